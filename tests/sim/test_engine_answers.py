"""The correctness probe against the simulated engine (the real sh and python3, as on a node): the engine answers
the probe's questions as a working model does, and under fault ``wrong-output`` it stays healthy and answers wrong,
everywhere or only where its environment holds the fault's MATCH."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.engine import ENGINE, Node, free_port, healthy, http, wait_for
from k3deploy.model import commands, correctness

MODEL = "moonshotai/Kimi-K3"


def serve(procs, tmp_path, net, faults=(), **env: str) -> str:
    node = Node(tmp_path, "h200", 0, 1, net, faults=faults)
    port = free_port(node.ip)
    procs.engine(node, [MODEL, "--served-model-name", "kimi-k3", "-tp", "8", "--host", node.ip, "--port", str(port)],
                 **env)
    base = f"http://{node.ip}:{port}"
    assert wait_for(lambda: healthy(base), 30), "the engine did not serve"
    return base


def wrong_answers(base: str) -> list[correctness.Answer]:
    out = subprocess.run(["sh", "-c", commands.correctness_probe(base, "kimi-k3")], capture_output=True, text=True,
                         timeout=60)
    answers, why = correctness.parse(out.stdout)
    assert answers is not None, why + out.stderr
    assert [a.prompt for a in answers] == [q.prompt for q in correctness.PROMPTS]
    return correctness.judge(answers)


def test_the_engine_knows_the_probe_questions(procs, tmp_path, net):
    base = serve(procs, tmp_path, net)
    assert wrong_answers(base) == []
    # any other question keeps the engine's usual answer
    code, body = http(base + "/v1/chat/completions", {"model": "kimi-k3",
                                                      "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and body["choices"][0]["message"]["content"].startswith("Hello from")


def test_wrong_output_is_healthy_and_wrong(procs, tmp_path, net):
    base = serve(procs, tmp_path, net, faults=["0:wrong-output"])
    assert http(base + "/health")[0] == 200
    wrong = wrong_answers(base)
    assert len(wrong) == len(correctness.PROMPTS)
    assert wrong[0].line() == ("'What is the capital of France? Answer with one word.': expected 'Paris', got "
                               "'!!!!!!!!'")


@pytest.mark.parametrize("env,wrong", [({"K3_CHANGE": "bad"}, True), ({"K3_CHANGE": "good"}, False)])
def test_wrong_output_with_a_match_applies_to_the_engine_that_holds_it(procs, tmp_path, net, env, wrong):
    base = serve(procs, tmp_path, net, faults=["0:wrong-output=K3_CHANGE=bad"], **env)
    assert bool(wrong_answers(base)) is wrong


def test_the_simulator_and_the_probe_ask_the_same_questions():
    sys.path.insert(0, str(ENGINE.parent))
    try:
        import vllmsim_answers
    finally:
        sys.path.remove(str(ENGINE.parent))
    assert vllmsim_answers.KNOWN == {q.prompt: q.expected for q in correctness.PROMPTS}
    import doctest

    assert doctest.testmod(vllmsim_answers).failed == 0
