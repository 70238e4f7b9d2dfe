"""The runbook runs exactly the commands the operations run, for every strategy x vendor family (NVIDIA, AMD,
Ascend), on a fresh cluster and on a partly staged one.

Both sides are real: the runbook is :func:`k3deploy.model.runbook.build` as ``k3deploy runbook`` writes it; the
operations are the deploy's own phases (:mod:`k3deploy.runtime.phases`) called for every host in a real pyinfra
``State`` (CLI mode: operations told apart by their call sites, as ``pyinfra INVENTORY deploy/k3.py`` does), and their
commands are what each operation yields, read from pyinfra's state without connecting to any host (every file a
fact would read is absent, as on a fresh node). ``tests/e2e/test_runbook.py`` executes a runbook on a simulated
cluster and checks, for one scenario, what the deploy ran over SSH.
"""

from __future__ import annotations

import re
import shlex
from io import BytesIO
from pathlib import Path
from typing import Any

import pyinfra
import pytest
from pyinfra.api.command import FileUploadCommand, FunctionCommand, RsyncCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state

from helpers import parts
from helpers.clusters import FAMILIES, STRATEGIES, smallest_rollout
from helpers.clusters import records as cluster_records
from helpers.pyinfra_state import cli_state
from k3deploy.facts.rollout import SmokeAnswer
from k3deploy.model import commands, steps
from k3deploy.model.binding import HostRecord
from k3deploy.model.images import LocalImage
from k3deploy.model.observed import Installed
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.revisions import sha256
from k3deploy.model.rollout import Rollout, mark_changes
from k3deploy.model.runbook import Context, blocks, build, to_markdown
from k3deploy.model.staging import engines, stage_for
from k3deploy.runtime import phases, readiness
from k3deploy.runtime.decide import Decided
from k3deploy.runtime.gather import Gathered
from k3deploy.runtime.reading import HostReading


#: per vendor family, its hardware in order of preference (the first that offers a strategy runs it)
def records(hardware: str, strategy: str, nodes: int, token: str | None, **extra: str) -> list[HostRecord]:
    return cluster_records(hardware, strategy, nodes, **({"k3_hf_token_file": token} if token else {}), **extra)


def rollout_of(hardware: list[str], strategy: str, token: str | None = None, **extra: str) -> Rollout | None:
    """The smallest cluster of the family's first hardware that offers ``strategy`` (None: none offers it)."""
    return smallest_rollout(hardware, strategy, **({"k3_hf_token_file": token} if token else {}), **extra)


#: every strategy x vendor family the recipe offers (kimi-k3 offers no single_node_dep or single_node_tep anywhere)
OFFERED = [(family, strategy) for family, hardware in FAMILIES.items() for strategy in STRATEGIES
           if rollout_of(hardware, strategy) is not None]


def test_every_strategy_and_every_family_is_covered():
    assert {s for _, s in OFFERED} == set(STRATEGIES) - {"single_node_dep", "single_node_tep"}
    assert {f for f, _ in OFFERED} == set(FAMILIES)


def operations(r: Rollout, gathered: Gathered, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every command each host's operations yield (the deploy's phases, called as pyinfra's CLI calls them)."""
    out: dict[str, list[Any]] = {}
    for _, per_host in ordered(r, gathered, monkeypatch):
        for host, cmds in per_host.items():
            out.setdefault(host, []).extend(cmds)
    return out


def ordered(r: Rollout, gathered: Gathered,
            monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, list[Any]]]]:
    """The operations in the order pyinfra runs them: each one's name and, per host, the commands it yields."""
    monkeypatch.setattr(pyinfra, "is_cli", True)
    state = cli_state(r.hosts, __file__)
    inventory = state.inventory
    decided = Decided(rollout=r, numbers={g: 1 for g in r.changed_groups}, metas={g: "{}\n" for g in r.changed_groups},
                      marks={g: 1 for g in r.changed_groups}, repairs=(), rollback_to={}, gate=None)
    ctx = phases.RunContext(gathered, decided, state=state)
    out: list[tuple[str, dict[str, list[Any]]]] = []
    with ctx_state.use(state):
        for h in inventory:
            # every file a fact would read is absent (a fresh node); nothing connects
            monkeypatch.setattr(h, "get_fact", lambda fact, **kwargs: fact.default())
            monkeypatch.setattr(h, "check_can_rsync", lambda: None)
            with ctx_host.use(h):
                for phase in (phases.stage_phase, phases.configure_phase, phases.start_phase, phases.smoke_phase):
                    phase(ctx=ctx)
        # each operation is called only on the hosts it does something on, yet pyinfra runs them in the order of
        # their calls, as if every host called every one (the order of the deploy file and the phases; a roll's
        # steps one after the other)
        order = state.get_op_order()
        if not r.rolling:
            assert order == sorted(order, key=lambda op_hash: state.op_meta[op_hash].op_order)
        for op_hash in order:
            per_host: dict[str, list[Any]] = {}
            for h in inventory:
                if op_hash in state.ops[h]:
                    with ctx_host.use(h):
                        per_host[h.name] = list(state.get_op_data_for_host(h, op_hash).command_generator())
            out.append((sorted(state.op_meta[op_hash].names)[0], per_host))
    return out


def script_of(command: StringCommand) -> str:
    argv = shlex.split(command.get_raw_value())
    assert argv[:2] == ["sh", "-c"] and len(argv) == 3, argv
    return argv[2]


SHARED = re.compile(r"^cat > (?P<path>\S+) <<'(?P<tag>K3_SHARED_EOF_*)'\n(?P<content>.*?)(?P=tag)$", re.M | re.S)
HEREDOC = re.compile(r"^cat >> \"\$t\" <<'(?P<tag>K3_EOF_*)'\n(?P<content>.*?)(?P=tag)\nchmod (?P<mode>\d+) \"\$t\" "
                     r"&& chown 0:0 \"\$t\" && mv -f \"\$t\" (?P<dest>\S+)$", re.M | re.S)


def compare(r: Rollout, gathered: Gathered, monkeypatch: pytest.MonkeyPatch) -> None:
    ssh = {h: ["ssh", f"root@{h}"] for h in r.hosts}
    doc = build(r, Context(inventory="inventories/x.py", preflight=[], addresses={h: h for h in r.hosts}, ssh=ssh,
                           brand="NVIDIA", guide=None, version="0", stage=gathered.stage, images=gathered.images))
    runbook = [b for b in blocks(to_markdown(doc)) if b.when is None]
    ops = operations(r, gathered, monkeypatch)
    config = r.vars.k3_config_dir

    # what the operations do, per host: scripts, files (dest -> content), copies from the control machine
    scripts: dict[str, set[str]] = {}
    files: dict[str, dict[str, str]] = {}
    copies: dict[str, set[tuple[str, str]]] = {}
    for host, cmds in ops.items():
        pending: BytesIO | None = None
        for cmd in cmds:
            if isinstance(cmd, FileUploadCommand):
                assert isinstance(cmd.src, BytesIO)
                pending = cmd.src
            elif isinstance(cmd, RsyncCommand):
                copies.setdefault(host, set()).add((cmd.src, cmd.dest))
            elif isinstance(cmd, StringCommand) and "_stdin" in cmd.connector_arguments:   # write_files
                payload, dests = str(cmd.connector_arguments["_stdin"]), re.findall(r'mv -f "\$t" (\S+)',
                                                                                     script_of(cmd))
                for dest in dests:
                    size, _, payload = payload.partition("\n")
                    content, payload = payload.encode()[:int(size)].decode(), payload.encode()[int(size):].decode()
                    files.setdefault(host, {})[shlex.split(dest)[0]] = content
            elif isinstance(cmd, StringCommand):
                text = script_of(cmd)
                m = re.search(r'mv -f "\$t" (\S+)$', text)
                if pending is not None and m:   # managed_file: the upload, then into place
                    files.setdefault(host, {})[shlex.split(m[1])[0]] = pending.getvalue().decode()
                    pending = None
                elif not text.startswith("umask 022 && mkdir -p") or "&& : >" not in text:   # managed_file's new_temp
                    scripts.setdefault(host, set()).update(parts(text))
            else:
                assert isinstance(cmd, FunctionCommand), cmd   # the gates and the router calls
    # the revision bookkeeping (revision recorded, then marked current once the group serves) is the deploy's own
    revision = re.compile(r"^(umask 077 && install -d -m 0700 \S+/revisions/.*|echo \d+ > \S+/revisions/.*)$", re.S)
    swaps = {h: {s for s in texts if revision.match(s) or s.startswith("{ [ -f ")} for h, texts in scripts.items()}
    scripts = {h: texts - swaps[h] for h, texts in scripts.items()}
    assert all(swaps.get(h) for h in r.hosts), "every host records its group's revision and puts its files in place"

    # what the runbook does, per host, the same way
    book: dict[str, list[str]] = {}
    book_files: dict[str, dict[str, str]] = {}
    book_copies: dict[str, set[tuple[str, str]]] = {}
    shared: dict[str, str] = {}   # files written once on the control machine, copied to each node
    for b in runbook:
        if b.node == "control":
            written = SHARED.search(b.text)
            if written:
                shared[written["path"]] = written["content"]
                continue
            argv = shlex.split(b.text)
            if argv[0] == "rsync":
                where, dest = argv[-1].split(":", 1)
                book_copies.setdefault(where.split("@")[-1], set()).add((argv[-2], dest))
            else:   # the token or a shared file: from the control machine's file over ssh, into place
                assert argv[-2] == "<" and re.search(r"install (-o 0 -g 0 )?-m 0[67][045][045] /dev/stdin", argv[-3]), \
                    b.text
                book_files.setdefault(argv[1].split("@")[-1], {})[argv[-3].split()[-1]] = \
                    shared.get(argv[-1], f"<{argv[-1]}>")
            continue
        found = HEREDOC.findall(b.text)
        if found:
            for _, content, _, dest in found:
                book_files.setdefault(b.node, {})[dest] = content
            continue
        book.setdefault(b.node, []).append(b.text)
    joined = {h: "\n".join(texts) for h, texts in book.items()}

    # 1. every command an operation runs is a command of the runbook, on that node
    for host, texts in scripts.items():
        for s in texts:
            assert s in joined.get(host, ""), f"{host} runs a command the runbook does not have:\n{s}"
    # 2. every command of the runbook is one an operation runs on that node: the waits poll with the gate's probe,
    #    the smoke test is the smoke operation's request
    probes = {h: {readiness.probe_script(u, r.plan.model) for u in r.on_host(h) if u.serves} for h in r.hosts}
    smoke = SmokeAnswer().command(endpoint=r.endpoint, model=steps.served_model(r), env_file=r.units[0].env_path)
    for b in runbook:
        if b.node == "control" or HEREDOC.search(b.text):
            continue
        probe = re.search(r"^k3_probe\(\) \{ (?P<p>.*); \}$", b.text, re.M)
        if probe:
            assert probe["p"] in probes[b.node], f"{b.node}: the runbook waits with a probe the gate never runs"
        elif b.text.strip() not in scripts.get(b.node, set()):
            assert b.text.strip() in smoke, f"{b.node}: the runbook runs a command the deploy never runs:\n{b.text}"
    # 3. the same files with the same bytes (the deploy stages env and unit files beside the live ones)
    live = {commands.staged_path(u.unit_path, config): u.unit_path for u in r.units}
    live |= {commands.staged_path(u.env_path, config): u.env_path for u in r.units}
    token = r.vars.k3_hf_token_file or ""
    for host in r.hosts:
        ours = {live.get(dest, dest): (f"<{token}>" if content == Path(token).read_text() else content)
                for dest, content in files.get(host, {}).items()}
        assert ours == book_files.get(host, {}), host
        assert copies.get(host, set()) == book_copies.get(host, set()), host


@pytest.mark.parametrize("held", ["fresh", "partly-staged", "air-gapped"])
@pytest.mark.parametrize("family, strategy", OFFERED, ids=[f"{f}-{s}" for f, s in OFFERED])
def test_the_runbook_runs_exactly_the_commands_the_operations_run(family, strategy, held, tmp_path, monkeypatch):
    token = tmp_path / "hf-token"
    token.write_text("hf_equalsFAKEtoken0123456789\n")
    token.chmod(0o600)
    # an air-gapped site: the image archive and the weights come from the control machine
    extra = {}
    if held == "air-gapped":
        (tmp_path / "image.tar").write_bytes(b"archive")
        (tmp_path / "weights" / "refs").mkdir(parents=True)
        (tmp_path / "weights" / "refs" / "main").write_text("0" * 40)
        (tmp_path / "weights" / "snapshots").mkdir()
        extra = {"k3_image_archive": str(tmp_path / "image.tar"), "k3_weights_source": str(tmp_path / "weights")}
    r = rollout_of(FAMILIES[family], strategy, str(token), **extra)
    assert r is not None
    r = r.decided(mark_changes(r, {}))   # nothing installed: every group starts
    hosts = engines(r)
    images = {hosts[0]: LocalImage(ref_digest="sha256:" + "ab" * 32)} if held == "partly-staged" else {}
    weights = {hosts[-1]: True} if held == "partly-staged" else {}
    plan = stage_for(r, images, weights)
    gathered = Gathered(target=target(records(r.plan.hardware, strategy, len(r.hosts), str(token), **extra), None),
                        rollout=r, stage=plan,
                        readings={h: HostReading(h, image=images.get(h), helper_read=True) for h in r.hosts})
    compare(r, gathered, monkeypatch)




def test_a_rolling_change_runs_replica_by_replica_though_each_host_calls_only_its_own_operations(monkeypatch):
    """Two replicas of two trays behind the router, an engine change: every operation of step 2 runs after every
    operation of step 1, on every host (the hosts of replica 1 call nothing of step 1 but its router calls)."""
    hosts = [HostRecord(f"r{i}n{j}", ("head",) if j == 0 else ("workers",),
                        {"k3_ip": f"192.0.2.{10 * i + j + 10}", "rank": j, "k3_replica": i, "k3_hardware": "gb300",
                         "k3_strategy": "multi_node_tp"}) for i in range(2) for j in range(2)]
    wanted = target(hosts, None)
    r = desired_rollout(wanted)
    installed = {(u.host, u.unit): Installed(unit_sha=sha256(u.unit_text), active="active",
                                             env_sha=sha256(u.env_text) if u.group == "router" else "before")
                 for u in r.units}
    r = r.decided(mark_changes(r, installed))
    assert r.rolling and r.waves() == [["engine-r0"], ["engine-r1"]]
    readings = {h: HostReading(h, installed={u.unit: installed[(u.host, u.unit)] for u in r.on_host(h)})
                for h in r.hosts}
    order = [name for name, _ in ordered(r, Gathered(target=wanted, rollout=r, stage=stage_for(r, {}, {}),
                                                     readings=readings), monkeypatch)]
    steps_of = [int(m[1]) for name in order if (m := re.search(r"step (\d) of 2", name))]
    assert steps_of == sorted(steps_of) and set(steps_of) == {1, 2}, order


def test_no_host_calls_the_stops_where_no_unit_of_the_restart_runs(monkeypatch):
    """A first rollout (every unit absent) calls no stop on any host and starts the heads before the workers; once a
    unit of the restarting groups runs somewhere, or one was not read, the hosts with units call their stops."""
    wanted = target(records("gb300", "multi_node_tp", 2, None), None)
    r = desired_rollout(wanted)

    def names(installed: dict[tuple[str, str], Installed]) -> list[str]:
        readings = {h: HostReading(h, installed={u.unit: installed[(u.host, u.unit)] for u in r.on_host(h)
                                                 if (u.host, u.unit) in installed}) for h in r.hosts}
        gathered = Gathered(target=wanted, rollout=r, stage=stage_for(r, {}, {}), readings=readings)
        return [name for name, _ in ordered(r, gathered, monkeypatch)]

    def stops(order: list[str]) -> list[str]:
        return [name for name in order if "Stop " in name]

    absent = {(u.host, u.unit): Installed() for u in r.units}
    r = r.decided(mark_changes(r, absent))
    fresh = names(absent)
    assert stops(fresh) == []
    starts = [i for i, name in enumerate(fresh) if "Start group heads" in name or "Start workers" in name]
    assert len(starts) == 2 and "Start group heads" in fresh[starts[0]]
    worker = next(u for u in r.units if not u.is_group_head)
    runs = names({**absent, (worker.host, worker.unit): Installed(active="active")})
    assert len(stops(runs)) == 2   # workers, then heads: on every host with such units
    head = r.units[0]
    assert len(stops(names({k: v for k, v in absent.items() if k != (head.host, head.unit)}))) == 2
