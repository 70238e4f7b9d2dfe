"""The correctness probe, pure: a few fixed questions with known answers, and the verdict on what an endpoint said.

An engine can be healthy and wrong: ``/health`` answers, ``/v1/models`` lists the model, a chat completion comes
back, and the text is garbage (a quantization flag the checkpoint was not made for, a wrong tokenizer mode; vLLM's
ROCm disaggregation CI and InferenceX gate on GSM8K for this reason, field-notes section 6). The probe
(:func:`k3deploy.model.commands.correctness_probe`, python3 on a node, as the smoke test) asks each of
:data:`PROMPTS` once, greedily (temperature 0, at most :data:`MAX_TOKENS` tokens), and prints one line
``K3_ANSWERS={json}``; :func:`parse` reads it, :func:`judge` says which answer is wrong: an answer is right when the
expected word stands in it as a word of its own (case, punctuation and Markdown aside), so "Paris." and "The capital
of France is **Paris**" both are. The questions are ones any instruction-tuned model answers the same way, Kimi-K3
included; the simulated engine knows them too (``vllmsim_answers.py``).

Example::

    >>> line = MARK + json.dumps([{"prompt": PROMPTS[0].prompt, "answer": "Paris."},
    ...                           {"prompt": PROMPTS[1].prompt, "answer": "!!!!!!!!"}])
    >>> bad = judge(parse(line)[0])
    >>> bad[0].line()
    "'What is 17 + 25? Answer with the number only.': expected '42', got '!!!!!!!!'"
    >>> bad[1].line()[-25:]   # a question not asked is not answered right
    'got no answer (not asked)'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

#: the mark before the probe's one line of JSON
MARK = "K3_ANSWERS="
#: the most tokens each answer may take (greedy: temperature 0)
MAX_TOKENS = 16


@dataclass(frozen=True)
class Question:
    """One prompt (a single user message) and the word its answer must contain."""

    prompt: str
    expected: str


#: the fixed questions, each with the one answer a model that works gives (short, unambiguous, no reasoning needed)
PROMPTS: tuple[Question, ...] = (
    Question("What is the capital of France? Answer with one word.", "Paris"),
    Question("What is 17 + 25? Answer with the number only.", "42"),
    Question("Which planet is known as the Red Planet? Answer with one word.", "Mars"),
    Question("Write the word 'cat' backwards. Answer with the letters only.", "tac"),
)


@dataclass(frozen=True)
class Answer:
    """What the endpoint said to one prompt (``error``: no answer at all)."""

    prompt: str
    answer: str = ""
    error: str | None = None

    @property
    def expected(self) -> str:
        return next((q.expected for q in PROMPTS if q.prompt == self.prompt), "")

    @property
    def right(self) -> bool:
        """
        >>> Answer(PROMPTS[0].prompt, "The capital of France is **Paris**.").right
        True
        >>> Answer(PROMPTS[0].prompt, "Parisian").right, Answer(PROMPTS[0].prompt, error="HTTP 500").right
        (False, False)
        """
        if self.error is not None or not self.expected:
            return False
        words = re.findall(r"[a-z0-9]+", self.answer.lower())
        return self.expected.lower() in words

    def line(self) -> str:
        got = f"no answer ({self.error})" if self.error is not None else repr(self.answer.strip()[:80])
        return f"{self.prompt!r}: expected {self.expected!r}, got {got}"


def parse(output: str) -> tuple[list[Answer] | None, str]:
    """The answers of a probe's output (its last ``K3_ANSWERS=`` line), or None and why.

    >>> parse("python3: not found")
    (None, 'the correctness probe printed no result: python3: not found')
    """
    lines = [ln for ln in output.splitlines() if ln.startswith(MARK)]
    if not lines:
        return None, "the correctness probe printed no result: " + (output.strip()[-300:] or "no output")
    try:
        data = json.loads(lines[-1][len(MARK):])
        return [Answer(str(d["prompt"]), str(d.get("answer") or ""), d.get("error")) for d in data], ""
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"the correctness probe's result is not readable: {exc}"


def judge(answers: list[Answer]) -> list[Answer]:
    """The wrong answers (every question unanswered counts as wrong).

    >>> judge([Answer(q.prompt, q.expected) for q in PROMPTS])
    []
    >>> [a.prompt for a in judge([])] == [q.prompt for q in PROMPTS]
    True
    """
    given = {a.prompt: a for a in answers}
    return [a for a in (given.get(q.prompt, Answer(q.prompt, error="not asked")) for q in PROMPTS) if not a.right]


def report(who: str, wrong: list[Answer], why: str = "") -> list[str]:
    """The lines a gate or a smoke test prints of a probe of ``who`` (a group, an endpoint): none when every answer
    is right.

    >>> report("group engine", [Answer(PROMPTS[2].prompt, "Venus")])
    ["correctness probe: group engine answers 1 of 4 questions wrong: 'Which planet is known as the Red Planet? \
Answer with one word.': expected 'Mars', got 'Venus'"]
    """
    if why:
        return [f"correctness probe: {who}: {why}"]
    return [f"correctness probe: {who} answers {len(wrong)} of {len(PROMPTS)} questions wrong: "
            + "; ".join(a.line() for a in wrong)] if wrong else []


def request_body(model: str, prompt: str) -> dict[str, object]:
    """The chat completion each question is: greedy, short.

    >>> request_body("kimi-k3", "q")["temperature"], request_body("kimi-k3", "q")["max_tokens"]
    (0, 16)
    """
    return {"model": model, "temperature": 0, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": prompt}]}


def plan_line() -> str:
    """What ``k3deploy plan`` says of the probe where ``k3_correctness_probe`` is on (beside the gate's lines).

    >>> plan_line()[:60]
    'correctness probe (k3_correctness_probe): 4 questions with k'
    """
    asked = "; ".join(f"{q.prompt!r} -> {q.expected!r}" for q in PROMPTS)
    return (f"correctness probe (k3_correctness_probe): {len(PROMPTS)} questions with known answers through each "
            f"changed group's endpoint, greedily, in the smoke test and the gate: {asked}; a wrong answer fails the "
            "smoke test and misses the gate")
