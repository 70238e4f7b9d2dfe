"""One build per rollout: a mutable tag is resolved to its registry digest once, and every node runs that digest.

A tag (``vllm/vllm-openai:kimi-k3``) names whatever build was pushed last, and ``docker`` pulls it only where it is
missing: after a re-push, or on a replaced node, the nodes of one group would run different builds. So the rollout
asks the registry once, from the first engine node (``docker buildx imagetools inspect``: a manifest ``HEAD``,
nothing is downloaded), for the digest the tag names now, and pins the image to ``REPO@sha256:...``: the stage
fetches and hands on exactly that build (verified by its digest where it is pulled, by its image id where it is
loaded), the units run it by a local tag named after the digest (:func:`run_ref`), and the revision records it, so
a rollback goes back to the very build. A re-push of the tag is then a change of
every unit of the group: the next rollout stages the new build and restarts the whole group together.

Pure: :mod:`k3deploy.runtime.gather` reads the registry's answer and the nodes' images as facts.

Example::

    >>> split("vllm/vllm-openai:kimi-k3")
    ('vllm/vllm-openai', 'kimi-k3', None)
    >>> pin("vllm/vllm-openai:kimi-k3", "sha256:" + "ab" * 32)[:36]
    'vllm/vllm-openai@sha256:abababababab'
    >>> parse_imagetools(["Name:      docker.io/vllm/vllm-openai:kimi-k3",
    ...                   "MediaType: application/vnd.oci.image.manifest.v1+json",
    ...                   "Digest:    sha256:" + "0" * 64]) == "sha256:" + "0" * 64
    True
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def split(image: str) -> tuple[str, str | None, str | None]:
    """``REPO[:TAG][@sha256:...]`` -> (repository, tag or None, digest or None); a bare repository has tag
    ``latest``, as docker reads it."""
    rest, _, digest = image.partition("@")
    last = rest.rsplit("/", 1)[-1]
    tag = None
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
    if tag is None and not digest:
        tag = "latest"
    return rest, tag, digest or None


def is_pinned(image: str) -> bool:
    return "@sha256:" in image


def pin(image: str, digest: str) -> str:
    """The reference of the build ``digest`` of ``image``'s repository: ``REPO@sha256:...``."""
    if not DIGEST.fullmatch(digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return f"{split(image)[0]}@{digest}"


def digest_of(image: str) -> str | None:
    return split(image)[2]


#: the local tag that names a pinned build on a node: ``REPO:k3-sha256-<hex>``
RUN_TAG_PREFIX = "k3-sha256-"


def run_ref(image: str) -> str:
    """What the units run for ``image``: a pinned build by a local tag named after its digest
    (``REPO:k3-sha256-<hex>``), else ``image`` itself.

    Not ``REPO@sha256:...``: docker finds an image by that reference only through its RepoDigests, which a node that
    got the build by ``docker load`` (the fan-out, an air-gapped archive) lacks with the classic image store (still
    the default of Docker Engine up to 28: moby#22011), so ``docker run`` would pull it again over the uplink (or
    fail, offline). A local tag survives ``docker save``/``docker load`` with either store, is never moved by a
    re-push upstream (no registry has it), and carries the digest into the unit, so a new build is a change.

        >>> run_ref("vllm/vllm-openai@sha256:" + "ab" * 32)[:35]
        'vllm/vllm-openai:k3-sha256-abababab'
        >>> shown(run_ref("r:t@sha256:" + "0" * 64)) == "r@sha256:" + "0" * 64
        True
    """
    repo, _, digest = split(image)
    return f"{repo}:{RUN_TAG_PREFIX}{digest.split(':', 1)[1]}" if digest else image


#: hex digits of a digest a table shows (as docker shows image ids), then an ellipsis
SHORT_DIGEST = 12


def shown(ref: str | None, short: bool = False) -> str | None:
    """A reference as every command writes it for people: a pinned build as ``REPO@sha256:DIGEST`` (its local tag
    :func:`run_ref` too), a tag as it is. ``short`` (a table's cell): the digest's first 12 hex digits and ``…``.

    >>> pinned = "vllm/vllm-openai@sha256:" + "ab" * 32
    >>> shown(run_ref(pinned)) == shown(pinned) == pinned
    True
    >>> shown(run_ref(pinned), short=True), shown("vllm/vllm-openai:kimi-k3", short=True)
    ('vllm/vllm-openai@sha256:abababababab…', 'vllm/vllm-openai:kimi-k3')
    """
    if ref and f":{RUN_TAG_PREFIX}" in ref:
        repo, _, tag = ref.rpartition(":")
        ref = f"{repo}@sha256:{tag[len(RUN_TAG_PREFIX):]}"
    if ref and short and "@sha256:" in ref:
        repo, _, digest = ref.partition("@sha256:")
        return f"{repo}@sha256:{digest[:SHORT_DIGEST]}…" if len(digest) > SHORT_DIGEST else ref
    return ref


def to_resolve(image: str, *, resolve: bool, archive: bool) -> bool:
    """Whether the rollout asks the registry for the digest of ``image``: a tag, resolution on
    (``k3_image_resolve``), and an image that comes from the registry (an air-gapped site's archive is the one
    source of its image: pin it with ``k3_image: REPO@sha256:...``)."""
    return resolve and not archive and not is_pinned(image)


def resolve_command(docker: str, image: str, timeout: int = 60) -> str:
    """Ask the registry for the digest ``image``'s tag names now, without pulling anything: prints ``K3_RC=<exit
    status>`` then what ``docker buildx imagetools inspect`` printed (parsed by :func:`parse_imagetools`)."""
    return (f"out=$(timeout {int(timeout)} {shlex.quote(docker)} buildx imagetools inspect {shlex.quote(image)} "
            f"2>&1); echo \"K3_RC=$?\"; printf '%s\\n' \"$out\"")


def parse_imagetools(lines: list[str]) -> str | None:
    """The ``Digest:`` of ``docker buildx imagetools inspect``'s first block (the manifest or the index the tag
    names; a multi-platform index is pinned as a whole, as ``docker pull`` records it), or None."""
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "Digest" and DIGEST.fullmatch(value.strip()):
            return value.strip()
        if key.strip() == "Manifests":
            break
    return None


@dataclass(frozen=True)
class Resolution:
    """The registry's answer for a tag: its digest, or why there is none."""

    image: str                   # the tag asked about
    host: str                    # the node that asked
    digest: str | None = None
    error: str | None = None

    @property
    def pinned(self) -> str | None:
        return pin(self.image, self.digest) if self.digest else None


def resolution(image: str, host: str, lines: list[str] | None) -> Resolution:
    """A :class:`Resolution` from the output of :func:`resolve_command` (None: the host could not run it)."""
    if not lines:
        return Resolution(image, host, error="no answer (is docker installed?)")
    rc = next((ln[len("K3_RC="):].strip() for ln in lines if ln.startswith("K3_RC=")), "")
    body = [ln for ln in lines if not ln.startswith("K3_RC=")]
    digest = parse_imagetools(body) if rc == "0" else None
    if digest:
        return Resolution(image, host, digest=digest)
    said = next((ln.strip() for ln in reversed(body) if ln.strip()), "")
    if rc == "124":
        said = "the registry did not answer within the timeout"
    return Resolution(image, host, error=said or f"docker buildx imagetools inspect exited {rc or '?'}")


@dataclass(frozen=True)
class LocalImage:
    """What a node holds of an image's repository: the repo digest of what the reference names locally (None: the
    reference is not there), the digests of its local builds (pulled ones: loaded ones may have none) and its local
    tags (the :func:`run_ref` tags of the pinned builds among them)."""

    ref_digest: str | None = None
    digests: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


def local_command(docker: str, image: str) -> str:
    """What :func:`parse_local` reads: the repo digest the reference ``image`` has locally, and the tag and digest
    of every local image of its repository (``docker image ls --digests``)."""
    d, repo = shlex.quote(docker), shlex.quote(split(image)[0])
    fmt = shlex.quote("{{index .RepoDigests 0}}")
    return (f"echo \"K3_REF=$({d} image inspect --format {fmt} {shlex.quote(image)} 2>/dev/null)\"; "
            f"{d} image ls --digests --format '{{{{.Tag}}}} {{{{.Digest}}}}' {repo} 2>/dev/null | "
            "sed 's/^/K3_HAVE=/'; true")


def parse_local(lines: list[str]) -> LocalImage:
    ref, have, tags = None, [], []
    for line in lines:
        if line.startswith("K3_REF="):
            ref = line[len("K3_REF="):].strip() or None
        elif line.startswith("K3_HAVE="):
            words = line[len("K3_HAVE="):].split()
            m = DIGEST.search(line)
            if m and m[0] not in have:
                have.append(m[0])
            if words and not words[0].startswith(("sha256:", "<none>")) and words[0] not in tags:
                tags.append(words[0])
    return LocalImage(ref, tuple(have), tuple(tags))


def holds(image: str, local: LocalImage | None) -> bool:
    """A node holds ``image``: a pinned one when a local build of the repository has its digest or its
    :func:`run_ref` tag, a tag when the tag is present locally."""
    if local is None:
        return False
    want = digest_of(image)
    if want:
        return (want in local.digests or bool(local.ref_digest and local.ref_digest.endswith(want))
                or run_ref(image).rpartition(":")[2] in local.tags)
    return local.ref_digest is not None


def named(image: str, local: LocalImage | None) -> bool:
    """The node has the :func:`run_ref` tag of a pinned ``image`` already (what the units run)."""
    return not is_pinned(image) or (local is not None and run_ref(image).rpartition(":")[2] in local.tags)
