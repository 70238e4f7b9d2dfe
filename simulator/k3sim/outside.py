"""The simulated outside: one HTTP server that stands in for the container registries and the model hub.

``sim up`` runs this file as a script (``python3 outside.py --dir DIR ...``, standard library only, so that it starts
fast and imports nothing of k3deploy) in the cluster's network namespace ``NAME-out``, at ``<subnet>.254`` port 80.
The nodes' ``/etc/hosts`` map ``registry-1.docker.io``, ``quay.io``, ``huggingface.co`` and ``k3sim-outside`` to it.

It serves real bytes:

- **Registry** (OCI distribution API): ``GET /v2/``; ``GET|HEAD /v2/<repository>/manifests/<tag or digest>`` (an OCI
  image manifest whose ``Docker-Content-Digest`` header is the digest ``registry.json`` fixes for that tag, not the
  sha256 of the body, so that pinned digests keep working; the manifest carries it, and the image id, in its
  ``io.k3sim.*`` annotations); ``GET|HEAD /v2/<repository>/blobs/<digest>`` (the config or a layer; the sha256 of a
  blob's bytes is its digest). Each image has 2-4 layers of deterministic pseudo-random bytes (seeded by
  ``repository:tag``), ``--image-mb`` MiB together. Every repository and tag of ``registry.json`` is served; the
  ``Host`` header picks the registry (``quay.io`` for ``quay.io/...`` repositories, any other name for Docker Hub's,
  so a registry mirror is any name that points here).
- **Model hub** (Hugging Face API shapes): ``GET /api/models/<repo>[/revision/<rev>]`` (``?blobs=true`` or not):
  ``id``, ``sha`` (the commit), ``siblings`` with ``rfilename``, ``size``, ``blobId`` and, for the safetensors shards,
  ``lfs`` (``sha256``, ``size``, ``pointerSize``); ``GET|HEAD /<repo>/resolve/<rev>/<file>`` with ``Range: bytes=N-``
  (206 and ``Content-Range``), ``X-Repo-Commit``, ``ETag`` (the sha256 of an LFS file, else its git blob id) and
  ``Content-Length``. Any repo id is served: its checkpoint (``config.json``, ``tokenizer_config.json``,
  ``tokenizer.json``, ``model.safetensors.index.json``, shards ``model-0000K-of-0000N.safetensors`` of at most
  64 MiB, at least two, ``--weights-mb`` MiB together) is generated from the repo id on first use. Revision ``main``
  and the commit resolve.

Generated files are cached under ``DIR/cache``. Every byte sent is counted in ``DIR/counters.json`` (rewritten at the
end of every response and after every MiB): ``payload_bytes`` (image layers and hub files: what a node needs),
``other_bytes`` (headers, manifests, image configs, API answers), ``by_host`` (payload per ``Host`` header),
``aborted`` (transfers cut) and the state of the ``outside-cut`` fault, which :func:`set_cut` arms in
``DIR/fault.json``: after that many more MiB of payload, every transfer in progress is cut (the connection is closed
mid-body) once; later transfers are served normally.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MiB = 1 << 20
#: the outside's address is ``<subnet>.OCTET``
OCTET = 254
PORT = 80
#: names the nodes' /etc/hosts map to the outside
HOSTS = ("k3sim-outside", "registry-1.docker.io", "quay.io", "huggingface.co")
#: the process name (``/proc/PID/comm``) the server sets, so that ``sim down`` signals only it
PROCESS_NAME = "k3sim-outside"
REGISTRY_JSON = Path(__file__).with_name("node_tools") / "usr/lib/k3sim/registry.json"
COUNTERS = "counters.json"
FAULT = "fault.json"
#: tags pushed again since ``up`` (:func:`repush`): ``{"repo:tag": [{"digest", "id", "created"}, ...]}``
PUSHES = "pushes.json"

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
MAX_SHARD = 64 * MiB
#: each shard's safetensors header is padded to this many bytes
SHARD_HEADER = 512
CHUNK = 64 * 1024
GEN_CHUNK = 8 * MiB
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


# --------------------------------------------------------------------------- sizes (pure: the status uses them too)


def mib_bytes(mib: float) -> int:
    return int(round(mib * MiB))


def layer_sizes(seed: str, total: int) -> list[int]:
    """The sizes of an image's 2-4 layers (deterministic per ``repository:tag``), ``total`` bytes together."""
    h = hashlib.sha256(seed.encode()).digest()
    count = max(1, min(2 + h[0] % 3, total))
    weights = [1 + h[1 + i] % 4 for i in range(count)]
    sizes = [total * w // sum(weights) for w in weights]
    sizes[-1] += total - sum(sizes)
    return sizes


def shard_names(total: int) -> list[str]:
    n = max(2, -(-total // MAX_SHARD))
    return [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def shard_sizes(total: int) -> dict[str, int]:
    names = shard_names(total)
    sizes = [total // len(names)] * len(names)
    sizes[-1] += total - sum(sizes)
    return dict(zip(names, sizes, strict=True))


def _tensors(index: int, data: int) -> list[tuple[str, int]]:
    """The (name, bytes) of the two tensors of shard ``index`` (1-based) holding ``data`` bytes."""
    half = data // 2
    return [(f"model.layers.{index - 1}.mlp.experts.weight", half),
            (f"model.layers.{index - 1}.self_attn.o_proj.weight", data - half)]


#: the simulated checkpoint's tokenizer: word-level, one id per whitespace-separated word (as the simulated engine
#: counts tokens), ``[UNK]`` and ``w1`` ... ``w1023``. Not Kimi-K3's vocabulary (tiktoken, remote code, not to be had
#: offline): a real tokenizer file that transformers loads (``PreTrainedTokenizerFast``), so that a real client that
#: needs the model's tokenizer (``vllm bench serve``'s random dataset) reads it from the snapshot as it would K3's.
TOKENIZER_WORDS = 1024


def tokenizer_json() -> dict[str, Any]:
    """The ``tokenizer.json`` of :data:`TOKENIZER_WORDS` ids (the ``tokenizers`` library's format, WordLevel model).

    >>> t = tokenizer_json()
    >>> t["model"]["type"], t["model"]["vocab"]["w7"], len(t["model"]["vocab"])
    ('WordLevel', 7, 1024)
    """
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, TOKENIZER_WORDS)}}
    unk = {"id": 0, "content": "[UNK]", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
           "special": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [unk], "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}


def small_files(total: int) -> dict[str, bytes]:
    """The checkpoint's small files (the same for every repo id: only the shard layout decides them)."""
    config = {"architectures": ["KimiK3ForCausalLM"], "model_type": "kimi_k3", "torch_dtype": "bfloat16",
              "num_hidden_layers": len(shard_names(total)), "k3sim": True}
    tokenizer = {"model_max_length": 1048576, "tokenizer_class": "PreTrainedTokenizerFast"}
    weight_map: dict[str, str] = {}
    data_total = 0
    for i, (name, size) in enumerate(shard_sizes(total).items(), 1):
        for tensor, n in _tensors(i, size - 8 - SHARD_HEADER):
            weight_map[tensor] = name
            data_total += n
    index = {"metadata": {"total_size": data_total}, "weight_map": dict(sorted(weight_map.items()))}
    return {"config.json": (json.dumps(config, indent=2) + "\n").encode(),
            "tokenizer_config.json": (json.dumps(tokenizer, indent=2) + "\n").encode(),
            "tokenizer.json": json.dumps(tokenizer_json(), separators=(",", ":")).encode(),
            "model.safetensors.index.json": (json.dumps(index, indent=2) + "\n").encode()}


def checkpoint_bytes(weights_mb: float) -> int:
    """All files of a repo's checkpoint: the shards (``weights_mb`` MiB) and the small files."""
    total = mib_bytes(weights_mb)
    return total + sum(len(b) for b in small_files(total).values())


def artifact_bytes(image_mb: float, weights_mb: float) -> int:
    """What one node needs from outside: one image's layers and one checkpoint."""
    return mib_bytes(image_mb) + checkpoint_bytes(weights_mb)


def commit_of(repo: str, total: int) -> str:
    return hashlib.sha1(f"k3sim/{repo}/{total}".encode()).hexdigest()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


# --------------------------------------------------------------------------- counters and the cut fault (files)


def read_counters(d: Path) -> dict[str, Any]:
    """The server's counters (zeros before its first write)."""
    try:
        doc: dict[str, Any] = json.loads((Path(d) / COUNTERS).read_text())
    except (OSError, ValueError):
        doc = {}
    base = {"payload_bytes": 0, "other_bytes": 0, "requests": 0, "by_host": {}, "aborted": 0, "cut": None}
    return {**base, **doc}


def set_cut(d: Path, mib: float) -> None:
    """Arm the ``outside-cut`` fault: ``mib`` more MiB of payload, then every transfer in progress is cut once."""
    _write_json(Path(d) / FAULT, {"id": uuid.uuid4().hex, "mib": mib})


def clear_cut(d: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (Path(d) / FAULT).unlink()


def repush(d: Path, ref: str, registry: dict[str, Any] | None = None) -> str:
    """Push a new build of ``repo:tag`` (a tag of ``registry.json``) to the outside whose state is in ``d``: from
    now on the tag names it (a new manifest digest, image id and layers); every earlier build stays reachable by its
    digest, as on a real registry. Returns the new digest."""
    repo, _, tag = ref.rpartition(":")
    known = registry if registry is not None else json.loads(REGISTRY_JSON.read_text())
    if not repo or "/" in tag or tag not in known.get(repo, {}):
        raise ValueError(f"{ref}: not a repository:tag of the simulated registry ({REGISTRY_JSON.name})")
    path = d / PUSHES
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        doc = {}
    builds = doc.setdefault(f"{repo}:{tag}", [])
    n = len(builds) + 1
    seed = f"{repo}:{tag}#{n}"
    builds.append({"digest": "sha256:" + hashlib.sha256(f"manifest {seed}".encode()).hexdigest(),
                   "id": "sha256:" + hashlib.sha256(f"config {seed}".encode()).hexdigest(),
                   "created": time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())})
    _write_json(path, doc)
    return str(builds[-1]["digest"])


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


class Meter:
    """Counts what the server sends and decides when the cut fault fires (one lock for both)."""

    def __init__(self, d: Path) -> None:
        self.dir = d
        self.lock = threading.Lock()
        self.c = read_counters(d)
        self.gen = 0  # bumped when the cut fires: transfers of an older generation stop
        self.fault_sig: tuple[int, int, int] | None = None
        self.flushed = self.c["payload_bytes"]

    def _refresh_fault(self) -> None:
        path = self.dir / FAULT
        try:
            st = os.stat(path)
            sig: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            sig = None
        if sig == self.fault_sig:
            return
        self.fault_sig = sig
        if sig is None:
            if self.c["cut"] is not None:
                self.c["cut"] = None
                self._flush()
            return
        try:
            doc = json.loads(path.read_text())
            fid, mib = str(doc["id"]), float(doc["mib"])
        except (OSError, ValueError, KeyError, TypeError):
            self.fault_sig = None  # half written: read it again next time
            return
        cut = self.c["cut"]
        if cut is None or cut.get("id") != fid:
            self.c["cut"] = {"id": fid, "mib": mib, "limit": self.c["payload_bytes"] + mib_bytes(mib),
                             "fired": False}
            self._flush()

    def start(self) -> int:
        """A transfer begins: its generation."""
        with self.lock:
            self._refresh_fault()
            self.c["requests"] += 1
            return self.gen

    def grant(self, n: int, gen: int, host: str) -> int:
        """How many of the next ``n`` payload bytes of a transfer of generation ``gen`` may go (counted as sent);
        fewer than ``n`` means: send those, then cut the connection."""
        with self.lock:
            self._refresh_fault()
            if gen != self.gen:
                return 0
            cut = self.c["cut"]
            if cut is not None and not cut["fired"]:
                room = cut["limit"] - self.c["payload_bytes"]
                if room < n:
                    n = max(0, room)
                    cut["fired"] = True
                    cut["fired_at"] = time.time()
                    self.gen += 1
            self.c["payload_bytes"] += n
            self.c["by_host"][host] = self.c["by_host"].get(host, 0) + n
            if self.c["payload_bytes"] - self.flushed >= MiB or (cut is not None and cut["fired"] and n == 0):
                self._flush()
            return n

    def refund(self, n: int, host: str) -> None:
        """Granted bytes that could not be sent (the client went away)."""
        with self.lock:
            self.c["payload_bytes"] -= n
            self.c["by_host"][host] = self.c["by_host"].get(host, 0) - n

    def other(self, n: int) -> None:
        with self.lock:
            self.c["other_bytes"] += n

    def done(self, aborted: bool = False) -> None:
        with self.lock:
            if aborted:
                self.c["aborted"] += 1
            self._flush()

    def _flush(self) -> None:
        self.flushed = self.c["payload_bytes"]
        self.c["updated"] = time.time()
        _write_json(self.dir / COUNTERS, self.c)


# --------------------------------------------------------------------------- generated content


def _fill(path: Path, seed: str, size: int, prefix: bytes = b"") -> str:
    """Write ``prefix`` then ``size - len(prefix)`` deterministic bytes to ``path``; returns the sha256."""
    rnd = random.Random(seed)
    h = hashlib.sha256()
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(prefix)
        h.update(prefix)
        left = size - len(prefix)
        while left > 0:
            block = rnd.randbytes(min(GEN_CHUNK, left))
            fh.write(block)
            h.update(block)
            left -= len(block)
    os.replace(tmp, path)
    return h.hexdigest()


class Store:
    """The registry's images and the hub's checkpoints, generated on first use and cached under ``DIR/cache``."""

    def __init__(self, d: Path, image_bytes: int, weights_bytes: int, registry: dict[str, Any]) -> None:
        self.state = d
        self.pushes: dict[str, list[dict[str, Any]]] = {}
        self.pushes_sig: tuple[int, int, int] | None = None
        self.dir = d / "cache"
        self.blobs = self.dir / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.image_bytes = image_bytes
        self.weights_bytes = weights_bytes
        self.registry = registry
        self.locks: dict[str, threading.Lock] = {}
        self.locks_lock = threading.Lock()
        self.known: dict[str, Path] = {}  # blob digest -> file
        self.configs: set[str] = set()  # digests of image configs (metadata; the rest are layers: payload)

    def _lock(self, key: str) -> threading.Lock:
        with self.locks_lock:
            return self.locks.setdefault(key, threading.Lock())

    # -- registry
    def repository(self, host: str, name: str) -> str | None:
        """The registry.json key of repository ``name`` asked of ``host``."""
        if host == "quay.io" and f"quay.io/{name}" in self.registry:
            return f"quay.io/{name}"
        plain = name.removeprefix("library/")
        if plain in self.registry:
            return plain
        return None

    def refresh_pushes(self) -> None:
        """Re-read ``pushes.json`` when it changed (:func:`repush` writes it while the server runs)."""
        path = self.state / PUSHES
        try:
            st = os.stat(path)
            sig: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            sig = None
        if sig == self.pushes_sig:
            return
        try:
            self.pushes = json.loads(path.read_text()) if sig is not None else {}
        except (OSError, ValueError):
            return  # half written: read it again next time
        self.pushes_sig = sig

    def builds(self, repo: str, tag: str) -> list[dict[str, Any]]:
        """Every build the tag has named, oldest first (registry.json's, then each push); the last is current."""
        base = self.registry[repo][tag]
        return [base, *({**base, **p} for p in self.pushes.get(f"{repo}:{tag}", []))]

    def tag_of(self, repo: str, ref: str) -> tuple[str, int] | None:
        """(tag, build number) that ``ref`` (a tag: its current build; a digest: the build it names) resolves to."""
        tags = self.registry[repo]
        if ref.startswith("sha256:"):
            for t in tags:
                for n, m in enumerate(self.builds(repo, t)):
                    if m["digest"] == ref:
                        return t, n
            return None
        return (ref, len(self.builds(repo, ref)) - 1) if ref in tags else None

    def image(self, repo: str, tag: str, build: int = 0) -> dict[str, Any]:
        """{"manifest": bytes, "digest": registry digest, "blobs": {digest: path}} of build ``build`` of
        ``repo:tag`` (0: registry.json's)."""
        key = f"{repo}:{tag}" + (f"#{build}" if build else "")
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
        meta_path = self.dir / f"image-{safe}-{self.image_bytes}.json"
        with self._lock(key):
            if meta_path.exists():
                meta = json.loads(meta_path.read_text())
            else:
                meta = self._make_image(repo, tag, build)
                _write_json(meta_path, meta)
        blobs = {d: self.blobs / d.split(":", 1)[1] for d in meta["blobs"]}
        self.known.update(blobs)
        self.configs.add(meta["blobs"][0])
        return {"manifest": meta["manifest"].encode(), "digest": meta["digest"], "blobs": blobs}

    def _make_image(self, repo: str, tag: str, build: int) -> dict[str, Any]:
        m = self.builds(repo, tag)[build]
        seed = f"{repo}:{tag}" + (f"#{build}" if build else "")
        layers = []
        for i, size in enumerate(layer_sizes(seed, self.image_bytes)):
            tmp = self.blobs / f"layer-{uuid.uuid4().hex}"
            hexd = _fill(tmp, f"{seed}/layer{i}", size)
            os.replace(tmp, self.blobs / hexd)
            layers.append({"mediaType": LAYER_TYPE, "digest": f"sha256:{hexd}", "size": size})
        config = {"architecture": "amd64", "os": "linux", "created": m["created"],
                  "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                             "Entrypoint": m.get("entrypoint") or None, "Cmd": m.get("cmd") or None,
                             "Labels": {"org.opencontainers.image.version": m.get("vllm", "")}},
                  "rootfs": {"type": "layers", "diff_ids": [x["digest"] for x in layers]}}
        raw = json.dumps(config, sort_keys=True).encode()
        chex = hashlib.sha256(raw).hexdigest()
        (self.blobs / chex).write_bytes(raw)
        annotations = {"io.k3sim.content-digest": m["digest"], "io.k3sim.image-id": m["id"],
                       "io.k3sim.platform": m.get("platform", ""),
                       "io.k3sim.requires-cuda": m.get("requires_cuda") or "",
                       "io.k3sim.image-size": str(m.get("size", self.image_bytes)),
                       "org.opencontainers.image.version": m.get("vllm", "")}
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                    "config": {"mediaType": CONFIG_TYPE, "digest": f"sha256:{chex}", "size": len(raw)},
                    "layers": layers, "annotations": annotations}
        return {"manifest": json.dumps(manifest, indent=3), "digest": m["digest"],
                "blobs": [f"sha256:{chex}", *[x["digest"] for x in layers]]}

    def blob(self, repo: str, digest: str) -> Path | None:
        if digest not in self.known:
            for tag in self.registry[repo]:
                for n in range(len(self.builds(repo, tag))):
                    self.image(repo, tag, n)
        path = self.known.get(digest)
        return path if path is not None and path.exists() else None

    # -- hub
    def model(self, repo: str) -> dict[str, Any]:
        """{"sha", "files": [{"name", "size", "blob_id", "sha256" (LFS only), "path"}]} of ``repo``'s checkpoint."""
        d = self.dir / "models" / repo.replace("/", "--") / str(self.weights_bytes)
        meta_path = d / "meta.json"
        with self._lock("model:" + repo):
            if meta_path.exists():
                return dict(json.loads(meta_path.read_text()))
            d.mkdir(parents=True, exist_ok=True)
            files: list[dict[str, Any]] = []
            for name, data in small_files(self.weights_bytes).items():
                (d / name).write_bytes(data)
                files.append({"name": name, "size": len(data), "blob_id": git_blob_id(data), "path": str(d / name)})
            for i, (name, size) in enumerate(shard_sizes(self.weights_bytes).items(), 1):
                header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
                offset = 0
                for tensor, n in _tensors(i, size - 8 - SHARD_HEADER):
                    header[tensor] = {"dtype": "U8", "shape": [n], "data_offsets": [offset, offset + n]}
                    offset += n
                text = json.dumps(header).encode().ljust(SHARD_HEADER)
                sha = _fill(d / name, f"{repo}/{name}", size, struct.pack("<Q", len(text)) + text)
                files.append({"name": name, "size": size, "sha256": sha, "blob_id": git_blob_id(lfs_pointer(sha, size)),
                              "path": str(d / name)})
            meta = {"sha": commit_of(repo, self.weights_bytes), "files": sorted(files, key=lambda f: str(f["name"]))}
            _write_json(meta_path, meta)
            return meta


# --------------------------------------------------------------------------- HTTP


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "k3sim-outside/1"
    sys_version = ""
    store: Store
    meter: Meter

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class names it so)
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {self.client_address[0]} {self.headers.get('Host', '-')} "
                         f"{format % args}\n")

    def end_headers(self) -> None:
        buf = getattr(self, "_headers_buffer", [])
        self.meter.other(sum(len(b) for b in buf) + 2)
        super().end_headers()

    @property
    def host(self) -> str:
        return (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]").lower()

    # -- small answers
    def _small(self, code: int, body: bytes, ctype: str = "application/json", headers: dict[str, str] | None = None,
               head: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)
            self.meter.other(len(body))
        self.meter.done()

    def _oci_error(self, code: int, err: str, message: str, head: bool) -> None:
        body = json.dumps({"errors": [{"code": err, "message": message, "detail": None}]}).encode()
        headers = {"Docker-Distribution-API-Version": "registry/2.0"}
        if code == 401:
            headers["WWW-Authenticate"] = f'Bearer realm="http://{self.host}/token",service="{self.host}"'
        self._small(code, body, headers=headers, head=head)

    def _hub_error(self, code: int, err: str, message: str, head: bool) -> None:
        self._small(code, json.dumps({"error": message}).encode(), headers={"X-Error-Code": err,
                                                                              "X-Error-Message": message}, head=head)

    # -- a file, with Range, counted and cut as the meter says
    def _file(self, path: Path, headers: dict[str, str], head: bool) -> None:
        size = path.stat().st_size
        start, code = 0, 200
        rng = self.headers.get("Range", "")
        m = re.fullmatch(r"\s*bytes=(\d+)-(\d*)\s*", rng)
        end = size - 1
        if m:
            start = int(m[1])
            if m[2]:
                end = min(end, int(m[2]))
            if start >= size or start > end:
                self._small(416, b"", "text/plain", {"Content-Range": f"bytes */{size}"}, head=head)
                return
            code = 206
        length = end - start + 1
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        if code == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            self.meter.done()
            return
        gen = self.meter.start()
        host = self.host or "-"
        with open(path, "rb") as fh:
            fh.seek(start)
            left = length
            while left > 0:
                chunk = fh.read(min(CHUNK, left))
                if not chunk:
                    break
                ok = self.meter.grant(len(chunk), gen, host)
                if ok:
                    try:
                        self.wfile.write(chunk[:ok])
                    except OSError:
                        self.meter.refund(ok, host)
                        self.close_connection = True
                        self.meter.done(aborted=True)
                        return
                    left -= ok
                if ok < len(chunk):
                    self._cut()
                    return
        self.meter.done()

    def _cut(self) -> None:
        """Close the connection mid-body: what was sent arrives, then the end of the stream."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
        self.meter.done(aborted=True)
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} cut {self.path} to {self.client_address[0]}\n")

    # -- routes
    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        path, _, _query = self.path.partition("?")
        try:
            if path in ("/v2", "/v2/"):
                self._small(200, b"{}", headers={"Docker-Distribution-API-Version": "registry/2.0"}, head=head)
            elif path.startswith("/v2/"):
                self._registry(path, head)
            elif path.startswith("/api/models/"):
                self._hub_api(path[len("/api/models/"):], head)
            elif "/resolve/" in path:
                self._hub_file(path, head)
            else:
                self._small(404, b'{"error": "not found"}', head=head)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _registry(self, path: str, head: bool) -> None:
        m = re.fullmatch(r"/v2/(.+)/(manifests|blobs)/([^/]+)", path)
        if not m:
            return self._oci_error(404, "NAME_UNKNOWN", "repository name not known to registry", head)
        name, kind, ref = m[1], m[2], m[3]
        repo = self.store.repository(self.host, name)
        if repo is None:  # Docker Hub and quay.io answer a repository that does not exist as one you may not read
            return self._oci_error(401, "UNAUTHORIZED", "authentication required", head)
        self.store.refresh_pushes()
        if kind == "manifests":
            found = self.store.tag_of(repo, ref)
            if found is None:
                return self._oci_error(404, "MANIFEST_UNKNOWN", "manifest unknown", head)
            img = self.store.image(repo, *found)
            return self._small(200, img["manifest"], MANIFEST_TYPE, {
                "Docker-Content-Digest": img["digest"], "ETag": f'"{img["digest"]}"',
                "Docker-Distribution-API-Version": "registry/2.0"}, head=head)
        blob = self.store.blob(repo, ref)
        if blob is None:
            return self._oci_error(404, "BLOB_UNKNOWN", "blob unknown to registry", head)
        headers = {"Docker-Content-Digest": ref, "ETag": f'"{ref}"', "Docker-Distribution-API-Version": "registry/2.0"}
        if ref in self.store.configs and not self.headers.get("Range"):  # the config: metadata, not payload
            return self._small(200, blob.read_bytes(), "application/octet-stream", headers, head=head)
        self._file(blob, headers, head)

    def _model_rev(self, repo: str, rev: str, head: bool) -> dict[str, Any] | None:
        if not REPO_RE.match(repo):
            self._hub_error(404, "RepoNotFound", "Repository not found", head)
            return None
        meta = self.store.model(repo)
        if rev not in ("main", meta["sha"]):
            self._hub_error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return None
        return meta

    def _hub_api(self, rest: str, head: bool) -> None:
        m = re.fullmatch(r"(.+?)/revision/([^/]+)", rest)
        repo, rev = (m[1], m[2]) if m else (rest.rstrip("/"), "main")
        meta = self._model_rev(repo, rev, head)
        if meta is None:
            return
        siblings = []
        for f in meta["files"]:
            s: dict[str, Any] = {"rfilename": f["name"], "size": f["size"], "blobId": f["blob_id"]}
            if "sha256" in f:
                s["lfs"] = {"sha256": f["sha256"], "size": f["size"],
                            "pointerSize": len(lfs_pointer(f["sha256"], f["size"]))}
            siblings.append(s)
        doc = {"_id": hashlib.sha1(repo.encode()).hexdigest()[:24], "id": repo, "modelId": repo, "sha": meta["sha"],
               "lastModified": "2026-07-27T08:00:00.000Z", "private": False, "disabled": False, "gated": False,
               "library_name": "transformers", "tags": ["safetensors"], "siblings": siblings,
               "usedStorage": sum(f["size"] for f in meta["files"])}
        self._small(200, json.dumps(doc).encode(), head=head)

    def _hub_file(self, path: str, head: bool) -> None:
        m = re.fullmatch(r"/(.+?)/resolve/([^/]+)/(.+)", path)
        if not m:
            return self._hub_error(404, "EntryNotFound", "Entry not found", head)
        meta = self._model_rev(m[1], m[2], head)
        if meta is None:
            return
        f = next((x for x in meta["files"] if x["name"] == m[3]), None)
        if f is None:
            return self._hub_error(404, "EntryNotFound", "Entry not found", head)
        etag = f.get("sha256") or f["blob_id"]
        headers = {"ETag": f'"{etag}"', "X-Repo-Commit": meta["sha"]}
        if "sha256" in f:
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(f["size"])})
        self._file(Path(f["path"]), headers, head)


# --------------------------------------------------------------------------- main


def _set_process_name(name: str) -> None:
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the simulated outside: registries and model hub")
    ap.add_argument("--dir", required=True, help="state directory (counters, fault, cache)")
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=PORT)
    ap.add_argument("--image-mb", type=float, default=8.0)
    ap.add_argument("--weights-mb", type=float, default=8.0)
    ap.add_argument("--registry", default=str(REGISTRY_JSON))
    args = ap.parse_args(argv)
    _set_process_name(PROCESS_NAME)
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    registry = json.loads(Path(args.registry).read_text())
    registry.pop("_comment", None)
    Handler.store = Store(d, mib_bytes(args.image_mb), mib_bytes(args.weights_mb), registry)
    Handler.meter = Meter(d)
    Handler.meter.done()  # the counters file exists from the start
    server = ThreadingHTTPServer((args.bind, args.port), Handler)
    server.daemon_threads = True

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.stderr.write(f"k3sim outside serving on {args.bind}:{args.port} (image {args.image_mb} MiB, "
                     f"weights {args.weights_mb} MiB)\n")
    sys.stderr.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        Handler.meter.done()
    return 0


if __name__ == "__main__":
    sys.exit(main())
