"""The spare records a node keeps (:mod:`k3deploy.model.spares`): its copy of the substitutions in effect, its
quarantine record, the events it was released from and its fence record, read in one command (it goes in the host's
facts batch).

    >>> SpareRecords().process(["K3_SPARE_FILE=quarantine", '{"reason": "XID 79"}', ""])
    SpareFiles(substitutions=None, quarantine='{"reason": "XID 79"}\\n', released=None, fence=None)
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api.facts import FactBase

from k3deploy.model.commands import SPARE_MARK, spare_records_read
from k3deploy.model.spares import FENCE_FILE, QUARANTINE_FILE, RELEASED_FILE, SUBSTITUTIONS_FILE


@dataclass(frozen=True)
class SpareFiles:
    """The text of each record on the node (None: no such file)."""

    substitutions: str | None = None
    quarantine: str | None = None
    released: str | None = None
    fence: str | None = None


_FIELDS = {SUBSTITUTIONS_FILE: "substitutions", QUARANTINE_FILE: "quarantine", RELEASED_FILE: "released",
           FENCE_FILE: "fence"}


class SpareRecords(FactBase[SpareFiles]):
    """The node's ``substitutions.json``, ``quarantine``, ``quarantine.released`` and ``fence`` in
    ``k3_config_dir``."""

    def command(self, config_dir: str) -> str:
        return spare_records_read(config_dir, list(_FIELDS))

    def process(self, output: list[str]) -> SpareFiles:
        texts: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in output:
            if line.startswith(SPARE_MARK) and line[len(SPARE_MARK):] in _FIELDS:
                current = texts.setdefault(_FIELDS[line[len(SPARE_MARK):]], [])
            elif current is not None:
                current.append(line)
        # each file is followed by one empty line of the command's own (a file's last newline may be missing)
        return SpareFiles(**{k: "\n".join(v[:-1] if v and v[-1] == "" else v) + "\n" for k, v in texts.items()})

    @staticmethod
    def default() -> SpareFiles:
        return SpareFiles()
