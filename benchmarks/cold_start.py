"""The CLI's cold start: wall time of a fresh ``k3deploy`` process, from its start to its exit, per command line.

Reports, as figures (JSON on stdout, a summary on stderr), the median and the fastest of ``--runs`` starts of each
command line (target <= 0.25 s): ``k3deploy --help`` (no command imported), ``k3deploy resolve --hardware gb300
--json`` (the recipe engine, the lint findings included) and ``k3deploy options --json``. Each process gets this
process's environment, ``PYTHONPATH`` set to the checkout (so it runs this checkout's code); compiled bytecode is
written on the first start and read on the others, as an installed tool's is.

With ``--against DIR`` each start of this checkout is followed by one of the other checkout (``PYTHONPATH=DIR``),
turn about, so the two figures are taken under the same load.

Run: python benchmarks/cold_start.py [--runs 15] [--against DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

COMMANDS: dict[str, list[str]] = {
    "--help": ["--help"],
    "resolve": ["resolve", "--hardware", "gb300", "--json"],
    "options": ["options", "--json"],
}

#: the process a user's ``k3deploy`` console script starts (its entry point, without the script's own lookup)
ENTRY = "from k3deploy.cli import main; main()"


def start(tree: str, args: list[str]) -> float:
    """Seconds from the start of a ``k3deploy ARGS`` process running ``tree``'s code to its exit (it must exit 0)."""
    env = {**os.environ, "PYTHONPATH": tree}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", ENTRY, *args], check=True, capture_output=True, env=env, cwd=tree)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15, help="starts per command line (the median is kept)")
    ap.add_argument("--against", default=None, help="another checkout of k3deploy, started turn about with this one")
    args = ap.parse_args()

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this": here} | ({"against": os.path.abspath(args.against)} if args.against else {})
    times: dict[str, dict[str, list[float]]] = {t: {c: [] for c in COMMANDS} for t in trees}
    for tree in trees.values():   # a first start of each writes its bytecode
        start(tree, COMMANDS["--help"])
    for i in range(args.runs):
        for name, argv in COMMANDS.items():
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for t in order:
                times[t][name].append(start(trees[t], argv))
    result = {t: {"tree": trees[t], "target_s": 0.25,
                  **{name: {"median_s": round(statistics.median(v), 3), "min_s": round(min(v), 3)}
                     for name, v in times[t].items()}} for t in trees}
    print(json.dumps(result, indent=2))
    for t in trees:
        print(f"{t}: " + ", ".join(f"{name} {result[t][name]['median_s']} s" for name in COMMANDS)
              + f" (median of {args.runs})", file=sys.stderr)


if __name__ == "__main__":
    main()
