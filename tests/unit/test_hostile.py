"""No value reaches a node's shell as script text: every remote command, rendered with hostile values for each of
its string parameters, runs in a real ``sh`` (dash) whose tools are stubs, and nothing the values carry runs.

The commands are enumerated, not listed: every public function of :mod:`k3deploy.model.commands` and the
``command()`` of every fact in :mod:`k3deploy.facts` that takes strings, so a new one is covered the day it is
written. Each script runs twice, with every stub tool succeeding and then failing, so both branches of its checks
run. A payload that ran would call ``k3pwn`` (a stub that leaves a marker file) or write the marker by redirection.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import FactBase

import k3deploy.facts
from k3deploy.facts.batch import Batch, specs
from k3deploy.model import commands
from k3deploy.vendors import PACKS

#: public functions of commands.py that return data, not a script
NOT_SCRIPTS = {"model_dir", "hub_dir", "archive_path", "chat_body", "staged_path", "file_names"}
#: stub tools: each exits with $K3_RC (0 or 1) and prints nothing
TOOLS = ("systemctl", "systemd-run", "docker", "curl", "rsync", "journalctl", "sleep", "mkdir", "rm", "mv", "cp",
         "install", "cat", "sed", "tr", "grep", "awk", "find", "xargs", "nproc", "readlink", "openssl", "sha256sum",
         "shasum", "ls", "wc", "head", "tail", "sort", "uniq", "gzip", "base64", "python3", "touch", "chmod", "ln",
         "tee", "env", "stat", "df", "ip", "ss", "nvidia-smi", "rocm-smi", "npu-smi", "hccn_tool", "ibstat",
         "ibv_devinfo", "lspci", "uname", "hostname", "nvcc", "modinfo", "lsmod", "dpkg", "rpm", "id", "sudo",
         "timedatectl", "chronyc", "ulimit", "getent", "free", "lscpu", "numactl", "ping", "ethtool", "jq", "cut",
         "printenv", "seq", "test", "true", "false", "mktemp", "du", "blockdev", "lsblk", "mount", "findmnt", "k3")
#: real tools the scripts need to end (loops on the clock, a walk up a path)
REAL = ("date", "dirname", "basename")


def payloads(marker: Path) -> list[str]:
    m = str(marker)
    return [
        "x'; k3pwn; echo '",
        'x"; k3pwn; echo "',
        "$(k3pwn)",
        "`k3pwn`",
        "x\nk3pwn\n",
        "x; k3pwn #",
        f"x'>{m}'",
        f"x>{m}",
        "x && k3pwn",
        "x | k3pwn",
        "${IFS}$(k3pwn)'\\''",
        "a\\'; k3pwn; \\",
        "repo/x@sha256:$(k3pwn)'`k3pwn`'",    # a pinned image: the digest's own branches
        f"10.0.0.2/29501' ; k3pwn ; echo '\n'$(k3pwn)'>{m}",
    ]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    stubs = root / "bin"
    stubs.mkdir()
    marker = root / "pwned"
    for tool in TOOLS:
        (stubs / tool).write_text('#!/bin/sh\nexit "${K3_RC:-0}"\n')
    (stubs / "k3pwn").write_text(f"#!/bin/sh\n: > {shlex.quote(str(marker))}\n")
    # timeout runs its command (without the limit): the command's own arguments are what is tested
    (stubs / "timeout").write_text('#!/bin/sh\nshift\nexec "$@"\n')
    for tool in ("sh", "dash", "bash", *REAL):
        real = shutil.which(tool)
        assert real, tool
        (stubs / tool).symlink_to(real)
    for f in stubs.iterdir():
        if not f.is_symlink():
            f.chmod(0o755)
    work = root / "work"
    work.mkdir()
    return stubs, work, marker


def run_hostile(sandbox, name: str, render) -> None:
    """Render with each payload and run the result both ways; no payload may leave the marker."""
    stubs, work, marker = sandbox
    for payload in payloads(marker):
        try:
            script = render(payload)
        except (ValueError, TypeError):
            continue   # refused before it became a script
        if isinstance(script, list):
            script = shlex.join(script)
        for rc in ("0", "1"):
            marker.unlink(missing_ok=True)
            proc = subprocess.run(["dash", "-c", script], cwd=work, capture_output=True, text=True, timeout=30,
                                  env={"PATH": str(stubs), "HOME": str(work), "K3_RC": rc})
            assert "Syntax error" not in proc.stderr, f"{name}({payload!r}): {proc.stderr}\n{script}"
            assert not marker.exists(), f"{name} ran what {payload!r} carries:\n{script}"


def value_for(annotation: Any, payload: str) -> Any:
    """A value of the parameter's type: the payload for strings (each item of a list of strings), else a small
    harmless value."""
    text = str(annotation).replace(" ", "")
    if "tuple[str,str]" in text:
        return [(payload, payload)]
    if "list[list" in text:
        return [[0, payload, payload]]
    if "Sequence[str]" in text or "list[str]" in text:
        return [payload, payload]
    if text.startswith("str") or "|str" in text:
        return payload
    if "float" in text:
        return 0.01
    if "bool" in text:
        return True
    if "int" in text:
        return 0
    raise AssertionError(f"no value for a parameter of type {annotation}")


def arguments(fn, payload: str, skip: int = 0) -> dict[str, Any]:
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return {p.name: value_for(p.annotation, payload) for p in params
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def takes_strings(fn, skip: int = 0) -> bool:
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return any("str" in str(p.annotation) or "list[list" in str(p.annotation) for p in params)


def command_functions() -> list[str]:
    return sorted(name for name, fn in inspect.getmembers(commands, inspect.isfunction)
                  if fn.__module__ == commands.__name__ and not name.startswith("_") and name not in NOT_SCRIPTS)


def facts_taking_strings() -> list[type[FactBase[Any]]]:
    found: dict[str, type[FactBase[Any]]] = {}
    names = [f"k3deploy.facts.{info.name}" for info in pkgutil.iter_modules(k3deploy.facts.__path__)]
    names += [f"k3deploy.vendors.{pack.name}.facts" for pack in PACKS]   # each pack's facts
    for name in names:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (issubclass(cls, FactBase) and cls.__module__ == name and cls is not Batch
                    and not inspect.isabstract(cls) and takes_strings(cls.command, skip=1)):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


def test_the_enumeration_finds_the_commands():
    names = command_functions()
    assert {"wait_tcp", "serve_peers", "unit_status", "probe", "receive_image", "start_units"} <= set(names)
    assert len(facts_taking_strings()) >= 8


@pytest.mark.parametrize("name", command_functions())
def test_no_command_runs_what_a_value_carries(sandbox, name):
    fn = getattr(commands, name)
    run_hostile(sandbox, name, lambda payload: fn(**arguments(fn, payload)))


@pytest.mark.parametrize("cls", facts_taking_strings(), ids=lambda c: c.__qualname__)
def test_no_fact_runs_what_a_value_carries(sandbox, cls):
    run_hostile(sandbox, cls.__qualname__, lambda payload: cls().command(**arguments(cls().command, payload)))


def test_a_batch_of_facts_runs_what_no_value_carries(sandbox):
    items = [(f"f{i}", cls, arguments(cls().command, "x'; k3pwn; echo '")) for i, cls in
             enumerate(facts_taking_strings())]
    run_hostile(sandbox, "Batch", lambda payload: Batch().command(specs(
        [(name, cls, {k: (payload if isinstance(v, str) else v) for k, v in kwargs.items()})
         for name, cls, kwargs in items if not any(isinstance(v, list) for v in kwargs.values())])))


# ------------------------------------------------------------------------- what a value carries arrives as it is


def test_status_reads_a_served_name_with_backslashes_as_it_is(sandbox):
    """``k3deploy status`` reads ``/v1/models`` through :func:`commands.unit_status` under dash, whose ``echo``
    would turn ``\\\\`` into ``\\`` (and so the JSON's ``\\\\b`` into a backspace): the name must come back whole."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from k3deploy.facts.status import UnitRuntime

    name = "org\\Kimi\\K3-\\n\\b\\\\x"
    body = json.dumps({"object": "list", "data": [{"id": name, "object": "model"}]}).encode()

    class Engine(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the handler's API)
            payload = body if self.path == "/v1/models" else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stubs, work, _ = sandbox
    tools = work / "status-bin"
    tools.mkdir(exist_ok=True)
    for tool in ("curl", "tr", "sed"):   # the real ones; systemctl and docker stay stubs
        if not (tools / tool).exists():
            (tools / tool).symlink_to(shutil.which(tool))
    try:
        script = UnitRuntime().command("k3-engine.service", "k3-engine", "docker",
                                       f"http://127.0.0.1:{server.server_address[1]}")
        proc = subprocess.run(["dash", "-c", script], capture_output=True, text=True, timeout=30,
                              env={"PATH": f"{tools}:{stubs}", "K3_RC": "0"})
    finally:
        server.shutdown()
    run = UnitRuntime().process(proc.stdout.splitlines())
    assert run.health == 200 and run.models == (name,), proc.stdout
