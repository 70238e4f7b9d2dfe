"""Command synthesis: a recipe selection -> per-node ``vllm serve`` argv and env.

This module reproduces the vLLM recipes site's command builder rule by rule (merge order, last-wins dedupe,
parallelism flags, feature gating, env layering, pd_cluster pools and the router). It does no I/O and never
validates a selection: :func:`k3deploy.resolver.resolve` validates first, then calls :func:`synthesize`.

JavaScript truthiness matters in several rules (``a || b`` falls through on ``undefined``, ``null``, ``""``,
``0`` and ``false`` but **not** on ``{}`` or ``[]``); :func:`js_or` ports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from math import ceil
from typing import Any

from k3deploy.recipe.schema import HardwareBlock, Recipe, RoleOverride, StrategyOverride, Variant
from k3deploy.recipe.taxonomy import BUILDER_MAX_NODES, HardwareProfile, Strategy

# --------------------------------------------------------------------------------------------------
# JavaScript-compatible helpers


def js_truthy(value: Any) -> bool:
    """JS truthiness: None, "", 0, False (and NaN) are false; every object, list and dict is true."""
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == value and value != 0
    if isinstance(value, str):
        return value != ""
    return True


def js_or(*values: Any) -> Any:
    """``a || b || c``: the first JS-truthy value, else the last one."""
    for v in values:
        if js_truthy(v):
            return v
    return values[-1] if values else None


def coalesce(*values: Any) -> Any:
    """``a ?? b ?? c``: the first value that is not None."""
    for v in values:
        if v is not None:
            return v
    return None


# --------------------------------------------------------------------------------------------------
# The four hardware-keyed lookups


def gen_block(m: dict[str, Any] | None, hw: HardwareProfile) -> Any:
    """GEN: ``m[gen] || (brand == NVIDIA ? m.nvidia : null)``."""
    if not m:
        return None
    v = m.get(hw.gen)
    if js_truthy(v):
        return v
    return m.get("nvidia") if hw.brand == "NVIDIA" else None


def keyed(m: Any, hw: HardwareProfile) -> Any:
    """KEYED: ``m[hwId] ?? m[gen] ?? m[brand] ?? m.default``; a scalar is its own value."""
    if not isinstance(m, dict):
        return m
    return coalesce(m.get(hw.id), m.get(hw.gen), m.get(hw.brand.lower()), m.get("default"))


def _block_args(block: HardwareBlock | None) -> list[str]:
    return block.extra_args if block is not None else []


def _block_env(block: HardwareBlock | None) -> dict[str, str]:
    return block.extra_env if block is not None else {}


# --------------------------------------------------------------------------------------------------
# Tokenising, dedupe, quoting


def dedupe_args(args: Iterable[str]) -> list[str]:
    """Last-wins dedupe of an argument list (falsy elements dropped first).

    A ``-``-prefixed string is a flag; a following element not starting with ``-`` is its value. Walking the
    units backwards, the first sighting of each flag is kept, at the position of its last occurrence;
    positionals are always kept.

    >>> dedupe_args(["--a", "1", "--b", "--a", "2"])
    ['--b', '--a', '2']
    """
    items = [a for a in args if a]
    flags = [i for i, a in enumerate(items) if a[0] == "-"]
    last = {items[i]: i for i in flags}  # each flag's last occurrence
    if len(last) == len(flags):  # no flag twice: nothing to drop
        return items
    out: list[str] = []
    after: bool | None = None  # after a flag: whether it was dropped (its value goes with it); else None
    for i, a in enumerate(items):
        if a[0] == "-":
            after = last[a] != i
            if not after:
                out.append(a)
        else:
            if after is not True:  # a kept flag's value, or a positional
                out.append(a)
            after = None
    return out


# --------------------------------------------------------------------------------------------------
# Offering, floors, node counts (pure helpers shared with the resolver)


def offered_strategies(recipe: Recipe) -> list[str]:
    """``compatible_strategies`` plus strategies granted ``supported`` somewhere in ``strategy_hardware``."""
    out = list(recipe.compatible_strategies)
    for s, per_hw in recipe.strategy_hardware.items():
        if s not in out and any(v == "supported" for v in (per_hw or {}).values()):
            out.append(s)
    return out


def strategy_supported_on(recipe: Recipe, strategy: str, hw: HardwareProfile) -> bool:
    """The per-GPU gate: KEYED ``strategy_hardware[s]``, else membership in ``compatible_strategies``."""
    v: object = keyed(recipe.strategy_hardware.get(strategy) or {}, hw)
    if v is not None:
        return v != "unsupported"
    return strategy in recipe.compatible_strategies


def min_gpus_for_strategy(recipe: Recipe, key: str, hw: HardwareProfile) -> int:
    cfg = recipe.strategy_min_gpus
    if cfg is None:
        return 0
    if isinstance(cfg, (int, float)):
        return int(cfg)

    def block(b: Any, k: str) -> int:
        if b is None:
            return 0
        if isinstance(b, (int, float)):
            return int(b)
        return int(coalesce(b.get(k), b.get("multi_node_" + k), b.get("single_node_" + k), 0))

    return max(block(cfg, key), block(cfg.get(hw.id), key))


def nodes_for_strategy(recipe: Recipe, key: str, hw: HardwareProfile) -> int:
    per_node = hw.gpu_count or 8
    return ceil(min_gpus_for_strategy(recipe, key, hw) / per_node) or 1


def reachable(recipe: Recipe, strategy: Strategy, hw: HardwareProfile) -> bool:
    nodes = BUILDER_MAX_NODES if strategy.deploy_type in ("multi_node", "pd_cluster") else 1
    return nodes * (hw.gpu_count or 8) >= min_gpus_for_strategy(recipe, strategy.id, hw)


def nodes_for(recipe: Recipe, strategy: Strategy, hw: HardwareProfile) -> int:
    """Node count the recipes site renders a strategy at: ``max(multi ? 2 : 1, nodesForStrategy)``."""
    return max(2 if strategy.multi_node else 1, nodes_for_strategy(recipe, strategy.id, hw))


def recommend_strategy(recipe: Recipe, offered: list[str], n: int) -> str:
    d = recipe.default_strategy
    if d and d in offered:
        if n > 1 and d.startswith("single_node_"):
            sibling = "multi_node_" + d[len("single_node_"):]
            if sibling in offered:
                return sibling
        else:
            return d
    if n > 1:
        for s in ("multi_node_tp", "multi_node_dep", "multi_node_tep"):
            if s in offered:
                return s
    if "single_node_tp" in offered:
        return "single_node_tp"
    return offered[0] if offered else "single_node_tp"


def fits_single_node(variant: Variant, hw: HardwareProfile) -> bool:
    need = variant.vram_minimum_gb or 0
    have = hw.vram_gb or 0
    return not need or not have or need <= have


def default_features(recipe: Recipe, variant: Variant, hw: HardwareProfile) -> list[str]:
    """The default-on feature set: in recipe order, opt-in features off unless a default mode names them."""
    opt_in = set(recipe.opt_in_features) | set(recipe.hardware_opt_in_features.get(hw.id) or [])
    modes = variant.default_modes or {}
    return [f for f in recipe.features if f in modes or f not in opt_in]


def pd_pool_modes(recipe: Recipe, so: StrategyOverride | None) -> list[str]:
    found: set[str] = set()
    for s in offered_strategies(recipe):
        if s == "pd_cluster":
            continue
        if s.endswith("_dep"):
            found.add("dep")
        elif s.endswith("_tep"):
            found.add("tep")
        elif s.endswith("_tp") or s.endswith("_tp_pp") or s.endswith("_tp_dp"):
            found.add("tp")
    modes: list[str] = [m for m in ("tp", "tep", "dep") if m in found] or ["tp"]
    if so is not None and so.pool_modes:
        narrowed = [m for m in modes if m in so.pool_modes]
        if narrowed:
            modes = narrowed
    return modes


def resolve_frontend(recipe: Recipe, hw: HardwareProfile, so: StrategyOverride | None, frontend: str | None) -> str:
    so_hw = so.hardware_overrides.get(hw.id) if so is not None else None
    rec_hw = recipe.hardware_overrides.get(hw.id)
    default = recipe.model.default_frontend
    if isinstance(default, dict):
        default = keyed(default, hw)
    sel = coalesce(frontend, so_hw.frontend if so_hw else None, rec_hw.frontend if rec_hw else None, default)
    return "rust" if sel == "rust" else "python"


# --------------------------------------------------------------------------------------------------
# Synthesis


@dataclass
class PoolSpec:
    """One pd_cluster pool as the builder's ``pdNodes[role]``: a node count, a rank, a parallelism."""

    nodes: int | None = None
    rank: int | None = None
    parallelism: str | None = None


@dataclass
class RoleMeta:
    nodes: int
    parallelism: str  # un-snapped
    tp: int
    dp_local: int
    dp_size: int
    current_node: int
    start_rank: int


@dataclass
class Synthesis:
    """What the builder's ``resolveCommand`` returns, in Python shapes.

    Non-PD: ``argvs`` holds one argv per node (rank order), ``env`` is shared. PD: ``roles`` maps
    ``prefill``/``decode`` to ``(argv, env, RoleMeta)`` for the requested ranks, plus ``router_argv``.
    """

    model_id: str
    argvs: list[list[str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    roles: dict[str, tuple[list[str], dict[str, str], RoleMeta]] = field(default_factory=dict)
    router_argv: list[str] = field(default_factory=list)


_NVL4_ENV = ("VLLM_USE_NCCL_SYMM_MEM", "NCCL_CUMEM_ENABLE", "NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE", "UCX_NET_DEVICES")


class _Builder:
    def __init__(
        self,
        recipe: Recipe,
        variant_key: str,
        strategy: Strategy,
        hw: HardwareProfile,
        features: list[str],
        advanced_args: list[str],
        nodes: int,
        pd_nodes: dict[str, PoolSpec] | None,
        frontend: str | None,
    ) -> None:
        self.recipe = recipe
        self.variant = recipe.variant(variant_key)
        self.variant_key = variant_key
        self.strategy = strategy
        self.strategy_ov: StrategyOverride | None = recipe.strategy_overrides.get(strategy.id)
        self.hw = hw
        self.gpus_per_node = hw.gpu_count or 1
        self.nodes = nodes
        self.features = features
        self.advanced = advanced_args
        self.pd_nodes = pd_nodes
        self.frontend = frontend
        self.model_id = js_or(self.variant.model_id, recipe.model.model_id, "unknown")
        # the strategy GEN block replaces the recipe and variant hardware layers (args and env alike)
        ov = self.strategy_ov
        self.strategy_hw: HardwareBlock | None = gen_block(ov.hardware_overrides, hw) if ov else None
        self.strategy_hw_exact = self.strategy_ov.hardware_overrides.get(hw.id) if self.strategy_ov else None
        self._feature_layers = [self._feature_layer(f) for f in features]

    # -- features ---------------------------------------------------------------------------------

    def _feature_layer(self, name: str) -> tuple[list[str], dict[str, str] | None]:
        feat = self.recipe.features.get(name)
        if feat is None:
            return [], None
        if feat.strategies and self.strategy.id not in feat.strategies:
            return [], None
        if feat.modes:
            allowed = []
            for key, mode in feat.modes.items():
                if mode.variants and self.variant_key not in mode.variants:
                    continue
                gate = mode.hardware or {}
                if gate.get(self.hw.gen) == "unsupported" or gate.get(self.hw.id) == "unsupported":
                    continue
                allowed.append(key)
            if not allowed:
                return [], None
            prefs = [(self.variant.default_modes or {}).get(name), feat.default_mode]
            key = next((p for p in prefs if p in allowed), allowed[0])
            mode = feat.modes[key]
            mho = keyed(mode.hardware_overrides or {}, self.hw)
            args = coalesce(mho.args if mho else None, mode.args) or []
            env = coalesce(mho.env if mho else None, mode.env)
            return list(args), env
        fho = keyed(feat.hardware_overrides or {}, self.hw)
        args = coalesce(fho.args if fho else None, feat.args) or []
        env = coalesce(fho.env if fho else None, feat.env)
        return list(args), env

    # -- args -------------------------------------------------------------------------------------

    def single_node_tp(self) -> int:
        if self.strategy.id != "single_node_tp":
            return self.gpus_per_node
        clamp = self.hw.gen != "cpu"
        for raw in (self.variant.tp, self.strategy_ov.tp if self.strategy_ov else None):
            tp = keyed(raw, self.hw) if raw is not None else None
            if isinstance(tp, (int, float)) and not isinstance(tp, bool) and tp > 0:
                return int(min(tp, self.gpus_per_node) if clamp else tp)
        need = self.variant.vram_minimum_gb
        per_gpu = (self.hw.vram_gb / self.gpus_per_node) if self.gpus_per_node else 0
        if need and per_gpu > 0:
            return 1 if 0 < need <= per_gpu else self.gpus_per_node
        return self.gpus_per_node

    def _dep_local(self) -> int:
        so = self.strategy_ov
        if so is None:
            return self.gpus_per_node
        pool = so.vllm_args + so.extra_args + _block_args(self.strategy_hw) + _block_args(self.strategy_hw_exact)
        local = self.gpus_per_node
        for i, a in enumerate(pool):
            if a == "--data-parallel-size-local" and i + 1 < len(pool):
                try:
                    local = int(float(pool[i + 1]))
                except ValueError:
                    pass
        return local

    def parallel_flags(self, node_role: str | None, rank: int) -> list[str]:
        S, G, N = self.strategy, self.gpus_per_node, self.nodes
        worker = node_role == "worker"
        r = max(1, rank) if worker else 0
        addr = "$HEAD_IP"
        if S.multi_node and N > 1:
            if S.parallel_flag == "--data-parallel-size":
                flags = ["--data-parallel-size", str(G * N), "--data-parallel-size-local", str(G),
                         "--data-parallel-address", addr]
                if worker:
                    flags += ["--data-parallel-start-rank", str(r * self._dep_local())]
                return flags
            if S.parallelism == "tp_pp":
                flags = ["--tensor-parallel-size", str(G), "--pipeline-parallel-size", str(N),
                         "--nnodes", str(N), "--node-rank", str(r), "--master-addr", addr]
                return flags + (["--headless"] if worker else [])
            if S.parallelism == "tp_dp":
                flags = ["--tensor-parallel-size", str(G), "--data-parallel-size", str(N),
                         "--data-parallel-size-local", "1", "--data-parallel-address", addr]
                return flags + (["--data-parallel-start-rank", str(r)] if worker else [])
            flags = ["--tensor-parallel-size", str(G * N), "--nnodes", str(N), "--node-rank", str(r),
                     "--master-addr", addr]
            return flags + (["--headless"] if worker else [])
        return [S.parallel_flag, str(self.single_node_tp())]

    def _hardware_args(self, role_ov: RoleOverride | None) -> list[str]:
        out: list[str] = []
        if js_truthy(self.strategy_hw):
            out += _block_args(self.strategy_hw)
        else:
            out += _block_args(gen_block(self.recipe.hardware_overrides, self.hw))
            out += _block_args(gen_block(self.variant.hardware_overrides, self.hw))
        out += _block_args(self.strategy_hw_exact)
        if role_ov is not None:
            out += _block_args(role_ov.hardware_overrides.get(self.hw.id))
        return out

    def build_args(self, role: str | None, node_role: str | None, rank: int,
                   pool_flags: list[str] | None = None) -> list[str]:
        V, S, so = self.variant, self.strategy, self.strategy_ov
        args: list[str] = list(self.recipe.model.base_args)
        args += V.extra_args
        args += _block_args(V.hardware_overrides.get(self.hw.id))
        role_ov: RoleOverride | None = None
        if role is None:
            args += S.vllm_args
            args += self.parallel_flags(node_role, rank)
            if so is not None:
                args += so.extra_args + so.vllm_args
        else:
            args += S.role(role).vllm_args
            args += pool_flags or []
            role_ov = getattr(so, role) if so is not None else None
            if role_ov is not None:
                args += role_ov.extra_args + role_ov.vllm_args
        args += self._hardware_args(role_ov)
        args += self.advanced
        for fargs, _ in self._feature_layers:
            args += fargs
        return dedupe_args(args)

    # -- env --------------------------------------------------------------------------------------

    def build_env(self, role: str | None, pool_nodes: int = 0, pd_rank: int = 0,
                  parallelism: str = "tp") -> dict[str, str]:
        V, S, so, hw, G = self.variant, self.strategy, self.strategy_ov, self.hw, self.gpus_per_node
        env: dict[str, str] = dict(self.recipe.model.base_env)
        env.update(V.extra_env)
        env.update(_block_env(V.hardware_overrides.get(hw.id)))
        role_ov: RoleOverride | None = None
        if role is None:
            env.update(S.env)
        else:
            env.update(S.role(role).env)
            n = pool_nodes
            if n >= 1:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(G))
                if n >= 2:
                    env["GLOO_SOCKET_IFNAME"] = "$IFACE_NAME"
                    env["NCCL_SOCKET_IFNAME"] = "$IFACE_NAME"
            else:
                half = G // 2
                ids = range(half) if role == "prefill" else range(half, G)
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in ids)
        if so is not None:
            env.update(so.env)
            if role is None:
                env.update(so.extra_env)
            else:
                role_ov = getattr(so, role)
                if role_ov is not None:
                    env.update(role_ov.env)
        if js_truthy(self.strategy_hw):
            env.update(_block_env(self.strategy_hw))
        else:
            env.update(_block_env(gen_block(self.recipe.hardware_overrides, hw)))
            env.update(_block_env(gen_block(V.hardware_overrides, hw)))
        env.update(_block_env(self.strategy_hw_exact))
        if role_ov is not None:
            env.update(_block_env(role_ov.hardware_overrides.get(hw.id)))
        for _, fenv in self._feature_layers:
            if fenv:
                env.update(fenv)
        if role is not None:
            if hw.id not in ("gb200", "gb300"):
                for k in _NVL4_ENV:
                    env.pop(k, None)
            if pd_rank > 0 and parallelism == "dep":
                first = f"${role.upper()}_NODE_1"
                moved = f"${role.upper()}_NODE_{pd_rank + 1}"
                env = {k: (moved if v == first else v) for k, v in env.items()}
        if resolve_frontend(self.recipe, hw, so, self.frontend) == "rust":
            env["VLLM_USE_RUST_FRONTEND"] = "1"
        return env

    # -- pd_cluster -------------------------------------------------------------------------------

    def pd_role(self, role: str) -> tuple[list[str], dict[str, str], RoleMeta]:
        S, so, G = self.strategy, self.strategy_ov, self.gpus_per_node
        pd = (self.pd_nodes or {}).get(role) or PoolSpec()
        role_ov: RoleOverride | None = getattr(so, role) if so is not None else None
        role_s = S.role(role)
        n = pd.nodes if isinstance(pd.nodes, int) else (1 if self.nodes > 1 else 0)
        pool_gpus = G // 2 if n == 0 else n * G
        raw_par = js_or(pd.parallelism, role_ov.parallelism if role_ov else None, role_s.parallelism, "tp")
        modes = pd_pool_modes(self.recipe, so)
        par = raw_par if raw_par in modes else modes[0]
        m = max(1, n)
        idx = min(max(pd.rank if pd.rank is not None else 0, 0), m - 1)
        upper = role.upper()
        if par == "dep":
            tp_explicit = coalesce(role_ov.tp if role_ov else None, role_s.tp)
            tp = tp_explicit if tp_explicit is not None else 1
            dp_local = max(1, G // tp) if tp else 1
            flags = ["--tensor-parallel-size", str(tp)] if tp_explicit is not None else []
            flags += ["--data-parallel-size", str(m * dp_local), "--data-parallel-size-local", str(dp_local),
                      "--data-parallel-start-rank", str(idx * dp_local),
                      "--data-parallel-address", f"${upper}_NODE_1",
                      "--data-parallel-rpc-port", f"${upper}_DP_RPC_PORT"]
            if m > 1:
                flags.append("--data-parallel-hybrid-lb")
            flags.append("--enable-expert-parallel")
        else:
            flag = js_or(role_ov.parallel_flag if role_ov else None, role_s.parallel_flag, S.parallel_flag,
                         "--tensor-parallel-size")
            flags = [flag, str(max(1, pool_gpus))]
            if par == "tep":
                flags.append("--enable-expert-parallel")
            if n > 1:
                flags += ["--nnodes", str(n), "--node-rank", str(idx), "--master-addr", f"${upper}_NODE_1"]
                if idx > 0:
                    flags.append("--headless")
        argv = self.build_args(role, None, 0, flags)
        env = self.build_env(role, n, pd.rank or 0, raw_par)
        if raw_par == "dep":
            meta_tp = js_or(role_ov.tp if role_ov else None, role_s.tp, 1)
            dp_local = max(1, G // meta_tp)
            meta = RoleMeta(n, raw_par, meta_tp, dp_local, max(1, n) * dp_local, idx, idx * dp_local)
        else:
            meta = RoleMeta(n, raw_par, pool_gpus, 0, 1, idx, 0)
        return argv, env, meta

    def router_argv(self, prefill: RoleMeta, decode: RoleMeta) -> list[str]:
        policy = js_or((self.strategy.router or {}).get("policy"), "round_robin")
        argv = ["vllm-router", "--policy", str(policy), "--vllm-pd-disaggregation"]
        for meta, name, port in ((prefill, "PREFILL", 8001), (decode, "DECODE", 8002)):
            count = max(1, js_or(meta.nodes, 1)) if meta.parallelism == "dep" else 1
            for i in range(1, count + 1):
                argv += [f"--{name.lower()}", f"http://${name}_NODE_{i}:{port}"]
        argv += ["--host", "$ROUTER_HOST", "--port", "$ROUTER_PORT"]
        router_ov = self.strategy_ov.router if self.strategy_ov is not None else None
        k = coalesce(router_ov.intra_node_data_parallel_size if router_ov else None,
                     max(prefill.dp_local or 0, decode.dp_local or 0, 1))
        return argv + ["--intra-node-data-parallel-size", str(k)]


def synthesize(
    recipe: Recipe,
    *,
    variant: str,
    strategy: Strategy,
    hw: HardwareProfile,
    features: list[str],
    nodes: int = 1,
    pd_nodes: dict[str, PoolSpec] | None = None,
    advanced_args: list[str] | None = None,
    frontend: str | None = None,
) -> Synthesis:
    """The builder's ``resolveCommand`` for one selection (no validation).

    Non-PD results carry one argv per node; PD results carry the prefill and decode command for the ranks in
    ``pd_nodes`` and the router argv.
    """
    s = _Builder(recipe, variant, strategy, hw, list(features), list(advanced_args or []), nodes, pd_nodes, frontend)
    out = Synthesis(model_id=s.model_id)
    head = ["vllm", "serve", s.model_id]
    if strategy.pd:
        pre = s.pd_role("prefill")
        dec = s.pd_role("decode")
        out.roles = {"prefill": (head + pre[0], pre[1], pre[2]), "decode": (head + dec[0], dec[1], dec[2])}
        out.router_argv = s.router_argv(pre[2], dec[2])
        return out
    out.env = s.build_env(None)
    if strategy.multi_node and nodes > 1:
        out.argvs = [head + s.build_args(None, "head", 0)]
        out.argvs += [head + s.build_args(None, "worker", r) for r in range(1, nodes)]
    else:
        out.argvs = [head + s.build_args(None, None, 0)]
    return out
