"""The simulated engine's /metrics as vLLM 0.33 shows them per data-parallel rank (``engine`` label): running and
waiting requests, KV-cache use, prefix-cache queries and hits, preemptions, prompt and generation tokens, and the
TTFT, ITL and end-to-end histograms."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

from helpers.engine import Node, free_port, healthy, http, wait_for
from k3deploy.model.monitoring import VLLM_METRICS

MODEL = "moonshotai/Kimi-K3"


def _engine(procs, tmp_path, net, *flags: str, **env: str) -> str:
    node = Node(tmp_path, "h200", 0, 1, net)
    port = free_port(node.ip)
    procs.engine(node, [MODEL, "--served-model-name", "kimi-k3", "-tp", "4", *flags, "--host", node.ip,
                        "--port", str(port)], "engine", **env)
    base = f"http://{node.ip}:{port}"
    assert wait_for(lambda: healthy(base), 30), "the engine did not serve"
    return base


def _samples(text: str) -> dict[tuple[str, str], float]:
    """(name, engine) -> value of every sample without labels besides engine and model_name."""
    out = {}
    for m in re.finditer(r'^(vllm:[a-z0-9_:]+)\{engine="(\d+)",model_name="kimi-k3"\} (\S+)$', text, re.M):
        out[(m[1], m[2])] = float(m[3])
    return out


def test_every_rank_the_server_fronts_has_vllm_s_metrics(procs, tmp_path, net):
    base = _engine(procs, tmp_path, net, "-dp", "2", "--enable-expert-parallel", K3SIM_KV_TOKENS="64")
    prompt = " ".join(f"w{i}" for i in range(40))   # 40 words: 40 tokens, two whole blocks of 16

    def ask(_: int) -> int:
        return http(base + "/v1/completions", {"model": "kimi-k3", "prompt": prompt, "max_tokens": 4,
                                               "ignore_eos": True})[0]

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(ask, range(4))) == [200] * 4
    # a request's counters are recorded as its answer is sent (as vLLM's output processor does): read until both
    # ranks counted both of theirs
    deadline = time.monotonic() + 10
    while True:
        code, text = http(base + "/metrics")
        assert code == 200
        got = _samples(str(text))
        counted = [got.get(("vllm:e2e_request_latency_seconds_count", rank)) for rank in ("0", "1")]
        if counted == [2.0, 2.0] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for name, kind in VLLM_METRICS.items():
        assert f"# TYPE {name} {kind}" in text, name
    for rank in ("0", "1"):
        assert got[("vllm:prompt_tokens_total", rank)] == 80.0          # two requests of 40 tokens on each rank
        assert got[("vllm:prefix_cache_queries_total", rank)] == 80.0
        assert got[("vllm:prefix_cache_hits_total", rank)] == 32.0      # the second saw the first's two blocks
        assert got[("vllm:generation_tokens_total", rank)] == 8.0
        assert got[("vllm:e2e_request_latency_seconds_count", rank)] == 2.0
        assert got[("vllm:num_requests_running", rank)] == 0.0 and got[("vllm:kv_cache_usage_perc", rank)] == 0.0
    # 64 tokens of cache: two requests of 40 at once on a rank do not fit, the second preempts
    assert got[("vllm:num_preemptions_total", "0")] + got[("vllm:num_preemptions_total", "1")] >= 1.0
    assert ("vllm:prompt_tokens_total", "2") not in got

