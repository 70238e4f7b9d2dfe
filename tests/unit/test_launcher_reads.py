"""``k3_launcher`` is read in one place, :func:`k3deploy.runtime.launchers.launcher_for`: every other module asks
the launcher it gives (what to read, what changes, what a revision keeps, how a group is polled and stopped), and
nothing outside :mod:`k3deploy.runtime.launchers` asks which launcher it is (``isinstance``)."""

from __future__ import annotations

import ast
from pathlib import Path

import k3deploy

PACKAGE = Path(k3deploy.__file__).parent
#: where the variable is declared (its default and description) and the one module that reads it
DECLARED = PACKAGE / "model" / "variables.py"
READER = PACKAGE / "runtime" / "launchers.py"


def reads(path: Path) -> list[int]:
    """The lines of ``path`` that read ``k3_launcher``: an attribute ``.k3_launcher``, or the name as a string of its
    own (``getattr(v, "k3_launcher")``, ``values["k3_launcher"]``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "k3_launcher":
            out.append(node.lineno)
        elif isinstance(node, ast.Constant) and node.value == "k3_launcher":
            out.append(node.lineno)
    return out


def test_only_launcher_for_reads_k3_launcher():
    found = {str(p.relative_to(PACKAGE.parent)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if p not in (DECLARED, READER) and "node_tools" not in p.parts and (lines := reads(p))}
    assert found == {}, f"k3_launcher read outside launcher_for (ask launcher_for's launcher instead): {found}"


def test_launcher_for_reads_it():
    tree = ast.parse(READER.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "launcher_for")
    assert any(isinstance(n, ast.Attribute) and n.attr == "k3_launcher" for n in ast.walk(fn))
    assert reads(READER) == [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                             and n.attr == "k3_launcher"]


def test_the_check_sees_a_read(tmp_path: Path):
    probe = tmp_path / "m.py"
    probe.write_text("def f(v):\n    return v.k3_launcher == 'slurm' or getattr(v, 'k3_launcher')\n")
    assert reads(probe) == [2, 2]


#: the launchers: a difference between them is a method of the ``Launcher`` protocol, never a branch on the class
LAUNCHERS = frozenset({"Slurm", "Systemd"})


def launcher_branches(path: Path) -> list[int]:
    """The lines of ``path`` that ask whether something is one of the launchers: ``isinstance(x, Slurm)``, with a
    tuple of classes or a dotted name (``launchers.Systemd``) too."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                and len(node.args) == 2):
            continue
        kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
        names = {k.id if isinstance(k, ast.Name) else k.attr if isinstance(k, ast.Attribute) else "" for k in kinds}
        if names & LAUNCHERS:
            out.append(node.lineno)
    return out


def test_no_launcher_branch_outside_the_launchers():
    found = {str(p.relative_to(PACKAGE.parent)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if p != READER and (lines := launcher_branches(p))}
    assert found == {}, f"a branch on the launcher's class (make it a method of Launcher instead): {found}"


def test_the_branch_check_sees_a_branch(tmp_path: Path):
    probe = tmp_path / "m.py"
    probe.write_text("def f(a, b, c):\n    return isinstance(a, Slurm) or isinstance(b, (int, launchers.Systemd))"
                     " or isinstance(c, int)\n")
    assert launcher_branches(probe) == [2, 2]
