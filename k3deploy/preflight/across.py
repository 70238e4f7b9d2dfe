"""The checks that need more than one host's facts, or a host other than the one checked: run once every host's
facts are in (:func:`k3deploy.preflight.report.check` judges each host on its own).

* :func:`router_checks` -- the router host has the ``vllm-router`` command its unit runs;
* :func:`image_resolver`, :func:`image_check` -- the one host that asks the registry which build the image's tag
  names, and the record of its answer (every node of the rollout runs that one digest);
* :func:`ascend_peer_round` -- multi-node Ascend: a second round in which each host pings, from NPU i, NPU i of
  every other host;
* :func:`nccl_probe` -- ``k3_nccl_probe``: the two-node NCCL all-reduce in the image (:mod:`k3deploy.preflight.probe`);
* :func:`rdma_reach_round` -- expert parallelism across nodes: each chosen RDMA port of each host reaches each chosen
  port of the others (:mod:`k3deploy.preflight.reach`).

Whether the NPU round and the NCCL probe apply is the vendor pack's answer (``npu_peer_round``, ``nccl_probe``:
:mod:`k3deploy.vendors`), asked by :func:`_npu_peer_round_applies` and :func:`_nccl_probe_applies`.

Example::

    >>> [c.status for c in router_checks({"n1": True}, "/usr/local/bin/vllm-router")]
    ['pass']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra.api.facts import FactBase
from pyinfra.api.state import State

from k3deploy.facts import ascend
from k3deploy.facts.batch import read_batch
from k3deploy.facts.parallel import each_host
from k3deploy.model import images as image_pins
from k3deploy.model.pipeline import Target
from k3deploy.model.requirements import Requirements
from k3deploy.model.rollout import Placement, Rollout
from k3deploy.model.staging import engines
from k3deploy.preflight.checks import CLUSTER, CheckResult, HostFacts, peer_checks, peer_targets
from k3deploy.preflight.probe import CHECK as PROBE_CHECK
from k3deploy.preflight.probe import run_probe
from k3deploy.preflight.reach import RdmaReach, reach_checks, reach_targets
from k3deploy.preflight.report import PreflightReport
from k3deploy.vendors import pack_for


def _npu_peer_round_applies(requirements: Requirements) -> bool:
    """Multi-node Ascend: the NPUs talk over their own RoCE ports, which only a round across hosts can test."""
    return pack_for(requirements).npu_peer_round and requirements.needs_rdma


def _nccl_probe_applies(requirements: Requirements, engine_hosts: list[str]) -> bool:
    """A pack whose engines talk NCCL (NVIDIA), over RDMA across at least two engine nodes."""
    return pack_for(requirements).nccl_probe and requirements.needs_rdma and len(engine_hosts) >= 2


#: checks only a run that reads what the hosts run makes (the deploy, ``plan``), not ``k3deploy preflight``: the
#: deploy counts them apart, so that its count of the preflight's checks is the one ``k3deploy preflight`` prints
BEYOND_PREFLIGHT = ("image.digest", "router.command")


def preflight_count(results: Sequence[CheckResult]) -> str:
    """How many checks passed, counted as ``k3deploy preflight`` counts them, then those the run adds by name.

    >>> r = [CheckResult("a", "disk.shm", "pass", "", ""), CheckResult("a", "image.digest", "pass", "", "")]
    >>> preflight_count(r), preflight_count(r[:1])
    ('1 checks (as k3deploy preflight counts them) and image.digest', '1 checks')
    """
    extra = sorted({r.check for r in results if r.check in BEYOND_PREFLIGHT})
    same = len([r for r in results if r.check not in BEYOND_PREFLIGHT])
    return f"{same} checks" + (f" (as k3deploy preflight counts them) and {', '.join(extra)}" if extra else "")


def router_checks(executable: Mapping[str, bool], path: str) -> list[CheckResult]:
    """The router host has the ``vllm-router`` command its unit runs (``k3_router_bin``): ``executable`` is, per
    router host whose facts asked, whether ``path`` is an executable there."""
    out = []
    for host, found in executable.items():
        if found:
            out.append(CheckResult(host, "router.command", "pass", f"{path} is executable",
                                   "the vllm-router command"))
        else:
            out.append(CheckResult(host, "router.command", "fail", f"{path} is missing or not executable on {host}",
                                   "the vllm-router command at k3_router_bin (the router unit's ExecStart)",
                                   "pip install vllm-router==0.1.17 on the router host, or set k3_router_bin to "
                                   "where it is (or k3_router_image to run it from an image)"))
    return out


def image_resolver(rollout: Placement) -> str | None:
    """The one host that asks the registry which build the image's tag names (the first engine host, which also
    fetches the image when no node holds it), or None when the image is not resolved (pinned already, an
    air-gapped archive, ``k3_image_resolve: false``, a rollback: the revision names its build)."""
    variables = rollout.vars
    hosts = engines(rollout)
    if not hosts or variables.k3_rollback is not False or not image_pins.to_resolve(
            rollout.plan.image, resolve=variables.k3_image_resolve, archive=bool(variables.k3_image_archive)):
        return None
    return hosts[0]


def image_check(res: image_pins.Resolution) -> CheckResult:
    """The preflight's record of the tag's resolution: the build every node of this rollout runs, or why the
    rollout cannot know it."""
    required = "the registry names the build of the image's tag (every node runs that one digest)"
    if res.digest:
        return CheckResult(res.host, "image.digest", "pass", f"{res.image} is {res.digest}", required)
    return CheckResult(res.host, "image.digest", "fail", f"{res.image}: {res.error}", required,
                       f"let {res.host} reach the registry with `docker buildx imagetools inspect {res.image}` "
                       "(the docker-buildx-plugin package), or pin the build: k3_image: REPO@sha256:<digest>; "
                       "k3_image_resolve: false runs the tag as each node has it (builds may differ)")


def ascend_peer_round(state: State, hosts: list[Any], read: list[HostFacts],
                      requirements: Requirements) -> list[CheckResult]:
    """Multi-node Ascend: the second round, once every host's NPU addresses are read: each host pings, from NPU i,
    NPU i of every other host (same-index pairs, what the RoCE plane connects; not every NPU pair), one command per
    host, all hosts at once; then ``ascend.peers`` per host (:func:`k3deploy.preflight.checks.peer_checks`)."""
    if not _npu_peer_round_applies(requirements):
        return []
    targets = peer_targets(read)
    if not targets:
        return []
    return peer_checks(read, targets, _ping_round(state, hosts, targets, ascend.HccnPing))


def rdma_reach_round(state: State, hosts: list[Any], read: list[HostFacts], requirements: Requirements,
                     report: PreflightReport, layout: Placement | None = None) -> list[CheckResult]:
    """Expert parallelism across nodes over the hosts' RDMA ports: the second round, once every host's ports are
    chosen; each host pings, from each chosen port, each chosen port of every other host of its engine group (a
    replica, a P/D pool: ``layout``'s groups), one command per host, all hosts at once; then ``rdma.reach`` per host
    (:mod:`k3deploy.preflight.reach`)."""
    if not (requirements.expert_parallel_across_nodes and requirements.needs_rdma
            and pack_for(requirements).transport.rdma_ports):
        return []
    # the engine groups whose engines run expert parallelism (an all-to-all among their hosts)
    groups = [[u.host for u in layout.group(g)] for g in layout.groups
              if any("--enable-expert-parallel" in u.node.argv for u in layout.group(g))] if layout else None
    targets, unknown = reach_targets(read, report.host_env(), groups)
    if not targets:
        return []
    return reach_checks(targets, unknown, _ping_round(state, hosts, targets, RdmaReach))


def _ping_round(state: State, hosts: list[Any], targets: dict[str, Any], fact: type[FactBase[Any]]) -> dict[str, Any]:
    """A second round's pings: ``fact`` with each host's ``targets``, one command per host, all hosts at once; per
    host its value, or why it could not be read (a dropped connection: the check says so)."""
    by_name = {host.name: host for host in hosts}
    pinging = [by_name[name] for name in targets if name in by_name]

    def one(host: Any) -> Any:
        try:
            return read_batch(state, host, [("pings", fact, {"targets": targets[host.name]})])["pings"]
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"[:200]

    return dict(zip([host.name for host in pinging], each_host(state, pinging, one), strict=True))


def nccl_probe(state: State, wanted: Target, rollout: Rollout, report: PreflightReport) -> list[CheckResult]:
    """``k3_nccl_probe``: the two-node NCCL all-reduce in the image on the planned engine nodes
    (:mod:`k3deploy.preflight.probe`), once every other check has passed (a node that fails them would fail it too,
    for a reason already shown); NVIDIA multi-node plans only."""
    engine_hosts = list(dict.fromkeys(u.host for u in rollout.units if u.group != "router"))
    if not _nccl_probe_applies(wanted.requirements, engine_hosts):
        return [CheckResult(CLUSTER, PROBE_CHECK, "pass", "not run: no multi-node NCCL over RDMA in this plan",
                            "k3_nccl_probe: a two-node NCCL all-reduce where NCCL crosses nodes")]
    if not report.ok:
        return [CheckResult(CLUSTER, PROBE_CHECK, "warn", "not run: other checks failed",
                            "every other check passed first", "fix the failures above, then rerun preflight")]
    hosts = {host.name: host for host in state.inventory}
    facts = [f for f in report.hosts if f.host in engine_hosts]
    return run_probe(state, hosts, facts, report.host_env(), wanted.vars.k3_docker, rollout.plan.image)
