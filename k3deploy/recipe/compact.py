"""Printing many nodes of one group once: what they all share, then each node's differences.

A rack (``resolve --nodes 18``) repeats the same env and ``vllm serve`` command per node with a handful of words
changed (the node rank, the data-parallel start rank, ``--headless``). :func:`shared_and_differences` splits the
nodes of one group into the command they share, written with shell variables where the nodes differ
(``--node-rank $NODE_RANK``, ``$NODE_FLAGS`` for flags only some nodes have), and per node the values of those
variables and its own env. The shared command with a node's line set before it is that node's command.

>>> a = Member("head (rank 0)", ["vllm", "serve", "m", "--tp", "8", "--node-rank", "0"], {"X": "1"})
>>> b = Member("worker (rank 1)", ["vllm", "serve", "m", "--tp", "8", "--node-rank", "1", "--headless"], {"X": "1"})
>>> s = shared_and_differences([a, b])
>>> s.argv, s.env
(['vllm', 'serve', 'm', '--tp', '8', '--node-rank', '$NODE_RANK', '$NODE_FLAGS'], {'X': '1'})
>>> import pprint; pprint.pprint(s.per_node)
[('head (rank 0)', ['NODE_RANK=0', 'NODE_FLAGS='], {}),
 ('worker (rank 1)', ['NODE_RANK=1', 'NODE_FLAGS=--headless'], {})]
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from k3deploy.recipe.printing import shell_quote

#: the shell variable that carries the flags only some nodes of a group have
NODE_FLAGS = "NODE_FLAGS"


@dataclass(frozen=True)
class Member:
    label: str                 # how the node is named on its line: "worker (rank 3), headless"
    argv: list[str]
    env: dict[str, str]


@dataclass
class Shared:
    argv: list[str]                                   # the shared command, $VARIABLES where the nodes differ
    env: dict[str, str]                               # env every node has with the same value
    #: per node: its label, the values of the command's variables (``NAME=value``), its own env (not shared)
    per_node: list[tuple[str, list[str], dict[str, str]]] = field(default_factory=list)


def _items(argv: list[str]) -> list[tuple[str, ...]]:
    """The words after ``vllm serve MODEL`` as units: a flag with its values, or a positional word."""
    out: list[tuple[str, ...]] = []
    i = 0
    while i < len(argv):
        take = 0
        if argv[i].startswith("-"):
            while i + 1 + take < len(argv) and not argv[i + 1 + take].startswith("-"):
                take += 1
        out.append(tuple(argv[i:i + 1 + take]))
        i += 1 + take
    return out


def variable_of(flag: str) -> str:
    """``--data-parallel-start-rank`` -> ``DATA_PARALLEL_START_RANK``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", flag.lstrip("-")).strip("_").upper()


def shared_and_differences(members: list[Member], head_words: int = 3) -> Shared:
    """What ``members`` share and how each differs (see the module's example). ``head_words``: the leading words
    every command has in common (``vllm serve MODEL``)."""
    lead = members[0].argv[:head_words]
    units = [_items(m.argv[head_words:]) for m in members]
    flags = [[u[0] for u in us] for us in units]
    common = [u for u in units[0] if all(u in us for us in units[1:])]
    varying = [u[0] for u in units[0] if u not in common and u[0].startswith("-") and len(u) == 2
               and all(f.count(u[0]) == 1 and len(next(x for x in us if x[0] == u[0])) == 2
                       for f, us in zip(flags, units, strict=True))]
    argv = list(lead)
    for u in units[0]:
        if u in common:
            argv += list(u)
        elif u[0] in varying:
            argv += [u[0], f"${variable_of(u[0])}"]
    extra = [[u for u in us if u not in common and u[0] not in varying] for us in units]
    if any(extra):
        argv.append(f"${NODE_FLAGS}")
    env = {k: v for k, v in members[0].env.items() if all(m.env.get(k) == v for m in members[1:])}
    per_node: list[tuple[str, list[str], dict[str, str]]] = []
    for m, us, ex in zip(members, units, extra, strict=True):
        sets = [f"{variable_of(flag)}={shell_quote(next(x for x in us if x[0] == flag)[1])}" for flag in varying]
        if any(extra):
            words = [w for u in ex for w in u]
            sets.append(f"{NODE_FLAGS}={shlex.quote(' '.join(words)) if words else ''}")
        per_node.append((m.label, sets, {k: v for k, v in m.env.items() if k not in env}))
    return Shared(argv=argv, env=env, per_node=per_node)
