"""``k3deploy export slurm``: the batch scripts, launch scripts and env files of an inventory or of a selection, as
files a site submits itself."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import k3, two_tray_site


def _export(*args: str) -> subprocess.CompletedProcess[str]:
    return k3("export", "slurm", *args, timeout=300)


def _all_text(out: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(out.rglob("*")) if p.is_file())


def _sbatch(path: Path) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in path.read_text().splitlines() if line.startswith("#SBATCH ")]


def test_export_from_an_inventory_names_its_hosts_and_follows_its_group_vars(tmp_path):
    inventory = two_tray_site(tmp_path, (
        "k3_hardware: gb300\nk3_strategy: multi_node_tp\nk3_iface: eth1\nk3_slurm_partition: gpu\n"
        "k3_launcher: slurm\nk3_slurm_submit_host: gpu01\n"
        "k3_extra_env:\n  SITE_API_TOKEN: s3cr3t-value\n"))
    out = tmp_path / "out"
    proc = _export(str(inventory), "-o", str(out), "--json", "--time", "1-00:00:00")
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)
    assert written["submit_order"] == ["k3-engine"]
    assert written["jobs"][0]["nodes"] == ["gpu01", "gpu02"]
    placed = {(f["host"], f["path"]): f["mode"] for f in written["files"]}
    assert placed == {("gpu01", "/etc/k3deploy/k3-engine.env"): "0600", ("gpu01", "/etc/k3deploy/k3-engine.launch"): "0755",
                      ("gpu02", "/etc/k3deploy/k3-engine.env"): "0600", ("gpu02", "/etc/k3deploy/k3-engine.launch"): "0755",
                      (None, "/var/lib/k3deploy/slurm/k3-engine.sbatch"): "0644"}
    for f in written["files"]:
        assert Path(f["file"]).is_file() and oct(Path(f["file"]).stat().st_mode & 0o777) == "0o" + f["mode"][1:]
    lines = _sbatch(out / "k3-engine.sbatch")
    for line in ("--nodelist=gpu01,gpu02", "--partition=gpu", "--time=1-00:00:00", "--exclusive", "--gres=gpu:4",
                 f"--comment={written['jobs'][0]['comment']}"):
        assert line in lines
    env = (out / "nodes" / "gpu02" / "etc" / "k3deploy" / "k3-engine.env").read_text()
    assert "VLLM_HOST_IP=10.1.0.2" in env and "SITE_API_TOKEN=@SECRET_SITE_API_TOKEN@" in env
    text = _all_text(out)
    assert "s3cr3t-value" not in text and "s3cr3t-value" not in proc.stdout
    assert "/etc/k3deploy/secrets/SITE_API_TOKEN" in (out / "README.txt").read_text()
    launch = out / "nodes" / "gpu01" / "etc" / "k3deploy" / "k3-engine.launch"
    for script in (out / "k3-engine.sbatch", launch):
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_export_from_a_selection_writes_placeholders_and_the_submit_order(tmp_path):
    out = tmp_path / "pd"
    proc = _export("--hardware", "b300", "--strategy", "pd_cluster", "--prefill-nodes", "1", "--decode-nodes", "2",
                   "-o", str(out), "--exclusive", "user", "--json")
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)
    assert written["submit_order"] == ["k3-prefill", "k3-decode", "k3-router"]
    assert written["endpoint"] == "http://@PREFILL0_IP@:30000"
    assert [j["nodes"] for j in written["jobs"]] == [["@PREFILL0@"], ["@DECODE0@", "@DECODE1@"], ["@PREFILL0@"]]
    readme = (out / "README.txt").read_text()
    order = [readme.index(f"{name}.sbatch  (") for name in written["submit_order"]]
    assert order == sorted(order) and "once the P/D pools serve" in readme
    text = _all_text(out)
    assert ".invalid" not in text
    assert "VLLM_HOST_IP=@DECODE1_IP@" in (out / "nodes" / "@DECODE1@" / "etc" / "k3deploy" / "k3-engine-decode.env"
                                           ).read_text()
    assert "--exclusive=user" in _sbatch(out / "k3-router.sbatch")
    for script in [*out.glob("*.sbatch"), *out.rglob("*.launch")]:
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script


def test_export_refuses_what_slurm_cannot_run_in_one_line(tmp_path):
    proc = _export("--hardware", "b300", "--strategy", "pd_cluster", "-o", str(tmp_path / "a"))
    assert proc.returncode == 2
    assert "@PREFILL0@" in proc.stderr and "k3_slurm_exclusive: user" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = _export("--hardware", "gb300", "--strategy", "multi_node_tp", "--nodes", "2", "-o", str(tmp_path / "b"),
                   "--segment")
    assert proc.returncode == 2 and "k3_slurm_version" in proc.stderr and "25.11" in proc.stderr
    proc = _export("inventories/gb300.py", "--hardware", "h200", "-o", str(tmp_path / "c"))
    assert proc.returncode == 2 and "--hardware" in proc.stderr
    proc = _export("--hardware", "gb300", "-o", str(tmp_path / "d"), "--time", "soon")
    assert proc.returncode == 2 and "'soon'" in proc.stderr and "D-HH:MM:SS" in proc.stderr


def test_export_segment_requests_the_groups_nodes_in_one_block(tmp_path):
    out = tmp_path / "rack"
    proc = _export("--hardware", "gb300", "--strategy", "multi_node_tp", "--nodes", "2", "-o", str(out), "--segment",
                   "--slurm-version", "25.11")
    assert proc.returncode == 0, proc.stderr
    assert "--segment=2" in _sbatch(out / "k3-engine.sbatch")
    assert "wrote 5 file(s)" in proc.stdout


def test_the_runbook_of_a_slurm_site_is_refused_naming_export_slurm(tmp_path):
    inventory = two_tray_site(tmp_path, "k3_hardware: gb300\nk3_strategy: multi_node_tp\nk3_iface: eth1\n"
                                        "k3_launcher: slurm\nk3_slurm_submit_host: gpu01\n")
    out = tmp_path / "runbook.md"
    proc = k3("runbook", str(inventory), "-o", str(out), "--offline")
    assert proc.returncode == 2 and not out.exists(), proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "k3_launcher: slurm" in line and f"k3deploy export slurm {inventory} -o DIR" in line


def test_the_export_writes_what_the_slurm_renderer_renders_the_launchers_files(tmp_path):
    """``export slurm`` and the Slurm launcher render through one :class:`Renderer` (:class:`slurm.Export`): the
    export writes its jobs and each node's launch scripts as it renders them, and the launcher's files, what a unit
    runs from and what a revision keeps are that renderer's (with the batch scripts placed on the submit host)."""
    from k3deploy.cli.export import _write
    from k3deploy.model import slurm
    from k3deploy.model.binding import HostRecord
    from k3deploy.model.pipeline import desired_rollout, target
    from k3deploy.runtime.launchers import Launcher, Renderer, Slurm, export_for, launcher_for

    data = {"k3_hardware": "gb300", "k3_launcher": "slurm", "k3_slurm_submit_host": "login1"}
    rollout = desired_rollout(target([HostRecord("n1", ("head",), {**data, "k3_ip": "10.0.0.1"}),
                                      HostRecord("n2", ("workers",), {**data, "k3_ip": "10.0.0.2"})], None))
    renderer: Renderer = export_for(rollout, kind="slurm")   # (mypy: the export is a Renderer)
    export = export_for(rollout, kind="slurm")
    assert renderer.name == "slurm" and export.jobs == slurm.jobs(rollout)
    assert not any(hasattr(export, m) for m in Launcher.__dict__ if not m.startswith("_")
                   and m not in Renderer.__dict__)
    written = _write(rollout, [], "a test", tmp_path / "out", {})
    for job in export.jobs:
        assert (tmp_path / "out" / f"{job.name}.sbatch").read_text() == job.script
    launches = [(hf.host, f) for hf in export.host_files for f in hf.files if f.mode == "0755"]
    assert launches and all((tmp_path / "out" / "nodes" / h / f.path.lstrip("/")).read_text() == f.text
                            for h, f in launches)
    assert {(f["host"], f["path"]) for f in written["files"]} == \
        {(None, j.path) for j in export.jobs} | {(hf.host, f.path) for hf in export.host_files for f in hf.files}
    launcher = launcher_for(rollout)
    assert isinstance(launcher, Slurm)
    placed = slurm.Export(rollout, "login1")
    for u in rollout.units:
        assert launcher.unit_file(u) == export.unit_file(u) in {f.path for h, f in launches if h == u.host}
        assert launcher.kept(u) == export.kept(u) and launcher.log_dir(u) == export.log_dir(u)
        assert launcher.files(u.host) == placed.files(u.host)
    assert launcher.files("login1") == placed.files("login1") is not None
    assert all(launcher.revision_files(g) == export.revision_files(g) for g in rollout.groups)
