"""``k3_router_image`` pinned to a digest as the engine image is: its tag asked of the registry from the router's
host, the router's unit run by the local tag named after the digest (so a re-pushed tag is a change of the router),
its build pulled by its digest on the router's host before the restart, and the router's revision recording the
build and the tag it was resolved from."""

from __future__ import annotations

from k3deploy.model.binding import HostRecord
from k3deploy.model.images import LocalImage, pin, resolution, run_ref
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.revisions import revision_for
from k3deploy.model.steps import ROUTER_IMAGE, fresh, stage
from k3deploy.preflight.across import image_check
from k3deploy.runtime.reading import ReadRouterImage, ReadRouterRegistry, plan_host, router_resolver
from k3deploy.runtime.views import DEPLOY, RUNBOOK, STATUS

ROUTER = "lmsysorg/vllm-router:v0.1.17"
ONE, TWO = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def hosts(**data: object) -> list[HostRecord]:
    """Two replicas of two GB300 trays each behind one router (on replica 0's head)."""
    return [HostRecord(f"r{i}n{j}", ("head",) if j == 0 else ("workers",),
                       {"k3_hardware": "gb300", "k3_ip": f"10.0.0.{10 * i + j + 10}", "rank": j, "k3_replica": i,
                        "k3_router_image": ROUTER, **data}) for i in range(2) for j in range(2)]


def router_unit(rollout):
    (u,) = rollout.group("router")
    return u


def imagetools(digest: str) -> list[str]:
    """What ``docker buildx imagetools inspect`` prints for the tag (the resolve command's own first line)."""
    return ["K3_RC=0", f"Name:      docker.io/{ROUTER}", "MediaType: application/vnd.oci.image.index.v1+json",
            f"Digest:    {digest}"]


def test_the_router_host_asks_the_registry_for_the_router_tag():
    layout = target(hosts(), None).require_layout()
    host = router_unit(layout).host
    assert router_resolver(layout) == host
    asked = plan_host(layout, host, DEPLOY, resolver=None).requests
    assert ReadRouterRegistry(ROUTER, "/usr/bin/docker") in asked and ReadRouterImage(ROUTER, "/usr/bin/docker") in asked
    assert ReadRouterRegistry(ROUTER, "/usr/bin/docker") in plan_host(layout, host, RUNBOOK, resolver=None).requests
    other = next(h for h in layout.hosts if h != host)
    assert not [r for r in plan_host(layout, other, STATUS, resolver=None).requests
                if isinstance(r, ReadRouterRegistry | ReadRouterImage)]
    # pinned already, resolution off, a rollback (the revision names its build), no router image: not asked
    for data in ({"k3_router_image": pin(ROUTER, ONE)}, {"k3_image_resolve": False}, {"k3_rollback": True}):
        assert router_resolver(target(hosts(**data), None).require_layout()) is None
    assert router_resolver(target(hosts(k3_router_image=None), None).require_layout()) is None


def test_the_router_runs_the_resolved_build_and_a_re_pushed_tag_is_a_change():
    wanted = target(hosts(), None)
    res = resolution(ROUTER, "r0n0", imagetools(ONE))
    assert res.pinned == f"lmsysorg/vllm-router@{ONE}"
    assert image_check(res).status == "pass" and image_check(res).observed == f"{ROUTER} is {ONE}"
    first = desired_rollout(wanted.with_router_image(res.pinned))
    unit = router_unit(first)
    assert unit.spec.container is not None and unit.spec.container.image == run_ref(res.pinned)
    assert f"lmsysorg/vllm-router:k3-sha256-{'1' * 64}" in unit.unit_text and ROUTER not in unit.unit_text
    # the tag pushed again: another build, another unit; the engines' units stay as they were
    second = desired_rollout(wanted.with_router_image(pin(ROUTER, TWO)))
    assert router_unit(second).unit_text != unit.unit_text
    assert [u.unit_text for u in second.units if u.group != "router"] == \
        [u.unit_text for u in first.units if u.group != "router"]
    # unresolved (no answer from the registry): the tag as given, and the preflight says why
    bad = resolution(ROUTER, "r0n0", ["K3_RC=1", "ERROR: failed to resolve"])
    assert bad.pinned is None and image_check(bad).status == "fail"
    assert router_unit(desired_rollout(wanted)).spec.container.image == ROUTER


def test_the_router_build_is_staged_by_digest_where_the_router_host_lacks_it():
    pinned = pin(ROUTER, ONE)
    rollout = desired_rollout(target(hosts(), None).with_router_image(pinned))
    host = router_unit(rollout).host
    made = [s for s in stage(rollout, fresh(rollout), router_tag=ROUTER) if s.kind == ROUTER_IMAGE]
    assert [(s.host, s.applies) for s in made] == [(h, h == host) for h in rollout.hosts]
    (step,) = [s for s in made if s.applies]
    assert f"pull -q lmsysorg/vllm-router@{ONE}" in step.script and f"*@{ONE}\\ *) echo 'digest ok" in step.script
    assert f"tag lmsysorg/vllm-router@{ONE} lmsysorg/vllm-router:k3-sha256-{'1' * 64}" in step.script
    assert step.script.endswith(f"lmsysorg/vllm-router:k3-sha256-{'1' * 64} {ROUTER}")
    # a host that holds the named build: nothing to do
    held = {host: LocalImage(f"lmsysorg/vllm-router@{ONE}", (ONE,), (f"k3-sha256-{'1' * 64}",))}
    assert not any(s.applies for s in stage(rollout, fresh(rollout), router_images=held) if s.kind == ROUTER_IMAGE)
    # without a router image there is no such step
    plain = desired_rollout(target(hosts(k3_router_image=None), None))
    assert not [s for s in stage(plain, fresh(plain)) if s.kind == ROUTER_IMAGE]


def test_the_router_revision_records_its_build_and_tag():
    pinned = pin(ROUTER, ONE)
    rollout = desired_rollout(target(hosts(), None).with_router_image(pinned))
    rev = revision_for(rollout, "router", 1, created="t", variables={}, version="0", tag=ROUTER)
    assert (rev.image, rev.tag) == (pinned, ROUTER)
    engine = revision_for(rollout, rollout.replicas[0], 1, created="t", variables={}, version="0")
    assert engine.image == rollout.plan.image
