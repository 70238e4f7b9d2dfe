"""``k3deploy deploy INVENTORY``, the deploy of an installed tool: run from a directory outside the clone (no
``deploy/k3.py``, ``config.py`` or ``group_vars/`` there), it brings a simulated node (one B300 box) to serving as ``pyinfra
INVENTORY deploy/k3.py`` does from the clone; a bad inventory path is one line and exit 2, and nothing runs."""

from __future__ import annotations

import pytest

from helpers import k3
from helpers.simulated import endpoint_of, openai_client


@pytest.mark.sim
def test_the_deploy_runs_from_any_directory(sim_factory, tmp_path):
    sim = sim_factory("smdeploy", "b300", 1)
    run = k3("deploy", str(sim.inventory), "-y", cwd=tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "Kimi-K3" in openai_client(endpoint_of(output))
    assert list(tmp_path.iterdir()) == []   # nothing written where it ran


@pytest.mark.parametrize("name, said", [("nosuch.py", "no such file"), ("notes.txt", "not a pyinfra inventory file")])
def test_a_bad_inventory_path_is_one_line_and_exit_2(tmp_path, name, said):
    (tmp_path / "notes.txt").write_text("not an inventory\n")
    run = k3("deploy", str(tmp_path / name), "-y", cwd=tmp_path)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and f"inventory {str(tmp_path / name)!r}: {said}" in run.stderr
