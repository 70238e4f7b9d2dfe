"""A weights source checked against its checkpoint before anything is copied: every shard its index names there,
each as long as its own safetensors header says; an image archive by its listing; what a refused run says, per node;
a copy from a peer that failed names it."""

from __future__ import annotations

import io
import json
import os
import struct
import tarfile
from pathlib import Path

import pytest

from k3deploy.model.checkpoint import Shard, SourceCheck, check_archive, check_source, index_shards, length
from k3deploy.model.staging import plan_stage, refused_archive, refused_source
from k3sim.outside import Store

MiB = 1 << 20


def cache_dir(root: Path, weights_bytes: int = 3 * MiB) -> Path:
    """A model's Hugging Face cache directory as ``hf download`` leaves it, of the checkpoint the simulated hub
    serves (real safetensors headers): blobs named by their hash, the snapshot's links to them, ``refs/main``."""
    meta = Store(root / "hub", 1, weights_bytes, {}).model("org/m")
    d = root / "models--org--m"
    snapshot = d / "snapshots" / meta["sha"]
    (d / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (d / "refs").mkdir()
    (d / "refs" / "main").write_text(meta["sha"])
    for f in meta["files"]:
        blob = d / "blobs" / f.get("sha256", f["blob_id"])
        blob.write_bytes(Path(f["path"]).read_bytes())
        (snapshot / f["name"]).symlink_to(f"../../blobs/{blob.name}")
    return d


def shard(d: Path, number: int) -> Path:
    (link,) = d.glob(f"snapshots/*/model-{number:05d}-of-*.safetensors")
    return link


def safetensors(tensors: dict[str, int]) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, n in tensors.items():
        header[name] = {"dtype": "U8", "shape": [n], "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + bytes(offset)


def test_a_whole_source_passes(tmp_path):
    d = cache_dir(tmp_path)
    check = check_source(str(d))
    assert check.ok and check.problem() == "" and check.error is None
    assert [s.name for s in check.shards] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert all(s.size == s.want == shard(d, i).stat().st_size for i, s in enumerate(check.shards, 1))


def test_the_length_is_the_header_s_own():
    data = safetensors({"a": 10, "b": 7})
    assert length(data) == len(data) == length(data[:len(data) - 17])   # the header alone gives it
    assert length(data[:20]) is None                   # a header cut short gives none
    assert length(b"\xff" * 8) is None                 # a size past the format's limit
    assert length(struct.pack("<Q", 2) + b"[]") is None
    assert length(struct.pack("<Q", 30) + b'{"a": {"data_offsets": "x"}}  ') is None


def test_a_missing_blob_and_a_missing_link_are_missing(tmp_path):
    d = cache_dir(tmp_path)
    shard(d, 2).resolve().unlink()          # the link names nothing
    check = check_source(str(d))
    assert not check.ok and check.missing == ["model-00002-of-00002.safetensors"]
    assert check.problem() == "1 of its 2 shards missing (model-00002-of-00002.safetensors)"
    shard(d, 1).unlink()                     # no link at all
    assert check_source(str(d)).missing == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_a_shard_cut_short_is_named_with_both_sizes(tmp_path):
    d = cache_dir(tmp_path)
    blob = shard(d, 1).resolve()
    whole = blob.read_bytes()
    size = len(whole)
    os.truncate(blob, size - 1)
    check = check_source(str(d))
    assert check.problem() == f"model-00001-of-00002.safetensors cut short: {size - 1} bytes, its header gives {size}"
    os.truncate(blob, 100)                   # into the header
    assert check_source(str(d)).problem() == ("model-00001-of-00002.safetensors cut short or rotten: 100 bytes, no "
                                              "whole safetensors header")
    blob.write_bytes(whole + bytes(10))      # longer than its header says: no shard this index names either
    assert check_source(str(d)).problem() == f"model-00001-of-00002.safetensors {size + 10} bytes, its header gives " \
                                             f"{size}"


def test_a_snapshot_without_an_index_checks_its_safetensors_files(tmp_path):
    d = tmp_path / "models--org--one"
    snap = d / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (d / "refs").mkdir()
    (d / "refs" / "main").write_text("abc\n")
    data = safetensors({"w": 64})
    (snap / "model.safetensors").write_bytes(data)
    assert check_source(str(d)).ok
    (snap / "model.safetensors").write_bytes(data[:-1])
    assert check_source(str(d)).problem() == f"model.safetensors cut short: {len(data) - 1} bytes, its header gives " \
                                             f"{len(data)}"
    (snap / "model.safetensors").unlink()
    assert "no model.safetensors.index.json and no *.safetensors" in str(check_source(str(d)).error)


@pytest.mark.parametrize("breaks, error", [
    (lambda d: (d / "refs" / "main").unlink(), "no refs/main"),
    (lambda d: (d / "refs" / "main").write_text("feed"), "refs/main names the snapshot 'feed', which is not there"),
    (lambda d: next(d.glob("snapshots/*/model.safetensors.index.json")).write_text("{}"), "cannot be read"),
])
def test_a_directory_that_is_no_readable_snapshot_says_why(tmp_path, breaks, error):
    d = cache_dir(tmp_path)
    breaks(d)
    check = check_source(str(d))
    assert not check.ok and error in check.problem()


def test_the_index_names_each_shard_once():
    assert index_shards(json.dumps({"weight_map": {"x": "b", "y": "a", "z": "b"}})) == ["a", "b"]
    with pytest.raises(ValueError):
        index_shards("[]")


def test_only_the_first_bytes_of_a_shard_are_read(tmp_path):
    # a sparse 64 GiB shard: its header says how long it is; the check does not read the rest
    d = tmp_path / "models--org--big"
    snap = d / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (d / "refs").mkdir()
    (d / "refs" / "main").write_text("abc")
    text = json.dumps({"w": {"dtype": "U8", "shape": [64 << 30], "data_offsets": [0, 64 << 30]}}).encode()
    head = struct.pack("<Q", len(text)) + text
    with (snap / "model.safetensors").open("wb") as f:
        f.write(head)
        f.truncate(len(head) + (64 << 30))
    assert check_source(str(d)).ok


def test_a_refused_run_says_per_node_what_it_was_to_do():
    nodes = ["n1", "n2", "n3", "n4"]
    sp = plan_stage(nodes, [], [], mode="fanout", sources=1, image_archive=True, weights_source=True, download=False,
                    shared=False)
    bad = SourceCheck("/site/models--org--m", "c0ffee", (Shard("m-1.safetensors", 10, 4096),))
    first, *per_node = refused_source(sp, bad, nodes, where="group_vars/all.yml", model="org/m")
    assert first == ("k3_weights_source: /site/models--org--m (group_vars/all.yml) lacks part of the checkpoint its "
                     "index names (snapshot c0ffee): m-1.safetensors cut short: 10 bytes, its header gives 4096: "
                     "complete it from the hub or a whole copy (remove the short shards' blobs, then `hf download "
                     "org/m --cache-dir /site` fetches what is missing) and run again; nothing was copied to any node")
    assert per_node == [
        "  [n1] did not start the stage: it was to copy the weights from k3_weights_source first; nothing was copied "
        "to it",
        "  [n2] did not start the stage: it was to get the weights from n1 in round 1; nothing was copied to it",
        "  [n3] did not start the stage: it was to get the weights from n1 in round 2; nothing was copied to it",
        "  [n4] did not start the stage: it was to get the weights from n2 in round 2; nothing was copied to it"]
    some = plan_stage(nodes[:2], [], ["n2"], mode="fanout", sources=1, image_archive=True, weights_source=True,
                      download=False, shared=False)
    assert not some.weights.fetch      # a node holds them: the source is not read (nor refused)


def test_a_copy_from_a_peer_names_the_peer():
    from k3deploy.model.binding import HostRecord
    from k3deploy.model.pipeline import desired_rollout, target
    from k3deploy.model.steps import StageKind, StagePart, fresh, stage

    hosts = [HostRecord(f"n{i}", ("head",) if i == 1 else ("workers",), {"k3_hardware": "gb300",
                                                                          "k3_ip": f"10.0.0.{i}"}) for i in (1, 2)]
    rollout = desired_rollout(target(hosts, None))
    (step,) = [s for s in stage(rollout, fresh(rollout)) if s.kind == StageKind(StagePart.ROUND, 0) and s.applies]
    assert step.host == "n2" and step.peers == ("n1",)


def archive(path: Path, layers: dict[str, bytes], named: list[str] | None = None) -> Path:
    """A ``docker save`` archive as docker 25+ writes it: the blobs, then ``index.json`` and ``manifest.json``."""
    manifest = [{"Config": "blobs/sha256/c", "RepoTags": ["r/i:t"],
                 "Layers": named if named is not None else [f"blobs/sha256/{n}" for n in layers]}]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in {"blobs/sha256/c": b"{}", **{f"blobs/sha256/{n}": d for n, d in layers.items()},
                           "index.json": b"{}", "manifest.json": json.dumps(manifest).encode()}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_whole_archive_passes_and_one_cut_short_does_not(tmp_path):
    a = archive(tmp_path / "i.tar", {"l1": os.urandom(300_000), "l2": os.urandom(200_000)})
    assert check_archive(str(a)) is None
    l1 = tarfile.open(a).getmember("blobs/sha256/l1")
    whole = a.read_bytes()
    a.write_bytes(whole[:150_000])                        # in the first layer
    assert check_archive(str(a)) == ("blobs/sha256/l1 cut short: the file ends at byte 150000, the member at "
                                     f"{l1.offset_data + 300_000}")
    with tarfile.open(tmp_path / "i2.tar", "w") as tar:   # a copy that stopped between the layers and the manifest
        for m in tarfile.open(archive(tmp_path / "full.tar", {"l1": b"x" * 10})):
            if m.name != "manifest.json":
                tar.addfile(m, io.BytesIO(b"x" * m.size))
    assert check_archive(str(tmp_path / "i2.tar")) == "no manifest.json (cut short?)"


def test_an_archive_naming_a_layer_it_lacks_or_no_tar_at_all_is_refused(tmp_path):
    a = archive(tmp_path / "i.tar", {"l1": b"x"}, named=["blobs/sha256/l1", "blobs/sha256/gone"])
    assert check_archive(str(a)) == "1 of the files its manifest.json names missing (blobs/sha256/gone)"
    (tmp_path / "no.tar").write_bytes(b"not a tar" * 100)
    assert "not a tar archive" in str(check_archive(str(tmp_path / "no.tar")))
    assert "not a tar archive" in str(check_archive(str(tmp_path / "absent.tar")))


def test_a_refused_archive_says_per_node_what_it_was_to_do():
    sp = plan_stage(["n1", "n2", "n3"], [], [], mode="fanout", sources=1, image_archive=True,
                    weights_source=False, download=True, shared=False)
    first, *per_node = refused_archive(sp, "no manifest.json (cut short?)", ["n1", "n2", "n3"], archive="/a/i.tar",
                                       where="group_vars/all.yml", image="r/i@sha256:" + "a" * 64)
    assert first.startswith("k3_image_archive: /a/i.tar (group_vars/all.yml) is not a whole docker save archive: no "
                            "manifest.json (cut short?): write it again (`docker save -o /a/i.tar r/i@sha256:")
    assert first.endswith("and run again; nothing was copied to any node")
    assert [line.split(";")[0] for line in per_node] == [
        "  [n1] did not start the stage: it was to copy the image from k3_image_archive first",
        "  [n2] did not start the stage: it was to get the image from n1 in round 1",
        "  [n3] did not start the stage: it was to get the image from n1 in round 2"]
