"""Progress of a long build or copy for people: a plain line every few seconds where the output is not a terminal
(bytes, share of the expected total, rate, time left), rich's bar on a terminal, nothing when quiet (``--json``);
the simulated nodes' base root build shows its bytes on disk against the last build's."""

from __future__ import annotations

import io
import json
import re
import threading

from k3deploy.runtime.progress import Meter, tree_bytes, watch

MIB = 2**20


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_every_few_seconds_with_bytes_rate_and_time_left():
    out, clock = io.StringIO(), Clock()
    meter = Meter("weights", 100 * MIB, stream=out, every=10, clock=clock)
    for second in range(1, 31):          # 2 MiB a second for 30 s
        clock.now = second
        meter.update(2 * MIB * second)
    meter.close()
    lines = out.getvalue().splitlines()
    assert lines == ["weights: 20.0 MiB of ~100.0 MiB (20%), 2.0 MiB/s, about 40 s left",
                     "weights: 40.0 MiB of ~100.0 MiB (40%), 2.0 MiB/s, about 30 s left",
                     "weights: 60.0 MiB of ~100.0 MiB (60%), 2.0 MiB/s, about 20 s left"]


def test_quiet_says_nothing():
    out, clock = io.StringIO(), Clock()
    meter = Meter("weights", 100 * MIB, stream=out, every=0, quiet=True, clock=clock)
    clock.now = 5
    meter.update(50 * MIB)
    meter.close()
    assert out.getvalue() == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_with_bytes_and_no_plain_lines():
    out, clock = Terminal(), Clock()
    meter = Meter("image", 10 * MIB, stream=out, every=0, clock=clock)
    clock.now = 1
    meter.update(5 * MIB)
    meter.bar.refresh()
    meter.close()
    shown = out.getvalue()
    assert "image" in shown and re.search(r"5\.\d/10\.\d MiB", shown), shown
    assert "about" not in shown                   # rich's own columns, not the plain line


def test_watch_measures_a_growing_directory_while_the_work_runs(tmp_path):
    out = io.StringIO()
    grown = threading.Event()

    def measure() -> int:
        (tmp_path / f"f{len(list(tmp_path.iterdir()))}").write_bytes(b"x" * MIB)
        if tree_bytes(tmp_path) >= 3 * MIB:
            grown.set()
        return tree_bytes(tmp_path)

    with watch("root", measure, total=8 * MIB, stream=out, every=0, poll=0.01):
        assert grown.wait(10)
    assert re.match(r"root: \d\.0 MiB of ~8\.0 MiB \(\d+%\)", out.getvalue().splitlines()[0]), out.getvalue()


def test_the_base_root_expects_what_the_last_build_took(tmp_path, monkeypatch):
    from k3sim import base

    monkeypatch.setenv("K3SIM_CACHE", str(tmp_path))
    assert base.expected_bytes() == base.BASE_BYTES
    (tmp_path / "base-0123").mkdir()
    (tmp_path / "base-0123" / base.MARKER).write_text(json.dumps({"id": "0123", "bytes": 286525633}))
    assert base.expected_bytes() == 286525633
