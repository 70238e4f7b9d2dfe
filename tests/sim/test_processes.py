"""cgroup walking in the simulated cluster's process control: the tree changes while it is read."""

from __future__ import annotations

import os
from pathlib import Path

from k3sim import processes


def _tree(tmp_path: Path) -> Path:
    cg = tmp_path / "node1"
    (cg / "payload" / "system.slice" / "getty.slice").mkdir(parents=True)
    (cg / "cgroup.procs").write_text("11\n")
    (cg / "payload" / "cgroup.procs").write_text("21\n22\n")
    (cg / "payload" / "system.slice" / "getty.slice" / "cgroup.procs").write_text("31\n")
    return cg


def test_cgroup_pids_reads_every_level(tmp_path):
    assert sorted(processes.cgroup_pids(_tree(tmp_path))) == [11, 21, 22, 31]
    assert processes.cgroup_pids(tmp_path / "gone") == []


def test_cgroup_pids_skips_a_cgroup_removed_while_walking(tmp_path, monkeypatch):
    cg = _tree(tmp_path)
    vanishing = str(cg / "payload" / "system.slice")
    real = os.scandir

    def scandir(path="."):
        if str(path) == vanishing:  # systemd in the node removed it between the parent's listing and this one
            raise FileNotFoundError(2, "No such file or directory", vanishing)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert sorted(processes.cgroup_pids(cg)) == [11, 21, 22]


def test_remove_cgroup_tree_removes_children_first(tmp_path):
    cg = tmp_path / "node1"
    (cg / "a" / "b").mkdir(parents=True)
    (cg / "c").mkdir()
    assert processes.remove_cgroup_tree(cg) is True
    assert not cg.exists()
