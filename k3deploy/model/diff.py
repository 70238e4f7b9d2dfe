"""What a rollout would change, per host: image, container argv, env file, unit file and restarts.

Pure: it compares the rollout (what ``deploy/k3.py`` would write) with what is installed on the hosts
(read by ``k3deploy plan``). The same :func:`k3deploy.model.rollout.mark_changes` decides what restarts, so the
plan and the rollout cannot disagree.

Example::

    >>> from k3deploy.model.diff import argv_lines
    >>> argv_lines(["/usr/bin/docker", "run", "--rm", "--name", "k3", "img:1", "m", "--tp", "8", "--x"])
    ['/usr/bin/docker run', '--rm', '--name k3', 'image img:1', 'm', '--tp 8', '--x']
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from k3deploy.model import steps, vip
from k3deploy.model.hosttext import exec_start, launch_argv, parse_env
from k3deploy.model.images import shown
from k3deploy.model.observed import ENV_MODE, TOKEN_MODE, UNIT_MODE, Installed, token_path
from k3deploy.model.rollout import Rollout, UnitWork, mark_changes, sha256
from k3deploy.model.secrets import mask_value
from k3deploy.model.slurm import QueuedJob, SlurmJob, job_actions, launch_command, launch_path, launch_script
from k3deploy.model.units import GROUP_MEMBER, group_member_text

#: ``docker run`` options that take a value (the rest are flags); ``--opt=value`` forms are one token
DOCKER_VALUE_OPTIONS = frozenset({
    "--name", "--network", "--net", "--ipc", "--pid", "--uts", "--env-file", "-e", "--env", "--gpus",
    "--shm-size", "-v", "--volume", "--mount", "--device", "--cap-add", "--cap-drop", "--ulimit",
    "--group-add", "--security-opt", "--entrypoint", "-u", "--user", "-w", "--workdir", "-p", "--publish",
    "-l", "--label", "--runtime", "--hostname", "-h", "--platform", "--memory", "-m", "--cpus",
    "--restart", "--log-driver", "--log-opt", "--stop-timeout", "--tmpfs", "--add-host", "--pull",
})


# ------------------------------------------------------------------------------ a container command


def _docker_split(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """``docker run`` argv -> (docker part, image, container args). A non-docker argv has no image."""
    if len(argv) < 2 or argv[1] != "run":
        return argv, None, []
    i = 2
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("-") or tok == "-":
            return argv[:i], tok, argv[i + 1:]
        i += 2 if (tok in DOCKER_VALUE_OPTIONS and "=" not in tok) else 1
    return argv, None, []


def image_of(argv: list[str] | None) -> str | None:
    """The container image of a ``docker run`` argv."""
    if not argv:
        return None
    return _docker_split(argv)[1]


def _group_flags(args: list[str], value_options: frozenset[str] | None = None) -> list[str]:
    """One line per flag with its values (``--tp 8``); positional words on their own line."""
    lines: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok.startswith("-") and tok != "-":
            if value_options is not None:
                take = 1 if (tok in value_options and "=" not in tok) else 0
            else:  # engine flags: every following word that is not itself a flag
                take = 0
                while i + 1 + take < len(args) and not _is_flag(args[i + 1 + take]):
                    take += 1
            lines.append(" ".join([tok, *args[i + 1:i + 1 + take]]))
            i += 1 + take
        else:
            lines.append(tok)
            i += 1
    return lines


def _is_flag(tok: str) -> bool:
    if not tok.startswith("-") or tok == "-":
        return False
    try:
        float(tok)  # a negative number is a value
        return False
    except ValueError:
        return True


def argv_lines(argv: list[str] | None) -> list[str]:
    """A container command as lines: ``docker run``, one docker option per line, the image, then the engine's
    own arguments, one flag with its values per line."""
    if not argv:
        return []
    docker, image, rest = _docker_split(argv)
    if image is None:
        return [argv[0], *_group_flags(argv[1:])]
    return [f"{docker[0]} run", *_group_flags(docker[2:], DOCKER_VALUE_OPTIONS), f"image {image}",
            *_group_flags(rest)]


# ---------------------------------------------------------------------------------- diffs


def line_diff(old: list[str], new: list[str]) -> list[tuple[str, str]]:
    """(``+``/``-``, line) for each line removed or added, in order; a line both removed and added (a flag that
    only changed its place) is one (``moved``, line) where it is added.

    >>> line_diff(["--a 1", "--b 2", "--c"], ["--b 2", "--a 1", "--c", "--d"])
    [('moved', '--b 2'), ('+', '--d')]
    """
    raw: list[tuple[str, str]] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            raw += [("-", x) for x in old[i1:i2]]
        if tag in ("replace", "insert"):
            raw += [("+", x) for x in new[j1:j2]]
    removed = Counter(x for op, x in raw if op == "-")
    added = Counter(x for op, x in raw if op == "+")
    skip, mark = removed & added, removed & added
    out: list[tuple[str, str]] = []
    for op, x in raw:
        if op == "-" and skip[x] > 0:
            skip[x] -= 1
        elif op == "+" and mark[x] > 0:
            mark[x] -= 1
            out.append(("moved", x))
        else:
            out.append((op, x))
    return out


def env_diff(old_text: str | None, new_text: str | Mapping[str, str]) -> list[dict[str, Any]]:
    """Per variable: added, removed or changed, with secret values masked (``new_text``: an env file, or the
    planned settings themselves)."""
    old, new = parse_env(old_text), (parse_env(new_text) if isinstance(new_text, str) else new_text)
    out: list[dict[str, Any]] = []
    for name, value in new.items():
        if name not in old:
            out.append({"op": "+", "name": name, "from": None, "to": mask_value(name, value)})
        elif old[name] != value:
            out.append({"op": "~", "name": name, "from": mask_value(name, old[name]), "to": mask_value(name, value)})
    for name, value in old.items():
        if name not in new:
            out.append({"op": "-", "name": name, "from": mask_value(name, value), "to": None})
    return out


def _unit_other_lines(text: str | None) -> list[str]:
    return [ln for ln in (text or "").splitlines() if not ln.startswith("ExecStart=")]


# ------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class HostPlan:
    """What changes on one host (its first unit's role and rank), in order; built whole (:func:`host_plans`)."""

    host: str
    role: str
    rank: int
    changes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "role": self.role, "rank": self.rank, "changes": self.changes}


def host_plans(rollout: Rollout, changes: Mapping[str, Sequence[dict[str, Any]]]) -> list[HostPlan]:
    """Each host of ``rollout`` in order, with its ``changes`` (host -> its changes, in order; none where absent).

    >>> from types import SimpleNamespace as N
    >>> units = [N(host="n1", node=N(role="head"), rank=0), N(host="n1", node=N(role="head"), rank=0),
    ...          N(host="n2", node=N(role="worker"), rank=1)]
    >>> [(h.host, h.rank, h.changes) for h in host_plans(N(units=units), {"n2": [{"kind": "restart"}]})]
    [('n1', 0, []), ('n2', 1, [{'kind': 'restart'}])]
    """
    first: dict[str, UnitWork] = {}
    for u in rollout.units:
        first.setdefault(u.host, u)
    return [HostPlan(host=h, role=u.node.role, rank=u.rank, changes=list(changes.get(h, ())))
            for h, u in first.items()]


@dataclass(frozen=True)
class PlanReport:
    hosts: list[HostPlan]
    restart_order: list[str]
    endpoint: str
    notes: list[str] = field(default_factory=list)
    staging: list[str] = field(default_factory=list)   # what the stage still has to bring (empty: nothing)
    steps: list[list[str]] = field(default_factory=list)  # a rolling change: the replicas restarted in each step
    router_missing: list[str] = field(default_factory=list)  # replicas that serve but the router leaves out
    jobs: list[dict[str, Any]] | None = None   # k3_launcher: slurm: per group, what happens to its job (None: systemd)
    gate: list[str] = field(default_factory=list)   # the SLO gate the restart gets, for people (empty: none)

    @property
    def has_changes(self) -> bool:
        return bool(self.restart_order) or any(h.changes for h in self.hosts) or bool(self.staging) \
            or bool(self.router_missing)

    @property
    def exit_code(self) -> int:
        """Like ``terraform plan -detailed-exitcode``: 0 nothing to do, 3 changes pending (2 is an error)."""
        return 3 if self.has_changes else 0

    def to_dict(self) -> dict[str, Any]:
        out = {"hosts": [h.to_dict() for h in self.hosts], "restart_order": self.restart_order,
               "endpoint": self.endpoint, "changes_pending": self.has_changes, "notes": self.notes,
               "staging": self.staging, "rolling_steps": self.steps, "router_missing": self.router_missing}
        if self.jobs is not None:
            out["launcher"], out["jobs"] = "slurm", self.jobs
        return out


def _argv_changes(old_argv: list[str] | None, new_argv: list[str] | None) -> list[dict[str, Any]]:
    """The container command's changes: the image (kind ``image``), then the flags one per line (kind ``argv``)."""
    changes: list[dict[str, Any]] = []
    old_image, new_image = image_of(old_argv), image_of(new_argv)
    if old_image != new_image:
        changes.append({"kind": "image", "from": old_image, "to": new_image})
    for op, line in line_diff(argv_lines(old_argv), argv_lines(new_argv)):
        if line.startswith("image ") and old_image != new_image:
            continue  # shown as the image change
        changes.append({"kind": "argv", "op": op, "line": line})
    return changes


def unit_file_changes(old_text: str | None, new_text: str, new_argv: list[str] | None = None) -> list[dict[str, Any]]:
    """A unit file's changes as people read them: the image, the container argv one flag per line, the other
    unit lines. ``new_argv``: the planned ``ExecStart=`` words (:meth:`~k3deploy.model.units.UnitSpec.exec_words`);
    without it they are read from ``new_text``, a file not rendered here."""
    changes = _argv_changes(exec_start(old_text), exec_start(new_text) if new_argv is None else new_argv)
    for op, line in line_diff(_unit_other_lines(old_text), _unit_other_lines(new_text)):
        changes.append({"kind": "unit", "op": op, "line": line})
    return changes


def env_file_changes(old_text: str | None, new_text: str | Mapping[str, str]) -> list[dict[str, Any]]:
    """An env file's changes per variable, secret values masked."""
    return [{"kind": "env", **d} for d in env_diff(old_text, new_text)]


def change_lines(changes: list[dict[str, Any]], indent: str = "") -> list[str]:
    """Changes of one file as lines: ``image: a -> b``, ``+ --flag value``, ``~ NAME: a -> b``, ..."""
    out: list[str] = []
    for c in changes:
        if c["kind"] == "image":
            out.append(f"{indent}image: {_show(c['from'])} -> {_show(c['to'])}")
        elif c["kind"] in ("argv", "unit"):
            out.append(f"{indent}> {c['line']} (moved)" if c["op"] == "moved" else f"{indent}{c['op']} {c['line']}")
        elif c["kind"] == "env":
            if c["op"] == "~":
                out.append(f"{indent}~ {c['name']}: {c['from']} -> {c['to']}")
            elif c["op"] == "+":
                out.append(f"{indent}+ {c['name']}={c['to']}")
            else:
                out.append(f"{indent}- {c['name']}={c['from']}")
    return out


def planned_exec(work: UnitWork) -> list[str] | None:
    """The ``ExecStart=`` words a unit is to run: its spec's, or those of the unit file it keeps (read from a
    host)."""
    if work.kept_unit_text is not None:
        return exec_start(work.kept_unit_text)
    return work.spec.unit.exec_words() if work.spec is not None else None


def planned_env(work: UnitWork) -> dict[str, str]:
    """The env file's settings a unit is to have: its spec's, or those of the env file it keeps (read from a
    host)."""
    if work.kept_env_text is not None:
        return parse_env(work.kept_env_text)
    return work.spec.env_map if work.spec is not None else {}


def planned_command(work: UnitWork) -> list[str] | None:
    """The command a unit's launch script runs: its spec's, or that of the script it keeps (read from a host)."""
    if work.launch_text is not None:
        return _launch_argv(work.launch_text)
    return work.spec.command if work.spec is not None else None


def unit_changes(work: UnitWork, have: Installed) -> list[dict[str, Any]]:
    """The changes of one unit: new files, image, argv lines, other unit lines, env variables."""
    changes: list[dict[str, Any]] = []
    if have.unit_sha != sha256(work.unit_text):
        if have.unit_text is None:
            changes.append({"kind": "file", "unit": work.unit, "path": work.unit_path, "op": "create"})
        changes += [{**c, "unit": work.unit}
                    for c in unit_file_changes(have.unit_text, work.unit_text, planned_exec(work))]
    if have.env_sha != sha256(work.env_text):
        if have.env_text is None:
            changes.append({"kind": "file", "unit": work.unit, "path": work.env_path, "op": "create"})
        changes += [{**c, "unit": work.unit} for c in env_file_changes(have.env_text, planned_env(work))]
    return changes


def file_drift(work: UnitWork, have: Installed, token: str | None = None) -> list[dict[str, Any]]:
    """The unit's files (and, with ``token``, the host's token file) whose owner or mode is not what they must be
    (:data:`~k3deploy.model.observed.UNIT_MODE`, ...): a change the deploy makes without a restart.

        >>> from k3deploy.model.observed import FileMeta
        >>> from types import SimpleNamespace as N
        >>> u = N(unit="k3-engine.service", unit_path="/etc/systemd/system/k3-engine.service", env_path="/e/k3.env")
        >>> file_drift(u, Installed(env_meta=FileMeta(1000, 0, "644")))[0]["text"]
        'env file /e/k3.env mode 0644 owner 1000, required 0600 root'
    """
    out: list[dict[str, Any]] = []
    for what, path, meta, mode in (("unit file", work.unit_path, have.unit_meta, UNIT_MODE),
                                   ("env file", work.env_path, have.env_meta, ENV_MODE),
                                   ("token file", token, have.token_meta, TOKEN_MODE)):
        drift = meta.drift(mode) if meta is not None and path else None
        if meta is not None and drift is not None:
            out.append({"kind": "drift", "unit": work.unit, "path": path, "file": what,
                        "mode": f"{int(meta.mode, 8):04o}",
                        "owner": meta.uid, "group": meta.gid, "required": f"{int(mode, 8):04o} root",
                        "text": f"{what} {path} {drift}"})
    return out


def _reason(work: UnitWork, have: Installed, changed_here: bool) -> str:
    if changed_here:
        return "its files change"
    if not have.running:
        return f"not running ({have.active})"
    if have.restarts > 0:
        return f"restarted {have.restarts} time(s) by systemd since it was started: its group may be wedged"
    if have.answers is False:
        return "running, but /health does not answer 200"
    return f"group {work.group} restarts"


def build(rollout: Rollout, installed: dict[tuple[str, str], Installed],
          helpers: Mapping[str, str | None] | None = None) -> PlanReport:
    """Compare the rollout with the installed state ``(host, unit) -> Installed`` (and ``helpers``: host -> sha256
    of its :data:`~k3deploy.model.units.GROUP_MEMBER`, when read); what restarts is decided exactly as the deploy
    decides it (:func:`~k3deploy.model.rollout.mark_changes`)."""
    rollout = rollout.decided(mark_changes(rollout, installed))
    order = steps.start_order(rollout)
    hosts: dict[str, list[dict[str, Any]]] = {}
    helper = sha256(group_member_text())
    for u in rollout.units:
        have = installed.get((u.host, u.unit), Installed())
        changes_here = hosts.setdefault(u.host, [])
        if helpers is not None and u.group != "router" and u.host in helpers and helpers[u.host] != helper \
                and not any(c["kind"] == "file" and c["path"] == GROUP_MEMBER for c in changes_here):
            changes_here.append({"kind": "file", "unit": u.unit, "path": GROUP_MEMBER,
                                 "op": "create" if helpers[u.host] is None else "modify"})
        changes = unit_changes(u, have)
        changes_here += changes
        token = token_path(rollout.vars.k3_config_dir) if rollout.vars.k3_hf_token_file else None
        if any(c["kind"] == "drift" and c["path"] == token for c in changes_here):
            token = None   # one token file per host, read with each of its engine units
        changes_here += file_drift(u, have, token)
        key = f"{u.host}:{u.unit}"
        if key in order:
            changes_here.append({"kind": "restart", "unit": u.unit, "position": order.index(key) + 1,
                                 "group": u.group, "reason": _reason(u, have, bool(changes))})
    notes = [rollout.how_changes_roll(), *filter(None, [vip.describe(rollout)])]
    missing = rollout.missing_from_router()
    notes += [f"{g} serves but the router leaves it out: the run puts it back into the router" for g in missing]
    return PlanReport(hosts=host_plans(rollout, hosts), restart_order=order, endpoint=rollout.endpoint, notes=notes,
                      steps=rollout.waves() if rollout.rolling else [], router_missing=missing)


# ------------------------------------------------------------------------------ the plan under Slurm


def _launch_argv(text: str | None) -> list[str] | None:
    try:
        return launch_argv(text) if text else None
    except ValueError:
        return None


def launch_file_changes(old_text: str | None, new_text: str,
                        new_argv: list[str] | None = None) -> list[dict[str, Any]]:
    """A launch script's changes as people read them: the image, the command one flag per line, the other lines
    (kind ``launch``). ``new_argv``: the planned command (:func:`planned_command`); without it, read from
    ``new_text``, a script not rendered here.

    >>> old = "#!/bin/bash\\nexec /usr/local/bin/vllm-router --port 30000\\n"
    >>> [c["line"] for c in launch_file_changes(old, old.replace("30000", "30001"))]
    ['--port 30000', '--port 30001']
    """
    changes = _argv_changes(_launch_argv(old_text), _launch_argv(new_text) if new_argv is None else new_argv)

    def others(text: str | None) -> list[str]:   # every line but the command's
        return [ln for ln in (text or "").splitlines()
                if not (ln.startswith("exec ") or (ln.endswith(" &") and not ln.startswith("#")))]

    for op, line in line_diff(others(old_text), others(new_text)):
        changes.append({"kind": "launch", "op": op, "line": line})
    return changes


def build_jobs(rollout: Rollout, installed: Mapping[tuple[str, str], Installed], jobs: list[SlurmJob],
               queued: list[QueuedJob], changed: Set[str], start: steps.StartSteps) -> PlanReport:
    """The plan under ``k3_launcher: slurm``: per unit its launch script and env file against what its node holds
    (``installed``: under Slurm a unit's file is its launch script), per group what happens to its job (keep,
    submit, or replace: the queued job ids cancelled first), from the queue the submit host read (``queued``) and
    the groups the deploy would resubmit (``changed``: :meth:`k3deploy.runtime.launchers.Slurm.changes`), in the
    order its ``start`` steps submit them (:func:`k3deploy.model.steps.start_order`)."""
    rollout = rollout.decided(changed)
    order = steps.start_order(rollout, start)
    decisions = {d.group: d for d in job_actions(jobs, queued)}
    rows: list[dict[str, Any]] = []
    for job in jobs:
        d = decisions[job.group]
        mine = [q for q in queued if q.name == job.name]
        action, why = d.action, d.why
        if job.group in changed and action == "keep":
            action = "replace"
            why = (f"{why}, but the engine groups it fronts are resubmitted" if job.group == "router" else
                   f"{why}, but a serving node of the group does not answer /health")
        rows.append({"group": job.group, "job": job.name, "action": action if job.group in changed else "keep",
                     "cancel": [q.id for q in mine] if action == "replace" else [],
                     "queued": [{"id": q.id, "state": q.state, "comment": q.comment} for q in mine],
                     "nodes": list(job.nodes), "comment": job.comment, "why": why})
    reasons = {r["group"]: r["why"] for r in rows}
    hosts: dict[str, list[dict[str, Any]]] = {}
    for u in rollout.units:
        have = installed.get((u.host, u.unit), Installed())
        changes_here = hosts.setdefault(u.host, [])
        script, path = launch_script(rollout, u), launch_path(rollout, u)
        if have.unit_sha != sha256(script):
            if have.unit_text is None:
                changes_here.append({"kind": "file", "unit": u.unit, "path": path, "op": "create"})
            changes_here += [{**c, "unit": u.unit}
                             for c in launch_file_changes(have.unit_text, script, launch_command(rollout, u))]
        if have.env_sha != sha256(u.env_text):
            if have.env_text is None:
                changes_here.append({"kind": "file", "unit": u.unit, "path": u.env_path, "op": "create"})
            changes_here += [{**c, "unit": u.unit} for c in env_file_changes(have.env_text, planned_env(u))]
        key = f"{u.host}:{u.unit}"
        if key in order:
            changes_here.append({"kind": "restart", "unit": u.unit, "position": order.index(key) + 1,
                                 "group": u.group, "reason": reasons.get(u.group, "its group's job is resubmitted")})
    notes = [rollout.how_changes_roll(), *filter(None, [vip.describe(rollout)])]
    missing = rollout.missing_from_router()
    notes += [f"{g} serves but the router leaves it out: the run puts it back into the router" for g in missing]
    return PlanReport(hosts=host_plans(rollout, hosts), restart_order=order, endpoint=rollout.endpoint, notes=notes,
                      steps=rollout.waves() if rollout.rolling else [], router_missing=missing, jobs=rows)


def render_jobs_text(report: PlanReport, rollout: Rollout) -> str:
    """The plan under Slurm for people: per host its units' launch script and env changes, then per group what
    happens to its job on ``k3_slurm_submit_host``, in submit order."""
    lines: list[str] = []
    for hp in report.hosts:
        lines.append(f"{hp.host}: {hp.role} rank {hp.rank}")
        for u in rollout.on_host(hp.host):
            mine = [c for c in hp.changes if c["unit"] == u.unit]
            lines.append(f"  {u.unit} ({u.node.role} rank {u.rank}, group {u.group}; its job's step)")
            image = next((c for c in mine if c["kind"] == "image"), None)
            planned = image_of(launch_command(rollout, u))
            if image is not None:
                lines += change_lines([image], "    ")
            elif planned:
                lines.append(f"    image: {shown(planned)} (unchanged)")
            for c in mine:
                if c["kind"] == "file":
                    lines.append(f"    {'new' if c['op'] == 'create' else 'changed'} file: {c['path']}")
            for kind, title in (("argv", "argv:"), ("launch", f"launch script {launch_path(rollout, u)}:"),
                                ("env", f"env {u.env_path}:")):
                some = [c for c in mine if c["kind"] == kind]
                if some:
                    lines.append(f"    {title}")
                    lines += change_lines([{**c, "kind": "unit"} if kind == "launch" else c for c in some], "      ")
            if not mine:
                lines.append("    no changes")
    lines += ["", f"Jobs, on {rollout.vars.k3_slurm_submit_host} (in submit order):"]
    for row in report.jobs or []:
        queued = ", ".join(f"job {q['id']} {q['state']}" for q in row["queued"]) or "none queued"
        if row["action"] == "keep":
            lines.append(f"  {row['group']}: keep {queued} ({row['job']}, {row['comment']})")
        elif row["action"] == "submit":
            lines.append(f"  {row['group']}: submit {row['job']} on {','.join(row['nodes'])} ({row['comment']}): "
                         f"{row['why']}")
        else:
            lines.append(f"  {row['group']}: replace: cancel job {', '.join(row['cancel'])}, then submit "
                         f"{row['job']} on {','.join(row['nodes'])} ({row['comment']}): {row['why']}")
    if report.steps:
        lines.append("Replica by replica behind the router (the endpoint keeps serving): "
                     + "; ".join(f"step {i}: {', '.join(w)}" for i, w in enumerate(report.steps, 1)))
    lines.append("")
    if report.staging:
        lines.append("Stage (before any job is submitted):")
        lines += [f"  {line}" for line in report.staging]
        lines.append("")
    for note in report.notes:
        lines.append(f"note: {note}")
    n_hosts = len([h for h in report.hosts if h.changes])
    n_jobs = len([r for r in report.jobs or [] if r["action"] != "keep"])
    lines.append(f"Plan: {n_hosts} of {len(report.hosts)} host(s) change, {n_jobs} job(s) submitted."
                 if report.has_changes else "No changes: every group's job runs the planned revision.")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ rendering


def _show(value: str | None) -> str:
    """An image of a change as people read it (:func:`~k3deploy.model.images.shown`)."""
    return "(none)" if value is None else str(shown(value))


def render_text(report: PlanReport, rollout: Rollout) -> str:
    """The plan for people: per host its units, image now -> planned, argv, unit and env changes, restarts."""
    lines: list[str] = []
    for hp in report.hosts:
        lines.append(f"{hp.host}: {hp.role} rank {hp.rank}")
        for u in rollout.on_host(hp.host):
            mine = [c for c in hp.changes if c["unit"] == u.unit]
            lines.append(f"  {u.unit} ({u.node.role} rank {u.rank}, group {u.group})")
            image = next((c for c in mine if c["kind"] == "image"), None)
            planned = image_of(planned_exec(u))
            if image is not None:
                lines += change_lines([image], "    ")
            elif planned:
                lines.append(f"    image: {shown(planned)} (unchanged)")
            for c in mine:
                if c["kind"] == "file":
                    lines.append(f"    {'new' if c['op'] == 'create' else 'changed'} file: {c['path']}")
                elif c["kind"] == "drift":
                    lines.append(f"    {c['text']} (no restart for it)")
            for kind, title in (("argv", "argv:"), ("unit", f"unit {u.unit_path}:"), ("env", f"env {u.env_path}:")):
                some = [c for c in mine if c["kind"] == kind]
                if some:
                    lines.append(f"    {title}")
                    lines += change_lines(some, "      ")
            restart = next((c for c in mine if c["kind"] == "restart"), None)
            if restart is not None:
                lines.append(f"    restart: #{restart['position']} ({restart['reason']})")
            elif not mine:
                lines.append("    no changes")
    lines.append("")
    if report.staging:
        lines.append("Stage (before anything restarts):")
        lines += [f"  {line}" for line in report.staging]
        lines.append("")
    restarting = {u.group for u in rollout.units if f"{u.host}:{u.unit}" in report.restart_order}
    phases = steps.order(rollout, steps.start_of(rollout, restarting))
    if report.steps:
        lines.append("Restart, replica by replica behind the router (the endpoint keeps serving):")
        for i, wave in enumerate(report.steps, 1):
            lines.append(f"  step {i} of {len(report.steps)}: {', '.join(wave)}: out of the router, in-flight "
                         "requests finish, then")
            lines += [f"    {j}. {name}: {'; '.join(items)}"
                      for j, (name, items) in enumerate(steps.order(rollout, steps.start_of(rollout, wave)), 1)]
            lines.append("    then back into the router; the next step starts once it serves")
    elif phases:
        lines.append("Restart, in this order (each phase on its hosts at once):")
        lines += [f"  {i}. {name}: {'; '.join(items)}" for i, (name, items) in enumerate(phases, 1)]
    else:
        lines.append("Restart: nothing restarts")
    if report.gate:
        lines.append("SLO gate (docs/gate.md):")
        lines += [f"  {line}" for line in report.gate]
    for note in report.notes:
        lines.append(f"note: {note}")
    n_hosts = len([h for h in report.hosts if h.changes])
    lines.append(f"Plan: {n_hosts} of {len(report.hosts)} host(s) change, {len(report.restart_order)} service(s) "
                 f"restart." if report.has_changes else "No changes: the cluster runs the planned version.")
    return "\n".join(lines) + "\n"
