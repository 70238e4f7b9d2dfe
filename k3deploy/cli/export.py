"""``k3deploy export slurm``: the Slurm batch jobs of an inventory (or of a selection, host names as placeholders),
for sites that submit their jobs themselves (docs/slurm.md); ``k3deploy export kubernetes``: its manifests
(docs/kubernetes.md). Each writes what its export's renderer (:func:`k3deploy.runtime.launchers.export_for`)
renders."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from k3deploy.cli.common import echo_json, json_option, selection_kwargs, selection_options
from k3deploy.cli.export_prometheus import export_prometheus
from k3deploy.errors import K3Error

#: ``--option`` -> the variable it sets (for this export only)
SLURM_OPTIONS = {"partition": "k3_slurm_partition", "account": "k3_slurm_account", "qos": "k3_slurm_qos",
                 "time_limit": "k3_slurm_time", "exclusive": "k3_slurm_exclusive", "gres": "k3_slurm_gres",
                 "slurm_version": "k3_slurm_version", "slurm_dir": "k3_slurm_dir", "imex": "k3_imex",
                 "container": "k3_slurm_container"}


@click.group("export")
def export() -> None:
    """Write what a site runs by itself, from the same rollout the deploy runs."""


export.add_command(export_prometheus)


@export.command("slurm")
@click.argument("inventory", required=False)
@selection_options
@click.option("-o", "--output", "output", required=True, metavar="DIR",
              help="Directory to write into (created; files already there are replaced).")
@click.option("--partition", default=None, help="k3_slurm_partition: the jobs' partition.")
@click.option("--account", default=None, help="k3_slurm_account: the jobs' account.")
@click.option("--qos", default=None, help="k3_slurm_qos: the jobs' QoS.")
@click.option("--time", "time_limit", default=None, metavar="LIMIT", help="k3_slurm_time: the jobs' time limit.")
@click.option("--exclusive", type=click.Choice(["node", "user"]), default=None,
              help="k3_slurm_exclusive: node (--exclusive) or user (--exclusive=user).")
@click.option("--gres", default=None, help="k3_slurm_gres of the engine jobs ('' for none).")
@click.option("--slurm-version", default=None, metavar="X.Y", help="k3_slurm_version: the site's Slurm version.")
@click.option("--slurm-dir", default=None, metavar="PATH", help="k3_slurm_dir on the nodes.")
@click.option("--container", type=click.Choice(["pyxis", "docker", "apptainer"]), default=None,
              help="k3_slurm_container: how each node's step runs its container; default: the vendor's (pyxis on "
                   "NVIDIA).")
@click.option("--imex", type=click.Choice(["standing", "per_job"]), default=None,
              help="k3_imex on GB200/GB300: standing (channel 0 in every job) or per_job (each job's channel, from "
                   "Slurm's switch/nvidia_imex or the site's prolog); default: standing, nothing being read.")
@click.option("--segment", is_flag=True, default=None,
              help="k3_slurm_segment: request each group's nodes in one topology block (--segment; with --nodelist "
                   "from Slurm 25.11, topology/block, e.g. an NVL72 rack; give --slurm-version).")
@json_option
def export_slurm(inventory: str | None, output: str, as_json: bool, recipe_path: str | None, segment: bool | None,
                 **params: Any) -> None:
    """Write the Slurm batch scripts of INVENTORY (or of a selection: --hardware H [--strategy S --nodes N ...]),
    one per group, with each node's launch script and env file and a README.txt saying where each goes and the
    submit order. Nothing is contacted.

    From an inventory the scripts name its hosts (Slurm node names = inventory host names) and its group_vars set
    the k3_slurm_* variables (the options here override them); what the deploy would read from each node (its
    cluster interface, RDMA ports) is a named blank, listed in README.txt with the command that finds it. From a
    selection the hosts are placeholders (@NODE0@, @PREFILL0@, ...): replace each with a node name.

    \b
    Examples:
      k3deploy export slurm inventories/gb300.py -o slurm-gb300
      k3deploy export slurm --hardware gb300 --strategy multi_node_tp --nodes 2 -o slurm-gb300 --partition gpu
      k3deploy export slurm --hardware gb300 --nodes 18 -o rack --segment --slurm-version 25.11
    """
    overrides: dict[str, Any] = {var: params.pop(opt) for opt, var in SLURM_OPTIONS.items()
                                 if params.get(opt) is not None}
    for opt in SLURM_OPTIONS:
        params.pop(opt, None)
    if segment:
        overrides["k3_slurm_segment"] = True
    if inventory is not None:
        given = [f"--{k.replace('_', '-')}" for k, v in {**params, "recipe": recipe_path}.items()
                 if v not in (None, "default")]
        if given:
            raise K3Error(f"{', '.join(given)} cannot be combined with an inventory: the selection comes from the "
                          "inventory's group_vars (k3_hardware, k3_strategy, ...)")
        rollout, blanks, source = _from_inventory(inventory, overrides)
        tokens: dict[str, str] = {}
    else:
        rollout, blanks, source, tokens = _from_selection(params, recipe_path, overrides)
    written = _write(rollout, blanks, source, Path(output), tokens)
    if as_json:
        echo_json(written)
        return
    click.echo(f"wrote {len(written['files'])} file(s) to {output}: {len(written['jobs'])} job(s) "
               f"({', '.join(j['name'] for j in written['jobs'])}); submit order and placement in "
               f"{written['readme']}")


def _from_inventory(inventory: str, overrides: dict[str, Any],
                    read_nodes: bool = False) -> tuple[Any, list[Any], str]:
    """The rollout of ``inventory``: what the nodes would tell as blanks, or (``read_nodes``) read from them over SSH
    as the deploy reads them (a node that preflight fails is named on stderr, as the runbook does)."""
    from k3deploy.cli.common import read_cluster
    from k3deploy.runtime.gather import require_reachable
    from k3deploy.runtime.views import EXPORT, OFFLINE_RUNBOOK

    gathered = read_cluster("export", inventory, view=EXPORT if read_nodes else OFFLINE_RUNBOOK, overrides=overrides)
    if read_nodes:
        require_reachable(gathered)
        failing = sorted(gathered.preflight.failures_by_host()) if gathered.preflight else []
        if failing:
            click.echo(f"warning: preflight fails on {', '.join(failing)} (k3deploy preflight {inventory} says "
                       "what to fix): the settings read there may not be what they should", err=True)
    return gathered.require_rollout(), list(gathered.blanks), inventory


def placeholder(role: str, rank: int) -> str:
    """The placeholder of a node's name in an export from a selection; its address is :func:`address_placeholder`.

    >>> placeholder("prefill", 1), placeholder("worker", 2), address_placeholder("@NODE2@")
    ('@PREFILL1@', '@NODE2@', '@NODE2_IP@')
    """
    return f"@{role.upper() if role in ('prefill', 'decode') else 'NODE'}{rank}@"


def replica_placeholder(replica: int, rank: int) -> str:
    """The placeholder of an engine node of replica ``replica`` (replica 0's are :func:`placeholder`'s).

    >>> replica_placeholder(0, 1), replica_placeholder(2, 0)
    ('@NODE1@', '@R2NODE0@')
    """
    return placeholder("node", rank) if replica == 0 else f"@R{replica}NODE{rank}@"


def address_placeholder(name: str) -> str:
    return f"{name[:-1]}_IP@"


def _stand_in(name: str) -> str:
    """A valid address standing for a placeholder node's address while the rollout renders (RFC 2606's .invalid);
    every written file shows :func:`address_placeholder` instead."""
    return f"k3-ip-{name.strip('@').lower()}.invalid"


def _from_selection(params: dict[str, Any], recipe_path: str | None, overrides: dict[str, Any],
                    replicas: int = 1) -> tuple[Any, list[Any], str, dict[str, str]]:
    from k3deploy import load_recipe
    from k3deploy import resolve as do_resolve
    from k3deploy.model.binding import HostRecord
    from k3deploy.model.pipeline import target
    from k3deploy.runtime.gather import render_offline
    from k3deploy.runtime.views import OFFLINE_RUNBOOK

    kwargs = selection_kwargs(params)
    plan = do_resolve(load_recipe(recipe_path), **kwargs)
    data: dict[str, Any] = {"k3_hardware": plan.hardware, "k3_strategy": plan.strategy, "k3_variant": plan.variant,
                            "k3_features": list(plan.features)}
    if kwargs.get("image"):
        data["k3_image"] = kwargs["image"]
    if recipe_path:
        data["k3_recipe"] = recipe_path
    records: list[HostRecord] = []
    if plan.strategy == "pd_cluster":
        pools = {r: [n for n in plan.nodes if n.role == r] for r in ("prefill", "decode")}
        if any(n.pool_nodes == 0 for ns in pools.values() for n in ns):
            records.append(HostRecord(placeholder("node", 0), ("prefill", "decode", "router"), {**data, "rank": 0}))
        else:
            for role, nodes in pools.items():
                for n in nodes:
                    groups = (role, "router") if role == "prefill" and n.rank == 0 else (role,)
                    records.append(HostRecord(placeholder(role, n.rank), groups, {**data, "rank": n.rank}))
    else:
        engines = [n for n in plan.nodes if n.role != "router"]
        records = [HostRecord(replica_placeholder(r, n.rank), ("head",) if n.rank == 0 else ("workers",),
                              {**data, "rank": n.rank, **({"k3_replica": r} if replicas > 1 else {})})
                   for r in range(replicas) for n in engines]
    records = [HostRecord(r.name, r.groups, {**r.data, "k3_ip": _stand_in(r.name)}) for r in records]
    wanted = target(records, None, overrides)
    rollout, blanks = render_offline(wanted, OFFLINE_RUNBOOK)
    if rollout is None:
        wanted.require_plan()
        raise K3Error("no rollout")  # unreachable: a target with a plan renders one
    shown = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in kwargs.items() if v not in (None, "default", []))
    if replicas > 1:
        if plan.strategy == "pd_cluster":
            raise K3Error(f"--replicas {replicas}: pd_cluster has no replicas (its pools scale with --prefill-nodes "
                          "and --decode-nodes): leave --replicas out")
        shown += f" --replicas {replicas}"
    tokens = {_stand_in(r.name): address_placeholder(r.name) for r in records}
    return rollout, blanks, f"the selection {shown}", tokens


def _write(rollout: Any, blanks: list[Any], source: str, out: Path, tokens: dict[str, str]) -> dict[str, Any]:
    """Write every job's batch script, each node's launch scripts and env files (no secret: each secret-named value
    is a placeholder, filled on the node from a 0600 file) and README.txt into ``out``; what was written."""
    from k3deploy.model import slurm
    from k3deploy.model.hosttext import parse_env
    from k3deploy.model.jobcontainers import import_image
    from k3deploy.model.runbook.blanks import secret_file, secret_token, without_secrets
    from k3deploy.runtime.launchers import export_for

    export = export_for(rollout, kind="slurm")
    jobs = export.jobs
    files: list[dict[str, Any]] = []
    secrets: dict[str, list[str]] = {}

    # every file's place is checked before the first is written: none outside -o, nothing half written
    for rel in [f"{job.name}.sbatch" for job in jobs] + [f"nodes/{hf.host}{f.path}" for hf in
                                                         export.host_files for f in hf.files]:
        if ".." in Path(rel).parts or not (out / rel).resolve().is_relative_to(out.resolve()):
            raise K3Error(f"{rel!r} would be written outside -o {out}: rename the host or path it is made of (plain "
                          "names only)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise K3Error(f"-o {out}: cannot create it: {exc.strerror}: choose a writable path") from None

    def put(rel: str, text: str, mode: int, host: str | None, dest: str | None) -> None:
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_shown(text, tokens), encoding="utf-8")
        os.chmod(path, mode)
        files.append({"file": str(path), "host": host, "path": dest, "mode": f"{mode:04o}"})

    for job in jobs:
        put(f"{job.name}.sbatch", job.script, 0o644, None, job.path)
    for hf in export.host_files:
        for f in hf.files:
            text = f.text
            if f.mode == "0600":   # an env file: its settings from its unit's spec (a kept one as a host holds it)
                text, hidden = without_secrets(f.spec.env_map if f.spec is not None else parse_env(f.text))
                if hidden:
                    secrets.setdefault(hf.host, []).extend(f"{n} in {f.path}" for n in hidden)
            put(f"nodes/{hf.host}{f.path}", text, int(f.mode, 8), hf.host, f.path)
    v = rollout.vars
    lines = [f"Slurm batch jobs of {rollout.plan.model} ({rollout.plan.strategy} on {rollout.plan.hardware}), "
             f"written by `k3deploy export slurm` from {source}.", "",
             "1. On each node, put its files in place (as root): nodes/<node>/<path> goes to <path> with the mode it "
             "has here, and create the directories of the jobs' output:"]
    for hf in export.host_files:
        placed = ", ".join(f"{f.path} ({f.mode})" for f in hf.files)
        lines.append(f"   {hf.host}: mkdir -p {' '.join(hf.dirs)}; {placed}")
    lines += ["   The launch scripts run the same containers as the systemd units of `pyinfra INVENTORY deploy/k3.py`; "
              "stage the image and the weights on the nodes first (the deploy's stage, or the runbook's)."]
    runtime = slurm.container_runtime(rollout)
    engine_file = slurm.engine_image_file(rollout)
    if runtime.staged is not None and engine_file is not None:
        lines.append(f"   The jobs run their containers with {runtime.name} (k3_slurm_container): make the image file "
                     "they run from once, on one node, from the registry (no docker needed), then copy it with its "
                     ".sha256 to the same path on every other node and check it there (its sha256sum must equal the "
                     ".sha256):")
        lines.append(f"   {import_image(runtime, rollout.plan.image, engine_file, local=False)}")
        lines += [f"   {h}: {shell}" for h in rollout.hosts for _, shell in slurm.image_imports(rollout, h)]
    lines.append("")
    step = 2
    if any(h.startswith("@") for h in rollout.hosts):
        lines.append(f"{step}. Replace each host placeholder in every file: "
                     + ", ".join(f"{h} with its Slurm node name and {address_placeholder(h)} with its address on the "
                                 "cluster network" for h in rollout.hosts) + "; and rename nodes/<placeholder>.")
        lines.append("")
        step += 1
    if blanks:
        lines.append(f"{step}. Fill the blanks: what the deploy reads from each node is written as a token; replace "
                     "each on its node with what the command prints there:")
        lines += [f"   {b.token} ({b.host}: {b.what}): {b.command}" for b in blanks]
        lines += assumed_lines(rollout, blanks)
        lines.append("")
        step += 1
    if secrets:
        lines.append(f"{step}. Secrets are not written here: for each, write its value on the node to its own 0600 "
                     "file and put it in the env file in place of its placeholder:")
        for host, names in secrets.items():
            for item in names:
                name = item.split(" ", 1)[0]
                lines.append(f"   {host}: {item} = {secret_token(name)} (value in "
                             f"{secret_file(v.k3_config_dir, name)})")
        lines.append("")
        step += 1
    lines.append(f"{step}. Submit, in this order, from a host where sbatch runs (sbatch --parsable FILE):")
    engine_jobs = [j for j in jobs if j.group != "router"]
    for j in engine_jobs:
        lines.append(f"   {j.name}.sbatch  (group {j.group}: {', '.join(j.nodes)}; revision {j.revision})")
    router = next((j for j in jobs if j.group == "router"), None)
    if router is not None:
        pools = "the P/D pools" if rollout.plan.strategy == "pd_cluster" else "the engine groups"
        lines.append(f"   then, once {pools} serve (GET /health answers 200 on "
                     f"{', '.join(rollout.serving_urls([j.group for j in engine_jobs]))}):")
        lines.append(f"   {router.name}.sbatch  (router on {', '.join(router.nodes)})")
    lines += ["", f"The public endpoint: {rollout.endpoint}.",
              f"Each job writes {v.k3_slurm_dir}/<group>/<job id>.out on its batch host (which step ended, with its "
              f"exit code) and each node's step {v.k3_slurm_dir}/<group>/<job id>/<node>.out on that node. A step "
              "that ends ends its job (no half group); once its group served, the job requeues itself instead "
              f"(scontrol requeue, at most k3_slurm_requeue_max = {v.k3_slurm_requeue_max} times: a failed node, a "
              "dead engine) and Slurm starts it again on the same nodes after its requeue delay. A job that ended "
              "otherwise is resubmitted by you (the deploy's next run does it).",
              f"squeue -u $USER --name={','.join(j.name for j in jobs)} -o '{slurm.QUEUE_FORMAT}' shows the jobs; "
              "the comment (%k) is the revision each runs. docs/slurm.md of k3deploy says more."]
    readme = out / "README.txt"
    readme.write_text(_shown("\n".join(lines) + "\n", tokens), encoding="utf-8")
    return {"dir": str(out), "readme": str(readme), "endpoint": _shown(rollout.endpoint, tokens),
            "jobs": [{"name": j.name, "group": j.group, "nodes": list(j.nodes), "file": str(out / f"{j.name}.sbatch"),
                      "revision": j.revision, "comment": j.comment} for j in jobs],
            "submit_order": [j.name for j in jobs], "files": files,
            "blanks": [{"token": b.token, "host": b.host, "what": b.what, "command": b.command} for b in blanks]}


def _shown(text: str, tokens: dict[str, str]) -> str:
    for stand_in, token in tokens.items():
        text = text.replace(stand_in, token)
    return text


#: ``--option`` -> the variable it sets (for this export only)
KUBERNETES_OPTIONS = {"iface": "k3_iface", "ib_hca": "k3_ib_hca", "namespace": "k3_k8s_namespace",
                      "secret": "k3_k8s_secret", "cache_pvc": "k3_k8s_cache_pvc",
                      "topology_key": "k3_k8s_topology_key", "gpus": "k3_k8s_gpus", "rdma": "k3_k8s_rdma",
                      "rdma_resource": "k3_k8s_rdma_resource", "rdma_class": "k3_k8s_rdma_class",
                      "rdma_count": "k3_k8s_rdma_count", "max_unavailable": "k3_max_unavailable"}


#: checks of the bare-metal path that a Kubernetes site does not need: no Docker daemon or data root (the kubelet's
#: runtime runs the pods), no stage daemon, no router binary on a host, and /dev/shm is the pod's own memory emptyDir
NOT_ON_KUBERNETES = ("container.runtime", "disk.images", "stage.peers", "router.command", "disk.shm")


@export.command("kubernetes")
@click.argument("inventory", required=False)
@selection_options
@click.option("--replicas", type=click.IntRange(min=1), default=None,
              help="From a selection: engine groups behind a router (one LeaderWorkerSet, replicas: N).")
@click.option("-o", "--output", "output", required=True, metavar="DIR",
              help="Directory to write into (created; files already there are replaced).")
@click.option("--iface", default=None, metavar="NAME",
              help="k3_iface: the cluster interface on every node (NCCL/GLOO); needed across nodes unless the "
                   "inventory sets it.")
@click.option("--ib-hca", default=None, metavar="DEV:PORT,...",
              help="k3_ib_hca: the RDMA ports on every node (NCCL_IB_HCA, UCX_NET_DEVICES), each with its port, "
                   "e.g. mlx5_0:1,mlx5_1:1; needed across nodes on NVIDIA and AMD unless the inventory sets it.")
@click.option("--namespace", default=None, metavar="NAME", help="k3_k8s_namespace: the namespace of every object.")
@click.option("--secret", default=None, metavar="NAME", help="k3_k8s_secret: the Secret holding HF_TOKEN.")
@click.option("--cache-pvc", default=None, metavar="NAME",
              help="k3_k8s_cache_pvc: a PVC for the model cache (default: hostPath k3_model_cache).")
@click.option("--topology-key", default=None, metavar="LABEL", help="k3_k8s_topology_key (NVL trays).")
@click.option("--gpus", type=click.Choice(["device-plugin", "dra"]), default=None,
              help="k3_k8s_gpus: the accelerators as the device plugin's resource, or claimed through DRA.")
@click.option("--rdma", type=click.Choice(["device-plugin", "dra"]), default=None,
              help="k3_k8s_rdma: the RDMA devices as a device plugin's resource, or claimed through DRA.")
@click.option("--rdma-resource", default=None, metavar="NAME", help="k3_k8s_rdma_resource (an RDMA device plugin's).")
@click.option("--rdma-class", default=None, metavar="NAME",
              help="k3_k8s_rdma_class (an RDMA DRA driver's DeviceClass).")
@click.option("--rdma-count", type=click.IntRange(min=1, max=64), default=None,
              help="k3_k8s_rdma_count: RDMA devices per engine pod.")
@click.option("--max-unavailable", type=click.IntRange(min=1), default=None,
              help="k3_max_unavailable: groups a rolling update takes down at once.")
@click.option("--pod-network", is_flag=True, default=None,
              help="k3_k8s_host_network: false (engine pods on the pod network instead of the node's).")
@click.option("--read-nodes", is_flag=True, default=False,
              help="With an inventory: read each node over SSH, as the deploy does, for what the inventory leaves "
                   "out (its interface, RDMA ports; the image's digest).")
@json_option
def export_kubernetes(inventory: str | None, output: str, as_json: bool, recipe_path: str | None,
                      replicas: int | None, pod_network: bool | None, read_nodes: bool, **params: Any) -> None:
    """Write the Kubernetes manifests of INVENTORY (or of a selection: --hardware H [--strategy S --nodes N
    --replicas R ...]): its Namespace, a LeaderWorkerSet per engine pool (and the ComputeDomain of NVL trays, the
    DRA claim templates), the router's Deployment, the public Service, one YAML file each; README.txt (the
    prerequisites with their minimum versions, what to create first, the preflight checks the site runs itself)
    and check.sh (kubectl commands that verify the prerequisites). `sh DIR/check.sh`, then `kubectl apply -f DIR`.
    What the deploy would read from the nodes (the cluster interface, the RDMA ports) comes from the inventory,
    --iface / --ib-hca, or the nodes over SSH (--read-nodes, the only option that contacts anything); without it
    the export refuses.

    \b
    Examples:
      k3deploy export kubernetes inventories/gb300.py -o k8s-gb300 --read-nodes
      k3deploy export kubernetes inventories/gb300.py -o k8s-gb300 --iface eth1 --ib-hca mlx5_0:1,mlx5_1:1
      k3deploy export kubernetes -H b300 -s multi_node_dep --replicas 2 -o k8s --iface eth1 --ib-hca mlx5_0:1
      k3deploy export kubernetes -H gb300 -s multi_node_tp -o k8s --iface eth1 --ib-hca mlx5_0:1 --gpus dra
    """
    overrides: dict[str, Any] = {var: params.pop(opt) for opt, var in KUBERNETES_OPTIONS.items()
                                 if params.get(opt) is not None}
    for opt in KUBERNETES_OPTIONS:
        params.pop(opt, None)
    if pod_network:
        overrides["k3_k8s_host_network"] = False
    if inventory is not None:
        given = [f"--{k.replace('_', '-')}" for k, v in {**params, "recipe": recipe_path, "replicas": replicas}.items()
                 if v not in (None, "default")]
        if given:
            raise K3Error(f"{', '.join(given)} cannot be combined with an inventory: the selection comes from the "
                          "inventory's group_vars (k3_hardware, k3_strategy, ...) and its replicas from k3_replica")
        rollout, blanks, source = _from_inventory(inventory, overrides, read_nodes)
        tokens: dict[str, str] = {}
    else:
        if read_nodes:
            raise K3Error("--read-nodes reads an inventory's nodes: give the inventory instead of a selection")
        rollout, blanks, source, tokens = _from_selection(params, recipe_path, overrides, replicas or 1)
    written = _write_kubernetes(rollout, blanks, source, Path(output), tokens)
    if as_json:
        echo_json(written)
        return
    click.echo(f"wrote {len(written['files'])} file(s) to {output}: "
               f"{', '.join(o['kind'] + ' ' + o['name'] for o in written['objects'])}; "
               f"sh {written['check']}, then kubectl apply -f {output} (first read {written['readme']})")


def assumed_lines(rollout: Any, blanks: list[Any]) -> list[str]:
    """What the blanks' settings assume of each node instead of reading it (the vendor's GPU path to the RDMA ports:
    :func:`k3deploy.model.runbook.blanks.assumed`), as README.txt says it under the blanks."""
    from k3deploy.model.runbook.blanks import assumed
    from k3deploy.vendors import pack_for_container

    pack = pack_for_container(rollout.plan.vendor)
    return [f"   Assumed, not read: {text}." for text in assumed(pack.brand, blanks)] if pack is not None else []


def _refuse_blanks(blanks: list[Any]) -> None:
    """An export to apply leaves nothing to fill: each value the deploy would read from a node must be given."""
    from k3deploy.model.runbook.blanks import PORTS

    names = {b.name for b in blanks}
    if not names:
        return
    wanted = []
    if "IFACE" in names:
        wanted.append("--iface NAME (k3_iface: the cluster interface, `ip -o -4 addr show` on a node)")
    if PORTS in names:
        wanted.append("--ib-hca DEV:PORT,... (k3_ib_hca, each device with its port: `ibv_devinfo` on a node)")
    raise K3Error(f"export kubernetes reads no node, so what the deploy would read there must be given: "
                  f"{' and '.join(wanted)}; or, from an inventory, --read-nodes (over SSH, as the deploy reads them)")


def _write_kubernetes(rollout: Any, blanks: list[Any], source: str, out: Path,
                      tokens: dict[str, str]) -> dict[str, Any]:
    from k3deploy.model import kubecheck
    from k3deploy.model.kubernetes import templates_of
    from k3deploy.runtime.launchers import export_for
    from k3deploy.vendors import pack_for_container

    _refuse_blanks(blanks)
    export = export_for(rollout)
    objects = export.objects   # (refused here, before anything is written, where the rollout cannot be exported)
    checks = kubecheck.needs(rollout, list(objects.values()))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise K3Error(f"-o {out}: cannot create it: {exc.strerror}: choose a writable path") from None
    files: list[dict[str, Any]] = []
    for name, obj in objects.items():
        path = out / name
        path.write_text(_shown(export.text(name), tokens), encoding="utf-8")
        files.append({"file": str(path), "kind": obj["kind"], "name": obj["metadata"]["name"],
                      "apiVersion": obj["apiVersion"]})
    check = out / "check.sh"
    check.write_text(kubecheck.script(checks, str(out)), encoding="utf-8")
    os.chmod(check, 0o755)
    v = rollout.vars
    plan = rollout.plan
    ns = v.k3_k8s_namespace
    lines = [f"Kubernetes manifests of {plan.model} ({plan.strategy} on {plan.hardware}), written by "
             f"`k3deploy export kubernetes` from {source}; plan revision {export.revision}. Every object is in the "
             f"namespace {ns} ({files[0]['file'].rsplit('/', 1)[-1]}).", "",
             f"Prerequisites, each with the source of its minimum (sh {check} checks each on the cluster kubectl "
             "points at):"]
    lines += [f"   - {c.what} [{c.source}]" for c in checks]
    pack = pack_for_container(plan.vendor)
    if pack is not None and pack.transport.gpu_path_assumed and any(
            "NCCL_IB_HCA" == e.get("name") for o in objects.values() for t in templates_of(o)
            for c in t["spec"]["containers"] for e in c.get("env", [])):
        lines.append(f"   Assumed, not read: {pack.transport.gpu_path_assumed} (on Kubernetes: in k3_extra_env).")
    if pack is not None:
        lines += ["", "Preflight: where the site lets k3deploy reach the nodes over SSH, `k3deploy preflight "
                  "INVENTORY` runs every check below; where it does not, the site runs them itself on each node "
                  "before the pods start (Kubernetes checks none of them):"]
        for c in pack.all_checks():
            if c.where == "node" and c.id not in NOT_ON_KUBERNETES:
                lines.append(f"   {c.id}: {c.required}")
    lines += ["", f"The public endpoint: Service {ns}/{files[-1]['name']} (ClusterIP; expose it as the site does). "
              "LeaderWorkerSet recreates a whole group when one of its pods fails once the group has started "
              "(RecreateGroupAfterStart); workers wait for the head's rendezvous port in an init container. "
              "docs/kubernetes.md of k3deploy says more.", "", "Steps:"]
    secret_keys = " --from-file=HF_TOKEN=<file holding the token>" + (
        f" --from-file=VLLM_API_KEY={v.k3_api_key_file}" if v.k3_api_key_file else "")
    lines.append(f"1. Create the namespace and the Secret the pods read the Hugging Face token from (never written "
                 f"here; and one key per secret-named value of k3_extra_env): kubectl apply -f {files[0]['file']}; "
                 f"kubectl create secret generic -n {ns} {v.k3_k8s_secret}{secret_keys}")
    cache = (f"the PVC {ns}/{v.k3_k8s_cache_pvc}" if v.k3_k8s_cache_pvc else
             f"{v.k3_model_cache} on every node (hostPath)")
    lines.append(f"2. Put the weights in {cache}: the pods run with HF_HUB_OFFLINE=1 as the units do (the "
                 "deploy's stage does it over SSH; or set HF_HUB_OFFLINE: '0' in k3_extra_env to download).")
    lines.append(f"3. sh {check}   (one line per prerequisite: ok, or missing with its fix; exit 1 if one is "
                 "missing)")
    lines.append(f"4. kubectl apply -f {out}   (in file order: "
                 + ", ".join(f"{f['kind']} {f['name']}" for f in files) + ")")
    readme = out / "README.txt"
    readme.write_text(_shown("\n".join(lines) + "\n", tokens), encoding="utf-8")
    return {"dir": str(out), "readme": str(readme), "check": str(check), "namespace": ns,
            "revision": export.revision,
            "objects": [{"kind": f["kind"], "name": f["name"]} for f in files], "files": files}
