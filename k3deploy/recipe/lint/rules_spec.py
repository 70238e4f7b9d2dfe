"""``plan`` rules on speculative decoding: the layouts and model runner it composes with."""

from __future__ import annotations

from k3deploy.recipe.lint.context import PlanContext
from k3deploy.recipe.lint.registry import rule


@rule("spec-decoding-pp")
def spec_decoding_pp(ctx: PlanContext) -> None:
    """Speculative decoding with pipeline parallelism (an error for DSpark, unvalidated otherwise)."""
    for e in ctx.engines:
        lay = e.layout
        sc = lay.args.get("--speculative-config")
        method = lay.spec_method
        if sc is not None and lay.pp > 1:
            dspark = method == "dspark"
            ctx.add("error" if dspark else "warning",
                    f"speculative decoding ({method or 'configured'}) with --pipeline-parallel-size {lay.pp}: "
                    + ("DSpark does not compose with pipeline parallelism in vLLM 0.33 (its draft model then "
                       "loads with load_format=auto)" if dspark else "not validated with pipeline parallelism"),
                    "drop --speculative-config for pipeline-parallel layouts (scope the feature's strategies)",
                    ctx.arg_path(e.node, sc), e.role)


@rule("spec-decoding-runner")
def spec_decoding_runner(ctx: PlanContext) -> None:
    """DSpark with the V1 model runner selected."""
    for e in ctx.engines:
        if e.layout.spec_method == "dspark" and e.node.env.get("VLLM_USE_V2_MODEL_RUNNER") == "0":
            ctx.add("error", "DSpark runs only on Model Runner V2, but "
                    "VLLM_USE_V2_MODEL_RUNNER=0 selects V1", "remove VLLM_USE_V2_MODEL_RUNNER=0",
                    ctx.env_path(e.node, "VLLM_USE_V2_MODEL_RUNNER"), e.role)
