"""The SLO gate at work, from the control machine over the hosts' own connections (as the readiness gate).

:func:`probe` runs the probe load (:func:`k3deploy.model.commands.slo_probe`) on a group's head node through the
group's own endpoint and reads the figures (:func:`k3deploy.model.slo.parse_probe`). :func:`canary` measures the
canary groups and one replica still on the previous revision at the same time, under the same load, and judges
(:func:`k3deploy.model.slo.judge`), and with ``k3_correctness_probe`` asks each the correctness probe's questions
(:func:`answered`); :func:`single` measures one group against its previous revision's recorded
figures. :func:`go_back` takes a group back to a recorded revision: stopped (workers, then the head), its unit and
env files restored from the revision's directory on each node, started in the rendezvous order, gated on serving.
Each measured revision keeps its figures in its directory (``slo.json``), where ``k3deploy history`` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import gevent
from pyinfra import logger

from k3deploy.model import bench, commands, correctness
from k3deploy.model.revisions import GroupHistory, revisions_dir
from k3deploy.model.rollout import Rollout
from k3deploy.model.slo import (
    Figures,
    GatePlan,
    Load,
    Verdict,
    figures_record,
    judge,
    parse_probe,
    read_record,
)
from k3deploy.runtime.readiness import Failure, run, served_model, stop_group, wait_group


@dataclass
class Outcome:
    """What the gate found for one group and what it did about it."""

    group: str
    verdict: Verdict
    against: str                          # what the figures were measured against, for people
    number: int | None = None             # the revision the group was restarted with (None: not a new one)
    back_to: int | None = None            # the revision it went back to after a miss
    failure: Failure | None = None        # going back failed: the group is stopped
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    def report(self) -> str:
        lines = [self.verdict.report(self.group, self.against)]
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)


def probe(hosts: Mapping[str, Any], rollout: Rollout, group: str, load: Load) -> tuple[Figures | None, str]:
    """The probe load through ``group``'s own endpoint (its head's), from the head's node, with the ``/metrics`` of
    every serving engine of the group before and after: the figures, or None and why."""
    serving = [u for u in rollout.group(group) if u.serves]
    if not serving:
        return None, f"group {group} serves no HTTP endpoint to send the probe load to"
    head = serving[0]
    assert head.serves is not None
    text = commands.slo_probe(head.serves, [u.serves for u in serving if u.serves],
                              served_model(head, rollout.plan.model), load.requests, load.concurrency,
                              load.prompt_tokens, load.output_tokens, env_file=head.env_path)
    ok, out = run(hosts, head.host, text)
    figures, why = parse_probe(out)
    if figures is None and not ok:
        why = f"the probe failed on {head.host}: {why}"
    return figures, why


def _measure(hosts: Mapping[str, Any], rollout: Rollout, groups: list[str],
             load: Load) -> dict[str, tuple[Figures | None, str]]:
    """:func:`probe` of every one of ``groups`` at once (each from its own head node)."""
    jobs = {g: gevent.spawn(probe, hosts, rollout, g, load) for g in groups}
    gevent.joinall(list(jobs.values()))
    return {g: (job.value if job.successful() else (None, f"the probe raised {job.exception!r}"))
            for g, job in jobs.items()}


def _unmeasured(why: str, load: Load) -> Figures:
    """The figures of a group the probe could not measure: every request counts as failed."""
    return Figures(requests=load.requests, failed=load.requests, ttft_p95_ms=None, itl_p95_ms=None,
                   errors=(why[:200],))


def recorded(history: GroupHistory | None, load: Load | None = None) -> Figures | None:
    """The figures the gate recorded for ``history``'s current revision (None: none); with ``load``
    (``k3_slo_baseline: bench``), its last benchmark's at the concurrency nearest the load's, where it has one."""
    if history is None or history.current is None:
        return None
    kept = bench.Record.from_json(history.benches.get(history.current, "")) if load is not None else None
    if kept is not None and load is not None and (figures := bench.baseline(kept, load.concurrency, load.requests)):
        return figures
    if history.current not in history.figures:
        return None
    return read_record(history.figures[history.current])[0]


def _bench_load(rollout: Rollout, gate: GatePlan) -> Load | None:
    return gate.load if rollout.vars.k3_slo_baseline == "bench" else None


def canary(hosts: Mapping[str, Any], rollout: Rollout, gate: GatePlan, numbers: Mapping[str, int],
           history: Mapping[str, GroupHistory]) -> list[Outcome]:
    """Measure the canary groups and the baseline replica at once, under the same load, each through its own
    endpoint, and judge each canary against the baseline (against its previous revision's recorded figures when
    no replica stays on the previous revision, or when the baseline could not be measured). Each measured revision
    keeps its figures."""
    groups = [*gate.groups, *([gate.baseline] if gate.baseline else [])]
    measured = _measure(hosts, rollout, groups, gate.load)
    base: Figures | None = None
    against = "its previous revision's recorded figures"
    notes: list[str] = []
    if gate.baseline is not None:
        base, why = measured[gate.baseline]
        if base is not None and base.failed == 0:
            against = f"{gate.baseline}, still on the previous revision, under the same load"
            baseline_number = history[gate.baseline].current if gate.baseline in history else None
            if baseline_number is not None:
                keep(hosts, rollout, gate.baseline, baseline_number, base, gate.load, None)
        else:
            notes.append(f"{gate.baseline} (the baseline) could not be measured ("
                         f"{why or (base.line() if base else 'no figures')}): judged against the recorded figures "
                         "and the absolute targets")
            base = None
    out = []
    for g in gate.groups:
        figures, why = measured[g]
        fallback = recorded(history.get(g), _bench_load(rollout, gate))
        verdict = judge(figures or _unmeasured(why, gate.load), base if base is not None else fallback,
                        gate.targets)
        verdict = answered(hosts, rollout, g, verdict)
        outcome = Outcome(g, verdict, against if base is not None or fallback is not None else "the absolute targets",
                          numbers.get(g), notes=list(notes))
        outcome.notes.append(f"canary {g}: {verdict.figures.line()}")
        if base is not None and gate.baseline is not None:
            outcome.notes.append(f"baseline {gate.baseline}: {base.line()}")
        if outcome.number is not None:
            keep(hosts, rollout, g, outcome.number, verdict.figures, gate.load, verdict)
        out.append(outcome)
    return out


def single(hosts: Mapping[str, Any], rollout: Rollout, gate: GatePlan, group: str, number: int | None,
           history: GroupHistory | None) -> Outcome:
    """Measure one restarted group and judge it against its previous revision's recorded figures (and the absolute
    targets); the figures are kept with the revision it runs."""
    figures, why = probe(hosts, rollout, group, gate.load)
    base = recorded(history, _bench_load(rollout, gate))
    previous = history.current if history is not None else None
    verdict = answered(hosts, rollout, group, judge(figures or _unmeasured(why, gate.load), base, gate.targets))
    against = (f"revision {previous}'s {'benchmark' if base.source == 'bench' else 'recorded figures'}"
               if base is not None else
               "the absolute targets (no figures recorded for the previous revision)")
    outcome = Outcome(group, verdict, against, number, notes=[f"{group}: {verdict.figures.line()}"])
    if number is not None:
        keep(hosts, rollout, group, number, verdict.figures, gate.load, verdict)
    return outcome


def answered(hosts: Mapping[str, Any], rollout: Rollout, group: str, verdict: Verdict) -> Verdict:
    """With ``k3_correctness_probe``, the correctness probe's questions through ``group``'s own endpoint, from its
    head's node: a wrong answer (or none) makes ``verdict`` a miss, with a line naming the prompt, the expected answer
    and the one given (:mod:`k3deploy.model.correctness`)."""
    serving = [u for u in rollout.group(group) if u.serves]
    if not rollout.vars.k3_correctness_probe or not serving:
        return verdict
    head = serving[0]
    assert head.serves is not None
    ok, out = run(hosts, head.host, commands.correctness_probe(head.serves, served_model(head, rollout.plan.model),
                                                              env_file=head.env_path))
    answers, why = correctness.parse(out)
    lines = correctness.report(f"group {group}", correctness.judge(answers) if answers is not None else [],
                               why or ("" if ok else f"the probe failed on {head.host}"))
    if not lines:
        return replace(verdict, lines=(*verdict.lines, f"correctness probe: {len(correctness.PROMPTS)} of "
                                                      f"{len(correctness.PROMPTS)} known answers: hit"))
    return replace(verdict, ok=False, lines=(*verdict.lines, lines[0] + ": miss"))


def keep(hosts: Mapping[str, Any], rollout: Rollout, group: str, number: int, figures: Figures, load: Load,
         verdict: Verdict | None) -> None:
    """Record ``figures`` in revision ``number``'s directory of ``group`` on each of its nodes (``slo.json``)."""
    record = figures_record(figures, load, verdict, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    text = commands.record_figures(revisions_dir(rollout.vars.k3_config_dir, group), number, record)
    jobs = [gevent.spawn(run, hosts, h, text) for h in dict.fromkeys(u.host for u in rollout.group(group))]
    gevent.joinall(jobs)
    for job in jobs:
        if not (job.successful() and job.value[0]):
            logger.warning(f"k3deploy: the SLO figures of group {group} revision {number} were not kept on every "
                           "node (k3deploy history shows them where they were)")
            return


def go_back(hosts: Mapping[str, Any], rollout: Rollout, group: str, number: int) -> Failure | None:
    """Take ``group`` back to its recorded revision ``number``: stop it (workers, then the head), put the revision's
    unit and env files back on each node, start the heads, then each worker once its head's rendezvous port
    accepts connections, and wait until it serves (:func:`~k3deploy.runtime.readiness.wait_group`). Returns the
    failure that stopped it, or None once it serves."""
    units = rollout.group(group)
    stop_group(hosts, units)
    kept = f"{revisions_dir(rollout.vars.k3_config_dir, group)}/{int(number)}"
    per_host: dict[str, list[tuple[str, str]]] = {}
    for u in units:
        for live in (u.unit_path, u.env_path):
            per_host.setdefault(u.host, []).append((f"{kept}/{live.rsplit('/', 1)[-1]}", live))
    jobs = {h: gevent.spawn(run, hosts, h, commands.restore_files(pairs)) for h, pairs in per_host.items()}
    gevent.joinall(list(jobs.values()))
    for h, job in jobs.items():
        ok, out = job.value if job.successful() else (False, repr(job.exception))
        if not ok:
            unit = next(u for u in units if u.host == h)
            return Failure(unit, "going back to the previous revision", out.strip()[-300:] or "the copy failed",
                           f"the files of revision {number} in {kept}")
    heads = [u for u in units if u.is_group_head]
    workers = [u for u in units if not u.is_group_head]
    for u in heads:
        ok, out = run(hosts, u.host, commands.start_units([u.unit]))
        if not ok:
            return Failure(u, "going back to the previous revision", out.strip()[-300:], f"{u.unit} starts")
    timeout = rollout.vars.k3_rendezvous_timeout
    started = {u.host + u.unit: gevent.spawn(run, hosts, u.host, "\n".join(
        [*([commands.wait_tcp(u.join[0], u.join[1], timeout)] if u.join else []), commands.start_units([u.unit])]))
        for u in workers}
    gevent.joinall(list(started.values()))
    for u in workers:
        job = started[u.host + u.unit]
        ok, out = job.value if job.successful() else (False, repr(job.exception))
        if not ok:
            stop_group(hosts, units)
            return Failure(u, "going back to the previous revision", out.strip()[-300:], f"{u.unit} starts")
    return wait_group(rollout, group, hosts, phase="going back to the previous revision")
