"""Commands in their own processes without an interpreter's start each: a process that has imported k3deploy,
pyinfra and their libraries once (about 0.8 s of CPU a command otherwise, most of a status or plan) and forks a
child per command. The child is the command as a user runs it, but for the start: its own process, its own gevent
hub and SSH connections, the working directory and environment of the call, standard input from ``/dev/null``,
its output in files the caller reads, its exit code from ``sys.exit`` (a traceback: 1, printed as the interpreter
prints it), the interpreter's exit handlers run before it exits.

:func:`run` is what :func:`helpers.k3` and :func:`helpers.deploy` call; where the process is busy with another call
(a test running two commands at once from threads) or cannot start, the call takes a fresh interpreter instead.
The same entry points start either way: ``k3deploy.cli.main`` and pyinfra's ``pyinfra_cli.main.main`` (the
``pyinfra`` script's).

The protocol on the process's standard input and output: one JSON line per call (``kind``, ``args``, ``cwd``,
``env``, ``out``, ``err``), answered by ``{"pid": N}`` once the child runs and ``{"rc": N}`` when it has exited."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: what each kind of call runs in the child, and the modules the process imports before its first fork (the lazy
#: imports of the commands that read hosts, deploy and render)
ENTRY = {"k3deploy": ("k3deploy.cli", "main"), "pyinfra": ("pyinfra_cli.main", "main")}
PRELOAD = ("k3deploy.cli", "pyinfra_cli.main", "pyinfra.api", "k3deploy.runtime.gather", "k3deploy.cli.status",
           "k3deploy.cli.plan", "k3deploy.model.status", "k3deploy.facts.rollout", "k3deploy.preflight.runner",
           "jinja2", "pydantic", "yaml")


def serve() -> None:
    """The process's loop: a call at a time, from standard input, answered on standard output."""
    from gevent import monkey

    monkey.patch_all()  # as pyinfra_cli does on import and k3deploy's main before its commands
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    fork = monkey.get_original("os", "fork")
    waitpid = monkey.get_original("os", "waitpid")
    calls = os.fdopen(os.dup(0), "r")
    answers = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    for line in calls:
        call = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = fork()
        if pid == 0:
            calls.close()
            answers.close()
            _child(call)
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        _, status = waitpid(pid, 0)
        answers.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


def _child(call: dict[str, Any]) -> None:
    """The command of ``call`` in this forked process; never returns."""
    code: int = 1
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
        os.chdir(call["cwd"])
        os.environ.clear()
        os.environ.update(call["env"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        out = os.open(call["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = out if call["err"] == call["out"] else os.open(call["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                                                              0o600)
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        module, attr = ENTRY[call["kind"]]
        import importlib

        main = getattr(importlib.import_module(module), attr)
        sys.argv = [call["argv0"], *call["args"]]
        try:
            main()
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - the interpreter prints an uncaught exception and exits 1
            import traceback

            traceback.print_exc()
            code = 1
        try:
            threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own wait for its threads
        except Exception:  # noqa: BLE001
            pass
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


class _Process:
    """The forking process of this test process, started at the first call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.broken = False
        #: what was read of the process's answers beyond the last whole line
        self.pending = b""

    def start(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, bufsize=0, cwd="/", start_new_session=True)
            self.pending = b""
            atexit.register(self.stop)
        return self.proc

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_PROCESS = _Process()


def _answer(deadline: float | None) -> dict[str, Any] | None:
    """The process's next answer (a line of its standard output, read unbuffered: two answers may come in one read),
    or None at ``deadline``."""
    proc = _PROCESS.proc
    assert proc is not None and proc.stdout is not None
    fd = proc.stdout.fileno()
    while b"\n" not in _PROCESS.pending:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            raise OSError("the forking process exited")
        _PROCESS.pending += chunk
    line, _PROCESS.pending = _PROCESS.pending.split(b"\n", 1)
    answer: dict[str, Any] = json.loads(line)
    return answer


def run(kind: str, argv0: str, args: Sequence[str], *, cwd: Path | str, env: Mapping[str, str] | None,
        timeout: float | None, out: Path, err: Path | None) -> int | None:
    """Run ``kind`` (``k3deploy`` or ``pyinfra``) with ``args`` in a forked child, its standard output into ``out``
    and its standard error into ``err`` (None: into ``out`` too); its exit code, or None where this process cannot
    take the call now (busy, or its forking process broken): the caller starts an interpreter instead. At
    ``timeout`` the child is killed and :class:`subprocess.TimeoutExpired` raised, as :func:`subprocess.run`
    does."""
    if _PROCESS.broken or not _PROCESS.lock.acquire(blocking=False):
        return None
    try:
        try:
            proc = _PROCESS.start()
            assert proc.stdin is not None and proc.stdout is not None
            call = {"kind": kind, "argv0": argv0, "args": list(args), "cwd": str(cwd),
                    "env": {**os.environ, **(env or {})}, "out": str(out), "err": str(err or out)}
            proc.stdin.write((json.dumps(call) + "\n").encode())
            proc.stdin.flush()
            started = _answer(None)
        except OSError:
            _PROCESS.broken = True
            return None
        assert started is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        done = _answer(deadline)
        if done is None:
            with contextlib.suppress(ProcessLookupError):   # it may end as the deadline comes
                os.kill(started["pid"], signal.SIGKILL)
            _answer(None)
            raise subprocess.TimeoutExpired([kind, *args], timeout or 0)
        return int(done["rc"])
    finally:
        _PROCESS.lock.release()


if __name__ == "__main__":
    del sys.path[0]  # this folder: the helpers are not the commands' modules
    serve()
