"""Staging at scale, as planned: each artifact crosses the uplink once, then spreads node to node along a pipelined
chain (or, with ``fanout``, in rounds where every holder hands it to one more node); holders are never sent what they
have; air-gapped sources and the per-node and shared-cache modes; the chain's copy run for real between rsync
daemons on loopback addresses, around a peer that does not answer."""

from __future__ import annotations

import contextlib
import math
import subprocess
from collections.abc import Iterator

import pytest

from k3deploy.facts.rollout import WeightsState
from k3deploy.model import commands
from k3deploy.model.staging import ARCHIVE, OUTSIDE, chain, plan_stage, summary, tree

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


@pytest.mark.parametrize("n", [2, 3, 8, 18, 72])
def test_a_chain_is_one_round_each_node_sending_once_whatever_n(n):
    hosts = [f"n{i}" for i in range(1, n + 1)]
    sp = plan_stage(hosts, [], [], mode="chain", sources=1, image_archive=False, weights_source=False, download=True,
                    shared=False)
    for art in (sp.image, sp.weights):
        assert art.fetch == {"n1": OUTSIDE} and len(art.rounds) == 1 == sp.rounds
        senders = list(art.rounds[0].values())
        assert len(senders) == len(set(senders)) == n - 1          # each node's link carries each byte out once
        assert art.rounds[0] == {hosts[i]: hosts[i - 1] for i in range(1, n)}
        assert all(art.upstream[h][-1] == "n1" for h in hosts[1:])   # routed around up to the holder
    assert summary(sp)[1] == (f"weights: n1 fetches it from outside; {n - 1} node{'s' if n > 2 else ''} "
                              f"get{'' if n > 2 else 's'} it from peers along a chain, each file handed on as it lands")


def test_a_chain_starts_at_every_holder_and_falls_back_to_the_others():
    links = chain(["n3", "n4"], NODES[:6])
    assert links == {"n1": ("n3", "n4"), "n2": ("n4", "n3"), "n5": ("n1", "n3", "n4"), "n6": ("n2", "n4", "n3")}
    sp = plan_stage(NODES[:6], ["n3", "n4"], NODES[:6], mode="chain", sources=1, image_archive=False,
                    weights_source=False, download=True, shared=False)
    assert sp.image.fetch == {} and sp.image.export == ["n3", "n4"] and sp.weights.rounds == []


# --------------------------------------------------------------------------- the chain's copy, for real (rsync)


def _rsync_port() -> int:
    """A free port for the real rsync daemons of a test (skipped where rsync is not installed)."""
    import shutil
    import socket

    if shutil.which("rsync") is None:
        pytest.skip("no rsync")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serving(tmp_path, port: int, nodes: dict) -> Iterator[None]:
    """A real rsync daemon per node address (``{address: the node's root}``, serving its hub), stopped after."""
    daemons = [_daemon(tmp_path, address, port, root / "huggingface/hub") for address, root in nodes.items()]
    try:
        yield
    finally:
        for d in daemons:
            d.terminate()
            d.wait()


def _daemon(tmp_path, address: str, port: int, hub) -> subprocess.Popen[bytes]:
    conf = tmp_path / f"{address}.conf"
    conf.write_text(f"address = {address}\nport = {port}\nuse chroot = no\nread only = yes\n"
                    f"socket options = {commands.PEERS_SOCKET_OPTIONS}\n"
                    f"[{commands.HUB_MODULE}]\n    path = {hub}\n    exclude = *.incomplete .k3-*\n")
    proc = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={conf}"])
    import socket
    import time
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex((address, port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    pytest.skip("no rsync daemon on a loopback address here")


def test_the_chain_copies_along_and_routes_around_a_peer_that_does_not_answer(tmp_path):

    port = _rsync_port()
    seed = tmp_path / "seed"
    _snapshot(seed, {"a.safetensors": b"x" * 300_000, "b.safetensors": b"y" * 1000})
    assert _sh(commands.verify_weights(str(seed), "org/m")).returncode == 0
    mid, last = tmp_path / "mid", tmp_path / "last"
    with _serving(tmp_path, port, {"127.0.0.21": seed, "127.0.0.22": mid}):
        # the last node starts first: it waits on the middle one, which copies from the seed as it is asked
        behind = subprocess.Popen(["sh", "-c", commands.relay_weights(
            [("mid", "127.0.0.22"), ("seed", "127.0.0.21")], port, str(last), "org/m", wait=2)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ahead = _sh(commands.relay_weights([("seed", "127.0.0.21")], port, str(mid), "org/m", wait=2))
        assert ahead.returncode == 0, ahead.stderr
        out, err = behind.communicate(timeout=60)
        assert behind.returncode == 0, err
        assert "routed around" not in err and "verified 3 files" in out
        for node in (mid, last):
            d = node / "huggingface/hub/models--org--m"
            assert (d / commands.VERIFIED).exists() and not list(d.glob("blobs/*.k3-part"))
        # a peer whose link is down (nothing answers at its address) is routed around, and said so
        cut = tmp_path / "cut"
        res = _sh(commands.relay_weights([("gone", "127.0.0.23"), ("mid", "127.0.0.22")], port, str(cut), "org/m",
                                         wait=2))
        assert res.returncode == 0, res.stderr
        assert "stage: gone (127.0.0.23) gave no snapshot" in res.stderr and "routed around it" in res.stderr
        # a peer whose copy of a shard went bad: copied once more, then refused, naming the blob
        shard = next(b for b in (mid / "huggingface/hub/models--org--m/blobs").iterdir() if len(b.name) == 64
                     and b.stat().st_size == 300_000)
        shard.write_bytes(b"z" * 300_000)
        rot = _sh(commands.relay_weights([("mid", "127.0.0.22")], port, str(tmp_path / "rot"), "org/m", wait=2))
        assert rot.returncode == 1 and f"stage: no peer gave a whole, good blob {shard.name} of org/m" in rot.stderr
        # no peer at all: one line naming what could not be had
        none = _sh(commands.relay_weights([("gone", "127.0.0.23")], port, str(tmp_path / "none"), "org/m", wait=1))
        assert none.returncode == 1 and "stage: no peer gave the snapshot of org/m" in none.stderr


def test_a_node_takes_a_file_once_it_holds_its_size_while_its_peer_still_hashes_its_copy(tmp_path):
    """The chain hands a file on by its size: a node whose copy holds as many bytes as the holder's blob takes it as
    its own (and verifies it itself), though its peer has not renamed its copy whole yet; the sizes come from the
    holder's listing on the first hop and from the peer's handed-on list after it."""
    import time

    port = _rsync_port()
    seed = tmp_path / "seed"
    sd = _snapshot(seed, {"a.safetensors": b"x" * 300_000, "b.safetensors": b"y" * 1000})
    mid = tmp_path / "mid"
    with _serving(tmp_path, port, {"127.0.0.41": seed, "127.0.0.42": mid}):
        first = _sh(commands.relay_weights([("seed", "127.0.0.41")], port, str(mid), "org/m", wait=2))
        assert first.returncode == 0, first.stderr
        md = mid / "huggingface/hub/models--org--m"
        listed = dict(line.split() for line in (md / commands.SIZES).read_text().splitlines())
        assert listed == {b.name: str(b.stat().st_size) for b in (sd / "blobs").iterdir()}
        # the middle node as it is while it hashes its copies: every blob whole in bytes, none renamed yet
        for blob in (md / "blobs").iterdir():
            blob.rename(blob.with_name(blob.name + ".k3-part"))
        # a peer's list is data, never script: lines that are not a name and a byte count are dropped
        pwn = tmp_path / "pwn"
        handed = (md / commands.SIZES).read_text()
        (md / commands.SIZES).write_text("".join(f"{b} 1$(touch {pwn})\n{b} -5\n" for b in listed) + "x\n"
                                         + handed)
        last = tmp_path / "last"
        took = _sh(commands.relay_weights([("mid", "127.0.0.42")], port, str(last), "org/m", wait=2))
        assert took.returncode == 0, took.stderr
        assert "routed around" not in took.stderr and "verified 3 files" in took.stdout
        ld = last / "huggingface/hub/models--org--m"
        assert sorted(b.name for b in (ld / "blobs").iterdir()) == sorted(b.name for b in (sd / "blobs").iterdir())
        assert (ld / commands.SIZES).read_text() == handed and not pwn.exists()
        (md / commands.SIZES).write_text(handed)
        # a wrong size costs a second copy, never a bad file: taken short, it fails its hash and is copied again,
        # without a size, once the peer holds it whole
        (md / commands.SIZES).write_text("".join(f"{b} {int(n) // 2}\n" for b, n in listed.items()))
        big = next(b for b, n in listed.items() if n == "300000")
        growing = md / "blobs" / f"{big}.k3-part"
        whole = growing.read_bytes()
        growing.write_bytes(whole[:200_000])      # the peer's copy of the shard still growing, past the wrong size
        short = subprocess.Popen(["sh", "-c", commands.relay_weights([("mid", "127.0.0.42")], port,
                                                                     str(tmp_path / "short"), "org/m", wait=2)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        got = tmp_path / "short/huggingface/hub/models--org--m/blobs"
        landed_bad = got.parent / ".k3-landed-bad"
        for _ in range(200):     # until the shard, taken at half its size, failed its hash (and waits for a whole)
            if landed_bad.exists() and big in landed_bad.read_text():
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the shard taken at the size its peer's list gave did not fail its hash")
        growing.write_bytes(whole)
        for part in (md / "blobs").glob("*.k3-part"):
            part.rename(part.with_name(part.name.removesuffix(".k3-part")))
        out, err = short.communicate(timeout=60)
        assert short.returncode == 0, err
        assert "verified 3 files" in out
        assert {b.name: b.read_bytes() for b in got.iterdir()} == {b.name: b.read_bytes() for b in
                                                                   (sd / "blobs").iterdir()}
        for blob in (md / "blobs").iterdir():
            blob.rename(blob.with_name(blob.name + ".k3-part"))
        # without the list (a holder that never wrote one, mid-copy), the node waits for the peer's whole file and
        # routes around a peer whose copy never becomes whole
        (md / commands.SIZES).unlink()
        waited = _sh(commands.relay_weights([("mid", "127.0.0.42")], port, str(tmp_path / "wait"), "org/m", wait=1))
        assert waited.returncode == 1 and "stalled" in waited.stderr


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


def test_the_chain_leaves_no_temporary_file_whether_it_copies_fails_or_is_killed(tmp_path):
    """rsync's messages go to a file ``mktemp`` makes; its name is gone at once, so neither a relay that copies,
    one that fails nor one killed (SIGKILL to its process group, which no ``trap`` sees) leaves it behind, and the
    full-disk message it holds is still read."""
    import os
    import signal
    import time

    port = _rsync_port()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}

    def run(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=60)

    seed, empty = tmp_path / "seed", tmp_path / "empty"
    _snapshot(seed, {"a.safetensors": b"x" * 100_000})
    (empty / "huggingface/hub").mkdir(parents=True)
    with _serving(tmp_path, port, {"127.0.0.31": seed, "127.0.0.32": empty}):
        copied = run(commands.relay_weights([("seed", "127.0.0.31")], port, str(tmp_path / "a"), "org/m", wait=2))
        assert copied.returncode == 0, copied.stderr
        failed = run(commands.relay_weights([("gone", "127.0.0.33")], port, str(tmp_path / "b"), "org/m", wait=1))
        assert failed.returncode == 1 and "no peer gave the snapshot" in failed.stderr
        # a peer that does not hold the snapshot yet: the relay waits on it, and is killed while it waits
        waiting = subprocess.Popen(["sh", "-c", commands.relay_weights([("empty", "127.0.0.32")], port,
                                                                        str(tmp_path / "c"), "org/m", wait=5)],
                                   env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not (tmp_path / "c/huggingface/hub/models--org--m/blobs").is_dir():
            assert waiting.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(waiting.pid, signal.SIGKILL)
        waiting.wait()
        assert list(tmp.iterdir()) == []
    # the messages are still there to read while the relay runs: a full disk is named
    full = run(f"{commands._relay_env([], port, 1)}; {commands.RELAY}; part=/x/f.k3-part; "
               'echo "rsync: write failed on f: No space left on device (28)" >> "$K3_ERR"; k3_full')
    assert full.returncode == 0 and "stage: this node cannot write /x/f.k3-part: rsync: write failed on f: No " \
        "space left on device (28)" in full.stderr
    assert list(tmp.iterdir()) == []


def test_the_peers_daemon_and_the_chains_clients_both_run_without_nagle():
    """rsync's protocol is many short exchanges: with Nagle's algorithm on either end each waits ~40 ms for a delayed
    ACK, which every poll of a hop pays; the daemon's configuration and the relay's rsync both set the option."""
    from k3deploy.model.binding import HostRecord
    from k3deploy.model.pipeline import desired_rollout, target
    from k3deploy.model.staging import peers_config

    given = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp"}
    r = desired_rollout(target([HostRecord("n1", ("head",), {**given, "k3_ip": "10.0.0.1"}),
                                HostRecord("n2", ("workers",), {**given, "k3_ip": "10.0.0.2"})], None))
    conf = dict(line.split(" = ", 1) for line in peers_config(r, "n1").splitlines() if " = " in line
                and not line.startswith(" "))
    assert conf["socket options"] == "TCP_NODELAY" == commands.PEERS_SOCKET_OPTIONS
    assert conf["read only"] == "yes" and conf["hosts allow"] == "10.0.0.1 10.0.0.2" and conf["address"] == "10.0.0.1"
    script = commands.relay_weights([("n1", "10.0.0.1")], 8873, "/c", "o/m")
    assert "--sockopts=TCP_NODELAY" in script and script.count("$K3_RSYNC ") >= 5
    assert " rsync " not in script.replace("$K3_RSYNC", "")     # every rsync of the chain goes through it
