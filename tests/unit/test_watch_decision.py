"""``k3deploy watch``: the decision of the control loop over sequences of looks (grace, a load given its time, backoff
doubling and capped, a held lock waited for, several groups), each group's state from its status, the systemd unit
under the real ``systemd-analyze verify``, and bad options as one line, exit 2."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import replace

import pytest

from helpers import ROOT, k3
from k3deploy.facts.status import UnitRun
from k3deploy.model.observed import Installed
from k3deploy.model.status import assess
from k3deploy.model.unitcheck import verify_unit
from k3deploy.model.watch import (
    BACK_OFF,
    DOWN,
    LOCKED,
    NOTHING,
    REPAIR,
    STARTING,
    UP,
    WAIT,
    Knobs,
    Look,
    Watch,
    actions,
    group_state,
    why_not_up,
)

MODEL = "moonshotai/Kimi-K3"
K = Knobs(grace=60, backoff=300, backoff_max=1200, start_allowance=600)


def test_a_group_down_is_left_alone_for_its_grace_then_repaired_once():
    assert actions(K, [(0, UP), (10, DOWN), (69, DOWN), (70, DOWN)]) == [NOTHING, WAIT, WAIT, REPAIR]


def test_a_group_back_up_within_its_grace_is_never_repaired_and_its_next_fall_starts_a_new_grace():
    looks = [(0, DOWN), (50, UP), (60, DOWN), (100, DOWN), (119, DOWN), (120, DOWN)]
    assert actions(K, looks) == [WAIT, NOTHING, WAIT, WAIT, WAIT, REPAIR]


def test_a_group_starting_gets_the_engines_load_time_and_a_down_one_only_the_grace():
    # self-healing restarted the members: they load; the loop does not cut the load short
    assert actions(K, [(0, STARTING), (300, STARTING), (599, STARTING), (600, STARTING)]) == [WAIT] * 3 + [REPAIR]
    # a member that stops while the group starts: the grace counts from the first look that saw the group not up
    assert actions(K, [(0, STARTING), (30, DOWN), (60, DOWN)]) == [WAIT, WAIT, REPAIR]
    # a grace longer than the load time wins
    assert actions(replace(K, grace=900), [(0, STARTING), (600, STARTING), (900, STARTING)]) == [WAIT, WAIT, REPAIR]


def test_repairs_that_do_not_bring_a_group_back_back_off_doubling_up_to_the_cap_and_serving_forgets_them():
    w = Watch(K)
    w.see(Look(0, {"engine": DOWN}))
    times: list[float] = []
    t = 60.0
    while len(times) < 5:
        w.see(Look(t, {"engine": DOWN}))
        d = w.decide(t)
        if d.action == REPAIR:
            times.append(t)
            w.repaired(d.groups, t + 20)   # the deploy took 20 s and the group is still down
        else:
            assert d.action == BACK_OFF and d.until is not None and d.until > t
        t += 10
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert gaps == [320, 620, 1220, 1220]   # 20 s of deploy + 300, 600, then 1200 (the cap), 1200
    # it serves again: the next fall gets its grace and its first backoff anew
    w.see(Look(t, {"engine": UP}))
    assert w.tracks["engine"].repairs == 0
    w.see(Look(t + 1, {"engine": DOWN}))
    assert w.decide(t + 60).action == WAIT and w.decide(t + 61).action == REPAIR
    w.repaired(("engine",), t + 61)
    assert w.tracks["engine"].not_before == t + 61 + 300


def test_a_held_lock_is_waited_for_and_the_grace_starts_again_once_it_is_free():
    w = Watch(K)
    w.see(Look(0, {"engine": DOWN}))
    lock = "a run holds the deployment lock: run 3f2a9c1b7e4d by ops@ctl1"
    for t in (100, 200, 300):
        w.see(Look(t, {"engine": DOWN}, lock=lock))
        d = w.decide(t)
        assert (d.action, d.groups, d.why) == (LOCKED, ("engine",), lock)
    w.see(Look(310, {"engine": DOWN}))            # the run ended and left the group down
    assert w.decide(310).action == WAIT
    assert w.decide(359).action == WAIT and w.decide(360).action == REPAIR   # 60 s after the last look under the lock


def test_one_repair_covers_every_group_due_and_leaves_out_those_up_or_still_in_their_grace():
    w = Watch(K)
    w.see(Look(0, {"head0": UP, "head1": DOWN, "router": UP}))
    w.see(Look(30, {"head0": DOWN, "head1": DOWN, "router": UP}))
    d = w.decide(60)
    assert (d.action, d.groups) == (REPAIR, ("head1",))
    w.repaired(d.groups, 80)
    d = w.decide(95)   # head0 is due too (grace from 30 s): repaired, though head1 backs off
    assert (d.action, d.groups) == (REPAIR, ("head0",))
    w.repaired(d.groups, 110)
    d = w.decide(120)
    assert d.action == BACK_OFF and d.until == 380 and set(d.groups) == {"head0", "head1"}


def test_the_changes_logged_are_the_first_look_and_each_change_with_how_long_it_was_not_up():
    w = Watch(K)
    first = w.see(Look(0, {"engine": UP, "router": UP}))
    assert [(c.group, c.state, c.was) for c in first] == [("engine", UP, None), ("router", UP, None)]
    assert w.see(Look(10, {"engine": UP, "router": UP})) == []
    assert [(c.group, c.state, c.was) for c in w.see(Look(20, {"engine": DOWN, "router": UP}))] == [
        ("engine", DOWN, UP)]
    assert w.see(Look(30, {"engine": DOWN, "router": UP})) == []
    (back,) = w.see(Look(75, {"engine": UP, "router": UP}))
    assert (back.state, back.was, back.down_for) == (UP, DOWN, 55)
    w.see(Look(80, {"engine": UP}))                      # a group gone from the inventory is forgotten
    assert set(w.tracks) == {"engine"}


def test_a_wait_that_goes_on_is_one_decision_for_the_log_and_a_new_lock_holder_is_another():
    w = Watch(K)
    w.see(Look(0, {"engine": DOWN}))
    assert w.decide(10).key() == w.decide(20).key()
    assert w.decide(60).key() == w.decide(90).key()          # due: "not repairing" is said once
    w.see(Look(100, {"engine": DOWN}, lock="run a"))
    one = w.decide(100).key()
    w.see(Look(110, {"engine": DOWN}, lock="run b"))
    assert w.decide(110).key() != one


@pytest.fixture(scope="module")
def rollout():
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import INVENTORY_ONLY

    return gather("inventories/gb300.py", INVENTORY_ONLY).require_rollout()


def _groups(rollout, active: dict[int, str], unreachable: frozenset[int] = frozenset()):
    """The status of the rollout's groups where unit i is ``active[i]`` (default active and serving)."""
    runs, installed = {}, {}
    for i, u in enumerate(rollout.units):
        state = active.get(i, "active")
        serving = state == "active" and u.serves
        runs[(u.host, u.unit)] = UnitRun(state, "running" if state == "active" else "dead", 0, 1000.0, "img",
                                         "sha256:1", 200 if serving else (0 if u.serves else None),
                                         (MODEL,) if serving else None)
        installed[(u.host, u.unit)] = Installed(unit_sha=hashlib.sha256(u.unit_text.encode()).hexdigest(),
                                                env_sha=hashlib.sha256(u.env_text.encode()).hexdigest())
    hosts = {rollout.units[i].host for i in unreachable}
    return assess(rollout, MODEL, runs, installed, (MODEL,), hosts, now=1060.0).groups


def test_each_groups_state_comes_from_its_status_an_unreachable_host_being_a_member_down(rollout):
    assert [group_state(g) for g in _groups(rollout, {})] == [UP]
    (g,) = _groups(rollout, {}, unreachable=frozenset({1}))
    assert group_state(g) == DOWN and why_not_up(g) == f"{rollout.units[1].host} unreachable"
    (g,) = _groups(rollout, {0: "inactive", 1: "inactive"})    # stopped for good: nothing starts it again
    assert group_state(g) == DOWN and "down (inactive)" in why_not_up(g)
    (g,) = _groups(rollout, {0: "activating", 1: "activating"})   # being started (self-healing, a boot)
    assert group_state(g) == STARTING


needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


@needs_analyze
def test_the_printed_unit_passes_systemd_analyze_verify_and_runs_the_loop_from_this_checkout():
    proc = k3("watch", "inventories/gb300.py", "--repair", "--grace", "120", "--print-unit", "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed["name"] == "k3-watch-gb300.service"
    text = printed["unit"]
    lines = text.splitlines()
    assert f'ExecStart="{sys.executable}" "-m" "k3deploy.cli" "watch" "{ROOT / "inventories/gb300.py"}" ' \
           '"--repair" "--grace=120"' in lines
    assert f"WorkingDirectory={ROOT}" in lines and "KillMode=mixed" in lines
    rc, out = verify_unit(text, printed["name"], stubs=[sys.executable])
    assert rc == 0, out
    rc, out = verify_unit(text.replace("KillMode=mixed", "KillMode=sometimes"), printed["name"],
                          stubs=[sys.executable])
    assert rc == 1 and "sometimes" in out
    assert k3("watch", "inventories/gb300.py", "--repair", "--grace", "120", "--print-unit").stdout == text


@pytest.mark.parametrize("args, named", [
    (["--grace", "-1"], "--grace '-1'"),
    (["--grace", "soon"], "--grace 'soon'"),
    (["--interval", "0"], "--interval '0'"),
    (["--interval", "2.5"], "--interval '2.5'"),
])
def test_a_bad_option_is_one_line_naming_it_and_exit_2(args, named):
    proc = k3("watch", "inventories/gb300.py", *args, "--once")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and named in proc.stderr and "give one such as" in proc.stderr


def test_an_inventory_that_is_not_there_is_one_line_and_exit_2():
    proc = k3("watch", "inventories/nowhere.py", "--once", "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: inventory 'inventories/nowhere.py' is not a file: give the inventory's .py file (as pyinfra takes it)"]


#: the end of a failed repair's output as the simulated cluster gave it (a worker's engine crashed at its start;
#: journal lines trimmed to the ones that matter), pyinfra's results table after it
FAILED_REPAIR = """\
--> Starting operation: Start | Engine groups serve (health, models)
    [n2] Skipped
    [n1] group engine stopped because worker rank 1 on n3 failed (reported there)
    [n1] Success
    [n3] worker rank 1 on n3 (10.77.203.13) failed during start: observed unit k3-engine.service active/running, \
restarts 1; required the engine keeps running and serves
    [n3] --- journalctl -u k3-engine.service (last 25 lines)
    [n3] Dec 06 10:20:22 n3 docker[2209]: ERROR 12-06 10:20:22 [core.py:866] EngineCore failed to start.
    [n3] Dec 06 10:20:22 n3 docker[2209]: Traceback (most recent call last):
    [n3] Dec 06 10:20:22 n3 docker[2209]: torch.AcceleratorError: CUDA error: an illegal memory access was encountered
    [n3] Dec 06 10:20:22 n3 docker[2209]: RuntimeError: Engine core initialization failed. See root cause above.
    [n3] Dec 06 10:20:22 n3 systemd[1]: k3-engine.service: Failed with result 'exit-code'.
    [n3] group engine is stopped; it runs no half-started version. (pyinfra reports this step next as 'Error: \
executed 0 commands')
    [n3] Error: executed 0 commands

--> Results:
    Operation                                                              Hosts   Success   Error   No Change
    Start | Engine groups serve (health, models)                           2       1         1       -
    Start | Mark the revision of group engine current                      3       -         1       2
    Grand total                                                            15      6         2       7

--> Disconnecting from hosts...
"""


def test_a_failed_repair_is_logged_with_the_line_naming_its_error_not_the_results_table():
    from k3deploy.cli.watch import _failure

    line = _failure(FAILED_REPAIR.splitlines())
    assert line.startswith("[n3] worker rank 1 on n3 (10.77.203.13) failed during start: observed unit "), line
    assert line.endswith("required the engine keeps running and serves: torch.AcceleratorError: CUDA error: an "
                         "illegal memory access was encountered"), line
    # a run refused before any unit started: k3deploy's own line, not pyinfra's table
    refused = ["    k3deploy: group engine: n2 (rank 1) is lost (unreachable: timed out) and no spare is left",
               "--> pyinfra error: no spare left for n2: nothing was changed", "--> Results:",
               "    Operation   Hosts   Success   Error   No Change", "    Grand total   -   -   -   -"]
    assert _failure(refused) == "--> pyinfra error: no spare left for n2: nothing was changed"
    assert "Operation" not in _failure(["--> Results:", "    Operation   Hosts   Success   Error   No Change",
                                        "    Grand total   1   -   1   -", "--> Disconnecting from hosts..."])
