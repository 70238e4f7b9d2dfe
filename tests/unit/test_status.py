"""``k3deploy status`` as an assessment: per unit from what its host reports, per group and for the cluster
(serving, degraded, down), with the exit code automation reads."""

from __future__ import annotations

import copy
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
        r = copy.copy(rollout)
        if window is not None:
            r.vars = rollout.vars.model_copy(update={"k3_crash_loop_window": window})
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
