"""The README a person reads first: at most 150 lines, the two commands (the test command is what CI runs), a first
hour that covers the whole path (sim up to sim down) in order, and every relative link of the README and docs/
resolving to a file and heading that exist. (tests/e2e/test_readme_first_hour.py runs the first hour.)"""

from __future__ import annotations

import re
import subprocess

from helpers import K3DEPLOY, ROOT
from helpers.readme import README, allowed, broken_links, exits, first_hour, script, strip_comment
from k3deploy.vendors.table import BEGIN

#: what the first hour must do, in this order (the issue's "first hour"), as the start of a command
PATH_OF_THE_FIRST_HOUR = [
    "source .venv/bin/activate", "k3deploy sim up", "k3deploy preflight", "pyinfra $INV deploy/k3.py -y",
    "python tools/chat.py", "k3deploy status", "echo ", "k3deploy plan $INV", "pyinfra $INV deploy/k3.py --dry --diff",
    "pyinfra $INV deploy/k3.py -y", "k3deploy history", "pyinfra $INV deploy/k3.py -y --data k3_rollback=",
    "k3deploy bundle", "k3deploy sim down",
]


def test_the_readme_is_at_most_150_lines():
    assert len(README.read_text().splitlines()) <= 150


def test_every_relative_link_of_the_readme_and_docs_resolves():
    assert broken_links() == []


def test_the_readme_keeps_the_two_commands_and_ci_runs_its_test_command():
    text = README.read_text()
    assert "bash tools/demo.sh" in text and "bash tools/test.sh" in text
    assert "bash tools/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_the_first_hour_walks_the_whole_path_in_order():
    commands = first_hour()
    at = 0
    for start in PATH_OF_THE_FIRST_HOUR:
        found = [i for i, c in enumerate(commands) if i >= at and c.startswith(start)]
        assert found, f"the first hour has no {start!r} after command {at}: {commands}"
        at = found[0] + 1
    # it changes a setting in the cluster's group_vars, and tells where k3deploy lives
    assert any("group_vars/all.yml" in c for c in commands)
    assert ".venv/bin" in README.read_text().split("## The first hour", 1)[1].split("\n## ", 1)[0]


def test_the_first_hour_script_records_each_exit_and_names_the_cluster():
    body = script(["NAME=first", "k3deploy plan $INV", "false"], "g1x")
    assert "NAME=g1x\n" in body and "NAME=first" not in body
    assert exits('x\n@@ 0 0\ny\n@@ 1 3\n@@ 2 1\n') == {0: 0, 1: 3, 2: 1}
    assert allowed("k3deploy plan $INV --rollback previous") == {0, 3} and allowed("k3deploy status $INV") == {0}


def test_a_comment_is_stripped_but_not_a_hash_inside_quotes():
    assert strip_comment("k3deploy status $INV   # serving?").strip() == "k3deploy status $INV"
    assert strip_comment("echo 'a # b' # c").strip() == "echo 'a # b'"
    assert strip_comment('EP=$(x | python -c "print(1)  # no")').strip() == 'EP=$(x | python -c "print(1)  # no")'


def test_every_doc_the_code_names_exists():
    named = {m for path in [*(ROOT / "k3deploy").rglob("*.py"), *(ROOT / "deploy").glob("*.py")]
             for m in re.findall(r"docs/[\w-]+\.md", path.read_text())}
    assert named and sorted(p for p in named if not (ROOT / p).is_file()) == []


def test_the_offline_runbooks_prerequisites_point_to_the_requirements_table(tmp_path):
    out = tmp_path / "runbook.md"
    proc = subprocess.run([*K3DEPLOY, "runbook", "inventories/gb300.py", "-o", str(out), "--offline"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    prerequisites = out.read_text().split("1. Prerequisites", 1)[1].split("\n## ", 1)[0]
    assert "docs/requirements.md" in prerequisites and "README" not in prerequisites
    assert BEGIN in (ROOT / "docs" / "requirements.md").read_text()
