"""An air-gapped site's sources checked before anything is copied, on a simulated 2-tray cluster.

The site brings the image as a ``docker save`` archive and the model's Hugging Face cache directory on the control
machine (``k3_image_archive``, ``k3_weights_source``, ``k3_download_weights: false``). A source missing a shard, one
whose shard was cut short, and an image archive cut short each refuse the run while it is prepared: one line names
the source, what is wrong and the fix, each node says what it was to do and that nothing was copied to it, and no
node holds the image, a weight file or an archive afterwards (``plan`` says the same and exits 2). A shard of the
right size with a byte changed passes the listing and is caught by the first node's verification after its copy;
the node that was to copy from it says so instead of failing on the refused connection to a daemon that never
started. With the sources whole again the deploy serves."""

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
from k3deploy.model import commands

pytestmark = [pytest.mark.sim, pytest.mark.faults]

CACHE = "/var/lib/k3deploy/cache"
STAGE = "/var/lib/k3deploy/stage"
MODEL = "moonshotai/Kimi-K3"
MODEL_DIR = commands.model_dir(CACHE, MODEL)
IMAGE = "vllm/vllm-openai:kimi-k3"
#: what a node holds of the artifacts: the image, any file of the model's cache, any archive of the stage
HOLDS = (f"docker image inspect {IMAGE} >/dev/null 2>&1 && echo image; "
         f"[ -d {CACHE} ] && find {CACHE} ! -type d | sed 's/^/file /'; "
         f"[ -d {STAGE} ] && find {STAGE} ! -type d | sed 's/^/staged /'; true")


class Site:
    """The cluster and the control machine's copies of the image and the weights."""

    def __init__(self, sim: Sim, source: Path, archive: Path) -> None:
        self.sim = sim
        self.source = source
        self.archive = archive
        self.nodes = [n["name"] for n in sim.info["nodes"]]

    def shard(self, number: int) -> tuple[Path, Path]:
        """(the snapshot's link of shard ``number``, its blob) in the source."""
        (link,) = self.source.glob(f"snapshots/*/model-{number:05d}-of-*.safetensors")
        return link, link.resolve()

    def holds(self) -> dict[str, list[str]]:
        """What each node holds of the artifacts (nothing: an empty list)."""
        return {name: self.sim.ssh(rank, HOLDS).stdout.split("\n")[:-1] for rank, name in enumerate(self.nodes)}

    def serves(self) -> bool:
        plan = json.loads(k3("plan", self.sim.inventory, "--json", check=False).stdout)
        chat = self.sim.ssh(0, f"curl -sf -m 10 -H 'Content-Type: application/json' -d "
                               f"'{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}' "
                               f"{plan['endpoint']}/v1/chat/completions")
        return '"choices"' in chat.stdout

    def refused(self, needle: str, variable: str = "k3_weights_source") -> subprocess.CompletedProcess[str]:
        """``plan`` and the deploy both refuse, naming the source (``variable``'s) and ``needle`` in one line, each
        node saying what it was to do; nothing is copied."""
        path = self.source if variable == "k3_weights_source" else self.archive
        what, fix = ("weights", "hf download") if variable == "k3_weights_source" else ("image", "docker save -o")
        plan = k3("plan", self.sim.inventory, check=False)
        assert plan.returncode == 2, plan.stdout[-800:] + plan.stderr
        (line,) = plan.stderr.strip().splitlines()
        assert f"{variable}: {path}" in line and needle in line and "Traceback" not in plan.stderr, plan.stderr
        run = deploy(self.sim.inventory, timeout=180)
        assert run.returncode == 2, why(run)
        (said,) = [x for x in run.stdout.splitlines() if f"{variable}: {path}" in x]
        assert needle in said and "nothing was copied to any node" in said, said
        assert fix in said, said
        first, second = self.nodes
        assert f"[{first}] did not start the stage: it was to copy the {what} from {variable} first; " \
               "nothing was copied to it" in run.stdout, why(run)
        assert f"[{second}] did not start the stage: it was to get the {what} from {first} in round 1; " \
               "nothing was copied to it" in run.stdout, why(run)
        assert "Starting operation: Stage" not in run.stdout and "Traceback" not in run.stdout, why(run)
        assert "Connection refused" not in run.stdout
        assert self.holds() == {n: [] for n in self.nodes}     # no image, no weight file, no archive anywhere
        return run


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    sim = Sim("srcgap", "gb300", 2)
    try:
        sim.set_vars("k3_strategy: multi_node_tp\n")
        here = tmp_path_factory.mktemp("site")
        # what a site brings in on a disk: a docker save archive and the hub's cache directory of the model, fetched
        # on the first node, brought to the control machine, then wiped from the node
        fetch = (f"docker pull -q {IMAGE} && docker save -o /root/image.tar {IMAGE} && "
                 f"{shlex.join(commands.download_argv('docker', CACHE, IMAGE, MODEL))}")
        got = sim.ssh(0, fetch)
        assert got.returncode == 0, got.stdout + got.stderr
        d = Path(sim.inventory).parent
        ssh = ["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o",
               "BatchMode=yes", f"root@{sim.info['nodes'][0]['ip']}"]
        (here / "image.tar").write_bytes(subprocess.run([*ssh, "cat /root/image.tar"], capture_output=True,
                                                        check=True).stdout)
        parent, name = MODEL_DIR.rsplit("/", 1)
        tar = subprocess.run([*ssh, f"tar -C {parent} -cf - {name}"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-C", str(here), "-xf", "-"], input=tar, check=True)
        wipe = sim.ssh(0, f"docker rmi {IMAGE} && rm -rf {CACHE} /root/image.tar")
        assert wipe.returncode == 0, wipe.stderr
        site = Site(sim, here / name, here / "image.tar")
        assert site.holds() == {n: [] for n in site.nodes}
        sim.set_vars(f"k3_image_archive: {here / 'image.tar'}\nk3_weights_source: {site.source}\n"
                     "k3_download_weights: false\n")
        yield site
    finally:
        sim.down()


def test_a_source_missing_a_shard_is_refused_before_any_copy(site):
    link, blob = site.shard(2)
    kept_blob = blob.with_name(blob.name + ".kept")
    target = link.readlink()
    blob.rename(kept_blob)          # the shard's blob is gone: the snapshot's link names nothing
    link.unlink()                   # and its link too: the listing lacks the name the index gives
    try:
        site.refused(f"1 of its 2 shards missing ({link.name})")
    finally:
        kept_blob.rename(blob)
        link.symlink_to(target)


def test_a_shard_cut_short_in_the_source_is_refused_before_any_copy(site):
    _, blob = site.shard(1)
    whole = blob.read_bytes()
    blob.write_bytes(whole[:len(whole) // 3])    # a copy that stopped a third of the way
    try:
        run = site.refused(f"cut short: {len(whole) // 3} bytes, its header gives {len(whole)}")
        assert "remove the short shards' blobs" in run.stdout, why(run)
    finally:
        blob.write_bytes(whole)


def test_an_image_archive_cut_short_is_refused_before_any_copy(site):
    whole = site.archive.read_bytes()
    site.archive.write_bytes(whole[:len(whole) // 2])    # a copy of the archive that stopped half way
    try:
        site.refused("is not a whole docker save archive: ", variable="k3_image_archive")
    finally:
        site.archive.write_bytes(whole)


def test_a_rotten_shard_fails_the_first_node_and_the_next_one_says_why(site):
    # the right size, one byte changed: the listing cannot see it; the first node's verification after its copy
    # does, and the node that was to copy from it says why it copied nothing
    _, blob = site.shard(1)
    whole = blob.read_bytes()
    blob.write_bytes(whole[:4096] + bytes([whole[4096] ^ 0x5A]) + whole[4097:])
    try:
        run = deploy(site.sim.inventory, timeout=240)
        assert run.returncode != 0, why(run)
        first, second = site.nodes
        assert re.search(rf"\[{first}\] bad file model-00001-of-\d+\.safetensors: sha256 \w+, but its blob is named "
                         rf"{blob.name}", run.stdout), why(run)
        assert f"[{second}] not staged: {first}, which was to send to it in this round, failed an earlier step" \
               in run.stdout, why(run)
        assert "Connection refused" not in run.stdout, why(run)
        assert "Starting operation: Configure" not in run.stdout, why(run)
    finally:
        blob.write_bytes(whole)


def test_with_the_source_whole_again_the_deploy_serves(site):
    run = deploy(site.sim.inventory, timeout=300)
    assert run.returncode == 0, why(run)
    assert site.serves()
    held = site.holds()
    assert all("image" in held[n] for n in site.nodes), held
