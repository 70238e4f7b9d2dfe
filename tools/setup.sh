#!/usr/bin/env bash
# Set up everything k3deploy and its tests need on a fresh Debian 12 machine, idempotently:
# the system packages of the simulated cluster (when run as root) and a virtualenv in .venv with
# k3deploy and its test extras, and the simulated cluster's package (simulator/, k3sim: the `k3deploy sim`
# commands), both editable. Usage: bash tools/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && [ -f .ci/install-sim.sh ]; then
  bash .ci/install-sim.sh
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.k3deploy-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ simulator/pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]' -e ./simulator
  touch "$stamp"
fi

# the real vllm-router the simulated cluster's router hosts run (needs root for the cache under /var/cache)
if [ "$(id -u)" = 0 ]; then
  bash tools/sim-router.sh >/dev/null
fi
