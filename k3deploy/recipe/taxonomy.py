"""Hardware profiles and serving strategies: the data the resolver reads besides the recipe.

Both live as YAML in ``k3deploy/data`` (``taxonomy.yaml``, ``strategies/*.yaml``, ``images.yaml``).

Example::

    >>> from k3deploy.recipe.taxonomy import hardware, strategies
    >>> hardware()["gb300"].gpu_count
    4
    >>> strategies()["multi_node_dep"].parallel_flag
    '--data-parallel-size'
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

DATA = Path(__file__).resolve().parents[1] / "data"
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read(path: Path) -> Any:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)


class HardwareProfile(BaseModel):
    """One hardware id of the taxonomy (one node of that kind)."""

    model_config = ConfigDict(frozen=True)

    id: str
    brand: str
    generation: str | list[str]
    gpu_count: int
    vram_gb: float
    label: str | None = None
    gpu_names: tuple[str, ...] = ()
    pci_device_ids: tuple[str, ...] = ()   # AMD: PCI device ids of the product (/sys/class/drm/card*/device/device)
    compute_capability: str | None = None
    gfx: str | None = None
    nvl: bool = False
    nvl_domain: int | None = None      # trays per NVLink domain (GB200/GB300 NVL72: 18); None = no multi-node NVLink
    # nvl: the compute tray of an NVL72 rack, whose GPUs reach the other trays over NVLink (multi-node NVLink through
    # IMEX). The GB200 NVL4 board (2 Grace + 4 Blackwell) is not one: its NVLink stays on the board.
    restricted: bool = False
    scalable: bool = True

    @property
    def gen(self) -> str:
        """The generation key (first element when the taxonomy gives a list)."""
        g = self.generation
        return g[0] if isinstance(g, list) else g

    @property
    def generations(self) -> list[str]:
        return list(self.generation) if isinstance(self.generation, list) else [self.generation]

    @property
    def brand_key(self) -> str:
        """Docker flavour: tpu, amd, intel or nvidia (Huawei NPUs land on nvidia, as in the builder)."""
        if self.gen == "tpu":
            return "tpu"
        if self.brand == "AMD":
            return "amd"
        if self.gen in ("cpu", "xpu") or self.brand == "Intel":
            return "intel"
        return "nvidia"

    @property
    def vendor(self) -> str:
        """The container vendor k3deploy deploys for: nvidia, amd, npu (or intel/tpu, unsupported)."""
        if self.brand == "Huawei":
            return "npu"
        return self.brand_key

    @property
    def per_gpu_gb(self) -> float:
        return self.vram_gb / self.gpu_count if self.gpu_count else 0.0


class RoleStrategy(BaseModel):
    vllm_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    parallelism: str | None = None
    parallel_flag: str | None = None
    tp: int | None = None


class Strategy(BaseModel):
    """A serving strategy (``strategies/<id>.yaml`` of the recipes project)."""

    id: str
    deploy_type: str = "single_node"
    vllm_args: list[str] = Field(default_factory=list)
    parallel_flag: str = "--tensor-parallel-size"
    parallelism: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    prefill: RoleStrategy | None = None
    decode: RoleStrategy | None = None
    router: dict[str, Any] | None = None

    @property
    def multi_node(self) -> bool:
        return self.deploy_type == "multi_node"

    @property
    def pd(self) -> bool:
        return self.deploy_type == "pd_cluster"

    @property
    def expert_parallel_across_nodes(self) -> bool:
        """Its expert-parallel group spans every node (DEP/TEP across nodes): the all-to-all crosses them."""
        return self.multi_node and "--enable-expert-parallel" in self.vllm_args

    @property
    def tensor_parallel_across_nodes(self) -> bool:
        """Its tensor-parallel group spans every node (TP/TEP): on NVL trays that needs one NVLink domain."""
        return self.multi_node and self.parallel_flag == "--tensor-parallel-size" and \
            self.parallelism not in ("tp_pp", "tp_dp")

    def role(self, name: str) -> RoleStrategy:
        r = getattr(self, name)
        return r if r is not None else RoleStrategy()


@cache
def hardware() -> dict[str, HardwareProfile]:
    raw = _read(DATA / "taxonomy.yaml")["hardware"]
    return {k: HardwareProfile(id=k, **v) for k, v in raw.items()}


@cache
def strategies() -> dict[str, Strategy]:
    out = {}
    for path in sorted((DATA / "strategies").glob("*.yaml")):
        out[path.stem] = Strategy(id=path.stem, **(_read(path) or {}))
    return out


@cache
def pinned_images() -> dict[str, dict[str, str]]:
    return _read(DATA / "images.yaml") or {}


#: the largest cluster the recipes builder renders (its MAX_NODES): the offering and default sizes follow it, and
#: plans inside it are byte-identical to the builder's
BUILDER_MAX_NODES = 16
#: the largest node count (or P/D pool) k3deploy plans, by the same rules; beyond the builder's range the plan says so
MAX_NODES = 256
