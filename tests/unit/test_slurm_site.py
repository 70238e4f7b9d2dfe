"""Slurm as the site runs it (k3deploy/model/slurm.py): the GRES name each vendor's pack gives an engine job's
``--gres``, ``--segment`` only where the site's Slurm accepts it with ``--nodelist``, and IMEX as the site manages
it (a standing domain, or a channel per job), read from the submit host's ``scontrol``."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from helpers.clusters import FAMILIES, records, smallest_rollout
from k3deploy.errors import K3Error
from k3deploy.model import slurm
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import Rollout
from k3deploy.model.variables import Variables
from k3deploy.recipe.taxonomy import hardware


def _rollout(strategy: str = "multi_node_tp", hardware: str = "gb300", nodes: int = 2, **extra: object) -> Rollout:
    return desired_rollout(target(records(hardware, strategy, nodes, **extra), None))


def _sbatch(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


# ---------------------------------------------------------------------------------------------- GRES per vendor


@pytest.mark.parametrize(("family", "name"), [("NVIDIA", "gpu"), ("AMD", "gpu"), ("Ascend", "npu")])
def test_an_engine_job_asks_for_its_vendors_gres_name(family: str, name: str) -> None:
    r = next(r for s in ("multi_node_tp", "multi_node_tp_dp") if (r := smallest_rollout(FAMILIES[family], s)))
    gpus = hardware()[r.plan.hardware].gpu_count
    gres = [x for x in _sbatch(slurm.jobs(r)[0].script) if x.startswith("--gres=")]
    assert gres == [f"--gres={name}:{gpus}"]


def test_the_gres_variable_overrides_the_packs_name() -> None:
    r = smallest_rollout(FAMILIES["Ascend"], "multi_node_tp_dp", k3_slurm_gres="gpu:{gpus_per_node}")
    assert r is not None
    assert "--gres=gpu:16" in _sbatch(slurm.jobs(r)[0].script)
    r = _rollout(k3_slurm_gres="gpu:a100:{gpus_per_node}")
    assert "--gres=gpu:a100:4" in _sbatch(slurm.jobs(r)[0].script)


# ---------------------------------------------------------------------------------------------- --segment


@pytest.mark.parametrize("version", ["22.05", "23.11", "24.05", "25.05"])
def test_segment_true_is_refused_before_25_11_in_one_line_naming_the_version_and_the_fix(version: str) -> None:
    with pytest.raises(K3Error) as exc:
        slurm.jobs(_rollout(k3_slurm_segment=True, k3_slurm_version=version))
    text = str(exc.value)
    assert f"the site's Slurm is {version}" in text and "25.11" in text and "k3_slurm_segment: auto" in text
    assert "\n" not in text


def test_segment_true_with_no_known_version_is_refused_naming_the_variable() -> None:
    with pytest.raises(K3Error, match=r"not known here: set k3_slurm_version"):
        slurm.jobs(_rollout(k3_slurm_segment=True))


@pytest.mark.parametrize(("segment", "version", "kept"), [
    (True, "25.11", True), (True, "26.05.1", True),
    ("auto", "25.11", True), ("auto", "25.05", False), ("auto", "22.05", False), ("auto", "auto", False),
    (False, "25.11", False)])
def test_segment_is_kept_only_where_the_sites_slurm_accepts_it_with_nodelist(segment: object, version: str,
                                                                             kept: bool) -> None:
    (job,) = slurm.jobs(_rollout(k3_slurm_segment=segment, k3_slurm_version=version))
    lines = _sbatch(job.script)
    assert ("--segment=2" in lines) is kept and "--nodelist=n0,n1" in lines


# ---------------------------------------------------------------------------------------------- IMEX as the site runs it

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def _site(name: str, version: str = "") -> slurm.SlurmSite:
    return slurm.parse_site(version, (FIX / name).read_text())


def test_the_site_is_read_from_real_scontrol_show_config_text() -> None:
    per_job = _site("scontrol-show-config-24.05-nvidia-imex.txt", "slurm 24.05.3")
    assert (per_job.version, per_job.switch, per_job.prolog) == ("24.05.3", slurm.IMEX_SWITCH,
                                                                 ("/etc/slurm/prolog.d/*",))
    assert per_job.imex_per_job
    prolog = _site("scontrol-show-config-25.11-imex-prolog.txt")      # the version from SLURM_VERSION
    assert (prolog.version, prolog.switch, prolog.prolog) == ("25.11.0", None, ("/etc/slurm/imex-prolog.sh",))
    assert not prolog.imex_per_job
    old = _site("scontrol-show-config-22.05-debian.txt",
                (FIX / "scontrol-version-22.05-debian.txt").read_text())         # captured: Debian 12's 22.05
    assert (old.version, old.switch, old.imex_per_job) == ("22.05.8", "switch/none", False)


def test_the_fact_reads_version_and_config_from_its_command_output() -> None:
    from k3deploy.facts.status import SITE_CONFIG, SITE_VERSION, SlurmSiteFact

    text = (FIX / "scontrol-show-config-24.05-nvidia-imex.txt").read_text().splitlines()
    got = SlurmSiteFact().process([SITE_VERSION, "slurm 24.05.3", SITE_CONFIG, *text])
    assert got == _site("scontrol-show-config-24.05-nvidia-imex.txt", "slurm 24.05.3")


@pytest.mark.parametrize(("fixture", "given", "mode", "version"), [
    ("scontrol-show-config-24.05-nvidia-imex.txt", {}, "per_job", "24.05"),
    ("scontrol-show-config-22.05-debian.txt", {}, "standing", "22.05"),
    ("scontrol-show-config-25.11-imex-prolog.txt", {"k3_imex_prolog": "/etc/slurm/imex-prolog.sh"}, "per_job", "25.11"),
    ("scontrol-show-config-24.05-nvidia-imex.txt", {"k3_imex": "standing", "k3_slurm_version": "24.11"}, None, None),
])
def test_what_the_variables_leave_to_the_site_follows_its_scontrol(fixture: str, given: dict[str, str],
                                                                   mode: str | None, version: str | None) -> None:
    v = Variables(k3_hardware="gb300", **given)
    decided = slurm.site_variables(v, _site(fixture))
    assert decided.get("k3_imex") == mode and decided.get("k3_slurm_version") == version


@pytest.mark.parametrize(("fixture", "given", "status"), [
    ("scontrol-show-config-24.05-nvidia-imex.txt", {"k3_imex": "per_job"}, "pass"),
    ("scontrol-show-config-22.05-debian.txt", {"k3_imex": "per_job"}, "fail"),
    ("scontrol-show-config-25.11-imex-prolog.txt", {"k3_imex": "per_job",
                                                    "k3_imex_prolog": "/etc/slurm/imex-prolog.sh"}, "pass"),
    ("scontrol-show-config-24.05-nvidia-imex.txt", {"k3_imex": "per_job"}, "pass"),
    ("scontrol-show-config-25.11-imex-prolog.txt", {"k3_imex": "per_job",
                                                    "k3_imex_prolog": "/opt/site/other-prolog"}, "fail"),
    ("scontrol-show-config-22.05-debian.txt", {"k3_imex": "standing"}, "pass"),
])
def test_imex_per_job_needs_the_switch_plugin_or_the_named_prolog(fixture: str, given: dict[str, str],
                                                                  status: str) -> None:
    from k3deploy.preflight.across import slurm_site_checks

    wanted = target(records("gb300", "multi_node_tp", 2, **given), None)
    assert wanted.requirements.imex_per_job is (given["k3_imex"] == "per_job")
    (result,) = slurm_site_checks("login1", _site(fixture, ""), wanted.vars, wanted.requirements)
    assert (result.host, result.check, result.status) == ("login1", "slurm.site", status), result
    if status == "fail":
        assert "k3_imex" in result.observed and "\n" not in result.observed and result.fix


def test_an_unread_site_is_a_warning_naming_what_was_assumed() -> None:
    from k3deploy.preflight.across import slurm_site_checks

    wanted = target(records("gb300", "multi_node_tp", 2), None)
    (result,) = slurm_site_checks("login1", slurm.SlurmSite(error="scontrol gave no answer"), wanted.vars,
                                  wanted.requirements)
    assert result.status == "warn" and "k3_slurm_version auto" in result.observed


def _launch(imex: str) -> str:
    """A worker's launch script with docker as the site's container runtime: the channels as ``--device``."""
    r = _rollout(k3_imex=imex, k3_slurm_container="docker")
    return slurm.launch_script(r, r.units[1])


def test_a_standing_domain_hands_the_container_channel_0_as_the_unit_does() -> None:
    script = _launch("standing")
    assert "--device /dev/nvidia-caps-imex-channels/channel0" in script and "NVIDIA_IMEX_CHANNELS" not in script


def test_per_job_under_pyxis_the_step_finds_its_channel_in_the_container_and_names_it() -> None:
    """Under pyxis the launch script runs inside the step's container: it passes no device; it finds the job's
    channel there (or fails at once naming its node) and exports its number as NVIDIA_IMEX_CHANNELS for the engine."""
    r = _rollout(k3_imex="per_job", k3_slurm_container="pyxis")
    script = slurm.launch_script(r, r.units[1])
    run = [ln for ln in script.splitlines() if ln.startswith("exec ")]
    assert len(run) == 1 and "docker" not in run[0] and "--device" not in run[0]
    assert not [ln for ln in script.splitlines() if ln.lstrip().startswith(("docker", "stop_container"))]
    assert "channel0" not in script and 'export NVIDIA_IMEX_CHANNELS="$ids"' in script
    assert script.index("NVIDIA_IMEX_CHANNELS") < script.index("\nexec ")


def _run_launch(script: str, tmp_path: Path, channels: list[str]) -> subprocess.CompletedProcess[str]:
    """The launch script run with bash, its IMEX channel directory and docker stood in for in ``tmp_path`` (the
    stand-in docker prints its arguments and NVIDIA_IMEX_CHANNELS)."""
    dev = tmp_path / "imex-channels"
    dev.mkdir()
    for c in channels:
        (dev / c).touch()
    docker = tmp_path / "docker"
    docker.write_text('#!/bin/bash\n[ "$1" = run ] && printf "%s\\n" "NVIDIA_IMEX_CHANNELS=${NVIDIA_IMEX_CHANNELS-}" '
                      '"$@"\nexit 0\n')
    docker.chmod(0o755)
    text = script.replace(slurm.IMEX_CHANNELS_DIR, str(dev)).replace("/usr/bin/docker", str(docker))
    return subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=30)


def test_per_job_the_launch_script_passes_the_jobs_channels_not_channel_0(tmp_path: Path) -> None:
    script = _launch("per_job")
    assert "channel0" not in script and "${imex[@]}" in script
    got = _run_launch(script, tmp_path, ["channel7"])
    assert got.returncode == 0, got.stderr
    words = got.stdout.splitlines()
    assert words[0] == "NVIDIA_IMEX_CHANNELS=7"
    at = words.index("--device", words.index("--gpus"))
    assert words[at + 1] == str(tmp_path / "imex-channels" / "channel7")
    assert not [w for w in words if w.endswith("channel0")]


def test_per_job_a_job_given_no_channel_fails_at_once_naming_the_node(tmp_path: Path) -> None:
    got = _run_launch(_launch("per_job"), tmp_path, [])
    assert got.returncode == 1 and got.stdout == ""
    assert "no IMEX channel" in got.stderr and socket.gethostname() in got.stderr and "switch/nvidia_imex" in got.stderr


# ---------------------------------------------------------------------------------------------- spares under Slurm


def test_a_spare_in_a_replicas_worker_rebuilds_only_that_replicas_job() -> None:
    """A spare takes replica 1's worker (n3, lost): only engine-r1's job changes (the spare in its --nodelist, a new
    revision in its --comment); replica 0's job and the router's keep their comment and are left alone."""
    from k3deploy.model.binding import HostRecord

    data = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp", "k3_slurm_exclusive": "user"}

    def hosts(worker: str) -> list[HostRecord]:
        names = ["n0", "n1", "n2", worker]
        return [HostRecord(names[i], ("head",) if i % 2 == 0 else ("workers",),
                           {**data, "k3_ip": f"192.0.2.{10 + i if names[i] != 's9' else 99}", "rank": i % 2,
                            "k3_replica": i // 2}) for i in range(4)]

    before = slurm.jobs(desired_rollout(target(hosts("n3"), None)))
    moved = desired_rollout(target(hosts("s9"), None))
    after = slurm.jobs(moved)
    assert [(j.name, j.nodes) for j in after] == [("k3-engine-r0", ("n0", "n1")), ("k3-engine-r1", ("n2", "s9")),
                                                  ("k3-router", ("n0",))]
    assert [a.comment == b.comment for a, b in zip(after, before, strict=True)] == [True, False, True]
    queued = [slurm.QueuedJob(str(41 + i), j.name, "RUNNING", j.comment, ",".join(j.nodes))
              for i, j in enumerate(before)]
    decisions = {d.group: d for d in slurm.job_actions(after, queued)}
    assert {g: d.action for g, d in decisions.items()} == {"engine-r0": "keep", "engine-r1": "replace",
                                                          "router": "keep"}
    assert decisions["engine-r1"].cancel == ("42",)
    assert slurm.changed_groups(moved, queued) == {"engine-r1"}


def test_export_slurm_renders_imex_per_job_when_told(tmp_path: Path) -> None:
    from helpers import k3

    for mode, channel0 in (("per_job", False), ("standing", True)):
        out = tmp_path / mode
        proc = k3("export", "slurm", "--hardware", "gb300", "--strategy", "multi_node_tp", "--nodes", "2", "-o",
                  str(out), "--imex", mode, "--container", "docker", timeout=300)
        assert proc.returncode == 0, proc.stderr
        scripts = [p.read_text() for p in out.rglob("*.launch")]
        assert len(scripts) == 2
        assert all(("channel0" in s) is channel0 and ("NVIDIA_IMEX_CHANNELS" in s) is not channel0 for s in scripts)


def test_imex_per_job_under_systemd_units_is_refused_in_one_line() -> None:
    from k3deploy.runtime.launchers import launcher_for

    r = desired_rollout(target(records("gb300", "multi_node_tp", 2, k3_imex="per_job", k3_launcher="systemd"), None))
    with pytest.raises(K3Error) as exc:
        launcher_for(r)
    assert "k3_imex: per_job needs k3_launcher: slurm" in str(exc.value) and "\n" not in str(exc.value)
    assert launcher_for(_rollout(k3_imex="standing")).name == "systemd"
