"""Beyond the builder's 16 nodes: the same rules, said in the plan's warnings; NVLink domains of 18 trays in the
plan, the preflight and the simulated nodes; lint still applies."""

from __future__ import annotations

import pytest

from k3deploy import resolve
from k3deploy.errors import SelectionError
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.checks import run_checks
from k3deploy.recipe.argv import flag_value
from k3deploy.recipe.fixes import deployable
from k3deploy.recipe.lint import lint_plan
from k3deploy.recipe.taxonomy import BUILDER_MAX_NODES, hardware
from k3deploy.vendors.nvidia.checks import NvidiaFacts
from k3deploy.vendors.nvidia.facts import GpuFabric, NvidiaGpu


@pytest.mark.parametrize("nodes", [18, 36, 72])
def test_a_full_rack_and_more_is_planned_by_the_same_rules(recipe, nodes):
    plan = deployable(resolve(recipe, hardware="gb300", strategy="multi_node_dep", nodes=nodes))
    assert len(plan.nodes) == nodes
    gpus = 4 * nodes
    head, last = plan.nodes[0], plan.nodes[-1]
    assert flag_value(head.argv, "--data-parallel-size") == str(gpus)  # DP72 on a full NVL72 rack of 18 trays
    assert flag_value(last.argv, "--data-parallel-start-rank") == str(4 * (nodes - 1))
    assert sorted(int(flag_value(n.argv, "--data-parallel-start-rank") or 0) for n in plan.nodes) == \
        list(range(0, gpus, 4))
    assert any(w.startswith(f"{nodes} nodes: beyond the {BUILDER_MAX_NODES} nodes the recipes builder renders")
               for w in plan.warnings)
    if nodes > 18:
        assert any(f"span {nodes // 18} NVLink domains of 18 gb300 trays" in w for w in plan.warnings)
    assert not [f for f in lint_plan(recipe, plan) if f.severity == "error"]


def test_inside_the_builder_range_nothing_is_added(recipe):
    plan = resolve(recipe, hardware="gb300", strategy="multi_node_dep", nodes=16)
    assert plan.warnings == []


def test_tensor_parallelism_across_domains_is_called_out(recipe):
    plan = resolve(recipe, hardware="gb300", strategy="multi_node_tp", nodes=36)
    assert any("tensor parallelism needs NVLink, which ends at the domain; keep a group within 18 trays" in w
               for w in plan.warnings)
    pd = resolve(recipe, hardware="gb300", strategy="pd_cluster", prefill_nodes=4, decode_nodes=24)
    assert any(w.startswith("the decode pool of 24 nodes spans 2 NVLink domains") for w in pd.warnings)


def test_lint_still_applies_beyond_the_builder(recipe):
    plan = resolve(recipe, hardware="gb300", strategy="multi_node_tp", nodes=18,
                   extra_args=["--decode-context-parallel-size", "5"])
    assert "dcp-divides-tp" in {f.code for f in lint_plan(recipe, plan) if f.severity == "error"}


def test_node_counts_have_an_upper_bound(recipe):
    with pytest.raises(SelectionError, match="must be ≤ 256"):
        resolve(recipe, hardware="gb300", strategy="multi_node_dep", nodes=257)


def _tray(host: str, uuid: str) -> NvidiaFacts:
    gpus = [NvidiaGpu("NVIDIA GB300", 284208, "580.95.05") for _ in range(4)]
    fabric = [GpuFabric(gpu=f"0000000{i}:01:00.0", state="Completed", status="Success", clique_id="32766",
                        cluster_uuid=uuid) for i in range(4)]
    return NvidiaFacts(host=host, gpus=gpus, fabric=fabric)


@pytest.mark.parametrize("strategy, one_domain, status", [
    ("multi_node_tp", True, "fail"), ("multi_node_dep", False, "warn")])
def test_preflight_holds_tensor_parallel_groups_to_one_nvlink_domain(strategy, one_domain, status):
    req = Requirements(hardware()["gb300"], "default", 1680.0, nodes=36, strategy=strategy, multi_node=True,
                       one_nvlink_domain=one_domain)
    hosts = [_tray(f"t{i}", "aaaa" if i < 18 else "bbbb") for i in range(36)]
    rows = [r for r in run_checks(req, hosts) if r.check in ("nvlink.fabric", "nvlink.domains")]
    if one_domain:
        assert {r.host for r in rows if r.status == "fail"} == {f"t{i}" for i in range(18, 36)}
    else:
        assert all(r.status == "pass" for r in rows if r.check == "nvlink.fabric")
        domains = next(r for r in rows if r.check == "nvlink.domains")
        assert (domains.status, domains.observed) == (status, "2 NVLink domain(s) (18 + 18 trays)")


def test_simulated_trays_beyond_a_rack_sit_in_the_next_domain():
    from k3sim.profiles import node_config

    def uuid(rank: int) -> str:
        doc = node_config("gb300", rank, 36, f"n{rank}", f"10.77.0.{11 + rank}", [], 0.01, "base-uuid")
        return doc["fabric"]["cluster_uuid"]

    assert {uuid(r) for r in range(18)} == {"base-uuid"}
    assert len({uuid(r) for r in range(18, 36)}) == 1 and uuid(18) != "base-uuid"


def test_the_simulated_timeouts_stretch_with_the_nodes_sharing_the_machine():
    from k3sim.profiles import node_config

    small = node_config("gb300", 0, 2, "n0", "10.77.0.11", [], 0.01, "u")
    rack = node_config("gb300", 0, 72, "n0", "10.77.0.11", [], 0.01, "u")
    assert small["timeout_scale"] == 0.01 and rack["timeout_scale"] == 0.18
    assert small["load_seconds"] == rack["load_seconds"]  # the engines' own load time is not stretched


def test_an_unusual_size_for_the_model_gets_a_note_on_whether_its_dimensions_divide():
    from k3deploy import load_recipe

    recipe = load_recipe()
    three = resolve(recipe, hardware="gb300", nodes=3)          # TP 12 from 3 trays of 4 GPUs
    (note,) = [w for w in three.warnings if "unusual size" in w]
    assert note.startswith("--tensor-parallel-size 12 is an unusual size for the model")
    assert "896 routed experts are not split by count" in note and "divides num_attention_heads" in note
    pd = resolve(recipe, hardware="gb300", strategy="pd_cluster", prefill_nodes=3, decode_nodes=4)
    assert any("896 routed experts over 12 expert-parallel ranks do not divide (74.67 each" in w for w in pd.warnings)
    assert not [w for w in resolve(recipe, hardware="gb300", nodes=2).warnings if "unusual size" in w]   # TP 8
    assert not [w for w in resolve(recipe, hardware="gb300", nodes=4).warnings if "unusual size" in w]
