"""Facts the rollout reads: unit state, container image digests, weights present in the cache.

Example::

    >>> host.get_fact(UnitState, unit="k3-engine.service")      # doctest: +SKIP
    UnitStatus(active='active', sub='running', restarts=0, result='success')
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase

from k3deploy.cluster.commands import list_revisions, smoke_test, weights_present
from k3deploy.cluster.observed import Installed
from k3deploy.cluster.revisions import GroupHistory, parse_listing


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


class ImageDigest(FactBase[str | None]):
    """The repo digest (``repo@sha256:...``) of a local image, or None when the image is not present."""

    def requires_command(self, image: str, docker: str = "docker") -> str:
        return docker

    def command(self, image: str, docker: str = "docker") -> str:
        fmt = shlex.quote("{{index .RepoDigests 0}}")
        return f"{shlex.quote(docker)} image inspect --format {fmt} {shlex.quote(image)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        line = output[0].strip() if output else ""
        return line or None


class WeightsPresent(FactBase[bool]):
    """True when the Hugging Face cache under ``cache`` holds a snapshot of ``model``."""

    def command(self, cache: str, model: str) -> str:
        return f"if {weights_present(cache, model)}; then echo yes; else echo no; fi"

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[-1].strip() == "yes"


@dataclass(frozen=True)
class Answer:
    ok: bool
    text: str


SMOKE_MARK = "K3_SMOKE_RC="


class SmokeAnswer(FactBase[Answer]):
    """One short chat completion through ``endpoint`` as ``model``, sent from this host by the smoke-test script
    (:func:`k3deploy.cluster.commands.smoke_test`): the answer, or what came back instead."""

    def command(self, endpoint: str, model: str) -> str:
        return f"( {smoke_test(endpoint, model)} ) 2>&1; echo {SMOKE_MARK}$?"

    def process(self, output: list[str]) -> Answer:
        rc = output[-1][len(SMOKE_MARK):] if output and output[-1].startswith(SMOKE_MARK) else "?"
        return Answer(rc == "0", "\n".join(output[:-1]).strip())


class Revisions(FactBase[GroupHistory]):
    """The recorded revisions of one group on this host: which one runs, and each one's ``meta.json``."""

    def command(self, directory: str) -> str:
        return list_revisions(directory)

    def process(self, output: list[str]) -> GroupHistory:
        return parse_listing(output)

    @staticmethod
    def default() -> GroupHistory:
        return GroupHistory(group="")


FILE_MARK, BODY_MARK, END_MARK = "K3_FILE=", "K3_BODY", "K3_END"


class UnitOnHost(FactBase[Installed]):
    """One unit as its host has it, in one command: its systemd state and its unit and env files (sha256 and
    text)."""

    def command(self, unit: str, unit_path: str, env_path: str) -> str:
        parts = [f"systemctl show --property=LoadState,ActiveState,SubState,NRestarts,Result "
                 f"{shlex.quote(unit)} 2>/dev/null || true"]
        for path in (unit_path, env_path):
            q = shlex.quote(path)
            parts.append(f"echo {FILE_MARK}{q}; if [ -f {q} ]; then (sha256sum {q} 2>/dev/null || shasum -a 256 {q})"
                         f" | cut -d' ' -f1; echo {BODY_MARK}; cat {q}; echo; echo {END_MARK}; fi")
        return "; ".join(parts)

    def process(self, output: list[str]) -> Installed:
        state = parse_unit_show([line for line in output if "=" in line and not line.startswith(FILE_MARK)][:5])
        files: list[tuple[str | None, str | None]] = []
        i = 0
        while i < len(output):
            if output[i].startswith(FILE_MARK):
                sha = text = None
                if i + 2 < len(output) and output[i + 2] == BODY_MARK:
                    sha = output[i + 1].strip() or None
                    end = output.index(END_MARK, i + 3)
                    body = output[i + 3:end]
                    if body and body[-1] == "":
                        body = body[:-1]  # the echo after cat: the file ended with a newline
                    text = "".join(f"{ln}\n" for ln in body)  # for diffs; the sha256 decides what changed
                    i = end
                files.append((sha, text))
            i += 1
        (unit_sha, unit_text), (env_sha, env_text) = (files + [(None, None)] * 2)[:2]
        return Installed(unit_text=unit_text, env_text=env_text, unit_sha=unit_sha, env_sha=env_sha,
                         active=state.active, restarts=state.restarts)

    @staticmethod
    def default() -> Installed:
        return Installed()
