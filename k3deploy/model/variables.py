"""Deployment variables: every knob, its default and its documentation, in one typed model, and where each value
came from.

Values come, lowest precedence first, from the defaults below, ``group_vars/all.yml``, ``group_vars/<group>.yml``
for each group of the host (in inventory order), then the inventory's own data for the host, then ``--data``.
``group_vars/`` is looked up next to the inventory file, then one level above it (the project layout
``inventories/x.py`` + ``group_vars/``); the directory next to the inventory wins. The working directory plays no
part. Keys that are not ``k3_*`` must be pyinfra's connection settings (``ssh_user``, ``ssh_port``, ``_sudo``, ...):
they pass through to the connections k3deploy opens. The variable table of docs/variables.md is generated from this
model (``python -m k3deploy.model.variables``) and a test keeps them equal.

Every value is checked here, before anything reads a host: addresses and host names (``k3_ip``,
``k3_router_host``, ``ssh_hostname``) are IP addresses or RFC 1123 host names; paths on the nodes are absolute
with no ``..``; the unit name is a plain name; timeouts and intervals are positive; no string carries a control
character (a newline would end an env file's line) or exceeds :data:`MAX_TEXT` characters, a served model name
:data:`MAX_MODEL_NAME`; a group_vars file names each key once, is at most 1 MiB and its aliases expand to at most
100,000 values (:mod:`k3deploy.recipe.yamlfile`: refused before a value is built). Host and group names become
paths (a group's group_vars file, a node's directory of ``export slurm``): each must be one plain path component
(:func:`name_in_path_error`).

Example::

    >>> is_address("10.0.0.2"), is_address("node-1.example"), is_address("10.0.0.2/29501' ; reboot ; '")
    (True, True, False)
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from k3deploy.errors import K3Error
from k3deploy.model.secrets import API_KEY_ENV, argv_secret, mask_listing
from k3deploy.recipe import yamlfile
from k3deploy.recipe.yamlfile import BoundedLoader

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: one label of an RFC 1123 host name
HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
#: a unit name that is also a container name (docker's rule for names), with no path in it
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
#: characters no value may carry (C0 controls and DEL): a newline would end an env file's line or a script's
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: the longest string any variable (each item of a list, each env value) may be: far below the kernel's 128 KiB
#: per argument, so every script that carries values stays a valid command line
MAX_TEXT = 4096
#: the longest served model name (``--served-model-name``): it is in every readiness probe and every request
MAX_MODEL_NAME = 256
#: the most characters of one node's engine argv (its words and a separator each)
MAX_ARGV = 65536
#: a Slurm partition, account or QoS name (a comma-separated list of them where Slurm takes several)
SLURM_NAME = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
#: a Slurm time limit (``--time``): MINUTES, MINUTES:SECONDS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or unlimited
SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|(?i:unlimited|infinite)")
#: a ``--gres`` value: NAME[:TYPE][:COUNT], several comma-separated, or empty (none)
SLURM_GRES = re.compile(r"([A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)*(,[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)*)*)?")
#: a Linux network interface name (IFNAMSIZ: at most 15 characters, no / or space)
IFACE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")
#: the variables that are paths on the nodes
NODE_PATHS = ("k3_config_dir", "k3_model_cache", "k3_stage_dir", "k3_image_dir", "k3_router_bin",
              "k3_slurm_dir", "k3_imex_prolog")


def is_address(value: str) -> bool:
    """An IP address (v4 or v6) or an RFC 1123 host name."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        pass
    name = value[:-1] if value.endswith(".") else value
    return 0 < len(name) <= 253 and all(HOST_LABEL.fullmatch(label) for label in name.split("."))


#: a host or group name that becomes part of a path (a group's group_vars file, a node's directory of ``export
#: slurm``): one path component, as a unit name is (``..``, ``/`` and ``\\`` cannot be part of it)
PATH_NAME = re.compile(r"[A-Za-z0-9_@][A-Za-z0-9_.:@-]{0,252}")
#: a host of one of pyinfra's connectors: ``@local``, ``@fake/NAME``, ``@docker/IMAGE``
CONNECTOR_HOST = re.compile(r"@[a-z]+(/[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,252})?")


def name_in_path_error(kind: str, name: str) -> str | None:
    """Why a host's or group's name (``kind``: "host" or "group") cannot become part of a path, or None.

    >>> name_in_path_error("host", "gpu01"), name_in_path_error("host", "@fake/gpu01")
    (None, None)
    >>> name_in_path_error("host", "../../tmp/x")[:60]
    "host '../../tmp/x' is not a plain name (letters, digits, _ ."
    """
    if PATH_NAME.fullmatch(name) or (kind == "host" and CONNECTOR_HOST.fullmatch(name)):
        return None
    fix = "rename it in the inventory (its address goes in ssh_hostname)" if kind == "host" else \
        "rename the group in the inventory"
    return (f"{kind} {_shown(name)} is not a plain name (letters, digits, _ . : @ -, not starting with . or -; "
            f"it becomes a {'directory' if kind == 'host' else 'file'}'s name): {fix}")


def address_error(value: Any) -> str | None:
    """Why ``value`` is not an address or host name, or None."""
    if isinstance(value, str) and is_address(value):
        return None
    return f"{_shown(value)} is not an IP address or host name (RFC 1123: letters, digits, - and .)"


def _shown(value: Any, limit: int = 60) -> str:
    """A value for an error line: its repr, cut short with its length when it is long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value))} characters)"


def _check_text(where: str, text: str) -> None:
    if len(text) > MAX_TEXT:
        raise ValueError(f"{where} is {len(text)} characters long, over the limit of {MAX_TEXT}: shorten it")
    bad = CONTROL.search(text)
    if bad:
        raise ValueError(f"{where} holds the control character {bad.group()!r}: remove it (one line, printable "
                         "characters only)")


#: a Prometheus duration (prometheus/common model.ParseDuration): units from the largest, each at most once
PROM_DURATION = r"^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$"


class Variables(BaseModel):
    """All ``k3_*`` variables (group_vars YAML or inventory host data)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # selection
    k3_hardware: str | None = Field(None, description=(
        "Hardware id of every node (gb300, b300, h200, mi355x, ascend_910c, ...). Required."))
    k3_strategy: str | None = Field(None, description=(
        "Serving strategy; default: the recipe's recommendation for the hardware."))
    k3_variant: str = Field("default", description="Recipe variant (default, nvfp4, ascend_w4a8).")
    k3_features: list[str] | None = Field(None, description=(
        "Exactly these features; default: the recipe's default set."))
    k3_recipe: str | None = Field(None, description=(
        "Recipe YAML path on the control machine; default: the vendored Kimi-K3 recipe."))
    k3_extra_args: list[str] = Field(default_factory=list, description=(
        "Extra `vllm serve` arguments, one item per argv word, appended where the recipes site puts its advanced "
        "arguments (last-wins applies); checked against the pinned engine's flags before anything changes."))
    k3_extra_env: dict[str, str] = Field(default_factory=dict, description=(
        "Extra environment of every engine container (`NAME: value`), applied last: it overrides the plan's env "
        "and the settings derived from the hosts. A secret-named value (`*TOKEN*`, `*SECRET*`, `*PASSWORD*`, `*_KEY`, "
        "...) is kept only in the nodes' 0600 env files: every output masks it."))
    # image and files
    k3_image: str | None = Field(None, description=(
        "Image override: REPO:TAG, REPO@sha256:..., :TAG or @sha256:<digest> (the digest is verified after "
        "the pull)."))
    k3_image_resolve: bool = Field(True, description=(
        "A tag `k3_image` (REPO:TAG) is resolved to the digest the registry names for it, once per rollout (`docker "
        "buildx imagetools inspect` on the first engine node; nothing is pulled), and every node runs that build "
        "(by the local tag `REPO:k3-sha256-<hex>`; plan, status and history show `REPO@sha256:...`); a re-push of "
        "the tag is a change the next rollout rolls out to the whole group. false: run the tag as each node has it "
        "(nodes may run different builds). "
        "Not with `k3_image_archive` (pin its build with `k3_image: REPO@sha256:...`)."))
    k3_config_dir: str = Field("/etc/k3deploy", description=(
        "Directory for the env files (0600) and the revisions kept for rollback (`revisions/<group>/<N>/`)."))
    k3_unit_name: str = Field("k3-engine", description=(
        "systemd unit (and container) name of the engine; the router unit is `<name>-router`."))
    k3_model_cache: str = Field("/var/lib/k3deploy/cache", description=(
        "Host directory mounted as the container's `~/.cache` (Hugging Face weights, vLLM and JIT caches)."))
    k3_compile_cache: bool = Field(True, description=(
        "Keep every compile and JIT cache of the engines (vLLM's torch.compile, inductor, Triton, DeepGEMM, "
        "FlashInfer, the vendor's) in `k3_model_cache`/k3-compile/<key>, the key covering the image, the hardware "
        "and the engine arguments and `VLLM_*` variables vLLM's compile hash covers; a node that lacks its class's "
        "caches gets them from a peer in the stage (docs/operating.md#compile-caches). false: where vLLM puts them."))
    k3_readahead: bool = Field(False, description=(
        "Before an engine starts, read its node's shards once into the page cache (`nice`/`ionice` idle class), so "
        "the engine's weight load reads memory, not a cold disk or shared filesystem."))
    k3_weights_shared: bool = Field(False, description=(
        "`k3_model_cache` is one shared filesystem: download the weights from the head only."))
    k3_hf_token_file: str | None = Field(None, description=(
        "File on the control machine holding the Hugging Face token (must be mode 0600); copied to the nodes "
        "as 0600 and used only to download weights."))
    k3_api_key_file: str | None = Field(None, description=(
        "File on the control machine holding the API key that protects the endpoint (one line; the file must be mode "
        "0600): every unit's env file (0600) on the nodes gets it as `VLLM_API_KEY`, which vLLM reads (it then "
        "answers 401 on `/v1/*` without `Authorization: Bearer <key>`; `/health` and `/metrics` stay open), and "
        "every client k3deploy runs (readiness gate, smoke test, SLO probe, status) sends it from there. Never "
        "`--api-key` in `k3_extra_args`: an argv is seen by `ps` and written into the unit file."))
    k3_download_weights: bool = Field(True, description=(
        "Download missing weights with the Hugging Face tooling in the image; false = weights must already be"
        " in the cache."))
    k3_stage: Literal["chain", "fanout", "per_node"] = Field("chain", description=(
        "How the image and the weights reach the nodes: over the uplink once (to the first engine node), then node "
        "to node over the cluster network (rsync): `chain` = along a pipelined chain, each node handing every file on "
        "as it lands (about one copy's time whatever N; a failed hop is routed around); `fanout` = a tree of "
        "log2(N) rounds of whole copies; `per_node` = every node fetches from outside itself."))
    k3_stage_sources: int = Field(1, ge=1, description=(
        "With `chain` or `fanout`: how many nodes fetch from outside in parallel when no node holds an artifact yet "
        "(with `chain`: one chain from each)."))
    k3_stage_hop_timeout: int = Field(10, ge=1, le=600, description=(
        "With `chain`: seconds a node waits on the peer before it in the chain (no connection, or no new byte while "
        "that peer's copy does not grow) before it routes around it and copies from the peer before that one."))
    k3_stage_dir: str = Field("/var/lib/k3deploy/stage", description=(
        "Directory on the nodes for image archives while they are handed to peers (removed after the stage)."))
    k3_stage_port: int = Field(8873, ge=1, le=65535, description=(
        "TCP port of the read-only rsync daemon that serves staged files to peers during the stage (cluster "
        "addresses only)."))
    k3_image_archive: str | None = Field(None, description=(
        "Air-gapped sites: a `docker save` archive of the image on the control machine; copied (rsync over SSH, "
        "resumable) to the first engine node, loaded, then fanned out. No registry is contacted. Checked before "
        "anything is copied: every member whole, `manifest.json` and every config and layer it names there."))
    k3_weights_source: str | None = Field(None, description=(
        "Air-gapped sites: the model's Hugging Face cache directory on the control machine (`models--ORG--NAME`, "
        "as `hf download` leaves it); copied (rsync over SSH) to the first engine node, verified, then fanned out. "
        "Checked before anything is copied: every shard its index names there, each as long as its safetensors "
        "header says; a source that lacks one refuses the run."))
    k3_hf_endpoint: str | None = Field(None, description=(
        "Model hub endpoint (`HF_ENDPOINT`) for the download, e.g. a site mirror; default: the hub."))
    k3_image_dir: str | None = Field(None, description=(
        "Where the container runtime stores images (preflight's free-space check); default: Docker's "
        "DockerRootDir."))
    k3_docker: str = Field("/usr/bin/docker", description="Container CLI on the nodes.")
    # network
    k3_iface: str | None = Field(None, description=(
        "Cluster interface for NCCL/GLOO; default: the interface carrying the node's inventory address (from "
        "facts)."))
    k3_dp_rpc_port: int = Field(29550, ge=1, le=65535, description=(
        "DP handshake port (`--data-parallel-rpc-port`); fills `$PREFILL_DP_RPC_PORT`/`$DECODE_DP_RPC_PORT`."))
    k3_router_port: int = Field(30000, ge=1, le=65535, description=(
        "Port of the public endpoint when a router fronts the engines (pd_cluster, hybrid-LB multi_node_dep, "
        "replicas)."))
    k3_router_host: str = Field("0.0.0.0", description="Bind address of the router.")
    k3_router_image: str | None = Field(None, description=(
        "Run the router from this image; default: `k3_router_bin` on the router host. A tag is pinned to the "
        "digest the registry names for it as `k3_image` is (`k3_image_resolve`; asked from the router's host): the "
        "router runs that build, pulled by its digest before it restarts, and its revision records it; a re-push "
        "of the tag is a change of the router."))
    k3_router_bin: str = Field("/usr/local/bin/vllm-router", description=(
        "Absolute path of the `vllm-router` command on the router host (`pip install vllm-router` puts it in "
        "`/usr/local/bin`), the router unit's `ExecStart`; not used with `k3_router_image`."))
    k3_replica: int = Field(0, ge=0, description=(
        "Per host: the replica (engine group) the host belongs to, 0..R-1; each replica has its own head (group "
        "`head`) and workers (ranks within the replica). With R > 1 one vllm-router in front of every replica is the "
        "endpoint (`k3_router_port`), and engine changes roll replica by replica. Not for pd_cluster."))
    k3_max_unavailable: int = Field(1, ge=1, description=(
        "Replicas restarted at once by a rolling change (each is taken out of the router first, drained, "
        "restarted, gated on serving, and put back before the next)."))
    k3_drain_timeout: int = Field(60, gt=0, description=(
        "Seconds a replica taken out of the router may take to finish its in-flight requests "
        "(`vllm:num_requests_running` + `vllm:num_requests_waiting` = 0) before it is restarted anyway."))
    k3_vip: str | None = Field(None, description=(
        "The site's virtual address (an IPv4 address in the cluster's subnet, held by no host): the endpoint clients "
        "use, kept across a head's replacement. keepalived (VRRP) runs on every engine host and spare; only the host "
        "that serves the endpoint (the head, or the router's host), while its `/health` answers, holds it. The "
        "endpoint becomes `http://<k3_vip>:<port>` in `status`, the smoke test and the runbook. Default: none (the "
        "endpoint is the head's or the router's own address)."))
    k3_vip_interface: str | None = Field(None, description=(
        "Interface the virtual address and VRRP use on every host; default: the interface carrying the host's cluster "
        "address (`k3_iface`, or from its facts)."))
    k3_vip_router_id: int = Field(51, ge=1, le=255, description=(
        "VRRP `virtual_router_id` of the virtual address: unique among the VRRP instances of the hosts' network."))
    k3_vip_prefix: int = Field(24, ge=1, le=32, description=(
        "Prefix length the virtual address is added with (that of the cluster's subnet)."))
    k3_front_hybrid_lb: bool = Field(True, description=(
        "Put a vllm-router in front of hybrid-LB nodes (multi_node_dep) so clients get one endpoint."))
    k3_ib_hca: str | None = Field(None, description=(
        "RDMA ports for NCCL and the P/D KV transfer, `device[:port],...` (e.g. `mlx5_0:1,mlx5_3:1`; a device alone = "
        "its active ports): become `NCCL_IB_HCA` (exact match, `=mlx5_0:1,...`) and `UCX_NET_DEVICES`, and preflight "
        "fails a host that lacks one. Default: the active ports (InfiniBand only beside an InfiniBand fabric), only "
        "HCAs `PIX`/`PXB` to a GPU in `nvidia-smi topo -m` where it tells them apart, never the port of the default "
        "route, no BlueField DPU's beside GPU NICs, each port once (a DGX Spark's second PCIe name left out)."))
    k3_nccl_probe: bool = Field(False, description=(
        "Preflight runs, before anything changes, a two-node NCCL all-reduce in the plan's image on the planned nodes "
        "(in pairs, `NCCL_DEBUG=INFO`, the derived NCCL settings) and fails a node whose NCCL transport is not "
        "GPUDirect RDMA (`via NET/IB/<n>/GDRDMA`). The image must be on the nodes already (it pulls nothing)."))
    k3_rdma_reach: bool = Field(False, description=(
        "With expert parallelism across nodes (DeepEP's all-to-all crosses rails), preflight pings each chosen RDMA "
        "port of each node from each chosen port of the other nodes of its group (one command per host) and fails "
        "the pairs that do not answer (`rdma.reach`): a rail-only fabric. Off by default, as `k3_nccl_probe`: a group "
        "of N nodes with P ports each sends (N-1)·P² pings from every node."))
    # timing
    k3_engine_ready_timeout: int | None = Field(None, gt=0, description=(
        "Seconds an engine may take to serve; default: the plan's VLLM_ENGINE_READY_TIMEOUT_S (600 if unset)."))
    k3_rendezvous_timeout: int = Field(300, gt=0, description=(
        "Seconds to wait for the head's rendezvous port before starting workers."))
    k3_rollout_deadline: int | None = Field(None, gt=0, description=(
        "Overall deadline of the start phase in seconds; default: engine-ready timeout + 900."))
    k3_poll_interval: float = Field(5.0, gt=0, description="Seconds between readiness polls.")
    k3_link_timeout: int = Field(30, ge=5, le=3600, description=(
        "Seconds a node's SSH connection may stay silent (a cut link, a frozen node) before the run names the node "
        "as not answering and goes on without it (SSH and TCP keepalives, TCP_USER_TIMEOUT); a wait that runs on a "
        "node also ends at its own timeout plus this margin, seen from the control machine."))
    k3_lock_lease: int = Field(60, ge=10, le=3600, description=(
        "Seconds of the deployment lock's lease: a run renews it on every host it holds every quarter of this; a "
        "holder on another control machine that has not renewed it for this long counts as gone (`k3deploy unlock` "
        "removes its lock, the next run takes it over)."))
    # day 2: what the nodes do on their own
    k3_heal: bool = Field(True, description=(
        "Self-healing groups: every member of a multi-node engine group that is not its head gets a watcher "
        "(`k3-group-member watch`, a transient unit bound to the engine unit): once the head served (or the member, "
        "where it serves an API of its own), a head that stops serving for `k3_heal_grace` seconds makes the member "
        "restart and join the head's next rendezvous."))
    k3_heal_grace: int = Field(30, ge=1, description=(
        "Seconds a group's head may not serve before its members restart (covers a short /health blip)."))
    k3_heal_interval: int = Field(5, ge=1, description="Seconds between a watcher's /health probes of its head.")
    k3_fence_port: int = Field(8479, ge=1, le=65535, description=(
        "TCP port on which every engine node answers its fence record (who holds each rank, read-only; "
        "`k3-fence-PORT.socket`): an engine unit starts only where its node still holds its rank in the newest record "
        "of its peers', so a tray whose rank a spare took does not start its engine when it comes back "
        "(docs/spares.md, *Fencing*). Open between the cluster's nodes."))
    k3_restart_sec: int = Field(10, ge=1, description=(
        "`RestartSec=` of the engine units: the wait before systemd starts a failed engine again."))
    k3_restart_max_delay: int = Field(300, ge=0, description=(
        "Crash-loop backoff of the engine units: from the 2nd failure in a row each start waits `k3_restart_sec`, "
        "then twice as long each time, at most this many seconds (0: no backoff, `RestartSec=` only)."))
    k3_crash_loop_window: int = Field(120, ge=0, description=(
        "`k3deploy status`: an engine unit that serves no HTTP (a group member) and that systemd restarted 3 times "
        "or more is shown as `crash-loop` until it has run this many seconds (a run that lasts is taken as fixed)."))
    # day 2: the watch loop, `k3deploy watch INVENTORY --repair` (docs/watch.md)
    k3_watch_grace: int = Field(300, ge=0, description=(
        "`k3deploy watch --repair`: seconds a group may not serve before the loop runs the deploy to repair it (a "
        "group whose members are all starting gets at least the engine's ready timeout); longer than self-healing "
        "takes (`k3_heal_grace` + `k3_restart_sec` + a rendezvous), shorter than a lost tray should cost."))
    k3_watch_interval: int = Field(30, ge=1, description=(
        "`k3deploy watch`: seconds between two looks at the groups (one status read: one command per host)."))
    k3_watch_backoff: int = Field(300, ge=1, description=(
        "`k3deploy watch --repair`: seconds to wait after a repair that did not bring a group back before the next; "
        "doubled after each further one, up to `k3_watch_backoff_max`."))
    k3_watch_backoff_max: int = Field(3600, ge=1, description=(
        "`k3deploy watch --repair`: the longest wait between two repairs of a group that stays down."))
    k3_smoke_test: bool = Field(True, description=(
        "Send one short chat completion through the public endpoint after the rollout."))
    # SLO gate and canary (docs/gate.md)
    k3_slo_gate: Literal["auto", "on", "off"] = Field("auto", description=(
        "The SLO gate: once a restarted group serves, a probe load (`k3_slo_requests`, ...) through its own endpoint, "
        "judged by time to first token and inter-token latency at p95 (the engines' `/metrics` histograms) and "
        "failed requests. `auto` = on for a rolling change over replicas: the first replica of the roll (the canary) "
        "against a replica still on the previous revision, under the same load, before it is put back into the "
        "router; a canary that misses goes back to its previous revision and the roll stops. `on` = also a single "
        "group (against its previous revision's recorded figures and the absolute targets; `k3_auto_rollback`); "
        "`off` = never. A rollback (`k3_rollback`) is not gated."))
    k3_slo_relative: float | None = Field(1.5, ge=1.0, description=(
        "The gate's relative target: TTFT and ITL at p95 at most this many times the baseline's (the replicas still "
        "on the previous revision, or its recorded figures); null = absolute targets only."))
    k3_slo_ttft_p95_ms: float | None = Field(None, gt=0, description=(
        "Absolute target of the gate: time to first token at p95, in milliseconds, under the probe load; default: "
        "none."))
    k3_slo_itl_p95_ms: float | None = Field(None, gt=0, description=(
        "Absolute target of the gate: inter-token latency at p95, in milliseconds, under the probe load; default: "
        "none."))
    k3_slo_requests: int = Field(20, ge=1, le=10000, description=(
        "Requests of the gate's probe load (streamed completions; any that fails misses the gate)."))
    k3_slo_concurrency: int = Field(4, ge=1, le=1024, description=(
        "Requests of the probe load in flight at once."))
    k3_slo_prompt_tokens: int = Field(256, ge=1, le=1000000, description=(
        "Prompt length of each probe request, in tokens (words of one token each)."))
    k3_slo_output_tokens: int = Field(64, ge=2, le=100000, description=(
        "Tokens each probe request generates (exactly: `ignore_eos`)."))
    k3_auto_rollback: bool = Field(False, description=(
        "A single group (no replicas) that misses the gate (`k3_slo_gate: on`) goes back to its previous revision "
        "at once (stopped, restored, started: the endpoint is down for another restart); false = it keeps serving "
        "the change and the run exits non-zero with the figures (roll back with `--data k3_rollback=true`). A "
        "canary always goes back (docs/gate.md)."))
    k3_slo_baseline: Literal["recorded", "bench"] = Field("recorded", description=(
        "What a single group's gate compares with: `recorded` = the figures the gate recorded for the previous "
        "revision; `bench` = the last `k3deploy bench` of the previous revision (its TTFT and ITL p95 at the "
        "concurrency nearest `k3_slo_concurrency`), else the gate's own record."))
    k3_correctness_probe: bool = Field(False, description=(
        "Ask the engines a small fixed set of questions with known answers (temperature 0, a few tokens) in the "
        "smoke test and the SLO gate: a wrong answer fails the smoke test and misses the gate, naming the prompt, "
        "the expected answer and the one given (docs/gate.md)."))
    # benchmark (docs/gate.md, k3deploy bench)
    k3_bench_input_tokens: int = Field(1024, ge=1, le=1000000, description=(
        "`k3deploy bench`: prompt tokens of each request (`vllm bench serve --random-input-len`, InferenceX's 1k)."))
    k3_bench_output_tokens: int = Field(1024, ge=1, le=1000000, description=(
        "`k3deploy bench`: tokens each request generates (`--random-output-len`, exactly: `ignore_eos`)."))
    k3_bench_concurrency: list[int] = Field(default_factory=lambda: [4, 16, 64], description=(
        "`k3deploy bench`: the concurrency sweep, one `vllm bench serve` run per value (`--max-concurrency`)."))
    k3_bench_rounds: int = Field(5, ge=1, le=1000, description=(
        "`k3deploy bench`: requests per run = this times its concurrency (`--num-prompts`)."))
    # monitoring: `k3deploy export prometheus` (docs/monitoring.md)
    k3_cluster_name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", description=(
        "The `cluster` label of every scrape target `k3deploy export prometheus` writes; default: the inventory "
        "file's name without its extension."))
    k3_prom_scrape_interval: str = Field("15s", pattern=PROM_DURATION, description=(
        "`scrape_interval` of the exported prometheus.yml (a Prometheus duration: 15s, 1m, ...)."))
    k3_prom_evaluation_interval: str = Field("15s", pattern=PROM_DURATION, description=(
        "`evaluation_interval` of the exported prometheus.yml: how often the recording and alerting rules run."))
    k3_prom_rate_window: str = Field("5m", pattern=PROM_DURATION, description=(
        "The window of every `rate()` in the exported rules and dashboard (at least four scrape intervals)."))
    k3_alert_for: str = Field("5m", pattern=PROM_DURATION, description=(
        "How long an exported alert's condition must hold before it fires (its `for:`)."))
    k3_alert_ttft_p99_warn_s: float = Field(10.0, gt=0, description=(
        "Alert K3TTFTHigh (warning): a group's time to first token at p99 above this many seconds (llm-d's default)."))
    k3_alert_ttft_p99_critical_s: float = Field(30.0, gt=0, description=(
        "Alert K3TTFTCritical: a group's time to first token at p99 above this many seconds (llm-d's default)."))
    k3_alert_kv_cache: float = Field(0.9, gt=0, le=1, description=(
        "Alert K3KVCacheHigh: an engine's KV-cache use (`vllm:kv_cache_usage_perc`, 0..1) above this."))
    k3_alert_decode_kv_cache: float = Field(0.95, gt=0, le=1, description=(
        "Alert K3DecodeKVCacheHigh: a decode engine's KV-cache use (0..1) above this (P/D)."))
    k3_alert_queue: float = Field(50, ge=0, description=(
        "Alert K3QueueLong: requests waiting in an engine (`vllm:num_requests_waiting`) above this."))
    k3_alert_preemptions_per_s: float = Field(1.0, ge=0, description=(
        "Alert K3Preemptions: an engine's preemptions per second above this."))
    k3_alert_pd_imbalance: float = Field(3.0, gt=1, description=(
        "Alert K3PDImbalance: requests waiting in the prefill pool over those in the decode pool, or the reverse, "
        "above this ratio (P/D)."))
    k3_alert_prefix_hit: float = Field(0.3, ge=0, le=1, description=(
        "Alert K3PrefixHitLow: a group's prefix-cache hit rate (hits over queried tokens, 0..1) below this while it "
        "serves."))
    k3_router_metrics_port: int = Field(29000, ge=0, le=65535, description=(
        "Port of vllm-router's Prometheus metrics on the router host (its `--prometheus-port` default), scraped by "
        "the exported configuration: every router gets `--prometheus-port` = this and `--prometheus-host` = "
        "`k3_router_host` (vllm-router's default host is 127.0.0.1); 0: not scraped, no flags added."))
    k3_node_exporter_port: int = Field(9100, ge=0, le=65535, description=(
        "Port of the Prometheus node exporter on every node, scraped by the exported configuration; 0: not "
        "scraped."))
    k3_gpu_exporter_port: int | None = Field(None, ge=0, le=65535, description=(
        "Port of the accelerators' exporter on every engine node (DCGM, AMD device-metrics-exporter, Ascend "
        "npu-exporter); default: the vendor pack's (9400, 5000, 8082); 0: not scraped."))
    # launcher: systemd units (default) or Slurm batch jobs (docs/slurm.md)
    k3_launcher: Literal["systemd", "slurm"] = Field("systemd", description=(
        "What starts the engines: `systemd` = one unit per node (`k3_unit_name`); `slurm` = each engine group (each "
        "replica, each P/D pool) and the router becomes a Slurm batch job submitted from `k3_slurm_submit_host`, "
        "running the same containers (docs/slurm.md)."))
    k3_slurm_submit_host: str | None = Field(None, description=(
        "With `k3_launcher: slurm`: the inventory host (a login or controller node) on which `sbatch`, `squeue`, "
        "`scancel` and `sacct` run, over SSH like every host. Required with slurm."))
    k3_slurm_partition: str | None = Field(None, description=(
        "Slurm partition of the jobs (`--partition`); default: the site's default partition."))
    k3_slurm_account: str | None = Field(None, description=(
        "Slurm account of the jobs (`--account`); default: the user's default account."))
    k3_slurm_qos: str | None = Field(None, description="Slurm QoS of the jobs (`--qos`); default: the site's.")
    k3_slurm_time: str | None = Field(None, description=(
        "Time limit of the jobs (`--time`: MINUTES, HH:MM:SS, D-HH:MM:SS or UNLIMITED); default: the partition's. "
        "A job that reaches it ends like a failed one: the next run submits it again."))
    k3_slurm_exclusive: Literal["node", "user"] = Field("node", description=(
        "`node` = `--exclusive` (no other job on a job's nodes); `user` = `--exclusive=user` (only this user's jobs: "
        "k3deploy's own jobs may share a node, e.g. the router beside a P/D pool)."))
    k3_slurm_gres: str = Field("{gres}:{gpus_per_node}", description=(
        "`--gres` of each engine job (`{gres}` = the vendor pack's GRES name: `gpu` for NVIDIA and AMD, `npu` for "
        "Ascend; `{gpus_per_node}` = the hardware's GPUs per node); e.g. `gpu:{gpus_per_node}` where a site names "
        "its NPUs `gpu`; `\"\"` = no `--gres` (a site without GPU GRES). The router's job asks for none."))
    k3_slurm_dir: str = Field("/var/lib/k3deploy/slurm", description=(
        "Directory for the batch scripts (on `k3_slurm_submit_host`) and the jobs' and steps' output "
        "(`<dir>/<group>/<job id>/<node>.out` on each node)."))
    k3_slurm_segment: bool | Literal["auto"] = Field(False, description=(
        "Render `#SBATCH --segment=<nodes of the group>`: the group's nodes in one block of the site's "
        "topology/block plugin (an NVL72 rack). Slurm accepts it beside `--nodelist` from 25.11: `true` is refused "
        "on an older Slurm (`k3_slurm_version`); `auto` = only where the site's Slurm is 25.11 or later."))
    k3_slurm_version: str = Field("auto", description=(
        "The site's Slurm version, MAJOR.MINOR: what the job scripts may use. `auto` = as the submit host's "
        "`scontrol --version` says (read by preflight, plan and the deploy; not known to `export slurm`)."))
    k3_imex: Literal["auto", "standing", "per_job"] = Field("auto", description=(
        "How the site runs IMEX on GB200/GB300 trays (multi-node NVLink): `standing` = one IMEX domain always up, "
        "channel 0 on every tray (preflight checks the daemon, channel 0 and the domain); `per_job` = a channel per "
        "Slurm job (`k3_launcher: slurm` only; `SwitchType=switch/nvidia_imex`, Slurm >= 24.05, or the site's "
        "prolog `k3_imex_prolog`): "
        "preflight checks the IMEX packages and the site's Slurm, each job's launch script passes the channel(s) "
        "the job was given. `auto` = per_job where the submit host's `scontrol show config` says switch/nvidia_imex "
        "(or `k3_imex_prolog` is set), else standing (docs/slurm.md)."))
    k3_imex_prolog: str | None = Field(None, description=(
        "With per-job IMEX and no switch/nvidia_imex: the site's Slurm prolog that writes each job's "
        "`nodes_config.cfg`, starts IMEX and creates the job's channel (preflight wants it in the submit host's "
        "`scontrol show config` `Prolog`)."))
    k3_slurm_requeue_max: int = Field(3, ge=0, le=100, description=(
        "Times a group's job requeues itself when a step ends after the group served (a node failed, an engine "
        "died): Slurm starts it again, whole, on the same nodes after its requeue delay. 0: never; the next deploy "
        "run submits it again."))
    k3_slurm_container: Literal["pyxis", "docker", "apptainer"] | None = Field(None, description=(
        "How a Slurm job's steps run the engine containers: `pyxis` = `srun --container-image` of a squashfs the "
        "stage makes on each node (`enroot import`), the container inside the job's cgroup; `docker` = `docker run` "
        "on the node (outside the job's cgroup); `apptainer` = `apptainer exec` of a SIF the stage makes. Unset: "
        "the vendor pack's (NVIDIA `pyxis`, AMD `apptainer`, Ascend `docker`; docs/slurm.md)."))
    k3_slurm_user: str | None = Field(None, description=(
        "The user the Slurm jobs are submitted, read and cancelled as (`runuser -u USER --` on "
        "`k3_slurm_submit_host`: a site with `DisableRootJobs`); the job's files on the nodes are made readable by "
        "it. Unset: the SSH user of the submit host."))
    # Kubernetes export (`k3deploy export kubernetes`, docs/kubernetes.md)
    k3_k8s_host_network: bool = Field(True, description=(
        "Kubernetes export: engine pods use the node's network (`hostNetwork`), as the units' `--network host`: "
        "NCCL/GLOO/UCX see the node's interfaces and RDMA ports under the names the plan sets; false: the pod "
        "network (only where the CNI carries RDMA, e.g. SR-IOV/Multus, added by the site)."))
    k3_k8s_namespace: str = Field("k3", description=(
        "Kubernetes export: the namespace of every object, written as a `Namespace` labelled with the PodSecurity "
        "level its pods need (`privileged` with host networking, hostPath volumes or added capabilities)."))
    k3_k8s_gpus: Literal["device-plugin", "dra"] = Field("device-plugin", description=(
        "Kubernetes export: how the engine pods get their accelerators. `device-plugin`: the vendor's extended "
        "resource (`nvidia.com/gpu`, `amd.com/gpu`, `huawei.com/Ascend910`: data of the packs), what the GPU "
        "operators install by default and every vendor has; `dra`: a `ResourceClaimTemplate` of the vendor's DRA "
        "DeviceClass (`gpu.nvidia.com`, `gpu.amd.com`; `resource.k8s.io/v1`, Kubernetes >= 1.34), for clusters "
        "whose GPUs only a DRA driver hands out (they have no extended resource)."))
    k3_k8s_rdma: Literal["device-plugin", "dra"] = Field("device-plugin", description=(
        "Kubernetes export, multi-node: how the engine pods get their RDMA devices. `device-plugin`: "
        "`k3_k8s_rdma_count` of `k3_k8s_rdma_resource`; `dra`: a `ResourceClaimTemplate` of `k3_k8s_rdma_count` "
        "devices of the DeviceClass `k3_k8s_rdma_class`. Never `/dev/infiniband` by hostPath: an unprivileged "
        "container gets no access to device nodes mounted so."))
    k3_k8s_rdma_resource: str = Field("rdma/rdma_shared_device_a", description=(
        "Kubernetes export, multi-node, `k3_k8s_rdma: device-plugin`: the extended resource of the site's RDMA "
        "device plugin. Default: the name NVIDIA's Network Operator configures for the k8s-rdma-shared-dev-plugin "
        "(one resource shares every selected HCA of the node, all an engine uses); e.g. `nvidia.com/hostdev` "
        "with SR-IOV's device plugin (then `k3_k8s_rdma_count` = the NICs per pod)."))
    k3_k8s_rdma_class: str | None = Field(None, description=(
        "Kubernetes export, multi-node, `k3_k8s_rdma: dra`: the DeviceClass of the site's RDMA DRA driver (no "
        "default: each driver names its own); the export refuses `dra` without it."))
    k3_k8s_rdma_count: int = Field(1, ge=1, le=64, description=(
        "Kubernetes export, multi-node: RDMA devices (device-plugin resources or DRA devices) per engine pod; 1 for "
        "a shared-device resource, the NICs per node for one device per NIC."))
    k3_k8s_cache_pvc: str | None = Field(None, description=(
        "Kubernetes export: a PersistentVolumeClaim (ReadWriteMany) holding the model cache; default: the node's "
        "`k3_model_cache` directory as a hostPath volume, as on bare metal."))
    k3_k8s_secret: str = Field("k3deploy-secrets", description=(
        "Kubernetes export: the Secret the pods read `HF_TOKEN` (key `HF_TOKEN`, optional) and every secret-named "
        "env value (key = its name) from, by reference; no value is written into a manifest."))
    k3_k8s_topology_key: str = Field("nvidia.com/gpu.clique", description=(
        "Kubernetes export, NVL trays (GB200/GB300): the node label whose value is one NVLink domain; each group is "
        "kept inside one (`leaderworkerset.sigs.k8s.io/exclusive-topology`)."))
    # per host / per run
    k3_ip: str | None = Field(None, description=(
        "Per host: its address on the cluster network (fills `$HEAD_IP`, `$PREFILL_NODE_n`, ...); default: "
        "`ssh_hostname`."))
    k3_rollback: bool | int = Field(False, description=(
        "Per run: `--data k3_rollback=true` goes back to each group's previous revision that served, "
        "`--data k3_rollback=N` to revision N (`k3deploy history`; also one that never served); the group restarts "
        "in order."))

    @property
    def recipe_path(self) -> str | None:
        return self.k3_recipe

    @field_validator("k3_hf_token_file", "k3_api_key_file", "k3_image_archive", "k3_weights_source", "k3_recipe")
    @classmethod
    def _home(cls, value: str | None) -> str | None:
        """Paths on the control machine may start with ``~`` (as in the example group_vars)."""
        return None if value is None else str(Path(value).expanduser())

    @field_validator("k3_bench_concurrency")
    @classmethod
    def _sweep(cls, value: list[int]) -> list[int]:
        if not value or any(c < 1 or c > 4096 for c in value):
            raise ValueError("the concurrency sweep is a list of 1 to 4096 requests at once each, e.g. [4, 16, 64]")
        return sorted(set(value))

    @field_validator("k3_extra_env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{_shown(name)} is not an environment variable name (letters, digits, _)")
            _check_text(f"the value of {name}", str(text))
        return {k: str(x) for k, x in value.items()}

    @field_validator("*")
    @classmethod
    def _texts(cls, value: Any) -> Any:
        """Every string (each item of a list, each key of a mapping) is bounded and printable."""
        if isinstance(value, str):
            _check_text("the value", value)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, str):
                    _check_text(f"item {i}", item)
        elif isinstance(value, dict):
            for key in value:
                _check_text("a name", str(key))
        return value

    @field_validator("k3_extra_args")
    @classmethod
    def _served_name(cls, value: list[str]) -> list[str]:
        """A served model name (``--served-model-name NAME...`` or ``=NAME``) is at most :data:`MAX_MODEL_NAME`
        characters; all the items together at most :data:`MAX_ARGV`."""
        from k3deploy.recipe.argv import is_flag

        total = sum(len(item) + 1 for item in value)
        if total > MAX_ARGV:
            raise ValueError(f"the items are {total} characters long together, over the limit of {MAX_ARGV} for a "
                             "node's argv: shorten them")
        names: list[str] = []
        for i, item in enumerate(value):
            flag, eq, rest = item.partition("=")
            if flag.replace("_", "-") != "--served-model-name":
                continue
            if eq:
                names.append(rest)
            else:
                for word in value[i + 1:]:
                    if is_flag(word):
                        break
                    names.append(word)
        for name in names:
            if len(name) > MAX_MODEL_NAME:
                raise ValueError(f"the served model name is {len(name)} characters long, over the limit of "
                                 f"{MAX_MODEL_NAME}: shorten it")
        return value

    @field_validator("k3_vip")
    @classmethod
    def _vip(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            addr = ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{_shown(value)} is not an IPv4 address: give a free address of the cluster's subnet, "
                             "e.g. 10.0.0.250") from None
        if addr.version != 4 or addr.is_loopback or addr.is_multicast or addr.is_unspecified:
            raise ValueError(f"{_shown(value)} cannot be a virtual address (IPv4 unicast only): give a free address of "
                             "the cluster's subnet, e.g. 10.0.0.250")
        return value

    @field_validator("k3_vip_interface")
    @classmethod
    def _vip_interface(cls, value: str | None) -> str | None:
        if value is not None and not IFACE_NAME.fullmatch(value):
            raise ValueError(f"{_shown(value)} is not a network interface name (at most 15 letters, digits, _ . -): "
                             "give one such as eth0 or bond0")
        return value

    @field_validator("k3_ip", "k3_router_host")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and (why := address_error(value)):
            raise ValueError(why)
        return value

    @field_validator(*NODE_PATHS)
    @classmethod
    def _node_path(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or ".." in value.split("/")):
            raise ValueError(f"{_shown(value)} is not an absolute path without '..' on the nodes: give one such as "
                             "/var/lib/k3deploy")
        return value

    @field_validator("k3_slurm_submit_host")
    @classmethod
    def _submit_host(cls, value: str | None) -> str | None:
        if value is not None and not is_address(value):
            raise ValueError(f"{_shown(value)} is not an inventory host name (RFC 1123: letters, digits, - and .): "
                             "give the name of the login or controller host in the inventory")
        return value

    @field_validator("k3_slurm_partition", "k3_slurm_account", "k3_slurm_qos")
    @classmethod
    def _slurm_name(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_NAME.fullmatch(value):
            raise ValueError(f"{_shown(value)} is not a Slurm name (letters, digits, _ . - and commas between "
                             "several): give one as `sinfo`/`sacctmgr` list it")
        return value

    @field_validator("k3_slurm_user")
    @classmethod
    def _slurm_user(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", value):
            raise ValueError(f"{_shown(value)} is not a user name (lower-case letters, digits, _ and -, at most 32): "
                             "give the site's user the jobs run as, as `id -un` prints it")
        return value

    @field_validator("k3_slurm_time")
    @classmethod
    def _slurm_time(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_TIME.fullmatch(value):
            raise ValueError(f"{_shown(value)} is not a Slurm time limit: give MINUTES, HH:MM:SS, D-HH:MM:SS or "
                             "UNLIMITED (e.g. 7-00:00:00)")
        return value

    @field_validator("k3_slurm_gres")
    @classmethod
    def _slurm_gres(cls, value: str) -> str:
        if not SLURM_GRES.fullmatch(value.replace("{gpus_per_node}", "1").replace("{gres}", "gpu")):
            raise ValueError(f"{_shown(value)} is not a --gres value: give NAME[:TYPE]:COUNT (e.g. gpu:4 or "
                             "gpu:{gpus_per_node}), or \"\" for none")
        return value

    @field_validator("k3_slurm_version")
    @classmethod
    def _slurm_version(cls, value: str) -> str:
        if value != "auto" and not re.fullmatch(r"\d{2}\.\d{1,2}(\.\d+)?", value):
            raise ValueError(f"{_shown(value)} is not a Slurm version: give MAJOR.MINOR as `scontrol --version` "
                             "prints it (e.g. 25.11), or auto")
        return value

    @field_validator("k3_unit_name")
    @classmethod
    def _unit_name(cls, value: str) -> str:
        if not UNIT_NAME.fullmatch(value):
            raise ValueError(f"{_shown(value)} is not a plain unit name (letters, digits, _ . -, starting with a "
                             "letter or digit, at most 128): give one such as k3-engine")
        return value


class _DuplicateKey(yaml.MarkedYAMLError):
    pass


class UniqueKeyLoader(BoundedLoader):
    """YAML's safe loader, bounded (:mod:`k3deploy.recipe.yamlfile`: the file's size, its aliases' expansion),
    refusing a mapping that names a key twice (the plain loader keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise _DuplicateKey(problem=f"duplicate key {key!r} (first on line {seen[key] + 1}): the last "
                                        "would win silently; keep one", problem_mark=key_node.start_mark)
                seen[key] = key_node.start_mark.line
            except TypeError:   # an unhashable key: the base loader says so
                break
        mapping: dict[Any, Any] = super().construct_mapping(node, deep)
        return mapping


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yamlfile.parse(yamlfile.read(path), str(path), UniqueKeyLoader)
    except OSError as exc:
        raise K3Error(f"{path}: cannot be read: {exc.strerror}: make it readable") from None
    except _DuplicateKey as exc:
        mark = exc.problem_mark
        raise K3Error(f"{path}:{mark.line + 1 if mark else '?'}: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise K3Error(f"{path}:{mark.line + 1 if mark else '?'}: YAML syntax error: {exc.problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise K3Error(f"{path}: group vars must be a YAML mapping of k3_* variables")
    return data


def reader() -> Callable[[Path], dict[str, Any]]:
    """A group_vars reader that parses each file once (the hosts of one inventory share their files); each call
    returns its own copy, so no host's values are another's."""
    parsed: dict[Path, dict[str, Any]] = {}

    def read(path: Path) -> dict[str, Any]:
        if path not in parsed:
            parsed[path] = _read_yaml(path)
        return deepcopy(parsed[path])

    return read


def group_vars_dirs(inventory_file: str | None) -> list[Path]:
    """Where ``group_vars/`` is looked up, lowest precedence first: one level above the inventory file (the
    project layout), then next to it (the most specific, e.g. a simulated cluster's own selection)."""
    if not inventory_file:
        return []
    here = Path(inventory_file).resolve().parent
    out: list[Path] = []
    for d in (here.parent / "group_vars", here / "group_vars"):
        if d.is_dir() and d not in out:
            out.append(d)
    return out


#: pyinfra's connection settings and global arguments a group_vars file may carry for the hosts
CONNECTOR_PREFIXES = ("ssh_", "winrm_", "docker_", "dockerssh_", "chroot_", "local_", "fake_", "podman_")
PYINFRA_ARGUMENTS = frozenset({
    "_sudo", "_sudo_user", "_use_sudo_login", "_sudo_password", "_preserve_sudo_env", "_su_user", "_use_su_login",
    "_preserve_su_env", "_su_shell", "_su_password", "_doas", "_doas_user", "_dzdo", "_dzdo_user",
    "_shell_executable", "_chdir", "_env", "_success_exit_codes", "_timeout", "_get_pty", "_stdin", "_temp_dir",
    "_retries", "_retry_delay",
})


#: the settings of pyinfra's SSH connector (3.10: ``SSHConnector.data_meta``; a test keeps them equal): a misspelt
#: one would be ignored by pyinfra, and the host would connect without it
SSH_SETTINGS = frozenset({
    "ssh_allow_agent", "ssh_config_file", "ssh_connect_retries", "ssh_connect_retry_max_delay",
    "ssh_connect_retry_min_delay", "ssh_file_transfer_protocol", "ssh_forward_agent", "ssh_hostname", "ssh_key",
    "ssh_key_password", "ssh_known_hosts_file", "ssh_look_for_keys", "ssh_paramiko_connect_kwargs", "ssh_password",
    "ssh_port", "ssh_strict_host_key_checking", "ssh_user",
})


def is_connector_setting(key: str) -> bool:
    if key.startswith("ssh_"):
        return key in SSH_SETTINGS
    return key.startswith(CONNECTOR_PREFIXES) or key in PYINFRA_ARGUMENTS


def _closest_setting(key: str) -> str:
    near = difflib.get_close_matches(key, sorted(SSH_SETTINGS | PYINFRA_ARGUMENTS), n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


def shown_path(path: Path) -> str:
    """A file for people: relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


#: variables that were removed, and why: naming one says so instead of "unknown"
RETIRED = {
    "k3_shm_size": "the engines run with `--ipc host`, which shares the host's /dev/shm (preflight checks its size), "
                   "so `--shm-size` had no effect: remove it",
}


def _closest(key: str) -> str:
    if key in RETIRED:
        return f" (no longer used: {RETIRED[key]})"
    near = difflib.get_close_matches(key, list(Variables.model_fields), n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


#: connection settings that name a host
ADDRESS_SETTINGS = ("ssh_hostname",)


def _check_connector(key: str, value: Any, where: str) -> None:
    if key in ADDRESS_SETTINGS and (why := address_error(value)):
        raise K3Error(f"{where}: {key}: {why}: give the node's address")


@dataclass(frozen=True)
class Resolved:
    """One host's variables with where each came from."""

    vars: Variables
    sources: dict[str, str]                   # k3_* variable -> "group_vars/all.yml", "inventory", "--data", ...
    connector: dict[str, Any]                 # pyinfra connection settings group_vars give (the inventory's
    connector_sources: dict[str, str]         # own data where it sets one too), and their files
    files: list[str]                          # the group_vars files merged, lowest precedence first

    def source(self, key: str) -> str:
        return self.sources.get(key, "default")

    def listing(self, *, everything: bool = False) -> dict[str, dict[str, Any]]:
        """``{name: {"value", "from"}}`` for every variable set somewhere (all of them with ``everything``) and
        every connection setting from group_vars; secrets masked (:func:`k3deploy.model.secrets.mask_listing`)."""
        out = {k: {"value": v, "from": self.source(k)} for k, v in self.vars.model_dump().items()
               if everything or self.source(k) != "default"}
        for k, v in self.connector.items():
            out[k] = {"value": v, "from": self.connector_sources[k]}
        return mask_listing(out)

    def lines(self) -> list[str]:
        """The variables set somewhere, one ``name = value  (from)`` line each."""
        return [f"{k} = {item['value']!r}  ({item['from']})" for k, item in sorted(self.listing().items())]


def merge_vars(groups: Iterable[str], host_data: Mapping[str, Any], dirs: Iterable[Path], source: str = "",
               overrides: Mapping[str, Any] | None = None, origins: Mapping[str, str] | None = None,
               overrides_from: str = "command line",
               read: Callable[[Path], dict[str, Any]] | None = None) -> Resolved:
    """Defaults < group_vars/all.yml < group_vars/<group>.yml (in order) < the inventory's data for the host <
    ``overrides``; a later directory of ``dirs`` wins over an earlier one. ``origins`` names where each key of
    ``host_data`` came from (default: "inventory"); ``read`` reads a group_vars file (:func:`reader`: each file
    once for many hosts)."""
    read = read or _read_yaml
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    connector: dict[str, Any] = {}
    connector_sources: dict[str, str] = {}
    files: list[str] = []
    for d in dirs:
        for name in ["all", *[g for g in groups if g != "all"]]:
            for ext in (".yml", ".yaml"):
                p = d / f"{name}{ext}"
                if not p.is_file():
                    continue
                where = shown_path(p)
                files.append(where)
                for key, value in read(p).items():
                    key = str(key)
                    if key.startswith("k3_"):
                        if key not in Variables.model_fields:
                            raise K3Error(f"{where}: unknown variable {key!r}{_closest(key)}: fix its name "
                                          "(docs/variables.md lists them)")
                        merged[key], sources[key] = value, where
                    elif is_connector_setting(key):
                        _check_connector(key, value, where)
                        connector[key], connector_sources[key] = value, where
                    else:
                        raise K3Error(f"{where}: {key!r} is neither a k3deploy variable (k3_*) nor a pyinfra "
                                      f"connection setting (ssh_user, ssh_key, _sudo, ...){_closest_setting(key)}: "
                                      "fix its name or remove it")
    for key, value in host_data.items():
        if key == "ssh_hostname":
            _check_connector(key, value, f"{source}{(origins or {}).get(key, 'inventory')}")
        if key in connector and key in (origins or {}):
            # the inventory's own data wins over group_vars, as pyinfra connects with it
            connector[key], connector_sources[key] = value, (origins or {})[key]
        if key.startswith("k3_"):
            if key not in Variables.model_fields:
                raise K3Error(f"{source}unknown variable {key!r}{_closest(key)} in the inventory's data: fix its name")
            merged[key], sources[key] = value, (origins or {}).get(key, "inventory")
    for key, value in (overrides or {}).items():
        if value is not None:
            merged[key], sources[key] = value, overrides_from
    refuse_argv_secrets(merged.get("k3_extra_args"), sources.get("k3_extra_args") or source.rstrip(": ") or "inventory")
    try:
        v = Variables.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        where = sources.get(str(err["loc"][0]), "") if err["loc"] else ""
        raise K3Error(f"{where + ': ' if where else source}variable {key}: {err['msg']}, got "
                      f"{_shown(err.get('input'), 100)}") from None
    if v.k3_api_key_file and API_KEY_ENV in v.k3_extra_env:
        raise K3Error(f"{sources.get('k3_extra_env')}: k3_extra_env sets {API_KEY_ENV} and k3_api_key_file "
                      f"({sources.get('k3_api_key_file')}) names a key file too: remove {API_KEY_ENV} from "
                      "k3_extra_env (the key file is where the key belongs)")
    return Resolved(v, sources, connector, connector_sources, files)


def refuse_argv_secrets(args: Any, where: str) -> None:
    """Refuse ``k3_extra_args`` that carry a secret (:func:`k3deploy.model.secrets.argv_secret`): an argv is seen by
    ``ps`` on the node and written into its 0644 unit file. One line naming the flag (never the value) and the fix.

    >>> refuse_argv_secrets(["--api-key", "s3cr3t"], "group_vars/all.yml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    k3deploy.errors.K3Error: group_vars/all.yml: k3_extra_args: --api-key carries a secret in the engines' argv (...
    """
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return
    found = argv_secret(args)
    if found is None:
        return
    _, flag = found
    if flag.replace("_", "-") == "--api-key":
        fix = (f"remove it and put the key, alone, in a file of mode 0600 named by k3_api_key_file (the engines get it "
               f"as {API_KEY_ENV} from their 0600 env files, and every client k3deploy runs sends it)")
    else:
        fix = ("remove it: a secret reaches the engines through their environment only (k3_extra_env, kept in the "
               "nodes' 0600 env files; the API key: k3_api_key_file)")
    what = (f"{flag} carries a secret" if flag.startswith("-") else
            "an item shaped like a token (hf_..., sk-..., a bearer header) carries a secret")
    raise K3Error(f"{where}: k3_extra_args: {what} in the engines' argv (seen by ps on the nodes, written into their "
                  f"0644 unit files): {fix}")


def markdown_table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Variables.model_fields.items():
        default = field.get_default(call_default_factory=True)
        dumped = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        shown = "(none)" if default is None else f"`{dumped}`"
        rows.append(f"| `{name}` | {shown} | {field.description} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n")

