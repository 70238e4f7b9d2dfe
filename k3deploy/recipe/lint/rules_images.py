"""``image`` rules: one image reference (the plan's image, and every image a recipe names)."""

from __future__ import annotations

import difflib

from k3deploy.recipe.lint.images import KNOWN_REPOSITORIES, ImageContext
from k3deploy.recipe.lint.registry import rule

_MOVING_TAGS = (None, "latest", "nightly")


@rule("image-invalid", scope="image")
def image_invalid(ctx: ImageContext) -> None:
    """The reference is not of the form REPO[:TAG][@sha256:DIGEST]."""
    if ctx.match is not None:
        return
    ref, repo = ctx.ref, ctx.repo
    near = difflib.get_close_matches(repo.replace("_", "-"), list(KNOWN_REPOSITORIES), n=1, cutoff=0.8)
    fix = f"use {near[0]}{ref[len(repo):] if ref.startswith(repo) else ''}" if near else \
        "write REPO[:TAG][@sha256:DIGEST] in lower case"
    ctx.emit(ctx.severity, f"image {ref!r} is not a valid image reference", fix, ctx.path)


@rule("image-repository", scope="image")
def image_repository(ctx: ImageContext) -> None:
    """A repository in the engine's namespaces (vllm/, quay.io/ascend/) that does not exist."""
    if not ctx.unknown_repository:
        return
    ref, repo = ctx.ref, ctx.repo
    near = difflib.get_close_matches(repo.replace("_", "-"), list(KNOWN_REPOSITORIES), n=1, cutoff=0.8)
    fix = (f"use {near[0]}{ref[len(repo):]} and verify it with docker manifest inspect" if near
           else f"use one of {', '.join(KNOWN_REPOSITORIES)}")
    ctx.emit(ctx.severity, f"image repository {repo} does not exist (image {ref})", fix, ctx.path)


@rule("image-vendor", scope="image")
def image_vendor(ctx: ImageContext) -> None:
    """Another vendor's build of the engine than the hardware needs."""
    repo, vendor = ctx.repo, ctx.vendor
    if not ctx.repository_ok or not vendor or repo not in KNOWN_REPOSITORIES or KNOWN_REPOSITORIES[repo] == vendor:
        return
    want = [r for r, v in KNOWN_REPOSITORIES.items() if v == vendor]
    ctx.emit("error", f"image {ctx.ref} is the {KNOWN_REPOSITORIES[repo]} build, the hardware needs a {vendor} image",
             f"use {want[0] if want else 'an image built for ' + vendor}:TAG", ctx.path)


def _unpinned_tag(ctx: ImageContext) -> tuple[bool, str | None]:
    """(the reference lacks a digest and pinning is checked, its tag)."""
    if not ctx.repository_ok or not ctx.pin_info or ctx.match is None or ctx.match.group("digest"):
        return False, None
    return True, ctx.match.group("tag")


@rule("image-unpinned", scope="image")
def image_unpinned(ctx: ImageContext) -> None:
    """No digest, and a moving tag (none, latest, nightly)."""
    unpinned, tag = _unpinned_tag(ctx)
    if unpinned and tag in _MOVING_TAGS:
        ctx.emit("warning", f"image {ctx.ref} follows a moving tag ({tag or 'latest'})",
                 "pin a release tag and a digest (REPO:TAG@sha256:...; docker manifest inspect shows it)", ctx.path)


@rule("image-digest", scope="image")
def image_digest(ctx: ImageContext) -> None:
    """A release tag without a digest."""
    unpinned, tag = _unpinned_tag(ctx)
    if unpinned and tag not in _MOVING_TAGS:
        ctx.emit("info", f"image {ctx.ref} is not pinned by digest",
                 "pin it as REPO:TAG@sha256:<digest> (docker manifest inspect shows it), or pass "
                 "--image @sha256:<digest>", ctx.path)
