"""What a host has now, as read by the runtime: per unit its unit and env file and its systemd state. Pure data.

    >>> Installed(active="active").running, Installed().running
    (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Installed:
    """What one unit looks like on its host now."""

    unit_text: str | None = None
    env_text: str | None = None
    unit_sha: str | None = None
    env_sha: str | None = None
    active: str = "absent"
    restarts: int = 0
    answers: bool | None = None     # a unit that serves HTTP: /health answered 200 (None: not asked)

    @property
    def running(self) -> bool:
        return self.active == "active"
