"""The deploy's Slurm launcher (``k3_launcher: slurm``): what the submit host is asked, what changes, and the readiness
gate of a group run by a job: the real probe and report scripts run in a local shell against scripted ``squeue``,
``scancel``, ``curl`` and ``docker`` (tests/e2e/test_slurm_deploy.py runs them against a real Slurm)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from k3deploy import load_recipe, resolve
from k3deploy.model import commands, slurm
from k3deploy.model.binding import HostRecord
from k3deploy.model.rollout import plan_rollout
from k3deploy.model.variables import Variables
from k3deploy.runtime.gather import Gathered
from k3deploy.runtime.launchers import Slurm, Systemd, launcher_for
from k3deploy.runtime.readiness import wait_group
from k3deploy.runtime.reading import HostReading, ReadSlurmQueue, plan_host
from k3deploy.runtime.views import DEPLOY

MODELS = '{"object":"list","data":[{"id":"moonshotai/Kimi-K3","object":"model"}]}'
SQUEUE = """#!/bin/sh
[ -f "$K3T/squeue-fails" ] && { echo 'squeue: error: Unable to contact slurm controller' >&2; exit 1; }
cat "$K3T/squeue" 2>/dev/null; exit 0
"""
SCANCEL = """#!/bin/sh
echo "scancel $*" >> "$K3T/scancel"
"""
CURL = """#!/bin/sh
for a in "$@"; do last="$a"; done
case "$*" in
  *K3_CODE=*) cat "$K3T/models"; printf '\nK3_CODE=200';;
  *http_code*) cat "$K3T/code" 2>/dev/null || echo 000;;
  *) case "$last" in */v1/models) cat "$K3T/models";; esac;;
esac
"""
DOCKER = """#!/bin/sh
echo "Error response from daemon: No such container: $4" >&2; exit 1
"""


class Host:
    """A node whose shell is this machine's ``sh`` with scripted Slurm, ``curl`` and ``docker``."""

    def __init__(self, root: Path, name: str):
        self.name, self.commands = name, list[str]()
        self.dir = root / name
        bin_dir = self.dir / "bin"
        bin_dir.mkdir(parents=True)
        for tool, text in (("squeue", SQUEUE), ("scancel", SCANCEL), ("curl", CURL), ("docker", DOCKER)):
            (bin_dir / tool).write_text(text)
            (bin_dir / tool).chmod(0o755)
        (self.dir / "models").write_text(MODELS)

    def set(self, **files: str) -> None:
        for name, text in files.items():
            (self.dir / name.replace("_", "-")).write_text(text)

    def run_shell_command(self, cmd: str, _stdin: str | None = None, **kwargs: Any) -> tuple[bool, Any]:
        self.commands.append(_stdin or cmd)
        env = {**os.environ, "PATH": f"{self.dir / 'bin'}:{os.environ['PATH']}", "K3T": str(self.dir)}
        proc = subprocess.run(["sh", "-c", cmd], input=_stdin, capture_output=True, text=True, env=env, timeout=30)
        return proc.returncode == 0, SimpleNamespace(stdout_lines=proc.stdout.splitlines(),
                                                     stderr_lines=proc.stderr.splitlines())


def rollout(tmp_path: Path | None = None):
    plan = resolve(load_recipe(), hardware="gb300", strategy="multi_node_tp", nodes=2)
    hosts = [HostRecord("n0", ("head",), {"k3_ip": "10.0.0.1"}), HostRecord("n1", ("workers",), {"k3_ip": "10.0.0.2"})]
    return plan_rollout(plan, hosts, Variables(
        k3_hardware="gb300", k3_poll_interval=0.2, k3_rollout_deadline=30, k3_docker="docker", k3_launcher="slurm",
        k3_slurm_submit_host="n0", k3_slurm_dir=str(tmp_path or "/var/lib/k3deploy/slurm")))


def probe(tmp_path: Path, *, squeue: str | None = None, code: str = "200", fails: bool = False) -> tuple[int, str]:
    h = Host(tmp_path, "n")
    h.set(code=code)
    if squeue is not None:
        h.set(squeue=squeue)
    if fails:
        h.set(squeue_fails="")
    _, out = h.run_shell_command(f"( {commands.probe_job('k3-engine', 'http://10.0.0.1:8000', 'moonshotai/Kimi-K3')} )"
                                 "; echo rc=$?")
    lines = out.stdout_lines
    return int(lines[-1][3:]), "\n".join(lines[:-1])


def test_the_probe_judges_the_job_then_the_endpoint(tmp_path):
    assert probe(tmp_path / "a", squeue="RUNNING\n") == (commands.PROBE_READY, "")
    assert probe(tmp_path / "b", squeue="RUNNING\n", code="000")[0] == commands.PROBE_STARTING
    assert probe(tmp_path / "c", squeue="PENDING\n")[0] == commands.PROBE_STARTING
    assert probe(tmp_path / "d", fails=True)[0] == commands.PROBE_STARTING   # squeue did not answer: poll again
    assert probe(tmp_path / "e", squeue="") == (commands.PROBE_FAILED,
                                                 "job k3-engine is no longer in the Slurm queue: it ended")
    assert probe(tmp_path / "f", squeue="COMPLETING\n") == (commands.PROBE_FAILED, "job k3-engine is COMPLETING")
    assert probe(tmp_path / "g", squeue="RUNNING\n", code="503")[0] == commands.PROBE_FAILED


def test_the_submit_host_reads_the_groups_jobs_and_no_other_host_does():
    layout = rollout()
    asked = {h: [r for r in plan_host(layout, h, DEPLOY, None).requests if isinstance(r, ReadSlurmQueue)]
             for h in ("n0", "n1")}
    assert asked == {"n0": [ReadSlurmQueue(("k3-engine",))], "n1": []}
    systemd = plan_rollout(layout.plan, [HostRecord("n0", ("head",), {"k3_ip": "10.0.0.1"}),
                                         HostRecord("n1", ("workers",), {"k3_ip": "10.0.0.2"})],
                           Variables(k3_hardware="gb300"))
    assert not any(isinstance(r, ReadSlurmQueue) for r in plan_host(systemd, "n0", DEPLOY, None).requests)


def launcher(r, queued=()) -> Slurm:
    return Slurm(r, "n0", {j.group: j for j in slurm.jobs(r)}, tuple(queued))


def test_a_running_job_of_the_planned_revision_is_kept_unless_it_does_not_answer():
    r = rollout()
    job = slurm.jobs(r)[0]
    running = slurm.QueuedJob("41", job.name, "RUNNING", job.comment, "n[0-1]")
    head = r.group("engine")[0]

    def gathered(code: int) -> Any:
        return Gathered(target=None, rollout=r,   # type: ignore[arg-type]
                        readings={"n0": HostReading("n0", health={head.unit: code}), "n1": HostReading("n1")})

    assert launcher(r, [running]).changes(r, gathered(200)) == set() and r.changed_groups == set()
    assert launcher(r, [running]).changes(r, gathered(0)) == {"engine"}
    other = slurm.QueuedJob("40", job.name, "RUNNING", "k3deploy:engine:0000000000000000", "n[0-1]")
    assert launcher(r, [other]).changes(r, gathered(200)) == {"engine"}
    assert launcher(r, []).changes(r, gathered(0)) == {"engine"}
    assert launcher_for(r).queue_host == "n0" and launcher_for(r).name == "slurm"
    assert Systemd(r).queue_host is None and Systemd(r).name == "systemd"


def test_a_revision_keeps_each_nodes_launch_script_and_env_file():
    r = rollout()
    ctl = launcher(r)
    worker = r.group("engine")[1]
    assert ctl.kept(worker) == ["/etc/k3deploy/k3-engine.launch", "/etc/k3deploy/k3-engine.env"]
    assert sorted(ctl.revision_files("engine")) == ["n0:/etc/k3deploy/k3-engine.env", "n0:/etc/k3deploy/k3-engine.launch",
                                                   "n1:/etc/k3deploy/k3-engine.env", "n1:/etc/k3deploy/k3-engine.launch"]
    assert ctl.revision_files("engine")["n1:/etc/k3deploy/k3-engine.launch"] == \
        slurm.sha256(slurm.launch_script(r, worker))


def test_a_failing_worker_is_named_with_its_step_output_and_the_job_is_cancelled(tmp_path):
    r = rollout(tmp_path / "slurm")
    hosts = {n: Host(tmp_path, n) for n in ("n0", "n1")}
    hosts["n0"].set(squeue="")   # the job ended
    (tmp_path / "slurm" / "engine" / "7").mkdir(parents=True)
    # as the batch script writes it on its first node, and as the worker's step wrote its own output on its node
    (tmp_path / "slurm" / "engine" / "7.out").write_text(
        "srun: error: n1: task 0: Exited with exit code 1\nk3deploy: group engine: the step on n1 ended with exit "
        "code 1 (its output: n1:/x/n1.out); stopping the group's other steps\n")
    (tmp_path / "slurm" / "engine" / "7" / "n1.out").write_text("EngineCore failed to start.\n")
    ctl = launcher(r)
    fail = wait_group(r, "engine", hosts, sleep=lambda s: None, control=ctl.control({"engine": "7"}))
    assert fail is not None and fail.host == "n1" and fail.unit.rank == 1
    assert fail.observed == "job k3-engine is no longer in the Slurm queue: it ended (seen from n0)"
    assert f"--- {tmp_path}/slurm/engine/7/n1.out (the step output, last 25 lines)" in fail.logs
    assert "EngineCore failed to start." in fail.logs and "no container k3-engine now" in fail.logs
    # the group's job is cancelled from the submit host (no half group); nothing is asked of systemd
    assert "--name=k3-engine" in (hosts["n0"].dir / "scancel").read_text()
    assert not any("systemctl" in c for h in hosts.values() for c in h.commands)
    advice = ctl.advice("engine", "n1", submitted={"engine": "7"}) or ""
    assert f"n1's step output is n1:{tmp_path}/slurm/engine/7/n1.out" in advice and "cancelled" in advice


def test_a_group_that_serves_passes_the_gate(tmp_path):
    r = rollout(tmp_path / "slurm")
    hosts = {n: Host(tmp_path, n) for n in ("n0", "n1")}
    for h in hosts.values():
        h.set(squeue="RUNNING\n", code="200")
    assert wait_group(r, "engine", hosts, sleep=lambda s: None, control=launcher(r).control({"engine": "7"})) \
        is None


def test_the_new_scripts_are_valid_sh():
    for script in (commands.probe_job("k3-engine", "http://h:8000", "m"), commands.probe_job("k3-router", None, None),
                   commands.step_logs("/var/lib/k3deploy/slurm/engine/7/n1.out", "k3-engine", "docker"),
                   commands.step_ended("/var/lib/k3deploy/slurm/engine/7.out"), commands.make_dirs(["/a b", "/c"])):
        assert subprocess.run(["sh", "-n", "-c", script], capture_output=True).returncode == 0, script
