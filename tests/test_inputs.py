"""Bad input: one clear line naming the value and the fix, exit code 2, never a traceback."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
from conftest import ROOT

from k3deploy import RecipeError, SelectionError, load_recipe, parse_recipe, resolve

K3 = sys.executable, "-m", "k3deploy"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from k3deploy.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_vendored_recipe_is_the_upstream_file_byte_for_byte():
    data = (ROOT / "recipes" / "kimi-k3.yaml").read_bytes()
    assert hashlib.sha256(data).hexdigest() == "2293186a1276dc7ac82d9b02c65844416a5e2664d224de3d46cd5763f05b9953"
    assert (ROOT / "k3deploy" / "data" / "kimi-k3.yaml").read_bytes() == data


@pytest.mark.parametrize("args, needle", [
    (["--hardware", "b900"], "unknown hardware 'b900'"),
    (["--hardware", "b300", "--strategy", "multi_node_magic"], "unknown strategy 'multi_node_magic'"),
    (["--hardware", "b300", "--variant", "fp8"], "unknown variant 'fp8'"),
    (["--hardware", "b300", "--features", "dcp"], "unknown feature 'dcp'"),
    (["--hardware", "h200", "--strategy", "multi_node_dep"], "multi_node_dep is not offered on h200"),
    (["--hardware", "h200", "--variant", "nvfp4"], "variant nvfp4 of kimi-k3 does not support h200"),
    (["--hardware", "ascend_910c"], "use --variant ascend_w4a8"),
    (["--hardware", "gb200", "--strategy", "multi_node_tp", "--nodes", "2"],
     "multi_node_tp on gb200 needs ≥16 GPUs = 4 nodes of 4"),
    (["--hardware", "b300", "--nodes", "0"], "--nodes must be ≥ 1, got 0"),
    (["--hardware", "b300", "--nodes", "-3"], "--nodes must be ≥ 1, got -3"),
    (["--hardware", "b300", "--strategy", "multi_node_tp", "--nodes", "257"], "--nodes must be ≤ 256, got 257"),
    (["--hardware", "b300", "--nodes", "2"], "single_node_tp runs on exactly 1 node"),
    (["--hardware", "b300", "--strategy", "multi_node_tp", "--nodes", "1"], "needs at least 2 nodes"),
    (["--hardware", "b300", "--strategy", "pd_cluster", "--prefill-nodes", "1"], "give both --prefill-nodes"),
    (["--hardware", "b300", "--strategy", "pd_cluster", "--prefill-nodes", "1", "--decode-nodes", "1"],
     "the decode pool (dep) on b300 needs ≥16 GPUs = 2 nodes of 8"),
    (["--hardware", "b300", "--prefill-nodes", "1", "--decode-nodes", "2"], "apply to pd_cluster only"),
    (["--hardware", "b300", "--image", "@sha256:1234"], "is not of the form @sha256:"),
    (["--hardware", "b300", "--image", "Not A Ref"], "is not a pinned image reference"),
    (["--hardware", "b300", "--recipe", "/nonexistent/k.yaml"], "recipe file /nonexistent/k.yaml not found"),
    ([], "missing --hardware"),
])
def test_cli_bad_input(args, needle):
    proc = run("resolve", *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_cli_bad_integer_is_usage_error():
    proc = run("resolve", "--hardware", "b300", "--nodes", "two")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "'two'" in proc.stderr


def test_malformed_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("meta:\n  slug: x\nmodel:\n  model_id: [unclosed\nvariants: {}\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(bad)
    assert str(bad) in str(exc.value) and ":5:" in str(exc.value)
    proc = run("resolve", "--hardware", "b300", "--recipe", str(bad))
    assert proc.returncode == 2 and f"{bad}:5:" in proc.stderr and "Traceback" not in proc.stderr


def test_missing_required_key_names_key_path(tmp_path):
    p = tmp_path / "nomodel.yaml"
    p.write_text("meta: {slug: x}\nmodel: {min_vllm_version: '1'}\nvariants: {default: {}}\n")
    with pytest.raises(RecipeError, match=r"required key 'model.model_id' is missing"):
        load_recipe(p)


def test_unquoted_number_arg_names_key_path_and_fix():
    text = (ROOT / "recipes" / "kimi-k3.yaml").read_text().replace('- "0.95"\n', "- 0.95\n", 1)
    with pytest.raises(RecipeError) as exc:
        parse_recipe(text, "k.yaml")
    assert "model.base_args.2" in str(exc.value) and 'quote it: "0.95"' in str(exc.value)


def test_wrong_type_names_key_path():
    text = (ROOT / "recipes" / "kimi-k3.yaml").read_text().replace("vram_minimum_gb: 1680", "vram_minimum_gb: lots")
    with pytest.raises(RecipeError, match=r"variants\.default\.vram_minimum_gb"):
        parse_recipe(text, "k.yaml")


def test_not_a_mapping():
    with pytest.raises(RecipeError, match="a recipe is a YAML mapping"):
        parse_recipe("- a\n- b\n", "list.yaml")


def test_feature_outside_its_strategies_is_reported_not_silent(recipe):
    plan = resolve(recipe, hardware="b200", strategy="multi_node_tp_pp", features=["spec_decoding", "reasoning"])
    assert plan.features == ["reasoning"]
    assert any("spec_decoding does not apply to multi_node_tp_pp" in w for w in plan.warnings)
    assert "--speculative-config" not in plan.nodes[0].argv


def test_feature_order_follows_the_recipe(recipe):
    a = resolve(recipe, hardware="b300", features=["reasoning", "tool_calling"])
    b = resolve(recipe, hardware="b300", features=["tool_calling", "reasoning"])
    assert a.nodes[0].argv == b.nodes[0].argv and a.features == ["tool_calling", "reasoning"]
    none = resolve(recipe, hardware="b300", features=[])
    assert "--reasoning-parser" not in none.nodes[0].argv


def test_image_overrides(recipe):
    digest = "sha256:" + "ab" * 32
    assert resolve(recipe, hardware="b300").image == "vllm/vllm-openai:kimi-k3"
    assert resolve(recipe, hardware="mi355x").image == "vllm/vllm-openai-rocm:kimi-k3"
    asc = resolve(recipe, hardware="ascend_910c", variant="ascend_w4a8")
    assert asc.image == "quay.io/ascend/vllm-ascend:kimi-k3-a3" and asc.vendor == "npu"
    assert resolve(recipe, hardware="b300", image="@" + digest).image == "vllm/vllm-openai:kimi-k3@" + digest
    assert resolve(recipe, hardware="b300", image=":nightly").image == "vllm/vllm-openai:nightly"
    assert resolve(recipe, hardware="b300", image="registry.local:5000/vllm/k3:v1").image == "registry.local:5000/vllm/k3:v1"
    with pytest.raises(SelectionError):
        resolve(recipe, hardware="b300", image="vllm/vllm-openai")  # unpinned: no tag, no digest
