"""What each stage step copies onto its host, for the progress shown while it runs: per copy its name, where its
bytes land on the receiving node, and where its whole size is known (a peer that holds it whole, or the control
machine's copy). Pure: from the stage's plan (:class:`~k3deploy.model.staging.StagePlan`) and a step of it
(:func:`k3deploy.model.steps.stage`); :mod:`k3deploy.runtime.stageprogress` measures the bytes while the step runs.

What is measured, per kind of step:

- a copy from a peer (the chain's relay or the tree's receive, a round of the stage): the image archive in
  ``k3_stage_dir`` (or the runtime's image file), the weights' blobs in the model's cache directory, each against
  the bytes of the same paths on the holder the chain starts from (it holds the artifact whole before the round);
- the compile caches from a peer of the class: the key's directory, against the sender's;
- the weights from the hub: the model's blobs (the hub CLI's ``*.incomplete`` files included), no total known
  before the download (the hub's index is fetched by the download itself);
- the image file made from the registry (a Slurm site's pyxis/apptainer file): the file being written;
- a copy from the control machine (an air-gapped site's archive or weights): the destination, against the control
  machine's copy.

``docker pull``'s own bytes are the daemon's (its content store's ingest files, by image store): not measured; the
pull is shown by pyinfra's operation line as before.

A file is measured with the names a copy gives it while it is not whole (``.part``, the chain's ``.k3-part``,
rsync's temporary ``.NAME.XXXXXX``), so the bytes do not drop when it is renamed whole.

Example::

    >>> c = Copied("weights", ("/c/hub/models--o--m/blobs/",), source="n1")
    >>> c.shown
    'weights from n1'
    >>> commands.file_names("/s/images/i.sqsh")
    ('i.sqsh', 'i.sqsh.part', 'i.sqsh.k3-part', '.i.sqsh.*')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from k3deploy.model import commands, compilecache
from k3deploy.model.staging import ARCHIVE, OUTSIDE, Artifact, StagePlan

if TYPE_CHECKING:
    from k3deploy.model.rollout import Placement
    from k3deploy.model.steps import Step


@dataclass(frozen=True)
class Copied:
    """One copy a stage step makes on its host: ``what`` it is (for people), the ``paths`` its bytes land at (a
    directory ends with ``/``: every file under it; a file: with its partial names,
    :func:`~k3deploy.model.commands.file_names`), ``source``: a host that holds it whole (its total is the same
    paths' bytes there), ``local``: the control machine's copy it comes from (its total is that copy's size);
    neither: no total known."""

    what: str
    paths: tuple[str, ...]
    source: str | None = None
    local: str | None = None

    @property
    def shown(self) -> str:
        return self.what + (f" from {self.source}" if self.source else
                            " from the control machine" if self.local else "")


def _holder(artifact: Artifact, host: str, sender: str) -> str:
    """The host a receiver's copy of ``artifact`` can be measured against: along a chain the first of its peers
    that receives nothing itself (a holder, whole before the round), else the round's sender (the tree sends whole
    files)."""
    return next((p for p in artifact.upstream.get(host, ()) if p not in artifact.upstream), sender)


def copies(rollout: Placement, plan: StagePlan, step: Step) -> tuple[Copied, ...]:
    """What ``step`` (a step of :func:`k3deploy.model.steps.stage` of ``plan``) copies onto its host; none where it
    copies nothing measurable."""
    from k3deploy.model.steps import StagePart

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
    if part is StagePart.ARCHIVE_COPY and plan.image.fetch.get(h) == ARCHIVE:
        return (Copied("image archive", (commands.archive_path(v.k3_stage_dir, image_ref),),
                       local=v.k3_image_archive),)
    if part is StagePart.HUB:
        return (Copied("weights", (blobs,)),)
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
