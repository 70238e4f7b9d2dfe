"""Files a deploy writes on a node, against a user of that node, on a simulated 2-node cluster: an unprivileged user
who takes every temporary name the upload could use (files of its own, mode 666, and symlinks into its home) gets
no byte of any file and owns none of them afterwards; a unit, env or token file given away or opened up is reported
by ``plan`` (exit 3) and given back to root with its mode by the deploy, without restarting an engine."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from pyinfra.api.util import sha1_hash

from helpers import deploy, k3, why
from helpers.simulated import Sim
from k3deploy.model.units import GROUP_MEMBER

pytestmark = [pytest.mark.sim, pytest.mark.faults]

CONF = "/etc/k3deploy"
UNIT, ENV, TOKEN = "/etc/systemd/system/k3-engine.service", f"{CONF}/k3-engine.env", f"{CONF}/hf-token"


@dataclass
class Cluster:
    sim: Sim
    mallory: int   # the uid of the node user


def stat(sim: Sim, rank: int, *paths: str) -> dict[str, str]:
    """``uid gid mode type`` of each path on a node (the path itself: a symlink is not followed)."""
    out = sim.ssh(rank, "stat -c '%n %u %g %a %F' " + " ".join(paths)).stdout
    return {line.split()[0]: " ".join(line.split()[1:]) for line in out.splitlines()}


def started(sim: Sim) -> list[str]:
    return [sim.ssh(rank, "systemctl show -p ActiveEnterTimestamp k3-engine.service").stdout for rank in (0, 1)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two gb300 nodes, each with a user ``mallory``, a token configured; nothing deployed yet."""
    token = tmp_path_factory.mktemp("files") / "hf-token"
    token.write_text("hf_filesE2Esecret0123456789\n")
    token.chmod(0o600)
    sim = Sim("fffiles", "gb300", 2)
    try:
        sim.set_vars(f"k3_strategy: multi_node_tp\nk3_stage: per_node\nk3_hf_token_file: {token}\n"
                     "k3_extra_env: {MY_SETTING: one}\n")
        for rank in (0, 1):
            made = sim.ssh(rank, "useradd -m mallory && id -u mallory")
            assert made.returncode == 0, made.stderr
        yield Cluster(sim, int(made.stdout.strip()))
    finally:
        sim.down()


def test_a_node_user_who_takes_the_upload_names_gets_nothing_and_owns_nothing(cluster):
    sim = cluster.sim
    # every name pyinfra's temporary upload would use for the files a deploy writes: a file of mallory's (mode 666)
    # for some, a symlink to one in its home for the others (the upload would write through it, the move put it
    # in place of the file)
    dests = [UNIT, ENV, TOKEN, GROUP_MEMBER, "/var/lib/k3deploy/stage/peers.conf"]
    names = [f"/tmp/pyinfra-{sha1_hash(d)}" for d in dests]
    traps = [f"umask 0; : > {names[i]}; chmod 666 {names[i]}" for i in (0, 3, 4)]
    traps += [f"umask 0; : > ~/got{i}; chmod 666 ~/got{i}; ln -s ~/got{i} {names[i]}" for i in (1, 2)]
    for rank in (0, 1):
        proc = sim.ssh(rank, f"su - mallory -c {shlex.quote('; '.join(traps))} && ls -l /tmp")
        assert proc.returncode == 0 and proc.stdout.count(" mallory mallory ") == len(dests), proc.stderr

    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    # a change: the env and unit files are written again
    sim.group_vars.write_text(sim.group_vars.read_text().replace("MY_SETTING: one", "MY_SETTING: two"))
    change = deploy(sim.inventory)
    assert change.returncode == 0, why(change)

    for rank in (0, 1):
        assert stat(sim, rank, UNIT, ENV, TOKEN) == {UNIT: "0 0 644 regular file", ENV: "0 0 600 regular file",
                                                     TOKEN: "0 0 600 regular file"}
        assert "MY_SETTING=two" in sim.ssh(rank, f"cat {ENV}").stdout
        # mallory's files are still its own, and empty; it owns nothing else
        mine = sim.ssh(rank, "find /tmp /etc /usr /var/lib -user mallory -printf '%p %s %l\\n'; "
                             "find /home/mallory -name 'got*' -printf '%p %s\\n'").stdout.splitlines()
        assert sorted(mine) == sorted([f"{names[i]} 0 " for i in (0, 3, 4)]
                                      + [f"{names[i]} 18 /home/mallory/got{i}" for i in (1, 2)]
                                      + [f"/home/mallory/got{i} 0" for i in (1, 2)]), mine
    status = k3("status", sim.inventory, "--json", check=False)
    assert status.returncode == 0 and json.loads(status.stdout)["verdict"] == "serving", status.stdout


def test_owner_and_mode_drift_is_planned_and_repaired_without_a_restart(cluster):
    sim, uid = cluster.sim, cluster.mallory
    if k3("plan", sim.inventory, check=False).returncode != 0:
        assert deploy(sim.inventory).returncode == 0   # (run alone: deploy first)
    before = started(sim)
    assert sim.ssh(1, f"chmod 0644 {ENV} && chown mallory {ENV}").returncode == 0
    assert sim.ssh(0, f"chmod 0640 {TOKEN} && chgrp mallory {TOKEN}").returncode == 0
    head, worker = (n["name"] for n in sim.info["nodes"])

    plan = k3("plan", sim.inventory, check=False)
    assert plan.returncode == 3, plan.stdout + plan.stderr
    assert f"env file {ENV} mode 0644 owner {uid}, required 0600 root" in plan.stdout
    assert f"token file {TOKEN} mode 0640 owner 0 group {uid}, required 0600 root" in plan.stdout
    assert "Restart: nothing restarts" in plan.stdout
    data = json.loads(k3("plan", sim.inventory, "--json", check=False).stdout)
    drift = {h["host"]: [c for c in h["changes"] if c["kind"] == "drift"] for h in data["hosts"]}
    assert [(c["path"], c["mode"], c["owner"], c["required"]) for c in drift[worker]] == [(ENV, "0644", uid,
                                                                                          "0600 root")]
    assert [(c["path"], c["mode"], c["group"]) for c in drift[head]] == [(TOKEN, "0640", uid)]
    assert data["changes_pending"] is True and data["restart_order"] == []

    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert stat(sim, 1, ENV)[ENV] == "0 0 600 regular file" and stat(sim, 0, TOKEN)[TOKEN] == "0 0 600 regular file"
    assert started(sim) == before   # drift alone restarts nothing
    after = k3("plan", sim.inventory, check=False)
    assert after.returncode == 0, after.stdout
