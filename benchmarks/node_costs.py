"""What one tray costs its own node in a change rollout, as CPU time, and the wall time that puts under a rollout of
N trays on this machine, whatever the control machine does.

On one fresh 2-tray GB300 simulated cluster (``multi_node_tp``, rolled out once), measures on the second tray (a
worker) the CPU time of the node's cgroup (``cpu.stat`` ``usage_usec``) for:

- ``ssh_connect``: one SSH connection that runs ``true`` (sshd's key exchange, authentication and session; pyinfra
  opens one per host per run);
- ``facts``: the node's one facts command exactly as the deploy sends it (the preflight facts and the rollout's own:
  units, image, weights, health), over an open connection, less an empty command's cost on that connection;
- ``engine_stop``: ``systemctl stop`` of its engine unit (systemd, ``docker stop``, the engine's shutdown, the unit's
  stop hooks and watcher).

A change rollout does each once per tray before the group's head can start again (the facts are read before
anything changes; a group restarts as a whole). Their sum is a floor, per tray, of the node CPU that the time the tool
adds grows by; with every simulated node on this machine's cores, N trays add at least (N - 2) x that sum / cores
seconds over a 2-tray rollout, however the deploy is written; real nodes each spend it on their own CPUs, in parallel.

Run as root: python benchmarks/node_costs.py [--repeat 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout import PYINFRA, ROOT, k3, sim_down  # noqa: E402

from k3sim.processes import node_cgroups  # noqa: E402

NAME = "bcost"


def node_cpu(node: str) -> float:
    for cg in node_cgroups(NAME, node):
        stat = cg / "cpu.stat"
        if stat.exists():
            return int(stat.read_text().split()[1]) / 1e6
    raise SystemExit(f"no cgroup with cpu.stat for {node}")


def facts_command(inventory: str, host: str) -> str:
    """The batched command the deploy reads ``host`` with (preflight facts + the rollout's own facts)."""
    from k3deploy.facts.batch import Batch, specs
    from k3deploy.model.inventory import records_of
    from k3deploy.model.pipeline import target
    from k3deploy.preflight import runner
    from k3deploy.runtime.connections import load_inventory
    from k3deploy.runtime.reading import plan_host
    from k3deploy.runtime.views import DEPLOY

    state = load_inventory(inventory)
    t = target(records_of(state.inventory), inventory)
    h = next(h for h in state.inventory if h.name == host)
    plan = runner.fact_plan(t.requirements, runner.host_address(h), t.vars.k3_model_cache, t.vars.k3_image_dir or "")
    extra = plan_host(t.require_layout(), host, DEPLOY, resolver=None).specs()
    return str(Batch().command(specs([*(read.spec for read in plan), *extra])))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sim_down(NAME)
    info = json.loads(k3("sim", "up", "--hardware", "gb300", "--nodes", "2", "--name", NAME, "--json",
                         "--strategy", "multi_node_tp"))
    try:
        subprocess.run([PYINFRA, info["inventory"], "deploy/k3.py", "-y"], cwd=ROOT, check=True,
                       capture_output=True)
        node = info["nodes"][1]
        d = Path(info["inventory"]).parent
        with tempfile.TemporaryDirectory() as tmp:
            base = ["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}",
                    "-o", "BatchMode=yes"]
            shared = [*base, "-o", "ControlMaster=auto", "-o", f"ControlPath={tmp}/cm", "-o", "ControlPersist=60"]
            target_ = f"root@{node['ip']}"

            def cost(cmd: list[str], n: int, stdin: str | None = None) -> float:
                before = node_cpu(node["name"])
                for _ in range(n):
                    subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True)
                return (node_cpu(node["name"]) - before) / n

            ssh_connect = cost([*base, target_, "true"], args.repeat)
            subprocess.run([*shared, target_, "true"], check=True)   # opens the shared connection
            channel = cost([*shared, target_, "true"], args.repeat)
            batch = facts_command(info["inventory"], node["name"])
            facts = cost([*shared, target_, "sh"], args.repeat, stdin=batch) - channel
            stop = cost([*shared, target_, "systemctl stop k3-engine.service"], 1) - channel
            subprocess.run([*shared, "-O", "exit", target_], capture_output=True)
    finally:
        sim_down(NAME)
    per_tray = ssh_connect + facts + stop
    cores = os.cpu_count() or 1
    floor = {n: round((n - 2) * per_tray / cores, 2) for n in (8, 18, 36, 72)}
    out = {"ssh_connect_ms": round(ssh_connect * 1e3, 1), "facts_ms": round(facts * 1e3, 1),
           "engine_stop_ms": round(stop * 1e3, 1), "per_tray_ms": round(per_tray * 1e3, 1), "cores": cores,
           "floor_added_s": floor}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"per tray, node CPU: ssh connection {out['ssh_connect_ms']} ms + facts command {out['facts_ms']} ms "
          f"+ engine stop {out['engine_stop_ms']} ms = {out['per_tray_ms']} ms")
    print(f"wall time N trays add over 2 trays, at least, on {cores} core(s): "
          + ", ".join(f"{n} trays {s} s" for n, s in floor.items()))


if __name__ == "__main__":
    main()
