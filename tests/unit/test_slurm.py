"""The Slurm launcher's model (k3deploy/model/slurm.py): launch scripts that run exactly the systemd units' containers,
batch scripts per group (their #SBATCH lines, their revision, their refusals), and a batch script run for real with
stand-ins for srun on PATH (the steps run locally, each with its node's name)."""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.clusters import FAMILIES, STRATEGIES, records, smallest_rollout
from k3deploy.errors import K3Error
from k3deploy.model import commands, slurm
from k3deploy.model.binding import HostRecord
from k3deploy.model.hosttext import exec_start, launch_argv, split_exec
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import Rollout

#: the launch scripts this module runs are ``docker run``'s (k3_slurm_container: docker; the other runtimes:
#: tests/unit/test_slurm_containers.py)
PIN_DOCKER = {"k3_slurm_container": "docker"}


#: per vendor family, its hardware in order of preference (the first that offers a strategy runs it)
def rollout_of(hardware: list[str], strategy: str, **extra: object) -> Rollout | None:
    """The smallest cluster of the family's first hardware that offers ``strategy`` (None: none offers it); where a
    router shares a host with an engine group (P/D: the first prefill host; a front router: the head's host) its jobs
    share nodes (``k3_slurm_exclusive: user``)."""
    extra = {**PIN_DOCKER, **extra}
    r = smallest_rollout(hardware, strategy, **extra)
    if r is not None and "router" in r.groups and "k3_slurm_exclusive" not in extra:
        r = smallest_rollout(hardware, strategy, **extra, k3_slurm_exclusive="user")
    return r


OFFERED = [(family, strategy) for family, hardware in FAMILIES.items() for strategy in STRATEGIES
           if rollout_of(hardware, strategy) is not None]


def offered(**extra: object) -> list[tuple[str, str, Rollout]]:
    out = []
    for family, strategy in OFFERED:
        r = rollout_of(FAMILIES[family], strategy, **extra)
        assert r is not None
        out.append((family, strategy, r))
    return out


def test_every_strategy_and_every_family_is_covered():
    assert {s for _, s in OFFERED} == set(STRATEGIES) - {"single_node_dep", "single_node_tep"}
    assert {f for f, _ in OFFERED} == set(FAMILIES)


def test_each_launch_script_runs_exactly_its_units_command_for_every_strategy_and_family():
    seen_router = False
    for family, strategy, r in offered():
        for u in r.units:
            unit_argv = exec_start(u.unit_text)
            assert unit_argv, (family, strategy, u.unit)
            assert launch_argv(slurm.launch_script(r, u)) == unit_argv, (family, strategy, u.host, u.unit)
            seen_router |= u.group == "router"
    assert seen_router


def _stub(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_bash_runs_the_launch_script_with_the_units_argv_word_for_word(tmp_path):
    """Both sides parsed by their own parser: bash runs the launch script (a stand-in docker records its argv, one
    word per line, NUL-free), systemd's quoting is undone by the unit's own reader."""
    docker = _stub(tmp_path / "docker", '#!/bin/bash\n[ "$1" = run ] || exit 0\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n')
    for family, strategy, r in offered(k3_docker=str(docker), k3_router_image="lmsysorg/vllm-router:v0.1.17"):
        for u in r.units:
            out = tmp_path / "argv"
            script = tmp_path / "launch"
            script.write_text(slurm.launch_script(r, u))
            proc = subprocess.run(["bash", str(script)], env={**os.environ, "ARGV_OUT": str(out)},
                                  capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, proc.stderr
            ran = [str(docker), *out.read_text().split("\0")[:-1]]
            assert ran == exec_start(u.unit_text), (family, strategy, u.unit)
            out.unlink()


def test_every_rendered_script_is_valid_bash():
    for family, strategy, r in [*offered(), *offered(k3_router_image="lmsysorg/vllm-router:v0.1.17",
                                                   k3_slurm_segment=True, k3_slurm_version="25.11")]:
        texts = [j.script for j in slurm.jobs(r)] + [slurm.launch_script(r, u) for u in r.units]
        for text in texts:
            proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, (family, strategy, proc.stderr, text)


def _sbatch(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def _rollout(strategy: str = "multi_node_tp", hardware: str = "gb300", nodes: int = 2, **extra: object) -> Rollout:
    return desired_rollout(target(records(hardware, strategy, nodes, **{**PIN_DOCKER, **extra}), None))


def test_the_sbatch_lines_follow_the_variables():
    (job,) = slurm.jobs(_rollout())
    lines = _sbatch(job.script)
    assert lines[:6] == ["--job-name=k3-engine", "--nodes=2", "--nodelist=n0,n1", "--ntasks-per-node=1", "--exclusive",
                         "--gres=gpu:4"]
    assert not [x for x in lines if x.startswith(("--partition", "--account", "--qos", "--time", "--segment"))]
    assert f"--comment=k3deploy:engine:{job.revision}" in lines and "--requeue" in lines
    assert "--output=/var/lib/k3deploy/slurm/engine/%j.out" in lines
    (job,) = slurm.jobs(_rollout(k3_slurm_partition="gpu", k3_slurm_account="ml", k3_slurm_qos="high",
                                 k3_slurm_time="7-00:00:00", k3_slurm_exclusive="user", k3_slurm_gres="",
                                 k3_slurm_segment=True, k3_slurm_version="25.11", k3_slurm_dir="/scratch/k3",
                                 k3_unit_name="site-a"))
    lines = _sbatch(job.script)
    assert "--exclusive=user" in lines and "--exclusive" not in lines
    assert not [x for x in lines if x.startswith("--gres")]
    for line in ("--job-name=site-a-engine", "--partition=gpu", "--account=ml", "--qos=high", "--time=7-00:00:00",
                 "--segment=2", "--output=/scratch/k3/engine/%j.out"):
        assert line in lines
    assert job.path == "/scratch/k3/site-a-engine.sbatch"


def test_pd_jobs_are_one_per_pool_then_the_router_without_gres():
    r = _rollout("pd_cluster", "b300", 3, k3_slurm_exclusive="user")
    jobs = slurm.jobs(r)
    assert [j.name for j in jobs] == ["k3-prefill", "k3-decode", "k3-router"]
    assert [j.nodes for j in jobs] == [("p0",), ("d0", "d1"), ("p0",)]
    assert "--gres=gpu:8" in _sbatch(jobs[1].script)
    assert not [x for x in _sbatch(jobs[2].script) if x.startswith("--gres")]
    assert len({j.comment for j in jobs}) == 3


def test_a_worker_waits_for_its_heads_port_with_the_systemd_paths_wait():
    r = _rollout()
    (job,) = slurm.jobs(r)
    worker = r.units[1]
    assert worker.join is not None
    wait = commands.wait_tcp(*worker.join, r.vars.k3_rendezvous_timeout)
    line = next(x for x in job.script.splitlines() if x.startswith("srun") and "-w n1" in x)
    words = shlex.split(line)
    assert words[-4:-2] == ["bash", "-c"] and words[-1] == "&"
    assert words[-2] == f"{wait} && exec {slurm.launch_path(r, worker)}"
    assert job.script.index("-w n0") < job.script.index("-w n1")


def test_the_revision_changes_with_what_the_group_runs_and_only_then():
    base = slurm.jobs(_rollout())[0]
    assert slurm.jobs(_rollout())[0].revision == base.revision
    for changed in ({"k3_extra_args": ["--max-num-seqs", "64"]}, {"k3_slurm_partition": "gpu"},
                    {"k3_extra_env": {"NCCL_DEBUG": "INFO"}}, {"k3_slurm_time": "60"}, {"k3_docker": "/usr/local/bin/docker"}):
        job = slurm.jobs(_rollout(**changed))[0]
        assert job.revision != base.revision, changed
        assert job.comment == f"k3deploy:engine:{job.revision}"
    # the submit host is not what the job runs
    assert slurm.jobs(_rollout(k3_slurm_submit_host="login1"))[0].revision == base.revision


def test_the_router_beside_a_pool_is_refused_with_whole_node_jobs():
    r = _rollout("pd_cluster", "b300", 3)
    with pytest.raises(K3Error) as exc:
        slurm.jobs(r)
    assert "p0" in str(exc.value) and "k3_slurm_exclusive: user" in str(exc.value) and "\n" not in str(exc.value)
    assert slurm.jobs(_rollout("pd_cluster", "b300", 3, k3_slurm_exclusive="user"))


def test_segment_needs_slurm_25_11_and_the_submit_host_must_be_known():
    with pytest.raises(K3Error, match=r"k3_slurm_segment.*25\.11.*not known"):
        slurm.jobs(_rollout(k3_slurm_segment=True))
    r = _rollout()
    with pytest.raises(K3Error, match="k3_slurm_submit_host"):
        slurm.check_submit(r, ["n0", "n1"])
    with pytest.raises(K3Error, match="login1 is not a host"):
        slurm.check_submit(_rollout(k3_slurm_submit_host="login1"), ["n0", "n1"])
    assert slurm.check_submit(_rollout(k3_slurm_submit_host="n0"), ["n0", "n1"]) == "n0"


def test_bad_slurm_values_are_one_line_naming_the_value_and_the_fix():
    for key, value, fix in (("k3_slurm_time", "7 days", "D-HH:MM:SS"), ("k3_slurm_gres", "gpu 4", "gpu:4"),
                            ("k3_slurm_version", "23", "MAJOR.MINOR"), ("k3_launcher", "sge", "slurm"),
                            ("k3_slurm_partition", "a;b", "Slurm name")):
        with pytest.raises(K3Error) as exc:
            target(records("gb300", "multi_node_tp", 2, **{key: value}), None)
        text = str(exc.value)
        assert key in text and value in text and fix in text and "\n" not in text, text


def test_each_host_gets_its_launch_scripts_env_files_and_the_submit_host_the_batch_scripts():
    r = _rollout("pd_cluster", "b300", 3, k3_slurm_exclusive="user", k3_slurm_submit_host="login1")
    files = {h.host: h for h in slurm.host_files(r, slurm.check_submit(r, ["p0", "d0", "d1", "login1"]))}
    assert list(files) == ["p0", "d0", "d1", "login1"]
    assert {f.path: f.mode for f in files["p0"].files} == {
        "/etc/k3deploy/k3-engine-prefill.env": "0600", "/etc/k3deploy/k3-engine-prefill.launch": "0755",
        "/etc/k3deploy/k3-engine-router.env": "0600", "/etc/k3deploy/k3-engine-router.launch": "0755"}
    # the groups' output directories, and the prefill engine's compile caches (its key's directory)
    assert [d for d in files["p0"].dirs if "/k3-compile/" not in d] == ["/var/lib/k3deploy/slurm/prefill",
                                                                         "/var/lib/k3deploy/slurm/router"]
    (caches,) = [d for d in files["p0"].dirs if "/k3-compile/" in d]
    assert re.fullmatch(r"/var/lib/k3deploy/cache/k3-compile/[0-9a-f]{16}", caches), caches
    assert files["p0"].owned == ()   # root's jobs: nothing to hand to a user
    owned = {h.host: h.owned for h in slurm.host_files(_rollout("pd_cluster", "b300", 3, k3_slurm_user="k3job",
                                                                k3_slurm_submit_host="login1"), None)}
    assert caches in owned["p0"] and "/var/lib/k3deploy/slurm/prefill" in owned["p0"]
    assert [f.path for f in files["login1"].files] == [f"/var/lib/k3deploy/slurm/k3-{g}.sbatch"
                                                       for g in ("prefill", "decode", "router")]
    assert [f.text for f in files["login1"].files] == [j.script for j in slurm.jobs(r)]
    assert "login1" not in {h.host for h in slurm.host_files(r, None)}


def test_the_commands_the_runtime_runs_on_the_submit_host_are_valid_sh():
    r = _rollout()
    (job,) = slurm.jobs(r)
    for text in (slurm.submit(job), slurm.queue([job.name]), slurm.cancel([job.name, "k3-router"], 60),
                 slurm.accounting([job.name])):
        assert subprocess.run(["sh", "-n", "-c", text], capture_output=True).returncode == 0, text


def test_the_deploy_makes_each_job_not_requeueable_before_it_stops_it(tmp_path):
    """A job that served requeues itself when its steps end: stopped by the deploy, it must end instead."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    # squeue: the job's id while asked for ids (-o %i); nothing left once it was signalled
    _stub(bin_dir / "squeue", '#!/bin/sh\ncase "$*" in *"-o %i") echo 41;; esac\n')
    for tool in ("scontrol", "scancel"):
        _stub(bin_dir / tool, f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
    proc = subprocess.run(["sh", "-c", slurm.cancel(["k3-engine"], 60)], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, timeout=30)
    assert proc.returncode == 0, proc.stderr
    ran = log.read_text().splitlines()
    assert ran[0] == "scontrol update JobId=41 Requeue=0", ran
    assert [line for line in ran if "--signal=TERM" in line] == [
        f"scancel -u {pwd.getpwuid(os.geteuid()).pw_name} --name=k3-engine --state=RUNNING --signal=TERM"], ran


# ---------------------------------------------------------------------------------------------- a real run

SRUN = r"""#!/bin/bash
# srun as the batch script uses it, run here: the step's command in this process, with its node's name
node=; out=
while [ $# -gt 0 ]; do
  case $1 in
    -w) node=$2; shift 2;;
    --output=*) out=${1#--output=}; shift;;
    -*) shift;;
    *) break;;
  esac
done
echo "srun node=$node $*" >> "$K3_TEST_LOG"
echo $$ >> "$K3_TEST_LOG.steps"
export SLURMD_NODENAME=$node
out=${out//%N/$node}
if [ -n "$out" ] && [ "$out" != /dev/null ]; then exec "$@" >> "$out" 2>&1; fi
exec "$@"
"""

#: scancel --signal=TERM JOBID as Slurm does it without --full: the signal to every step's task, not to the batch script
SCANCEL = r"""#!/bin/bash
echo "scancel $*" >> "$K3_TEST_LOG"
[ "$1" = --signal=TERM ] && [ "$2" = "$SLURM_JOB_ID" ] || exit 1
while read -r pid; do kill -TERM "$pid" 2>/dev/null; done < "$K3_TEST_LOG.steps"
exit 0
"""

#: the launch script both test nodes run (one machine: it tells them apart by the node name srun gives it)
LAUNCH = r"""#!/bin/bash
log=$K3_TEST_LOG
case $SLURMD_NODENAME in
n0)
  trap 'echo "n0 stopped"  >> "$log"; kill "$py" 2>/dev/null; exit 143' TERM
  sleep 1
  python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
open(sys.argv[2], "a").write("n0 listening\n"); time.sleep(120)' "$K3_TEST_PORT" "$log" &
  py=$!
  wait "$py";;
n1)
  echo "n1 started" >> "$log"
  echo "n1 gives up"
  exit 1;;
esac
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(shutil.which("python3") is None, reason="python3 not on PATH")
def test_a_batch_script_starts_the_worker_after_the_heads_port_and_fails_whole_with_the_failing_node(tmp_path):
    port = _free_port()
    cfg, out_dir, bin_dir, log = tmp_path / "cfg", tmp_path / "slurm", tmp_path / "bin", tmp_path / "log"
    for d in (cfg, out_dir / "engine", bin_dir):
        d.mkdir(parents=True)
    r = _rollout(k3_config_dir=str(cfg), k3_slurm_dir=str(out_dir), k3_rendezvous_timeout=30)
    # the head listens on this machine: the worker waits for 127.0.0.1:<a free port>
    r = replace(r, units=[replace(u, join=("127.0.0.1", port)) if u.join else u for u in r.units])
    (job,) = slurm.jobs(r)
    assert {slurm.launch_path(r, u) for u in r.units} == {str(cfg / "k3-engine.launch")}
    _stub(cfg / "k3-engine.launch", LAUNCH)
    _stub(bin_dir / "srun", SRUN)
    _stub(bin_dir / "scancel", SCANCEL)
    _stub(bin_dir / "scontrol", SCONTROL)
    script = tmp_path / "job.sbatch"
    script.write_text(job.script)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77", "K3_TEST_LOG": str(log),
           "K3_TEST_PORT": str(port)}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    events = [line for line in log.read_text().splitlines() if not line.startswith(("srun", "scancel"))]
    assert "scancel --signal=TERM 77" in log.read_text()
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "scontrol" not in log.read_text()   # it never served: no requeue, the deploy's gate reports it
    # the worker's step started only once the head's port was open, and the head's step was stopped
    assert events == ["n0 listening", "n1 started", "n0 stopped"], events
    step_out = out_dir / "engine" / "77"
    assert f"rendezvous 127.0.0.1:{port} open" in (step_out / "n1.out").read_text()
    assert "n1 gives up" in (step_out / "n1.out").read_text()
    # the job names the node whose step ended, its exit code and where its output is
    assert (f"group engine: the step on n1 ended with exit code 1 (its output: n1:{step_out}/n1.out); stopping "
            "the group's other steps") in proc.stderr
    assert time.monotonic() - t0 < 60


#: the head serves at once (the job's watcher asks /health with curl); scontrol as the job calls it to requeue itself
CURL_OK = "#!/bin/sh\nexit 0\n"
SCONTROL = r"""#!/bin/bash
echo "scontrol $*" >> "$K3_TEST_LOG"
[ "$1" = -o ] && echo "JobId=$SLURM_JOB_ID JobName=k3-engine Requeue=${K3_TEST_REQUEUE:-1} Restarts=0 BatchFlag=1"
exit 0
"""

#: the head runs until stopped; the worker ends once the head's step runs (its srun has registered it: the stub's
#: scancel signals the steps registered) and the job has seen the group serve (it waits up to 2 minutes for that: a
#: loaded machine may take long to start the head's step or run the job's watcher, and a worker that ends first is
#: a different case)
LAUNCH_AFTER_SERVING = r"""#!/bin/bash
case $SLURMD_NODENAME in
n0)
  trap 'echo "n0 stopped" >> "$K3_TEST_LOG"; exit 143' TERM
  echo "n0 runs" >> "$K3_TEST_LOG"
  sleep 300 & wait;;
n1)
  for _ in $(seq 1200); do [ -e "$K3_TEST_SERVED" ] && grep -q "^n0 runs" "$K3_TEST_LOG" && break; sleep 0.1; done
  echo "n1 lost"
  exit 1;;
esac
"""


@pytest.mark.parametrize("restarts, requeueable, requeued", [(None, "1", True), ("2", "1", True), ("3", "1", False),
                                                              (None, "0", False)])
def test_a_job_that_served_requeues_itself_when_a_step_ends_up_to_the_limit(tmp_path, restarts, requeueable,
                                                                            requeued):
    """... unless it was made not requeueable (what the deploy does before it stops a job: ``slurm.cancel``)."""
    cfg, out_dir, bin_dir, log = tmp_path / "cfg", tmp_path / "slurm", tmp_path / "bin", tmp_path / "log"
    for d in (cfg, out_dir / "engine", bin_dir):
        d.mkdir(parents=True)
    r = _rollout(k3_config_dir=str(cfg), k3_slurm_dir=str(out_dir), k3_poll_interval=0.2)
    r = replace(r, units=[replace(u, join=None) for u in r.units])   # no rendezvous wait here
    (job,) = slurm.jobs(r)
    assert "k3_slurm_requeue_max = 3 times" in job.script
    _stub(cfg / "k3-engine.launch", LAUNCH_AFTER_SERVING)
    for name, text in (("srun", SRUN), ("scancel", SCANCEL), ("curl", CURL_OK), ("scontrol", SCONTROL)):
        _stub(bin_dir / name, text)
    script = tmp_path / "job.sbatch"
    script.write_text(job.script)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77", "K3_TEST_LOG": str(log),
           "K3_TEST_SERVED": str(out_dir / "engine" / "77" / "served"), "K3_TEST_REQUEUE": requeueable,
           **({"SLURM_RESTART_COUNT": restarts} if restarts else {})}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    ran = log.read_text()
    assert "n0 stopped" in ran   # the group's other steps are stopped either way: no half group
    assert "the step on n1 ended with exit code 1" in proc.stderr   # the watcher's end is not a step's
    if requeued:
        assert proc.returncode == 0 and "scontrol requeue 77" in ran, (proc.stderr, ran)
        assert (f"group engine served before the step ended: the job requeues itself (restart "
                f"{int(restarts or 0) + 1} of 3;") in proc.stderr
    else:
        assert proc.returncode == 1 and "scontrol requeue" not in ran and "requeues itself" not in proc.stderr, (
            proc.stderr, ran)
    if requeueable == "0":
        assert "served before the step ended, but the job is stopped for good (no longer requeueable" in proc.stderr


def _queued(job: slurm.SlurmJob, comment: str | None = None, state: str = "RUNNING") -> slurm.QueuedJob:
    return slurm.QueuedJob(f"{abs(hash(job.name)) % 1000}", job.name, state, comment or job.comment, ",".join(job.nodes))


def test_a_rerun_with_nothing_changed_keeps_every_job_and_a_change_replaces_its_group():
    r = _rollout("pd_cluster", "b300", 3, k3_slurm_exclusive="user")
    prefill, decode, router = slurm.jobs(r)
    assert slurm.changed_groups(r, [_queued(j) for j in (prefill, decode, router)]) == set()
    assert r.changed_groups == set()
    queued = [_queued(prefill), _queued(decode, "k3deploy:decode:0000000000000000"), _queued(router)]
    decisions = slurm.job_actions([prefill, decode, router], queued)
    assert [d.action for d in decisions] == ["keep", "replace", "keep"]
    assert decisions[1].cancel == (queued[1].id,)
    # a P/D pool that changes takes the router with it; an ended job or none at all is (re)submitted
    assert slurm.changed_groups(r, queued) == {"decode", "router"}
    assert slurm.changed_groups(r, [_queued(prefill, state="FAILED"), _queued(decode), _queued(router)]) == {
        "prefill", "router"}
    assert slurm.changed_groups(r, [_queued(decode), _queued(router)]) == {"prefill", "router"}
    assert slurm.changed_groups(r, [_queued(j) for j in (prefill, decode, router)], failing=["decode"]) == {
        "decode", "router"}


def test_replicas_are_one_job_each_and_a_changed_replica_leaves_the_router_serving():
    data = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp", "k3_slurm_exclusive": "user"}
    hosts = [HostRecord(f"n{i}", ("head",) if i % 2 == 0 else ("workers",),
                        {**data, "k3_ip": f"192.0.2.{10 + i}", "rank": i % 2, "k3_replica": i // 2}) for i in range(4)]
    r = desired_rollout(target(hosts, None))
    jobs = slurm.jobs(r)
    assert [(j.name, j.nodes) for j in jobs] == [("k3-engine-r0", ("n0", "n1")), ("k3-engine-r1", ("n2", "n3")),
                                                 ("k3-router", ("n0",))]
    queued = [_queued(jobs[0]), _queued(jobs[1], "k3deploy:engine-r1:0000000000000000"), _queued(jobs[2])]
    assert slurm.changed_groups(r, queued) == {"engine-r1"}
    r = r.decided(slurm.changed_groups(r, queued))
    assert r.waves() == [["engine-r1"]]


DOCKER = r"""#!/bin/bash
# docker as the launch script uses it: each call's argv recorded (NUL-separated, one call a line); `run` stays up
# until `stop` ends it (as the container's exit ends a `docker run` client)
[ "$1" != run ] || echo $$ > "$K3_TEST_LOG.run"
printf "%s\0" "$0" "$@" >> "$K3_TEST_LOG"; echo >> "$K3_TEST_LOG"
case $1 in
run) trap 'kill $s; exit 0' TERM; sleep 30 & s=$!; wait $s;;
stop) kill -TERM "$(cat "$K3_TEST_LOG.run")";;
esac
exit 0
"""


def _unit_line(unit_text: str, key: str) -> list[str]:
    line = next(x for x in unit_text.splitlines() if x.startswith(key + "=") and "docker" in x)
    return split_exec(line.split("=", 1)[1].lstrip("-"))


def test_sigterm_stops_the_container_as_the_units_execstop_after_the_units_pre_step(tmp_path):
    docker = _stub(tmp_path / "docker", DOCKER)
    log = tmp_path / "calls"
    r = _rollout(k3_docker=str(docker))
    unit = r.units[0]
    script = tmp_path / "launch"
    script.write_text(slurm.launch_script(r, unit))
    proc = subprocess.Popen(["bash", str(script)], env={**os.environ, "K3_TEST_LOG": str(log)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (log.exists() and "\0run\0" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(15)
    assert proc.wait(timeout=30) == slurm.STOPPED, proc.communicate()
    calls = [line.split("\0")[:-1] for line in log.read_text().splitlines() if line]
    assert calls[0] == _unit_line(unit.unit_text, "ExecStartPre")       # the leftover container removed first
    assert calls[1] == exec_start(unit.unit_text)
    assert calls[2] == _unit_line(unit.unit_text, "ExecStop")           # then stopped as systemd stops it
    assert time.monotonic() < deadline
