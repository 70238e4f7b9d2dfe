"""One build per rollout, the pure parts: a tag resolved to its registry digest, what a node holds of the pinned
build, the stage and the revision of a pinned image, and the simulated registry's re-push of a tag."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from k3deploy.model import commands
from k3deploy.model.images import (
    LocalImage,
    Resolution,
    holds,
    is_pinned,
    named,
    parse_imagetools,
    parse_local,
    pin,
    resolution,
    run_ref,
    shown,
    split,
    to_resolve,
)
from k3deploy.model.revisions import Revision
from k3deploy.model.staging import OUTSIDE, plan_stage
from k3sim import outside

TAG = "vllm/vllm-openai:kimi-k3"
OLD, NEW = "sha256:" + "a" * 64, "sha256:" + "b" * 64

#: ``docker buildx imagetools inspect`` of a single-platform image, and of a multi-platform index (the docs' alpine)
SINGLE = ["Name:      docker.io/vllm/vllm-openai:kimi-k3", "MediaType: application/vnd.oci.image.manifest.v1+json",
          f"Digest:    {NEW}"]
INDEX = ["Name:      docker.io/library/alpine:latest",
         "MediaType: application/vnd.docker.distribution.manifest.list.v2+json",
         f"Digest:    {NEW}", "", "Manifests:",
         f"  Name:      docker.io/library/alpine:latest@{OLD}",
         "  MediaType: application/vnd.docker.distribution.manifest.v2+json", "  Platform:  linux/amd64"]


def test_references_split_and_pin_to_the_repository_at_the_digest():
    assert split(TAG) == ("vllm/vllm-openai", "kimi-k3", None)
    assert split("registry:5000/org/img") == ("registry:5000/org/img", "latest", None)
    assert split(f"{TAG}@{OLD}") == ("vllm/vllm-openai", "kimi-k3", OLD)
    assert split(f"quay.io/ascend/vllm-ascend@{OLD}") == ("quay.io/ascend/vllm-ascend", None, OLD)
    assert pin(TAG, NEW) == f"vllm/vllm-openai@{NEW}" and is_pinned(pin(TAG, NEW)) and not is_pinned(TAG)
    with pytest.raises(ValueError):
        pin(TAG, "sha256:short")


def test_only_a_tag_from_a_registry_is_resolved():
    assert to_resolve(TAG, resolve=True, archive=False)
    assert not to_resolve(f"{TAG}@{OLD}", resolve=True, archive=False)   # pinned already
    assert not to_resolve(TAG, resolve=True, archive=True)               # an air-gapped archive is the source
    assert not to_resolve(TAG, resolve=False, archive=False)             # k3_image_resolve: false


def test_the_digest_is_the_one_the_tag_names_not_a_platform_manifest_of_it():
    assert parse_imagetools(SINGLE) == NEW
    assert parse_imagetools(INDEX) == NEW
    assert parse_imagetools(["ERROR: docker.io/vllm/vllm-openai:nope: not found"]) is None


def test_the_registry_answer_or_why_there_is_none():
    ok = resolution(TAG, "n1", ["K3_RC=0", *SINGLE])
    assert ok == Resolution(TAG, "n1", digest=NEW) and ok.pinned == f"vllm/vllm-openai@{NEW}"
    missing = resolution(TAG, "n1", ["K3_RC=1", "ERROR: docker.io/vllm/vllm-openai:kimi-k3: not found"])
    assert missing.digest is None and missing.pinned is None and "not found" in (missing.error or "")
    plugin = resolution(TAG, "n1", ["K3_RC=1", "docker: 'buildx' is not a docker command."])
    assert "buildx" in (plugin.error or "")
    assert "did not answer" in (resolution(TAG, "n1", ["K3_RC=124"]).error or "")
    assert resolution(TAG, "n1", []).error


def test_a_node_holds_a_pinned_image_only_with_that_build():
    old_tag = parse_local([f"K3_REF=vllm/vllm-openai@{OLD}", f"K3_HAVE=kimi-k3 {OLD}", "K3_HAVE=<none> <none>"])
    assert old_tag == LocalImage(f"vllm/vllm-openai@{OLD}", (OLD,), ("kimi-k3",))
    assert holds(TAG, old_tag)                                       # the tag is there (some build of it)
    assert not holds(pin(TAG, NEW), old_tag)                         # but not the build the rollout pins
    assert holds(pin(TAG, OLD), old_tag) and not named(pin(TAG, OLD), old_tag)   # held, not yet named for the units
    both = parse_local(["K3_REF=", f"K3_HAVE=<none> {OLD}", f"K3_HAVE=<none> {NEW}"])   # untagged, by digest
    assert not holds(TAG, both) and holds(pin(TAG, NEW), both)
    # loaded with the classic image store: no repo digest, only the local tag named after the digest
    loaded = parse_local(["K3_REF=", f"K3_HAVE={run_ref(pin(TAG, NEW)).rpartition(':')[2]} <none>"])
    assert loaded.digests == () and holds(pin(TAG, NEW), loaded) and named(pin(TAG, NEW), loaded)
    assert not holds(pin(TAG, OLD), loaded)
    assert not holds(pin(TAG, NEW), None) and not holds(pin(TAG, NEW), LocalImage()) and named(TAG, None)


def test_units_run_a_pinned_build_by_a_local_tag_named_after_its_digest():
    run = run_ref(pin(TAG, NEW))
    assert run == f"vllm/vllm-openai:k3-sha256-{'b' * 64}" and len(run.rpartition(":")[2]) <= 128
    assert run_ref(f"{TAG}@{NEW}") == run and run_ref(TAG) == TAG
    assert shown(run) == pin(TAG, NEW) and shown(TAG) == TAG and shown(None) is None


def test_a_node_with_another_build_of_the_tag_gets_the_pinned_one_from_a_peer():
    nodes = {"n1": parse_local([f"K3_REF=r@{OLD}", f"K3_HAVE=kimi-k3 {OLD}"]),   # the build of the day before
             "n2": parse_local([f"K3_REF=r@{NEW}", f"K3_HAVE=kimi-k3 {NEW}"]),   # a replaced node: the re-pushed one
             "n3": LocalImage()}
    image = pin(TAG, NEW)
    sp = plan_stage(list(nodes), [h for h, li in nodes.items() if holds(image, li)], list(nodes), mode="fanout",
                    sources=1, image_archive=False, weights_source=False, download=True, shared=False)
    assert sp.image.fetch == {} and set(sp.image.receivers) == {"n1", "n3"} and sp.image.senders == ["n2"]
    nobody = plan_stage(["n1", "n2"], [h for h in ("n1",) if holds(image, nodes[h])], [], mode="fanout", sources=1,
                        image_archive=False, weights_source=False, download=True, shared=False)
    assert nobody.image.fetch == {"n1": OUTSIDE}                      # nobody holds it: one node pulls that build


def test_the_stage_pulls_the_build_by_digest_hands_it_on_by_its_local_tag_and_checks_its_id(tmp_path):
    image, run = pin(TAG, NEW), run_ref(pin(TAG, NEW))
    pull = commands.pull("docker", image, TAG)
    assert f"docker pull -q {image}" in pull and f"docker tag {image} {run}" in pull
    assert pull.endswith(f"docker tag {run} {TAG}")                   # the tag on the node names the build it runs
    assert "docker tag" not in commands.pull("docker", TAG)
    assert f"docker save -o {commands.archive_path('/s', image)}.part {run}" in commands.export_image("docker", image,
                                                                                                     "/s")
    got = commands.receive_image("10.0.0.1", 8873, "docker", image, "/s", TAG)
    assert ".tar.id" in got and "image inspect --format '{{.Id}}'" in got and got.endswith(f"docker tag {run} {TAG}")
    assert commands.stop_serving("/s", image).endswith(".tar.id")
    # the digest check accepts the build under any of its repo digests, and refuses another build
    fake = tmp_path / "docker"
    for digests, rc in ((f"vllm/vllm-openai@{OLD} vllm/vllm-openai@{NEW}", 0), (f"vllm/vllm-openai@{OLD}", 1)):
        fake.write_text(f"#!/bin/sh\necho '{digests}'\n")
        fake.chmod(0o755)
        res = subprocess.run(["sh", "-c", commands.digest_check(str(fake), image)], capture_output=True, text=True)
        assert res.returncode == rc, res.stderr
    # a receiver refuses a loaded build whose image id is not the sender's
    (tmp_path / "a.tar.id").write_text("sha256:peer\n")
    for loaded, rc in (("sha256:peer", 0), ("sha256:other", 1)):
        fake.write_text(f"#!/bin/sh\n[ \"$1\" = image ] && echo {loaded}; exit 0\n")
        full = commands.receive_image("10.0.0.1", 8873, str(fake), image, str(tmp_path))
        check = full[full.index(" && ", full.index("rsync -a")) + 4:]   # what follows the copy
        check = check.replace(shlex.quote(commands.archive_path(str(tmp_path), image)), str(tmp_path / "a.tar"))
        res = subprocess.run(["sh", "-c", check], capture_output=True, text=True)
        assert res.returncode == rc, (check, res.stderr)


def test_a_revision_records_the_build_and_the_tag_it_came_from():
    rev = Revision(group="engine", number=2, created="2026-12-04T00:00:00Z", image=pin(TAG, NEW), summary="s",
                   tag=TAG)
    assert Revision.from_json(rev.to_json()) == rev
    older = json.loads(rev.to_json())
    del older["tag"]                                                  # recorded before the tag was
    assert Revision.from_json(json.dumps(older)).tag == ""


def test_the_simulated_registry_serves_a_re_pushed_tag_and_keeps_the_old_build(tmp_path):
    registry = json.loads(outside.REGISTRY_JSON.read_text())
    registry.pop("_comment")
    store = outside.Store(tmp_path, 4096, 4096, registry)
    first = registry["vllm/vllm-openai"]["kimi-k3"]["digest"]
    store.refresh_pushes()
    assert store.tag_of("vllm/vllm-openai", "kimi-k3") == ("kimi-k3", 0)
    new = outside.repush(tmp_path, TAG)
    store.refresh_pushes()
    assert new != first and store.tag_of("vllm/vllm-openai", "kimi-k3") == ("kimi-k3", 1)
    assert store.tag_of("vllm/vllm-openai", first) == ("kimi-k3", 0)     # still there by digest
    assert store.tag_of("vllm/vllm-openai", new) == ("kimi-k3", 1)
    a, b = store.image("vllm/vllm-openai", "kimi-k3", 0), store.image("vllm/vllm-openai", "kimi-k3", 1)
    assert (a["digest"], b["digest"]) == (first, new) and set(a["blobs"]).isdisjoint(b["blobs"])
    assert json.loads(b["manifest"])["annotations"]["io.k3sim.content-digest"] == new
    with pytest.raises(ValueError):
        outside.repush(tmp_path, "vllm/vllm-openai:nope")
