"""Names, node layout and the on-disk state of simulated clusters, and the lock that serialises changes.

The state of cluster ``NAME`` lives in ``<state root>/NAME/state.json`` (state root
``/run/k3deploy/sim``, ``K3SIM_STATE`` overrides it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3sim.host import SimError, write_atomic

DEFAULT_NAME = "k3sim"
MAX_NODES = 128
STATE_VERSION = 1
NAME_RE = re.compile(r"^[a-z][a-z0-9]{1,9}$")
RESERVED_NAMES = {"all", "head", "workers", "node", "lo"}


# --------------------------------------------------------------------------- names and layout


@dataclass(frozen=True)
class NodeLayout:
    name: str
    rank: int
    ip: str
    veth: str
    dir: Path

    @property
    def netns(self) -> str:
        return self.name

    @property
    def merged(self) -> Path:
        return self.dir / "merged"


def validate_name(name: str) -> str:
    if not NAME_RE.match(name) or name in RESERVED_NAMES:
        raise SimError(
            f"bad cluster name {name!r}: use 2-10 characters, lowercase letters and digits, starting with a letter"
        )
    return name


def layout(name: str, subnet: str, nodes: int) -> list[NodeLayout]:
    d = state_root() / name
    return [
        NodeLayout(f"{name}-node{i}", i - 1, f"{subnet}.{10 + i}", f"{name}-v{i}", d / f"{name}-node{i}")
        for i in range(1, nodes + 1)
    ]


# --------------------------------------------------------------------------- state files


def state_root() -> Path:
    return Path(os.environ.get("K3SIM_STATE", "/run/k3deploy/sim"))


def state_dir(name: str) -> Path:
    return state_root() / name


def load_state(name: str) -> dict[str, Any] | None:
    f = state_dir(name) / "state.json"
    try:
        state: dict[str, Any] = json.loads(f.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"name": name, "nodes": [], "phase": "corrupt"}
    return state


def save_state(state: dict[str, Any]) -> None:
    write_atomic(state_dir(state["name"]) / "state.json", json.dumps(state, indent=2) + "\n", 0o600)


def list_names() -> list[str]:
    root = state_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "state.json").exists())


# --------------------------------------------------------------------------- lock


_LOCK_DEPTH: dict[int, int] = {}


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """One simulation change at a time on this host (flock on the state directory itself).

    Re-entrant within one process (a nested call does not wait for itself); another process holding the
    lock for longer than ``K3SIM_LOCK_TIMEOUT`` seconds (default 600) is an error, not a hang.
    """
    if _LOCK_DEPTH.get(os.getpid(), 0):
        _LOCK_DEPTH[os.getpid()] += 1
        try:
            yield
        finally:
            _LOCK_DEPTH[os.getpid()] -= 1
        return
    root = state_root()
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + float(os.environ.get("K3SIM_LOCK_TIMEOUT", "600"))
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SimError(f"another k3deploy sim command holds {root} (cluster {name!r} waited too long): "
                                   "wait for it to finish, or stop it") from None
                time.sleep(0.1)
        _LOCK_DEPTH[os.getpid()] = 1
        try:
            yield
        finally:
            _LOCK_DEPTH[os.getpid()] = 0
    finally:
        os.close(fd)
