"""Self-healing groups on the simulated cluster: a multi-node group comes back serving on its own, with no tool run,
after its head is killed, a worker is killed and a node reboots; a crash loop backs off and shows in `status`.

The group is B300 `multi_node_dep` (hybrid DP, 2 nodes): the simulated DP engines behave as vLLM's do when their head dies
(vllm#32136: they keep running, attached to nothing), so without the watcher the group would stay down."""

from __future__ import annotations

import json
import time

import pytest

from helpers import deploy, k3, k3_here, why

pytestmark = pytest.mark.sim

UNIT = "k3-engine.service"


def status(sim) -> int:
    return k3("status", sim.inventory, "--json", check=False).returncode


def until_status(sim, code: int, timeout: float) -> float:
    """Seconds until `k3deploy status` exits ``code`` (polled about once a second)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if status(sim) == code:
            return time.monotonic() - t0
        time.sleep(0.5)
    out = k3("status", sim.inventory, check=False)
    logs = "".join(f"\n--- {n['name']}: journal of the engine and its watcher (last 60 lines)\n"
                   + "\n".join(journal(sim, rank).splitlines()[-60:]) for rank, n in enumerate(sim.info["nodes"]))
    raise AssertionError(f"status did not exit {code} within {timeout:.0f} s:\n{out.stdout}{out.stderr}{logs}")


def journal(sim, rank: int, unit: str = UNIT) -> str:
    return sim.ssh(rank, f"journalctl -u {unit} -u k3-engine-watch.service --no-pager -o cat").stdout


def test_a_group_heals_itself_after_a_head_kill_a_worker_kill_and_reboots(sim_factory):
    sim = sim_factory("heal", "b300", 2)
    sim.set_vars("k3_strategy: multi_node_dep\nk3_stage: per_node\n")
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert status(sim) == 0
    assert sim.ssh(1, "systemctl is-active k3-engine-watch.service").stdout.strip() == "active"
    assert sim.ssh(0, "systemctl is-active k3-engine-watch.service").stdout.strip() != "active"   # the head

    # the head dies: systemd restarts it; its member, left attached to nothing, is restarted by its watcher
    sim.ssh(0, f"systemctl kill --signal=SIGKILL {UNIT}")
    until_status(sim, 1, 30)
    until_status(sim, 0, 120)
    assert "lost its group; restarting it" in journal(sim, 1)
    plan = json.loads(k3("plan", sim.inventory, "--json", check=False).stdout)
    assert plan["changes_pending"] is False, plan    # a group that healed is left alone by the next run

    # a worker dies: the head goes down with it and both come back
    sim.ssh(1, f"systemctl kill --signal=SIGKILL {UNIT}")
    until_status(sim, 1, 30)
    until_status(sim, 0, 120)

    # a node reboots: the worker's node, then the head's
    for rank in (1, 0):
        k3("sim", "reboot", sim.name, str(rank), check=True)
        until_status(sim, 0, 180)
        assert sim.ssh(rank, f"systemctl is-active {UNIT}").stdout.strip() == "active"


def test_a_crash_loop_backs_off_shows_in_status_and_recovers_once_fixed(sim_factory):
    sim = sim_factory("loop", "gb300", 2)
    sim.set_vars("k3_strategy: multi_node_tp\nk3_stage: per_node\nk3_restart_max_delay: 8\n")
    assert deploy(sim.inventory).returncode == 0
    k3_here("sim", "fault", sim.name, "1:engine-crash", check=True)
    sim.ssh(1, f"systemctl kill --signal=SIGKILL {UNIT}")
    deadline = time.monotonic() + 120
    verdict = None
    while time.monotonic() < deadline:
        st = json.loads(k3("status", sim.inventory, "--json", check=False).stdout)
        verdict = {u["host"]: u["verdict"] for g in st["groups"] for u in g["units"]}[sim.info["nodes"][1]["name"]]
        if verdict == "crash-loop":
            break
        time.sleep(1)
    assert verdict == "crash-loop", st
    assert "crash loop, waiting" in journal(sim, 1)    # each start waits longer
    text = k3("status", sim.inventory, check=False)
    assert text.returncode == 1 and "restarts" in text.stdout
    k3_here("sim", "fault", sim.name, "--clear", check=True)
    until_status(sim, 0, 150)
