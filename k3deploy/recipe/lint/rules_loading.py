"""``plan`` rules on ``--load-format``: a loader that cannot read the Hugging Face checkpoint the tool stages, or whose
package the image does not hold.

From vLLM 0.33.0's source: the loaders are registered in ``vllm/model_executor/model_loader/__init__.py``; the
Run:ai streamer (``runai_streamer``) imports ``runai_model_streamer`` (``runai_streamer_loader.py``, extra
``vllm[runai]``), which the ``vllm-openai`` image installs (``docker/Dockerfile``: ``runai-model-streamer[s3,gcs]``)
and reads local safetensors or ``s3://``/``gs://`` objects; ``fastsafetensors`` and ``instanttensor`` import the
packages of those names (``weight_utils.py``), hard dependencies of the CUDA wheel (vllm-facts §1:
``fastsafetensors>=0.3.3``, ``instanttensor>=0.2.2``; fastsafetensors' direct path is GPUDirect Storage,
``nvidia-fs`` and cuFile, else it reads through host memory); ``tensorizer`` imports ``tensorizer``
(``tensorizer_loader.py``) and reads a model serialized by its own script; ``sharded_state`` and
``runai_streamer_sharded`` read the per-rank files ``save_sharded_state`` writes; ``pt`` reads ``*.pt``/``*.bin``,
``mistral`` ``consolidated.safetensors``; ``dummy`` serves random weights. A Hugging Face safetensors checkpoint
(what the stage fetches and verifies) loads with ``auto``, ``safetensors``, ``hf``, ``runai_streamer``,
``fastsafetensors``, ``instanttensor`` and ``npcache``. Another vendor's image, or an image of the site's, is not
known to hold those packages: a warning says how to check it.

Example::

    >>> FORMATS["runai_streamer"].package, sorted(FORMATS["runai_streamer"].images)
    ('runai_model_streamer', ['nvidia'])
"""

from __future__ import annotations

from dataclasses import dataclass

from k3deploy.recipe.lint.argv import placeholder
from k3deploy.recipe.lint.context import PlanContext
from k3deploy.recipe.lint.images import KNOWN_REPOSITORIES, ImageContext, repo_of
from k3deploy.recipe.lint.registry import rule


@dataclass(frozen=True)
class LoadFormat:
    """What one ``--load-format`` needs: the Python ``package`` vLLM imports for it (installed by ``pip install
    vllm[extra]``), the vendors whose published image holds it (``images``: the plan's container vendor keys),
    and why it cannot read a Hugging Face safetensors checkpoint (``unusable``)."""

    package: str | None = None
    extra: str | None = None
    images: frozenset[str] = frozenset()
    unusable: str | None = None


_SHARDED = "it reads the per-rank files `save_sharded_state` writes, not a Hugging Face checkpoint"
FORMATS: dict[str, LoadFormat] = {
    "runai_streamer": LoadFormat("runai_model_streamer", "runai", frozenset({"nvidia"})),
    "runai_streamer_sharded": LoadFormat("runai_model_streamer", "runai", frozenset({"nvidia"}), unusable=_SHARDED),
    "fastsafetensors": LoadFormat("fastsafetensors", "fastsafetensors", frozenset({"nvidia"})),
    "instanttensor": LoadFormat("instanttensor", None, frozenset({"nvidia"})),
    "tensorizer": LoadFormat("tensorizer", "tensorizer", unusable="it reads a model serialized with tensorizer's "
                                                                 "own script, not a Hugging Face checkpoint"),
    "sharded_state": LoadFormat(unusable=_SHARDED),
    "pt": LoadFormat(unusable="it reads *.pt/*.bin files and the checkpoint holds safetensors"),
    "mistral": LoadFormat(unusable="it reads Mistral's consolidated.safetensors, not a Hugging Face checkpoint"),
    "dummy": LoadFormat(unusable="it serves random weights"),
}


@rule("load-format")
def load_format(ctx: PlanContext) -> None:
    """A ``--load-format`` that cannot read the staged checkpoint (an error), or whose package the image is not
    known to hold (a warning)."""
    vendor = ctx.plan.vendor
    official = repo_of(ctx.plan.image) in KNOWN_REPOSITORIES
    # a malformed or non-existent image is the image rules' finding: nothing to say of what it holds
    image_ok = ImageContext(ctx.plan.image, None, vendor=None, severity="error", pin_info=False).repository_ok
    for e in ctx.engines:
        a = e.layout.args.get("--load-format")
        if a is None or not a.value or placeholder(a.value) or a.value not in FORMATS:
            continue
        value, need = a.value, FORMATS[a.value]
        path = ctx.arg_path(e.node, a)
        if need.unusable is not None:
            ctx.add("error", f"--load-format {value} cannot load the staged checkpoint: {need.unusable}",
                    "use --load-format auto (or safetensors, runai_streamer)", path, e.role)
        elif need.package is not None and image_ok and (vendor not in need.images or not official):
            where = f"the published image {ctx.plan.image} is not known to hold it" if official else \
                f"the image {ctx.plan.image} must hold it"
            build = f"`pip install vllm[{need.extra}]`" if need.extra else f"`pip install {need.package}`"
            ctx.add("warning", f"--load-format {value} imports {need.package}, which {where}",
                    f"check it (`docker run --rm --entrypoint python3 {ctx.plan.image} -c 'import {need.package}'`); "
                    f"where it fails, set k3_image to an image built with {build}, or use --load-format auto",
                    path, e.role)
