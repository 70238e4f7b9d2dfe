"""A start, phase by phase: the engine's own log lines (vLLM 0.33's format, tests/fixtures/vllm/README.md) and the
unit's start time -> each phase's seconds; kept per revision and node, read back by history; drawn as a timeline."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from k3deploy.facts.status import UnitRuntime
from k3deploy.model import commands, startup
from k3deploy.model.revisions import Revision, combine, parse_listing
from k3deploy.model.timeline import LABEL_W, PLOT_W, svg, timeline

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
HEAD = (FIXTURES / "startup-head.txt").read_text().splitlines()
WORKER = (FIXTURES / "startup-worker.txt").read_text().splitlines()
SVG = "{http://www.w3.org/2000/svg}"


def test_a_head_start_splits_into_every_phase_from_its_log_lines():
    s = startup.parse(HEAD)
    assert list(s.seconds) == list(startup.PHASES)
    assert s.seconds == pytest.approx({"container": 12.412, "rendezvous": 90.706, "weights": 243.132,
                                       "compile": 15.754, "kv_cache": 17.556, "graphs": 61.817, "ready": 2.961})
    assert s.total == pytest.approx(444.338)   # from systemd's start to "Application startup complete."
    assert s.compile_cache == "hit" and s.complete and s.gate == pytest.approx(1796548046.5)
    starts = [start for _, start, _ in s.phases]
    assert starts == sorted(starts) and starts[0] == 0.0


def test_a_headless_worker_is_complete_at_its_graphs_and_its_compile_missed():
    s = startup.parse(WORKER)
    assert list(s.seconds) == ["container", "rendezvous", "weights", "compile", "kv_cache", "graphs"]
    assert s.compile_cache == "miss" and s.complete
    assert s.seconds["container"] == pytest.approx(11.002) and s.seconds["weights"] == pytest.approx(237.914)


def test_a_phase_not_logged_is_left_out_and_the_next_spans_its_time():
    eager = [line for line in HEAD if "torch.compile" not in line and "compiled graph" not in line
             and "Graph capturing" not in line]
    s = startup.parse(eager)
    assert "compile" not in s.seconds and "graphs" not in s.seconds
    assert s.seconds["kv_cache"] == pytest.approx(15.754 + 17.556)
    assert s.total == pytest.approx(startup.parse(HEAD).total)


def test_a_start_still_loading_is_not_complete_and_nothing_logged_is_no_phase():
    loading = startup.parse(HEAD[:4])
    assert list(loading.seconds) == ["container", "rendezvous", "weights"] and not loading.complete
    assert "(not ready)" in loading.line()
    assert startup.parse([]).phases == () and startup.parse(HEAD[:1]).begun == pytest.approx(1796547600.0)


def test_the_journal_filter_keeps_the_first_engine_line_and_the_milestones(tmp_path):
    # the same grep and awk the nodes run (commands.startup_lines), over a journal with lines it must drop
    journal = [line[len("K3_START="):] for line in HEAD if line.startswith("K3_START=")]
    noise = ["1796547600.100000 gb300-01 docker[4120]: Error response from daemon: No such container: k3-engine",
             "1796547650.000000 gb300-01 docker[4121]: (EngineCore_DP0 pid=312) INFO 12-06 09:00:50 "
             "[parallel_state.py:1871] rank(s) of node_rank=1 joined"]
    later = "1796550000.000000 gb300-01 docker[4121]: (APIServer pid=1) INFO 12-06 09:40:00 [gpu_worker.py:424] " \
            "Available KV cache memory: 1.00 GiB"   # after the ready line: the start is read no further
    text = "\n".join([noise[0], journal[0], noise[1], *journal[1:], later]) + "\n"
    script = commands.startup_lines("k3-engine.service")
    pipeline = script[script.index("grep -E"):]
    out = subprocess.run(["sh", "-c", pipeline], input=text, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["K3_START=" + line for line in journal]


def test_a_slurm_step_output_gives_the_last_start_by_vllms_own_stamps(tmp_path):
    # the same ls, grep and awk the nodes run (commands.step_startup_lines) over a group's directory: an older job's
    # step output, the job's own output, and the newest job's step output holding a failed start and the requeued
    # one after it (tests/fixtures/vllm/step-head.out)
    group = tmp_path / "engine"
    (group / "41").mkdir(parents=True)
    (group / "42").mkdir()
    old = group / "41" / "gb300-01.out"
    old.write_text("k3deploy: the step began at 2026-12-05T10:00:00.000000Z\n"
                   "INFO 12-05 10:00:01 [utils.py:253] non-default args: {}\n")
    (group / "42.out").write_text("k3deploy: group engine served\n")
    (group / "42" / "gb300-01.out").write_text((FIXTURES / "step-head.out").read_text())
    import os
    os.utime(old, (1796460000, 1796460000))
    run = subprocess.run(["sh", "-c", commands.step_startup_lines(str(group), "gb300-01")], capture_output=True,
                         text=True, check=True, env={**os.environ, "TZ": "UTC"})
    lines = run.stdout.splitlines()
    assert lines[0].startswith("K3_CLOCK=") and lines[0].endswith(" +0000")
    assert lines[1] == "K3_STEP=k3deploy: the step began at 2026-12-06T09:00:00.000000Z"
    assert not any("08:4" in line or "Avg prompt" in line or "1.00 GiB" in line or "shards" in line
                   for line in lines)   # the failed start before it, the lines after ready, progress bars
    # the node's clock when it was read (a fixed one here: the year of the stamps is the clock's)
    s = startup.parse(["K3_CLOCK=1796600000.5 +0000", *lines[1:], "K3_GATE=1796548046.5"])
    assert s.begun == pytest.approx(1796547600.0)   # the launch script's own line, with microseconds
    assert s.seconds == {"container": 12.0, "rendezvous": 91.0, "weights": 243.0, "compile": 16.0,
                         "kv_cache": 17.0, "graphs": 62.0, "ready": 0.0}   # whole seconds, as vLLM stamps them
    assert s.compile_cache == "hit" and s.complete
    # the same lines read on a node one hour east of UTC (vLLM stamps its local time) and in the next year
    east = [line.replace(" 09:", " 10:") if "INFO 12-06" in line else line for line in lines[1:]]
    assert startup.parse(["K3_CLOCK=1796600000.5 +0100", *east]).seconds == s.seconds
    assert startup.parse(["K3_CLOCK=1798800000 +0000", *lines[2:]]).begun == pytest.approx(1796547612.0)
    # no clock, no stamp read; a start record without the launch script's line: from the engine's first line
    assert startup.parse(lines[1:]).phases == ()


def test_the_slurm_launcher_keeps_a_start_from_its_step_output_and_the_systemd_one_from_the_journal(tmp_path):
    from types import SimpleNamespace as N

    from k3deploy.model.steps import JobSteps, UnitSteps

    units = [N(unit="k3-engine.service", host="n2", group="engine")]
    r = N(vars=N(k3_slurm_dir=str(tmp_path / "slurm"), k3_config_dir=str(tmp_path / "etc")),
          group=lambda g: units)
    job = JobSteps("n1").keep_starts(r, "engine", "n2", 3)   # type: ignore[arg-type]
    assert commands.step_startup_lines(str(tmp_path / "slurm/engine"), "n2") in job
    unit = UnitSteps().keep_starts(r, "engine", "n2", 3)   # type: ignore[arg-type]
    assert commands.startup_lines("k3-engine.service") in unit and "K3_CLOCK" not in unit
    # the record of the job's start, kept in the revision's directory (0600) and listed back as history lists it
    rev = tmp_path / "etc/revisions/engine/3"
    rev.mkdir(parents=True)
    (rev / "meta.json").write_text(Revision(group="engine", number=3, created="t", image="i", summary="s").to_json())
    (tmp_path / "slurm/engine/42").mkdir(parents=True)
    (tmp_path / "slurm/engine/42/n2.out").write_text((FIXTURES / "step-head.out").read_text())
    subprocess.run(["sh", "-c", job], check=True, capture_output=True)
    assert (rev / "startup-k3-engine.service.log").stat().st_mode & 0o777 == 0o600
    listing = subprocess.run(["sh", "-c", commands.list_revisions(str(rev.parent))], capture_output=True,
                             text=True).stdout
    kept = startup.recorded(parse_listing(listing.splitlines()).startups[3])[""]["k3-engine.service"]
    assert kept.seconds["weights"] == 243.0 and kept.complete and kept.gate is not None


def test_status_under_slurm_reads_the_last_start_from_the_step_output():
    fact = UnitRuntime()
    script = fact.command("k3-engine.service", "k3-engine", group_dir="/var/lib/k3deploy/slurm/engine", host="n2")
    assert commands.step_startup_lines("/var/lib/k3deploy/slurm/engine", "n2") in script and "journalctl" not in script
    assert "journalctl _SYSTEMD_INVOCATION_ID" in fact.command("k3-engine.service", "k3-engine")
    lines = ["K3_CLOCK=1796600000.5 +0000", "K3_STEP=k3deploy: the step began at 2026-12-06T09:00:00.000000Z",
             *(f"K3_STEP={line}" for line in (FIXTURES / "step-head.out").read_text().splitlines()[6:])]
    run = fact.process(["K3_LoadState=not-found", "K3_HEALTH=200", *lines])
    assert run.active == "absent" and run.health == 200 and run.startup == tuple(lines)
    assert startup.parse(run.startup).seconds["weights"] == 243.0


def test_status_reads_the_last_start_beside_the_units_state():
    run = UnitRuntime().process(["K3_ActiveState=active", "K3_SubState=running", *HEAD[:-1]])
    assert run.active == "active" and run.startup == tuple(HEAD[:-1])
    assert startup.parse(run.startup).seconds["weights"] == pytest.approx(243.132)


def test_history_lists_each_hosts_recorded_start_per_revision():
    meta = Revision(group="engine", number=2, created="t", image="img", summary="s").to_json()
    listing = ["K3_CURRENT=2", "K3_META=/etc/k3deploy/revisions/engine/2/meta.json", *meta.splitlines(),
               "K3_KEPT=meta.json startup-k3-engine.service.log"]
    n1 = parse_listing([*listing, *(f"K3_STARTUP=k3-engine.service {line}" for line in HEAD)])
    n2 = parse_listing([*listing, *(f"K3_STARTUP=k3-engine.service {line}" for line in WORKER)])
    h = combine("engine", [("n1", n1), ("n2", n2)])
    starts = startup.recorded(h.startups[2])
    assert set(starts) == {"n1", "n2"}
    assert starts["n1"]["k3-engine.service"].compile_cache == "hit"
    assert "ready" not in starts["n2"]["k3-engine.service"].seconds
    back = startup.from_dict(starts["n1"]["k3-engine.service"].to_dict())
    assert back == starts["n1"]["k3-engine.service"]


def test_the_record_is_kept_where_the_revision_is_and_listed_back(tmp_path):
    d = tmp_path / "engine"
    (d / "3").mkdir(parents=True)
    (d / "3" / "meta.json").write_text(Revision(group="engine", number=3, created="t", image="i",
                                                summary="s").to_json())
    record = commands.keep_startup(str(d), 3, ["k3-engine.service"])
    subprocess.run(["sh", "-c", record], check=True, capture_output=True)   # no unit here: begun and gate only
    kept = d / "3" / "startup-k3-engine.service.log"
    assert kept.stat().st_mode & 0o777 == 0o600
    listing = subprocess.run(["sh", "-c", commands.list_revisions(str(d))], capture_output=True, text=True).stdout
    h = parse_listing(listing.splitlines())
    lines = h.startups[3][""]["k3-engine.service"]
    assert any(line.startswith("K3_GATE=") for line in lines)
    assert startup.parse(lines).phases == ()


def test_the_timeline_has_a_bar_per_node_and_phase_as_wide_as_its_seconds():
    starts = {"gb300-01": {"k3-engine.service": startup.parse(HEAD)},
              "gb300-02": {"k3-engine.service": startup.parse(WORKER)}}
    t = timeline("engine", 2, starts)
    root = ET.fromstring(svg(t))
    bars = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]
    scale = PLOT_W / t.span
    for host, units in starts.items():
        s = units["k3-engine.service"]
        shown = {r.get("data-phase", ""): r for r in bars if r.get("data-host") == host}
        assert set(shown) == {*s.seconds, "gate"}
        for phase, seconds in s.seconds.items():
            assert float(shown[phase].get("width", "")) == pytest.approx(seconds * scale, abs=0.01)
        assert s.begun is not None and s.gate is not None and t.origin is not None
        assert float(shown["container"].get("x", "")) == pytest.approx(LABEL_W + (s.begun - t.origin) * scale,
                                                                       abs=0.01)
        assert float(shown["gate"].get("data-seconds", "")) == pytest.approx(s.gate - s.begun - s.total, abs=0.002)
    assert root.find(f"{SVG}title") is not None and "http" not in svg(t).replace(SVG[1:-1], "")


# --------------------------------------------------------------------------- the stage's steps, recorded per node


def test_a_stage_step_is_timed_into_the_nodes_record_and_keeps_its_exit_code(tmp_path):
    from k3deploy.model.steps import timed_stage

    record = tmp_path / "etc/revisions" / commands.STAGE_FILE
    first = subprocess.run(["sh", "-c", timed_stage(str(record), "image_pull", "sleep 0.2; echo pulled",
                                                             first=True)], capture_output=True, text=True)
    assert first.returncode == 0 and first.stdout == "pulled\n"
    failed = subprocess.run(["sh", "-c", timed_stage(str(record), "weights_download", "exit 3")],
                            capture_output=True, text=True)
    assert failed.returncode == 3   # the step fails as its script did; its time is recorded all the same
    assert record.stat().st_mode & 0o777 == 0o600
    lines = record.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["K3_STAGE=image_pull", "K3_STAGE=weights_download"]
    s = startup.parse(lines)
    assert list(s.stage_seconds) == ["image_pull", "weights_download"] and s.stage_seconds["image_pull"] >= 0.2
    # the next run's first step begins the record anew: the last run's stage only
    subprocess.run(["sh", "-c", timed_stage(str(record), "from_peer", "true", first=True)], check=True)
    assert [line.split()[0] for line in record.read_text().splitlines()] == ["K3_STAGE=from_peer"]


def test_an_air_gapped_sites_copies_from_the_control_machine_are_timed_on_the_node(tmp_path):
    """A copy from the control machine is no script of the node's: a command before it and one after it on the node
    record it as the node's other stage steps are, the first one beginning the record anew."""
    import time

    from k3deploy.model import steps
    from k3deploy.model.binding import HostRecord
    from k3deploy.model.pipeline import desired_rollout, target

    source = tmp_path / "site" / "models--o--m"
    (source / "refs").mkdir(parents=True)
    (source / "snapshots").mkdir()
    (source / "refs" / "main").write_text("c0ffee")
    (tmp_path / "i.tar").write_bytes(b"")
    given = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp", "k3_config_dir": str(tmp_path / "etc"),
             "k3_weights_source": str(source), "k3_image_archive": str(tmp_path / "i.tar")}
    r = desired_rollout(target([HostRecord("n1", ("head",), {**given, "k3_ip": "10.0.0.1"}),
                                HostRecord("n2", ("workers",), {**given, "k3_ip": "10.0.0.2"})], None))
    r = r.decided(set(r.groups))
    staged = {(s.host, s.kind): s for s in steps.rollout(r).stage}
    image, weights = staged[("n1", steps.ARCHIVE_COPY)].copy, staged[("n1", steps.WEIGHTS_COPY)].copy
    assert image is not None and weights is not None and image.began and weights.ended
    assert staged[("n2", steps.WEIGHTS_COPY)].copy is None or not staged[("n2", steps.WEIGHTS_COPY)].applies
    record = Path(steps.stage_record(str(tmp_path / "etc")))
    record.parent.mkdir(parents=True)
    record.write_text("K3_STAGE=from_peer 1.0 2.0\n")      # the last run's
    for copy in (image, weights):
        subprocess.run(["sh", "-c", copy.began], check=True)
        time.sleep(0.2)     # the copy itself runs from the control machine in between
        subprocess.run(["sh", "-c", copy.ended], check=True)
    s = startup.parse(record.read_text().splitlines())
    assert list(s.stage_seconds) == ["image_copy", "weights_copy"]
    assert all(v >= 0.2 for v in s.stage_seconds.values()) and not Path(f"{record}.began").exists()


def test_the_mark_keeps_the_stage_that_ran_toward_the_revision_with_each_start(tmp_path):
    import os

    from k3deploy.model.steps import stage_record, timed_stage

    config = tmp_path / "etc"
    d = config / "revisions/engine"
    (d / "3").mkdir(parents=True)
    (d / "3" / "meta.json").write_text(Revision(group="engine", number=3, created="t", image="i",
                                                summary="s").to_json())
    record = stage_record(str(config))
    subprocess.run(["sh", "-c", timed_stage(record, "weights_download", "true", first=True)], check=True)
    (d / "stage.seen").touch()
    os.utime(d / "stage.seen", (1, 1))   # the group's last mark: before this stage ran
    mark = (f"{commands.set_current(str(d), 3)} && {{ {commands.kept_stage(record, str(d))}; }} && "
            f"{commands.keep_startup(str(d), 3, ['k3-engine.service'])}")
    subprocess.run(["sh", "-c", mark], check=True, capture_output=True)
    listing = subprocess.run(["sh", "-c", commands.list_revisions(str(d))], capture_output=True, text=True).stdout
    kept = startup.recorded(parse_listing(listing.splitlines()).startups[3])[""]["k3-engine.service"]
    assert list(kept.stage_seconds) == ["weights_download"] and kept.gate is not None
    assert "stage weights_download" in kept.line()
    assert startup.from_dict(kept.to_dict()) == kept
    # a later revision whose run staged nothing on this node: the record is older than the group's mark, not kept
    (d / "4").mkdir()
    (d / "4" / "meta.json").write_text(Revision(group="engine", number=4, created="t", image="i",
                                                summary="s").to_json())
    mark = (f"{commands.set_current(str(d), 4)} && {{ {commands.kept_stage(record, str(d))}; }} && "
            f"{commands.keep_startup(str(d), 4, ['k3-engine.service'])}")
    subprocess.run(["sh", "-c", mark], check=True, capture_output=True)
    assert "K3_STAGE=" not in (d / "4/startup-k3-engine.service.log").read_text()


def test_the_rollout_times_each_stage_step_a_node_runs_and_its_first_begins_the_record():
    from k3deploy.model import steps
    from k3deploy.model.binding import HostRecord
    from k3deploy.model.pipeline import desired_rollout, target

    hosts = [HostRecord("n1", ("head",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.1"}),
             HostRecord("n2", ("workers",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.2"})]
    layout = desired_rollout(target(hosts, None))
    r = layout.decided(layout.groups)
    made = steps.rollout(r)
    record = steps.stage_record(r.vars.k3_config_dir)
    for h in ("n1", "n2"):
        mine = [s for s in made.stage if s.host == h and s.applies and s.script]
        timed = [s for s in mine if steps.bar_name(s.kind) is not None]
        assert timed and all(f"{record}" in s.script and s.script.startswith(("( k3_b=", "( mkdir -p", "( k3_w=0;"))
                             for s in timed)
        assert f"> {record}" in timed[0].script and all(f">> {record}" in s.script for s in timed[1:])
        assert not any(record in s.script for s in mine if steps.bar_name(s.kind) is None)   # the daemon, ...
    # a round from a peer is recorded part by part: the image, then the weights
    got = next(s for s in made.stage if s.host == "n2" and s.kind == steps.StageKind(steps.StagePart.ROUND, 0))
    assert got.script.count("K3_STAGE=%s %s %s") == 2
    assert got.script.index("image_from_peer") < got.script.index("weights_from_peer")
    # side by side: the weights' chain does not wait behind the image's, and the record is begun before either
    assert got.script.startswith(f"( mkdir -p /etc/k3deploy/revisions && umask 077 && : > {record} ) || true && ( k3_w=0;")
    assert "& k3_p0=$!;" in got.script and "& k3_p1=$!;" in got.script and f"> {record}" not in got.script.split(
        "k3_w=0;", 1)[1].replace(f">> {record}", "")
    # the mark keeps the stage with each start, on every host of the group
    for h in ("n1", "n2"):
        mark = steps._mark(r, "engine", 1, h, steps.UNITS)
        kept = mark.index(commands.kept_stage(record, "/etc/k3deploy/revisions/engine"))
        assert mark.index("/current") < kept < mark.index("startup-k3-engine.service.log")


def test_the_timeline_draws_a_bar_per_stage_step_before_the_start_and_none_where_the_stage_did_nothing():
    head = startup.parse([*HEAD, "K3_STAGE=image_pull 1796547000.0 1796547100.5",
                          "K3_STAGE=weights_download 1796547100.5 1796547590.0"])
    worker = startup.parse(WORKER)   # this node held everything: its stage did nothing
    t = timeline("engine", 2, {"gb300-01": {"k3-engine.service": head}, "gb300-02": {"k3-engine.service": worker}})
    assert t.origin == 1796547000.0   # the first stage step began first
    first, second = t.rows
    assert [(b.phase, b.start, b.seconds) for b in first.bars[:2]] == [("image_pull", 0.0, 100.5),
                                                                      ("weights_download", 100.5, 489.5)]
    assert first.bars[2].phase == "container" and first.bars[2].start == 600.0
    assert not [b for b in second.bars if b.note == "stage"]
    root = ET.fromstring(svg(t))
    staged = [r for r in root.iter(f"{SVG}rect") if r.get("data-kind") == "stage"]
    scale = PLOT_W / t.span
    assert [(r.get("data-host"), r.get("data-phase")) for r in staged] == [("gb300-01", "image_pull"),
                                                                          ("gb300-01", "weights_download")]
    assert float(staged[1].get("x", "")) == pytest.approx(LABEL_W + 100.5 * scale, abs=0.01)
    assert float(staged[1].get("width", "")) == pytest.approx(489.5 * scale, abs=0.01)
    assert "weights_download" in [t.text for t in root.iter(f"{SVG}text")]   # in the legend
