#!/usr/bin/env bash
# Set up (tools/setup.sh) and run k3deploy on the embedded default: the vendored Kimi-K3 recipe on a
# 2-tray GB300 NVL4 selection.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
.venv/bin/k3deploy options --hardware gb300
.venv/bin/k3deploy resolve --hardware gb300 --strategy multi_node_tp --nodes 2
