"""Rollout overhead on the simulated cluster, as figures.

For GB300 trays, multi_node_tp on 2, 8 and 18 (one NVL72 rack: tensor parallelism stays in one NVLink domain) and
multi_node_dep (data and expert parallelism over every GPU, behind one router; it may span racks) on 18, 36 and 72,
measures three runs of `pyinfra <inventory> deploy/k3.py -y` on one fresh simulated cluster:

1. the first rollout: the nodes hold nothing, so it also stages the image and the weights (one fetch over the
   uplink, then node to node);
2. a change rollout: an engine setting changes (``k3_extra_env``), every engine restarts; the nodes hold the image
   and the weights (what a site that pre-pulled them, or any later rollout, runs);
3. the idempotent re-run (nothing to do).

For each rollout: the wall time; the engines' own start (from the head unit's process start to the head engine's
"Application startup complete." log line after it: what a hand-started vLLM would take as well); the time the tool
adds = wall time - engines' own start; and the stage phase (from "Beginning operation run" to the first Configure
operation, read from pyinfra's output as it arrives); the CPU time of the control machine's pyinfra process (what the
tool itself computes and sends); the CPU time of all the simulated nodes together (their cgroup's ``cpu.stat``: sshd,
the commands the deploy runs, systemd, the simulated tools, engines and watchers); and the operations per node that
ran commands (pyinfra's "Success" count / N; the facts of a host are one more command). Targets: the time the tool
adds at 18 trays <= 5 s and <= 1.5x the 2-tray figure, at 72 trays <= 2.5x it; a re-run of 72 trays <= 10 s; the
control machine's CPU per added tray (from the smallest run to each larger one: what one more tray costs the pyinfra
process) <= 25 ms for a first rollout, the re-run's no more than the first rollout's. Every
simulated node shares this machine's CPUs, so what each node does itself (sshd, its shell, the simulated tools) grows
with N here, where real nodes run in parallel: the wall time of a run is at least (control CPU + nodes' CPU) / cores.

With ``--against DIR`` (another checkout of k3deploy, e.g. ``git archive COMMIT | tar -x -C DIR``) each cluster size
is measured on this checkout, then on DIR (its own code and its own simulator, on a fresh cluster), and the two
checkouts' rows are printed side by side (the second's names end in ``x``): the control CPU per added tray of both,
under the same load.

Run as root: python benchmarks/rollout.py [--runs multi_node_tp:2 ... multi_node_dep:72] [--prefix b] [--json]
[--against DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from k3sim.processes import cluster_cgroups

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PYINFRA = str(Path(PY).parent / "pyinfra")


def env_of(tree: Path) -> dict[str, str]:
    """This process's environment with ``tree``'s code (and its simulator, where it has one as a package of its own)
    first on the path; compiled bytecode is written on the first start and read on the others, as an installed tool's
    is (``PYTHONDONTWRITEBYTECODE`` would have every deploy compile the package again)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "simulator")])}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def k3(*args: str, tree: Path = ROOT) -> str:
    return subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", *args], check=True,
                          capture_output=True, text=True, cwd=tree, env=env_of(tree)).stdout


def sim_down(name: str, tree: Path = ROOT) -> None:
    """Remove the simulated cluster ``name`` if it is up (its absence is no error)."""
    subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", "sim", "down", "--name", name],
                   capture_output=True, cwd=tree, env=env_of(tree))


def ssh(info: dict, rank: int, cmd: str) -> str:
    d = Path(info["inventory"]).parent
    return subprocess.run(["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}",
                           f"root@{info['nodes'][rank]['ip']}", cmd], check=True, capture_output=True,
                          text=True).stdout


def nodes_cpu(name: str) -> float:
    """CPU seconds the cluster's nodes have used so far (cgroup v2 ``usage_usec`` of the cluster's cgroup)."""
    for cg in cluster_cgroups(name):
        stat = cg / "cpu.stat"
        if stat.exists():
            return int(stat.read_text().split()[1]) / 1e6
    return 0.0


def deploy(inventory: str, name: str = "", tree: Path = ROOT) -> dict:
    """One `pyinfra INVENTORY deploy/k3.py -y`: its wall time and the stage phase's, from its output as it comes; the
    CPU time of the control machine's pyinfra process and of the cluster ``name``'s nodes; the operations that ran
    commands (pyinfra's "Success")."""
    nodes_before = nodes_cpu(name)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.Popen([PYINFRA, inventory, "deploy/k3.py", "-y"], cwd=tree, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env_of(tree))
    assert proc.stdout is not None
    began = configure = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if began is None and line.startswith("--> Beginning operation run"):
            began = time.monotonic()
        if configure is None and line.startswith("--> Starting operation: Configure"):
            configure = time.monotonic()
    rc = proc.wait()
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        raise SystemExit(f"deploy of {inventory} failed:\n{''.join(lines)[-3000:]}")
    total = next((m for line in lines if (m := re.match(r"\s*Grand total\s+(\d+)\s+(\S+)", line))), None)
    return {"wall_s": wall, "stage_s": (configure - began) if began and configure else 0.0,
            "control_cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "nodes_cpu_s": nodes_cpu(name) - nodes_before,
            "changed_ops": int(total.group(2)) if total and total.group(2).isdigit() else 0}


def engine_start(info: dict) -> float:
    """Seconds from the head unit's (last) process start to its engine's first "startup complete" after it."""
    started = float(ssh(info, 0, "systemctl show --timestamp=unix -p ExecMainStartTimestamp --value "
                                 "k3-engine.service").strip().lstrip("@"))
    lines = ssh(info, 0, "journalctl -u k3-engine.service -o short-unix --no-pager | "
                         "grep 'Application startup complete'").splitlines()
    ready = [float(line.split()[0]) for line in lines if float(line.split()[0]) >= started]
    return ready[0] - started


def figures(run: dict, engine: float, n: int) -> dict:
    return {"deploy_s": round(run["wall_s"], 2), "engine_start_s": round(engine, 2),
            "stage_s": round(run["stage_s"], 2), "tool_s": round(run["wall_s"] - engine, 2),
            "control_cpu_s": round(run["control_cpu_s"], 3), "nodes_cpu_s": round(run["nodes_cpu_s"], 2),
            "ops_per_node": round(run["changed_ops"] / n, 1)}


def measure(n: int, strategy: str, prefix: str = "b", tree: Path = ROOT, suffix: str = "") -> dict:
    name = f"{prefix}{strategy.split('_')[-1]}{n}{suffix}"
    sim_down(name, tree)
    info = json.loads(k3("sim", "up", "--hardware", "gb300", "--nodes", str(n), "--name", name, "--json",
                         "--strategy", strategy, tree=tree))
    try:
        first = figures(deploy(info["inventory"], name, tree), engine_start(info), n)
        gv = Path(info["inventory"]).parent / "group_vars" / "all.yml"
        gv.write_text(gv.read_text() + "k3_extra_env: {K3_BENCH_CHANGE: '1'}\n")
        change = figures(deploy(info["inventory"], name, tree), engine_start(info), n)
        again = deploy(info["inventory"], name, tree)
        return {"tree": str(tree), "nodes": n, "strategy": strategy, "first": first, "change": change,
                "idempotent_rerun_s": round(again["wall_s"], 2),
                "rerun_control_cpu_s": round(again["control_cpu_s"], 3),
                "rerun_nodes_cpu_s": round(again["nodes_cpu_s"], 2), "rerun_ops": again["changed_ops"]}
    finally:
        sim_down(name, tree)


def per_added_tray(rows: list[dict]) -> None:
    """Each row's control CPU per tray added since the smallest run of its checkout (ms), for the first rollout and
    the re-run: ``(cpu(N) - cpu(N0)) / (N - N0)`` (``None`` for the smallest run itself)."""
    for r in rows:
        base = min((b for b in rows if b["tree"] == r["tree"]), key=lambda b: b["nodes"])
        added = r["nodes"] - base["nodes"]
        r["control_cpu_ms_per_added_tray"] = {
            "first": round(1000 * (r["first"]["control_cpu_s"] - base["first"]["control_cpu_s"]) / added, 1),
            "rerun": round(1000 * (r["rerun_control_cpu_s"] - base["rerun_control_cpu_s"]) / added, 1),
        } if added else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", metavar="STRATEGY:TRAYS",
                    default=["multi_node_tp:2", "multi_node_tp:8", "multi_node_tp:18", "multi_node_dep:18",
                             "multi_node_dep:36", "multi_node_dep:72"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--prefix", default="b", help="the simulated clusters' names start with it (b: btp2, bdep18, ...)")
    ap.add_argument("--against", type=Path, default=None,
                    help="another checkout of k3deploy, measured after this one at each size")
    args = ap.parse_args()
    for tree in [ROOT] + ([args.against.resolve()] if args.against is not None else []):
        # its bytecode written before the first measured start, as an installed tool's is
        subprocess.run([PY, "-m", "compileall", "-q", *(str(tree / d) for d in ("k3deploy", "simulator", "deploy")
                                                         if (tree / d).is_dir())], check=True, env=env_of(tree))
    rows = []
    for strategy, n in (r.split(":") for r in args.runs):
        rows.append(measure(int(n), strategy, args.prefix))
        if args.against is not None:
            rows.append(measure(int(n), strategy, args.prefix, args.against.resolve(), "x"))
    per_added_tray(rows)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'checkout':>20} {'strategy':>15} {'nodes':>5} | "
          f"first: {'deploy':>7} {'engine':>7} {'stage':>6} {'tool':>6} "
          f"{'ctl cpu':>7} {'ops/n':>5} | change: {'deploy':>7} {'engine':>7} {'tool':>6} {'ctl cpu':>7} "
          f"{'nodes cpu':>9} {'ops/n':>5} | {'re-run':>7} {'ctl cpu':>7} {'nodes cpu':>9} {'ops':>4}")
    for r in rows:
        f, c = r["first"], r["change"]
        print(f"{r['tree'][-20:]:>20} {r['strategy']:>15} {r['nodes']:>5} | "
              f"{f['deploy_s']:>14} {f['engine_start_s']:>7} {f['stage_s']:>6} "
              f"{f['tool_s']:>6} {f['control_cpu_s']:>7} {f['ops_per_node']:>5} | {c['deploy_s']:>15} "
              f"{c['engine_start_s']:>7} {c['tool_s']:>6} {c['control_cpu_s']:>7} {c['nodes_cpu_s']:>9} "
              f"{c['ops_per_node']:>5} | {r['idempotent_rerun_s']:>7} {r['rerun_control_cpu_s']:>7} "
              f"{r['rerun_nodes_cpu_s']:>9} {r['rerun_ops']:>4}")
    for r in rows:
        per = r["control_cpu_ms_per_added_tray"]
        if per is not None:
            base = min(b["nodes"] for b in rows if b["tree"] == r["tree"])
            print(f"{r['tree']}: control CPU per added tray, {base} -> {r['nodes']} trays: first rollout "
                  f"{per['first']} ms, re-run {per['rerun']} ms")

if __name__ == "__main__":
    main()
