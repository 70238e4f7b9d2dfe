"""The table of what preflight checks, per vendor (docs/requirements.md), is the one generated from the checks'
registry (so it cannot drift from the checks), and that table names every registered check of every vendor with its
fix."""

from helpers import ROOT
from k3deploy.vendors import PACKS
from k3deploy.vendors.table import BEGIN, END, markdown_table, replace_in, rows


def test_the_requirements_doc_lists_what_preflight_checks_per_vendor_as_generated():
    doc = (ROOT / "docs" / "requirements.md").read_text()
    between = doc.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert between == markdown_table(), "regenerate: python -m k3deploy.vendors.table --write docs/requirements.md"


def test_every_registered_check_of_every_vendor_has_a_row_with_its_fix():
    table = rows()
    for pack in PACKS:
        for check in pack.all_checks():
            if check.id == "nccl.probe" and check.id not in pack.probes:
                continue
            mine = [r for r in table if r[0] == check.id and (r[1] == "every vendor" or pack.brand in r[1])]
            assert len(mine) == 1, (pack.name, check.id)
            assert mine[0][3] == check.required and mine[0][4] == check.fix


def test_the_amd_rows_say_what_amd_needs():
    by = {(r[0], r[1]): r for r in rows()}
    assert "SPX" in by[("gpu.count", "AMD")][4] and "memory_peers/amdkfd" in by[("rdma.gpudirect", "AMD")][2]
    assert ">= 6.10" in by[("rocm.driver", "AMD")][3] and ("rocm.driver.group", "AMD") in by


def test_write_replaces_only_the_table():
    text = f"before\n{BEGIN}\nold table\n{END}\nafter\n"
    assert replace_in(text) == f"before\n{BEGIN}\n{markdown_table()}\n{END}\nafter\n"
