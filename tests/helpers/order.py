"""The order the suite runs its test modules in: the longest first, by the seconds each took at its last measured run
(``tests/module-seconds.json``), so that the two test processes of ``tools/test.sh`` (pytest-xdist, a module at a
time each) end close together instead of one starting a long module when the other is done. The modules without a
figure run first, in their order: a new module is most likely a long one, and an unknown module costs little at the
start but its whole length at the end. ``pytest --record-module-seconds`` writes the figures of the modules it ran
into the file (tests/conftest.py).

Example::

    >>> longest_first(["a.py", "b.py", "c.py", "d.py"], {"b.py": 40.0, "d.py": 300.0})
    ['a.py', 'c.py', 'd.py', 'b.py']
    >>> module_of("tests/e2e/test_stage.py::test_x[1]")
    'tests/e2e/test_stage.py'
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

#: each module's seconds (its tests' setup, call and teardown together: its clusters' bring-up and tear-down included)
SECONDS = Path(__file__).resolve().parents[1] / "module-seconds.json"


def module_of(nodeid: str) -> str:
    """The module (its path from the repository root) of a test's node id."""
    return nodeid.split("::", 1)[0]


def longest_first(modules: Iterable[str], seconds: Mapping[str, float]) -> list[str]:
    """``modules`` the longest first; those without a figure before all, in their order."""
    listed = list(dict.fromkeys(modules))
    return sorted(listed, key=lambda m: (-seconds.get(m, math.inf), listed.index(m)))


def load(path: Path = SECONDS) -> dict[str, float]:
    """The recorded seconds per module (none where the file is missing)."""
    if not path.exists():
        return {}
    data: dict[str, float] = json.loads(path.read_text())["seconds"]
    return data


def save(measured: Mapping[str, float], path: Path = SECONDS) -> None:
    """Record ``measured`` (seconds per module, rounded), keeping the figures of the modules it lacks."""
    seconds = {**load(path), **{m: round(s, 1) for m, s in measured.items()}}
    ordered = dict(sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0])))
    path.write_text(json.dumps({"about": "seconds per test module at its last measured run, the longest first: "
                                         "pytest --record-module-seconds (docs/testing.md)",
                                "seconds": ordered}, indent=1) + "\n")
