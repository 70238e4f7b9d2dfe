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

A secret never belongs in an argv (``ps`` shows it, and the unit file that runs it is 0644): a flag named like a
secret with a value (``--api-key KEY``, ``--hf-token=hf_...``), or any word shaped like a well-known token, is
refused where the variables are read (:func:`argv_secret`) and masked wherever an argv is shown.

    >>> mask_argv(["--api-key", "s3cr3t", "--hf-token=hf_abcdefghijklmnopqrstuvwxyz", "--tokenizer", "t"])
    ['--api-key', '****', '--hf-token=****', '--tokenizer', 't']
    >>> argv_secret(["--max-num-batched-tokens", "8192", "--api-key", "s3cr3t"])
    (3, '--api-key')
    >>> argv_secret(["--served-model-name", "hf_abcdefghijklmnopqrstuvwxyz0123"]), argv_secret(["--hf-token"])
    ((1, '--served-model-name'), None)
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
#: the engines' API key: vLLM reads it from its environment (``--api-key`` without an argv); a unit's env file (0600)
#: holds it, and every client k3deploy runs on a node reads it from there
API_KEY_ENV = "VLLM_API_KEY"
_ENV_FLAGS = ("-e", "--env")
_ENV_WORD = re.compile(r"[A-Z_][A-Z0-9_]*=")   # an env setting as an argv word (after -e, or as env takes it)
#: a flag whose value is a secret: its name ends like one (``--api-key``, ``--hf-token``, ``--db-password``)
SECRET_FLAG = re.compile(r"(?i)^--?[a-z0-9_.-]*?(api[-_]key|token|secret|password|passwd|[-_]key)$")
#: words shaped like well-known tokens, whatever flag carries them: Hugging Face, OpenAI-style, GitHub, Slack, AWS
#: access key ids, JSON web tokens, a bearer header
TOKEN_SHAPE = re.compile(r"(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
                         r"|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.|(?i:bearer)\s+\S{8,})")
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


def _is_flag(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not word[1:2].isdigit()


def _secret_words(words: list[str]) -> list[tuple[int, str]]:
    """Every word of ``words`` that carries a secret, as ``(index, the flag it belongs to)``."""
    out: list[tuple[int, str]] = []
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if _is_flag(word) and SECRET_FLAG.match(flag):
            if eq and value:
                out.append((i, flag))
            elif not eq and i + 1 < len(words) and not _is_flag(words[i + 1]):
                out.append((i + 1, flag))
        elif TOKEN_SHAPE.search(word) and not any(i == j for j, _ in out):
            owner = flag if _is_flag(word) else next((w.partition("=")[0] for w in reversed(words[:i]) if _is_flag(w)),
                                                     "a word")
            out.append((i, owner))
    return out


def argv_secret(argv: Iterable[str]) -> tuple[int, str] | None:
    """The first word of ``argv`` that carries a secret, as ``(index, the flag it belongs to)``: the value of a
    secret-named flag (``--api-key KEY``, ``--api-key=KEY``; a bare ``--hf-token`` carries none), or a word shaped
    like a token (:data:`TOKEN_SHAPE`) wherever it is (its flag: the flag before it, or the word itself). None: no
    secret."""
    found = _secret_words(list(argv))
    return found[0] if found else None


def mask_argv(argv: Iterable[str]) -> list[str]:
    """An argv with the value of every secret-named env it sets masked: ``-e NAME=value``, ``--env NAME=value``,
    ``--env=NAME=value`` and upper-case ``NAME=value`` words (as ``env`` takes them); and every secret it carries
    itself (:func:`argv_secret`: a secret-named flag's value, a word shaped like a token)."""
    out: list[str] = []
    for word in argv:
        flag, eq, rest = word.partition("=")
        if flag in _ENV_FLAGS and eq:
            out.append(f"{flag}={mask_line(rest)}")
        else:
            out.append(mask_line(word) if _ENV_WORD.match(word) else word)
    for i, _ in _secret_words(out):
        flag, eq, _value = out[i].partition("=")
        out[i] = f"{flag}={MASK}" if eq and _is_flag(out[i]) else MASK
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
