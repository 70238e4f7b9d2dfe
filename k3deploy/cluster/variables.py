"""Deployment variables: every knob, its default and its documentation, in one typed model.

Values come, lowest precedence first, from the defaults below, ``group_vars/all.yml``, ``group_vars/<group>.yml``
for each group of the host (in inventory order), then the host's own data in the inventory. The README's
variable table is generated from this model (``python -m k3deploy.cluster.variables``) and a test keeps them equal.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3deploy.errors import K3Error


class Variables(BaseModel):
    """All ``k3_*`` variables (group_vars YAML or inventory host data)."""

    model_config = ConfigDict(extra="forbid")

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
        "Extra `vllm serve` arguments, appended where the recipes site puts its advanced arguments (last-wins"
        " applies)."))
    # image and files
    k3_image: str | None = Field(None, description=(
        "Image override: REPO:TAG, REPO@sha256:..., :TAG or @sha256:<digest> (the digest is verified after "
        "the pull)."))
    k3_config_dir: str = Field("/etc/k3deploy", description=(
        "Directory for the env files (0600) and the previous versions kept for rollback."))
    k3_unit_name: str = Field("k3-engine", description=(
        "systemd unit (and container) name of the engine; the router unit is `<name>-router`."))
    k3_model_cache: str = Field("/var/lib/k3deploy/cache", description=(
        "Host directory mounted as the container's `~/.cache` (Hugging Face weights, vLLM and JIT caches)."))
    k3_weights_shared: bool = Field(False, description=(
        "`k3_model_cache` is one shared filesystem: download the weights from the head only."))
    k3_hf_token_file: str | None = Field(None, description=(
        "File on the control machine holding the Hugging Face token (must be mode 0600); copied to the nodes "
        "as 0600 and used only to download weights."))
    k3_download_weights: bool = Field(True, description=(
        "Download missing weights with the Hugging Face tooling in the image; false = weights must already be"
        " in the cache."))
    k3_image_dir: str | None = Field(None, description=(
        "Where the container runtime stores images (preflight's free-space check); default: Docker's "
        "DockerRootDir."))
    k3_docker: str = Field("/usr/bin/docker", description="Container CLI on the nodes.")
    k3_shm_size: str = Field("64g", description="`--shm-size` of the engine container (NVIDIA and AMD).")
    # network
    k3_iface: str | None = Field(None, description=(
        "Cluster interface for NCCL/GLOO; default: the interface carrying the node's inventory address (from "
        "facts)."))
    k3_dp_rpc_port: int = Field(29550, description=(
        "DP handshake port (`--data-parallel-rpc-port`); fills `$PREFILL_DP_RPC_PORT`/`$DECODE_DP_RPC_PORT`."))
    k3_router_port: int = Field(30000, description=(
        "Port of the public endpoint when a router fronts the engines (pd_cluster, hybrid-LB multi_node_dep)."))
    k3_router_host: str = Field("0.0.0.0", description="Bind address of the router.")
    k3_router_image: str | None = Field(None, description=(
        "Run the router from this image; default: the `vllm-router` command on the router host."))
    k3_front_hybrid_lb: bool = Field(True, description=(
        "Put a vllm-router in front of hybrid-LB nodes (multi_node_dep) so clients get one endpoint."))
    # timing
    k3_engine_ready_timeout: int | None = Field(None, description=(
        "Seconds an engine may take to serve; default: the plan's VLLM_ENGINE_READY_TIMEOUT_S (600 if unset)."))
    k3_rendezvous_timeout: int = Field(300, description=(
        "Seconds to wait for the head's rendezvous port before starting workers."))
    k3_rollout_deadline: int | None = Field(None, description=(
        "Overall deadline of the start phase in seconds; default: engine-ready timeout + 900."))
    k3_poll_interval: float = Field(5.0, description="Seconds between readiness polls.")
    k3_smoke_test: bool = Field(True, description=(
        "Send one short chat completion through the public endpoint after the rollout."))
    # per host / per run
    k3_ip: str | None = Field(None, description=(
        "Per host: its address on the cluster network (fills `$HEAD_IP`, `$PREFILL_NODE_n`, ...); default: "
        "`ssh_hostname`."))
    k3_sim: str | None = Field(None, description=(
        "Per host, set by `k3deploy sim up`: the simulated cluster the host belongs to."))
    k3_rollback: bool = Field(False, description=(
        "Per run (`--data k3_rollback=true`): restore the previous unit and env files and restart in order."))

    @property
    def recipe_path(self) -> str | None:
        return self.k3_recipe


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise K3Error(f"{path}:{mark.line + 1 if mark else '?'}: YAML syntax error: {exc.problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise K3Error(f"{path}: group vars must be a YAML mapping of k3_* variables")
    return data


def inventory_path_from_argv(argv: list[str] | None = None) -> str | None:
    """The inventory file of a ``pyinfra INVENTORY deploy/k3.py`` run (its first existing .py argument)."""
    for arg in (argv if argv is not None else sys.argv)[1:]:
        if arg.endswith(".py") and Path(arg).is_file() and "deploy" not in Path(arg).parts[:-1]:
            return arg
    return None


def group_vars_dirs(inventory_file: str | None) -> list[Path]:
    """Where ``group_vars/`` is looked up, lowest precedence first: the working directory, one level above the
    inventory file, next to the inventory file (the most specific, e.g. a simulated cluster's own selection)."""
    dirs: list[Path] = [Path.cwd() / "group_vars"]
    if inventory_file:
        dirs.append(Path(inventory_file).resolve().parent.parent / "group_vars")
        dirs.append(Path(inventory_file).resolve().parent / "group_vars")
    out: list[Path] = []
    for d in dirs:
        d = d.resolve()
        if d.is_dir():
            if d in out:
                out.remove(d)
            out.append(d)
    return out


def merge_vars(groups: Iterable[str], host_data: Mapping[str, Any], dirs: Iterable[Path], source: str = "",
               overrides: Mapping[str, Any] | None = None) -> Variables:
    """Defaults < group_vars/all.yml < group_vars/<group>.yml (in order) < host data < ``overrides``; a later
    directory of ``dirs`` wins over an earlier one."""
    merged: dict[str, Any] = {}
    for d in dirs:
        for name in ["all", *[g for g in groups if g != "all"]]:
            for ext in (".yml", ".yaml"):
                p = d / f"{name}{ext}"
                if p.is_file():
                    merged.update(_read_yaml(p))
    merged.update({k: v for k, v in host_data.items() if k.startswith("k3_")})
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return Variables.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            known = ", ".join(sorted(Variables.model_fields))
            raise K3Error(f"{source}unknown variable {key!r}: check the spelling (known: {known})") from None
        raise K3Error(f"{source}variable {key}: {err['msg']}, got {err.get('input')!r}") from None


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
