"""The first contact: a simulated cluster deploys as created (``sim up`` picks the recommended strategy that
fits its node count, or refuses naming the sizes that fit), messages in an inventory's context name the variable, the
file and the group, ids get a did-you-mean, ``options`` and ``resolve`` agree on the hardware ids, and the demo's and
the chat client's interfaces."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT
from k3deploy import load_recipe
from k3deploy.errors import K3Error, SelectionError
from k3deploy.model.binding import HostRecord
from k3deploy.model.pipeline import target
from k3deploy.recipe import fit
from k3deploy.recipe.offering import offering
from k3deploy.recipe.resolve import resolve
from k3sim import cluster as sim
from k3sim.inventory import write_inventory


def _inventory(tmp_path: Path, hardware: str, nodes: int, pools: dict[str, int] | None = None,
               strategy: str | None = None, replicas: int = 1) -> tuple[list[HostRecord], str]:
    """What ``sim up`` writes for this cluster (inventory and group_vars, through its own code), as host records."""
    picked, default = sim.choose_strategy(hardware, nodes // replicas, pools, strategy)
    recs: list[dict[str, Any]] = [{"name": f"n{i}", "ip": f"10.9.0.{11 + i}", "rank": i} for i in range(nodes)]
    state: dict[str, Any] = {"name": "t", "hardware": hardware, "nodes": recs, "pools": pools, "replicas": replicas,
                             "strategy": picked, "strategy_default": default, "key": "k", "known_hosts": "kh",
                             "inventory": str(tmp_path / "t.py")}
    write_inventory(state)
    if pools:
        p = pools["prefill"]
        groups = [("prefill",)] * p + [("decode",)] * pools["decode"]
        records = [HostRecord(r["name"], g, {"k3_ip": r["ip"]}) for r, g in zip(recs, groups, strict=True)]
        records.append(HostRecord("router0", ("router",), {"k3_ip": recs[0]["ip"]}))
    else:
        records = [HostRecord(r["name"], ("head",) if i == 0 else ("workers",), {"k3_ip": r["ip"]})
                   for i, r in enumerate(recs)]
    return records, state["inventory"]


# ------------------------------------------------------------------------------------------------ sim up


def test_sim_up_picks_a_strategy_that_fits_the_node_count(tmp_path):
    """mi355x x 2: the recommendation (single_node_tp) runs on 1 node; sim up writes multi_node_tp and the
    inventory resolves as created."""
    assert sim.choose_strategy("mi355x", 2, None, None) == ("multi_node_tp", False)
    records, inv = _inventory(tmp_path, "mi355x", 2)
    text = (tmp_path / "group_vars" / "all.yml").read_text()
    assert "\nk3_strategy: multi_node_tp\n" in text
    t = target(records, inv)
    assert t.plan_error is None and t.plan is not None and t.plan.strategy == "multi_node_tp"


def test_sim_up_refuses_a_size_nothing_fits_naming_the_sizes_that_fit():
    with pytest.raises(K3Error, match=r"no strategy of kimi-k3 runs on 2 nodes of h100: give --nodes of a size "
                                      r"that fits: 4-16 nodes \(multi_node_tp"):
        sim.choose_strategy("h100", 2, None, None)
    with pytest.raises(K3Error, match=r"--strategy single_node_tp does not run on 2 nodes of mi355x .*strategies "
                                      r"that fit 2 nodes: multi_node_tp"):
        sim.choose_strategy("mi355x", 2, None, "single_node_tp")
    with pytest.raises(K3Error, match=r"--layout pd:1,1 does not fit pd_cluster on gb300.*--layout pd:2,4 --nodes 6"):
        sim.choose_strategy("gb300", 2, {"prefill": 1, "decode": 1}, None)


def _offered() -> list[tuple[str, str, int, dict[str, int] | None]]:
    data = offering(load_recipe())
    out: list[tuple[str, str, int, dict[str, int] | None]] = []
    for hw_id, entry in data["hardware"].items():
        for rec in entry["recommended"].values():
            out.append((hw_id, rec["strategy"], rec["nodes"], None))
        for row in entry["strategies"]:
            if row["deploy_type"] == "pd_cluster" and row.get("prefill_nodes"):
                pools = {"prefill": row["prefill_nodes"], "decode": row["decode_nodes"]}
                out.append((hw_id, "pd_cluster", sum(pools.values()), pools))
    return out


@pytest.mark.parametrize(("hw_id", "strategy", "nodes", "pools"), _offered(),
                         ids=lambda v: str(v) if not isinstance(v, dict) else f"pd:{v['prefill']},{v['decode']}")
def test_every_hardware_at_its_default_size_and_every_listed_pd_layout_resolves_as_created(tmp_path, hw_id, strategy,
                                                                                           nodes, pools):
    """Done means: ``sim up`` for every hardware id at its default node count, and with ``--layout pd:P,D`` at the
    sizes ``options`` lists, deploys without editing anything (its inventory's plan resolves)."""
    records, inv = _inventory(tmp_path, hw_id, nodes, pools)
    t = target(records, inv)
    assert t.plan_error is None, t.plan_error
    assert t.plan is not None and t.plan.strategy == strategy


def test_the_recommendation_stays_a_comment_when_an_unset_strategy_deploys_it(tmp_path):
    _inventory(tmp_path, "gb300", 2)
    text = (tmp_path / "group_vars" / "all.yml").read_text()
    assert "# k3_strategy: multi_node_tp" in text and "\nk3_strategy:" not in text


def test_sim_up_did_you_mean_before_touching_anything():
    with pytest.raises(K3Error, match=r"unknown hardware 'MI355X'.*\(did you mean 'mi355x'\?\)"):
        sim.up(hardware="MI355X", nodes=2, name="g2t")
    with pytest.raises(K3Error, match=r"unknown strategy 'multi-node-dep'.*\(did you mean 'multi_node_dep'\?\)"):
        sim.up(hardware="mi355x", nodes=2, name="g2t", strategy="multi-node-dep")


# ------------------------------------------------------------------------------------------------ ids


def test_resolve_and_options_say_the_same_of_an_unknown_hardware_with_a_did_you_mean():
    recipe = load_recipe()
    with pytest.raises(SelectionError) as by_resolve:
        resolve(recipe, hardware="MI355X")
    with pytest.raises(SelectionError) as by_options:
        offering(recipe, hardware_id="MI355X")
    assert str(by_resolve.value) == str(by_options.value)
    assert "(did you mean 'mi355x'?)" in str(by_resolve.value)
    assert "trillium" not in str(by_options.value)   # the recipe's hardware, not the whole taxonomy
    with pytest.raises(SelectionError, match=r"\(did you mean 'multi_node_dep'\?\)"):
        resolve(recipe, hardware="gb300", strategy="multi-node-dep")


def test_near_matches_case_and_dashes_and_leaves_strangers_alone():
    assert fit.near("MI355X", ["mi355x", "mi300x"]) == "mi355x"
    assert fit.near("multi-node-dep", ["multi_node_dep", "multi_node_tep"]) == "multi_node_dep"
    assert fit.did_you_mean("quux", ["mi355x"]) == ""
    assert fit.did_you_mean("mi355x", ["mi355x"]) == ""


# ------------------------------------------------------------------------------------------------ inventory context


def _write(tmp_path: Path, groups: dict[str, list[str]], gv: str) -> tuple[list[HostRecord], str]:
    (tmp_path / "group_vars").mkdir(exist_ok=True)
    (tmp_path / "group_vars" / "all.yml").write_text(gv)
    inv = tmp_path / "inv.py"
    inv.write_text("")
    records = [HostRecord(h, (g,), {"k3_ip": f"10.9.0.{11 + i}"})
               for i, (g, hosts) in enumerate((g, hs) for g, hs in groups.items()) for h in hosts]
    return records, str(inv)


def test_a_strategy_that_does_not_fit_the_hosts_is_told_in_the_inventorys_terms(tmp_path):
    records, inv = _write(tmp_path, {"head": ["a"], "workers": ["b"]},
                          "k3_hardware: mi355x\nk3_strategy: single_node_tp\n")
    err = target(records, inv).plan_error
    assert err is not None
    assert "--nodes" not in err and "use a multi_node" not in err
    gv = str(tmp_path / "group_vars" / "all.yml")
    assert f"set `k3_strategy: multi_node_tp` in {gv}" in err, err
    assert "strategies that fit this inventory's 2 engine hosts (head + workers): multi_node_tp, " in err


def test_a_size_nothing_fits_names_the_group_to_add_hosts_to(tmp_path):
    records, inv = _write(tmp_path, {"head": ["a"], "workers": ["b"]}, "k3_hardware: h100\n")
    err = target(records, inv).plan_error
    assert err is not None and "--nodes" not in err
    assert "sizes that fit: 4-16 nodes" in err and f"add hosts to `workers` in {inv}" in err, err


def test_pd_pools_too_small_name_the_hosts_to_add_per_group(tmp_path):
    records, inv = _write(tmp_path, {"prefill": ["a"], "decode": ["b"], "router": ["a"]},
                          "k3_hardware: gb300\nk3_strategy: pd_cluster\n")
    err = target(records, inv).plan_error
    assert err is not None and "--prefill-nodes" not in err and "--decode-nodes" not in err
    assert "add 1 host(s) to `prefill` and 3 host(s) to `decode`" in err, err


def test_an_unknown_strategy_in_group_vars_names_its_file_and_the_likely_id(tmp_path):
    records, inv = _write(tmp_path, {"head": ["a"], "workers": ["b"]},
                          "k3_hardware: mi355x\nk3_strategy: multi-node-tp\n")
    with pytest.raises(K3Error) as exc:
        target(records, inv)
    assert str(exc.value).startswith(f"k3_strategy ({tmp_path / 'group_vars' / 'all.yml'}): unknown strategy")
    assert "(did you mean 'multi_node_tp'?)" in str(exc.value)


# ------------------------------------------------------------------------------------------------ tools


def _tool(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_chat_takes_the_question_as_an_argument():
    chat = _tool("chat")
    args = chat.parse(["http://10.0.0.1:8000", "What", "is", "2+2?", "--model", "m"])
    assert (args.endpoint, " ".join(args.question), args.model) == ("http://10.0.0.1:8000", "What is 2+2?", "m")
    assert chat.parse(["http://x:8000"]).question == []


def test_plan_summary_counts_per_node_and_names_what_restarts():
    plan = {"changes_pending": True, "endpoint": "http://10.0.0.1:8000", "restart_order": ["n1:k3-engine.service"],
            "hosts": [{"host": "n1", "role": "head", "rank": 0, "changes": [
                {"kind": "file", "op": "create"}, {"kind": "file", "op": "create"}, {"kind": "argv", "op": "+"},
                {"kind": "argv", "op": "-"}, {"kind": "env", "op": "+"}, {"kind": "image", "from": None, "to": "x"},
                {"kind": "restart", "unit": "k3-engine.service"}]},
                {"host": "n2", "role": "worker", "rank": 1, "changes": []}]}
    lines = _tool("plan_summary").summary(plan)
    assert lines == ["n1 (head rank 0): 2 files to create, 2 flag lines changed, 1 env line changed, a new image",
                     "n2 (worker rank 1): no changes",
                     "restarts, in order: n1:k3-engine.service",
                     "endpoint afterwards: http://10.0.0.1:8000"]
    assert _tool("plan_summary").summary({"changes_pending": False})[0].startswith("no changes")


def test_demo_leaves_an_existing_cluster_of_its_name_alone(tmp_path):
    """K3_DEMO_NAME names the cluster; one of that name that exists stops the demo before set-up, untouched."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "state.json").write_text(json.dumps({"name": "mine"}))
    env = {**os.environ, "K3SIM_STATE": str(tmp_path), "K3_DEMO_NAME": "mine"}
    proc = subprocess.run(["bash", str(ROOT / "tools" / "demo.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "exists already" in proc.stderr and "K3_DEMO_NAME=" in proc.stderr
    assert (tmp_path / "mine" / "state.json").exists()
    text = (ROOT / "tools" / "demo.sh").read_text()
    assert "sim down --name \"$NAME\" >/dev/null 2>&1 || true\n\necho" not in text   # no tear-down before sim up
    assert "== try next" in text and "plan_summary.py" in text
    assert sys.executable  # the demo runs its own venv; only its refusal runs here
