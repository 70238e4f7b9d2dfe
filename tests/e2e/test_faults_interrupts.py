"""Interrupted and orphaned runs, end to end on one simulated 2-tray cluster: a run stopped by SIGINT, SIGTERM or
SIGHUP in the middle of its restart, the head's link cut while a change waits in the readiness gate, and the lock of
a run that is still alive (unlock refuses it, from this control machine and from another; its lease runs out once
it stops renewing it; ``--force`` removes it with a warning). After each the run said which state each group is in,
no host holds the lock of a run that is gone, and the next run converges to a recorded revision.

Each test makes a change (a new value of one ``k3_extra_env`` variable) so that the group restarts, and leaves the
cluster converged and serving for the next one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers import K3DEPLOY, PYINFRA, ROOT, k3, present, why
from helpers.records import LOCK, current, runs_a_recorded_revision
from helpers.simulated import Sim

pytestmark = [pytest.mark.sim, pytest.mark.faults]

#: the lease of the deployment lock on this cluster (the shortest allowed: its expiry is seen within the test)
LEASE = 10
#: seconds the simulated engines take to load in the changes that need a window in the readiness gate: longer than
#: what happens in that window (a cut found within k3_link_timeout, 10 s; the lease's waits, LEASE + 5 and
#: LEASE + 3 s after the lock was taken), with room for a loaded machine
SLOW = 30


class Run:
    """A deploy running in the background (its own process group, as from a terminal); its output is collected
    line by line."""

    def __init__(self, sim: Sim, pause_at: str | None = None) -> None:
        """``pause_at``: hold the run (SIGSTOP) the moment a line matching it is printed: the operation it names has
        begun and has not yet heard back from the nodes (pyinfra prints the line before it sends the commands)."""
        self.pause_at = re.compile(pause_at) if pause_at else None
        self.paused = threading.Event()
        self.proc = subprocess.Popen([PYINFRA, sim.inventory, "deploy/k3.py", "-y"], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.pause_at is not None and not self.paused.is_set() and self.pause_at.search(line):
                os.killpg(self.proc.pid, signal.SIGSTOP)
                self.paused.set()
            self.lines.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 180) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(re.search(pattern, line) for line in self.lines):
                return
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} in the run's output:\n{self.stdout[-3000:]}")

    def run_id(self) -> str:
        self.wait_for(r"deployment lock taken on 2 host")
        return present(re.search(r"\(run (\w+)\)", next(x for x in self.lines if "deployment lock taken" in x))).group(1)

    def signal(self, signum: int, group: bool = False) -> None:
        (os.killpg if group else os.kill)(self.proc.pid, signum)

    def finish(self, timeout: float = 300) -> subprocess.CompletedProcess:
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._reader.join(10)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.stdout, "")


@pytest.fixture(scope="module")
def cluster():
    sim = Sim("irint", "gb300", 2)
    base = sim.group_vars.read_text() + f"k3_strategy: multi_node_tp\nk3_link_timeout: 10\nk3_lock_lease: {LEASE}\n"
    sim.base_vars = base  # type: ignore[attr-defined]
    sim.group_vars.write_text(base)
    first = Run(sim).finish()
    assert first.returncode == 0, why(first)
    yield sim
    sim.down()


def change(sim: Sim, value: str, slow: bool = False) -> None:
    env = f"K3_FAULT_PROBE: '{value}'" + (f", K3SIM_LOAD_SECONDS: '{SLOW}'" if slow else "")
    sim.group_vars.write_text(sim.base_vars + f"k3_extra_env: {{{env}}}\n")  # type: ignore[attr-defined]


def lock_free(sim: Sim) -> bool:
    return all(sim.ssh(rank, f"test -e {LOCK}").returncode == 1 for rank in (0, 1))


def status(sim: Sim) -> dict:
    return json.loads(k3("status", sim.inventory, "--json", check=False).stdout)


def converge(sim: Sim) -> subprocess.CompletedProcess:
    """The next run: it ends serving, on a newly recorded revision, which history marks as serving."""
    again = Run(sim).finish()
    assert again.returncode == 0, why(again)
    st = status(sim)
    assert st["verdict"] == "serving" and st["lock"] == [], st
    number = runs_a_recorded_revision(sim)
    assert number == current(sim)
    engine = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]["engine"]
    assert engine["current"] == number and next(r for r in engine["revisions"] if r["number"] == number)["served"]
    assert lock_free(sim)
    return again


def elsewhere(*args: str) -> subprocess.CompletedProcess[str]:
    """``k3deploy ARGS`` as from another control machine: its own host name (a UTS namespace of its own), so it
    cannot look at this machine's processes and has only the lease to go by."""
    return subprocess.run(["unshare", "--uts", "sh", "-c", 'hostname k3ctl2 && exec "$@"', "sh", *K3DEPLOY, *args],
                          capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=120)


@pytest.mark.parametrize("signum, marker", [
    (signal.SIGINT, r"Starting operation: Start \| Start workers once their head"),
    (signal.SIGTERM, r"Starting operation: Start \| Start group heads"),
    (signal.SIGHUP, r"Starting operation: Configure \| Env file \(0600\), staged")])
def test_an_interrupted_run_exits_non_zero_gives_the_lock_back_and_names_each_groups_state(cluster, signum, marker):
    sim = cluster
    before = current(sim)
    change(sim, f"interrupted-{signal.Signals(signum).name}")
    run = Run(sim, pause_at=marker)
    run.wait_for(marker)
    assert run.paused.wait(10)   # held where the marker's operation began: the signal comes in that operation
    run.signal(signum, group=signum == signal.SIGINT)   # Ctrl-C reaches the terminal's whole process group
    run.signal(signal.SIGCONT, group=True)
    done = run.finish(timeout=90)
    name = signal.Signals(signum).name
    assert done.returncode == 128 + signum, why(done)
    assert f"the run was interrupted ({name})" in done.stdout, why(done)
    assert "Exiting upon user request" not in done.stdout and "Traceback" not in done.stdout, why(done)
    states = [line for line in done.stdout.splitlines() if "k3deploy:   group engine: " in line]
    assert len(states) == 1, why(done)
    if signum == signal.SIGHUP:
        # in the configure phase: nothing of the group was stopped, it serves what it served
        assert "untouched, runs revision" in states[0], states
        assert status(sim)["verdict"] == "serving" and runs_a_recorded_revision(sim) == before
    else:
        assert "restarting, not serving" in states[0], states
    assert re.search(rf"to converge every group: pyinfra {re.escape(sim.inventory)} deploy/k3.py -y", done.stdout)
    assert "the deployment lock was given back" in done.stdout
    assert lock_free(sim), why(done)   # no stale lock left for the next run to take over
    again = converge(sim)
    assert "took over the stale lock" not in again.stdout
    assert current(sim) == before + 1


def test_the_head_lost_in_the_readiness_gate_ends_the_run_naming_it(cluster):
    sim = cluster
    before = current(sim)
    head = sim.info["nodes"][0]["name"]
    veth = next(n["veth"] for n in json.loads((Path(sim.inventory).parent / "state.json").read_text())["nodes"]
                if n["rank"] == 0)
    change(sim, "head-lost-in-gate", slow=True)   # the engines load for SLOW s: the gate waits that long
    run = Run(sim)
    try:
        run.wait_for(r"Starting operation: Start \| Engine groups serve")
        time.sleep(3)
        subprocess.run(["ip", "link", "set", veth, "down"], check=True)
        cut = time.monotonic()
        done = run.finish(timeout=240)
        took = time.monotonic() - cut
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    assert done.returncode != 0, why(done)
    assert took < 90, f"the run took {took:.0f} s to end after the cut:\n{done.stdout[-3000:]}"
    assert f"the SSH connection to {head} was lost" in done.stdout, why(done)
    failed = [line for line in done.stdout.splitlines() if f"rank 0 on {head}" in line and "failed during" in line]
    assert failed, why(done)
    assert "Unexpected error in Python callback" not in done.stdout and "Traceback" not in done.stdout, why(done)
    time.sleep(1)
    change(sim, "head-back")
    again = converge(sim)
    assert current(sim) == before + 2, again.stdout[-2000:]


def test_the_lock_of_a_live_run_is_not_broken_and_its_lease_runs_out(cluster):
    sim = cluster
    change(sim, "live-run", slow=True)
    run = Run(sim)
    run_id = run.run_id()
    taken = time.monotonic()
    try:
        # from this control machine: its process runs
        here = k3("unlock", sim.inventory, "--run", run_id)
        assert here.returncode == 1, here.stdout + here.stderr
        refusal = (here.stdout + here.stderr).strip().splitlines()
        assert len(refusal) == 1 and f"run {run_id} is alive (its process" in refusal[0], refusal
        assert f"k3deploy unlock {sim.inventory} --run {run_id} --force" in refusal[0]
        # from another one, later than a lease would last unrenewed: the holder renewed it
        run.wait_for(r"Starting operation: Start \| Engine groups serve")
        time.sleep(max(0.0, taken + LEASE + 5 - time.monotonic()))
        there = elsewhere("unlock", sim.inventory, "--run", run_id)
        assert there.returncode == 1 and "renewed its lease" in there.stderr, there.stdout + there.stderr
        assert not lock_free(sim)
        # the holder stops renewing (held still): once the lease has run out, the other machine may break it
        run.signal(signal.SIGSTOP, group=True)
        time.sleep(LEASE + 3)
        shown = elsewhere("unlock", sim.inventory)
        assert shown.returncode == 1 and "stale: its lease ran out" in shown.stdout, shown.stdout + shown.stderr
        broken = elsewhere("unlock", sim.inventory, "--run", run_id)
        assert broken.returncode == 0 and f"removed the deployment lock of run {run_id}" in broken.stdout, \
            broken.stdout + broken.stderr
        assert lock_free(sim)
    finally:
        run.signal(signal.SIGCONT, group=True)
    run.finish()
    # --force removes the lock of a live run, with a warning
    second = Run(sim)
    second_id = second.run_id()
    second.signal(signal.SIGSTOP, group=True)
    try:
        forced = k3("unlock", sim.inventory, "--run", second_id, "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert f"warning: run {second_id} is alive" in forced.stderr and lock_free(sim)
    finally:
        second.signal(signal.SIGCONT, group=True)
    second.finish()
    change(sim, "after-live-run")
    converge(sim)
