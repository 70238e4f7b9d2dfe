"""What a host has now, as read by the runtime: per unit its unit and env file (content, owner and mode) and its
systemd state. Pure data, and the owner and mode every managed file must have.

    >>> Installed(active="active").running, Installed().running
    (True, False)
    >>> FileMeta(1000, 0, "644").drift(ENV_MODE)
    'mode 0644 owner 1000, required 0600 root'
    >>> FileMeta(0, 0, "600").drift(ENV_MODE) is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass

#: the mode of each kind of managed file; every one is owned by root (uid and gid 0)
UNIT_MODE, ENV_MODE, TOKEN_MODE = "644", "600", "600"


def token_path(config_dir: str) -> str:
    """Where the engine nodes keep the Hugging Face token (``k3_hf_token_file`` copied, 0600 root)."""
    return config_dir.rstrip("/") + "/hf-token"


@dataclass(frozen=True)
class FileMeta:
    """Owner, group and permission bits (octal, as ``stat -c %a`` prints them) of one file on a host."""

    uid: int
    gid: int
    mode: str

    def drift(self, mode: str, owned: bool = False) -> str | None:
        """How the file differs from root-owned with ``mode`` (None: it does not). ``owned``: the file is a user's
        (a Slurm job's, ``k3_slurm_user``), whose uid the control machine does not know: only its mode is compared.

            >>> job = FileMeta(2901, 2901, "644")
            >>> FileMeta(2901, 2901, "600").drift("600", owned=True), job.drift("600", owned=True)
            (None, 'mode 0644 owner 2901 group 2901, required 0600 its user')
        """
        if owned and int(self.mode, 8) == int(mode, 8):
            return None
        if not owned and self.uid == 0 and self.gid == 0 and int(self.mode, 8) == int(mode, 8):
            return None
        if owned:
            return (f"mode {int(self.mode, 8):04o} owner {self.uid} group {self.gid}, required {int(mode, 8):04o} "
                    "its user")
        owner = f"owner {self.uid}" + (f" group {self.gid}" if self.gid != 0 else "")
        return f"mode {int(self.mode, 8):04o} {owner}, required {int(mode, 8):04o} root"

    @staticmethod
    def parse(line: str) -> FileMeta | None:
        """``"UID GID MODE"`` (what :data:`STAT_FORMAT` prints after its mark) -> FileMeta; None when unreadable.

            >>> FileMeta.parse("0 0 600")
            FileMeta(uid=0, gid=0, mode='600')
        """
        parts = line.split()
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            return None
        return FileMeta(int(parts[0]), int(parts[1]), parts[2])


@dataclass(frozen=True)
class Installed:
    """What one unit looks like on its host now."""

    unit_text: str | None = None
    env_text: str | None = None
    unit_sha: str | None = None
    env_sha: str | None = None
    active: str = "absent"
    restarts: int = 0
    answers: bool | None = None     # a unit that serves HTTP: /health answered 200 (None: not asked)
    unit_meta: FileMeta | None = None   # owner and mode of the unit file (None: no file, or not read)
    env_meta: FileMeta | None = None
    token_meta: FileMeta | None = None  # of the host's token file, read with an engine unit (None: none there)

    @property
    def running(self) -> bool:
        return self.active == "active"
