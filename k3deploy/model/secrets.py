"""What counts as a secret, and how it is shown: never its value. The one rule every output applies (plan, vars,
history, resolve, the runbook, status, bundle, the deploy's diffs and the revisions' ``meta.json``).

A name is secret when it contains ``TOKEN``, ``SECRET``, ``PASSWORD``, ``PASSWD``, ``CREDENTIAL``, ``PRIVATE`` or
``API_KEY``, or ends in ``_KEY`` (any case); a name ending in ``_FILE``, ``_PATH`` or ``_DIR`` (and pyinfra's
``ssh_key`` setting, a key file) names where a secret is kept, not the secret, and is shown, as is a name ending
in ``_TOKENS`` (a count of tokens: ``MAX_TOKENS``, ``k3_slo_output_tokens``). A secret's value is
shown as ``****`` wherever it appears: an env file line, an env mapping, a variables listing (``k3_extra_env``'s
entries, a setting such as ``ssh_password``), an argv that sets an env (``-e NAME=value``), a recorded ``repr`` of a
mapping.

    >>> mask_line("HF_TOKEN=hf_abc"), mask_line("NCCL_DEBUG=INFO"), mask_line("HF_TOKEN_PATH=/run/secrets/hf")
    ('HF_TOKEN=****', 'NCCL_DEBUG=INFO', 'HF_TOKEN_PATH=/run/secrets/hf')
    >>> is_secret("k3_slo_output_tokens"), is_secret("HF_TOKENS_FILE"), is_secret("MY_TOKEN")
    (False, False, True)
    >>> mask_env({"DB_PASSWORD": "hunter2", "NCCL_DEBUG": "INFO"})
    {'DB_PASSWORD': '****', 'NCCL_DEBUG': 'INFO'}
    >>> mask_argv(["docker", "run", "-e", "MY_API_KEY=abc", "--env=DB_PASSWD=x", "-e", "A=1", "img"])
    ['docker', 'run', '-e', 'MY_API_KEY=****', '--env=DB_PASSWD=****', '-e', 'A=1', 'img']
    >>> mask_listing({"k3_extra_env": {"value": {"MY_API_KEY": "abc", "A": "1"}, "from": "group_vars/all.yml"}})
    {'k3_extra_env': {'value': {'MY_API_KEY': '****', 'A': '1'}, 'from': 'group_vars/all.yml'}}
    >>> mask_repr("{'MY_API_KEY': 'abc', 'A': '1'} (group_vars/all.yml)")
    "{'MY_API_KEY': '****', 'A': '1'} (group_vars/all.yml)"
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

#: names whose values never appear in diffs, plans, listings, runbooks, records or logs
SECRET = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|API_KEY|_KEY$)", re.I)
#: secret-looking names that say where a secret is kept (a path), not the secret itself
REFERENCE = re.compile(r"(?i:_FILE|_PATH|_DIR)$|^ssh_key$")
#: names that count tokens, not secrets
COUNT = re.compile(r"(?i:_TOKENS)$")
MASK = "****"
_ENV_FLAGS = ("-e", "--env")
_ENV_WORD = re.compile(r"[A-Z_][A-Z0-9_]*=")   # an env setting as an argv word (after -e, or as env takes it)
_QUOTED = re.compile(r"""(?P<q>['"])(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P=q)(?P<sep>\s*:\s*)"""
                     r"""(?P<v>'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")""")


def is_secret(name: str) -> bool:
    return bool(SECRET.search(name)) and not REFERENCE.search(name) and not COUNT.search(name)


def mask_value(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    return MASK if is_secret(name) else value


def mask_line(line: str) -> str:
    """An env file line with a secret's value masked."""
    name, sep, value = line.partition("=")
    return f"{name}={MASK}" if sep and is_secret(name) else line


def mask_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """An env mapping (``NAME -> value``) with the secrets' values masked."""
    return {k: MASK if is_secret(str(k)) and v is not None else v for k, v in env.items()}


def mask_argv(argv: Iterable[str]) -> list[str]:
    """An argv with the value of every secret-named env it sets masked: ``-e NAME=value``, ``--env NAME=value``,
    ``--env=NAME=value`` and upper-case ``NAME=value`` words (as ``env`` takes them)."""
    out: list[str] = []
    for word in argv:
        flag, eq, rest = word.partition("=")
        if flag in _ENV_FLAGS and eq:
            out.append(f"{flag}={mask_line(rest)}")
        else:
            out.append(mask_line(word) if _ENV_WORD.match(word) else word)
    return out


def mask_repr(text: str) -> str:
    """A recorded text with the values of secret-named keys of a mapping's ``repr`` (or JSON) masked."""
    return _QUOTED.sub(lambda m: m[0] if not is_secret(m["name"]) else
                       f"{m['q']}{m['name']}{m['q']}{m['sep']}{m['v'][0]}{MASK}{m['v'][0]}", text)


def mask_listing(listing: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """A variables listing (``{name: {"value", "from"}}``): a secret-named setting's value, and in a mapping value
    (``k3_extra_env``) or a list value (``k3_extra_args``) the secrets' values, masked."""
    out: dict[str, dict[str, Any]] = {}
    for name, item in listing.items():
        value = item.get("value")
        if is_secret(name) and value is not None:
            value = MASK
        elif isinstance(value, Mapping):
            value = mask_env(value)
        elif isinstance(value, list) and all(isinstance(x, str) for x in value):
            value = mask_argv(value)
        out[name] = {**item, "value": value}
    return out


def scrub(text: str, values: Iterable[str]) -> str:
    """``text`` with every known secret value replaced by the mask (longest first)."""
    for value in sorted({v for v in values if v}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def secret_values(env: Mapping[str, Any]) -> list[str]:
    """The values of the secret-named entries of an env mapping."""
    return [str(v) for k, v in env.items() if is_secret(str(k)) and v not in (None, "")]
