"""Argument vectors read the way the engine's argparse reads them (:func:`parse_argv`), and the engine layout
of one node (:class:`Layout`: parallel sizes, load-balancing mode, MoE backend, speculative method)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from k3deploy.recipe.catalog import Catalog, Flag


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

    @property
    def known(self) -> Flag | None:
        """The flag this option sets: the exact match, else the flag an abbreviation expands to."""
        return self.flag or self.abbrev_of


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


def placeholder(value: str | None) -> bool:
    """True for a value the deployment fills in later (``$HOST_IP``)."""
    return value is not None and "$" in value


def as_int(value: str | None, default: int) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


@dataclass
class Layout:
    """The engine layout of one node, as its flags set it."""

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


def layout(args: list[Arg], cat: Catalog) -> Layout:
    """The layout the parsed options of one ``vllm serve`` node describe."""
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
    lay = Layout(args=by, spec_method=method)

    def num(name: str, default: int) -> int:
        return as_int(lay.value(name), default)

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
