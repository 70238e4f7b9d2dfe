"""An interrupted deploy run: SIGINT (Ctrl-C), SIGTERM or SIGHUP.

pyinfra's command line answers Ctrl-C with ``Exiting upon user request!`` and exit code 0, whatever the run was
doing, and SIGTERM or SIGHUP end the process at once (Python's default), without the ``atexit`` handler that gives
the deployment lock back. A deploy run installs its own handler for all three instead (:func:`install`), once its
context is built: the run stops starting operations (every step of the restart asks :func:`stopped` first; the
commands already sent to the nodes end as they would), prints each group's state at that moment and the command that
converges it, gives the lock back on every host it holds (over the open connections, each bounded), and exits
``128 + the signal's number`` (130, 143, 129). A second signal while that happens is ignored; SIGKILL cannot be
caught (its lock is taken over later, see :mod:`k3deploy.runtime.lock`).

Example::

    >>> exit_code(signal.SIGTERM), exit_code(signal.SIGINT), exit_code(signal.SIGHUP)
    (143, 130, 129)
    >>> stopped()
    False
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: the signals a deploy run answers (SIGKILL and SIGSTOP cannot be caught)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code(signum: int) -> int:
    """The exit code of a run ended by ``signum``: 128 + its number, as a shell reports a process it killed."""
    return 128 + int(signum)


@dataclass
class Interruption:
    """What the handler needs of the run: its lines of state (``report``) and how to give the lock back
    (``release``); both set as the run gets them."""

    report: Callable[[], list[str]] = field(default=lambda: [])
    release: Callable[[], None] = field(default=lambda: None)
    signum: int | None = None
    greenlet: Any = None
    installed: bool = False


_RUN = Interruption()


def stopped() -> bool:
    """The run was interrupted: start no further step."""
    return _RUN.signum is not None


def install(report: Callable[[], list[str]], release: Callable[[], None]) -> bool:
    """Answer SIGINT, SIGTERM and SIGHUP in this (``pyinfra``) process as the module says; False (nothing installed)
    outside pyinfra's command line (a test process that runs the deploy's code in-process keeps its own handlers)."""
    import pyinfra

    _RUN.report, _RUN.release = report, release
    if not getattr(pyinfra, "is_cli", False):
        return False
    if not _RUN.installed:   # once: config.py installs it before pyinfra connects, the run's context again
        for signum in SIGNALS:
            signal.signal(signum, _handler)
        atexit.register(_finish)
        _RUN.installed = True
    return True


def before_connecting() -> bool:
    """:func:`install` for a run that has not read any host yet (``config.py``, which pyinfra runs before it
    connects): an interruption there has changed nothing."""
    return install(lambda: ["nothing was changed on any node (the run was connecting to the hosts)"], lambda: None)


def _handler(signum: int, frame: Any) -> None:
    """The signal handler: it only starts the work (a signal handler may not wait on the hub)."""
    import gevent

    if _RUN.signum is not None:
        return
    _RUN.signum = signum
    _RUN.greenlet = gevent.spawn(_interrupted, signum)


def _interrupted(signum: int) -> None:
    from pyinfra import logger

    name = signal.Signals(signum).name
    code = exit_code(signum)
    try:
        logger.error(f"--> k3deploy: the run was interrupted ({name}): no further step starts; what the nodes run "
                     "now:")
        for line in _RUN.report():
            logger.error(f"--> k3deploy:   {line}")
        _RUN.release()
        logger.error(f"--> k3deploy: the deployment lock was given back; exit code {code}")
    except BaseException as exc:   # whatever happens here, the run ends with the signal's code
        logger.error(f"--> k3deploy: while stopping after {name}: {type(exc).__name__}: {exc}")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _finish() -> None:
    """At the interpreter's exit: an interruption that is being handled ends the process with its own code."""
    if _RUN.greenlet is not None:
        _RUN.greenlet.join()
