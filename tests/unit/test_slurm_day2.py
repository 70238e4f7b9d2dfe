"""Day 2 under ``k3_launcher: slurm``: ``status`` (each group's job as squeue shows it stands for its units' systemd
state; the verdicts are the systemd ones; a unit runs as planned when its launch script and env file are), ``plan``
(per group keep, submit or replace, with the files that change) and a rollback's restored launch scripts."""

from __future__ import annotations

import hashlib

from k3deploy.facts.status import UnitRun
from k3deploy.model import slurm
from k3deploy.model.binding import HostRecord
from k3deploy.model.diff import build_jobs, render_jobs_text
from k3deploy.model.observed import Installed
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import Rollout
from k3deploy.model.status import assess
from k3deploy.model.steps import JobSteps, served_model


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _rollout() -> Rollout:
    data = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp", "k3_launcher": "slurm",
            "k3_slurm_submit_host": "n0", "k3_slurm_container": "docker"}
    return desired_rollout(target([HostRecord(f"n{i}", ("head",) if i == 0 else ("workers",),
                                              {**data, "k3_ip": f"192.0.2.{10 + i}", "rank": i}) for i in range(2)],
                                  None))


def _reading(r: Rollout, health: int = 200) -> tuple[dict, dict]:
    model = served_model(r)
    runs = {(u.host, u.unit): UnitRun("absent", "", 0, None, "img", "sha256:1", health if u.serves else None,
                                      (model,) if u.serves and health == 200 else None) for u in r.units}
    installed = {(u.host, u.unit): Installed(unit_sha=_sha(slurm.launch_script(r, u)), env_sha=_sha(u.env_text))
                 for u in r.units}
    return runs, installed


def test_a_running_job_whose_head_serves_is_serving_with_its_job_id():
    r = _rollout()
    (job,) = slurm.jobs(r)
    jobs = slurm.group_jobs([job], [slurm.QueuedJob("41", job.name, "RUNNING", job.comment, "n[0-1]")])
    runs, installed = _reading(r)
    model = served_model(r)
    st = assess(r, model, runs, installed, (model,), set(), now=0.0, jobs=jobs)
    assert st.verdict == "serving" and st.exit_code == 0
    (g,) = st.groups
    assert g.job is not None and (g.job.id, g.job.state, g.job.planned) == ("41", "RUNNING", True)
    assert all(u.matches_plan and u.active == "job 41 RUNNING" and u.restarts is None for u in g.units)
    d = st.to_dict()
    assert d["launcher"] == "slurm" and d["groups"][0]["job"]["shown"] == "job 41 RUNNING"


def test_no_job_in_the_queue_is_down_whatever_the_nodes_still_answer():
    r = _rollout()
    jobs = slurm.group_jobs(slurm.jobs(r), [])
    runs, installed = _reading(r, health=0)
    st = assess(r, served_model(r), runs, installed, None, set(), now=0.0, jobs=jobs)
    assert st.verdict == "down" and st.exit_code == 1
    (g,) = st.groups
    assert g.verdict == "down" and g.job is not None and g.job.shown() == "no job"
    assert {u.active for u in g.units} == {"no job"} and {u.verdict for u in g.units} == {"down"}


def test_a_pending_job_is_starting_and_another_revision_is_said():
    r = _rollout()
    (job,) = slurm.jobs(r)
    jobs = slurm.group_jobs([job], [slurm.QueuedJob("40", job.name, "RUNNING", "k3deploy:engine:00", "n[0-1]"),
                                    slurm.QueuedJob("42", job.name, "PENDING", job.comment, "")])
    assert jobs["engine"].shown() == "job 42 PENDING"
    runs, installed = _reading(r, health=0)
    st = assess(r, served_model(r), runs, installed, None, set(), now=0.0, jobs=jobs)
    assert {u.verdict for u in st.groups[0].units} == {"starting"}
    old = slurm.group_jobs([job], [slurm.QueuedJob("40", job.name, "RUNNING", "k3deploy:engine:00", "n[0-1]")])
    assert old["engine"].shown() == "job 40 RUNNING (another revision)"


def test_a_launch_script_that_differs_is_not_as_planned_and_says_which_file():
    r = _rollout()
    (job,) = slurm.jobs(r)
    jobs = slurm.group_jobs([job], [slurm.QueuedJob("41", job.name, "RUNNING", job.comment, "n[0-1]")])
    runs, installed = _reading(r)
    u = r.units[-1]
    installed[(u.host, u.unit)] = Installed(unit_sha="0" * 64, env_sha=_sha(u.env_text))
    model = served_model(r)
    st = assess(r, model, runs, installed, (model,), set(), now=0.0, jobs=jobs)
    found = {x.host: x for x in st.groups[0].units}
    assert found[u.host].matches_plan is False and "launch script" in (found[u.host].why or "")


def test_the_systemd_status_has_no_launcher_keys():
    r = _rollout()
    runs, installed = _reading(r)
    model = served_model(r)
    d = assess(r, model, runs, installed, (model,), set(), now=0.0).to_dict()
    assert "launcher" not in d and "job" not in d["groups"][0]


def test_a_restored_launch_script_is_what_the_job_runs_and_what_its_revision_hashes():
    from dataclasses import replace

    r = _rollout()
    before = slurm.jobs(r)[0]
    kept = slurm.launch_script(r, r.units[1]).replace("docker run", "docker run --label restored=1")
    r.units[1] = replace(r.units[1], launch_text=kept)
    (job,) = slurm.jobs(r)
    assert slurm.launch_script(r, r.units[1]) == kept and job.revision != before.revision
    files = {f.path: f.text for hf in slurm.host_files(r, "n0") if hf.host == "n1" for f in hf.files}
    assert files[slurm.launch_path(r, r.units[1])] == kept


def test_the_plan_keeps_a_job_that_runs_the_planned_revision_and_changes_nothing():
    r = _rollout()
    (job,) = slurm.jobs(r)
    queued = [slurm.QueuedJob("41", job.name, "RUNNING", job.comment, "n[0-1]")]
    _, installed = _reading(r)
    report = build_jobs(r, installed, [job], queued, slurm.changed_groups(r, queued), JobSteps("n0"))
    assert not report.has_changes and report.exit_code == 0
    assert [(j["group"], j["action"], j["cancel"]) for j in report.jobs or []] == [("engine", "keep", [])]
    text = render_jobs_text(report, r)
    assert "engine: keep job 41 RUNNING" in text and "No changes" in text
    assert report.to_dict()["launcher"] == "slurm"


def test_the_plan_replaces_a_job_of_another_revision_naming_the_ids_to_cancel_and_the_changed_lines():
    r = _rollout()
    (job,) = slurm.jobs(r)
    queued = [slurm.QueuedJob("41", job.name, "RUNNING", "k3deploy:engine:0000000000000000", "n[0-1]")]
    _, installed = _reading(r)
    worker = r.units[1]
    old = slurm.launch_script(r, worker).replace(" &\n", " --max-num-seqs 4 &\n")
    assert old != slurm.launch_script(r, worker)
    installed[(worker.host, worker.unit)] = Installed(unit_text=old, unit_sha=_sha(old), env_sha=_sha(worker.env_text),
                                                      env_text=worker.env_text)
    report = build_jobs(r, installed, [job], queued, slurm.changed_groups(r, queued), JobSteps("n0"))
    assert report.has_changes and report.exit_code == 3
    (row,) = report.jobs or []
    assert (row["action"], row["cancel"], row["comment"]) == ("replace", ["41"], job.comment)
    changes = {h.host: h.changes for h in report.hosts}
    assert {"kind": "argv", "op": "-", "line": "--max-num-seqs 4", "unit": worker.unit} in changes[worker.host]
    assert [c["kind"] for c in changes["n0"]] == ["restart"]
    text = render_jobs_text(report, r)
    assert f"engine: replace: cancel job 41, then submit {job.name} on n0,n1" in text
    assert "- --max-num-seqs 4" in text


def test_the_plan_submits_a_group_with_no_job_and_new_files():
    r = _rollout()
    (job,) = slurm.jobs(r)
    report = build_jobs(r, {}, [job], [], slurm.changed_groups(r, []), JobSteps("n0"))
    (row,) = report.jobs or []
    assert row["action"] == "submit" and row["cancel"] == []
    files = [c["path"] for h in report.hosts for c in h.changes if c["kind"] == "file"]
    assert slurm.launch_path(r, r.units[0]) in files and r.units[0].env_path in files
    assert f"engine: submit {job.name} on n0,n1" in render_jobs_text(report, r)


def test_under_slurm_a_host_reads_its_launch_scripts_and_for_a_bundle_its_step_output():
    from k3deploy.runtime import views
    from k3deploy.runtime.reading import ReadLogs, ReadSlurmQueue, ReadUnit, plan_host

    r = _rollout()
    plan = plan_host(r, "n1", views.bundle(9), resolver=None)
    (unit,) = [q for q in plan.requests if isinstance(q, ReadUnit)]
    assert unit.unit_path == slurm.launch_path(r, r.units[1])
    (logs,) = [q for q in plan.requests if isinstance(q, ReadLogs)]
    assert (logs.group_dir, logs.host, logs.lines) == (slurm.group_dir(r, "engine"), "n1", 9)
    assert not any(isinstance(q, ReadSlurmQueue) for q in plan.requests)
    assert any(isinstance(q, ReadSlurmQueue) for q in plan_host(r, "n0", views.STATUS, resolver=None).requests)


def test_the_plan_in_a_bundle_reads_health_from_how_the_units_run():
    from typing import Any

    from k3deploy.runtime.gather import Gathered
    from k3deploy.runtime.launchers import Slurm
    from k3deploy.runtime.reading import HostReading

    r = _rollout()
    (job,) = slurm.jobs(r)
    head = r.units[0]
    running = Slurm(r, "n0", {job.group: job}, (slurm.QueuedJob("41", job.name, "RUNNING", job.comment, "n0"),))

    def gathered(code: int) -> Any:
        return Gathered(target=None, rollout=r,   # type: ignore[arg-type]
                        readings={"n0": HostReading("n0", runs={head.unit: UnitRun("absent", health=code)}),
                                  "n1": HostReading("n1")})

    assert running.changes(r, gathered(200)) == set()
    assert running.changes(r, gathered(0)) == {"engine"}
