"""Simulated enroot (NVIDIA's unprivileged container runtime, under pyxis) for one node; ``/usr/bin/enroot`` runs it.

Subset, with enroot's own command forms (github.com/NVIDIA/enroot, doc/usage.md) where it has them:

- ``enroot version``;
- ``enroot import -o FILE dockerd://IMAGE`` (from the node's simulated docker, where the stage put the image),
  ``docker://[REGISTRY#]IMAGE`` (from the simulated registry, each layer verified against its digest, without a
  docker on the node: enroot pulls itself) or ``docker-archive://PATH`` (a ``docker save`` archive): writes a
  squashfs-like file (``hsqs``, enroot's squashfs magic, then the image's id, digest, config and platform as JSON on
  one line, then the image's layers, so the file is as large as the image); an existing ``FILE`` is refused, as
  enroot refuses it;
- ``enroot start --image FILE [--name N] [--workdir D] [--env NAMES] [--rw] [--mount-home] [--entrypoint]
  [--mount SRC:DST[:FLAGS]]... -- ARGV``: what the simulator's pyxis (``k3sim_pyxis.so``, a SPANK plugin of the
  nodes' slurmd) execs in a task of a step that names ``--container-image``. It checks the file (present, a squashfs
  of this simulator, holding the image whose digest its name carries) and every mount's source, then runs ARGV as
  the task's own process (same pid: the job's cgroup and process tree) with the task's environment, the image's on
  top (pyxis: the image's values take precedence, but for ``--container-env`` names), the mounts for the simulated
  engine (``K3SIM_VOLUMES``), the image's ``vllm`` on PATH, and as many GPUs as Slurm gave the job
  (``CUDA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES`` or ``GPU_DEVICE_ORDINAL`` from its GRES; all of the node's
  without one: nothing confines the devices in the simulated nodes);
- ``enroot start [--mount SRC:DST]... [--env KEY[=VAL]]... IMAGE COMMAND [ARG...]``: enroot's own form
  (doc/cmd/start.md: a squashfs image started directly), e.g. the stage's ``hf download`` from the image on a node
  without docker: the image's Hugging Face CLI (the simulated ``hf``) runs with the mounts.
"""
from __future__ import annotations

import json
import os
import re
import sys

VERSION = "3.5.0"
MAGIC = "hsqs"
BIN = "/usr/lib/k3sim/container-bin"
#: the variables Slurm's gres/gpu sets in a task (slurm.conf(5), gres.conf(5))
GRES_ENV = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


def err(msg: str, code: int = 1):
    sys.stderr.write(f"[ERROR] {msg}\n")
    sys.exit(code)


def _docker():
    import dockersim

    return dockersim


def cmd_import(argv):
    out = None
    rest = []
    i = 0
    while i < len(argv):
        if argv[i] in ("-o", "--output") and i + 1 < len(argv):
            out, i = argv[i + 1], i + 2
        elif argv[i].startswith("--output="):
            out, i = argv[i].split("=", 1)[1], i + 1
        else:
            rest.append(argv[i])
            i += 1
    if len(rest) != 1:
        err("Usage: enroot import [options] [--] URI")
    uri = rest[0]
    d = _docker()
    layers = None
    if uri.startswith("dockerd://"):
        ref = uri[len("dockerd://"):]
        img = d.find_image(ref)
        if img is None:
            err(f"Error response from daemon: No such image: {ref}")
    elif uri.startswith("docker://"):
        ref = uri[len("docker://"):].replace("#", "/", 1)
        img = d.find_image(ref) or d.pull(ref, quiet=True, out=sys.stderr)
    elif uri.startswith("docker-archive://"):
        ref = uri[len("docker-archive://"):]
        img, layers = from_archive(d, ref)
    else:
        err(f"Invalid image reference: {uri}")
    out = out or re.sub(r"[^A-Za-z0-9_.-]", "+", ref) + ".sqsh"
    if os.path.exists(out):
        err(f"File already exists: {out}")
    doc = {"id": img["Id"], "repo": img["_repo"], "digest": img["_digest"], "config": img["Config"],
           "platform": img.get("_platform", ""), "requires_cuda": img.get("_requires_cuda")}
    with open(out, "wb") as fh:
        fh.write((MAGIC + "\n" + json.dumps(doc) + "\n").encode())
        for chunk in (layers if layers is not None else layer_bytes(d, img)):
            fh.write(chunk)
    print(f"[INFO] Creating squashfs filesystem... {out}")
    return 0


def layer_bytes(d, img):
    """The image's layers as the simulated docker's data root holds them (a pull put them there)."""
    for digest in img.get("_layers", []):
        try:
            with open(d.blob_path(digest), "rb") as fh:
                yield fh.read()
        except OSError as exc:
            err(f"failed to read layer {digest}: {(exc.strerror or str(exc)).lower()}")


def from_archive(d, path):
    """The image of a ``docker save`` archive (its first entry) and its layers, each checked against its digest."""
    import hashlib
    import tarfile

    try:
        with tarfile.open(path) as tar:
            def member(name):
                found = tar.extractfile(name)
                if found is None:
                    raise KeyError(name)
                return found.read()

            def raw(digest):
                return member("blobs/sha256/" + digest.split(":", 1)[-1])

            entry = json.loads(member("manifest.json"))[0]
            names = tar.getnames()
            index = json.loads(member("index.json")) if "index.json" in names else {}
            config = "sha256:" + entry["Config"].rsplit("/", 1)[1]
            for desc in index.get("manifests", []):
                mraw = raw(desc["digest"])
                if json.loads(mraw)["config"]["digest"] == config:
                    break
            else:
                err(f"Invalid argument: {path}: no manifest for {config}")
            man = json.loads(mraw)
            tags = entry.get("RepoTags") or []
            named = (desc.get("annotations") or {}).get("io.containerd.image.name", "")
            repo = d.parse_ref(tags[0] if tags else named)[0]
            content = (man.get("annotations") or {}).get("io.k3sim.content-digest") or d.digest_of(mraw)
            img = d.image_record(repo, content, mraw, raw(config))
            layers = []
            for digest in img["_layers"]:
                data = raw(digest)
                if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
                    err(f"Invalid argument: {path}: layer {digest} does not match its digest")
                layers.append(data)
    except (OSError, KeyError, ValueError, tarfile.TarError, AttributeError) as exc:
        err(f"Invalid argument: {path} is not a docker archive ({exc})")
    return img, layers


def read_image(path):
    try:
        with open(path, "rb") as fh:
            magic = fh.readline().decode(errors="replace").strip()
            body = fh.readline().decode(errors="replace")
    except OSError as exc:
        err(f"{(exc.strerror or str(exc))}: {path}")
    if magic != MAGIC:
        err(f"Invalid argument: {path} is not a squashfs image")
    try:
        doc = json.loads(body)
    except ValueError:
        err(f"Invalid argument: {path} is a squashfs image of no container")
    named = re.search(r"sha256[_:]([0-9a-f]{64})", os.path.basename(path))
    if named and doc.get("digest") != "sha256:" + named.group(1):
        err(f"{path}: its name says image sha256:{named.group(1)}, it holds {doc.get('digest')}: import it again")
    return doc


def visible_gpus(env, count):
    for key in GRES_ENV:
        value = env.get(key)
        if value is not None:
            return 0 if value.strip() in ("", "NoDevFiles") else len(value.split(","))
    return count


def cmd_start_image(argv):
    """``enroot start [--mount SRC:DST]... [--env KEY[=VAL]]... [--rw] IMAGE COMMAND...``: enroot's own form."""
    mounts: list[str] = []
    env_items: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in ("--mount", "-m", "--env", "-e") and i + 1 < len(argv):
            (mounts if argv[i] in ("--mount", "-m") else env_items).append(argv[i + 1])
            i += 2
        elif argv[i] in ("--rw", "-w", "--root", "-r"):
            i += 1
        elif argv[i] == "--":
            i += 1
            break
        else:
            err(f"Invalid argument: {argv[i]}")
    if i >= len(argv) - 1:
        err("Usage: enroot start [options] [--] NAME|IMAGE [COMMAND] [ARG...]")
    image, command = argv[i], argv[i + 1:]
    doc = read_image(image)
    volumes = []
    for spec in mounts:
        src, _, rest = spec.partition(":")
        if not os.path.exists(src):
            err(f"No such file or directory: {src} (mount {spec})")
        volumes.append(f"{src}:{rest}")
    env = dict(os.environ)
    for item in doc["config"].get("Env") or []:
        key, _, val = item.partition("=")
        env[key] = val
    for item in env_items:
        key, eq, val = item.partition("=")
        if eq:
            env[key] = val
    env.update(K3SIM_VOLUMES=json.dumps(volumes), K3SIM_CONTAINER_IMAGE=doc["digest"],
               PATH=BIN + ":" + env.get("PATH", "/usr/bin:/bin"))
    lib = os.path.dirname(os.path.abspath(__file__))
    if command[0] in ("hf", "huggingface-cli"):   # the image's Hugging Face CLI (as the simulated docker runs it)
        command = [sys.executable, os.path.join(lib, "hfsim.py"), *command[1:]]
    elif os.path.basename(command[0]).startswith("python") and command[1:2] == ["-c"] and \
            "vllm.benchmarks" in (command[2] if len(command) > 2 else ""):
        # vLLM's own benchmark client (k3deploy bench): the real one, from the engine venv, as the simulated docker
        command = [sys.executable, os.path.join(lib, "vllmsim_bench.py"), *command[2:]]
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        err(f"{command[0]}: {(exc.strerror or str(exc)).lower()}", 127)
    return 127


def cmd_start(argv):
    if "--image" not in argv:
        return cmd_start_image(argv)
    opts: dict[str, str] = {}
    mounts: list[str] = []
    flags = set()
    i = 0
    while i < len(argv) and argv[i] != "--":
        a = argv[i]
        if a in ("--image", "--name", "--workdir", "--env", "--mount") and i + 1 < len(argv):
            if a == "--mount":
                mounts.append(argv[i + 1])
            else:
                opts[a[2:]] = argv[i + 1]
            i += 2
        elif a in ("--rw", "--mount-home", "--entrypoint"):
            flags.add(a)
            i += 1
        else:
            err(f"Invalid argument: {a}")
    command = argv[i + 1:]
    if "image" not in opts or not command:
        err("Usage: enroot start --image FILE [options] -- COMMAND [ARG...]")
    doc = read_image(opts["image"])
    volumes = []
    for spec in mounts:
        src, _, rest = spec.partition(":")
        if not os.path.exists(src):
            err(f"No such file or directory: {src} (mount {spec})")
        volumes.append(f"{src}:{rest}")
    env = dict(os.environ)
    keep = set(opts.get("env", "").split(",")) - {""}
    for item in doc["config"].get("Env") or []:
        key, _, val = item.partition("=")
        if key not in keep:
            env[key] = val
    try:
        with open(os.environ.get("K3SIM_NODE_CONFIG", "/etc/k3sim/node.json")) as fh:
            count = int(json.load(fh)["gpu"]["count"])
    except (OSError, ValueError, KeyError):
        count = 0
    env.update(K3SIM_IMAGE_PLATFORM=doc.get("platform") or "", K3SIM_VOLUMES=json.dumps(volumes),
               K3SIM_GPUS_VISIBLE=str(visible_gpus(os.environ, count)), K3SIM_CONTAINER=opts.get("name", ""),
               K3SIM_CONTAINER_IMAGE=doc["digest"], PATH=BIN + ":" + env.get("PATH", "/usr/bin:/bin"))
    if opts.get("workdir"):
        os.chdir(opts["workdir"])
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        err(f"{command[0]}: {(exc.strerror or str(exc)).lower()}", 127)
    return 127


def main(argv):
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("Usage: enroot COMMAND [ARG...] (simulated: version, import, start)")
        return 0
    if argv[0] in ("version", "--version"):
        print(VERSION)
        return 0
    if argv[0] == "import":
        return cmd_import(argv[1:])
    if argv[0] == "start":
        return cmd_start(argv[1:])
    err(f"Unknown command: {argv[0]}")
    return 1
