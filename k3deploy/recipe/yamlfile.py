"""YAML an operator hands k3deploy (group_vars, a recipe), read with bounds: a file above :data:`MAX_BYTES` is
refused before it is read, and a document whose aliases would expand it beyond :data:`MAX_VALUES` values is refused
while it is parsed, before any value is built (a "billion laughs" of nested aliases is a few hundred bytes and
would otherwise be expanded by whatever walks the values). Both cost well under a second and memory of the order
of the file; each is one :class:`~k3deploy.errors.K3Error` line naming the file and the fix. Pure.

Example::

    >>> doc = "a: &a [x, x, x, x, x, x, x, x, x]\\n" + "".join(
    ...     f"{n}: &{n} [" + ", ".join([f"*{p}"] * 9) + "]\\n" for p, n in zip("abcdefgh", "bcdefghi"))
    >>> parse(doc, "group_vars/all.yml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    k3deploy.errors.K3Error: group_vars/all.yml:6: its YAML aliases expand to more than 100000 values (an alias bomb)...
    >>> parse("k3_hardware: gb300\\nk3_extra_args: &args [--enforce-eager]\\n", "all.yml")
    {'k3_hardware': 'gb300', 'k3_extra_args': ['--enforce-eager']}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from k3deploy.errors import K3Error

#: the largest YAML file k3deploy reads (group_vars, a recipe): real ones are a few KiB
MAX_BYTES = 1 << 20
#: the most values (scalars, lists and mappings) one document may hold with every alias expanded
MAX_VALUES = 100_000

_Base: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class AliasBomb(yaml.MarkedYAMLError):
    """A document whose aliases expand beyond :data:`MAX_VALUES` values (or into themselves)."""


def expanded_size(root: yaml.Node, limit: int = MAX_VALUES) -> int:
    """How many values ``root`` holds with every alias expanded (each node counted once per reference); raises
    :class:`AliasBomb` at the node where the count passes ``limit``, or at an alias that contains itself. Each
    distinct node is walked once (its size is remembered), so the cost is the size of the document, not of its
    expansion.

    >>> expanded_size(yaml.compose("[&a [1, 2], *a, *a]"))
    10
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise AliasBomb(problem="an alias that contains itself expands without end: remove the recursion",
                            problem_mark=node.start_mark)
        open_nodes.add(key)
        total = 1
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        for child in children:
            total += size(child)
            if total > limit:
                raise AliasBomb(problem=f"its YAML aliases expand to more than {limit} values (an alias bomb): write "
                                "the values out, or use fewer aliases", problem_mark=node.start_mark)
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)


class BoundedLoader(_Base):  # type: ignore[misc]
    """YAML's safe loader (the C one where PyYAML has it) that refuses a document whose aliases expand beyond
    :data:`MAX_VALUES` values, once the document is composed and before any value is constructed."""

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None:
            expanded_size(node)
        return node


def read(path: Path, shown: str | None = None, limit: int = MAX_BYTES) -> str:
    """The text of a YAML file the operator gave, at most ``limit`` bytes (a larger file is refused before it is
    read; a file that grows while it is read is cut at ``limit + 1`` bytes and refused)."""
    where = shown or str(path)
    size = path.stat().st_size
    if size > limit:
        raise K3Error(f"{where}: {size} bytes, over the limit of {limit} for a YAML file k3deploy reads: keep it to "
                      "the variables it sets (real ones are a few KiB)")
    with path.open("rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise K3Error(f"{where}: more than {limit} bytes, over the limit for a YAML file k3deploy reads: keep it to "
                      "the variables it sets")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise K3Error(f"{where}: not UTF-8 text (byte {exc.start}): save it as UTF-8") from None


def parse(text: str, where: str, loader: type[Any] = BoundedLoader) -> Any:
    """``text`` parsed with ``loader`` (a :class:`BoundedLoader`); an alias bomb or a YAML error is one line naming
    ``where`` and the line."""
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 (a safe loader)
    except AliasBomb as exc:
        mark = exc.problem_mark
        raise K3Error(f"{where}:{mark.line + 1 if mark else '?'}: {exc.problem}") from None
