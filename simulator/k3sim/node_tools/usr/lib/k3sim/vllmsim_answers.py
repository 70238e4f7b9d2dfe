"""What the simulated engine answers to the correctness probe's questions, and the ``wrong-output`` fault.

k3deploy's correctness probe (``k3deploy/model/correctness.py``) asks a few fixed questions whose answers any working
instruction-tuned model gives the same (greedy, a few tokens). The simulated engine answers them as Kimi-K3 would
(tests/sim/test_engine_answers.py keeps the two lists equal); any other prompt keeps the engine's usual answer.

Fault ``wrong-output[=MATCH]`` (``/etc/k3sim/node.json`` ``engine.wrong_output``): the engine stays healthy
(``/health``, ``/v1/models``, every completion 200) and its chat answers are ``!!!!!!!!``, the degenerate output of a
model run with a quantization its checkpoint was not made for. With MATCH, only an engine whose argv or environment
(``NAME=VALUE``) holds MATCH answers wrong: a change that breaks the answers, and a revision without it that answers
right.

Example::

    >>> answer("What is 17 + 25? Answer with the number only.", {}, [], {})
    ['42']
    >>> answer("What is 17 + 25? Answer with the number only.", {"wrong_output": "K3_CHANGE=bad"}, [],
    ...        {"K3_CHANGE": "bad"})
    ['!!!!!!!!']
    >>> answer("Say hello in one word.", {}, [], {}) is None
    True
"""
from __future__ import annotations

#: the correctness probe's questions and the answer each gets
KNOWN = {
    "What is the capital of France? Answer with one word.": "Paris",
    "What is 17 + 25? Answer with the number only.": "42",
    "Which planet is known as the Red Planet? Answer with one word.": "Mars",
    "Write the word 'cat' backwards. Answer with the letters only.": "tac",
}
#: what a broken engine says instead
GARBAGE = "!!!!!!!!"


def wrong(engine_cfg: dict, argv: list, env: dict) -> bool:
    """Whether fault ``wrong-output`` applies to this engine (its argv and environment)."""
    match = engine_cfg.get("wrong_output")
    if match is None:
        return False
    return match == "" or match in argv or match in {f"{k}={v}" for k, v in env.items()}


def answer(prompt: str, engine_cfg: dict, argv: list, env: dict) -> list | None:
    """The words of a chat answer to ``prompt`` where this module decides it (None: the engine's usual answer)."""
    if wrong(engine_cfg, argv, env):
        return [GARBAGE]
    known = KNOWN.get(prompt.strip())
    return [known] if known is not None else None
