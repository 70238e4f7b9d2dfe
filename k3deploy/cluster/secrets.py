"""What counts as a secret in an env file, and how it is shown: never its value.

    >>> mask_line("HF_TOKEN=hf_abc"), mask_line("NCCL_DEBUG=INFO")
    ('HF_TOKEN=****', 'NCCL_DEBUG=INFO')
"""

from __future__ import annotations

import re

#: env names whose values never appear in diffs, plans or logs
SECRET = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|_KEY$)", re.I)
MASK = "****"


def is_secret(name: str) -> bool:
    return bool(SECRET.search(name))


def mask_value(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    return MASK if is_secret(name) else value


def mask_line(line: str) -> str:
    """An env file line with a secret's value masked."""
    name, sep, value = line.partition("=")
    return f"{name}={MASK}" if sep and is_secret(name) else line
