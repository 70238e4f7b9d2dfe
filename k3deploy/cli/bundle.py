"""``k3deploy bundle INVENTORY -o FILE.tar.gz``: everything support needs in one file, and no secret."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from k3deploy.cli.common import echo_json, json_option, read_cluster
from k3deploy.errors import K3Error
from k3deploy.model.secrets import mask_line
from k3deploy.model.secrets import scrub as scrub_values
from k3deploy.model.secrets import secret_values as env_secrets

if TYPE_CHECKING:
    from k3deploy.runtime.gather import Gathered


def _json(data: Any) -> str:
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        return str(value)

    return json.dumps(data, indent=2, default=plain) + "\n"


def scrub(text: str, secrets: list[str]) -> str:
    """Every line with a secret's value masked (env lines by name, and any known secret value anywhere)."""
    return scrub_values("\n".join(mask_line(line) for line in text.split("\n")), secrets)


def secret_values(gathered: Gathered) -> list[str]:
    """The values of every secret-named env setting: of the variables, the planned env files and those installed
    (so they are masked wherever they appear, not only in ``NAME=value`` lines)."""
    values = env_secrets(gathered.target.vars.k3_extra_env)
    texts = [u.env_text for u in gathered.require_rollout().units]
    texts += [i.env_text for i in gathered.installed.values() if i.env_text]
    for text in texts:
        values += env_secrets(dict(line.split("=", 1) for line in text.splitlines() if "=" in line))
    return sorted(set(values), key=len, reverse=True)


def bundle_files(gathered: Gathered, inventory: str, version: str, secrets: list[str]) -> dict[str, str]:
    """The bundle's files by path: the tool's version, variables, plan, status, preflight, the starts each revision
    recorded and the current one's timeline (:func:`startup_files`), and per host its facts
    and what the rollout read there, and per unit its unit and env files (as installed), journal and container
    log. Under ``k3_launcher: slurm``: per unit its launch script instead of a unit file and its step output in its
    group's newest job (and the job's own output, on its batch host) instead of a journal; the submit host's
    ``squeue`` in ``slurm/``."""
    from k3deploy.cli.plan import plan_report, staging_lines
    from k3deploy.cli.status import status_of

    r = gathered.require_rollout()
    t = gathered.target
    first = t.resolved[t.records[0].name]
    secrets = list(secrets) + secret_values(gathered)
    from k3deploy.runtime.launchers import launcher_for

    launcher = launcher_for(r)
    queue = launcher.queue_host is not None   # (Slurm: the submit host's queue)

    def plan() -> dict[str, Any]:
        return dataclasses.replace(plan_report(gathered), staging=staging_lines(gathered)).to_dict()

    def either(what: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Under Slurm the plan and the status need the submit host's queue: where it could not be read the
        bundle says why instead (a bundle is most wanted when something is broken)."""
        try:
            return what()
        except K3Error as exc:
            if not queue:
                raise
            return {"error": str(exc)}

    files = {
        "VERSION": f"k3deploy {version}\ncollected {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
                   f"inventory {inventory}\n",
        "variables.json": _json({"group_vars": first.files, "variables": first.listing()}),
        "plan.json": _json(either(plan)),
        "status.json": _json(either(lambda: status_of(gathered).to_dict())),
        "preflight.json": _json(gathered.preflight.to_dict() if gathered.preflight else None),
    }
    files.update(startup_files(gathered))
    for f in gathered.facts:
        files[f"hosts/{f.host}/facts.json"] = _json(f)
    for host, reading in gathered.readings.items():
        files[f"hosts/{host}/read.json"] = _json(reading)
    if queue:
        files.update(slurm_files(gathered))
    for u in r.units:
        have = gathered.installed.get((u.host, u.unit))
        name, runs_from = launcher.bundle_names(u)   # (under Slurm no systemd unit: its container, launch script)
        base = f"hosts/{u.host}/{name}"
        if have is not None and have.unit_text is not None:
            files[f"{base}.{runs_from}"] = have.unit_text
        if have is not None and have.env_text is not None:
            files[f"{base}.env"] = have.env_text
        logs = gathered.logs.get((u.host, u.unit), {})
        job = logs.get("job", "").strip()
        for kind, text in logs.items():
            if kind == "job":
                continue
            # under Slurm: the step output and the job's own output, named by the job they come from
            files[f"{base}.{kind}-{job or 'none'}.log" if kind in ("step", "batch") else f"{base}.{kind}.log"] = text
    return {path: scrub(text, secrets) for path, text in files.items()}


def startup_files(gathered: Gathered) -> dict[str, str]:
    """Each group's starts as its revisions recorded them, phase by phase (``startup.json``: group -> revision ->
    host -> unit), and the current revision's timeline (``timeline-<group>.svg``, as ``k3deploy timeline`` draws
    it)."""
    from k3deploy.model import startup, timeline

    out: dict[str, str] = {}
    recorded = {g: {n: startup.recorded(starts) for n, starts in h.startups.items()}
                for g, h in gathered.history.items()}
    out["startup.json"] = _json({g: {str(n): {host: {unit: s.to_dict() for unit, s in units.items()}
                                             for host, units in by_host.items()} for n, by_host in revisions.items()}
                                 for g, revisions in recorded.items()})
    for g, h in gathered.history.items():
        if h.current is not None and recorded[g].get(h.current):
            out[f"timeline-{g}.svg"] = timeline.svg(timeline.timeline(g, h.current, recorded[g][h.current]))
    return out


def slurm_files(gathered: Gathered) -> dict[str, str]:
    """``k3_launcher: slurm``: the submit host's ``squeue`` as the run read it (``slurm/squeue.txt``: one line per
    job, ``JOBID NAME STATE COMMENT NODES``) and per group its job with the planned one (``slurm/jobs.json``)."""
    from k3deploy.model import slurm

    r = gathered.require_rollout()
    queue = gathered.slurm_queue
    planned = slurm.jobs(r)
    shown = slurm.queue([j.name for j in planned], r.vars.k3_slurm_user)
    lines = [f"# squeue on {r.vars.k3_slurm_submit_host}: {shown}"]
    if queue is None or queue.error is not None:
        lines.append(f"# squeue failed: {queue.error if queue is not None else 'not read'}")
    else:
        lines += [f"{q.id} {q.name} {q.state} {q.comment or '(null)'} {q.nodes}" for q in queue.jobs]
    held = slurm.group_jobs(planned, queue.jobs if queue is not None else ())
    jobs = {j.group: {"planned": {"name": j.name, "nodes": list(j.nodes), "comment": j.comment, "script": j.path},
                      "queued": {**dataclasses.asdict(held[j.group]), "shown": held[j.group].shown()}}
            for j in planned}
    return {"slurm/squeue.txt": "\n".join(lines) + "\n", "slurm/jobs.json": _json(jobs)}


@click.command("bundle")
@click.argument("inventory")
@click.option("-o", "--output", required=True, metavar="FILE.tar.gz", help="Where to write the bundle.")
@click.option("--lines", type=click.IntRange(1, 100000), default=300, show_default=True,
              help="Lines of each unit journal and container log.")
@json_option
def bundle(inventory: str, output: str, lines: int, as_json: bool) -> None:
    """Write one file to attach to a bug report: per node its facts and preflight results, the unit and env
    files as installed (secrets masked), the tail of each unit journal and container log, the status, the plan,
    the variables and the tool's version, each revision's recorded starts phase by phase (startup.json) and the
    current one's timeline (timeline-GROUP.svg). No secret goes in: env values of secret names are masked and the
    Hugging Face token's value is removed wherever it appears. Read-only on the nodes.

    \b
    Example:
      k3deploy bundle inventories/gb300.py -o k3-support.tar.gz
    """
    from importlib.metadata import version

    target = Path(output)
    if not target.parent.is_dir():
        raise K3Error(f"-o {output}: directory {target.parent} does not exist: create it or choose another path")
    from k3deploy.runtime import views

    gathered = read_cluster("bundle", inventory, view=views.bundle(lines))
    secrets = []
    token_file = gathered.target.vars.k3_hf_token_file
    if token_file and Path(token_file).is_file():
        token = Path(token_file).read_text().strip()
        if token:
            secrets.append(token)
    files = bundle_files(gathered, inventory, version("k3deploy"), secrets)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"k3deploy-bundle/{path}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp = target.with_name(target.name + ".part")
    try:
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, target)
    except OSError as exc:
        raise K3Error(f"-o {output}: cannot write: {exc.strerror}: choose a writable path") from None
    if as_json:
        echo_json({"output": output, "files": sorted(files)})
    else:
        click.echo(f"wrote {output}: {len(files)} files from {len(gathered.target.records)} host(s)")
