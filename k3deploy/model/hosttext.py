r"""Reading back what a host holds: a unit file's ``ExecStart=``, an env file, a launch script's command.

Only for text read from a host (the installed unit and env file, a revision's kept files): what a rollout renders
comes from its :class:`~k3deploy.model.engine.EngineSpec` and is never read back (tests/unit/test_spec_truth.py
keeps it so). Pure.

Example::

    >>> exec_start('[Service]\nExecStart="/usr/bin/docker" "run" "img" "100%%"\n')
    ['/usr/bin/docker', 'run', 'img', '100%']
    >>> parse_env("# a comment\nA=1\nB=x=y\n")
    {'A': '1', 'B': 'x=y'}
"""

from __future__ import annotations

import shlex


def split_exec(value: str) -> list[str]:
    """Split an ``Exec*=`` value the way systemd does (double/single quotes, C escapes, ``%%``, ``$$``)."""
    out: list[str] = []
    i, n = 0, len(value)
    escapes = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "r": "\r", "s": " "}
    while i < n:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            break
        word: list[str] = []
        quote = None
        while i < n:
            c = value[i]
            if quote is None and c in " \t":
                break
            if c in "\"'" and (quote is None or quote == c):
                quote = None if quote == c else c
            elif c == "\\" and i + 1 < n:
                i += 1
                word.append(escapes.get(value[i], value[i]))
            elif c in "%$" and i + 1 < n and value[i + 1] == c:
                word.append(c)
                i += 1
            else:
                word.append(c)
            i += 1
        out.append("".join(word))
    return out


def exec_start(unit_text: str | None) -> list[str] | None:
    """The argv of the unit's ``ExecStart=`` line (None when there is no unit or no such line)."""
    if not unit_text:
        return None
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            value = line[len("ExecStart="):].lstrip("-@:+!")
            return split_exec(value)
    return None


def parse_env(text: str | None) -> dict[str, str]:
    """A docker env file -> ordered {name: value} (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, value = line.partition("=")
        out[name] = value
    return out


#: the line of a launch script that names the image file its step's container runs from (pyxis, apptainer)
IMAGE_LINE = "# Container image: "


def launch_image(script: str) -> str | None:
    """The image file a launch script's container runs from (its :data:`IMAGE_LINE`), read back from a host's
    script (a revision it keeps); None where it names none (docker: the image is in its argv).

    >>> launch_image("#!/bin/bash\\n# Container image: /s/images/r.sqsh\\nexec vllm serve m\\n")
    '/s/images/r.sqsh'
    """
    for line in script.splitlines():
        if line.startswith(IMAGE_LINE):
            return line[len(IMAGE_LINE):].strip() or None
    return None


def launch_argv(script: str) -> list[str]:
    """The command a launch script runs (its container's ``docker run``, or the router's ``exec``), read back.

    >>> launch_argv("x\\nexec /usr/local/bin/vllm-router --port 30000\\n")
    ['/usr/local/bin/vllm-router', '--port', '30000']
    """
    for line in script.splitlines():
        if line.startswith("exec "):
            return shlex.split(line)[1:]
        if line.endswith(" &") and not line.startswith("#"):
            return shlex.split(line)[:-1]
    raise ValueError("no command in the launch script")
