"""Golden tests: the recipes command builder's own output on the vendored recipe, reproduced exactly."""

from __future__ import annotations

import pytest

from helpers import golden
from k3deploy import resolve
from k3deploy.recipe.printing import format_command, format_router, format_site_docker_run
from k3deploy.recipe.rules import PoolSpec, synthesize
from k3deploy.recipe.taxonomy import hardware, strategies

BUILDER = golden("builder-cases.json")["cases"]
WORKED = golden("worked-examples.json")["cases"]


def _case_id(c: dict) -> str:
    s = c["case"]
    extra = f"-{s['pd_role']}{s['pd_rank']}" if "pd_role" in s else ""
    return f"{s['hw']}-{s['strategy']}-{s['variant']}-n{s['nodes']}-{'+'.join(s['features']) or 'nofeat'}{extra}"


@pytest.mark.parametrize("case", BUILDER, ids=[_case_id(c) for c in BUILDER])
def test_builder_case_through_public_api(recipe, case):
    """Every builder case, resolved through resolve(): per-node argv and env (key order included)."""
    sel = case["case"]
    kwargs = dict(hardware=sel["hw"], strategy=sel["strategy"], variant=sel["variant"], features=sel["features"])
    if "pd_pools" in sel:
        pools = sel["pd_pools"]
        plan = resolve(recipe, prefill_nodes=pools["prefill"]["nodes"], decode_nodes=pools["decode"]["nodes"], **kwargs)
    else:
        plan = resolve(recipe, nodes=sel["nodes"], **kwargs)
        assert [(n.role, n.rank) for n in plan.nodes] == [(n["role"], n["rank"]) for n in case["nodes"]]
    by_key = {(n.role, n.rank): n for n in plan.nodes}
    for want in case["nodes"]:
        got = by_key[(want["role"], want["rank"])]
        if want["role"] == "router":
            assert got.command == want["command"]
            continue
        assert got.argv == want["argv"]
        assert list(got.env.items()) == list(want["env"].items())
        if "pool_nodes" in want:
            assert (got.pool_nodes, got.parallelism) == (want["pool_nodes"], want["parallelism"])


def _plan_for_worked(recipe, sel):
    # JSON API renderings: default features and the site's own node count (nodes=None must find it)
    plan = resolve(recipe, hardware=sel["hardware"], strategy=sel["strategy"], variant=sel["variant"])
    if "nodes" in sel:
        assert len(plan.nodes) == sel["nodes"], "resolve(nodes=None) must pick the recipes site's node count"
    return plan


JSON_API = [c for c in WORKED if not c.get("direct")]
DIRECT = [c for c in WORKED if c.get("direct")]


@pytest.mark.parametrize("case", JSON_API, ids=[f"{c['section']}-{c['selection']['hardware']}-{c['selection']['strategy']}" for c in JSON_API])
def test_worked_example_json_api(recipe, case):
    plan = _plan_for_worked(recipe, case["selection"])
    by_key = {(n.role, n.rank): n for n in plan.nodes}
    for want in case["nodes"]:
        got = by_key[(want["role"], want["rank"])]
        assert got.command == want["command"]
        if "env" in want:
            assert list(got.env.items()) == list(want["env"].items())
        if "meta" in want:
            # e.g. "(nodes=2 parallelism=dep tp=1 dpLocal=8 dpSize=16)"
            meta = dict(kv.split("=") for kv in want["meta"].strip("()").split())
            assert got.pool_nodes == int(meta["nodes"]) and got.parallelism == meta["parallelism"]
    if case.get("env"):
        for node in plan.nodes:
            assert list(node.env.items()) == list(case["env"].items())


def test_docker_command_matches_builder_but_with_the_k3_image(recipe):
    case = next(c for c in WORKED if c.get("site_docker_command"))
    plan = _plan_for_worked(recipe, case["selection"])
    head = plan.nodes[0]
    # the builder's layout, byte for byte, with its own image
    assert format_site_docker_run(head.argv, head.env, "vllm/vllm-openai:latest", 8000, "nvidia") == case["site_docker_command"]
    # k3deploy's deliberate deviation: the K3 CUDA 13 image instead of :latest
    assert plan.image == "vllm/vllm-openai:kimi-k3"
    assert plan.site_docker_command(head) == case["site_docker_command"].replace("vllm/vllm-openai:latest", "vllm/vllm-openai:kimi-k3")


@pytest.mark.parametrize("case", DIRECT, ids=[str(i) for i in range(len(DIRECT))])
def test_worked_example_direct_calls(recipe, case):
    sel = case["selection"]
    pd = None
    if "pdNodes" in sel:
        pd = {role: PoolSpec(**spec) for role, spec in sel["pdNodes"].items()}
    syn = synthesize(recipe, variant=sel.get("variant", "default"), strategy=strategies()[sel["strategy"]],
                     hw=hardware()[sel["hw"]], features=sel["features"], nodes=sel.get("nodes", 1), pd_nodes=pd)
    if pd:
        want = {n["role"]: n["command"] for n in case["nodes"]}
        assert format_command(syn.roles["prefill"][0]) == want["prefill"]
        assert format_command(syn.roles["decode"][0]) == want["decode"]
        assert format_router(syn.router_argv) == want["router"]
        assert [syn.roles["prefill"][1], syn.roles["decode"][1]] == case["envs"]
        assert [list(e) for e in (syn.roles["prefill"][1], syn.roles["decode"][1])] == [list(e) for e in case["envs"]]
        return
    assert [format_command(a) for a in syn.argvs[: len(case["nodes"])]] == [n["command"] for n in case["nodes"]]
    assert list(syn.env.items()) == list(case["envs"][0].items())
