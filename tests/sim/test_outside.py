"""The simulated outside: registries and a model hub that serve real bytes over a shaped uplink, counted.

The first tests run the outside server on a loopback address of the host and the nodes' docker / hf on the host
(``K3SIM_OUTSIDE``); the ``sim`` tests bring up a cluster (root, systemd-nspawn) whose nodes reach the outside at
``<subnet>.254`` by the names in their ``/etc/hosts``, behind tc-shaped links.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import k3, k3_here, present
from helpers.engine import DOCKER, Node
from helpers.engine import Outside as OutsideServer
from helpers.simulated import ssh
from k3deploy.model import commands
from k3sim import outside

MiB = 1 << 20
REGISTRY = json.loads(outside.REGISTRY_JSON.read_text())
REGISTRY.pop("_comment")
IMAGE = "vllm/vllm-openai:kimi-k3"


def get(srv: OutsideServer, path: str, host: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://{srv.addr}{path}", headers={"Host": host, **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def docker(node: Node, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DOCKER), *args], capture_output=True, text=True, env=node.env(**env),
                          timeout=60)


def hf_download(node: Node, cache: Path, model: str) -> subprocess.CompletedProcess[str]:
    return docker(node, "run", "--rm", "--network", "host", "-v", f"{cache}:/root/.cache", "--entrypoint", "hf", IMAGE,
                  "download", model)


# ----------------------------------------------------------------------------- the server (on the host)


def test_every_registry_tag_has_a_manifest_with_its_pinned_digest_and_layers_that_hash_to_theirs(outside_server):
    srv = outside_server
    for repo, tags in REGISTRY.items():
        host, name = ("quay.io", repo.split("/", 1)[1]) if repo.startswith("quay.io/") else ("registry-1.docker.io",
                                                                                             repo)
        for tag, meta in tags.items():
            for ref in (tag, meta["digest"]):
                code, headers, body = get(srv, f"/v2/{name}/manifests/{ref}", host)
                assert code == 200, (repo, ref, body)
                assert headers["Content-Type"] == outside.MANIFEST_TYPE
                assert headers["Docker-Content-Digest"] == meta["digest"]
            manifest = json.loads(body)
            assert 2 <= len(manifest["layers"]) <= 4
            assert sum(x["size"] for x in manifest["layers"]) == 4 * MiB
            assert manifest["annotations"]["io.k3sim.image-id"] == meta["id"]
    for layer in [manifest["config"], *manifest["layers"]]:  # the last image's blobs
        code, _, body = get(srv, f"/v2/{name}/blobs/{layer['digest']}", host)
        assert code == 200 and len(body) == layer["size"]
        assert "sha256:" + hashlib.sha256(body).hexdigest() == layer["digest"]
    code, _, body = get(srv, "/v2/vllm/vllm-openai/manifests/nope", "registry-1.docker.io")
    assert code == 404 and json.loads(body)["errors"][0]["code"] == "MANIFEST_UNKNOWN"
    assert get(srv, "/v2/vllm/vllm-openai_rocm/manifests/kimi-k3", "registry-1.docker.io")[0] == 401


def test_the_same_bytes_come_back_from_a_second_server(outside_server, tmp_path, net):
    other = OutsideServer(tmp_path, f"{net}.254")
    try:
        seen = [(get(srv, "/v2/vllm/vllm-openai/manifests/latest", "registry-1.docker.io")[2],
                 json.loads(get(srv, "/api/models/a/b", "huggingface.co")[2])["sha"]) for srv in (outside_server, other)]
        assert seen[0] == seen[1]
    finally:
        other.stop()


def test_the_hub_serves_any_repo_by_main_or_commit_with_ranges_and_etags(outside_server):
    srv = outside_server
    code, _, body = get(srv, "/api/models/some-org/any-model/revision/main?blobs=true", "huggingface.co")
    info = json.loads(body)
    assert code == 200 and info["id"] == "some-org/any-model" and len(info["sha"]) == 40
    files = {s["rfilename"]: s for s in info["siblings"]}
    shards = sorted(f for f in files if f.endswith(".safetensors"))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert {"config.json", "tokenizer_config.json", "model.safetensors.index.json"} <= set(files)
    assert sum(files[s]["size"] for s in shards) == 4 * MiB
    assert all("lfs" in files[s] and files[s]["lfs"]["size"] == files[s]["size"] for s in shards)
    assert "lfs" not in files["config.json"]
    for rev in ("main", info["sha"]):
        code, headers, body = get(srv, f"/some-org/any-model/resolve/{rev}/{shards[0]}", "huggingface.co")
        assert code == 200 and headers["X-Repo-Commit"] == info["sha"]
        assert headers["ETag"].strip('"') == hashlib.sha256(body).hexdigest() == files[shards[0]]["lfs"]["sha256"]
    code, headers, tail = get(srv, f"/some-org/any-model/resolve/main/{shards[0]}", "huggingface.co",
                              Range="bytes=1000-")
    assert code == 206 and tail == body[1000:]
    assert headers["Content-Range"] == f"bytes 1000-{len(body) - 1}/{len(body)}"
    code, headers, index = get(srv, "/some-org/any-model/resolve/main/model.safetensors.index.json", "huggingface.co")
    assert headers["ETag"].strip('"') == outside.git_blob_id(index) == files["model.safetensors.index.json"]["blobId"]
    assert sorted(set(json.loads(index)["weight_map"].values())) == shards
    assert get(srv, "/some-org/any-model/resolve/v9/config.json", "huggingface.co")[0] == 404


# ----------------------------------------------------------------------------- docker and hf against it (on the host)


def test_a_pull_resumes_a_layer_cut_mid_transfer_and_moves_each_byte_once(outside_server, tmp_path, net):
    node = Node(tmp_path, "h200", 0, 1, net)
    before = outside_server.payload()
    outside.set_cut(outside_server.dir, 1.5)
    try:
        res = docker(node, "pull", "vllm/vllm-openai-rocm:latest")
    finally:
        outside.clear_cut(outside_server.dir)
    assert res.returncode == 0, res.stderr
    assert "Retrying in" in res.stdout and "Status: Downloaded newer image" in res.stdout
    assert outside.read_counters(outside_server.dir)["aborted"] >= 1
    assert outside_server.payload() - before == 4 * MiB


def test_hf_download_resumes_a_cut_transfer_from_its_incomplete_file(outside_server, tmp_path, net):
    node = Node(tmp_path, "h200", 0, 1, net)
    assert docker(node, "pull", "-q", IMAGE).returncode == 0
    cache = tmp_path / "cache"
    before = outside_server.payload()
    outside.set_cut(outside_server.dir, 1)
    try:
        cut = hf_download(node, cache, "org/resumed")
        assert cut.returncode == 1 and "IncompleteRead" in cut.stderr
        partial = list((cache / "huggingface/hub/models--org--resumed/blobs").glob("*.incomplete"))
        assert len(partial) == 1 and 0 < partial[0].stat().st_size
        again = hf_download(node, cache, "org/resumed")
    finally:
        outside.clear_cut(outside_server.dir)
    assert again.returncode == 0, again.stderr
    assert not list(cache.rglob("*.incomplete"))
    assert outside_server.payload() - before == outside.checkpoint_bytes(4)  # nothing was sent twice
    check = subprocess.run(["sh", "-c", commands.verify_weights(str(cache), "org/resumed")], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr


def test_hf_download_sends_the_token_and_never_prints_it(outside_server, tmp_path, net):
    node = Node(tmp_path, "h200", 0, 1, net)
    token = tmp_path / "token"
    token.write_text("hf_SECRETvalue42\n")
    res = docker(node, "run", "--rm", "-v", f"{tmp_path / 'c'}:/root/.cache", "-v", f"{token}:/run/secrets/hf:ro",
                 "-e", "HF_TOKEN_PATH=/run/secrets/hf", "--entrypoint", "hf", IMAGE, "download", "org/private")
    assert res.returncode == 0, res.stderr
    assert "hf_SECRET" not in res.stdout + res.stderr
    offline = docker(node, "run", "--rm", "-v", f"{tmp_path / 'c'}:/root/.cache", "-e", "HF_HUB_OFFLINE=1",
                     "--entrypoint", "hf", IMAGE, "download", "org/other")
    assert offline.returncode == 1 and "HF_HUB_OFFLINE" in offline.stderr


def test_a_re_pushed_tag_names_a_new_build_that_docker_resolves_pulls_and_moves_the_tag_to(tmp_path, net):
    """``sim push``: the registry's tag names a new build (its own server: the shared one keeps registry.json's);
    ``docker buildx imagetools inspect`` prints its digest as buildx does, a pull moves the local tag to it (the old
    build stays, by digest), and ``docker tag`` moves the tag back."""
    (tmp_path / "out").mkdir()
    srv = OutsideServer(tmp_path / "out", f"{net}.254")
    try:
        node = Node(tmp_path, "h200", 0, 1, net)

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return docker(node, *args, K3SIM_OUTSIDE=srv.addr)

        first = REGISTRY["vllm/vllm-openai"]["kimi-k3"]["digest"]
        inspect = run("buildx", "imagetools", "inspect", IMAGE)
        assert inspect.returncode == 0 and inspect.stdout.splitlines() == [
            f"Name:      docker.io/{IMAGE}", f"MediaType: {outside.MANIFEST_TYPE}", f"Digest:    {first}"]
        assert run("pull", "-q", IMAGE).returncode == 0
        new = outside.repush(srv.dir, IMAGE)
        assert run("buildx", "imagetools", "inspect", IMAGE).stdout.splitlines()[2] == f"Digest:    {new}"
        assert run("pull", "-q", IMAGE).returncode == 0
        fmt = "{{index .RepoDigests 0}}"
        assert run("image", "inspect", "--format", fmt, IMAGE).stdout.strip() == f"vllm/vllm-openai@{new}"
        old = run("image", "inspect", "--format", "{{json .RepoTags}}", f"vllm/vllm-openai@{first}")
        assert old.returncode == 0 and old.stdout.strip() == "[]"          # untagged, still there by digest
        assert run("tag", f"vllm/vllm-openai@{first}", IMAGE).returncode == 0
        assert run("image", "inspect", "--format", fmt, IMAGE).stdout.strip() == f"vllm/vllm-openai@{first}"
        gone = run("buildx", "imagetools", "inspect", "vllm/vllm-openai:nope")
        assert gone.returncode == 1 and gone.stderr.strip() == "ERROR: docker.io/vllm/vllm-openai:nope: not found"
    finally:
        srv.stop()


def test_no_outside_is_dockers_connection_error(tmp_path, net):
    node = Node(tmp_path, "h200", 0, 1, net)
    res = docker(node, "pull", IMAGE, K3SIM_OUTSIDE=f"{net}.254:9")
    assert res.returncode == 1
    assert res.stderr.startswith('Error response from daemon: Get "http://registry-1.docker.io/v2/": dial tcp')


@pytest.mark.parametrize("args,needle", [
    (["--uplink-mbps", "0"], "bad --uplink-mbps 0"),
    (["--weights-mb", "-1"], "bad --weights-mb -1"),
    (["--fault", "outside-cut=x"], "bad outside-cut value 'x'"),
    (["--fault", "outside-cut"], "needs a value"),
])
def test_bad_outside_options_are_one_line(args, needle):
    res = k3_here("sim", "up", "--hardware", "h200", "--nodes", "2", "--name", "tbadout", *args)
    assert res.returncode != 0 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


# ----------------------------------------------------------------------------- on a simulated cluster

UPLINK_MBPS = 160  # 20 MB/s: a transfer of 8 MiB takes about 0.4 s
CLUSTER = "stgo"


@pytest.fixture(scope="module")
def stg():
    from k3sim import cluster as sim

    sim.down(CLUSTER)
    res = k3("sim", "up", "--hardware", "h200", "--nodes", "2", "--name", CLUSTER, "--json",
             "--uplink-mbps", str(UPLINK_MBPS), "--weights-mb", "16", "--image-mb", "4")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    state = present(sim.load_state(CLUSTER))
    yield info
    assert k3_here("sim", "down", "--name", CLUSTER).returncode == 0
    out = state["outside"]
    assert not Path(f"/run/netns/{out['netns']}").exists() and not Path(f"/sys/class/net/{out['veth']}").exists()
    stat = Path(f"/proc/{out['pid']}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")


def status() -> dict:
    res = k3_here("sim", "status", "--name", CLUSTER, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["clusters"][0]


def on(stg: dict, rank: int, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return ssh(stg, stg["nodes"][rank]["ip"], command, timeout=timeout)


HF = ("docker run --rm --network host -v /var/lib/k3deploy/cache:/root/.cache --entrypoint hf "
      f"{IMAGE} download")


@pytest.mark.sim
def test_a_pull_moves_the_image_layers_over_the_uplink_once(stg):
    st = status()
    assert st["outside"]["ip"] == stg["outside"]["ip"] and st["outside"]["ip"].endswith(".254")
    assert (st["uplink_mbps"], st["cluster_mbps"]) == (UPLINK_MBPS, 4000)
    assert st["artifact_bytes"] == 4 * MiB + outside.checkpoint_bytes(16)
    hosts = on(stg, 0, "for h in registry-1.docker.io quay.io huggingface.co k3sim-outside; do getent ahostsv4 $h | "
                       "head -n 1; done").stdout.split()
    assert hosts.count(st["outside"]["ip"]) == 4
    before = st["outside_bytes"]
    pulled = on(stg, 0, f"docker pull {IMAGE}")
    assert pulled.returncode == 0, pulled.stderr
    assert status()["outside_bytes"] - before == 4 * MiB  # exactly the layers
    again = on(stg, 0, f"docker pull {IMAGE}")
    assert "Status: Image is up to date" in again.stdout
    assert status()["outside_bytes"] - before == 4 * MiB  # the second pull moved no layer
    digest = REGISTRY["vllm/vllm-openai"]["kimi-k3"]["digest"]
    got = on(stg, 0, f"docker image inspect --format '{{{{index .RepoDigests 0}}}}' {IMAGE}@{digest}").stdout
    assert got.strip() == f"vllm/vllm-openai@{digest}"


@pytest.mark.sim
def test_save_then_load_on_another_node_gives_the_same_image_without_the_uplink(stg):
    assert on(stg, 0, f"docker pull -q {IMAGE}").returncode == 0
    before = status()["outside_bytes"]
    d = Path(stg["inventory"]).parent
    base = ["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o", "BatchMode=yes"]
    save = subprocess.Popen([*base, f"root@{stg['nodes'][0]['ip']}", f"docker save {IMAGE}"], stdout=subprocess.PIPE)
    load = subprocess.run([*base, f"root@{stg['nodes'][1]['ip']}", "docker rmi -f " + IMAGE + " >/dev/null 2>&1; "
                           "docker load"], stdin=save.stdout, capture_output=True, text=True, timeout=60)
    assert save.wait(timeout=60) == 0
    assert load.returncode == 0 and load.stdout == f"Loaded image: {IMAGE}\n", load.stderr
    fmt = "'{{.Id}} {{index .RepoDigests 0}}'"
    assert on(stg, 1, f"docker image inspect --format {fmt} {IMAGE}").stdout == \
        on(stg, 0, f"docker image inspect --format {fmt} {IMAGE}").stdout
    # what the deploy checks: the pinned digest, through its own command
    digest = REGISTRY["vllm/vllm-openai"]["kimi-k3"]["digest"]
    assert on(stg, 1, commands.digest_check("docker", f"{IMAGE}@{digest}")).returncode == 0
    assert status()["outside_bytes"] == before



@pytest.mark.sim
def test_hf_download_gives_the_hub_cache_layout_with_verified_shards(stg):
    model = "moonshotai/Kimi-K3"
    assert on(stg, 0, f"docker pull -q {IMAGE}").returncode == 0
    before = status()["outside_bytes"]
    res = on(stg, 0, f"{HF} {model}")
    assert res.returncode == 0, res.stderr
    assert status()["outside_bytes"] - before == outside.checkpoint_bytes(16)
    api = json.loads(on(stg, 0, f"curl -sf http://huggingface.co/api/models/{model}/revision/main").stdout)
    mdir = commands.model_dir("/var/lib/k3deploy/cache", model)
    snap = f"{mdir}/snapshots/{api['sha']}"
    assert res.stdout.splitlines()[-1] == snap
    assert on(stg, 0, f"cat {mdir}/refs/main").stdout == api["sha"]
    for s in api["siblings"]:
        etag = s["lfs"]["sha256"] if "lfs" in s else s["blobId"]
        assert on(stg, 0, f"readlink {snap}/{s['rfilename']}").stdout.strip() == f"../../blobs/{etag}"
    assert on(stg, 0, commands.verify_weights("/var/lib/k3deploy/cache", model)).returncode == 0
    again = on(stg, 0, f"{HF} {model}")
    assert again.returncode == 0 and status()["outside_bytes"] - before == outside.checkpoint_bytes(16)


@pytest.mark.sim
def test_a_cut_transfer_leaves_incomplete_and_a_rerun_resumes(stg):
    model = "org/cut-and-resume"
    assert on(stg, 1, f"docker pull -q {IMAGE}").returncode == 0
    r = k3_here("sim", "fault", "--name", CLUSTER, "outside-cut=6")
    assert r.returncode == 0 and f"{CLUSTER}-out\toutside-cut=6" in r.stdout, r.stderr
    before = status()["outside_bytes"]
    cut = on(stg, 1, f"{HF} {model}")
    assert cut.returncode != 0 and "IncompleteRead" in cut.stderr
    blobs = commands.model_dir("/var/lib/k3deploy/cache", model) + "/blobs"
    partial = on(stg, 1, f"stat -c %s {blobs}/*.incomplete").stdout.split()
    assert len(partial) == 1 and int(partial[0]) > 0
    st = status()
    assert st["outside"]["cut"]["fired"] and st["outside"]["aborted"] >= 1
    assert "outside-cut=6 (fired)" in k3_here("sim", "status", "--name", CLUSTER).stdout
    resumed = on(stg, 1, f"{HF} {model}")
    assert resumed.returncode == 0, resumed.stderr
    moved = status()["outside_bytes"] - before
    assert outside.checkpoint_bytes(16) <= moved < 1.5 * outside.checkpoint_bytes(16)
    assert on(stg, 1, commands.verify_weights("/var/lib/k3deploy/cache", model)).returncode == 0
    r = k3_here("sim", "fault", "--name", CLUSTER, "--clear", "outside-cut")
    assert r.returncode == 0 and f"{CLUSTER}-out\t-" in r.stdout
    assert status()["outside"]["faults"] == []


@pytest.mark.sim
def test_the_uplink_is_shaped_to_its_rate_and_shared_by_the_nodes(stg):
    rate = UPLINK_MBPS * 1e6 / 8
    shard = "model-00001-of-00002.safetensors"
    curl = ("curl -sf -o /dev/null -w '%{{speed_download}} %{{size_download}}' "
            "http://huggingface.co/org/rate{}/resolve/main/" + shard)
    assert on(stg, 0, "curl -sf -o /dev/null http://huggingface.co/api/models/org/rate0").returncode == 0  # generated
    alone = float(on(stg, 0, curl.format(0)).stdout.split()[0])
    assert 0.5 * rate < alone < 1.3 * rate, alone / rate
    for r in (1, 2):
        on(stg, 0, f"curl -sf -o /dev/null http://huggingface.co/api/models/org/rate{r}")
    both = []
    d = Path(stg["inventory"]).parent
    t0 = time.monotonic()
    for rank in (0, 1):
        both.append(subprocess.Popen(
            ["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o",
             "BatchMode=yes", f"root@{stg['nodes'][rank]['ip']}", curl.format(rank + 1)],
            stdout=subprocess.PIPE, text=True))
    sizes = [float(p.communicate(timeout=60)[0].split()[1]) for p in both]
    together = sum(sizes) / (time.monotonic() - t0)   # both at once, from the first start to the last byte
    assert 0.5 * rate < together < 1.3 * rate, together / rate  # one uplink for all


@pytest.mark.sim
def test_a_registry_mirror_in_daemon_json_is_used_for_docker_hub_only(stg):
    ip = status()["outside"]["ip"]
    setup = (f"echo '{ip} mirror.k3sim.test' >> /etc/hosts && mkdir -p /etc/docker && "
             "echo '{\"registry-mirrors\": [\"http://mirror.k3sim.test\"]}' > /etc/docker/daemon.json")
    assert on(stg, 1, setup).returncode == 0
    try:
        before = status()["outside"]["by_host"]
        assert on(stg, 1, "docker pull -q vllm/vllm-openai:latest").returncode == 0
        assert on(stg, 1, "docker pull -q quay.io/ascend/vllm-ascend:kimi-k3").returncode == 0
        after = status()["outside"]["by_host"]
        grew = {h: after.get(h, 0) - before.get(h, 0) for h in after}
        assert grew["mirror.k3sim.test"] == 4 * MiB and grew.get("registry-1.docker.io", 0) == 0
        assert grew["quay.io"] == 4 * MiB
        # a mirror that does not answer (nothing listens on its port): docker falls back to the hub
        on(stg, 1, "echo '{\"registry-mirrors\": [\"http://mirror.k3sim.test:81\"]}' > /etc/docker/daemon.json")
        assert on(stg, 1, "docker pull -q vllm/vllm-openai-rocm:kimi-k3").returncode == 0
        assert status()["outside"]["by_host"]["registry-1.docker.io"] - before.get("registry-1.docker.io", 0) == \
            4 * MiB
    finally:
        on(stg, 1, "rm -f /etc/docker/daemon.json")


#: each cached docker image command of a node (its key, a line per word) -> the inode of its exit status file (a run
#: of the tool through the cache writes a new file; a replay reads it)
ANSWER_FILES = ("python3 -c 'import os; d = \"/run/k3sim/cache\"; print(repr({n: os.stat(d + \"/\" + n).st_ino "
                "for n in os.listdir(d) if n.startswith(\"docker\\nimage\\n\") and n.endswith(\".rc\")}))'")


def answer_file(*words: str) -> str:
    """The name of a command's exit status file in a node's answer cache (the words one per line, ``%`` written
    ``%p``, ``/`` written ``%s``)."""
    return "\n".join(w.replace("%", "%p").replace("/", "%s") for w in words) + ".rc"


@pytest.mark.sim
def test_a_change_of_the_image_store_answers_again_what_the_node_cache_holds(stg):
    """A pull, tag or removal of an image answers again (in the same docker process) each cached image inspect and
    listing, so the deploy's next read is replayed, and replays the store as it is now."""
    import ast

    ls = "docker image ls --digests --format '{{.Tag}} {{.Digest}}' vllm/vllm-openai"
    inspect = f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}"

    def files() -> dict[str, int]:
        return ast.literal_eval(on(stg, 1, ANSWER_FILES).stdout)

    on(stg, 1, f"docker rmi -f {IMAGE} vllm/vllm-openai:latest vllm/vllm-openai:k3-refresh-test >/dev/null 2>&1; true")
    assert on(stg, 1, ls).stdout == on(stg, 1, ls).stdout == ""
    assert on(stg, 1, inspect).returncode == 1
    cached = files()
    mine = [answer_file(*ls.split(" ", 5)[:5], "{{.Tag}} {{.Digest}}", "vllm/vllm-openai"),
            answer_file("docker", "image", "inspect", "--format", "{{.Id}}", IMAGE)]
    assert all(k in cached for k in mine), cached   # both answered from the cache from now on
    assert on(stg, 1, ls).stdout == "" and files() == cached

    assert on(stg, 1, f"docker pull -q {IMAGE}").returncode == 0
    refreshed = files()
    assert refreshed.keys() == cached.keys() and all(refreshed[k] != cached[k] for k in cached)
    assert on(stg, 1, ls).stdout.split()[0] == "kimi-k3"
    assert on(stg, 1, inspect).returncode == 0 and on(stg, 1, inspect).stdout.startswith("sha256:")
    assert files() == refreshed   # replayed: no run of the tool

    assert on(stg, 1, f"docker tag {IMAGE} vllm/vllm-openai:k3-refresh-test").returncode == 0
    assert sorted(line.split()[0] for line in on(stg, 1, ls).stdout.splitlines()) == ["k3-refresh-test", "kimi-k3"]
    assert on(stg, 1, f"docker rmi -f {IMAGE} vllm/vllm-openai:k3-refresh-test").returncode == 0
    assert on(stg, 1, ls).stdout == "" and on(stg, 1, inspect).returncode == 1
    # what a run of the tool itself answers now is what was replayed
    assert on(stg, 1, ls.replace("docker ", "/usr/lib/k3sim/tools/docker ", 1)).stdout == ""
