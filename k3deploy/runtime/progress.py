"""Progress of a long copy or build for people: bytes done, rate and time left, while it runs.

On a terminal it is rich's progress bar (``rich.progress``: bytes, speed, time remaining), redrawn in place; where
the output is not a terminal (a CI log, a pipe) it is one plain line every ``every`` seconds (:func:`line`), so a
log shows the copy advancing without a line per second; with ``quiet`` (a command's ``--json``) nothing. What is
measured is the caller's: :func:`watch` polls a function that says how many bytes are done (a directory's size,
a file's) while the work runs. Several copies at once (the stage's, one per receiving node and artifact) share one
:class:`Board`: one bar each on a terminal, else a line each every ``every`` seconds, and one line each as it ends
(:func:`done_line`: so a copy shorter than ``every`` is still seen, with its bytes and its total).

Example::

    >>> line("base root", 150 * 2**20, 300 * 2**20, 5 * 2**20)
    'base root: 150.0 MiB of ~300.0 MiB (50%), 5.0 MiB/s, about 30 s left'
    >>> done_line("weights", 2**30, 2**30, 8.0, ok=True)
    'weights: 1.0 GiB of 1.0 GiB, done in 8 s (128.0 MiB/s)'
    >>> with watch("base root", lambda: 0, total=None, quiet=True):  # the work runs here
    ...     pass
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

#: seconds between two plain lines where the output is not a terminal
EVERY = 10.0
#: seconds between two measurements
POLL = 1.0


def size(value: float) -> str:
    """Bytes as people read them (binary units, one decimal).

    >>> size(0), size(1536), size(3 * 2**30)
    ('0 B', '1.5 KiB', '3.0 GiB')
    """
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = 0
    while value >= 1024 and i < len(units) - 1:
        value /= 1024
        i += 1
    return f"{value:.0f} B" if i == 0 else f"{value:.1f} {units[i]}"


def left(seconds: float) -> str:
    """Time left as people read it.

    >>> left(42), left(125), left(3725)
    ('42 s', '2m05s', '1h02m')
    """
    s = int(round(seconds))
    return f"{s} s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def line(what: str, done: int, total: int | None, rate: float | None) -> str:
    """One plain progress line: bytes done (of the expected total, ``~``: an estimate, and the share), the rate and
    the time left at that rate (none before a rate is known or past the estimate).

    >>> line("weights", 2**30, None, None)
    'weights: 1.0 GiB'
    >>> line("weights", 2**30, 2**30 // 2, 2**20)
    'weights: 1.0 GiB of ~512.0 MiB (99%), 1.0 MiB/s'
    """
    out = f"{what}: {size(done)}"
    if total:
        out += f" of ~{size(total)} ({min(99, int(100 * done / total))}%)"
    if rate:
        out += f", {size(rate)}/s"
        if total and done < total:
            out += f", about {left((total - done) / rate)} left"
    return out


def done_line(what: str, done: int, total: int | None, seconds: float, ok: bool) -> str:
    """The line a copy ends with: the bytes it holds (of its total where known), the time it took and its mean rate;
    one that failed says where it stopped.

    >>> done_line("image", 3 * 2**20, 8 * 2**20, 2.0, ok=False)
    'image: stopped at 3.0 MiB of 8.0 MiB (37%) after 2 s'
    >>> done_line("weights", 5 * 2**20, None, 0.2, ok=True)
    'weights: 5.0 MiB, done in 0 s (25.0 MiB/s)'
    """
    if not ok:
        of = f" of {size(total)} ({min(99, int(100 * done / total))}%)" if total else ""
        return f"{what}: stopped at {size(done)}{of} after {left(seconds)}"
    of = f" of {size(total)}" if total else ""
    rate = f" ({size(done / seconds)}/s)" if seconds > 0 and done else ""
    return f"{what}: {size(done)}{of}, done in {left(seconds)}{rate}"



def rich_bar(stream: IO[str]) -> Any:
    """rich's transfer bars on ``stream`` (a terminal): a task's description (its "[host]" as text, not rich's
    markup), bar, bytes, rate and time left; gone once stopped."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(binary_units=True),
                    TransferSpeedColumn(), TimeRemainingColumn(), console=Console(file=stream), transient=True)


class Board:
    """Several copies shown at once, each under its own key: :meth:`begin`, :meth:`update` with the bytes so far
    (and a total once it is known), :meth:`end`. On a terminal one rich bar each (one live display for all); else a
    plain line (:func:`line`) per copy every ``every`` seconds, and one :func:`done_line` as it ends; ``quiet``:
    nothing. The rate is the copy's mean since its first measure; the time left is the rest at that rate.

        >>> import io
        >>> t = [0.0]
        >>> out = io.StringIO()
        >>> b = Board(out, every=10, clock=lambda: t[0])
        >>> b.begin("a", "[n2] weights", None)
        >>> t[0] = 4; b.update("a", 2**20, 4 * 2**20)
        >>> t[0] = 11; b.update("a", 3 * 2**20)
        >>> t[0] = 12; b.end("a", 4 * 2**20, ok=True)
        >>> print(out.getvalue(), end="")
        [n2] weights: 3.0 MiB of ~4.0 MiB (75%), 292.6 KiB/s, about 4 s left
        [n2] weights: 4.0 MiB of 4.0 MiB, done in 12 s (341.3 KiB/s)
    """

    def __init__(self, stream: IO[str] | None = None, every: float = EVERY, quiet: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.every, self.quiet, self.clock = every, quiet, clock
        self.copies: dict[str, dict[str, Any]] = {}
        self.bar: Any = None
        self.tty = not quiet and self.stream.isatty()

    def begin(self, key: str, what: str, total: int | None) -> None:
        now = self.clock()
        self.copies[key] = {"what": what, "total": total, "started": now, "said": now, "done": 0, "first": None}
        if self.tty:
            if self.bar is None:
                self.bar = rich_bar(self.stream)
                self.bar.start()
            self.copies[key]["task"] = self.bar.add_task(what, total=total)

    def rate(self, key: str) -> float | None:
        c = self.copies[key]
        if c["first"] is None:
            return None
        t0, b0 = c["first"]
        spent = self.clock() - t0
        return (c["done"] - b0) / spent if spent > 0 and c["done"] > b0 else None

    def update(self, key: str, done: int, total: int | None = None) -> None:
        c = self.copies.get(key)
        if c is None:
            return
        now = self.clock()
        if c["first"] is None:
            c["first"] = (now, done)   # the rate is from here: bytes a resumed copy held before are not counted
        c["done"] = max(done, c["done"])
        if total:
            c["total"] = total
        if self.quiet:
            return
        if self.bar is not None and "task" in c:
            self.bar.update(c["task"], completed=c["done"], total=c["total"])
        elif not self.tty and now - c["said"] >= self.every:
            c["said"] = now
            print(line(c["what"], c["done"], c["total"], self.rate(key)), file=self.stream, flush=True)

    def forget(self, key: str) -> None:
        """The copy is not shown any more, and ends without a line (nothing was measured of it)."""
        c = self.copies.pop(key, None)
        if c is not None and self.bar is not None and "task" in c:
            self.bar.remove_task(c["task"])
            if not self.copies:
                self.bar.stop()
                self.bar = None

    def end(self, key: str, done: int | None, ok: bool) -> None:
        """The copy ended (``ok``: its step succeeded, so it holds the whole: ``done`` then is at least its total)."""
        c = self.copies.pop(key, None)
        if c is None:
            return
        got = max(done or 0, c["done"])
        if ok and c["total"]:
            got = max(got, c["total"])
        said = done_line(c["what"], got, c["total"], self.clock() - c["started"], ok)
        if self.bar is not None and "task" in c:
            self.bar.remove_task(c["task"])
            self.bar.console.print(said, markup=False, highlight=False)
            if not self.copies:
                self.bar.stop()
                self.bar = None
        elif not self.quiet:
            print(said, file=self.stream, flush=True)


def tree_bytes(path: Path) -> int:
    """The bytes of the regular files under ``path`` (0 while it does not exist); links are not followed."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                total += st.st_size if not os.path.islink(os.path.join(root, name)) else 0
    return total


class Meter:
    """Bytes done of an expected total, shown as :mod:`this module <k3deploy.runtime.progress>` says."""

    def __init__(self, what: str, total: int | None, stream: IO[str] | None = None, every: float = EVERY,
                 quiet: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.total, self.every, self.quiet, self.clock = what, total, every, quiet, clock
        self.stream = stream if stream is not None else sys.stderr
        self.started = clock()
        self.last_said = self.started
        self.done = 0
        self.bar: Any = None
        if not quiet and self.stream.isatty():
            self.bar = rich_bar(self.stream)
            self.task = self.bar.add_task(what, total=total)
            self.bar.start()

    def rate(self) -> float | None:
        spent = self.clock() - self.started
        return self.done / spent if spent > 0 and self.done else None

    def update(self, done: int) -> None:
        """``done`` bytes so far: the bar moves; a plain line where ``every`` seconds passed since the last."""
        self.done = done
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=done if self.total is None else min(done, self.total))
            return
        now = self.clock()
        if now - self.last_said >= self.every:
            self.last_said = now
            print(line(self.what, done, self.total, self.rate()), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


@contextlib.contextmanager
def watch(what: str, measure: Callable[[], int], total: int | None, stream: IO[str] | None = None,
          every: float = EVERY, quiet: bool = False, poll: float = POLL) -> Iterator[Meter]:
    """While the body runs, measure the bytes done every ``poll`` seconds (in a thread) and show them."""
    meter = Meter(what, total, stream, every, quiet)
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(poll):
            with contextlib.suppress(OSError):
                meter.update(measure())

    thread = threading.Thread(target=run, name=f"progress {what}", daemon=True)
    if not quiet:
        thread.start()
    try:
        yield meter
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        meter.close()
