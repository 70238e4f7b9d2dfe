"""The deployment lock's scripts under a real sh, and how a holder is judged stale."""

from __future__ import annotations

import os
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from helpers import present
from k3deploy.model.commands import LOCK_MARK, lock_read, lock_release, lock_take
from k3deploy.runtime.lock import LockRecord, held_summary, stale, this_run
from k3deploy.runtime.phases import dry_run


def sh(script: str) -> list[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()


def test_of_many_runs_taking_it_at_once_exactly_one_holds_the_lock(tmp_path):
    d = str(tmp_path / "k3")
    runs = [replace(this_run("inv.py"), run=f"run{i:02d}") for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda r: sh(lock_take(d, r.line())), runs))
    taken = [r for r, out in zip(runs, answers, strict=True) if out[0] == f"{LOCK_MARK}taken"]
    assert len(taken) == 1
    holder = LockRecord.parse("\n".join(sh(lock_read(d))))
    assert holder == taken[0]
    for r, out in zip(runs, answers, strict=True):
        if r is not taken[0]:   # each refused run is told who holds it
            assert out[0] == f"{LOCK_MARK}held" and LockRecord.parse("\n".join(out[1:])) == holder
    assert oct(os.stat(tmp_path / "k3" / "deploy.lock").st_mode & 0o777) == "0o600"
    assert not [p for p in os.listdir(d) if p != "deploy.lock"]   # no private file left behind


def test_only_the_holder_releases_and_an_emptied_config_dir_goes(tmp_path):
    d = str(tmp_path / "k3")
    mine, other = this_run("inv.py"), replace(this_run("inv.py"), run="someoneelse")
    sh(lock_take(d, mine.line()))
    sh(lock_release(d, other.run))
    assert LockRecord.parse("\n".join(sh(lock_read(d)))) == mine     # another run's release leaves it
    sh(lock_release(d, mine.run))
    assert not os.path.exists(d)       # the lock was all the directory held: a refused run leaves nothing
    sh(lock_take(d, mine.line()))
    (tmp_path / "k3" / "k3-engine.env").write_text("A=1\n")
    sh(lock_release(d, mine.run))
    assert sorted(os.listdir(d)) == ["k3-engine.env"]   # a directory holding more stays


def test_a_holder_is_stale_only_when_its_process_on_this_machine_is_gone():
    me = this_run("inv.py")
    assert stale(me) is None     # this very process
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = replace(me, pid=dead.pid)
    assert str(dead.pid) in present(stale(gone))
    assert stale(replace(me, pid_start=me.pid_start + 1)) is not None          # the PID belongs to another process now
    assert stale(replace(gone, by=f"ops@{socket.gethostname()}-elsewhere")) is None   # another machine: cannot tell
    assert stale(replace(gone, boot="another-boot")) is None
    lines = held_summary({"n1": gone, "n2": gone})
    assert len(lines) == 1 and "held on n1, n2 by run" in lines[0] and "(stale: " in lines[0]


def test_a_dry_run_is_told_from_its_arguments():
    assert dry_run(["pyinfra", "inv.py", "deploy/k3.py", "--dry", "--diff"])
    assert dry_run(["pyinfra", "inv.py", "deploy/k3.py", "--json"])         # pyinfra prints the changes and exits
    assert not dry_run(["pyinfra", "inv.py", "deploy/k3.py", "--json", "-y"])
    assert not dry_run(["pyinfra", "inv.py", "deploy/k3.py", "-vy"])
    assert not dry_run(["pyinfra", "inv.py", "deploy/k3.py"])               # asks, then changes
