"""The pyinfra inventory of a simulated cluster (``<state>/NAME/NAME.py``) and its ``group_vars/all.yml``.

Groups: ``head`` (rank 0) and ``workers`` (with replicas: one head per replica, ``k3_replica`` and ranks within the
replica on every host), or with a P/D layout (``pd:P,D``) ``prefill``, ``decode`` and
``router`` (the first prefill node); then ``spares`` (``sim up --spares K``: the last K nodes, no rank).
``group_vars/all.yml`` holds the selection for ``deploy/k3.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from k3deploy.errors import K3Error
from k3sim import profiles
from k3sim.host import write_atomic
from k3sim.monitoring import GROUP_VARS

#: where the simulated outside serves the hub (:mod:`k3sim.outside`; ``huggingface.co`` maps to it on every node)
HUB_ENDPOINT = "http://huggingface.co"


def parse_layout(layout: str | None, nodes: int) -> dict[str, int] | None:
    """``None`` (head + workers) or ``"pd:P,D"`` -> ``{"prefill": P, "decode": D}`` with P + D == nodes."""
    if layout is None or layout == "head":
        return None
    m = re.fullmatch(r"pd:(\d+),(\d+)", layout)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise K3Error(f"layout {layout!r} is not pd:P,D with P, D >= 1 (e.g. pd:1,2)")
    p, d = int(m.group(1)), int(m.group(2))
    if p + d != nodes:
        raise K3Error(f"layout {layout} needs {p + d} nodes, got --nodes {nodes}: make P + D equal --nodes")
    return {"prefill": p, "decode": d}


def write_inventory(state: dict[str, Any]) -> None:
    """Write the inventory named by ``state["inventory"]`` and the ``group_vars/all.yml`` next to it."""
    ssh = {
        "ssh_user": "root",
        "ssh_key": state["key"],
        "ssh_known_hosts_file": state["known_hosts"],
        "ssh_strict_host_key_checking": "yes",
    }

    def host(rec: dict[str, Any], replica: int | None = None, ranked: bool = True) -> str:
        data = {"ssh_hostname": rec["ip"], "rank": rec["rank"], "k3_ip": rec["ip"], "sim_cluster": state["name"]}
        if not ranked:
            del data["rank"]
        if replica is not None:
            data["k3_replica"] = replica
        return f"    ({rec['name']!r}, {{**_ssh, **{data!r}}}),\n"

    count = len(state["nodes"]) - int(state.get("spares") or 0)
    recs, spare_recs = state["nodes"][:count], state["nodes"][count:]
    pools = state.get("pools")
    head = (
        f'"""pyinfra inventory of the simulated cluster {state["name"]!r} '
        f'({len(state["nodes"])} x {state["hardware"]}), written by k3deploy sim up."""\n\n'
        f"_ssh = {ssh!r}\n\n"
    )
    if pools:
        p = pools["prefill"]

        def pool(rs: list[dict[str, Any]]) -> str:
            return "".join(host({**r, "rank": i}) for i, r in enumerate(rs))

        text = head + (f"prefill = [\n{pool(recs[:p])}]\n\n"
                       f"decode = [\n{pool(recs[p:])}]\n\n"
                       f"router = [\n{host({**recs[0], 'rank': 0})}]\n")
    elif state.get("replicas", 1) > 1:
        per = len(recs) // state["replicas"]
        split = [recs[i:i + per] for i in range(0, len(recs), per)]
        heads = "".join(host({**rs[0], "rank": 0}, i) for i, rs in enumerate(split))
        workers = "".join(host({**r, "rank": j}, i) for i, rs in enumerate(split) for j, r in enumerate(rs) if j)
        text = head + f"head = [\n{heads}]\n\nworkers = [\n{workers}]\n"
    else:
        text = head + f"head = [\n{host(recs[0])}]\n\nworkers = [\n{''.join(host(r) for r in recs[1:])}]\n"
    if spare_recs:   # hosts of the same hardware standing by for a lost member (docs/spares.md)
        text += f"\nspares = [\n{''.join(host(r, ranked=False) for r in spare_recs)}]\n"
    write_atomic(Path(state["inventory"]), text, 0o600)
    # the selection for `pyinfra <inventory> deploy/k3.py`, Ansible-style next to the inventory
    gv = Path(state["inventory"]).parent / "group_vars"
    gv.mkdir(exist_ok=True)
    lines = ["# written by k3deploy sim up: the selection for this simulated cluster",
             f"k3_hardware: {state['hardware']}"]
    if pools:
        lines.append("k3_strategy: pd_cluster")
    elif state.get("strategy") and state.get("strategy_default"):
        # the recipe's recommendation, which fits these nodes: an unset k3_strategy deploys it too
        lines.append(f"# k3_strategy: {state['strategy']}  (the recommended strategy for these nodes; set it to "
                     "deploy another)")
    elif state.get("strategy"):
        lines.append(f"k3_strategy: {state['strategy']}")
    # the simulated hub answers plain HTTP at huggingface.co (the simulated image's `hf` defaults to it too): the
    # site's endpoint, so what the nodes ask the hub (the download's index) reaches it
    lines.append(f"k3_hf_endpoint: {HUB_ENDPOINT}")
    if state["hardware"] == "ascend_910c":
        lines.append("k3_variant: ascend_w4a8")
    if state.get("vip"):
        lines += ["# the site's virtual address (sim up --vip): keepalived on the nodes, held by the one that serves",
                  f"k3_vip: {state['vip']}"]
    if state.get("slurm"):
        sl = state["slurm"]
        lines += ["# the engines run as Slurm jobs of the cluster's own Slurm (sim up --slurm), not as systemd units",
                  "k3_launcher: slurm",
                  "# slurmctld runs on the rank-0 node: jobs are submitted (sbatch, squeue, scancel) there over SSH",
                  f"k3_slurm_submit_host: {sl['submit_host']}",
                  "# the one partition of the simulated Slurm, over every node",
                  f"k3_slurm_partition: {sl['partition']}"]
        if profiles.profile(state["hardware"]).get("vendor", "nvidia") != "nvidia":
            lines += ["# the simulated nodes run pyxis (NVIDIA's default) and docker, not Apptainer (the AMD pack's "
                      "default under Slurm)", "k3_slurm_container: docker"]
        if pools:
            lines += ["# the router runs on the first prefill node beside its engine: k3deploy's jobs share nodes",
                      "k3_slurm_exclusive: user"]
        elif state.get("replicas", 1) > 1 or (state.get("strategy") == "multi_node_dep" and len(recs) > 1):
            lines += ["# the router in front of the replicas (or of the hybrid-LB nodes) runs on the first head's "
                      "node beside its engine: k3deploy's jobs share nodes",
                      "k3_slurm_exclusive: user"]
    lines.append("k3_poll_interval: 0.5")
    if state.get("monitoring"):  # short intervals: a figure or an alert within seconds (k3sim.monitoring)
        lines += list(GROUP_VARS)
    # the simulated engines start in seconds: groups heal and crash loops back off on the same scale
    lines += ["k3_restart_sec: 2", "k3_heal_grace: 3", "k3_heal_interval: 1", "k3_restart_max_delay: 30",
              "k3_crash_loop_window: 10"]
    write_atomic(gv / "all.yml", "\n".join(lines) + "\n", 0o644)
