"""Inventory vs plan: hosts get their plan node, placeholders are filled, mismatches are one clear error."""

from __future__ import annotations

import pytest

from helpers import ROOT, present
from k3deploy import K3Error, resolve
from k3deploy.model.binding import HostRecord, bind, fill, rendezvous_port
from k3deploy.model.inventory import records_of, variables_for
from k3deploy.runtime.connections import load_inventory
from k3deploy.runtime.gather import gather
from k3deploy.runtime.views import INVENTORY_ONLY


def hosts(n, **extra):
    out = [HostRecord("h0", ("head",), {"k3_ip": "192.0.2.1"})]
    out += [HostRecord(f"w{i}", ("workers",), {"k3_ip": f"192.0.2.{i + 1}", "rank": i}) for i in range(1, n)]
    return out


def test_placeholders_filled_per_host(recipe):
    plan = resolve(recipe, hardware="gb200", strategy="multi_node_dep")
    bound = bind(plan, hosts(4), ifaces={"h0": "ib0", "w1": "ib1", "w2": "ib0", "w3": "ib0"})
    w1 = present(bound["w1"].engine)
    assert w1.argv[w1.argv.index("--data-parallel-address") + 1] == "192.0.2.1"
    assert w1.env["NCCL_SOCKET_IFNAME"] == "ib1" and present(bound["h0"].engine).env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert not any("$" in a for b in bound.values() for a in present(b.engine).argv)
    assert rendezvous_port(w1.argv) == 29550
    assert rendezvous_port(resolve(recipe, hardware="gb300").nodes[1].argv) == 29501


def test_pd_pools_and_router_filled(recipe):
    plan = resolve(recipe, hardware="b300", strategy="pd_cluster")
    recs = [HostRecord("p0", ("prefill", "router"), {"k3_ip": "192.0.2.10"}),
            HostRecord("d0", ("decode",), {"k3_ip": "192.0.2.20", "rank": 0}),
            HostRecord("d1", ("decode",), {"k3_ip": "192.0.2.21", "rank": 1})]
    bound = bind(plan, recs, router_port=30000)
    assert present(bound["d1"].engine).env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "192.0.2.21"
    dec = present(bound["d1"].engine).argv
    assert dec[dec.index("--data-parallel-address") + 1] == "192.0.2.20"
    assert dec[dec.index("--data-parallel-rpc-port") + 1] == "29550"
    router = present(bound["p0"].router).argv
    assert "http://192.0.2.21:8002" in router and router[router.index("--port") + 1] == "30000"


@pytest.mark.parametrize("records, needle", [
    (hosts(3), "the plan for multi_node_tp on gb300 has 2 node(s) but the inventory has 3"),
    (hosts(1), "has 2 node(s) but the inventory has 1"),
    ([HostRecord("w1", ("workers",), {}), HostRecord("w2", ("workers",), {})], "needs exactly one host in group head"),
    ([HostRecord("h0", ("head",), {}), HostRecord("w1", ("workers",), {"rank": 1}),
      HostRecord("w2", ("workers",), {"rank": 1})], "duplicate rank 1 in group workers"),
    ([HostRecord("h0", ("head",), {}), HostRecord("w1", ("workers",), {"rank": 1}),
      HostRecord("w2", ("workers",), {})], "have no rank while others do"),
])
def test_inventory_mismatch_is_one_clear_error(recipe, records, needle):
    plan = resolve(recipe, hardware="gb300", strategy="multi_node_tp", nodes=2)
    with pytest.raises(K3Error) as exc:
        bind(plan, records)
    assert needle in str(exc.value)


def test_fill_leaves_unknown_placeholders():
    assert fill("$HEAD_IP:$OTHER ${X}", {"HEAD_IP": "1.2.3.4"}) == "1.2.3.4:$OTHER ${X}"


@pytest.mark.parametrize("inventory", sorted((ROOT / "inventories").glob("*.py")), ids=lambda p: p.stem)
def test_example_inventories_plan_cleanly(inventory):
    r = gather(str(inventory), INVENTORY_ONLY).require_rollout()
    assert r.units and all(u.unit_text.startswith("# Managed by k3deploy") for u in r.units)
    records = records_of(load_inventory(str(inventory)).inventory)
    v = variables_for(records, str(inventory))[records[0].name].vars
    assert v.k3_hardware == r.plan.hardware


def test_unknown_variable_names_the_key(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text('head = [("n1", {"ssh_hostname": "192.0.2.1"})]\n')
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("k3_hardware: b300\nk3_hardwre: b200\n")
    with pytest.raises(K3Error, match="unknown variable 'k3_hardwre'"):
        gather(str(inv), INVENTORY_ONLY).require_rollout()
