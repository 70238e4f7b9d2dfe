"""What the tests share: the repository's paths, the command-line runner, the simulated-cluster marker's test and the
readers of a deploy's output. Fixtures live in the ``conftest.py`` files; everything else shared lives here.

Every test folder imports it the same way (``tests/`` is on pytest's ``pythonpath``)::

    from helpers import ROOT, k3

The kinds of tests have their own folders: ``tests/unit/`` (pure, in-process: no simulated nodes), ``tests/sim/``
(the simulator itself and the simulated nodes' tools, without a whole deploy) and ``tests/e2e/`` (deploys over SSH to
simulated nodes). A test that needs the simulated cluster says so with ``@pytest.mark.sim`` (or ``pytestmark``);
``tests/conftest.py`` skips it, with :func:`sim_missing`'s reason, where the cluster cannot run. Helpers of one kind
only: :mod:`helpers.engine` (simulated engines, docker and router as host processes) and :mod:`helpers.simulated`
(a simulated cluster's handles).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from k3deploy.facts.base import FactError

T = TypeVar("T")

#: the repository's root
ROOT = Path(__file__).resolve().parents[2]
#: the tests' root (``tests/``) and their data: real command outputs, golden outputs, pyinfra-testing fact fixtures,
#: recipes for the linter and for the resolver
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"
GOLDEN = TESTS / "golden"
FACTS = TESTS / "facts"
LINT_RECIPES = TESTS / "lint_recipes"
RECIPES = TESTS / "recipes"
#: the virtual environment's scripts, and its pyinfra
BIN = Path(sys.executable).parent
PYINFRA = str(BIN / "pyinfra")
#: how the tests run the command line: this interpreter, so that no installed script is needed
K3DEPLOY = [sys.executable, "-c", "from k3deploy.cli import main; main()"]
#: the first lines of an inventory of pyinfra's @fake hosts, which answer one scripted output per command: their facts
#: are read one at a time and no deployment lock is taken there (``k3deploy.facts.batch.one_at_a_time``), in every
#: process that loads the inventory (pytest's, pyinfra's, k3deploy's)
FAKE_HOSTS = ("from pyinfra.connectors.fake import FakeConnector as _Fake\nimport k3deploy.facts.batch as _batch\n"
              "_batch.one_at_a_time = lambda host: isinstance(host.connector, _Fake)\n")


def k3(*args: str, check: bool = False, cwd: Path | str = ROOT, timeout: float | None = 600,
       env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``k3deploy ARGS`` as a user does (its own process, stdin closed, in the repository root unless ``cwd``);
    ``env`` is added to this process's environment. ``check``: a non-zero exit fails the test, with the output.
    The process is forked from one that has imported k3deploy already (:mod:`helpers.zygote`)."""
    proc = _forked("k3deploy", "k3deploy", args, cwd=cwd, timeout=timeout, env=env, merged=False)
    if proc is None:
        proc = subprocess.run([*K3DEPLOY, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=None if env is None else {**os.environ, **env})
    if check and proc.returncode != 0:
        raise AssertionError(f"k3deploy {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _forked(kind: str, argv0: str, args: Sequence[str], *, cwd: Path | str, timeout: float | None,
            env: Mapping[str, str] | None, merged: bool) -> subprocess.CompletedProcess[str] | None:
    """``kind`` with ``args`` in a child of :mod:`helpers.zygote`'s process, as :func:`subprocess.run` with its
    output captured (``merged``: standard error into standard output) would give it; None where that process cannot
    take the call (the caller starts an interpreter)."""
    from helpers import zygote

    with tempfile.TemporaryDirectory(prefix="k3-call-") as tmp:
        out, err = Path(tmp) / "out", None if merged else Path(tmp) / "err"
        rc = zygote.run(kind, argv0, args, cwd=cwd, env=env, timeout=timeout, out=out, err=err)
        if rc is None:
            return None
        return subprocess.CompletedProcess([argv0, *args], rc, out.read_text(),
                                           None if err is None else err.read_text())


def k3_here(*args: str, check: bool = False, cwd: Path | str = ROOT,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """:func:`k3` in this process (``k3deploy.cli.main`` with ``args``, in ``cwd``, with ``env`` added): the same
    exit code, standard output and standard error, without an interpreter's start (about 0.4 s a command). For the
    commands that read no host (``resolve``, ``vars``, ``lint``, ``options``), whose bad input is what a test checks;
    a traceback is an exception here, which fails the test as the word "Traceback" in :func:`k3`'s output does."""
    from k3deploy.cli import main

    out, err = io.StringIO(), io.StringIO()
    before = dict(os.environ)
    code: int | str | None = 0
    try:
        os.environ.update(env or {})
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as exc:
                code = exc.code
    finally:
        os.environ.clear()
        os.environ.update(before)
    rc = code if isinstance(code, int) else 0 if code is None else 1
    proc = subprocess.CompletedProcess([*K3DEPLOY, *args], rc, out.getvalue(), err.getvalue())
    if check and rc != 0:
        raise AssertionError(f"k3deploy {' '.join(args)} exited {rc}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def two_tray_site(tmp_path: Path, group_vars: str) -> Path:
    """A site's inventory of two trays (gpu01 head, gpu02 worker) with ``group_vars`` as its
    ``group_vars/all.yml``; its path."""
    site = tmp_path / "site"
    (site / "group_vars").mkdir(parents=True)
    (site / "inventory.py").write_text(
        'head = [("gpu01", {"ssh_hostname": "10.1.0.1", "k3_ip": "10.1.0.1"})]\n'
        'workers = [("gpu02", {"ssh_hostname": "10.1.0.2", "k3_ip": "10.1.0.2", "rank": 1})]\n')
    (site / "group_vars" / "all.yml").write_text(group_vars)
    return site / "inventory.py"


def present(value: T | None) -> T:
    """``value``, failing the test where it is None (a host without an engine, a state file that is not there).

    >>> present(3)
    3
    """
    assert value is not None, "expected a value, got None"
    return value


def read(value: T | FactError | None) -> T:
    """A fact's value, failing the test where the fact could not be read (a FactError) or is missing."""
    from k3deploy.facts.base import FactError

    assert value is not None and not isinstance(value, FactError), f"the fact was not read: {value!r}"
    return value


def member(tar: tarfile.TarFile, name: str | tarfile.TarInfo) -> bytes:
    """The bytes of a regular file in ``tar``, failing the test where it is not one."""
    fh = tar.extractfile(name)
    assert fh is not None, f"{name} is not a regular file of the archive"
    return fh.read()


def parts(script: str) -> list[str]:
    r"""The scripts one command runs one after the other (:func:`k3deploy.model.commands.then`), in order.

    >>> parts("{ a <<'E'\nx\nE\n} || exit\n{ b\n} || exit\nc")
    ["a <<'E'\nx\nE", 'b', 'c']
    >>> parts("c")
    ['c']
    """
    *first, rest = script.split("\n} || exit\n")
    return [p.removeprefix("{ ") for p in first] + [rest]


def golden(name: str) -> Any:
    """The parsed JSON file ``tests/golden/NAME``."""
    return json.loads((GOLDEN / name).read_text())


def sim_missing() -> str | None:
    """Why a simulated cluster cannot run on this machine (the reason ``@pytest.mark.sim`` tests are skipped with),
    or None when it can."""
    if os.geteuid() != 0:
        return "the simulated cluster needs root"
    if shutil.which("systemd-nspawn") is None:
        return "systemd-nspawn is not installed (systemd-container; bash .ci/install-sim.sh)"
    if shutil.which("ssh") is None:
        return "ssh is not installed (openssh-client; bash .ci/install-sim.sh)"
    return None


def pyinfra(*args: str, timeout: float | None = 300, merged: bool = True,
            cwd: Path | str = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``pyinfra ARGS`` (its own process, stdin closed, forked as :func:`k3` is); ``merged``: its standard error
    (where pyinfra logs) into ``stdout``, as a terminal shows them."""
    proc = _forked("pyinfra", PYINFRA, args, cwd=cwd, timeout=timeout, env=None, merged=merged)
    if proc is not None:
        return proc
    return subprocess.run([PYINFRA, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merged else subprocess.PIPE, text=True, cwd=cwd,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def deploy(inventory: str, *extra: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """Run the deploy (``pyinfra INVENTORY deploy/k3.py -y EXTRA``); pyinfra's whole output (it logs to stderr) ends
    up in ``stdout``."""
    return pyinfra(inventory, "deploy/k3.py", "-y", *extra, timeout=timeout)


def preflight(inventory: str) -> tuple[int, dict]:
    """``k3deploy preflight INVENTORY --json``: its exit code (0 or 1) and its report."""
    proc = k3("preflight", inventory, "--json", check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def result(report: dict, host: str, check: str) -> dict:
    """The one result of ``check`` on ``host`` in a preflight report."""
    (hit,) = [r for r in report["hosts"][host]["results"] if r["check"] == check]
    return hit


def plan_json(inventory: str) -> tuple[int, dict[str, Any]]:
    """``k3deploy plan INVENTORY --json``: its exit code (0: nothing to change, 3: changes) and its answer."""
    proc = k3("plan", inventory, "--json", check=False)
    assert proc.returncode in (0, 3), why(proc) + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def why(proc: subprocess.CompletedProcess[str]) -> str:
    """What a failed assertion on a run shows: its lines that name an error or a failure (a deploy's output is long
    and the reason is rarely at its end), then the end of the output."""
    out = proc.stdout or ""
    keys = ("rror", "fail", "not serving", "observed", "Traceback", "refus", "timed out")
    hits = [line for line in out.splitlines() if any(k in line for k in keys) and " | " not in line]
    return "\n".join(["--- lines naming an error or a failure:", *hits[:60], "--- the end of the output:",
                      out[-2500:]]) + (f"\n--- stderr:\n{proc.stderr[-1500:]}" if proc.stderr else "")


def totals(output: str) -> tuple[int, int, int]:
    """(success, error, no change) of the run's "Grand total" line.

    >>> totals("Grand total  12  10  -  2")
    (10, 0, 2)
    """
    m = re.search(r"Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", output)
    assert m, output[-3000:]
    num = [0 if x == "-" else int(x) for x in m.groups()[1:]]
    return num[0], num[1], num[2]
