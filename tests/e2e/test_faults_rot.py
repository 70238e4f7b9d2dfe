"""Rotten weights and a leftover stage daemon on a simulated 2-node cluster (one multi-node group).

A byte of a shard flipped on the worker with its time stamp kept (``touch -r``) passes the cheap reads (``plan``,
``status``: a file not newer than the verification mark is trusted), but not the stage's last step: before any
engine of a group restarts, every file of the snapshot is hashed again on each of its hosts. The deploy fails naming
the worker and the file, neither engine restarts, the endpoint keeps serving, ``k3deploy verify`` names the file, and
the next deploy copies the blob again from the head and converges. A stage daemon (``k3-stage-peers``) left up by a
killed run is reported by preflight and stopped by the next deploy's first stage step."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from helpers import deploy, k3, why
from helpers.simulated import Sim
from k3deploy.model import commands

pytestmark = [pytest.mark.sim, pytest.mark.faults]

CACHE = "/var/lib/k3deploy/cache"
MODEL = "moonshotai/Kimi-K3"
MODEL_DIR = commands.model_dir(CACHE, MODEL)
UNIT = "k3-engine.service"


class Cluster:
    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.base = sim.group_vars.read_text()
        self.changes = 0

    def change(self) -> None:
        """A change that restarts the group (an env variable of the engines)."""
        self.changes += 1
        self.sim.group_vars.write_text(self.base + f"k3_extra_env: {{K3_ROT_CHANGE: '{self.changes}'}}\n")

    def since(self) -> list[str]:
        return [self.sim.ssh(rank, f"systemctl show -p ActiveEnterTimestamp --value {UNIT}").stdout.strip()
                for rank in (0, 1)]

    def serves(self) -> bool:
        plan = json.loads(k3("plan", self.sim.inventory, "--json", check=False).stdout)
        chat = self.sim.ssh(0, f"curl -sf -m 10 -H 'Content-Type: application/json' -d "
                               f"'{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}' "
                               f"{plan['endpoint']}/v1/chat/completions")
        return '"choices"' in chat.stdout

    def shard(self, rank: int) -> tuple[str, str]:
        """(the snapshot's name of the first shard, its blob's path) on a node."""
        link = self.sim.ssh(rank, f"ls {MODEL_DIR}/snapshots/*/model-00001-of-*.safetensors").stdout.strip()
        blob = self.sim.ssh(rank, f"readlink -f {link}").stdout.strip()
        assert link and blob
        return link.rsplit("/", 1)[1], blob

    def flip(self, rank: int, blob: str, keep_mtime: bool) -> None:
        """Change one byte of ``blob`` (its size stays); with ``keep_mtime`` its time stamps are put back."""
        keep = f"touch -r {blob} /tmp/k3-ref && " if keep_mtime else ""
        back = f" && touch -r /tmp/k3-ref {blob}" if keep_mtime else ""
        b = self.sim.ssh(rank, f"od -An -tu1 -j100 -N1 {blob}").stdout.strip()
        other = (int(b) ^ 0x5A) if b else 0x5A
        got = self.sim.ssh(rank, f"{keep}printf '\\{other:03o}' | dd of={blob} bs=1 seek=100 conv=notrunc "
                                 f"status=none{back}")
        assert got.returncode == 0, got.stderr


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    sim = Sim("fvrot", "gb300", 2)
    try:
        sim.set_vars("k3_strategy: multi_node_tp\n")
        first = deploy(sim.inventory)
        assert first.returncode == 0, why(first)
        yield Cluster(sim)
    finally:
        sim.down()


def test_a_leftover_stage_daemon_is_reported_by_preflight_and_stopped_by_the_next_deploy(cluster: Cluster) -> None:
    sim = cluster.sim
    node2 = sim.info["nodes"][1]["name"]
    started = sim.ssh(1, f"systemd-run --unit {commands.PEERS_UNIT} --collect sleep 600")
    assert started.returncode == 0, started.stderr
    pre = k3("preflight", sim.inventory, "--json", check=False)
    assert pre.returncode == 0, pre.stdout[-2000:] + pre.stderr    # a warning: nothing fails
    report = json.loads(pre.stdout)
    (warn,) = [r for r in report["hosts"][node2]["results"] if r["check"] == "stage.peers"]
    assert warn["status"] == "warn" and f"{commands.PEERS_UNIT}.service active" in warn["observed"]
    assert f"systemctl stop {commands.PEERS_UNIT}" in warn["fix"]
    assert not [r for r in report["hosts"][sim.info["nodes"][0]["name"]]["results"] if r["check"] == "stage.peers"]
    run = deploy(sim.inventory)          # nothing else to do: the stage stops the daemon all the same
    assert run.returncode == 0, why(run)
    assert sim.ssh(1, f"systemctl is-active {commands.PEERS_UNIT}").stdout.strip() != "active"
    assert "stage.peers" not in k3("preflight", sim.inventory, check=True).stdout


def test_a_byte_flipped_with_its_mtime_kept_stops_the_restart_and_the_next_deploy_repairs_it(
        cluster: Cluster) -> None:
    sim = cluster.sim
    node2 = sim.info["nodes"][1]["name"]
    name, blob = cluster.shard(1)
    cluster.flip(1, blob, keep_mtime=True)
    plan = k3("plan", sim.inventory, "--json", check=False)
    assert json.loads(plan.stdout)["staging"] == []       # the cheap read trusts the file: its mtime is old
    before = cluster.since()
    cluster.change()
    run = deploy(sim.inventory)
    assert run.returncode != 0, why(run)
    assert f"[{node2}]" in run.stdout and f"bad file {name}: sha256 " in run.stdout, why(run)
    assert f"but its blob is named {blob.rsplit('/', 1)[1]}" in run.stdout
    assert cluster.since() == before, "an engine of the group restarted on a rotten shard"
    assert cluster.serves()
    check = k3("verify", sim.inventory, check=False)
    assert check.returncode == 1 and name in check.stdout and node2 in check.stdout, check.stdout + check.stderr
    doc = json.loads(k3("verify", sim.inventory, "--json", check=False).stdout)
    assert [b["path"] for b in doc["hosts"][node2]["bad"]] == [name] and not doc["ok"]
    assert doc["hosts"][sim.info["nodes"][0]["name"]]["ok"]
    # the failed check took the snapshot's mark: the next deploy copies the blob again from the head
    again = deploy(sim.inventory)
    assert again.returncode == 0, why(again)
    assert k3("verify", sim.inventory, check=False).returncode == 0
    assert cluster.since()[0] != before[0] and cluster.serves()


def test_a_byte_flipped_with_a_new_mtime_is_copied_again_before_the_restart(cluster: Cluster) -> None:
    sim = cluster.sim
    node2 = sim.info["nodes"][1]["name"]
    name, blob = cluster.shard(1)
    cluster.flip(1, blob, keep_mtime=False)
    check = k3("verify", sim.inventory, check=False)
    assert check.returncode == 1 and name in check.stdout, check.stdout + check.stderr
    assert f"{node2}: weights 1 file changed since verified" in json.loads(
        k3("plan", sim.inventory, "--json", check=False).stdout)["staging"]
    cluster.change()
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert k3("verify", sim.inventory, check=False).returncode == 0 and cluster.serves()


def test_verify_refuses_a_missing_inventory_in_one_line() -> None:
    bad = k3("verify", "inventories/nope.py", check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nope.py" in bad.stderr
