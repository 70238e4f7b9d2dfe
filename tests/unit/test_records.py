"""Revision records cut short, split current markers and which revision a rollback to ``previous`` picks
(:mod:`k3deploy.model.revisions`), and the router's unit reading its workers from the worker file."""

from __future__ import annotations

from dataclasses import replace

import pytest

from k3deploy.errors import K3Error
from k3deploy.model import commands
from k3deploy.model.revisions import GroupHistory, Revision, combine, parse_listing, rollback_target, sha256

UNIT, ENV = "/etc/systemd/system/k3-engine.service", "/etc/k3deploy/k3-engine.env"


def record(number: int) -> Revision:
    return Revision(group="engine", number=number, created="t", image="img", summary="s",
                    files={f"{h}:{p}": sha256(f"{h}{p}{number}") for h in ("n1", "n2") for p in (UNIT, ENV)})


def listing(numbers: list[int], current: int, cut: int | None = None, sums: dict[str, str] | None = None,
            served: bool = True) -> list[str]:
    """What ``list_revisions`` prints on a host: revision ``cut``'s record cut short (with ``sums``)."""
    out = [f"K3_CURRENT={current}"]
    for n in numbers:
        meta = record(n).to_json()
        out += [f"K3_META=/etc/k3deploy/revisions/engine/{n}/meta.json", *(meta[:50] if n == cut else meta).splitlines(),
                "K3_KEPT=k3-engine.env k3-engine.service meta.json" + (" served" if served else "")]
        if n == cut:
            out.append("K3_SUMS=" + " ".join(f"{d}  {name}" for name, d in (sums or {}).items()))
    return out


def own_sums(host: str, number: int) -> dict[str, str]:
    return {"k3-engine.service": sha256(f"{host}{UNIT}{number}"), "k3-engine.env": sha256(f"{host}{ENV}{number}")}


def test_a_record_cut_short_is_corrupt_on_its_host_and_rebuildable_where_its_files_match() -> None:
    h = combine("engine", [("n1", parse_listing(listing([1, 2], 2))),
                           ("n2", parse_listing(listing([1, 2], 2, cut=2, sums=own_sums("n2", 2))))])
    assert h.numbers == [1, 2] and h.corrupt_on(2) == {"n2": "/etc/k3deploy/revisions/engine/2/meta.json"}
    assert not h.restorable(2) and h.lacking(2) == ["n2"] and h.rebuildable(2, "n2")
    assert h.next_number() == 3 and not h.split


def test_a_record_whose_files_differ_is_not_rebuildable() -> None:
    h = combine("engine", [("n1", parse_listing(listing([1, 2], 2))),
                           ("n2", parse_listing(listing([1, 2], 2, cut=2, sums=own_sums("n2", 1))))])
    assert h.corrupt_on(2) and not h.rebuildable(2, "n2")


def test_a_record_cut_short_everywhere_still_takes_its_number() -> None:
    h = combine("engine", [(n, parse_listing(listing([1, 2], 2, cut=2))) for n in ("n1", "n2")])
    assert h.numbers == [1] and h.next_number() == 3 and not h.rebuildable(2, "n1")


def test_a_split_marker_is_named_with_each_node() -> None:
    h = combine("engine", [("n1", parse_listing(listing([1, 2], 1))), ("n2", parse_listing(listing([1, 2], 2)))])
    assert h.split and h.currents == {"n1": 1, "n2": 2}
    h = replace(h, runs_now=2)
    assert "(n1: 1, n2: 2); the nodes run revision 2" in h.split_line()


def test_rollback_to_previous_skips_revisions_that_never_served() -> None:
    h = GroupHistory("engine", {n: record(n) for n in (1, 2, 3)}, current=3, marked={1, 3})
    served = [n for n in h.numbers if h.served(n)]
    assert rollback_target(h.numbers, 3, True, served=served) == 1
    assert rollback_target(h.numbers, 3, 2, served=served) == 2
    with pytest.raises(K3Error, match="k3_rollback=2"):
        rollback_target([2, 3], 3, True, served=[3])


def test_the_router_calls_write_the_worker_file_before_calling_the_router() -> None:
    text = commands.router_remove("http://n1:30000", ["http://n1:8000"],
                                  ("/etc/k3deploy/k3-engine-router.workers", ["http://n3:8000"]))
    assert text.index("mv -f") < text.index("/remove_worker") and "--retry" in text
    assert 'K3_ROUTER_WORKERS="http://n3:8000"' in text
