"""Progress of a long copy or build for people: bytes done, rate and time left, while it runs.

On a terminal it is rich's progress bar (``rich.progress``: bytes, speed, time remaining), redrawn in place; where
the output is not a terminal (a CI log, a pipe) it is one plain line every ``every`` seconds (:func:`line`), so a
log shows the copy advancing without a line per second; with ``quiet`` (a command's ``--json``) nothing. What is
measured is the caller's: :func:`watch` polls a function that says how many bytes are done (a directory's size,
a file's) while the work runs.

Example::

    >>> line("base root", 150 * 2**20, 300 * 2**20, 5 * 2**20)
    'base root: 150.0 MiB of ~300.0 MiB (50%), 5.0 MiB/s, about 30 s left'
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
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                                TransferSpeedColumn(), TimeRemainingColumn(),
                                console=Console(file=self.stream), transient=True)
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
