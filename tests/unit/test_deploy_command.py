"""``k3deploy deploy`` with no terminal to confirm pyinfra's prompt: one line with the fix, exit 2, nothing run."""

from __future__ import annotations

from helpers import k3


def test_a_deploy_without_a_terminal_or_y_is_refused_in_one_line():
    proc = k3("deploy", "inventories/gb300.py", timeout=120)   # stdin closed, as cron or CI runs it
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, lines
    assert "standard input is not a terminal" in lines[0] and "add -y" in lines[0] and "--dry" in lines[0]
    assert "Connecting" not in proc.stdout   # refused before pyinfra started


def test_a_missing_inventory_is_named_before_the_terminal_is_asked_about():
    proc = k3("deploy", "no/such/inventory.py", "-y", timeout=120)
    assert proc.returncode == 2 and "inventory 'no/such/inventory.py': no such file" in proc.stderr + proc.stdout
