"""Revision records and the router under faults, on a simulated 4-node cluster of two 2-tray replicas behind the
real vllm-router.

The router SIGKILLed in the middle of a roll comes back after ``RestartSec=1`` with the worker list the roll keeps
in its worker file (the replica that is out stays out), the router calls of the roll wait for it, the run succeeds,
clients fail only while the router is down, and every node of a replica names the same current revision. A split
``current`` marker (a run stopped between the nodes' marks) is reported with what the nodes run and repaired by the
next deploy. A record (``meta.json``) cut short on one node is reported as corrupt, naming the node and the path,
and written again by the next deploy from the other nodes' record; a rollback to ``previous`` never goes to a
revision that never served."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from helpers import PYINFRA, ROOT, deploy, k3, k3_here, why
from helpers.clients import Client
from helpers.simulated import Sim

pytestmark = [pytest.mark.sim, pytest.mark.faults]

REVISIONS = "/etc/k3deploy/revisions"
ROUTER = "k3-engine-router"


class Cluster:
    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.ips = [n["ip"] for n in sim.info["nodes"]]
        self.names = [n["name"] for n in sim.info["nodes"]]
        self.endpoint = f"http://{self.ips[0]}:30000"
        self.changes = 0

    def change(self, value: str | None = None) -> None:
        """An engine change (an env variable of the engines): it rolls replica by replica."""
        self.changes += 1
        self.sim.set_vars(f"k3_extra_env: {{K3_RECORD_CHANGE: '{value or self.changes}'}}\n")

    def workers(self, timeout: float = 2) -> list[str] | None:
        """What the router sends requests to (None: it does not answer)."""
        try:
            with urllib.request.urlopen(f"{self.endpoint}/list_workers", timeout=timeout) as resp:
                return sorted(json.loads(resp.read())["urls"])
        except (OSError, ValueError, KeyError):
            return None

    def currents(self) -> dict[str, list[str]]:
        """group -> the revision each of its nodes names current (in node order)."""
        out: dict[str, list[str]] = {}
        for rank in range(len(self.ips)):
            listing = self.sim.ssh(rank, f"grep -H . {REVISIONS}/*/current").stdout
            for line in listing.splitlines():
                path, value = line.split(":", 1)
                out.setdefault(path.split("/")[-2], []).append(value.strip())
        return out

    def history(self) -> dict[str, dict]:
        return json.loads(k3("history", self.sim.inventory, "--json", check=True).stdout)["groups"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    sim = Sim("rcrec", "gb300", 4, "--replicas", "2")
    try:
        sim.set_vars("k3_slo_requests: 8\nk3_slo_output_tokens: 8\n")   # the canary's probe, small
        first = deploy(sim.inventory)
        assert first.returncode == 0, why(first)
        yield Cluster(sim)
    finally:
        sim.down()


def test_the_router_killed_mid_roll_is_back_at_once_and_keeps_the_rolled_replica_out(cluster: Cluster) -> None:
    sim = cluster.sim
    r0 = f"http://{cluster.ips[0]}:8000"
    r1 = f"http://{cluster.ips[2]}:8000"
    assert cluster.workers() == sorted([r0, r1])
    cluster.change()
    with Client(cluster.endpoint) as client:
        time.sleep(2)
        run = subprocess.Popen([PYINFRA, sim.inventory, "deploy/k3.py", "-y"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        deadline = time.monotonic() + 240
        while cluster.workers() != [r1]:          # r0 is out of the router: its roll has begun
            assert time.monotonic() < deadline and run.poll() is None, "the roll never took r0 out"
            time.sleep(0.2)
        time.sleep(1)
        killed = time.monotonic()
        assert sim.ssh(0, f"systemctl kill -s KILL {ROUTER}").returncode == 0
        while (seen := cluster.workers(timeout=0.5)) is None:
            assert time.monotonic() < killed + 30, "the router did not come back"
            time.sleep(0.05)
        back = time.monotonic()
        out, _ = run.communicate(timeout=600)
        time.sleep(1)
    assert run.returncode == 0, out[-4000:]
    # the router started again with the worker file's list: the replica out of the roll stays out
    assert r0 not in seen, seen
    down = back - killed
    print(f"router down {down:.2f} s after SIGKILL; {len(client.failures)} failed requests, {client.ok} answered")
    assert down < 8, down     # RestartSec=1 and the launcher's start (about 1.5 s on an idle 2-core machine)
    late = [t - killed for t in client.failed_at if not killed - 0.5 <= t <= back + 0.5]
    assert late == [], (late, client.failures[:5])
    assert client.ok > 10 and len(client.answered_by) == 2, (client.ok, client.answered_by)
    assert cluster.workers() == sorted([r0, r1])
    assert int(sim.ssh(0, f"systemctl show -p NRestarts --value {ROUTER}").stdout.strip() or 0) >= 1
    # every node of a group names one current revision, the newest, and history and plan say so
    history = cluster.history()
    for group, values in cluster.currents().items():
        assert len(set(values)) == 1, (group, values)
        assert int(values[0]) == history[group]["current"], (group, values, history[group])
    for group in ("engine-r0", "engine-r1"):
        assert history[group]["current"] == max(r["number"] for r in history[group]["revisions"])
        assert history[group]["split"] is None
    plan = k3("plan", sim.inventory, check=False)
    assert plan.returncode == 0 and "rolled back" not in plan.stdout, plan.stdout[-2000:]


def test_a_split_current_marker_is_reported_and_repaired_by_the_next_deploy(cluster: Cluster) -> None:
    sim = cluster.sim
    history = cluster.history()["engine-r0"]
    runs = history["current"]
    older = max(r["number"] for r in history["revisions"] if r["number"] < runs)
    # a run stopped between the marks: the head names the older revision, its worker the one both run
    sim.ssh(0, f"echo {older} > {REVISIONS}/engine-r0/current")
    assert cluster.currents()["engine-r0"] == [str(older), str(runs)]
    history = cluster.history()["engine-r0"]
    assert history["current"] == runs, history          # what the nodes' files are
    assert history["marked_current"] == {cluster.names[0]: older, cluster.names[1]: runs}
    assert f"the nodes run revision {runs}" in history["split"]
    plan = k3("plan", sim.inventory, check=False)
    assert plan.returncode == 3, plan.stdout[-2000:]
    assert "marked differently on its nodes" in plan.stdout and "rolled back" not in plan.stdout
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert "Mark the revision of group engine-r0 current" in run.stdout
    assert cluster.currents()["engine-r0"] == [str(runs), str(runs)]
    assert cluster.history()["engine-r0"]["split"] is None
    assert k3("plan", sim.inventory, check=False).returncode == 0


def test_a_record_cut_short_is_named_corrupt_and_written_again(cluster: Cluster) -> None:
    sim = cluster.sim
    number = cluster.history()["engine-r0"]["current"]
    path = f"{REVISIONS}/engine-r0/{number}/meta.json"
    whole = sim.ssh(0, f"sha256sum < {path}").stdout
    assert sim.ssh(1, f"truncate -s 120 {path}").returncode == 0
    shown = cluster.history()["engine-r0"]
    (rev,) = [r for r in shown["revisions"] if r["number"] == number]
    assert rev["corrupt_on"] == {cluster.names[1]: path} and not rev["restorable"], rev
    text = k3("history", sim.inventory, check=True).stdout
    assert f"the record of revision {number} on {cluster.names[1]} is corrupt ({path}" in text, text
    assert "lacks its files" not in text
    plan = k3("plan", sim.inventory, check=False)
    assert plan.returncode == 3 and f"is corrupt ({path})" in plan.stdout, plan.stdout[-2000:]
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert f"Write the record of revision {number} of group engine-r0 again" in run.stdout
    assert sim.ssh(1, f"sha256sum < {path}").stdout == whole
    (rev,) = [r for r in cluster.history()["engine-r0"]["revisions"] if r["number"] == number]
    assert rev["corrupt_on"] == {} and rev["restorable"]
    assert k3("plan", sim.inventory, check=False).returncode == 0


def test_rollback_to_previous_skips_a_revision_that_never_served(cluster: Cluster) -> None:
    sim = cluster.sim
    served = cluster.history()["engine-r0"]["current"]
    # a change whose replica 0 never serves (its worker crashes at start): recorded, never served
    k3_here("sim", "fault", sim.name, "1:engine-crash", check=True)
    cluster.change("never")
    failed = deploy(sim.inventory)
    assert failed.returncode != 0, why(failed)
    k3_here("sim", "fault", sim.name, "--clear", "1", check=True)
    never = max(r["number"] for r in cluster.history()["engine-r0"]["revisions"])
    assert never > served
    cluster.change()
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    history = cluster.history()["engine-r0"]
    assert history["current"] > never
    assert not next(r for r in history["revisions"] if r["number"] == never)["served"]
    preview = k3("plan", sim.inventory, "--rollback", "previous", "--json", check=False)
    assert preview.returncode == 3, preview.stdout[-2000:] + preview.stderr     # a rollback is a change
    notes = " ".join(json.loads(preview.stdout)["notes"])
    assert f"group engine-r0: a rollback from revision {history['current']} to revision {served} " in notes, notes
