"""The README's first hour, run as written (its copy-paste block, extracted from README.md) on a simulated cluster:
every command exits as the README says (0; `plan` 0 or 3), the OpenAI client gets an answer, the change deploys
as a new revision, the rollback goes back to the one before, and the bundle is written."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from helpers import ROOT, k3
from helpers.readme import allowed, exits, first_hour, script

pytestmark = pytest.mark.sim

NAME = "readme1"


def test_the_readme_first_hour_runs_as_written():
    commands = first_hour()
    k3("sim", "down", "--name", NAME, check=False)   # a leftover of an interrupted earlier run
    bundle = Path(f"/tmp/{NAME}-bundle.tar.gz")
    bundle.unlink(missing_ok=True)
    try:
        proc = subprocess.run(["bash", "-c", script(commands, NAME)], capture_output=True, text=True, cwd=ROOT,
                              timeout=1800, stdin=subprocess.DEVNULL)
    finally:
        k3("sim", "down", "--name", NAME, check=False)
    out = proc.stdout + proc.stderr
    codes = exits(proc.stdout)
    assert sorted(codes) == list(range(len(commands))), out[-4000:]
    wrong = [(commands[i], rc) for i, rc in codes.items() if rc not in allowed(commands[i])]
    assert wrong == [], out[-6000:]
    assert "Generated text: " in proc.stdout, out[-4000:]
    assert "--max-num-seqs" in proc.stdout   # plan and the diff show the change
    assert "revision 1 (rolled back)" in out   # the rollback went back to the first revision (pyinfra logs on stderr)
    with tarfile.open(bundle) as tar:
        assert tar.getnames()
    bundle.unlink()
