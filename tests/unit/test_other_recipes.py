"""The resolver handles every recipe of the schema, not only Kimi-K3."""

from __future__ import annotations

import pytest

from helpers import RECIPES as RECIPE_DIR
from helpers import ROOT
from k3deploy import load_recipe, resolve
from k3deploy.recipe.offering import iter_matrix

RECIPES = sorted(RECIPE_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_whole_matrix_resolves(path):
    recipe = load_recipe(path)
    n = 0
    for sel in iter_matrix(recipe, feature_subsets=False):
        plan = resolve(recipe, **sel)
        assert plan.nodes and plan.nodes[0].argv[:2] in (["vllm", "serve"], ["vllm-router"])
        n += 1
    assert n > 0


def _recipe(name: str):
    return load_recipe(next(p for p in RECIPES if p.stem == name))


def test_model_docker_image_brand_map():
    k26 = _recipe("Kimi-K2.6")
    assert resolve(k26, hardware="mi355x").image == "vllm/vllm-openai-rocm:nightly"
    assert resolve(k26, hardware="h200").image == "vllm/vllm-openai:latest"


def test_hardware_opt_in_features():
    k26 = _recipe("Kimi-K2.6")
    assert "encoder_parallel" in k26.hardware_opt_in_features["gb200"]
    assert "encoder_parallel" not in resolve(k26, hardware="gb200").features
    # encoder_parallel is opt-in on gb200 only: elsewhere it follows opt_in_features
    on_h200 = "encoder_parallel" not in k26.opt_in_features
    assert ("encoder_parallel" in resolve(k26, hardware="h200").features) == on_h200


def test_pd_cluster_role_env_and_nvl4_filter():
    k26 = _recipe("Kimi-K2.6")
    gb = resolve(k26, hardware="gb200", strategy="pd_cluster")
    pre = gb.role("prefill")[0]
    assert pre.env.get("VLLM_USE_NCCL_SYMM_MEM") == "1"  # kept on NVL4 trays
    b2 = resolve(k26, hardware="b200", strategy="pd_cluster")
    assert "VLLM_USE_NCCL_SYMM_MEM" not in b2.role("prefill")[0].env  # filtered elsewhere


def test_base_env_reaches_every_node(tmp_path):
    text = (ROOT / "recipes" / "kimi-k3.yaml").read_text()
    text = text.replace('  base_args:\n', '  base_env:\n    HF_HUB_ENABLE_HF_TRANSFER: "1"\n  base_args:\n', 1)
    p = tmp_path / "k3-env.yaml"
    p.write_text(text)
    plan = resolve(load_recipe(p), hardware="gb300")
    for node in plan.nodes:
        assert next(iter(node.env)) == "HF_HUB_ENABLE_HF_TRANSFER"
