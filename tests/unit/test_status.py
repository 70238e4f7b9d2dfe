"""``k3deploy status`` as an assessment: per unit from what its host reports, per group and for the cluster
(serving, degraded, down), with the exit code automation reads."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from k3deploy.facts.status import UnitRun, UnitRuntime
from k3deploy.model.observed import Installed
from k3deploy.model.status import assess, unit_verdict

MODEL = "moonshotai/Kimi-K3"


@pytest.fixture(scope="module")
def rollout():
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import INVENTORY_ONLY

    return gather("inventories/gb300.py", INVENTORY_ONLY).require_rollout()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def healthy(r):
    runs = {(u.host, u.unit): UnitRun("active", "running", 0, 1000.0, "img", "sha256:1",
                                      200 if u.serves else None, (MODEL,) if u.serves else None) for u in r.units}
    installed = {(u.host, u.unit): Installed(unit_sha=_sha(u.unit_text), env_sha=_sha(u.env_text), active="active")
                 for u in r.units}
    return runs, installed


def test_every_member_up_and_the_endpoint_listing_the_model_is_serving(rollout):
    runs, installed = healthy(rollout)
    st = assess(rollout, MODEL, runs, installed, (MODEL,), set(), now=1060.0)
    assert st.verdict == "serving" and st.exit_code == 0
    units = [u for g in st.groups for u in g.units]
    assert all(u.matches_plan and u.uptime_s == 60.0 for u in units)
    assert {u.verdict for u in units} == {"serving", "running"}   # the head serves HTTP, workers run headless


def test_a_dead_worker_degrades_its_group_while_the_head_still_answers(rollout):
    runs, installed = healthy(rollout)
    worker = next(u for u in rollout.units if u.rank == 1)
    runs[(worker.host, worker.unit)] = UnitRun("failed", "failed", 3)
    st = assess(rollout, MODEL, runs, installed, (MODEL,), set(), now=1060.0)
    assert st.verdict == "degraded" and st.exit_code == 1
    (g,) = st.groups
    assert g.verdict == "degraded" and [u.verdict for u in g.units if u.host == worker.host] == ["down"]


def test_a_dead_head_or_a_silent_endpoint_is_down(rollout):
    runs, installed = healthy(rollout)
    head = next(u for u in rollout.units if u.rank == 0)
    runs[(head.host, head.unit)] = UnitRun("active", "running", 0, 1000.0, "img", "sha256:1", 503, None)
    st = assess(rollout, MODEL, runs, installed, None, set(), now=1060.0)
    assert st.verdict == "down" and st.groups[0].verdict == "down" and st.exit_code == 1


def test_changed_files_and_unreachable_hosts_are_shown(rollout):
    runs, installed = healthy(rollout)
    u = rollout.units[-1]
    installed[(u.host, u.unit)] = Installed(unit_sha="0" * 64, env_sha=_sha(u.env_text), active="active")
    other = rollout.units[0]
    st = assess(rollout, MODEL, runs, installed, (MODEL,), {other.host}, now=1060.0)
    found = {x.host: x for g in st.groups for x in g.units}
    assert found[u.host].matches_plan is False
    assert found[other.host].verdict == "unreachable" and st.unreachable == [other.host]
    assert st.verdict == "degraded" and st.to_dict()["unreachable"] == [other.host]


def test_unit_verdicts():
    assert unit_verdict(active="activating", serves=True, health=0, listed=None) == "starting"
    assert unit_verdict(active="inactive", serves=False, health=None, listed=None) == "down"
    assert unit_verdict(active="active", serves=True, health=200, listed=False) == "starting"


def test_a_restarted_member_is_in_its_crash_loop_until_it_has_run_the_window(rollout):
    runs, installed = healthy(rollout)
    worker = next(u for u in rollout.units if u.rank == 1)
    runs[(worker.host, worker.unit)] = UnitRun("active", "running", 4, 1000.0, "img", "sha256:1", None, None)

    def verdict(now: float, window: int | None = None) -> str:
        r = rollout
        if window is not None:
            r = dataclasses.replace(rollout, vars=rollout.vars.model_copy(update={"k3_crash_loop_window": window}))
        st = assess(r, MODEL, runs, installed, (MODEL,), set(), now=now)
        return next(u.verdict for g in st.groups for u in g.units if u.host == worker.host)

    assert rollout.vars.k3_crash_loop_window == 120    # the default
    assert verdict(now=1119.0) == "crash-loop" and verdict(now=1120.0) == "running"
    assert verdict(now=1009.0, window=10) == "crash-loop" and verdict(now=1010.0, window=10) == "running"
    # fewer than 3 restarts is no crash loop, whatever the uptime
    runs[(worker.host, worker.unit)] = UnitRun("active", "running", 2, 1000.0, "img", "sha256:1", None, None)
    assert verdict(now=1001.0) == "running"


def test_the_status_fact_reads_a_unit_that_is_not_installed():
    run = UnitRuntime().process(["K3_LoadState=not-found", "K3_ActiveState=inactive", "K3_SubState=dead",
                                 "K3_NRestarts=0", "K3_ActiveEnterTimestamp=", "K3_IMAGE=", "K3_HEALTH=000",
                                 "K3_MODELS="])
    assert run.active == "absent" and run.since is None and run.health == 0 and run.models is None


def test_a_unit_not_as_planned_says_why(rollout):
    from k3deploy.model.revisions import GroupHistory, Revision

    runs, installed = healthy(rollout)
    head = next(u for u in rollout.units if u.rank == 0)
    old = {f"{head.host}:{head.unit_path}": "u1", f"{head.host}:{head.env_path}": "e1"}
    history = {head.group: GroupHistory(head.group, {1: Revision(head.group, 1, "t", "img", "s", files=old),
                                                     2: Revision(head.group, 2, "t", "img", "s")},
                                        current=1, marked={1, 2})}
    installed[(head.host, head.unit)] = Installed(unit_sha="u1", env_sha="e1", active="active")
    st = assess(rollout, MODEL, runs, installed, (MODEL,), set(), now=1060.0, history=history)
    (unit,) = [u for g in st.groups for u in g.units if u.host == head.host]
    assert unit.matches_plan is False and unit.why is not None
    assert unit.why.startswith("runs revision 1, rolled back from 2: the variables ask for other settings"), unit.why
    installed[(head.host, head.unit)] = Installed(unit_sha="x", env_sha="y", active="active")
    st = assess(rollout, MODEL, runs, installed, (MODEL,), set(), now=1060.0, history=history)
    assert "differs from the plan" in next(u.why or "" for g in st.groups for u in g.units if u.host == head.host)
    assert all(u.why is None for g in st.groups for u in g.units if u.host != head.host)


def test_a_crash_loop_points_at_the_member_whose_engine_keeps_exiting(rollout):
    from k3deploy.model.status import crash_loops

    runs, installed = healthy(rollout)
    worker = next(u for u in rollout.units if u.rank == 1)
    runs[(worker.host, worker.unit)] = UnitRun("activating", "auto-restart", 6, None, None, None, None, None)
    st = assess(rollout, MODEL, runs, installed, None, set(), now=1060.0)
    journal = (f"2026-12-05T05:00:00+0000 {worker.host} docker[812]: RuntimeError: NCCL error: unhandled system "
               f"error\n2026-12-05T05:00:01+0000 {worker.host} systemd[1]: {worker.unit}.service: Main process "
               "exited, code=exited, status=1/FAILURE\n")
    (line,) = crash_loops(st, {(worker.host, worker.unit): {"journal": journal, "container": ""}})
    assert f"{worker.host}'s engine keeps exiting ({worker.unit}, restarted 6 times)" in line, line
    assert "RuntimeError: NCCL error: unhandled system error" in line and "Main process exited" not in line
    runs, installed = healthy(rollout)
    assert crash_loops(assess(rollout, MODEL, runs, installed, (MODEL,), set(), now=1060.0), {}) == []


def test_status_labels_its_two_image_digests():
    from k3deploy.cli.status import _image_cell

    cell = _image_cell("vllm/vllm-openai@sha256:" + "a" * 64, "sha256:" + "b" * 64).splitlines()
    assert cell == ["vllm/vllm-openai@sha256:aaaaaaaaaaaa…", "local id sha256:bbbbbbbbbbbb"]
