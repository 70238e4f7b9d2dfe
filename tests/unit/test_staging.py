"""Staging at scale, as planned: each artifact crosses the uplink once, then spreads node to node in rounds where
every holder hands it to one more node; holders are never sent what they have; air-gapped sources and the
per-node and shared-cache modes."""

from __future__ import annotations

import math
import subprocess

import pytest

from k3deploy.facts.rollout import WeightsState
from k3deploy.model import commands
from k3deploy.model.staging import ARCHIVE, OUTSIDE, plan_stage, summary, tree

NODES = [f"n{i}" for i in range(1, 19)]


def _receivers_get_it_from_holders(holders, rounds):
    have = set(holders)
    for step in rounds:
        assert set(step.values()) <= have                      # only holders send
        assert len(set(step.values())) == len(step)            # each sends to one node per round
        assert not set(step) & have                            # nobody receives what it has
        have |= set(step)
    return have


@pytest.mark.parametrize("n", [2, 3, 8, 18, 72])
def test_a_fresh_cluster_fetches_once_and_spreads_in_log2_rounds(n):
    hosts = [f"n{i}" for i in range(1, n + 1)]
    sp = plan_stage(hosts, [], [], mode="fanout", sources=1, image_archive=False, weights_source=False,
                    download=True, shared=False)
    for art in (sp.image, sp.weights):
        assert art.fetch == {"n1": OUTSIDE}
        assert len(art.rounds) == math.ceil(math.log2(n))
        assert _receivers_get_it_from_holders(["n1"], art.rounds) == set(hosts)
    assert sp.image.export == []  # the fetching node writes its archive as it pulls


def test_nodes_that_hold_an_artifact_send_it_and_are_sent_nothing():
    sp = plan_stage(NODES, ["n3", "n4"], NODES[:17], mode="fanout", sources=1, image_archive=False,
                    weights_source=False, download=True, shared=False)
    assert sp.image.fetch == {} and sp.weights.fetch == {}
    assert sp.weights.rounds == [{"n18": "n1"}]                # one node lost its weights: one copy, from a peer
    assert _receivers_get_it_from_holders(["n3", "n4"], sp.image.rounds) == set(NODES)
    assert set(sp.image.export) == {"n3", "n4"}                # holders write the archive they hand on


def test_nothing_to_do_when_every_node_holds_both():
    sp = plan_stage(NODES, NODES, NODES, mode="fanout", sources=1, image_archive=False, weights_source=False,
                    download=True, shared=False)
    assert sp.rounds == 0 and sp.takes_part == [] and sp.senders == []
    assert summary(sp) == ["image: on every engine node already", "weights: on every engine node already"]


def test_several_sources_fetch_in_parallel_when_asked():
    sp = plan_stage(NODES[:8], [], [], mode="fanout", sources=2, image_archive=False, weights_source=False,
                    download=True, shared=False)
    assert sp.weights.fetch == {"n1": OUTSIDE, "n2": OUTSIDE}
    assert len(sp.weights.rounds) == 2


def test_per_node_mode_fetches_on_every_node_that_lacks_it():
    sp = plan_stage(NODES[:4], ["n2"], [], mode="per_node", sources=1, image_archive=False, weights_source=False,
                    download=True, shared=False)
    assert set(sp.image.fetch) == {"n1", "n3", "n4"} and sp.rounds == 0
    assert set(sp.weights.fetch) == {"n1", "n2", "n3", "n4"}


def test_air_gapped_sources_come_from_the_control_machine_once():
    sp = plan_stage(NODES[:8], [], [], mode="fanout", sources=1, image_archive=True, weights_source=True,
                    download=False, shared=False)
    assert sp.image.fetch == {"n1": ARCHIVE} and sp.weights.fetch == {"n1": ARCHIVE}
    assert "the control machine" in summary(sp)[0]


def test_without_download_the_weights_must_be_there_already():
    sp = plan_stage(NODES[:3], [], [], mode="fanout", sources=1, image_archive=False, weights_source=False,
                    download=False, shared=False)
    assert sp.weights.fetch == {} and sp.weights.rounds == [] and sp.weights.require == ["n1", "n2", "n3"]
    some = plan_stage(NODES[:3], [], ["n2"], mode="fanout", sources=1, image_archive=False, weights_source=False,
                      download=False, shared=False)
    assert some.weights.require == [] and _receivers_get_it_from_holders(["n2"], some.weights.rounds) == \
        set(NODES[:3])


def test_a_shared_cache_is_filled_by_the_first_node_only():
    sp = plan_stage(NODES[:4], [], [], mode="fanout", sources=1, image_archive=False, weights_source=False,
                    download=True, shared=True)
    assert sp.weights.fetch == {"n1": OUTSIDE} and sp.weights.rounds == []


def test_tree_needs_a_holder():
    assert tree([], ["a", "b"]) == []


# --------------------------------------------------------------------------- verification, for real (sha256sum)


def _snapshot(root, shards: dict[str, bytes], index: list[str] | None = None):
    import hashlib
    import json

    d = root / "huggingface/hub/models--org--m"
    (d / "blobs").mkdir(parents=True)
    snap = d / "snapshots/abc"
    snap.mkdir(parents=True)
    (d / "refs").mkdir()
    (d / "refs/main").write_text("abc")
    names = index if index is not None else list(shards)
    files = {**shards, "model.safetensors.index.json": json.dumps(
        {"metadata": {}, "weight_map": {f"t{i}": n for i, n in enumerate(names)}}).encode()}
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else \
            hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()   # the hub's name of a file kept in git
        (d / "blobs" / blob).write_bytes(data)
        (snap / name).symlink_to(f"../../blobs/{blob}")
    return d


def _sh(script):
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True)


def test_verification_passes_a_whole_snapshot_and_marks_it(tmp_path):
    d = _snapshot(tmp_path, {"a.safetensors": b"x" * 1000, "b.safetensors": b"y" * 10})
    res = _sh(commands.verify_weights(str(tmp_path), "org/m"))
    assert res.returncode == 0, res.stderr
    assert (d / commands.VERIFIED).exists() and "verified 3 files" in res.stdout
    status = WeightsState().process(_sh(WeightsState().command(str(tmp_path), "org/m")).stdout.splitlines())
    assert status.verified and status.revision == "abc"


def test_verification_finds_a_corrupted_shard_and_a_missing_one(tmp_path):
    import hashlib

    d = _snapshot(tmp_path, {"a.safetensors": b"x" * 1000}, index=["a.safetensors", "b.safetensors"])
    blob = next(p for p in (d / "blobs").iterdir() if len(p.name) == 64)
    blob.write_bytes(b"z" * 1000)   # same size, other bytes
    res = _sh(commands.verify_weights(str(tmp_path), "org/m"))
    assert res.returncode == 1
    assert "missing shard b.safetensors" in res.stderr and f"bad file a.safetensors: sha256 {hashlib.sha256(b'z' * 1000).hexdigest()}, but its blob is named {blob.name}" \
        in res.stderr
    assert (d / commands.BAD).read_text().split() == [str(blob)]
    assert not (d / commands.VERIFIED).exists()
    status = WeightsState().process(_sh(WeightsState().command(str(tmp_path), "org/m")).stdout.splitlines())
    assert not status.complete and status.missing == ("b.safetensors",)


def test_a_file_changed_after_verification_is_seen(tmp_path):
    import os
    import time

    d = _snapshot(tmp_path, {"a.safetensors": b"x" * 100})
    assert _sh(commands.verify_weights(str(tmp_path), "org/m")).returncode == 0
    blob = next(p for p in (d / "blobs").iterdir() if len(p.name) == 64)
    later = time.time() + 5
    os.utime(blob, (later, later))
    status = WeightsState().process(_sh(WeightsState().command(str(tmp_path), "org/m")).stdout.splitlines())
    assert status.complete and not status.verified and status.changed == ("a.safetensors",)


def test_no_snapshot_is_not_complete(tmp_path):
    status = WeightsState().process(_sh(WeightsState().command(str(tmp_path), "org/m")).stdout.splitlines())
    assert status.revision is None and not status.complete and status.describe() == "no snapshot"
