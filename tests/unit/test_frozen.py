"""The deployment model is built in stages, each a frozen value: a placement, a rollout rendered once, what a run
decided. Changing one after it is built fails at once; the only thing of a run that changes is its run state."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.clusters import records
from k3deploy.model.binding import BoundNode
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import HostStart, Placement, Rollout, StartPlan, UnitWork, mark_changes
from k3deploy.model.spares import Settled
from k3deploy.model.staging import Artifact, StagePlan
from k3deploy.model.variables import Variables
from k3deploy.runtime.decide import Decided
from k3deploy.runtime.gather import Gathered
from k3deploy.runtime.phases import RouterCall, RunContext

FROZEN = [UnitWork, Placement, Rollout, HostStart, StartPlan, BoundNode, Artifact, StagePlan, Settled,
          Gathered, Decided, RunContext, RouterCall]


@pytest.mark.parametrize("kind", FROZEN, ids=lambda k: k.__name__)
def test_the_main_model_types_are_frozen(kind: type) -> None:
    assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen   # type: ignore[attr-defined]


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
    assert rollout.changed_groups == frozenset() and rollout.restart_order() == []
    assert decided.restart_order() == [f"{u.host}:{u.unit}" for u in rollout.units]
    assert decided.units == rollout.units and decided.decided(router_workers=("x",)).changed_groups == changed
