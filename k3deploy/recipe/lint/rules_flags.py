"""``plan`` rules on the options of every node: unknown, abbreviated, repeated, deprecated flags, bad values
(argparse choices and types, the choice sets vLLM validates after parsing, JSON configs) and stray
positionals. ``vllm serve`` nodes are read with the vLLM catalog, router nodes with the vllm-router one."""

from __future__ import annotations

import difflib
import json

from k3deploy.recipe.catalog import Flag
from k3deploy.recipe.lint.argv import Arg, placeholder
from k3deploy.recipe.lint.context import EngineNode, PlanContext, RouterNode
from k3deploy.recipe.lint.registry import rule

#: ``vllm serve`` flags whose value vLLM validates after parsing (type=str) against a known set.
CHOICE_SETS = {
    "--attention-backend": "attention_backend",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--load-format": "load_format",
    "--tool-call-parser": "tool_call_parser",
    "--reasoning-parser": "reasoning_parser",
    "--moe-backend": "moe_backend",
    "--all2all-backend": "all2all_backend",
    "--dcp-comm-backend": "dcp_comm_backend",
}
#: choice sets a platform plugin (vllm-ascend) may extend
_PLUGIN_EXTENDED = {"kv_cache_dtype", "load_format", "attention_backend"}
_CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
_KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
_REPEATABLE = ("append", "count", "extend")
_ROUTER_PATH = "builder: router"


@rule("arg-positional")
def arg_positional(ctx: PlanContext) -> None:
    """A stray positional argument after the model (vLLM's parser exits)."""
    for e in ctx.engines:
        for s in e.stray:
            ctx.add("error", f"stray argument {s!r} after the model on {e.role}",
                    "remove it or attach it to its flag", ctx.arg_path(e.node, None, s), e.role)


@rule("flag-repeated")
def flag_repeated(ctx: PlanContext) -> None:
    """A flag set twice (possibly under two spellings): argparse keeps the last value."""
    for e in ctx.engines:
        seen: dict[str, Arg] = {}
        for a in e.args:
            f = a.known
            if f is None or f.action in _REPEATABLE:
                continue
            key = f.name + (f".{a.dotted}" if a.dotted else "")
            prev = seen.get(key)
            if prev is not None:
                ctx.add("warning",
                        f"{f.name} is set twice ({prev.option} {prev.value or ''} and {a.option} "
                        f"{a.value or ''}); argparse keeps the last one".replace(" )", ")").replace("  ", " "),
                        "keep one spelling so the value is the one you mean", ctx.arg_path(e.node, a), e.role)
            seen[key] = a


@rule("flag-unknown")
def flag_unknown(ctx: PlanContext) -> None:
    """A flag the engine's (or the router's) parser does not know."""
    for n in ctx.nodes:
        if isinstance(n, RouterNode):
            cat = ctx.router
            for a in n.args:
                if a.known is None:
                    names = [s for f in cat.flags for s in f.spellings]
                    near = difflib.get_close_matches(cat.normalize(a.option), names, n=1, cutoff=0.75)
                    ctx.add("error", f"vllm-router {cat.version} has no flag {a.option}",
                            f"use {near[0]}" if near else "remove it", _ROUTER_PATH, "router")
            continue
        cat = ctx.cat
        for a in n.args:
            if a.known is None:
                names = [s for f in cat.flags for s in f.spellings if s.startswith("--")]
                near = difflib.get_close_matches(cat.normalize(a.option), names, n=1, cutoff=0.75)
                fix = f"use {near[0]}" if near else "remove it (vLLM's parser exits with 'unrecognized arguments')"
                ctx.add("error", f"vllm {cat.version} has no flag {cat.normalize(a.option)}", fix,
                        ctx.arg_path(n.node, a), n.role)


@rule("flag-abbrev")
def flag_abbrev(ctx: PlanContext) -> None:
    """An abbreviation argparse expands to a flag (a new flag with the same prefix breaks it)."""
    for n in ctx.nodes:
        for a in n.args:
            if a.flag is not None or a.abbrev_of is None:
                continue
            if isinstance(n, RouterNode):
                ctx.add("warning", f"{a.option} is an abbreviation argparse expands to {a.abbrev_of.name}",
                        f"write {a.abbrev_of.name} in full", _ROUTER_PATH, "router")
            else:
                ctx.add("warning", f"{a.option} is an abbreviation argparse expands to {a.abbrev_of.name}",
                        f"write {a.abbrev_of.name} in full (a new flag with the same prefix breaks it)",
                        ctx.arg_path(n.node, a), n.role)


@rule("flag-deprecated")
def flag_deprecated(ctx: PlanContext) -> None:
    """A flag the pinned vLLM marks deprecated."""
    for e in ctx.engines:
        for a in e.args:
            f = a.known
            if f is not None and f.deprecated:
                ctx.add("warning", f"{f.name} is deprecated in vllm {ctx.cat.version}",
                        "drop it or use its replacement", ctx.arg_path(e.node, a), e.role)


@rule("flag-value")
def flag_value(ctx: PlanContext) -> None:
    """A value the parser (or vLLM's config validation right after it) rejects, or a missing value."""
    for n in ctx.nodes:
        if isinstance(n, RouterNode):
            _router_values(ctx, n)
        else:
            _engine_values(ctx, n)


def _router_values(ctx: PlanContext, router: RouterNode) -> None:
    for a in router.args:
        f = a.flag
        if f is None or a.value is None or placeholder(a.value) or f.nargs in ("+", "*"):
            continue
        why = f.check_value(a.value)
        if why:
            ctx.add("error", why, "fix the value", _ROUTER_PATH, "router")


def _engine_values(ctx: PlanContext, engine: EngineNode) -> None:
    cat, role = ctx.cat, engine.role
    for a in engine.args:
        f = a.known
        if f is None:
            continue
        if a.value is None:
            if f.takes_value and f.nargs not in ("?", "*"):
                ctx.add("error", f"{f.name} needs a value", f"give {f.name} a value", ctx.arg_path(engine.node, a),
                        role)
            continue
        if placeholder(a.value):
            continue
        if a.dotted is not None:  # one key of a config given as --flag.key value: vLLM's pydantic checks it
            keys = set(cat.attention_config_keys)
            key = a.dotted.split(".", 1)[0]
            if f.name == "--attention-config" and keys and key not in keys:
                ctx.add("error", f"--attention-config has no key {key!r}",
                        f"use one of: {', '.join(sorted(keys))}", ctx.arg_path(engine.node, a), role)
            continue
        why = f.check_value(a.value)
        if why is None:
            why = _check_choice_set(ctx, f, a.value)
        if why is None and f.is_json:
            why = _check_json(ctx, f, a.value)
        if why:
            sev = "warning" if why.startswith("~") else "error"
            ctx.add(sev, why.lstrip("~"), _value_fix(ctx, f), ctx.arg_path(engine.node, a), role)


def _value_fix(ctx: PlanContext, flag: Flag) -> str:
    kind = CHOICE_SETS.get(flag.name)
    if flag.choices:
        return f"use one of: {', '.join(flag.choices)}"
    if kind:
        return f"use a value vllm {ctx.cat.version} registers (k3deploy catalog set {kind})"
    return f"fix the value of {flag.name}"


def _check_choice_set(ctx: PlanContext, flag: Flag, value: str) -> str | None:
    """Why vLLM rejects ``value`` of a type=str flag it validates against a registered set; a leading ``~``
    marks a set a platform plugin may extend (a warning)."""
    kind = CHOICE_SETS.get(flag.name)
    if kind is None or flag.choices:
        return None
    allowed = ctx.cat.choices(kind)
    v = value
    if kind == "attention_backend":
        if v.lower() == "auto" or ctx.cat.attention_backend(v) is not None or v.upper() in allowed:
            return None
    elif kind == "moe_backend":
        if v.lower().replace("-", "_") in allowed:
            return None
    elif v in allowed:
        return None
    prefix = "~" if (ctx.npu and kind in _PLUGIN_EXTENDED) else ""
    near = difflib.get_close_matches(v, list(allowed), n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"{prefix}{flag.name} {value!r} is not a value vllm {ctx.cat.version} registers{hint}"


def _check_json(ctx: PlanContext, flag: Flag, value: str) -> str | None:
    """Why vLLM rejects the JSON config ``value`` (its form, and the keys and values k3deploy knows)."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        return f"{flag.name} is not valid JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(data, dict):
        return None
    cat = ctx.cat
    if flag.name == "--attention-config":
        keys = set(cat.attention_config_keys)
        bad = [k for k in data if keys and k not in keys]
        if bad:
            return f"--attention-config has no key {bad[0]!r}"
        mpb = data.get("mla_prefill_backend")
        if isinstance(mpb, str) and cat.mla_prefill_backend(mpb) is None:
            return f"--attention-config mla_prefill_backend {mpb!r} is not a registered MLA prefill backend"
        b = data.get("backend")
        if isinstance(b, str) and b.lower() != "auto" and cat.attention_backend(b) is None:
            return f"--attention-config backend {b!r} is not a registered attention backend"
    elif flag.name == "--speculative-config":
        method = data.get("method")
        methods = cat.choices("speculative_method")
        if isinstance(method, str) and methods and method not in methods:
            return f"--speculative-config method {method!r} is not one vllm {cat.version} registers"
    elif flag.name == "--compilation-config":
        mode = data.get("cudagraph_mode")
        if isinstance(mode, str) and mode.upper() not in _CUDAGRAPH_MODES:
            return f"--compilation-config cudagraph_mode {mode!r} is not one of {', '.join(_CUDAGRAPH_MODES)}"
    elif flag.name == "--kv-transfer-config":
        role = data.get("kv_role")
        if data.get("kv_connector") and role not in _KV_ROLES:
            return f"--kv-transfer-config kv_role {role!r} is not one of {', '.join(_KV_ROLES)}"
    return None
