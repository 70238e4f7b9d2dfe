"""``k3deploy bench`` and the correctness probe on the simulated cluster: one group of 2 GB300 trays.

The real ``vllm bench serve`` (vLLM 0.33.0 of the engine venv, run by the simulated docker from the engines' image on
the head node) measures the simulated engines across two revisions; each sweep is kept with its revision, ``history``
shows both, the picture has a line per revision, and the gate of the second change takes its baseline from the first
revision's benchmark. Then a change under fault ``wrong-output`` (the engines answer ``!!!!!!!!`` once their
environment holds ``K3_CHANGE=bad``) serves, healthy, and answers wrong: the gate's correctness probe refuses it,
naming the prompt, the expected answer and the one given, and the group goes back to the recorded revision, which
answers right."""

from __future__ import annotations

import json
import shlex

import pytest

from helpers import deploy, k3, why
from helpers.simulated import Sim
from k3sim.processes import engine_venv

pytestmark = pytest.mark.sim

NAME = "bnbench"
needs_client = pytest.mark.skipif(engine_venv() is None, reason="no engine venv (tools/engine-venv.sh): the real "
                                                                "vllm bench serve is not there to run")


@pytest.fixture(scope="module")
def sim():
    s = Sim(NAME, "gb300", 2, "--fault", "0:wrong-output=K3_CHANGE=bad", "--fault", "1:wrong-output=K3_CHANGE=bad")
    # the quick setting: a sweep of 2 runs of 32/16 tokens, and a probe load of the same shape
    s.set_vars("k3_bench_input_tokens: 32\nk3_bench_output_tokens: 16\nk3_bench_concurrency: [1, 4]\n"
               "k3_bench_rounds: 2\nk3_correctness_probe: true\nk3_slo_gate: 'on'\nk3_auto_rollback: true\n"
               "k3_slo_baseline: bench\nk3_slo_requests: 8\nk3_slo_prompt_tokens: 32\nk3_slo_output_tokens: 16\n")
    run = deploy(s.inventory)
    assert run.returncode == 0, why(run)
    assert "correctness probe: 4 of 4 known answers: hit" in run.stdout
    assert "gave the 4 known answers of the correctness probe" in run.stdout   # the smoke test asked them too
    yield s
    s.down()


def history(sim: Sim) -> dict:
    return json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]["engine"]


@needs_client
def test_bench_measures_each_revision_with_the_real_client(sim, tmp_path):
    first = k3("bench", sim.inventory, "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    figures = json.loads(first.stdout)
    assert sorted(figures) == ["1", "4"]
    for c in figures.values():
        assert set(c) == {"ttft_ms", "itl_ms", "output_tokens_per_s"}
        assert 0 < c["ttft_ms"]["p50"] <= c["ttft_ms"]["p99"] and 0 < c["itl_ms"]["p50"] <= c["itl_ms"]["p99"]
        assert c["output_tokens_per_s"] > 0
    assert figures["4"]["output_tokens_per_s"] > figures["1"]["output_tokens_per_s"]   # more at once, more out

    # a second revision: its gate judged against the first revision's benchmark, then benchmarked in turn
    sim.set_vars("k3_extra_env: {K3_CHANGE: one}\n")
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert "SLO gate: group engine meets the targets (measured against revision 1's benchmark)" in run.stdout
    picture = tmp_path / "bench.svg"
    second = k3("bench", sim.inventory, "--svg", str(picture))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "vllm bench serve from" in second.stdout and "kept with engine revision 2" in second.stdout
    svg = picture.read_text()
    assert svg.startswith("<svg") and svg.count("<polyline") == 2 and "engine rev 1" in svg and "engine rev 2" in svg

    revs = {r["number"]: r for r in history(sim)["revisions"]}
    assert revs[1]["bench"]["figures"] == figures
    assert revs[2]["bench"]["gpus"] == 8 and revs[2]["bench"]["load"]["concurrency"] == [1, 4]
    assert revs[2]["bench"]["points"][1]["per_gpu"] == pytest.approx(revs[2]["bench"]["points"][1]
                                                                      ["output_tokens_per_s"] / 8, abs=0.01)
    table = k3("history", sim.inventory, check=True).stdout
    assert "c4: TTFT" in table


@pytest.mark.faults
def test_a_change_that_answers_wrong_is_refused_by_the_gate(sim):
    before = history(sim)["current"]
    sim.set_vars("k3_extra_env: {K3_CHANGE: bad}\n")
    run = deploy(sim.inventory)
    assert run.returncode != 0, why(run)
    out = run.stdout
    assert ("correctness probe: group engine answers 4 of 4 questions wrong: 'What is the capital of France? Answer "
            "with one word.': expected 'Paris', got '!!!!!!!!'") in out
    assert "SLO gate: group engine misses the targets" in out
    h = history(sim)
    assert h["current"] == before
    assert not {r["number"]: r for r in h["revisions"]}[before + 1]["served"]
    for rank in range(2):
        assert "K3_CHANGE=bad" not in sim.ssh(rank, "cat /etc/k3deploy/k3-engine.env").stdout
    st = json.loads(k3("status", sim.inventory, "--json", check=True).stdout)
    assert st["verdict"] == "serving"
    body = json.dumps({"temperature": 0, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}]})
    answer = sim.ssh(0, f"curl -s -m 10 -H 'Content-Type: application/json' -d {shlex.quote(body)} "
                        f"{st['endpoint']}/v1/chat/completions")
    assert json.loads(answer.stdout)["choices"][0]["message"]["content"] == "42", answer.stdout + answer.stderr
