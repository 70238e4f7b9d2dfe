"""Image references: :func:`check_image` (one reference, through the ``image`` rules of
:mod:`~k3deploy.recipe.lint.rules_images`), the recipe key a plan's image came from, and the images written
anywhere in a recipe (:func:`recipe_image_findings`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from k3deploy.recipe.lint.findings import Finding
from k3deploy.recipe.lint.registry import Emitter, run
from k3deploy.recipe.plan import Plan
from k3deploy.recipe.schema import Recipe
from k3deploy.recipe.taxonomy import HardwareProfile, pinned_images

#: Repositories the engine images are published under, with the vendor each one serves.
KNOWN_REPOSITORIES = {
    "vllm/vllm-openai": "nvidia",
    "vllm/vllm-openai-rocm": "amd",
    "vllm/vllm-tpu": "tpu",
    "vllm/vllm-openai-cpu": "intel",
    "vllm/vllm-openai-xpu": "intel",
    "quay.io/ascend/vllm-ascend": "npu",
}
_CHECKED_NAMESPACES = ("vllm/", "quay.io/ascend/")
_REF = re.compile(
    r"(?P<repo>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?")
_GUIDE_IMAGE = re.compile(r"(?<![\w/.-])((?:quay\.io/ascend/|docker\.io/)?vllm/vllm[\w.-]*(?::[\w.-]+)?)")


def repo_of(ref: str) -> str:
    """The repository part of an image reference (``docker.io/`` dropped)."""
    m = _REF.fullmatch(ref)
    repo = m.group("repo") if m else ref.split("@")[0].rsplit(":", 1)[0]
    return repo[len("docker.io/"):] if repo.startswith("docker.io/") else repo


class ImageContext(Emitter):
    """One image reference as the ``image`` rules see it. ``severity`` is that of the reference's form
    findings (malformed, unknown repository); ``vendor`` the vendor the hardware needs (None: any);
    ``pin_info`` asks for the pinning findings."""

    def __init__(self, ref: str, path: str | None, *, vendor: str | None, severity: str, pin_info: bool) -> None:
        super().__init__()
        self.ref, self.path, self.vendor, self.severity, self.pin_info = ref, path, vendor, severity, pin_info
        self.match = _REF.fullmatch(ref)
        self.repo = repo_of(ref)

    @property
    def unknown_repository(self) -> bool:
        """A well-formed reference to a repository of the engine's namespaces that does not exist."""
        return self.match is not None and self.repo.startswith(_CHECKED_NAMESPACES) and \
            self.repo not in KNOWN_REPOSITORIES

    @property
    def repository_ok(self) -> bool:
        """Well-formed, and not a repository known not to exist: the tag and vendor are worth checking."""
        return self.match is not None and not self.unknown_repository


def check_image(ref: str, path: str | None, *, vendor: str | None = None, severity: str = "error",
                pin_info: bool = True) -> list[Finding]:
    """Findings for one image reference: malformed, a repository that does not exist in the engine's
    namespace, the wrong vendor's image, or an unpinned tag."""
    return run("image", ImageContext(ref, path, vendor=vendor, severity=severity, pin_info=pin_info))


def image_path(recipe: Recipe, plan: Plan, hw: HardwareProfile) -> str:
    """The recipe key (or packaged pin) the plan's image came from."""
    v = recipe.variants.get(plan.variant)
    pin = v.hardware_overrides.get(hw.id) if v else None
    if pin is not None and pin.docker_image == plan.image:
        return f"variants.{plan.variant}.hardware_overrides.{hw.id}.docker_image"
    if pinned_images().get(recipe.slug, {}).get(hw.vendor) == plan.image:
        return f"images.yaml:{recipe.slug}.{hw.vendor}"
    for where, o in ((f"variants.{plan.variant}.docker_image", v.docker_image if v else None),
                     ("model.docker_image", recipe.model.docker_image)):
        if o == plan.image:
            return where
        if isinstance(o, dict):
            for k, val in o.items():
                if val == plan.image:
                    return f"{where}.{k}"
                if isinstance(val, dict):
                    for k2, val2 in val.items():
                        if val2 == plan.image:
                            return f"{where}.{k}.{k2}"
    return "builder: default image"


def image_vendor(ref: str) -> str | None:
    """The vendor an image reference is for: its repository's, or that of the known repository it misspells
    (None: neither).

    >>> image_vendor("vllm/vllm-openai_rocm:kimi-k3"), image_vendor("vllm/vllm-openai:v1"), image_vendor("x/y")
    ('amd', 'nvidia', None)
    """
    import difflib

    repo = repo_of(ref)
    if repo in KNOWN_REPOSITORIES:
        return KNOWN_REPOSITORIES[repo]
    near = difflib.get_close_matches(repo, list(KNOWN_REPOSITORIES), n=1, cutoff=0.9)
    return KNOWN_REPOSITORIES[near[0]] if near else None


def recipe_image_findings(recipe: Recipe, vendors: set[str] | None = None) -> list[Finding]:
    """Image names written anywhere in the recipe (``docker_image`` keys, the guide) and in k3deploy's own
    pins, checked for the repository form. Guide mentions are warnings: the guide is read, not run. ``vendors``:
    only images for these vendors (and those of no known vendor), e.g. those of the hardware a lint selected."""
    out: list[Finding] = []

    def wanted(ref: str, vendor: str | None = None) -> bool:
        vendor = vendor or image_vendor(ref)
        return vendors is None or vendor is None or vendor in vendors

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                p = f"{path}.{k}" if path else str(k)
                if k == "docker_image":
                    for ref, rp in _image_refs(v, p):
                        if wanted(ref):
                            out.extend(check_image(ref, rp, pin_info=False))
                elif isinstance(v, (dict, list)) and k != "guide":
                    walk(v, p)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(recipe.model_dump(mode="python", exclude={"guide", "source"}), "")
    seen = set()
    for m in _GUIDE_IMAGE.finditer(recipe.guide or ""):
        ref = m.group(1).rstrip(".")
        if ref in seen or not wanted(ref):
            continue
        seen.add(ref)
        out.extend(f for f in check_image(ref, "guide", severity="warning", pin_info=False))
    for slug, per_vendor in (pinned_images() or {}).items():
        for vendor, ref in (per_vendor or {}).items():
            if not wanted(str(ref), str(vendor)):
                continue
            out.extend(check_image(str(ref), f"images.yaml:{slug}.{vendor}", vendor=vendor, pin_info=False))
    return out


def _image_refs(v: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(v, str):
        yield v, path
    elif isinstance(v, dict):
        for k, val in v.items():
            yield from _image_refs(val, f"{path}.{k}")
