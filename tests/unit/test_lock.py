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


class _LocalHost:
    """A host whose commands run under this machine's sh (what the lock runs through ``run_shell_command``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.commands: list[str] = []

    def run_shell_command(self, command: str, **_: object) -> tuple[bool, object]:
        self.commands.append(command)
        proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        return proc.returncode == 0, type("Out", (), {"stdout_lines": proc.stdout.splitlines()})()


def _lock(tmp_path, run: LockRecord):
    from pyinfra.api import Config, Inventory, State

    from k3deploy.runtime.lock import Lock

    hosts = {n: _LocalHost(n) for n in ("n0", "n1", "n2")}
    state = State()
    state.init(Inventory(([], {})), Config())
    return Lock(state, hosts, {n: str(tmp_path / n) for n in hosts}, run), hosts


def test_the_lock_is_taken_on_the_first_host_alone_then_from_what_each_host_read_printed(tmp_path):
    from k3deploy.runtime.lock import LockHeld

    mine = this_run("inv.py")
    lock, hosts = _lock(tmp_path, mine)
    lock.take_first()
    assert lock.taken == ["n0"] and (tmp_path / "n0" / "deploy.lock").exists()
    assert lock.request("n0") is None and lock.request("n1") == (str(tmp_path / "n1"), mine.line())
    # each other host took it in the command that read it: the answers are judged, nothing more runs there
    answers = {n: sh(lock_take(str(tmp_path / n), mine.line())) for n in ("n1", "n2")}
    lock.settle(answers)
    assert sorted(lock.taken) == ["n0", "n1", "n2"] and hosts["n1"].commands == hosts["n2"].commands == []

    # another live run holds n2: the run is refused naming it, and gives the lock back where it took it
    other = replace(this_run("inv.py"), run="otherrun0001")
    second, hosts2 = _lock(tmp_path / "second", mine)
    sh(lock_take(str(tmp_path / "second" / "n2"), other.line()))
    second.take_first()
    answers = {n: sh(lock_take(str(tmp_path / "second" / n), mine.line())) for n in ("n1", "n2")}
    try:
        second.settle(answers)
        raise AssertionError("settle took a lock another run holds")
    except LockHeld as exc:
        assert "on n2" in str(exc) and "otherrun0001" in str(exc) and "nothing was changed" in str(exc)
    assert second.taken == []
    assert not (tmp_path / "second" / "n0").exists() and not (tmp_path / "second" / "n1").exists()
    assert LockRecord.parse("\n".join(sh(lock_read(str(tmp_path / "second" / "n2"))))) == other


def test_a_holder_elsewhere_is_alive_while_it_renews_its_lease(tmp_path):
    import time

    from k3deploy.model.commands import lock_renew
    from k3deploy.runtime.lock import alive

    d = str(tmp_path / "k3")
    other = replace(this_run("inv.py", lease=10), by="ops@ctl2", boot="another-boot")
    sh(lock_take(d, other.line()))
    seen = present(LockRecord.parse("\n".join(sh(lock_read(d)))))
    assert seen == other and seen.renewed_ago is not None and seen.renewed_ago <= 1   # the node's own clock
    assert "renewed its lease" in present(alive(seen)) and stale(seen) is None
    lock = tmp_path / "k3" / "deploy.lock"
    old = time.time() - 30
    os.utime(lock, (old, old))                      # not renewed for 30 s: the lease of 10 s ran out
    expired = present(LockRecord.parse("\n".join(sh(lock_read(d)))))
    assert alive(expired) is None and "its lease ran out" in present(stale(expired))
    sh(lock_renew(d, "someoneelse"))                # another run's renewal leaves it as it is
    assert present(present(LockRecord.parse("\n".join(sh(lock_read(d))))).renewed_ago) >= 29
    sh(lock_renew(d, other.run))                    # its holder's renews it
    assert alive(present(LockRecord.parse("\n".join(sh(lock_read(d)))))) is not None
    # a record without a lease (an older run's) cannot be judged from elsewhere; on this machine its process decides
    unjudged = replace(expired, lease=0)
    assert alive(unjudged) is None and stale(unjudged) is None
    me = this_run("inv.py", lease=10)
    assert "runs on" in present(alive(replace(me, renewed_ago=1000)))
