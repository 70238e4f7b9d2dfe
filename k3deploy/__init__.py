"""k3deploy: deploy Kimi-K3 on vLLM to bare-metal GPU clusters.

Public API::

    from k3deploy import load_recipe, resolve
    plan = resolve(load_recipe(), hardware="gb300", strategy="multi_node_tp", nodes=2)
    for node in plan.nodes:
        print(node.role, node.rank, node.argv, node.env)

Module map, in the order data flows: recipe -> plan -> bound plan -> rendered files -> operations -> rollout.
The first two layers are pure (no pyinfra, no gevent, no host I/O; a test keeps them so).

``recipe/`` -- the recipe engine (pure)
    recipe/schema.py (the recipe YAML as a typed model), recipe/taxonomy.py (hardware profiles, strategies),
    recipe/offering.py (what a recipe offers where, recommendations, did-you-mean), recipe/fit.py (the
    strategies that fit a node count or P/D pools, the sizes that fit), recipe/rules.py (the recipes builder's merge
    rules), recipe/images.py (the image of a selection), recipe/resolve.py (a selection -> plan),
    recipe/plan.py (Plan, NodePlan), recipe/fixes.py (what the pinned engine needs to start),
    recipe/catalog.py (the pinned engine's flags and env), recipe/lint/ (findings, one rule per code),
    recipe/argv.py (values read back from an argv as vLLM's parser reads them), recipe/printing.py (commands
    printed as the recipes site prints them), recipe/compact.py (many nodes printed once: what they share, then
    each node's differences), recipe/yamlfile.py (the YAML an operator gives, read with bounds on its size and on
    its aliases' expansion).

``vendors/`` -- the vendor packs (pure), one place per vendor family
    vendors/base.py (Pack, Check, Transport, Container: what a pack is), vendors/common.py (the checks every host
    gets), vendors/nvidia/ (HGX and NVL72 trays), vendors/amd/ (Instinct), vendors/ascend/ (A2/A3): each a pure
    ``__init__`` (its pack: check ids with command, requirement and fix; transport settings; container devices,
    mounts and flags; floors; the one derivation of the transport settings), vendors/<family>/facts.py (its
    pyinfra facts: facts layer) and vendors/<family>/checks.py (the facts it reads, its judges and its cluster-wide
    probes: preflight layer; NVIDIA's NCCL probe in vendors/nvidia/probe.py); the packs are found, not listed;
    vendors/table.py (docs/requirements.md's table of what preflight checks per vendor, generated from the registry).

    model/variables.py (every knob, group_vars merged), model/inventory.py (host records, roles, the plan of an
    inventory), model/requirements.py (what a plan asks of its hosts), model/binding.py (placeholders filled per
    host), model/units.py (container command, env file, systemd unit, the node-side helper
    data/node/k3-group-member that watches a member's head and backs crash loops off), model/unitcheck.py
    (systemd-analyze verify), model/engine.py (the engine spec of a unit: argv with symbolic per-node values, env,
    container; what every launcher's files render from), model/hosttext.py (a unit file, env file or launch script
    read back from a host), model/rollout.py (units per host, start order, what restarts), model/observed.py
    (what a host has), model/diff.py (what would change), model/secrets.py (what is never shown),
    model/commands.py (every shell command the rollout runs), model/compilecache.py (the engines' compile and
    JIT caches in a directory per key of their compile inputs), model/steps.py (what a rollout does per host: stage,
    configure, restart, smoke; rendered as operations and as the runbook), model/runbook/ (the rollout as a runbook),
    model/revisions.py (numbered revisions per group, for history and rollback), model/startup.py (an engine start,
    phase by phase, from vLLM's log lines), model/timeline.py (a revision's starts drawn on one time axis: SVG, HTML),
    model/slo.py (the SLO gate:
    p95s from vLLM's /metrics histograms, the targets, the verdict, the gate a restart gets), model/correctness.py
    (questions with known answers: healthy but wrong fails the smoke test and the gate), model/bench.py (the
    benchmark: vllm bench serve's sweep, its record per revision, its picture), model/staging.py
    (the image and
    the weights over the uplink once, then node to node), model/stagecopies.py (what each stage step copies where,
    for its progress), model/checkpoint.py (a weights source read against its
    checkpoint's index before anything is copied), model/images.py (a tag resolved to one digest per
    rollout, every node on that build), model/status.py (serving, degraded or down, per unit,
    group and cluster), model/health.py (hardware-health events: XID, ECC, row remap, NVLink, NPU health, and
    which are fatal), model/pipeline.py (inventory -> variables -> requirements -> plan -> rollout),
    model/slurm.py (the Slurm launcher: a batch job per group, launch scripts that run the units' containers,
    the sbatch/squeue/scancel/sacct commands), model/jobcontainers.py (the container runtime of a Slurm site:
    pyxis, docker or apptainer, as data), model/kubernetes.py (the rollout as LeaderWorkerSet manifests: a
    pod template per role running the plan's argv, per-node values from LWS), model/kubecheck.py (what a cluster
    needs for them, with minimum versions, and check.sh: kubectl commands that verify it), model/watch.py (the
    watch loop's decision from each group's state over time: nothing, wait, repair or back off; its systemd unit),
    model/spares.py (hot spares: a lost member's rank given to a spare, the substitutions and quarantines the nodes
    record), model/vip.py (the site's virtual address: keepalived's VRRP configuration per host, held by the host
    that serves the endpoint), model/monitoring.py (Prometheus scrape targets, prometheus.yml, recording and
    alerting rules and their promtool tests), model/dashboard.py (the Grafana dashboard, built with
    grafana-foundation-sdk).

``runtime/`` -- pyinfra
    runtime/gather.py (the one pipeline: inventory, facts, checks, the rollout rendered once, installed state),
    runtime/decide.py (what a run does, decided once from what was read: what restarts, the revisions, the gate;
    the deploy and ``k3deploy plan`` alike),
    runtime/views.py (what each use reads: one named view per command), runtime/connections.py (the inventory
    loaded, hosts connected and disconnected), runtime/reading.py (the typed plan of what each host is asked, and
    its typed reading),
    runtime/operations.py (the rollout's operations), runtime/readiness.py (the readiness gates),
    runtime/slo.py (the SLO gate run: the probe load, the canary against a replica on the previous revision,
    going back to a recorded revision),
    runtime/bench.py (the benchmark run: vLLM's client from the engines' image, kept with each serving revision),
    runtime/phases.py (the phases of deploy/k3.py), runtime/pyinfra_internals.py (all that touches pyinfra's internals),
    runtime/command.py (the deploy's command lines: what ``k3deploy deploy`` runs, the inventory and the command of a
    run, the watch loop's repair),
    runtime/lock.py (the deployment lock: one run at a time changes a cluster; a lease its holder renews),
    runtime/interrupts.py (a run stopped by SIGINT, SIGTERM or SIGHUP: each group's state, the lock given back, a
    non-zero exit), runtime/launchers.py (what starts the groups, behind one interface: systemd units or, with
    k3_launcher: slurm, one Slurm batch job per group; launcher_for, the one reader of k3_launcher),
    runtime/progress.py (bytes, rate and time left of a long build or copy: rich's bar on a terminal, plain lines
    elsewhere), runtime/stageprogress.py (the stage's copies shown as they run: each receiving node's bytes read
    beside the copy's command).

``facts/`` -- pyinfra facts with pure, doctested parsers
    facts/base.py, facts/rdma.py (and how near each NIC sits to the accelerators), facts/host.py,
    facts/rollout.py (unit state, image digest, weights, revisions, smoke answer, a file's sha256),
    facts/health.py (what the vendors' hardware-health facts share: the quarantine record),
    facts/batch.py (many facts of one host read in one command: one round trip), facts/status.py (units as they
    run, the public endpoint), facts/parallel.py (every host at once), facts/spares.py (a node's spare records),
    facts/monitoring.py (the ports a node listens on: its exporters).

``preflight/`` -- host checks
    preflight/base.py (host facts, results, what a vendor's preflight side provides),
    preflight/checks.py (facts -> results), preflight/settings.py (NCCL/UCX/HCCL settings derived from facts),
    preflight/report.py (one typed report), preflight/runner.py (which facts, read on one host; local capture),
    preflight/rounds.py (a second round across hosts: each host's pings, all hosts at once), preflight/reach.py
    (expert parallelism across nodes: each RDMA port reaches each peer port), preflight/across.py (the checks
    across hosts: the router's command, the image's digest, the packs' cluster-wide probes, the RDMA reach round).

``cli/`` -- the ``k3deploy`` commands
    cli/resolve.py, cli/options.py, cli/lint.py, cli/preflight.py, cli/plan.py, cli/runbook.py, cli/vars.py,
    cli/history.py, cli/status.py, cli/bundle.py, cli/verify.py (every weight file hashed on demand), cli/bench.py
    (a load test of the endpoint, recorded per revision),
    cli/unlock.py (who holds the deployment lock; break a dead run's), cli/export.py (the Slurm batch jobs for sites
    that submit themselves), cli/export_prometheus.py (what a site loads to monitor), cli/watch.py (the control
    loop that repairs a group down past its grace, and its systemd unit), cli/spares.py (the spares, the
    quarantined nodes, a release), cli/timeline.py (a revision's starts as a picture), cli/__main__.py (``python -m
    k3deploy.cli``), cli/deploy.py (``k3deploy deploy``: the deploy from any directory, data/deploy/ the files it
    runs), cli/common.py (options defined once and composed).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from k3deploy.errors import K3Error, RecipeError, SelectionError

if TYPE_CHECKING:
    from k3deploy.recipe.plan import NodePlan, Plan
    from k3deploy.recipe.resolve import resolve
    from k3deploy.recipe.schema import Recipe, load_recipe, parse_recipe

__all__ = [
    "K3Error", "NodePlan", "Plan", "Recipe", "RecipeError", "SelectionError", "load_recipe", "parse_recipe",
    "resolve",
]
__version__ = "0.1.0"

#: the public names of the recipe engine, imported on first use (``k3deploy --help`` and the commands that need no
#: recipe start without pydantic and the recipe's schema)
_LAZY = {"NodePlan": "k3deploy.recipe.plan", "Plan": "k3deploy.recipe.plan", "resolve": "k3deploy.recipe.resolve",
         "Recipe": "k3deploy.recipe.schema", "load_recipe": "k3deploy.recipe.schema",
         "parse_recipe": "k3deploy.recipe.schema"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'k3deploy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
