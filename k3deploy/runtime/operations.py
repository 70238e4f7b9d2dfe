"""pyinfra operations of the rollout. Each describes desired state and does nothing (``host.noop``) when the
host already has it; every command they run is a script of :mod:`k3deploy.cluster.commands` (the runbook prints
the same scripts).

Example (in a deploy file)::

    from k3deploy.runtime.operations import managed_file, wait_tcp
    managed_file(name="env file", dest="/etc/k3deploy/k3-engine.env", content="A=1\\n", mode="600", kind="env")
    wait_tcp(name="head rendezvous port", targets=[("10.0.0.1", 29501)], timeout=300)
"""

from __future__ import annotations

import difflib
import hashlib
import shlex
from io import BytesIO

from pyinfra import host, logger, state
from pyinfra.api import FileUploadCommand, RsyncCommand, StringCommand, operation
from pyinfra.api.state import StateStage
from pyinfra.facts.files import FileContents, Sha256File

from k3deploy.cluster import commands
from k3deploy.cluster.diff import change_lines, env_file_changes, unit_file_changes
from k3deploy.cluster.secrets import mask_line
from k3deploy.facts.rollout import SmokeAnswer, UnitState


def sh(script: str) -> StringCommand:
    """A script as one ``sh -c`` command."""
    return StringCommand("sh", "-c", shlex.quote(script))


def fail(message: str) -> StringCommand:
    """A command that fails this host with ``message`` on stderr."""
    return sh(f"echo {shlex.quote(message)} >&2; exit 1")


@operation()
def managed_file(dest: str, content: str, mode: str = "644", kind: str = "text",
                 seen: tuple[str | None, str | None] | None = None, active: bool = True):
    """Write ``content`` to ``dest`` with ``mode`` when it differs (``seen``: ``(sha256, text)`` of the file as
    this run already read it, so it is not read again).

    With ``--diff`` the change is shown as people read it: a unit (``kind="unit"``) as its image and container
    argv one flag per line, an env file (``"env"``) per variable with secret values masked, other text as a diff of
    its lines; a ``"secret"`` shows nothing of its contents.
    """
    if not active:
        host.noop("not needed on this host")
        return
    data = content.encode()
    want = hashlib.sha256(data).hexdigest()
    have = seen[0] if seen is not None else host.get_fact(Sha256File, path=dest)
    if have == want:
        host.noop(f"{dest} is up to date")
        return
    if state.config.DIFF:
        verb = "modify" if have else "create"
        if kind == "secret":
            host.log(f"Will {verb} {dest} (secret: contents not shown)", logger.info)
        else:
            if seen is not None:
                old = seen[1]
            else:
                lines = host.get_fact(FileContents, path=dest) if have else None
                old = None if lines is None else "".join(f"{x}\n" for x in lines)
            host.log(f"Will {verb} {dest}", logger.info)
            for line in file_diff(kind, old, content):
                logger.info("    %s", line)
    # uploaded to pyinfra's temporary directory, then put in place: two commands per file
    tmp = host.get_temp_filename(dest)
    yield FileUploadCommand(BytesIO(data), tmp, remote_temp_filename=tmp)
    yield sh(f"mkdir -p {shlex.quote(dest.rsplit('/', 1)[0] or '/')} && chmod {mode} {shlex.quote(tmp)} && "
             f"mv -f {shlex.quote(tmp)} {shlex.quote(dest)}")


def file_diff(kind: str, old: str | None, new: str) -> list[str]:
    """What changes in a file, for ``--diff``: per flag for units, per variable for env files."""
    if kind == "unit":
        return change_lines(unit_file_changes(old, new))
    if kind == "env":
        return change_lines(env_file_changes(old, new))
    return [line for line in difflib.unified_diff([mask_line(x) for x in (old or "").splitlines()],
                                                  [mask_line(x) for x in new.splitlines()], lineterm="", n=2)
            if not line.startswith(("---", "+++"))]


@operation(is_idempotent=False)
def script(text: str, active: bool = True):
    """Run one script of :mod:`k3deploy.cluster.commands` on this host (nothing when ``active`` is false)."""
    if not active or not text:
        host.noop("nothing to do here")
        return
    yield sh(text)


@operation(is_idempotent=False)
def from_control(src: str, dest: str, active: bool = True):
    """Copy ``src`` from the control machine to ``dest`` on this host with ``rsync`` over the host's SSH connection
    (a partial copy resumes; unchanged files are not sent again). A directory ``src`` ends with ``/``."""
    if not active:
        host.noop("not needed on this host")
        return
    try:
        host.check_can_rsync()
    except NotImplementedError as exc:
        yield fail(f"cannot copy {src} to this host: {exc}")
        return
    yield sh(f"mkdir -p {shlex.quote(dest.rstrip('/').rsplit('/', 1)[0] or '/')}")
    yield RsyncCommand(src, dest, ["-a", "--partial", "--exclude=*.incomplete", "--exclude=.k3-*"])


@operation(is_idempotent=False)
def stop_units(units: list[str], active: bool = True, seen: dict[str, str] | None = None):
    """Stop these units (and so their containers); nothing when ``active`` is false or they are not running.
    ``seen``: each unit's ActiveState as this run already read it."""
    if not active:
        host.noop("not part of a group that restarts")
        return

    def state_of(u: str) -> str:
        return seen[u] if seen is not None and u in seen else host.get_fact(UnitState, unit=u).active

    running = [u for u in units if state_of(u) not in ("inactive", "absent", "failed")]
    if not running:
        host.noop("already stopped")
        return
    yield sh(commands.stop_units(running))


@operation(is_idempotent=False)
def start_units(units: list[str], active: bool = True):
    """daemon-reload, reset failure counters, enable and (re)start these units."""
    if not active or not units:
        host.noop("nothing to start here")
        return
    yield sh(commands.start_units(units))


@operation(is_idempotent=False)
def wait_tcp(targets: list[tuple[str, int]], timeout: int = 300, interval: float = 1.0):
    """Wait until each ``(address, port)`` accepts a TCP connection, tried from this host (no payload is sent)."""
    if not targets:
        host.noop("no rendezvous to wait for")
        return
    for address, port in targets:
        yield sh(commands.wait_tcp(address, port, timeout, interval))


@operation(is_idempotent=False)
def smoke(endpoint: str, model: str, active: bool = True):
    """One short chat completion through the public endpoint, as the recipe guide's client sends it.

    A check, not a change: "No change" when the model answers. It runs when the rollout executes, after the
    engines started: change detection (and so ``--dry``) never sends a request.
    """
    if not active:
        host.noop("the smoke test is off (k3_smoke_test: false)")
        return
    if state.current_stage < StateStage.Execute:
        host.noop(f"at execution: one chat completion through {endpoint} as {model!r}")
        return
    answer = host.get_fact(SmokeAnswer, endpoint=endpoint, model=model)
    if answer.ok:
        host.noop(f"{endpoint} answered {answer.text!r}")
        logger.info(f"    [{host.name}] smoke test: {endpoint} answered {answer.text!r} as {model!r}")
        return
    yield fail(f"smoke test: POST {endpoint}/v1/chat/completions as {model!r} answered {answer.text[:200]!r}; "
               "required a chat completion")
