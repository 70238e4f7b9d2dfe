#!/usr/bin/env bash
# The code gates: ruff (pyflakes, bugbear, isort, pyupgrade, pycodestyle) and mypy (check_untyped_defs) over
# the package, the simulated nodes' tools, the tests, tools and benchmarks. Usage: bash tools/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin
"$PY/ruff" check .
"$PY/mypy" k3deploy tools benchmarks deploy
# the simulated nodes' tools are scripts without a .py suffix, importing k3simlib from their own lib directory
mapfile -t node_tools < <(find k3deploy/sim/node_tools -type f \( -name '*.py' -o -perm -u+x \) \
  -exec grep -lE '^#!.*python' {} + | sort)
MYPYPATH=k3deploy/sim/node_tools/usr/lib/k3sim "$PY/mypy" --scripts-are-modules "${node_tools[@]}"
