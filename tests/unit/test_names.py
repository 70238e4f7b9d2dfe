"""Names that explain themselves: no parameter of the package's own types is called by one letter (``t: Target``,
``r: Rollout``), and the word "cluster" names no Python object of gathered state."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "k3deploy"
#: the simulator's package, held to the same names
SIMULATOR = ROOT / "simulator" / "k3sim"


def sources() -> list[Path]:
    return sorted(p for top in (PACKAGE, SIMULATOR) for p in top.rglob("*.py") if "node_tools" not in p.parts)


def own_types() -> set[str]:
    """Every class the package defines."""
    return {node.name for path in sources() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)}


def one_letter_parameters(text: str, types: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in args.posonlyargs + args.args + args.kwonlyargs:
                if len(arg.arg) == 1 and arg.annotation is not None:
                    named = {n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)}
                    named |= {n.value.strip("'\"") for n in ast.walk(arg.annotation)
                              if isinstance(n, ast.Constant) and isinstance(n.value, str)}
                    if named & types:
                        found.append(f"{node.name}({arg.arg}: {ast.unparse(arg.annotation)})")
    return found


def test_no_parameter_of_the_packages_own_types_is_one_letter():
    types = own_types()
    offenders = [f"{path.relative_to(ROOT)}: {spot}" for path in sources()
                 for spot in one_letter_parameters(path.read_text(), types)]
    assert offenders == []


def test_a_one_letter_parameter_is_found():
    text = "def build(r: Rollout, c: 'Context', n: int, target: Target) -> None: ...\n"
    assert one_letter_parameters(text, {"Rollout", "Context", "Target"}) == [
        "build(r: Rollout)", "build(c: 'Context')"]


def test_no_class_is_called_cluster():
    classes = [f"{path.relative_to(ROOT)}: {node.name}" for path in sources()
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ClassDef) and node.name == "Cluster"]
    assert classes == []
