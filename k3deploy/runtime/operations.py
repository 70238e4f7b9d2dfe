"""pyinfra operations of the rollout. Each describes desired state and does nothing (``host.noop``) when the
host already has it; every command they run is a script of :mod:`k3deploy.model.commands` (the runbook prints
the same scripts).

Example (in a deploy file)::

    from k3deploy.model import commands, correctness
    from k3deploy.runtime.operations import managed_file, start_units
    managed_file(name="env file", dest="/etc/k3deploy/k3-engine.env", content="A=1\\n", mode="600", kind="env")
    start_units(name="worker, once its head listens",
                text=commands.start_joined(["k3-engine.service"], [("10.0.0.1", 29501)], 300, "/etc/k3deploy"))
"""

from __future__ import annotations

import difflib
import hashlib
import secrets
import shlex
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FileUploadCommand, FunctionCommand, PyinfraCommand, RsyncCommand, StringCommand
from pyinfra.api.operation import operation
from pyinfra.api.state import StateStage
from pyinfra.context import host, state
from pyinfra.facts.files import Directory, File, FileContents
from pyinfra.operations import server

from k3deploy.facts.rollout import (
    CorrectAnswers,
    FileOnHost,
    FileState,
    KeepalivedState,
    SmokeAnswer,
    UnitState,
    VipHeld,
)
from k3deploy.model import commands, correctness
from k3deploy.model.diff import change_lines, env_file_changes, unit_file_changes
from k3deploy.model.engine import EngineSpec
from k3deploy.model.observed import ENV_MODE, UNIT_MODE, Installed
from k3deploy.model.rollout import UnitWork
from k3deploy.model.secrets import mask_line
from k3deploy.model.stagecopies import Copied
from k3deploy.model.steps import Step
from k3deploy.runtime.stageprogress import Watched, watched

#: what an operation yields: the commands it runs on the host
Commands = Generator[PyinfraCommand, None, None]


def sh(script: str) -> StringCommand:
    """A script as one ``sh -c`` command."""
    return StringCommand("sh", "-c", shlex.quote(script))


def fail(message: str) -> StringCommand:
    """A command that fails this host with ``message`` on stderr."""
    return sh(f"echo {shlex.quote(message)} >&2; exit 1")


@operation()
def managed_file(dest: str, content: str, mode: str = "644", kind: str = "text",
                 seen: tuple[str | None, str | None] | None = None, active: bool = True,
                 live: str | None = None) -> Commands:
    """Write ``content`` to ``dest``, owned by root with ``mode``, when it differs (``seen``: ``(sha256, text)`` of
    the file as this run already read it, so it is not read again). Read here (no ``seen``), a file whose content is
    up to date but whose owner or mode is not gets them back (nothing else changes).

    The content goes to a new file of a name drawn here at random in ``dest``'s directory, created root's and 0600
    before a byte is written, then renamed onto ``dest`` (:func:`upload`): no other user of the host can read it or
    take its place at any moment. ``live``: the file ``dest`` is the next version of (staged beside it; ``seen`` is
    then the live file's), named so in ``--diff``.

    With ``--diff`` the change is shown as people read it: a unit (``kind="unit"``) as its image and container
    argv one flag per line, an env file (``"env"``) per variable with secret values masked, other text as a diff of
    its lines; a ``"secret"`` shows nothing of its contents.
    """
    if not active:
        host.noop("not needed on this host")
        return
    data = content.encode()
    want = hashlib.sha256(data).hexdigest()
    if seen is not None:
        have, meta = seen[0], None
    else:
        got = host.get_fact(FileOnHost, path=dest)
        have, meta = got.sha, got.meta
    if have == want:
        drift = meta.drift(mode) if meta is not None else None
        if drift is None:
            host.noop(f"{dest} is up to date")
            return
        if state.config.DIFF:
            host.log(f"Will give {dest} its owner and mode back (content unchanged): {drift}", logger.info)
        yield sh(commands.lock_down([(dest, mode)]))
        return
    if state.config.DIFF:
        show_change(dest, kind, have, seen, content, live)
    args: Mapping[str, Any] = host.current_op_global_arguments or {}
    if any(args.get(k) for k in ("_sudo", "_doas", "_dzdo", "_su_user")):
        yield from upload(dest, data, mode, private_in=host.get_temp_filename().rsplit("/", 1)[0] or "/tmp")
    else:
        yield from upload(dest, data, mode)


#: connector arguments of a command the SSH user runs as itself, whatever the operation's (sudo, doas, su)
AS_SSH_USER: dict[str, Any] = {"_sudo": False, "_doas": False, "_dzdo": False, "_su_user": None}


def upload(dest: str, data: bytes, mode: str, private_in: str | None = None,
           nonce: str | None = None) -> list[PyinfraCommand]:
    """The three commands that write ``data`` to ``dest`` (root's, ``mode``): create ``DIR/.k3-<nonce>.tmp`` (a
    random name drawn on the control machine) root's and 0600, only if the name does not exist, in a directory only
    root can write to (:func:`~k3deploy.model.commands.new_temp`); upload into it (SFTP keeps the file's owner
    and mode); check it is still root's and 0600, set ``mode`` and rename it onto ``dest``
    (:func:`~k3deploy.model.commands.put_in_place`).

    With ``private_in`` (an operation under ``_sudo``: SFTP uploads as the SSH user, who cannot write a file of
    root's), the SSH user makes a private directory there (0700, a random name, ``mkdir`` fails if it exists) and
    uploads into it; root then fills the temporary file from it and removes it.

        >>> [type(c).__name__ for c in upload("/etc/k3deploy/a.env", b"A=1\\n", "600", nonce="ab")]
        ['StringCommand', 'FileUploadCommand', 'StringCommand']
        >>> upload("/etc/k3deploy/a.env", b"", "600", nonce="ab")[1].dest
        '/etc/k3deploy/.k3-ab.tmp'
        >>> upload("/etc/k3deploy/a.env", b"", "600", private_in="/tmp", nonce="ab")[1].dest
        '/tmp/k3-ab/f'
    """
    nonce = nonce or secrets.token_hex(16)
    directory = dest.rsplit("/", 1)[0] or "/"
    temp = f"{directory.rstrip('/')}/.k3-{nonce}.tmp"
    if private_in is None:
        return [sh(commands.new_temp(directory, temp)), FileUploadCommand(BytesIO(data), temp),
                sh(commands.put_in_place(temp, dest, mode))]
    private = f"{private_in.rstrip('/')}/k3-{nonce}"
    return [StringCommand("sh", "-c", shlex.quote(f"umask 077 && mkdir {shlex.quote(private)}"), **AS_SSH_USER),
            FileUploadCommand(BytesIO(data), f"{private}/f", **AS_SSH_USER),
            sh(commands.put_in_place(temp, dest, mode, private=private))]


def show_change(dest: str, kind: str, have: str | None, seen: tuple[str | None, str | None] | None, content: str,
                live: str | None, spec: EngineSpec | None = None) -> None:
    """Say, for ``--diff``, how a file changes (a secret: that it does, nothing of its contents; a unit's file
    rendered from ``spec``: as :func:`file_diff` takes it from there)."""
    verb = "modify" if have else "create"
    if kind == "secret":
        host.log(f"Will {verb} {dest} (secret: contents not shown)", logger.info)
        return
    if seen is not None:
        old = seen[1]
    else:
        lines = host.get_fact(FileContents, path=dest) if have else None
        old = None if lines is None else "".join(f"{x}\n" for x in lines)
    host.log(f"Will {verb} {live or dest}" + (f" (written to {dest} now, put in place at the restart)"
                                               if live else ""), logger.info)
    for line in file_diff(kind, old, content, spec):
        logger.info("    %s", line)


@dataclass(frozen=True)
class Written:
    """One file of :func:`write_files`: ``content`` for ``dest`` (``mode``), as :func:`managed_file` takes it;
    ``when``: written only while this holds (evaluated as the operation runs); ``spec``: the engine spec a unit's
    env file or systemd unit renders from (:attr:`k3deploy.model.steps.FileWrite.spec`), what ``--diff`` shows."""

    dest: str
    content: str = field(repr=False)
    mode: str = "644"
    kind: str = "text"
    seen: tuple[str | None, str | None] | None = field(default=None, repr=False)
    live: str | None = None
    when: Callable[[], bool] | None = None
    spec: EngineSpec | None = field(default=None, repr=False, compare=False)
    owner: str | None = None        # a user name: the file is that user's (a Slurm job's, k3_slurm_user)
    read: FileState | None = field(default=None, repr=False)   # as the host's reading found it (not read again)


@operation()
def write_files(files: Sequence[Written], restore: Sequence[tuple[str, str, str]] = ()) -> Commands:
    """Write every one of ``files`` whose content differs, all in one command: the script
    (:func:`~k3deploy.model.commands.write_from_stdin`) is the command line, the contents come on its stdin (never
    in argv, never in a log), each into a new root-only file of a random name put in place as :func:`managed_file`
    does (a file's sha256, owner and mode as ``seen``, else as the host's reading found them, ``read``, else read
    here). A file up to date whose owner or mode drifted gets them back, as do the files of ``restore`` (``(path,
    mode, how it drifted)``, e.g. :func:`drifted`'s live unit and env files), content untouched. ``--diff`` shows
    each change as :func:`managed_file` does."""
    todo: list[Written] = []
    drifted: list[tuple[str, str, str | None]] = []
    for path, mode, how in restore:
        drifted.append((path, mode, None))
        if state.config.DIFF:
            host.log(f"Will give {path} its owner and mode back (content unchanged): {how}", logger.info)
    for f in files:
        if f.when is not None and not f.when():
            continue
        if f.seen is not None:
            have, meta = f.seen[0], None
        else:
            got = f.read if f.read is not None else host.get_fact(FileOnHost, path=f.dest)
            have, meta = got.sha, got.meta
        if have == hashlib.sha256(f.content.encode()).hexdigest():
            drift = meta.drift(f.mode, owned=f.owner is not None) if meta is not None else None
            if drift is not None:
                drifted.append((f.dest, f.mode, f.owner))
                if state.config.DIFF:
                    host.log(f"Will give {f.dest} its owner and mode back (content unchanged): {drift}", logger.info)
            continue
        if state.config.DIFF:
            show_change(f.dest, f.kind, have, f.seen, f.content, f.live, f.spec)
        todo.append(f)
    if not todo and not drifted:
        host.noop("every file is up to date")
        return
    if drifted:
        yield sh(commands.lock_down(drifted))
    if todo:
        script = commands.write_from_stdin([(f.dest, f.mode, f.owner) for f in todo], secrets.token_hex(16))
        payload = "".join(f"{len(f.content.encode())}\n{f.content}" for f in todo)
        yield StringCommand("sh", "-c", shlex.quote(script), _stdin=payload)


@operation()
def directories(paths: Sequence[str], mode: str = "0755", owner: str | None = None,
                owned: Collection[str] = (), opened: Collection[str] = ()) -> Commands:
    """Create the directories of ``paths`` that are missing (root's, ``mode``), with their parents; those of
    ``owned`` are ``owner``'s (a user name), and one of them another user's is given to ``owner``; one of ``opened``
    that others cannot pass through gets ``go+x`` (others reach the files in it they may read, list nothing)."""
    have = {p: host.get_fact(Directory, path=p) for p in paths}
    mine = [p for p in paths if p in owned and owner is not None]
    missing = [p for p in paths if not have[p] and p not in mine]
    given = [p for p in mine if not (d := have[p]) or d.get("user") != owner]
    closed = [p for p in paths if p in opened and (not (d := have[p]) or not int(d.get("mode") or 0) % 2)]
    if not missing and not given and not closed:
        host.noop("every directory is there")
        return
    yield sh(" && ".join([*([commands.make_dirs(missing, mode)] if missing else []),
                          *([commands.make_dirs(given, mode, owner)] if given else []),
                          *([f"chmod go+x {' '.join(shlex.quote(p) for p in closed)}"] if closed else [])]))


@operation()
def stage_step(step: Step, copies: tuple[Copied, ...] = ()) -> Commands:
    """One step of the stage (:func:`k3deploy.model.steps.stage`) on this host: its script, its file (a secret read
    from the control machine's file only here: :func:`managed_file`) or its copy from the control machine
    (:func:`from_control`); nothing where it does not apply. A copy from a peer that failed an earlier step of this
    run fails here saying so (not with the refused connection to the peer's rsync daemon that never started).
    ``copies``: what it copies here, shown while it runs (:mod:`k3deploy.runtime.stageprogress`)."""
    if not step.applies:
        host.noop("not needed on this host")
        return
    if step.creates and all(host.get_fact(File, path=p) for p in step.creates):
        host.noop("the files it makes are here")
        return
    down = [p for p in step.peers if p in {h.name for h in state.failed_hosts}]
    if down and len(down) == len(step.peers):   # its senders failed an earlier step (the error is above there)
        yield fail(f"not staged: {' and '.join(down)}, which {'was' if len(down) == 1 else 'were'} to send to it in "
                   "this round, failed an earlier step of this run (the error is above there): nothing was copied here")
        return
    if step.file is not None:
        f = step.file
        content = Path(f.source).read_text() if f.source else f.content
        yield from managed_file._inner(dest=f.dest, content=content, mode=f.mode, kind=f.kind)
    elif step.copy is not None:
        if step.copy.began:
            yield sh(step.copy.began)
        for command in from_control._inner(src=step.copy.src, dest=step.copy.dest):
            yield watched(command, copies)
        if step.copy.ended:
            yield sh(step.copy.ended)
    elif step.script:
        yield Watched("sh", "-c", shlex.quote(step.script), copies=copies) if copies else sh(step.script)
    else:
        host.noop("nothing to do here")


def drifted(units: Sequence[UnitWork], installed: Mapping[tuple[str, str], Installed]) -> list[tuple[str, str, str]]:
    """``(path, mode, how it drifted)`` of each unit and env file of ``units`` whose owner or mode is not root's and
    :data:`~k3deploy.model.observed.UNIT_MODE` (``ENV_MODE``), as this run read them (``installed``)."""
    out = []
    for u in units:
        have = installed.get((u.host, u.unit))
        for path, mode, meta in ((u.unit_path, UNIT_MODE, have.unit_meta if have else None),
                                 (u.env_path, ENV_MODE, have.env_meta if have else None)):
            drift = meta.drift(mode) if meta is not None else None
            if drift is not None:
                out.append((path, mode, drift))
    return out


#: the ActiveStates of a unit that has nothing to stop ("absent": no unit file)
STOPPED = ("inactive", "absent", "failed")


def file_diff(kind: str, old: str | None, new: str, spec: EngineSpec | None = None) -> list[str]:
    """What changes in a file, for ``--diff``: per flag for units, per variable for env files (secret values
    masked). ``old`` is the file the host holds; a unit's systemd unit or env file rendered from ``spec`` is taken
    from there (its ``ExecStart=`` words, its settings: ``new`` is not read back); without one, a file kept as a
    host held it (a revision's), ``new`` is that host's text. Any other file (``kind="text"``: the fence's units,
    the helper) is shown line by line."""
    if kind == "unit":
        if spec is not None:
            return change_lines(unit_file_changes(old, spec.unit_text, spec.unit.exec_words()))
        return change_lines(unit_file_changes(old, new))
    if kind == "env":
        return change_lines(env_file_changes(old, spec.env_map if spec is not None else new))
    return [line for line in difflib.unified_diff([mask_line(x) for x in (old or "").splitlines()],
                                                  [mask_line(x) for x in new.splitlines()], lineterm="", n=2)
            if not line.startswith(("---", "+++"))]


@operation(is_idempotent=False)
def script(text: str, active: bool = True, then: Callable[[str], None] | None = None) -> Commands:
    """Run one script of :mod:`k3deploy.model.commands` on this host (nothing when ``active`` is false); ``then``
    is called on the control machine with the host's name once the script succeeded."""
    if not active or not text:
        host.noop("nothing to do here")
        return
    yield sh(text)
    if then is not None:
        yield FunctionCommand(then, (host.name,), {})


@operation(is_idempotent=False)
def from_control(src: str, dest: str, active: bool = True) -> Commands:
    """Copy ``src`` from the control machine to ``dest`` on this host with ``rsync`` over the host's SSH connection
    (a partial copy resumes; unchanged files are not sent again). A directory ``src`` ends with ``/``. What arrives is
    root's and writable by root only; a file (an image archive, which root loads) goes only into a directory that
    only root can write to."""
    if not active:
        host.noop("not needed on this host")
        return
    try:
        host.check_can_rsync()
    except NotImplementedError as exc:
        yield fail(f"cannot copy {src} to this host: {exc}")
        return
    yield sh(commands.copy_into(dest))
    # the files are root's and writable by root only on the host, whoever owns them on the control machine
    yield RsyncCommand(src, dest, ["-a", "--no-owner", "--no-group", "--chmod=go-w", "--partial",
                                   "--exclude=*.incomplete", "--exclude=.k3-*"])


@operation(is_idempotent=False)
def stop_units(text: str, units: list[str], active: bool = True, seen: dict[str, str] | None = None) -> Commands:
    """Run ``text``, the step's stop of ``units`` (and so of their containers,
    :func:`k3deploy.model.commands.stop_units`: those not read as stopped); nothing when ``active`` is false, the
    step stops nothing here or none of them runs. ``seen``: each unit's ActiveState as this run already read it."""
    if not active:
        host.noop("not part of a group that restarts")
        return

    def state_of(u: str) -> str:
        return seen[u] if seen is not None and u in seen else host.get_fact(UnitState, unit=u).active

    if not text or all(state_of(u) in STOPPED for u in units):
        host.noop("already stopped")
        return
    yield sh(text)


@operation(is_idempotent=False)
def start_units(text: str, active: bool = True) -> Commands:
    """Run ``text``, the step's start of its units as :class:`k3deploy.model.steps.UnitSteps` writes it
    (daemon-reload where needed, failure counters reset, enable and (re)start; a worker's first waits for its
    head's rendezvous port: :func:`k3deploy.model.commands.start_joined`); nothing when ``active`` is false or the
    step starts nothing here."""
    if not active or not text:
        host.noop("nothing to start here")
        return
    yield sh(text)


@operation(is_idempotent=False)
def smoke(endpoint: str, model: str, active: bool = True, env_file: str | None = None,
          correct: bool = False) -> Commands:
    """One short chat completion through the public endpoint, as the recipe guide's client sends it; with
    ``correct`` (``k3_correctness_probe``), the correctness probe's questions too (:mod:`k3deploy.model.correctness`):
    a wrong answer fails it, naming the prompt, the expected answer and the one given.

    A check, not a change: "No change" when the model answers. It runs when the rollout executes, after the
    engines started: change detection (and so ``--dry``) never sends a request.
    """
    if not active:
        host.noop("the smoke test is off (k3_smoke_test: false)")
        return
    if state.current_stage < StateStage.Execute:
        host.noop(f"at execution: one chat completion through {endpoint} as {model!r}")
        return
    answer = host.get_fact(SmokeAnswer, endpoint=endpoint, model=model, env_file=env_file)
    if answer.ok:
        host.noop(f"{endpoint} answered {answer.text!r}")
        logger.info(f"    [{host.name}] smoke test: {endpoint} answered {answer.text!r} as {model!r}")
        if correct:
            answers, why = host.get_fact(CorrectAnswers, endpoint=endpoint, model=model, env_file=env_file)
            lines = correctness.report(endpoint, correctness.judge(answers) if answers is not None else [],
                                       why)
            if lines:
                yield fail(f"smoke test: {lines[0]}; required the known answers (a flag, quantization or tokenizer "
                           "mode that changes what the model says?)")
            else:
                logger.info(f"    [{host.name}] smoke test: {endpoint} gave the {len(correctness.PROMPTS)} known "
                            "answers of the correctness probe")
        return
    yield fail(f"smoke test: POST {endpoint}/v1/chat/completions as {model!r} answered {answer.text[:200]!r}; "
               "required a chat completion")


@operation()
def keepalived(conf: str, content: str, unit: str, package: str, staged: str, apply: str) -> Commands:
    """keepalived on this host running ``content`` as its configuration ``conf``, its ``unit`` enabled: nothing when
    it already does. Not installed: the host's package manager installs ``package`` (pyinfra's ``server.packages``).
    The new configuration is written beside the live one (``staged``), and ``apply`` checks it with ``keepalived -t``
    (a refused one fails the host and leaves the running one), moves it into place and reloads the unit (started
    when it is not running): the step's own path and script (:class:`k3deploy.model.steps.Keepalived`)."""
    have = host.get_fact(KeepalivedState, conf=conf, unit=unit)
    data = content.encode()
    if have.binary and have.conf_sha == hashlib.sha256(data).hexdigest() and have.runs:
        host.noop(f"keepalived runs {conf} as planned")
        return
    if not have.binary:
        yield from server.packages._inner(packages=[package])
    if state.config.DIFF:
        show_change(conf, "text", have.conf_sha, None, content, None)
    yield from upload(staged, data, "644")
    yield sh(apply)


@operation(is_idempotent=False)
def vip_held(endpoint: str, vip: str, timeout: int) -> Commands:
    """A check, not a change: this host holds the virtual address and the endpoint answers ``/health`` on it,
    waited for up to ``timeout`` seconds. It runs when the rollout executes (a ``--dry`` run asks nothing)."""
    if state.current_stage < StateStage.Execute:
        host.noop(f"at execution: {vip} held here and {endpoint}/health answering")
        return
    held = host.get_fact(VipHeld, endpoint=endpoint, vip=vip, timeout=timeout)
    if held.ok:
        host.noop(held.text.splitlines()[-1] if held.text else f"{vip} held here")
        logger.info(f"    [{host.name}] {held.text.splitlines()[-1] if held.text else vip}")
        return
    yield fail(held.text.splitlines()[-1] if held.text else f"{vip} is not held by this host")
