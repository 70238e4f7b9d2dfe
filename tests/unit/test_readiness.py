"""The readiness gate's decisions: the real probe script runs in a local shell against scripted ``systemctl`` and
``curl`` (the real gate runs the same script over SSH in tests/e2e)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from k3deploy import load_recipe, resolve
from k3deploy.model.binding import HostRecord
from k3deploy.model.rollout import plan_rollout
from k3deploy.model.variables import Variables
from k3deploy.runtime.readiness import wait_group

MODELS = '{"object":"list","data":[{"id":"moonshotai/Kimi-K3","object":"model"}]}'
SYSTEMCTL = """#!/bin/sh
case "$1" in
  show) cat "$K3T/state";;
  stop) echo "$K3T_NAME" >> "$K3T/../stops";;
esac
"""
CURL = """#!/bin/sh
for a in "$@"; do last="$a"; done
case "$*" in
  *K3_CODE=*) cat "$K3T/models"; printf '\nK3_CODE=%s' "$(cat "$K3T/models-code" 2>/dev/null || echo 200)";;
  *http_code*) cat "$K3T/code";;
  *) case "$last" in */v1/models) cat "$K3T/models";; esac;;
esac
"""
JOURNAL = "#!/bin/sh\necho log line\n"


class Host:
    """A node whose shell is this machine's ``sh`` with scripted ``systemctl``/``curl``: per poll a unit state
    (ActiveState, SubState, NRestarts) and an HTTP code."""

    def __init__(self, root: Path, name: str, states, codes=None, models: str = MODELS):
        self.name, self.states, self.codes, self.polls = name, list(states), list(codes or []), 0
        self.commands: list[str] = []
        self.dir = root / name
        bin_dir = self.dir / "bin"
        bin_dir.mkdir(parents=True)
        for tool, text in (("systemctl", SYSTEMCTL), ("curl", CURL), ("journalctl", JOURNAL), ("docker", JOURNAL)):
            (bin_dir / tool).write_text(text)
            (bin_dir / tool).chmod(0o755)
        (self.dir / "models").write_text(models)

    def run_shell_command(self, cmd, _stdin=None, **kwargs):
        self.commands.append(_stdin or cmd)
        if "K3_PROBE=" in (_stdin or cmd):
            st = self.states[min(self.polls, len(self.states) - 1)]
            self.polls += 1
            (self.dir / "state").write_text(f"ActiveState={st[0]}\nSubState={st[1]}\nNRestarts={st[2]}\n")
            (self.dir / "code").write_text(self.codes.pop(0) if self.codes else "000")
        env = {**os.environ, "PATH": f"{self.dir / 'bin'}:{os.environ['PATH']}", "K3T": str(self.dir),
               "K3T_NAME": self.name}
        proc = subprocess.run(["sh", "-c", cmd], input=_stdin, capture_output=True, text=True, env=env, timeout=30)
        return proc.returncode == 0, SimpleNamespace(stdout_lines=proc.stdout.splitlines(),
                                                     stderr_lines=proc.stderr.splitlines())


def rollout(strategy: str = "multi_node_tp", hardware: str = "gb300"):
    plan = resolve(load_recipe(), hardware=hardware, strategy=strategy, nodes=2)
    hosts = [HostRecord("n0", ("head",), {"k3_ip": "10.0.0.1"}), HostRecord("n1", ("workers",), {"k3_ip": "10.0.0.2"})]
    return plan_rollout(plan, hosts, Variables(k3_hardware=hardware, k3_poll_interval=0.2, k3_rollout_deadline=30, k3_docker="docker"))


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


RUNNING = ("active", "running", 0)


def stops(tmp_path: Path) -> list[str]:
    f = tmp_path / "stops"
    return f.read_text().split() if f.exists() else []


def test_group_serves_once_the_head_answers(tmp_path):
    r, clock = rollout(), Clock()
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING], ["000", "000", "200"]), "n1": Host(tmp_path, "n1", [RUNNING])}
    assert wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock) is None
    assert clock.t > 0  # it waited for the head
    assert stops(tmp_path) == []


def test_a_crashing_worker_stops_the_whole_group_and_is_named(tmp_path):
    r, clock = rollout(), Clock()
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING]),
             "n1": Host(tmp_path, "n1", [RUNNING, ("activating", "auto-restart", 0)])}
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and failure.host == "n1" and failure.unit.rank == 1
    report = failure.report()
    assert report.startswith("worker rank 1 on n1 (10.0.0.2) failed during start: observed unit k3-engine.service "
                             "activating/auto-restart")
    # the failed node's own journal and container log, fetched from that node
    assert report.endswith("log line")
    assert any("journalctl -u k3-engine.service" in c and "logs --tail" in c for c in hosts["n1"].commands)
    assert stops(tmp_path) == ["n1", "n0"]  # workers first, then the head


def test_a_restart_counts_as_a_failure(tmp_path):
    r, clock = rollout(), Clock()
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING, ("active", "running", 1)]), "n1": Host(tmp_path, "n1", [RUNNING])}
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and failure.host == "n0" and "restarts 1" in failure.observed


def test_a_401_on_the_models_is_a_failure_at_once_naming_the_key(tmp_path):
    r, clock = rollout(), Clock()
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING], ["200"]), "n1": Host(tmp_path, "n1", [RUNNING])}
    (tmp_path / "n0" / "models-code").write_text("401")
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and failure.host == "n0" and clock.t < 5   # at once, not at the deadline
    assert failure.observed == ("GET http://10.0.0.1:8000/v1/models -> 401: the endpoint requires an API key and none "
                                "was sent (/etc/k3deploy/k3-engine.env holds no VLLM_API_KEY): put the key in a 0600 "
                                "file named by k3_api_key_file and deploy again")
    assert stops(tmp_path) == ["n1", "n0"]


def test_503_is_a_failure_not_a_wait(tmp_path):
    r, clock = rollout(), Clock()
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING], ["503"]), "n1": Host(tmp_path, "n1", [RUNNING])}
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and "503" in failure.observed and clock.t == 0


def test_models_must_list_the_served_model(tmp_path):
    r, clock = rollout(), Clock()
    for u in r.units:
        u.node.argv[:] = [*u.node.argv, "--served-model-name", "k3"]
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING], ["200"] * 3), "n1": Host(tmp_path, "n1", [RUNNING])}
    r = dataclasses.replace(r, deadline=1)
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and "listing 'k3'" in failure.observed  # it answered, but not as "k3"


def test_the_last_served_model_name_counts_as_vllm_reads_it(tmp_path):
    r, clock = rollout(), Clock()
    for u in r.units:
        u.node.argv[:] = [*u.node.argv, "--served-model-name", "old", "--served-model-name=k3"]
    listing = '{"object":"list","data":[{"id": "k3","object":"model"}]}'
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING], ["200"], models=listing), "n1": Host(tmp_path, "n1", [RUNNING])}
    assert wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock) is None


def test_deadline(tmp_path):
    r, clock = rollout(), Clock()
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING]), "n1": Host(tmp_path, "n1", [RUNNING])}
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and "not serving after 30s" in failure.observed and clock.t >= 30


def test_members_are_polled_once_a_period_until_the_head_serves(tmp_path):
    from k3deploy.runtime.readiness import MEMBERS_SECONDS

    r, clock = rollout(), Clock()
    per_period = round(MEMBERS_SECONDS / 0.2)   # rounds (0.2 s apart) in one period of the members' polls
    head_rounds = 2 * per_period + per_period // 4   # the head answers between the second and the third period
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING], ["000"] * (head_rounds - 1) + ["200"]),
             "n1": Host(tmp_path, "n1", [RUNNING])}
    assert wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock) is None
    assert hosts["n0"].polls == head_rounds
    assert hosts["n1"].polls == 3   # at the start, then once a period: not every few rounds of a short interval


def test_a_member_failing_while_the_head_starts_is_seen_within_a_period(tmp_path):
    from k3deploy.runtime.readiness import MEMBERS_SECONDS

    r, clock = rollout(), Clock()
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING]),   # never serves
             "n1": Host(tmp_path, "n1", [RUNNING, ("failed", "failed", 0)])}
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)
    assert failure is not None and failure.host == "n1"
    assert hosts["n1"].polls == 2 and MEMBERS_SECONDS <= clock.t <= MEMBERS_SECONDS + 2 * 0.2
    assert stops(tmp_path) == ["n1", "n0"]


def test_serving_members_are_polled_at_once_when_the_head_serves(tmp_path):
    r, clock = rollout("multi_node_dep", "b300"), Clock()   # hybrid load balancing: the member serves its own API
    assert [u.serves is not None for u in r.group("engine")] == [True, True]
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING], ["000", "000", "200"]),
             "n1": Host(tmp_path, "n1", [RUNNING], ["000", "200"])}
    assert wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock) is None
    assert hosts["n1"].polls == 2   # round 1, then the round right after the head's first 200
    assert abs(clock.t - 2 * 0.2) < 1e-9   # two waits (after rounds 1 and 2), none after the head served


def test_headless_members_add_no_round_once_the_head_serves(tmp_path):
    r, clock = rollout(), Clock()   # multi_node_tp: the member serves no API
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING], ["000", "200"]), "n1": Host(tmp_path, "n1", [RUNNING])}
    assert wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock) is None
    assert hosts["n0"].polls == 2 and hosts["n1"].polls == 1 and abs(clock.t - 0.2) < 1e-9


def test_a_container_removed_with_its_engine_is_explained_not_reported_as_a_fault(tmp_path):
    import subprocess

    from k3deploy.model.commands import logs

    docker = tmp_path / "docker"
    docker.write_text('#!/bin/sh\necho "Error response from daemon: No such container: $4" >&2; exit 1\n')
    docker.chmod(0o755)
    out = subprocess.run(["sh", "-c", logs("k3-engine.service", "k3-engine", str(docker), 5)], capture_output=True,
                         text=True).stdout
    assert "No such container" not in out and "(no container k3-engine now: the unit runs it with --rm" in out, out
    docker.write_text('#!/bin/sh\necho "Cannot connect to the Docker daemon" >&2; exit 1\n')
    out = subprocess.run(["sh", "-c", logs("k3-engine.service", "k3-engine", str(docker), 5)], capture_output=True,
                         text=True).stdout
    assert "Cannot connect to the Docker daemon" in out   # any other answer is shown as it is


def test_a_failure_of_unchanged_files_does_not_suggest_a_rollback():
    from k3deploy.runtime.launchers import failure_advice

    node = failure_advice("engine", "n2", changed=False)
    assert "k3_rollback" not in node and "the cause is on n2, not in the settings" in node
    assert "'Error: executed 0 commands'" in node      # pyinfra's line that follows is explained
    change = failure_advice("engine", "n2", changed=True)
    assert "--data k3_rollback=true" in change and "'Error: executed 0 commands'" in change


def test_once_the_head_serves_a_member_that_serves_is_not_asked_again_every_round(tmp_path):
    plan = resolve(load_recipe(), hardware="b300", strategy="multi_node_dep", nodes=3)
    hosts_ = [HostRecord("n0", ("head",), {"k3_ip": "10.0.0.1"})] + [
        HostRecord(f"n{i}", ("workers",), {"k3_ip": f"10.0.0.{i + 1}"}) for i in (1, 2)]
    r = plan_rollout(plan, hosts_, Variables(k3_hardware="b300", k3_poll_interval=0.2, k3_rollout_deadline=30,
                                             k3_docker="docker"))
    assert all(u.serves for u in r.group("engine"))   # hybrid load balancing: every member serves its own API
    clock = Clock()
    hosts = {"n0": Host(tmp_path, "n0", [RUNNING], ["000", "200"]),
             "n1": Host(tmp_path, "n1", [RUNNING], ["000", "200"]),               # serves with the head
             "n2": Host(tmp_path, "n2", [RUNNING], ["000", "000", "000", "000", "200"])}   # three rounds later
    assert wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock) is None
    assert hosts["n2"].polls == 5        # rounds 1, 3, 4, 5 and 6: every round once the head serves
    assert hosts["n1"].polls == 2        # rounds 1 and 3: serving, it waits for the next 8th round


class Lost(Host):
    """A node whose SSH connection is gone: every command raises as paramiko does on a dead transport."""

    def run_shell_command(self, cmd, _stdin=None, **kwargs):
        self.commands.append(_stdin or cmd)
        from paramiko.ssh_exception import SSHException

        raise SSHException("SSH session not active")


def test_a_head_whose_connection_is_lost_is_named_and_the_gate_ends(tmp_path):
    r, clock = rollout(), Clock()
    hosts = {"n0": Lost(tmp_path, "n0", [RUNNING]), "n1": Host(tmp_path, "n1", [RUNNING])}
    failure = wait_group(r, "engine", hosts, sleep=clock.sleep, clock=clock)   # no exception: a failure
    assert failure is not None and failure.host == "n0"
    assert "the SSH connection to n0 was lost (SSHException: SSH session not active)" in failure.report()
    assert stops(tmp_path) == ["n1"]   # the member that answers is stopped (no half group)


def test_a_command_that_outlasts_its_bound_is_a_failure_naming_the_host(tmp_path):
    import gevent

    from k3deploy.runtime.readiness import run

    class Silent(Host):
        def run_shell_command(self, cmd, _stdin=None, **kwargs):
            gevent.sleep(5)
            raise AssertionError("not reached")

    ok, text = run({"n0": Silent(tmp_path, "n0", [RUNNING])}, "n0", "true", timeout=0.2)
    assert not ok and text == "n0 did not answer within 0 s"
