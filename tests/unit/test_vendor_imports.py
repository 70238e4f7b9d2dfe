"""A vendor's truth lives in its pack: no module outside ``k3deploy/vendors/`` imports a specific pack (its pure
``__init__``, its ``checks``, its probe), but the registries that list every pack (``PACKS`` in
``k3deploy/vendors/__init__.py``, ``VENDOR_CHECKS`` in ``k3deploy/preflight/checks.py``), each vendor's facts module
and the simulated cluster, which simulates each vendor's tools. The rest finds the plan's pack through the registry
and asks it: its transport settings, its checks and probes, its kinds of health event."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import k3deploy
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.base import HostFacts
from k3deploy.preflight.checks import VENDOR_CHECKS
from k3deploy.preflight.runner import fact_plan
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors import PACKS

PACKAGE = Path(k3deploy.__file__).parent

FAMILIES = tuple(pack.name for pack in PACKS)

#: the modules that may name a pack: the registry of the packs' preflight sides, and each vendor's facts
ALLOWED = {"k3deploy.preflight.checks", *(f"k3deploy.facts.{family}" for family in FAMILIES)}


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


def test_a_fact_of_no_field_is_refused():
    with pytest.raises(AttributeError, match="no fact 'gpus'"):
        HostFacts("n1").keep("gpus", [])
