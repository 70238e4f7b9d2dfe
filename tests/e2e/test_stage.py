"""Staging at scale on the simulated cluster: each artifact is fetched by one node and spreads node to node along a
pipelined chain (rsync from a read-only daemon on the node before, the image as a docker save archive); every shard
is verified against its sha256; a corrupted shard is caught and copied again from a peer, not fetched again; an
air-gapped site rolls out from the control machine's copies."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import deploy, k3, why
from helpers.simulated import Sim
from k3deploy.model import commands, steps

pytestmark = pytest.mark.sim

CACHE = "/var/lib/k3deploy/cache"
MODEL = "moonshotai/Kimi-K3"
MODEL_DIR = commands.model_dir(CACHE, MODEL)
IMAGE = "vllm/vllm-openai:kimi-k3"


def serves(sim) -> bool:
    plan = json.loads(k3("plan", sim.inventory, "--json", check=False).stdout)
    chat = sim.ssh(0, f"curl -sf -H 'Content-Type: application/json' -d "
                      f"'{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}' "
                      f"{plan['endpoint']}/v1/chat/completions")
    return '"choices"' in chat.stdout


def verified(sim, rank: int) -> bool:
    return sim.ssh(rank, commands.verify_weights(CACHE, MODEL)).returncode == 0


def ran_on(output: str, operation: str) -> int:
    """On how many hosts an operation did something (pyinfra's summary table at the end of a run; a stage step that
    applies on no host is no operation, so it has no line there)."""
    assert re.search(r"^\s*Grand total\s", output, re.M), "the run printed no summary table"
    m = re.search(r"^\s*Stage \| " + re.escape(operation) + r"\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", output, re.M)
    return 0 if m is None or m[2] == "-" else int(m[2])


def uplink(sim) -> tuple[int, int]:
    """(bytes the simulated outside served over the uplink since up, one node's artifacts: image and checkpoint)."""
    doc = json.loads(k3("sim", "status", "--name", sim.name, "--json", check=True).stdout)
    c = next(c for c in doc["clusters"] if c["name"] == sim.name)
    return c["outside_bytes"], c["artifact_bytes"]


def staging(sim) -> list[str]:
    plan = k3("plan", sim.inventory, "--json", check=False)
    assert plan.returncode in (0, 3), why(plan) + plan.stderr
    return json.loads(plan.stdout)["staging"]


class Staged:
    """A cluster of four trays and its first deploy: what ``plan`` said it would stage, and the run."""

    def __init__(self, sim: Sim, planned: list[str], run: subprocess.CompletedProcess[str]) -> None:
        self.sim, self.planned, self.run = sim, planned, run


@pytest.fixture(scope="module")
def four() -> Iterator[Staged]:
    """Four gb300 trays in one group, deployed once: the spread's test reads that first run, the corrupted shard's
    test works on the cluster it left (one bring-up and one first deploy for both)."""
    sim = Sim("stg4", "gb300", 4)
    try:
        sim.set_vars("k3_strategy: multi_node_tp\n")
        planned = staging(sim)
        yield Staged(sim, planned, deploy(sim.inventory))
    finally:
        sim.down()


def peers_served(sim, rank: int) -> set[str]:
    """The addresses the stage's rsync daemon on node ``rank`` served files to in this boot (its journal)."""
    out = sim.ssh(rank, f"journalctl -b -u {commands.PEERS_UNIT} --no-pager -o cat").stdout
    return set(re.findall(r"^rsync (?:on|to) \S+ from [^(\n]*\(([0-9.]+)\)", out, re.M))


def test_four_trays_fetch_each_artifact_once_and_hand_it_on_along_a_chain(four: Staged) -> None:
    sim, run = four.sim, four.run
    first = sim.info["nodes"][0]["name"]
    said = "3 nodes get it from peers along a chain, each file handed on as it lands"
    assert four.planned[:2] == [f"image: {first} fetches it from outside; {said}",
                                f"weights: {first} fetches it from outside; {said}"]
    assert run.returncode == 0, why(run)
    assert "Stage round 1 of 1: from a peer" in run.stdout and "Stage round 2" not in run.stdout
    assert ran_on(run.stdout, f"Image {IMAGE}: from the registry") == 1       # once over the uplink
    assert ran_on(run.stdout, f"Weights of {MODEL}: from the hub") == 1
    assert ran_on(run.stdout, "Stage round 1 of 1: from a peer") == 3          # all three at once
    ips = [n["ip"] for n in sim.info["nodes"]]
    for rank in range(3):           # each node served the next one only: a chain, each link carrying the bytes once
        assert peers_served(sim, rank) == {ips[rank + 1]}, (rank, peers_served(sim, rank))
    assert all(verified(sim, rank) for rank in range(4))
    # each copy was shown on the control machine as it ran, its last line its bytes against the holder's total
    size = r"(\d+(?:\.\d)? (?:B|KiB|MiB|GiB))"
    for node in sim.info["nodes"][1:]:
        for what in ("image", "weights"):
            line = re.search(rf"^\[{node['name']}\] stage: {what} from {first}: {size} of {size}, done in ",
                             run.stdout, re.M)
            assert line is not None and line[1] == line[2] and not line[1].endswith(" B"), (node["name"], what)
    # the hub's download and the image's pull, each against its source's own index (read by the node that fetches)
    for what in ("weights", "image"):
        line = re.search(rf"^\[{first}\] stage: {what}: {size} of {size}, done in ", run.stdout, re.M)
        assert line is not None and line[1] == line[2] and not line[1].endswith(" B"), (what, run.stdout[-3000:])
    served, artifacts = uplink(sim)        # the uplink carried the artifacts once, not once per node
    assert artifacts <= served <= 1.2 * artifacts, (served, artifacts)
    for rank in range(4):   # the archives are gone, the daemons stopped; the image stays loaded
        assert sim.ssh(rank, f"ls {commands.archive_path('/var/lib/k3deploy/stage', IMAGE)}").returncode != 0
        assert sim.ssh(rank, f"systemctl is-active {commands.PEERS_UNIT}").stdout.strip() != "active"
        assert sim.ssh(rank, f"docker image inspect {IMAGE}").returncode == 0
    assert serves(sim)
    assert staging(sim) == []
    again = deploy(sim.inventory)
    assert again.returncode == 0 and "Stage round" not in again.stdout and "] stage: " not in again.stdout


def test_an_interrupted_stage_resumes_where_it_stopped(sim_factory):
    sim = sim_factory("stgr", "gb300", 2, "--weights-mb", "24", "--image-mb", "8")
    sim.set_vars("k3_strategy: multi_node_tp\n")
    # the uplink breaks once, in the middle of the checkpoint (after the 8 MiB image and 12 MiB of shards)
    k3("sim", "fault", sim.name, "outside-cut=20", check=True)
    run = deploy(sim.inventory)
    assert run.returncode != 0
    assert "--> Starting operation: Start | Start group heads" not in run.stdout     # nothing started
    partial = sim.ssh(0, f"find {MODEL_DIR}/blobs -name '*.incomplete' -size +0").stdout.split()
    assert partial, "the broken download left no partial file to resume"
    assert not verified(sim, 0)
    served_first, artifacts = uplink(sim)
    assert served_first < artifacts
    again = deploy(sim.inventory)
    assert again.returncode == 0, why(again)
    assert verified(sim, 0) and verified(sim, 1) and serves(sim)
    served, _ = uplink(sim)                 # what was already there is not fetched again
    assert artifacts <= served <= 1.2 * artifacts, (served_first, served, artifacts)


def test_a_corrupted_shard_is_found_and_copied_again_from_a_peer(four: Staged) -> None:
    sim = four.sim      # deployed and verified on every tray
    assert four.run.returncode == 0, why(four.run)
    shard = sim.ssh(1, f"readlink -f {MODEL_DIR}/snapshots/*/model-00001-of-*.safetensors").stdout.strip()
    assert shard
    sim.ssh(1, f"printf garbage | dd of={shlex.quote(shard)} bs=1 seek=4096 conv=notrunc status=none")
    lines = staging(sim)
    node2 = sim.info["nodes"][1]["name"]
    assert f"{node2}: weights 1 file changed since verified" in lines, lines
    assert "weights: 1 node gets it from peers along a chain, each file handed on as it lands" in lines   # not outside
    assert not verified(sim, 1)
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert ran_on(run.stdout, f"Weights of {MODEL}: from the hub") == 0
    assert ran_on(run.stdout, "Stage round 1 of 1: from a peer") == 1
    assert verified(sim, 1) and serves(sim)
    assert staging(sim) == []


def test_an_air_gapped_site_rolls_out_from_the_control_machine(sim_factory, tmp_path):
    sim = sim_factory("stga", "gb300", 2)
    sim.set_vars("k3_strategy: multi_node_tp\n")
    # what a site brings in on a disk: a docker save archive and the hub's cache directory of the model
    fetch = (f"docker pull -q {IMAGE} && docker save -o /root/image.tar {IMAGE} && "
             f"{shlex.join(commands.download_argv('docker', CACHE, IMAGE, MODEL))}")
    got = sim.ssh(0, fetch)
    assert got.returncode == 0, got.stdout + got.stderr
    d = Path(sim.inventory).parent
    ssh = ["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o", "BatchMode=yes",
           f"root@{sim.info['nodes'][0]['ip']}"]
    (tmp_path / "image.tar").write_bytes(subprocess.run([*ssh, "cat /root/image.tar"], capture_output=True,
                                                        check=True).stdout)
    tar = subprocess.run([*ssh, f"tar -C {MODEL_DIR.rsplit('/', 1)[0]} -cf - {MODEL_DIR.rsplit('/', 1)[1]}"],
                         capture_output=True, check=True).stdout
    subprocess.run(["tar", "-C", str(tmp_path), "-xf", "-"], input=tar, check=True)
    wipe = sim.ssh(0, f"docker rmi {IMAGE} && rm -rf {CACHE} /root/image.tar")
    assert wipe.returncode == 0, wipe.stderr
    source = tmp_path / MODEL_DIR.rsplit("/", 1)[1]
    sim.set_vars(f"k3_image_archive: {tmp_path / 'image.tar'}\nk3_weights_source: {source}\n"
                 "k3_download_weights: false\n")
    first = sim.info["nodes"][0]["name"]
    assert staging(sim)[:2] == [
        f"image: {first} fetches it from the control machine; 1 node gets it from peers along a chain, each file "
        "handed on as it lands",
        f"weights: {first} fetches it from the control machine; 1 node gets it from peers along a chain, each file "
        "handed on as it lands"]
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert ran_on(run.stdout, f"Image {IMAGE}: from the registry") == 0      # no registry, no hub
    assert ran_on(run.stdout, f"Weights of {MODEL}: from the hub") == 0
    assert ran_on(run.stdout, "Image: the archive from the control machine") == 1
    assert ran_on(run.stdout, "Weights: from the control machine") == 1
    size = r"(\d+(?:\.\d)? (?:B|KiB|MiB|GiB))"   # each copy shown against the control machine's copy
    for what in ("image archive", "weights"):
        line = re.search(rf"^\[{first}\] stage: {what} from the control machine: {size} of {size}, done in ",
                         run.stdout, re.M)
        assert line is not None and line[1] == line[2] and not line[1].endswith(" B"), what
    # the copies from the control machine are timed into the first node's stage record, as its other steps are
    record = sim.ssh(0, f"cat {steps.stage_record('/etc/k3deploy')}").stdout.split()
    timed = {w.removeprefix("K3_STAGE="): (float(b), float(e)) for w, b, e in zip(record[::3], record[1::3],
                                                                                    record[2::3], strict=True)}
    assert {"image_copy", "weights_copy"} <= set(timed) and all(e >= b for b, e in timed.values()), record
    assert timed["image_copy"][1] <= timed["weights_copy"][0]
    assert verified(sim, 0) and verified(sim, 1) and serves(sim)
    assert staging(sim) == []
