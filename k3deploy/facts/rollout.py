"""Facts the rollout reads: unit state, container image digests, weights present in the cache.

Example::

    >>> host.get_fact(UnitState, unit="k3-engine.service")      # doctest: +SKIP
    UnitStatus(active='active', sub='running', restarts=0, result='success')
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api.facts import FactBase

from k3deploy.facts.base import EXIT_MARK, Jsonable, K3Fact
from k3deploy.model import correctness
from k3deploy.model.commands import (
    PEERS_UNIT,
    VERIFIED,
    check_snapshot,
    correctness_probe,
    list_revisions,
    model_dir,
    smoke_test,
    wait_vip,
)
from k3deploy.model.compilecache import COMPLETE
from k3deploy.model.images import LocalImage, local_command, parse_local, resolve_command
from k3deploy.model.observed import FileMeta, Installed
from k3deploy.model.revisions import GroupHistory, parse_listing


@dataclass(frozen=True)
class UnitStatus:
    active: str          # active | inactive | failed | activating | deactivating | absent
    sub: str
    restarts: int
    result: str

    @property
    def running(self) -> bool:
        return self.active == "active"


def parse_unit_show(lines: list[str]) -> UnitStatus:
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    load = values.get("LoadState", "")
    active = "absent" if load == "not-found" else values.get("ActiveState", "unknown")
    return UnitStatus(active, values.get("SubState", ""), int(values.get("NRestarts") or 0), values.get("Result", ""))


class UnitState(FactBase[UnitStatus]):
    """``systemctl show`` of one unit: active state, sub state, restart count, result."""

    def requires_command(self, unit: str) -> str:
        return "systemctl"

    def command(self, unit: str) -> str:
        return (f"systemctl show --property=LoadState,ActiveState,SubState,NRestarts,Result "
                f"{shlex.quote(unit)} 2>/dev/null || true")

    def process(self, output: list[str]) -> UnitStatus:
        return parse_unit_show(output)

    @staticmethod
    def default() -> UnitStatus:
        return UnitStatus("absent", "", 0, "")


class ImageDigest(FactBase[LocalImage]):
    """What a node holds of an image's repository: the repo digest (``repo@sha256:...``) of what the reference names
    locally (None when it is not present) and the digest of every local build of the repository.

        >>> ImageDigest().process(["K3_REF=r@sha256:" + "a" * 64, "K3_HAVE=sha256:" + "a" * 64]).ref_digest[:10]
        'r@sha256:a'
    """

    def requires_command(self, image: str, docker: str = "docker") -> str:
        return docker

    def command(self, image: str, docker: str = "docker") -> str:
        return local_command(docker, image)

    def process(self, output: list[str]) -> LocalImage:
        return parse_local(output)

    @staticmethod
    def default() -> LocalImage:
        return LocalImage()


class RegistryDigest(FactBase[list[str]]):
    """The registry's answer for an image's tag (``docker buildx imagetools inspect``, a manifest HEAD: nothing is
    pulled), raw: :func:`k3deploy.model.images.resolution` reads it."""

    def command(self, image: str, docker: str = "docker") -> str:
        return resolve_command(docker, image)

    def process(self, output: list[str]) -> list[str]:
        return list(output)

    @staticmethod
    def default() -> list[str]:
        return []


class Executable(FactBase[bool]):
    """Whether ``path`` is an executable file on the host.

        >>> Executable().process(["yes"]), Executable().process(["no"])
        (True, False)
    """

    def command(self, path: str) -> str:
        return f"if [ -f {shlex.quote(path)} ] && [ -x {shlex.quote(path)} ]; then echo yes; else echo no; fi"

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"

    @staticmethod
    def default() -> bool:
        return False


class CompileCaches(FactBase["tuple[str, ...]"]):
    """The compile cache keys whose directories under ``root`` (``<k3_model_cache>/k3-compile``) are marked whole
    (:data:`k3deploy.model.compilecache.COMPLETE`: an engine served from them, or a whole copy came in).

        >>> CompileCaches().process(["1bbbac2cd5120513", "", "ab12"])
        ('1bbbac2cd5120513', 'ab12')
    """

    def command(self, root: str) -> str:
        return (f'for d in {shlex.quote(root.rstrip("/"))}/*/; do [ -f "$d{COMPLETE}" ] && basename "$d"; done; '
                "true")

    def process(self, output: list[str]) -> tuple[str, ...]:
        return tuple(line.strip() for line in output if line.strip())

    @staticmethod
    def default() -> tuple[str, ...]:
        return ()


class FileHash(FactBase["str | None"]):
    """The sha256 of one file, None when it is not there (a plain ``sha256sum``, so it goes in a batch).

        >>> FileHash().process(["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  /x"])
        '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'
    """

    def requires_command(self, path: str) -> str:
        return "sha256sum"

    def command(self, path: str) -> str:
        return f"sha256sum {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        word = output[0].split()[0] if output and output[0].split() else ""
        return word if len(word) == 64 else None

    @staticmethod
    def default() -> str | None:
        return None


@dataclass(frozen=True)
class WeightsStatus:
    """What a node's Hugging Face cache holds of a model.

    ``complete``: a snapshot whose index names no missing shard; ``verified``: its files passed
    :func:`~k3deploy.model.commands.verify_weights` and none changed since (``changed`` lists those that did).
    """

    revision: str | None = None
    files: int = 0
    missing: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    partial: int = 0            # interrupted downloads (``*.incomplete`` blobs)
    stamped: bool = False

    @property
    def complete(self) -> bool:
        return self.revision is not None and self.files > 0 and not self.missing

    @property
    def verified(self) -> bool:
        return self.complete and self.stamped and not self.changed

    def describe(self) -> str:
        if self.revision is None:
            return "no snapshot" + (f" ({self.partial} partial download{'s' if self.partial != 1 else ''})"
                                    if self.partial else "")
        if self.missing:
            return f"{len(self.missing)} shard{'s' if len(self.missing) != 1 else ''} missing ({self.missing[0]}, ...)"
        if not self.stamped:
            return "complete, not verified"
        if self.changed:
            return f"{len(self.changed)} file{'s' if len(self.changed) != 1 else ''} changed since verified"
        return f"verified ({self.files} files)"


class WeightsState(FactBase[WeightsStatus]):
    """The model's snapshot in the cache under ``cache``: revision, files, shards of the index that are missing,
    files changed since the last verification, interrupted downloads.

    Cheap (it runs on every read of a host): a file is trusted when it is not newer than the mark of the last
    verification, so a byte changed with its time stamp kept is not seen here; every file is hashed again before an
    engine starts (:func:`~k3deploy.model.commands.verify_before_start`) and by ``k3deploy verify``
    (:class:`WeightsHashes`).

    >>> WeightsState().process(["K3_REV=abc", "K3_FILES=5", "K3_MISSING=model-00002-of-00002.safetensors",
    ...                          "K3_STAMP=1", "K3_PARTIAL=1"]).describe()
    '1 shard missing (model-00002-of-00002.safetensors, ...)'
    >>> WeightsState().process(["K3_REV=abc", "K3_FILES=5", "K3_STAMP=1"]).verified
    True
    """

    @staticmethod
    def default() -> WeightsStatus:
        return WeightsStatus()

    def command(self, cache: str, model: str) -> str:
        d = shlex.quote(model_dir(cache, model))
        # the shell's own glob and parameter expansion where they do (every process counts: it runs on every read)
        return (f'd={d}; set -- "$d"/blobs/*.incomplete; [ -e "$1" ] || shift $#; echo "K3_PARTIAL=$#"; '
                f'rev=$(cat "$d/refs/main" 2>/dev/null) && cd "$d/snapshots/$rev" 2>/dev/null && {{ '
                'echo "K3_REV=$rev"; echo "K3_FILES=$(find . ! -type d | wc -l)"; '
                "[ -f model.safetensors.index.json ] && for f in $(grep -o '\"[^\"]*[.]safetensors\"' "
                "model.safetensors.index.json | sort -u); do f=${f#\\\"}; f=${f%\\\"}; "
                "[ -e \"$f\" ] || echo \"K3_MISSING=$f\"; "
                f'done; [ -f "$d/{VERIFIED}" ] && echo K3_STAMP=1 && find -L . -type f -newer "$d/{VERIFIED}" | '
                "sed 's/^/K3_CHANGED=/'; }; true")

    def process(self, output: list[str]) -> WeightsStatus:
        rev, files, partial, stamped = None, 0, 0, False
        missing: list[str] = []
        changed: list[str] = []
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "K3_REV" and value:
                rev = value
            elif key == "K3_FILES":
                files = int(value or 0)
            elif key == "K3_PARTIAL":
                partial = int(value or 0)
            elif key == "K3_MISSING":
                missing.append(value)
            elif key == "K3_CHANGED":
                changed.append(value.removeprefix("./"))
            elif key == "K3_STAMP":
                stamped = True
        return WeightsStatus(rev, files, tuple(missing), tuple(changed), partial, stamped)


@dataclass(frozen=True)
class BadFile:
    """A file of the snapshot whose content is not what its blob's name says (``kind``: ``sha256``, ``git-blob``,
    ``missing``: its blob is gone, ``unnamed``: its blob is named by no hash; ``observed``: what it hashes to)."""

    path: str
    kind: str
    observed: str
    blob: str

    def describe(self) -> str:
        name = self.blob.rsplit("/", 1)[-1]
        if self.kind == "missing":
            return f"{self.path}: its blob {name} is missing"
        if self.kind == "unnamed":
            return f"{self.path}: not named by a hash ({name}): it cannot be verified"
        return f"{self.path}: {self.kind} {self.observed}, but its blob is named {name}"


@dataclass(frozen=True)
class WeightsCheck:
    """Every file of a node's snapshot hashed against its blob's name (:class:`WeightsHashes`)."""

    files: int = 0
    bytes: int = 0
    seconds: float | None = None
    bad: tuple[BadFile, ...] = ()
    missing: tuple[str, ...] = ()      # shards the index names that are not there ("(no snapshot)": none at all)

    @property
    def ok(self) -> bool:
        return self.files > 0 and not self.bad and not self.missing

    def problems(self) -> list[str]:
        """One line per bad or missing file."""
        return [*(f"missing shard {m}" if not m.startswith("(") else m.strip("()") for m in self.missing),
                *(b.describe() for b in self.bad)]


class WeightsHashes(FactBase[WeightsCheck]):
    """Hash every file of the model's snapshot in the cache under ``cache`` against its blob's name, whatever its
    time stamps (:func:`~k3deploy.model.commands.check_snapshot`; read-only: it writes nothing on the node). It
    reads the whole checkpoint: seconds to minutes per node.

    >>> c = WeightsHashes().process(["K3_BAD=sha256 " + "1" * 64 + " /c/blobs/" + "2" * 64 + " m-1.safetensors",
    ...                               "K3_FILES=3", "K3_BYTES=10", "K3_SECONDS=0.02"])
    >>> c.ok, c.files, c.problems()[0][:28]
    (False, 3, 'm-1.safetensors: sha256 1111')
    """

    def command(self, cache: str, model: str) -> str:
        return f"{check_snapshot(cache, model)} 2>/dev/null; true"

    def process(self, output: list[str]) -> WeightsCheck:
        files = size = 0
        seconds: float | None = None
        bad: list[BadFile] = []
        missing: list[str] = []
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "K3_BAD":
                kind, observed, blob, path = (value.split(" ", 3) + ["", "", ""])[:4]
                bad.append(BadFile(path, kind, observed, blob))
            elif key == "K3_MISSING":
                missing.append(value)
            elif key == "K3_FILES":
                files = int(value or 0)
            elif key == "K3_BYTES":
                size = int(value or 0)
            elif key == "K3_SECONDS":
                seconds = float(value or 0)
        return WeightsCheck(files, size, seconds, tuple(bad), tuple(missing))

    @staticmethod
    def default() -> WeightsCheck:
        return WeightsCheck(missing=("(no answer)",))


@dataclass(frozen=True)
class StageDaemon(Jsonable):
    """The stage's rsync daemon unit (:data:`~k3deploy.model.commands.PEERS_UNIT`) as a node has it: ``state``
    is its ActiveState, "" when it is not loaded (no deploy's stage is serving on the node)."""

    state: str = ""
    since: str = ""

    @property
    def running(self) -> bool:
        return self.state in ("active", "activating", "reloading", "deactivating")


class StagePeers(K3Fact[StageDaemon]):
    """Whether the stage's read-only rsync daemon (a transient unit, root, open to the cluster's engine hosts) runs on
    the node: a stage runs it only while it lasts, so one found by a read outside a stage was left behind by a run
    that was killed. No process runs unless the transient unit is loaded (its unit file under ``/run``).

    >>> StagePeers().process(["ActiveState=active", "ActiveEnterTimestamp=Mon 2026-01-05 10:00:00 UTC", "K3_EXIT=0"])
    StageDaemon(state='active', since='Mon 2026-01-05 10:00:00 UTC')
    >>> StagePeers().process(["K3_EXIT=0"]).running
    False
    """

    tool = "systemctl"
    hint = "the stage's daemon is a systemd unit"
    shown_command = f"systemctl show -p ActiveState -p ActiveEnterTimestamp {PEERS_UNIT}"

    def command(self) -> str:
        return (f"if [ -e /run/systemd/transient/{PEERS_UNIT}.service ]; then {self.shown_command} 2>&1; fi; "
                f"echo {EXIT_MARK}0")

    def parse(self, lines: list[str]) -> StageDaemon:
        values = dict(line.strip().split("=", 1) for line in lines if "=" in line)
        return StageDaemon(values.get("ActiveState", ""), values.get("ActiveEnterTimestamp", ""))


@dataclass(frozen=True)
class Answer:
    ok: bool
    text: str


SMOKE_MARK = "K3_SMOKE_RC="


class SmokeAnswer(FactBase[Answer]):
    """One short chat completion through ``endpoint`` as ``model``, sent from this host by the smoke-test script
    (:func:`k3deploy.model.commands.smoke_test`): the answer, or what came back instead."""

    def command(self, endpoint: str, model: str, env_file: str | None = None) -> str:
        return f"( {smoke_test(endpoint, model, env_file)} ) 2>&1; echo {SMOKE_MARK}$?"

    def process(self, output: list[str]) -> Answer:
        rc = output[-1][len(SMOKE_MARK):] if output and output[-1].startswith(SMOKE_MARK) else "?"
        return Answer(rc == "0", "\n".join(output[:-1]).strip())


class CorrectAnswers(FactBase[tuple[list[correctness.Answer] | None, str]]):
    """The correctness probe's questions asked through ``endpoint`` as ``model`` from this host
    (:func:`k3deploy.model.commands.correctness_probe`): the answers, or None and why."""

    def command(self, endpoint: str, model: str, env_file: str | None = None) -> str:
        return f"( {correctness_probe(endpoint, model, env_file=env_file)} ) 2>&1; true"

    def process(self, output: list[str]) -> tuple[list[correctness.Answer] | None, str]:
        return correctness.parse("\n".join(output))


VIP_MARK = "K3_VIP_RC="


class VipHeld(FactBase[Answer]):
    """Whether this host holds the virtual address ``vip`` and ``endpoint`` answers ``/health`` on it, waited for
    up to ``timeout`` seconds (:func:`k3deploy.model.commands.wait_vip`): what it said."""

    def command(self, endpoint: str, vip: str, timeout: int) -> str:
        return f"( {wait_vip(endpoint, vip, timeout)} ) 2>&1; echo {VIP_MARK}$?"

    def process(self, output: list[str]) -> Answer:
        rc = output[-1][len(VIP_MARK):] if output and output[-1].startswith(VIP_MARK) else "?"
        return Answer(rc == "0", "\n".join(output[:-1]).strip())


@dataclass(frozen=True)
class KeepalivedStatus:
    """keepalived on one host: its binary (None: not installed), the sha256 of its configuration (None: none), and
    its unit's active and enabled states."""

    binary: str | None
    conf_sha: str | None
    active: str
    enabled: str

    @property
    def runs(self) -> bool:
        return self.active == "active" and self.enabled == "enabled"


class KeepalivedState(FactBase[KeepalivedStatus]):
    """keepalived on this host, in one command: installed, its configuration's sha256, the unit's states.

        >>> KeepalivedState().process(["K3_KA_BIN=/usr/sbin/keepalived", "K3_KA_SHA=", "K3_KA_ACTIVE=inactive",
        ...                            "K3_KA_ENABLED=disabled"])
        KeepalivedStatus(binary='/usr/sbin/keepalived', conf_sha=None, active='inactive', enabled='disabled')
    """

    def command(self, conf: str, unit: str) -> str:
        c, u = shlex.quote(conf), shlex.quote(unit)
        return (f"echo K3_KA_BIN=$(command -v keepalived); "
                f"echo K3_KA_SHA=$(sha256sum {c} 2>/dev/null | cut -d' ' -f1); "
                f"echo K3_KA_ACTIVE=$(systemctl is-active {u} 2>/dev/null); "
                f"echo K3_KA_ENABLED=$(systemctl is-enabled {u} 2>/dev/null)")

    def process(self, output: list[str]) -> KeepalivedStatus:
        values = dict(line.split("=", 1) for line in output if line.startswith("K3_KA_") and "=" in line)
        sha = values.get("K3_KA_SHA", "").strip()
        return KeepalivedStatus(values.get("K3_KA_BIN", "").strip() or None, sha if len(sha) == 64 else None,
                                values.get("K3_KA_ACTIVE", "").strip() or "unknown",
                                values.get("K3_KA_ENABLED", "").strip() or "unknown")


class Revisions(FactBase[GroupHistory]):
    """The recorded revisions of one group on this host: which one runs, and each one's ``meta.json``."""

    def command(self, directory: str) -> str:
        return list_revisions(directory)

    def process(self, output: list[str]) -> GroupHistory:
        return parse_listing(output)

    @staticmethod
    def default() -> GroupHistory:
        return GroupHistory(group="")


FILE_MARK, META_MARK, BODY_MARK, END_MARK = "K3_FILE=", "K3_META=", "K3_BODY", "K3_END"


def stat_line(q: str) -> str:
    """Shell printing ``K3_META=UID GID MODE`` of the (quoted) path ``q`` itself (a symlink is not followed)."""
    return f"echo {META_MARK}$(stat -c '%u %g %a' {q} 2>/dev/null || stat -f '%u %g %Lp' {q})"


def _file_part(q: str, body: bool) -> str:
    read = f"sha256sum {q} 2>/dev/null || shasum -a 256 {q}; {stat_line(q)}"
    if body:
        read += f"; echo {BODY_MARK}; cat {q}; echo; echo {END_MARK}"
    return f"echo {FILE_MARK}{q}; if [ -f {q} ]; then {read}; fi"


@dataclass(frozen=True)
class FileState:
    """One file as its host has it: sha256 and owner and mode (both None when there is no file)."""

    sha: str | None = None
    meta: FileMeta | None = None


def _files(output: list[str]) -> list[tuple[str | None, str | None, FileMeta | None]]:
    """(sha256, text, owner and mode) of each ``K3_FILE=`` section, in order (text None where not read)."""
    files: list[tuple[str | None, str | None, FileMeta | None]] = []
    i = 0
    while i < len(output):
        if output[i].startswith(FILE_MARK):
            sha = text = meta = None
            j = i + 1
            if j < len(output) and not output[j].startswith((FILE_MARK, META_MARK)) and output[j] != BODY_MARK:
                sha = next(iter(output[j].split()), "").lstrip("\\") or None   # "<sha256>  <path>"
                j += 1
            if j < len(output) and output[j].startswith(META_MARK):
                meta = FileMeta.parse(output[j][len(META_MARK):])
                j += 1
            if sha is not None and j < len(output) and output[j] == BODY_MARK:
                end = output.index(END_MARK, j + 1)
                body = output[j + 1:end]
                if body and body[-1] == "":
                    body = body[:-1]  # the echo after cat: the file ended with a newline
                text = "".join(f"{ln}\n" for ln in body)  # for diffs; the sha256 decides what changed
                j = end + 1
            files.append((sha, text, meta))
            i = j
            continue
        i += 1
    return files


class FileOnHost(FactBase[FileState]):
    """The sha256, owner and mode of one file, in one command (what :func:`~k3deploy.runtime.operations.managed_file`
    compares).

        >>> FileOnHost().process(["K3_FILE=/x", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  /x",
        ...                       "K3_META=1000 1000 644"]).meta
        FileMeta(uid=1000, gid=1000, mode='644')
        >>> FileOnHost().process(["K3_FILE=/x"])
        FileState(sha=None, meta=None)
    """

    def command(self, path: str) -> str:
        return _file_part(shlex.quote(path), body=False)

    def process(self, output: list[str]) -> FileState:
        sha, _, meta = (_files(output) + [(None, None, None)])[0]
        return FileState(sha if sha is not None and len(sha) == 64 else None, meta)

    @staticmethod
    def default() -> FileState:
        return FileState()


class UnitOnHost(FactBase[Installed]):
    """One unit as its host has it, in one command: its systemd state, its unit and env files (sha256, owner and
    mode, text) and, with ``token_path`` (an engine unit's host), the owner and mode of the token file there."""

    def command(self, unit: str, unit_path: str, env_path: str, token_path: str | None = None) -> str:
        parts = [f"systemctl show --property=LoadState,ActiveState,SubState,NRestarts,Result "
                 f"{shlex.quote(unit)} 2>/dev/null || true"]
        parts += [_file_part(shlex.quote(path), body=True) for path in (unit_path, env_path)]
        if token_path:
            parts.append(_file_part(shlex.quote(token_path), body=False))
        return "; ".join(parts)

    def process(self, output: list[str]) -> Installed:
        state = parse_unit_show([line for line in output if "=" in line
                                 and not line.startswith((FILE_MARK, META_MARK))][:5])
        files = _files(output)
        (unit_sha, unit_text, unit_meta), (env_sha, env_text, env_meta), (_, _, token_meta) = \
            (files + [(None, None, None)] * 3)[:3]
        return Installed(unit_text=unit_text, env_text=env_text, unit_sha=unit_sha, env_sha=env_sha,
                         active=state.active, restarts=state.restarts, unit_meta=unit_meta, env_meta=env_meta,
                         token_meta=token_meta)

    @staticmethod
    def default() -> Installed:
        return Installed()
