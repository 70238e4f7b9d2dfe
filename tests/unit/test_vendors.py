"""The vendor packs: every check is registered once with its command, requirement and fix; the runbook's check table
takes its commands from that registry (no empty cell, for every hardware family); a fact shows and runs the command
its check registers; and no code outside the packs, the recipe engine and the simulator branches on the vendor."""

from __future__ import annotations

import ast
import importlib
import inspect
import re

import pytest

from helpers import ROOT
from k3deploy.facts.base import K3Fact, wrap
from k3deploy.model.commands import PEERS_UNIT
from k3deploy.model.inventory import plan_for, records_of, variables_for
from k3deploy.model.rollout import plan_rollout
from k3deploy.model.runbook import Context, blocks, build, to_markdown
from k3deploy.model.runbook.blanks import Blank
from k3deploy.preflight.checks import VENDOR_CHECKS, CheckResult
from k3deploy.recipe.taxonomy import hardware
from k3deploy.runtime.connections import load_inventory
from k3deploy.vendors import PACKS, Pack, Spot, pack_for, pack_for_container

#: one example inventory per hardware family (HGX, NVL72 trays, AMD Instinct, Ascend A3) and a P/D one
INVENTORIES = ["b300.py", "h100.py", "gb300.py", "gb200.py", "mi355x.py", "ascend910c.py", "pd_b300.py"]
FACT_MODULES = (*(f"k3deploy.vendors.{pack.name}.facts" for pack in PACKS), "k3deploy.facts.rdma", "k3deploy.facts.host",
                "k3deploy.facts.rollout")


def rollout(inventory: str):
    records = records_of(load_inventory(f"inventories/{inventory}").inventory)
    variables = variables_for(records, inventory)[records[0].name].vars
    return plan_rollout(plan_for(records, variables), records, variables)


def fact_classes() -> dict[str, type[K3Fact]]:
    mods = [importlib.import_module(m) for m in FACT_MODULES]
    return {n: c for m in mods for n, c in vars(m).items() if inspect.isclass(c) and issubclass(c, K3Fact)}


def emitted_check_ids() -> dict[str, set[str]]:
    """Per module of the preflight side, the check ids its judges report (the second argument of ``add``/``error``
    and of ``CheckResult``, where it is written out)."""
    paths = [*sorted((ROOT / "k3deploy/preflight").glob("*.py")), *sorted((ROOT / "k3deploy/vendors").glob("*/checks.py"))]
    out: dict[str, set[str]] = {}
    for path in paths:
        ids = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            arg = node.args[1]
            if name in ("add", "error", "CheckResult") and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                ids.add(arg.value)
        out[str(path.relative_to(ROOT))] = ids
    return out


@pytest.mark.parametrize("pack", PACKS, ids=lambda p: p.name)
def test_every_registered_check_has_its_command_requirement_and_fix(pack: Pack):
    spot = Spot(address="10.0.0.1")
    ids = [c.id for c in pack.all_checks()]
    assert len(ids) == len(set(ids))
    for check in pack.all_checks():
        assert re.fullmatch(r"[a-z]+(\.[a-z]+)+", check.id), check.id
        assert check.command_for(spot).strip(), check.id
        assert check.required.strip() and check.fix.strip(), check.id
    assert pack.check(pack.driver_check).id == pack.driver_check
    assert pack_for(pack.brand) is pack and pack_for_container(pack.container_key) is pack


def test_every_check_a_judge_reports_is_registered():
    emitted = emitted_check_ids()
    assert sum(len(ids) for ids in emitted.values()) > 20
    for module, ids in emitted.items():
        family = module.split("/")[2] if module.startswith("k3deploy/vendors/") else None
        packs = [pack_for_container(p.container_key) for p in PACKS if family in (None, p.name)]
        for check in ids:
            registered = [p.name for p in packs if p is not None and check in {c.id for c in p.all_checks()}]
            assert registered, f"{module} reports {check!r}, which no pack registers"
    assert {name for name in VENDOR_CHECKS} == {p.name for p in PACKS}


def test_a_checks_command_is_the_one_its_fact_shows_and_runs():
    classes = fact_classes()
    linked = 0
    for pack in PACKS:
        for check in pack.all_checks():
            if not check.fact:
                continue
            linked += 1
            fact = classes[check.fact]
            command = check.command_for(Spot(peers_unit=PEERS_UNIT))
            assert fact.shown_command == command, (pack.name, check.id)
            runs = fact().command()
            if fact.command is K3Fact.command:
                assert runs == wrap(command)
            assert all(part.strip() in runs for part in command.split(";")), (pack.name, check.id, runs)
    assert linked >= 8


def _table_rows(md: str) -> list[list[str]]:
    section = md.split("## 1. Prerequisites", 1)[1].split("\n## ", 1)[0]
    return [[cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| check")]


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_the_runbooks_check_table_has_every_command_from_the_registry(inventory):
    r = rollout(inventory)
    pack = pack_for(hardware()[r.plan.hardware])
    hosts = list(dict.fromkeys(u.host for u in r.units))
    every = [c.id for c in pack.all_checks()]
    rows = [CheckResult(h, check, "pass", "seen", "wanted") for h in hosts for check in every]
    md = to_markdown(build(r, Context(inventory=f"inventories/{inventory}", preflight=rows,
                                      addresses={h: h for h in hosts}, ssh={h: ["ssh", h] for h in hosts},
                                      brand=pack.brand, guide=None, version="0")))
    table = [row for row in _table_rows(md) if len(row) == 6]
    assert len(table) == len(rows)
    for check, cell, *_ in table:
        assert cell not in ("", "``"), f"{inventory}: {check} has no command"
        assert cell.startswith("`") and cell.endswith("`")
    address = next(u.node.address for u in r.units if u.host == hosts[0])
    spot = Spot(address=address, cache=r.vars.k3_model_cache, router_bin=r.vars.k3_router_bin, image=r.plan.image,
                devices=hardware()[r.plan.hardware].gpu_count, peers_unit=PEERS_UNIT)
    first = table[: len(every)]
    assert [(check, cell) for check, cell, *_ in first] == [(c.id, f"`{c.command_for(spot)}`")
                                                            for c in pack.all_checks()]


@pytest.mark.parametrize("inventory", ["gb300.py", "mi355x.py", "ascend910c.py"])
def test_an_offline_runbook_lists_every_node_checks_command(inventory):
    r = rollout(inventory)
    pack = pack_for(hardware()[r.plan.hardware])
    hosts = list(dict.fromkeys(u.host for u in r.units))
    md = to_markdown(build(r, Context(inventory=f"inventories/{inventory}", preflight=[],
                                      addresses={h: h for h in hosts}, ssh={h: ["ssh", h] for h in hosts},
                                      brand=pack.brand, guide=None, version="0",
                                      blanks=[Blank(hosts[0], "IFACE", "the interface", "ip -o -4 addr show")])))
    checks = [b for b in blocks(md) if b.when == "check" and b.node == hosts[0] and "echo @" not in b.text]
    assert len(checks) == 1
    text = checks[0].text
    address = next(u.node.address for u in r.units if u.host == hosts[0])
    spot = Spot(address=address, cache=r.vars.k3_model_cache, router_bin=r.vars.k3_router_bin, image=r.plan.image,
                devices=hardware()[r.plan.hardware].gpu_count, peers_unit=PEERS_UNIT)
    for check in pack.all_checks():
        if check.each_node and check.where == "node":
            assert check.command_for(spot) in text, check.id
    own = {c.command_for(spot) for c in pack.all_checks()}
    foreign = {c.command_for(spot) for p in PACKS if p is not pack for c in p.checks} - own
    assert foreign and not [command for command in foreign if command in text]


#: where code may compare a brand or vendor: the packs themselves, the recipe engine (the recipe's own per-brand
#: data), the simulator (the simulated vendors' tools)
ALLOWED = ("k3deploy/vendors/", "k3deploy/recipe/", "simulator/k3sim/")
VENDOR_WORD = re.compile(r"brand|vendor", re.I)


def vendor_branches(source: str) -> list[str]:
    """The comparisons, ``match`` statements and ``.get`` lookups of ``source`` that name a brand or vendor."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            if any(VENDOR_WORD.search(ast.unparse(o)) for o in [node.left, *node.comparators]):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Match) and VENDOR_WORD.search(ast.unparse(node.subject)):
            found.append(f"{node.lineno}: match {ast.unparse(node.subject)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and VENDOR_WORD.search(ast.unparse(node.args[0])):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_outside_the_packs_branches_on_the_vendor():
    """``grep -rnE "(brand|vendor)" k3deploy deploy | grep -E "==|!=| in |match |case "``, read as code: a comparison,
    a ``match`` or a lookup by brand or vendor, outside the packs, the recipe engine and the simulator."""
    paths = [p for p in [*(ROOT / "k3deploy").rglob("*.py"), *(ROOT / "deploy").rglob("*.py")]
             if not str(p.relative_to(ROOT)).startswith(ALLOWED)]
    assert len(paths) > 50
    offenders = [f"{p.relative_to(ROOT)}:{hit}" for p in paths for hit in vendor_branches(p.read_text())]
    assert offenders == []


def test_the_branch_finder_sees_the_old_forms():
    old = ('if sel.brand == "NVIDIA":\n    pass\nx = spec.vendor in ("nvidia", "amd")\n'
           'y = UCX_TLS.get(brand)\nmatch plan.vendor:\n    case "npu":\n        pass\n'
           '# a vendor tool may hang in a bad state\nz = pack_for(brand).transport\n')
    assert sorted(int(hit.split(":")[0]) for hit in vendor_branches(old)) == [1, 3, 4, 5]


def test_hardware_within_a_vendor_is_data_in_its_pack():
    nvidia, amd, ascend = (pack_for(b) for b in ("NVIDIA", "AMD", "Huawei"))
    # NVL72 trays get the IMEX channel and wait for nvidia-imex; HGX boards do not
    assert nvidia.container.after(imex=True) == ["nvidia-fabricmanager.service", "nvidia-imex.service"]
    assert nvidia.container.after(imex=False) == ["nvidia-fabricmanager.service"]
    # A2 (8 NPUs) and A3 (16 dies): one --device per NPU, from the hardware's count
    assert ascend.container.run_flags(8).count("--device") == 8 + 3
    assert ascend.container.run_flags(16).count("--device") == 16 + 3
    net = ascend.check("ascend.network")
    assert "seq 0 7" in net.command_for(Spot(devices=8)) and "seq 0 15" in net.command_for(Spot(devices=16))
    # MI300X and MI355X: matched by PCI device id or by product name as words
    mi300 = hardware()["mi300x"] if "mi300x" in hardware() else None
    if mi300 is not None:
        assert amd.model_matches("AMD Instinct MI300X OAM", None, mi300.gpu_names, ())
    assert amd.model_matches("whatever", "0x74a5", (), ("0x74a5",))
    assert not nvidia.model_matches("NVIDIA H200 NVL", None, ("NVIDIA H200",), ())
