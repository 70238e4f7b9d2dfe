#!/usr/bin/env bash
# The code gates: ruff (pyflakes, bugbear, isort, pyupgrade, pycodestyle) over everything; mypy --strict over the
# package, the playbook and the simulator's package (k3sim); mypy (check_untyped_defs, pyproject.toml) over the
# tests, tools and benchmarks and the simulated nodes' tools. Usage: bash tools/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin
"$PY/ruff" check .
# a cache per set of options: the strict run and the others check the package's modules with different options, so
# one shared cache would have each run check them all again (about 50 s instead of 2 s per run here)
"$PY/mypy" --strict --cache-dir .mypy_cache/strict k3deploy deploy simulator/k3sim
"$PY/mypy" --cache-dir .mypy_cache/default tools benchmarks
"$PY/mypy" --cache-dir .mypy_cache/default tests
# the simulated nodes' tools are scripts without a .py suffix, importing k3simlib from their own lib directory
mapfile -t node_tools < <(find simulator/k3sim/node_tools -type f \( -name '*.py' -o -perm -u+x \) \
  -exec grep -lE '^#!.*python' {} + | sort)
MYPYPATH=simulator/k3sim/node_tools/usr/lib/k3sim "$PY/mypy" --cache-dir .mypy_cache/node-tools --scripts-are-modules "${node_tools[@]}"
