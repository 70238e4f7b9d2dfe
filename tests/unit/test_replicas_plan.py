"""Replicas: several engine groups of one plan behind one router, and changes that roll replica by replica."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from helpers import present
from k3deploy import K3Error, resolve
from k3deploy.model import commands
from k3deploy.model.binding import HostRecord, bind
from k3deploy.model.diff import build, render_text
from k3deploy.model.observed import Installed
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import mark_changes, plan_rollout, sha256
from k3deploy.model.variables import Variables


def replicas(r: int, per: int, **data) -> list[HostRecord]:
    out = []
    for i in range(r):
        for j in range(per):
            out.append(HostRecord(f"r{i}n{j}", ("head",) if j == 0 else ("workers",),
                                  {"k3_ip": f"192.0.2.{10 * i + j + 10}", "rank": j, "k3_replica": i,
                                   "k3_hardware": "gb300", **data}))
    return out


def installed_as(r, override: Mapping[tuple[str, str], Installed] | None = None) -> dict[tuple[str, str], Installed]:
    """What the hosts would report after a successful rollout of ``r`` (``override``: (host, unit) -> Installed)."""
    out = {(u.host, u.unit): Installed(unit_sha=sha256(u.unit_text), env_sha=sha256(u.env_text), active="active")
           for u in r.units}
    out.update(override or {})
    return out


def test_each_replica_binds_the_whole_plan_with_its_own_head(recipe):
    plan = resolve(recipe, hardware="gb300", strategy="multi_node_tp", nodes=2)
    bound = bind(plan, replicas(2, 2))
    for i in range(2):
        worker = present(bound[f"r{i}n1"].engine)
        assert worker.replica == i and worker.rank == 1
        # each worker joins its own replica's head
        assert worker.argv[worker.argv.index("--master-addr") + 1] == f"192.0.2.{10 * i + 10}"
        assert present(bound[f"r{i}n0"].engine).rank == 0


def test_replicas_are_groups_behind_one_router():
    t = target(replicas(2, 2), None)
    r = desired_rollout(t)
    assert r.groups == ["engine-r0", "engine-r1", "router"]
    assert r.replicas == ["engine-r0", "engine-r1"]
    router = r.group("router")[0]
    argv = router.node.argv
    urls = argv[argv.index("--worker-urls") + 1:argv.index("--host")]
    assert urls == ["http://192.0.2.10:8000", "http://192.0.2.20:8000"]   # the heads serve (internal LB)
    assert r.endpoint == "http://192.0.2.10:30000"
    assert t.plan is not None and len(t.plan.nodes) == 2                  # the plan is one replica's


def test_one_replica_has_no_router_and_restarts_whole():
    r = desired_rollout(target(replicas(1, 2), None))
    assert r.groups == ["engine"] and r.replicas == []
    assert "whole group" in r.how_changes_roll()


def test_an_engine_change_rolls_replica_by_replica_and_keeps_the_router():
    t = target(replicas(3, 2), None)
    r = desired_rollout(t)
    r = r.decided(changed := mark_changes(r, {}))   # nothing installed: everything starts, router included
    assert changed == {"engine-r0", "engine-r1", "engine-r2", "router"} and not r.rolling
    assert r.waves() == [["engine-r0", "engine-r1", "engine-r2", "router"]]
    # an env change on every engine (k3_extra_env) leaves the router's unit as it was
    t2 = target(replicas(3, 2, k3_extra_env={"FOO": "1"}), None)
    r2 = desired_rollout(t2)
    have = installed_as(r)
    r2 = r2.decided(mark_changes(r2, have))
    assert mark_changes(r2, have) == {"engine-r0", "engine-r1", "engine-r2"}
    assert r2.rolling and r2.waves() == [["engine-r0"], ["engine-r1"], ["engine-r2"]]
    t3 = target(replicas(3, 2, k3_extra_env={"FOO": "1"}, k3_max_unavailable=2), None)
    r3 = desired_rollout(t3)
    r3 = r3.decided(mark_changes(r3, installed_as(r)))
    assert r3.waves() == [["engine-r0", "engine-r1"], ["engine-r2"]]


def test_a_replica_that_is_down_is_the_only_one_restarted():
    r = desired_rollout(target(replicas(2, 2), None))
    down = Installed(unit_sha=sha256(r.units[2].unit_text), env_sha=sha256(r.units[2].env_text), active="failed")
    have = installed_as(r, {})
    have[(r.units[2].host, r.units[2].unit)] = down
    r = r.decided(mark_changes(r, have))
    assert mark_changes(r, have) == {"engine-r1"} and r.waves() == [["engine-r1"]]


def test_the_diff_shows_the_steps_of_a_rolling_change():
    r = desired_rollout(target(replicas(2, 2), None))
    r2 = desired_rollout(target(replicas(2, 2, k3_extra_env={"FOO": "1"}), None))
    report = build(r2, installed_as(r))
    text = render_text(report, r2)
    assert "replica by replica behind the router" in text
    assert "step 1 of 2: engine-r0" in text and "step 2 of 2: engine-r1" in text
    assert report.to_dict()["rolling_steps"] == [["engine-r0"], ["engine-r1"]]
    assert any("2 replicas behind the router" in n for n in report.notes)


@pytest.mark.parametrize("records, needle", [
    (replicas(2, 2)[:3], "the inventory of replica 1 has 1 (1 head + 0 workers): give every replica the same"),
    ([*replicas(1, 2), *[HostRecord(h.name + "x", h.groups, {**h.data, "k3_replica": 2}) for h in replicas(1, 2)]],
     "k3_replica values [0, 2] do not number the replicas 0..1"),
    ([HostRecord("a", ("head",), {"k3_hardware": "gb300", "k3_replica": 0}),
      HostRecord("b", ("workers",), {"k3_hardware": "gb300", "k3_replica": 0, "rank": 1}),
      HostRecord("c", ("workers",), {"k3_hardware": "gb300", "k3_replica": 1, "rank": 0}),
      HostRecord("d", ("workers",), {"k3_hardware": "gb300", "k3_replica": 1, "rank": 1})],
     "needs exactly one host in group head of replica 1, found 0: give one head host this k3_replica"),
])
def test_replica_mistakes_are_one_clear_error(records, needle):
    t = target(records, None)
    assert t.plan is None and needle in (t.plan_error or ""), t.plan_error


def test_pd_cluster_refuses_replicas(recipe):
    plan = resolve(recipe, hardware="b300", strategy="pd_cluster")
    recs = [HostRecord("p0", ("prefill", "router"), {"k3_ip": "192.0.2.10", "k3_replica": 1}),
            HostRecord("d0", ("decode",), {"k3_ip": "192.0.2.20", "rank": 0}),
            HostRecord("d1", ("decode",), {"k3_ip": "192.0.2.21", "rank": 1})]
    with pytest.raises(K3Error, match="pd_cluster has no replicas"):
        bind(plan, recs)


def test_router_commands_accept_what_the_real_router_answers():
    remove = commands.router_remove("http://10.0.0.1:30000", ["http://10.0.0.2:8000"])
    assert "'http://10.0.0.1:30000/remove_worker?url=http://10.0.0.2:8000'" in remove and "-X POST" in remove
    add = commands.router_add("http://10.0.0.1:30000", ["http://10.0.0.2:8000"], 600)
    # vllm-router 0.1.17: 200 "Successfully added worker", 400 "Worker ... already exists"
    assert "already exists (HTTP 400)" in add and "-m 600" in add


def test_variables_document_the_replica_knobs():
    fields = Variables.model_fields
    for name in ("k3_replica", "k3_max_unavailable", "k3_drain_timeout"):
        assert fields[name].description
    assert Variables().k3_max_unavailable == 1
    with pytest.raises(ValueError):
        Variables(k3_max_unavailable=0)


def test_compute_puts_the_router_on_replica_0s_head():
    t = target(replicas(2, 1, k3_hardware="b300"), None)   # two single-node replicas
    r = plan_rollout(t.require_plan(), t.records, t.vars)
    assert [u.group for u in r.units] == ["engine-r0", "engine-r1", "router"]
    assert r.group("router")[0].host == "r0n0"


def test_the_runbook_rolls_replica_by_replica():
    from k3deploy.model.runbook import Context, blocks, build, to_markdown

    r = desired_rollout(target(replicas(2, 2), None))
    hosts = r.hosts
    md = to_markdown(build(r, Context(inventory="inventories/x.py", preflight=[], addresses={h: h for h in hosts},
                                      ssh={h: ["ssh", f"root@{h}"] for h in hosts}, brand="NVIDIA", guide=None,
                                      version="0")))
    assert "5b. An engine change, replica by replica" in md
    rolling = [b for b in blocks(md) if b.when == "rolling"]
    # per replica: out of the router (on the router host), drain its head, stop, start, back into the router
    texts = [b.text for b in rolling]
    first_remove = next(i for i, t in enumerate(texts) if "remove_worker?url=http://192.0.2.10:8000" in t)
    first_add = next(i for i, t in enumerate(texts) if "add_worker?url=http://192.0.2.10:8000" in t)
    second_remove = next(i for i, t in enumerate(texts) if "remove_worker?url=http://192.0.2.20:8000" in t)
    assert first_remove < first_add < second_remove
    assert rolling[first_remove].node == "r0n0" == rolling[first_add].node   # the router runs on replica 0's head
    between = texts[first_remove:first_add]
    assert any("/metrics" in t for t in between) and any(t.startswith("systemctl stop") for t in between)
    # the bring-up itself is unchanged: both replicas, then the router
    assert not any("remove_worker" in b.text for b in blocks(md) if b.when is None)


def test_sim_writes_an_inventory_of_replicas(tmp_path):
    from k3deploy.model.inventory import records_of
    from k3deploy.runtime.connections import load_inventory
    from k3sim.inventory import write_inventory

    nodes = [{"name": f"rp-node{i + 1}", "ip": f"10.9.0.{10 + i}", "rank": i} for i in range(6)]
    state: dict[str, Any] = {"name": "rp", "hardware": "gb300", "nodes": nodes, "replicas": 3, "inventory": str(tmp_path / "rp.py"),
             "key": str(tmp_path / "id"), "known_hosts": str(tmp_path / "kh")}
    write_inventory(state)
    recs = records_of(load_inventory(state["inventory"]).inventory)
    t = target(recs, state["inventory"])
    r = desired_rollout(t)
    assert r.replicas == ["engine-r0", "engine-r1", "engine-r2"]
    assert [(u.host, u.group, u.rank) for u in r.units if u.group != "router"] == [
        ("rp-node1", "engine-r0", 0), ("rp-node3", "engine-r1", 0), ("rp-node5", "engine-r2", 0),
        ("rp-node2", "engine-r0", 1), ("rp-node4", "engine-r1", 1), ("rp-node6", "engine-r2", 1)]


def test_sim_up_refuses_replicas_that_do_not_divide_the_nodes():
    from k3sim.cluster import up
    from k3sim.host import SimError

    with pytest.raises(SimError, match="bad --replicas 3: give a number >= 1 that divides --nodes 4"):
        up("gb300", 4, name="rq", replicas=3)
    with pytest.raises(SimError, match="a P/D cluster has no replicas"):
        up("b300", 4, name="rq", replicas=2, pd_layout="pd:2,2")
