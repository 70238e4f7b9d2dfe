"""`pyinfra <inventory> deploy/k3.py` with ``k3_launcher: slurm`` on a simulated cluster under a real Slurm (``sim up
--slurm``: slurmctld on the rank-0 node, the submit host): each group one batch job, a re-run submits nothing, a change
cancels and resubmits, ``status`` reads each group's job, a rollback resubmits the group from its revision's files, a
failing worker fails its job with its own output in the report; a node that fails under the serving job gets the
job requeued. P/D and replicas under Slurm: tests/e2e/test_slurm_groups.py."""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import deploy, k3, totals, why
from helpers.engine import wait_for
from helpers.simulated import Sim, endpoint_of, openai_client
from helpers.simulated import slurm_jobs as jobs

pytestmark = pytest.mark.sim

COMMENT = re.compile(r"k3deploy:engine:[0-9a-f]{16}")


def engine_job(sim: Sim) -> tuple[str, str]:
    """The one job of the engine group: its id and comment (it must be running)."""
    queued = jobs(sim)
    assert [(j[1], j[2]) for j in queued] == [("k3-engine", "RUNNING")], queued
    assert COMMENT.fullmatch(queued[0][3]), queued
    return queued[0][0], queued[0][3]


def history(sim: Sim, starts: dict | None = None) -> tuple[int | None, list[int]]:
    """The engine group's current revision and its revisions' numbers (``k3deploy history --json``); ``starts``
    given: filled with the current revision's start record per host and unit."""
    got = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]["engine"]
    if starts is not None:
        starts.update(next((r.get("startup") or {} for r in got["revisions"] if r["number"] == got["current"]), {}))
    return got["current"], [r["number"] for r in got["revisions"]]


def status(sim: Sim) -> tuple[int, dict]:
    """``k3deploy status --json``: its exit code and what it says."""
    got = k3("status", sim.inventory, "--json")
    assert got.returncode in (0, 1), got.stdout + got.stderr
    return got.returncode, json.loads(got.stdout)


def engine_job_now(sim: Sim) -> tuple[str, str] | None:
    """The engine group's job id and comment while it runs; None while it does not."""
    queued = jobs(sim)
    return (queued[0][0], queued[0][3]) if [(j[1], j[2]) for j in queued] == [("k3-engine", "RUNNING")] else None


def serves(endpoint: str) -> bool:
    """The endpoint lists its model (``/v1/models``), asked once."""
    try:
        with urllib.request.urlopen(f"{endpoint}/v1/models", timeout=5) as r:
            return b"Kimi-K3" in r.read()
    except OSError:
        return False


def bundled(sim: Sim, tmp: Path) -> dict[str, str]:
    """``k3deploy bundle``: its files by path."""
    out = tmp / "bundle.tar.gz"
    k3("bundle", sim.inventory, "-o", str(out), check=True)
    with tarfile.open(out) as tar:
        return {m.name.removeprefix("k3deploy-bundle/"): (tar.extractfile(m) or io.BytesIO()).read().decode()
                for m in tar.getmembers() if m.isfile()}


#: the most a run that stops a serving job may take here: the job's steps end within seconds of SIGTERM (an engine
#: that did not stop on it ran until docker stop's SIGKILL, 60 s later; a job that requeued itself, 120 s and a hard
#: cancel)
STOPPING_RUN_S = 45


def stopping(sim: Sim, *extra: str):
    """A deploy run that stops the serving job: it ends in time, and without cancelling anything outright."""
    t0 = time.monotonic()
    run = deploy(sim.inventory, *extra)
    took = time.monotonic() - t0
    assert took < STOPPING_RUN_S and "cancelled outright" not in run.stdout, (f"{took:.0f} s", why(run))
    return run


def test_multi_node_tp_under_slurm(sim_factory, tmp_path):
    sim = sim_factory("sdtp", "gb300", 2, "--slurm")
    sim.set_vars("k3_strategy: multi_node_tp\n")
    head, worker = (n["name"] for n in sim.info["nodes"])

    # the submit host must be a host of the inventory: one line, exit 2, nothing changed
    sim.set_vars("k3_slurm_submit_host: login9\n")
    bad = deploy(sim.inventory)
    assert bad.returncode == 2, why(bad)
    assert "k3_slurm_submit_host: login9 is not a host of the inventory" in bad.stdout and "Stage |" not in bad.stdout
    sim.set_vars(f"k3_slurm_submit_host: {head}\n")

    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    job, comment = engine_job(sim)
    assert f"group engine: job {job} (k3-engine, {comment}) submitted on {head},{worker}" in first.stdout
    assert "serves at" in first.stdout
    assert "Kimi-K3" in openai_client(endpoint_of(first.stdout))
    for rank in (0, 1):
        # the engine runs in the job's step, not under systemd: no k3-engine unit anywhere
        units = sim.ssh(rank, "systemctl list-unit-files 'k3-engine*' --no-legend; ls /etc/systemd/system")
        assert "k3-engine" not in units.stdout, units.stdout
        files = sim.ssh(rank, "stat -c '%n %a' /etc/k3deploy/k3-engine.env /etc/k3deploy/k3-engine.launch")
        assert files.stdout.split("\n")[:2] == ["/etc/k3deploy/k3-engine.env 600",
                                                "/etc/k3deploy/k3-engine.launch 755"], files.stdout
        # each node keeps its own step's output
        out = sim.ssh(rank, f"cat /var/lib/k3deploy/slurm/engine/{job}/{sim.info['nodes'][rank]['name']}.out")
        assert out.returncode == 0, out.stderr
    starts: dict = {}
    assert history(sim, starts) == (1, [1])
    # each node's start, phase by phase, read from its step output by vLLM's own stamps and kept with the revision
    assert set(starts) == {head, worker}, starts
    for node, last in ((head, "ready"), (worker, "graphs")):   # a headless worker: no API server
        rec = next(iter(starts[node].values()))
        assert list(rec["startup"])[-1] == last and rec["startup_complete"], (node, rec)
        assert rec["startup"]["weights"] >= 0 and rec["startup_begun"] is not None, rec
    code, st = status(sim)
    assert code == 0 and st["verdict"] == "serving" and st["launcher"] == "slurm", st
    # and each unit's last start, phase by phase, from its step output: the start the revision kept
    assert {u["host"]: u["startup"] for g in st["groups"] for u in g["units"]} == {
        h: next(iter(by_unit.values()))["startup"] for h, by_unit in starts.items()}, st
    (group,) = st["groups"]
    assert group["verdict"] == "serving" and group["job"]["id"] == job and group["job"]["planned"], group
    assert [(u["host"], u["active"], u["restarts"], u["matches_plan"]) for u in group["units"]] == [
        (head, f"job {job} RUNNING", None, True), (worker, f"job {job} RUNNING", None, True)]
    # each node's engine is a step of the job (squeue --steps): the table has it instead of a unit, restarts, up
    assert {node for _, node in group["job"]["steps"]} == {head, worker}, group["job"]
    assert all(step.startswith(f"{job}.") for step, _ in group["job"]["steps"]), group["job"]
    table = k3("status", sim.inventory)
    assert table.returncode == 0 and f"job {job} RUNNING" in table.stdout, table.stdout
    header = next(line for line in table.stdout.splitlines() if "job.step" in line)
    assert " unit " not in header and "restarts" not in header and "n/a" not in table.stdout, table.stdout
    assert all(f"{step} RUNNING" in table.stdout for step, _ in group["job"]["steps"]), table.stdout
    # the bundle: squeue's view and each node's step output of the running job
    files = bundled(sim, tmp_path)
    assert any(line.startswith(f"{job} k3-engine RUNNING {comment}") for line in files["slurm/squeue.txt"].splitlines())
    assert json.loads(files["slurm/jobs.json"])["engine"]["queued"]["id"] == job
    for node in (head, worker):
        assert {f"hosts/{node}/k3-engine.step-{job}.log", f"hosts/{node}/k3-engine.launch"} <= set(files), sorted(files)
    assert f"hosts/{head}/k3-engine.batch-{job}.log" in files   # the job's own output, on its batch host
    assert json.loads(files["status.json"])["verdict"] == "serving"
    kept = sim.ssh(1, "ls /etc/k3deploy/revisions/engine/1").stdout.split()
    assert kept == ["k3-engine.env", "k3-engine.launch", "meta.json", "served", "startup-k3-engine.service.log"], kept
    batch = sim.ssh(0, "cat /var/lib/k3deploy/slurm/k3-engine.sbatch").stdout
    assert f"#SBATCH --comment={comment}\n" in batch and f"#SBATCH --nodelist={head},{worker}\n" in batch

    # nothing changed: nothing submitted or cancelled, the same job runs on
    again = deploy(sim.inventory)
    assert again.returncode == 0, why(again)
    success, errors, nochange = totals(again.stdout)
    assert (success, errors) == (0, 0) and nochange > 0, again.stdout[-3000:]
    assert "submitted on" not in again.stdout and "cancelled" not in again.stdout
    assert engine_job(sim) == (job, comment)

    # the plan of a re-run: every job kept
    plan = k3("plan", sim.inventory)
    assert plan.returncode == 0 and f"engine: keep job {job} RUNNING" in plan.stdout, plan.stdout

    # a change: the old job is cancelled, the new one submitted with the new revision, and it serves
    sim.set_vars('k3_extra_args: ["--max-num-seqs", "4"]\n')
    plan = k3("plan", sim.inventory, "--json")
    assert plan.returncode == 3, plan.stdout + plan.stderr
    (row,) = json.loads(plan.stdout)["jobs"]
    assert (row["action"], row["cancel"]) == ("replace", [job]), row
    text = k3("plan", sim.inventory).stdout
    assert f"engine: replace: cancel job {job}, then submit k3-engine on {head},{worker}" in text, text
    assert "+ --max-num-seqs 4" in text
    changed = stopping(sim)
    assert changed.returncode == 0, why(changed)
    assert f"cancelled job {job} (k3-engine, {comment})" in changed.stdout
    # the job it stopped had served: made not requeueable first, it ended instead of requeueing itself
    old = sim.ssh(0, f"cat /var/lib/k3deploy/slurm/engine/{job}.out").stdout
    assert "the job is stopped for good" in old and "requeues itself" not in old, old
    job2, comment2 = engine_job(sim)
    assert job2 != job and comment2 != comment
    assert "--max-num-seqs 4" in sim.ssh(1, "cat /etc/k3deploy/k3-engine.launch").stdout
    openai_client(endpoint_of(changed.stdout))
    assert history(sim) == (2, [1, 2])

    # a job cancelled behind the deploy's back: the next run submits it again
    assert sim.ssh(0, f"scancel {job2}").returncode == 0
    for _ in range(60):
        if not jobs(sim):
            break
        sim.ssh(0, "sleep 1")
    code, st = status(sim)
    assert code == 1 and st["verdict"] == "down", st
    (group,) = st["groups"]
    assert group["verdict"] == "down" and group["job"]["id"] is None and group["job"]["shown"] == "no job", group
    assert {u["active"] for u in group["units"]} == {"no job"}
    back = deploy(sim.inventory)
    assert back.returncode == 0, why(back)
    job3, comment3 = engine_job(sim)
    assert job3 != job2 and comment3 == comment2
    code, st = status(sim)
    assert code == 0 and st["verdict"] == "serving" and st["groups"][0]["job"]["id"] == job3, st
    assert history(sim) == (2, [1, 2])   # the same files: no new revision

    # a rollback: revision 1's launch scripts and env files back on every node, its job resubmitted from them
    preview = k3("plan", sim.inventory, "--rollback", "previous")
    assert preview.returncode == 3 and "a rollback from revision 2 to revision 1" in preview.stdout, preview.stdout
    assert f"engine: replace: cancel job {job3}" in preview.stdout and "- --max-num-seqs 4" in preview.stdout
    rollback = stopping(sim, "--data", "k3_rollback=true")
    assert rollback.returncode == 0, why(rollback)
    assert "rollback of group engine from revision 2 to revision 1" in rollback.stdout
    assert f"cancelled job {job3} (k3-engine, {comment3})" in rollback.stdout
    job4, comment4 = engine_job(sim)
    assert job4 != job3 and comment4 == comment   # revision 1's files: revision 1's comment
    for rank in (0, 1):
        now = sim.ssh(rank, "cat /etc/k3deploy/k3-engine.env /etc/k3deploy/k3-engine.launch").stdout
        kept = sim.ssh(rank, "cat /etc/k3deploy/revisions/engine/1/k3-engine.env "
                             "/etc/k3deploy/revisions/engine/1/k3-engine.launch").stdout
        assert now == kept and "--max-num-seqs" not in now
    assert history(sim) == (1, [1, 2])
    code, st = status(sim)
    assert code == 0 and st["verdict"] == "serving" and st["groups"][0]["job"]["id"] == job4, st
    openai_client(endpoint_of(first.stdout))

    # a node that fails under the running job (rebooted: its step ends with it): the job, which served, requeues
    # itself, and Slurm starts it again, whole, on the same nodes after its requeue delay; no command of ours runs
    served = f"/var/lib/k3deploy/slurm/engine/{job4}/served"
    assert wait_for(lambda: sim.ssh(0, f"test -e {served}").returncode == 0, 30, 1), "the job never saw its group serve"
    t0 = time.monotonic()
    k3("sim", "reboot", "--name", sim.name, "1", check=True)
    again_serving = wait_for(lambda: engine_job_now(sim) == (job4, comment4) and
                             "Restarts=1" in sim.ssh(0, f"scontrol show job {job4}").stdout and
                             serves(endpoint_of(first.stdout)), 180, 1)
    took = time.monotonic() - t0
    assert again_serving, (jobs(sim), sim.ssh(0, f"tail -5 /var/lib/k3deploy/slurm/engine/{job4}.out").stdout)
    print(f"node failure under the job -> serving again (requeued, same nodes): {took:.1f} s")
    out = sim.ssh(0, f"cat /var/lib/k3deploy/slurm/engine/{job4}.out").stdout
    assert "group engine served before the step ended: the job requeues itself (restart 1 of 3;" in out, out
    openai_client(endpoint_of(first.stdout))
    code, st = status(sim)
    assert code == 0 and st["verdict"] == "serving" and st["groups"][0]["job"]["id"] == job4, st

    # a change whose worker crashes: the job ends whole, the report names the worker with its own step output
    k3("sim", "fault", "--name", sim.name, "1:engine-crash", check=True)
    sim.set_vars('k3_extra_args: ["--max-num-seqs", "8"]\n')
    crash = stopping(sim)
    assert crash.returncode != 0
    assert f"[{worker}] worker rank 1 on {worker} (" in crash.stdout and "failed during start" in crash.stdout
    assert f"[{worker}] --- /var/lib/k3deploy/slurm/engine/" in crash.stdout
    assert "EngineCore failed to start" in crash.stdout
    assert f"[{head}] group engine stopped because worker rank 1 on {worker} failed" in crash.stdout
    assert jobs(sim) == []   # no half group
