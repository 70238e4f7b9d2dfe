"""Every shell command the rollout runs on a node, written once: the operations (:mod:`k3deploy.runtime`) run
these scripts and the runbook (:mod:`k3deploy.model.runbook`) prints the same scripts, so the two cannot drift.

Each function returns a POSIX ``sh`` script (the operations run it as ``sh -c SCRIPT``; the runbook's blocks
run under ``bash -e``), so every script is correct under both.

Example::

    >>> download_argv("docker", "/var/lib/k3deploy/cache", "vllm/vllm-openai:kimi-k3", "moonshotai/Kimi-K3")[-3:]
    ['vllm/vllm-openai:kimi-k3', 'download', 'moonshotai/Kimi-K3']
    >>> stop_units(["k3-engine.service"])
    'systemctl stop k3-engine.service'
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Sequence
from urllib.parse import quote

from k3deploy.model import compilecache
from k3deploy.model.bench import BENCH_FILE
from k3deploy.model.correctness import PROMPTS, request_body
from k3deploy.model.images import run_ref
from k3deploy.model.secrets import API_KEY_ENV
from k3deploy.model.slo import FAMILIES, FIGURES_FILE
from k3deploy.model.startup import (
    BEGIN,
    CLOCK,
    ENGINE_LINE,
    GATE,
    KEPT,
    LINE,
    READY,
    STAGE,
    STEP,
    STEP_BEGAN,
    ere,
)
from k3deploy.model.units import CONTAINER_CACHE, router_workers_text

#: what one poll of a unit (:func:`probe`) exits with
PROBE_READY, PROBE_FAILED, PROBE_STARTING = 0, 1, 2
#: what a client says when the endpoint refuses it (401/403): the key is the cause, and where it comes from
KEY_REFUSED = ("the endpoint refused the API key sent (VLLM_API_KEY of {env}, from k3_api_key_file): give the engines "
               "and the clients the same key (k3_api_key_file) and deploy again")
KEY_MISSING = ("the endpoint requires an API key and none was sent ({env} holds no VLLM_API_KEY): put the key in a "
               "0600 file named by k3_api_key_file and deploy again")


def _units(units: Sequence[str]) -> str:
    return " ".join(shlex.quote(u) for u in units)


def read_key(env_file: str) -> str:
    """Shell that sets ``k3_key`` to the API key the unit's env file holds (its ``VLLM_API_KEY`` line; empty when
    there is none, or no such file). The key stays in the shell: it never becomes an argument of a command.

    >>> read_key("/etc/k3deploy/k3-engine.env")
    "k3_key=$(sed -n 's/^VLLM_API_KEY=//p' /etc/k3deploy/k3-engine.env 2>/dev/null | tail -n 1)"
    """
    return f"k3_key=$(sed -n 's/^{API_KEY_ENV}=//p' {shlex.quote(env_file)} 2>/dev/null | tail -n 1)"


#: the start of a pipe that hands curl the ``Authorization`` header on its stdin (``curl -H @-``), when ``k3_key``
#: (:func:`read_key`) holds a key: printf is the shell's own, so the key is in no process's argv
BEARER = "{ [ -z \"$k3_key\" ] || printf 'Authorization: Bearer %s\\n' \"$k3_key\"; } | "


def _refused(url: str, env_file: str, code: str = "$code") -> str:
    """Shell that, for an HTTP ``code`` of 401 or 403, says the API key is the cause (sent and refused, or none
    sent) and exits :data:`PROBE_FAILED`."""
    refused = shlex.quote(f"GET {url} -> ") + code + shlex.quote(": " + KEY_REFUSED.format(env=env_file))
    missing = shlex.quote(f"GET {url} -> ") + code + shlex.quote(": " + KEY_MISSING.format(env=env_file))
    return (f"case \"{code}\" in 401|403) if [ -n \"$k3_key\" ]; then echo {refused}; else echo {missing}; fi; "
            f"exit {PROBE_FAILED};; esac")


# ---------------------------------------------------------------------------------------------- stage


def download_argv(docker: str, cache: str, image: str, model: str, token_file: str | None = None,
                  endpoint: str | None = None) -> list[str]:
    """Download the weights with the image's own Hugging Face CLI into ``cache`` (mounted as ``~/.cache``), from
    ``endpoint`` (a site mirror of the hub) when set.

    The token, if any, is read by the CLI from a 0600 file (``HF_TOKEN_PATH``): it never appears in argv.
    """
    args = [docker, "run", "--rm", "--network", "host", "-v", f"{cache}:/root/.cache"]
    if token_file:
        args += ["-v", f"{token_file}:/run/secrets/hf-token:ro", "-e", "HF_TOKEN_PATH=/run/secrets/hf-token"]
    if endpoint:
        args += ["-e", f"HF_ENDPOINT={endpoint}"]
    return args + ["--entrypoint", "hf", image, "download", model]


#: the hub the image's CLI downloads from where no endpoint is set (``huggingface_hub.constants.ENDPOINT``)
HUB = "https://huggingface.co"
#: the longest the hub's index may take to answer (no answer: the download shows no total)
HUB_INDEX_TIMEOUT = 15


def hub_index(endpoint: str | None, model: str, revision: str = "main", token_file: str | None = None) -> str:
    """Shell that prints the hub's index of ``model`` at ``revision`` with every file's size, as
    ``HfApi.model_info(repo, revision=..., files_metadata=True)`` asks for it (huggingface_hub 2.4.0
    ``hf_api.py``: ``GET {endpoint}/api/models/{repo}/revision/{rev}`` with ``blobs=true``), from ``endpoint``
    (the site's mirror, as the download uses it) or the hub. curl (every node has it: the probes use it) honours the
    node's own ``https_proxy``/``no_proxy``; the token, where there is one, is read from its 0600 file by the shell
    and handed to curl as a header on its stdin (``-H @-``, curl >= 7.55): it is in no argv. Prints nothing and
    fails where the hub does not answer 2xx (air-gapped, down, 401): the caller shows no total then.

        >>> print(hub_index(None, "o/m"))
        curl -fsS --max-time 15 'https://huggingface.co/api/models/o/m/revision/main?blobs=true'
        >>> print(hub_index("http://mirror:8080/", "o/m", token_file="/t").replace(" | ", " |\\n"))
        { [ -r /t ] && printf 'Authorization: Bearer %s\\n' "$(cat /t)"; } |
        curl -fsS --max-time 15 -H @- 'http://mirror:8080/api/models/o/m/revision/main?blobs=true'
    """
    url = f"{(endpoint or HUB).rstrip('/')}/api/models/{model}/revision/{quote(revision, safe='')}?blobs=true"
    curl = f"curl -fsS --max-time {HUB_INDEX_TIMEOUT} "
    if not token_file:
        return curl + shlex.quote(url)
    t = shlex.quote(token_file)
    return (f"{{ [ -r {t} ] && printf 'Authorization: Bearer %s\\n' \"$(cat {t})\"; }} | "
            f"{curl}-H @- {shlex.quote(url)}")


def image_index(docker: str, image: str) -> str:
    """Shell that prints the node's docker data root and architecture (``docker info``), then the registry's
    manifest of ``image`` with its layers' sizes, as the CLI reads it (``docker manifest inspect -v``: the CLI's
    ``ImageManifest``, docker/cli ``cli/manifest/types/types.go``; a list of them for a multi-platform image), with
    the credentials the CLI hands the daemon for the pull (its ``config.json``) and the node's proxy settings.

        >>> print(image_index("docker", "v/o:t"))
        docker info -f '{{.DockerRootDir}} {{.Architecture}}' && docker manifest inspect -v v/o:t
    """
    d = shlex.quote(docker)
    return f"{d} info -f '{{{{.DockerRootDir}}}} {{{{.Architecture}}}}' && {d} manifest inspect -v {shlex.quote(image)}"


#: the content stores a docker daemon's containerd image store keeps its blobs in: the system containerd's, and that
#: of the containerd dockerd starts itself (under the data root, ``$r``)
CONTENT_STORES = ("/var/lib/containerd/io.containerd.content.v1.content",
                  '"$r"/containerd/daemon/io.containerd.content.v1.content')


def pulled_bytes(root: str, layers: Sequence[tuple[str, int]]) -> str:
    """Shell that prints the bytes a ``docker pull`` of an image whose ``layers`` are ``(sha256 hex, size)`` holds
    so far on a node whose docker data root is ``root``, read from the daemon's own files, whichever its image store:
    each layer that is whole counts its size (the containerd store's blob ``<content>/blobs/sha256/<hex>``,
    containerd's ``plugins/content/local/store.go``; the classic store's layer registered by its digest,
    ``<root>/image/<driver>/distribution/diffid-by-digest/sha256/<hex>``, moby's ``distribution/metadata``), each
    download under way its bytes so far (containerd's ``<content>/ingest/*/data``; the classic store's temp files
    ``<root>/tmp/GetImageBlob*``, moby's ``distribution/pull_v2.go``, ``TMPDIR`` being ``<root>/tmp``). Read only.

        >>> s = pulled_bytes("/var/lib/docker", [("ab", 5), ("cd", 7)])
        >>> s.startswith("r=/var/lib/docker; { for x in ab:5 cd:7; do "), s.count("find "), s.count("-printf")
        (True, 2, 2)
    """
    marks = " ".join([f"{c}/blobs/sha256/$h" for c in CONTENT_STORES]
                     + ['"$r"/image/*/distribution/diffid-by-digest/sha256/$h'])
    words = " ".join(f"{h}:{n}" for h, n in layers)
    ingest = " ".join(f"{c}/ingest" for c in CONTENT_STORES)
    return (f"r={shlex.quote(root)}; {{ for x in {words}; do h=${{x%:*}}; for f in {marks}; do "
            '[ -e "$f" ] && { echo "${x#*:}"; break; }; done; done; '
            f"find {ingest} -name data -type f -printf '%s\\n' 2>/dev/null; "
            """find "$r"/tmp -maxdepth 1 -name 'GetImageBlob*' -type f -printf '%s\\n' 2>/dev/null; """
            """} | awk '{s += $1} END {printf "%d\\n", s}'""")


def require_weights(cache: str, model: str) -> str:
    """Verify the weights already in the cache and fail with the reason when they are not all there
    (``k3_download_weights: false``)."""
    why = (f"weights of {model} in {cache}/huggingface are missing or incomplete and k3_download_weights is false: "
           "stage them first")
    return f"{verify_weights(cache, model)} || {{ echo {shlex.quote(why)} >&2; exit 1; }}"


def digest_check(docker: str, image: str) -> str:
    """Shell that fails unless the local ``image`` carries the digest it pins (empty when it pins none). Every
    repo digest of the image counts (an image pulled by an index and by a platform manifest has two)."""
    if "@sha256:" not in image:
        return ""
    want = shlex.quote(image.split("@", 1)[1])
    return (f"got=$({shlex.quote(docker)} image inspect --format '{{{{join .RepoDigests \" \"}}}}' "
            f"{shlex.quote(image)}) && case \" $got \" in *@{want}\\ *) echo 'digest ok: '{want};; "
            f"*) echo \"image digest $got, required \"{want} >&2; exit 1;; esac")


def name_build(docker: str, image: str, tag: str | None = None) -> str:
    """Shell that gives a pinned ``image`` (present by its digest) the local tag the units run
    (:func:`k3deploy.model.images.run_ref`), and moves ``tag`` (the ``REPO:TAG`` it was resolved from) to it, so
    the tag on a node names the build it runs; empty for an image that pins no digest."""
    if "@sha256:" not in image:
        return ""
    d, run = shlex.quote(docker), shlex.quote(run_ref(image))
    out = f"{{ {d} image inspect {run} >/dev/null 2>&1 || {d} tag {shlex.quote(image)} {run}; }}"
    return out + (f" && {d} tag {run} {shlex.quote(tag)}" if tag else "")


def _then(*parts: str) -> str:
    return " && ".join(p for p in parts if p)


def pull(docker: str, image: str, tag: str | None = None) -> str:
    """Pull ``image`` when it is not present locally, then verify a pinned digest and name the build (see
    :func:`name_build`)."""
    d, i = shlex.quote(docker), shlex.quote(image)
    return _then(f"{{ {d} image inspect {i} >/dev/null 2>&1 || {d} pull -q {i}; }}", digest_check(docker, image),
                 name_build(docker, image, tag))


# ------------------------------------------------------------------------------------- stage at scale

#: the file that says a snapshot was verified (in the model's cache directory; files newer than it are checked again)
VERIFIED = ".k3-verified"
#: the files that failed the last verification, one path per line
BAD = ".k3-bad"
#: the chain's list of the model's blobs and their sizes (``<blob> <bytes>`` lines), handed on with the snapshot
#: (:func:`relay_weights`); peers may read it (its name is not one the peers' daemon hides)
SIZES = "k3-sizes"
#: the transient unit of the read-only rsync daemon that serves staged files to peers
PEERS_UNIT = "k3-stage-peers"
#: where ``k3-group-member stopped`` notes an engine unit's failed runs (its crash-loop backoff counts them)
FAILURES_DIR = "/run/k3deploy"
#: the daemon's socket options (rsyncd.conf(5) ``socket options``; the clients pass the same with ``--sockopts``)
PEERS_SOCKET_OPTIONS = "TCP_NODELAY"
#: rsync modules of that daemon
HUB_MODULE, STAGE_MODULE = "k3-hub", "k3-stage"
#: the daemon's module of the engines' compile caches (:mod:`k3deploy.model.compilecache`)
COMPILE_MODULE = compilecache.DIRNAME


def model_dir(cache: str, model: str) -> str:
    """The model's directory in the Hugging Face cache under ``cache`` (``blobs/``, ``snapshots/``, ``refs/``)."""
    return f"{hub_dir(cache)}/models--{model.replace('/', '--')}"


def hub_dir(cache: str) -> str:
    return f"{cache.rstrip('/')}/huggingface/hub"


def archive_path(stage_dir: str, image: str) -> str:
    """Where a node keeps ``image`` as a ``docker save`` archive while it hands it to peers."""
    return f"{stage_dir.rstrip('/')}/{re.sub(r'[^A-Za-z0-9_.-]', '_', image)}.tar"


#: how one file of a snapshot is checked against its blob's name (``$1``: its path in the snapshot), one line out:
#: ``K3_OK=<bytes>`` or ``K3_BAD=<kind> <what it hashes to, or -> <its blob> <its path>``. A blob named by 64 hex
#: digits (an LFS file: a shard) is its sha256; one named by 40 hex digits (a small file the hub keeps in git) is its
#: git blob id, the sha1 of ``blob <size>\0`` and the content (computed here: ``git`` need not be on the node). A file
#: whose blob is gone (``missing``) or is named by neither (``unnamed``: it cannot be checked) is bad too.
CHECK_FILE = (
    'f=${1#./}; b=$(readlink -f "$1"); e=${b##*/}; '
    'if [ ! -f "$b" ]; then echo "K3_BAD=missing - $b $f"; exit 0; fi; '
    'case $e in *[!0-9a-f]*) n=0;; *) n=${#e};; esac; s=$(($(wc -c < "$b"))); '
    'if [ "$n" = 64 ]; then k=sha256; h=$($K3_SHA256 < "$b"); '
    r'elif [ "$n" = 40 ]; then k=git-blob; h=$({ printf "blob %d\000" "$s"; cat "$b"; } | $K3_SHA1); '
    'else echo "K3_BAD=unnamed - $b $f"; exit 0; fi; '
    'if [ "${h%% *}" = "$e" ]; then echo "K3_OK=$s"; else echo "K3_BAD=$k ${h%% *} $b $f"; fi')
#: the hash commands, chosen once per check: ``openssl dgst`` where the node has it (it uses the CPU's SHA
#: instructions: several times faster than coreutils' ``sha256sum`` and ``sha1sum``, the fallback)
HASH_TOOLS = ('if openssl dgst -sha256 -r </dev/null >/dev/null 2>&1; then K3_SHA256="openssl dgst -sha256 -r"; '
              'K3_SHA1="openssl dgst -sha1 -r"; else K3_SHA256=sha256sum; K3_SHA1=sha1sum; fi; '
              'export K3_SHA256 K3_SHA1')
#: sums the lines of :data:`CHECK_FILE`: passes ``K3_BAD`` lines on and says each on stderr (what the file hashes to
#: against its blob's name), writes each bad blob's path to the file ``list`` (when set), then prints ``K3_FILES`` and
#: ``K3_BYTES``; exits 1 when a file is bad
TALLY = r"""awk -v list="$list" '/^K3_OK=/ {n++; bytes += substr($0, 7); next}
/^K3_BAD=/ {n++; bad++; print; split(substr($0, 8), w, " "); p = substr($0, 8 + length(w[1] w[2] w[3]) + 3)
  name = w[3]; sub(/.*\//, "", name)
  if (w[1] == "missing") why = "its blob " name " is missing"
  else if (w[1] == "unnamed") why = "not named by a hash (" name "): it cannot be verified"
  else why = w[1] " " w[2] ", but its blob is named " name
  print "bad file " p ": " why > "/dev/stderr"
  if (list != "") print w[3] > list}
END {printf "K3_FILES=%d\nK3_BYTES=%.0f\n", n, bytes; exit bad > 0}'"""


def check_snapshot(cache: str, model: str, bad_list: bool = False) -> str:
    """Hash every file of the model's snapshot again, whatever its time stamps, against its blob's name
    (:data:`CHECK_FILE`), in parallel, one file per CPU, and check that every shard the index names is there.

    Prints ``K3_MISSING=<shard>`` and ``K3_BAD=...`` per bad file (each also said on stderr), then ``K3_FILES``,
    ``K3_BYTES`` and ``K3_SECONDS``; exits 1 on any bad or missing file. With ``bad_list`` the bad blobs' paths go to
    the model directory's ``BAD`` file (a receive removes them and copies them again); without, it writes nothing.

        >>> "xargs -0 -r -P" in check_snapshot("/c", "org/m")
        True
    """
    d = shlex.quote(model_dir(cache, model))
    listed = f'"$d/{BAD}"' if bad_list else '""'
    return (f'( d={d}; list={listed}; rev=$(cat "$d/refs/main" 2>/dev/null) && cd "$d/snapshots/$rev" 2>/dev/null || '
            f'{{ echo "K3_MISSING=(no snapshot)"; echo {shlex.quote(f"no snapshot of {model} in {cache}")} >&2; '
            'exit 1; }; '
            f'{HASH_TOOLS}; t0=$(date +%s.%N); missing=0; [ -z "$list" ] || : > "$list"; '
            'if [ -f model.safetensors.index.json ]; then '
            "for f in $(grep -o '\"[^\"]*[.]safetensors\"' model.safetensors.index.json | tr -d '\"' | sort -u); do "
            '[ -e "$f" ] || [ -L "$f" ] || { echo "K3_MISSING=$f"; echo "missing shard $f" >&2; missing=1; }; done; '
            'elif ! ls ./*.safetensors >/dev/null 2>&1; then echo "K3_MISSING=(no shard and no index)"; '
            'echo "no shard and no index in $PWD" >&2; missing=1; fi; '
            'bad=0; find . ! -type d -print0 | xargs -0 -r -P "$(nproc)" -n 1 '
            f'sh -c {shlex.quote(CHECK_FILE)} _ | {TALLY} || bad=1; '
            'echo "K3_SECONDS=$(awk -v a="$t0" -v b="$(date +%s.%N)" \'BEGIN {printf "%.2f", b - a}\')"; '
            '[ "$bad" = 0 ] && [ "$missing" = 0 ] )')


def verify_weights(cache: str, model: str) -> str:
    """Verify the model's snapshot (:func:`check_snapshot`: every file against its blob's name, every shard of the
    index there) and mark it verified (``VERIFIED``). Bad files are listed in ``BAD`` and said on stderr; the script
    then fails."""
    d = shlex.quote(model_dir(cache, model))
    return (f'rm -f {d}/{VERIFIED} && {check_snapshot(cache, model, bad_list=True)} >{d}/.k3-check && '
            f'touch {d}/{VERIFIED} && echo "verified $(sed -n "s/^K3_FILES=//p" {d}/.k3-check) files"')


def verify_before_start(cache: str, model: str) -> str:
    """The check before an engine starts: :func:`check_snapshot`, whatever the time stamps say, with a summary line.
    A bad snapshot loses its ``VERIFIED`` mark (its bad blobs go to ``BAD``), so the next rollout copies it again
    from a peer; a good one is marked verified again."""
    d = shlex.quote(model_dir(cache, model))
    tally = ("sed -n 's/^K3_FILES=//p; s/^K3_BYTES=//p; s/^K3_SECONDS=//p' " + d + "/.k3-check | tr '\\n' ' '")
    bad = (f"weights of {model} in {cache}: bad files (above); this host's engines must not start on them: the next "
           "rollout copies them again from a peer (k3deploy verify INVENTORY checks every node)")
    return (f'if {check_snapshot(cache, model, bad_list=True)} >{d}/.k3-check; then touch {d}/{VERIFIED}; '
            f'set -- $({tally}); echo "every file of the snapshot verified: $1 files, $2 bytes in $3 s"; '
            f'else rm -f {d}/{VERIFIED}; echo {shlex.quote(bad)} >&2; exit 1; fi')


def readahead(cache: str, model: str) -> str:
    """Read every file of the model's snapshot once into the page cache, at the lowest CPU and best-effort I/O
    priority (``nice``, ``ionice -c 2 -n 7``), so the engine's weight load reads memory (a cold disk or shared
    filesystem is "the slow path").

        >>> readahead("/c", "o/m").split(" | ")[1]
        'nice -n 19 ionice -c 2 -n 7 xargs -0 -r cat > /dev/null'
    """
    d = shlex.quote(model_dir(cache, model))
    return (f'rev=$(cat {d}/refs/main) && find -L {d}/snapshots/"$rev" -type f -print0 | '
            "nice -n 19 ionice -c 2 -n 7 xargs -0 -r cat > /dev/null")


def fetch_weights(docker: str, cache: str, image: str, model: str, token_file: str | None = None,
                  endpoint: str | None = None) -> str:
    """Download the weights from the hub (the image's own CLI resumes a partial download) and verify them."""
    argv = download_argv(docker, cache, image, model, token_file, endpoint)
    return f"mkdir -p {shlex.quote(cache)} && {shlex.join(argv)} && {verify_weights(cache, model)}"


def fetch_weights_with(argv: Sequence[str], cache: str, model: str) -> str:
    """Download the weights with ``argv`` (the image's CLI run by the site's container runtime from its staged
    file, :meth:`k3deploy.model.jobcontainers.Runtime.download_argv`), then verify them, as :func:`fetch_weights`."""
    return f"mkdir -p {shlex.quote(cache)} && {shlex.join(argv)} && {verify_weights(cache, model)}"


def receive_file(address: str, port: int, stage_dir: str, path: str) -> str:
    """Copy the staged file ``path`` (under ``stage_dir``, a runtime's image file) and its checksum from the peer at
    ``address`` (resumable), check the file against that checksum, then move both into place; a file that does not
    match is removed and the step fails, naming it and the peer.

    >>> print(receive_file("10.0.0.1", 8730, "/s", "/s/images/i.sqsh").replace(" && ", " &&\\n"))
    mkdir -p /s/images &&
    rsync -a --partial rsync://10.0.0.1:8730/k3-stage/images/i.sqsh /s/images/i.sqsh.part &&
    rsync -a rsync://10.0.0.1:8730/k3-stage/images/i.sqsh.sha256 /s/images/i.sqsh.sha256.part &&
    { [ "$(sha256sum < /s/images/i.sqsh.part | cut -d" " -f1)" = "$(cat /s/images/i.sqsh.sha256.part)" ] || \
{ rm -f /s/images/i.sqsh.part /s/images/i.sqsh.sha256.part; echo 'k3deploy: /s/images/i.sqsh from 10.0.0.1: its \
sha256 is not the one its maker wrote: removed; run again' >&2; exit 1; }; } &&
    mv -f /s/images/i.sqsh.part /s/images/i.sqsh &&
    mv -f /s/images/i.sqsh.sha256.part /s/images/i.sqsh.sha256
    """
    rel = path[len(stage_dir.rstrip("/")) + 1:]
    src = _rsync_from(address, port, STAGE_MODULE, rel)
    q, part = shlex.quote(path), shlex.quote(path + ".part")
    total, total_part = shlex.quote(path + ".sha256"), shlex.quote(path + ".sha256.part")
    said = shlex.quote(f"k3deploy: {path} from {address}: its sha256 is not the one its maker wrote: removed; run "
                       "again")
    return (f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0] or '/')} && rsync -a --partial {shlex.quote(src)} {part} "
            f"&& rsync -a {shlex.quote(src + '.sha256')} {total_part} && "
            f"{{ [ \"$(sha256sum < {part} | cut -d\" \" -f1)\" = \"$(cat {total_part})\" ] || "
            f"{{ rm -f {part} {total_part}; echo {said} >&2; exit 1; }}; }} && mv -f {part} {q} && "
            f"mv -f {total_part} {total}")


def _rsync_from(address: str, port: int, module: str, path: str) -> str:
    return f"rsync://{address}:{port}/{module}/{path}"


def receive_weights(address: str, port: int, cache: str, model: str) -> str:
    """Copy the model's cache directory from the peer at ``address`` (resumable; files that already match are not
    sent again), then verify; files that fail are removed and copied once more."""
    d = model_dir(cache, model)
    src = _rsync_from(address, port, HUB_MODULE, d.rsplit("/", 1)[1] + "/")
    get = (f"rsync -a --partial --exclude '*.incomplete' --exclude '.k3-*' {shlex.quote(src)} "
           f"{shlex.quote(d + '/')}")
    qd = shlex.quote(d)
    return (f"mkdir -p {qd} && rm -f {qd}/{VERIFIED} && {get} && {{ {verify_weights(cache, model)} || "
            f"{{ xargs -r rm -f < {qd}/{BAD} && {get} && {verify_weights(cache, model)}; }}; }}")


def receive_caches(address: str, port: int, model_cache: str, key: str) -> str:
    """Copy one cache key's compile caches from the peer at ``address`` (resumable), then mark them whole here (the
    mark is never copied: a copy cut short is no holder).

        >>> print(receive_caches("10.0.0.1", 8873, "/c", "ab12").replace(" && ", chr(10)))
        mkdir -p /c/k3-compile/ab12
        rsync -a --partial rsync://10.0.0.1:8873/k3-compile/ab12/ /c/k3-compile/ab12/
        touch /c/k3-compile/ab12/.k3-complete
    """
    d = compilecache.host_dir(model_cache, key)
    qd = shlex.quote(d)
    src = _rsync_from(address, port, COMPILE_MODULE, f"{key}/")
    return (f"mkdir -p {qd} && rsync -a --partial {shlex.quote(src)} {shlex.quote(d + '/')} && "
            f"touch {shlex.quote(d + '/' + compilecache.COMPLETE)}")


def mark_caches(model_cache: str, keys: Sequence[str]) -> str:
    """Mark the compile caches of ``keys`` whole on this node (an engine served from them): from now on the node
    hands them to the nodes of its class that lack them.

        >>> mark_caches("/c", ["ab12"])
        'mkdir -p /c/k3-compile/ab12 && touch /c/k3-compile/ab12/.k3-complete'
    """
    return " && ".join(f"mkdir -p {shlex.quote(d)} && touch {shlex.quote(d + '/' + compilecache.COMPLETE)}"
                       for d in (compilecache.host_dir(model_cache, k) for k in keys))


def file_names(path: str) -> tuple[str, ...]:
    """The names a copy of the file ``path`` has in its directory until it is whole, and then (as ``find -name``
    patterns): the tree's and an import's ``.part``, the chain's ``.k3-part``, rsync's temporary ``.NAME.XXXXXX``.

        >>> file_names("/s/images/i.sqsh")
        ('i.sqsh', 'i.sqsh.part', 'i.sqsh.k3-part', '.i.sqsh.*')
    """
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return name, f"{name}.part", f"{name}.k3-part", f".{name}.*"


def copied_bytes(copies: Sequence[Sequence[str]]) -> str:
    """Shell that prints, one line per copy of ``copies`` (each its paths: a directory ending in ``/``, every
    regular file under it; else a file with the names it has until it is whole,
    :func:`file_names`), the bytes it holds so far: what the stage's progress reads while
    a step runs (read only; a path not there yet counts 0).

        >>> first, second = copied_bytes([["/c/blobs/"], ["/s/i.tar"]]).split("; { ")
        >>> first.startswith("{ find /c/blobs/ -type f"), "-name i.tar.k3-part" in second, second.count("awk")
        (True, True, 1)
    """
    lines = []
    for paths in copies:
        finds = []
        for path in paths:
            if path.endswith("/"):
                finds.append(f"find {shlex.quote(path)} -type f -printf '%s\\n' 2>/dev/null")
            else:
                parent = path.rsplit("/", 1)[0] or "/"
                names = " -o ".join(f"-name {shlex.quote(n)}" for n in file_names(path))
                finds.append(f"find {shlex.quote(parent)} -maxdepth 1 -type f \\( {names} \\) -printf '%s\\n' "
                             "2>/dev/null")
        lines.append("{ " + "; ".join(finds) + "; } | awk '{s += $1} END {printf \"%d\\n\", s}'")
    return "; ".join(lines)


#: the chain's copy of one file (``k3deploy.model.staging.chain``), as shell functions. ``k3_relay MODULE PATH DEST
#: [SIZE]`` copies ``PATH`` of the peers' rsync module ``MODULE`` to ``DEST.k3-part`` from the first peer of
#: ``$K3_PEERS`` (``name=address`` words, nearest first; ``$K3_PORT``) not in ``$K3_DEAD``: the whole file where that
#: peer holds it, else its growing ``PATH.k3-part`` (``rsync --append``: only the bytes beyond this node's copy; rsync
#: checks what it sends), again at once where that gave bytes (a pause between copies is a lag the node does not make
#: up: its link is no faster than its peer's), else after 0.3 s, until the peer holds it whole, or, with ``SIZE`` (the
#: file's size as its holder has it), until this node holds ``SIZE`` bytes: the file is this node's then, to verify on
#: its own (its name is its hash), while its peer may still be hashing its copy; so a hop adds a poll, not a hash, and
#: the peer's growing copy is asked first (one connection a poll). A wrong ``SIZE`` costs time, never a file: too small,
#: the copy fails its hash and is copied again without one; too large, the copy ends when the peer holds it whole. A
#: peer that does not answer within ``$K3_WAIT`` seconds, or during whose transfer this node's copy does not grow for
#: ``$K3_WAIT`` seconds (a cut link: rsync's own ``--timeout`` does not fire while the socket still takes its
#: keep-alives, so ``k3_pull`` watches the file and kills the transfer's process group: rsync's own cleanup would block
#: on the dead socket), or that answers but whose copy does not grow for ``$K3_STALL`` seconds (its own copy failed),
#: joins ``K3_DEAD`` (said on stderr) and the next one is asked. It sets ``K3_FROM`` to the peer that gave it whole;
#: returns 1 when no peer could. ``k3_sum FILE NAME`` is true when ``FILE`` hashes to ``NAME`` (64 hex digits: sha256;
#: 40: the git blob id the hub names a small file by; any other name is not checked here).
RELAY = (
    'k3_pull() { setsid $K3_RSYNC -q --append "$1" "$2" >/dev/null '
    '2>>"$K3_ERR" & '
    'pid=$!; { was=-1; t=$(date +%s); while sleep 1; do now=$(stat -c %s "$2" 2>/dev/null || echo 0); '
    'if [ "$now" != "$was" ]; then was=$now; t=$(date +%s); elif [ $(($(date +%s) - t)) -ge "$K3_WAIT" ]; then '
    'kill -KILL -$pid 2>/dev/null; break; fi; done; } >/dev/null 2>&1 & '
    'dog=$!; wait $pid; rc=$?; '
    'kill $dog 2>/dev/null; wait $dog 2>/dev/null; return $rc; }; '
    'k3_full() { m=$(grep -m1 -e "No space left on device" -e "Disk quota exceeded" "$K3_ERR" 2>/dev/null) || '
    'return 1; echo "stage: this node cannot write $part: $m" >&2; }; '
    'k3_len() { stat -c %s "$part" 2>/dev/null || echo 0; }; '
    'k3_relay() { part="$3.k3-part"; want=$4; case $want in *[!0-9]*) want=;; esac; : > "$K3_ERR"; '
    'for p in $K3_PEERS; do case " $K3_DEAD " in *" $p "*) continue;; esac; '
    'src="rsync://${p#*=}:$K3_PORT/$1/$2"; last=$(date +%s); '
    'while :; do had=$(k3_len); if [ -n "$want" ]; then '
    '[ "$had" -lt "$want" ] || { K3_FROM=$p; return 0; }; k3_pull "$src.k3-part" "$part"; rc=$?; '
    '! k3_full || return 2; if [ $rc = 23 ]; then k3_pull "$src" "$part"; rc=$?; ! k3_full || return 2; '
    '[ $rc != 0 ] || { K3_FROM=$p; return 0; }; fi; [ "$(k3_len)" -lt "$want" ] || { K3_FROM=$p; return 0; }; '
    'else k3_pull "$src" "$part"; rc=$?; ! k3_full || return 2; '
    'if [ $rc = 0 ]; then K3_FROM=$p; return 0; fi; [ $rc = 23 ] || break; '
    'k3_pull "$src.k3-part" "$part"; rc=$?; ! k3_full || return 2; fi; '
    'case $rc in 0|23|24) ;; *) break;; esac; '
    'if [ "$(k3_len)" -gt "$had" ]; then last=$(date +%s); '
    'elif [ $(($(date +%s) - last)) -ge "$K3_STALL" ]; then rc=stalled; break; else sleep 0.3; fi; done; '
    'echo "stage: ${p%%=*} (${p#*=}) gave no more of $2 (rsync exit $rc: no answer or no new byte within '
    '${K3_WAIT}s; stalled: its own copy did not grow for ${K3_STALL}s): routed around it" >&2; '
    'K3_DEAD="$K3_DEAD $p"; done; return 1; }; '
    'k3_sum() { case ${#2} in 64) h=$($K3_SHA256 < "$1");; '
    r'40) h=$({ printf "blob %d\000" "$(($(wc -c < "$1")))"; cat "$1"; } | $K3_SHA1);; *) return 0;; esac; '
    '[ "${h%% *}" = "$2" ]; }')


def _relay_env(peers: Sequence[tuple[str, str]], port: int, wait: int) -> str:
    """The relay's variables (``K3_RSYNC``: rsync as the chain runs it against a peer's daemon, with ``TCP_NODELAY``
    as the daemon has it (:data:`PEERS_SOCKET_OPTIONS`): without it, Nagle's algorithm against delayed ACKs holds each
    short exchange of rsync's protocol for ~40 ms, ~0.13 s a connection, which a hop pays on every poll), and
    ``K3_ERR``: where rsync's messages go (what :data:`RELAY`'s ``k3_full`` reads), a
    file made by ``mktemp``, held open on descriptor 9 and unlinked at once, then named ``/dev/fd/9``: no name of it
    is left in the temporary directory whichever way the script ends (done, failed, or killed, even by SIGKILL,
    which no ``trap`` sees), and the kernel frees it with the last process holding it; ``/dev/null`` where no
    temporary file can be made.

        >>> "exec 9>" in _relay_env([("n1", "10.0.0.11")], 8873, 10)
        True
    """
    words = " ".join(f"{name}={address}" for name, address in peers)
    return (f"K3_PEERS={shlex.quote(words)} K3_PORT={int(port)} K3_WAIT={int(wait)} K3_STALL={6 * int(wait)} "
            f"K3_RSYNC='rsync --timeout={int(wait)} --contimeout={int(wait)} --sockopts={PEERS_SOCKET_OPTIONS}' "
            'K3_DEAD= K3_FROM= K3_ERR=/dev/null; if k3_t=$(mktemp 2>/dev/null); then exec 9>"$k3_t"; rm -f "$k3_t"; '
            "K3_ERR=/dev/fd/9; fi")


def relay_weights(peers: Sequence[tuple[str, str]], port: int, cache: str, model: str, wait: int = 10) -> str:
    """The model's cache directory along the chain (:data:`RELAY`): from the first of ``peers`` (``(name,
    address)``, nearest first) that answers, once it holds the snapshot (its ``refs/main``, which a node writes
    last), the snapshot's links and the blobs' sizes (``SIZES``); then every blob the snapshot names, in one order
    on every node, each copied as the peer receives it until this node holds its size (or the peer holds it whole,
    where its size is not known), verified against its name as it lands and only then renamed whole, a bad one
    copied once more (without a size); then every shard the index names checked to be there, and the
    snapshot marked verified (``VERIFIED``: each of its files was hashed once, as it landed).

        >>> "k3_relay k3-hub" in relay_weights([("n1", "10.0.0.11")], 8873, "/c", "o/m")
        True
    """
    d = model_dir(cache, model)
    qd, top = shlex.quote(d), shlex.quote(d.rsplit("/", 1)[1])
    failed = shlex.quote(f"stage: no peer gave the snapshot of {model}")
    nobody = ('echo "stage: no peer gave a whole, good blob $b of "' + shlex.quote(model) + '" (asked: $K3_PEERS)" '
              '>&2; exit 1')
    # the blobs' sizes as the chain's holder has them (what lets a node take a file as soon as it holds all of it):
    # the sizes of the peer's whole blobs, then, for the others, the peer's own list (a node writes it before its
    # ``refs/main``, which its successor waits for); a list, not a check: every file is still verified by its name
    sizes = ('{ timeout -k 1 "$((3 * K3_WAIT))" $K3_RSYNC --list-only --no-h "$src/blobs/" 2>/dev/null | '
             "awk '$1 ~ /^-/ && $NF !~ /[.]k3-part$/ {print $NF, $2}'; timeout -k 1 \"$((3 * K3_WAIT))\" "
             f'$K3_RSYNC -q "$src/{SIZES}" "$d/.k3-sizes" 2>/dev/null && cat "$d/.k3-sizes"; }} | '
             f"awk '$2 ~ /^[0-9]+$/ && !seen[$1]++' > \"$d/.k3-sizes-new\"; mv -f \"$d/.k3-sizes-new\" "
             f'"$d/{SIZES}"; rm -f "$d/.k3-sizes"')
    meta = ('for p in $K3_PEERS; do src="rsync://${p#*=}:$K3_PORT/' + HUB_MODULE + '/$top"; last=$(date +%s); '
            'while :; do timeout -k 1 "$((3 * K3_WAIT))" $K3_RSYNC -q '
            '"$src/refs/main" "$d/.k3-ref" 2>/dev/null; rc=$?; [ $rc = 23 ] || break; '
            '[ $(($(date +%s) - last)) -lt "$K3_STALL" ] || break; sleep 0.3; done; '
            'if [ $rc = 0 ] && timeout -k 1 "$((3 * K3_WAIT))" $K3_RSYNC -rlt '
            '"$src/snapshots/" "$d/snapshots/"; then ' + sizes + '; '
            'mkdir -p "$d/refs" && mv -f "$d/.k3-ref" "$d/refs/main" && ok=1 && break; fi; '
            'echo "stage: ${p%%=*} (${p#*=}) gave no snapshot (rsync exit $rc): routed around it" >&2; '
            f'K3_DEAD="$K3_DEAD $p"; done; [ "$ok" = 1 ] || {{ echo {failed} >&2; exit 1; }}')
    # each blob hashed as it lands, in the background (one per core at most as the copies go on), then renamed
    # whole; one that does not hash to its name is listed and copied once more at the end
    bad = '"$d/.k3-landed-bad"'
    blobs = ('rev=$(cat "$d/refs/main") && : > ' + bad + ' && for b in $(find "$d/snapshots/$rev" -type l -exec '
             "readlink {} + | sed 's|.*/||' | sort -u); do f=\"$d/blobs/$b\"; "
             '[ -f "$f" ] && k3_sum "$f" "$b" && continue; rm -f "$f"; '
             f"size=$(awk -v b=\"$b\" '$1 == b {{print $2; exit}}' \"$d/{SIZES}\" 2>/dev/null); "
             'k3_relay ' + HUB_MODULE + ' "$top/blobs/$b" '
             f'"$f" "$size" || {{ wait; {nobody}; }}; {{ if k3_sum "$f.k3-part" "$b"; then mv -f "$f.k3-part" "$f"; '
             f'else echo "$b" >> {bad}; fi; }} & done; wait; for b in $(cat {bad}); do f="$d/blobs/$b"; '
             f'rm -f "$f.k3-part"; k3_relay {HUB_MODULE} "$top/blobs/$b" "$f" && k3_sum "$f.k3-part" "$b" || '
             f'{{ {nobody}; }}; mv -f "$f.k3-part" "$f"; done; rm -f {bad}')
    # every shard the index names is there (each file was hashed as it landed: not again here)
    indexed = ('cd "$d/snapshots/$rev" && n=$(find . ! -type d | wc -l) && { [ ! -f model.safetensors.index.json ] || '
               "for f in $(grep -o '\"[^\"]*[.]safetensors\"' model.safetensors.index.json | tr -d '\"' | sort -u); "
               'do [ -e "$f" ] || { echo "stage: shard $f of the index is not in the snapshot ${p%%=*} gave" >&2; '
               'exit 1; }; done; }')
    return (f"( d={qd}; top={top}; {_relay_env(peers, port, wait)}; ok=0; {HASH_TOOLS}; {RELAY}; "
            f'mkdir -p "$d/blobs" && rm -f "$d/{VERIFIED}" && {meta} && {blobs} && {indexed} && '
            f'touch "$d/{VERIFIED}" && echo "verified $n files as they landed" )')


def relay_image(peers: Sequence[tuple[str, str]], port: int, docker: str, image: str, stage_dir: str,
                wait: int = 10, tag: str | None = None) -> str:
    """The image archive along the chain (:data:`RELAY`): copied from the first of ``peers`` that answers as that
    peer receives it, checked against the sha256 its sender wrote (:func:`export_image`) as it lands and only then
    renamed whole (what the next node copies as whole), then loaded; a pinned build's image id is checked against
    the peer's (see :func:`receive_image`).

        >>> "k3_relay k3-stage" in relay_image([("n1", "10.0.0.11")], 8873, "docker", "r/i:t", "/s")
        True
    """
    a = archive_path(stage_dir, image)
    name = a.rsplit("/", 1)[1]
    d = shlex.quote(docker)
    pinned = "@sha256:" in image
    failed = shlex.quote(f"stage: no peer gave the image archive {name}")
    side = [".sha256", *([".id"] if pinned else [])]
    srcs = " ".join(f'"$src"{shlex.quote(name + ext)}' for ext in side)
    bad = ('echo "stage: the image archive from ${K3_FROM%%=*} hashes to $got, its sender wrote $want: not loaded" '
           '>&2; rm -f "$a.k3-part"; exit 1')
    out = (f"mkdir -p {shlex.quote(stage_dir)} && {root_only_dir(stage_dir)} && ( a={shlex.quote(a)}; "
           f"{_relay_env(peers, port, wait)}; {HASH_TOOLS}; {RELAY}; k3_relay {STAGE_MODULE} {shlex.quote(name)} "
           f'"$a" || {{ echo {failed} >&2; exit 1; }}; src="rsync://${{K3_FROM#*=}}:$K3_PORT/{STAGE_MODULE}/"; '
           f'timeout -k 1 "$((3 * K3_WAIT))" $K3_RSYNC -q {srcs} '
           f'{shlex.quote(stage_dir.rstrip("/") + "/")} '
           '&& got=$($K3_SHA256 < "$a.k3-part" | cut -d" " -f1) && want=$(cat "$a.sha256") && '
           f'{{ [ "$got" = "$want" ] || {{ {bad}; }}; }} && mv -f "$a.k3-part" "$a" )')
    if not pinned:
        return _then(out, f"{d} load -i {shlex.quote(a)}", digest_check(docker, image), name_build(docker, image, tag))
    run = shlex.quote(run_ref(image))
    qa = shlex.quote(a)
    return (f"{out} && {d} load -i {qa} && got=$({d} image inspect --format '{{{{.Id}}}}' {run}) && "
            f"want=$(cat {qa}.id) && if [ \"$got\" != \"$want\" ]; then echo \"loaded image $got as \"{run}\", "
            f"the peer's build is $want\" >&2; exit 1; fi && echo \"image id ok: $got\""
            + (f" && {d} tag {run} {shlex.quote(tag)}" if tag else ""))


def relay_file(peers: Sequence[tuple[str, str]], port: int, stage_dir: str, path: str, wait: int = 10) -> str:
    """A runtime's image file (``path`` under ``stage_dir``: a squashfs, a SIF) along the chain (:data:`RELAY`):
    copied from the first of ``peers`` that answers as that peer receives it, checked against the sha256 its maker
    wrote (:func:`receive_file`'s rule) and only then moved into place, the checksum first (what the next node
    copies as whole); a file that does not match is removed and the step fails, naming the peer.

        >>> "k3_relay k3-stage images/i.sqsh" in relay_file([("n1", "10.0.0.11")], 8873, "/s", "/s/images/i.sqsh")
        True
    """
    rel = path[len(stage_dir.rstrip("/")) + 1:]
    failed = shlex.quote(f"stage: no peer gave the image file {rel}")
    bad = ('echo "stage: the image file from ${K3_FROM%%=*} hashes to $got, its maker wrote $want: removed; run '
           'again" >&2; rm -f "$a.k3-part" "$a.sha256.k3-part"; exit 1')
    return (f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0] or '/')} && ( a={shlex.quote(path)}; "
            f"{_relay_env(peers, port, wait)}; {HASH_TOOLS}; {RELAY}; k3_relay {STAGE_MODULE} {shlex.quote(rel)} "
            f'"$a" || {{ echo {failed} >&2; exit 1; }}; src="rsync://${{K3_FROM#*=}}:$K3_PORT/{STAGE_MODULE}/"; '
            f'timeout -k 1 "$((3 * K3_WAIT))" $K3_RSYNC -q '
            f'"$src"{shlex.quote(rel + ".sha256")} "$a.sha256.k3-part" '
            '&& got=$($K3_SHA256 < "$a.k3-part" | cut -d" " -f1) && want=$(cat "$a.sha256.k3-part") && '
            f'{{ [ "$got" = "$want" ] || {{ {bad}; }}; }} && mv -f "$a.sha256.k3-part" "$a.sha256" && '
            'mv -f "$a.k3-part" "$a" )')


def sum_archive(stage_dir: str, image: str, part: str = "") -> str:
    """Write the sha256 of the image archive (``part``: of its ``.part`` file being written) beside it, where the
    chain's receivers check their copy against it (:func:`relay_image`)."""
    a = archive_path(stage_dir, image)
    return (f"{{ {HASH_TOOLS}; $K3_SHA256 < {shlex.quote(a + part)} | cut -d' ' -f1 > "
            f"{shlex.quote(a + '.sha256')}; }}")


def export_image(docker: str, image: str, stage_dir: str) -> str:
    """Write ``image`` as an archive for peers (kept while the stage runs). A pinned build is saved by the local tag
    the units run (so a load names it, whatever the image store) with its image id next to it (``.id``), which the
    receivers check after loading."""
    a = shlex.quote(archive_path(stage_dir, image))
    d = shlex.quote(docker)
    summed = sum_archive(stage_dir, image, ".part")
    if "@sha256:" not in image:
        return (f"mkdir -p {shlex.quote(stage_dir)} && {root_only_dir(stage_dir)} && {{ [ -s {a} ] && "
                f"[ -s {a}.sha256 ] || {{ {d} save -o {a}.part {shlex.quote(image)} && {summed} && "
                f"mv -f {a}.part {a}; }}; }}")
    run = shlex.quote(run_ref(image))
    return (f"mkdir -p {shlex.quote(stage_dir)} && {root_only_dir(stage_dir)} && {name_build(docker, image)} && "
            f"{{ [ -s {a} ] && [ -s {a}.id ] && [ -s {a}.sha256 ] || "
            f"{{ {d} save -o {a}.part {run} && {d} image inspect --format '{{{{.Id}}}}' {run} > {a}.id && "
            f"{summed} && mv -f {a}.part {a}; }}; }}")


def load_image(docker: str, image: str, archive: str, tag: str | None = None) -> str:
    """Load ``image`` from an archive (the control machine's); a pinned digest is verified and the build named."""
    return _then(f"{shlex.quote(docker)} load -i {shlex.quote(archive)}", digest_check(docker, image),
                 name_build(docker, image, tag))


def receive_image(address: str, port: int, docker: str, image: str, stage_dir: str, tag: str | None = None) -> str:
    """Copy the image archive from the peer at ``address`` (resumable), then load it. A pinned build is checked by
    its image id against the peer's (the id is the sha256 of the image's config, which names every layer: a
    ``docker load`` keeps it with either image store, where the repo digest survives only with the containerd
    store), then tagged as ``tag``."""
    a = archive_path(stage_dir, image)
    name = a.rsplit("/", 1)[1]
    qa, qd = shlex.quote(a), shlex.quote(stage_dir)
    made = f"mkdir -p {qd} && {root_only_dir(stage_dir)}"
    if "@sha256:" not in image:
        src = _rsync_from(address, port, STAGE_MODULE, name)
        return (f"{made} && rsync -a --partial {shlex.quote(src)} {qa} && "
                f"{load_image(docker, image, a, tag)}")
    srcs = " ".join(shlex.quote(_rsync_from(address, port, STAGE_MODULE, n)) for n in (name, f"{name}.id"))
    d, run = shlex.quote(docker), shlex.quote(run_ref(image))
    return (f"{made} && rsync -a --partial {srcs} {shlex.quote(stage_dir.rstrip('/') + '/')} && "
            f"{d} load -i {qa} && got=$({d} image inspect --format '{{{{.Id}}}}' {run}) && want=$(cat {qa}.id) && "
            f"if [ \"$got\" != \"$want\" ]; then echo \"loaded image $got as \"{run}\", the peer's build is "
            f"$want\" >&2; exit 1; fi && echo \"image id ok: $got\"" + (f" && {d} tag {run} {shlex.quote(tag)}"
                                                                       if tag else ""))


def _tcp_open(address: str, port: int, seconds: int) -> str:
    """A command that succeeds when ``address:port`` accepts a TCP connection within ``seconds`` (bash's
    ``/dev/tcp``; the address and port reach it as arguments, never as script text).

    >>> _tcp_open("10.0.0.1", 29501, 2)
    "timeout 2 bash -c '</dev/tcp/$1/$2' _ 10.0.0.1 29501"
    """
    return f"timeout {int(seconds)} bash -c '</dev/tcp/$1/$2' _ {shlex.quote(address)} {int(port)}"


def serve_peers(config: str, text: str, address: str, port: int, dirs: Sequence[str]) -> str:
    """Write the daemon's configuration ``text`` to ``config`` (:func:`put_text`), start the read-only rsync daemon
    (a transient unit) that gives this node's staged files to its peers, and wait until it listens on
    ``address:port``: one command."""
    unit = PEERS_UNIT
    made = " ".join(shlex.quote(d) for d in dirs)
    late = shlex.quote(f"rsync daemon not listening on {address}:{int(port)} after 30s")
    return (f"{put_text(config, text, '644')} && mkdir -p {made} && "
            f"{{ systemctl stop {unit} 2>/dev/null || true; }} && "
            f"{{ systemctl reset-failed {unit} 2>/dev/null || true; }} && "
            f"systemd-run --quiet --unit {unit} --collect rsync --daemon --no-detach "
            f"--config={shlex.quote(config)} && i=0; until {_tcp_open(address, port, 1)} "
            f"2>/dev/null; do i=$((i+1)); if [ $i -ge 60 ]; then echo {late} >&2; "
            f"journalctl -u {unit} -n 5 --no-pager >&2; exit 1; fi; sleep 0.5; done")


def stop_peers() -> str:
    """Stop the stage's rsync daemon (one a killed run left up) and forget its failures; done when it is gone."""
    return (f"systemctl stop {PEERS_UNIT} 2>/dev/null; systemctl reset-failed {PEERS_UNIT} 2>/dev/null; "
            f"! systemctl is-active --quiet {PEERS_UNIT} && echo 'stopped {PEERS_UNIT}, left by an earlier run'")


def stop_serving(stage_dir: str, image: str) -> str:
    """Stop serving peers and remove the image archive (the image itself stays loaded)."""
    a = shlex.quote(archive_path(stage_dir, image))
    return (f"{{ systemctl stop {PEERS_UNIT} 2>/dev/null || true; }} && rm -f {a} {a}.part {a}.sha256 "
            f"{a}.k3-part {a}.id")


# ------------------------------------------------------------------------------------------ configure


def root_only_dir(directory: str) -> str:
    """Shell that fails unless ``directory`` (symlinks resolved) is owned by root and writable by root only, and each
    directory above it is owned by root and writable by root only or sticky (``/tmp``): then no other user can put,
    swap or rename a file in it while root writes there.

        >>> root_only_dir("/etc/k3deploy").startswith("d=$(cd /etc/k3deploy && pwd -P)")
        True
    """
    return (f'd=$(cd {shlex.quote(directory)} && pwd -P) && set -- "$d" && a=$d && while [ "$a" != / ]; do '
            'a=${a%/*}; a=${a:-/}; set -- "$@" "$a"; done && stat -c \'%u %a %n\' "$@" | { f=1; while read -r u m n; '
            'do if [ "$u" != 0 ] || [ $(( (0$m & 022) && ($f || !(0$m & 01000)) )) != 0 ]; then '
            'echo "k3deploy: $n is owned by uid $u with mode $m: the directory of a file k3deploy writes as root, and '
            'each one above it, must be owned by root and writable by root only (chown root:root; chmod go-w)" >&2; '
            'exit 1; fi; '
            'f=0; done; }')


def put_text(dest: str, text: str, mode: str) -> str:
    """Write ``text`` (no secret: it is part of the command) to ``dest`` with ``mode``, root's, in one command that
    fails as a whole: into a new file of an unpredictable name (``mktemp``, 0600) in the destination's directory,
    which only root may write to (:func:`root_only_dir`), then mode and owner set and renamed onto ``dest``.

        >>> put_text("/var/lib/k3deploy/stage/peers.conf", "x = 1", "644").endswith(
        ...     'mv -f "$t" /var/lib/k3deploy/stage/peers.conf; } || { rm -f "$t"; exit 1; }')
        True
    """
    directory = dest.rsplit("/", 1)[0] or "/"
    t = '"$t"'
    return (f"umask 022 && mkdir -p {shlex.quote(directory)} && {root_only_dir(directory)} && "
            f"t=$({_mktemp(directory.rstrip('/') + '/.k3-')}) && {{ printf %s {shlex.quote(text)} > {t} && "
            f"chmod {shlex.quote(mode)} {t} && chown 0:0 {t} && mv -f {t} {shlex.quote(dest)}; }} || "
            f"{{ rm -f {t}; exit 1; }}")


def new_temp(directory: str, temp: str) -> str:
    """Create ``temp`` (a name in ``directory`` the control machine drew at random) empty, root's and 0600, only if
    no such name exists (``set -C``), in a directory only root can write to (see :func:`root_only_dir`)."""
    d = shlex.quote(directory)
    return f"umask 022 && mkdir -p {d} && {root_only_dir(directory)} && umask 077 && set -C && : > {shlex.quote(temp)}"


def put_in_place(temp: str, dest: str, mode: str, private: str | None = None, owner: str | None = None) -> str:
    """Install ``temp`` (made by :func:`new_temp`, its content written since) as ``dest``: it must still be a plain
    file of root's with mode 0600 in a directory only root can write to; then its mode and owner (root) are set and
    it is renamed onto ``dest`` (one step: nobody sees a partial file). With ``private`` (a directory of the SSH user,
    0700, holding the content as ``f``: an upload under sudo), ``temp`` is made and filled from it here, then the
    directory is removed. With ``owner`` (a user name: a Slurm job's file, ``k3_slurm_user``), the file is that
    user's instead of root's. A failure removes ``temp``."""
    directory = dest.rsplit("/", 1)[0] or "/"
    who = f"{shlex.quote(owner)}:" if owner else "0:0"
    if private is None:
        out = f"t={shlex.quote(temp)}; trap 'rm -f \"$t\"' EXIT; {{ {root_only_dir(directory)}; }} || exit 1; "
    else:
        out = (f"t={shlex.quote(temp)}; p={shlex.quote(private)}; trap 'rm -f \"$t\"; rm -rf \"$p\"' EXIT; "
               f"{{ {new_temp(directory, temp)}; }} || exit 1; cat \"$p/f\" >> \"$t\" || exit 1; ")
    return out + ('{ [ -f "$t" ] && [ ! -L "$t" ] && [ "$(stat -c \'%u %a\' "$t")" = "0 600" ]; } || '
                  '{ echo "k3deploy: $t is not a plain file of root\'s with mode 0600 any more: nothing written" >&2; '
                  f'exit 1; }}; chmod {shlex.quote(mode)} "$t" && chown {who} "$t" && mv -f "$t" {shlex.quote(dest)}')


def copy_into(dest: str) -> str:
    """Before a copy from the control machine to ``dest`` (a directory when it ends with ``/``): its parent made;
    a file (an image archive, which root loads) goes only into a directory that only root can write to.

        >>> copy_into("/var/lib/k3deploy/cache/huggingface/hub/models--m/")
        'umask 022 && mkdir -p /var/lib/k3deploy/cache/huggingface/hub'
    """
    parent = dest.rstrip("/").rsplit("/", 1)[0] or "/"
    made = f"umask 022 && mkdir -p {shlex.quote(parent)}"
    return made if dest.endswith("/") else f"{made} && {root_only_dir(parent)}"


def write_from_stdin(files: Sequence[tuple[str, str] | tuple[str, str, str | None]], nonce: str) -> str:
    """Write several files (``(dest, mode)`` pairs, or ``(dest, mode, owner)``: :func:`put_in_place`) in one script,
    their contents arriving one after the other on stdin, never in argv: each as a line with its size in bytes, then
    its bytes. Each goes
    into a new file ``.k3-<nonce>-<i>.tmp`` beside ``dest`` (made by :func:`new_temp`: root's, 0600, only if no such
    name exists, in a directory only root can write to; the nonce is drawn at random on the control machine), which
    is then put in place (:func:`put_in_place`). The first file that cannot be written stops the script (exit 1),
    before any later file is touched.

        >>> 'head -c "$n" >> /d/.k3-ab-0.tmp' in write_from_stdin([("/d/a.env", "600")], "ab")
        True
    """
    parts = []
    for i, (dest, mode, *who) in enumerate(files):
        owner = who[0] if who else None
        directory = dest.rsplit("/", 1)[0] or "/"
        temp = f"{directory.rstrip('/')}/.k3-{nonce}-{i}.tmp"
        t = shlex.quote(temp)
        parts.append(f"IFS= read -r n && case $n in ''|*[!0-9]*) exit 1;; esac && "
                     f"( {new_temp(directory, temp)} ) && {{ head -c \"$n\" >> {t} || {{ rm -f {t}; exit 1; }}; }} && "
                     f"( {put_in_place(temp, dest, mode, owner=owner)} ) || exit 1")
    return "\n".join(parts)


def make_dirs(paths: Sequence[str], mode: str = "0755", owner: str | None = None) -> str:
    """Create ``paths`` (and their parents), root's (or ``owner``'s: a user name) and ``mode``.

        >>> make_dirs(["/var/lib/k3deploy/slurm"])
        'mkdir -p -m 0755 /var/lib/k3deploy/slurm && chown 0:0 /var/lib/k3deploy/slurm'
    """
    q = " ".join(shlex.quote(p) for p in paths)
    return f"mkdir -p -m {shlex.quote(mode)} {q} && chown {shlex.quote(owner) + ':' if owner else '0:0'} {q}"


def lock_down(files: Sequence[tuple[str, str] | tuple[str, str, str | None]]) -> str:
    """Give each ``(path, mode)`` that is a plain file root as owner and ``mode`` (its content stays); a ``(path,
    mode, owner)`` with an owner (a user name, as :func:`put_in_place` takes it) goes to that user instead.

        >>> lock_down([("/e/a.env", "600"), ("/e/b.env", "600", "k3job")]).count("chown")
        2
        >>> "chown k3job: /e/b.env" in lock_down([("/e/b.env", "600", "k3job")])
        True
    """
    out = []
    for path, mode, *who in files:
        q, m = shlex.quote(path), shlex.quote(mode)
        owner = f"{shlex.quote(who[0])}:" if who and who[0] else "0:0"
        out.append(f"{{ [ ! -f {q} ] || [ -L {q} ] || {{ chown {owner} {q} && chmod {m} {q}; }}; }}")
    return " && ".join(out)


def _mktemp(prefix: str) -> str:
    """``mktemp`` of a new file, mode 0600, whose name is ``prefix`` and ten random characters (the ``X``s of its
    template).

    >>> _mktemp("/etc/k3deploy/.k3-") == "mktemp /etc/k3deploy/.k3-" + "X" * 10
    True
    """
    return f"mktemp {shlex.quote(prefix)}{'X' * 10}"


def install_file(dest: str, content: str, mode: str) -> str:
    """Write ``content`` to ``dest`` with ``mode`` (the runbook's form of the operations' upload): into a new file of
    an unpredictable name (``mktemp``, 0600) in the destination's directory, which only root may write to, then
    mode and owner set and renamed onto ``dest``."""
    tag = "K3_EOF"
    while tag in content.splitlines():
        tag += "_"
    directory = dest.rsplit("/", 1)[0] or "/"
    d, t = shlex.quote(directory), '"$t"'
    return (f"install -d -m 0755 {d}\n{root_only_dir(directory)}\n"
            f"t=$({_mktemp(directory.rstrip('/') + '/.k3-')})\n"
            f"cat >> {t} <<'{tag}'\n{content}{tag}\nchmod {shlex.quote(mode)} {t} && chown 0:0 {t} && mv -f {t} "
            f"{shlex.quote(dest)}\n")


def daemon_reload() -> str:
    return "systemctl daemon-reload"


# ---------------------------------------------------------------------------------------------- start


def stop_units(units: Sequence[str]) -> str:
    return f"systemctl stop {_units(units)}"


def start_units(units: Sequence[str]) -> str:
    """Reload unit files where systemd holds an older version of one (``NeedDaemonReload``), clear old failures
    (systemd's and the crash-loop backoff's notes, so an explicit start never waits), enable the units not enabled
    yet and (re)start the units. A reload and an enable each make systemd re-read every unit file of the node (a
    tenth of a second of its CPU on a small node, more on a busy one): each runs only when it changes something."""
    q = _units(units)
    notes = " ".join(shlex.quote(f"{FAILURES_DIR}/{u}.failures") for u in units)
    return (f"{{ ! systemctl show -p NeedDaemonReload --value {q} | grep -qx yes || systemctl daemon-reload; }} && "
            f"{{ systemctl reset-failed {q} 2>/dev/null || true; }} && rm -f {notes} && "
            f"{{ off=; for u in {q}; do systemctl is-enabled --quiet \"$u\" || off=\"$off $u\"; done; "
            f"[ -z \"$off\" ] || systemctl enable $off; }} && systemctl restart {q}")


def start_joined(units: Sequence[str], joins: Sequence[tuple[str, int]], timeout: int, config_dir: str) -> str:
    """Start units that join their heads (:func:`start_units`) once each ``(address, port)`` accepts a TCP
    connection (:func:`wait_tcp`), in one script: a wait that times out ends it. The start goes on only if the
    deployment lock on this node (``config_dir``) is as it was when the script began: a run that lost its link to
    this node leaves this script waiting there, and once a later run has taken the lock over it must start nothing
    (the worker would join that run's group a second time). Where no run holds a lock (the runbook) it is the same
    empty lock before and after.

    >>> print(start_joined(["k3-engine.service"], [("10.0.0.1", 29501)], 300, "/etc/k3").splitlines()[0])
    held=$(cat /etc/k3/deploy.lock 2>/dev/null || true)
    """
    lock = shlex.quote(f"{config_dir.rstrip('/')}/{LOCK_FILE}")
    why = shlex.quote("not started: the deployment lock on this node changed hands while this start waited (a later "
                      "run took it over)")
    return "\n".join([f"held=$(cat {lock} 2>/dev/null || true)",
                      *(wait_tcp(address, port, timeout) for address, port in joins),
                      f'test "$(cat {lock} 2>/dev/null || true)" = "$held" || {{ echo {why} >&2; exit 1; }}',
                      start_units(units)])


def wait_tcp(address: str, port: int, timeout: int, interval: float = 1.0) -> str:
    """Wait, from this node, until ``address:port`` accepts a TCP connection (no payload is sent)."""
    where = f"{address}:{int(port)}"
    late = shlex.quote(f"rendezvous {where} not open after {int(timeout)}s (is the head engine running?)")
    return (f"end=$(( $(date +%s) + {int(timeout)} )); "
            f"until {_tcp_open(address, port, 2)} 2>/dev/null; do "
            f"if [ $(date +%s) -ge $end ]; then echo {late} >&2; exit 1; fi; sleep {float(interval):g}; done; "
            f"echo {shlex.quote(f'rendezvous {where} open')}")


def _serving(url: str, model: str | None, env_file: str | None = None) -> list[str]:
    """The part of a probe that asks the endpoint: ``/health`` 200 (503: failed) and, with ``model``, ``/v1/models``
    listing it. With ``env_file`` the request to ``/v1/models`` carries the API key that file holds (vLLM guards
    ``/v1``; ``/health`` is open), and a 401 or 403 fails at once, naming the key."""
    health = shlex.quote(url + "/health")
    lines = [
        f"code=$(curl -s -o /dev/null -m 5 -w '%{{http_code}}' {health} || true)",
        f"if [ \"$code\" = 503 ]; then echo {shlex.quote(f'GET {url}/health -> 503 (engine dead)')}; "
        f"exit {PROBE_FAILED}; fi",
        f"[ \"$code\" = 200 ] || exit {PROBE_STARTING}",
    ]
    if model:
        listed = " ".join(f"-e {shlex.quote(p)}" for p in (f'"id":{json.dumps(model)}', f'"id": {json.dumps(model)}'))
        models = shlex.quote(url + "/v1/models")
        if env_file is None:
            lines.append(f"curl -s -m 5 {models} | grep -qF {listed} || exit {PROBE_STARTING}")
        else:
            lines += [read_key(env_file),
                      f"body=$({BEARER}curl -s -m 5 -H @- -w '\\nK3_CODE=%{{http_code}}' {models} || true)",
                      "code=${body##*K3_CODE=}",
                      _refused(url + "/v1/models", env_file),
                      f"printf '%s\\n' \"$body\" | grep -qF {listed} || exit {PROBE_STARTING}"]
    return lines


def probe(unit: str, url: str | None, model: str | None, env_file: str | None = None) -> str:
    """One poll of a started unit. Exit 0: serving (``url``: ``/health`` 200 and, with ``model``, ``/v1/models``
    lists it; no ``url``: running); 1: failed, with what was observed on stdout; 2: still starting.

    A unit that failed, restarted, or stopped, or an engine whose ``/health`` answers 503, has failed; so has one
    whose ``/v1/models`` answers 401 or 403 (the API key: ``env_file``, the unit's own, holds the one sent).
    """
    u = shlex.quote(unit)
    lines = [
        f"eval \"$(systemctl show -p ActiveState -p SubState -p NRestarts {u} 2>/dev/null)\"",
        f"case \"$ActiveState/$SubState\" in failed/*|*/auto-restart|inactive/*|deactivating/*) "
        f"echo 'unit '{u}\" $ActiveState/$SubState, restarts ${{NRestarts:-0}}\"; exit {PROBE_FAILED};; esac",
        f"if [ \"${{NRestarts:-0}}\" -gt 0 ]; then echo 'unit '{u}\" $ActiveState/$SubState, restarts "
        f"$NRestarts\"; exit {PROBE_FAILED}; fi",
    ]
    if not url:
        lines.append(f"[ \"$ActiveState\" = active ] || exit {PROBE_STARTING}")
        return "; ".join(lines)
    return "; ".join(lines + _serving(url, model, env_file))


def probe_job(job: str, url: str | None, model: str | None, env_file: str | None = None,
              user: str | None = None) -> str:
    """One poll of a unit launched by Slurm (``k3_launcher: slurm``), from its own node: its group's job ``job`` (by
    name) must be running; then as :func:`probe` (``url``: ``/health`` 200 and, with ``model``, ``/v1/models`` lists
    it; no ``url``: the job running). The job is ``user``'s (``k3_slurm_user``; None: this SSH user's). Exit 0:
    serving; 1: failed (the job left the queue or is ending, or ``/health`` answers 503), with what was observed on
    stdout; 2: still starting (pending, or squeue did not answer).

        >>> "--name=k3-engine" in probe_job("k3-engine", None, None)
        True
    """
    j = shlex.quote(job)
    who = shlex.quote(user) if user else '"$(id -un)"'
    lines = [
        f"state=$(squeue -h -u {who} --name={j} -o %T 2>/dev/null) || exit {PROBE_STARTING}",
        "state=$(printf '%s\\n' \"$state\" | head -n 1)",
        f"case \"$state\" in RUNNING) ;; PENDING|CONFIGURING|REQUEUED|REQUEUE_HOLD) exit {PROBE_STARTING};; "
        f"'') echo 'job '{j}' is no longer in the Slurm queue: it ended'; exit {PROBE_FAILED};; "
        f"*) echo 'job '{j}\" is $state\"; exit {PROBE_FAILED};; esac",
    ]
    if not url:
        return "; ".join(lines)
    return "; ".join(lines + _serving(url, model, env_file))


def step_logs(output: str, container: str | None, docker: str, lines: int = 25) -> str:
    """The tail of a Slurm step's output (on its own node: ``k3deploy.model.slurm.step_output``) and of its
    container's log (``k3_launcher: slurm``'s :func:`logs`)."""
    lines = int(lines)
    o = shlex.quote(output)
    script = (f"echo {shlex.quote(f'--- {output} (the step output, last {lines} lines)')}; "
              f"tail -n {lines} {o} 2>&1")
    if container:
        script += "; " + _container_log(container, docker, lines, "its launch script runs it", "the step output")
    return script


def job_logs(group_dir: str, host: str, container: str, docker: str, lines: int) -> str:
    """What ``k3deploy bundle`` reads of a unit launched by Slurm (``k3_launcher: slurm``), each after a marker line:
    the id of the group's newest job on this node (its newest step output directory under ``group_dir``), the tail
    of this node's step output in that job, of the job's own output (on its batch host, the job's first node) and of
    the container's log.

        >>> "K3_LOG=step" in job_logs("/var/lib/k3deploy/slurm/engine", "n1", "k3-engine", "docker", 5)
        True
    """
    n, d = int(lines), shlex.quote(group_dir.rstrip("/"))
    return (f"k3_d=$(ls -1td {d}/*/ 2>/dev/null | head -n 1); k3_d=${{k3_d%/}}; echo K3_LOG=job; "
            "[ -n \"$k3_d\" ] && echo \"${k3_d##*/}\"; "
            f"echo K3_LOG=step; [ -n \"$k3_d\" ] && tail -n {n} \"$k3_d\"/{shlex.quote(host)}.out 2>&1; "
            f"if [ -n \"$k3_d\" ] && [ -f \"$k3_d.out\" ]; then echo K3_LOG=batch; tail -n {n} \"$k3_d.out\"; fi; "
            f"echo K3_LOG=container; {shlex.quote(docker)} logs --tail {n} {shlex.quote(container)} 2>&1; true")


def step_ended(job_output: str) -> str:
    """The line a Slurm job's batch script wrote when its first step ended (which node, its exit code), from the
    job's own output on its first node; nothing when there is none."""
    return f"grep -ho 'the step on [^ ]* ended with exit code [0-9]*' {shlex.quote(job_output)} 2>/dev/null | tail -n 1"


def logs(unit: str, container: str | None, docker: str, lines: int = 25) -> str:
    """The tail of a unit's journal and of its container's log."""
    lines = int(lines)
    script = (f"echo {shlex.quote(f'--- journalctl -u {unit} (last {lines} lines)')}; "
              f"journalctl -u {shlex.quote(unit)} -n {lines} --no-pager 2>&1 | tail -n {lines}")
    if container:
        script += _stop_found_none(container) + "; " + _container_log(container, docker, lines, "the unit runs it",
                                                                          "the journal")
    return script


def _stop_found_none(container: str) -> str:
    """A filter of a unit's journal: the unit's ``ExecStop`` (``docker stop``) of a unit stopped while its engine had
    just exited (its ``--rm`` container removed) or before ``docker run`` had created the container (a crash loop
    stopped by the rollout's stop) found no container; docker's "No such container" would read as a second fault,
    so the line says what it means instead.

        >>> _stop_found_none("k3-engine").split("/")[1]
        'Error response from daemon: No such container: k3-engine$'
    """
    said = (f"(docker stop found no container {container}: stopped while its engine had exited or before its "
            "container was created; not a fault)")
    name = container.replace(".", r"\.")      # a container name is letters, digits, '_', '.' and '-'
    found = f"Error response from daemon: No such container: {name}$"
    return f" | sed {shlex.quote(f's/{found}/{said}/')}"


def _container_log(container: str, docker: str, lines: int, runs_it: str, where: str) -> str:
    """The tail of a container's log. Its launcher runs it with ``--rm`` (``runs_it``): once the engine exited it is
    gone, and docker's "No such container" would read as a second fault; it says what it means instead (what the
    engine wrote is in ``where``, shown above)."""
    gone = (f"(no container {container} now: {runs_it} with --rm, so it is removed when the engine exits; what the "
            f"engine wrote is in {where} above)")
    return (f"echo {shlex.quote(f'--- {docker} logs --tail {lines} {container}')}; "
            f"if k3_out=$({shlex.quote(docker)} logs --tail {lines} {shlex.quote(container)} 2>&1); then "
            f"printf '%s\\n' \"$k3_out\" | tail -n {lines}; else case \"$k3_out\" in "
            f"*'No such container'*) echo {shlex.quote(gone)};; "
            f"*) printf '%s\\n' \"$k3_out\" | tail -n {lines};; esac; fi")


def wait_ready(unit: str, url: str | None, model: str | None, timeout: int, container: str | None, docker: str,
               interval: float = 2.0, env_file: str | None = None) -> str:
    """The runbook's wait: :func:`probe` until it says serving; on a failure or past ``timeout`` the reason and
    the logs, exit 1."""
    return (f"end=$(( $(date +%s) + {int(timeout)} ))\n"
            f"k3_probe() {{ {probe(unit, url, model, env_file)}; }}\n"
            f"until out=$(k3_probe); do\n"
            f"  rc=$?\n"
            f"  if [ $rc = {PROBE_FAILED} ] || [ $(date +%s) -ge $end ]; then\n"
            f"    echo {shlex.quote(unit)}\" is not serving: ${{out:-no answer within {int(timeout)}s}}\" >&2\n"
            f"    ( {logs(unit, container, docker)} ) >&2\n"
            f"    exit 1\n"
            f"  fi\n"
            f"  sleep {float(interval):g}\n"
            f"done\n"
            f"echo {shlex.quote(f'{unit} serves' + (f' at {url}' if url else ''))}\n")


# ---------------------------------------------------------------------------------------------- rolling


#: curl's retries of a router call: a router that restarts (systemd starts it again after a crash) is waited for
ROUTER_RETRY = "--retry 15 --retry-delay 1 --retry-all-errors --retry-max-time 60"


def router_list(workers: tuple[str, Sequence[str]] | None) -> str:
    r"""Write a router's worker file (``(path, urls)``: :func:`k3deploy.model.units.workers_file`, the workers it
    sends requests to): the list the router's unit starts with, so a router that restarts keeps a replica that is
    out of it out. Written as every file k3deploy writes as root (:func:`put_text`, 0600): under a new name, renamed
    into place (a start reads the old list or the new one).

    >>> listed = router_list(("/etc/k3deploy/k3-engine-router.workers", ["http://10.0.0.1:8000"]))
    >>> listed == put_text("/etc/k3deploy/k3-engine-router.workers",
    ...                    'K3_ROUTER_WORKERS="http://10.0.0.1:8000"\n', "600")
    True
    """
    if workers is None:
        return ""
    path, urls = workers
    return put_text(path, router_workers_text(list(urls)), "600")


def router_remove(router: str, urls: Sequence[str], workers: tuple[str, Sequence[str]] | None = None) -> str:
    """Take workers out of a running vllm-router (``POST /remove_worker?url=``; 200, also for one not listed), so
    it sends them no new request; requests in flight go on. With ``workers`` the router's worker file is written
    first (:func:`router_list`: the workers it keeps). A router restarting meanwhile is waited for."""
    lines = [f"out=$(curl -sS -m 10 {ROUTER_RETRY} -X POST -w ' (HTTP %{{http_code}})' "
             f"{shlex.quote(router.rstrip('/') + '/remove_worker?url=' + url)} 2>&1); "
             f"case \"$out\" in *'(HTTP 200)') echo \"$out\";; "
             f"*) echo {shlex.quote(f'remove {url}: ')}\"$out\"; exit 1;; esac"
             for url in urls]
    listed = router_list(workers)
    return "; ".join([f"{listed} || exit 1", *lines] if listed else lines)


def router_add(router: str, urls: Sequence[str], timeout: int,
               workers: tuple[str, Sequence[str]] | None = None) -> str:
    """Put workers back into a running vllm-router (``POST /add_worker?url=``: it answers once the worker's
    ``/health`` does; 400 "already exists" counts as done). With ``workers`` the router's worker file is written
    first (:func:`router_list`: every worker it sends requests to, these ones included). A router restarting
    meanwhile is waited for."""
    lines = [f"out=$(curl -sS -m {int(timeout)} {ROUTER_RETRY} -X POST -w ' (HTTP %{{http_code}})' "
             f"{shlex.quote(router.rstrip('/') + '/add_worker?url=' + url)} 2>&1); "
             f"case \"$out\" in *'(HTTP 200)'|*'already exists (HTTP 400)') echo \"$out\";; "
             f"*) echo {shlex.quote(f'add {url}: ')}\"$out\"; exit 1;; esac"
             for url in urls]
    listed = router_list(workers)
    return "; ".join([f"{listed} || exit 1", *lines] if listed else lines)


def router_workers(router: str) -> str:
    """The workers a running vllm-router sends requests to (``GET /list_workers``: ``{"urls": [...]}``)."""
    return f"curl -s -m 3 {shlex.quote(router.rstrip('/') + '/list_workers')} | tr -d '\\n'; echo"


def drain(url: str, timeout: int, interval: float = 0.5) -> str:
    """Wait until the engine at ``url`` has no request running or waiting (``/metrics``: ``vllm:num_requests_running``
    + ``vllm:num_requests_waiting``), seen twice in a row ``interval`` apart, or ``timeout`` seconds passed (then it
    says how many were still in flight and goes on: the restart drops them)."""
    metrics = shlex.quote(url.rstrip("/") + "/metrics")
    count = ("curl -s -m 3 " + metrics + " | awk '/^vllm:num_requests_(running|waiting)[{ ]/ {n += $NF} "
             "END {printf \"%d\", n}'")
    return (f"end=$(( $(date +%s) + {int(timeout)} )); quiet=0; "
            f"while :; do n=$({count}); n=${{n:-0}}; "
            f"if [ \"$n\" = 0 ]; then quiet=$((quiet + 1)); [ $quiet -ge 2 ] && break; else quiet=0; fi; "
            f"if [ $(date +%s) -ge $end ]; then echo {shlex.quote(url + ': ')}\"$n request(s) still in flight after "
            f"{int(timeout)}s (k3_drain_timeout); restarting anyway\"; exit 0; fi; sleep {float(interval):g}; done; "
            f"echo {shlex.quote(url + ': no request in flight')}")


# ---------------------------------------------------------------------------------------------- smoke


def chat_body(model: str) -> str:
    return json.dumps({"model": model, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "Say hello in one word."}]})


def unit_status(unit: str, container: str, docker: str, url: str | None, env_file: str | None = None,
                group_dir: str | None = None, host: str | None = None) -> str:
    """What ``k3deploy status`` reads of one unit, as ``K3_*=`` lines: systemd state, restarts and since when; the
    container's image and image id; with ``url``, the HTTP code of ``/health`` and the body of ``/v1/models``
    (3 s each; with ``env_file``, the unit's own, sent with the API key it holds); its last start, from the journal
    (:func:`startup_lines`) or, under Slurm (``group_dir`` and ``host`` set), from its step output in its group's
    newest job (:func:`step_startup_lines`)."""
    u, c = shlex.quote(unit), shlex.quote(container)
    fmt = shlex.quote("{{.Config.Image}} {{.Image}}")
    lines = [f"systemctl show --timestamp=unix -p LoadState -p ActiveState -p SubState -p NRestarts "
             f"-p ActiveEnterTimestamp {u} 2>/dev/null | sed 's/^/K3_/'",
             f"printf '%s\\n' \"K3_IMAGE=$({shlex.quote(docker)} inspect --format {fmt} {c} 2>/dev/null)\""]
    if url:
        # printf, not echo: dash's echo turns the backslashes of a served model name into other characters
        lines += [f"printf '%s\\n' \"K3_HEALTH=$(curl -s -o /dev/null -m 3 -w '%{{http_code}}' "
                  f"{shlex.quote(url + '/health')})\"",
                  _models_line("K3_MODELS=", url, env_file)]
    started = step_startup_lines(group_dir, host) if group_dir is not None and host is not None else \
        startup_lines(unit)
    return "; ".join([*lines, started])


def _models_line(mark: str, url: str, env_file: str | None) -> str:
    """Shell printing ``mark`` and the body of ``url``'s ``/v1/models`` on one line (with ``env_file``: sent with the
    API key it holds)."""
    models = shlex.quote(url.rstrip("/") + "/v1/models")
    if env_file is None:
        return f"printf '%s\\n' \"{mark}$(curl -s -m 3 {models} | tr -d '\\n')\""
    return (f"{read_key(env_file)}; printf '%s\\n' \"{mark}$({BEARER}curl -s -m 3 -H @- {models} | "
            "tr -d '\\n')\"")


def health_code(url: str) -> str:
    """The HTTP code of ``url``'s ``/health`` (``000``: no answer within 3 s)."""
    return f"curl -s -o /dev/null -m 3 -w '%{{http_code}}' {shlex.quote(url + '/health')}; echo"


def endpoint_models(endpoint: str, env_file: str | None = None) -> str:
    """The model ids the public endpoint lists (``/v1/models``), as JSON on one line; empty when it does not answer.
    With ``env_file`` (a unit's env file on this host) the request carries the API key it holds."""
    return _models_line("", endpoint, env_file)


#: a revision's record of each unit's start on a node, in its directory (``startup-<unit>.log``)
STARTUP_FILE = "startup-{unit}.log"


def startup_lines(unit: str) -> str:
    r"""The last start of ``unit`` as :func:`k3deploy.model.startup.parse` reads it: ``K3_BEGIN=`` when systemd began
    it (``InactiveExitTimestamp``, microseconds), then ``K3_START=`` the engine's first log line and its milestones,
    from the journal of the unit's last invocation (``_SYSTEMD_INVOCATION_ID``), as ``journalctl -o short-unix``
    prints them; the journal is read up to the API server's ready line only (an engine that has served for weeks
    has logged much since).

    >>> print(startup_lines("k3-engine.service"))   # doctest: +ELLIPSIS
    printf 'K3_BEGIN=%s\n' "$(systemctl show -P InactiveExitTimestamp --timestamp=us+utc k3-engine.service ...
    """
    u = shlex.quote(unit)
    return (f"printf '{BEGIN}%s\\n' \"$(systemctl show -P InactiveExitTimestamp --timestamp=us+utc {u} "
            f"2>/dev/null)\"; k3_i=$(systemctl show -P InvocationID {u} 2>/dev/null); [ -z \"$k3_i\" ] || "
            f"journalctl _SYSTEMD_INVOCATION_ID=\"$k3_i\" -o short-unix --no-pager 2>/dev/null | "
            f"grep -E {shlex.quote(ENGINE_LINE)} | "
            f"awk -v k={shlex.quote(KEPT)} 'NR == 1 || $0 ~ k {{ print }} /{READY}/ {{ exit }}' | sed 's/^/{LINE}/'")


def step_startup_lines(group_dir: str, host: str) -> str:
    """The last start in this node's newest Slurm step output under ``group_dir`` (``<job id>/<host>.out``, written
    as the engine logs), as :func:`k3deploy.model.startup.parse` reads it: ``K3_CLOCK=`` the node's clock (epoch
    seconds, UTC offset: the year and zone of vLLM's own stamps), then ``K3_STEP=`` the launch script's first line
    (:data:`~k3deploy.model.startup.STEP_BEGAN`) of the last start the file holds (a requeued job appends its
    next start), the engine's first log line and its milestones, read up to the API server's ready line. A file
    without the launch script's line (a launch script kept from an older revision) is read whole.

    >>> step_startup_lines("/var/lib/k3deploy/slurm/engine", "n1").startswith("printf 'K3_CLOCK=")
    True
    """
    began = ere(STEP_BEGAN)
    return (f"printf '{CLOCK}%s %s\\n' \"$(date +%s.%N)\" \"$(date +%z)\"; "
            f"k3_f=$(ls -1t {shlex.quote(group_dir.rstrip('/'))}/*/{shlex.quote(host + '.out')} 2>/dev/null | "
            f"head -n 1); [ -z \"$k3_f\" ] || grep -E {shlex.quote(ENGINE_LINE + '|' + began)} \"$k3_f\" | "
            f"awk -v k={shlex.quote(KEPT)} -v b={shlex.quote(began)} '$0 ~ b {{ n = 0; done = 0 }} "
            f"!done && (n < 2 || $0 ~ k) {{ l[n++] = $0 }} /{READY}/ {{ done = 1 }} "
            f"END {{ for (i = 0; i < n; i++) print l[i] }}' | sed 's/^/{STEP}/'")


#: a node's record of its stage in a run (``K3_STAGE=<step> <began> <ended>`` a line, epoch seconds), beside the
#: groups' revisions: what :func:`stage_ended` writes and :func:`kept_stage` keeps with the revision
STAGE_FILE = "stage.log"

#: before a stage step's script (run in a subshell of its own after it): when the step began
STAGE_BEGAN = "k3_b=$(date +%s.%N)"


def stage_ended(record: str, name: str, first: bool = False) -> str:
    """After a stage step's script (``( STAGE_BEGAN; ( SCRIPT ); stage_ended )``, :data:`STAGE_BEGAN`): a line of the
    node's stage record ``record`` (0600): ``K3_STAGE=`` the step's ``name``, when it began and when it ended
    (``date +%s.%N``); the step's exit code is the script's. ``first``: the node's first step of the run's stage,
    which begins the record anew (the record is the last run's stage only).

    >>> stage_ended("/r/stage.log", "weights").startswith("k3_rc=$?; mkdir -p /r && ")
    True
    """
    r = shlex.quote(record)
    return (f"k3_rc=$?; mkdir -p {shlex.quote(record.rsplit('/', 1)[0] or '/')} && ( umask 077; "
            f"printf '{STAGE}%s %s %s\\n' {shlex.quote(name)} \"$k3_b\" \"$(date +%s.%N)\" {'>' if first else '>>'} "
            f"{r} ) || true; exit $k3_rc")


def copy_began(record: str) -> str:
    """Before a stage step that is no script of the node's (a copy from the control machine): when it began, kept
    beside the node's stage record ``record`` for :func:`copy_ended`.

    >>> copy_began("/r/stage.log")
    '( mkdir -p /r && umask 077 && date +%s.%N > /r/stage.log.began ) || true'
    """
    return _in_record_dir(record, f"date +%s.%N > {shlex.quote(record + '.began')}")


def copy_ended(record: str, name: str, first: bool = False) -> str:
    """After that step: its line of the node's stage record (:func:`stage_ended`), from when :func:`copy_began`
    said it began.

    >>> copy_ended("/r/stage.log", "weights_copy").startswith("( k3_b=$(cat /r/stage.log.began 2>/dev/null); ")
    True
    """
    began = shlex.quote(record + ".began")
    return f"( k3_b=$(cat {began} 2>/dev/null); rm -f {began}; true; {stage_ended(record, name, first)} )"


def stage_reset(record: str) -> str:
    """Before a node's first stage step of a run whose timed parts run side by side (:func:`side_by_side`): the
    node's stage record ``record`` begun anew (0600), so that no part's line is lost to another's truncation.

    >>> stage_reset("/r/stage.log")
    '( mkdir -p /r && umask 077 && : > /r/stage.log ) || true'
    """
    return _in_record_dir(record, f": > {shlex.quote(record)}")


def _in_record_dir(record: str, write: str) -> str:
    """``write`` into a file beside the node's stage record ``record``, its directory made, the file 0600; never
    failing the step it serves."""
    return f"( mkdir -p {shlex.quote(record.rsplit('/', 1)[0] or '/')} && umask 077 && {write} ) || true"


def side_by_side(*scripts: str) -> str:
    """``scripts`` at once, each in a subshell of its own, all waited for: the exit code is the last failed one's (0
    where every one succeeded), each one's messages its own. A stage round's copies (the image and the weights along
    the chain) run so: each node's weights follow its predecessor's as they land instead of waiting behind its own
    image's copy, so the chain's depth is paid once, not once per artifact.

    >>> import subprocess
    >>> subprocess.run(["sh", "-c", side_by_side("sleep 0.2; exit 3", "true")]).returncode
    3
    >>> subprocess.run(["sh", "-c", side_by_side("true", "true")]).returncode
    0
    >>> side_by_side("a")
    'a'
    """
    if len(scripts) == 1:
        return scripts[0]
    started = " ".join(f"( {script} ) & k3_p{i}=$!;" for i, script in enumerate(scripts))
    waited = " ".join(f"wait $k3_p{i} || k3_w=$?;" for i in range(len(scripts)))
    return f"( k3_w=0; {started} {waited} exit $k3_w )"


def kept_stage(record: str, directory: str) -> str:
    """Once a group's revision became current on this node (:func:`set_current`): the node's stage record ``record``
    (:func:`timed_stage`) where it is newer than the group's last mark here (``stage.seen`` in ``directory``, touched
    now): the stage ran toward this revision (an older one was an earlier revision's, or no stage ran here:
    nothing), kept in the shell variable ``k3_staged`` that :func:`keep_startup` writes into each unit's start
    record."""
    r, seen = shlex.quote(record), shlex.quote(f"{directory}/stage.seen")
    return (f"k3_staged=; if [ -f {r} ] && {{ [ ! -f {seen} ] || [ {r} -nt {seen} ]; }}; then "
            f"k3_staged=$(cat {r}); fi; touch {seen}")


def keep_startup(directory: str, number: int, units: Sequence[str]) -> str:
    """Keep each of ``units``' last start (:func:`startup_lines`, from the journal) and the time now (``K3_GATE=``:
    its group serves) in revision ``number``'s directory of a group (``startup-<unit>.log``), where this node keeps
    that revision."""
    return _keep(directory, number, units, startup_lines)


def keep_step_startup(directory: str, number: int, units: Sequence[str], group_dir: str, host: str) -> str:
    """:func:`keep_startup` of a Slurm job's units: each one's last start from this node's step output under
    ``group_dir`` (:func:`step_startup_lines`)."""
    return _keep(directory, number, units, lambda _: step_startup_lines(group_dir, host))


def _keep(directory: str, number: int, units: Sequence[str], read: Callable[[str], str]) -> str:
    d = f"{directory}/{int(number)}"
    return " && ".join(
        f"{{ [ ! -d {shlex.quote(d)} ] || {{ umask 077; {{ {read(u)}; [ -z \"${{k3_staged:-}}\" ] || "
        f"printf '%s\\n' \"$k3_staged\"; echo \"{GATE}$(date +%s.%N)\"; }} "
        f"> {shlex.quote(d + '/' + STARTUP_FILE.format(unit=u))}; }}; }}" for u in units)


def unit_logs(unit: str, container: str, docker: str, lines: int) -> str:
    """The last ``lines`` of a unit's journal and of its container's log, each after a marker line (for support
    bundles)."""
    return (f"echo K3_LOG=journal; journalctl -u {shlex.quote(unit)} -n {int(lines)} --no-pager -o short-iso "
            f"2>&1; echo K3_LOG=container; {shlex.quote(docker)} logs --tail {int(lines)} {shlex.quote(container)} "
            "2>&1; true")


def smoke_test(endpoint: str, model: str, env_file: str | None = None) -> str:
    """One short chat completion through ``endpoint`` as ``model``; prints the answer, fails without one. With
    ``env_file`` (a unit's env file on this host) the request carries the API key it holds, and an answer of 401 or
    403 says that the key is the cause."""
    url = endpoint.rstrip("/") + "/v1/chat/completions"
    parse = ("import json,sys; t=sys.stdin.read(); d=json.loads(t) if t.lstrip().startswith('{') else {}; "
             "c=d.get('choices') if isinstance(d, dict) else None; "
             "print(c[0]['message']['content']) if c else sys.exit('no chat completion in the answer: ' + t[:200])")
    if env_file is None:
        return (f"curl -sS -m 120 -H 'Content-Type: application/json' -d {shlex.quote(chat_body(model))} "
                f"{shlex.quote(url)} | python3 -c {shlex.quote(parse)}")
    refused, missing = (f"POST {url} -> 401 Unauthorized: " + m.format(env=env_file) for m in (KEY_REFUSED,
                                                                                             KEY_MISSING))
    keyed = (f"import json,sys; t=sys.stdin.read(); d=json.loads(t) if t.lstrip().startswith('{{') else {{}}; "
             "c=d.get('choices') if isinstance(d, dict) else None; "
             "e=d.get('error') if isinstance(d, dict) else None; "
             f"sys.exit({refused!r} if sys.argv[1] else {missing!r}) if e == 'Unauthorized' else None; "
             "print(c[0]['message']['content']) if c else sys.exit('no chat completion in the answer: ' + t[:200])")
    return (f"{read_key(env_file)}; {BEARER}curl -sS -m 120 -H @- -H 'Content-Type: application/json' "
            f"-d {shlex.quote(chat_body(model))} {shlex.quote(url)} | python3 -c {shlex.quote(keyed)} "
            "\"${k3_key:+sent}\"")


# ------------------------------------------------------------------------------------------- virtual address


def keepalived_apply(staged: str, conf: str, unit: str) -> str:
    """Check keepalived's next configuration ``staged`` with ``keepalived -t`` (a refused one is removed and fails
    the host, the live one left as it was), move it onto ``conf``, enable ``unit`` and reload it (start it when it
    is not running).

        >>> keepalived_apply("/etc/keepalived/keepalived.conf.next", "/etc/keepalived/keepalived.conf",
        ...                  "keepalived.service").split("; ")[0]
        'if ! keepalived -t -f /etc/keepalived/keepalived.conf.next >/dev/null 2>&1'
    """
    s, c, u = shlex.quote(staged), shlex.quote(conf), shlex.quote(unit)
    refused = shlex.quote(f"keepalived -t refused the configuration {staged}; the running one is kept: ")
    return (f"if ! keepalived -t -f {s} >/dev/null 2>&1; then echo {refused}\"$(keepalived -t -f {s} 2>&1 | "
            f"tail -3 | tr '\\n' ' ')\" >&2; rm -f {s}; exit 1; fi; mv -f {s} {c}; systemctl enable --quiet {u}; "
            f"systemctl reload-or-restart {u}")


def wait_vip(endpoint: str, vip: str, timeout: int, interval: float = 1.0) -> str:
    """Wait, on the host that must hold it, until the virtual address ``vip`` is on one of its interfaces and
    ``endpoint`` (on that address) answers ``/health``: keepalived took it (VRRP) once the host's own check passed."""
    health = shlex.quote(endpoint.rstrip("/") + "/health")
    late = shlex.quote(f"the virtual address {vip} is not held by this host or {endpoint}/health does not answer "
                       f"after {int(timeout)}s (required: keepalived here in MASTER state; see journalctl -u "
                       "keepalived)")
    held = f"ip -o -4 addr show | grep -qF {shlex.quote(f' {vip}/')}"
    return (f"end=$(( $(date +%s) + {int(timeout)} )); "
            f"until {held} && curl -sf -o /dev/null -m 2 {health}; do "
            f"if [ $(date +%s) -ge $end ]; then echo {late} >&2; exit 1; fi; sleep {float(interval):g}; done; "
            f"echo {shlex.quote(f'{vip} held here; {endpoint}/health answers')}")


# ------------------------------------------------------------------------------------------- revisions


#: a line of a revision's start record in :func:`list_revisions` (``K3_STARTUP=<unit> <line>``)
STARTUP_MARK = "K3_STARTUP="


def list_revisions(directory: str) -> str:
    """The group's current revision and every revision's ``meta.json`` and the files its directory holds (parsed by
    :func:`k3deploy.model.revisions.parse_listing`), with its SLO figures and its last benchmark where kept; where a
    ``meta.json`` does not end as a whole record does (cut short), the sha256 of each file of its directory too
    (``K3_SUMS=``: whether it can be written again); and each unit's start recorded there (:func:`keep_startup`), a
    ``K3_STARTUP=<unit> <line>`` line each."""
    d = shlex.quote(directory)
    return (f"echo \"K3_CURRENT=$(cat {d}/current 2>/dev/null)\"; for m in {d}/*/meta.json; do "
            f"[ -f \"$m\" ] || continue; echo \"K3_META=$m\"; cat \"$m\"; echo; "
            f"echo \"K3_KEPT=$(ls -A \"${{m%/meta.json}}\" | tr '\\n' ' ')\"; "
            f"[ \"$(tail -n 1 \"$m\")\" = '}}' ] || echo \"K3_SUMS=$(cd \"${{m%/meta.json}}\" && sha256sum -- * "
            f"| tr '\\n' ' ')\"; f=\"${{m%/meta.json}}/{FIGURES_FILE}\"; "
            f"[ ! -f \"$f\" ] || printf '%s\\n' \"K3_SLO=$(tr -d '\\n' < \"$f\")\"; "
            f"b=\"${{m%/meta.json}}/{BENCH_FILE}\"; "
            f"[ ! -f \"$b\" ] || printf '%s\\n' \"K3_BENCH=$(tr -d '\\n' < \"$b\")\"; "
            f"for s in \"${{m%/meta.json}}\"/startup-*.log; do [ -f \"$s\" ] || continue; n=${{s##*/startup-}}; "
            f"awk -v n=\"${{n%.log}}\" '{{print \"{STARTUP_MARK}\" n \" \" $0}}' \"$s\"; done; done")


def record_revision(directory: str, number: int, files: Sequence[tuple[str, str]], meta: str) -> str:
    """Keep revision ``number`` of a group: ``files`` are ``(source, name)`` pairs, each copied to ``name`` in the
    revision's directory (the unit and env files the restart puts in place: the staged file where it changes, else
    the live one), and ``meta``. It becomes the current revision only once the group serves (:func:`set_current`)."""
    d = shlex.quote(f"{directory}/{number}")
    tag = "K3_EOF"
    while tag in meta.splitlines():
        tag += "_"
    copies = " && ".join(f"cp -p {shlex.quote(src)} {d}/{shlex.quote(name)}" for src, name in files)
    return (f"umask 077 && install -d -m 0700 {shlex.quote(directory)} {d} && {copies} && "
            f"install -m 0600 /dev/stdin {d}/meta.json <<'{tag}'\n{meta}{tag}")


def rewrite_record(directory: str, number: int, meta: str) -> str:
    """Write revision ``number``'s record (``meta.json``) again where this node's copy was cut short: ``meta`` is the
    record the group's other nodes keep (the revision's files on this node hash to what it says)."""
    d = shlex.quote(f"{directory}/{int(number)}")
    tag = "K3_EOF"
    while tag in meta.splitlines():
        tag += "_"
    return f"umask 077 && [ -d {d} ] && install -m 0600 /dev/stdin {d}/meta.json <<'{tag}'\n{meta}{tag}"


def then(*scripts: str) -> str:
    r"""One script running ``scripts`` one after the other, each only once the one before it succeeded (else the
    script ends with that one's status); a script may end with a here-document, whose end tag stands alone on its
    line. Empty scripts are left out.

    >>> print(then("cat > /tmp/x <<'E'\nhi\nE", "", "echo done"))
    { cat > /tmp/x <<'E'
    hi
    E
    } || exit
    echo done
    >>> then("", "echo done")
    'echo done'
    """
    *first, last = [s for s in scripts if s] or [""]
    return "".join(f"{{ {s}\n}} || exit\n" for s in first) + last


def staged_path(live: str, config_dir: str) -> str:
    """Where the configure phase writes the next version of the live file ``live`` (a unit or env file): beside
    the live files, in ``<k3_config_dir>/next/``, under the live file's own name. The restart step moves it into
    place (:func:`swap_in`), so what runs is always what a revision recorded.

    >>> staged_path("/etc/systemd/system/k3-engine.service", "/etc/k3deploy")
    '/etc/k3deploy/next/k3-engine.service'
    """
    return f"{config_dir.rstrip('/')}/next/{live.rsplit('/', 1)[-1]}"


def swap_in(pairs: Sequence[tuple[str, str]]) -> str:
    """Move each staged file onto its live path (``(staged, live)`` pairs; a rename on one filesystem: a reader sees
    the old file or the new one, never a mix). A staged file that is missing fails the step: nothing is half-swapped
    on this host (every file is checked before the first one moves)."""
    return _all_then_each(pairs, "mv -f", "the staged files of this change are missing (a run that stopped "
                                          "before this step removed them?)")


def _all_then_each(pairs: Sequence[tuple[str, str]], verb: str, missing: str) -> str:
    """``verb SOURCE DEST`` for each ``(source, dest)`` pair, once every source is there (else ``missing`` on
    stderr and exit 1: nothing is half done)."""
    if not pairs:
        return ""
    check = " && ".join(f"[ -f {shlex.quote(src)} ]" for src, _ in pairs)
    each = " && ".join(f"{verb} {shlex.quote(src)} {shlex.quote(dest)}" for src, dest in pairs)
    return f"{{ {check} || {{ echo {shlex.quote(missing)} >&2; exit 1; }}; }} && {each}"


#: the file in a revision's directory that says the group served it (a revision is recorded before its restart)
SERVED = "served"


def set_current(directory: str, number: int) -> str:
    """Make revision ``number`` the current one, once the group serves it (or after a rollback to it), and mark it
    as served."""
    kept = shlex.quote(f"{directory}/{int(number)}")
    return (f"echo {int(number)} > {shlex.quote(directory + '/current')} && "
            f"{{ [ ! -d {kept} ] || touch {kept}/{SERVED}; }}")


# ---------------------------------------------------------------------------------------------- lock

#: the deployment lock's file name in ``k3_config_dir``: one line of JSON naming the run that holds it
LOCK_FILE = "deploy.lock"
LOCK_MARK = "K3_LOCK="


def lock_take(config_dir: str, record: str) -> str:
    """Take the deployment lock on this node: the file is created whole under a private name, then linked to
    ``LOCK_FILE`` (``ln`` fails when the lock exists: two runs cannot both take it). Prints ``K3_LOCK=taken``, or
    ``K3_LOCK=held`` and the holder's record."""
    d = shlex.quote(config_dir.rstrip("/") or "/")
    lock = shlex.quote(f"{config_dir.rstrip('/')}/{LOCK_FILE}")
    private = _mktemp(f"{config_dir.rstrip('/')}/.{LOCK_FILE}.")
    return (f"umask 077 && mkdir -p {d} && t=$({private}) && "
            f"printf '%s\\n' {shlex.quote(record)} > \"$t\" && "
            f"if ln \"$t\" {lock} 2>/dev/null; then rm -f \"$t\"; echo {LOCK_MARK}taken; "
            f"else rm -f \"$t\"; echo {LOCK_MARK}held; {_lock_shown(lock)}; fi")


#: the line after a lock's record: how many seconds ago its holder last renewed it, by this node's clock
LOCK_AGE_MARK = "K3_LOCK_AGE="


def _lock_shown(lock: str) -> str:
    """The lock file (quoted path) and, on a line of its own, the seconds since its holder last renewed it (the
    file's modification time against the node's own clock: no two machines' clocks are compared)."""
    return (f"cat {lock} 2>/dev/null && echo {LOCK_AGE_MARK}$(( $(date +%s) - $(stat -c %Y {lock} 2>/dev/null "
            "|| date +%s) ))")


def lock_read(config_dir: str) -> str:
    """The holder's record of the deployment lock on this node and the age of its lease (nothing when it is free)."""
    return f"{_lock_shown(shlex.quote(config_dir.rstrip('/') + '/' + LOCK_FILE))}; true"


def lock_renew(config_dir: str, run: str) -> str:
    """Renew run ``run``'s lease of the deployment lock on this node: the file's modification time becomes now, if
    that run holds it (another run's lock is left alone)."""
    lock = shlex.quote(f"{config_dir.rstrip('/')}/{LOCK_FILE}")
    mark = shlex.quote(f'"run": {json.dumps(run)}')
    return f"if grep -qF {mark} {lock} 2>/dev/null; then touch -c {lock}; fi; true"


def lock_release(config_dir: str, run: str) -> str:
    """Remove the deployment lock on this node if run ``run`` holds it (another run's lock is left alone), and the
    configuration directory when the lock was all it held (a run refused before it changed anything leaves the
    node as it found it)."""
    d = shlex.quote(config_dir.rstrip("/") or "/")
    lock = shlex.quote(f"{config_dir.rstrip('/')}/{LOCK_FILE}")
    mark = shlex.quote(f'"run": {json.dumps(run)}')
    return f"if grep -qF {mark} {lock} 2>/dev/null; then rm -f {lock}; rmdir {d} 2>/dev/null; fi; true"


# ---------------------------------------------------------------------------------------------- spares

#: the line before each spare record :func:`spare_records_read` prints (the file's name follows)
SPARE_MARK = "K3_SPARE_FILE="


def spare_records_read(config_dir: str, names: Sequence[str]) -> str:
    """The spare records this node keeps (:mod:`k3deploy.model.spares`): for each of ``names`` there, a
    ``K3_SPARE_FILE=<name>`` line and the file.

    >>> print(spare_records_read("/etc/k3", ["quarantine"]))
    for f in quarantine; do [ -f /etc/k3/"$f" ] && { echo K3_SPARE_FILE="$f"; cat /etc/k3/"$f"; echo; }; done; true
    """
    d = shlex.quote(config_dir.rstrip("/") or "/")
    return (f"for f in {' '.join(shlex.quote(n) for n in names)}; do [ -f {d}/\"$f\" ] && "
            f"{{ echo {SPARE_MARK}\"$f\"; cat {d}/\"$f\"; echo; }}; done; true")


def stand_down(units: Sequence[str]) -> str:
    """A node that runs nothing now (quarantined, or lost and replaced by a spare): its units stopped and disabled,
    so that a boot does not start them again.

    >>> stand_down(["k3-engine.service"])
    'systemctl disable --now k3-engine.service && { systemctl reset-failed k3-engine.service 2>/dev/null || true; }'
    """
    names = _units(units)
    return f"systemctl disable --now {names} && {{ systemctl reset-failed {names} 2>/dev/null || true; }}"


def release_quarantine(config_dir: str, quarantine: str, released: str, released_text: str) -> str:
    """The operator's release of a quarantined node: the events it was quarantined for are kept as released (they
    do not quarantine it again), then the quarantine record goes; the node is a spare from then on."""
    d = config_dir.rstrip("/") or "/"
    tag = "K3_EOF"
    while tag in released_text.splitlines():
        tag += "_"
    return (f"umask 022 && install -d {shlex.quote(d)} && "
            f"install -m 0644 /dev/stdin {shlex.quote(d + '/' + released)} <<'{tag}' && "
            f"rm -f {shlex.quote(d + '/' + quarantine)}\n{released_text}{tag}")


# ---------------------------------------------------------------------------------------------- SLO gate

#: the node-side clients' API key: read by the client itself from the unit's env file (``a["env_file"]``, in no
#: argv), the request headers that carry it
_API_KEY = r"""key = ""
if a.get("env_file"):
    try:
        with open(a["env_file"]) as f:
            for x in f:
                if x.startswith("VLLM_API_KEY="):
                    key = x.rstrip("\n").split("=", 1)[1]
    except OSError:
        pass
auth = {"Authorization": "Bearer " + key} if key else {}
"""

#: the probe load's client (python3 on the node, as the smoke test's): each engine's ``/metrics`` (the gate's families
#: only) before; the requests, ``concurrency`` at a time, each a streamed completion whose time to its first token the
#: client notes; ``/metrics`` after, once the engines counted the finished requests (5 s at most); one line of JSON
_PROBE = r"""
import json, sys, threading, time, urllib.error, urllib.request
a = json.loads(sys.argv[1])
""" + _API_KEY + r"""def metrics(u):
    try:
        with urllib.request.urlopen(u + "/metrics", timeout=10) as r:
            t = r.read().decode("utf-8", "replace")
    except Exception:
        return ""
    return "\n".join(x for x in t.splitlines() if x.startswith(tuple(a["families"])))
def finished(texts):
    return sum(float(x.split()[-1]) for t in texts for x in t.splitlines() if x.startswith(a["families"][-1] + "{"))
body = json.dumps({"model": a["model"], "prompt": " ".join(["hello"] * a["prompt"]), "max_tokens": a["output"],
                   "ignore_eos": True, "stream": True}).encode()
def one():
    t0, first, done = time.monotonic(), None, False
    try:
        q = urllib.request.Request(a["url"] + "/v1/completions", data=body,
                                   headers={"Content-Type": "application/json", **auth})
        with urllib.request.urlopen(q, timeout=a["timeout"]) as r:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                c = json.loads(data).get("choices") or [{}]
                if first is None and c[0].get("text"):
                    first = time.monotonic() - t0
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return {"ok": False, "error": f"{e.code}: " + (a["refused"] if key else a["missing"])}
        return {"ok": False, "error": str(e)[:200]}
    except Exception as e:
        return {"ok": False, "error": str(e)[:200]}
    if not done or first is None:
        return {"ok": False, "error": "the stream ended before its last event"}
    return {"ok": True, "ttft": first}
todo, results, lock = list(range(a["requests"])), [], threading.Lock()
def work():
    while True:
        with lock:
            if not todo:
                return
            todo.pop()
        r = one()
        with lock:
            results.append(r)
before = {u: metrics(u) for u in a["metrics"]}
threads = [threading.Thread(target=work) for _ in range(a["concurrency"])]
for t in threads:
    t.start()
for t in threads:
    t.join()
ok, end = sum(1 for r in results if r["ok"]), time.monotonic() + 5
while True:
    after = {u: metrics(u) for u in a["metrics"]}
    if finished(after.values()) - finished(before.values()) >= ok or time.monotonic() > end:
        break
    time.sleep(0.2)
print("K3_SLO=" + json.dumps({"before": before, "after": after, "results": results}))
"""


def slo_probe(url: str, metrics: Sequence[str], model: str, requests: int, concurrency: int, prompt_tokens: int,
              output_tokens: int, timeout: int = 300, env_file: str | None = None) -> str:
    """The SLO gate's probe load on one group, from one of its nodes (python3, as :func:`smoke_test`): ``requests``
    streamed completions through ``url`` (the group's own endpoint), ``concurrency`` at a time, each a prompt of
    ``prompt_tokens`` words and exactly ``output_tokens`` tokens out (``ignore_eos``); the time to each one's first
    token as the client saw it; the ``/metrics`` of each of the group's serving engines (``metrics``) before and
    after. Prints one line, ``K3_SLO={json}`` (read by :func:`k3deploy.model.slo.parse_probe`). With ``env_file`` (a
    unit's env file on this node) every request carries the API key it holds (read by the client itself: the key is
    in no argv); a 401 or 403 is a failed request that names the key.

    >>> text = slo_probe("http://10.0.0.1:8000", ["http://10.0.0.1:8000"], "kimi-k3", 20, 4, 256, 64)
    >>> text.startswith("python3 -c ") and '"concurrency": 4' in text
    True
    """
    args = {"url": url.rstrip("/"), "metrics": [m.rstrip("/") for m in metrics], "model": model,
            "requests": int(requests), "concurrency": int(concurrency), "prompt": int(prompt_tokens),
            "output": int(output_tokens), "timeout": int(timeout), "families": list(FAMILIES)}
    if env_file is not None:
        args.update(env_file=env_file, refused=KEY_REFUSED.format(env=env_file),
                    missing=KEY_MISSING.format(env=env_file))
    return f"python3 -c {shlex.quote(_PROBE.strip())} {shlex.quote(json.dumps(args))}"


def restore_files(pairs: Sequence[tuple[str, str]]) -> str:
    """Put a recorded revision's files back in place (``(kept, live)`` pairs: the copy in the revision's directory,
    the live path), each with the mode it was kept with; every kept file is checked before the first one is copied.

    >>> restore_files([("/etc/k3deploy/revisions/engine-r0/3/k3-engine.env", "/etc/k3deploy/k3-engine.env")])
    '{ [ -f /etc/k3deploy/revisions/engine-r0/3/k3-engine.env ] || { echo ... exit 1; }; } && cp -p ...'
    """
    return _all_then_each(pairs, "cp -p", "the previous revision's files are missing on this node: it cannot go "
                                          "back to them")


def record_figures(directory: str, number: int, record: str) -> str:
    """Keep the SLO gate's record (:func:`k3deploy.model.slo.figures_record`, one line of JSON) in revision
    ``number``'s directory of a group (``slo.json``), where this node keeps that revision."""
    d = shlex.quote(f"{directory}/{int(number)}")
    return f"[ ! -d {d} ] || printf '%s\\n' {shlex.quote(record)} > {d}/{FIGURES_FILE}"


# ---------------------------------------------------------------------------------------------- correctness probe

#: the correctness probe's client (python3 on the node, as the smoke test's): each question once, one line of JSON
_ANSWERS = r"""
import json, sys, urllib.error, urllib.request
a = json.loads(sys.argv[1])
""" + _API_KEY + r"""out = []
for body in a["bodies"]:
    r = {"prompt": body["messages"][0]["content"]}
    try:
        q = urllib.request.Request(a["url"] + "/v1/chat/completions", data=json.dumps(body).encode(),
                                   headers={"Content-Type": "application/json", **auth})
        with urllib.request.urlopen(q, timeout=a["timeout"]) as resp:
            r["answer"] = json.loads(resp.read())["choices"][0]["message"]["content"] or ""
    except urllib.error.HTTPError as e:
        r["error"] = f"HTTP {e.code}"
    except Exception as e:
        r["error"] = str(e)[:200]
    out.append(r)
print("K3_ANSWERS=" + json.dumps(out))
"""


def correctness_probe(url: str, model: str, timeout: int = 60, env_file: str | None = None) -> str:
    """The correctness probe (:mod:`k3deploy.model.correctness`) from one node: each fixed question once through
    ``url`` as ``model``, greedily; prints one line ``K3_ANSWERS={json}`` (read by
    :func:`k3deploy.model.correctness.parse`). With ``env_file`` (a unit's env file on this node) every request
    carries the API key it holds, read by the client itself (the key is in no argv).

    >>> text = correctness_probe("http://10.0.0.1:8000", "kimi-k3")
    >>> text.startswith("python3 -c ") and '"temperature": 0' in text
    True
    """
    args = {"url": url.rstrip("/"), "timeout": int(timeout), "env_file": env_file,
            "bodies": [request_body(model, q.prompt) for q in PROMPTS]}
    return f"python3 -c {shlex.quote(_ANSWERS.strip())} {shlex.quote(json.dumps(args))}"


# ---------------------------------------------------------------------------------------------- benchmark

#: the benchmark's driver, run by the engine image's python3: vLLM's own ``vllm bench serve`` (its parser and its
#: ``main``, vllm/benchmarks/serve.py), once per concurrency of the sweep in one process (the client's imports once);
#: the engines' API key, where the env file holds one, as the client's OPENAI_API_KEY (never in an argv)
_BENCH = r"""
import json, os, sys
a = json.loads(sys.argv[1])
for line in (open(sys.argv[2]).read().splitlines() if len(sys.argv) > 2 else []):
    if line and not line.startswith("#") and "=" in line:
        os.environ.setdefault(*line.split("=", 1))
if os.environ.get("VLLM_API_KEY") and not os.environ.get("OPENAI_API_KEY"):
    os.environ["OPENAI_API_KEY"] = os.environ["VLLM_API_KEY"]
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
for c in a["concurrency"]:
    args = parser.parse_args(a["args"] + ["--max-concurrency", str(c), "--num-prompts", str(c * a["rounds"])])
    try:
        r = main(args)
    except Exception as e:
        print("K3_BENCH=" + json.dumps({"concurrency": c, "error": (type(e).__name__ + ": " + str(e))[:300]}))
        sys.exit(1)
    print("K3_BENCH=" + json.dumps({"concurrency": c, "result": {k: v for k, v in r.items()
                                                                if isinstance(v, (int, float, str)) or v is None}}))
    sys.stdout.flush()
"""


def bench_serve(docker: str, image: str, cache_dir: str, env_file: str, args: Sequence[str],
                concurrency: Sequence[int], rounds: int) -> str:
    """The benchmark (:mod:`k3deploy.model.bench`) from one node: a container of the engines' ``image`` on the host
    network, the model cache mounted as the engines mount it, the unit's env file (the API key where it holds one),
    offline, running ``vllm bench serve`` with ``args`` once per ``concurrency`` (``rounds`` requests per unit of
    it); prints one ``K3_BENCH={json}`` line per run.

    >>> text = bench_serve("/usr/bin/docker", "img@sha256:ab", "/var/lib/k3", "/etc/k3deploy/k3-engine.env",
    ...                    ["--backend", "vllm"], [4, 16], 5)
    >>> text.split(" -c ")[0]
    '/usr/bin/docker run --rm --network host --env-file /etc/k3deploy/k3-engine.env -e HF_HUB_OFFLINE=1 -v \
/var/lib/k3:/root/.cache --entrypoint python3 img@sha256:ab'
    """
    argv = [docker, "run", "--rm", "--network", "host", "--env-file", env_file, "-e", "HF_HUB_OFFLINE=1",
            "-v", f"{cache_dir}:{CONTAINER_CACHE}", "--entrypoint", "python3", image]
    return bench_with(argv, args, concurrency, rounds)


def bench_with(python: Sequence[str], args: Sequence[str], concurrency: Sequence[int], rounds: int,
               env_file: str | None = None) -> str:
    """The benchmark of :func:`bench_serve` run by ``python``: the argv that runs ``python3`` in a container of the
    engines' image on the host network, the model cache at ``~/.cache`` (docker's, or a Slurm site's runtime from
    its staged file: :meth:`k3deploy.runtime.launchers.Launcher.bench_command`); ``env_file``: the unit's env file,
    which the client reads in the container itself (mounted there at its own path: the API key in no argv), where
    the runtime is not handed it as docker's ``--env-file``.

        >>> bench_with(["enroot", "start", "i.sqsh", "python3"], [], [1], 1, "/etc/k3/e.env").split(" ")[-1]
        '/etc/k3/e.env'
    """
    spec = {"args": list(args), "concurrency": [int(c) for c in concurrency], "rounds": int(rounds)}
    return (f"{shlex.join(python)} -c {shlex.quote(_BENCH.strip())} {shlex.quote(json.dumps(spec))}"
            + (f" {shlex.quote(env_file)}" if env_file else ""))


def record_bench(directory: str, number: int, record: str) -> str:
    """Keep a benchmark's record (:class:`k3deploy.model.bench.Record`, one line of JSON) in revision ``number``'s
    directory of a group (``bench.json``, the last one), where this node keeps that revision."""
    d = shlex.quote(f"{directory}/{int(number)}")
    return f"[ ! -d {d} ] || printf '%s\\n' {shlex.quote(record)} > {d}/{BENCH_FILE}"
