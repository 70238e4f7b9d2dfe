"""``k3deploy watch`` end to end on one simulated 2-tray GB300 group (multi_node_tp): a look at a serving cluster
does nothing; a group stopped in a way self-healing does not undo (its engines disabled and stopped on both trays:
a clean stop restarts nothing, and no watcher outlives its engine) serves again with ``watch --repair`` running and
no other command; a run holding the deployment lock is waited for, not fought."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers import deploy, k3, why
from helpers.simulated import Sim, WatchLoop, openai_client

pytestmark = [pytest.mark.sim, pytest.mark.faults]

UNIT = "k3-engine.service"


@pytest.fixture(scope="module")
def cluster():
    sim = Sim("wwatch", "gb300", 2)
    sim.set_vars("k3_strategy: multi_node_tp\n")
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    yield sim
    sim.down()


def events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def stop_for_good(sim: Sim, ranks: tuple[int, ...] = (1, 0)) -> None:
    """Disable and stop the engine on each rank: nothing on the nodes starts it again."""
    for rank in ranks:
        out = sim.ssh(rank, f"systemctl disable --now {UNIT}; systemctl is-active {UNIT}")
        assert out.stdout.strip() in ("inactive", "failed"), out   # stopped by systemctl: not started again


def test_a_look_at_a_serving_cluster_reports_every_group_up_and_does_nothing(cluster):
    proc = k3("watch", cluster.inventory, "--once", "--json", "--repair", "--grace", "0")
    assert proc.returncode == 0, proc.stderr
    got = events(proc.stdout)
    assert [e["event"] for e in got] == ["start", "state", "nothing"], got
    assert (got[1]["group"], got[1]["state"], got[1]["was"]) == ("engine", "up", None)
    assert proc.stderr == ""    # no deploy ran (its output goes to stderr)


def test_a_group_stopped_for_good_serves_again_with_the_loop_running_and_no_other_command(cluster):
    failed = time.monotonic()
    stop_for_good(cluster)
    assert k3("status", cluster.inventory, "--json").returncode == 1
    loop = WatchLoop(cluster.inventory, "--repair", "--grace", "5", "--interval", "2")
    endpoint = json.loads(k3("status", cluster.inventory, "--json").stdout)["endpoint"]
    served = None
    while time.monotonic() - failed < 120 and loop.proc.poll() is None:
        if k3("status", cluster.inventory, "--json").returncode == 0:
            openai_client(endpoint)
            served = time.monotonic() - failed
            break
        time.sleep(1)
    # the loop's own look after its repair sees the group up
    until = time.monotonic() + 30
    while time.monotonic() < until and not any(e["event"] == "state" and e["state"] == "up" for e in loop.events):
        time.sleep(0.5)
    rc = loop.stop()
    kinds = [e["event"] for e in loop.events]
    assert served is not None, f"{loop.events}\n{loop.stderr[-3000:]}"
    print(f"\nwatch --repair --grace 5 --interval 2: from the failure to serving again (OpenAI client answers): "
          f"{served:.1f} s")
    assert rc == 0 and kinds[-2:] == ["stopping", "stopped"], loop.events
    down = next(e for e in loop.events if e["event"] == "state")
    assert (down["group"], down["state"]) == ("engine", "down") and "down (" in down["why"]
    (repair,) = [e for e in loop.events if e["event"] == "repair"]
    assert repair["groups"] == ["engine"]
    # the installed deploy (k3deploy deploy INVENTORY -y), not a clone's deploy/k3.py
    assert repair["command"][1:4] == ["-m", "k3deploy.cli", "deploy"] and repair["command"][-1] == "-y"
    assert Path(repair["command"][-2]) == Path(cluster.inventory).resolve()
    (ended,) = [e for e in loop.events if e["event"] == "repaired"]
    assert ended["rc"] == 0, loop.stderr[-3000:]
    back = [e for e in loop.events if e["event"] == "state" and e["state"] == "up"]
    assert back and back[0]["was"] == "down" and back[0]["down_for"] >= 5
    assert kinds.index("repair") < kinds.index("repaired") < kinds.index("state", kinds.index("repaired"))
    for rank in (0, 1):   # the deploy enabled them again: a reboot starts them
        assert cluster.ssh(rank, f"systemctl is-enabled {UNIT}").stdout.strip() == "enabled"


def test_a_run_holding_the_deployment_lock_is_waited_for_not_fought(cluster):
    from k3deploy.runtime.lock import LockRecord

    stop_for_good(cluster, (0,))
    held = LockRecord(run="0123456789ab", by="ops@elsewhere", pid=4242, pid_start=1, boot="b", started=int(time.time()),
                      inventory=cluster.inventory)
    for rank in (0, 1):
        cluster.ssh(rank, f"printf '%s\\n' '{held.line()}' > /etc/k3deploy/deploy.lock")
    try:
        proc = k3("watch", cluster.inventory, "--once", "--json", "--repair", "--grace", "0")
    finally:
        for rank in (0, 1):
            cluster.ssh(rank, "rm -f /etc/k3deploy/deploy.lock")
    assert proc.returncode == 1, proc.stderr
    got = events(proc.stdout)
    assert [e["event"] for e in got] == ["start", "state", "wait"], got
    assert got[2]["action"] == "wait for the lock" and "run 0123456789ab by ops@elsewhere" in got[2]["lock"]
    assert proc.stderr == ""    # no deploy ran
    assert cluster.ssh(0, f"systemctl is-active {UNIT}").stdout.strip() in ("inactive", "failed")
