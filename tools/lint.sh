#!/usr/bin/env bash
# The code gates: ruff (pyflakes, bugbear, isort, pyupgrade, pycodestyle) over everything; mypy --strict over the
# package, the playbook and the simulator's package (k3sim); mypy (check_untyped_defs, pyproject.toml) over the
# tests, tools and benchmarks and the simulated nodes' tools. Usage: bash tools/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin
"$PY/ruff" check .
"$PY/mypy" --strict k3deploy deploy simulator/k3sim
"$PY/mypy" tools benchmarks
"$PY/mypy" tests
# the simulated nodes' tools are scripts without a .py suffix, importing k3simlib from their own lib directory
mapfile -t node_tools < <(find simulator/k3sim/node_tools -type f \( -name '*.py' -o -perm -u+x \) \
  -exec grep -lE '^#!.*python' {} + | sort)
MYPYPATH=simulator/k3sim/node_tools/usr/lib/k3sim "$PY/mypy" --scripts-are-modules "${node_tools[@]}"
