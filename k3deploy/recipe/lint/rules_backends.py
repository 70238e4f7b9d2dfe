"""``plan`` rules on the attention and MLA-prefill backends a node names: the GPU generations their kernels
support and the KV cache dtypes they take."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from k3deploy.recipe.lint.argv import Arg, placeholder
from k3deploy.recipe.lint.context import EngineNode, PlanContext
from k3deploy.recipe.lint.registry import rule


def _backends(ctx: PlanContext, engine: EngineNode) -> Iterator[tuple[Arg, Any, str]]:
    """(argument, backend or None, what) for ``--attention-backend`` and the ``mla_prefill_backend`` of
    ``--attention-config``, in that order."""
    lay = engine.layout
    att = lay.args.get("--attention-backend")
    if att is not None and att.value and not placeholder(att.value):
        yield att, ctx.cat.attention_backend(att.value), "--attention-backend"
    ac = lay.args.get("--attention-config")
    if ac is not None and ac.value and not placeholder(ac.value):
        try:
            data = json.loads(ac.value)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("mla_prefill_backend"), str):
            yield ac, ctx.cat.mla_prefill_backend(data["mla_prefill_backend"]), "mla_prefill_backend"


@rule("backend-capability")
def backend_capability(ctx: PlanContext) -> None:
    """A backend whose kernels do not run on the hardware's GPU generation (or on non-CUDA hardware)."""
    for e in ctx.engines:
        for a, backend, what in _backends(ctx, e):
            if backend is None:
                continue
            majors = backend.majors
            cc = ctx.capability()
            path = ctx.arg_path(e.node, a)
            if cc is not None:
                if backend.supports(cc) is False:
                    need = "/".join(f"{m}.x" for m in majors) or "another GPU generation"
                    ctx.add("error", f"{what} {backend.name} needs compute capability {need}; {ctx.hw.gen} GPUs are "
                            f"{cc[0]}.{cc[1]}",
                            "drop it for this hardware (let vLLM pick the backend) or gate it to the hardware it "
                            "supports", path, e.role)
            elif majors and min(majors) >= 10:
                ctx.add("error", f"{what} {backend.name} is a CUDA kernel for compute capability "
                        f"{'/'.join(f'{m}.x' for m in majors)}; {ctx.hw.brand} hardware cannot run it",
                        "drop it for this hardware (let vLLM pick the backend)", path, e.role)


@rule("backend-kv-dtype")
def backend_kv_dtype(ctx: PlanContext) -> None:
    """An attention backend that does not take the node's KV cache dtype."""
    for e in ctx.engines:
        lay = e.layout
        att = lay.args.get("--attention-backend")
        if att is None or not att.value or placeholder(att.value):
            continue
        b = ctx.cat.attention_backend(att.value)
        kv = (lay.value("--kv-cache-dtype") or "auto")
        if b is not None and b.supported_kv_cache_dtypes and kv not in b.supported_kv_cache_dtypes:
            ctx.add("error",
                    f"--attention-backend {b.name} supports KV cache dtypes {', '.join(b.supported_kv_cache_dtypes)}"
                    f" only; the KV cache dtype here is {kv}",
                    f"add --kv-cache-dtype {b.supported_kv_cache_dtypes[0]} or use another backend",
                    ctx.arg_path(e.node, att), e.role)
