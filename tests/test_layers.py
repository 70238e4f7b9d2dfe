"""The package's layers: the pure ones (the recipe engine and the cluster model) never import pyinfra or gevent,
and the module map in ``k3deploy/__init__.py`` lists what is there."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

import k3deploy

PURE = ("k3deploy.recipe", "k3deploy.model")
FORBIDDEN = ("pyinfra", "pyinfra_cli", "gevent", "paramiko")


def modules_of(package: str) -> list[str]:
    pkg = __import__(package, fromlist=["_"])
    return [package] + [m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")]


@pytest.mark.parametrize("package", PURE)
def test_pure_layers_import_no_pyinfra_or_gevent(package):
    # a fresh interpreter: import every module of the layer, then look at what got loaded
    code = (f"import sys, importlib\nfor m in {modules_of(package)!r}:\n    importlib.import_module(m)\n"
            f"print(sorted({{n.split('.')[0] for n in sys.modules}} & {set(FORBIDDEN)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"{package} pulls in {proc.stdout.strip()}"


@pytest.mark.parametrize("package", PURE)
def test_pure_layers_name_no_pyinfra_import_anywhere(package):
    """Also imports inside functions (a lazy import would escape the test above until it runs)."""
    root = Path(k3deploy.__file__).parent / package.split(".")[1]
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                if n.split(".")[0] in FORBIDDEN or n.startswith(("k3deploy.runtime", "k3deploy.facts",
                                                                  "k3deploy.preflight", "k3deploy.sim",
                                                                  "k3deploy.cli")):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {n}")
    assert offenders == []


def test_module_map_lists_every_package_and_module():
    doc = k3deploy.__doc__ or ""
    pkg = Path(k3deploy.__file__).parent
    missing = []
    for sub in sorted(p for p in pkg.iterdir() if (p / "__init__.py").is_file()):
        for mod in sorted(sub.glob("*.py")):
            if mod.stem != "__init__" and f"{sub.name}/{mod.name}" not in doc:
                missing.append(f"{sub.name}/{mod.name}")
        for nested in sorted(p for p in sub.iterdir() if (p / "__init__.py").is_file()):
            if f"{sub.name}/{nested.name}/" not in doc:
                missing.append(f"{sub.name}/{nested.name}/")
    assert missing == []


def test_readme_layout_matches_the_tree():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    pkg = Path(k3deploy.__file__).parent
    for sub in sorted(p for p in pkg.iterdir() if (p / "__init__.py").is_file()):
        assert f"k3deploy/{sub.name}/" in section, sub.name
    for top in ("deploy/", "inventories/", "templates/", "group_vars/", "tests/", "benchmarks/", "tools/"):
        assert top in section, top


def test_no_module_calls_another_modules_private_helper():
    pkg = Path(k3deploy.__file__).parent
    offenders = []
    for path in pkg.rglob("*.py"):
        if "node_tools" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("k3deploy"):
                offenders += [f"{path.relative_to(ROOT)} imports {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert offenders == []
