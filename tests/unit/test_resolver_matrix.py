"""Properties over the whole offered matrix: every hardware x offered strategy x variant x feature subset."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3deploy import resolve
from k3deploy.recipe.offering import hardware_for_variant, iter_matrix, strategies_on
from k3deploy.recipe.rules import dedupe_args, min_gpus_for_strategy
from k3deploy.recipe.taxonomy import hardware

# flags that legitimately differ between the ranks of one engine group, with whether they carry a value
PER_RANK = {"--node-rank": True, "--headless": False, "--data-parallel-start-rank": True}


def _flags(argv: list[str]) -> list[str]:
    return [a for a in argv[3:] if a.startswith("-")]


def _strip_per_rank(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in PER_RANK:
            i += 2 if PER_RANK[argv[i]] else 1
            continue
        out.append(argv[i])
        i += 1
    return out


def _check_plan(plan) -> None:
    for node in plan.nodes:
        if node.role == "router":
            assert node.argv[0] == "vllm-router"
            continue
        assert node.argv[:3] == ["vllm", "serve", plan.model]
        counts = Counter(_flags(node.argv))
        assert not [f for f, c in counts.items() if c > 1], f"duplicate flags in {node.role}{node.rank}"
        assert node.argv == ["vllm", "serve", plan.model, *dedupe_args(node.argv[3:])], "dedupe must be idempotent"
        assert all(isinstance(v, str) for v in node.env.values())
    groups: dict[str, list] = {}
    for node in plan.nodes:
        if node.role != "router":
            groups.setdefault("engine" if node.role in ("head", "worker") else node.role, []).append(node)
    for nodes in groups.values():
        first = nodes[0]
        for other in nodes[1:]:
            # the same command on every rank but for the per-rank flags
            assert _strip_per_rank(other.argv) == _strip_per_rank(first.argv)
            if first.role in ("head", "worker"):
                assert other.env == first.env
        heads = [n for n in nodes if "--headless" not in n.argv]
        if "--nnodes" in first.argv:
            # exactly rank 0 serves; every other rank of an --nnodes group is headless
            assert [n.rank for n in heads] == [0]
            assert all(n.argv[n.argv.index("--node-rank") + 1] == str(n.rank) for n in nodes)
        starts = [n.argv[n.argv.index("--data-parallel-start-rank") + 1] for n in nodes
                  if "--data-parallel-start-rank" in n.argv]
        assert len(starts) == len(set(starts)), "DP start ranks must be unique within a group"


def test_whole_offered_matrix(recipe):
    count = 0
    for sel in iter_matrix(recipe):
        plan = resolve(recipe, **sel)
        _check_plan(plan)
        count += 1
    # default: h100 4 strategies + 8 hardware x 6; nvfp4: 4 Blackwell x 6; ascend_w4a8: 1; 2^5 feature subsets
    assert count == (4 + 8 * 6 + 4 * 6 + 1) * 32


def test_single_node_tp_is_tp8_everywhere(recipe):
    for sel in iter_matrix(recipe, feature_subsets=False):
        if sel["strategy"] == "single_node_tp":
            argv = resolve(recipe, **sel).nodes[0].argv
            assert argv[argv.index("--tensor-parallel-size") + 1] == "8"


@st.composite
def selections(draw, recipe):
    variant = draw(st.sampled_from(list(recipe.variants)))
    hw_id = draw(st.sampled_from(hardware_for_variant(recipe, variant)))
    hw = hardware()[hw_id]
    strategy = draw(st.sampled_from(strategies_on(recipe, hw)))
    feats = draw(st.lists(st.sampled_from(list(recipe.features)), unique=True))
    kwargs = dict(hardware=hw_id, strategy=strategy, variant=variant, features=feats)
    floor = max(1, -(-min_gpus_for_strategy(recipe, strategy, hw) // hw.gpu_count))
    if strategy.startswith("multi_node_"):
        kwargs["nodes"] = draw(st.integers(min_value=max(2, floor), max_value=16))
    return kwargs


@pytest.fixture(scope="module")
def k3():
    from k3deploy import load_recipe

    return load_recipe()


def test_random_node_counts(k3):
    @settings(max_examples=300, deadline=None)
    @given(selections(k3))
    def check(sel):
        plan = resolve(k3, **sel)
        _check_plan(plan)
        if "nodes" in sel:
            assert len(plan.nodes) == sel["nodes"]
            head = plan.nodes[0].argv
            if "--nnodes" in head:
                assert head[head.index("--nnodes") + 1] == str(sel["nodes"])

    check()


@given(st.lists(st.sampled_from(["--a", "--b", "--c", "1", "2", "x", "", "-1"]), max_size=12))
def test_dedupe_last_wins(args):
    out = dedupe_args(args)
    assert dedupe_args(out) == out
    flags = [a for a in out if a.startswith("-")]
    assert len(flags) == len(set(flags))
    # every flag that appeared survives
    assert set(flags) == {a for a in args if a.startswith("-")}
