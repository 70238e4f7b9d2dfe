"""The simulated engine as the SLO gate reads it: /metrics in vLLM 0.33's format (TTFT and ITL histograms with
vLLM's bucket edges, finished requests by reason), tokens streamed as they are made, and ``K3SIM_SLOWDOWN`` from the
engine's environment making every token that many times slower, seen by the gate's own probe (the real sh and
python3, as on a node)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from types import SimpleNamespace

import pytest

from helpers.engine import Node, free_port, healthy, http, wait_for
from k3deploy.model import commands
from k3deploy.model.binding import HostRecord
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.revisions import GroupHistory
from k3deploy.model.slo import (
    ITL,
    TTFT,
    GatePlan,
    Targets,
    judge,
    load_of,
    parse_metrics,
    parse_probe,
    read_record,
    targets_of,
)
from k3deploy.runtime import slo as runtime_slo
from k3deploy.runtime.readiness import served_model

MODEL = "moonshotai/Kimi-K3"
#: vLLM's edges (vllm/v1/metrics/loggers.py)
TTFT_EDGES = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5",
              "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf"]
ITL_EDGES = ["0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.75", "1.0", "2.5", "5.0",
             "7.5", "10.0", "20.0", "40.0", "80.0", "+Inf"]


def start(procs, tmp_path, net, log: str = "engine", **env: str) -> str:
    node = Node(tmp_path, "h200", 0, 1, net)
    port = free_port(node.ip)
    procs.engine(node, [MODEL, "--served-model-name", "kimi-k3", "-tp", "8", "--host", node.ip, "--port", str(port)],
                 log, **env)
    base = f"http://{node.ip}:{port}"
    assert wait_for(lambda: healthy(base), 30), "the engine did not serve"
    return base


def metrics(base: str) -> str:
    code, text = http(base + "/metrics")
    assert code == 200
    return str(text)


def probe(base: str, requests: int = 8, concurrency: int = 4, output: int = 8):
    out = subprocess.run(["sh", "-c", commands.slo_probe(base, [base], "kimi-k3", requests, concurrency, 64, output)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    figures, why = parse_probe(out.stdout)
    assert figures is not None, why
    return figures


def test_a_stream_ends_with_the_usage_as_vllm_sends_it(procs, tmp_path, net):
    """``stream_options.include_usage``: a last chunk with the usage and no choice before ``[DONE]`` (chat and
    completions), ``continuous_usage_stats``: every chunk with the usage so far; neither: no usage. The shapes are
    vLLM 0.33's (``chat_completion/serving.py``, ``completion/serving.py``: the last chunk dumped without its unset
    and None fields)."""
    import json

    base = start(procs, tmp_path, net)

    def events(path: str, **body: object) -> list[dict[str, object]]:
        code, text = http(base + path, {"model": "kimi-k3", "max_tokens": 3, "ignore_eos": True, "stream": True,
                                        **body})
        assert code == 200 and str(text).rstrip().endswith("data: [DONE]")
        return [json.loads(e[len("data: "):]) for e in str(text).split("\n\n") if e.startswith("data: {")]

    chat = {"messages": [{"role": "user", "content": "a b c d"}]}
    for path, extra, obj in (("/v1/chat/completions", chat, "chat.completion.chunk"),
                             ("/v1/completions", {"prompt": "a b c d"}, "text_completion")):
        got = events(path, stream_options={"include_usage": True}, **extra)
        last = got[-1]
        assert list(last) == ["id", "object", "created", "model", "choices", "usage"], last
        assert last["object"] == obj and last["choices"] == [] and last["id"] == got[0]["id"]
        assert last["usage"] == {"prompt_tokens": 4, "total_tokens": 7, "completion_tokens": 3}
        assert all("usage" not in e for e in got[:-1])
        assert all("usage" not in e for e in events(path, **extra))
        every = events(path, stream_options={"include_usage": True, "continuous_usage_stats": True}, **extra)
        counts = [e["usage"]["completion_tokens"] for e in every[:-1]]           # type: ignore[index]
        assert counts == sorted(counts) and counts[-1] == 3 and every[-1]["choices"] == []


def test_metrics_as_vllm_shows_them(procs, tmp_path, net):
    base = start(procs, tmp_path, net)
    text = metrics(base)
    for name, edges in ((TTFT, TTFT_EDGES), (ITL, ITL_EDGES)):
        assert f"# TYPE {name} histogram" in text
        buckets = [line for line in text.splitlines() if line.startswith(name + "_bucket")]
        assert [b.split('le="')[1].split('"')[0] for b in buckets] == edges
        assert buckets[0] == f'{name}_bucket{{engine="0",le="{edges[0]}",model_name="kimi-k3"}} 0.0'
        assert f'{name}_count{{engine="0",model_name="kimi-k3"}} 0.0' in text
    for reason in ("stop", "length", "abort", "error"):
        assert f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="kimi-k3"}} 0.0' in text
    # a chat completion (12 words, finished by "stop") and a streamed completion of exactly 5 tokens ("length")
    assert http(base + "/v1/chat/completions", {"model": "kimi-k3",
                                                "messages": [{"role": "user", "content": "hi"}]})[0] == 200
    code, body = http(base + "/v1/completions", {"model": "kimi-k3", "prompt": "a b c", "max_tokens": 5,
                                                 "ignore_eos": True, "stream": True})
    assert code == 200 and body.count('"text": ') == 6 and body.rstrip().endswith("data: [DONE]")
    snap = parse_metrics(metrics(base))
    assert snap.finished == {"stop": 1.0, "length": 1.0, "abort": 0.0, "error": 0.0}
    assert snap.histograms[TTFT].count == 2 and snap.histograms[ITL].count == 11 + 4
    # ignore_eos past the answer's length: exactly max_tokens tokens
    code, body = http(base + "/v1/completions", {"model": "kimi-k3", "prompt": "a", "max_tokens": 30,
                                                 "ignore_eos": True})
    assert code == 200 and body["usage"]["completion_tokens"] == 30 and body["choices"][0]["finish_reason"] == "length"


def test_a_stream_sends_each_token_as_it_is_made(procs, tmp_path, net):
    base = start(procs, tmp_path, net, K3SIM_SLOWDOWN="5")   # 0.1 s a token
    req = urllib.request.Request(base + "/v1/completions", headers={"content-type": "application/json"},
                                 data=b'{"model": "kimi-k3", "prompt": "hi", "max_tokens": 6, "ignore_eos": true, '
                                      b'"stream": true}')
    t0 = time.monotonic()
    seen = []
    with urllib.request.urlopen(req, timeout=10) as resp:
        for line in resp:
            if line.startswith(b"data: {"):
                seen.append(time.monotonic() - t0)
    assert len(seen) == 7   # six tokens and the finish
    assert 0.08 < seen[0] < 0.4, seen                 # the first token after the prefill (5 x 0.02 s and more)
    assert seen[5] - seen[0] > 5 * 0.1 * 0.9, seen    # each next one 0.1 s later


def test_a_slowdown_is_what_the_gate_sees(procs, tmp_path, net):
    """Two engines, one with ``K3SIM_SLOWDOWN=3``: the same probe load on each; the slow one's TTFT and ITL at p95
    (from its /metrics) are in buckets about three times higher, and it misses the 1.5x gate against the other;
    the other, against itself, meets it."""
    fast = start(procs, tmp_path / "a", net, "fast")
    slow = start(procs, tmp_path / "b", net, "slow", K3SIM_SLOWDOWN="3")
    base, again, slowed = probe(fast), probe(fast), probe(slow)
    assert base.failed == 0 and slowed.failed == 0 and base.source == "metrics"
    assert base.itl_p95_ms == pytest.approx(24.25) and slowed.itl_p95_ms == pytest.approx(73.75)
    assert slowed.ttft_p95_ms is not None and base.ttft_p95_ms is not None
    assert slowed.ttft_p95_ms > 2 * base.ttft_p95_ms
    assert slowed.client_ttft_p95_ms is not None and base.client_ttft_p95_ms is not None
    assert slowed.client_ttft_p95_ms > base.client_ttft_p95_ms
    assert judge(again, base, Targets()).ok
    verdict = judge(slowed, base, Targets())
    assert not verdict.ok and [line.rsplit(" ", 1)[-1] for line in verdict.lines] == ["hit", "miss", "miss"]


class LocalHost:
    """A node whose shell is this machine's ``sh`` (its engine listens on its own loopback address)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run_shell_command(self, cmd, _stdin=None, **kwargs):
        proc = subprocess.run(["sh", "-c", cmd] if _stdin is None else cmd, shell=_stdin is not None, input=_stdin,
                              capture_output=True, text=True, timeout=120)
        return proc.returncode == 0, SimpleNamespace(stdout_lines=proc.stdout.splitlines(),
                                                     stderr_lines=proc.stderr.splitlines())


def test_the_canary_against_a_replica_on_the_previous_revision(procs, tmp_path, net):
    """:func:`k3deploy.runtime.slo.canary` over two replicas whose engines run here: the canary three times slower
    misses against the replica on the previous revision, measured at the same time under the same load; each
    revision keeps its figures where ``k3deploy history`` reads them."""
    records = [HostRecord(f"r{i}", ("head",), {"k3_ip": f"{net}.{11 + i}", "rank": 0, "k3_replica": i,
                                               "k3_hardware": "h200", "k3_strategy": "single_node_tp",
                                               "k3_config_dir": str(tmp_path / "etc"), "k3_slo_requests": 8,
                                               "k3_slo_output_tokens": 8})
               for i in range(2)]
    rollout = desired_rollout(target(records, None))
    hosts = {"r0": LocalHost("r0"), "r1": LocalHost("r1")}
    model = served_model(rollout.group("engine-r0")[0], rollout.plan.model)
    for i, slowdown in ((0, "3"), (1, "1")):
        node = Node(tmp_path / f"n{i}", "h200", 0, 1, net)
        ip = f"{net}.{11 + i}"
        procs.engine(node, [MODEL, "--served-model-name", model, "-tp", "8", "--host", ip, "--port", "8000"],
                     f"engine{i}", K3SIM_SLOWDOWN=slowdown)
        assert wait_for(lambda ip=ip: healthy(f"http://{ip}:8000"), 30)
    for group, number in (("engine-r0", 2), ("engine-r1", 1)):
        (tmp_path / "etc" / "revisions" / group / str(number)).mkdir(parents=True)
    gate = GatePlan("canary", ("engine-r0",), "engine-r1", load_of(rollout.vars), targets_of(rollout.vars))
    history = {"engine-r0": GroupHistory("engine-r0", current=1), "engine-r1": GroupHistory("engine-r1", current=1)}
    (outcome,) = runtime_slo.canary(hosts, rollout, gate, {"engine-r0": 2}, history)
    assert not outcome.ok and outcome.number == 2
    assert outcome.against == "engine-r1, still on the previous revision, under the same load"
    assert [line.rsplit(" ", 1)[-1] for line in outcome.verdict.lines] == ["hit", "miss", "miss"]
    assert outcome.verdict.baseline is not None and outcome.verdict.baseline.itl_p95_ms == pytest.approx(24.25)
    kept = (tmp_path / "etc" / "revisions" / "engine-r0" / "2" / "slo.json").read_text()
    figures, record = read_record(kept)
    assert record["verdict"] == "miss" and figures is not None and figures.itl_p95_ms == pytest.approx(73.75)
    baseline = read_record((tmp_path / "etc" / "revisions" / "engine-r1" / "1" / "slo.json").read_text())
    assert baseline[1]["verdict"] is None and baseline[0] == outcome.verdict.baseline
