"""The readiness gate's decisions, over scripted hosts (the real gate runs over SSH in tests/e2e)."""

from __future__ import annotations

from types import SimpleNamespace

from k3deploy import load_recipe, resolve
from k3deploy.cluster.binding import HostRecord
from k3deploy.cluster.rollout import compute
from k3deploy.cluster.variables import Variables
from k3deploy.runtime.readiness import wait_group

CALLS: list[tuple[str, str]] = []  # (host, command) in the order the gate sent them


class Host:
    """Answers the gate's commands from a script: unit states and HTTP codes per poll."""

    def __init__(self, name, states, codes=None):
        self.name, self.states, self.codes, self.polls, self.commands = name, list(states), list(codes or []), 0, []

    def run_shell_command(self, cmd, **kwargs):
        self.commands.append(cmd)
        CALLS.append((self.name, cmd))
        if "systemctl show" in cmd:
            st = self.states[min(self.polls, len(self.states) - 1)]
            self.polls += 1
            lines = [f"ActiveState={st[0]}", f"SubState={st[1]}", f"NRestarts={st[2]}"]
        elif "%{http_code}" in cmd:
            lines = [self.codes.pop(0) if self.codes else "000"]
        elif "/v1/models" in cmd:
            lines = ['{"object":"list","data":[{"id":"moonshotai/Kimi-K3"}]}']
        else:
            lines = ["log line"]
        return True, SimpleNamespace(stdout_lines=lines)


def rollout():
    plan = resolve(load_recipe(), hardware="gb300", strategy="multi_node_tp", nodes=2)
    hosts = [HostRecord("n0", ("head",), {"k3_ip": "10.0.0.1"}), HostRecord("n1", ("workers",), {"k3_ip": "10.0.0.2"})]
    return compute(plan, hosts, Variables(k3_hardware="gb300", k3_poll_interval=0.2, k3_rollout_deadline=30))


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


RUNNING = ("active", "running", 0)


def test_group_serves_once_the_head_answers():
    r, clock = rollout(), Clock()
    hosts = {"n0": Host("n0", [RUNNING], ["000", "000", "200"]), "n1": Host("n1", [RUNNING])}
    assert wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock) is None
    assert clock.t > 0  # it waited for the head
    assert not any("systemctl stop" in c for h in hosts.values() for c in h.commands)


def test_a_crashing_worker_stops_the_whole_group_and_is_named():
    r, clock = rollout(), Clock()
    hosts = {"n0": Host("n0", [RUNNING]), "n1": Host("n1", [RUNNING, ("activating", "auto-restart", 0)])}
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and failure.unit.host == "n1" and failure.unit.rank == 1
    report = failure.report()
    assert report.startswith("worker rank 1 on n1 (10.0.0.2) failed during start: observed unit k3-engine.service "
                             "activating/auto-restart")
    # the failed node's own journal and container log, fetched from that node
    assert report.endswith("log line")
    assert any("journalctl -u k3-engine.service" in c and "logs --tail" in c for c in hosts["n1"].commands)
    stops = [name for name, c in CALLS if "systemctl stop" in c]
    assert stops[-2:] == ["n1", "n0"]  # workers first, then the head


def test_503_is_a_failure_not_a_wait():
    r, clock = rollout(), Clock()
    hosts = {"n0": Host("n0", [RUNNING], ["503"]), "n1": Host("n1", [RUNNING])}
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and "503" in failure.observed and clock.t == 0


def test_models_must_list_the_served_model():
    r, clock = rollout(), Clock()
    for u in r.units:
        u.node.argv[:] = [*u.node.argv, "--served-model-name", "k3"]
    hosts = {"n0": Host("n0", [RUNNING], ["200"] * 3), "n1": Host("n1", [RUNNING])}
    r.deadline = 1
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and "listing 'k3'" in failure.observed  # it answered, but not as "k3"


def test_deadline():
    r, clock = rollout(), Clock()
    hosts = {"n0": Host("n0", [RUNNING]), "n1": Host("n1", [RUNNING])}
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and "not serving after 30s" in failure.observed and clock.t >= 30
