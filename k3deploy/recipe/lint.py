"""Lint: what the recipe builder prints but the pinned engine does not accept, or the hardware cannot run.

Pure (no I/O besides the packaged data): checks resolved plans against the engine catalogs
(:mod:`k3deploy.recipe.catalog`) and the hardware taxonomy, and names for every finding the recipe key that
produced the offending argument or variable.

    >>> from k3deploy import load_recipe, resolve
    >>> from k3deploy.recipe.lint import lint_plan
    >>> recipe = load_recipe()
    >>> plan = resolve(recipe, hardware="mi355x", strategy="single_node_tp")
    >>> [f.path for f in lint_plan(recipe, plan) if f.code == "env-unknown"]
    ['hardware_overrides.amd.extra_env.VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4']

:func:`lint_recipe` runs the whole offered matrix (every variant × hardware × strategy, with the default
features and with each opt-in feature switched on) and groups identical findings across selections.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from math import ceil
from typing import Any

from k3deploy.errors import K3Error, SelectionError
from k3deploy.recipe.catalog import Catalog, Flag, load_catalog
from k3deploy.recipe.plan import NodePlan, Plan
from k3deploy.recipe.schema import Recipe
from k3deploy.recipe.taxonomy import HardwareProfile, hardware, pinned_images, strategies

SEVERITIES = ("error", "warning", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


# ------------------------------------------------------------------------------------------------
# Findings


@dataclass(frozen=True)
class Finding:
    """One problem. ``path`` is the recipe key that produced it (``hardware_overrides.amd.extra_env.X``,
    ``strategy_overrides.pd_cluster.prefill.env.Y``, ``guide``), a packaged data file
    (``strategies/pd_cluster.yaml:prefill.env.Z``, ``images.yaml:kimi-k3.amd``) or, for flags the builder
    synthesises itself, ``builder:<strategy> parallel flags``."""

    severity: str
    code: str
    message: str
    fix: str
    path: str | None = None
    roles: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str | None, str, str]:
        return (self.severity, self.code, self.path, self.message, self.fix)

    def line(self) -> str:
        where = f" [{self.path}]" if self.path else ""
        on = f" (on {', '.join(self.roles)})" if self.roles else ""
        return f"{self.code}: {self.message}{on}{where}: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "code": self.code, "path": self.path, "message": self.message,
                "fix": self.fix, "roles": list(self.roles)}


@dataclass(frozen=True)
class Selection:
    """One resolved selection of the matrix; ``extra`` are the opt-in features switched on for it."""

    hardware: str
    strategy: str
    variant: str
    features: tuple[str, ...]
    extra: tuple[str, ...] = ()
    nodes: str = ""

    def label(self) -> str:
        s = f"{self.hardware}/{self.strategy}/{self.variant}"
        return s + "".join(f" +{f}" for f in self.extra)

    def to_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "strategy": self.strategy, "variant": self.variant,
                "features": list(self.features), "opt_in": list(self.extra), "nodes": self.nodes}


@dataclass
class Group:
    """A finding and every selection it occurs in (empty: it concerns the recipe as a whole)."""

    finding: Finding
    selections: list[Selection] = field(default_factory=list)
    roles: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        d = self.finding.to_dict()
        d["roles"] = sorted(self.roles)
        d["scope"] = "selection" if self.selections else "recipe"
        d["selections"] = [s.to_dict() for s in self.selections]
        return d


@dataclass
class LintReport:
    recipe: str
    groups: list[Group]
    checked: list[Selection]

    @property
    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in SEVERITIES}
        for g in self.groups:
            out[g.finding.severity] += 1
        return out

    @property
    def exit_code(self) -> int:
        """1 when any finding is an error, else 0."""
        return 1 if self.counts["error"] else 0

    def to_dict(self) -> dict[str, Any]:
        c = self.counts
        return {"findings": [g.to_dict() for g in self.groups],
                "summary": {"recipe": self.recipe, "selections": len(self.checked), "errors": c["error"],
                            "warnings": c["warning"], "info": c["info"], "findings": len(self.groups),
                            "exit_code": self.exit_code}}


# ------------------------------------------------------------------------------------------------
# Where an argument or variable came from


_ARG_KEYS = ("base_args", "extra_args", "vllm_args", "args")
_ENV_KEYS = ("base_env", "extra_env", "env")


@dataclass(frozen=True)
class _Source:
    path: tuple[str, ...]
    kind: str  # "args" | "env"
    items: Any  # list[str] or dict[str, str]
    prefix: str = ""  # "" for the recipe, "strategies/<id>.yaml:" for a strategy definition


def _walk(node: Any, path: tuple[str, ...], out: list[_Source], prefix: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            k = str(k)
            if k in _ARG_KEYS and isinstance(v, list):
                out.append(_Source(path + (k,), "args", [str(a) for a in v], prefix))
            elif k in _ENV_KEYS and isinstance(v, dict):
                out.append(_Source(path + (k,), "env", {str(a): str(b) for a, b in v.items()}, prefix))
            elif isinstance(v, (dict, list)) and k not in ("guide", "meta"):
                _walk(v, path + (k,), out, prefix)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, (dict, list)):
                _walk(v, path + (str(i),), out, prefix)


def _hw_keys(hw: HardwareProfile) -> set[str]:
    keys = {hw.id, hw.gen, hw.brand.lower(), "default", *hw.generations}
    if hw.brand == "NVIDIA":
        keys.add("nvidia")
    return keys


class Provenance:
    """Finds the recipe key an argument or variable of a selection came from, by searching the recipe's
    argument lists and env maps that apply to the selection (variant, hardware keys, strategy, role,
    features), then the strategy definition."""

    def __init__(self, recipe: Recipe) -> None:
        raw = recipe.model_dump(mode="python", exclude={"guide", "source"})
        self.sources: list[_Source] = []
        _walk(raw, (), self.sources)
        self.strategy_sources: dict[str, list[_Source]] = {}
        for sid, strat in strategies().items():
            found: list[_Source] = []
            _walk(strat.model_dump(mode="python"), (), found, prefix=f"strategies/{sid}.yaml:")
            self.strategy_sources[sid] = found

    @staticmethod
    def _applies(src: _Source, ctx: _Ctx) -> bool:
        p = src.path
        if src.prefix:  # strategy definition: top level, or the node's pd role
            return not (p and p[0] in ("prefill", "decode") and p[0] != ctx.role)
        for i, seg in enumerate(p):
            parent = p[i - 1] if i else None
            if parent == "variants" and seg != ctx.variant:
                return False
            if parent == "features" and seg not in ctx.features:
                return False
            if parent == "strategy_overrides" and seg != ctx.strategy:
                return False
            if parent == "hardware_overrides" and seg not in ctx.hw_keys:
                return False
            if i >= 2 and p[0] == "strategy_overrides" and i == 2 and seg in ("prefill", "decode") \
                    and seg != ctx.role:
                return False
        return True

    def _candidates(self, ctx: _Ctx) -> Iterator[_Source]:
        for s in self.sources:
            if self._applies(s, ctx):
                yield s
        for s in self.strategy_sources.get(ctx.strategy, ()):
            if self._applies(s, ctx):
                yield s

    def arg(self, ctx: _Ctx, spellings: Iterable[str], value: str | None, norm: Callable[[str], str]) -> str | None:
        """Key path of the argument list entry that sets this flag (with this value when given)."""
        wanted = set(spellings)
        best: tuple[int, str] | None = None
        for src in self._candidates(ctx):
            items = src.items
            for i, a in enumerate(items):
                if not a.startswith("-") or norm(a) not in wanted:
                    continue
                inline = a.split("=", 1)[1] if "=" in a else None
                nxt = inline if inline is not None else (items[i + 1] if i + 1 < len(items) else None)
                score = 2 if value is None or nxt == value else 1
                path = src.prefix + ".".join(src.path) + f"[{i}]"
                if best is None or score > best[0]:
                    best = (score, path)
        return best[1] if best else None

    def env(self, ctx: _Ctx, name: str, value: str | None) -> str | None:
        best: tuple[int, str] | None = None
        for src in self._candidates(ctx):
            if name in src.items:
                score = 2 if value is None or src.items[name] == value else 1
                path = src.prefix + ".".join(src.path + (name,))
                if best is None or score > best[0]:
                    best = (score, path)
        return best[1] if best else None


@dataclass
class _Ctx:
    variant: str
    strategy: str
    features: set[str]
    hw: HardwareProfile
    hw_keys: set[str]
    role: str | None = None


# ------------------------------------------------------------------------------------------------
# Argument vectors


@dataclass(frozen=True)
class Arg:
    option: str  # as written
    value: str | None
    flag: Flag | None  # exact match in the catalog
    abbrev_of: Flag | None = None  # the flag argparse would expand an abbreviation to

    @property
    def dotted(self) -> str | None:
        """The config key of a dotted option (``--kv-transfer-config.kv_role`` → ``kv_role``), else None."""
        name = self.option.split("=", 1)[0]
        if not name.startswith("--") or "." not in name:
            return None
        return name.split(".", 1)[1]


def parse_argv(tokens: Sequence[str], cat: Catalog) -> tuple[list[Arg], list[str]]:
    """Split an argument vector into options with their values the way argparse consumes them; returns the
    options and the stray positionals."""
    out: list[Arg] = []
    stray: list[str] = []
    i, n = 0, len(tokens)
    while i < n:
        t = tokens[i]
        if not t.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", t):
            stray.append(t)
            i += 1
            continue
        inline = t.split("=", 1)[1] if t.startswith("--") and "=" in t else None
        exact = cat.flag(t)
        abbr = None if exact is not None else cat.flag(t, abbrev=True)
        f = exact or abbr
        i += 1
        if inline is not None:
            out.append(Arg(t, inline, exact, abbr))
            continue
        if f is not None and not f.takes_value:
            out.append(Arg(t, None, exact, abbr))
            continue
        nargs = f.nargs if f is not None else None
        if nargs in ("+", "*"):
            vals = []
            while i < n and not tokens[i].startswith("-"):
                vals.append(tokens[i])
                i += 1
            out.append(Arg(t, " ".join(vals) if vals else None, exact, abbr))
            continue
        if i < n and (not tokens[i].startswith("-") or (f is not None and re.fullmatch(r"-\d+(\.\d+)?", tokens[i]))):
            out.append(Arg(t, tokens[i], exact, abbr))
            i += 1
        else:
            out.append(Arg(t, None, exact, abbr))
    return out, stray


def _placeholder(value: str | None) -> bool:
    return value is not None and "$" in value


def _as_int(value: str | None, default: int) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


# ------------------------------------------------------------------------------------------------
# Engine layout of one node


@dataclass
class _Layout:
    args: dict[str, Arg]  # canonical flag name -> last occurrence
    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_local: int | None = None
    dp_start: int | None = None
    dcp: int = 1
    nnodes: int = 1
    node_rank: int = 0
    ep: bool = False
    headless: bool = False
    hybrid_lb: bool = False
    external_lb: bool = False
    dp_rank: int | None = None
    moe_backend: str | None = None
    spec_method: str | None = None

    def has(self, name: str) -> bool:
        return name in self.args

    def value(self, name: str) -> str | None:
        a = self.args.get(name)
        return a.value if a else None

    def boolean(self, name: str, cat: Catalog) -> bool:
        a = self.args.get(name)
        if a is None:
            return False
        return not cat.is_negation(a.option)


def _layout(args: list[Arg], cat: Catalog) -> _Layout:
    by: dict[str, Arg] = {}
    method = None
    for a in args:
        f = a.flag or a.abbrev_of
        if f is None:
            continue
        if f.name == "--speculative-config":
            if a.dotted == "method":
                method = a.value
            elif a.dotted is None and a.value:
                try:
                    data = json.loads(a.value)
                except ValueError:
                    data = None
                method = data.get("method") if isinstance(data, dict) else None
        if a.dotted is None or f.name not in by:
            by[f.name] = a
    lay = _Layout(args=by, spec_method=method)

    def num(name: str, default: int) -> int:
        return _as_int(lay.value(name), default)

    lay.tp, lay.pp, lay.dp = num("--tensor-parallel-size", 1), num("--pipeline-parallel-size", 1), \
        num("--data-parallel-size", 1)
    lay.dcp, lay.nnodes, lay.node_rank = num("--decode-context-parallel-size", 1), num("--nnodes", 1), \
        num("--node-rank", 0)
    if lay.has("--data-parallel-size-local"):
        lay.dp_local = num("--data-parallel-size-local", 1)
    if lay.has("--data-parallel-start-rank"):
        lay.dp_start = num("--data-parallel-start-rank", 0)
    if lay.has("--data-parallel-rank"):
        lay.dp_rank = num("--data-parallel-rank", 0)
    lay.ep = lay.boolean("--enable-expert-parallel", cat)
    lay.headless = lay.boolean("--headless", cat)
    lay.hybrid_lb = lay.boolean("--data-parallel-hybrid-lb", cat)
    lay.external_lb = lay.boolean("--data-parallel-external-lb", cat)
    mb = lay.value("--moe-backend")
    lay.moe_backend = mb.lower().replace("-", "_") if mb else None
    return lay


# ------------------------------------------------------------------------------------------------
# Images

#: Repositories the engine images are published under, with the vendor each one serves.
KNOWN_REPOSITORIES = {
    "vllm/vllm-openai": "nvidia",
    "vllm/vllm-openai-rocm": "amd",
    "vllm/vllm-tpu": "tpu",
    "vllm/vllm-openai-cpu": "intel",
    "vllm/vllm-openai-xpu": "intel",
    "quay.io/ascend/vllm-ascend": "npu",
}
_CHECKED_NAMESPACES = ("vllm/", "quay.io/ascend/")
_REF = re.compile(
    r"(?P<repo>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?")
_GUIDE_IMAGE = re.compile(r"(?<![\w/.-])((?:quay\.io/ascend/|docker\.io/)?vllm/vllm[\w.-]*(?::[\w.-]+)?)")


def _repo_of(ref: str) -> str:
    m = _REF.fullmatch(ref)
    repo = m.group("repo") if m else ref.split("@")[0].rsplit(":", 1)[0]
    return repo[len("docker.io/"):] if repo.startswith("docker.io/") else repo


def check_image(ref: str, path: str | None, *, vendor: str | None = None, severity: str = "error",
                pin_info: bool = True) -> list[Finding]:
    """Findings for one image reference: malformed, a repository that does not exist in the engine's
    namespace, the wrong vendor's image, or an unpinned tag."""
    out: list[Finding] = []
    m = _REF.fullmatch(ref)
    repo = _repo_of(ref)
    if m is None:
        near = difflib.get_close_matches(repo.replace("_", "-"), list(KNOWN_REPOSITORIES), n=1, cutoff=0.8)
        fix = f"use {near[0]}{ref[len(repo):] if ref.startswith(repo) else ''}" if near else \
            "write REPO[:TAG][@sha256:DIGEST] in lower case"
        out.append(Finding(severity, "image-invalid", f"image {ref!r} is not a valid image reference", fix, path))
        return out
    if repo.startswith(_CHECKED_NAMESPACES) and repo not in KNOWN_REPOSITORIES:
        near = difflib.get_close_matches(repo.replace("_", "-"), list(KNOWN_REPOSITORIES), n=1, cutoff=0.8)
        fix = (f"use {near[0]}{ref[len(repo):]} and verify it with docker manifest inspect" if near
               else f"use one of {', '.join(KNOWN_REPOSITORIES)}")
        out.append(Finding(severity, "image-repository",
                           f"image repository {repo} does not exist (image {ref})", fix, path))
        return out
    if vendor and repo in KNOWN_REPOSITORIES and KNOWN_REPOSITORIES[repo] != vendor:
        want = [r for r, v in KNOWN_REPOSITORIES.items() if v == vendor]
        out.append(Finding("error", "image-vendor",
                           f"image {ref} is the {KNOWN_REPOSITORIES[repo]} build, the hardware needs a {vendor} image",
                           f"use {want[0] if want else 'an image built for ' + vendor}:TAG", path))
    if pin_info and not m.group("digest"):
        tag = m.group("tag")
        if tag in (None, "latest", "nightly"):
            out.append(Finding("warning", "image-unpinned", f"image {ref} follows a moving tag ({tag or 'latest'})",
                               "pin a release tag and a digest (REPO:TAG@sha256:...; docker manifest inspect shows it)",
                               path))
        else:
            out.append(Finding("info", "image-digest", f"image {ref} is not pinned by digest",
                               "pin it as REPO:TAG@sha256:<digest> (docker manifest inspect shows it), or pass "
                               "--image @sha256:<digest>", path))
    return out


def _image_path(recipe: Recipe, plan: Plan, hw: HardwareProfile) -> str:
    v = recipe.variants.get(plan.variant)
    pin = v.hardware_overrides.get(hw.id) if v else None
    if pin is not None and pin.docker_image == plan.image:
        return f"variants.{plan.variant}.hardware_overrides.{hw.id}.docker_image"
    if pinned_images().get(recipe.slug, {}).get(hw.vendor) == plan.image:
        return f"images.yaml:{recipe.slug}.{hw.vendor}"
    for where, o in ((f"variants.{plan.variant}.docker_image", v.docker_image if v else None),
                     ("model.docker_image", recipe.model.docker_image)):
        if o == plan.image:
            return where
        if isinstance(o, dict):
            for k, val in o.items():
                if val == plan.image:
                    return f"{where}.{k}"
                if isinstance(val, dict):
                    for k2, val2 in val.items():
                        if val2 == plan.image:
                            return f"{where}.{k}.{k2}"
    return "builder: default image"


def recipe_image_findings(recipe: Recipe) -> list[Finding]:
    """Image names written anywhere in the recipe (``docker_image`` keys, the guide) and in k3deploy's own
    pins, checked for the repository form. Guide mentions are warnings: the guide is read, not run."""
    out: list[Finding] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                p = f"{path}.{k}" if path else str(k)
                if k == "docker_image":
                    for ref, rp in _image_refs(v, p):
                        out.extend(check_image(ref, rp, pin_info=False))
                elif isinstance(v, (dict, list)) and k != "guide":
                    walk(v, p)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(recipe.model_dump(mode="python", exclude={"guide", "source"}), "")
    seen = set()
    for m in _GUIDE_IMAGE.finditer(recipe.guide or ""):
        ref = m.group(1).rstrip(".")
        if ref in seen:
            continue
        seen.add(ref)
        out.extend(f for f in check_image(ref, "guide", severity="warning", pin_info=False))
    for slug, per_vendor in (pinned_images() or {}).items():
        for vendor, ref in (per_vendor or {}).items():
            out.extend(check_image(str(ref), f"images.yaml:{slug}.{vendor}", vendor=vendor, pin_info=False))
    return out


def _image_refs(v: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(v, str):
        yield v, path
    elif isinstance(v, dict):
        for k, val in v.items():
            yield from _image_refs(val, f"{path}.{k}")


# ------------------------------------------------------------------------------------------------
# Checks on one plan

#: ``vllm serve`` flags whose value vLLM validates after parsing (type=str) against a known set.
_CHOICE_SETS = {
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
_NVL_ONLY_ENV = ("NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE", "VLLM_USE_NCCL_SYMM_MEM",
                 "UCX_NET_DEVICES")
#: Env names vLLM renamed or never had, with the variable to use instead.
_ENV_RENAMES = {
    "VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4": ("VLLM_ROCM_USE_AITER_MOE_SITUV2", "a8w4"),
    "VLLM_ROCM_USE_AITER_MOE_SITUV2_A4W4": ("VLLM_ROCM_USE_AITER_MOE_SITUV2", "a4w4"),
}


class _PlanLinter:
    def __init__(self, recipe: Recipe, plan: Plan, prov: Provenance, cat: Catalog, router: Catalog) -> None:
        self.recipe, self.plan, self.prov, self.cat, self.router = recipe, plan, prov, cat, router
        self.hw = hardware()[plan.hardware]
        self.strategy = strategies()[plan.strategy]
        self.out: list[Finding] = []
        self.ctx = _Ctx(variant=plan.variant, strategy=plan.strategy, features=set(plan.features), hw=self.hw,
                        hw_keys=_hw_keys(self.hw))
        self.cuda = self.hw.brand == "NVIDIA"
        self.npu = self.hw.vendor == "npu"

    # -- shared ----------------------------------------------------------------------------------------

    def add(self, severity: str, code: str, message: str, fix: str, path: str | None, role: str | None) -> None:
        self.out.append(Finding(severity, code, message, fix, path, (role,) if role else ()))

    def arg_path(self, node: NodePlan, a: Arg | None, name: str | None = None) -> str:
        self.ctx.role = node.role
        f = (a.flag or a.abbrev_of) if a else None
        spellings: list[str] = [self.cat.normalize(a.option)] if a is not None else [name or ""]
        if f is not None:
            spellings += f.spellings
        value = a.value if a else None
        found = self.prov.arg(self.ctx, spellings, value, self.cat.normalize)
        return found or f"builder: {self.plan.strategy}"

    def env_path(self, node: NodePlan, name: str) -> str:
        self.ctx.role = node.role
        return self.prov.env(self.ctx, name, node.env.get(name)) or f"builder: {self.plan.strategy} env"

    # -- entry ---------------------------------------------------------------------------------------

    def run(self) -> list[Finding]:
        engines = [n for n in self.plan.nodes if n.role != "router"]
        layouts: dict[int, _Layout] = {}
        for idx, node in enumerate(self.plan.nodes):
            if node.role == "router":
                self.check_router(node, engines)
                continue
            args, stray = parse_argv(node.argv[3:], self.cat)
            for s in stray:
                self.add("error", "arg-positional", f"stray argument {s!r} after the model on {node.role}",
                         "remove it or attach it to its flag", self.arg_path(node, None, s), node.role)
            self.check_flags(node, args)
            lay = _layout(args, self.cat)
            layouts[idx] = lay
            self.check_node(node, lay)
            self.check_env(node, lay)
        self.check_lb(engines, [layouts[i] for i, n in enumerate(self.plan.nodes) if n.role != "router"])
        self.check_memory(engines)
        for f in check_image(self.plan.image, _image_path(self.recipe, self.plan, self.hw), vendor=self.hw.vendor):
            self.out.append(f)
        return self.out

    # -- flags ---------------------------------------------------------------------------------------

    def check_flags(self, node: NodePlan, args: list[Arg]) -> None:
        cat, role = self.cat, node.role
        seen: dict[str, Arg] = {}
        for a in args:
            f0 = a.flag or a.abbrev_of
            if f0 is not None and f0.action not in ("append", "count", "extend"):
                key = f0.name + (f".{a.dotted}" if a.dotted else "")
                prev = seen.get(key)
                if prev is not None:
                    self.add("warning", "flag-repeated",
                             f"{f0.name} is set twice ({prev.option} {prev.value or ''} and {a.option} "
                             f"{a.value or ''}); argparse keeps the last one".replace(" )", ")").replace("  ", " "),
                             "keep one spelling so the value is the one you mean", self.arg_path(node, a), role)
                seen[key] = a
            if a.flag is None and a.abbrev_of is None:
                names = [s for f in cat.flags for s in f.spellings if s.startswith("--")]
                near = difflib.get_close_matches(cat.normalize(a.option), names, n=1, cutoff=0.75)
                fix = f"use {near[0]}" if near else "remove it (vLLM's parser exits with 'unrecognized arguments')"
                self.add("error", "flag-unknown", f"vllm {cat.version} has no flag {cat.normalize(a.option)}",
                         fix, self.arg_path(node, a), role)
                continue
            if a.flag is None and a.abbrev_of is not None:
                self.add("warning", "flag-abbrev",
                         f"{a.option} is an abbreviation argparse expands to {a.abbrev_of.name}",
                         f"write {a.abbrev_of.name} in full (a new flag with the same prefix breaks it)",
                         self.arg_path(node, a), role)
            f = a.flag or a.abbrev_of
            assert f is not None
            if f.deprecated:
                self.add("warning", "flag-deprecated", f"{f.name} is deprecated in vllm {cat.version}",
                         "drop it or use its replacement", self.arg_path(node, a), role)
            if a.value is None:
                if f.takes_value and f.nargs not in ("?", "*"):
                    self.add("error", "flag-value", f"{f.name} needs a value", f"give {f.name} a value",
                             self.arg_path(node, a), role)
                continue
            if _placeholder(a.value):
                continue
            if a.dotted is not None:  # one key of a config given as --flag.key value: vLLM's pydantic checks it
                keys = set(self.cat.attention_config_keys)
                key = a.dotted.split(".", 1)[0]
                if f.name == "--attention-config" and keys and key not in keys:
                    self.add("error", "flag-value", f"--attention-config has no key {key!r}",
                             f"use one of: {', '.join(sorted(keys))}", self.arg_path(node, a), role)
                continue
            why = f.check_value(a.value)
            if why is None:
                why = self.check_choice_set(f, a.value)
            if why is None and f.is_json:
                why = self.check_json(f, a.value, node)
            if why:
                sev = "warning" if why.startswith("~") else "error"
                self.add(sev, "flag-value", why.lstrip("~"), self._value_fix(f), self.arg_path(node, a), role)

    def _value_fix(self, f: Flag) -> str:
        kind = _CHOICE_SETS.get(f.name)
        if f.choices:
            return f"use one of: {', '.join(f.choices)}"
        if kind:
            return f"use a value vllm {self.cat.version} registers (k3deploy catalog set {kind})"
        return f"fix the value of {f.name}"

    def check_choice_set(self, f: Flag, value: str) -> str | None:
        kind = _CHOICE_SETS.get(f.name)
        if kind is None or f.choices:
            return None
        allowed = self.cat.choices(kind)
        v = value
        if kind == "attention_backend":
            if v.lower() == "auto" or self.cat.attention_backend(v) is not None or v.upper() in allowed:
                return None
        elif kind == "moe_backend":
            if v.lower().replace("-", "_") in allowed:
                return None
        elif v in allowed:
            return None
        prefix = "~" if (self.npu and kind in _PLUGIN_EXTENDED) else ""
        near = difflib.get_close_matches(v, list(allowed), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        return f"{prefix}{f.name} {value!r} is not a value vllm {self.cat.version} registers{hint}"

    def check_json(self, f: Flag, value: str, node: NodePlan) -> str | None:
        try:
            data = json.loads(value)
        except ValueError as exc:
            return f"{f.name} is not valid JSON ({exc.msg} at column {exc.colno})"
        if not isinstance(data, dict):
            return None
        if f.name == "--attention-config":
            keys = set(self.cat.attention_config_keys)
            bad = [k for k in data if keys and k not in keys]
            if bad:
                return f"--attention-config has no key {bad[0]!r}"
            mpb = data.get("mla_prefill_backend")
            if isinstance(mpb, str) and self.cat.mla_prefill_backend(mpb) is None:
                return f"--attention-config mla_prefill_backend {mpb!r} is not a registered MLA prefill backend"
            b = data.get("backend")
            if isinstance(b, str) and b.lower() != "auto" and self.cat.attention_backend(b) is None:
                return f"--attention-config backend {b!r} is not a registered attention backend"
        elif f.name == "--speculative-config":
            method = data.get("method")
            methods = self.cat.choices("speculative_method")
            if isinstance(method, str) and methods and method not in methods:
                return f"--speculative-config method {method!r} is not one vllm {self.cat.version} registers"
        elif f.name == "--compilation-config":
            mode = data.get("cudagraph_mode")
            if isinstance(mode, str) and mode.upper() not in _CUDAGRAPH_MODES:
                return f"--compilation-config cudagraph_mode {mode!r} is not one of {', '.join(_CUDAGRAPH_MODES)}"
        elif f.name == "--kv-transfer-config":
            role = data.get("kv_role")
            if data.get("kv_connector") and role not in _KV_ROLES:
                return f"--kv-transfer-config kv_role {role!r} is not one of {', '.join(_KV_ROLES)}"
        return None

    # -- per-node semantics ------------------------------------------------------------------------------

    def _capability(self) -> tuple[int, int] | None:
        cc = self.hw.compute_capability
        if not cc:
            return None
        major, _, minor = cc.partition(".")
        return int(major), int(minor or 0)

    def _backend_gate(self, node: NodePlan, a: Arg, backend: Any, what: str) -> None:
        if backend is None:
            return
        majors = backend.majors
        cc = self._capability()
        path = self.arg_path(node, a)
        if cc is not None:
            ok = backend.supports(cc)
            if ok is False:
                need = "/".join(f"{m}.x" for m in majors) or "another GPU generation"
                self.add("error", "backend-capability",
                         f"{what} {backend.name} needs compute capability {need}; {self.hw.gen} GPUs are "
                         f"{cc[0]}.{cc[1]}",
                         "drop it for this hardware (let vLLM pick the backend) or gate it to the hardware it "
                         "supports", path, node.role)
        elif majors and min(majors) >= 10:
            self.add("error", "backend-capability",
                     f"{what} {backend.name} is a CUDA kernel for compute capability "
                     f"{'/'.join(f'{m}.x' for m in majors)}; {self.hw.brand} hardware cannot run it",
                     "drop it for this hardware (let vLLM pick the backend)", path, node.role)

    def check_node(self, node: NodePlan, lay: _Layout) -> None:
        role, cat = node.role, self.cat
        att = lay.args.get("--attention-backend")
        kv = (lay.value("--kv-cache-dtype") or "auto")
        if att is not None and att.value and not _placeholder(att.value):
            b = cat.attention_backend(att.value)
            self._backend_gate(node, att, b, "--attention-backend")
            if b is not None and b.supported_kv_cache_dtypes and kv not in b.supported_kv_cache_dtypes:
                self.add("error", "backend-kv-dtype",
                         f"--attention-backend {b.name} supports KV cache dtypes {', '.join(b.supported_kv_cache_dtypes)}"
                         f" only; the KV cache dtype here is {kv}",
                         f"add --kv-cache-dtype {b.supported_kv_cache_dtypes[0]} or use another backend",
                         self.arg_path(node, att), role)
        ac = lay.args.get("--attention-config")
        if ac is not None and ac.value and not _placeholder(ac.value):
            try:
                data = json.loads(ac.value)
            except ValueError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("mla_prefill_backend"), str):
                self._backend_gate(node, ac, cat.mla_prefill_backend(data["mla_prefill_backend"]),
                                   "mla_prefill_backend")
        # parallel sizes (vLLM ParallelConfig checks)
        if lay.dcp > 1 and lay.tp % lay.dcp:
            self.add("error", "dcp-divides-tp",
                     f"--decode-context-parallel-size {lay.dcp} does not divide the tensor-parallel size {lay.tp} "
                     f"(vLLM: tp_size={lay.tp} must be divisible by dcp_size={lay.dcp})",
                     f"use a DCP size that divides {lay.tp}, or a layout with TP a multiple of {lay.dcp}",
                     self.arg_path(node, lay.args.get("--decode-context-parallel-size")), role)
        if lay.moe_backend == "deep_gemm_mega_moe" and not lay.ep:
            self.add("error", "megamoe-needs-ep", "--moe-backend deep_gemm_mega_moe needs --enable-expert-parallel "
                     "(vLLM: 'Kimi K3 MegaMoE requires expert parallel')", "add --enable-expert-parallel",
                     self.arg_path(node, lay.args.get("--moe-backend")), role)
        if lay.nnodes > 1:
            world = lay.dp * lay.pp * lay.tp
            if world % lay.nnodes:
                self.add("error", "nnodes-world", f"world size {world} (DP×PP×TP) is not divisible by --nnodes "
                         f"{lay.nnodes}", "make DP×PP×TP a multiple of the node count",
                         self.arg_path(node, lay.args.get("--nnodes")), role)
        if lay.hybrid_lb and lay.headless:
            self.add("error", "lb-headless", "--data-parallel-hybrid-lb with --headless (vLLM: "
                     "'data_parallel_hybrid_lb is not applicable in headless mode')",
                     "drop --headless from hybrid-LB nodes", self.arg_path(node, lay.args["--data-parallel-hybrid-lb"]),
                     role)
        if lay.hybrid_lb and lay.external_lb:
            self.add("error", "lb-modes", "--data-parallel-hybrid-lb and --data-parallel-external-lb together",
                     "choose one load-balancing mode", self.arg_path(node, lay.args["--data-parallel-hybrid-lb"]),
                     role)
        if lay.hybrid_lb and lay.dp_local is None and lay.nnodes <= 1:
            self.add("error", "lb-hybrid-local", "--data-parallel-hybrid-lb needs --data-parallel-size-local",
                     "add --data-parallel-size-local", self.arg_path(node, lay.args["--data-parallel-hybrid-lb"]),
                     role)
        # speculative decoding
        sc = lay.args.get("--speculative-config")
        method = lay.spec_method
        if sc is not None and lay.pp > 1:
            dspark = method == "dspark"
            self.add("error" if dspark else "warning", "spec-decoding-pp",
                     f"speculative decoding ({method or 'configured'}) with --pipeline-parallel-size {lay.pp}: "
                     + ("DSpark does not compose with pipeline parallelism in vLLM 0.33 (its draft model then "
                        "loads with load_format=auto)" if dspark else "not validated with pipeline parallelism"),
                     "drop --speculative-config for pipeline-parallel layouts (scope the feature's strategies)",
                     self.arg_path(node, sc), role)
        if method == "dspark" and node.env.get("VLLM_USE_V2_MODEL_RUNNER") == "0":
            self.add("error", "spec-decoding-runner", "DSpark runs only on Model Runner V2, but "
                     "VLLM_USE_V2_MODEL_RUNNER=0 selects V1", "remove VLLM_USE_V2_MODEL_RUNNER=0",
                     self.env_path(node, "VLLM_USE_V2_MODEL_RUNNER"), role)
        # P/D
        kvt = lay.args.get("--kv-transfer-config")
        if kvt is not None and kvt.value and "nixl" in kvt.value.lower():
            if lay.boolean("--disable-hybrid-kv-cache-manager", cat):
                self.add("error", "pd-hybrid-kv", "NIXL P/D needs the hybrid KV-cache manager, but "
                         "--disable-hybrid-kv-cache-manager turns it off",
                         "use --no-disable-hybrid-kv-cache-manager",
                         self.arg_path(node, lay.args["--disable-hybrid-kv-cache-manager"]), role)
            if self._hybrid_model() and node.env.get("VLLM_SSM_CONV_STATE_LAYOUT") != "DS":
                self.add("error", "pd-conv-layout", "NIXL transfer of Kimi-K3's KDA (Mamba-like) state needs "
                         "VLLM_SSM_CONV_STATE_LAYOUT=DS (vLLM asserts: '3-read Mamba conv transfer requires DS conv "
                         "state layout')", "set VLLM_SSM_CONV_STATE_LAYOUT=DS on every prefill and decode node",
                         self.env_path(node, "VLLM_SSM_CONV_STATE_LAYOUT"), role)
            if "VLLM_NIXL_SIDE_CHANNEL_HOST" not in node.env:
                self.add("warning", "pd-side-channel", "VLLM_NIXL_SIDE_CHANNEL_HOST is unset: vLLM defaults to "
                         "localhost, which only works when prefill and decode share a machine",
                         "set VLLM_NIXL_SIDE_CHANNEL_HOST to the node's own reachable IP",
                         f"strategies/{self.plan.strategy}.yaml:{role}.env", role)

    def _hybrid_model(self) -> bool:
        return "kimi-k3" in self.plan.model.lower()

    # -- env -----------------------------------------------------------------------------------------

    def check_env(self, node: NodePlan, lay: _Layout) -> None:
        role, cat = node.role, self.cat
        for name, value in node.env.items():
            path = None

            def where() -> str:
                nonlocal path
                if path is None:
                    path = self.env_path(node, name)
                return path

            if name.startswith("VLLM_"):
                var = cat.env_var(name)
                if var is None:
                    if name in _ENV_RENAMES:
                        good, val = _ENV_RENAMES[name]
                        fix = f"use {good}={val} (vLLM {cat.version} reads that)"
                    else:
                        near = difflib.get_close_matches(name, sorted(cat.env_names), n=1, cutoff=0.8)
                        fix = f"use {near[0]}" if near else "remove it"
                    if self.npu:
                        self.add("info", "env-unknown", f"{name} is not read by vLLM {cat.version}; it may be a "
                                 "vllm-ascend variable", "check the vllm-ascend release notes of the image", where(),
                                 role)
                    else:
                        self.add("warning", "env-unknown", f"{name} is not an environment variable vLLM "
                                 f"{cat.version} reads (it logs 'Unknown vLLM environment variable detected', an "
                                 "error with --fail-on-environ-validation)", fix, where(), role)
                    continue
                if not _placeholder(value):
                    why = var.check_value(value)
                    if why is None and var.type and var.type.split(" ")[0] == "int":
                        try:
                            int(value)
                        except ValueError:
                            why = f"{name}={value!r} is not an integer"
                    if why is None and name == "VLLM_USE_V2_MODEL_RUNNER" and value not in ("0", "1"):
                        why = f"{name}={value!r}: vLLM parses it with int(); use 0 or 1"
                    if why:
                        self.add("error", "env-value", why, f"fix the value of {name}", where(), role)
                        continue
                    if var.default is not None and _same(value, var.default, var.type) and \
                            not (name == "VLLM_USE_BREAKABLE_CUDAGRAPH" and self.cuda):
                        self.add("info", "env-default", f"{name}={value} is vLLM {cat.version}'s default",
                                 "harmless; keep it only for older images", where(), role)
            elif name in ("AITER_SITUV2_A8W4", "AITER_SITUV2_A4W4") and not self.npu:
                self.add("warning", "env-overwritten", f"{name} is overwritten by vLLM {cat.version} at import "
                         "from VLLM_ROCM_USE_AITER_MOE_SITUV2, so setting it has no effect",
                         f"use VLLM_ROCM_USE_AITER_MOE_SITUV2={'a8w4' if 'A8W4' in name else 'a4w4'}", where(), role)
            elif name == "SAFETENSORS_FAST_GPU":
                self.add("info", "env-unused", f"{name} is not read by vLLM {cat.version}", "harmless; drop it",
                         where(), role)
            elif name in _NVL_ONLY_ENV and not self.hw.nvl:
                self.add("warning", "env-hardware", f"{name} is meant for multi-node NVLink fabrics (GB200/GB300 "
                         "NVL); on other hardware it is inert or harmful", f"set {name} only for GB200/GB300",
                         where(), role)
            elif name == "UCX_TLS" and "cuda_" in value and not self.cuda:
                self.add("error", "env-hardware", f"UCX_TLS={value} names CUDA transports on {self.hw.id}",
                         "drop the cuda_* transports on non-NVIDIA hardware", where(), role)
        self._role_env(node, lay)

    def _role_env(self, node: NodePlan, lay: _Layout) -> None:
        name = "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT"
        value = node.env.get(name)
        if value is None or value.strip().lower() in ("0", "false", ""):
            pass
        else:
            effective = lay.pp == 1 and lay.ep and lay.tp > 1 and (
                lay.moe_backend == "deep_gemm_mega_moe" or lay.dp > 1)
            missing = [c for c, ok in (("expert parallel", lay.ep), ("TP > 1", lay.tp > 1), ("PP = 1", lay.pp == 1),
                                       ("DP > 1 or --moe-backend deep_gemm_mega_moe",
                                        lay.dp > 1 or lay.moe_backend == "deep_gemm_mega_moe")) if not ok]
            why = ("expert parallel, TP > 1, PP = 1 and DP > 1 or --moe-backend deep_gemm_mega_moe; missing: "
                   + ", ".join(missing))
            if node.role == "prefill":
                self.add("warning", "env-role", f"{name} is set on prefill; vLLM documents it for decode instances "
                         f"('not for prefill'){'' if effective else ' and it is a no-op here (needs ' + why + ')'}",
                         "set it on decode only, and only where sequence-parallel MoE is active",
                         self.env_path(node, name), node.role)
            elif not effective:
                self.add("warning", "env-role", f"{name} has no effect here (needs {why})",
                         "remove it, or use it where sequence-parallel MoE is active", self.env_path(node, name),
                         node.role)
        nixl = [k for k in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT") if k in node.env]
        if nixl and not lay.has("--kv-transfer-config"):
            self.add("info", "env-role", f"{nixl[0]} has no effect without a NIXL --kv-transfer-config",
                     "remove it from non-P/D nodes", self.env_path(node, nixl[0]), node.role)

    # -- multi-node consistency ------------------------------------------------------------------------

    def check_lb(self, engines: list[NodePlan], lays: list[_Layout]) -> None:
        """Data-parallel rendezvous without --nnodes: the head checks remote engines' --headless against
        its own load-balancing mode (vLLM: 'Remote engine N must use --headless unless in external or hybrid
        dp lb mode')."""
        groups: dict[str, list[tuple[NodePlan, _Layout]]] = {}
        for node, lay in zip(engines, lays):
            groups.setdefault(node.role if node.role in ("prefill", "decode") else "engine", []).append((node, lay))
        for pool, members in groups.items():
            heads = [(n, l) for n, l in members if (l.dp_start or 0) == 0 and l.dp_rank is None]
            if not heads:
                continue
            head_node, head = heads[0]
            if head.nnodes > 1 or head.dp <= 1:
                continue
            local = head.dp_local if head.dp_local is not None else head.dp
            head_lb = head.external_lb or (head.hybrid_lb and local < head.dp)
            for node, lay in members:
                if node is head_node or lay.nnodes > 1 or not (lay.dp_start or lay.dp_rank):
                    continue
                arg = lay.args.get("--data-parallel-start-rank") or lay.args.get("--data-parallel-rank")
                role = node.role
                if not head_lb and not lay.headless:
                    mode = "external" if (lay.dp_local or 1) == 1 else "hybrid"
                    self.add("error", "dp-headless",
                             f"a {role} node has {arg.option if arg else '--data-parallel-start-rank'} "
                             f"without --headless ({mode} LB on that node) while its head runs internal-LB data "
                             "parallel; the head refuses it ('Remote engine must use --headless unless in external "
                             "or hybrid dp lb mode')",
                             "add --headless to that worker (one endpoint on the head; k3deploy's deployable "
                             "plan does, see k3deploy.recipe.fixes), or run every node in hybrid/external LB with a load "
                             "balancer in front",
                             self.arg_path(node, arg), role)
                elif head_lb and lay.headless:
                    self.add("error", "dp-headless", f"a {role} node is --headless but its head runs "
                             "hybrid/external-LB data parallel (vLLM: 'must not use --headless')",
                             "drop --headless on that node", self.arg_path(node, lay.args.get("--headless")), role)
            if head_lb and len(members) > 1 and pool != "decode":
                role = head_node.role
                self.add("info", "dp-endpoints", "hybrid/external-LB data parallel: every node serves "
                         "its own API port, so clients need a load balancer or router in front",
                         "put a load balancer in front of all nodes, or use internal LB (workers --headless, no "
                         "--data-parallel-hybrid-lb) for one endpoint",
                         self.arg_path(head_node, head.args.get("--data-parallel-hybrid-lb")), role)

    # -- memory --------------------------------------------------------------------------------------------

    def check_memory(self, engines: list[NodePlan]) -> None:
        v = self.recipe.variants.get(self.plan.variant)
        need = v.vram_minimum_gb if v else None
        have = self.hw.vram_gb
        if not need or not have:
            return
        path = f"variants.{self.plan.variant}.vram_minimum_gb"
        if self.strategy.pd:
            for role in ("prefill", "decode"):
                nodes = [n for n in engines if n.role == role]
                if not nodes:
                    continue
                pool = nodes[0].pool_nodes or 0
                gb = have * pool if pool else have / 2
                if gb < need:
                    size = f"{pool} node{'s' if pool != 1 else ''} × {have:g} GB" if pool else \
                        f"half of one {self.hw.id} node"
                    self.add("error", "memory-fit", f"the {role} pool on {self.hw.id} has {size} = {gb:g} GB, below "
                             f"the {need:g} GB variant {self.plan.variant} needs",
                             f"use --{role}-nodes {ceil(need / have)} or more", path, None)
            return
        n = len(engines)
        gb = have * n
        if gb < need:
            self.add("error", "memory-fit",
                     f"{self.plan.strategy} on {self.hw.id} plans {n} node{'s' if n != 1 else ''} × {have:g} GB = "
                     f"{gb:g} GB, below the {need:g} GB variant {self.plan.variant} needs",
                     f"use ≥{ceil(need / have)} nodes (a multi_node_* strategy, --nodes {ceil(need / have)})"
                     if self.strategy.multi_node or n == 1 else f"use ≥{ceil(need / have)} nodes", path, None)

    # -- router --------------------------------------------------------------------------------------------

    def check_router(self, node: NodePlan, engines: list[NodePlan]) -> None:
        cat = self.router
        args, stray = parse_argv(node.argv[1:], cat)
        for a in args:
            if a.flag is None and a.abbrev_of is None:
                names = [s for f in cat.flags for s in f.spellings]
                near = difflib.get_close_matches(cat.normalize(a.option), names, n=1, cutoff=0.75)
                self.add("error", "flag-unknown", f"vllm-router {cat.version} has no flag {a.option}",
                         f"use {near[0]}" if near else "remove it", "builder: router", "router")
            elif a.flag is None and a.abbrev_of is not None:
                self.add("warning", "flag-abbrev", f"{a.option} is an abbreviation argparse expands to "
                         f"{a.abbrev_of.name}", f"write {a.abbrev_of.name} in full", "builder: router", "router")
            elif a.value is not None and not _placeholder(a.value) and (a.flag or a.abbrev_of).nargs not in ("+", "*"):
                why = (a.flag or a.abbrev_of).check_value(a.value)  # type: ignore[union-attr]
                if why:
                    self.add("error", "flag-value", why, "fix the value", "builder: router", "router")
        timeout_flag = cat.flag("--worker-startup-timeout-secs")
        router_timeout = None
        for a in args:
            if (a.flag or a.abbrev_of) is timeout_flag and a.value and not _placeholder(a.value):
                router_timeout = _as_int(a.value, 0)
        if router_timeout is None:
            router_timeout = _as_int(timeout_flag.default if timeout_flag else None, 600)
        ready_var = self.cat.env_var("VLLM_ENGINE_READY_TIMEOUT_S")
        default_ready = _as_int(ready_var.default if ready_var else None, 600)
        ready = max((_as_int(n.env.get("VLLM_ENGINE_READY_TIMEOUT_S"), default_ready) for n in engines),
                    default=default_ready)
        if router_timeout < ready:
            src = next((n for n in engines if _as_int(n.env.get("VLLM_ENGINE_READY_TIMEOUT_S"), -1) == ready), None)
            where = self.env_path(src, "VLLM_ENGINE_READY_TIMEOUT_S") if src else "builder: router"
            self.add("warning", "router-timeout",
                     f"vllm-router waits {router_timeout} s for its workers (--worker-startup-timeout-secs), "
                     f"shorter than the {ready} s the engines may take to become ready "
                     "(VLLM_ENGINE_READY_TIMEOUT_S)",
                     f"add --worker-startup-timeout-secs {ready} to the router, or start it only after every "
                     "prefill and decode endpoint answers /health", where, "router")


def _same(value: str, default: str, typ: str | None) -> bool:
    if value == default:
        return True
    if typ and typ.startswith("bool"):
        truth = {"1": True, "true": True, "0": False, "false": False}
        return truth.get(value.strip().lower()) is not None and \
            truth.get(value.strip().lower()) == truth.get(default.strip().lower())
    return False


# ------------------------------------------------------------------------------------------------
# Public API


def provenance(recipe: Recipe) -> Provenance:
    return recipe.memo(("lint.provenance",), lambda: Provenance(recipe))


def lint_plan(recipe: Recipe, plan: Plan, *, catalog: Catalog | None = None,
              router_catalog: Catalog | None = None) -> list[Finding]:
    """Findings for one resolved plan, identical findings on several nodes merged (their roles listed)."""
    cat = catalog or load_catalog("vllm")
    router = router_catalog or load_catalog("vllm-router")
    raw = _PlanLinter(recipe, plan, provenance(recipe), cat, router).run()
    merged: dict[tuple, Finding] = {}
    for f in raw:
        k = f.key
        if k in merged:
            roles = tuple(dict.fromkeys(merged[k].roles + f.roles))
            merged[k] = Finding(f.severity, f.code, f.message, f.fix, f.path, roles)
        else:
            merged[k] = f
    return sorted(merged.values(), key=lambda f: (_RANK[f.severity], f.code, f.path or "", f.message))


def feature_sets(recipe: Recipe, variant: str, hw: HardwareProfile, strategy: str) -> list[tuple[list[str], tuple[str, ...]]]:
    """The default feature set, and that set plus each opt-in feature that applies to ``strategy``."""
    from k3deploy.recipe.rules import default_features

    base = default_features(recipe, recipe.variants[variant], hw)
    out: list[tuple[list[str], tuple[str, ...]]] = [(base, ())]
    opt = list(dict.fromkeys(list(recipe.opt_in_features) + list(recipe.hardware_opt_in_features.get(hw.id) or [])))
    for f in opt:
        if f in base or f not in recipe.features:
            continue
        scope = recipe.features[f].strategies
        if scope and strategy not in scope:
            continue
        out.append(([x for x in recipe.features if x in base or x == f], (f,)))
    return out


def _nodes_label(plan: Plan) -> str:
    if strategies()[plan.strategy].pd:
        p = len(plan.role("prefill"))
        d = len(plan.role("decode"))
        pool = plan.role("prefill")[0].pool_nodes if plan.role("prefill") else 0
        return "colocated" if pool == 0 else f"P{p}+D{d}"
    return str(len(plan.nodes))


def lint_recipe(recipe: Recipe, *, hardware_id: str | None = None, strategy: str | None = None,
                variant: str | None = None) -> LintReport:
    """Lint every offered selection (optionally narrowed) and group identical findings."""
    from k3deploy.recipe.offering import hardware_for_variant, strategies_on
    from k3deploy.recipe.resolve import resolve

    hw_all = hardware()
    if hardware_id is not None and hardware_id not in hw_all:
        raise SelectionError(f"unknown hardware {hardware_id!r}: choose one of {', '.join(sorted(hw_all))}")
    if strategy is not None and strategy not in strategies():
        raise SelectionError(f"unknown strategy {strategy!r}: choose one of {', '.join(sorted(strategies()))}")
    if variant is not None and variant not in recipe.variants:
        raise SelectionError(f"unknown variant {variant!r} in recipe {recipe.slug}: choose one of "
                             f"{', '.join(recipe.variants)}")
    cat, router = load_catalog("vllm"), load_catalog("vllm-router")
    groups: dict[tuple, Group] = {}
    checked: list[Selection] = []

    def record(f: Finding, sel: Selection | None) -> None:
        g = groups.get(f.key)
        if g is None:
            g = groups[f.key] = Group(Finding(f.severity, f.code, f.message, f.fix, f.path))
        if sel is not None and (not g.selections or g.selections[-1] != sel):
            g.selections.append(sel)
        g.roles.update(f.roles)

    for vk in ([variant] if variant else list(recipe.variants)):
        for hw_id in hardware_for_variant(recipe, vk):
            if hardware_id is not None and hw_id != hardware_id:
                continue
            hw = hw_all[hw_id]
            for s in strategies_on(recipe, hw):
                if strategy is not None and s != strategy:
                    continue
                for feats, extra in feature_sets(recipe, vk, hw, s):
                    try:
                        plan = resolve(recipe, hardware=hw_id, strategy=s, variant=vk, features=feats)
                    except SelectionError as exc:
                        sel = Selection(hw_id, s, vk, tuple(feats), extra, "")
                        checked.append(sel)
                        record(Finding("error", "unresolvable", f"the offered selection does not resolve: {exc}",
                                       "fix the recipe's offering (strategy_hardware, strategy_min_gpus) or the "
                                       "selection", None), sel)
                        continue
                    sel = Selection(hw_id, s, vk, tuple(plan.features), extra, _nodes_label(plan))
                    checked.append(sel)
                    for f in lint_plan(recipe, plan, catalog=cat, router_catalog=router):
                        record(f, sel)
    if not checked:
        what = ", ".join(f"{k} {v}" for k, v in (("hardware", hardware_id), ("strategy", strategy),
                                                   ("variant", variant)) if v) or "the recipe"
        raise SelectionError(f"{recipe.slug} offers no selection for {what}: see k3deploy options for what it offers")
    for f in recipe_image_findings(recipe):
        record(f, None)
    ordered = sorted(groups.values(), key=lambda g: (_RANK[g.finding.severity], g.finding.code,
                                                      g.finding.path or "", g.finding.message))
    return LintReport(recipe=recipe.slug, groups=ordered, checked=checked)


def summarize_selections(selections: Sequence[Selection], checked: Sequence[Selection]) -> str:
    """Compact text for a list of selections: per variant, each hardware with the affected strategies (just
    the hardware when every checked strategy is affected) and the opt-in features when not every feature
    set is affected."""
    if not selections:
        return "recipe"
    all_sets: dict[tuple[str, str, str], set[tuple[str, ...]]] = {}
    hw_strats: dict[tuple[str, str], list[str]] = {}
    for s in checked:
        all_sets.setdefault((s.variant, s.hardware, s.strategy), set()).add(s.extra)
        lst = hw_strats.setdefault((s.variant, s.hardware), [])
        if s.strategy not in lst:
            lst.append(s.strategy)
    hit: dict[tuple[str, str, str], set[tuple[str, ...]]] = {}
    for s in selections:
        hit.setdefault((s.variant, s.hardware, s.strategy), set()).add(s.extra)
    by_vh: dict[tuple[str, str], list[str]] = {}
    for (v, h, st), extras in hit.items():
        if extras == all_sets.get((v, h, st), set()):
            label = st
        else:
            label = st + "".join(sorted({"+" + "+".join(e) if e else " (default features)" for e in extras}))
        by_vh.setdefault((v, h), []).append(label)
    per_variant: dict[str, list[str]] = {}
    for (v, h), labels in by_vh.items():
        every = hw_strats.get((v, h), [])
        whole = sorted(labels) == sorted(every) and all("+" not in x and "(" not in x for x in labels)
        per_variant.setdefault(v, []).append(h if whole and len(every) > 1 else f"{h} ({', '.join(labels)})")
    several = len({s.variant for s in checked}) > 1
    return "; ".join(f"{v}: {', '.join(hs)}" if several else ", ".join(hs) for v, hs in per_variant.items())


def echo_findings(recipe: Recipe, plan: Plan, echo: Callable[[str], None], *, include_info: bool = False) -> int:
    """Print a plan's lint findings as ``lint error: ...`` / ``lint warning: ...`` lines; returns the number
    of errors. Never raises: a failure of the linter itself is printed as one line."""
    try:
        found = lint_plan(recipe, plan)
    except K3Error as exc:
        echo(f"lint skipped: {exc}")
        return 0
    except Exception as exc:  # the linter must never break the command it decorates
        echo(f"lint skipped: internal error {type(exc).__name__}: {exc}")
        return 0
    errors = 0
    for f in found:
        if f.severity == "info" and not include_info:
            continue
        errors += f.severity == "error"
        echo(f"lint {f.severity}: {f.line()}")
    return errors


def echo_selection_findings(selection: Any, echo: Callable[[str], None]) -> int:
    """``echo_findings`` for a preflight selection (hardware profile, strategy or None, variant, node count)
    against the vendored recipe, as k3deploy deploys it (:func:`k3deploy.recipe.fixes.deployable`); a selection that
    does not resolve is reported as one skipped line."""
    from k3deploy.recipe.fixes import deployable
    from k3deploy.recipe.resolve import resolve
    from k3deploy.recipe.schema import load_recipe

    try:
        recipe = load_recipe()
        strat = strategies().get(selection.strategy) if selection.strategy else None
        kwargs: dict[str, Any] = {"hardware": selection.hardware.id, "strategy": selection.strategy,
                                  "variant": selection.variant}
        if strat is not None and not strat.pd:
            kwargs["nodes"] = selection.nodes
        plan = deployable(resolve(recipe, **kwargs))
    except K3Error as exc:
        echo(f"lint skipped: {exc}")
        return 0
    return echo_findings(recipe, plan, echo)
