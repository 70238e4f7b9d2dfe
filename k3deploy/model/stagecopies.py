"""What each stage step copies onto its host, for the progress shown while it runs: per copy its name, where its
bytes land on the receiving node, and where its whole size is known (a peer that holds it whole, or the control
machine's copy). Pure: from the stage's plan (:class:`~k3deploy.model.staging.StagePlan`) and a step of it
(:func:`k3deploy.model.steps.stage`); :mod:`k3deploy.runtime.stageprogress` measures the bytes while the step runs.

What is measured, per kind of step:

- a copy from a peer (the chain's relay or the tree's receive, a round of the stage): the image archive in
  ``k3_stage_dir`` (or the runtime's image file), the weights' blobs in the model's cache directory, each against
  the bytes of the same paths on the holder the chain starts from (it holds the artifact whole before the round);
- the compile caches from a peer of the class: the key's directory, against the sender's;
- the weights from the hub: the model's blobs (the hub CLI's ``*.incomplete`` files included), against the sizes
  in the hub's own index of the revision, read once by the downloading node itself
  (:func:`k3deploy.model.commands.hub_index`: its endpoint, proxy and token; :func:`hub_total`); no answer (an
  air-gapped site, the hub down, a refused token): no total, the download goes on;
- the image file made from the registry (a Slurm site's pyxis/apptainer file): the file being written;
- a copy from the control machine (an air-gapped site's archive or weights): the destination, against the control
  machine's copy.

- the image from the registry (``docker pull``): the daemon's own files, whichever its image store, against the
  registry's manifest of the image read once by the pulling node (:func:`image_layers`,
  :func:`k3deploy.model.commands.pulled_bytes`). ``docker pull`` itself prints no bytes off a terminal (the CLI's
  ``pkg/jsonmessage/jsonmessage.go`` drops a progress message there: "disable progressbar in non-terminal"; and the
  stage pulls with ``-q``), so its output is not read.

A file is measured with the names a copy gives it while it is not whole (``.part``, the chain's ``.k3-part``,
rsync's temporary ``.NAME.XXXXXX``), so the bytes do not drop when it is renamed whole.

Example::

    >>> c = Copied("weights", ("/c/hub/models--o--m/blobs/",), source="n1")
    >>> c.shown
    'weights from n1'
    >>> hub_total('{"siblings": [{"rfilename": "a", "size": 5, "blobId": "b1"}, '
    ...           '{"rfilename": "m.safetensors", "size": 9, "blobId": "b2", "lfs": {"size": 9, "sha256": "h"}}]}')
    14
    >>> image_layers('/var/lib/docker x86_64\\n{"Descriptor": {"platform": {"os": "linux", "architecture": "amd64"}}, '
    ...              '"OCIManifest": {"layers": [{"digest": "sha256:ab", "size": 7}]}}')
    ('/var/lib/docker', (('ab', 7),))
    >>> commands.file_names("/s/images/i.sqsh")
    ('i.sqsh', 'i.sqsh.part', 'i.sqsh.k3-part', '.i.sqsh.*')
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from k3deploy.model import commands, compilecache
from k3deploy.model.staging import ARCHIVE, OUTSIDE, Artifact, StagePlan

if TYPE_CHECKING:
    from k3deploy.model.rollout import Placement
    from k3deploy.model.steps import Step


@dataclass(frozen=True)
class Index:
    """A command the receiving host runs once, before it measures a download, that prints its source's own index of
    it: the hub's (``kind`` ``"hub"``: its total, :func:`hub_total`) or the registry's manifest of an image
    (``"image"``: its total and the layers the daemon's files are measured by, :func:`image_layers`)."""

    command: str
    kind: Literal["hub", "image"]


@dataclass(frozen=True)
class Copied:
    """One copy a stage step makes on its host: ``what`` it is (for people), the ``paths`` its bytes land at (a
    directory ends with ``/``: every file under it; a file: with its partial names,
    :func:`~k3deploy.model.commands.file_names`), ``source``: a host that holds it whole (its total is the same
    paths' bytes there), ``local``: the control machine's copy it comes from (its total is that copy's size),
    ``index``: its source's own index of it, read by the receiving host itself (:class:`Index`); none: no total
    known."""

    what: str
    paths: tuple[str, ...]
    source: str | None = None
    local: str | None = None
    index: Index | None = None

    @property
    def shown(self) -> str:
        return self.what + (f" from {self.source}" if self.source else
                            " from the control machine" if self.local else "")


def hub_total(answer: str) -> int | None:
    """The bytes a download of every file of a revision puts in the hub cache's ``blobs/``, from the hub's index
    of it (:func:`k3deploy.model.commands.hub_index`; the shape huggingface_hub 2.4.0 reads into ``RepoSibling``:
    each of ``siblings`` with ``size`` and ``blobId``, an LFS file with ``lfs.size`` and ``lfs.sha256``): each blob
    once (the cache keeps one blob for files of the same content, by its ETag: the sha256 of an LFS file, else its
    blob id); None where the answer is not such an index (an error page, a file without its size).

        >>> hub_total('{"siblings": [{"rfilename": "a", "size": 3, "blobId": "x"}, '
        ...           '{"rfilename": "b", "size": 3, "blobId": "x"}]}')
        3
        >>> hub_total("<html>503</html>"), hub_total('{"siblings": [{"rfilename": "a"}]}'), hub_total("{}")
        (None, None, None)
    """
    try:
        doc: Any = json.loads(answer)
    except ValueError:
        return None
    siblings = doc.get("siblings") if isinstance(doc, dict) else None
    if not isinstance(siblings, list) or not siblings:
        return None
    blobs: dict[str, int] = {}
    for i, s in enumerate(siblings):
        lfs = s.get("lfs") if isinstance(s, dict) else None
        got = lfs if isinstance(lfs, dict) else s if isinstance(s, dict) else {}
        size = got.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return None
        blobs[str(got.get("sha256") or s.get("blobId") or i)] = size
    return sum(blobs.values())


#: Go's names of the architectures ``docker info`` reports as the kernel names them (a manifest list's platforms)
GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}


def image_layers(answer: str) -> tuple[str, tuple[tuple[str, int], ...]] | None:
    """The docker data root and the layers ``(sha256 hex, size)`` of the image a node pulls, from
    :func:`k3deploy.model.commands.image_index`'s answer: a line ``ROOT ARCH``, then ``docker manifest inspect -v``'s
    ``ImageManifest`` (its ``OCIManifest`` or ``SchemaV2Manifest``), or a list of them (a multi-platform image: the
    node's platform's); None where the answer is not that.

        >>> image_layers("/d aarch64\\n[]"), image_layers("no docker")
        (None, None)
    """
    head, _, rest = answer.partition("\n")
    root, _, arch = head.strip().partition(" ")
    try:
        doc: Any = json.loads(rest)
    except ValueError:
        return None
    want = GOARCH.get(arch, arch)
    entries = doc if isinstance(doc, list) else [doc]
    for e in entries:
        if not isinstance(e, dict):
            continue
        platform = (e.get("Descriptor") or {}).get("platform") or e.get("Platform") or {}   # older CLIs: Platform
        if isinstance(doc, list) and (platform.get("os"), platform.get("architecture")) != ("linux", want):
            continue
        man = e.get("OCIManifest") or e.get("SchemaV2Manifest") or {}
        layers = man.get("layers") if isinstance(man, dict) else None
        if not root or not isinstance(layers, list) or not layers:
            return None
        try:
            return root, tuple((str(x["digest"]).split(":", 1)[1], int(x["size"])) for x in layers)
        except (KeyError, IndexError, TypeError, ValueError):
            return None
    return None


def _holder(artifact: Artifact, host: str, sender: str) -> str:
    """The host a receiver's copy of ``artifact`` can be measured against: along a chain the first of its peers
    that receives nothing itself (a holder, whole before the round), else the round's sender (the tree sends whole
    files)."""
    return next((p for p in artifact.upstream.get(host, ()) if p not in artifact.upstream), sender)


def copies(rollout: Placement, plan: StagePlan, step: Step) -> tuple[Copied, ...]:
    """What ``step`` (a step of :func:`k3deploy.model.steps.stage` of ``plan``) copies onto its host; none where it
    copies nothing measurable."""
    from k3deploy.model.steps import StagePart, token_path

    if step.kind is None or not step.applies:
        return ()
    v = rollout.vars
    h, part = step.host, step.kind.part
    image_ref = rollout.plan.image
    weights_dir = commands.model_dir(v.k3_model_cache, rollout.plan.model)
    blobs = weights_dir + "/blobs/"
    image_at = plan.image_file or commands.archive_path(v.k3_stage_dir, image_ref)
    image_what = "image file" if plan.image_file else "image"
    if part is StagePart.PULL and plan.image_file and plan.image.fetch.get(h) == OUTSIDE:
        return (Copied("image file", (plan.image_file,)),)
    if part is StagePart.PULL and plan.image.fetch.get(h) == OUTSIDE:
        return (Copied("image", (), index=Index(commands.image_index(v.k3_docker, image_ref), "image")),)
    if part is StagePart.ARCHIVE_COPY and plan.image.fetch.get(h) == ARCHIVE:
        return (Copied("image archive", (commands.archive_path(v.k3_stage_dir, image_ref),),
                       local=v.k3_image_archive),)
    if part is StagePart.HUB:
        return (Copied("weights", (blobs,), index=Index(commands.hub_index(
            v.k3_hf_endpoint, rollout.plan.model, token_file=token_path(rollout)), "hub")),)
    if part is StagePart.WEIGHTS_COPY and v.k3_weights_source:
        return (Copied("weights", (weights_dir + "/",), local=v.k3_weights_source.rstrip("/") + "/"),)
    if part is StagePart.ROUND:
        from_image, from_weights = plan.round_of(step.kind.round, h)
        out: list[Copied] = []
        if from_image:
            out.append(Copied(image_what, (image_at,), source=_holder(plan.image, h, from_image)))
        if from_weights:
            out.append(Copied("weights", (blobs,), source=_holder(plan.weights, h, from_weights)))
        return tuple(out)
    if part is StagePart.CACHES:
        return tuple(Copied(f"compile caches {c.key[:12]}", (compilecache.host_dir(v.k3_model_cache, c.key) + "/",),
                            source=c.sends[h]) for c in plan.caches if h in c.sends)
    return ()
