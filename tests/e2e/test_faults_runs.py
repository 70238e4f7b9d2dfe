"""Faults of the run itself, end to end on one simulated 2-tray cluster: a second operator at once, the control run
killed in each phase, a link cut in each phase, a member's disk full in the middle of the stage. After each the
cluster serves a recorded revision or the run said exactly why not, and the next run converges.

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

from helpers import PYINFRA, ROOT, k3, k3_here, present, why
from helpers.records import current, recorded, runs_a_recorded_revision
from helpers.simulated import Sim

pytestmark = [pytest.mark.sim, pytest.mark.faults]


class Run:
    """A deploy running in the background; its output is collected line by line."""

    def __init__(self, sim: Sim, pause_at: str | None = None) -> None:
        """``pause_at``: stop the run (SIGSTOP) the moment a line matching it is printed: the operation it names has
        begun and has not yet heard back from the nodes (pyinfra prints the line before it sends the commands)."""
        self.pause_at = re.compile(pause_at) if pause_at else None
        self.paused = threading.Event()
        self.proc = subprocess.Popen([PYINFRA, sim.inventory, "deploy/k3.py", "-y"], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True)
        self.lines: list[str] = []
        self.started = time.monotonic()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.pause_at is not None and not self.paused.is_set() and self.pause_at.search(line):
                self.pause()
                self.paused.set()
            self.lines.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(re.search(pattern, line) for line in self.lines):
                return
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} in the run's output:\n{self.stdout[-3000:]}")

    def pause(self) -> None:
        """Hold the run where it is (its process stays alive: it still holds what it took)."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def finish(self, timeout: float = 300) -> subprocess.CompletedProcess:
        self.proc.wait(timeout)
        self._reader.join(10)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.stdout, "")


@pytest.fixture(scope="module")
def cluster():
    sim = Sim("frun", "gb300", 2)
    base = sim.group_vars.read_text() + "k3_strategy: multi_node_tp\nk3_link_timeout: 10\n"
    sim.base_vars = base  # type: ignore[attr-defined]
    sim.group_vars.write_text(base)
    first = Run(sim).finish()
    assert first.returncode == 0, why(first)
    yield sim
    sim.down()


def change(sim: Sim, value: str) -> None:
    sim.group_vars.write_text(sim.base_vars + f"k3_extra_env: {{K3_FAULT_PROBE: '{value}'}}\n")  # type: ignore


def status(sim: Sim) -> dict:
    out = k3("status", sim.inventory, "--json", check=False)
    return json.loads(out.stdout)


def started_at(sim: Sim, rank: int) -> str:
    return sim.ssh(rank, "systemctl show -p ActiveEnterTimestampMonotonic --value k3-engine.service").stdout.strip()


def converge(sim: Sim, expect_takeover: bool = False) -> subprocess.CompletedProcess:
    """The next run, from this control machine: it ends serving, on a newly recorded revision."""
    again = Run(sim).finish()
    assert again.returncode == 0, why(again)
    if expect_takeover:
        assert "took over the stale lock of run" in again.stdout, again.stdout[-2000:]
    st = status(sim)
    assert st["verdict"] == "serving" and st["lock"] == [], st
    assert runs_a_recorded_revision(sim) == current(sim)
    for rank in (0, 1):
        assert sim.ssh(rank, "test -e /etc/k3deploy/deploy.lock").returncode == 1   # released
    return again


def test_a_second_run_at_once_is_refused_naming_the_holder(cluster):
    sim = cluster
    before = current(sim)
    change(sim, "two-runs-a")
    a = Run(sim)
    a.wait_for(r"deployment lock taken on 2 host")
    a.pause()    # the first run holds the lock for as long as the checks below take, however fast it deploys
    try:
        held = status(sim)
        assert held["lock"] and "run " in held["lock"][0], held    # status shows the held lock
        plan = k3("plan", sim.inventory, "--json", check=False)
        assert any("deployment lock held" in line for line in json.loads(plan.stdout)["lock"]), plan.stdout
        b = Run(sim).finish()
    finally:
        a.resume()
    first = a.finish()
    assert first.returncode == 0, why(first)
    assert b.returncode == 1, why(b)
    refusals = [line for line in b.stdout.splitlines() if "another run holds the deployment lock" in line]
    assert len(refusals) == 1, b.stdout[-2000:]
    run_id = present(re.search(r"run (\w+)", next(x for x in a.lines if "deployment lock taken" in x))).group(1)
    assert f"run {run_id} by " in refusals[0] and f"k3deploy unlock {sim.inventory} --run {run_id}" in refusals[0]
    assert "Starting operation" not in b.stdout    # the refused run changed nothing
    assert current(sim) == before + 1
    # the next change, a few seconds later, numbers its revision after the first one's
    change(sim, "two-runs-b")
    converge(sim)
    assert current(sim) == before + 2 and sorted(recorded(sim, 0)) == list(range(1, before + 3))


#: the operation each phase's fault waits for (the start phase's differs per test)
IN_STAGE = r"Starting operation: Stage \| Weights: verify every file"
IN_CONFIGURE = r"Starting operation: Configure \| Env file \(0600\), staged"


@pytest.mark.parametrize("phase, marker", [("stage", IN_STAGE), ("configure", IN_CONFIGURE),
                                           ("start", r"Starting operation: Start \| Start group heads")])
def test_a_killed_run_leaves_a_recorded_revision_and_the_next_run_converges(cluster, phase, marker):
    sim = cluster
    before, serving_since = current(sim), started_at(sim, 0)
    change(sim, f"killed-in-{phase}")
    run = Run(sim)
    run.wait_for(marker)
    run.kill()
    # what runs (or would run, once started) is a recorded revision: healing or a reboot cannot start anything else
    number = runs_a_recorded_revision(sim)
    st = status(sim)
    assert st["lock"] and "stale" in st["lock"][0], st       # the killed run's lock, named as stale
    if phase in ("stage", "configure"):
        # nothing was restarted: the group serves the revision it served
        assert number == before and st["verdict"] == "serving" and started_at(sim, 0) == serving_since
    else:
        assert number == before + 1 and st["verdict"] != "serving"   # stopped for the swap: status says so
    if phase == "configure":
        # as an operator on another control machine would: see who holds it, then break that run's lock by its id
        shown = k3("unlock", sim.inventory, check=False)
        assert shown.returncode == 1 and "deployment lock held on" in shown.stdout, shown.stdout + shown.stderr
        run_id = present(re.search(r"by run (\w+) by ", shown.stdout)).group(1)
        broken = k3("unlock", sim.inventory, "--run", run_id, check=False)
        assert broken.returncode == 0 and f"removed the deployment lock of run {run_id} on " in broken.stdout
        assert k3("unlock", sim.inventory, check=False).returncode == 0
    again = converge(sim, expect_takeover=phase != "configure")
    assert current(sim) == before + 1, again.stdout[-2000:]


@pytest.mark.parametrize("phase, marker", [
    ("stage", IN_STAGE), ("configure", IN_CONFIGURE),
    ("start", r"Starting operation: Start \| Start workers once their head")])
def test_a_cut_link_ends_the_run_naming_the_node(cluster, phase, marker):
    sim = cluster
    before, serving_since = current(sim), started_at(sim, 0)
    worker = sim.info["nodes"][1]["name"]
    veth = next(n["veth"] for n in json.loads((Path(sim.inventory).parent / "state.json").read_text())["nodes"]
                if n["rank"] == 1)
    change(sim, f"cut-in-{phase}")
    run = Run(sim, pause_at=marker)
    try:
        run.wait_for(marker)
        assert run.paused.wait(10)
        subprocess.run(["ip", "link", "set", veth, "down"], check=True)
        cut = time.monotonic()
        run.resume()
        done = run.finish(timeout=180)
        took = time.monotonic() - cut
    finally:
        run.resume()
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    assert done.returncode != 0, why(done)
    assert took < 90, f"the run took {took:.0f} s to end after the cut"
    errors = [line for line in done.stdout.splitlines() if worker in line and ("rror" in line or "fail" in line)]
    assert errors, why(done)
    if phase != "start":
        # the head was not touched: the group serves what it served
        assert started_at(sim, 0) == serving_since and runs_a_recorded_revision(sim) == before, why(done)
        assert "the change of engine stops here" in done.stdout and worker in done.stdout
    time.sleep(1)
    converge(sim, expect_takeover=phase == "start")
    assert current(sim) == before + 1


MODEL = "/var/lib/k3deploy/cache/huggingface/hub/models--moonshotai--Kimi-K3"


def test_an_outside_cut_in_the_stage_leaves_the_group_serving(cluster):
    sim = cluster
    before, serving_since = current(sim), started_at(sim, 0)
    head = sim.info["nodes"][0]["name"]
    # no node holds the weights any more (the engines run on): the stage fetches them from the hub, and the uplink
    # breaks once, in the middle of the checkpoint
    for rank in (0, 1):
        assert sim.ssh(rank, f"rm -rf {MODEL}").returncode == 0
    k3_here("sim", "fault", sim.name, "outside-cut=2", check=True)
    change(sim, "outside-cut")
    run = Run(sim).finish()
    assert run.returncode != 0, why(run)
    # the head's download broke, and the worker, which was to copy from it, had nothing to copy: every member failed
    # the stage, each says why, and pyinfra stops there
    assert re.search(rf"\[{head}\] Error while downloading .*Connection broken", run.stdout), why(run)
    assert "Starting operation: Configure" not in run.stdout and "Starting operation: Start" not in run.stdout
    assert started_at(sim, 0) == serving_since and runs_a_recorded_revision(sim) == before
    st = status(sim)
    assert st["verdict"] == "serving" and st["lock"] == [], st
    # the uplink works again: the next run fetches what is missing and converges
    converge(sim)
    assert current(sim) == before + 1


def test_a_member_whose_disk_fills_in_the_stage_leaves_the_group_serving(cluster):
    sim = cluster
    before, serving_since = current(sim), started_at(sim, 0)
    worker = sim.info["nodes"][1]["name"]
    model = MODEL
    # the worker's copy of the weights is gone and the filesystem it lands on has 1 MiB left: the stage copies them
    # back from the head and runs out of space half way
    full = sim.ssh(1, f"rm -rf {model} && mkdir -p {model} && mount -t tmpfs -o size=1m k3full {model}")
    assert full.returncode == 0, full.stderr
    try:
        change(sim, "disk-full")
        run = Run(sim).finish()
        assert run.returncode != 0, why(run)
        assert re.search(r"No space left on device|out of space|disk full", run.stdout), why(run)
        assert f"the change of engine stops here: {worker} failed an earlier step" in run.stdout, why(run)
        # no member was restarted or given new files: the group serves the revision it served
        assert started_at(sim, 0) == serving_since and runs_a_recorded_revision(sim) == before
        st = status(sim)
        assert st["verdict"] == "serving" and st["lock"] == [], st
    finally:
        sim.ssh(1, f"umount {model}")
    converge(sim)
    assert current(sim) == before + 1
