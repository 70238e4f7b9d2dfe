"""Progress of a long build or copy for people: a plain line every few seconds where the output is not a terminal
(bytes, share of the expected total, rate, time left), rich's bar on a terminal, nothing when quiet (``--json``);
the simulated nodes' base root build shows its bytes on disk against the last build's."""

from __future__ import annotations

import io
import json
import re
import threading

from k3deploy.runtime.progress import Meter, tree_bytes, watch

MIB = 2**20


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_every_few_seconds_with_bytes_rate_and_time_left():
    out, clock = io.StringIO(), Clock()
    meter = Meter("weights", 100 * MIB, stream=out, every=10, clock=clock)
    for second in range(1, 31):          # 2 MiB a second for 30 s
        clock.now = second
        meter.update(2 * MIB * second)
    meter.close()
    lines = out.getvalue().splitlines()
    assert lines == ["weights: 20.0 MiB of ~100.0 MiB (20%), 2.0 MiB/s, about 40 s left",
                     "weights: 40.0 MiB of ~100.0 MiB (40%), 2.0 MiB/s, about 30 s left",
                     "weights: 60.0 MiB of ~100.0 MiB (60%), 2.0 MiB/s, about 20 s left"]


def test_quiet_says_nothing():
    out, clock = io.StringIO(), Clock()
    meter = Meter("weights", 100 * MIB, stream=out, every=0, quiet=True, clock=clock)
    clock.now = 5
    meter.update(50 * MIB)
    meter.close()
    assert out.getvalue() == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_with_bytes_and_no_plain_lines():
    out, clock = Terminal(), Clock()
    meter = Meter("image", 10 * MIB, stream=out, every=0, clock=clock)
    clock.now = 1
    meter.update(5 * MIB)
    meter.bar.refresh()
    meter.close()
    shown = out.getvalue()
    assert "image" in shown and re.search(r"5\.\d/10\.\d MiB", shown), shown
    assert "about" not in shown                   # rich's own columns, not the plain line


def test_watch_measures_a_growing_directory_while_the_work_runs(tmp_path):
    out = io.StringIO()
    grown = threading.Event()

    def measure() -> int:
        (tmp_path / f"f{len(list(tmp_path.iterdir()))}").write_bytes(b"x" * MIB)
        if tree_bytes(tmp_path) >= 3 * MIB:
            grown.set()
        return tree_bytes(tmp_path)

    with watch("root", measure, total=8 * MIB, stream=out, every=0, poll=0.01):
        assert grown.wait(10)
    assert re.match(r"root: \d\.0 MiB of ~8\.0 MiB \(\d+%\)", out.getvalue().splitlines()[0]), out.getvalue()


def test_the_base_root_expects_what_the_last_build_took(tmp_path, monkeypatch):
    from k3sim import base

    monkeypatch.setenv("K3SIM_CACHE", str(tmp_path))
    assert base.expected_bytes() == base.BASE_BYTES
    (tmp_path / "base-0123").mkdir()
    (tmp_path / "base-0123" / base.MARKER).write_text(json.dumps({"id": "0123", "bytes": 286525633}))
    assert base.expected_bytes() == 286525633


# -- the stage's copies: what each step copies where, measured as it runs ----------------------------------------


def _tray_rollout(n: int, **more: object):
    from k3deploy.model.binding import HostRecord
    from k3deploy.model.pipeline import desired_rollout, target

    given = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp", **more}
    hosts = [HostRecord(f"n{i}", ("head",) if i == 1 else ("workers",), {**given, "k3_ip": f"10.0.0.{i}"})
             for i in range(1, n + 1)]
    r = desired_rollout(target(hosts, None))
    return r.decided(set(r.groups))


def test_each_receiver_of_a_chain_measures_its_copies_against_the_holder_it_starts_from():
    from k3deploy.model import commands, steps
    from k3deploy.model.stagecopies import Index, copies

    r = _tray_rollout(4)
    plan = steps.fresh(r)
    v = r.vars
    blobs = commands.model_dir(v.k3_model_cache, r.plan.model) + "/blobs/"
    archive = commands.archive_path(v.k3_stage_dir, r.plan.image)
    made = {(s.host, s.kind): copies(r, plan, s) for s in steps.stage(r, plan)}
    # n1 fetches from outside: the hub's download and docker's pull are measured, each against its source's index
    assert [(c.what, c.paths, c.source) for c in made[("n1", steps.HUB)]] == [("weights", (blobs,), None)]
    assert made[("n1", steps.HUB)][0].index == Index(commands.hub_index(None, r.plan.model), "hub")
    assert [(c.what, c.paths, c.index) for c in made[("n1", steps.PULL)]] == [
        ("image", (), Index(commands.image_index(v.k3_docker, r.plan.image), "image"))]
    rounds = {h: c for (h, kind), c in made.items() if kind is not None and kind.part is steps.StagePart.ROUND}
    assert rounds["n1"] == ()
    for h in ("n2", "n3", "n4"):   # along the chain n1 -> n2 -> n3 -> n4: each against n1, which holds them whole
        assert [(c.shown, c.paths) for c in rounds[h]] == [("image from n1", (archive,)),
                                                            ("weights from n1", (blobs,))]
    # the tree sends whole files: each receiver against its sender of the round
    tree = steps.stage(_tray_rollout(4, k3_stage="fanout"), plan := steps.fresh(_tray_rollout(4, k3_stage="fanout")))
    sources = {(s.host, s.kind.round): {c.source for c in copies(_tray_rollout(4, k3_stage="fanout"), plan, s)}
               for s in tree if s.kind is not None and s.kind.part is steps.StagePart.ROUND and s.applies}
    assert sources == {("n2", 0): {"n1"}, ("n3", 1): {"n1"}, ("n4", 1): {"n2"}}


def test_a_copy_from_the_control_machine_is_measured_against_the_control_machines_copy(tmp_path):
    from k3deploy.model import steps
    from k3deploy.model.stagecopies import copies

    (tmp_path / "models--o--m" / "refs").mkdir(parents=True)
    (tmp_path / "models--o--m" / "snapshots").mkdir()
    (tmp_path / "models--o--m" / "refs" / "main").write_text("c0ffee")
    (tmp_path / "i.tar").write_bytes(b"")
    r = _tray_rollout(2, k3_weights_source=str(tmp_path / "models--o--m"), k3_image_archive=str(tmp_path / "i.tar"))
    plan = steps.fresh(r)
    made = {(s.host, s.kind): copies(r, plan, s) for s in steps.stage(r, plan)}
    (weights,) = made[("n1", steps.WEIGHTS_COPY)]
    (image,) = made[("n1", steps.ARCHIVE_COPY)]
    assert weights.local == str(tmp_path / "models--o--m") + "/" and weights.shown == "weights from the control machine"
    assert image.local == str(tmp_path / "i.tar") and image.what == "image archive"
    assert made[("n2", steps.WEIGHTS_COPY)] == ()


def test_the_bytes_of_a_copy_count_its_partial_names_and_nothing_else(tmp_path):
    """The node's read (run here by the same shell): a file under its chain, tree and rsync names, so its bytes do
    not drop when it is renamed whole; the checksum beside it and other files are not counted."""
    import subprocess

    from k3deploy.model.commands import copied_bytes

    stage, blobs = tmp_path / "stage", tmp_path / "hub" / "blobs"
    stage.mkdir()
    blobs.mkdir(parents=True)
    (stage / "i.tar.k3-part").write_bytes(b"x" * 1000)
    (stage / ".i.tar.Ab12Cd").write_bytes(b"x" * 24)
    (stage / "i.tar.sha256").write_bytes(b"x" * 64)
    (stage / "other.tar").write_bytes(b"x" * 5000)
    (blobs / "aa").write_bytes(b"x" * 300)
    (blobs / "bb.incomplete").write_bytes(b"x" * 200)
    script = copied_bytes([[str(stage / "i.tar")], [str(blobs) + "/"], [str(tmp_path / "none") + "/"]])
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1024", "500", "0"]
    (stage / "i.tar.k3-part").rename(stage / "i.tar")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "1024"


def test_a_board_shows_several_copies_each_with_its_own_rate_and_a_last_line_each():
    from k3deploy.runtime.progress import Board

    out, clock = io.StringIO(), Clock()
    board = Board(out, every=10, clock=clock)
    board.begin("a", "[n2] stage: image from n1", None)
    board.begin("b", "[n3] stage: weights from n1", 100 * MIB)
    board.update("a", 0, 64 * MIB)       # the total read from the holder
    for second in range(1, 13):         # a: 4 MiB/s, b: 8 MiB/s
        clock.now = second
        board.update("a", 4 * MIB * second)
        board.update("b", 8 * MIB * second)
    board.end("a", None, ok=False)      # its step failed: where it stopped
    clock.now = 13
    board.end("b", 90 * MIB, ok=True)   # its step succeeded: it holds the whole
    board.end("b", 0, ok=True)          # (ended once)
    assert out.getvalue().splitlines() == [
        "[n2] stage: image from n1: 40.0 MiB of ~64.0 MiB (62%), 4.0 MiB/s, about 6 s left",
        "[n3] stage: weights from n1: 80.0 MiB of ~100.0 MiB (80%), 8.0 MiB/s, about 2 s left",
        "[n2] stage: image from n1: stopped at 48.0 MiB of 64.0 MiB (75%) after 12 s",
        "[n3] stage: weights from n1: 100.0 MiB of 100.0 MiB, done in 13 s (7.7 MiB/s)"]


def test_a_quiet_board_says_nothing():
    from k3deploy.runtime.progress import Board

    out = io.StringIO()
    board = Board(out, every=0, quiet=True)
    board.begin("a", "x", 10)
    board.update("a", 5)
    board.end("a", 10, ok=True)
    assert out.getvalue() == ""


def test_a_step_shows_its_copies_while_its_command_runs_and_stops_reading_when_it_ends(tmp_path, monkeypatch):
    """A real pyinfra host (``@local``: this machine) runs a stage step's command, a copy that grows a file for about
    4 s; while it runs the bytes are read beside it (the whole size first: here the control machine's copy, as an
    air-gapped site's), a plain line is said every ``every`` seconds, one as the step ends; then no read is left
    running. A step that fails says where it stopped."""
    import gevent
    from pyinfra.api import Config, Inventory, State

    from k3deploy.model.stagecopies import Copied
    from k3deploy.preflight import runner
    from k3deploy.runtime import stageprogress
    from k3deploy.runtime.progress import Board

    runner.quiet_pyinfra()
    inventory = Inventory((["@local"], {}))
    state = State(inventory=inventory, config=Config())
    host = inventory.get_host("@local")
    host.connect(raise_exceptions=True)
    holder, dest = tmp_path / "holder" / "i.tar", tmp_path / "dest" / "i.tar"
    holder.parent.mkdir()
    dest.parent.mkdir()
    holder.write_bytes(b"x" * 5 * MIB)
    out = io.StringIO()
    monkeypatch.setattr(stageprogress, "_board", Board(out, every=0.5))
    monkeypatch.setattr(stageprogress, "POLL", 0.25)
    copy = Copied("image", (str(dest),), local=str(holder))
    seen: list[gevent.Greenlet] = []
    spawn = gevent.spawn

    def spawned(*args: object, **kwargs: object) -> gevent.Greenlet:
        made = spawn(*args, **kwargs)
        if getattr(args[0], "__module__", None) == stageprogress.__name__:   # the copies' reader (not pyinfra's own)
            seen.append(made)
        return made

    monkeypatch.setattr(gevent, "spawn", spawned)
    grow = (f"for i in 1 2 3 4 5; do head -c {MIB} /dev/zero >> {dest}.k3-part; sleep 0.8; done; "
            f"mv {dest}.k3-part {dest}")
    ok, _ = stageprogress.Watched("sh", "-c", repr(grow), copies=(copy,)).execute(state, host, {})
    said = "[@local] stage: image from the control machine: "
    lines = out.getvalue().splitlines()
    assert ok and lines[-1].startswith(said + "5.0 MiB of 5.0 MiB, done in ")
    # (on a loaded machine a read may come before the first byte: "0 B of ~5.0 MiB (0%)", no rate yet)
    assert any(re.fullmatch(re.escape(said) + r"(\d+ B|\d+\.\d [KM]iB) of ~5\.0 MiB \(\d+%\)"
                            r"(, [\d.]+ ([KM]i)?B/s)?(, about \d+ s left)?", line) for line in lines[:-1]), lines
    assert seen and all(g.dead for g in seen)       # the read stopped with the step
    # a step that fails: where the copy stopped, from one last read
    out.truncate(0)
    out.seek(0)
    dest.unlink()
    cut = f"head -c {2 * MIB} /dev/zero > {dest}.k3-part; exit 3"
    ok, _ = stageprogress.Watched("sh", "-c", repr(cut), copies=(copy,)).execute(state, host, {})
    assert not ok
    assert re.fullmatch(re.escape(said) + r"stopped at 2\.0 MiB of 5\.0 MiB \(40%\) after \d+ s\n", out.getvalue())


def test_on_a_terminal_the_copies_are_bars_and_their_last_lines_stay():
    """rich's bars, one live display for all the copies, gone when the last ends; each copy's last line stays, its
    "[host]" as text (not taken for rich markup)."""
    from k3deploy.runtime.progress import Board

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    board = Board(out)
    board.begin("a", "[n2] stage: image from n1", None)
    board.begin("b", "[n3] stage: weights from n1", 100 * MIB)
    board.update("a", MIB, 50 * MIB)
    board.update("b", 60 * MIB)
    assert board.bar is not None and len(board.bar.tasks) == 2
    board.end("a", None, ok=True)
    board.end("b", 70 * MIB, ok=False)
    assert board.bar is None
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert re.search(r"(^|\r)\[n2\] stage: image from n1: 50\.0 MiB of 50\.0 MiB, done in ", text, re.M)
    assert re.search(r"(^|\r)\[n3\] stage: weights from n1: stopped at 70\.0 MiB of 100\.0 MiB \(70%\)", text, re.M)


def test_a_holder_s_whole_size_is_read_once_for_every_receiver_of_a_step(monkeypatch):
    """Every receiver of a step copies from the same holder: its size is read once, the other receivers wait for that
    answer; a read that gets no answer is asked again by the next receiver."""
    import gevent

    from k3deploy.model.stagecopies import Copied
    from k3deploy.runtime import stageprogress

    reads: list[str] = []
    answers = iter([None, [7 * MIB]])

    class Holder:
        name, connected = "n1", True

    class Inventory:
        def get_host(self, name: str, default: object = None) -> object:
            return Holder() if name == "n1" else default

    class State:
        inventory = Inventory()

    def read(host: object, copies: object, arguments: object) -> list[int] | None:
        reads.append(getattr(host, "name", "?"))
        gevent.sleep(0.05)
        return next(answers)

    monkeypatch.setattr(stageprogress, "_read", read)
    monkeypatch.setattr(stageprogress, "_holders", {})
    copy = Copied("weights", ("/c/hub/models--o--m/blobs/",), source="n1")
    assert stageprogress._totals(State(), None, [copy], {}) == [None]          # no answer: not kept
    receivers = [gevent.spawn(stageprogress._totals, State(), None, [copy], {}) for _ in range(17)]
    gevent.joinall(receivers)
    assert [r.value for r in receivers] == [[7 * MIB]] * 17
    assert reads == ["n1", "n1"]                                          # the failed read, then one for all 17


FIXTURES = __import__("pathlib").Path(__file__).parents[1] / "fixtures"


def test_the_hub_s_index_gives_the_bytes_a_download_puts_in_the_cache():
    """The hub's answer with every file's size (tests/fixtures/hub, its shape as huggingface_hub reads it): an LFS
    file by its ``lfs.size``, a small one by its ``size``, a content two files share once (one blob)."""
    from k3deploy.model.stagecopies import hub_total

    answer = (FIXTURES / "hub" / "model-info-blobs.json").read_text()
    assert hub_total(answer) == 1519 + 1686 + 383865448 + 5234139343
    assert hub_total('{"error": "Repository not found"}') is None
    assert hub_total(answer.replace('"size": 1686', '"size": null')) is None    # a file without its size: no total


def test_the_downloading_node_reads_the_hub_s_index_with_the_token_from_its_file(tmp_path):
    """The index's command, run by a real shell and curl against a real HTTP server standing in for the endpoint:
    the token goes from its 0600 file to the header (never in the command's text), the answer's total is read; a
    refused token (401) or an endpoint that does not answer gives no total."""
    import http.server
    import subprocess

    from k3deploy.model import commands
    from k3deploy.model.stagecopies import hub_total

    seen: list[tuple[str, str | None]] = []
    answer = (FIXTURES / "hub" / "model-info-blobs.json").read_bytes()

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            ok = self.headers.get("Authorization") == "Bearer hf_secret"
            body = answer if ok else b'{"error": "Invalid credentials in Authorization header"}'
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    token = tmp_path / "hf-token"
    token.write_text("hf_secret\n")
    token.chmod(0o600)

    def total(script: str) -> int | None:
        assert "hf_secret" not in script
        run = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
        return hub_total(run.stdout) if run.returncode == 0 else None

    try:
        assert total(commands.hub_index(endpoint + "/", "org/model", token_file=str(token))) == 5618007996
        assert seen[-1] == ("/api/models/org/model/revision/main?blobs=true", "Bearer hf_secret")
        assert total(commands.hub_index(endpoint, "org/model")) is None               # 401: no token sent
        assert seen[-1][1] is None
        token.write_text("hf_other")
        assert total(commands.hub_index(endpoint, "org/model", token_file=str(token))) is None
    finally:
        server.shutdown()
        server.server_close()
    assert total(commands.hub_index(endpoint, "org/model")) is None                   # nothing answers


def test_a_pull_is_measured_by_the_daemon_s_own_files_whichever_its_image_store(tmp_path):
    """``docker pull``'s bytes: each layer of the manifest that is whole (the classic store's layer registered by its
    digest, the containerd store's blob) by its size, each download under way by its file so far (the classic
    store's ``GetImageBlob*`` temp file, containerd's ingest ``data``), read by a real shell from a data root laid
    out as the daemons lay it out; the layers from ``docker manifest inspect -v`` (tests/fixtures/host)."""
    import subprocess

    from k3deploy.model import commands
    from k3deploy.model.stagecopies import image_layers

    root = tmp_path / "docker"
    a, b, c, d = ("a" * 64, 100), ("b" * 64, 200), ("c" * 64, 300), ("d" * 64, 400)
    registered = root / "image" / "overlay2" / "distribution" / "diffid-by-digest" / "sha256"
    content = root / "containerd" / "daemon" / "io.containerd.content.v1.content"
    registered.mkdir(parents=True)
    (registered / a[0]).write_text("sha256:" + "e" * 64)            # classic: a whole, c downloading
    (root / "tmp").mkdir()
    (root / "tmp" / "GetImageBlob2771529104").write_bytes(b"x" * 50)
    (content / "blobs" / "sha256").mkdir(parents=True)               # containerd: b whole, d downloading
    (content / "blobs" / "sha256" / b[0]).write_bytes(b"x" * b[1])
    (content / "ingest" / ("f" * 64)).mkdir(parents=True)
    (content / "ingest" / ("f" * 64) / "data").write_bytes(b"x" * 70)
    (content / "ingest" / ("f" * 64) / "ref").write_text("layer-sha256:" + d[0])

    def read(layers: list[tuple[str, int]]) -> int:
        run = subprocess.run(["sh", "-c", commands.pulled_bytes(str(root), layers)], capture_output=True, text=True,
                             timeout=30)
        assert run.returncode == 0, run.stderr
        return int(run.stdout)

    assert read([a, b, c, d]) == 100 + 200 + 50 + 70
    assert read([c]) == 50 + 70                                         # another image's layers are not counted whole
    verbose = (FIXTURES / "host" / "docker-manifest-inspect-v-hello-world.txt").read_text()
    assert image_layers("/var/lib/docker x86_64\n" + verbose) == (
        "/var/lib/docker", (("b04784fba78d739b526e27edc02a5a8cd07b1052e9283f5fc155828f4b614c28", 972),))
    # a multi-platform image: the node's platform's manifest
    listed = json.dumps([{"Descriptor": {"platform": {"os": "linux", "architecture": arch}},
                          "OCIManifest": {"layers": [{"digest": f"sha256:{h}", "size": n}]}}
                         for arch, h, n in (("amd64", "11", 5), ("arm64", "22", 6))])
    assert image_layers("/d aarch64\n" + listed) == ("/d", (("22", 6),))
    assert image_layers("/d s390x\n" + listed) is None


def test_a_pull_quicker_than_its_manifest_s_read_still_ends_with_its_total_and_one_with_no_manifest_says_nothing(
        tmp_path, monkeypatch):
    """A real pyinfra host (``@local``) runs a quick step whose copy is measured through its index only (a pull):
    the step's end waits for the index's read, so its line has the total; where the index does not answer, the copy
    ends without a line (nothing of it was measured)."""
    from pyinfra.api import Config, Inventory, State

    from k3deploy.model.stagecopies import Copied, Index
    from k3deploy.preflight import runner
    from k3deploy.runtime import stageprogress
    from k3deploy.runtime.progress import Board

    runner.quiet_pyinfra()
    inventory = Inventory((["@local"], {}))
    state = State(inventory=inventory, config=Config())
    host = inventory.get_host("@local")
    host.connect(raise_exceptions=True)
    out = io.StringIO()
    monkeypatch.setattr(stageprogress, "_board", Board(out, every=60))
    manifest = json.dumps({"OCIManifest": {"layers": [{"digest": "sha256:" + "a" * 64, "size": 3 * MIB}]}})
    index = f"sleep 1; echo {tmp_path} x86_64; echo '{manifest}'"
    pull = Copied("image", (), index=Index(index, "image"))
    ok, _ = stageprogress.Watched("sh", "-c", "true", copies=(pull,)).execute(state, host, {})
    said = out.getvalue()
    assert ok and re.fullmatch(r"\[@local\] stage: image: 3\.0 MiB of 3\.0 MiB, done in \d+ s( \(.*\))?\n", said), said
    out.truncate(0)
    out.seek(0)
    none = Copied("image", (), index=Index("exit 1", "image"))
    ok, _ = stageprogress.Watched("sh", "-c", "true", copies=(none,)).execute(state, host, {})
    assert ok and out.getvalue() == "" and not stageprogress.board().copies
