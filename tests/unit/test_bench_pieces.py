"""The benchmark's pieces without a cluster: its record kept and listed by the real sh beside the SLO figures, the SLO
gate's baseline taken from it, the variables of the sweep, the command the node runs, and the simulated docker
handing vLLM's benchmark client to the engine venv."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from k3deploy.model import bench, commands
from k3deploy.model.revisions import Revision, parse_listing
from k3deploy.model.slo import Figures, Load, figures_record
from k3deploy.model.variables import Variables
from k3deploy.runtime.slo import recorded

NODE_LIB = Path(__file__).resolve().parents[2] / "simulator/k3sim/node_tools/usr/lib/k3sim"


def point(c: int, ttft95: float, itl95: float, tput: float) -> bench.Point:
    return bench.Point(c, 2 * c, 0, {"p50": ttft95 / 2, "p95": ttft95, "p99": ttft95 * 1.1},
                       {"p50": itl95 / 2, "p95": itl95, "p99": itl95 * 1.1},
                       {"p50": 400.0, "p95": 450.0, "p99": 470.0}, tput, tput / 8)


RECORD = bench.Record("2026-12-06T23:00:00Z", "http://10.0.0.1:8000", bench.Load(32, 16, (1, 4, 16), 2), 8,
                      (point(1, 40.0, 20.0, 30.0), point(4, 60.0, 25.0, 100.0), point(16, 120.0, 40.0, 300.0)),
                      revisions={"engine": 3})


def sh(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)


def test_a_benchmark_is_kept_with_its_revision_and_listed_beside_the_slo_figures(tmp_path):
    d = tmp_path / "revisions" / "engine"
    (d / "3").mkdir(parents=True)
    (d / "3" / "meta.json").write_text(Revision(group="engine", number=3, created="t", image="img",
                                                summary="s").to_json())
    (d / "current").write_text("3\n")
    slo = figures_record(Figures(8, 0, 59.0, 24.25), Load(8, 4, 32, 16), None, "t")
    assert sh(commands.record_figures(str(d), 3, slo)).returncode == 0
    assert sh(commands.record_bench(str(d), 3, RECORD.to_json())).returncode == 0
    assert sh(commands.record_bench(str(d), 9, RECORD.to_json())).returncode == 0   # not kept here: nothing
    assert not (d / "9").exists()
    h = parse_listing(sh(commands.list_revisions(str(d))).stdout.splitlines())
    assert h.numbers == [3] and bench.Record.from_json(h.benches[3]) == RECORD and 3 in h.figures
    # the gate's baseline: the benchmark at the concurrency nearest the probe's, where asked; else the gate's record
    base = recorded(h, Load(20, 5, 256, 64))
    assert base is not None and (base.ttft_p95_ms, base.itl_p95_ms, base.source) == (60.0, 25.0, "bench")
    base = recorded(h, Load(20, 12, 256, 64))
    assert base is not None and base.ttft_p95_ms == 120.0
    plain = recorded(h)
    assert plain is not None and plain.ttft_p95_ms == 59.0 and plain.source == "metrics"


def test_the_sweep_is_variables_with_inferencex_defaults():
    v = Variables()
    assert bench.load_of(v) == bench.Load(1024, 1024, (4, 16, 64), 5)
    assert Variables(k3_bench_concurrency=[16, 1, 16]).k3_bench_concurrency == [1, 16]
    with pytest.raises(ValidationError, match="concurrency sweep"):
        Variables(k3_bench_concurrency=[])
    assert v.k3_slo_baseline == "recorded" and v.k3_correctness_probe is False


def test_the_node_runs_vllms_own_client_from_the_engine_image_with_no_secret_in_its_argv():
    load = bench.Load(32, 16, (1, 4), 2)
    text = commands.bench_serve("/usr/bin/docker", "vllm/vllm-openai@sha256:ab", "/var/lib/k3deploy/cache",
                                "/etc/k3deploy/k3-engine.env", bench.client_args(load, "http://10.0.0.1:8000",
                                                                                 "moonshotai/Kimi-K3", "kimi-k3"),
                                load.concurrency, load.rounds)
    words = shlex.split(text)
    assert words[:2] == ["/usr/bin/docker", "run"] and "vllm/vllm-openai@sha256:ab" in words
    assert words[words.index("--env-file") + 1] == "/etc/k3deploy/k3-engine.env"
    assert "HF_HUB_OFFLINE=1" in words and "/var/lib/k3deploy/cache:/root/.cache" in words
    script = words[words.index("-c") + 1]
    assert "from vllm.benchmarks.serve import add_cli_args, main" in script and "VLLM_API_KEY" in script
    assert "--random-input-len" in words[-1] and '"concurrency": [1, 4]' in words[-1]
    assert "API_KEY=" not in text


def test_the_simulated_docker_runs_the_client_from_the_engine_venv():
    sys.path.insert(0, str(NODE_LIB))
    try:
        import dockersim
    finally:
        sys.path.remove(str(NODE_LIB))
    script = "from vllm.benchmarks.serve import add_cli_args, main"
    cmd = dockersim._translate(["python3", "-c", script, "{}"], {}, "engine.py")
    assert cmd[1].endswith("/vllmsim_bench.py") and cmd[2:] == [script, "{}"]


def test_the_picture_has_a_line_per_revision_and_history_a_line_per_run():
    svg = bench.svg({"engine rev 1": RECORD, "engine rev 2": RECORD})
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 6 and "output tokens/s per GPU" in svg
    assert bench.cell(RECORD).splitlines()[2] == "c16: TTFT 60/132, ITL 20/44 ms, 300 tok/s (37.5/GPU)"


def test_the_launcher_runs_the_client_as_it_runs_the_engines_image():
    """systemd: docker, as above; a pyxis Slurm site (no docker needed): ``enroot start`` of the staged squashfs the
    unit's job runs, the model cache at ``~/.cache``, the env file's directory at its own path and the env file read
    by the client itself: no secret in the argv."""
    from k3deploy.model.binding import HostRecord
    from k3deploy.model.pipeline import desired_rollout, target
    from k3deploy.model.slurm import engine_image_file
    from k3deploy.runtime.launchers import launcher_for

    def rollout(**more: object):
        given = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp", **more}
        hosts = [HostRecord(f"n{i}", ("head",) if i == 1 else ("workers",), {**given, "k3_ip": f"10.0.0.{i}"})
                 for i in (1, 2)]
        return desired_rollout(target(hosts, None))

    load = bench.Load(32, 16, (1,), 2)
    r = rollout()
    head = r.units[0]
    args = bench.client_args(load, r.endpoint, r.plan.model, "kimi-k3")
    c = head.require_spec().container
    assert c is not None
    assert launcher_for(r).bench_command(head, args, load.concurrency, load.rounds) == commands.bench_serve(
        c.docker, c.image, c.cache_dir, head.env_path, args, load.concurrency, load.rounds)
    s = rollout(k3_launcher="slurm", k3_slurm_submit_host="n1", k3_slurm_container="pyxis")
    unit = s.units[0]
    words = shlex.split(launcher_for(s).bench_command(unit, args, load.concurrency, load.rounds))
    config = unit.env_path.rsplit("/", 1)[0]
    assert words[:words.index("python3")] == [
        "enroot", "start", "--mount", f"{unit.require_spec().container.cache_dir}:/root/.cache",
        "--mount", f"{config}:{config}", "--env", "HF_HUB_OFFLINE=1", engine_image_file(s)]
    assert words[words.index("python3") + 1] == "-c" and words[-1] == unit.env_path
    assert "docker" not in words and not any("API_KEY=" in w for w in words)
