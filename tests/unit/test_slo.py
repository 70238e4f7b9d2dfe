"""The SLO gate, pure: p95s from vLLM's /metrics histograms, the comparison, the variables, the gate a plan shows, and
the node-side commands that keep and read a revision's figures (run by the real sh)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from helpers import k3
from k3deploy.model import commands
from k3deploy.model.binding import HostRecord
from k3deploy.model.diff import build, render_text
from k3deploy.model.observed import Installed
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.revisions import Revision, parse_listing
from k3deploy.model.rollout import mark_changes, sha256
from k3deploy.model.slo import (
    ITL,
    PROBE_MARK,
    TTFT,
    Figures,
    Load,
    Targets,
    delta,
    figures_record,
    judge,
    parse_metrics,
    parse_probe,
    plan_gate,
    quantile,
    read_record,
)
from k3deploy.model.variables import Variables

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
BEFORE = (FIXTURES / "metrics-before.txt").read_text()
AFTER = (FIXTURES / "metrics-after.txt").read_text()


def test_p95s_from_two_reads_of_vllms_metrics():
    before, after = parse_metrics(BEFORE), parse_metrics(AFTER)
    # every bucket of vLLM's edges is read, +Inf last; the _count, _sum and _created lines are not buckets
    assert len(after.histograms[TTFT].buckets) == 23 and len(after.histograms[ITL].buckets) == 20
    d = delta(before, after)
    assert d.histograms[TTFT].count == 20 and d.finished == {"stop": 0.0, "length": 20.0, "abort": 0.0, "error": 0.0}
    # histogram_quantile: rank 19 of 20 lies in (0.1, 0.25] (12 below it, 8 in it): 0.1 + 0.15 * 7/8
    assert quantile(0.95, d.histograms[TTFT]) == pytest.approx(0.23125)
    # rank 1197 of 1260 in (0.025, 0.05] (1000 below, 240 in it)
    assert quantile(0.95, d.histograms[ITL]) == pytest.approx(0.025 + 0.025 * 197 / 240)
    # over the whole life of the engine (not the probe's window) the p95 is another figure
    assert quantile(0.95, after.histograms[TTFT]) != pytest.approx(0.23125)


def test_a_probe_result_becomes_the_figures():
    results = [{"ok": True, "ttft": 0.05 + i / 1000} for i in range(20)]
    line = PROBE_MARK + json.dumps({"before": {"http://a:8000": BEFORE}, "after": {"http://a:8000": AFTER},
                                    "results": results})
    figures, why = parse_probe("some noise\n" + line + "\n")
    assert figures is not None, why
    assert (figures.requests, figures.failed, figures.source) == (20, 0, "metrics")
    assert figures.ttft_p95_ms == pytest.approx(231.25) and figures.itl_p95_ms == pytest.approx(45.521, abs=1e-3)
    assert figures.client_ttft_p95_ms == pytest.approx(68.0)
    # two engines of one group: their histograms add up
    two = PROBE_MARK + json.dumps({"before": {"a": BEFORE, "b": BEFORE}, "after": {"a": AFTER, "b": AFTER},
                                   "results": results})
    both = parse_probe(two)[0]
    assert both is not None and both.ttft_p95_ms == pytest.approx(231.25)
    # an engine that restarted during the probe: its counters start again from zero
    again = PROBE_MARK + json.dumps({"before": {"a": AFTER}, "after": {"a": BEFORE}, "results": results})
    restarted = parse_probe(again)[0]
    alone = quantile(0.95, parse_metrics(BEFORE).histograms[TTFT])
    assert restarted is not None and alone is not None
    assert restarted.ttft_p95_ms == pytest.approx(alone * 1000, abs=1e-3)


def test_the_comparison():
    base = Figures(20, 0, ttft_p95_ms=59.0, itl_p95_ms=24.25)
    same = judge(Figures(20, 0, 59.0, 24.25), base, Targets())
    assert same.ok and all(line.endswith("hit") for line in same.lines)
    # 3x slower tokens: ITL p95 in a bucket three times higher
    slow = judge(Figures(20, 0, 242.5, 73.75), base, Targets())
    assert not slow.ok
    assert "TTFT p95: 242 ms against 59.0 ms on the previous revision (target at most 1.5x = 88.5 ms): miss" \
        in slow.lines
    assert "ITL p95: 73.8 ms against 24.2 ms on the previous revision (target at most 1.5x = 36.4 ms): miss" \
        in slow.lines
    # just at the limit is a hit; one failed request is a miss, whatever the latencies
    assert judge(Figures(20, 0, 88.5, 36.375), base, Targets()).ok
    failed = judge(Figures(20, 1, 50.0, 20.0, errors=("HTTP Error 500: Internal Server Error",)), base, Targets())
    assert not failed.ok and failed.lines[0].startswith("failed requests: 1 of 20 (target 0): miss (HTTP Error 500")
    # no baseline: the absolute targets alone; none set: only failures count
    assert judge(Figures(20, 0, 400.0, 90.0), None, Targets()).ok
    absolute = judge(Figures(20, 0, 400.0, 20.0), None, Targets(None, ttft_p95_ms=300.0, itl_p95_ms=50.0))
    assert not absolute.ok and absolute.lines[1:] == ("TTFT p95: 400 ms (target at most 300 ms): miss",
                                                      "ITL p95: 20.0 ms (target at most 50.0 ms): hit")
    # a figure that could not be measured misses a target that needs it
    assert not judge(Figures(20, 0, None, None), base, Targets()).ok
    report = slow.report("engine-r0", "engine-r1, still on the previous revision, under the same load")
    assert report.splitlines()[0] == ("SLO gate: group engine-r0 misses the targets (measured against engine-r1, "
                                      "still on the previous revision, under the same load)")


def test_a_revisions_figures_round_trip():
    record = figures_record(Figures(12, 0, 242.5, 73.75, 251.0), Load(12, 4, 256, 16),
                            judge(Figures(12, 0, 242.5, 73.75), Figures(12, 0, 59.0, 24.25), Targets()), "t")
    figures, data = read_record(record)
    assert figures == Figures(12, 0, 242.5, 73.75, 251.0) and data["verdict"] == "miss"
    assert data["load"] == {"requests": 12, "concurrency": 4, "prompt_tokens": 256, "output_tokens": 16}


def test_gate_variables_defaults_and_bad_values():
    v = Variables()
    assert (v.k3_slo_gate, v.k3_slo_relative, v.k3_slo_ttft_p95_ms, v.k3_slo_itl_p95_ms) == ("auto", 1.5, None, None)
    assert (v.k3_slo_requests, v.k3_slo_concurrency, v.k3_slo_prompt_tokens, v.k3_slo_output_tokens) == \
        (20, 4, 256, 64)
    assert v.k3_auto_rollback is False
    for bad in ({"k3_slo_gate": "sometimes"}, {"k3_slo_relative": 0.5}, {"k3_slo_output_tokens": 1},
                {"k3_slo_ttft_p95_ms": 0}):
        with pytest.raises(ValidationError):
            Variables(**bad)


def test_a_bad_gate_value_is_one_line_and_exit_2(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text('head = [("n1", {"ssh_hostname": "192.0.2.10", "k3_hardware": "gb300"})]\n')
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("k3_slo_gate: sometimes\n")
    out = k3("vars", str(inv))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "k3_slo_gate" in out.stderr and "Traceback" not in out.stderr
    assert len([ln for ln in out.stderr.splitlines() if ln.strip()]) == 1, out.stderr


def replicas(r: int, per: int, **data) -> list[HostRecord]:
    return [HostRecord(f"r{i}n{j}", ("head",) if j == 0 else ("workers",),
                       {"k3_ip": f"192.0.2.{10 * i + j + 10}", "rank": j, "k3_replica": i, "k3_hardware": "gb300",
                        **data})
            for i in range(r) for j in range(per)]


def installed(r) -> dict[tuple[str, str], Installed]:
    return {(u.host, u.unit): Installed(unit_sha=sha256(u.unit_text), env_sha=sha256(u.env_text), active="active")
            for u in r.units}


def test_the_gate_a_plan_shows():
    running = desired_rollout(target(replicas(2, 2), None))
    # a rolling change over replicas: the canary, against the replica still on the previous revision
    change = desired_rollout(target(replicas(2, 2, k3_extra_env={"K3SIM_SLOWDOWN": "3"}), None))
    change = change.decided(mark_changes(change, installed(running)))
    gate = plan_gate(change)
    assert gate is not None and (gate.kind, gate.groups, gate.baseline) == ("canary", ("engine-r0",), "engine-r1")
    assert plan_gate(change, rollback=True) is None   # going back to what served is not gated
    report = build(change, installed(running))
    report = replace(report, gate=gate.lines())
    text = render_text(report, change)
    assert "SLO gate (docs/gate.md):" in text
    assert "engine-r0 (the canary) and engine-r1 (still on the previous revision)" in text
    assert "20 streamed completions, 4 at a time, 256 prompt tokens, 64 output tokens each" in text
    assert "TTFT and ITL p95 at most 1.5x the previous revision" in text
    # off: none; a first deploy (everything starts, the router too): no canary
    off = desired_rollout(target(replicas(2, 2, k3_slo_gate="off", k3_extra_env={"A": "1"}), None))
    off = off.decided(mark_changes(off, installed(running)))
    assert plan_gate(off) is None
    fresh = desired_rollout(target(replicas(2, 2), None))
    fresh = fresh.decided(mark_changes(fresh, {}))
    assert plan_gate(fresh) is None
    # one group: gated only with k3_slo_gate: on, against its recorded figures
    one = desired_rollout(target(replicas(1, 2, k3_extra_env={"A": "1"}), None))
    one = one.decided(mark_changes(one, {}))
    assert plan_gate(one) is None
    on = desired_rollout(target(replicas(1, 2, k3_slo_gate="on", k3_auto_rollback=True), None))
    on = on.decided(mark_changes(on, {}))
    single = plan_gate(on)
    assert single is not None and (single.kind, single.groups, single.auto_rollback) == ("group", ("engine",), True)
    assert "goes back to its previous revision" in " ".join(single.lines())


def sh(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)


def test_a_revisions_figures_are_kept_and_listed_by_the_real_sh(tmp_path):
    d = tmp_path / "revisions" / "engine-r0"
    (d / "3").mkdir(parents=True)
    meta = Revision(group="engine-r0", number=3, created="t", image="img", summary="s").to_json()
    (d / "3" / "meta.json").write_text(meta)
    (d / "current").write_text("3\n")
    record = figures_record(Figures(12, 0, 59.0, 24.25), Load(12, 4, 256, 16), None, "t")
    assert sh(commands.record_figures(str(d), 3, record)).returncode == 0
    assert sh(commands.record_figures(str(d), 9, record)).returncode == 0   # not kept here: nothing written
    assert not (d / "9").exists()
    listing = sh(commands.list_revisions(str(d)))
    h = parse_listing(listing.stdout.splitlines())
    assert h.current == 3 and h.numbers == [3] and read_record(h.figures[3])[0] == Figures(12, 0, 59.0, 24.25)


def test_going_back_restores_a_revisions_files_with_their_modes(tmp_path):
    kept, live = tmp_path / "kept", tmp_path / "live"
    kept.mkdir(), live.mkdir()
    (kept / "k3-engine.env").write_text("A=old\n")
    (kept / "k3-engine.env").chmod(0o600)
    (live / "k3-engine.env").write_text("A=new\n")
    pairs = [(str(kept / "k3-engine.env"), str(live / "k3-engine.env"))]
    assert sh(commands.restore_files(pairs)).returncode == 0
    assert (live / "k3-engine.env").read_text() == "A=old\n"
    assert (live / "k3-engine.env").stat().st_mode & 0o777 == 0o600
    # a kept file missing: nothing is copied
    (live / "k3-engine.env").write_text("A=new\n")
    out = sh(commands.restore_files([*pairs, (str(kept / "gone.service"), str(live / "x.service"))]))
    assert out.returncode == 1 and "missing" in out.stderr and (live / "k3-engine.env").read_text() == "A=new\n"


def test_the_probe_reports_every_request_that_fails():
    """The probe's own client (python3, as on the nodes) against an address that refuses: each request fails and
    says why; the figures miss the gate."""
    text = commands.slo_probe("http://127.0.0.1:9", ["http://127.0.0.1:9"], "kimi-k3", 3, 2, 4, 4, timeout=5)
    out = sh(text)
    assert out.returncode == 0, out.stderr
    figures, why = parse_probe(out.stdout)
    assert figures is not None, why
    assert (figures.requests, figures.failed) == (3, 3) and "Connection refused" in figures.errors[0]
    assert not judge(figures, None, Targets()).ok
