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
def _index(flags: tuple[tuple[str, ...], ...]) -> dict[str, int]:
    want: dict[str, int] = {}
    for k, names in enumerate(flags):
        for name in names:
            want.setdefault(_norm(name), k)
    return want


def last_flags(argv: Sequence[str], *flags: tuple[str, ...]) -> list[int]:
    """For each flag (its names, as a tuple), the index of its last occurrence in ``argv`` (-1 if absent): several
    flags read in one pass over the argv, from the end (it stops once each is found).

    >>> last_flags(["vllm", "serve", "m", "-tp", "4", "--port=1", "--tensor_parallel_size", "8"],
    ...            ("--port",), ("--tensor-parallel-size", "-tp"), ("--headless",))
    [5, 6, -1]
    """
    want = _index(flags)
    found = [-1] * len(flags)
    left = len(flags)
    for i in range(len(argv) - 1, -1, -1):
        tok = argv[i]
        k = want.get(tok)
        if k is None:
            # normalised only when it could name a flag other than as spelt (a name holds no "=" and no "_")
            if not ("=" in tok or "_" in tok) or tok[:1] != "-":
                continue
            k = want.get(_norm(tok))
            if k is None:
                continue
        if found[k] < 0:
            found[k] = i
            left -= 1
            if not left:
                break
    return found


def values_at(argv: Sequence[str], i: int) -> list[str] | None:
    """The values of the flag at index ``i`` of ``argv`` (None for -1: absent)."""
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


def int_at(argv: Sequence[str], i: int, default: int | None = None) -> int | None:
    """The integer value of the flag at index ``i`` (see :func:`int_value`)."""
    values = values_at(argv, i)
    value = values[0] if values else None
    return int(value) if value is not None and value.lstrip("-").isdigit() else default


def flag_values(argv: Sequence[str], *names: str) -> list[str] | None:
    """The values of the last occurrence of a flag (any of ``names``), or None when it is absent.

    A token that is a flag is never another flag's value, so the last occurrence is the last matching token.
    """
    return values_at(argv, last_flags(argv, names)[0])


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last occurrence of a flag (its first word), or None when it is absent or bare."""
    values = flag_values(argv, *names)
    return values[0] if values else None


def int_value(argv: Sequence[str], *names: str, default: int | None = None) -> int | None:
    """An integer flag value; ``default`` when the flag is absent or its value is not an integer."""
    return int_at(argv, last_flags(argv, names)[0], default)


def has_flag(argv: Sequence[str], name: str) -> bool:
    """A boolean flag's effective state: its last ``--x`` / ``--no-x`` occurrence (argparse
    ``BooleanOptionalAction``); False when neither is given."""
    positive = _norm(name)
    on, off = last_flags(argv, (positive,), ("--no-" + positive[2:],))
    return on > off


def served_model_name(argv: Sequence[str], model: str) -> str:
    """The model id clients must send: the first ``--served-model-name`` of its last occurrence, else the
    model itself."""
    names = flag_values(argv, "--served-model-name")
    return names[0] if names else model
