#!/usr/bin/env bash
# The main job on the embedded default, end to end on a fresh machine (as root):
#   set-up -> a simulated cluster of 2 GB300 NVL72 compute trays -> `pyinfra <its inventory> deploy/k3.py`
#   -> the recipe guide's OpenAI client answering through the deployed endpoint -> tear-down.
# K3_DEMO_KEEP=1 keeps the cluster up afterwards (remove it with: .venv/bin/k3deploy sim down --name demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

NAME=demo
K3=.venv/bin/k3deploy
cleanup() { [ "${K3_DEMO_KEEP:-0}" = 1 ] || "$K3" sim down --name "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT

echo "== 1. a simulated 2-tray GB300 cluster (network namespaces, systemd-nspawn nodes, real sshd)"
"$K3" sim down --name "$NAME" >/dev/null 2>&1 || true
inventory=$("$K3" sim up --hardware gb300 --nodes 2 --name "$NAME" --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["inventory"])')
echo "inventory: $inventory"

echo "== 2. the plan: what each node will run, and where every value came from"
"$K3" resolve --inventory "$inventory"

echo "== 3. preflight"
"$K3" preflight "$inventory"

echo "== 4. review, then roll out: pyinfra $inventory deploy/k3.py"
"$K3" plan "$inventory" || [ $? = 3 ]  # exit 3: changes pending
.venv/bin/pyinfra "$inventory" deploy/k3.py -y 2>&1 | tee /tmp/k3deploy-demo.log | grep -E "^--> (Starting|k3deploy)|serves at|smoke test|Error|Grand total"
endpoint=$(grep -oE 'Chat completion through http://[0-9.]+:[0-9]+' /tmp/k3deploy-demo.log | head -1 | awk '{print $4}')

echo "== 5. the recipe guide's OpenAI client against $endpoint"
.venv/bin/python tools/chat.py "$endpoint"

echo "== 6. a second run changes nothing; the revision it runs"
.venv/bin/pyinfra "$inventory" deploy/k3.py -y 2>&1 | grep -E "Grand total"
"$K3" history "$inventory"
