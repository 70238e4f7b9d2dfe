#!/usr/bin/python3
"""Simulated ``hf download MODEL`` of the Hugging Face CLI, as run inside a vLLM image.

It writes the cache layout ``huggingface_hub`` uses (``hub/models--ORG--NAME/{blobs/ETAG, refs/main,
snapshots/REV/NAME -> ../../blobs/ETAG}``; the ETag of an LFS file, a shard, is its sha256) into the cache
directory bind-mounted on the container's ``/root/.cache`` (or ``/root/.cache/huggingface``), with a small
checkpoint (two shards of ``K3SIM_SHARD_BYTES``) instead of the real weights. A blob is written as
``ETAG.incomplete`` and renamed once complete; complete blobs are not written again. ``HF_TOKEN_PATH`` names
the token file; its value is never printed. ``HF_HUB_OFFLINE=1`` refuses to download, as the real client does.
"""

import hashlib
import json
import os
import sys
import time


def host_path(container_path):
    """Where a container path lives on the node, through the bind mounts (longest destination first)."""
    mounts = []
    for spec in json.loads(os.environ.get("K3SIM_VOLUMES", "[]")):
        src, _, rest = spec.partition(":")
        mounts.append((rest.split(":")[0].rstrip("/"), src))
    for dst, src in sorted(mounts, key=lambda m: -len(m[0])):
        if container_path == dst or container_path.startswith(dst + "/"):
            return src + container_path[len(dst):]
    return container_path


def cache_root():
    for spec in json.loads(os.environ.get("K3SIM_VOLUMES", "[]")):
        src, _, rest = spec.partition(":")
        dst = rest.split(":")[0]
        if dst.rstrip("/") == "/root/.cache":
            return os.path.join(src, "huggingface")
        if dst.rstrip("/") == "/root/.cache/huggingface":
            return src
    return None


#: shards of the simulated checkpoint, and the size of each (small: the simulation moves real bytes)
SHARDS = 2
SHARD_BYTES = int(os.environ.get("K3SIM_SHARD_BYTES", str(256 * 1024)))


def checkpoint(repo):
    """The files of the simulated checkpoint of ``repo``, by name: deterministic bytes per repository."""
    names = [f"model-{i:05d}-of-{SHARDS:05d}.safetensors" for i in range(1, SHARDS + 1)]
    shards = {}
    for name in names:
        seed = hashlib.sha256(f"{repo}/{name}".encode()).digest()
        shards[name] = (seed * (SHARD_BYTES // len(seed) + 1))[:SHARD_BYTES]
    index = {"metadata": {"total_size": SHARD_BYTES * SHARDS},
             "weight_map": {f"model.layers.{i}.weight": name for i, name in enumerate(names)}}
    return {"config.json": json.dumps({"architectures": ["KimiK3ForCausalLM"], "_name_or_path": repo}).encode(),
            "tokenizer_config.json": b"{}",
            "model.safetensors.index.json": json.dumps(index).encode(), **shards}


def etag_of(name, data):
    """The hub's ETag, which names the blob in the cache: sha256 for LFS files (the shards), else the git blob id."""
    if name.endswith(".safetensors"):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def main(argv):
    if not argv or argv[0] != "download" or len(argv) < 2:
        print("usage: hf download REPO_ID [--revision REV]", file=sys.stderr)
        return 2
    repo = argv[1]
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        print(f"Cannot download {repo}: HF_HUB_OFFLINE=1 (offline mode is enabled).", file=sys.stderr)
        return 1
    token_path = os.environ.get("HF_TOKEN_PATH")
    if token_path and not (os.path.isfile(host_path(token_path)) and open(host_path(token_path)).read().strip()):
        print(f"Token file {token_path} is missing or empty.", file=sys.stderr)
        return 1
    root = cache_root()
    if root is None:
        print("No cache volume mounted on /root/.cache: the download would be lost with the container.",
              file=sys.stderr)
        return 1
    rev = hashlib.sha1(repo.encode()).hexdigest()
    base = os.path.join(root, "hub", "models--" + repo.replace("/", "--"))
    snap = os.path.join(base, "snapshots", rev)
    blobs = os.path.join(base, "blobs")
    for d in (snap, blobs, os.path.join(base, "refs")):
        os.makedirs(d, exist_ok=True)
    files = checkpoint(repo)
    for i, (name, data) in enumerate(files.items(), 1):
        etag = etag_of(name, data)
        blob = os.path.join(blobs, etag)
        if not (os.path.isfile(blob) and os.path.getsize(blob) == len(data)):
            time.sleep(0.02)
            with open(blob + ".incomplete", "wb") as f:
                f.write(data)
            if name.endswith(".safetensors") and hashlib.sha256(open(blob + ".incomplete", "rb").read()).hexdigest() \
                    != etag:
                print(f"Consistency check failed: file {name} has the wrong sha256", file=sys.stderr)
                return 1
            os.replace(blob + ".incomplete", blob)
        link = os.path.join(snap, name)
        if not os.path.islink(link):
            os.symlink(os.path.join("..", "..", "blobs", etag), link)
        print(f"Fetching {len(files)} files: {i}/{len(files)} {name}", flush=True)
    with open(os.path.join(base, "refs", "main"), "w") as f:
        f.write(rev)
    print(snap)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
