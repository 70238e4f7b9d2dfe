"""The order the suite runs its modules in (``helpers.order``, tests/conftest.py): the longest first by the recorded
seconds (a module without a figure first), the figures recorded by ``--record-module-seconds`` without losing those of the modules a run left out,
and the recorded file naming only modules that exist."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

from helpers import ROOT, order


def test_the_examples_hold():
    result = doctest.testmod(order)
    assert result.attempted > 0 and result.failed == 0


def test_the_unmeasured_first_in_their_order_then_the_longest_first():
    modules = ["u1.py", "e1.py", "u2.py", "e2.py", "u3.py"]
    assert order.longest_first(modules, {"e2.py": 500, "e1.py": 120.5, "u2.py": 3}) == [
        "u1.py", "u3.py", "e2.py", "e1.py", "u2.py"]
    assert order.longest_first(modules, {}) == modules


def test_a_recording_keeps_the_figures_of_the_modules_it_did_not_run(tmp_path: Path):
    path = tmp_path / "seconds.json"
    assert order.load(path) == {}
    order.save({"a.py": 10.04, "b.py": 200.0}, path)
    order.save({"a.py": 300.26}, path)
    assert order.load(path) == {"a.py": 300.3, "b.py": 200.0}
    assert list(json.loads(path.read_text())["seconds"]) == ["a.py", "b.py"]     # the file too, the longest first


def test_the_recorded_file_names_only_modules_that_exist():
    seconds = order.load()
    assert seconds, f"{order.SECONDS} holds no figures"
    assert [m for m in seconds if not (ROOT / m).is_file()] == []
    assert all(s >= 0 for s in seconds.values())
