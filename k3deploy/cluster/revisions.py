"""Numbered revisions of each engine group: what was deployed, when, and from which variables.

Every rollout that restarts a group records a new revision on each host of that group, once the group serves:
``<k3_config_dir>/revisions/<group>/<N>/`` holds the unit and env files that ran, and ``meta.json`` what they came
from (image, selection, the variables that differ from their defaults with the file that set them, the tool's
version, the time). ``<k3_config_dir>/revisions/<group>/current`` names the revision that runs. A rollback
(``k3_rollback: true`` for the previous revision, or ``k3_rollback: N``) restores revision N's files and moves
``current`` to N; the revisions themselves are never rewritten. Pure: the runtime reads and writes the files.

Example::

    >>> r = Revision(group="engine", number=3, created="2026-12-03T10:00:00Z", image="img:1", summary="gb300 x2")
    >>> Revision.from_json(r.to_json()) == r
    True
    >>> rollback_target([1, 2, 3], current=3, wanted=True)
    2
    >>> rollback_target([1, 2, 3], current=3, wanted=True, runs_current=False)   # after a failed rollout
    3
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from k3deploy.errors import K3Error


@dataclass(frozen=True)
class Revision:
    group: str
    number: int
    created: str                                   # ISO 8601, UTC
    image: str                                     # what the units run: REPO@sha256:... once a tag was resolved
    summary: str                                   # hardware x nodes, strategy, variant, features
    variables: dict[str, str] = field(default_factory=dict)   # k3_* -> "value (source)", defaults left out
    files: dict[str, str] = field(default_factory=dict)       # host:path -> sha256 of what ran
    version: str = ""
    note: str = ""                                 # e.g. "rolled back from 4"
    tag: str = ""                                  # the tag the image was resolved from (REPO:TAG), if any

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Revision:
        data: dict[str, Any] = json.loads(text)
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass
class GroupHistory:
    """The revisions of one group as its hosts report them."""

    group: str
    revisions: dict[int, Revision] = field(default_factory=dict)
    current: int | None = None

    @property
    def numbers(self) -> list[int]:
        return sorted(self.revisions)

    def next_number(self) -> int:
        return max(self.revisions, default=0) + 1


def revisions_dir(config_dir: str, group: str) -> str:
    return f"{config_dir.rstrip('/')}/revisions/{group}"


def rollback_target(numbers: list[int], current: int | None, wanted: bool | int, *, runs_current: bool = True) -> int:
    """Which revision a rollback goes to. ``True``: the one before ``current`` when the hosts run ``current``;
    the current revision itself when they run something newer that was never recorded (a rollout that failed).
    A number: that revision."""
    if not numbers:
        raise K3Error("nothing to roll back to: no revision is recorded on the hosts (k3deploy history INVENTORY)")
    if wanted is True:
        if current is not None and not runs_current:
            return current
        older = [n for n in numbers if current is None or n < current]
        if not older:
            raise K3Error(f"nothing to roll back to: revision {current} is the oldest recorded "
                          f"(revisions: {', '.join(map(str, numbers))})")
        return max(older)
    if wanted not in numbers:
        raise K3Error(f"k3_rollback={wanted}: no such revision (recorded: {', '.join(map(str, numbers))}): "
                      "pick one from k3deploy history INVENTORY")
    return int(wanted)


def runs(rev: Revision, installed: dict[str, str | None]) -> bool:
    """The hosts run exactly ``rev``: every file it recorded has the recorded sha256 (``installed``: host:path ->
    sha256 now, None when missing)."""
    return all(installed.get(key) == digest for key, digest in rev.files.items())


def revision_for(r: Any, group: str, number: int, *, created: str, variables: dict[str, str], version: str,
                 note: str = "", tag: str = "") -> Revision:
    """The record of what a group runs now (``r`` a :class:`k3deploy.cluster.rollout.Rollout`): its image is the
    exact build (``REPO@sha256:...`` once ``tag`` was resolved), so a rollback goes back to that build."""
    plan = r.plan
    units = r.group(group)
    engines = len({u.host for u in r.units if u.group != "router"})
    summary = (f"{plan.hardware} x {engines}, {plan.strategy}, variant {plan.variant}, "
               f"features {','.join(plan.features) or '-'}")
    files = {}
    for u in units:
        files[f"{u.host}:{u.unit_path}"] = sha256(u.unit_text)
        files[f"{u.host}:{u.env_path}"] = sha256(u.env_text)
    return Revision(group=group, number=number, created=created, image=plan.image, summary=summary,
                    variables=variables, files=files, version=version, note=note, tag=tag)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parse_listing(lines: list[str]) -> GroupHistory:
    """The output of :func:`k3deploy.cluster.commands.list_revisions` (``K3_CURRENT=``, then per revision
    ``K3_META=<path>`` and its JSON) -> the group's history. Unreadable entries are skipped."""
    history = GroupHistory(group="")
    chunks: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("K3_CURRENT="):
            value = line[len("K3_CURRENT="):].strip()
            history.current = int(value) if value.isdigit() else None
        elif line.startswith("K3_META="):
            chunks.append((line[len("K3_META="):], []))
        elif chunks:
            chunks[-1][1].append(line)
    for _, body in chunks:
        try:
            rev = Revision.from_json("\n".join(body))
        except (ValueError, TypeError):
            continue
        history.revisions[rev.number] = rev
        history.group = rev.group
    return history
