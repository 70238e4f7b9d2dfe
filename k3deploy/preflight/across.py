"""The checks that need more than one host's facts, or a host other than the one checked: run once every host's
facts are in (:func:`k3deploy.preflight.report.check` judges each host on its own).

* :func:`router_checks` -- the router host has the ``vllm-router`` command its unit runs;
* :func:`image_resolver`, :func:`image_check` -- the one host that asks the registry which build the image's tag
  names, and the record of its answer (every node of the rollout runs that one digest);
* :func:`run_probes` -- the vendor pack's cluster-wide probes (:class:`~k3deploy.preflight.base.ClusterProbe`: the
  NCCL all-reduce in the image, ``k3_nccl_probe``; the Ascend NPUs' pings to their peers), each in its round;
* :func:`rdma_reach_round` -- expert parallelism across nodes: each chosen RDMA port of each host reaches each chosen
  port of the others (:mod:`k3deploy.preflight.reach`).

Which probes there are is the vendor pack's answer (its preflight side's ``probes()``); nothing here names a vendor.

Example::

    >>> [c.status for c in router_checks({"n1": True}, "/usr/local/bin/vllm-router")]
    ['pass']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatch
from typing import Any

from pyinfra.api.state import State

from k3deploy.model import images as image_pins
from k3deploy.model.pipeline import Target
from k3deploy.model.requirements import Requirements
from k3deploy.model.rollout import Placement, Rollout
from k3deploy.model.slurm import SlurmSite
from k3deploy.model.staging import engines
from k3deploy.model.variables import Variables
from k3deploy.preflight.base import ProbeRound, probe_not_run
from k3deploy.preflight.checks import CheckResult, HostFacts, vendor_checks
from k3deploy.preflight.reach import RdmaReach, reach_checks, reach_targets
from k3deploy.preflight.report import PreflightReport
from k3deploy.preflight.rounds import ping_round
from k3deploy.vendors import pack_for

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


def slurm_site_checks(host: str, site: SlurmSite, variables: Variables, need: Requirements) -> list[CheckResult]:
    """The site's Slurm as the submit host ``host`` read it (``k3_launcher: slurm``): its version (what
    ``k3_slurm_version: auto`` and ``k3_slurm_segment: auto`` follow) and, where the plan runs IMEX per job
    (``k3_imex: per_job``, multi-node NVLink), what hands each job its channel: ``SwitchType=switch/nvidia_imex``, or
    the prolog ``k3_imex_prolog`` names among the site's ``Prolog``. ``variables``: after the site's word
    (:func:`k3deploy.model.slurm.site_variables`)."""
    check = pack_for(need).check("slurm.site")
    if site.error is not None:
        return [CheckResult(host, "slurm.site", "warn", f"{site.error} (k3_slurm_version {variables.k3_slurm_version}"
                            f", k3_imex {variables.k3_imex})", check.required,
                            "make `scontrol --version` and `scontrol show config` answer on the submit host, or set "
                            "k3_slurm_version and k3_imex to the site's")]
    seen = (f"Slurm {site.version}, SwitchType {site.switch or '(none)'}, Prolog "
            f"{', '.join(site.prolog) or '(none)'}")
    if need.mnnvl and variables.k3_imex == "per_job" and not site.imex_per_job:
        prolog = variables.k3_imex_prolog
        if prolog is None:
            return [CheckResult(host, "slurm.site", "fail", f"k3_imex: per_job, but {seen}: nothing gives a job its "
                                "IMEX channel", check.required, check.fix)]
        if not any(fnmatch(prolog, p) or p == prolog for p in site.prolog):
            return [CheckResult(host, "slurm.site", "fail", f"k3_imex_prolog {prolog} is not a Prolog of the site "
                                f"({seen})", check.required,
                                f"add {prolog} to slurm.conf's Prolog (or its directory's glob) and `scontrol "
                                "reconfigure`, or set k3_imex_prolog to the prolog the site runs")]
    mode = f"; IMEX {variables.k3_imex}" if need.mnnvl else ""
    return [CheckResult(host, "slurm.site", "pass", f"{seen}{mode}", check.required)]


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


def run_probes(state: State, hosts: list[Any], wanted: Target, report: PreflightReport,
               rollout: Rollout | None = None) -> list[CheckResult]:
    """The vendor pack's cluster-wide probes of this round: those that run before the rollout is rendered (no
    ``rollout``), or those that run on it. ``k3_nccl_probe`` where the pack has no NCCL probe: said not run."""
    probes = vendor_checks(wanted.requirements).probes()
    at = ProbeRound(state, hosts, wanted, report.hosts, report.ok, report.host_env(), rollout)
    out = [result for p in probes if p.after_render == (rollout is not None) for result in p.run(at)]
    if rollout is not None and wanted.vars.k3_nccl_probe and not any(p.check == "nccl.probe" for p in probes):
        out.append(probe_not_run())
    return out


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
    return reach_checks(targets, unknown, ping_round(state, hosts, targets, RdmaReach))
