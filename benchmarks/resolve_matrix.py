"""Resolver speed over the whole offered matrix, and the CLI's cold start.

Reports, as figures (JSON on stdout, a summary on stderr):
- the median time per node command (one node's argv + env; a plan of N nodes counts N), over every
  selection of the offered matrix (hardware x offered strategy x variant x feature subset); target <= 40 us;
- the cold start of `k3deploy resolve --hardware gb300 --json` (target <= 0.25 s).

Run: python benchmarks/resolve_matrix.py [--repeat 5] [--recipe PATH]

Side by side with another checkout of k3deploy (the machine's load moves the figures by a third from minute to
minute, so two figures compare only when taken in the same run, turn about):

    mkdir /tmp/c11349b && git archive c11349b | tar -x -C /tmp/c11349b
    python benchmarks/resolve_matrix.py --against /tmp/c11349b --rounds 7
    rm -r /tmp/c11349b

runs the matrix figure alone in a fresh process for this checkout and for the other (``PYTHONPATH`` set to each),
alternately, ``--rounds`` times, and prints each checkout's figures and their median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5, help="timed repetitions per selection (the median is kept)")
    ap.add_argument("--cold-runs", type=int, default=10)
    ap.add_argument("--recipe", default=None)
    ap.add_argument("--against", default=None, help="another checkout of k3deploy, measured turn about with this one")
    ap.add_argument("--rounds", type=int, default=5, help="with --against: the measurements of each checkout")
    ap.add_argument("--matrix-only", action="store_true", help="the matrix figure alone (no cold start)")
    args = ap.parse_args()
    if args.against:
        side_by_side(args)
        return

    from k3deploy import load_recipe, resolve
    from k3deploy.recipe.offering import iter_matrix

    recipe = load_recipe(args.recipe)
    selections = list(iter_matrix(recipe))
    per_node: list[float] = []
    total_nodes = 0
    for sel in selections:
        resolve(recipe, **sel)  # warm
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            plan = resolve(recipe, **sel)
            times.append(time.perf_counter() - t0)
        n = sum(1 for node in plan.nodes if node.role != "router") or 1
        total_nodes += n
        per_node.append(statistics.median(times) / n)

    if args.matrix_only:
        print(json.dumps({"median_us_per_node_command": round(statistics.median(per_node) * 1e6, 2),
                          "selections": len(selections), "node_commands": total_nodes}))
        return

    cli = [sys.executable, "-c", "from k3deploy.cli import main; main()", "resolve", "--hardware", "gb300", "--json"]
    cold = []
    for _ in range(args.cold_runs):
        t0 = time.perf_counter()
        subprocess.run(cli, check=True, capture_output=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "0"})
        cold.append(time.perf_counter() - t0)

    result = {
        "selections": len(selections),
        "node_commands": total_nodes,
        "median_us_per_node_command": round(statistics.median(per_node) * 1e6, 2),
        "p90_us_per_node_command": round(sorted(per_node)[int(len(per_node) * 0.9)] * 1e6, 2),
        "target_us_per_node_command": 40,
        "cli_cold_start_s_median": round(statistics.median(cold), 3),
        "cli_cold_start_s_min": round(min(cold), 3),
        "target_cli_cold_start_s": 0.25,
    }
    print(json.dumps(result, indent=2))
    print(f"median {result['median_us_per_node_command']} us per node command over {len(selections)} selections "
          f"({total_nodes} node commands); CLI cold start {result['cli_cold_start_s_median']} s", file=sys.stderr)


def side_by_side(args: argparse.Namespace) -> None:
    """The matrix figure of this checkout and of ``args.against``, each in its own process, turn about."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this": here, "against": os.path.abspath(args.against)}
    figures: dict[str, list[float]] = {name: [] for name in trees}
    sizes: dict[str, tuple[int, int]] = {}
    for i in range(args.rounds):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--matrix-only", "--repeat", str(args.repeat)]
            if args.recipe:
                cmd += ["--recipe", args.recipe]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=trees[name],
                                 env={**os.environ, "PYTHONPATH": trees[name]}).stdout
            result = json.loads(out)
            figures[name].append(result["median_us_per_node_command"])
            sizes[name] = (result["selections"], result["node_commands"])
            print(f"round {i + 1} {name}: {result['median_us_per_node_command']} us", file=sys.stderr)
    report = {name: {"tree": trees[name], "selections": sizes[name][0], "node_commands": sizes[name][1],
                     "us_per_node_command": figures[name],
                     "median_us_per_node_command": round(statistics.median(figures[name]), 2)} for name in trees}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
