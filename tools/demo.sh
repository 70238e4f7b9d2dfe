#!/usr/bin/env bash
# The main job on the embedded default, end to end on a fresh machine (as root):
#   set-up -> a simulated cluster of 2 GB300 NVL72 compute trays -> `pyinfra <its inventory> deploy/k3.py`
#   -> the recipe guide's OpenAI client answering through the deployed endpoint -> tear-down.
# K3_DEMO_NAME=NAME names the cluster (default demo; an existing cluster of that name is left alone: the demo stops).
# K3_DEMO_KEEP=1 keeps the cluster up afterwards (remove it with: .venv/bin/k3deploy sim down --name NAME).
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=${K3_DEMO_NAME:-demo}
K3=.venv/bin/k3deploy
PY=.venv/bin/python
if [ -e "${K3SIM_STATE:-/run/k3deploy/sim}/$NAME/state.json" ]; then
    echo "a simulated cluster named '$NAME' exists already; the demo leaves it alone. Run it under another name:" >&2
    echo "  K3_DEMO_NAME=demo2 bash tools/demo.sh     (or remove it: $K3 sim down --name $NAME)" >&2
    exit 2
fi
bash tools/setup.sh
created=0
cleanup() { [ "$created" = 1 ] && [ "${K3_DEMO_KEEP:-0}" != 1 ] && "$K3" sim down --name "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT

echo "== 1. a simulated 2-tray GB300 cluster '$NAME' (network namespaces, systemd-nspawn nodes, real sshd)"
created=1
inventory=$("$K3" sim up --hardware gb300 --nodes 2 --name "$NAME" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["inventory"])')
echo "inventory: $inventory"

echo "== 2. the plan: what each node will run, and where every value came from"
"$K3" resolve --inventory "$inventory"

echo "== 3. preflight"
"$K3" preflight "$inventory"

echo "== 4. review (a summary; every line: $K3 plan $inventory), then roll out: pyinfra $inventory deploy/k3.py"
{ "$K3" plan "$inventory" --json || [ $? = 3 ]; } | "$PY" tools/plan_summary.py  # exit 3: changes pending
.venv/bin/pyinfra "$inventory" deploy/k3.py -y 2>&1 | tee /tmp/k3deploy-demo.log | grep -E "^--> (Starting|k3deploy)|serves at|smoke test|Error|Grand total"
endpoint=$(grep -oE 'Chat completion through http://[0-9.]+:[0-9]+' /tmp/k3deploy-demo.log | head -1 | awk '{print $4}')

echo "== 5. the recipe guide's OpenAI client against $endpoint"
"$PY" tools/chat.py "$endpoint" "What can you do, in one sentence?"

echo "== 6. a second run changes nothing; the revision it runs"
.venv/bin/pyinfra "$inventory" deploy/k3.py -y 2>&1 | grep -E "Grand total"
"$K3" history "$inventory"

keep=$([ "${K3_DEMO_KEEP:-0}" = 1 ] && echo "the cluster stays up (K3_DEMO_KEEP=1)" || echo "rerun with K3_DEMO_KEEP=1 to keep the cluster for these")
cat <<NEXT

== try next ($keep)
  export PATH=\$PWD/.venv/bin:\$PATH INV=$inventory
  python tools/chat.py $endpoint "your question"      # ask it again
  k3deploy status \$INV                                 # what runs, which revision, is it healthy
  echo 'k3_extra_args: [--max-num-seqs, "64"]' >> $(dirname "$inventory")/group_vars/all.yml   # change a setting
  k3deploy plan \$INV                                   # review the change, then: pyinfra \$INV deploy/k3.py -y
  k3deploy history \$INV                                # revisions; roll back: pyinfra \$INV deploy/k3.py -y --data k3_rollback=true
  k3deploy sim down --name $NAME                        # remove the cluster
NEXT
