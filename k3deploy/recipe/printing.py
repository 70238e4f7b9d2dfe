"""Printing argv the way the recipes site prints it: shell quoting, line layout, ``docker run`` forms."""

from __future__ import annotations

import re

_BARE_VAR = re.compile(r"\$[A-Z_][A-Z0-9_]*")
_SAFE = re.compile(r"[A-Za-z0-9_./=:@,+%-]+")


def shell_quote(value: str) -> str:
    """Quote one flag value as the builder does.

    >>> shell_quote("$HEAD_IP"), shell_quote("0.95"), shell_quote('{"a":1}')
    ('$HEAD_IP', '0.95', '\\'{"a":1}\\'')
    """
    if _BARE_VAR.fullmatch(value) or _SAFE.fullmatch(value):
        return value
    return "'" + value.replace("'", "'\\''") + "'"


def _units(args: list[str], quote: bool = True) -> list[str]:
    """One printed line per unit: a flag with its (quoted) value, or a positional."""
    lines: list[str] = []
    i, n = 0, len(args)
    while i < n:
        a = args[i]
        if a.startswith("-") and i + 1 < n and not args[i + 1].startswith("-"):
            value = args[i + 1]
            lines.append(f"{a} {shell_quote(value) if quote else value}")
            i += 2
        else:
            lines.append(a)
            i += 1
    return lines


def format_command(argv: list[str]) -> str:
    """``vllm serve <model> \\`` then one unit per line, indented by two spaces."""
    first = " ".join(argv[:3])
    return " \\\n  ".join([first, *_units(argv[3:])])


def format_router(argv: list[str]) -> str:
    """The router command: every line after the first indented by four spaces; values printed verbatim."""
    lines = _units(argv[1:], quote=False)
    head = f"{argv[0]} {lines[0]}" if lines else argv[0]
    return " \\\n    ".join([head, *lines[1:]])


def format_exports(env: dict[str, str]) -> str:
    """``export K=V`` lines, values raw (the recipes site's pip form)."""
    return "\n".join(f"export {k}={v}" for k, v in env.items())


GPU_FLAGS: dict[str, list[list[str]]] = {
    "nvidia": [["--gpus", "all"]],
    "amd": [["--device=/dev/kfd", "--device=/dev/dri"],
            ["--security-opt", "seccomp=unconfined", "--group-add", "video"]],
}


def site_docker_run_argv(argv: list[str], env: dict[str, str], image: str, port: int, vendor: str) -> list[str]:
    """The builder's ``docker run`` argv (its image entrypoint is ``vllm serve``, so those words are dropped)."""
    out = ["docker", "run"]
    for line in GPU_FLAGS.get(vendor, GPU_FLAGS["nvidia"]):
        out += line
    out += ["--privileged", "--ipc=host", "-p", f"{port}:{port}",
            "-v", "~/.cache/huggingface:/root/.cache/huggingface"]
    for k, v in env.items():
        out += ["-e", f"{k}={v}"]
    return out + [image, *argv[2:]]


def format_site_docker_run(argv: list[str], env: dict[str, str], image: str, port: int, vendor: str) -> str:
    """``docker run`` as shell text, laid out like the recipes site's docker tab."""
    gpu = [" ".join(line) for line in GPU_FLAGS.get(vendor, GPU_FLAGS["nvidia"])]
    lines = [f"docker run {gpu[0]}", *gpu[1:],
             f"--privileged --ipc=host -p {port}:{port}",
             "-v ~/.cache/huggingface:/root/.cache/huggingface"]
    lines += [f"-e {k}={v}" for k, v in env.items()]
    lines.append(f"{image} {argv[2]}")
    lines += _units(argv[3:])
    return " \\\n  ".join(lines)
