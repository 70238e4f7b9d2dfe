"""The engines' compile caches: the key (what vLLM's compile hash covers, nothing else), the env file pointing every
cache into the key's directory, the stage handing a class's caches to the nodes that lack them, the mark once an
engine served from them, and the read-ahead of the shards."""

from __future__ import annotations

from typing import Any

from k3deploy.model import commands, compilecache, steps
from k3deploy.model.binding import HostRecord
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import Rollout
from k3deploy.model.staging import stage_for, summary


def two(hardware: str = "gb300", **more: Any) -> Rollout:
    given = {"k3_hardware": hardware, "k3_strategy": "multi_node_tp", **more}
    hosts = [HostRecord("n1", ("head",), {**given, "k3_ip": "10.0.0.1"}),
             HostRecord("n2", ("workers",), {**given, "k3_ip": "10.0.0.2"})]
    r = desired_rollout(target(hosts, None))
    return r.decided(set(r.groups))


def key(r: Rollout, host: str = "n1") -> str:
    unit = next(u for u in r.units if u.host == host)
    assert unit.spec is not None
    found = compilecache.key_of(unit.spec.env_map)
    assert found is not None
    return found


def test_the_nodes_of_a_group_share_a_key_that_follows_only_the_compile_inputs() -> None:
    base = two()
    assert key(base, "n1") == key(base, "n2")          # the address and the rank are not compile inputs
    assert key(two(k3_extra_env={"NCCL_DEBUG": "INFO"})) == key(base)
    assert key(two(k3_extra_env={"VLLM_HOST_IP": "10.9.9.9", "VLLM_LOGGING_LEVEL": "DEBUG"})) == key(base)
    assert key(two(k3_extra_args=["--served-model-name", "k3"])) == key(base)
    assert key(two(k3_extra_env={"VLLM_USE_DEEP_GEMM": "0"})) != key(base)       # hashed by compile_factors()
    assert key(two(k3_extra_args=["--max-num-seqs", "64"])) != key(base)         # a VllmConfig field
    assert key(two(k3_image="vllm/vllm-openai@sha256:" + "ab" * 32)) != key(base)
    assert key(two("b300")) != key(base)


def test_every_cache_of_the_vendor_is_pointed_into_the_key_directory() -> None:
    r = two()
    env = next(u for u in r.units if u.host == "n1").spec.env_map   # type: ignore[union-attr]
    k = key(r)
    for name in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH"):
        assert env[name].startswith(f"/root/.cache/k3-compile/{k}/"), name
    amd = next(u for u in two("mi355x").units).spec.env_map   # type: ignore[union-attr]
    assert "AITER_JIT_DIR" in amd and "FLASHINFER_WORKSPACE_BASE" not in amd
    mine = next(u for u in two(k3_extra_env={"TRITON_CACHE_DIR": "/x"}).units).spec.env_map  # type: ignore[union-attr]
    assert mine["TRITON_CACHE_DIR"] == "/x"                       # the site's own word wins
    off = next(u for u in two(k3_compile_cache=False).units).spec.env_map   # type: ignore[union-attr]
    assert "VLLM_CACHE_ROOT" not in off and "TRITON_CACHE_DIR" not in off


def test_the_stage_hands_a_class_caches_to_the_node_that_lacks_them() -> None:
    r = two()
    k = key(r)
    plan = stage_for(r, {}, {}, {"n1": (k,), "n2": ()})
    assert [(c.key, c.sends) for c in plan.caches] == [(k, {"n2": "n1"})]
    assert summary(plan)[-1] == f"compile caches {k}: n2 gets them from n1, which built them"   # what plan shows
    staged = {(s.host, s.kind): s for s in steps.stage(r, plan)}
    share = staged[("n2", steps.CACHES)]
    assert share.applies and share.peers == ("n1",)
    assert share.script == commands.receive_caches("10.0.0.1", r.vars.k3_stage_port, r.vars.k3_model_cache, k)
    assert not staged[("n1", steps.CACHES)].applies
    serve = staged[("n1", steps.SERVE)]
    assert serve.applies and compilecache.host_root(r.vars.k3_model_cache) in serve.script
    assert "[k3-compile]" in serve.script                          # the daemon's module
    # nobody holds them (a first rollout) or both do: nothing moves
    assert stage_for(r, {}, {}, {}).caches == ()
    assert stage_for(r, {}, {}, {"n1": (k,), "n2": (k,)}).caches == ()
    # another key (another configuration) is no holder
    assert stage_for(r, {}, {}, {"n1": ("0" * 16,)}).caches == ()


def test_an_engine_that_served_marks_its_caches_whole() -> None:
    r = two()
    actions = [a for a in steps.restart(r, steps.UNITS) if a.kind == "current"]
    mark = commands.mark_caches(r.vars.k3_model_cache, [key(r)])
    assert actions and all(mark in (p.script or "") for a in actions for p in a.parts if p.script)


def test_the_read_ahead_warms_the_restarting_nodes_only_when_asked() -> None:
    def warm(r: Rollout) -> list[str]:
        return [s.host for s in steps.stage(r, steps.fresh(r)) if s.kind == steps.READAHEAD and s.applies]

    assert warm(two()) == []
    assert warm(two(k3_readahead=True)) == ["n1", "n2"]
    r = two(k3_readahead=True)
    assert warm(r.decided(set())) == []
