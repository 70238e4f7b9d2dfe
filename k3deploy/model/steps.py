"""What a rollout does on each host, as data: one step list, two renderers.

The stage (the image and the weights, :mod:`k3deploy.model.staging`), the configure phase (each unit's env file and
systemd unit, written beside the live ones), the restart (stop, start heads, rendezvous, start workers) and the
smoke test are lists of :class:`Step`: the host, the script of :mod:`k3deploy.model.commands` it runs (or the file it
writes, or the copy from the control machine), and whether it applies, decided here from what the hosts hold
(nothing on a fresh cluster, some artifacts on a partly staged one) and what changes. :mod:`k3deploy.runtime.phases`
renders the steps as pyinfra operations (one operation per step kind, called on the hosts the step applies to);
:mod:`k3deploy.model.runbook.sections` renders the same steps as command blocks, so the two run the same commands.

Pure: no pyinfra, no host I/O.

Example::

    >>> from k3deploy.model.binding import HostRecord
    >>> from k3deploy.model.pipeline import desired_rollout, target
    >>> hosts = [HostRecord("n1", ("head",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.1"}),
    ...          HostRecord("n2", ("workers",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.2"})]
    >>> rollout = desired_rollout(target(hosts, None))
    >>> [(s.host, s.name) for s in stage(rollout, fresh(rollout)) if s.applies][:2]
    [('n1', 'Image vllm/vllm-openai:kimi-k3: from the registry'), ('n1', 'Weights of moonshotai/Kimi-K3: from the hub')]
    >>> served_model(rollout)
    'moonshotai/Kimi-K3'
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from k3deploy.model import commands
from k3deploy.model.images import LocalImage, holds, named, run_ref
from k3deploy.model.rollout import Rollout, StartPlan, UnitWork
from k3deploy.model.staging import (
    ARCHIVE,
    OUTSIDE,
    StagePlan,
    addresses,
    engines,
    peers_config,
    peers_config_path,
    stage_for,
    stage_hosts,
)
from k3deploy.model.units import GROUP_MEMBER, fence_units, group_member_text
from k3deploy.recipe.argv import served_model_name

#: the stage's step kinds, in the order they run (the rounds from a peer come between ``SERVE`` and ``UNSERVE``)
(STOP_LEFTOVER, TOKEN, PULL, ARCHIVE_COPY, ARCHIVE_LOAD, NAME_BUILD, HUB, WEIGHTS_COPY, WEIGHTS_VERIFY, REQUIRE,
 EXPORT, SERVE) = range(12)
ROUND = 100          # round i of the fan-out is kind ROUND + i
UNSERVE, VERIFY_BEFORE_START = 10_000, 10_001


@dataclass(frozen=True)
class FileWrite:
    """A file a step writes: ``content``, or the control machine's file ``source`` (a secret read only when
    written); ``kind`` says how ``--diff`` shows it (``unit``, ``env``, ``secret``, ``text``)."""

    dest: str
    mode: str
    content: str = ""
    source: str | None = None
    kind: str = "text"


@dataclass(frozen=True)
class Copy:
    """A copy from the control machine (``rsync`` over the host's SSH connection): a directory ``src`` ends with
    ``/``."""

    src: str
    dest: str


@dataclass(frozen=True)
class Step:
    """One thing a rollout does on one host: a script, a file or a copy from the control machine.

    ``kind`` names the step across hosts (the same kind runs on every host at once, in the order of the kinds);
    ``applies`` is false where the step has nothing to do on this host (what the host holds, or its role)."""

    kind: int
    name: str
    host: str
    applies: bool
    script: str = ""
    file: FileWrite | None = None
    copy: Copy | None = None
    why: str = ""        # for people: what the step does (the runbook's sentence)
    peers: tuple[str, ...] = ()   # the hosts it copies from: where one of them failed, it fails saying so


def fresh(rollout: Rollout) -> StagePlan:
    """The stage of a cluster that holds nothing yet."""
    return stage_for(rollout, {}, {})


def token_path(rollout: Rollout) -> str | None:
    """Where the Hugging Face token goes on an engine node (None: no token)."""
    variables = rollout.vars
    return variables.k3_config_dir.rstrip("/") + "/hf-token" if variables.k3_hf_token_file else None


def takes_part(plan: StagePlan) -> bool:
    """Some host has something to fetch, check, export, serve or receive."""
    image, weights = plan.image, plan.weights
    return bool(image.fetch or weights.fetch or image.require or weights.require or image.export or weights.export
                or plan.rounds or plan.senders or plan.takes_part)


def stage(rollout: Rollout, plan: StagePlan, *, tag: str | None = None,
          images: Mapping[str, LocalImage | None] | None = None, leftover: Collection[str] = ()) -> list[Step]:
    """Every stage step on every host, kind by kind (hosts in inventory order within a kind).

    ``plan``: how the artifacts reach the nodes that lack them (:func:`~k3deploy.model.staging.stage_for` of what
    the hosts hold; :func:`fresh` for a cluster that holds nothing); ``tag``: the tag the pinned image was resolved
    from; ``images``: what each host holds of the image's repository; ``leftover``: hosts where an earlier run's
    rsync daemon still runs."""
    variables, model, image_ref = rollout.vars, rollout.plan.model, rollout.plan.image
    docker, cache = variables.k3_docker, variables.k3_model_cache
    held = images or {}
    engine_hosts = engines(rollout)
    where = addresses(rollout)
    image, weights = plan.image, plan.weights
    archive = commands.archive_path(variables.k3_stage_dir, image_ref)
    token = token_path(rollout)
    shown = tag or image_ref
    steps: list[Step] = []
    hosts = stage_hosts(rollout)   # the spares standing by are staged too

    def each(kind: int, name: str, build: Callable[[str], Step | None]) -> None:
        for name_of_host in hosts:
            made = build(name_of_host)
            steps.append(made if made is not None else Step(kind, name, name_of_host, False))

    each(STOP_LEFTOVER, "Peers: stop a daemon an earlier run left", lambda h: Step(
        STOP_LEFTOVER, "Peers: stop a daemon an earlier run left", h, h in leftover, commands.stop_peers(),
        why="stop the rsync daemon an earlier, stopped run left serving"))
    each(TOKEN, "Hugging Face token (0600)", lambda h: Step(
        TOKEN, "Hugging Face token (0600)", h, bool(token) and h in engine_hosts,
        file=FileWrite(token or "", "600", source=variables.k3_hf_token_file, kind="secret"),
        why="the Hugging Face token, from the control machine's file (0600; the value is never shown)"))
    if takes_part(plan):
        each(PULL, f"Image {shown}: from the registry", lambda h: Step(
            PULL, f"Image {shown}: from the registry", h, image.fetch.get(h) == OUTSIDE,
            commands.pull(docker, image_ref, tag) + (" && " + commands.export_image(docker, image_ref,
                                                                                    variables.k3_stage_dir)
                                                     if h in image.senders else ""),
            why=f"pull `{image_ref}` from the registry" + (" and write it as an archive for its peers"
                                                          if h in image.senders else "")))
        each(ARCHIVE_COPY, "Image: the archive from the control machine", lambda h: Step(
            ARCHIVE_COPY, "Image: the archive from the control machine", h, image.fetch.get(h) == ARCHIVE,
            copy=Copy(variables.k3_image_archive or "", archive),
            why=f"copy the image archive `{variables.k3_image_archive}` from the control machine"))
        each(ARCHIVE_LOAD, "Image: load the archive", lambda h: Step(
            ARCHIVE_LOAD, "Image: load the archive", h, image.fetch.get(h) == ARCHIVE,
            commands.load_image(docker, image_ref, archive, tag), why="load the image archive"))
        # a node that holds the pinned build by its digest only gets the local tag the units run
        each(NAME_BUILD, "Image: name the pinned build", lambda h: Step(
            NAME_BUILD, "Image: name the pinned build", h,
            h in engine_hosts and h not in image.fetch and h not in image.receivers
            and not named(image_ref, held.get(h)), commands.name_build(docker, image_ref, tag),
            why="give the pinned build it holds the local tag the units run"))

        def hub(h: str) -> Step:
            # the hub CLI of the pinned build where the node has it by now, else of the build its tag names there
            # (any build of the image downloads the same files: no image crosses the uplink for it), else the
            # pinned build
            local = held.get(h)
            hf_image = (run_ref(image_ref) if h in image.fetch or holds(image_ref, local) else
                        tag if tag and local is not None and local.ref_digest else image_ref)
            return Step(HUB, f"Weights of {model}: from the hub", h, weights.fetch.get(h) == OUTSIDE,
                        commands.fetch_weights(docker, cache, hf_image, model, token, variables.k3_hf_endpoint),
                        why=f"download the weights of {model} (the image's own CLI resumes a partial download), "
                            "then verify every shard")

        each(HUB, f"Weights of {model}: from the hub", hub)
        each(WEIGHTS_COPY, "Weights: from the control machine", lambda h: Step(
            WEIGHTS_COPY, "Weights: from the control machine", h, weights.fetch.get(h) == ARCHIVE,
            copy=Copy((variables.k3_weights_source or "").rstrip("/") + "/", commands.model_dir(cache, model) + "/"),
            why=f"copy the weights `{variables.k3_weights_source}` from the control machine"))
        each(WEIGHTS_VERIFY, "Weights: verify", lambda h: Step(
            WEIGHTS_VERIFY, "Weights: verify", h, weights.fetch.get(h) == ARCHIVE,
            commands.verify_weights(cache, model), why="verify the weights copied"))
        each(REQUIRE, "Weights: verify those already here", lambda h: Step(
            REQUIRE, "Weights: verify those already here", h, h in weights.require,
            commands.require_weights(cache, model),
            why="check the weights already staged (k3_download_weights is false)"))
        # then node to node: every holder hands each artifact to one node per round
        each(EXPORT, "Image: archive for peers", lambda h: Step(
            EXPORT, "Image: archive for peers", h, h in image.export,
            commands.export_image(docker, image_ref, variables.k3_stage_dir),
            why="write the image it holds as an archive for its peers"))
        config = peers_config_path(rollout)
        senders = set(plan.senders)
        each(SERVE, "Peers: serve staged files (read only)", lambda h: Step(
            SERVE, "Peers: serve staged files (read only)", h, h in senders,
            commands.serve_peers(config, peers_config(rollout, h), where[h], variables.k3_stage_port,
                                 [commands.hub_dir(cache), variables.k3_stage_dir]) if h in senders else "",
            why=f"serve the staged files to peers while the stage runs: the rsync daemon's configuration `{config}`, "
                "then the daemon"))
        # a receiver that sends to nobody is done with the stage after its last round: it removes the image archive
        # there (the unserve step is then only the senders' and the fetchers')
        last = {h: i for i in range(plan.rounds) for h in hosts if any(plan.round_of(i, h))}
        done_early = {h for h in last if h not in senders}
        for index in range(plan.rounds):
            name = f"Stage round {index + 1} of {plan.rounds}: from a peer"

            def receive(h: str, index: int = index, name: str = name) -> Step:
                from_image, from_weights = plan.round_of(index, h)
                parts, said = [], []
                if from_image:
                    parts.append(commands.receive_image(where[from_image], variables.k3_stage_port, docker, image_ref,
                                                        variables.k3_stage_dir, tag))
                    said.append(f"the image from {from_image}")
                if from_weights:
                    parts.append(commands.receive_weights(where[from_weights], variables.k3_stage_port, cache, model))
                    said.append(f"the weights from {from_weights}")
                if parts and h in done_early and last[h] == index:
                    parts.append(commands.stop_serving(variables.k3_stage_dir, image_ref))
                    said.append("then it removes the image archive (it sends to no peer)")
                peers = tuple(dict.fromkeys(p for p in (from_image, from_weights) if p))
                return Step(ROUND + index, name, h, bool(parts), " && ".join(parts), why=", ".join(said),
                            peers=peers)

            each(ROUND + index, name, receive)
        each(UNSERVE, "Peers: stop serving, remove image archives", lambda h: Step(
            UNSERVE, "Peers: stop serving, remove image archives", h, h in plan.takes_part and h not in done_early,
            commands.stop_serving(variables.k3_stage_dir, image_ref),
            why="stop serving and remove the image archive (the image stays loaded)"))
    verify = before_start(rollout, plan)
    each(VERIFY_BEFORE_START, "Weights: verify every file before the engines start", lambda h: Step(
        VERIFY_BEFORE_START, "Weights: verify every file before the engines start", h, h in verify,
        commands.verify_before_start(cache, model),
        why="hash every file of the snapshot again before the engines start"))
    return steps


def before_start(rollout: Rollout, plan: StagePlan) -> set[str]:
    """The hosts that hash every file of the snapshot again before an engine starts (the stage's last step): each
    engine host of a group that restarts, except a host whose stage verified the weights in this run already; on
    one shared cache, the first engine host of each such group."""
    weights = plan.weights
    hashed = {*weights.fetch, *weights.require, *weights.receivers}
    groups = {g: list(dict.fromkeys(u.host for u in rollout.group(g))) for g in rollout.changed_groups
              if g != "router"}
    return {h for hosts in groups.values() for h in (hosts[:1] if rollout.vars.k3_weights_shared else hosts)
            if h not in hashed}


# ------------------------------------------------------------------------------------------------ configure


def helper(rollout: Rollout, host: str) -> Step:
    """The engine units' node-side helper (:data:`~k3deploy.model.units.GROUP_MEMBER`), on a host with an
    engine."""
    return Step(0, f"Group member helper {GROUP_MEMBER}", host,
                any(u.group != "router" for u in rollout.on_host(host)),
                file=FileWrite(GROUP_MEMBER, "755", group_member_text()))


def fence_files(rollout: Rollout, host: str) -> list[FileWrite]:
    """The units that answer the node's fence record to its peers (:func:`~k3deploy.model.units.fence_units`), on
    a host with an engine (where :func:`helper` applies): written in place, started by the engine units' Wants=."""
    if not helper(rollout, host).applies:
        return []
    v = rollout.vars
    return [FileWrite(path, "644", text, kind="unit") for path, text in fence_units(v.k3_fence_port,
                                                                                 v.k3_config_dir).items()]


def unit_files(rollout: Rollout, unit: UnitWork, *, staged: bool) -> list[FileWrite]:
    """The env file (0600) and the systemd unit of ``unit``: beside the live ones (``staged``, in
    ``<k3_config_dir>/next/``: the restart puts them in place) or at their live paths (a fresh node, by hand)."""
    config = rollout.vars.k3_config_dir

    def where(live: str) -> str:
        return commands.staged_path(live, config) if staged else live

    return [FileWrite(where(unit.env_path), "600", unit.env_text, kind="env"),
            FileWrite(where(unit.unit_path), "644", unit.unit_text, kind="unit")]


# ------------------------------------------------------------------------------------------------ restart


@dataclass(frozen=True)
class HostRestart:
    """One host's scripts in each phase of a restart (empty: nothing to do there)."""

    host: str
    stop_routers: str
    stop_workers: str
    stop_heads: str
    start_heads: str
    start_workers: str           # first, one wait per rendezvous (head address, port) the worker joins
    start_routers: str


def restart(rollout: Rollout, plan: StartPlan) -> list[HostRestart]:
    """Each host's part of a restart (:class:`~k3deploy.model.rollout.StartPlan`), in the order the phases run:
    stop routers, workers, heads; start heads; the workers, each once its head's rendezvous port accepts
    connections (one script: a wait that times out ends it); (the engine groups serve); start the router."""
    timeout = rollout.vars.k3_rendezvous_timeout

    def stop(units: Sequence[str]) -> str:
        return commands.stop_units(units) if units else ""

    def start(units: Sequence[str], joins: Sequence[tuple[str, int]] = ()) -> str:
        if not units:
            return ""
        return (commands.start_joined(units, joins, timeout, rollout.vars.k3_config_dir) if joins
                else commands.start_units(units))

    return [HostRestart(h.host, stop(h.routers), stop(h.workers), stop(h.heads), start(h.heads),
                        start(h.workers, h.joins), start(h.routers)) for h in plan.hosts]


def wait_serving(rollout: Rollout, unit: UnitWork) -> str:
    """The runbook's wait until ``unit`` serves (the gate polls with the same probe)."""
    variables = rollout.vars
    if unit.group == "router":
        return commands.wait_ready(unit.unit, unit.serves, None, rollout.deadline, None, variables.k3_docker)
    return commands.wait_ready(unit.unit, unit.serves, served_model_name(unit.node.argv, rollout.plan.model),
                               rollout.deadline, unit.container, variables.k3_docker, env_file=unit.env_path)


# ------------------------------------------------------------------------------------------------ smoke


def served_model(rollout: Rollout) -> str:
    """The model name clients send: the engines' ``--served-model-name``, else the model."""
    engine_units = [u for u in rollout.units if u.group != "router"]
    return (served_model_name(engine_units[0].node.argv, rollout.plan.model) if engine_units
            else rollout.plan.model)


def smoke(rollout: Rollout) -> Step:
    """One short chat completion through the public endpoint, from the first host, with the API key its first unit's
    env file holds (where the engines have one)."""
    first = rollout.units[0]
    return Step(0, f"Chat completion through {rollout.endpoint}", first.host, rollout.vars.k3_smoke_test,
                commands.smoke_test(rollout.endpoint, served_model(rollout), first.env_path))
