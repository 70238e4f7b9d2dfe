"""Progress of the stage's copies on the control machine, while they run: per copy the bytes so far against its
whole size, the rate and the time left (:class:`k3deploy.runtime.progress.Board`: rich's bars on a terminal, a
plain line every 10 s otherwise, and one line per copy as it ends, on stderr: never on the stdout a ``--json``
prints).

Why this way. The copies run as remote scripts through pyinfra, which shows a command's output only at ``-vvv`` and
only line by line as the script prints it. Making the scripts print progress lines would change what the stage runs
(and what the runbook prints) and tie every copy tool's output to a format; instead, while a stage step's command
runs, a greenlet of this deploy process (pyinfra runs each host as a gevent greenlet, so it runs beside the command
without a thread) reads, every :data:`POLL` seconds, the bytes the receiving node holds at the copy's paths, over a
channel of its own on the host's SSH connection (one ``find`` of those paths:
:func:`k3deploy.model.commands.copied_bytes`; a few files, never the data: the copy is not slowed measurably), and
the whole size once from the host that holds it whole (:mod:`k3deploy.model.stagecopies`), or, for a download
from the hub or the registry, from the source's own index of it (the hub's sizes, the image's manifest), read once
by the downloading node (its endpoint, proxy and credentials); a pull's bytes are the daemon's own files. The
step's command is the same one pyinfra would run (:class:`Watched` runs it as its ``StringCommand`` or
``RsyncCommand`` does); the greenlet is killed when the command returns or raises, whatever the outcome; under
``--dry`` no command runs, so nothing is shown.

Example (in an operation)::

    yield Watched("sh", "-c", "rsync ...", copies=(Copied("weights", ("/c/hub/models--o--m/blobs/",), "n1"),))
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gevent
from gevent.event import AsyncResult, Event
from pyinfra.api.command import PyinfraCommand, RsyncCommand, StringCommand

from k3deploy.model.commands import copied_bytes, pulled_bytes
from k3deploy.model.stagecopies import Copied, Index, hub_total, image_layers
from k3deploy.runtime.progress import Board, tree_bytes

#: seconds between two reads of a node's bytes on a terminal (off one, half the plain lines' interval: each read is
#: an SSH command per receiving node, control-machine CPU at rack scale)
POLL = 2.0
#: the longest a read of the bytes may take (a node that does not answer: the copy's own step says why)
READ_TIMEOUT = 30

_board: Board | None = None


def board() -> Board:
    """The one display of this process's copies (made at the first copy)."""
    global _board
    if _board is None:
        _board = Board()
    return _board


def _run(host: Any, script: str, arguments: dict[str, Any]) -> list[str] | None:
    """The lines ``script`` prints on ``host``, over a channel of its own on the host's connection (None: it
    failed or there was no answer)."""
    args = {k: v for k, v in arguments.items() if k not in ("_timeout", "_stdin", "_success_exit_codes",
                                                            "_get_pty")}
    try:
        ok, out = host.run_shell_command(StringCommand("sh", "-c", shlex.quote(script)), print_output=False,
                                         print_input=False, _timeout=READ_TIMEOUT, **args)
    except Exception:   # a connection that fails under the read: the copy's own command reports it
        return None
    return list(out.stdout_lines) if ok else None


def _script(copy: Copied) -> str:
    """Shell that prints the bytes ``copy`` holds at its paths (0 where it has none: a download measured by its
    index's files only)."""
    return copied_bytes([copy.paths]) if copy.paths else "echo 0"


def _read(host: Any, scripts: Sequence[str], arguments: dict[str, Any]) -> list[int] | None:
    """The bytes each copy holds on ``host``, each by its script (:func:`_script`) (None: no answer)."""
    got = [int(x) for x in _run(host, "; ".join(scripts), arguments) or [] if x.strip().isdigit()]
    return got if len(got) == len(scripts) else None


def _local(path: str) -> int | None:
    p = Path(path)
    with contextlib.suppress(OSError):
        return p.stat().st_size if p.is_file() else tree_bytes(p)
    return None


#: the holders' whole sizes this run has read, by (holder, paths): every receiver of a step copies from the same
#: holder, which holds the artifact whole before the round, so it is read once for all of them (the first receiver
#: reads, the others wait for its answer)
_holders: dict[tuple[str, tuple[str, ...]], AsyncResult] = {}


def _holder_total(state: Any, copy: Copied, arguments: dict[str, Any]) -> int | None:
    """The bytes ``copy``'s holder (``copy.source``) holds at its paths, read once per holder and paths."""
    assert copy.source is not None
    key = (copy.source, copy.paths)
    known = _holders.get(key)
    if known is not None:
        got: int | None = known.get()
        return got
    known = _holders[key] = AsyncResult()
    total: int | None = None
    try:
        holder = state.inventory.get_host(copy.source, None) if state is not None else None
        read = _read(holder, [_script(copy)], arguments) if holder is not None and holder.connected else None
        total = read[0] if read else None
    finally:
        if total is None:   # not known (or the read was stopped): the next receiver asks again
            del _holders[key]
        known.set(total)
    return total


def _index_total(host: Any, index: Index, arguments: dict[str, Any]) -> tuple[int | None, str | None]:
    """The whole size of a download, from its source's index read by the downloading ``host`` itself, and for an
    image the script that reads the daemon's files for it (no answer: neither; the download's own step goes on)."""
    answer = "\n".join(_run(host, index.command, arguments) or [])
    if index.kind == "hub":
        return hub_total(answer), None
    image = image_layers(answer)
    if image is None:
        return None, None
    root, layers = image
    return sum(n for _, n in layers), pulled_bytes(root, layers)


def _totals(state: Any, host: Any, copies: Sequence[Copied], arguments: dict[str, Any],
            scripts: list[str] | None = None) -> list[int | None]:
    """Each copy's whole size: its holder's bytes at the same paths, the control machine's copy's, or its source's
    index's (where that index says how its bytes are read, ``scripts[i]`` becomes that script)."""
    out: list[int | None] = []
    for i, c in enumerate(copies):
        total: int | None = None
        if c.local:
            total = _local(c.local)
        elif c.source:
            total = _holder_total(state, c, arguments)
        elif c.index:
            total, script = _index_total(host, c.index, arguments)
            if script and scripts is not None:
                scripts[i] = script
        out.append(total or None)
    return out


@contextlib.contextmanager
def watching(state: Any, host: Any, copies: Sequence[Copied], arguments: dict[str, Any]) -> Iterator[list[bool]]:
    """While the body runs, ``copies`` on ``host`` shown on the :func:`board`; the body sets ``outcome[0]`` to
    whether the step's command succeeded (then each copy is whole)."""
    if not copies:
        yield [False]
        return
    shown = board()
    keys = [f"{host.name}:{id(c)}:{c.what}" for c in copies]
    for key, c in zip(keys, copies, strict=True):
        shown.begin(key, f"[{host.name}] stage: {c.shown}", None)

    scripts = [_script(c) for c in copies]
    known = Event()

    def poll() -> None:
        for key, total in zip(keys, _totals(state, host, copies, arguments, scripts), strict=True):
            if total:
                shown.update(key, 0, total)
        known.set()
        while True:   # the first read after a pause: a step shorter than it costs no read (its end says its bytes)
            gevent.sleep(POLL if shown.tty else max(POLL, shown.every / 2))   # off a terminal: a line a while
            got = _read(host, scripts, arguments)
            for key, done in zip(keys, got or [], strict=False):
                shown.update(key, done)

    outcome = [False]
    reader = gevent.spawn(poll)
    try:
        yield outcome
    finally:
        if outcome[0]:   # a step quicker than the read of its totals waits for that read: its last line has them
            known.wait(READ_TIMEOUT)
        reader.kill(block=True)
        # a last read where the bytes are not known otherwise (a failed step, a copy with no total); a copy whose
        # step succeeded holds its total: the step's end waits for no read
        whole = outcome[0] and all(shown.copies.get(k, {}).get("total") for k in keys)
        last = None if whole else _read(host, scripts, arguments)
        for i, (key, c) in enumerate(zip(keys, copies, strict=True)):
            if not c.paths and not shown.copies.get(key, {}).get("total"):
                shown.forget(key)   # measured through its index only, which did not answer: nothing to say
            shown.end(key, last[i] if last else None, ok=outcome[0])


def _succeeded(result: Any) -> bool:
    """A command's ``execute`` result: ``(ok, output)`` of a shell command, ``ok`` of an rsync."""
    return bool(result[0] if isinstance(result, tuple) else result)


class _Watching:
    """A command's ``copies`` shown while it runs (:func:`watching`): mixed in before the pyinfra command class."""

    copies: tuple[Copied, ...]

    def execute(self, state: Any, host: Any, connector_arguments: Any) -> Any:
        with watching(state, host, self.copies, dict(connector_arguments)) as outcome:
            result = super().execute(state, host, connector_arguments)  # type: ignore[misc]
            outcome[0] = _succeeded(result)
            return result


class Watched(_Watching, StringCommand):
    """A stage step's script, run as its :class:`~pyinfra.api.command.StringCommand` would be, its ``copies``
    shown while it runs (:func:`watching`)."""

    def __init__(self, *bits: Any, copies: Sequence[Copied] = (), **kwargs: Any) -> None:
        super().__init__(*bits, **kwargs)
        self.copies = tuple(copies)


class WatchedRsync(_Watching, RsyncCommand):
    """A copy from the control machine, run as its :class:`~pyinfra.api.command.RsyncCommand` would be, its
    ``copies`` shown while it runs."""

    def __init__(self, src: str, dest: str, flags: Any, copies: Sequence[Copied] = (), **kwargs: Any) -> None:
        super().__init__(src, dest, flags, **kwargs)
        self.copies = tuple(copies)


def watched(command: PyinfraCommand, copies: Sequence[Copied]) -> PyinfraCommand:
    """``command`` with ``copies`` shown while it runs (an rsync from the control machine or a script); any other
    command, or none to show, as it is."""
    if not copies:
        return command
    if isinstance(command, RsyncCommand):
        return WatchedRsync(command.src, command.dest, command.flags, copies=copies, **command.connector_arguments)
    return command
