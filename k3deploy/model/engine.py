"""The engine spec: what one unit runs, the one source every launcher's files render from. Pure, frozen.

Per unit: the plan's argv as words whose per-node values are symbolic (:class:`Ref`: the group head's address on
a worker, the node's own address; :class:`Rank`: the node rank, the data-parallel start rank; :class:`GroupSize`:
the number of nodes in the group, ``--nnodes``), the env file's
settings (values likewise), the container it runs in (image,
devices, mounts, flags: :class:`k3deploy.model.units.ContainerSpec`) and the systemd unit's settings
(:class:`k3deploy.model.units.UnitSpec`, whose ``argv`` is the full command: ``docker run ...`` or the router's
binary). The systemd unit and its env file (:attr:`EngineSpec.unit_text`, :attr:`EngineSpec.env_text`), a Slurm
job's launch script (:func:`k3deploy.model.slurm.launch_script`), the Kubernetes pod templates
(:mod:`k3deploy.model.kubernetes`: a :class:`Ref` or :class:`GroupSize` is an LWS reference there) and the runbook
all render from it (their per-node values as this node has them: :func:`text`);
nothing rendered is read back (what is read back is what a host holds: :mod:`k3deploy.model.hosttext`).

Example::

    >>> w = words("--master-addr=$HEAD_IP", "--master-addr=10.0.0.1", {"HEAD_IP": "10.0.0.1"}, head="10.0.0.1",
    ...           own="10.0.0.2")
    >>> w, text(w)
    (('--master-addr=', Ref(name='head', value='10.0.0.1')), '--master-addr=10.0.0.1')
    >>> words("$HEAD_IP", "10.0.0.1", {"HEAD_IP": "10.0.0.1"}, head=None, own="10.0.0.1")
    (Ref(name='self', value='10.0.0.1'),)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from k3deploy.model.binding import PLACEHOLDER
from k3deploy.model.units import ContainerSpec, UnitSpec, env_file_text, render_unit
from k3deploy.recipe.argv import int_value


@dataclass(frozen=True)
class Ref:
    """A per-node value: ``head``, the group head's address (on a worker); ``self``, the node's own address.
    ``value`` is what it is on this node."""

    name: Literal["head", "self"]
    value: str


@dataclass(frozen=True)
class Rank:
    """A per-node integer: ``scale`` x the node's rank in its group + ``offset`` (``--node-rank``: 1 x rank; the
    data-parallel start rank: the data-parallel ranks per node x rank). ``value`` is what it is on this node."""

    scale: int
    offset: int
    value: str


@dataclass(frozen=True)
class GroupSize:
    """The number of nodes in the unit's group (``--nnodes``). ``value`` is what it is (the same on every node)."""

    value: str


Part = str | Ref | Rank | GroupSize
#: one argv word or env value: literal text and per-node values
Word = tuple[Part, ...]

#: the flags whose value follows the node's rank, each with its scale read off the node's argv (None: not known)
RANK_FLAGS: dict[str, Callable[[Sequence[str]], int | None]] = {
    "--node-rank": lambda argv: 1,
    "--data-parallel-start-rank": lambda argv: int_value(argv, "--data-parallel-size-local"),
}
#: the flags whose value is the number of nodes in the group
SIZE_FLAGS = frozenset({"--nnodes"})


def text(word: Word) -> str:
    """The word as this node has it."""
    if len(word) == 1 and isinstance(word[0], str):
        return word[0]
    return "".join(p if isinstance(p, str) else p.value for p in word)


def ranked(argv: Sequence[Word], rank: int, size: int | None = None) -> tuple[Word, ...]:
    """``argv`` with the value of each flag of :data:`RANK_FLAGS` as a :class:`Rank` (where it is an integer) and,
    where it is ``size`` (the nodes of the group), that of each flag of :data:`SIZE_FLAGS` as :class:`GroupSize`.

    >>> ranked([("vllm",), ("--data-parallel-size-local",), ("8",), ("--data-parallel-start-rank",), ("16",)], 2)[4]
    (Rank(scale=8, offset=0, value='16'),)
    >>> ranked([("vllm",), ("--nnodes",), ("2",), ("--node-rank",), ("1",)], 1, size=2)[2:]
    ((GroupSize(value='2'),), ('--node-rank',), (Rank(scale=1, offset=0, value='1'),))
    """
    plain = [text(w) for w in argv]
    out = list(argv)
    for i in range(1, len(argv)):
        scale_of = RANK_FLAGS.get(plain[i - 1])
        scale = scale_of(plain) if scale_of is not None else None
        if scale is not None and plain[i].lstrip("-").isdigit():
            value = int(plain[i])
            out[i] = (Rank(scale, value - scale * rank, plain[i]),)
        elif size is not None and plain[i - 1] in SIZE_FLAGS and plain[i] == str(size):
            out[i] = (GroupSize(plain[i]),)
    return tuple(out)


def literal(value: str) -> Word:
    return (value,) if value else ()


def words(planned: str, filled: str, mapping: Mapping[str, str], *, head: str | None, own: str) -> Word:
    """A word of the plan (``planned``, its ``$NAME`` placeholders intact; ``filled``, as bound to this node) with
    each placeholder that names the group head's address (``head``: on a worker) or this node's (``own``) as a
    :class:`Ref`. ``mapping``: what each placeholder was filled with. Where the parts do not give ``filled`` back
    (a placeholder filled twice), the word is literal."""
    if "$" not in planned:
        return literal(filled)
    parts: list[Part] = []
    at = 0
    for m in PLACEHOLDER.finditer(planned):
        parts.append(planned[at:m.start()])
        value = mapping.get(m.group(1))
        if value is not None and head is not None and value == head:
            parts.append(Ref("head", value))
        elif value is not None and value == own:
            parts.append(Ref("self", value))
        else:
            parts.append(m.group(0) if value is None else value)
        at = m.end()
    parts.append(planned[at:])
    out: list[Part] = []
    for p in parts:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    merged = tuple(out)
    return merged if text(merged) == filled else literal(filled)


@dataclass(frozen=True)
class EngineSpec:
    """One unit's engine (or router): its argv, env, container and unit settings; every file renders from it."""

    argv_words: tuple[Word, ...]        # the plan's argv (``vllm serve ...``, ``vllm-router ...``)
    env: tuple[tuple[str, Word], ...] = field(repr=False)   # the env file, in order (may hold a secret)
    container: ContainerSpec | None     # None: a router run from ``k3_router_bin`` on the host
    unit: UnitSpec                      # the systemd unit; ``unit.argv`` is the full command

    @property
    def argv(self) -> list[str]:
        """The plan's argv as this node runs it."""
        return [text(w) for w in self.argv_words]

    @property
    def command(self) -> list[str]:
        """What runs on the node: the container's ``docker run`` (or the router's binary), every launcher's."""
        return list(self.unit.argv)

    @property
    def env_map(self) -> dict[str, str]:
        """The env file's settings as this node has them."""
        return {k: text(v) for k, v in self.env}

    @property
    def image(self) -> str | None:
        """The container image (None: no container)."""
        return self.container.image if self.container is not None else None

    @cached_property
    def unit_text(self) -> str:
        return render_unit(self.unit)

    @cached_property
    def env_text(self) -> str:
        return env_file_text(self.env_map)


def env_words(env: Mapping[str, str], planned: Mapping[str, str], mapping: Mapping[str, str], *, head: str | None,
              own: str) -> tuple[tuple[str, Word], ...]:
    """The env file's settings as words: a value the plan gave (``planned``: with its placeholders) keeps its
    per-node addresses symbolic (:func:`words`); any other setting that is the node's own address (``VLLM_HOST_IP``,
    a pack's ``HCCL_IF_IP``) or, on a worker, its head's is that :class:`Ref`.

    >>> env_words({"VLLM_HOST_IP": "10.0.0.2", "A": "1"}, {}, {}, head="10.0.0.1", own="10.0.0.2")
    (('VLLM_HOST_IP', (Ref(name='self', value='10.0.0.2'),)), ('A', ('1',)))
    """
    out: list[tuple[str, Word]] = []
    for k, v in env.items():
        if k in planned:
            out.append((k, words(planned[k], v, mapping, head=head, own=own)))
        elif head is not None and v == head:
            out.append((k, (Ref("head", v),)))
        elif v == own:
            out.append((k, (Ref("self", v),)))
        else:
            out.append((k, literal(v)))
    return tuple(out)
