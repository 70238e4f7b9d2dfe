"""The container image of a selection: the recipe's own pins, k3deploy's pinned K3 images
(``data/images.yaml``), the recipes builder's defaults, and the ``--image`` / ``k3_image`` override. Pure.

Example::

    >>> from k3deploy import load_recipe
    >>> from k3deploy.recipe.taxonomy import hardware
    >>> resolve_image(load_recipe(), "default", hardware()["gb300"], "@sha256:" + "a" * 64)[:32]
    'vllm/vllm-openai:kimi-k3@sha256:'
"""

from __future__ import annotations

import re
from typing import Any

from k3deploy.errors import SelectionError
from k3deploy.recipe.schema import Recipe, Variant
from k3deploy.recipe.taxonomy import HardwareProfile, pinned_images

_IMAGE = re.compile(
    r"(?P<name>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _builder_image(recipe: Recipe, variant: Variant, hw: HardwareProfile) -> str | None:
    pin = variant.hardware_overrides.get(hw.id)
    if pin is not None and isinstance(pin.docker_image, str):
        return pin.docker_image
    key = hw.brand_key
    image: str | None = None
    cuda_map: dict[str, Any] | None = None
    for o in (variant.docker_image, recipe.model.docker_image):
        if image or cuda_map or o is None:
            continue
        if isinstance(o, str):
            if key == "nvidia":
                image = o
        elif isinstance(o, dict):
            if any(k in o for k in ("nvidia", "amd", "tpu", "intel")):
                val = o.get(key)
                if isinstance(val, str):
                    image = val
                elif key == "nvidia" and isinstance(val, dict):
                    cuda_map = val
            elif key == "nvidia" and ("cu129" in o or "cu130" in o):
                cuda_map = o
    if image:
        return image
    if hw.gen == "xpu":
        return "vllm/vllm-openai-xpu:latest"
    if cuda_map:
        return cuda_map.get("cu130") or cuda_map.get("cu129")
    nightly = recipe.model.nightly_required
    defaults = {
        "nvidia": "vllm/vllm-openai:nightly" if nightly else "vllm/vllm-openai:latest",
        "amd": "vllm/vllm-openai-rocm:nightly" if nightly else "vllm/vllm-openai-rocm:latest",
        "tpu": "vllm/vllm-tpu:nightly" if nightly else "vllm/vllm-tpu:latest",
        "intel": None if nightly else "vllm/vllm-openai-cpu:latest-x86_64",
    }
    return defaults.get(key)


def resolve_image(recipe: Recipe, variant_key: str, hw: HardwareProfile, override: str | None = None) -> str:
    """The container image for (recipe, variant, hardware), with k3deploy's pins and an optional override.

    ``override`` is a full reference (``repo[:tag][@sha256:...]``), ``:tag`` (another tag of the default
    repository) or ``@sha256:<64 hex>`` (the default image pinned by digest).
    """
    v = recipe.variants[variant_key]
    pin = v.hardware_overrides.get(hw.id)
    image: str | None
    if pin is not None and isinstance(pin.docker_image, str):
        image = pin.docker_image
    else:
        image = pinned_images().get(recipe.slug, {}).get(hw.vendor) or _builder_image(recipe, v, hw)
    if image is None:
        raise SelectionError(f"no container image known for {hw.id}: set an image with --image REPO:TAG")
    if not override:
        return image
    m = _IMAGE.fullmatch(image)
    base = m.group("name") if m else image.split("@")[0].rsplit(":", 1)[0]
    if override.startswith("@"):
        if not _DIGEST.fullmatch(override[1:]):
            raise SelectionError(
                f"image digest {override!r} is not of the form @sha256:<64 lowercase hex digits>")
        return image.split("@")[0] + override
    if override.startswith(":"):
        candidate = base + override
    else:
        candidate = override
    if not _IMAGE.fullmatch(candidate) or ":" not in candidate.split("/")[-1] and "@" not in candidate:
        raise SelectionError(
            f"image {override!r} is not a pinned image reference: use REPO:TAG, REPO@sha256:<digest>, "
            f":TAG or @sha256:<digest>")
    return candidate


