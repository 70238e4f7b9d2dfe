"""Reading values out of a ``vllm serve`` (or ``vllm-router``) argv the way the engine's own parser does.

vLLM's ``FlexibleArgumentParser`` is argparse: the **last** occurrence of a flag wins, ``--flag=value`` and
``--flag value`` are the same, and ``_`` may stand for ``-`` in a flag's name. Every value k3deploy reads back
from an argv (served model name, ports, master address, DP ports, ``--headless``) goes through this module,
so the rollout, the readiness gate, the smoke test and the plan cannot read one argv two ways.

    >>> argv = ["vllm", "serve", "m", "--port", "8000", "--served-model-name", "a", "b", "--port=8001"]
    >>> flag_value(argv, "--port")
    '8001'
    >>> flag_values(argv, "--served-model-name")
    ['a', 'b']
    >>> served_model_name(argv, "m")
    'a'
    >>> has_flag(["vllm", "serve", "m", "--headless"], "--headless")
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache


def _norm(token: str) -> str:
    """The flag name of a token (``--a_b=1`` -> ``--a-b``); non-flags unchanged."""
    if "=" in token:
        token = token.split("=", 1)[0]
    if "_" in token and token.startswith("--"):
        return "--" + token[2:].replace("_", "-")
    return token


def is_flag(token: str) -> bool:
    """True for ``-x``/``--xy`` tokens; a negative number is a value, not a flag."""
    if len(token) < 2 or token[0] != "-":
        return False
    if token[1].isdigit() or token[1] == ".":
        try:
            float(token)
        except ValueError:
            return True
        return False
    return True


@cache
def _wanted(names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(_norm(n) for n in names)


def _last_named(argv: Sequence[str], wanted: frozenset[str]) -> int:
    """The index of the last token that names one of the flags ``wanted`` (``_norm(token) in wanted``), -1 if none.

    A token is normalised only when it could name a flag other than as spelt (it starts with ``-`` and holds ``=``
    or ``_``); any other token names a wanted flag only by being one of the names (a wanted name holds neither).

    >>> _last_named(["vllm", "--port", "1", "--port", "2"], frozenset({"--port"}))
    3
    >>> _last_named(["vllm", "--max_model_len", "8", "--port=2"], frozenset({"--max-model-len", "--port"}))
    3
    >>> _last_named(["vllm", "--max_model_len", "8"], frozenset({"--max-model-len"}))
    1
    >>> _last_named(["x", "a_b", "-1"], frozenset({"-p"}))
    -1
    """
    for i in range(len(argv) - 1, -1, -1):
        tok = argv[i]
        if tok in wanted or (("=" in tok or "_" in tok) and tok[:1] == "-" and _norm(tok) in wanted):
            return i
    return -1


def flag_values(argv: Sequence[str], *names: str) -> list[str] | None:
    """The values of the last occurrence of a flag (any of ``names``), or None when it is absent.

    A token that is a flag is never another flag's value, so the last occurrence is the last matching token.
    """
    i = _last_named(argv, _wanted(names))
    if i < 0:
        return None
    tok = argv[i]
    if "=" in tok:
        return [tok.split("=", 1)[1]]
    values: list[str] = []
    for value in argv[i + 1:]:
        if is_flag(value):
            break
        values.append(value)
    return values


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last occurrence of a flag (its first word), or None when it is absent or bare."""
    values = flag_values(argv, *names)
    return values[0] if values else None


def int_value(argv: Sequence[str], *names: str, default: int | None = None) -> int | None:
    """An integer flag value; ``default`` when the flag is absent or its value is not an integer."""
    value = flag_value(argv, *names)
    return int(value) if value is not None and value.lstrip("-").isdigit() else default


def has_flag(argv: Sequence[str], name: str) -> bool:
    """A boolean flag's effective state: its last ``--x`` / ``--no-x`` occurrence (argparse
    ``BooleanOptionalAction``); False when neither is given."""
    positive = _norm(name)
    return _last_named(argv, _wanted((positive,))) > _last_named(argv, _wanted(("--no-" + positive[2:],)))


def served_model_name(argv: Sequence[str], model: str) -> str:
    """The model id clients must send: the first ``--served-model-name`` of its last occurrence, else the
    model itself."""
    names = flag_values(argv, "--served-model-name")
    return names[0] if names else model
