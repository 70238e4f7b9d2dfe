"""What each command reads of the hosts: the typed plan per view, the typed reading it fills, and an inventory read
with the recipe parsed once and the rollout rendered once (no hosts needed)."""

from __future__ import annotations

from typing import Any

import pytest

import k3deploy.model.pipeline as pipeline
import k3deploy.recipe.schema as schema
from k3deploy.facts.status import UnitRun
from k3deploy.model.observed import Installed
from k3deploy.model.pipeline import target
from k3deploy.model.rollout import Placement, render
from k3deploy.runtime import views
from k3deploy.runtime.connections import inventory_file, load_inventory
from k3deploy.runtime.gather import gather
from k3deploy.runtime.reading import (
    ReadEndpoint,
    ReadHealth,
    ReadLogs,
    ReadPlan,
    ReadRegistry,
    ReadRunning,
    ReadUnit,
    plan_host,
    plan_hosts,
)


@pytest.fixture(scope="module")
def layout() -> Placement:
    from k3deploy.model.inventory import records_of

    state = load_inventory("inventories/gb300.py")
    return target(records_of(state.inventory), inventory_file("inventories/gb300.py")).require_layout()


def kinds(plan: ReadPlan) -> set[str]:
    return {type(r).__name__ for r in plan.requests}


def test_a_layout_places_the_units_without_rendering_them(layout: Placement) -> None:
    assert not layout.rendered and layout.hosts and all(u.unit_text == "" for u in layout.units)


def test_each_view_asks_what_its_command_needs(layout: Placement) -> None:
    head, worker = layout.hosts[0], layout.hosts[1]
    assert plan_host(layout, head, views.PREFLIGHT, resolver=head).requests == ()
    assert [type(r) for r in plan_host(layout, head, views.RUNBOOK, resolver=head).requests] == [ReadRegistry]
    assert plan_host(layout, worker, views.RUNBOOK, resolver=head).requests == ()
    plan = kinds(plan_host(layout, head, views.PLAN, resolver=None))
    assert {"ReadUnit", "ReadHealth", "ReadLock", "ReadRevisions", "ReadImage", "ReadWeights"} <= plan
    assert not {"ReadRunning", "ReadEndpoint", "ReadLogs", "ReadRegistry"} & plan
    status = plan_host(layout, head, views.STATUS, resolver=None)
    assert {ReadRunning, ReadEndpoint} <= {type(r) for r in status.requests}
    assert ReadHealth not in {type(r) for r in status.requests}
    assert ReadEndpoint not in {type(r) for r in plan_host(layout, worker, views.STATUS, resolver=None).requests}
    logs = [r for r in plan_host(layout, head, views.bundle(7), resolver=None).requests if isinstance(r, ReadLogs)]
    assert logs and all(r.lines == 7 for r in logs)


def test_every_host_is_planned_with_one_launcher_for_the_run(layout: Placement,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import k3deploy.runtime.reading as reading

    made: list[object] = []
    real = reading.launcher_for

    def counted(*args: Any) -> Any:
        made.append(args)
        return real(*args)

    monkeypatch.setattr(reading, "launcher_for", counted)
    plans = plan_hosts(layout, layout.hosts, views.STATUS, resolver=layout.hosts[0])
    assert len(made) == 1 and list(plans) == layout.hosts
    monkeypatch.undo()
    assert plans == {h: plan_host(layout, h, views.STATUS, resolver=layout.hosts[0]) for h in layout.hosts}


def test_the_values_land_in_a_typed_reading(layout: Placement) -> None:
    head = layout.hosts[0]
    plan = plan_host(layout, head, views.STATUS, resolver=None)
    values: dict[str, object] = {}
    for (name, _, _), request in zip(plan.specs(), plan.requests, strict=True):
        values[name] = (Installed(unit_sha="a" * 64) if isinstance(request, ReadUnit)
                        else UnitRun(active="active") if isinstance(request, ReadRunning)
                        else ("moonshotai/Kimi-K3",) if isinstance(request, ReadEndpoint) else None)
    reading = plan.reading(values)
    assert reading is not None and reading.host == head
    unit = next(u.unit for u in layout.on_host(head))
    assert reading.installed[unit].unit_sha == "a" * 64 and reading.runs[unit].active == "active"
    assert reading.endpoint_models == ("moonshotai/Kimi-K3",)
    assert plan.reading({}) is None   # nothing came back: the host failed, it has no reading


def test_the_units_written_in_place_are_read_with_the_facts_of_each_engine_host(layout: Placement) -> None:
    from k3deploy.facts.rollout import FileState
    from k3deploy.model.observed import FileMeta
    from k3deploy.model.units import fence_paths
    from k3deploy.runtime.reading import ReadFile

    paths = fence_paths(layout.vars.k3_fence_port)
    for host in layout.hosts:
        plan = plan_host(layout, host, views.DEPLOY, resolver=None)
        assert [r.path for r in plan.requests if isinstance(r, ReadFile)] == list(paths), host
    plan = plan_host(layout, layout.hosts[1], views.DEPLOY, resolver=None)
    read = {p: FileState("b" * 64, FileMeta(0, 0, "644")) for p in paths[:1]} | {paths[1]: FileState()}
    values = {name: read[request.path] if isinstance(request, ReadFile) else None
              for (name, _, _), request in zip(plan.specs(), plan.requests, strict=True)}
    reading = plan.reading(values)
    assert reading is not None and reading.files == read   # each by its path, one absent
    for view in (views.PREFLIGHT, views.RUNBOOK):   # views that read nothing installed read none of them
        assert not any(isinstance(r, ReadFile) for r in plan_host(layout, layout.hosts[0], view, resolver=None).requests)


def test_an_inventory_is_read_with_one_recipe_parse_and_one_render(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"parse": 0, "render": 0}
    parse = schema.parse_recipe

    def counted_parse(*args: Any, **kwargs: Any) -> Any:
        calls["parse"] += 1
        return parse(*args, **kwargs)

    def counted_render(*args: Any, **kwargs: Any) -> Any:
        calls["render"] += 1
        return render(*args, **kwargs)

    monkeypatch.setattr(schema, "parse_recipe", counted_parse)
    monkeypatch.setattr(pipeline, "render", counted_render)
    for view in (views.INVENTORY_ONLY, views.OFFLINE_RUNBOOK):
        calls.update(parse=0, render=0)
        gathered = gather("inventories/gb300.py", view)
        assert gathered.require_rollout().rendered and calls == {"parse": 1, "render": 1}, view.name
    assert gathered.blanks and gathered.preflight is None


def test_each_request_asks_its_fact_by_the_facts_own_parameter_names() -> None:
    import dataclasses
    import inspect

    from k3deploy.runtime import reading

    requests = [cls for cls in vars(reading).values()
                if isinstance(cls, type) and issubclass(cls, reading.Request) and cls is not reading.Request]
    assert len(requests) == 24
    for cls in requests:
        sample = cls(**{f.name: f"<{f.name}>" for f in dataclasses.fields(cls)})
        parameters = inspect.signature(cls.fact().command).parameters
        assert set(sample.arguments()) <= set(parameters), cls.__name__
    # a field that only says where the value goes is not asked of the fact
    assert ReadHealth(unit="k3-engine", url="http://x/health").arguments() == {"url": "http://x/health"}
    assert reading.ReadRevisions(group="engine", directory="/d").arguments() == {"directory": "/d"}
