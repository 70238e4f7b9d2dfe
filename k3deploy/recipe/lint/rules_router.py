"""``plan`` rule on the P/D router: how long it waits for the engines it fronts. (Its flags are checked by
the flag rules of :mod:`~k3deploy.recipe.lint.rules_flags`.)"""

from __future__ import annotations

from k3deploy.recipe.lint.argv import as_int, placeholder
from k3deploy.recipe.lint.context import PlanContext
from k3deploy.recipe.lint.registry import rule

_READY = "VLLM_ENGINE_READY_TIMEOUT_S"


@rule("router-timeout")
def router_timeout(ctx: PlanContext) -> None:
    """The router gives up on its workers before the engines' own start-up timeout."""
    engines = [e.node for e in ctx.engines]
    timeout_flag = ctx.router.flag("--worker-startup-timeout-secs")
    ready_var = ctx.cat.env_var(_READY)
    default_ready = as_int(ready_var.default if ready_var else None, 600)
    for r in ctx.routers:
        waits = None
        for a in r.args:
            if (a.flag or a.abbrev_of) is timeout_flag and a.value and not placeholder(a.value):
                waits = as_int(a.value, 0)
        if waits is None:
            waits = as_int(timeout_flag.default if timeout_flag else None, 600)
        ready = max((as_int(n.env.get(_READY), default_ready) for n in engines), default=default_ready)
        if waits < ready:
            src = next((n for n in engines if as_int(n.env.get(_READY), -1) == ready), None)
            where = ctx.env_path(src, _READY) if src else "builder: router"
            ctx.add("warning",
                    f"vllm-router waits {waits} s for its workers (--worker-startup-timeout-secs), "
                    f"shorter than the {ready} s the engines may take to become ready "
                    "(VLLM_ENGINE_READY_TIMEOUT_S)",
                    f"add --worker-startup-timeout-secs {ready} to the router, or start it only after every "
                    "prefill and decode endpoint answers /health", where, "router")
