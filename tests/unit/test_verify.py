"""Every file of the weights hashed again before an engine starts, and by ``k3deploy verify``: the real scripts under
dash on a tiny Hugging Face cache (a shard kept in LFS, a file kept in git, a byte flipped with its time stamp kept,
a missing shard); the stage's leftover rsync daemon as preflight reports it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import pytest

from k3deploy.facts.rollout import StageDaemon, StagePeers, WeightsHashes, WeightsState
from k3deploy.model import commands
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.checks import HostFacts, run_checks

pytestmark = pytest.mark.skipif(shutil.which("dash") is None, reason="dash is not installed")

SHARD_A, SHARD_B, CONFIG = b"a" * 3000, b"b" * 2000, b'{"model_type": "kimi_k3"}\n'


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def cache(root, shards: dict[str, bytes], index: list[str] | None = None):
    """The hub's layout: blobs named by their sha256 (LFS) or git blob id, snapshot links, refs/main."""
    d = root / "huggingface/hub/models--org--m"
    (d / "blobs").mkdir(parents=True)
    (d / "snapshots/abc").mkdir(parents=True)
    (d / "refs").mkdir()
    (d / "refs/main").write_text("abc")
    index_doc = json.dumps({"metadata": {}, "weight_map": {f"t{i}": n for i, n in enumerate(index or shards)}})
    files = {**shards, "model.safetensors.index.json": index_doc.encode(), "config.json": CONFIG}
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob(data)
        (d / "blobs" / blob).write_bytes(data)
        (d / "snapshots/abc" / name).symlink_to(f"../../blobs/{blob}")
    return d


def dash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["dash", "-c", script], capture_output=True, text=True)


def blob_of(d, data: bytes):
    return d / "blobs" / hashlib.sha256(data).hexdigest()


def flip_keeping_mtime(path) -> None:
    """One byte changed, the file's time stamps put back (what ``touch -r`` does)."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def weights_state(root):
    return WeightsState().process(dash(WeightsState().command(str(root), "org/m")).stdout.splitlines())


def test_a_good_snapshot_passes_every_file_shards_and_git_files(tmp_path):
    cache(tmp_path, {"m-1.safetensors": SHARD_A, "m-2.safetensors": SHARD_B})
    res = dash(commands.check_snapshot(str(tmp_path), "org/m"))
    assert res.returncode == 0, res.stderr
    check = WeightsHashes().process(res.stdout.splitlines())
    d = tmp_path / "huggingface/hub/models--org--m"
    assert check.ok and check.files == 4 and check.seconds is not None and not check.problems()
    assert check.bytes == sum(p.stat().st_size for p in (d / "blobs").iterdir())


def test_a_byte_flipped_with_its_mtime_kept_is_found_though_the_facts_trust_it(tmp_path):
    d = cache(tmp_path, {"m-1.safetensors": SHARD_A, "m-2.safetensors": SHARD_B})
    assert dash(commands.verify_weights(str(tmp_path), "org/m")).returncode == 0
    flip_keeping_mtime(blob_of(d, SHARD_B))
    assert weights_state(tmp_path).verified   # the cheap read trusts a file not newer than the mark
    res = dash(commands.verify_before_start(str(tmp_path), "org/m"))
    assert res.returncode == 1
    flipped = bytearray(SHARD_B)
    flipped[100] ^= 0x01
    want = (f"bad file m-2.safetensors: sha256 {hashlib.sha256(bytes(flipped)).hexdigest()}, but its blob is named "
            f"{hashlib.sha256(SHARD_B).hexdigest()}")
    assert want in res.stderr, res.stderr
    assert "m-1.safetensors" not in res.stderr
    # the snapshot is no longer marked verified: the next rollout copies the bad blob again from a peer
    assert not (d / commands.VERIFIED).exists() and not weights_state(tmp_path).verified
    assert (d / commands.BAD).read_text().split() == [str(blob_of(d, SHARD_B))]


def test_a_changed_git_file_a_missing_shard_and_a_missing_blob_are_each_named(tmp_path):
    d = cache(tmp_path, {"m-1.safetensors": SHARD_A, "m-2.safetensors": SHARD_B},
              index=["m-1.safetensors", "m-2.safetensors", "m-3.safetensors"])
    config = d / "blobs" / git_blob(CONFIG)
    config.write_bytes(CONFIG.replace(b"k3", b"k2"))
    blob_of(d, SHARD_A).unlink()
    res = dash(commands.check_snapshot(str(tmp_path), "org/m"))
    assert res.returncode == 1
    check = WeightsHashes().process(res.stdout.splitlines())
    assert check.missing == ("m-3.safetensors",)
    problems = check.problems()
    assert "missing shard m-3.safetensors" in problems
    assert f"m-1.safetensors: its blob {hashlib.sha256(SHARD_A).hexdigest()} is missing" in problems
    assert (f"config.json: git-blob {git_blob(CONFIG.replace(b'k3', b'k2'))}, but its blob is named "
            f"{git_blob(CONFIG)}") in problems
    assert "missing shard m-3.safetensors" in res.stderr
    # the read-only check (k3deploy verify) writes nothing next to the weights
    assert not (d / commands.BAD).exists()


def test_the_hash_tools_fall_back_to_coreutils_without_openssl(tmp_path):
    d = cache(tmp_path, {"m-1.safetensors": SHARD_A})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("readlink", "wc", "cat", "sha256sum", "sha1sum", "find", "xargs", "nproc", "grep", "tr", "sort",
                 "awk", "date", "ls", "sh", "dash", "rm", "touch", "sed"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bin_dir)}
    ok = subprocess.run(["dash", "-c", commands.check_snapshot(str(tmp_path), "org/m")], capture_output=True,
                        text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    flip_keeping_mtime(blob_of(d, SHARD_A))
    bad = subprocess.run(["dash", "-c", commands.check_snapshot(str(tmp_path), "org/m")], capture_output=True,
                         text=True, env=env)
    assert bad.returncode == 1 and "bad file m-1.safetensors: sha256" in bad.stderr


def test_no_snapshot_is_a_failure_with_the_reason(tmp_path):
    res = dash(commands.check_snapshot(str(tmp_path), "org/m"))
    assert res.returncode == 1 and "no snapshot of org/m" in res.stderr
    assert not WeightsHashes().process(res.stdout.splitlines()).ok


# ----------------------------------------------------------------------------- the stage's leftover daemon


def _sel() -> Requirements:
    from k3deploy.recipe.taxonomy import hardware

    return Requirements(hardware=hardware()["gb300"], variant="default", vram_minimum_gb=None, nodes=1,
                        strategy=None, multi_node=False)


def test_preflight_warns_of_a_stage_daemon_a_killed_run_left_running():
    facts = StagePeers().process(["ActiveState=active", "ActiveEnterTimestamp=Mon 2026-01-05 10:00:00 UTC",
                                  "K3_EXIT=0"])
    results = run_checks(_sel(), [HostFacts(host="node0", stage_peers=facts)])
    (warn,) = [r for r in results if r.check == "stage.peers"]
    assert warn.status == "warn" and warn.host == "node0"
    assert f"{commands.PEERS_UNIT}.service active since Mon 2026-01-05 10:00:00 UTC" in warn.observed
    assert f"systemctl stop {commands.PEERS_UNIT}" in warn.fix
    quiet = run_checks(_sel(), [HostFacts(host="node0", stage_peers=StagePeers().process(["K3_EXIT=0"]))])
    assert not [r for r in quiet if r.check == "stage.peers"]
    assert not [r for r in run_checks(_sel(), [HostFacts(host="node0", stage_peers=StageDaemon("failed"))])
                if r.check == "stage.peers"]

