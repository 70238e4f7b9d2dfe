"""The resolve and options commands, run as a user runs them."""

from __future__ import annotations

import json
import shlex

from helpers import ROOT, k3
from k3deploy import resolve


def test_resolve_json_is_plan_to_dict(recipe):
    proc = k3("resolve", "--hardware", "gb200", "--strategy", "multi_node_dep", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data == resolve(recipe, hardware="gb200", strategy="multi_node_dep").to_dict()
    assert data["image"] == "vllm/vllm-openai:kimi-k3" and data["features"] == ["tool_calling", "reasoning"]
    assert [(n["role"], n["rank"]) for n in data["nodes"]] == [("head", 0), ("worker", 1), ("worker", 2), ("worker", 3)]
    assert data["nodes"][0]["argv"][:3] == ["vllm", "serve", "moonshotai/Kimi-K3"]


def test_resolve_text_round_trips_through_a_shell(recipe):
    proc = k3("resolve", "--hardware", "b300", "--features", "tool_calling,reasoning,decode_context_parallelism")
    assert proc.returncode == 0, proc.stderr
    plan = resolve(recipe, hardware="b300", features=["tool_calling", "reasoning", "decode_context_parallelism"])
    text = proc.stdout
    start = text.index("vllm serve")
    block = text[start: text.index("\n\n", start)]
    # the printed command, read by a POSIX shell, gives back exactly the plan's argv
    assert shlex.split(block.replace("\\\n", " ")) == plan.nodes[0].argv
    assert "docker run --gpus all" in text and "vllm/vllm-openai:kimi-k3 moonshotai/Kimi-K3" in text


def test_resolve_prints_a_docker_run_form_only_where_it_would_run():
    """The recipes site's docker run form is labelled as its form, and left out where it would not run: Ascend
    (--gpus all) and the nodes of a multi-node group (-p without host networking or RDMA devices)."""
    single = k3("resolve", "--hardware", "b300")
    assert single.returncode == 0 and "# the recipes site's docker run form (single node;" in single.stdout
    assert "docker run --gpus all" in single.stdout
    for args, why in ((["--hardware", "gb300", "--strategy", "multi_node_tp", "--nodes", "2"], "host networking"),
                      (["--hardware", "ascend_910c", "--variant", "ascend_w4a8"], "Ascend NPUs")):
        proc = k3("resolve", *args)
        assert proc.returncode == 0, proc.stderr
        assert "docker run -" not in proc.stdout and "# no docker run form" in proc.stdout and why in proc.stdout
        assert "k3deploy resolve --inventory INVENTORY" in proc.stdout


def test_resolve_pd_prints_router_and_pools():
    proc = k3("resolve", "--hardware", "b300", "--strategy", "pd_cluster", "--json")
    data = json.loads(proc.stdout)
    roles = [(n["role"], n["rank"]) for n in data["nodes"]]
    assert roles == [("prefill", 0), ("decode", 0), ("decode", 1), ("router", 0)]
    assert data["nodes"][-1]["argv"][0] == "vllm-router"
    assert data["nodes"][2]["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$DECODE_NODE_2"


def test_resolve_empty_features_and_warnings_on_stderr():
    proc = k3("resolve", "--hardware", "b200", "--strategy", "multi_node_tp_pp", "--features", "spec_decoding", "--json")
    assert proc.returncode == 0
    assert "warning: feature spec_decoding does not apply to multi_node_tp_pp" in proc.stderr
    assert json.loads(proc.stdout)["features"] == []


def test_options_json():
    proc = k3("options", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["default_hardware"] == "b300"
    assert data["variants"]["ascend_w4a8"]["hardware"] == ["ascend_910c"]
    gb200 = data["hardware"]["gb200"]
    assert gb200["recommended"]["default"] == {"strategy": "multi_node_tp", "nodes": 4}
    rows = {r["strategy"]: r for r in gb200["strategies"]}
    assert rows["multi_node_tp"]["min_gpus"] == 16 and rows["multi_node_tep"]["nodes"] == 2
    assert (rows["pd_cluster"]["prefill_nodes"], rows["pd_cluster"]["decode_nodes"]) == (3, 4)
    assert "multi_node_dep" not in {r["strategy"] for r in data["hardware"]["h200"]["strategies"]}
    feats = {f["name"]: f for f in data["features"]}
    assert feats["reasoning"]["default"] and not feats["spec_decoding"]["default"]
    assert feats["decode_context_parallelism"]["strategies"] == ["single_node_tp"]


def test_options_text_and_filters():
    proc = k3("options", "--hardware", "h100")
    assert proc.returncode == 0 and "multi_node_tp" in proc.stdout and "b300 " not in proc.stdout
    bad = k3("options", "--variant", "fp8")
    assert bad.returncode == 2 and "unknown variant 'fp8'" in bad.stderr


def test_other_recipe_via_flag():
    proc = k3("resolve", "--hardware", "h200", "--recipe", str(ROOT / "tests/recipes/GLM-5.1.yaml"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == "zai-org/GLM-5.1"
