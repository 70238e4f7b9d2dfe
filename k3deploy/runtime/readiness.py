"""Readiness gates run from the control machine over the hosts' own connections.

A group's head host runs :func:`wait_group` (through ``python.call``): it polls every serving node's
``/health`` and ``/v1/models`` *from that node*, and every node's unit, until all serve or one fails. A node
that fails (unit failed or restarting, container gone, ``/health`` 503) or the deadline stops the whole
group, and the report names the node, the phase, what was observed and what was required, with the tail of
its unit journal and container log.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent
from pyinfra import logger

from k3deploy.cluster.rollout import Rollout, UnitWork


@dataclass
class Failure:
    unit: UnitWork
    phase: str
    observed: str
    required: str
    logs: str = ""

    def report(self) -> str:
        u = self.unit
        head = (f"{u.node.role} rank {u.rank} on {u.host} ({u.node.address}) failed during {self.phase}: "
                f"observed {self.observed}; required {self.required}")
        return head + ("\n" + self.logs if self.logs else "")


def _run(hosts: dict[str, Any], name: str, script: str) -> tuple[bool, str]:
    ok, out = hosts[name].run_shell_command(f"sh -c {shlex.quote(script)}", print_output=False, print_input=False)
    text = "\n".join(getattr(out, "stdout_lines", []) or [])
    return bool(ok), text


def unit_status(hosts: dict[str, Any], u: UnitWork) -> dict[str, str]:
    ok, text = _run(hosts, u.host, f"systemctl show --property=ActiveState,SubState,NRestarts,Result {shlex.quote(u.unit)}")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def http_code(hosts: dict[str, Any], u: UnitWork, path: str) -> str:
    ok, text = _run(hosts, u.host, f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' {shlex.quote(u.serves + path)} || true")
    return text.strip()[-3:] or "000"


def logs(hosts: dict[str, Any], u: UnitWork, docker: str, lines: int = 25) -> str:
    script = (f"echo '--- journalctl -u {u.unit} (last {lines} lines)'; "
              f"journalctl -u {shlex.quote(u.unit)} -n {lines} --no-pager 2>&1 | tail -n {lines}; ")
    if u.group != "router":
        script += (f"echo '--- {docker} logs --tail {lines} {u.container}'; "
                   f"{shlex.quote(docker)} logs --tail {lines} {shlex.quote(u.container)} 2>&1 | tail -n {lines}")
    _, text = _run(hosts, u.host, script)
    return text


def stop_group(hosts: dict[str, Any], units: list[UnitWork]) -> None:
    """Workers first, then the head (vLLM does not stop headless ranks when their head dies)."""
    for u in sorted(units, key=lambda x: -x.rank):
        _run(hosts, u.host, f"systemctl stop {shlex.quote(u.unit)}")


def served_model(u: UnitWork, model: str) -> str:
    """The id ``/v1/models`` must list: ``--served-model-name`` (its first name) when given, else the model."""
    argv = u.node.argv
    if "--served-model-name" in argv and argv.index("--served-model-name") + 1 < len(argv):
        return argv[argv.index("--served-model-name") + 1]
    return model


def check_models(hosts: dict[str, Any], u: UnitWork, model: str) -> bool:
    ok, text = _run(hosts, u.host, f"curl -s -m 5 {shlex.quote(u.serves + '/v1/models')} || true")
    try:
        ids = [m.get("id") for m in json.loads(text).get("data", [])]
    except (ValueError, AttributeError):
        return False
    return served_model(u, model) in ids


def _probe(hosts: dict[str, Any], u: UnitWork, ready: set[str], group: str, model: str) -> Any:
    """None (still starting), "ready", or (observed, required) when the unit failed."""
    st = unit_status(hosts, u)
    active, sub, restarts = st.get("ActiveState", "?"), st.get("SubState", "?"), int(st.get("NRestarts") or 0)
    key = u.unit + "@" + u.host
    if (active == "failed" or restarts > 0 or sub == "auto-restart"
            or (active in ("inactive", "deactivating") and key not in ready)):
        return (f"unit {u.unit} {active}/{sub}, restarts {restarts}", "the engine keeps running until its group serves")
    if u.serves and key not in ready:
        code = http_code(hosts, u, "/health")
        if code == "503":
            return (f"GET {u.serves}/health -> 503 (engine dead)", "200")
        if code == "200" and (group == "router" or check_models(hosts, u, model)):
            return "ready"
    return None


def wait_group(r: Rollout, group: str, hosts: dict[str, Any], *, phase: str = "start",
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Failure | None:
    """Poll a started group until every serving unit is healthy; on failure stop the group and report."""
    units = r.group(group)
    deadline = clock() + r.deadline
    interval = max(0.2, r.vars.k3_poll_interval)
    docker = r.vars.k3_docker
    ready: set[str] = set()
    while True:
        # one poll of every unit, all hosts at once (each over its own connection)
        jobs = {u.unit + "@" + u.host: gevent.spawn(_probe, hosts, u, ready, group, r.plan.model) for u in units}
        gevent.joinall(list(jobs.values()))
        for u in units:
            status = jobs[u.unit + "@" + u.host].value
            if status is None:
                continue
            if status == "ready":
                ready.add(u.unit + "@" + u.host)
                logger.info(f"[{u.host}] {u.unit} serves at {u.serves}")
                continue
            observed, required = status
            fail = Failure(u, phase, observed, required, logs(hosts, u, docker))
            stop_group(hosts, units)
            return fail
        if all(u.unit + "@" + u.host in ready for u in units if u.serves):
            return None
        if clock() > deadline:
            waiting = [u for u in units if u.serves and u.unit + "@" + u.host not in ready]
            u = waiting[0]
            fail = Failure(u, phase, f"{u.serves} not serving after {r.deadline}s (GET /health 200 and /v1/models "
                                     f"listing {served_model(u, r.plan.model)!r} required)",
                           f"healthy within the deadline (k3_rollout_deadline={r.deadline})", logs(hosts, u, docker))
            stop_group(hosts, units)
            return fail
        sleep(interval)
