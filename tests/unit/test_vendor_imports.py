"""A vendor's truth lives in its pack, and adding a vendor touches its pack, its simulated tools and data files only:
no module outside ``k3deploy/vendors/`` imports a specific pack (its pure ``__init__``, its facts, its ``checks``, its
probe) or names one's module in a string, the simulated cluster aside, which simulates each vendor's tools; the packs
are found, not listed (``PACKS`` in ``k3deploy/vendors/__init__.py``, ``VENDOR_CHECKS`` in
``k3deploy/preflight/checks.py``, the layers of a pack's modules), as a fourth pack dropped beside them shows. The
rest finds the plan's pack through the registry and asks it: its transport settings, its checks and probes, its kinds
of health event."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import k3deploy
from helpers import ROOT
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.base import HostFacts
from k3deploy.preflight.checks import VENDOR_CHECKS
from k3deploy.preflight.runner import fact_plan
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors import PACKS

PACKAGE = Path(k3deploy.__file__).parent

FAMILIES = tuple(pack.name for pack in PACKS)

#: the modules outside the packs that may name a pack: none (the registries find them)
ALLOWED: set[str] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: every module of the package, by name (the simulated nodes' tools are scripts of the nodes, not modules of it)
MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if "node_tools" not in path.parts}


def imported(module: str) -> list[tuple[int, str]]:
    """(line, name) of every absolute import of the module, at any depth; ``from a import b`` names ``a.b``."""
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def names_a_pack(name: str) -> bool:
    return any(name == f"k3deploy.vendors.{f}" or name.startswith(f"k3deploy.vendors.{f}.") for f in FAMILIES)


def test_no_module_outside_the_packs_imports_a_specific_pack():
    found = []
    for module in MODULES:
        if module.startswith("k3deploy.vendors") or module in ALLOWED:
            continue
        found += [f"{module}:{line} imports {name}" for line, name in imported(module) if names_a_pack(name)]
    assert found == []


def strings_naming_a_pack(source: str) -> list[str]:
    """Where the source's string values name a pack's module (``k3deploy.vendors.nvidia.facts``,
    ``k3deploy/vendors/amd``): an import by name escapes the import test above (docstrings may name them)."""
    tree = ast.parse(source)
    docs = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [f"{node.lineno} names {family}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            for family in FAMILIES for sep in "./" if f"vendors{sep}{family}" in node.value]


def test_no_module_outside_the_packs_names_a_packs_module():
    assert strings_naming_a_pack('"""k3deploy.vendors.amd"""\nimportlib.import_module("k3deploy.vendors.amd.facts")') \
        == ["2 names amd"]
    found = [f"{module}:{hit}" for module in MODULES
             if not module.startswith("k3deploy.vendors.") or module == "k3deploy.vendors"
             for hit in strings_naming_a_pack(MODULES[module].read_text())]
    assert found == []


#: a fourth pack, as a new vendor adds it: its pure pack, its facts, its preflight side (here borrowing NVIDIA's
#: data, which a real one would not)
FOURTH = {
    "__init__.py": """
        import dataclasses
        from k3deploy.vendors.nvidia import PACK as SOME
        PACK = dataclasses.replace(SOME, name="fourth", brand="Fourth", container_key="fourth", rank=4)
    """,
    "facts.py": """
        from k3deploy.facts.base import K3Fact
        class FourthDevices(K3Fact[list[str]]):
            tool = required_binary = shown_command = "fourth-smi"
            def parse(self, lines: list[str]) -> list[str]:
                return lines
    """,
    "checks.py": """
        from k3deploy.preflight.base import VendorChecks
        from k3deploy.vendors.fourth import PACK
        from k3deploy.vendors.fourth.facts import FourthDevices
        class FourthChecks(VendorChecks):
            pack = PACK
            capture = ((FourthDevices, {}),)
        CHECKS = FourthChecks()
    """,
}


def test_a_fourth_pack_is_found_without_a_line_elsewhere(tmp_path):
    """A pack dropped beside the others (here in a directory added to the packs' search path before they are
    found) is a pack of the registry, its preflight side is the checks' and its facts are captured, with no line
    changed outside it; its modules get their layers by their names."""
    for name, text in FOURTH.items():
        (tmp_path / "fourth" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "fourth" / name).write_text(textwrap.dedent(text))
    code = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.find_spec("k3deploy.vendors")
        spec.submodule_search_locations.append({str(tmp_path)!r})
        module = importlib.util.module_from_spec(spec)
        sys.modules["k3deploy.vendors"] = module
        spec.loader.exec_module(module)
        from k3deploy.errors import K3Error
        from k3deploy.preflight.checks import VENDOR_CHECKS
        from k3deploy.preflight.runner import CAPTURE_FACTS
        print([p.name for p in module.PACKS], VENDOR_CHECKS["fourth"].pack is module.pack_for("Fourth"))
        print([cls.__name__ for cls, _ in CAPTURE_FACTS if cls.__module__ == "k3deploy.vendors.fourth.facts"])
        try:
            module.pack_for("Intel")
        except K3Error as exc:
            print(exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "['nvidia', 'amd', 'ascend', 'fourth'] True", "['FourthDevices']",
        "k3deploy has no vendor pack for Intel hardware: use NVIDIA, AMD, Huawei or Fourth hardware"]
    spec = importlib.util.spec_from_file_location("_layers", Path(__file__).with_name("test_layers.py"))
    assert spec is not None and spec.loader is not None
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)   # the layers' table, whose pack modules get their layers by their names
    assert [layers.layer_of(f"k3deploy.vendors.fourth.{name}") for name in ("facts", "checks", "probe")] == \
        ["facts", "preflight", "preflight"]


def test_a_pack_is_named_as_its_package(tmp_path):
    (tmp_path / "fifth").mkdir()
    (tmp_path / "fifth" / "__init__.py").write_text(textwrap.dedent(FOURTH["__init__.py"]))
    code = textwrap.dedent(f"""
        import k3deploy.vendors as packs
        packs.__path__.append({str(tmp_path)!r})
        packs.discover()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "the pack of k3deploy/vendors/fifth is named 'fourth': name it 'fifth', as its package" in proc.stderr


def test_importing_a_pack_by_name_from_the_registrys_package_counts():
    """What ``model/health.py`` did (``from k3deploy.vendors import nvidia``), and a pack's module, both count; the
    registry's own names do not."""
    assert names_a_pack("k3deploy.vendors.nvidia") and names_a_pack("k3deploy.vendors.ascend.checks.peer_checks")
    assert not names_a_pack("k3deploy.vendors.pack_for") and not names_a_pack("k3deploy.vendors.base.Pack")


def test_each_packs_probes_are_the_ones_its_preflight_side_runs():
    for pack in PACKS:
        assert tuple(p.check for p in VENDOR_CHECKS[pack.name].probes()) == pack.probes, pack.name


def test_each_kind_of_health_event_is_one_packs():
    kinds = [k.kind for pack in PACKS for k in pack.health]
    assert len(kinds) == len(set(kinds)) and {"xid", "ras", "npu-health"} <= set(kinds)


@pytest.mark.parametrize("hw", ["h200", "gb300", "mi355x", "ascend_910c"])
def test_every_fact_a_pack_reads_is_a_field_of_its_facts_type(hw):
    """The common facts are :class:`HostFacts`'s; each pack's own are fields of its own type, none of another's."""
    need = Requirements(hardware()[hw], "default", None, nodes=2, multi_node=True, pd=True)
    judges = VENDOR_CHECKS[next(p.name for p in PACKS if p.brand == need.brand)]
    own = {f.name for f in dataclasses.fields(judges.facts_type)} - {f.name for f in dataclasses.fields(HostFacts)}
    read = {name for name, _, _ in fact_plan(need, "10.0.0.1", "/c", "")} - {"health"}
    assert {name for name, _, _ in judges.facts(need)} <= own | {"topology"}
    assert read <= own | {f.name for f in dataclasses.fields(HostFacts)}
    others = {f.name for c in VENDOR_CHECKS.values() if c is not judges for f in dataclasses.fields(c.facts_type)}
    assert not own & others


@pytest.mark.parametrize("hw", ["h200", "gb300", "mi355x", "ascend_910c"])
def test_each_fact_read_fills_the_field_it_is_named_for(hw):
    """A read's ``into`` is a typed method of the facts type (no setattr by name): what it reads lands in the field
    the batch names it by, the health fact's in ``health_error`` (an error) or ``health`` (a reading)."""
    need = Requirements(hardware()[hw], "default", None, nodes=2, multi_node=True, pd=True)
    judges = VENDOR_CHECKS[next(p.name for p in PACKS if p.brand == need.brand)]
    for read in fact_plan(need, "10.0.0.1", "/c", ""):
        facts = judges.facts_type("n1")
        got = read.fact.default()
        read.into(facts, got)
        assert getattr(facts, "health_error" if read.name == "health" else read.name) is got, read.name
