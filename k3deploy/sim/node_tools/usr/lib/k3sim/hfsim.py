#!/usr/bin/python3
"""Simulated ``hf download MODEL`` of the Hugging Face CLI, as run inside a vLLM image.

It writes the snapshot layout ``huggingface_hub`` uses (``hub/models--ORG--NAME/{refs/main,snapshots/REV/}``)
into the cache directory bind-mounted on the container's ``/root/.cache`` (or ``/root/.cache/huggingface``),
with a few small files instead of the real weights. ``HF_TOKEN_PATH`` names the token file; its value is never
printed. ``HF_HUB_OFFLINE=1`` refuses to download, as the real client does.
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
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(base, "refs"), exist_ok=True)
    files = {"config.json": json.dumps({"architectures": ["KimiK3ForCausalLM"], "_name_or_path": repo}),
             "model.safetensors.index.json": json.dumps({"metadata": {"total_size": 1560000000000}, "weight_map": {}}),
             "tokenizer_config.json": "{}"}
    for i, (name, text) in enumerate(files.items(), 1):
        time.sleep(0.05)
        with open(os.path.join(snap, name), "w") as f:
            f.write(text)
        print(f"Fetching {len(files)} files: {i}/{len(files)} {name}", flush=True)
    with open(os.path.join(base, "refs", "main"), "w") as f:
        f.write(rev)
    print(snap)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
