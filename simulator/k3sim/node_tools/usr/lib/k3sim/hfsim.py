#!/usr/bin/python3
"""Simulated ``hf download REPO [--revision REV]`` of the Hugging Face CLI, as run inside a vLLM image.

It downloads from the hub at ``HF_ENDPOINT`` (default ``http://huggingface.co``: the simulated outside; plain HTTP)
and writes the cache layout ``huggingface_hub`` uses into the cache directory bind-mounted on the container's
``/root/.cache`` (or ``/root/.cache/huggingface``): ``hub/models--ORG--NAME/blobs/ETAG`` (the ETag of an LFS file, a
shard, is its sha256; of a small file, its git blob id), ``snapshots/COMMIT/FILE -> ../../blobs/ETAG`` and
``refs/REV`` (the commit). A file is downloaded to ``blobs/ETAG.incomplete``, resumed from that file's size with a
``Range`` request, verified against its sha256 (LFS files) and renamed into place; complete blobs are skipped. A
transfer that breaks exits 1 and leaves the ``.incomplete`` file for the next run (the real client retries a few
times in-process first). ``HF_TOKEN_PATH`` names the token file, sent as ``Authorization: Bearer`` and never
printed. ``HF_HUB_OFFLINE=1`` refuses to download, as the real client does.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import sys
import urllib.parse

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3simlib as k  # noqa: E402

DEFAULT_ENDPOINT = "http://huggingface.co"


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


class Broken(Exception):
    """The download of one file stopped before its end."""


def fail_offline(repo):
    print("huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the files on the "
          "Hub and we cannot find the appropriate snapshot folder for the specified revision on the local disk. "
          f"Please check your internet connection and try again. ({repo})", file=sys.stderr)
    return 1


def get_json(url, headers):
    resp, conn = k.http_open(url, headers=headers)
    try:
        body = resp.read()
    finally:
        conn.close()
    return resp, body


def download(url, headers, dest, size):
    """Bring ``dest`` (``ETAG.incomplete``) to ``size`` bytes, resuming from what it has; Broken when cut short."""
    have = os.path.getsize(dest) if os.path.exists(dest) else 0
    if have > size:
        os.unlink(dest)
        have = 0
    if have == size:
        return
    hdrs = dict(headers)
    if have:
        hdrs["Range"] = f"bytes={have}-"
    try:
        resp, conn = k.http_open(url, headers=hdrs)
    except OSError as exc:
        raise Broken(f"Error while downloading from {url}: {exc}") from None
    try:
        if resp.status == 416:
            os.unlink(dest)
            raise Broken(f"Error while downloading from {url}: 416 Range Not Satisfiable")
        if resp.status not in (200, 206):
            raise Broken(f"{resp.status} Client Error: {resp.reason} for url: {url}")
        if resp.status == 200:
            have = 0
        with open(dest, "ab" if have else "wb") as fh:
            got = k.copy_body(resp, fh, size - have)
    finally:
        conn.close()
    if have + got < size:
        raise Broken(f"Error while downloading from {url}: ('Connection broken: IncompleteRead({have + got} bytes "
                     f"read, {size - have - got} more expected)', IncompleteRead({have + got} bytes read, "
                     f"{size - have - got} more expected))")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv):
    if not argv or argv[0] != "download" or len(argv) < 2:
        print("usage: hf download REPO_ID [--revision REV]", file=sys.stderr)
        return 2
    repo = argv[1]
    rev = "main"
    rest = argv[2:]
    for i, a in enumerate(rest):
        if a == "--revision" and i + 1 < len(rest):
            rev = rest[i + 1]
        elif a.startswith("--revision="):
            rev = a.split("=", 1)[1]
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        print(f"Cannot download {repo}: HF_HUB_OFFLINE=1 (offline mode is enabled).", file=sys.stderr)
        return 1
    headers = {}
    token_path = os.environ.get("HF_TOKEN_PATH")
    if token_path:
        try:
            with open(host_path(token_path)) as fh:
                token = fh.read().strip()
        except OSError:
            token = ""
        if not token:
            print(f"Token file {token_path} is missing or empty.", file=sys.stderr)
            return 1
        headers["Authorization"] = f"Bearer {token}"
    root = cache_root()
    if root is None:
        print("No cache volume mounted on /root/.cache: the download would be lost with the container.",
              file=sys.stderr)
        return 1
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    quoted = urllib.parse.quote(repo, safe="/")
    try:
        resp, body = get_json(f"{endpoint}/api/models/{quoted}/revision/{urllib.parse.quote(rev, safe='')}"
                              "?blobs=true", headers)
    except k.net_errors():
        return fail_offline(repo)
    if resp.status == 401:
        print(f"huggingface_hub.errors.GatedRepoError: 401 Client Error. Cannot access repository {repo}: "
              "invalid or missing token.", file=sys.stderr)
        return 1
    if resp.status == 404:
        code = resp.getheader("X-Error-Code") or ""
        what = "Revision Not Found" if code == "RevisionNotFound" else "Repository Not Found"
        print(f"huggingface_hub.errors.{code or 'RepositoryNotFound'}Error: 404 Client Error. {what} for url: "
              f"{endpoint}/api/models/{repo}/revision/{rev}.", file=sys.stderr)
        return 1
    if resp.status != 200:
        print(f"{resp.status} Server Error: {resp.reason} for url: {endpoint}/api/models/{repo}", file=sys.stderr)
        return 1
    info = json.loads(body)
    commit = info["sha"]
    siblings = sorted(info["siblings"], key=lambda s: s["rfilename"])
    base = os.path.join(root, "hub", "models--" + repo.replace("/", "--"))
    snap = os.path.join(base, "snapshots", commit)
    blobs = os.path.join(base, "blobs")
    locks = os.path.join(root, "hub", ".locks", "models--" + repo.replace("/", "--"))
    for d in (snap, blobs, os.path.join(base, "refs"), locks):
        os.makedirs(d, exist_ok=True)
    n = len(siblings)
    for i, s in enumerate(siblings, 1):
        name = s["rfilename"]
        lfs = s.get("lfs")
        etag = lfs["sha256"] if lfs else s["blobId"]
        size = int(lfs["size"] if lfs else s["size"])
        blob = os.path.join(blobs, etag)
        with open(os.path.join(locks, f"{etag}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (os.path.isfile(blob) and os.path.getsize(blob) == size):
                part = blob + ".incomplete"
                url = f"{endpoint}/{quoted}/resolve/{commit}/{urllib.parse.quote(name)}"
                try:
                    download(url, headers, part, size)
                except Broken as exc:
                    print(str(exc), file=sys.stderr)
                    return 1
                except OSError as exc:
                    print(f"OSError: [Errno {exc.errno}] {exc.strerror}: '{part}'", file=sys.stderr)
                    return 1
                if lfs and sha256_of(part) != etag:
                    os.unlink(part)
                    print(f"Consistency check failed: file {name} should have sha256 {etag} (it does not): the "
                          "download was removed, retry it.", file=sys.stderr)
                    return 1
                os.replace(part, blob)
        link = os.path.join(snap, name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        target = os.path.relpath(blob, os.path.dirname(link))
        if os.path.islink(link) and os.readlink(link) != target:
            os.unlink(link)
        if not os.path.islink(link):
            with contextlib.suppress(FileExistsError):
                os.symlink(target, link)
        print(f"Fetching {n} files: {i}/{n} {name}", flush=True)
    if rev != commit:
        with open(os.path.join(base, "refs", rev), "w") as f:
            f.write(commit)
    print(snap)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
