"""``plan`` rules on every engine node's environment: ``VLLM_*`` variables vLLM does not read, bad values,
values equal to the default, variables vLLM overwrites or ignores, variables for other hardware, and
variables set on a role (or in a layout) where they do nothing."""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from k3deploy.recipe.catalog import EnvVar
from k3deploy.recipe.lint.argv import placeholder
from k3deploy.recipe.lint.context import EngineNode, PlanContext
from k3deploy.recipe.lint.registry import rule

_NVL_ONLY_ENV = ("NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE", "VLLM_USE_NCCL_SYMM_MEM",
                 "UCX_NET_DEVICES")
#: Env names vLLM renamed or never had, with the variable to use instead.
ENV_RENAMES = {
    "VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4": ("VLLM_ROCM_USE_AITER_MOE_SITUV2", "a8w4"),
    "VLLM_ROCM_USE_AITER_MOE_SITUV2_A4W4": ("VLLM_ROCM_USE_AITER_MOE_SITUV2", "a4w4"),
}
_AITER_OVERWRITTEN = ("AITER_SITUV2_A8W4", "AITER_SITUV2_A4W4")
_SHARD_SP = "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT"


def _env(ctx: PlanContext) -> Iterator[tuple[EngineNode, str, str]]:
    for e in ctx.engines:
        for name, value in e.node.env.items():
            yield e, name, value


def _vllm_env(ctx: PlanContext) -> Iterator[tuple[EngineNode, str, str, EnvVar]]:
    """The ``VLLM_*`` variables vLLM registers, with their registry entry."""
    for e, name, value in _env(ctx):
        var = ctx.cat.env_var(name) if name.startswith("VLLM_") else None
        if var is not None:
            yield e, name, value, var


def _value_problem(name: str, value: str, var: EnvVar) -> str | None:
    """Why vLLM rejects ``value`` of a variable it reads (placeholders are not checked)."""
    if placeholder(value):
        return None
    why = var.check_value(value)
    if why is None and var.type and var.type.split(" ")[0] == "int":
        try:
            int(value)
        except ValueError:
            why = f"{name}={value!r} is not an integer"
    if why is None and name == "VLLM_USE_V2_MODEL_RUNNER" and value not in ("0", "1"):
        why = f"{name}={value!r}: vLLM parses it with int(); use 0 or 1"
    return why


def _same(value: str, default: str, typ: str | None) -> bool:
    if value == default:
        return True
    if typ and typ.startswith("bool"):
        truth = {"1": True, "true": True, "0": False, "false": False}
        return truth.get(value.strip().lower()) is not None and \
            truth.get(value.strip().lower()) == truth.get(default.strip().lower())
    return False


@rule("env-unknown")
def env_unknown(ctx: PlanContext) -> None:
    """A ``VLLM_*`` variable vLLM does not register (on Ascend it may be a vllm-ascend one: info)."""
    cat = ctx.cat
    for e, name, _value in _env(ctx):
        if not name.startswith("VLLM_") or cat.env_var(name) is not None:
            continue
        if name in ENV_RENAMES:
            good, val = ENV_RENAMES[name]
            fix = f"use {good}={val} (vLLM {cat.version} reads that)"
        else:
            near = difflib.get_close_matches(name, sorted(cat.env_names), n=1, cutoff=0.8)
            fix = f"use {near[0]}" if near else "remove it"
        if ctx.npu:
            ctx.add("info", f"{name} is not read by vLLM {cat.version}; it may be a "
                    "vllm-ascend variable", "check the vllm-ascend release notes of the image",
                    ctx.env_path(e.node, name), e.role)
        else:
            ctx.add("warning", f"{name} is not an environment variable vLLM "
                    f"{cat.version} reads (it logs 'Unknown vLLM environment variable detected', an "
                    "error with --fail-on-environ-validation)", fix, ctx.env_path(e.node, name), e.role)


@rule("env-value")
def env_value(ctx: PlanContext) -> None:
    """A value vLLM rejects (choices, integers, the model-runner switch)."""
    for e, name, value, var in _vllm_env(ctx):
        why = _value_problem(name, value, var)
        if why:
            ctx.add("error", why, f"fix the value of {name}", ctx.env_path(e.node, name), e.role)


@rule("env-default")
def env_default(ctx: PlanContext) -> None:
    """A variable set to the pinned vLLM's default (harmless)."""
    for e, name, value, var in _vllm_env(ctx):
        if placeholder(value) or _value_problem(name, value, var):
            continue
        if var.default is not None and _same(value, var.default, var.type) and \
                not (name == "VLLM_USE_BREAKABLE_CUDAGRAPH" and ctx.cuda):
            ctx.add("info", f"{name}={value} is vLLM {ctx.cat.version}'s default",
                    "harmless; keep it only for older images", ctx.env_path(e.node, name), e.role)


@rule("env-overwritten")
def env_overwritten(ctx: PlanContext) -> None:
    """An AITER variable vLLM overwrites at import."""
    if ctx.npu:
        return
    for e, name, _value in _env(ctx):
        if name in _AITER_OVERWRITTEN:
            ctx.add("warning", f"{name} is overwritten by vLLM {ctx.cat.version} at import "
                    "from VLLM_ROCM_USE_AITER_MOE_SITUV2, so setting it has no effect",
                    f"use VLLM_ROCM_USE_AITER_MOE_SITUV2={'a8w4' if 'A8W4' in name else 'a4w4'}",
                    ctx.env_path(e.node, name), e.role)


@rule("env-unused")
def env_unused(ctx: PlanContext) -> None:
    """A variable the pinned vLLM does not read (harmless)."""
    for e, name, _value in _env(ctx):
        if name == "SAFETENSORS_FAST_GPU":
            ctx.add("info", f"{name} is not read by vLLM {ctx.cat.version}", "harmless; drop it",
                    ctx.env_path(e.node, name), e.role)


@rule("env-hardware")
def env_hardware(ctx: PlanContext) -> None:
    """A variable meant for other hardware: NVLink-fabric settings off GB200/GB300, CUDA transports off NVIDIA."""
    for e, name, value in _env(ctx):
        if name.startswith("VLLM_"):  # vLLM's own variables are checked against its registry
            continue
        if name in _NVL_ONLY_ENV and not ctx.hw.nvl:
            ctx.add("warning", f"{name} is meant for multi-node NVLink fabrics (GB200/GB300 "
                    "NVL); on other hardware it is inert or harmful", f"set {name} only for GB200/GB300",
                    ctx.env_path(e.node, name), e.role)
        elif name == "UCX_TLS" and "cuda_" in value and not ctx.cuda:
            ctx.add("error", f"UCX_TLS={value} names CUDA transports on {ctx.hw.id}",
                    "drop the cuda_* transports on non-NVIDIA hardware", ctx.env_path(e.node, name), e.role)


@rule("env-role")
def env_role(ctx: PlanContext) -> None:
    """A variable set where it does nothing: the shared-expert sequence-parallel switch on prefill or outside
    sequence-parallel MoE, NIXL side-channel settings without a NIXL connector."""
    for e in ctx.engines:
        node, lay = e.node, e.layout
        value = node.env.get(_SHARD_SP)
        if value is not None and value.strip().lower() not in ("0", "false", ""):
            effective = lay.pp == 1 and lay.ep and lay.tp > 1 and (
                lay.moe_backend == "deep_gemm_mega_moe" or lay.dp > 1)
            missing = [c for c, ok in (("expert parallel", lay.ep), ("TP > 1", lay.tp > 1), ("PP = 1", lay.pp == 1),
                                       ("DP > 1 or --moe-backend deep_gemm_mega_moe",
                                        lay.dp > 1 or lay.moe_backend == "deep_gemm_mega_moe")) if not ok]
            why = ("expert parallel, TP > 1, PP = 1 and DP > 1 or --moe-backend deep_gemm_mega_moe; missing: "
                   + ", ".join(missing))
            if node.role == "prefill":
                ctx.add("warning", f"{_SHARD_SP} is set on prefill; vLLM documents it for decode instances "
                        f"('not for prefill'){'' if effective else ' and it is a no-op here (needs ' + why + ')'}",
                        "set it on decode only, and only where sequence-parallel MoE is active",
                        ctx.env_path(node, _SHARD_SP), node.role)
            elif not effective:
                ctx.add("warning", f"{_SHARD_SP} has no effect here (needs {why})",
                        "remove it, or use it where sequence-parallel MoE is active", ctx.env_path(node, _SHARD_SP),
                        node.role)
        nixl = [k for k in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT") if k in node.env]
        if nixl and not lay.has("--kv-transfer-config"):
            ctx.add("info", f"{nixl[0]} has no effect without a NIXL --kv-transfer-config",
                    "remove it from non-P/D nodes", ctx.env_path(node, nixl[0]), node.role)
