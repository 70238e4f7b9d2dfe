#!/usr/bin/env bash
# Install the real vllm-router 0.1.17 (and orjson) from PyPI for the simulated cluster's router hosts:
# wheels for the nodes' Python (Debian 12, CPython 3.11) under ${K3SIM_CACHE:-/var/cache/k3deploy}/vllm-router-0.1.17
# (K3SIM_ROUTER_DIR overrides), which every node mounts read-only. Idempotent. Run as root; tools/setup.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=${PYTHON:-python3}
exec "$PY" -m k3sim.router "$@"
