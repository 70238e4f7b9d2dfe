"""What a rollout does on each host, as data: one step list, two renderers.

The stage (the image and the weights, :mod:`k3deploy.model.staging`), the configure phase (each unit's env file and
systemd unit, written beside the live ones) and the smoke test are lists of :class:`Step`: the host, the script of
:mod:`k3deploy.model.commands` it runs (or the file it writes, or the copy from the control machine), and whether it
applies, decided here from what the hosts hold (nothing on a fresh cluster, some artifacts on a partly staged one)
and what changes. The restart is one list of :class:`Action` (:func:`restart`): each step of a roll (out of the
router, drain, the launcher's stop, record and swap and starts, or its record and submit, the gate, the SLO gate,
back into the router), with typed conditions (:data:`Condition`) and barriers, whatever starts the groups (the
launcher's :class:`StartSteps`). The virtual address is steps too (:func:`virtual_address`: keepalived, or the
refusal where its interface is unknown, then the holder's wait). :mod:`k3deploy.runtime.phases` renders the steps
and actions as pyinfra operations (one operation per step kind or action, called on the hosts it applies to);
:mod:`k3deploy.model.runbook.sections` renders the same steps and actions (:func:`start_of`) as command blocks, so
the two run the same commands.

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
    >>> [(a.kind, a.role, a.hosts) for a in start_of(rollout, rollout.groups)][1:]
    [('stop', 'heads', ['n1']), ('start', 'heads', ['n1']), ('start', 'workers', ['n2']), ('gate', '', ['n1', 'n2'])]
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import partial
from typing import Literal, Protocol

from k3deploy.model import commands, compilecache, vip
from k3deploy.model.engine import EngineSpec
from k3deploy.model.hosttext import parse_env
from k3deploy.model.images import LocalImage, holds, named, run_ref
from k3deploy.model.jobcontainers import import_image, runtime
from k3deploy.model.revisions import revisions_dir
from k3deploy.model.rollout import HostStart, Placement, Rollout, StartPlan, UnitWork
from k3deploy.model.slo import GatePlan
from k3deploy.model.slurm import group_dir, host_files, image_imports, launch_path
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


class StagePart(Enum):
    """The stage's parts, in the order they run: a part's value is its place (the rounds from a peer come between
    ``SERVE`` and ``UNSERVE``, each a :class:`StageKind` of ``ROUND`` numbered within it)."""

    STOP_LEFTOVER = 0
    TOKEN = 1
    PULL = 2
    ARCHIVE_COPY = 3
    ARCHIVE_LOAD = 4
    NAME_BUILD = 5
    HUB = 6
    WEIGHTS_COPY = 7
    WEIGHTS_VERIFY = 8
    REQUIRE = 9
    EXPORT = 10
    SERVE = 11
    ROUND = 100
    CACHES = 9_000
    UNSERVE = 10_000
    CONTAINER_IMAGE = 10_001
    VERIFY_BEFORE_START = 10_002
    ROUTER_IMAGE = 10_003
    PRUNE_IMAGES = 10_004
    READAHEAD = 10_005


@dataclass(frozen=True)
class StageKind:
    """What a stage step is across hosts: its ``part`` of the stage and, for a round of the fan-out from a peer,
    which round (``round``, 0 the first). The same kind runs on every host at once, kinds in their ``order``.

    >>> StageKind(StagePart.ROUND, 1).order > StageKind(StagePart.SERVE).order, StageKind(StagePart.TOKEN).order
    (True, 1)
    """

    part: StagePart
    round: int = 0

    @property
    def order(self) -> int:
        """Its place among the stage's kinds."""
        return self.part.value + self.round


#: the kind of each part of the stage but the rounds from a peer (round ``i``: ``StageKind(StagePart.ROUND, i)``)
(STOP_LEFTOVER, TOKEN, PULL, ARCHIVE_COPY, ARCHIVE_LOAD, NAME_BUILD, HUB, WEIGHTS_COPY, WEIGHTS_VERIFY, REQUIRE, EXPORT,
 SERVE, CACHES, UNSERVE, CONTAINER_IMAGE, VERIFY_BEFORE_START, ROUTER_IMAGE, PRUNE_IMAGES, READAHEAD) = (
    StageKind(p) for p in StagePart if p is not StagePart.ROUND)


#: each stage step a node records (:func:`timed`): its name in the node's stage record, a bar of the timeline (a
#: round from a peer: its parts', ``image_from_peer`` and ``weights_from_peer``); the others (the token, the peers'
#: daemon, naming a build, removing files) take no time worth a bar
STAGE_BARS: dict[StagePart, str] = {
    StagePart.PULL: "image_pull", StagePart.ARCHIVE_COPY: "image_copy", StagePart.ARCHIVE_LOAD: "image_load",
    StagePart.HUB: "weights_download", StagePart.WEIGHTS_COPY: "weights_copy",
    StagePart.WEIGHTS_VERIFY: "weights_verify", StagePart.REQUIRE: "weights_check", StagePart.EXPORT: "image_export",
    StagePart.ROUND: "from_peer", StagePart.CACHES: "compile_caches", StagePart.CONTAINER_IMAGE: "image_file",
    StagePart.VERIFY_BEFORE_START: "verify", StagePart.ROUTER_IMAGE: "router_image", StagePart.READAHEAD: "readahead",
}


def bar_name(kind: StageKind | None) -> str | None:
    """A stage step's name in the node's stage record (a round after the first: numbered); None: not recorded.

    >>> bar_name(StageKind(StagePart.ROUND, 0)), bar_name(StageKind(StagePart.ROUND, 2)), bar_name(TOKEN)
    ('from_peer', 'from_peer_3', None)
    """
    name = STAGE_BARS.get(kind.part) if kind is not None else None
    return f"{name}_{kind.round + 1}" if name is not None and kind is not None and kind.round else name


def stage_record(config_dir: str) -> str:
    """Where a node records its stage (:data:`k3deploy.model.commands.STAGE_FILE`, beside the groups' revisions).

    >>> stage_record("/etc/k3deploy/")
    '/etc/k3deploy/revisions/stage.log'
    """
    return f"{config_dir.rstrip('/')}/revisions/{commands.STAGE_FILE}"


def timed_stage(record: str, name: str, script: str, first: bool = False) -> str:
    """``script``, a stage step on a node, in a subshell, timed into the node's stage record ``record`` as ``name``
    (:func:`k3deploy.model.commands.stage_ended`): its exit code is the script's."""
    return f"( {commands.STAGE_BEGAN}; ( {script} ); {commands.stage_ended(record, name, first)} )"


def parts_script(copies: Sequence[str], rest: Sequence[str], reset: str | None = None) -> str:
    """A step's script from its parts: its ``copies`` side by side (:func:`k3deploy.model.commands.side_by_side`),
    then the ``rest`` one after the other; ``reset``: the node's stage record begun anew before them.

    >>> parts_script(["a"], ["c"])
    'a && c'
    """
    lead = [commands.stage_reset(reset)] if reset is not None else []
    return " && ".join([*lead, *([commands.side_by_side(*copies)] if copies else []), *rest])


def timed(rollout: Rollout, staged: Sequence[Step]) -> tuple[Step, ...]:
    """The stage's ``staged`` steps (in the order they run), each script a node runs of a recorded kind
    (:func:`bar_name`) timed into the node's stage record (:func:`timed_stage`; a node's first one begins it anew);
    a round's copies (the image and the weights from a peer) side by side
    (:func:`k3deploy.model.commands.side_by_side`); a copy from the control machine (an air-gapped site's) between a
    command before it and one after it on the node; the rest as they are."""
    record = stage_record(rollout.vars.k3_config_dir)
    begun: set[str] = set()
    out = []
    for step in staged:
        name = bar_name(step.kind)
        if step.applies and step.copy is not None and name is not None:
            first = step.host not in begun
            begun.add(step.host)
            out.append(replace(step, copy=replace(step.copy, began=commands.copy_began(record),
                                                  ended=commands.copy_ended(record, name, first))))
        elif step.applies and step.script and name is not None:
            parts = step.bars or ((name, step.script),)
            numbered = f"_{step.kind.round + 1}" if step.bars and step.kind is not None and step.kind.round else ""
            named = [(part + numbered, script) for part, script in parts if part is not None]
            rest = [script for part, script in parts if part is None]
            first = step.host not in begun and bool(named)
            if named:
                begun.add(step.host)
            if len(named) > 1:   # the record begun anew before parts that run side by side, not by one of them
                timed_parts = [timed_stage(record, n, script) for n, script in named]
                script = parts_script(timed_parts, rest, reset=record if first else None)
            else:
                script = parts_script([timed_stage(record, n, script, first) for n, script in named], rest)
            out.append(replace(step, script=script))
        else:
            out.append(step)
    return tuple(out)


@dataclass(frozen=True)
class FileWrite:
    """A file a step writes: ``content``, or the control machine's file ``source`` (a secret read only when
    written); ``kind`` says how ``--diff`` shows it (``unit``, ``env``, ``secret``, ``text``). A unit's env file or
    systemd unit rendered from its engine spec carries it (``spec``): what the file says is taken from there, never
    read back from ``content``; without one (a file as a host holds it, kept by a revision) it is read back."""

    dest: str
    mode: str
    content: str = ""
    source: str | None = None
    kind: str = "text"
    when: tuple[Condition, ...] = ()   # what must hold when it is written (:class:`Intact`: its group's members)
    spec: EngineSpec | None = field(default=None, repr=False, compare=False)
    owner: str | None = None           # a user name: the file is that user's (a Slurm job's, k3_slurm_user)

    @property
    def settings(self) -> dict[str, str]:
        """An env file's settings: its spec's, or those of the text a host holds."""
        return self.spec.env_map if self.spec is not None else parse_env(self.content)


@dataclass(frozen=True)
class Copy:
    """A copy from the control machine (``rsync`` over the host's SSH connection): a directory ``src`` ends with
    ``/``. ``began`` and ``ended``: what the node runs before and after it where the copy is timed into its stage
    record (:func:`timed`)."""

    src: str
    dest: str
    began: str = ""
    ended: str = ""


@dataclass(frozen=True)
class Step:
    """One thing a rollout does on one host: a script, a file or a copy from the control machine.

    ``kind`` names a stage step across hosts (the same kind runs on every host at once, in the order of the kinds;
    None: a step of no stage); ``applies`` is false where the step has nothing to do on this host (what the host
    holds, or its role)."""

    kind: StageKind | None
    name: str
    host: str
    applies: bool
    script: str = ""
    file: FileWrite | None = None
    copy: Copy | None = None
    why: str = ""        # for people: what the step does (the runbook's sentence)
    peers: tuple[str, ...] = ()   # the hosts it copies from: where one of them failed, it fails saying so
    creates: tuple[str, ...] = ()   # the files it makes: where the host has them all, it has nothing to do
    # its script's parts, each with its name in the node's stage record (None: not recorded), where they are
    # recorded one by one (a round from a peer: the image and the weights); the script is :func:`parts_script`'s
    bars: tuple[tuple[str | None, str], ...] = ()


def fresh(rollout: Rollout) -> StagePlan:
    """The stage of a cluster that holds nothing yet."""
    return stage_for(rollout, {}, {})


def token_path(rollout: Placement) -> str | None:
    """Where the Hugging Face token goes on an engine node (None: no token)."""
    variables = rollout.vars
    return variables.k3_config_dir.rstrip("/") + "/hf-token" if variables.k3_hf_token_file else None


def takes_part(plan: StagePlan) -> bool:
    """Some host has something to fetch, check, export, serve or receive."""
    image, weights = plan.image, plan.weights
    return bool(image.fetch or weights.fetch or image.require or weights.require or image.export or weights.export
                or plan.rounds or plan.senders or plan.takes_part)


def stage(rollout: Rollout, plan: StagePlan, *, tag: str | None = None,
          images: Mapping[str, LocalImage | None] | None = None, leftover: Collection[str] = (),
          router_tag: str | None = None, router_images: Mapping[str, LocalImage | None] | None = None) -> list[Step]:
    """Every stage step on every host, kind by kind (hosts in inventory order within a kind).

    ``plan``: how the artifacts reach the nodes that lack them (:func:`~k3deploy.model.staging.stage_for` of what
    the hosts hold; :func:`fresh` for a cluster that holds nothing); ``tag``: the tag the pinned image was resolved
    from; ``images``: what each host holds of the image's repository; ``leftover``: hosts where an earlier run's
    rsync daemon still runs; ``router_tag``, ``router_images``: the same for ``k3_router_image`` (its build pulled
    by its digest on the router's host, from the registry, and named as the engines' is)."""
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
    # where the image travels as its runtime's file (a Slurm site's pyxis or apptainer): made once from the registry
    # or the archive, handed on as that file with its checksum; the nodes need no docker
    file, rt = plan.image_file, runtime(plan.runtime) if plan.runtime else None

    def each(kind: StageKind, name: str, build: Callable[[str], Step | None]) -> None:
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
            import_image(rt, image_ref, file, local=False),
            why=f"make {rt.name}'s file of `{image_ref}` from the registry (its peers get that file)")
            if file and rt else Step(
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
            f"{import_image(rt, image_ref, file, archive=archive)} && rm -f {shlex.quote(archive)}",
            why=f"make {rt.name}'s file of the image from the archive, then remove the archive")
            if file and rt else Step(
            ARCHIVE_LOAD, "Image: load the archive", h, image.fetch.get(h) == ARCHIVE,
            commands.load_image(docker, image_ref, archive, tag)
            + (" && " + commands.sum_archive(variables.k3_stage_dir, image_ref) if h in image.senders else ""),
            why="load the image archive" + (" and write its sha256 for its peers" if h in image.senders else "")))
        # a node that holds the pinned build by its digest only gets the local tag the units run
        each(NAME_BUILD, "Image: name the pinned build", lambda h: Step(
            NAME_BUILD, "Image: name the pinned build", h,
            not file and h in engine_hosts and h not in image.fetch and h not in image.receivers
            and not named(image_ref, held.get(h)), commands.name_build(docker, image_ref, tag),
            why="give the pinned build it holds the local tag the units run"))

        def hub(h: str) -> Step:
            # the hub CLI of the pinned build where the node has it by now, else of the build its tag names there
            # (any build of the image downloads the same files: no image crosses the uplink for it), else the
            # pinned build
            local = held.get(h)
            hf_image = (run_ref(image_ref) if h in image.fetch or holds(image_ref, local) else
                        tag if tag and local is not None and local.ref_digest else image_ref)
            # where the image is its runtime's file, the CLI of that file (this node made or holds it by now)
            fetch = commands.fetch_weights(docker, cache, hf_image, model, token, variables.k3_hf_endpoint) \
                if not (file and rt and h not in image.receivers) else \
                commands.fetch_weights_with(rt.download_argv(file, cache, model, token, variables.k3_hf_endpoint),
                                            cache, model)
            return Step(HUB, f"Weights of {model}: from the hub", h, weights.fetch.get(h) == OUTSIDE, fetch,
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
                                 [commands.hub_dir(cache), variables.k3_stage_dir,
                                  *([compilecache.host_root(cache)] if h in plan.cache_senders else [])])
            if h in senders else "",
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
                port, wait = variables.k3_stage_port, variables.k3_stage_hop_timeout
                up_image, up_weights = image.upstream.get(h, ()), weights.upstream.get(h, ())
                if from_image and file and up_image:   # the runtime's file along a chain
                    parts.append(commands.relay_file([(p, where[p]) for p in up_image], port, variables.k3_stage_dir,
                                                     file, wait))
                    said.append(f"the image file from {from_image} as it receives it")
                elif from_image and file:
                    parts.append(commands.receive_file(where[from_image], port, variables.k3_stage_dir, file))
                    said.append(f"the image file from {from_image}")
                elif from_image and up_image:    # along a chain: as the peer receives it, around a failed hop
                    parts.append(commands.relay_image([(p, where[p]) for p in up_image], port, docker, image_ref,
                                                      variables.k3_stage_dir, wait, tag))
                    said.append(f"the image from {from_image} as it receives it")
                elif from_image:
                    parts.append(commands.receive_image(where[from_image], port, docker, image_ref,
                                                        variables.k3_stage_dir, tag))
                    said.append(f"the image from {from_image}")
                if from_weights and up_weights:
                    parts.append(commands.relay_weights([(p, where[p]) for p in up_weights], port, cache, model, wait))
                    said.append(f"the weights from {from_weights} as it receives them")
                elif from_weights:
                    parts.append(commands.receive_weights(where[from_weights], port, cache, model))
                    said.append(f"the weights from {from_weights}")
                names = [n for n, came in (("image_from_peer", from_image), ("weights_from_peer", from_weights))
                         if came]   # a part each, in that order
                if parts and h in done_early and last[h] == index:
                    parts.append(commands.stop_serving(variables.k3_stage_dir, image_ref))
                    said.append("then it removes the image archive (it sends to no peer)")
                peers = tuple(dict.fromkeys(p for p in (from_image, *up_image, from_weights, *up_weights) if p))
                script = parts_script(parts[:len(names)], parts[len(names):])
                return Step(StageKind(StagePart.ROUND, index), name, h, bool(parts), script,
                            why=", ".join(said), peers=peers,
                            bars=tuple(zip([*names, *[None] * (len(parts) - len(names))], parts, strict=True)))

            each(StageKind(StagePart.ROUND, index), name, receive)
        shares = {h: [(c.key, c.sends[h]) for c in plan.caches if h in c.sends] for h in hosts}
        each(CACHES, "Compile caches: from a peer of the class", lambda h: Step(
            CACHES, "Compile caches: from a peer of the class", h, bool(shares[h]),
            " && ".join(commands.receive_caches(where[s], variables.k3_stage_port, cache, k) for k, s in shares[h]),
            why="copy the compile and JIT caches its engines' key needs from " + ", ".join(
                dict.fromkeys(s for _, s in shares[h])) + ", which built them" if shares[h] else "",
            peers=tuple(dict.fromkeys(s for _, s in shares[h]))))
        each(UNSERVE, "Peers: stop serving, remove image archives", lambda h: Step(
            UNSERVE, "Peers: stop serving, remove image archives", h, h in plan.takes_part and h not in done_early,
            commands.stop_serving(variables.k3_stage_dir, image_ref),
            why="stop serving and remove the image archive (the image stays loaded)"))
    verify = before_start(rollout, plan)
    each(VERIFY_BEFORE_START, "Weights: verify every file before the engines start", lambda h: Step(
        VERIFY_BEFORE_START, "Weights: verify every file before the engines start", h, h in verify,
        commands.verify_before_start(cache, model),
        why="hash every file of the snapshot again before the engines start"))
    router_image = variables.k3_router_image
    if router_image:   # the router's build, where it runs one: its stage is its host's pull (a small image)
        router_hosts = {u.host for u in rollout.units if u.group == "router"}
        router_held = router_images or {}
        title = f"Router image {router_tag or router_image}: from the registry"
        each(ROUTER_IMAGE, title, lambda h: Step(
            ROUTER_IMAGE, title, h, h in router_hosts and not named(router_image, router_held.get(h)),
            commands.pull(docker, router_image, router_tag),
            why=f"pull the router's build `{router_image}` from the registry (verified by its digest) and give it "
                "the local tag its unit runs"))
    if plan.stale:   # the runtime's older image files: of images no kept revision runs
        title = "Image files: remove those of images no kept revision runs"
        each(PRUNE_IMAGES, title, lambda h: Step(
            PRUNE_IMAGES, title, h, bool(plan.stale.get(h)),
            " ".join(["rm -f", *(shlex.quote(f"{p}{x}") for p in plan.stale[h] for x in ("", ".sha256"))])
            if plan.stale.get(h) else "",
            why="remove the image files (and their checksums) of images that no kept revision of any group runs"))
    if variables.k3_readahead:
        warm = {u.host for g in rollout.changed_groups if g != "router" for u in rollout.group(g)}
        each(READAHEAD, "Weights: into the page cache", lambda h: Step(
            READAHEAD, "Weights: into the page cache", h, h in warm, commands.readahead(cache, model),
            why="read every shard of the snapshot once at idle I/O priority, so the engine's load reads memory"))
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
    return Step(None, f"Group member helper {GROUP_MEMBER}", host,
                any(u.group != "router" for u in rollout.on_host(host)),
                file=FileWrite(GROUP_MEMBER, "755", group_member_text()))


def fence_files(rollout: Rollout, host: str) -> list[FileWrite]:
    """The units that answer the node's fence record to its peers (:func:`~k3deploy.model.units.fence_units`), on
    a host with an engine (where :func:`helper` applies): written in place, started by the engine units' Wants=."""
    if not helper(rollout, host).applies:
        return []
    v = rollout.vars
    return [FileWrite(path, "644", text) for path, text in fence_units(v.k3_fence_port, v.k3_config_dir).items()]


def unit_files(rollout: Rollout, unit: UnitWork, *, staged: bool) -> list[FileWrite]:
    """The env file (0600) and the systemd unit of ``unit``: beside the live ones (``staged``, in
    ``<k3_config_dir>/next/``: the restart puts them in place) or at their live paths (a fresh node, by hand)."""
    config = rollout.vars.k3_config_dir

    def where(live: str) -> str:
        return commands.staged_path(live, config) if staged else live

    return [FileWrite(where(unit.env_path), "600", unit.env_text, kind="env",
                      spec=unit.spec if unit.kept_env_text is None else None),
            FileWrite(where(unit.unit_path), "644", unit.unit_text, kind="unit",
                      spec=unit.spec if unit.kept_unit_text is None else None)]


#: the systemd units' configure step (a rolling change's steps name theirs after it)
CONFIGURE = "Env file (0600), staged, systemd unit, group member helper"


@dataclass(frozen=True)
class Configure:
    """A host's configure step, the launcher's (:meth:`StartSteps.configure`): the directories it makes
    (``dirs``, one operation named ``dirs_name``), then, in one operation named ``name``, the files it writes in
    place and the ``staged`` units' env file (0600) and systemd unit written beside the live ones
    (:func:`unit_files`); with ``restore``, owner and mode given back to the live ones where they drifted."""

    host: str
    name: str
    files: tuple[FileWrite, ...] = ()
    staged: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()
    dirs_name: str = ""
    restore: bool = False
    owner: str | None = None           # k3_slurm_user: the user whose are ``owned`` (of ``dirs``)
    owned: tuple[str, ...] = ()
    opened: tuple[str, ...] = ()       # of ``dirs``, those others pass through (go+x: the job's user's files in it)


# ------------------------------------------------------------------------------------------------ restart


# The restart as data: every operation of the start phase, in the order it runs, whatever starts the groups. Each
# :class:`Action` says what it does on which hosts and when it goes ahead (:data:`Condition`); the launcher's own part
# (the units' stops, swap and starts, or the jobs' record and submit) comes from its :class:`StartSteps`.


@dataclass(frozen=True)
class Serves:
    """Condition: every one of ``groups`` serves, every one of the router ``calls`` succeeded, and the run was not
    interrupted."""

    groups: tuple[str, ...]
    calls: tuple[RouterCall, ...] = ()


@dataclass(frozen=True)
class Begins:
    """Condition: restart step ``wave`` (of ``groups``) goes ahead: no member of its groups failed an earlier step
    and no canary missed (decided once, when its first operation runs)."""

    wave: int
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Keeps:
    """Condition: ``group`` serves what this run started it with (the SLO gate did not take it back)."""

    group: str


@dataclass(frozen=True)
class Missed:
    """Condition: a group missed the SLO gate in this run."""


@dataclass(frozen=True)
class Intact:
    """Condition: no host of ``group`` failed an earlier step of this run (and the run was not interrupted): the
    group's files may be written."""

    group: str


Condition = Serves | Begins | Keeps | Missed | Intact
@dataclass(frozen=True)
class RouterCall:
    """A call of a roll to the router: take step ``step``'s replicas out (``remove``) or put them back (``add``)."""

    action: Literal["add", "remove"]
    step: int

    @staticmethod
    def before(step: int, *, out: bool = False) -> list[RouterCall]:
        """The calls restart step ``step`` of a roll waits for: every earlier step's replicas put back, and with
        ``out`` its own replicas taken out."""
        return [*(RouterCall("add", j) for j in range(step)), *([RouterCall("remove", step)] if out else [])]

#: what an action does (the renderers' switch): ``rebuild`` a record cut short, put the ``missing`` replicas back
#: into the router, take a replica ``out`` of it, ``drain`` its requests, ``stage`` its files, ``stop`` units,
#: ``swap`` (record the revision, put its files in place), ``start`` units (workers: once their head's rendezvous
#: port accepts connections), ``record`` a job's revision, ``submit`` jobs, ``gate`` (the groups serve), the
#: ``slo`` gate, ``mark`` a rolled replica's revision current, put a replica back ``in`` the router, ``current``
#: (mark a group's revision once it serves), the SLO ``verdict``
Kind = Literal["rebuild", "missing", "out", "drain", "stage", "stop", "swap", "start", "record", "submit", "gate",
               "slo", "mark", "in", "current", "verdict"]


@dataclass(frozen=True)
class Part:
    """What an action does on one host: its ``script`` (:mod:`k3deploy.model.commands`), the ``units`` it stops,
    starts or stages (workers: the ``joins``, each ``(address, port)`` of a head's rendezvous they wait for), the
    ``groups`` it waits for or submits, and what must also hold there (``when``)."""

    host: str
    script: str = ""
    units: tuple[str, ...] = ()
    joins: tuple[tuple[str, int], ...] = ()
    groups: tuple[str, ...] = ()
    stops: tuple[str, ...] = ()     # ``submit``: the groups whose jobs are cancelled first
    when: tuple[Condition, ...] = ()
    active: bool = True


@dataclass(frozen=True)
class Action:
    """One operation of the restart: ``parts`` where it acts, ``when`` what must hold when it runs. A ``barrier``
    is called on every host (doing nothing where it has no part): nothing any host calls after it runs before it
    ended on every host, which keeps the steps of a roll apart. ``role``: whose units (``routers``, ``workers``,
    ``heads``) a ``stop`` or ``start`` acts on; ``call``: the router call whose outcome it records; ``timeout``:
    the longest it may take on a host (None: the connection's bound)."""

    kind: Kind
    name: str
    parts: tuple[Part, ...]
    when: tuple[Condition, ...] = ()
    barrier: bool = False
    wave: int | None = None
    role: str = ""
    call: RouterCall | None = None
    timeout: int | None = None

    def on(self, host: str) -> Part | None:
        """This action's part on ``host`` (None: it has none there)."""
        return next((p for p in self.parts if p.host == host), None)

    @property
    def hosts(self) -> list[str]:
        return [p.host for p in self.parts]


@dataclass(frozen=True)
class Decisions:
    """What the run decided before the restart, with which the steps are built: each changing group's revision
    number and ``meta.json``, the revision each group is marked with once it serves, the groups whose nodes name
    different current revisions, each unit's staged files that move onto the live ones (``(host, unit) ->
    (staged, live)``), the units read as stopped, the records cut short a host writes again (host ->
    ``(group, number, record)``), and the SLO gate with the host that runs it."""

    numbers: Mapping[str, int] = field(default_factory=dict)
    metas: Mapping[str, str] = field(default_factory=dict)
    marks: Mapping[str, int] = field(default_factory=dict)
    repairs: tuple[str, ...] = ()
    changes: Mapping[tuple[str, str], tuple[tuple[str, str], ...]] = field(default_factory=dict)
    stopped: frozenset[tuple[str, str]] = frozenset()
    rebuild: Mapping[str, tuple[tuple[str, int, str], ...]] = field(default_factory=dict)
    gate: GatePlan | None = None
    gate_host: str | None = None


class StartSteps(Protocol):
    """A launcher's part of the restart (:func:`restart`): what runs before the restart's steps, its part of each
    step between the roll's drain and the gate, how the router starts, and whether the router's worker file lists
    the replicas and a rolled replica is marked current in its own step."""

    @property
    def idle(self) -> str:
        """What a run says where nothing restarts."""

    @property
    def worker_file(self) -> bool:
        """The router's worker file lists the replicas (a roll's router calls rewrite it)."""

    @property
    def marks_in_roll(self) -> bool:
        """A rolled replica is marked current in its own step."""

    def keep_starts(self, rollout: Rollout, group: str, host: str, number: int) -> str:
        """The shell that keeps the last start of each of ``group``'s units on ``host`` with its revision ``number``
        (``startup-<unit>.log``), read from where the launcher's units log their lines (the mark's part)."""

    def configure(self, rollout: Rollout, host: str) -> Configure | None:
        """``host``'s configure step (None: nothing there)."""

    def staged(self, rollout: Rollout) -> list[Step]:
        """Its steps of the stage, once the image is on every node (the image in the form its runtime reads)."""

    def before(self, rollout: Rollout, decided: Decisions) -> list[Action]:
        """What runs before the first step (records written again)."""

    def engines(self, rollout: Rollout, plan: StartPlan, wave: int, groups: Sequence[str], label: str,
                when: tuple[Condition, ...], decided: Decisions, rolling: bool = False) -> list[Action]:
        """The launcher's part of one step, once the groups may restart (``when``; ``rolling``: a step of a roll
        behind the router)."""

    def gate_groups(self, rollout: Rollout, plan: StartPlan, host: str, rolling: bool) -> list[str]:
        """The engine groups ``host`` waits for in a step."""

    def router(self, rollout: Rollout, plan: StartPlan, when: tuple[Condition, ...]) -> list[Action]:
        """The router's start (and its gate), once the engine groups serve."""


def _stop(role: str, stopped: frozenset[tuple[str, str]], start: HostStart) -> str:
    """The stop of ``role``'s units on a host, but those read as stopped (empty: none runs)."""
    up = [u for u in getattr(start, role) if (start.host, u) not in stopped]
    return commands.stop_units(up) if up else ""


def _unit_parts(plan: StartPlan, role: str, script: Callable[[HostStart], str]) -> tuple[Part, ...]:
    """A part on each host with ``role``'s units (``routers``, ``workers``, ``heads``) in ``plan``."""
    return tuple(Part(h.host, script(h), tuple(getattr(h, role)), tuple(h.joins) if role == "workers" else ())
                 for h in plan.hosts if getattr(h, role))


def _gate(rollout: Rollout, plan: StartPlan, launcher: StartSteps, label: str, when: tuple[Condition, ...],
          rolling: bool, wave: int) -> Action | None:
    parts = tuple(Part(h, groups=tuple(g)) for h in rollout.hosts
                  if (g := launcher.gate_groups(rollout, plan, h, rolling)))
    return Action("gate", f"Engine groups serve (health, models){label}", parts, when, wave=wave) if parts else None


@dataclass(frozen=True)
class UnitSteps:
    """The systemd units' part (:class:`~k3deploy.runtime.launchers.Systemd`): routers, workers, then heads
    stopped (where some unit of the step may run), the revision recorded and its files put in place, the heads
    started, then the workers, each once its head's rendezvous port accepts connections; the router once the engine
    groups serve."""

    idle: str = "every group runs the planned version: nothing restarts"
    worker_file: bool = True
    marks_in_roll: bool = True

    def keep_starts(self, rollout: Rollout, group: str, host: str, number: int) -> str:
        """From the journal of each unit's last invocation (:func:`k3deploy.model.commands.keep_startup`)."""
        return commands.keep_startup(revisions_dir(rollout.vars.k3_config_dir, group), number,
                                     [u.unit for u in rollout.group(group) if u.host == host])

    def staged(self, rollout: Rollout) -> list[Step]:
        """None: the units run the image from the node's docker, where the stage put it."""
        return []

    def configure(self, rollout: Rollout, host: str) -> Configure:
        """The engine units' helper, the units that answer the node's fence record to its peers and each unit's
        next env file and systemd unit, staged, but a rolling change's replicas' (each gets its files in its own
        step of the roll: a roll that stops leaves the replicas after it on the files they run); on every host,
        even where nothing is written (every host's sequence keeps the same steps at the same depths)."""
        made = helper(rollout, host)
        files = [made.file] if made.applies and made.file is not None else []
        rolled = {g for wave in rollout.waves() for g in wave} if rollout.rolling else set()
        return Configure(host, CONFIGURE, (*files, *fence_files(rollout, host)),
                         tuple(u.unit for u in rollout.on_host(host) if u.group not in rolled), restore=True)

    def before(self, rollout: Rollout, decided: Decisions) -> list[Action]:
        """Each record cut short on a host whose files hash to what the group's other nodes recorded, written
        again from their record (before anything restarts, so a rollback can restore it)."""
        cfg = rollout.vars.k3_config_dir
        out = []
        for h in rollout.hosts:
            for group, n, record in decided.rebuild.get(h, ()):
                out.append(Action("rebuild", f"Write the record of revision {n} of group {group} again (cut short on "
                                             "this node)",
                                  (Part(h, commands.rewrite_record(revisions_dir(cfg, group), n, record)),)))
        return out

    def engines(self, rollout: Rollout, plan: StartPlan, wave: int, groups: Sequence[str], label: str,
                when: tuple[Condition, ...], decided: Decisions, rolling: bool = False) -> list[Action]:
        r = rollout
        out: list[Action] = []
        if rolling:   # each replica gets its files in its own step of the roll: a roll that stops leaves the
            # replicas after it on the files they run
            staged = tuple(Part(h, units=tuple(u.unit for u in r.on_host(h) if u.group in groups)) for h in r.hosts
                           if any(u.group in groups for u in r.on_host(h)))
            if staged:
                out.append(Action("stage", f"Env file (0600), staged, systemd unit{label}", staged, when, wave=wave))
        # a change anywhere in a group restarts the whole group: router, workers, then heads (each host calls its
        # stops even where its units are stopped: the starts after them stay as deep in every host's sequence, so
        # that no worker's start comes before its head's; where no unit of the step runs on any host, as in a
        # first rollout, no host calls them)
        if any((h.host, u) not in decided.stopped for h in plan.hosts for u in (*h.routers, *h.workers, *h.heads)):
            for role, title in (("routers", "Stop routers of restarting groups"),
                                ("workers", f"Stop workers of restarting groups{label}"),
                                ("heads", f"Stop heads of restarting groups{label}")):
                parts = _unit_parts(plan, role, partial(_stop, role, decided.stopped))
                if parts:
                    out.append(Action("stop", title, parts, when, wave=wave, role=role))
        # every host records and swaps before any head starts: a run killed after this leaves every member of a
        # group on the files of one recorded revision
        swaps = tuple(Part(h, text) for h in r.hosts if (text := commands.then(*swap(r, h, groups, decided))))
        if swaps:
            out.append(Action("swap", f"Record the new revision, put its files in place{label}", swaps, when,
                              wave=wave))
        timeout = r.vars.k3_rendezvous_timeout
        heads = _unit_parts(plan, "heads", lambda h: commands.start_units(h.heads))
        if heads:
            out.append(Action("start", f"Start group heads{label}", heads, when, wave=wave, role="heads"))
        # one command: the wait for the head's rendezvous port (tried from this node), then the start
        workers = _unit_parts(plan, "workers", lambda h: commands.start_joined(h.workers, h.joins, timeout,
                                                                               r.vars.k3_config_dir)
                              if h.joins else commands.start_units(h.workers))
        if workers:
            out.append(Action("start", f"Start workers once their head's rendezvous port accepts connections{label}",
                              workers, when, wave=wave, role="workers", timeout=timeout + r.vars.k3_link_timeout))
        return out

    def gate_groups(self, rollout: Rollout, plan: StartPlan, host: str, rolling: bool) -> list[str]:
        # the router starts once the engine groups serve: its host waits for them too, even where none of them runs
        # on it (a replica whose head moved to a spare), so that its start comes after their gate
        if plan.on(host).routers and not rolling:
            return list(plan.engine_groups)
        return sorted({u.group for u in rollout.on_host(host) if u.group in plan.engine_groups})

    def router(self, rollout: Rollout, plan: StartPlan, when: tuple[Condition, ...]) -> list[Action]:
        parts = _unit_parts(plan, "routers", lambda h: commands.start_units(h.routers))
        if not parts:
            return []
        return [Action("start", "Start router", parts, when, role="routers"),
                Action("gate", "Router serves", tuple(Part(p.host, groups=("router",)) for p in parts), when)]


@dataclass(frozen=True)
class JobSteps:
    """A Slurm job per group's part (:class:`~k3deploy.runtime.launchers.Slurm`): each node records the revision
    (its launch scripts and env files, written in place by the configure phase), then, on the submit host, the
    restarting groups' jobs are cancelled and the engine groups' submitted (each job starts its head, waits for its
    rendezvous port from each worker's node, starts the workers); the router's job once the engine groups serve."""

    submit_host: str
    idle: str = "every group's job runs the planned revision: nothing is submitted"
    worker_file: bool = False
    marks_in_roll: bool = False

    def keep_starts(self, rollout: Rollout, group: str, host: str, number: int) -> str:
        """From the node's step output of the group's newest job (no journal holds a job step's lines:
        :func:`k3deploy.model.commands.keep_step_startup`)."""
        return commands.keep_step_startup(revisions_dir(rollout.vars.k3_config_dir, group), number,
                                          [u.unit for u in rollout.group(group) if u.host == host],
                                          group_dir(rollout, group), host)

    def configure(self, rollout: Rollout, host: str) -> Configure | None:
        """``host``'s Slurm files (:func:`k3deploy.model.slurm.host_files`): on each node its env files (0600) and
        launch scripts and its groups' output directories, on the submit host the batch scripts; in place at once
        (a running job keeps the files it started with: sbatch copied its batch script, each step's shell and
        container read theirs when they started), a unit's not for a group with a member that failed an earlier
        step. None: a host with none."""
        mine = next((f for f in host_files(rollout, self.submit_host) if f.host == host), None)
        if mine is None:
            return None
        groups = {p: u.group for u in rollout.on_host(host) for p in (u.env_path, launch_path(rollout, u))}
        return Configure(host, "Env files (0600), launch scripts, batch scripts", tuple(
            FileWrite(f.path, f.mode, f.text, kind="env" if f.mode == "0600" else "text",
                      when=(Intact(groups[f.path]),) if f.path in groups else (), spec=f.spec, owner=f.owner)
            for f in mine.files), dirs=(rollout.vars.k3_config_dir, *mine.dirs),
            dirs_name="Slurm output and batch script directories", owner=rollout.vars.k3_slurm_user,
            owned=mine.owned, opened=(rollout.vars.k3_config_dir,) if mine.owned else ())

    def staged(self, rollout: Rollout) -> list[Step]:
        """On every host of the stage, each image its units run in the form the site's container runtime reads
        (:func:`k3deploy.model.slurm.image_imports`): made once, keyed by the image's digest."""
        out = []
        for h in stage_hosts(rollout):
            made = image_imports(rollout, h)
            out.append(Step(CONTAINER_IMAGE, "Image: in the form the Slurm container runtime reads", h, bool(made),
                            " && ".join(s for _, s in made), why="make the image file the jobs' containers run "
                            "from (pyxis: enroot import to a squashfs; apptainer: a SIF), unless the node has it",
                            creates=tuple(p for p, _ in made)))
        return out

    def before(self, rollout: Rollout, decided: Decisions) -> list[Action]:
        return []

    def engines(self, rollout: Rollout, plan: StartPlan, wave: int, groups: Sequence[str], label: str,
                when: tuple[Condition, ...], decided: Decisions, rolling: bool = False) -> list[Action]:
        r = rollout
        records = []
        for h in r.hosts:
            keep = [commands.record_revision(revisions_dir(r.vars.k3_config_dir, g), decided.numbers[g],
                                             [(p, p.rsplit("/", 1)[-1]) for u in r.group(g) if u.host == h
                                              for p in (launch_path(r, u), u.env_path)], decided.metas[g])
                    for g in groups if g in decided.numbers and any(u.host == h for u in r.group(g))]
            if keep:   # record_revision ends with a here-document: each in its own block, on lines of its own
                records.append(Part(h, "\n".join(f"{{ {k}\n}}" for k in keep)))
        out = [Action("record", f"Record the new revision (launch scripts, env files){label}", tuple(records), when,
                      wave=wave)] if records else []
        out.append(Action("submit", f"Cancel the restarting groups' jobs, submit the engine groups' jobs{label}",
                          (Part(self.submit_host, groups=tuple(plan.engine_groups), stops=tuple(groups)),), when,
                          wave=wave))
        return out

    def gate_groups(self, rollout: Rollout, plan: StartPlan, host: str, rolling: bool) -> list[str]:
        return sorted({u.group for u in rollout.on_host(host) if u.group in plan.engine_groups})

    def router(self, rollout: Rollout, plan: StartPlan, when: tuple[Condition, ...]) -> list[Action]:
        router = next((u for u in rollout.units if u.group == "router"), None)
        if not plan.router or router is None:
            return []
        return [Action("submit", "Submit the router's job", (Part(self.submit_host, groups=("router",)),), when),
                Action("gate", "Router serves", (Part(router.host, groups=("router",)),), when)]


def swap(rollout: Rollout, host: str, groups: Sequence[str], decided: Decisions) -> list[str]:
    """``host``'s part of putting ``groups``' new files in place, once their units are stopped, as scripts to run one
    after the other (:func:`k3deploy.model.commands.then`): each changing group's revision is recorded first (copies
    of the files it will run: the staged ones where they change, the live ones where not, and its ``meta.json``),
    then the staged files move onto the live ones. A rollback records nothing: it goes back to a recorded
    revision."""
    r = rollout
    parts = []
    pairs: list[tuple[str, str]] = []
    for group in groups:
        mine = [u for u in r.group(group) if u.host == host]
        if not mine:
            continue
        changes = {live: staged for u in mine for staged, live in decided.changes.get((u.host, u.unit), ())}
        pairs += [(staged, live) for live, staged in changes.items()]
        if group in decided.numbers:
            files = [(changes.get(p, p), p.rsplit("/", 1)[-1]) for u in mine for p in (u.unit_path, u.env_path)]
            parts.append(commands.record_revision(revisions_dir(r.vars.k3_config_dir, group), decided.numbers[group],
                                                  files, decided.metas[group]))
    router = next((u for u in r.group("router") if u.host == host), None) if "router" in groups else None
    if router is not None:   # the router restarts with every replica: its worker file lists them all
        parts.append(commands.router_list(r.router_list(router, r.replicas)))
    # the files move only once every record is kept
    return [*parts, commands.swap_in(pairs)] if pairs else parts


def start_order(rollout: Rollout, launcher: StartSteps | None = None) -> list[str]:
    """``host:unit`` in the order the restart (:func:`restart`) starts them, what ``plan`` shows: each ``start``
    action's units, or each group of a ``submit`` (a job starts its head, then its workers); ``launcher``: whose
    start steps (default: systemd units', :data:`UNITS`).

    >>> from k3deploy.model.binding import HostRecord
    >>> from k3deploy.model.pipeline import desired_rollout, target
    >>> hosts = [HostRecord("n1", ("head",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.1"}),
    ...          HostRecord("n2", ("workers",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.2"})]
    >>> layout = desired_rollout(target(hosts, None))
    >>> start_order(layout.decided(layout.groups))
    ['n1:k3-engine.service', 'n2:k3-engine.service']
    """
    out: list[str] = []
    for action in restart(rollout, launcher if launcher is not None else UNITS):
        if action.kind == "start":
            out += [f"{p.host}:{u}" for p in action.parts for u in p.units]
        elif action.kind == "submit":
            out += [f"{u.host}:{u.unit}" for p in action.parts for g in p.groups for u in rollout.group(g)]
    return list(dict.fromkeys(out))


def restart(rollout: Rollout, launcher: StartSteps, decided: Decisions | None = None) -> list[Action]:
    """Every operation of the start phase, in order: what the launcher runs first; the replicas the router left
    out put back; then each step of the restart (one, or with a rolling change one per wave of replicas): the
    replica taken out of the router and drained, the launcher's part (stop, record and swap, start heads, then
    workers; or record and submit jobs), the groups' gate, the SLO gate, the replica marked current and put back
    (or the router started and gated); then each restarted group marked current on every host, and the SLO gate's
    verdict. A step goes ahead only once every earlier step's replicas serve and are back in the router.

    Changing the rollout's order is changing this function."""
    d = decided if decided is not None else Decisions()
    r = rollout
    waves = r.waves()
    router = next((u for u in r.units if u.group == "router"), None)
    out = launcher.before(r, d)
    missing = r.missing_from_router()
    if missing and router is not None:
        urls = r.serving_urls(missing)
        out.append(Action("missing", "Put serving replicas the router left out back in "
                                     f"({', '.join(missing) or 'none'})",
                          (Part(router.host, commands.router_add(router.serves or "", urls, r.ready_timeout,
                                                                 *_listed(r, router, r.replicas, launcher)),
                                active=bool(urls)),)))
    gate = d.gate
    for i, wave in enumerate(waves):
        plan = r.start_plan(set(wave))
        earlier = tuple(g for w in waves[:i] for g in w)
        rolling = r.rolling and router is not None
        adds: tuple[RouterCall, ...] = tuple(RouterCall("add", j) for j in range(i))
        begins = Begins(i, tuple(wave))
        go: tuple[Condition, ...] = (Serves(earlier, adds if rolling else ()), begins)
        # the replica is restarted only once the router no longer sends it requests
        ready = (Serves(earlier, (*adds, RouterCall("remove", i))), begins) if rolling else go
        label = f" ({', '.join(wave)}, step {i + 1} of {len(waves)})" if r.rolling else ""
        urls = r.serving_urls(wave)
        if rolling and router is not None:
            # a barrier: with the one that puts the replica back, it bounds the step on every host
            out.append(Action("out", f"Take the replica out of the router{label}", (Part(
                router.host, commands.router_remove(router.serves or "", urls, *_listed(
                    r, router, [g for g in r.replicas if g not in wave], launcher))),), go, barrier=True, wave=i,
                call=RouterCall("remove", i)))
            draining = tuple(Part(h, " && ".join(commands.drain(u, r.vars.k3_drain_timeout, r.vars.k3_poll_interval)
                                                 for u in served))
                             for h in r.hosts
                             if (served := [u.serves for g in wave for u in r.group(g) if u.serves and u.host == h]))
            if draining:
                out.append(Action("drain", f"Let its in-flight requests finish{label}", draining, ready, wave=i,
                                  timeout=r.vars.k3_drain_timeout + r.vars.k3_link_timeout))
        out += launcher.engines(r, plan, i, wave, label, ready, d, rolling)
        gated = _gate(r, plan, launcher, label, ready, rolling, i)
        if gated is not None:
            out.append(gated)
        engines_serve: tuple[Condition, ...] = (
            Serves((*earlier, *plan.engine_groups), (*adds, RouterCall("remove", i)) if rolling else ()),)
        if gate is not None and i == 0 and (gate.kind == "group" or rolling) and d.gate_host is not None:
            out.append(Action("slo", f"SLO gate: {gate.kind_title}{label}", (Part(d.gate_host),), engines_serve,
                              barrier=True, wave=i))
        if rolling and launcher.marks_in_roll:
            # a rolled replica is marked current as soon as it serves, on every one of its nodes in one step,
            # before the router call that puts it back
            marking = tuple(Part(h, " && ".join(_marked(r, g, h, _mark(r, g, d.marks[g], h, launcher))
                                                for g in marked),
                                 when=tuple(Keeps(g) for g in marked))
                            for h in r.hosts
                            if (marked := [g for g in wave if g in launcher.gate_groups(r, plan, h, rolling)
                                           and d.marks.get(g) is not None]))
            if marking:
                out.append(Action("mark", f"Mark the revision of the replica current{label}", marking, engines_serve,
                                  wave=i))
        if rolling and router is not None:   # a barrier, the step's last operation (see its first)
            out.append(Action("in", f"Put the replica back into the router{label}", (Part(
                router.host, commands.router_add(router.serves or "", urls, r.ready_timeout,
                                                 *_listed(r, router, r.replicas, launcher))),),
                engines_serve, barrier=True, wave=i, call=RouterCall("add", i)))
        else:
            out += launcher.router(r, plan, engines_serve)
    out += _current(r, launcher, d)
    if gate is not None and d.gate_host is not None:
        out.append(Action("verdict", "SLO gate: the verdict", (Part(d.gate_host),), (Missed(),), barrier=True))
    return out


#: the systemd units' part of the restart
UNITS = UnitSteps()


def start_of(rollout: Rollout, groups: Collection[str], launcher: StartSteps = UNITS) -> list[Action]:
    """The stop and start of ``groups`` as one step of :func:`restart` (the runbook's start, a rollback, one replica
    of a roll), whatever the hosts hold: every unit stopped, started, gated."""
    plan = rollout.start_plan(set(groups))
    out = launcher.engines(rollout, plan, 0, [g for g in rollout.groups if g in groups], "", (), Decisions())
    gated = _gate(rollout, plan, launcher, "", (), False, 0)
    return out + ([gated] if gated is not None else []) + launcher.router(rollout, plan, ())


def _listed(rollout: Rollout, router: UnitWork, groups: list[str],
            launcher: StartSteps) -> tuple[tuple[str, list[str]] | None, ...]:
    """The router's worker file listing ``groups`` as a router call's last argument, where the launcher keeps one."""
    return (rollout.router_list(router, groups),) if launcher.worker_file else ()


def _mark(rollout: Rollout, group: str, number: int, host: str, launcher: StartSteps) -> str:
    """On ``host``, once ``group`` serves: revision ``number`` becomes current, and the start of each of the group's
    units there (with the node's stage toward it: :func:`k3deploy.model.commands.kept_stage`), read where the
    launcher says its lines are (:meth:`StartSteps.keep_starts`), is kept in the
    revision's directory (:func:`k3deploy.model.commands.keep_startup`)."""
    directory = revisions_dir(rollout.vars.k3_config_dir, group)
    staged = commands.kept_stage(stage_record(rollout.vars.k3_config_dir), directory)
    return (f"{commands.set_current(directory, number)} && {{ {staged}; }} && "
            f"{launcher.keep_starts(rollout, group, host, number)}")


def _marked(rollout: Rollout, group: str, host: str, script: str) -> str:
    """``script`` (a group's revision made current on ``host``), then the compile caches its engines there served
    from marked whole (:func:`~k3deploy.model.commands.mark_caches`): the stage hands them on from then on."""
    keys = list(dict.fromkeys(k for u in rollout.group(group) if u.host == host and u.spec is not None
                              if (k := compilecache.key_of(u.spec.env_map)) is not None))
    return f"{script} && {commands.mark_caches(rollout.vars.k3_model_cache, keys)}" if keys else script


def _current(rollout: Rollout, launcher: StartSteps, decided: Decisions) -> list[Action]:
    """Once a restarted group serves, on each of its hosts: the revision it runs becomes the current one (a group
    that did not restart records nothing: no action for it). Each is called on every host (doing something on its
    own hosts): the last operations every host shares, so that nothing of the restart runs after them."""
    r = rollout
    # (a rolled replica was marked in its own step; a group whose nodes' marks differ is marked again)
    rolled = ({g for w in r.waves() for g in w} if r.rolling and launcher.marks_in_roll
              and any(u.group == "router" for u in r.units) else set())
    changed = [g for g in r.groups if (g in r.changed_groups and g not in rolled) or g in decided.repairs]
    out = []
    for group in changed:
        number = decided.marks.get(group)
        here = {u.host for u in r.group(group)}
        parts = tuple(Part(h, _marked(r, group, h, _mark(r, group, number, h, launcher))
                           if h in here and number is not None else "") for h in r.hosts)
        out.append(Action("current", f"Mark the revision of group {group} current", parts, (Keeps(group),),
                          barrier=True))
    return out


def order(rollout: Rollout, actions: Sequence[Action]) -> list[tuple[str, list[str]]]:
    """Each kind of stop and start of ``actions`` with the hosts that act in it (``host: units``), for people:
    stop routers, workers, heads; start heads; the workers' wait for their head's rendezvous port; start workers;
    the engine groups serve; start router; the router serves."""
    out: list[tuple[str, list[str]]] = []
    for a in actions:
        if a.kind == "stop":
            out.append((f"stop {a.role}", [f"{p.host}: {', '.join(p.units)}" for p in a.parts]))
        elif a.kind == "start":
            if a.role == "workers" and any(p.joins for p in a.parts):
                out.append(("workers wait for the head's rendezvous port",
                            [f"{p.host} -> {', '.join(f'{h}:{port}' for h, port in p.joins)}" for p in a.parts
                             if p.joins]))
            out.append((f"start {a.role}" if a.role != "routers" else "start router",
                        [f"{p.host}: {', '.join(p.units)}" for p in a.parts]))
        elif a.kind == "gate":
            groups = list(dict.fromkeys(g for p in a.parts for g in p.groups))
            out.append(("router serves", ["router"]) if groups == ["router"] else ("engine groups serve", [
                g for g in rollout.groups if g in groups]))
    return out


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
    return Step(None, f"Chat completion through {rollout.endpoint}", first.host, rollout.vars.k3_smoke_test,
                commands.smoke_test(rollout.endpoint, served_model(rollout), first.env_path))


# ------------------------------------------------------------------------------------------------ virtual address


@dataclass(frozen=True)
class Keepalived:
    """Step: keepalived on ``host`` running ``content`` as its configuration ``conf``, ``unit`` enabled (``package``
    installed where it is missing): the configuration written beside the live one (``staged``), checked and applied
    (``apply``)."""

    host: str
    name: str
    conf: str
    content: str
    unit: str = vip.KEEPALIVED_UNIT
    package: str = vip.KEEPALIVED_PACKAGE

    @property
    def staged(self) -> str:
        """Where the new configuration is written before ``keepalived -t`` checks it."""
        return f"{self.conf}.k3-next"

    @property
    def apply(self) -> str:
        """The script that checks the staged configuration, moves it into place and reloads the unit."""
        return commands.keepalived_apply(self.staged, self.conf, self.unit)


@dataclass(frozen=True)
class Refusal:
    """Step: ``host`` cannot take part (``why``, one line naming the fix): it fails the host, changing nothing."""

    host: str
    name: str
    why: str

    @property
    def script(self) -> str:
        return f"echo {shlex.quote(self.why)} >&2; exit 1"


@dataclass(frozen=True)
class Hold:
    """Step: on ``host``, once ``when`` holds, wait up to ``timeout`` seconds until it holds the virtual address
    ``vip`` and ``endpoint`` answers ``/health`` on it."""

    host: str
    name: str
    endpoint: str
    vip: str
    timeout: int
    when: tuple[Condition, ...] = ()

    @property
    def script(self) -> str:
        return commands.wait_vip(self.endpoint, self.vip, self.timeout)


#: a step of the virtual address
VipStep = Keepalived | Refusal | Hold


def virtual_address(rollout: Rollout, *, blank: str | None = None) -> tuple[VipStep, ...]:
    """With ``k3_vip``: keepalived on every host of the rollout and every spare (:func:`k3deploy.model.vip.members`,
    its configuration :func:`~k3deploy.model.vip.keepalived_conf`), then, on the host that serves the endpoint, once
    every group serves, the wait until it holds the address. A host whose interface for the address is unknown (not
    read, no ``k3_vip_interface``) gets a refusal instead, or, with ``blank``, a configuration naming that blank (the
    runbook's). Nothing without ``k3_vip``.

    >>> from k3deploy.model.binding import HostRecord
    >>> from k3deploy.model.pipeline import desired_rollout, target
    >>> common = {"k3_hardware": "gb300", "k3_vip": "10.0.0.250"}
    >>> layout = desired_rollout(target([HostRecord("n1", ("head",), {**common, "k3_ip": "10.0.0.1"}),
    ...                                  HostRecord("n2", ("workers",), {**common, "k3_ip": "10.0.0.2"})], None))
    >>> [(type(s).__name__, s.host) for s in virtual_address(layout)]
    [('Refusal', 'n1'), ('Refusal', 'n2')]
    >>> [(type(s).__name__, s.host) for s in virtual_address(layout, blank="IFACE")]
    [('Keepalived', 'n1'), ('Keepalived', 'n2'), ('Hold', 'n1')]
    >>> virtual_address(layout, blank="IFACE")[-1].when
    (Serves(groups=('engine',), calls=()),)
    """
    address = rollout.vars.k3_vip
    if address is None:
        return ()
    out: list[VipStep] = []
    for host in vip.members(rollout):
        interface = rollout.vars.k3_vip_interface or rollout.ifaces.get(host) or blank
        if interface is None:
            out.append(Refusal(host, "keepalived: the virtual address's interface",
                                   f"no interface for the virtual address {address} on {host}: its cluster interface "
                                   "was not read; set k3_vip_interface"))
        else:
            out.append(Keepalived(host, f"keepalived: virtual address {address} (VRRP)", vip.KEEPALIVED_CONF,
                                      vip.keepalived_conf(rollout, host, interface)))
    holder = rollout.vip_holder
    if holder is not None and any(isinstance(s, Keepalived) and s.host == holder for s in out):
        out.append(Hold(holder, f"Virtual address {address} held here, {rollout.endpoint} answering",
                            rollout.endpoint, address, vip.HOLD_TIMEOUT, (Serves(tuple(rollout.groups)),)))
    return tuple(out)


# ------------------------------------------------------------------------------------------------ the whole rollout


#: the rollout's parts after the preflight, in the order they run: the deploy runs its phases in this order
#: (:func:`k3deploy.runtime.phases.roll_out`) and the runbook writes its sections in it
#: (:func:`k3deploy.model.runbook.sections.build`), so reordering the rollout is changing this tuple (the order
#: within the restart: :func:`restart`)
ORDER: tuple[str, ...] = ("stage", "configure", "start", "virtual address", "smoke")


@dataclass(frozen=True)
class RolloutSteps:
    """The whole rollout as steps, in the order it runs (:func:`rollout`): the stage's steps (kind by kind, hosts in
    inventory order within a kind), each host's configure step (the launcher's), the restart's actions
    (:func:`restart`), the virtual address's steps (:func:`virtual_address`), the smoke test. The deploy's
    operations (:mod:`k3deploy.runtime.phases`) and the runbook (:mod:`k3deploy.model.runbook.sections`) render
    it."""

    stage: tuple[Step, ...]
    configure: tuple[Configure, ...]
    start: tuple[Action, ...]
    vip: tuple[VipStep, ...]
    smoke: Step

    @property
    def steps(self) -> list[Step | Configure | Action | VipStep]:
        """Every step, in the order they run."""
        return [*self.stage, *self.configure, *self.start, *self.vip, self.smoke]

    def configure_of(self, host: str) -> Configure | None:
        """``host``'s configure step (None: nothing there)."""
        return next((c for c in self.configure if c.host == host), None)


def rollout(layout: Rollout, launcher: StartSteps = UNITS, plan: StagePlan | None = None,
            decided: Decisions | None = None, *, hosts: Sequence[str] | None = None, tag: str | None = None,
            images: Mapping[str, LocalImage | None] | None = None, leftover: Collection[str] = (),
            router_tag: str | None = None,
            router_images: Mapping[str, LocalImage | None] | None = None) -> RolloutSteps:
    """Every step of a rollout of ``layout``, in order, whatever starts the groups (``launcher``): the stage
    (:func:`stage`; ``plan``: how the artifacts reach the nodes, :func:`fresh` where not given; ``tag``, ``images``,
    ``leftover``, ``router_tag``, ``router_images`` as there), the configure step of each of ``hosts`` (default: the
    rollout's), the restart (:func:`restart`, with the run's ``decided``), the virtual address
    (:func:`virtual_address`), the smoke test.
    The one builder the deploy and the runbook render: changing the rollout's order is changing this function (the
    restart's: :func:`restart`).

    >>> from k3deploy.model.binding import HostRecord
    >>> from k3deploy.model.pipeline import desired_rollout, target
    >>> hosts = [HostRecord("n1", ("head",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.1"}),
    ...          HostRecord("n2", ("workers",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.2"})]
    >>> layout = desired_rollout(target(hosts, None))
    >>> made = rollout(layout.decided(layout.groups))
    >>> [c.host for c in made.configure], [a.kind for a in made.start], made.smoke.host
    (['n1', 'n2'], ['stop', 'stop', 'start', 'start', 'gate', 'current'], 'n1')
    """
    configured = (launcher.configure(layout, h) for h in (layout.hosts if hosts is None else hosts))
    staged = stage(layout, plan if plan is not None else fresh(layout), tag=tag, images=images, leftover=leftover,
                   router_tag=router_tag, router_images=router_images)
    return RolloutSteps(
        timed(layout, sorted([*staged, *launcher.staged(layout)],
                             key=lambda s: s.kind.order if s.kind is not None else 0)),
        tuple(c for c in configured if c is not None), tuple(restart(layout, launcher, decided)),
        virtual_address(layout), smoke(layout))
