"""Staging at scale on the simulated cluster, as figures: a rollout that brings the image and the weights to every
node along a pipelined chain (`k3_stage: chain`, the default: fetched from outside once, then each file handed on
node to node as it lands), beside the binomial tree of whole copies (`fanout`) and the naive way (`per_node`: every
node fetches from outside), each on a fresh cluster.

For GB300 trays (multi_node_tp) on 2, 8 and 18 trays, measures one `pyinfra <inventory> deploy/k3.py -y` on a
fresh cluster whose simulated outside (registry and hub) serves real bytes behind a tc-shaped uplink
(`sim up --uplink-mbps`, `--weights-mb`, `--image-mb`; node to node `--cluster-mbps`): the rollout's wall time, the
stage phase's wall time (from the first stage operation to the first operation after the stage in pyinfra's log),
the bytes the outside served over the uplink against one node's artifacts (image layers and checkpoint), how many
nodes fetched each artifact from outside and the rounds of node-to-node copies. Against the physical limit: the
first rollout's time to serve (the deploy's wall time: it ends when the cluster answers a chat completion) over one
copy of the artifacts through the uplink plus the engines' own start as measured (the head unit's process start to
its engine's "Application startup complete."); with ``--change``, then a change rollout (``k3_extra_env``: every
engine restarts, nothing to stage) over the engines' own start.

Run as root: python benchmarks/stage.py [--trays 2,8,18] [--modes chain,fanout,per_node] [--weights-mb 256]
             [--image-mb 64] [--uplink-mbps 400] [--cluster-mbps 4000] [--change] [--prefix bs] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PYINFRA = str(Path(PY).parent / "pyinfra")


def k3(*args: str) -> str:
    return subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", *args], check=True,
                          capture_output=True, text=True, cwd=ROOT).stdout


def ran_on(output: str, operation: str) -> int:
    """On how many hosts an operation did something (pyinfra's summary table)."""
    m = re.search(r"^\s*Stage \| " + re.escape(operation) + r"\s+(\d+)\s+(\S+)", output, re.M)
    return 0 if m is None or m[2] == "-" else int(m[2])


def ssh(info: dict, rank: int, command: str) -> str:
    d = Path(info["inventory"]).parent
    return subprocess.run(["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o",
                           "BatchMode=yes", f"root@{info['nodes'][rank]['ip']}", command], capture_output=True,
                          text=True, check=True).stdout


def engine_start(info: dict) -> float:
    """Seconds from the head unit's (last) process start to its engine's first "startup complete" after it (as
    benchmarks/rollout.py reads it)."""
    started = float(ssh(info, 0, "systemctl show --timestamp=unix -p ExecMainStartTimestamp --value "
                                 "k3-engine.service").strip().lstrip("@"))
    lines = ssh(info, 0, "journalctl -u k3-engine.service -o short-unix --no-pager | "
                         "grep 'Application startup complete'").splitlines()
    return [float(line.split()[0]) for line in lines if float(line.split()[0]) >= started][0] - started


def change(info: dict) -> dict:
    """A change rollout (an engine setting: every engine restarts, nothing to stage): its wall time and the engines'
    own start."""
    gv = Path(info["inventory"]).parent / "group_vars" / "all.yml"
    gv.write_text(gv.read_text() + "k3_extra_env: {K3_BENCH_CHANGE: '1'}\n")
    t0 = time.monotonic()
    run = subprocess.run([PYINFRA, info["inventory"], "deploy/k3.py", "-y"], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if run.returncode != 0:
        raise SystemExit(f"change rollout failed:\n{(run.stdout + run.stderr)[-3000:]}")
    engine = engine_start(info)
    return {"change_s": round(wall, 2), "change_engine_s": round(engine, 2), "change_x": round(wall / engine, 2)}


def measure(n: int, mode: str, args: argparse.Namespace) -> dict:
    name = f"{args.prefix}{mode[0]}{n}"
    subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", "sim", "down", "--name", name],
                   capture_output=True, cwd=ROOT)
    info = json.loads(k3("sim", "up", "--hardware", "gb300", "--nodes", str(n), "--name", name, "--json",
                         "--strategy", "multi_node_tp", "--weights-mb", str(args.weights_mb), "--image-mb",
                         str(args.image_mb), "--uplink-mbps", str(args.uplink_mbps), "--cluster-mbps",
                         str(args.cluster_mbps)))
    try:
        gv = Path(info["inventory"]).parent / "group_vars" / "all.yml"
        gv.write_text(gv.read_text() + f"k3_stage: {mode}\n")
        t0 = time.monotonic()
        run = subprocess.Popen([PYINFRA, info["inventory"], "deploy/k3.py", "-y"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        stage_start = stage_end = None
        lines = []
        assert run.stdout is not None
        for line in run.stdout:
            lines.append(line)
            now = time.monotonic() - t0
            if line.startswith("--> Starting operation: Stage") and stage_start is None:
                stage_start = now
            elif line.startswith("--> Starting operation:") and stage_start is not None and stage_end is None \
                    and "Stage" not in line:
                stage_end = now
        total = time.monotonic() - t0
        if run.wait() != 0:
            raise SystemExit(f"deploy of {n} trays ({mode}) failed:\n{''.join(lines)[-3000:]}")
        out = "".join(lines)
        status = json.loads(k3("sim", "status", "--name", name, "--json"))["clusters"][0]
        rounds = len(re.findall(r"^--> Starting operation: Stage \| Stage round \d+ of", out, re.M))
        engine = engine_start(info)
        copy = status["artifact_bytes"] * 8 / (args.uplink_mbps * 1e6)    # one copy through the uplink
        row = {"trays": n, "mode": mode, "rollout_s": round(total, 2),
               "stage_s": round((stage_end or total) - (stage_start or 0), 2),
               "image_fetches": ran_on(out, "Image vllm/vllm-openai:kimi-k3: from the registry"),
               "weights_fetches": ran_on(out, "Weights of moonshotai/Kimi-K3: from the hub"), "rounds": rounds,
               "outside_bytes": status["outside_bytes"], "artifact_bytes": status["artifact_bytes"],
               "uplink_x": round(status["outside_bytes"] / status["artifact_bytes"], 2),
               "engine_s": round(engine, 2), "limit_s": round(copy + engine, 2),
               "limit_x": round(total / (copy + engine), 2)}
        return {**row, **change(info)} if args.change else row
    finally:
        subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", "sim", "down", "--name", name],
                       capture_output=True, cwd=ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trays", default="2,8,18")
    ap.add_argument("--modes", default="chain,fanout,per_node")
    ap.add_argument("--weights-mb", type=float, default=256.0, help="checkpoint size, MiB")
    ap.add_argument("--image-mb", type=float, default=64.0, help="image layers, MiB")
    ap.add_argument("--uplink-mbps", type=float, default=400.0, help="the site's uplink, Mbit/s")
    ap.add_argument("--cluster-mbps", type=float, default=4000.0, help="each node's rate to the others, Mbit/s")
    ap.add_argument("--prefix", default="bs", help="the simulated clusters' names start with it (bs: bsc2, ...)")
    ap.add_argument("--change", action="store_true", help="then a change rollout on the same cluster")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(int(n), mode, args) for n in args.trays.split(",") for mode in args.modes.split(",")]
    for r in rows:
        print(f"{r['trays']:>3} trays {r['mode']:<8} rollout {r['rollout_s']:7.2f} s  stage {r['stage_s']:6.2f} s  "
              f"uplink {r['outside_bytes'] / 2**20:8.1f} MiB = {r['uplink_x']:5.2f}x the artifacts; fetched from "
              f"outside: image x{r['image_fetches']}, weights x{r['weights_fetches']}; {r['rounds']} rounds; engine "
              f"start {r['engine_s']:.2f} s; limit {r['limit_s']:.2f} s: {r['limit_x']:.2f}x it"
              + (f"; change rollout {r['change_s']:.2f} s = {r['change_x']:.2f}x its engine start "
                 f"{r['change_engine_s']:.2f} s" if "change_s" in r else ""), file=sys.stderr)
    for mode in dict.fromkeys(r["mode"] for r in rows):
        by = {r["trays"]: r for r in rows if r["mode"] == mode}
        if 2 in by and 8 in by:
            print(f"{mode}: 8 trays / 2 trays rollout time = {by[8]['rollout_s'] / by[2]['rollout_s']:.2f}x "
                  f"(target <= 1.3x); 8 trays' uplink = {by[8]['uplink_x']:.2f}x the artifacts", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
