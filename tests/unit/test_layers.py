"""The package's layers, over every module and every import (those inside functions included, read from the source):
a module imports only its own layer or lower ones, nothing imports the simulated cluster (k3sim), no two modules
import each other (directly or round a cycle), the pure layers never load pyinfra or gevent; and the module map in
``k3deploy/__init__.py`` lists what is there."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import k3deploy
from helpers import ROOT

PACKAGE = Path(k3deploy.__file__).parent

#: the layers, lowest first: a module may import modules of its own layer and of the layers before it
LAYERS = ("errors", "recipe", "vendors", "model", "facts", "preflight", "runtime", "cli")

#: the layer of each module: its longest prefix in this table (the simulated cluster is a package of its own, k3sim,
#: which the product never imports: its commands reach the command line as a plugin)
LAYER_OF = {
    "k3deploy.errors": "errors",
    "k3deploy": "recipe",  # the package's front door re-exports the recipe engine's API
    "k3deploy.recipe": "recipe",
    "k3deploy.vendors": "vendors",  # the pure vendor packs: what each vendor needs, as data (but PACK_MODULES)
    "k3deploy.model": "model",
    "k3deploy.facts": "facts",
    "k3deploy.preflight": "preflight",
    "k3deploy.runtime": "runtime",
    "k3deploy.cli": "cli",
    "k3deploy.data.deploy.k3": "cli",  # the deploy file and its pyinfra configuration, as `k3deploy deploy` runs them
    "k3deploy.data.deploy.config": "cli",
}

#: the layer of a pack's module by its name, in every pack (``k3deploy.vendors.<family>.<name>``), so that a new
#: pack needs no line here: its facts, the judges of its checks with its fact plan, its cluster-wide probe
PACK_MODULES = {"facts": "facts", "checks": "preflight", "probe": "preflight"}

#: the layers that never load pyinfra, pyinfra_cli, gevent or paramiko (and what they never import)
PURE = ("errors", "recipe", "vendors", "model")
FORBIDDEN = ("pyinfra", "pyinfra_cli", "gevent", "paramiko")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: every module of the package, by name (the simulated nodes' tools are scripts of the nodes, not modules of it)
MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if "node_tools" not in path.parts}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 4 and parts[:2] == ["k3deploy", "vendors"] and parts[3] in PACK_MODULES:
        return PACK_MODULES[parts[3]]
    prefixes = [p for p in LAYER_OF if module == p or module.startswith(p + ".")]
    return LAYER_OF[max(prefixes, key=len)]


def imports_of(module: str) -> list[tuple[int, str]]:
    """(line, name) of every import in the module's source, at any depth: a module for ``import a.b`` and for
    ``from a import b`` where ``a.b`` is a module, the package ``a`` otherwise; relative imports made absolute."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if sub in MODULES else base))
    return found


def package_imports(module: str) -> list[tuple[int, str]]:
    return [(line, name) for line, name in imports_of(module) if name == "k3deploy" or name.startswith("k3deploy.")]


def where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_every_module_has_a_layer():
    assert set(LAYERS) == set(LAYER_OF.values())
    assert [m for m in MODULES if m not in LAYER_OF and not any(m.startswith(p + ".") for p in LAYER_OF)] == []
    assert [m for m in LAYER_OF if m not in MODULES] == []  # the table names no module that is gone


def test_no_module_imports_a_higher_layer():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    offenders = []
    for module in MODULES:
        for line, name in package_imports(module):
            target = name if name in MODULES else name.rpartition(".")[0]
            if rank[layer_of(target)] > rank[layer_of(module)]:
                offenders.append(f"{where(module, line)}: {module} ({layer_of(module)}) imports {name} "
                                 f"({layer_of(target)})")
    assert offenders == []


def test_no_module_imports_the_simulated_cluster():
    offenders = [f"{where(module, line)}: {module} imports {name}" for module in MODULES
                 for line, name in imports_of(module) if name.split(".")[0] == "k3sim"]
    assert offenders == []


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one node of ``graph`` (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_strongly_connected_helper():
    assert strongly_connected({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["a", "b"]]
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    graph = {module: {name for _, name in package_imports(module) if name in MODULES} - {module}
             for module in MODULES}
    cycles = []
    for component in strongly_connected(graph):
        members = set(component)
        cycles.append(" <-> ".join(component) + ": " + "; ".join(
            f"{where(module, line)} imports {name}" for module in component
            for line, name in package_imports(module) if name in members and name != module))
    assert cycles == []


def test_pure_layers_import_no_pyinfra_or_gevent_anywhere():
    """Also imports inside functions (a lazy import would escape the test below until it runs)."""
    offenders = [f"{where(module, line)}: {module} imports {name}" for module in MODULES
                 if layer_of(module) in PURE for line, name in imports_of(module)
                 if name.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_pure_layers_load_no_pyinfra_or_gevent():
    # a fresh interpreter: import every module of the pure layers, then look at what got loaded
    pure = sorted(m for m in MODULES if layer_of(m) in PURE)
    code = (f"import sys, importlib\nfor m in {pure!r}:\n    importlib.import_module(m)\n"
            f"print(sorted({{n.split('.')[0] for n in sys.modules}} & {set(FORBIDDEN)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"the pure layers pull in {proc.stdout.strip()}"


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


def test_the_docs_layout_matches_the_tree():
    doc = (ROOT / "docs" / "layout.md").read_text()
    section = doc.split("## Layout", 1)[1].split("\n## ", 1)[0]
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
