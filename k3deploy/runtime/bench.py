"""``k3deploy bench`` at work: vLLM's own benchmark client against the serving endpoint, recorded per revision.

:func:`bench` reads the cluster as ``history`` does (:data:`~k3deploy.runtime.views.HISTORY`: the rollout and each
group's revisions), runs ``vllm bench serve`` from the engines' own image (the sweep of
:func:`k3deploy.model.bench.load_of`), as the launcher runs that image (:meth:`Launcher.bench_command
<k3deploy.runtime.launchers.Launcher.bench_command>`: docker, or a Slurm site's runtime from its staged file), on the
node of the first engine group's head through the public endpoint, and keeps the sweep
(:class:`k3deploy.model.bench.Record`) in the directory of the revision each serving group runs, on each of its
nodes (``bench.json``), where ``k3deploy history`` reads it.

Example::

    result = bench("inventories/gb300.py")
    print(result.summary())      # {"4": {"ttft_ms": {"p50": ..., "p99": ...}, "itl_ms": {...}, ...}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import gevent

from k3deploy.errors import K3Error
from k3deploy.model import bench as model
from k3deploy.model import commands
from k3deploy.model.revisions import GroupHistory, revisions_dir
from k3deploy.model.steps import served_model


@dataclass
class Result:
    """What one benchmark measured, on which node, and where it was kept."""

    record: model.Record
    node: str
    why: str = ""                                   # why the sweep stopped short ("" when it ran to its end)
    kept: dict[str, int] = field(default_factory=dict)   # group -> the revision the record was kept with
    history: dict[str, GroupHistory] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.why

    def summary(self) -> dict[str, dict[str, Any]]:
        return model.summary(list(self.record.points))


def bench(inventory: str, overrides: dict[str, Any] | None = None) -> Result:
    """Run the benchmark on the inventory's cluster and keep it with the revisions that serve (see the module)."""
    from k3deploy.preflight import runner
    from k3deploy.runtime.connections import disconnect, open_inventory
    from k3deploy.runtime.gather import read_and_render, require_reachable
    from k3deploy.runtime.launchers import launcher_for
    from k3deploy.runtime.readiness import run
    from k3deploy.runtime.views import HISTORY

    state, wanted = open_inventory(inventory, overrides)
    runner.quiet_pyinfra()
    try:
        gathered = read_and_render(state, wanted, HISTORY, connect_first=True)
        require_reachable(gathered)
        r = gathered.rollout
        if r is None:
            raise K3Error(f"bench: {inventory} lays out no engine to benchmark")
        engines = [u for u in r.units if u.group != "router" and u.spec is not None and u.spec.container]
        if not engines:
            raise K3Error(f"bench: {inventory} runs no engine container to run the benchmark client from")
        head = engines[0]
        spec = head.spec
        assert spec is not None and spec.container is not None
        load = model.load_of(r.vars)
        gpus = sum(u.spec.container.gpus_per_node for u in engines if u.spec is not None and u.spec.container)
        args = model.client_args(load, r.endpoint, r.plan.model, served_model(r))
        text = launcher_for(r).bench_command(head, args, load.concurrency, load.rounds)
        hosts = {h.name: h for h in state.inventory}
        _, out = run(hosts, head.host, text)
        points, why = model.parse(out, gpus)
        serving = {g: h for g, h in gathered.history.items() if g != "router" and h.current is not None}
        record = model.Record(datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), r.endpoint, load, gpus,
                              tuple(points), revisions={g: h.current for g, h in serving.items()
                                                        if h.current is not None})
        result = Result(record, head.host, why, history=gathered.history)
        if why:
            return result
        jobs = {}
        for g, h in serving.items():
            assert h.current is not None
            script = commands.record_bench(revisions_dir(r.vars.k3_config_dir, g), h.current, record.to_json())
            for node in dict.fromkeys(u.host for u in r.group(g)):
                jobs[(g, node)] = gevent.spawn(run, hosts, node, script)
        gevent.joinall(list(jobs.values()))
        for (g, _), job in jobs.items():
            if job.successful() and job.value[0] and serving[g].current is not None:
                result.kept[g] = serving[g].current   # type: ignore[assignment]
        return result
    finally:
        disconnect(list(state.inventory))
