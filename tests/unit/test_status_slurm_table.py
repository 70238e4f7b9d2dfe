"""``status`` under ``k3_launcher: slurm`` for people: no systemd unit column (nor restarts or uptime, systemd's), a
``job.step`` column instead with each node's step as the submit host's ``squeue --steps`` lists it, read by the
same command that reads the queue."""

from __future__ import annotations

import hashlib
import io

from k3deploy.facts.status import SQUEUE_OK, STEPS_MARK, SlurmQueue, UnitRun
from k3deploy.model import slurm
from k3deploy.model.binding import HostRecord
from k3deploy.model.observed import Installed
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import Rollout
from k3deploy.model.status import assess
from k3deploy.model.steps import served_model


def _rollout() -> Rollout:
    """A GB300 pair under Slurm (docker as the container runtime), n0 its submit host."""
    data = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp", "k3_launcher": "slurm",
            "k3_slurm_submit_host": "n0", "k3_slurm_container": "docker"}
    return desired_rollout(target([HostRecord(f"n{i}", ("head",) if i == 0 else ("workers",),
                                              {**data, "k3_ip": f"192.0.2.{10 + i}", "rank": i}) for i in range(2)],
                                  None))


def _reading(r: Rollout) -> tuple[dict, dict]:
    """What the nodes report of a serving group: its head answers, every launch script and env file as planned."""
    model = served_model(r)
    runs = {(u.host, u.unit): UnitRun("absent", "", 0, None, "img", "sha256:1", 200 if u.serves else None,
                                      (model,) if u.serves else None) for u in r.units}
    installed = {(u.host, u.unit): Installed(unit_sha=hashlib.sha256(slurm.launch_script(r, u).encode()).hexdigest(),
                                             env_sha=hashlib.sha256(u.env_text.encode()).hexdigest())
                 for u in r.units}
    return runs, installed


def rendered(st: object) -> list[str]:
    from rich.console import Console

    from k3deploy.cli.status import show

    out = io.StringIO()
    show(st, Console(file=out, width=160, color_system=None))   # type: ignore[arg-type]
    return out.getvalue().splitlines()


def test_each_node_shows_its_step_of_the_group_job_and_no_unit():
    r = _rollout()
    (job,) = slurm.jobs(r)
    # what squeue prints, as the fact reads it: the job, then its steps (mkdir over both nodes, one per node, batch)
    reading = SlurmQueue().process([SQUEUE_OK, f"41 {job.name} RUNNING {job.comment} n[0-1]", STEPS_MARK,
                                    "41.0 n[0-1]", "41.2 n1", "41.1 n0", "41.batch n0", "41.extern n0", "40.1 n0"])
    assert reading.steps == (("41.2", "n1"), ("41.1", "n0"), ("40.1", "n0"))
    jobs = slurm.group_jobs([job], reading.jobs, reading.steps)
    assert jobs["engine"].steps == (("41.1", "n0"), ("41.2", "n1"))       # its own, in step order
    runs, installed = _reading(r)
    model = served_model(r)
    st = assess(r, model, runs, installed, (model,), set(), now=0.0, jobs=jobs)
    lines = rendered(st)
    header = next(line for line in lines if "job.step" in line)
    assert "unit" not in header.split() and "restarts" not in header and " up " not in header
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    rows = {row[0]: row[1] for row in cells if row and row[0] in ("n0", "n1")}
    assert rows == {"n0": "41.1 RUNNING", "n1": "41.2 RUNNING"}, lines
    assert not any("k3-engine.service" in line or "n/a" in line for line in lines)
    assert st.to_dict()["groups"][0]["job"]["steps"] == (("41.1", "n0"), ("41.2", "n1"))


def test_a_pending_job_has_no_step_yet_and_says_the_job():
    r = _rollout()
    (job,) = slurm.jobs(r)
    jobs = slurm.group_jobs([job], [slurm.QueuedJob("42", job.name, "PENDING", job.comment, "")])
    assert jobs["engine"].on("n0") == "job 42 PENDING"
    assert slurm.group_jobs([job], [])["engine"].on("n0") == "no job"
