"""Several facts of one host in one command, so reading a host costs one SSH round trip, however many facts.

:class:`Batch` runs each fact's own command (with its ``requires_command`` test, as pyinfra would) behind a
marker line and hands each fact its own output, through that fact's own ``process``: the values are exactly what
``host.get_fact`` returns one fact at a time.

A host that answers each command from a table of scripted outputs, one output per command, cannot answer a batch:
:func:`read_batch` reads the facts of the hosts :data:`one_at_a_time` names one at a time (same values, one command
per fact). It names none; a test whose hosts are scripted sets it (the fact-source seam).

The batch's output comes back gzip-compressed and base64-encoded where the host has ``gzip`` and ``base64`` (every
Linux distribution does): a few dozen lines instead of several hundred, which is what the control machine spends its
CPU on (pyinfra reads a command's output line by line); without them, as the facts print it.

Example::

    >>> from k3deploy.facts.host import KernelVersion
    >>> "echo K3_FACT=kernel" in Batch().command(specs([("kernel", KernelVersion, {})])).splitlines()
    True
    >>> Batch().process(["K3_FACT=kernel", "6.8.0-1031-nvidia-64k"])
    {'kernel': ['6.8.0-1031-nvidia-64k']}
    >>> Batch().process([PACKED + "H4sIAAAAAAAAA/M2jndzdA6xzU4tykvN4TLTs9Az0DU0MDbUzSvLTMlM1DUzyeYCAJZ3UYslAAAA"])
    {'kernel': ['6.8.0-1031-nvidia-64k']}
"""

from __future__ import annotations

import base64
import gzip
import importlib
import json
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from pyinfra.api.facts import FactBase, get_fact

#: the line before each fact's output, and the line a fact prints when its required command is missing
MARK = "K3_FACT="
NOCMD = "K3_NOCMD"
#: the start of a packed output: the rest of that line and the lines after it are base64 of the gzipped output
PACKED = "K3_GZ64="

Spec = tuple[str, type[FactBase[Any]], dict[str, Any]]


def specs(items: Sequence[Spec]) -> str:
    """The batch's argument: ``(name, fact class, arguments)`` per fact, as one JSON string."""
    return json.dumps([[name, f"{cls.__module__}:{cls.__qualname__}", kwargs] for name, cls, kwargs in items])


def _fact(path: str) -> type[FactBase[Any]]:
    module, _, name = path.partition(":")
    cls: type[FactBase[Any]] = getattr(importlib.import_module(module), name)
    return cls


class Batch(FactBase[dict[str, list[str]]]):
    """The raw output of several facts, per fact name (see :func:`values`)."""

    def command(self, specs: str) -> str:
        parts = []
        for name, path, kwargs in json.loads(specs):
            fact = _fact(path)()
            command = fact.command(**kwargs)
            required = fact.requires_command(**kwargs)
            body = (f"if command -v {shlex.quote(required)} >/dev/null 2>&1; then ( {command} ); "
                    f"else echo {NOCMD}; fi" if required else f"( {command} )")
            parts.append(f"echo {MARK}{name}\n{body}")
        body = "\n".join(parts)
        return (f"k3_facts() {{\n{body}\n}}\n"
                "if command -v gzip >/dev/null 2>&1 && command -v base64 >/dev/null 2>&1; then\n"
                f"printf %s {PACKED}; k3_facts | gzip -c | base64\nelse\nk3_facts\nfi")

    def process(self, output: list[str]) -> dict[str, list[str]]:
        if output and output[0].startswith(PACKED):
            data = output[0][len(PACKED):] + "".join(line.strip() for line in output[1:])
            output = gzip.decompress(base64.b64decode(data)).decode("utf-8", "replace").splitlines()
        out: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in output:
            if line.startswith(MARK):
                current = out.setdefault(line[len(MARK):].strip(), [])
            elif current is not None:
                current.append(line)
        return out


def value(cls: type[FactBase[Any]], lines: list[str] | None) -> Any:
    """One fact's value from its part of a batch, as pyinfra would give it: its ``default()`` when its required
    command is missing or it printed nothing, else its ``process(lines)``."""
    if lines is None or lines == [NOCMD] or not any(line.strip() for line in lines):
        return cls.default()
    return cls().process(lines)


def in_one_command(host: Any) -> bool:
    """False: every host runs a batch in a shell (the default of :data:`one_at_a_time`)."""
    return False


#: the hosts whose facts are read one at a time, a command each, and that hold no deployment lock (the deploy takes
#: none there): none, unless a test sets it for hosts that answer one scripted output per command
one_at_a_time: Callable[[Any], bool] = in_one_command


def read_batch(state: Any, host: Any, items: Sequence[Spec]) -> dict[str, Any]:
    """The value of each fact in ``items`` on ``host``, by name: one command for the lot (one round trip), or one
    command per fact on a host :data:`one_at_a_time` names. Connection errors propagate, as from ``get_fact``."""
    if not items:
        return {}
    if one_at_a_time(host):
        return {name: get_fact(state, host, cls, kwargs=kwargs, apply_failed_hosts=False)
                for name, cls, kwargs in items}
    raw = get_fact(state, host, Batch, kwargs={"specs": specs(items)}, apply_failed_hosts=False) or {}
    return {name: value(cls, raw.get(name)) for name, cls, _ in items}
