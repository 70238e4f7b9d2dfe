"""Simulated docker CLI + daemon for one node (state under /var/lib/k3sim/docker); ``/usr/bin/docker`` runs it.

Subset: pull, images, image inspect/ls/rm/save/load/tag, rmi, save, load, tag, inspect, run (foreground or -d),
stop, kill, rm, logs, ps, wait, info, version, buildx imagetools inspect (the registry's digest of a tag), manifest
inspect [-v]. A pull downloads each blob where the daemon keeps it while it downloads (:func:`download_file`). ``run``
starts the simulated vLLM engine as a real process and supervises it: its stdout/stderr are the container's log, its
exit status is ``docker run``'s, SIGTERM/SIGINT are forwarded, ``docker stop`` sends SIGTERM then SIGKILL after the
timeout.
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shlex
import signal
import sys
import time

import gotemplate
import k3simlib as k

# hashlib, secrets, shutil, subprocess, threading, urllib.parse and typing are imported where used: a docker call
# that only reads or stops costs mostly its start-up
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

LIB = os.path.dirname(os.path.realpath(__file__))

CLIENT_VERSION = "28.2.2"
BUILD = "e6534b4"
RUN_VALUE_OPTS = {
    "--name", "-e", "--env", "--env-file", "-v", "--volume", "--network", "--net", "--ipc", "--gpus", "--device",
    "--shm-size", "--ulimit", "--cap-add", "--cap-drop", "--security-opt", "--group-add", "-p", "--publish",
    "--entrypoint", "--runtime", "--restart", "-w", "--workdir", "-u", "--user", "-l", "--label", "--log-driver",
    "--log-opt", "--pull", "--mount", "-h", "--hostname", "--add-host", "--cpus", "-m", "--memory", "--pid",
    "--uts", "--stop-signal", "--stop-timeout", "--platform", "--cidfile", "--tmpfs", "--cpuset-cpus",
    "--memory-swap", "--sysctl", "--device-cgroup-rule", "--label-file", "--expose", "--dns",
}
RUN_BOOL_OPTS = {"--rm", "-d", "--detach", "--privileged", "-i", "--interactive", "-t", "--tty", "--init",
                 "--read-only", "-P", "--publish-all", "--sig-proxy", "--no-healthcheck", "-q", "--quiet"}


def err(msg: str, code: int = 1) -> NoReturn:
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.exit(code)


def strerror(exc: OSError) -> str:
    """The error text as Go prints it (lower case), e.g. ``no space left on device``."""
    return (exc.strerror or str(exc)).lower()


# ----------------------------------------------------------------------------- state

def root():
    cfg = load_cfg()
    base = os.environ.get("K3SIM_STATE_DIR")
    if base:
        return os.path.join(base, "docker")
    return cfg.get("docker_data_dir") or "/var/lib/k3sim/docker"


_CFG = None


def load_cfg():
    global _CFG
    if _CFG is None:
        _CFG = k.load_config()
    return _CFG


def ensure_dirs():
    r = root()
    os.makedirs(os.path.join(r, "containers"), exist_ok=True)
    os.makedirs(os.path.join(r, "image"), exist_ok=True)
    return r


class Lock:
    def __enter__(self):
        self.fh = open(os.path.join(ensure_dirs(), ".lock"), "w")
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def write_json(path, obj):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(tmp, path)


#: the node's answer cache (/usr/lib/k3sim/cached): the simulated tools' answers, replayed while still true
ANSWERS = "/run/k3sim/cache"


def images_path():
    """The image store's index (images.json)."""
    return os.path.join(root(), "images.json")


def write_images(db):
    """Write the image store's index (under the store's Lock) and answer again what the answer cache holds of it."""
    path = images_path()
    write_json(path, db)
    refresh_answers(path)


def refresh_answers(index):
    """The image store changed: answer again, in this process, each ``docker image inspect`` and ``image ls`` the
    node's answer cache holds, so that the next reads replay them instead of starting this program again. A docker
    CLI answers those in milliseconds on a real node; here the Python start-up of N simulated nodes sharing two
    cores would set the pace of the deploy's first read after every pull or load. Called under the store's Lock,
    so no other change of the store comes between the index and its answers."""
    if os.environ.get("K3SIM_NODE_CONFIG") or os.environ.get("K3SIM_STATE_DIR"):
        return   # a tool run beside the nodes: no answer cache
    try:
        keys = [n[:-3] for n in os.listdir(ANSWERS) if n.startswith("docker\nimage\n") and n.endswith(".rc")]
    except FileNotFoundError:
        return
    since = os.stat(index).st_mtime_ns
    for key in keys:
        out, errs, rc = _answer(_command_of(key)[1:])
        base, tmp = os.path.join(ANSWERS, key), f".{os.getpid()}.refresh"
        for suffix, data in ((".out", out), (".err", errs), (".rc", f"{rc}\n".encode())):
            with open(base + suffix + tmp, "wb") as fh:
                fh.write(data)
        # the cache replays an answer newer than the index (modification times move by the kernel's clock tick)
        while os.stat(base + ".rc" + tmp).st_mtime_ns <= since:
            time.sleep(0.001)
            os.utime(base + ".rc" + tmp)
        for suffix in (".out", ".err", ".rc"):
            os.replace(base + suffix + tmp, base + suffix)


def _command_of(key):
    """The command line of an answer cache's key: the tool, then each argument, one per line, with ``%`` written
    ``%p`` and ``/`` written ``%s`` (every ``%`` starts one of the two)."""
    return [part.replace("%s", "/").replace("%p", "%") for part in key.split("\n")]


def _answer(argv):
    """stdout, stderr and exit status of ``docker ARGV``, run in this process."""
    out, errs = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(errs):
        try:
            rc = main(list(argv)) or 0
        except SystemExit as exc:
            rc = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    return out.getvalue().encode(), errs.getvalue().encode(), rc


def read_json(path, default=None):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (FileNotFoundError, ValueError):
        return default


def now_iso():
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z"


def iso_to_epoch(s):
    try:
        return time.mktime(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    except (ValueError, TypeError):
        return time.time()


def ago(epoch):
    d = max(0, int(time.time() - epoch))
    for unit, sec in (("week", 604800), ("day", 86400), ("hour", 3600), ("minute", 60)):
        if d >= sec:
            n = d // sec
            if n > 1:
                return f"{n} {unit}s ago"
            return f"About a{'n' if unit == 'hour' else ''} {unit} ago"
    if d == 0:
        return "Less than a second ago"
    return f"{d} seconds ago" if d != 1 else "1 second ago"


def human_size(n):
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.3g}{unit}"
    return f"{n}B"


# ----------------------------------------------------------------------------- registry & images

def parse_ref(ref):
    """-> (repo, tag or None, digest or None)"""
    r = ref
    for pre in ("docker.io/library/", "docker.io/", "index.docker.io/"):
        if r.startswith(pre):
            r = r[len(pre):]
    digest = None
    if "@" in r:
        r, digest = r.split("@", 1)
    tag = None
    last = r.rsplit("/", 1)[-1]
    if ":" in last:
        r, tag = r.rsplit(":", 1)
    if tag is None and digest is None:
        tag = "latest"
    return r, tag, digest


def display(repo, tag, digest):
    return repo + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def images_db():
    ensure_dirs()
    return read_json(images_path(), {})


def find_image(ref):
    """A local image by reference, id or id prefix; None if absent."""
    db = images_db()
    if ref.startswith("sha256:") or (len(ref) >= 4 and all(c in "0123456789abcdef" for c in ref)):
        want = ref if ref.startswith("sha256:") else "sha256:" + ref
        for img in db.values():
            if img["Id"].startswith(want):
                return img
    repo, tag, digest = parse_ref(ref)
    for img in db.values():
        if img["_repo"] != repo:
            continue
        if digest and img["_digest"] == digest and (tag is None or tag in img["_tags"]):
            return img
        if not digest and tag in img["_tags"]:
            return img
    return None


HUB = "registry-1.docker.io"
DAEMON_JSON = "/etc/docker/daemon.json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
#: attempts per layer when a transfer breaks (dockerd retries a layer five times, resuming it)
LAYER_ATTEMPTS = 6


def blob_dir():
    d = os.path.join(root(), "blobs", "sha256")
    os.makedirs(d, exist_ok=True)
    return d


def blob_path(digest):
    return os.path.join(blob_dir(), digest.split(":", 1)[1])


def digest_of(raw):
    """The content digest of ``raw`` bytes, ``sha256:<hex>``."""
    import hashlib

    return "sha256:" + hashlib.sha256(raw).hexdigest()


def sha256_file(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def classic_store():
    """The node's /etc/docker/daemon.json turns the containerd image store off (``"features":
    {"containerd-snapshotter": false}``): then ``load`` keeps no RepoDigests (moby#22011) and ``save`` of an image
    chosen by digest names no image, as the classic (graphdriver) store does. By default the simulation keeps them,
    as the containerd store does."""
    features = (read_json(DAEMON_JSON, {}) or {}).get("features") or {}
    return features.get("containerd-snapshotter") is False


def registry_sources(repo):
    """[(base URL, repository name there)] in the order docker tries them: a repository of another registry
    (``quay.io/...``) from that registry; a Docker Hub one from the first ``registry-mirrors`` entry of
    /etc/docker/daemon.json when there is one, then from the hub itself."""
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return [(f"http://{first}", rest)]
    name = repo if "/" in repo else f"library/{repo}"
    daemon = read_json(DAEMON_JSON, {}) or {}
    mirrors = [str(m).rstrip("/") for m in daemon.get("registry-mirrors") or []]
    return [(m, name) for m in mirrors[:1]] + [(f"http://{HUB}", name)]


def _host_of(base):
    import urllib.parse

    u = urllib.parse.urlsplit(base)
    return u.hostname or "", u.port or 80


def _manifest(base, name, ref):
    """The registry's answer to a GET of ``ref``'s manifest: the response and its body (a network error raises)."""
    resp, conn = k.http_open(f"{base}/v2/{name}/manifests/{ref}", headers={"Accept": MANIFEST_TYPE})
    try:
        return resp, resp.read()
    finally:
        conn.close()


def fetch_manifest(repo, ref):
    """(base, name, manifest bytes, content digest) from the first source that has it; docker's error otherwise."""
    sources = registry_sources(repo)
    failure = None
    for i, (base, name) in enumerate(sources):
        last = i == len(sources) - 1
        try:
            resp, body = _manifest(base, name, ref)
        except k.net_errors() as exc:
            host, port = _host_of(base)
            failure = f'Get "{base}/v2/": {k.net_error(exc, host, port)}'
            continue
        if resp.status == 200:
            return base, name, body, resp.getheader("Docker-Content-Digest")
        if not last:  # a mirror that cannot serve it: the next source, as dockerd falls back
            continue
        if resp.status == 401:
            return None, None, None, "unauthorized"
        if resp.status == 404:
            return None, None, None, "unknown"
        failure = f"received unexpected HTTP status: {resp.status} {resp.reason}"
    err(f"Error response from daemon: {failure}")


#: the content store of the containerd dockerd starts itself (``<data-root>/containerd/daemon``, its root, as
#: moby's libcontainerd supervisor sets it), as containerd lays it out (``plugins/content/local/store.go``)
CONTENT = os.path.join("containerd", "daemon", "io.containerd.content.v1.content")


def download_file(digest):
    """Where the daemon writes a blob while it downloads it, by image store: the containerd store's ingest
    (``<content>/ingest/<sha256 of the ref>/data``, with its ``ref``: containerd's ``content/local`` store), the
    classic store's temp file (``os.CreateTemp("", "GetImageBlob")`` in moby's ``distribution/pull_v2.go``, in
    ``<data-root>/tmp``, the daemon's ``TMPDIR``)."""
    import hashlib

    if classic_store():
        d = os.path.join(root(), "tmp")
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, f"GetImageBlob{os.getpid()}{digest[7:15]}")
    ref = f"layer-{digest}"
    d = os.path.join(root(), CONTENT, "ingest", hashlib.sha256(ref.encode()).hexdigest())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "ref"), "w") as fh:
        fh.write(ref)
    return os.path.join(d, "data")


def committed(digest, tmp, layer=True):
    """The daemon's mark that a blob is whole, by image store: the containerd store's blob
    (``<content>/blobs/sha256/<hex>``: here a hard link to the simulation's copy), the classic store's layer
    registered by its digest (``image/overlay2/distribution/diffid-by-digest/sha256/<hex>``: moby's
    ``distribution/metadata`` v2 service, written once the layer is registered; the simulated layers are
    uncompressed, so the diff id is the digest). The ingest's directory goes."""
    hexd = digest.split(":", 1)[1]
    if classic_store():
        if not layer:   # the image's config: not a layer
            return
        d = os.path.join(root(), "image", "overlay2", "distribution", "diffid-by-digest", "sha256")
        os.makedirs(d, exist_ok=True)
        write_atomic_text(os.path.join(d, hexd), digest)
        return
    d = os.path.join(root(), CONTENT, "blobs", "sha256")
    os.makedirs(d, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.link(blob_path(digest), os.path.join(d, hexd))
    import shutil

    shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)


def write_atomic_text(path, text):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def fetch_blob(base, name, desc, out, quiet, layer=True):
    """Download one blob into the data root (resumed with Range when the transfer breaks), verify its sha256;
    while it downloads it is where the daemon keeps it (:func:`download_file`), then marked whole
    (:func:`committed`)."""
    digest, size = desc["digest"], int(desc["size"])
    short = digest.split(":", 1)[1][:12]
    final = blob_path(digest)
    tmp = None
    scale = float(load_cfg().get("time_scale", 0.01))
    try:
        tmp = download_file(digest)
        for attempt in range(1, LAYER_ATTEMPTS + 1):
            have = os.path.getsize(tmp) if os.path.exists(tmp) else 0
            try:
                resp, conn = k.http_open(f"{base}/v2/{name}/blobs/{digest}",
                                         headers={"Range": f"bytes={have}-"} if have else None)
            except k.net_errors() as exc:
                host, port = _host_of(base)
                problem = k.net_error(exc, host, port)
            else:
                try:
                    if resp.status not in (200, 206):
                        err(f"Error response from daemon: error pulling blob {digest}: received unexpected HTTP "
                            f"status: {resp.status} {resp.reason}")
                    if resp.status == 200:
                        have = 0
                    with open(tmp, "ab" if have else "wb") as fh:
                        got = k.copy_body(resp, fh, size - have)
                finally:
                    conn.close()
                if have + got == size:
                    break
                problem = "unexpected EOF"
            if attempt == LAYER_ATTEMPTS:
                err(f"Error response from daemon: error pulling blob {digest}: {problem}")
            if not quiet:
                out.write(f"{short}: Retrying in {5 * attempt} seconds\n")
                out.flush()
            time.sleep(max(0.05, 5 * attempt * scale))
        if "sha256:" + sha256_file(tmp) != digest:
            os.unlink(tmp)
            err(f"filesystem layer verification failed for digest {digest}")
        os.replace(tmp, final)
        committed(digest, tmp, layer)
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        err(f"failed to register layer: write {final}: {strerror(exc)}")


def image_record(repo, digest, manifest_raw, config_raw):
    """The local image (images.json entry) of a manifest and its config, as a pull or a load registers it."""

    man = json.loads(manifest_raw)
    cfg = json.loads(config_raw)
    ann = man.get("annotations") or {}
    layers = [x["digest"] for x in man["layers"]]
    c = cfg.get("config") or {}
    return {"Id": ann.get("io.k3sim.image-id") or man["config"]["digest"], "RepoTags": [],
            "RepoDigests": [f"{repo}@{digest}"], "Created": cfg.get("created", ""),
            "Size": int(ann.get("io.k3sim.image-size") or sum(int(x["size"]) for x in man["layers"])),
            "Architecture": cfg.get("architecture", "amd64"), "Os": cfg.get("os", "linux"),
            "Config": {"Env": c.get("Env") or [], "Entrypoint": c.get("Entrypoint") or None,
                       "Cmd": c.get("Cmd") or None, "Labels": c.get("Labels") or {}},
            "RootFS": {"Type": "layers", "Layers": layers},
            "_repo": repo, "_tags": [], "_digest": digest, "_platform": ann.get("io.k3sim.platform", ""),
            "_requires_cuda": ann.get("io.k3sim.requires-cuda") or None,
            "_manifest": digest_of(manifest_raw), "_config": man["config"]["digest"],
            "_layers": layers}


def _add_tag(img, tag, db=None, repo=None):
    """Tag ``img`` as ``repo:tag`` (its own repository by default). A tag names one image: the image that had it
    loses it (``db``: the other images), and keeps its RepoDigests, as with dockerd."""
    repo = repo or img["_repo"]
    name = f"{repo}:{tag}"
    if not tag or name in img["RepoTags"]:
        return False
    for other in (db or {}).values():
        if other["Id"] != img["Id"] and name in other["RepoTags"]:
            other["RepoTags"].remove(name)
            if other["_repo"] == repo and tag in other["_tags"]:
                other["_tags"].remove(tag)
    if repo == img["_repo"]:
        img["_tags"].append(tag)
    img["RepoTags"].append(name)
    return True


def _register(img, tag):
    """Add ``img`` (or a tag of it) to images.json; True when something changed."""
    with Lock():
        db = images_db()
        have = db.get(img["Id"])
        if have is not None:
            img = have
        changed = _add_tag(img, tag, db) or have is None
        db[img["Id"]] = img
        write_images(db)
    return changed


def pull(ref, quiet=False, out=sys.stdout):
    """docker pull: the manifest, then the config and every layer the data root lacks, over HTTP from the registry
    (or the daemon's registry mirror), each verified against its digest."""

    repo, tag, digest = parse_ref(ref)
    base, name, manifest_raw, got = fetch_manifest(repo, digest or tag)
    if manifest_raw is None:
        if got == "unauthorized":
            if repo.startswith("quay.io/"):
                err("Error response from daemon: unauthorized: access to the requested resource is not authorized")
            err(f"Error response from daemon: pull access denied for {repo}, repository does not exist or may "
                "require 'docker login': denied: requested access to the resource is denied")
        err(f"Error response from daemon: manifest for {display(repo, tag, digest)} not found: manifest unknown: "
            "manifest unknown")
    man = json.loads(manifest_raw)
    content = got or (man.get("annotations") or {}).get("io.k3sim.content-digest") or \
        digest_of(manifest_raw)
    if digest and tag:  # repo:tag@digest: the tag must name that digest
        _, _, _, by_tag = fetch_manifest(repo, tag)
        if by_tag != digest:
            err(f"Error response from daemon: manifest for {display(repo, tag, digest)} not found: manifest "
                "unknown: manifest unknown")
    if not quiet:
        out.write(f"{tag or digest}: Pulling from {repo}\n")
        out.flush()
    config_desc = man["config"]
    layers = man["layers"]
    missing = [d for d in layers if not os.path.exists(blob_path(d["digest"]))]
    fresh = find_image_id((man.get("annotations") or {}).get("io.k3sim.image-id") or config_desc["digest"]) is None
    if not quiet:
        for d in layers:
            out.write(f"{d['digest'][7:19]}: {'Pulling fs layer' if d in missing else 'Already exists'}\n")
        out.flush()
    if not os.path.exists(blob_path(config_desc["digest"])):
        fetch_blob(base, name, config_desc, out, quiet, layer=False)
    for d in missing:
        fetch_blob(base, name, d, out, quiet)
        if not quiet:
            short = d["digest"][7:19]
            out.write(f"{short}: Verifying Checksum\n{short}: Download complete\n{short}: Pull complete\n")
            out.flush()
    mpath = blob_path(digest_of(manifest_raw))
    try:
        if not os.path.exists(mpath):
            with open(f"{mpath}.{os.getpid()}.tmp", "wb") as fh:
                fh.write(manifest_raw)
            os.replace(f"{mpath}.{os.getpid()}.tmp", mpath)
        with open(blob_path(config_desc["digest"]), "rb") as fh:
            config_raw = fh.read()
    except OSError as exc:
        err(f"failed to register layer: write {mpath}: {strerror(exc)}")
    img = image_record(repo, content, manifest_raw, config_raw)
    updated = _register(img, tag)
    shown = display(repo, tag if not digest else None, digest)
    full = f"docker.io/{shown}" if "." not in repo.split("/")[0] else shown
    if quiet:
        out.write(full + "\n")
        return img
    out.write(f"Digest: {content}\n")
    out.write(f"Status: {'Downloaded newer image' if fresh or missing or updated else 'Image is up to date'} "
              f"for {shown}\n")
    out.write(full + "\n")
    return img


def find_image_id(image_id):
    return images_db().get(image_id)


def public_image(img):
    return {k_: v for k_, v in img.items() if not k_.startswith("_")}


# ----------------------------------------------------------------------------- containers

def cdir(cid):
    return os.path.join(root(), "containers", cid)


def all_containers():
    base = os.path.join(ensure_dirs(), "containers")
    out = []
    for cid in sorted(os.listdir(base)):
        meta = read_json(os.path.join(base, cid, "config.json"))
        if meta and _gone(meta):
            remove(meta)
        elif meta:
            out.append(refresh(meta))
    out.sort(key=lambda m: m["Created"], reverse=True)
    return out


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def refresh(meta):
    st = meta["State"]
    if st["Running"] and not pid_alive(st["Pid"]):
        st.update(Running=False, Status="exited", ExitCode=st.get("ExitCode") or 137, Pid=0,
                  FinishedAt=st.get("FinishedAt") or now_iso())
    return meta


def _gone(meta):
    """A ``--rm`` container whose process has exited and whose supervisor could not remove it (killed with it, as
    a Slurm step's SIGKILL kills both): real dockerd removes an AutoRemove container when it exits, whatever became
    of the client, so it is gone here too."""
    st = meta["State"]
    return meta["HostConfig"].get("AutoRemove") and st["Running"] and not pid_alive(st["Pid"]) and \
        not pid_alive(meta.get("_supervisor") or 0)


def find_container(ident):
    for m in all_containers():
        if ident in (m["Id"], m["Name"].lstrip("/")) or (len(ident) >= 3 and m["Id"].startswith(ident)):
            return m
    return None


def save(meta):
    path = cdir(meta["Id"])
    if os.path.isdir(path):
        write_json(os.path.join(path, "config.json"), meta)


def remove(meta):
    path = cdir(meta["Id"])
    for name in ("config.json", "json.log"):
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass


# ----------------------------------------------------------------------------- run

def parse_run(argv):
    opts: dict[str, Any] = {"env": [], "env_files": [], "volumes": [], "devices": [], "ports": [], "ulimits": [],
                            "caps": [], "security": [], "groups": [], "bools": set()}
    vals: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-") or a == "-":
            break
        if a == "--":
            i += 1
            break
        name, eq, val = a.partition("=")
        if name in RUN_BOOL_OPTS:
            if eq and val.lower() in ("false", "0"):
                opts["bools"].discard(name)
            else:
                opts["bools"].add(name)
            i += 1
            continue
        if name.startswith("-") and not name.startswith("--") and len(name) > 2 and not eq:
            letters = name[1:]
            if all(f"-{c}" in RUN_BOOL_OPTS for c in letters):
                opts["bools"].update(f"-{c}" for c in letters)
                i += 1
                continue
        if name not in RUN_VALUE_OPTS:
            err(f"unknown flag: {name}\nSee 'docker run --help'.", 125)
        if not eq:
            if i + 1 >= len(argv):
                err(f"flag needs an argument: {name}\nSee 'docker run --help'.", 125)
            val = argv[i + 1]
            i += 2
        else:
            i += 1
        key = {"-e": "env", "--env": "env", "--env-file": "env_files", "-v": "volumes", "--volume": "volumes",
               "--device": "devices", "-p": "ports", "--publish": "ports", "--ulimit": "ulimits",
               "--cap-add": "caps", "--security-opt": "security", "--group-add": "groups"}.get(name)
        if key:
            opts[key].append(val)
        else:
            vals[{"--net": "--network", "-h": "--hostname", "-w": "--workdir", "-u": "--user",
                  "-m": "--memory", "-l": "--label"}.get(name, name)] = val
    if i >= len(argv):
        err("\"docker run\" requires at least 1 argument.\nSee 'docker run --help'.\n\nUsage:  docker run [OPTIONS] "
            "IMAGE [COMMAND] [ARG...]\n\nCreate and run a new container from an image", 125)
    opts["vals"] = vals
    return opts, argv[i], argv[i + 1:]


def build_env(opts, img):
    env = {}
    for item in img["Config"].get("Env") or []:
        key, _, val = item.partition("=")
        env[key] = val
    for path in opts["env_files"]:
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()
        except OSError as exc:
            err(f"docker: open {path}: {strerror(exc)}\n\nRun 'docker run --help' for more information", 125)
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, eq, val = line.partition("=")
            if not eq:
                if key in os.environ:
                    env[key] = os.environ[key]
                continue
            env[key] = val
    for item in opts["env"]:
        key, eq, val = item.partition("=")
        if eq:
            env[key] = val
        elif key in os.environ:
            env[key] = os.environ[key]
    return env


def visible_gpus(cfg, opts, env, img):
    """How many accelerators the container sees, and a docker error if the runtime refuses."""
    vendor = cfg["vendor"]
    count = cfg["gpu"]["count"]
    gpus = opts["vals"].get("--gpus")
    runtime = opts["vals"].get("--runtime")
    privileged = "--privileged" in opts["bools"]
    devices = [d.split(":")[0] for d in opts["devices"]]
    if gpus is not None or runtime == "nvidia" or any(d.startswith("nvidia.com/gpu") for d in devices):
        if vendor != "nvidia":
            if gpus is not None:
                err('docker: Error response from daemon: could not select device driver "" with capabilities: '
                    '[[gpu]].\n\nRun \'docker run --help\' for more information', 125)
            if runtime == "nvidia":
                err('docker: Error response from daemon: unknown or invalid runtime name: nvidia.\n\nRun '
                    '\'docker run --help\' for more information', 125)
        need = img.get("_requires_cuda")
        have = cfg["driver"].get("cuda_version", "0")
        if need and _ver(have) < _ver(need):
            err("docker: Error response from daemon: failed to create task for container: failed to create shim "
                "task: OCI runtime create failed: runc create failed: unable to start container process: error "
                "during container init: error running prestart hook #0: exit status 1, stdout: , stderr: "
                "Auto-detected mode as 'legacy'\nnvidia-container-cli: requirement error: unsatisfied condition: "
                f"cuda>={need}, please update your driver to a newer version, or use an earlier cuda container: "
                "unknown.\n\nRun 'docker run --help' for more information", 125)
        if gpus is None:
            sel = env.get("NVIDIA_VISIBLE_DEVICES", "all" if runtime != "nvidia" else "")
        else:
            sel = gpus.strip("'\"")
        if sel.startswith("count="):
            return min(count, int(sel[6:]) if sel[6:].isdigit() else count)
        if sel.startswith("device="):
            return min(count, len(sel[7:].split(",")))
        if sel in ("all", ""):
            return count if sel == "all" else 0
        if sel.isdigit():
            return min(count, int(sel))
        return min(count, len(sel.split(",")))
    if vendor == "amd" and (privileged or "/dev/kfd" in devices):
        return count
    if vendor == "ascend":
        if privileged:
            return count
        return min(count, len([d for d in devices if d.startswith("/dev/davinci") and d[12:].isdigit()]))
    return 0


def _ver(v):
    try:
        return tuple(int(x) for x in v.split("."))
    except ValueError:
        return (0,)


def engine_command(img, entrypoint, args, env):
    """Translate the container's entrypoint + args into the process the node runs."""
    engine = os.path.join(LIB, "engine.py")
    ep = shlex.split(entrypoint) if entrypoint is not None else (img["Config"].get("Entrypoint") or [])
    if entrypoint == "":
        ep = []
    cmd = ep + (args if args or entrypoint is not None else (img["Config"].get("Cmd") or []))
    if not cmd:
        return None
    return _translate(cmd, env, engine)


def _translate(cmd, env, engine):
    prog = os.path.basename(cmd[0])
    if prog in ("hf", "huggingface-cli"):
        # the images' Hugging Face CLI: a simulated download into the bind-mounted cache
        return [sys.executable, os.path.join(LIB, "hfsim.py")] + cmd[1:]
    if prog == "vllm":
        if cmd[1:2] == ["serve"]:
            return [sys.executable, engine, "serve"] + cmd[2:]
        return [sys.executable, engine] + cmd[1:]
    if prog.startswith("python") and cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        rest = cmd[3:]
        return [sys.executable, engine, "serve"] + rest
    if prog.startswith("python") and cmd[1:2] == ["-c"] and "vllm.benchmarks" in (cmd[2] if len(cmd) > 2 else ""):
        # vLLM's own benchmark client (k3deploy bench): the real one, from the engine venv (vllmsim_bench.py)
        return [sys.executable, os.path.join(LIB, "vllmsim_bench.py")] + cmd[2:]
    if prog.startswith("python") and cmd[1:2] == ["-c"] and "init_process_group" in (cmd[2] if len(cmd) > 2 else ""):
        # a torch.distributed script (k3deploy's NCCL probe): a simulated NCCL all-reduce between two nodes
        return [sys.executable, os.path.join(LIB, "ncclprobe.py")]
    if prog in ("bash", "sh", "dash"):
        script = None
        for i, a in enumerate(cmd[1:], 1):
            if a.startswith("-") and "c" in a[1:]:
                script = cmd[i + 1] if i + 1 < len(cmd) else ""
                break
        if script is None:
            return ["true"]  # an interactive shell without a TTY exits at once
        return _from_script(script, env, engine)
    return cmd


def _from_script(script, env, engine):
    lex = shlex.shlex(script.replace("\n", ";"), posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    words = list(lex)
    cmds: list[list[str]] = []
    cur: list[str] = []
    for w in words:
        if w and set(w) <= set(";&|"):
            if cur:
                cmds.append(cur)
            cur = []
        else:
            cur.append(w)
    if cur:
        cmds.append(cur)
    for c in cmds:
        while c and c[0] in ("exec", "nohup", "time"):
            c = c[1:]
        while c and "=" in c[0] and not c[0].startswith("-") and c[0].split("=")[0].isidentifier():
            key, _, val = c[0].partition("=")
            env[key] = val
            c = c[1:]
        if not c:
            continue
        if c[0] == "export":
            for item in c[1:]:
                key, eq, val = item.partition("=")
                if eq:
                    env[key] = val
            continue
        if os.path.basename(c[0]) == "vllm" or (os.path.basename(c[0]).startswith("python") and
                                                "vllm.entrypoints.openai.api_server" in c):
            return _translate(c, env, engine)
    return ["true"]


class Supervisor:
    """Runs the container process, tees its output to the json log (and to our stdio when attached)."""

    def __init__(self, meta, cmd, env, attached):
        import threading

        self.meta = meta
        self.cmd = cmd
        self.env = env
        self.attached = attached
        self.lock = threading.Lock()
        self.log = open(os.path.join(cdir(meta["Id"]), "json.log"), "a")

    def _pump(self, src, stream, out):
        for raw in iter(src.readline, b""):
            line = raw.decode(errors="replace")
            with self.lock:
                self.log.write(json.dumps({"log": line, "stream": stream, "time": now_iso()}) + "\n")
                self.log.flush()
            if out is not None:
                try:
                    out.write(line)
                    out.flush()
                except (OSError, ValueError):
                    pass

    def run(self):
        import subprocess
        import threading

        try:
            proc = subprocess.Popen(self.cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd="/", start_new_session=True)
        except OSError as exc:
            self.meta["State"].update(Running=False, Status="exited", ExitCode=127, Error=str(exc))
            save(self.meta)
            err(f"docker: Error response from daemon: failed to create task for container: exec: \"{self.cmd[0]}\": "
                "executable file not found in $PATH: unknown.", 127)
        st = self.meta["State"]
        st.update(Running=True, Status="running", Pid=proc.pid, StartedAt=now_iso())
        self.meta["_supervisor"] = os.getpid()  # not docker's: kept out of inspect
        save(self.meta)

        def forward(signum, frame):
            try:
                proc.send_signal(signum)
            except OSError:
                pass

        if self.attached:
            # real `docker run` without -t proxies signals (--sig-proxy, default true): the CLI catches every signal
            # it can and sends it to the container (ForwardAllSignals skips SIGCHLD, SIGPIPE and SIGURG), so a
            # `systemctl stop` or a Slurm cancel (SIGCONT, SIGTERM to the step) reaches the engine through the
            # client. SIGKILL cannot be proxied: real docker's container (a child of containerd-shim) outlives a
            # killed client, where this one, the client's child, is killed with it by whatever kills the client's
            # process tree (a unit's cgroup, Slurm's proctrack)
            skip = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGPIPE, signal.SIGURG, signal.SIGSEGV,
                    signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGTRAP, signal.SIGSYS}
            sigs = [s_ for s_ in signal.valid_signals() if s_ not in skip]
        else:
            sigs = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT]
        for sig in sigs:
            try:
                signal.signal(sig, forward)
            except (OSError, ValueError):
                pass
        pumps = [threading.Thread(target=self._pump, args=(proc.stdout, "stdout",
                                                            sys.stdout if self.attached else None)),
                 threading.Thread(target=self._pump, args=(proc.stderr, "stderr",
                                                            sys.stderr if self.attached else None))]
        for t in pumps:
            t.start()
        rc = proc.wait()
        for t in pumps:
            t.join()
        code = rc if rc >= 0 else 128 - rc
        with Lock():
            meta = read_json(os.path.join(cdir(self.meta["Id"]), "config.json")) or self.meta
            meta["State"].update(Running=False, Status="exited", ExitCode=code, Pid=0, FinishedAt=now_iso())
            if meta["HostConfig"]["AutoRemove"]:
                remove(meta)
            else:
                save(meta)
        return code


def cmd_run(argv):
    import secrets
    import shutil
    import subprocess

    cfg = load_cfg()
    opts, ref, args = parse_run(argv)
    img = find_image(ref)
    if img is None:
        if opts["vals"].get("--pull") == "never":
            err(f"docker: Error response from daemon: No such image: {ref}", 125)
        sys.stderr.write(f"Unable to find image '{ref}' locally\n")
        try:
            img = pull(ref, out=sys.stderr)
        except SystemExit:
            sys.exit(125)
    env = build_env(opts, img)
    gpus = visible_gpus(cfg, opts, env, img)
    name = opts["vals"].get("--name")
    cid = secrets.token_hex(32)
    # fault docker-slow-create: a busy dockerd takes this long to create the container (a stop meanwhile finds none)
    time.sleep(float(cfg.get("engine", {}).get("create_delay_seconds", 0)))
    with Lock():
        if name:
            for m in all_containers():
                if m["Name"] == "/" + name:
                    err(f"docker: Error response from daemon: Conflict. The container name \"/{name}\" is already "
                        f"in use by container \"{m['Id']}\". You have to remove (or rename) that container to be "
                        "able to reuse that name.\n\nRun 'docker run --help' for more information", 125)
        else:
            name = "sim_" + cid[:8]
        meta = {
            "Id": cid, "Name": "/" + name, "Created": now_iso(), "Image": img["Id"],
            "Path": None, "Args": args,
            "State": {"Status": "created", "Running": False, "Paused": False, "Restarting": False,
                      "OOMKilled": False, "Dead": False, "Pid": 0, "ExitCode": 0, "Error": "",
                      "StartedAt": "0001-01-01T00:00:00Z", "FinishedAt": "0001-01-01T00:00:00Z"},
            "HostConfig": {"AutoRemove": "--rm" in opts["bools"], "Privileged": "--privileged" in opts["bools"],
                           "NetworkMode": opts["vals"].get("--network", "bridge"),
                           "IpcMode": opts["vals"].get("--ipc", "private"),
                           "ShmSize": opts["vals"].get("--shm-size", "64m"), "Binds": opts["volumes"],
                           "Devices": opts["devices"], "CapAdd": opts["caps"], "SecurityOpt": opts["security"],
                           "GroupAdd": opts["groups"], "Ulimits": opts["ulimits"], "PortBindings": opts["ports"],
                           "Runtime": opts["vals"].get("--runtime", "runc"),
                           "DeviceRequests": [{"Count": -1, "Capabilities": [["gpu"]]}]
                           if opts["vals"].get("--gpus") else None},
            "Config": {"Image": ref, "Env": [f"{k_}={v}" for k_, v in env.items()],
                       "Entrypoint": shlex.split(opts["vals"]["--entrypoint"]) if "--entrypoint" in opts["vals"]
                       else img["Config"].get("Entrypoint"), "Cmd": args or img["Config"].get("Cmd"),
                       "Hostname": opts["vals"].get("--hostname", cfg.get("name", ""))},
            "Mounts": [{"Type": "bind", "Source": v.split(":")[0], "Destination": v.split(":")[1]
                        if ":" in v else v} for v in opts["volumes"]],
        }
        os.makedirs(cdir(cid), exist_ok=True)
        save(meta)
    cmd = engine_command(img, opts["vals"].get("--entrypoint"), list(args), env)
    if cmd is None:
        err("docker: Error response from daemon: no command specified.\n\nRun 'docker run --help' for more "
            "information", 125)
    meta["Path"] = cmd[0]
    proc_env = dict(env)
    for key in ("K3SIM_NODE_CONFIG", "K3SIM_STATE_DIR", "K3SIM_OUTSIDE"):
        if key in os.environ:
            proc_env[key] = os.environ[key]
    proc_env.update(K3SIM_IMAGE_PLATFORM=img.get("_platform", ""), K3SIM_GPUS_VISIBLE=str(gpus),
                    K3SIM_CONTAINER=name, HOSTNAME=meta["Config"]["Hostname"],
                    K3SIM_VOLUMES=json.dumps(opts["volumes"]))
    if "--detach" in opts["bools"] or "-d" in opts["bools"]:
        spec = os.path.join(cdir(cid), "run.json")
        write_json(spec, {"cmd": cmd, "env": proc_env})
        sup = [sys.executable, os.path.realpath(sys.argv[0]), "__supervise", cid]  # the docker program
        if os.path.isdir("/run/systemd/system") and shutil.which("systemd-run"):
            # like dockerd, keep the container out of the caller's cgroup (it outlives a unit's docker client)
            keep = [f"--setenv={key}={os.environ[key]}"
                    for key in ("K3SIM_NODE_CONFIG", "K3SIM_STATE_DIR", "K3SIM_OUTSIDE") if key in os.environ]
            sup = ["systemd-run", "--quiet", "--collect", f"--unit=docker-{cid[:12]}", *keep, *sup]
        subprocess.Popen(sup, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env=dict(os.environ))
        for _ in range(100):  # report the id once the process runs, as dockerd does
            m = read_json(os.path.join(cdir(cid), "config.json"))
            if m is None or m["State"]["Status"] != "created":
                break
            time.sleep(0.02)
        print(cid)
        return 0
    return Supervisor(meta, cmd, proc_env, attached=True).run()


def cmd_supervise(argv):
    cid = argv[0]
    spec = read_json(os.path.join(cdir(cid), "run.json"))
    meta = read_json(os.path.join(cdir(cid), "config.json"))
    os.unlink(os.path.join(cdir(cid), "run.json"))
    return Supervisor(meta, spec["cmd"], spec["env"], attached=False).run()


# ----------------------------------------------------------------------------- other commands

def fmt_or_json(objs, fmt):
    if fmt:
        for o in objs:
            try:
                print(gotemplate.render(fmt, o))
            except gotemplate.TemplateError as exc:
                err(f"template parsing error: template: :1: {exc}")
    else:
        print(json.dumps(objs, indent=4))


def take_opt(argv, names, has_value=True):
    """Remove an option from argv; return its value (or True) or None."""
    for i, a in enumerate(argv):
        for n in names:
            if a == n:
                if has_value:
                    if i + 1 >= len(argv):
                        err(f"flag needs an argument: {n}")
                    val = argv[i + 1]
                    del argv[i:i + 2]
                    return val
                del argv[i]
                return True
            if has_value and a.startswith(n + "=") and n.startswith("--"):
                del argv[i]
                return a.split("=", 1)[1]
    return None


def take_all(argv, names):
    vals: list[str] = []
    while True:
        v = take_opt(argv, names)
        if v is None:
            return vals
        vals.append(v)


def cmd_image_inspect(argv):
    fmt = take_opt(argv, ["--format", "-f"])
    if not argv:
        err("\"docker image inspect\" requires at least 1 argument.")
    found, rc = [], 0
    for ref in argv:
        img = find_image(ref)
        if img is None:
            sys.stderr.write(f"Error response from daemon: No such image: {display(*parse_ref(ref))}\n")
            rc = 1
        else:
            found.append(public_image(img))
    if fmt:
        fmt_or_json(found, fmt)
    else:
        print(json.dumps(found, indent=4))
    return rc


def cmd_images(argv):
    quiet = take_opt(argv, ["-q", "--quiet"], False)
    fmt = take_opt(argv, ["--format"])
    digests = take_opt(argv, ["--digests"], False)
    take_opt(argv, ["-a", "--all"], False)
    filt = [a for a in argv if not a.startswith("-")]
    rows = []
    for img in sorted(images_db().values(), key=lambda i: i["Created"], reverse=True):
        for tag in img["_tags"] or ["<none>"]:
            row = {"Repository": img["_repo"], "Tag": tag, "ID": img["Id"][7:19], "Digest": img["_digest"] or "<none>",
                   "CreatedSince": ago(iso_to_epoch(img["Created"])), "CreatedAt": img["Created"],
                   "Size": human_size(img["Size"])}
            if filt and not any(parse_ref(f)[0] == img["_repo"] and (":" not in f or parse_ref(f)[1] == tag)
                                for f in filt):
                continue
            rows.append(row)
    if quiet:
        for r in rows:
            print(r["ID"])
        return 0
    if fmt:
        if fmt.startswith("table"):
            fmt = fmt[5:].strip()
        fmt_or_json(rows, fmt)
        return 0
    cols = ["REPOSITORY", "TAG"] + (["DIGEST"] if digests else []) + ["IMAGE ID", "CREATED", "SIZE"]
    keys = ["Repository", "Tag"] + (["Digest"] if digests else []) + ["ID", "CreatedSince", "Size"]
    table(cols, [[r[k_] for k_ in keys] for r in rows])
    return 0


def table(cols, rows):
    widths = [max([len(c)] + [len(str(r[i])) for r in rows]) for i, c in enumerate(cols)]
    for r in [cols] + rows:
        print("   ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def cmd_rmi(argv):
    force = take_opt(argv, ["-f", "--force"], False)
    rc = 0
    with Lock():
        db = images_db()
        for ref in argv:
            img = find_image(ref)
            if img is None:
                sys.stderr.write(f"Error response from daemon: No such image: {ref}\n")
                rc = 1
                continue
            users = [m for m in all_containers() if m["Image"] == img["Id"]]
            if users and not force:
                sys.stderr.write(f"Error response from daemon: conflict: unable to remove repository reference "
                                 f"\"{ref}\" (must force) - container {users[0]['Id'][:12]} is using its referenced "
                                 f"image {img['Id'][7:19]}\n")
                rc = 1
                continue
            for t in img["RepoTags"]:
                print(f"Untagged: {t}")
            for d in img["RepoDigests"]:
                print(f"Untagged: {d}")
            db.pop(img["Id"], None)
            print(f"Deleted: {img['Id']}")
            still = {d for other in db.values() for d in _image_blobs(other)}
            for d in _image_blobs(img):
                if d in still:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(blob_path(d))
                if d in img.get("_layers", []):
                    print(f"Deleted: {d}")
        write_images(db)
    return rc


def container_view(m):
    st = m["State"]
    if st["Running"]:
        status = "Up " + ago(iso_to_epoch(st["StartedAt"])).replace(" ago", "")
    elif st["Status"] == "created":
        status = "Created"
    else:
        status = f"Exited ({st['ExitCode']}) {ago(iso_to_epoch(st['FinishedAt']))}"
    command = " ".join((m["Config"].get("Entrypoint") or []) + (m["Config"].get("Cmd") or []))
    return {"ID": m["Id"][:12], "Names": m["Name"].lstrip("/"), "Image": m["Config"]["Image"],
            "Command": json.dumps(command[:20] + "…" if len(command) > 20 else command, ensure_ascii=False),
            "CreatedAt": m["Created"], "RunningFor": ago(iso_to_epoch(m["Created"])), "Status": status,
            "State": st["Status"], "Ports": "", "Mounts": ",".join(x["Source"] for x in m["Mounts"]),
            "Labels": "", "Networks": m["HostConfig"]["NetworkMode"], "Size": "0B", "_id": m["Id"]}


def cmd_ps(argv):
    show_all = take_opt(argv, ["-a", "--all"], False)
    quiet = take_opt(argv, ["-q", "--quiet"], False)
    no_trunc = take_opt(argv, ["--no-trunc"], False)
    fmt = take_opt(argv, ["--format"])
    filters = take_all(argv, ["-f", "--filter"])
    rows = []
    for m in all_containers():
        v = container_view(m)
        if not show_all and not m["State"]["Running"]:
            continue
        ok = True
        for f in filters:
            key, _, val = f.partition("=")
            if key == "name" and val.lstrip("^/").rstrip("$") not in v["Names"]:
                ok = False
            elif key == "status" and v["State"] != val:
                ok = False
            elif key == "id" and not m["Id"].startswith(val):
                ok = False
            elif key == "ancestor" and parse_ref(val)[0] != parse_ref(v["Image"])[0]:
                ok = False
        if ok:
            if no_trunc:
                v["ID"] = m["Id"]
            rows.append(v)
    if quiet:
        for r in rows:
            print(r["ID"])
        return 0
    if fmt:
        if fmt.startswith("table"):
            fmt = fmt[5:].strip()
        for r in rows:
            print(gotemplate.render(fmt, {k_: val for k_, val in r.items() if not k_.startswith("_")}))
        return 0
    table(["CONTAINER ID", "IMAGE", "COMMAND", "CREATED", "STATUS", "PORTS", "NAMES"],
          [[r["ID"], r["Image"], r["Command"], r["RunningFor"], r["Status"], r["Ports"], r["Names"]] for r in rows])
    return 0


def cmd_inspect(argv):
    fmt = take_opt(argv, ["--format", "-f"])
    kind = take_opt(argv, ["--type"])
    if not argv:
        err("\"docker inspect\" requires at least 1 argument.")
    found, rc = [], 0
    for ident in argv:
        m = find_container(ident) if kind != "image" else None
        if m is not None:
            found.append({k_: v for k_, v in m.items() if not k_.startswith("_")})
            continue
        img = find_image(ident) if kind != "container" else None
        if img is not None:
            found.append(public_image(img))
            continue
        sys.stderr.write(f"Error: No such object: {ident}\n")
        rc = 1
    fmt_or_json(found, fmt) if fmt else print(json.dumps(found, indent=4))
    return rc


def wait_exit(m, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if not pid_alive(m["State"]["Pid"]):
            return True
        time.sleep(0.02)
    return not pid_alive(m["State"]["Pid"])


def settle(m, code):
    """Record an exit when no supervisor is left to do it."""
    time.sleep(0.05)
    with Lock():
        cur = read_json(os.path.join(cdir(m["Id"]), "config.json"))
        if cur is None:
            return
        if cur["State"]["Running"]:
            cur["State"].update(Running=False, Status="exited", ExitCode=code, Pid=0, FinishedAt=now_iso())
            if cur["HostConfig"]["AutoRemove"]:
                remove(cur)
            else:
                save(cur)


def cmd_stop(argv):
    t = take_opt(argv, ["-t", "--time", "--timeout"])
    take_opt(argv, ["-s", "--signal"])
    timeout = float(t) if t is not None else 10.0
    rc = 0
    for ident in argv:
        m = find_container(ident)
        if m is None:
            sys.stderr.write(f"Error response from daemon: No such container: {ident}\n")
            rc = 1
            continue
        if m["State"]["Running"]:
            pid = m["State"]["Pid"]
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
            if not wait_exit(m, timeout):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                wait_exit(m, 5)
                settle(m, 137)
            else:
                settle(m, 143)
            # let an attached supervisor finish its bookkeeping
            for _ in range(50):
                cur = read_json(os.path.join(cdir(m["Id"]), "config.json"))
                if cur is None or not cur["State"]["Running"]:
                    break
                time.sleep(0.02)
        print(ident)
    return rc


def cmd_kill(argv):
    sig = take_opt(argv, ["-s", "--signal"]) or "KILL"
    signum = getattr(signal, "SIG" + sig.upper().removeprefix("SIG"), None) if not sig.isdigit() else int(sig)
    rc = 0
    for ident in argv:
        m = find_container(ident)
        if m is None:
            sys.stderr.write(f"Error response from daemon: No such container: {ident}\n")
            rc = 1
            continue
        if not m["State"]["Running"]:
            sys.stderr.write(f"Error response from daemon: cannot kill container: {ident}: container "
                             f"{m['Id']} is not running\n")
            rc = 1
            continue
        if signum is None:
            sys.stderr.write(f"Error response from daemon: Invalid signal: {sig}\n")
            rc = 1
            continue
        os.kill(m["State"]["Pid"], signum)
        print(ident)
    return rc


def cmd_rm(argv):
    force = take_opt(argv, ["-f", "--force"], False)
    take_opt(argv, ["-v", "--volumes"], False)
    rc = 0
    for ident in argv:
        m = find_container(ident)
        if m is None:
            if not force:
                sys.stderr.write(f"Error response from daemon: No such container: {ident}\n")
                rc = 1
            continue
        if m["State"]["Running"]:
            if not force:
                sys.stderr.write(f"Error response from daemon: cannot remove container \"{m['Name']}\": container "
                                 "is running: stop the container before removing or force remove\n")
                rc = 1
                continue
            try:
                os.kill(m["State"]["Pid"], signal.SIGKILL)
            except OSError:
                pass
            wait_exit(m, 5)
        with Lock():
            remove(m)
        print(ident)
    return rc


def cmd_logs(argv):
    tail = take_opt(argv, ["-n", "--tail"])
    follow = take_opt(argv, ["-f", "--follow"], False)
    stamps = take_opt(argv, ["-t", "--timestamps"], False)
    if len(argv) != 1:
        err("\"docker logs\" requires exactly 1 argument.")
    m = find_container(argv[0])
    if m is None:
        err(f"Error response from daemon: No such container: {argv[0]}")
    path = os.path.join(cdir(m["Id"]), "json.log")
    try:
        fh = open(path)
    except FileNotFoundError:
        return 0
    lines = fh.readlines()
    if tail not in (None, "all"):
        n = int(tail)
        lines = lines[-n:] if n > 0 else []

    def emit(raw):
        try:
            rec = json.loads(raw)
        except ValueError:
            return
        out = sys.stdout if rec["stream"] == "stdout" else sys.stderr
        out.write((rec["time"] + " " if stamps else "") + rec["log"])
        out.flush()

    for raw in lines:
        emit(raw)
    if follow:
        while True:
            raw = fh.readline()
            if raw:
                emit(raw)
                continue
            cur = read_json(os.path.join(cdir(m["Id"]), "config.json"))
            if cur is None or not refresh(cur)["State"]["Running"]:
                for raw in fh.readlines():
                    emit(raw)
                return 0
            time.sleep(0.05)
    return 0


def cmd_wait(argv):
    rc = 0
    for ident in argv:
        m = find_container(ident)
        if m is None:
            sys.stderr.write(f"Error response from daemon: No such container: {ident}\n")
            rc = 1
            continue
        while True:
            cur = read_json(os.path.join(cdir(m["Id"]), "config.json"))
            if cur is None:
                print(m["State"]["ExitCode"])
                break
            cur = refresh(cur)
            if not cur["State"]["Running"] and cur["State"]["Status"] != "created":
                print(cur["State"]["ExitCode"])
                break
            time.sleep(0.05)
    return rc


def runtimes():
    rts = {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"}}
    cfg = load_cfg()
    daemon = read_json("/etc/docker/daemon.json", {}) or {}
    rts.update(daemon.get("runtimes", {}))
    if cfg["vendor"] == "nvidia":
        rts.setdefault("nvidia", {"path": "nvidia-container-runtime"})
    return rts


def cmd_info(argv):
    fmt = take_opt(argv, ["--format", "-f"])
    cfg = load_cfg()
    conts = all_containers()
    info = {"ID": cfg.get("cluster_uuid", ""), "Containers": len(conts),
            "ContainersRunning": sum(1 for c in conts if c["State"]["Running"]),
            "ContainersStopped": sum(1 for c in conts if not c["State"]["Running"]),
            "Images": len(images_db()), "Driver": "overlay2", "DockerRootDir": root(),
            "Architecture": os.uname().machine,
            "ServerVersion": CLIENT_VERSION, "Runtimes": runtimes(), "DefaultRuntime": "runc",
            "Name": cfg.get("name", ""), "OperatingSystem": "Debian GNU/Linux 12 (bookworm)",
            "KernelVersion": k.kernel_release(), "NCPU": os.cpu_count(), "CgroupVersion": "1"}
    if fmt:
        fmt_or_json([info], fmt)
        return 0
    print(f"Client: Docker Engine - Community\n Version:    {CLIENT_VERSION}\n\n"
          f"Server:\n Containers: {info['Containers']}\n"
          f"  Running: {info['ContainersRunning']}\n  Stopped: {info['ContainersStopped']}\n Images: {info['Images']}\n"
          f" Server Version: {CLIENT_VERSION}\n Storage Driver: overlay2\n"
          f" Runtimes: {' '.join(sorted(info['Runtimes']))}\n"
          f" Default Runtime: runc\n Kernel Version: {info['KernelVersion']}\n"
          f" Operating System: {info['OperatingSystem']}\n"
          f" Name: {info['Name']}\n Docker Root Dir: {info['DockerRootDir']}")
    return 0


def cmd_version(argv):
    fmt = take_opt(argv, ["--format", "-f"])
    data = {"Client": {"Version": CLIENT_VERSION, "ApiVersion": "1.50", "GitCommit": BUILD},
            "Server": {"Version": CLIENT_VERSION, "ApiVersion": "1.50", "GitCommit": BUILD}}
    if fmt:
        fmt_or_json([data], fmt)
    else:
        print(f"Client: Docker Engine - Community\n Version:           {CLIENT_VERSION}\n API version:       1.50\n\n"
              f"Server: Docker Engine - Community\n Engine:\n  Version:          {CLIENT_VERSION}\n"
              f"  API version:      1.50 (minimum version 1.24)")
    return 0


def cmd_tag(argv):
    """docker tag SOURCE TARGET: TARGET (a tag of the source's repository) names the source image from now on."""
    if len(argv) != 2:
        err("\"docker tag\" requires exactly 2 arguments.\nSee 'docker tag --help'.")
    src, target = argv
    repo, tag, digest = parse_ref(target)
    if digest or not tag:
        err(f"Error parsing reference: \"{target}\" is not a valid repository/tag: invalid reference format")
    with Lock():
        img = find_image(src)
        if img is None:
            err(f"Error response from daemon: No such image: {display(*parse_ref(src))}")
        db = images_db()
        img = db[img["Id"]]
        _add_tag(img, tag, db, repo)
        write_images(db)
    return 0


def cmd_manifest(argv):
    """docker manifest inspect [-v] NAME: the registry's manifest of NAME, asked directly (as the CLI does: not
    through the daemon's mirrors). ``-v`` prints the CLI's ``ImageManifest`` (docker/cli
    ``cli/manifest/types/types.go``: ``Ref``, ``Descriptor`` with the platform, ``Raw``, the manifest itself under
    ``OCIManifest``); the simulated registry serves single-platform OCI manifests, so it is one object, not a list."""
    import base64

    if argv[:1] != ["inspect"]:
        err(f"docker manifest: unknown command: docker manifest {' '.join(argv[:1])}")
    rest = argv[1:]
    verbose = take_opt(rest, ["-v", "--verbose"], False)
    take_opt(rest, ["--insecure"], False)
    if len(rest) != 1:
        err("\"docker manifest inspect\" requires exactly 1 argument.")
    repo, tag, digest = parse_ref(rest[0])
    base, name = registry_sources(repo)[-1]
    url = f"{base}/v2/{name}/manifests/{digest or tag}"
    try:
        resp, raw = _manifest(base, name, digest or tag)
    except k.net_errors() as exc:
        host, port = _host_of(base)
        err(f'Get "{url}": {k.net_error(exc, host, port)}')
    if resp.status != 200:
        err(f"no such manifest: {_normalized(display(repo, tag, digest))}")
    if not verbose:
        sys.stdout.write(json.dumps(json.loads(raw), indent=3) + "\n")
        return 0
    man = json.loads(raw)
    platform = (man.get("annotations") or {}).get("io.k3sim.platform") or "linux/amd64"
    os_, _, arch = platform.partition("/")
    doc = {"Ref": _normalized(display(repo, tag, digest)),
           "Descriptor": {"mediaType": MANIFEST_TYPE, "digest": resp.getheader("Docker-Content-Digest") or
                          digest_of(raw), "size": len(raw), "platform": {"architecture": arch, "os": os_}},
           "Raw": base64.b64encode(raw).decode(), "OCIManifest": man}
    sys.stdout.write(json.dumps(doc, indent=8) + "\n")
    return 0


def cmd_buildx(argv):
    """docker buildx imagetools inspect NAME: what the registry says of NAME (asked directly: the daemon's registry
    mirrors are not used, as with buildx), printed as buildx prints a single-platform image."""
    if argv[:2] != ["imagetools", "inspect"]:
        err(f"ERROR: unknown command: docker buildx {' '.join(argv[:2])}")
    rest = argv[2:]
    if take_opt(rest, ["--format"]) is not None or take_opt(rest, ["--raw"], False):
        err("ERROR: --format and --raw are not simulated")
    take_opt(rest, ["--builder"])
    if len(rest) != 1:
        err("ERROR: requires exactly 1 argument.")
    repo, tag, digest = parse_ref(rest[0])
    base, name = registry_sources(repo)[-1]
    shown = _normalized(display(repo, tag, digest))
    url = f"{base}/v2/{name}/manifests/{digest or tag}"
    try:
        resp, conn = k.http_open(url, headers={"Accept": MANIFEST_TYPE}, method="HEAD")
        try:
            resp.read()
        finally:
            conn.close()
    except k.net_errors() as exc:
        host, port = _host_of(base)
        err(f'ERROR: failed to do request: Head "{url}": {k.net_error(exc, host, port)}')
    if resp.status == 404:
        err(f"ERROR: {shown}: not found")
    if resp.status != 200:
        err(f"ERROR: unexpected status from HEAD request to {url}: {resp.status} {resp.reason}")
    print(f"Name:      {shown}")
    print(f"MediaType: {resp.getheader('Content-Type') or MANIFEST_TYPE}")
    print(f"Digest:    {resp.getheader('Docker-Content-Digest')}")
    return 0


# ----------------------------------------------------------------------------- save & load

def _image_blobs(img):
    return [d for d in [img.get("_manifest"), img.get("_config"), *img.get("_layers", [])] if d]


def _normalized(ref):
    """A reference as containerd names it (``docker.io/`` for Docker Hub repositories)."""
    return ref if "." in ref.split("/")[0] else f"docker.io/{ref}"


def cmd_save(argv):
    """docker save [-o FILE] IMAGE...: an OCI-layout tar as docker 25+ writes it (``blobs/sha256/...`` holding each
    image's manifest, config and layer bytes, ``index.json``, ``manifest.json``, ``oci-layout``, ``repositories``)."""
    output = take_opt(argv, ["-o", "--output"])
    if not argv:
        err("\"docker save\" requires at least 1 argument.\nSee 'docker save --help'.")
    import tarfile

    entries: list[dict] = []
    index: list[dict] = []
    blobs: dict[str, str] = {}
    repos: dict[str, dict[str, str]] = {}
    for ref in argv:
        img = find_image(ref)
        if img is None:
            err(f"Error response from daemon: reference does not exist: {ref}")
        for d in _image_blobs(img):
            if not os.path.exists(blob_path(d)):
                err(f"Error response from daemon: content digest {d}: not found")
            blobs[d] = blob_path(d)
        repo, tag, digest = parse_ref(ref)
        tags = [f"{repo}:{tag}"] if tag and f"{repo}:{tag}" in img["RepoTags"] else list(img["RepoTags"])
        if digest and not tag and classic_store():  # chosen by digest: the graphdriver store saves no name
            tags = []
        entries.append({"Config": f"blobs/sha256/{img['_config'][7:]}", "RepoTags": tags,
                        "Layers": [f"blobs/sha256/{d[7:]}" for d in img["_layers"]]})
        desc = {"mediaType": MANIFEST_TYPE, "digest": img["_manifest"],
                "size": os.path.getsize(blobs[img["_manifest"]])}
        for t in tags:
            index.append({**desc, "annotations": {"io.containerd.image.name": _normalized(t),
                                                  "org.opencontainers.image.ref.name": t.rsplit(":", 1)[1]}})
            repos.setdefault(img["_repo"], {})[t.rsplit(":", 1)[1]] = img["_config"][7:]
        if not tags and img["_digest"] and not classic_store():
            index.append({**desc, "annotations": {"io.containerd.image.name":
                                                  _normalized(f"{img['_repo']}@{img['_digest']}")}})
        elif not tags:
            index.append(dict(desc))
    if not output and sys.stdout.isatty():
        err("cowardly refusing to save to a terminal. Use the -o flag or redirect")
    try:
        fh = open(output, "wb") if output else sys.stdout.buffer
        with tarfile.open(fileobj=fh, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            def add(name, data=None, path=None):
                info = tarfile.TarInfo(name)
                info.mtime = 0
                if path is not None:
                    info.size = os.path.getsize(path)
                    with open(path, "rb") as src:
                        tar.addfile(info, src)
                else:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))

            for d, path in blobs.items():
                add(f"blobs/sha256/{d[7:]}", path=path)
            add("index.json", json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                                          "manifests": index}).encode())
            add("manifest.json", json.dumps(entries).encode())
            add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            add("repositories", json.dumps(repos).encode())
        if output:
            fh.close()
    except OSError as exc:
        err(f"Error response from daemon: write {output or '-'}: {strerror(exc)}")
    return 0


def cmd_load(argv):
    """docker load [-i FILE] [-q]: images from a docker save archive (read as a stream, from stdin without -i);
    every blob is verified against its sha256, then the image is registered with its Id, tags and RepoDigests."""
    import shutil

    source = take_opt(argv, ["-i", "--input"])
    quiet = take_opt(argv, ["-q", "--quiet"], False)
    import tarfile
    import tempfile

    try:
        fh = open(source, "rb") if source else sys.stdin.buffer
    except OSError as exc:
        err(f"Error response from daemon: open {source}: {strerror(exc)}")
    staging = tempfile.mkdtemp(prefix=".load-", dir=blob_dir())
    try:
        return _load(tarfile, fh, staging, quiet)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _load(tarfile, fh, staging, quiet):
    import hashlib

    small: dict[str, bytes] = {}
    got: dict[str, str] = {}
    try:
        with tarfile.open(fileobj=fh, mode="r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                name = member.name.removeprefix("./")
                src = tar.extractfile(member)
                if src is None:
                    continue
                if name.startswith("blobs/sha256/"):
                    hexd = name.rsplit("/", 1)[1]
                    dst = os.path.join(staging, hexd)
                    h = hashlib.sha256()
                    try:
                        with open(dst, "wb") as out:
                            while block := src.read(1 << 20):
                                h.update(block)
                                out.write(block)
                    except OSError as exc:
                        err(f"failed to register layer: write {dst}: {strerror(exc)}")
                    if h.hexdigest() != hexd:
                        err(f"Error response from daemon: invalid diffID for layer: {name}: checksum mismatch")
                    got[hexd] = dst
                elif name in ("manifest.json", "index.json", "repositories", "oci-layout"):
                    small[name] = src.read()
        entries = json.loads(small["manifest.json"])
        index = json.loads(small.get("index.json", b"{}"))
    except (OSError, KeyError, EOFError, tarfile.TarError, ValueError) as exc:
        err(f"Error response from daemon: unexpected EOF or bad archive: {exc}")

    def raw(digest):
        path = got.get(digest.split(":", 1)[-1])
        if path is None:
            err(f"Error response from daemon: bad archive: blob {digest} is missing")
        with open(path, "rb") as f:
            return f.read()

    by_config: dict[str, tuple[dict, bytes]] = {}
    for desc in index.get("manifests", []):
        mraw = raw(desc["digest"])
        by_config.setdefault(json.loads(mraw)["config"]["digest"], (desc, mraw))
    loaded: list[str] = []
    classic = classic_store()
    with Lock():
        db = images_db()
        for entry in entries:
            config_digest = "sha256:" + entry["Config"].rsplit("/", 1)[1]
            if config_digest not in by_config:
                err(f"Error response from daemon: bad archive: no manifest in index.json for {config_digest}")
            desc, mraw = by_config[config_digest]
            man = json.loads(mraw)
            ann = man.get("annotations") or {}
            tags = [parse_ref(t) for t in entry.get("RepoTags") or []]
            named = (desc.get("annotations") or {}).get("io.containerd.image.name", "")
            repo = tags[0][0] if tags else parse_ref(named)[0]
            content = ann.get("io.k3sim.content-digest") or digest_of(mraw)
            img = image_record(repo, content, mraw, raw(config_digest))
            if classic:  # the graphdriver store records no repo digest for a loaded image
                img["RepoDigests"], img["_digest"] = [], None
            for d in _image_blobs(img):
                hexd = d.split(":", 1)[1]
                if hexd not in got:
                    err(f"Error response from daemon: bad archive: blob {d} is missing")
                os.replace(got[hexd], blob_path(d))
                got[hexd] = blob_path(d)
            have = db.get(img["Id"])
            if have is not None:
                img = have
            for _, t, _ in tags:
                _add_tag(img, t, db)
            db[img["Id"]] = img
            loaded += entry.get("RepoTags") or [img["Id"]]
        write_images(db)
    if not quiet:
        for name in loaded:
            print(f"Loaded image ID: {name}" if name.startswith("sha256:") else f"Loaded image: {name}")
    return 0


def main(argv):
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("Usage:  docker [OPTIONS] COMMAND\n\nA self-sufficient runtime for containers (simulated)")
        return 0
    if argv[0] in ("-v", "--version"):
        print(f"Docker version {CLIENT_VERSION}, build {BUILD}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "__supervise":
        return cmd_supervise(rest)
    if cmd in ("image", "container"):
        if not rest:
            err(f"Usage:  docker {cmd} COMMAND")
        sub, rest = rest[0], rest[1:]
        table_ = {("image", "inspect"): cmd_image_inspect, ("image", "ls"): cmd_images,
                  ("image", "list"): cmd_images, ("image", "rm"): cmd_rmi, ("image", "save"): cmd_save,
                  ("image", "load"): cmd_load, ("image", "tag"): cmd_tag,
                  ("container", "ls"): cmd_ps, ("container", "list"): cmd_ps, ("container", "inspect"): cmd_inspect,
                  ("container", "run"): cmd_run, ("container", "stop"): cmd_stop, ("container", "rm"): cmd_rm,
                  ("container", "logs"): cmd_logs, ("container", "kill"): cmd_kill, ("container", "wait"): cmd_wait}
        if (cmd, sub) == ("image", "pull"):
            cmd = "pull"
        elif (cmd, sub) in table_:
            return table_[(cmd, sub)](rest)
        else:
            err(f"docker: '{cmd} {sub}' is not a docker command.\nSee 'docker --help'")
    if cmd == "pull":
        quiet = take_opt(rest, ["-q", "--quiet"], False)
        take_opt(rest, ["--platform"])
        if len(rest) != 1:
            err("\"docker pull\" requires exactly 1 argument.\nSee 'docker pull --help'.")
        pull(rest[0], quiet=bool(quiet))
        return 0
    handlers = {"images": cmd_images, "rmi": cmd_rmi, "inspect": cmd_inspect, "run": cmd_run, "stop": cmd_stop,
                "kill": cmd_kill, "rm": cmd_rm, "logs": cmd_logs, "ps": cmd_ps, "wait": cmd_wait, "info": cmd_info,
                "version": cmd_version, "save": cmd_save, "load": cmd_load, "tag": cmd_tag, "buildx": cmd_buildx,
                "manifest": cmd_manifest}
    if cmd not in handlers:
        err(f"docker: unknown command: docker {cmd}\n\nRun 'docker --help' for more information")
    return handlers[cmd](rest)

