"""The engines' compile caches on a simulated cluster of two trays (one group): each node's engine compiles on a miss
into the keyed directory on its model cache; a node that lost them (a replaced disk) gets them from the peer of its
class in the stage, and with a change that keeps the compile inputs (a ``NCCL_*`` variable) every engine loads them
(a hit); a change of a keyed input (a ``VLLM_*`` variable that vLLM's compile hash covers) is a new key: a miss.
With ``k3_readahead`` the stage reads each restarting node's shards into the page cache first."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from helpers import deploy, why
from helpers.simulated import Sim
from k3deploy.model import compilecache

pytestmark = pytest.mark.sim

ROOT = compilecache.host_root("/var/lib/k3deploy/cache")
SHARE = "Compile caches: from a peer of the class"


@pytest.fixture(scope="module")
def two() -> Iterator[Sim]:
    sim = Sim("ccache", "gb300", 2)
    try:
        sim.set_vars("k3_strategy: multi_node_tp\n")
        yield sim
    finally:
        sim.down()


def compile_log(sim: Sim, rank: int) -> str:
    """What the node's running engine logged of its compile phase: ``hit``, ``miss`` (or what it said)."""
    out = sim.ssh(rank, "docker logs k3-engine 2>&1 | grep -E 'Directly load the compiled|Compiling a graph'").stdout
    return "hit" if "Directly load the compiled" in out else "miss" if "Compiling a graph" in out else out


def keys(sim: Sim, rank: int) -> tuple[str, list[str]]:
    """(the key the node's engine runs with, the keys it holds whole)."""
    env = dict(line.split("=", 1) for line in sim.ssh(rank, "cat /etc/k3deploy/k3-engine.env").stdout.splitlines()
               if "=" in line and not line.startswith("#"))
    held = sim.ssh(rank, f"cd {ROOT} && ls */{compilecache.COMPLETE} 2>/dev/null").stdout.split()
    return compilecache.key_of(env) or "", sorted(p.split("/")[0] for p in held)


def ran_on(output: str, step: str) -> int:
    """On how many hosts a stage step did something (pyinfra's summary table)."""
    m = re.search(r"^\s*Stage \| " + re.escape(step) + r"\s+(\d+)\s+(\S+)", output, re.M)
    return 0 if m is None or m[2] == "-" else int(m[2])


def test_compile_caches_persist_travel_and_follow_their_key(two: Sim) -> None:
    sim = two
    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    assert [compile_log(sim, r) for r in (0, 1)] == ["miss", "miss"]      # nobody held them: each compiles its own
    key, held = keys(sim, 0)
    assert key and keys(sim, 1) == (key, [key])
    assert held == [key]
    # the JIT caches landed in the key's directory, on the host's persistent cache
    assert sim.ssh(0, f"ls {ROOT}/{key}/triton/*/ {ROOT}/{key}/vllm/torch_compile_cache/*/").returncode == 0

    # a replaced disk on the second node, then a change the compile hash ignores (not a VLLM_* variable), with the
    # shards read into the page cache before the engines start
    sim.ssh(1, f"rm -rf {ROOT}")
    sim.set_vars("k3_extra_env: {NCCL_DEBUG: INFO}\nk3_readahead: true\n")
    kept = deploy(sim.inventory)
    assert kept.returncode == 0, why(kept)
    assert ran_on(kept.stdout, SHARE) == 1, kept.stdout[-3000:]
    assert ran_on(kept.stdout, "Weights: into the page cache") == 2
    assert [compile_log(sim, r) for r in (0, 1)] == ["hit", "hit"]
    assert keys(sim, 1) == (key, [key])

    # a keyed input changes: a new directory, compiled again, the old one kept for a way back
    sim.set_vars("k3_extra_env: {NCCL_DEBUG: INFO, VLLM_USE_DEEP_GEMM: '0'}\n")
    changed = deploy(sim.inventory)
    assert changed.returncode == 0, why(changed)
    assert [compile_log(sim, r) for r in (0, 1)] == ["miss", "miss"]
    new, held = keys(sim, 0)
    assert new != key and held == sorted([key, new])
