"""A start, phase by phase, on the simulated cluster: two gb300 trays in one group deployed once; `status --json`
carries each unit's last start per phase (read from the simulated engine's vLLM 0.33 log lines and systemd's start
time), `history --json` the same start as the revision recorded it on each node with the node's stage toward it,
`timeline` draws them (a bar per node and stage step or phase, as wide as its seconds) and the bundle carries both."""

from __future__ import annotations

import json
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest

from helpers import deploy, k3, member, why
from helpers.simulated import Sim
from k3deploy.model.timeline import PLOT_W

pytestmark = pytest.mark.sim

HEAD_PHASES = ["container", "rendezvous", "weights", "compile", "kv_cache", "graphs", "ready"]
SVG = "{http://www.w3.org/2000/svg}"
LOAD = 3.0   # the simulated engine's load: 300 s nominal x the time scale 0.01 (simulator/k3sim/profiles.py)


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    s = Sim("phs", "gb300", 2)
    try:
        s.set_vars("k3_strategy: multi_node_tp\nk3_stage: per_node\n")
        run = deploy(s.inventory)
        assert run.returncode == 0, why(run)
        yield s
    finally:
        s.down()


def test_status_history_timeline_and_bundle_show_each_start_phase_by_phase(sim, tmp_path):
    head, worker = (n["name"] for n in sim.info["nodes"])
    st = json.loads(k3("status", sim.inventory, "--json", check=True).stdout)
    units = {u["host"]: u for g in st["groups"] for u in g["units"]}
    assert list(units[head]["startup"]) == HEAD_PHASES                     # the head serves the API
    assert list(units[worker]["startup"]) == HEAD_PHASES[:-1]              # a headless worker: no API
    for u in units.values():
        s = u["startup"]
        assert all(v >= 0 for v in s.values()) and u["compile_cache"] == "miss"
        # the simulated engine spends 70 % of its load on the weights, 15 % compiling, 10 % capturing graphs (the
        # journal stamps a line as it receives it: a few ms either way)
        for phase, share in (("weights", 0.7), ("compile", 0.15), ("graphs", 0.1)):
            assert share * LOAD - 0.05 <= s[phase] < share * LOAD + 1.5, (phase, s)

    hist = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]["engine"]
    current = next(r for r in hist["revisions"] if r["number"] == hist["current"])
    recorded = {host: by_unit["k3-engine.service"] for host, by_unit in current["startup"].items()}
    assert set(recorded) == {head, worker}
    for host, rec in recorded.items():   # the revision kept the very start status reads
        assert rec["startup"] == units[host]["startup"] and rec["startup_complete"] is True
        assert rec["gate"] >= rec["startup_begun"] + rec["startup_total"]   # recorded once the group served
    # each tray's stage toward the revision, step by step (k3_stage: per_node: each pulled the image and downloaded
    # the weights itself), ended before its start began
    assert set(current["stage"]) == {head, worker}
    for host, staged in current["stage"].items():
        assert {"image_pull", "weights_download"} <= set(staged) and all(v > 0 for v in staged.values()), staged
        assert max(e for _, e in recorded[host]["stage_times"].values()) <= recorded[host]["startup_begun"]

    picture = tmp_path / "rollout.svg"
    t = json.loads(k3("timeline", sim.inventory, "-o", str(picture), "--json", check=True).stdout)
    assert (t["group"], t["revision"]) == ("engine", hist["current"])
    root = ET.parse(picture).getroot()
    bars = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]
    scale = PLOT_W / t["span"]
    for host, rec in recorded.items():
        shown = {r.get("data-phase", ""): r for r in bars if r.get("data-host") == host
                 and r.get("data-kind") != "stage"}
        assert set(shown) == {*rec["startup"], "gate"}, sorted(shown)
        for phase, seconds in rec["startup"].items():
            assert float(shown[phase].get("width", "")) == pytest.approx(seconds * scale, abs=0.02), (host, phase)
        # a bar per stage step, as wide as its seconds, before the start's first phase
        staged = {r.get("data-phase", ""): r for r in bars if r.get("data-host") == host
                  and r.get("data-kind") == "stage"}
        assert set(staged) == set(rec["stage"]), sorted(staged)
        for step, seconds in rec["stage"].items():
            assert float(staged[step].get("width", "")) == pytest.approx(seconds * scale, abs=0.02), (host, step)
            assert float(staged[step].get("x", "")) < float(shown["container"].get("x", ""))

    out = tmp_path / "support.tar.gz"
    k3("bundle", sim.inventory, "-o", str(out), check=True)
    with tarfile.open(out) as tar:
        kept = json.loads(member(tar, "k3deploy-bundle/startup.json"))
        drawn = ET.fromstring(member(tar, "k3deploy-bundle/timeline-engine.svg"))
        status = json.loads(member(tar, "k3deploy-bundle/status.json"))
    assert kept["engine"][str(hist["current"])] == current["startup"]
    assert len([r for r in drawn.iter(f"{SVG}rect") if r.get("class") == "bar"]) == len(bars)
    assert {u["host"]: u["startup"] for g in status["groups"] for u in g["units"]} == {
        h: u["startup"] for h, u in units.items()}
