"""Fencing end to end (docs/spares.md, *Fencing*), on one simulated cluster of 2 GB300 trays (``multi_node_tp``) and
one spare: a tray whose rank a spare took is powered on again and its engine unit, still enabled, does not start (its
start check finds the newer fence record on a peer, names the node that holds its rank, and disables the unit): the
group serves throughout, the endpoint polled five times a second. Then the race: with ``watch --repair`` running, the
tray that holds rank 1 is powered off and powered on again while the repair is giving its rank to the other tray;
the repair succeeds and the group serves on, the returned tray standing by. Last, a returned tray that no peer
answers (the fence port closed on them) starts on its own record, and the watch loop stands it down at the look that
sees it: the group serves again on the spare."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from helpers import deploy, k3, why
from helpers.simulated import Sim, WatchLoop, endpoint_of, openai_client

pytestmark = [pytest.mark.sim, pytest.mark.faults]

UNIT = "k3-engine.service"
SOCKET = "k3-fence-8479.socket"
CLOSED = f"/run/systemd/system/{SOCKET}.d"


@pytest.fixture(scope="module")
def cluster():
    sim = Sim("fzfence", "gb300", 2, "--spares", "1")
    sim.set_vars("k3_strategy: multi_node_tp\nk3_link_timeout: 10\n")
    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    yield sim
    sim.down()


class Poller:
    """GET ``/health`` of the endpoint every ``every`` seconds (five times a second) in a thread: each answer (or
    error) and when."""

    def __init__(self, endpoint: str, every: float = 0.2) -> None:
        self.endpoint = endpoint
        self.every = every
        self.seen: list[tuple[float, str]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.done.is_set():
            try:
                with urllib.request.urlopen(self.endpoint + "/health", timeout=2) as r:
                    got = str(r.status)
            except Exception as exc:  # noqa: BLE001 (any failure of a poll is what the test reports)
                got = f"{type(exc).__name__}: {exc}"
            self.seen.append((time.time(), got))
            time.sleep(self.every)

    def stop(self) -> list[tuple[float, str]]:
        self.done.set()
        self.thread.join(10)
        return self.seen


def journal(sim: Sim, rank: int) -> str:
    return sim.ssh(rank, f"journalctl -b -u {UNIT} --no-pager -o cat").stdout


def until(what, timeout: float, every: float = 1.0):
    """``what()`` once it is true, polled until ``timeout`` seconds (None: never)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(every)
    return None


def test_a_tray_back_after_a_spare_took_its_rank_does_not_start_its_engine(cluster):
    sim = cluster
    node1, node2, spare = (n["name"] for n in sim.info["nodes"])
    k3("sim", "power", sim.name, "1", "off", check=True)
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert f"{spare} takes {node2}'s place: rank 1 of group engine" in run.stdout
    endpoint = endpoint_of(run.stdout)
    fence = sim.ssh(0, "cat /etc/k3deploy/fence").stdout
    assert f"holds engine 1 {spare}" in fence.splitlines(), fence

    poller = Poller(endpoint)
    on = json.loads(k3("sim", "power", sim.name, "1", "on", "--json", check=True).stdout)
    refused = until(lambda: "no longer holds rank 1" in journal(sim, 1) and journal(sim, 1), 60)
    # the tray stood down (its unit disabled, not running: it cannot join any more), and the endpoint was watched
    # since the power came back for 30 polls: the group would be down by then had the tray joined (a head refuses a
    # rank twice)
    until(lambda: sim.ssh(1, f"systemctl is-enabled {UNIT}; systemctl is-active {UNIT}").stdout.split()
          == ["disabled", "inactive"], 30)
    until(lambda: sum(t >= on["at"] for t, _ in poller.seen) >= 30, 60, 0.2)
    seen = poller.stop()
    assert refused, journal(sim, 1)
    line = next(x for x in refused.splitlines() if "no longer holds rank 1" in x)
    assert f"{node2} no longer holds rank 1 of group engine: {spare} holds it" in line, line
    assert "Skipped due to 'exec-condition'" in sim.ssh(1, f"journalctl -b -u {UNIT} --no-pager").stdout
    after = [got for t, got in seen if t >= on["at"]]
    assert len(after) >= 30 and set(after) == {"200"}, seen
    print(f"\n{node2} powered on: its start refused in its journal, the endpoint answered 200 to all {len(after)} "
          "polls meanwhile")
    assert sim.ssh(1, f"systemctl is-active {UNIT}").stdout.strip() == "inactive"
    assert sim.ssh(1, f"systemctl is-enabled {UNIT}").stdout.strip() == "disabled"     # it stood down
    assert "joined twice" not in sim.ssh(0, f"journalctl -u {UNIT} --no-pager -o cat").stdout
    assert "Generated text: " in openai_client(endpoint)
    st = json.loads(k3("status", sim.inventory, "--json").stdout)
    assert st["verdict"] == "serving", st
    listed = json.loads(k3("spares", sim.inventory, "--json", check=True).stdout)
    assert {h["host"]: h["state"] for h in listed["hosts"]} == {spare: "in use", node2: "standing by"}

    # a tray that still holds its rank comes back serving by itself: its check finds its rank its own
    k3("sim", "reboot", sim.name, "2", check=True)
    assert until(lambda: sim.ssh(2, f"systemctl is-active {UNIT}").stdout.strip() == "active" and
                 k3("status", sim.inventory, "--json").returncode == 0, 120), journal(sim, 2)
    assert "no longer holds" not in journal(sim, 2)


def test_a_tray_back_while_the_repair_gives_its_rank_away_does_not_join(cluster):
    sim = cluster
    node1, node2, spare = (n["name"] for n in sim.info["nodes"])   # the spare holds rank 1, node2 stands by
    endpoint = json.loads(k3("status", sim.inventory, "--json").stdout)["endpoint"]
    loop = WatchLoop(sim.inventory, "--repair", "--grace", "5", "--interval", "2")
    off = json.loads(k3("sim", "power", sim.name, "2", "off", "--json", check=True).stdout)
    # the repair's deploy has chosen node2 for the spare's rank: the spare is powered on again at once
    taking = f"{node2} takes {spare}'s place: rank 1 of group engine"
    chosen = until(lambda: taking in loop.stderr, 120, 0.2)
    on = json.loads(k3("sim", "power", sim.name, "2", "on", "--json", check=True).stdout)
    repaired = until(lambda: [e for e in loop.events if e["event"] == "repaired"], 180)
    up = until(lambda: [e for e in loop.events if e["event"] == "state" and e["state"] == "up"
                        and e["was"] is not None], 60)
    poller = Poller(endpoint)
    # the returned tray's start refused (it stands by: it cannot join any more), and the endpoint watched over two
    # looks of the loop after that (20 polls, 4 s)
    refused = until(lambda: "no longer holds rank 1" in journal(sim, 2), 30)
    since = time.time()
    until(lambda: sum(t >= since for t, _ in poller.seen) >= 20, 30, 0.2)
    seen = poller.stop()
    rc = loop.stop()
    assert chosen and repaired, f"{loop.events}\n{loop.stderr[-4000:]}"
    print(f"\n{sim.info['nodes'][2]['name']} powered off at {off['at']:.1f}, on again at {on['at']:.1f} while the "
          f"repair gave its rank away; repair: exit {repaired[0]['rc']} after {repaired[0]['seconds']} s")
    assert repaired[0]["rc"] == 0, f"{repaired[0]}\n{loop.stderr[-4000:]}"
    assert rc == 0 and up, loop.events
    assert set(got for _, got in seen) == {"200"}, seen
    assert "Generated text: " in openai_client(endpoint)
    assert refused, journal(sim, 2)
    assert f"{spare} no longer holds rank 1 of group engine: {node2} holds it" in journal(sim, 2)
    assert sim.ssh(2, f"systemctl is-active {UNIT}").stdout.strip() != "active"
    assert "joined twice" not in sim.ssh(0, f"journalctl -u {UNIT} --no-pager -o cat").stdout
    st = json.loads(k3("status", sim.inventory, "--json").stdout)
    assert st["verdict"] == "serving" and [(u["host"], u["rank"]) for g in st["groups"] for u in g["units"]] == [
        (node1, 0), (node2, 1)], st


def test_a_returned_tray_that_no_peer_answers_is_stood_down_by_the_watch_loop(cluster):
    sim = cluster
    node1, node2, spare = (n["name"] for n in sim.info["nodes"])   # node2 holds rank 1, the spare stands by
    loop = WatchLoop(sim.inventory, "--repair", "--grace", "5", "--interval", "2")
    try:
        k3("sim", "power", sim.name, "1", "off", check=True)
        assert until(lambda: [e for e in loop.events if e["event"] == "repaired"], 180), loop.stderr[-4000:]
        assert until(lambda: sim.ssh(2, f"systemctl is-active {UNIT}").stdout.strip() == "active", 60)
        # the fence port closed on every peer (as a firewall would): node2's check hears no one (a runtime drop-in
        # whose condition fails: a restarted engine's Wants= does not open it again)
        for rank in (0, 2):
            out = sim.ssh(rank, f"mkdir -p {CLOSED} && printf '[Unit]\\nConditionPathExists=/closed-by-the-test\\n' "
                                f"> {CLOSED}/closed.conf && systemctl daemon-reload && systemctl stop {SOCKET}")
            assert out.returncode == 0, out
        k3("sim", "power", sim.name, "1", "on", check=True)
        down = until(lambda: [e for e in loop.events if e["event"] == "stand down"], 120, 0.5)
        assert down, f"{loop.events}\n{journal(sim, 1)}"
        assert "peer(s) answered on port 8479: k3-engine.service starts on this node's own" in journal(sim, 1)
        assert (down[0]["host"], down[0]["units"], down[0]["error"]) == (node2, [UNIT], None), down
        assert f"{spare} holds its rank 1 of group engine" in down[0]["why"]
        assert sim.ssh(1, f"systemctl is-enabled {UNIT}").stdout.strip() == "disabled"
        assert sim.ssh(1, f"systemctl is-active {UNIT}").stdout.strip() != "active"
        assert until(lambda: k3("status", sim.inventory, "--json").returncode == 0, 180), loop.stderr[-4000:]
    finally:
        rc = loop.stop()
        for rank in (0, 2):
            sim.ssh(rank, f"rm -rf {CLOSED} && systemctl daemon-reload && systemctl start {SOCKET}")
    assert rc == 0
    st = json.loads(k3("status", sim.inventory, "--json").stdout)
    assert [(u["host"], u["rank"]) for g in st["groups"] for u in g["units"]] == [(node1, 0), (spare, 1)], st
