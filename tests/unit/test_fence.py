"""Fencing (docs/spares.md, *Fencing*): the fence record the deploy writes (who holds each rank, at an epoch), and
the engine units' start check ``k3-group-member holds`` run by the real bash against peers that answer their
records over TCP (local addresses), as the nodes' ``k3-fence-PORT.socket`` does."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3deploy.model.spares import Fence
from k3deploy.model.units import GROUP_MEMBER_SOURCE, fence_units

HELPER = str(GROUP_MEMBER_SOURCE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peer:
    """A peer's fence socket: every connection gets ``text`` and is closed."""

    def __init__(self, address: str, port: int, text: str) -> None:
        self.sock = socket.create_server((address, port))
        self.text = text
        self.asked = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.asked += 1
            with conn:
                conn.sendall(self.text.encode())

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    made: list[Peer] = []
    yield made
    for p in made:
        p.close()


def record(epoch: int, rank1: str, port_peers: dict[str, str]) -> Fence:
    return Fence(epoch, {("engine", 0): "n1", ("engine", 1): rank1}, port_peers)


def holds(tmp_path: Path, own: Fence | None, me: str, rank: int, port: int) -> subprocess.CompletedProcess[str]:
    """``k3-group-member holds`` for ``me`` at ``rank``, its record ``own``; systemctl is recorded, not run (this
    machine's systemd is not the node's: the end-to-end test sees the unit disabled on a simulated node)."""
    cfg = tmp_path / "etc"
    cfg.mkdir(exist_ok=True)
    if own is not None:
        (cfg / "fence").write_text(own.text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/systemctl\n')
    (bin_dir / "systemctl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["bash", HELPER, "holds", "k3-engine.service", "engine", str(rank), me, str(cfg),
                           str(port)], capture_output=True, text=True, env=env, timeout=30)


ADDRESSES = {"n1": "127.0.0.11", "n2": "127.0.0.12", "n3": "127.0.0.13"}


def test_a_node_whose_rank_a_spare_took_does_not_start_and_names_the_holder(tmp_path, peers):
    port = free_port()
    stale = record(100, "n2", ADDRESSES)                  # what n2 knew when it went away
    newer = record(200, "n3", ADDRESSES)                  # what the run that gave rank 1 to n3 wrote on n1 and n3
    peers += [Peer(ADDRESSES["n1"], port, newer.text()), Peer(ADDRESSES["n3"], port, newer.text())]
    out = holds(tmp_path, stale, "n2", 1, port)
    assert out.returncode == 1, out
    assert ("n2 no longer holds rank 1 of group engine: n3 holds it (fence epoch 200, the record of n1)" in out.stdout
            or "the record of n3" in out.stdout), out.stdout
    assert (tmp_path / "systemctl").read_text() == "disable --quiet k3-engine.service\n"
    assert all(p.asked == 1 for p in peers)               # every peer asked once, the node itself never


def test_a_member_that_still_holds_its_rank_starts(tmp_path, peers):
    port = free_port()
    now = record(200, "n3", ADDRESSES)
    peers += [Peer(ADDRESSES["n1"], port, now.text()), Peer(ADDRESSES["n2"], port, "")]   # n2: a spare, no record
    out = holds(tmp_path, now, "n3", 1, port)
    assert out.returncode == 0 and out.stdout == "", out
    assert holds(tmp_path, now, "n1", 0, port).returncode == 0
    assert not (tmp_path / "systemctl").exists()


def test_the_newest_record_wins_even_over_the_nodes_own(tmp_path, peers):
    port = free_port()
    # n2 took its rank back later (the spare n3 was lost in turn): n3's own record is the older one
    peers.append(Peer(ADDRESSES["n1"], port, record(300, "n2", ADDRESSES).text()))
    assert holds(tmp_path, record(200, "n3", ADDRESSES), "n3", 1, port).returncode == 1
    assert holds(tmp_path, record(200, "n3", ADDRESSES), "n2", 1, port).returncode == 0


def test_without_a_record_or_an_answer_the_node_starts_on_what_it_knows(tmp_path):
    port = free_port()                                    # nobody listens: every peer refuses at once
    assert holds(tmp_path, None, "n2", 1, port).returncode == 0     # a deployment without spares writes none
    out = holds(tmp_path, record(100, "n2", ADDRESSES), "n2", 1, port)
    assert out.returncode == 0 and "none of 2 peer(s) answered" in out.stdout, out
    out = holds(tmp_path, record(100, "n3", ADDRESSES), "n2", 1, port)
    assert out.returncode == 1 and "n3 holds it (fence epoch 100, the record of own)" in out.stdout, out


def test_the_record_service_prints_the_nodes_record(tmp_path):
    (tmp_path / "fence").write_text(record(5, "n2", ADDRESSES).text())
    out = subprocess.run(["bash", HELPER, "record", str(tmp_path)], capture_output=True, text=True, check=True)
    assert Fence.from_text(out.stdout) == record(5, "n2", ADDRESSES)
    assert subprocess.run(["bash", HELPER, "record", str(tmp_path / "none")], capture_output=True,
                          text=True).stdout == ""


def test_the_fence_units_listen_on_the_port_and_run_the_helper():
    units = fence_units(9001, "/etc/k3 deploy")
    sock = units["/etc/systemd/system/k3-fence-9001.socket"].splitlines()
    assert "ListenStream=9001" in sock and "Accept=yes" in sock
    svc = units["/etc/systemd/system/k3-fence-9001@.service"].splitlines()
    assert 'ExecStart="/usr/local/lib/k3deploy/k3-group-member" "record" "/etc/k3 deploy"' in svc
    assert "StandardOutput=socket" in svc
