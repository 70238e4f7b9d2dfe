"""The simulated docker: registry pulls with fixed digests, images, run/stop/logs/ps/rm/inspect."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.engine import DOCKER, Node, free_port, healthy, http, wait_for

pytestmark = pytest.mark.usefixtures("outside_server")  # pulls fetch from the simulated outside

IMAGE = "vllm/vllm-openai:kimi-k3"
DIGEST = "sha256:3a2eb08c964042fec5afa5e174f485f7147648f1f78227112edacc7bcc2efd4a"


def docker(node: Node, *args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DOCKER), *args], capture_output=True, text=True,
                          env=node.env(**env), timeout=timeout)


def test_pull_images_and_inspect(tmp_path, net):
    n = Node(tmp_path, "h200", 0, 1, net)
    assert docker(n, "image", "inspect", IMAGE).returncode == 1
    res = docker(n, "pull", IMAGE)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "kimi-k3: Pulling from vllm/vllm-openai"
    assert lines[-3:] == [f"Digest: {DIGEST}", f"Status: Downloaded newer image for {IMAGE}",
                          f"docker.io/{IMAGE}"]
    again = docker(n, "pull", IMAGE).stdout.splitlines()
    assert again[-2] == f"Status: Image is up to date for {IMAGE}"
    assert docker(n, "image", "inspect", "--format", "{{index .RepoDigests 0}}", IMAGE).stdout == \
        f"vllm/vllm-openai@{DIGEST}\n"
    image_id = docker(n, "image", "inspect", IMAGE, "--format", "{{.Id}}").stdout.strip()
    assert image_id.startswith("sha256:") and len(image_id) == 71
    assert json.loads(docker(n, "inspect", IMAGE).stdout)[0]["Config"]["Entrypoint"] == ["vllm", "serve"]
    table = docker(n, "images").stdout.splitlines()
    assert table[0].split() == ["REPOSITORY", "TAG", "IMAGE", "ID", "CREATED", "SIZE"]
    assert table[1].split()[:3] == ["vllm/vllm-openai", "kimi-k3", image_id[7:19]]
    # the same image pulled by digest is the same local image
    assert docker(n, "pull", f"vllm/vllm-openai@{DIGEST}").returncode == 0
    assert docker(n, "images", "-q").stdout.split() == [image_id[7:19]]


@pytest.mark.parametrize("ref,message", [
    ("vllm/vllm-openai:nope", "Error response from daemon: manifest for vllm/vllm-openai:nope not found: "
                              "manifest unknown: manifest unknown"),
    ("vllm/vllm-openai_rocm:kimi-k3", "Error response from daemon: pull access denied for vllm/vllm-openai_rocm, "
                                      "repository does not exist or may require 'docker login'"),
    ("vllm/vllm-openai@sha256:" + "0" * 64, "manifest unknown"),
])
def test_pull_errors_are_dockers(tmp_path, net, ref, message):
    res = docker(Node(tmp_path, "h200", 0, 1, net), "pull", ref)
    assert res.returncode == 1 and message in res.stderr


def test_run_in_the_foreground_like_a_systemd_unit(tmp_path, net):
    n = Node(tmp_path, "h200", 0, 1, net)
    port = free_port(n.ip)
    envfile = tmp_path / "k3.env"
    envfile.write_text("# rendered env\nK3SIM_LOAD_SECONDS=0.2\nHF_HUB_OFFLINE=1\n")
    cmd = [sys.executable, str(DOCKER), "run", "--rm", "--name", "k3-engine", "--gpus", "all", "--network", "host",
           "--ipc=host", "--shm-size", "16g", "--ulimit", "memlock=-1", "--cap-add", "IPC_LOCK", "--env-file",
           str(envfile), "-e", "NCCL_DEBUG=WARN", "-v", "/var/lib/k3deploy/hf:/root/.cache/huggingface",
           "--device", "/dev/infiniband:/dev/infiniband", IMAGE, "moonshotai/Kimi-K3", "--served-model-name",
           "kimi-k3", "-tp", "8", "--host", n.ip, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=n.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: healthy(f"http://{n.ip}:{port}"), 8)
        ps = docker(n, "ps", "--format", "{{.Names}} {{.State}} {{.Image}}").stdout
        assert ps == f"k3-engine running {IMAGE}\n"
        inspect = json.loads(docker(n, "inspect", "k3-engine").stdout)[0]
        assert "HF_HUB_OFFLINE=1" in inspect["Config"]["Env"] and inspect["HostConfig"]["NetworkMode"] == "host"
        proc.send_signal(signal.SIGTERM)  # systemctl stop
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert "Application startup complete." in out  # the engine's log is docker run's output
    assert docker(n, "ps", "-a", "-q").stdout == ""  # --rm removed it


def test_exit_status_of_the_engine_propagates(tmp_path, net):
    n = Node(tmp_path, "h200", 0, 1, net)
    assert docker(n, "run", "--rm", "--gpus", "all", IMAGE, "m", "-tp", "nine").returncode == 2
    crash = Node(tmp_path / "c", "h200", 0, 1, net, faults=("0:engine-crash",))
    res = docker(crash, "run", "--name", "boom", "--gpus", "all", IMAGE, "m", "-tp", "8")
    assert res.returncode == 1 and "Engine core initialization failed" in res.stderr
    state = docker(crash, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", "boom").stdout
    assert state == "exited 1\n"
    assert "Engine core initialization failed" in docker(crash, "logs", "boom").stderr


def test_detached_run_ps_logs_stop_rm(tmp_path, net):
    n = Node(tmp_path, "gb300", 0, 1, net)
    port = free_port(n.ip)
    res = docker(n, "run", "-d", "--name", "k3-engine", "--gpus", "all", "-e", "K3SIM_LOAD_SECONDS=0.2", IMAGE,
                 "moonshotai/Kimi-K3", "-tp", "4", "--host", n.ip, "--port", str(port))
    cid = res.stdout.strip()
    assert res.returncode == 0 and len(cid) == 64
    try:
        assert wait_for(lambda: healthy(f"http://{n.ip}:{port}"), 8)
        table = docker(n, "ps").stdout.splitlines()
        assert table[0].split()[:2] == ["CONTAINER", "ID"] and table[1].startswith(cid[:12])
        assert table[1].split()[-1] == "k3-engine"
        dup = docker(n, "run", "-d", "--name", "k3-engine", IMAGE, "m")
        assert dup.returncode == 125 and 'The container name "/k3-engine" is already in use' in dup.stderr
        busy = docker(n, "rm", "k3-engine")
        assert busy.returncode == 1 and "container is running" in busy.stderr
        tail = docker(n, "logs", "--tail", "2", "k3-engine").stdout.splitlines()
        assert len(tail) == 2
        assert "Application startup complete." in docker(n, "logs", "k3-engine").stdout
        t0 = time.monotonic()
        assert docker(n, "stop", "-t", "5", "k3-engine").stdout == "k3-engine\n"
        assert time.monotonic() - t0 < 4
        assert http(f"http://{n.ip}:{port}/health")[0] is None
        assert docker(n, "ps", "-q").stdout == ""
        assert docker(n, "ps", "-a", "--format", "{{.Names}} {{.State}}").stdout == "k3-engine exited\n"
        assert docker(n, "wait", "k3-engine").stdout == "0\n"
    finally:
        docker(n, "rm", "-f", "k3-engine")
    assert docker(n, "ps", "-a", "-q").stdout == ""
    assert docker(n, "rm", "-f", "k3-engine").returncode == 0  # already gone: rm -f is quiet
    missing = docker(n, "stop", "k3-engine")
    assert missing.returncode == 1 and "No such container: k3-engine" in missing.stderr


@pytest.mark.parametrize("entrypoint", [False, True])
def test_ascend_image_runs_vllm_serve_from_bash_lc(tmp_path, net, entrypoint):
    n = Node(tmp_path, "ascend_910c", 0, 1, net)
    port = free_port(n.ip)
    script = ("source /usr/local/Ascend/ascend-toolkit/set_env.sh; source /usr/local/Ascend/nnal/atb/set_env.sh; "
              "export VLLM_USE_MODELSCOPE=True K3SIM_LOAD_SECONDS=0.2\n"
              f"exec vllm serve Eco-Tech/Kimi-K3-w4a8 --served-model-name kimi-k3 --quantization ascend -tp 16 "
              f"--host {n.ip} --port {port}")
    devices = [a for i in range(16) for a in ("--device", f"/dev/davinci{i}")]
    image = "quay.io/ascend/vllm-ascend:kimi-k3-a3"
    # the image's CMD is /bin/bash: either `IMAGE bash -lc ...` or `--entrypoint bash IMAGE -lc ...`
    tail = ["--entrypoint", "bash", image, "-lc", script] if entrypoint else [image, "bash", "-lc", script]
    res = docker(n, "run", "-d", "--name", "vllm-ascend", "--net=host", "--shm-size=1g", *devices,
                 "--device", "/dev/davinci_manager", *tail)
    assert res.returncode == 0, res.stderr
    try:
        assert wait_for(lambda: healthy(f"http://{n.ip}:{port}"), 8)
        assert http(f"http://{n.ip}:{port}/v1/models")[1]["data"][0]["id"] == "kimi-k3"
    finally:
        docker(n, "rm", "-f", "vllm-ascend")


def test_runtime_refusals(tmp_path, net):
    amd = Node(tmp_path / "a", "mi355x", 0, 1, net)
    res = docker(amd, "run", "--rm", "--gpus", "all", "vllm/vllm-openai-rocm:kimi-k3", "m")
    assert res.returncode == 125
    assert 'could not select device driver "" with capabilities: [[gpu]]' in res.stderr
    old = Node(tmp_path / "o", "h200", 0, 1, net, faults=("0:driver=570.86.15",))
    res = docker(old, "run", "--rm", "--gpus", "all", IMAGE, "m")
    assert res.returncode == 125
    assert "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0" in res.stderr
    # without --gpus the CUDA image sees no GPU, as on a real host
    res = docker(Node(tmp_path / "n", "h200", 0, 1, net), "run", "--rm", IMAGE, "m", "-tp", "8")
    assert res.returncode == 1 and "RuntimeError: Failed to infer device type" in res.stderr


def test_info_and_version_formats(tmp_path, net):
    nv = Node(tmp_path / "nv", "b200", 0, 1, net)
    fmt = "{{range $k, $v := .Runtimes}}{{$k}} {{end}}"
    assert docker(nv, "info", "--format", fmt).stdout == "io.containerd.runc.v2 nvidia runc \n"
    amd = Node(tmp_path / "amd", "mi300x", 0, 1, net)
    assert docker(amd, "info", "--format", fmt).stdout == "io.containerd.runc.v2 runc \n"
    assert docker(nv, "version", "--format", "{{.Server.Version}}").stdout == "28.2.2\n"
    assert docker(nv, "--version").stdout.startswith("Docker version 28.2.2, build ")


def test_a_pull_leaves_the_daemon_s_own_files_that_the_stage_s_progress_reads(tmp_path, net):
    """As with dockerd's containerd image store: every blob is downloaded to the content store's ingest and committed
    to its blobs; the stage's progress, from ``docker info`` and ``docker manifest inspect -v`` on the node, then
    reads the pull as whole."""
    from k3deploy.model import commands
    from k3deploy.model.stagecopies import image_layers

    n = Node(tmp_path, "h200", 0, 1, net)
    assert docker(n, "pull", "-q", IMAGE).returncode == 0
    root = docker(n, "info", "-f", "{{.DockerRootDir}} {{.Architecture}}").stdout
    verbose = json.loads(docker(n, "manifest", "inspect", "-v", IMAGE).stdout)
    assert verbose["Descriptor"]["digest"] == DIGEST and verbose["Ref"] == f"docker.io/{IMAGE}"
    got = image_layers(root + json.dumps(verbose))
    assert got is not None and len(got[1]) >= 2
    read = subprocess.run(["sh", "-c", commands.pulled_bytes(*got)], capture_output=True, text=True, timeout=30)
    assert int(read.stdout) == sum(size for _, size in got[1]) > 0
    assert not any((Path(got[0]) / "containerd" / "daemon" / "io.containerd.content.v1.content" / "ingest")
                   .iterdir())                                             # nothing left under way


@pytest.mark.parametrize("classic", [False, True])
def test_a_layer_under_way_is_where_the_daemon_keeps_it(tmp_path, net, monkeypatch, classic):
    """Halfway through a layer's download (the simulated docker's pull, in this process, its body copy paused), the
    stage's reader counts the bytes so far: in the containerd store's ingest, or with the classic store
    (``"containerd-snapshotter": false``) in ``<data-root>/tmp/GetImageBlob*``; once the pull is done, every
    layer whole."""
    from helpers.engine import DOCKER
    from k3deploy.model import commands
    from k3deploy.model.stagecopies import image_layers

    n = Node(tmp_path, "h200", 0, 1, net)
    for key, value in n.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(DOCKER.resolve().parent.parent / "lib" / "k3sim"))
    import dockersim
    import k3simlib

    monkeypatch.setattr(dockersim, "_CFG", None)
    monkeypatch.setattr(dockersim, "classic_store", lambda: classic)
    got = image_layers(docker(n, "info", "-f", "{{.DockerRootDir}} {{.Architecture}}").stdout
                       + docker(n, "manifest", "inspect", "-v", IMAGE).stdout)
    assert got is not None
    root, layers = got
    seen: list[int] = []
    copy = k3simlib.copy_body

    def halfway(resp, out, want, *rest):     # the first half, a read of the node as the stage reads it, the rest
        first = copy(resp, out, want // 2, *rest)
        out.flush()
        if len(layers) > len(seen) and want in dict(layers).values():
            read = subprocess.run(["sh", "-c", commands.pulled_bytes(root, layers)], capture_output=True, text=True)
            seen.append(int(read.stdout))
        return first + copy(resp, out, want - first, *rest)

    monkeypatch.setattr(k3simlib, "copy_body", halfway)
    dockersim.pull(IMAGE, quiet=True, out=open(os.devnull, "w"))
    sizes = [size for _, size in layers]
    assert seen == [sum(sizes[:i]) + sizes[i] // 2 for i in range(len(sizes))], (seen, sizes)
    whole = subprocess.run(["sh", "-c", commands.pulled_bytes(root, layers)], capture_output=True, text=True)
    assert int(whole.stdout) == sum(sizes)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a small tmpfs needs root")
def test_pull_fails_on_a_full_disk(tmp_path, net):
    n = Node(tmp_path, "h200", 0, 1, net)
    data = n.dir / "state" / "docker"
    data.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "k3sim-test", str(data)], check=True)
    try:
        res = docker(n, "pull", IMAGE)
        assert res.returncode == 1 and "no space left on device" in res.stderr
        assert docker(n, "images", "-q").stdout == ""
    finally:
        subprocess.run(["umount", str(data)], check=True)


def test_save_then_load_on_another_node_gives_the_same_image(tmp_path, net):
    a = Node(tmp_path / "a", "h200", 0, 2, net)
    b = Node(tmp_path / "b", "h200", 1, 2, net)
    assert docker(a, "pull", "-q", IMAGE).returncode == 0
    archive = tmp_path / "image.tar"
    saved = docker(a, "save", "-o", str(archive), IMAGE)
    assert saved.returncode == 0, saved.stderr
    import tarfile

    with tarfile.open(archive) as tar:
        assert {"oci-layout", "index.json", "manifest.json"} <= set(tar.getnames())
    loaded = docker(b, "load", "-i", str(archive))
    assert loaded.returncode == 0 and loaded.stdout == f"Loaded image: {IMAGE}\n", loaded.stderr
    for fmt in ("{{.Id}}", "{{index .RepoDigests 0}}"):
        assert docker(b, "image", "inspect", "--format", fmt, IMAGE).stdout == \
            docker(a, "image", "inspect", "--format", fmt, IMAGE).stdout
    # a damaged archive is refused, as docker refuses a layer whose checksum does not match
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF   # inside the layer, the bulk of the archive
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    c = Node(tmp_path / "c", "h200", 0, 1, net)
    res = docker(c, "load", "-i", str(bad))
    assert res.returncode == 1 and ("checksum mismatch" in res.stderr or "bad archive" in res.stderr)
    assert docker(c, "image", "inspect", IMAGE).returncode == 1


def test_the_engine_refuses_a_snapshot_with_a_shard_missing(tmp_path, net):
    """An interrupted download leaves a snapshot whose index names a shard that is not there: the engine fails on
    it, as vLLM does, instead of serving from part of the weights."""
    n = Node(tmp_path, "h200", 0, 1, net)
    cache = tmp_path / "cache"
    hub = cache / "huggingface/hub/models--moonshotai--Kimi-K3"
    snap = hub / "snapshots/abc"
    snap.mkdir(parents=True)
    (hub / "refs").mkdir()
    (hub / "refs/main").write_text("abc")
    (snap / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (snap / "model-00001-of-00002.safetensors").write_bytes(b"x")
    res = docker(n, "run", "--rm", "--gpus", "all", "-v", f"{cache}:/root/.cache", "-e", "K3SIM_LOAD_SECONDS=0.1",
                 IMAGE, "moonshotai/Kimi-K3", "-tp", "8", "--host", n.ip, "--port", str(free_port(n.ip)))
    assert res.returncode == 1
    assert f"No such file or directory: '{snap / 'model-00002-of-00002.safetensors'}'" in res.stderr
