"""Generate the engine catalogs in ``k3deploy/data/catalog/`` by introspecting a real vLLM / vllm-router install.

The catalogs are what ``k3deploy.recipe.catalog`` (and the linter built on it) knows about the pinned engine: every
``vllm serve`` flag with its type, choices and default; the environment variables ``vllm.envs`` registers;
the attention / MLA-prefill / MoE / all2all / KV-cache / load-format choices; the ``--attention-config`` keys;
and every ``vllm-router`` flag. Nothing here is typed in by hand: each value is read from the installed
packages, so regenerating after an engine upgrade picks up what changed.

Regenerate (same versions)::

    tools/engine-venv.sh                                   # creates .venv-engine (once)
    VLLM_TARGET_DEVICE=cpu .venv-engine/bin/python tools/gen_catalogs.py

For a new engine version::

    VLLM_VERSION=0.34.0 ROUTER_VERSION=0.1.18 tools/engine-venv.sh .venv-engine-next
    VLLM_TARGET_DEVICE=cpu .venv-engine-next/bin/python tools/gen_catalogs.py
    # writes k3deploy/data/catalog/vllm-0.34.0.json and vllm-router-0.1.18.json (named after the installed
    # versions); then point k3deploy.recipe.catalog's default version at them and run the tests.

``--check`` compares what would be written with the files on disk and exits 1 on a difference (handy in CI
on a machine that has the engine venv). Output is deterministic: keys and lists are sorted, defaults are
rendered as strings, and machine-specific paths (the home directory) are written as ``~``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib
import importlib.metadata
import json
import logging
import os
import re
import sys
import typing
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "k3deploy" / "data" / "catalog"
HOME = os.path.expanduser("~")

#: Compute capabilities at which backend classes are asked ``supports_compute_capability``:
#: Ampere, Hopper, Blackwell datacenter (B200/GB200 = 10.0, B300/GB300 = 10.3), Blackwell consumer.
CAPABILITIES = [(8, 0), (9, 0), (10, 0), (10, 3), (12, 0)]


# ------------------------------------------------------------------------------------------------------------
# formatting utilities


def render(value: Any) -> str | None:
    """A default value as a stable string (None stays None)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (int, float, str)):
        return str(value).replace(HOME, "~") if isinstance(value, str) else str(value)
    if isinstance(value, (set, frozenset)):
        return json.dumps(sorted(render(v) for v in value))
    if isinstance(value, (list, tuple)):
        return json.dumps([render(v) if not isinstance(v, (int, float, str)) else v for v in value])
    if isinstance(value, dict):
        return json.dumps({str(k): (v if isinstance(v, (int, float, str, bool)) or v is None else render(v))
                           for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}, sort_keys=True)
    if dataclasses.is_dataclass(value):
        return f"<{type(value).__name__}>"
    return f"<{type(value).__name__}>"


def closure_vars(fn: Any) -> dict[str, Any]:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    out = {}
    for name, cell in zip(code.co_freevars, cells, strict=True):
        try:
            out[name] = cell.cell_contents
        except ValueError:
            pass
    return out


def type_name(t: Any) -> tuple[str, bool]:
    """(name, optional) for an argparse ``type=`` callable as vLLM builds them."""
    if t is None:
        return "str", False
    if t in (int, float, str):
        return t.__name__, False
    if t is json.loads:
        return "json", False
    name = getattr(t, "__name__", type(t).__name__)
    if name == "_optional_type":
        inner, _ = type_name(closure_vars(t).get("return_type"))
        return inner, True
    if name == "_parse_type":
        inner, opt = type_name(closure_vars(t).get("return_type"))
        return inner, opt
    if name == "parse_dataclass":
        defaults = t.__defaults__ or ()
        cls = defaults[0] if defaults else None
        return f"json:{cls.__name__}" if cls is not None else "json", False
    if name == "union_dict_and_str":
        return "json_or_str", False
    if name == "<lambda>":
        return "str", False
    return name, False


# ------------------------------------------------------------------------------------------------------------
# vLLM


def build_serve_parser():
    """``vllm serve``'s parser, as ``vllm.entrypoints.cli.main`` builds it."""
    import vllm.entrypoints.cli.serve as serve_mod
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmd = serve_mod.ServeSubcommand()
    serve = cmd.subparser_init(subparsers)
    return serve


def action_record(action: argparse.Action, accepted: list[str], group: str, deprecated: set) -> dict[str, Any]:
    """One flag. ``accepted`` = every option string the parser maps to this action (help-hidden ones too)."""
    boolean_optional = isinstance(action, argparse.BooleanOptionalAction)
    negative = set(getattr(action, "negative_option_strings", ()) or ())
    if boolean_optional and not negative:
        negative = {o for o in accepted if o.startswith("--no-")}
    positive = [o for o in accepted if o not in negative]
    visible = [o for o in action.option_strings if o not in negative]
    longs = [o for o in visible if o.startswith("--")] or [o for o in positive if o.startswith("--")]
    name = longs[0] if longs else positive[0]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)) or boolean_optional:
        tname, optional = "bool", False
    else:
        tname, optional = type_name(action.type)
    choices = None
    if action.choices is not None:
        choices = sorted(str(c) for c in action.choices if c is not None)
        if any(c is None for c in action.choices):
            optional = True
    kind = type(action).__name__
    kind = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
            "_AppendAction": "append", "_StoreConstAction": "store_const", "_CountAction": "count",
            "_VersionAction": "version", "BooleanOptionalAction": "boolean_optional",
            "EnableDisableAction": "boolean_optional"}.get(kind, kind)
    takes_value = action.nargs != 0 and kind not in ("store_true", "store_false", "boolean_optional", "version",
                                                     "store_const", "count")
    return {
        "name": name,
        "aliases": sorted(o for o in positive if o != name),
        "negations": sorted(negative),
        "hidden": sorted(o for o in accepted if o not in action.option_strings),
        "dest": action.dest,
        "group": group,
        "action": kind,
        "type": tname,
        "optional": optional,
        "choices": choices,
        "nargs": None if action.nargs is None else str(action.nargs),
        "boolean_optional": boolean_optional,
        "takes_value": takes_value,
        "default": None if action.default is argparse.SUPPRESS else render(action.default),
        "deprecated": action in deprecated,
    }


def parser_flags(parser: argparse.ArgumentParser) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    group_of: dict[int, str] = {}
    for grp in parser._action_groups:
        for act in grp._group_actions:
            group_of[id(act)] = grp.title or ""
    accepted: dict[int, list[str]] = {}
    for opt, act in parser._option_string_actions.items():
        accepted.setdefault(id(act), []).append(opt)
    deprecated: set[str] = getattr(parser, "_deprecated", set())
    flags: list[dict[str, Any]] = []
    positionals: list[dict[str, Any]] = []
    for act in parser._actions:
        if not act.option_strings:
            positionals.append({"dest": act.dest, "nargs": None if act.nargs is None else str(act.nargs)})
            continue
        if isinstance(act, argparse._HelpAction):
            continue
        flags.append(action_record(act, sorted(accepted.get(id(act), act.option_strings)),
                                   group_of.get(id(act), ""), deprecated))
    flags.sort(key=lambda f: str(f["name"]))
    positionals.sort(key=lambda p: str(p["dest"]))
    return flags, positionals


def config_field_default(group: str, dest: str) -> tuple[bool, Any]:
    """(found, default) of the config dataclass field a flag fills (its argument group is named after it)."""
    import vllm.config as config_mod

    cls = getattr(config_mod, group, None)
    if cls is None or not dataclasses.is_dataclass(cls):
        return False, None
    for f in dataclasses.fields(cls):
        if f.name != dest:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
            if type(default).__name__ == "FieldInfo":
                factory = getattr(default, "default_factory", None)
                if factory is not None:
                    return False, None
                default = default.default
            return True, default
        return False, None
    return False, None


def add_config_defaults(flags: list[dict[str, Any]]) -> None:
    """Where the CLI default is None (= "not given"), record the default of the config field it fills:
    that is the value the engine ends up with (e.g. ``--data-parallel-rpc-port`` → 29550)."""
    for f in flags:
        if f["default"] is not None:
            continue
        found, default = config_field_default(f["group"], f["dest"])
        if found and default is not None and not dataclasses.is_dataclass(default):
            f["config_default"] = render(default)


def env_type_annotations() -> dict[str, str]:
    """``NAME: type = default`` annotations of ``vllm/envs.py`` (its ``if TYPE_CHECKING:`` block)."""
    import vllm.envs as envs

    tree = ast.parse(Path(envs.__file__).read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id.isupper():
                out[node.target.id] = ast.unparse(node.annotation)
    return out


def fresh_default(getter: Any) -> str | None:
    """The getter's value with the variable unset; undoes a getter that writes its default into os.environ."""
    snapshot = dict(os.environ)
    try:
        return render(getter())
    finally:
        os.environ.clear()
        os.environ.update(snapshot)


def env_catalog() -> list[dict[str, Any]]:
    import vllm.envs as envs

    annotations = env_type_annotations()
    saved = dict(os.environ)
    for k in list(os.environ):
        if k.startswith("VLLM_") and k not in ("VLLM_TARGET_DEVICE", "VLLM_CONFIGURE_LOGGING"):
            del os.environ[k]
    out = []
    try:
        for name in sorted(envs.environment_variables):
            getter = envs.environment_variables[name]
            rec: dict[str, Any] = {"name": name, "type": annotations.get(name)}
            if name in ("VLLM_TARGET_DEVICE", "VLLM_CONFIGURE_LOGGING"):
                # set by this generator; record the code's default, not ours
                value = os.environ.pop(name)
                try:
                    rec["default"] = render(getter())
                finally:
                    os.environ[name] = value
            else:
                try:
                    first, second = fresh_default(getter), fresh_default(getter)
                except Exception as exc:  # a getter that needs a device or another var
                    rec["default"] = None
                    rec["default_error"] = type(exc).__name__
                else:
                    if first == second:
                        rec["default"] = first
                    else:  # generated per process (a random name, a free port): no stable default
                        rec["default"] = None
                        rec["default_dynamic"] = True
            cv = closure_vars(getter)
            choices = cv.get("choices")
            if choices is not None:
                if callable(choices):
                    try:
                        choices = choices()
                    except Exception:
                        choices = None
                if choices is not None:
                    rec["choices"] = sorted(str(c) for c in choices)
                    rec["case_sensitive"] = bool(cv.get("case_sensitive", True))
            out.append(rec)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return out


def capability_support(cls: Any) -> dict[str, bool] | None:
    from vllm.platforms.interface import DeviceCapability

    fn = getattr(cls, "supports_compute_capability", None)
    if fn is None:
        return None
    out = {}
    for major, minor in CAPABILITIES:
        try:
            out[f"{major}.{minor}"] = bool(fn(DeviceCapability(major, minor)))
        except Exception:
            return None
    return out


def backend_records(enum_cls: Any) -> list[dict[str, Any]]:
    """Members of a backend enum, with the compute capabilities the backend class accepts where it imports."""
    out = []
    for member in enum_cls:
        rec: dict[str, Any] = {"name": member.name, "class": member.value or None}
        try:
            cls = member.get_class()
        except Exception as exc:
            rec["compute_capability"] = None
            message = re.sub(r"\s*\((?:/|[A-Za-z]:)[^)]*\)", "", str(exc).splitlines()[0] if str(exc) else "")
            rec["introspection_error"] = f"{type(exc).__name__}: {message[:160]}"
        else:
            rec["compute_capability"] = capability_support(cls)
            for attr in ("supported_kv_cache_dtypes", "supported_dtypes"):
                val = getattr(cls, attr, None)
                if isinstance(val, (list, tuple, set)):
                    rec[attr] = sorted(str(v).replace("torch.", "") for v in val)
        out.append(rec)
    out.sort(key=lambda r: str(r["name"]))
    return out


def dataclass_keys(cls: Any) -> list[dict[str, Any]]:
    hints = typing.get_type_hints(cls, include_extras=False)
    out = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        default = getattr(default, "default", default) if type(default).__name__ == "FieldInfo" else default
        ann = hints.get(f.name, f.type)
        tname = getattr(ann, "__name__", None) if isinstance(ann, type) else None
        rec = {"name": f.name, "type": tname or str(ann).replace("typing.", ""), "default": render(default)}
        literal_choices = literal_values(ann)
        if literal_choices:
            rec["choices"] = literal_choices
        out.append(rec)
    out.sort(key=lambda r: str(r["name"]))
    return out


def literal_values(tp: Any) -> list[str] | None:
    vals: list[str] = []

    def walk(t: Any) -> None:
        origin = typing.get_origin(t)
        if origin is typing.Literal:
            vals.extend(str(a) for a in typing.get_args(t))
        elif origin is not None:
            for a in typing.get_args(t):
                walk(a)
        elif isinstance(t, type) and issubclass(t, enum.Enum):
            vals.extend(m.name for m in t)

    walk(tp)
    return sorted(set(vals)) or None


def flag_choices(flags: list[dict[str, Any]], name: str) -> list[str] | None:
    for f in flags:
        if f["name"] == name:
            return f["choices"]
    return None


def vllm_catalog() -> dict[str, Any]:
    import vllm
    from vllm.config import attention as attention_mod
    from vllm.config import cache as cache_mod
    from vllm.config import kernel as kernel_mod
    from vllm.config import parallel as parallel_mod
    from vllm.config import speculative as spec_mod
    from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    serve = build_serve_parser()
    flags, positionals = parser_flags(serve)
    add_config_defaults(flags)

    load_formats = None
    try:
        loader = importlib.import_module("vllm.model_executor.model_loader")
        load_formats = sorted(typing.get_args(loader.LoadFormats))
    except Exception:
        pass

    try:
        from vllm.tool_parsers import ToolParserManager

        tool_parsers = ToolParserManager.list_registered()
    except Exception:
        tool_parsers = None
    try:
        from vllm.reasoning import ReasoningParserManager

        reasoning_parsers = ReasoningParserManager.list_registered()
    except Exception:
        reasoning_parsers = None

    return {
        "engine": "vllm",
        "version": vllm.__version__,
        "generator": "tools/gen_catalogs.py",
        "serve_positionals": positionals,
        "allow_abbrev": serve.allow_abbrev,
        "flags": flags,
        "env_vars": env_catalog(),
        "choices": {
            "all2all_backend": flag_choices(flags, "--all2all-backend"),
            "all2all_backend_config": sorted(typing.get_args(parallel_mod.All2AllBackend)),
            "attention_backend": sorted(m.name for m in AttentionBackendEnum),
            "dcp_comm_backend": sorted(typing.get_args(parallel_mod.DCPCommBackend)),
            "kv_cache_dtype": sorted(typing.get_args(cache_mod.CacheDType)),
            "load_format": load_formats,
            "mla_prefill_backend": sorted(m.name for m in MLAPrefillBackendEnum),
            "moe_backend": sorted(typing.get_args(kernel_mod.MoEBackend)),
            "reasoning_parser": reasoning_parsers,
            "speculative_method": literal_values(spec_mod.SpeculativeMethod),
            "tool_call_parser": tool_parsers,
        },
        "attention_backends": backend_records(AttentionBackendEnum),
        "attention_config": {
            "keys": dataclass_keys(attention_mod.AttentionConfig),
            "mla_prefill_backends": backend_records(MLAPrefillBackendEnum),
        },
        "capabilities_probed": [f"{a}.{b}" for a, b in CAPABILITIES],
        "introspected_on_platform": os.environ.get("VLLM_TARGET_DEVICE", ""),
    }


# ------------------------------------------------------------------------------------------------------------
# vllm-router


def router_catalog() -> dict[str, Any]:
    from vllm_router.router_args import RouterArgs

    # the parser vllm_router.launch_router.parse_router_args builds
    parser = argparse.ArgumentParser(prog="vllm-router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    flags, positionals = parser_flags(parser)
    return {
        "engine": "vllm-router",
        "version": importlib.metadata.version("vllm-router"),
        "generator": "tools/gen_catalogs.py",
        "entry_point": "vllm_router.launch_router:main",
        "allow_abbrev": parser.allow_abbrev,
        "flags": flags,
        "positionals": positionals,
    }


# ------------------------------------------------------------------------------------------------------------


def dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate k3deploy/data/catalog/*.json from the installed engine.")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    opts = ap.parse_args(argv)
    logging.disable(logging.WARNING)  # backend imports log their missing GPU kernels; not our concern here

    outputs = {}
    vc = vllm_catalog()
    outputs[f"vllm-{vc['version']}.json"] = dump(vc)
    rc = router_catalog()
    outputs[f"vllm-router-{rc['version']}.json"] = dump(rc)

    status = 0
    opts.out.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(outputs.items()):
        path = opts.out / name
        if opts.check:
            current = path.read_text(encoding="utf-8") if path.exists() else None
            if current != text:
                print(f"{path}: differs from the installed engine; rerun tools/gen_catalogs.py", file=sys.stderr)
                status = 1
            else:
                print(f"{path}: up to date", file=sys.stderr)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path} ({len(text)} bytes)", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
