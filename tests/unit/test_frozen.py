"""The deployment model is built in stages, each a frozen value: the resolved plan, what was read of each host, a
placement, a rollout rendered once, what a run decided, the plan's report and the runbook. Changing one after it is
built fails at once; the only thing of a run that changes is its run state."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from helpers.clusters import records
from k3deploy import load_recipe, resolve
from k3deploy.model.binding import BoundNode
from k3deploy.model.diff import HostPlan, PlanReport, build
from k3deploy.model.observed import Installed
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.revisions import GroupHistory, Revision, combine, parse_listing
from k3deploy.model.rollout import HostStart, Placement, Rollout, StartPlan, UnitWork, mark_changes
from k3deploy.model.runbook import Block, Doc, blocks, to_markdown
from k3deploy.model.runbook.document import Draft
from k3deploy.model.spares import Settled
from k3deploy.model.staging import Artifact, StagePlan
from k3deploy.model.steps import start_order
from k3deploy.model.variables import Variables
from k3deploy.recipe.plan import NodePlan, Plan
from k3deploy.runtime.decide import Decided, NoSpare
from k3deploy.runtime.gather import Gathered
from k3deploy.runtime.phases import RouterCall, RunContext
from k3deploy.runtime.reading import HostReading, ReadPlan, ReadRevisions, ReadUnit

FROZEN = [UnitWork, Placement, Rollout, HostStart, StartPlan, BoundNode, Artifact, StagePlan, Settled,
          Gathered, Decided, NoSpare, RunContext, RouterCall, HostReading, GroupHistory, Installed, PlanReport, HostPlan,
          Doc, Block]


@pytest.mark.parametrize("kind", FROZEN, ids=lambda k: k.__name__)
def test_the_main_model_types_are_frozen(kind: type) -> None:
    assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen   # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", [Plan, NodePlan], ids=lambda k: k.__name__)
def test_the_resolved_plan_is_frozen(kind: type) -> None:
    assert kind.model_config.get("frozen") is True   # type: ignore[attr-defined]


def test_a_resolved_plan_cannot_be_changed_and_a_fixed_one_is_a_new_plan() -> None:
    plan = resolve(load_recipe(), hardware="gb300")
    with pytest.raises(ValidationError, match="frozen"):
        plan.image = "other:1"   # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        plan.nodes[0].port = 1   # type: ignore[misc]
    other = plan.model_copy(update={"image": "other:1"})
    assert other.image == "other:1" and plan.image != "other:1"


def test_a_reading_is_built_whole_from_its_requests() -> None:
    plan = ReadPlan("n1", (ReadUnit("a.service", "/a", "/a.env", None), ReadUnit("b.service", "/b", "/b.env", None),
                           ReadRevisions("engine", "/r")))
    values = {"ReadUnit.0": Installed(active="active"), "ReadUnit.1": Installed(),
              "ReadRevisions.2": GroupHistory("engine", current=2)}
    reading = plan.reading(values)
    assert reading is not None and reading.host == "n1"
    assert {u: have.active for u, have in reading.installed.items()} == {"a.service": "active", "b.service": "absent"}
    assert reading.revisions["engine"].current == 2
    assert plan.reading({"ReadUnit.0": Installed()}) is None   # a host whose values did not come back
    with pytest.raises(dataclasses.FrozenInstanceError):
        reading.image = None   # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        reading.installed["a.service"].active = "failed"   # type: ignore[misc]


def test_a_group_history_is_combined_and_parsed_whole() -> None:
    meta = Revision(group="engine", number=1, created="t", image="img", summary="s").to_json()
    listed = parse_listing(["K3_CURRENT=1", "K3_META=/etc/k3deploy/revisions/engine/1/meta.json",
                            *meta.splitlines(), "K3_KEPT=meta.json served"])
    h = combine("engine", [("n1", GroupHistory("engine")), ("n2", listed)])
    assert (h.current, h.currents, h.marked, h.hosts) == (1, {"n1": None, "n2": 1}, {1}, ["n1", "n2"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.current = 2   # type: ignore[misc]


def test_the_plan_report_and_the_runbook_are_frozen() -> None:
    rollout = desired_rollout(target(records("gb300", "multi_node_tp", 2), None))
    report = build(rollout, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.staging = ["x"]   # type: ignore[misc]
    assert dataclasses.replace(report, staging=["x"]).has_changes and report.staging == []
    host = report.hosts[0]
    assert host.changes   # built whole: each host's changes, in order, given when it is made
    with pytest.raises(dataclasses.FrozenInstanceError):
        host.changes = []   # type: ignore[misc]
    draft = Draft()
    draft.h(1, "Runbook")
    draft.block("n1", "echo hi")
    doc = draft.done()
    draft.p("written after the runbook was done")
    assert doc.items == (("h", 1, "Runbook"), ("block", Block("n1", "echo hi")))
    assert blocks(to_markdown(doc)) == [Block("n1", "echo hi\n")]
    with pytest.raises(dataclasses.FrozenInstanceError):
        doc.items = ()   # type: ignore[misc]


def test_the_variables_are_frozen() -> None:
    variables = Variables(k3_hardware="gb300")
    assert Variables.model_config.get("frozen") is True
    with pytest.raises(ValueError, match="frozen"):
        variables.k3_max_unavailable = 2   # type: ignore[misc]


def test_a_rollout_cannot_be_changed_after_it_is_built() -> None:
    wanted = target(records("gb300", "multi_node_tp", 2), None)
    layout = wanted.require_layout()
    rollout = desired_rollout(wanted)
    assert not layout.rendered and rollout.rendered and not isinstance(layout, Rollout)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rollout.changed_groups = frozenset({"engine"})   # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rollout.router_workers = ()   # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rollout.units[0].unit_text = ""   # type: ignore[misc]


def test_what_restarts_is_a_new_rollout_and_the_rendered_one_is_left_as_it_was() -> None:
    rollout = desired_rollout(target(records("gb300", "multi_node_tp", 2), None))
    changed = mark_changes(rollout, {})   # nothing installed: every group starts
    decided = rollout.decided(changed)
    assert changed == {"engine"} and decided.changed_groups == changed
    assert rollout.changed_groups == frozenset() and start_order(rollout) == []
    assert start_order(decided) == [f"{u.host}:{u.unit}" for u in rollout.units]
    assert decided.units == rollout.units and decided.decided(router_workers=("x",)).changed_groups == changed
