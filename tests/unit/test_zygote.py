"""The tests' forking process (``helpers.zygote``): each command its own child, its exit code and output its own,
however fast it ends (two answers of the process may come in one read), and a command past its timeout killed
while the next call still gets its own answer."""

from __future__ import annotations

import subprocess
import time

import pytest

from helpers import ROOT, zygote


def test_commands_that_end_at_once_get_their_own_exit_codes_without_waiting(tmp_path):
    for i in range(5):
        began = time.monotonic()
        rc = zygote.run("k3deploy", "k3deploy", ["no-such-command"], cwd=ROOT, env=None, timeout=30,
                        out=tmp_path / f"out{i}", err=tmp_path / f"err{i}")
        assert rc == 2 and "No such command 'no-such-command'" in (tmp_path / f"err{i}").read_text()
        assert time.monotonic() - began < 10        # not its timeout: the answer was there
    rc = zygote.run("k3deploy", "k3deploy", ["--help"], cwd=ROOT, env={"COLUMNS": "100"}, timeout=30,
                    out=tmp_path / "help", err=None)
    assert rc == 0 and "Usage: k3deploy" in (tmp_path / "help").read_text()


def test_a_command_past_its_timeout_is_killed_and_the_next_one_answered(tmp_path):
    # a command that waits on its standard input would end at once (it is /dev/null): an inventory that takes a
    # minute to load stands in for a hung run
    inventory = tmp_path / "inv.py"
    inventory.write_text('import time\ntime.sleep(60)\nhosts = ["@local"]\n')
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run("pyinfra", "pyinfra", [str(inventory), "exec", "-y", "--", "true"], cwd=ROOT, env=None,
                   timeout=2, out=tmp_path / "hung", err=None)
    rc = zygote.run("k3deploy", "k3deploy", ["no-such-command"], cwd=ROOT, env=None, timeout=30,
                    out=tmp_path / "next", err=tmp_path / "next-err")
    assert rc == 2
