"""Simulated enroot (NVIDIA's unprivileged container runtime, under pyxis) for one node; ``/usr/bin/enroot`` runs it.

Subset, with enroot's own command forms (github.com/NVIDIA/enroot, doc/usage.md) where it has them:

- ``enroot version``;
- ``enroot import -o FILE dockerd://IMAGE`` (from the node's simulated docker, where the stage put the image) or
  ``docker://[REGISTRY#]IMAGE`` (from the simulated registry, pulled through the simulated docker): writes a
  squashfs-like file (``hsqs``, enroot's squashfs magic, then the image's id, digest, config and platform as JSON);
  an existing ``FILE`` is refused, as enroot refuses it;
- ``enroot start --image FILE [--name N] [--workdir D] [--env NAMES] [--rw] [--mount-home] [--entrypoint]
  [--mount SRC:DST[:FLAGS]]... -- ARGV``: what the simulator's pyxis (``k3sim_pyxis.so``, a SPANK plugin of the
  nodes' slurmd) execs in a task of a step that names ``--container-image``. It checks the file (present, a squashfs
  of this simulator, holding the image whose digest its name carries) and every mount's source, then runs ARGV as
  the task's own process (same pid: the job's cgroup and process tree) with the task's environment, the image's on
  top (pyxis: the image's values take precedence, but for ``--container-env`` names), the mounts for the simulated
  engine (``K3SIM_VOLUMES``), the image's ``vllm`` on PATH, and as many GPUs as Slurm gave the job
  (``CUDA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES`` or ``GPU_DEVICE_ORDINAL`` from its GRES; all of the node's
  without one: nothing confines the devices in the simulated nodes).
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
    if uri.startswith("dockerd://"):
        ref = uri[len("dockerd://"):]
        img = d.find_image(ref)
        if img is None:
            err(f"Error response from daemon: No such image: {ref}")
    elif uri.startswith("docker://"):
        ref = uri[len("docker://"):].replace("#", "/", 1)
        img = d.find_image(ref) or d.pull(ref, quiet=True, out=sys.stderr)
    else:
        err(f"Invalid image reference: {uri}")
    out = out or re.sub(r"[^A-Za-z0-9_.-]", "+", ref) + ".sqsh"
    if os.path.exists(out):
        err(f"File already exists: {out}")
    doc = {"id": img["Id"], "repo": img["_repo"], "digest": img["_digest"], "config": img["Config"],
           "platform": img.get("_platform", ""), "requires_cuda": img.get("_requires_cuda")}
    with open(out, "w") as fh:
        fh.write(MAGIC + "\n" + json.dumps(doc) + "\n")
    print(f"[INFO] Creating squashfs filesystem... {out}")
    return 0


def read_image(path):
    try:
        with open(path) as fh:
            magic = fh.readline().strip()
            body = fh.read()
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


def cmd_start(argv):
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
