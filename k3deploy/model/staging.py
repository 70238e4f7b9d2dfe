"""Staging at scale: each artifact (the image, the weights) crosses the uplink once, then spreads node to node.

The engine nodes that already hold an artifact are its holders (for the weights: every shard of the index there and
verified). When there are none, the first engine node (or the first ``k3_stage_sources`` of them) fetches it from
outside: the registry and the model hub, a site mirror, or the control machine's copy on an air-gapped site.

``k3_stage: chain`` (the default) then hands each file on along a pipelined chain, as Kascade and the classic
``tar | nc`` chains do: every node that needs the artifact copies each file from the node before it *while that node
is still receiving it* (``rsync --append`` of the growing file, from a read-only rsync daemon on the sender), so N
nodes take about one cluster-network copy plus a small term per hop, not one copy per round; every node's link
carries each byte once in and at most once out. Each file is verified as it lands (a weight blob against its sha256,
the name of its blob in the Hugging Face cache) before the node hands it on as whole. A hop that fails or stalls
(no byte for ``k3_stage_hop_timeout`` seconds) is routed around: the node copies from the one before it, and so on
up to the holders (:func:`chain`). rsync is used rather than a BitTorrent swarm (aria2, a tracker) or multicast
(udpcast): it is on every node already, and the uplink stays at one copy by the schedule itself.

``k3_stage: fanout`` keeps the binomial tree of whole copies (:func:`tree`: ``ceil(log2(N))`` rounds, each node
holding a whole file before it sends it); ``per_node`` the simple way (every node fetches from outside itself); a
shared cache (``k3_weights_shared``) is filled by the first engine node only.

The engines' compile caches (:mod:`k3deploy.model.compilecache`) are one more artifact: the nodes that run the
same cache key are a class, a node holds the class's caches once an engine of it served from them, and each node
of the class that lacks them gets them from a holder (:func:`cache_shares`, the holders taken in turn) through the
same read-only rsync daemon, before its engine starts. On a first rollout nobody holds them: every node compiles
its own, at once (the nodes of a group start together, and each rank compiles its own graphs), and from then on a
node that lacks them (a node added or replaced, a spare taking a rank, a wiped disk) gets them from its class.

Pure: the schedule is computed from what the facts saw; :mod:`k3deploy.runtime.phases` runs it, and the runbook
prints it.

Example::

    >>> tree(["n1"], ["n2", "n3", "n4", "n5"])
    [{'n2': 'n1'}, {'n3': 'n1', 'n4': 'n2'}, {'n5': 'n1'}]
    >>> tree([], ["n1"])
    []
    >>> chain(["n1"], ["n2", "n3", "n4"])
    {'n2': ('n1',), 'n3': ('n2', 'n1'), 'n4': ('n3', 'n2', 'n1')}
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from k3deploy.model import commands, compilecache
from k3deploy.model.checkpoint import SourceCheck
from k3deploy.model.images import LocalImage, holds
from k3deploy.model.units import render_template

if TYPE_CHECKING:
    from k3deploy.model.rollout import Placement

#: how an artifact reaches a node that fetches it itself
OUTSIDE, ARCHIVE = "outside", "archive"


def tree(holders: Sequence[str], needers: Sequence[str]) -> list[dict[str, str]]:
    """Transfers round by round, ``{receiver: sender}``: in each round every holder sends to at most one node that
    still needs the artifact; receivers send from the next round on."""
    have = list(holders)
    todo = [n for n in needers if n not in have]
    out: list[dict[str, str]] = []
    while have and todo:
        step = dict(zip(todo, have, strict=False))
        todo = todo[len(step):]
        have += list(step)
        out.append(step)
    return out


def chain(holders: Sequence[str], needers: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Each node that needs the artifact and where it copies from, nearest first: one pipelined chain per holder
    (the needers dealt to them in turn), each node after the one before it, then the rest of its chain up to the
    holder, then the other holders (so a failed or stalled hop is routed around).

        >>> chain(["a", "b"], ["n1", "n2", "n3"])
        {'n1': ('a', 'b'), 'n2': ('b', 'a'), 'n3': ('n1', 'a', 'b')}
        >>> chain([], ["n1"])
        {}
    """
    have = list(holders)
    lines: list[list[str]] = [[h] for h in have]
    out: dict[str, tuple[str, ...]] = {}
    for i, node in enumerate(n for n in needers if n not in have) if have else ():
        line = lines[i % len(lines)]
        out[node] = (*reversed(line), *(h for h in have if h != line[0]))
        line.append(node)
    return out


@dataclass(frozen=True)
class Artifact:
    """How one artifact reaches the nodes that lack it."""

    what: str                                   # "image" or "weights"
    fetch: dict[str, str] = field(default_factory=dict)    # host -> OUTSIDE or ARCHIVE: fetches it itself
    rounds: list[dict[str, str]] = field(default_factory=list)   # the tree, after the fetches
    export: list[str] = field(default_factory=list)        # holders that must write the image archive first
    require: list[str] = field(default_factory=list)       # must hold it already (nobody may fetch it): checked
    upstream: dict[str, tuple[str, ...]] = field(default_factory=dict)   # a chain: receiver -> peers, nearest first

    @property
    def senders(self) -> list[str]:
        return list(dict.fromkeys(s for step in self.rounds for s in step.values()))

    @property
    def receivers(self) -> list[str]:
        return [r for step in self.rounds for r in step]


@dataclass(frozen=True)
class CacheShare:
    """One class's compile caches (its cache ``key``) handed to the nodes of the class that lack them:
    ``sends`` maps each receiver to the holder it copies from."""

    key: str
    sends: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StagePlan:
    """How the image and the weights reach the nodes. ``image_file``, ``runtime``: the image travels as the file
    the site's container runtime reads (a Slurm site's pyxis squashfs or apptainer SIF, at that path on every node,
    :func:`k3deploy.model.jobcontainers.staged_image`), made once from the registry or the archive and handed on as
    a file; None: through each node's docker. ``stale``: that runtime's older image files, pruned
    (:func:`k3deploy.model.jobcontainers.stale_files`)."""

    image: Artifact
    weights: Artifact
    caches: tuple[CacheShare, ...] = ()
    image_file: str | None = None
    runtime: str | None = None
    #: host -> the runtime's image files there that no kept revision runs (removed after the stage)
    stale: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return max(len(self.image.rounds), len(self.weights.rounds))

    @property
    def cache_senders(self) -> list[str]:
        return list(dict.fromkeys(s for c in self.caches for s in c.sends.values()))

    @property
    def senders(self) -> list[str]:
        return list(dict.fromkeys([*self.image.senders, *self.weights.senders, *self.cache_senders]))

    @property
    def takes_part(self) -> list[str]:
        """Every host that writes a staging file: fetchers, senders, receivers."""
        hosts = [*self.image.fetch, *self.weights.fetch, *self.senders, *self.image.receivers,
                 *self.weights.receivers, *(r for c in self.caches for r in c.sends)]
        return list(dict.fromkeys(hosts))

    def round_of(self, index: int, host: str) -> tuple[str | None, str | None]:
        """(image sender, weights sender) of ``host`` in round ``index`` (None: nothing to receive)."""
        def pick(artifact: Artifact) -> str | None:
            return artifact.rounds[index].get(host) if index < len(artifact.rounds) else None
        return pick(self.image), pick(self.weights)


def plan_artifact(what: str, engines: Sequence[str], holders: Sequence[str], *, mode: str, sources: int,
                  archive: bool, can_fetch: bool = True) -> Artifact:
    """How ``what`` reaches the ``engines`` (in inventory order) that are not among its ``holders``.

    ``mode``: ``chain``, ``fanout`` or ``per_node``; ``sources``: how many nodes fetch from outside when no node
    holds it; ``archive``: it comes from the control machine (air-gapped) instead of outside; ``can_fetch``: false
    when the nodes must not fetch it (``k3_download_weights: false``): then only holders can give it.
    """
    held = [h for h in engines if h in holders]
    need = [h for h in engines if h not in holders]
    if not need:
        return Artifact(what)
    how = ARCHIVE if archive else OUTSIDE
    fetch: dict[str, str] = {}
    rounds: list[dict[str, str]] = []
    links: dict[str, tuple[str, ...]] = {}
    if mode == "per_node":
        if can_fetch:
            fetch = {h: how for h in need}
    else:
        seeds: list[str] = []
        if not held and can_fetch:
            seeds = need[:max(1, sources)]
            fetch = {h: how for h in seeds}
        if mode == "chain":    # one round: every receiver at once, each from the node before it in its chain
            links = chain([*held, *seeds], need)
            rounds = [{h: peers[0] for h, peers in links.items()}] if links else []
        else:
            rounds = tree([*held, *seeds], need)
    art = Artifact(what, fetch, rounds, upstream=links)
    export = [h for h in held if h in art.senders] if what == "image" and mode != "per_node" else []
    return replace(art, export=export, require=[h for h in need if h not in fetch and h not in art.receivers])


def plan_stage(engines: Sequence[str], image_holders: Sequence[str], weight_holders: Sequence[str], *,
               mode: str, sources: int, image_archive: bool, weights_source: bool, download: bool,
               shared: bool) -> StagePlan:
    """The whole stage: the image and the weights (see :func:`plan_artifact`). A shared cache is filled once, by
    the first engine node (if nobody holds the weights)."""
    image = plan_artifact("image", engines, image_holders, mode=mode, sources=sources, archive=image_archive)
    if shared:
        weights = Artifact("weights")
        if engines and not [h for h in engines if h in weight_holders]:
            if download or weights_source:
                weights = Artifact("weights", fetch={engines[0]: ARCHIVE if weights_source else OUTSIDE})
            else:
                weights = Artifact("weights", require=[engines[0]])
    else:
        weights = plan_artifact("weights", engines, weight_holders, mode=mode, sources=sources,
                                archive=weights_source, can_fetch=download or weights_source)
    return StagePlan(image=image, weights=weights)


def engines(rollout: Placement) -> list[str]:
    """The hosts that run an engine, then the spares standing by (all need the image and the weights), in
    inventory order."""
    running = [h for h in rollout.hosts if any(u.group != "router" for u in rollout.on_host(h))]
    return running + [h for h in rollout.spares if h not in running]


def addresses(rollout: Placement) -> dict[str, str]:
    """Each engine host's (and spare's) address on the cluster network (where its peers reach its rsync daemon)."""
    out: dict[str, str] = {}
    for u in rollout.units:
        out.setdefault(u.host, u.node.address)
    for host, address in rollout.spares.items():
        out.setdefault(host, address)
    return out


def stage_hosts(rollout: Placement) -> list[str]:
    """The hosts the stage has steps for: every host with a unit, then the spares standing by."""
    return rollout.hosts + [h for h in rollout.spares if h not in rollout.hosts]


def stage_for(rollout: Placement, images: Mapping[str, LocalImage], weights_verified: Mapping[str, bool],
              caches: Mapping[str, Collection[str]] | None = None, *, image_file: str | None = None,
              runtime: str | None = None, files: Mapping[str, Collection[str]] | None = None) -> StagePlan:
    """The stage of a rollout, from what the facts saw on each host (its images of the repository, verified
    weights, the compile cache keys it holds: ``caches``). A pinned image (``REPO@sha256:...``, as a resolved tag
    is) is held only where that very build is. With ``image_file`` (the runtime's file of the image, ``runtime`` its
    name) the image travels as that file: held where the host's ``files`` (the names of the whole files it has
    there) name it, none exported."""
    v = rollout.vars
    hosts = engines(rollout)
    if image_file is not None:
        name = image_file.rsplit("/", 1)[1]
        held = [h for h in hosts if name in (files or {}).get(h, ())]
    else:
        held = [h for h in hosts if holds(rollout.plan.image, images.get(h))]
    plan = plan_stage(hosts, held, [h for h in hosts if weights_verified.get(h)], mode=v.k3_stage,
                      sources=v.k3_stage_sources, image_archive=bool(v.k3_image_archive),
                      weights_source=bool(v.k3_weights_source), download=v.k3_download_weights,
                      shared=v.k3_weights_shared)
    if image_file is not None:
        plan = replace(plan, image=replace(plan.image, export=[]), image_file=image_file, runtime=runtime)
    if caches is None or v.k3_weights_shared:   # one shared model cache holds one copy of each key already
        return plan
    return replace(plan, caches=cache_shares(unit_keys(rollout), caches))


def unit_keys(rollout: Placement) -> dict[str, list[str]]:
    """Each engine host's compile cache keys (from its units' env files; none where they keep no keyed caches)."""
    out: dict[str, list[str]] = {}
    for u in rollout.units:
        spec = u.spec
        key = compilecache.key_of(spec.env_map) if spec is not None else None
        if key is not None and key not in out.setdefault(u.host, []):
            out[u.host].append(key)
    return out


def cache_shares(keys: Mapping[str, Sequence[str]], held: Mapping[str, Collection[str]]) -> tuple[CacheShare, ...]:
    """For each cache key the hosts run (``keys``: host -> keys, in inventory order), the hosts that lack it get it
    from those that hold it (``held``: host -> keys), the holders taken in turn; a key nobody holds is compiled by
    every node of its class (no share).

    >>> cache_shares({"n1": ["k"], "n2": ["k"], "n3": ["k"]}, {"n1": {"k"}})
    (CacheShare(key='k', sends={'n2': 'n1', 'n3': 'n1'}),)
    >>> cache_shares({"n1": ["k"], "n2": ["k2"]}, {"n1": {"k"}})
    ()
    """
    out: list[CacheShare] = []
    for key in dict.fromkeys(k for ks in keys.values() for k in ks):
        holders = [h for h in keys if key in held.get(h, ())]
        needers = [h for h, ks in keys.items() if key in ks and key not in held.get(h, ())]
        if holders and needers:
            out.append(CacheShare(key, {h: holders[i % len(holders)] for i, h in enumerate(needers)}))
    return tuple(out)


def peers_config(rollout: Placement, host: str) -> str:
    """The rsync daemon configuration of ``host`` while it serves its peers (unit ``k3-stage-peers``, only while a
    stage runs): read only, bound to its cluster address, open to the cluster's engine hosts only (with ``hosts
    allow`` alone, every other host is refused: rsyncd.conf(5)). Every node of a chain but the last serves one, so
    it is kept to its settings (the runbook prints it per node)."""
    v = rollout.vars
    where = addresses(rollout)
    allow = " ".join(dict.fromkeys(where[h] for h in engines(rollout)))
    return render_template("k3-stage-peers.conf.j2", unit=commands.PEERS_UNIT, address=where[host],
                           port=v.k3_stage_port, hosts_allow=allow, socket_options=commands.PEERS_SOCKET_OPTIONS,
                           hub_module=commands.HUB_MODULE,
                           hub=commands.hub_dir(v.k3_model_cache), stage_module=commands.STAGE_MODULE,
                           stage=v.k3_stage_dir.rstrip("/"), compile_module=commands.COMPILE_MODULE,
                           compile=compilecache.host_root(v.k3_model_cache))


def peers_config_path(rollout: Placement) -> str:
    return f"{rollout.vars.k3_stage_dir.rstrip('/')}/peers.conf"


def summary(plan: StagePlan) -> list[str]:
    """One line per artifact, for plan and the deploy's output."""
    out = []
    for a in (plan.image, plan.weights):
        if not a.fetch and not a.rounds:
            out.append(f"{a.what}: on every engine node already")
            continue
        parts = []
        if a.fetch:
            src = "the control machine" if ARCHIVE in a.fetch.values() else "outside"
            parts.append(f"{', '.join(a.fetch)} fetch{'es' if len(a.fetch) == 1 else ''} it from {src}")
        if a.upstream:
            n = len(a.receivers)
            parts.append(f"{n} node{'s' if n != 1 else ''} get{'s' if n == 1 else ''} it from peers along a chain, "
                         "each file handed on as it lands")
        elif a.rounds:
            n = len(a.receivers)
            parts.append(f"{n} node{'s' if n != 1 else ''} get{'s' if n == 1 else ''} it from peers in "
                         f"{len(a.rounds)} round{'s' if len(a.rounds) != 1 else ''}")
        out.append(f"{a.what}: " + "; ".join(parts))
    for c in plan.caches:
        got = list(c.sends)
        out.append(f"compile caches {c.key}: {', '.join(got)} get{'s' if len(got) == 1 else ''} them from "
                   f"{', '.join(dict.fromkeys(c.sends.values()))}, which built them")
    return out


def refused_source(plan: StagePlan, check: SourceCheck, hosts: Sequence[str], *, where: str, model: str) -> list[str]:
    """Why a run whose stage copies the weights from a broken source (:func:`k3deploy.model.checkpoint.check_source`)
    is refused before anything moves: one line naming the source, what it lacks and the fix, then one line per host
    of the stage saying what it was to do (``where``: the file that sets ``k3_weights_source``).

        >>> from k3deploy.model.checkpoint import Shard
        >>> sp = plan_stage(["n1", "n2"], [], [], mode="fanout", sources=1, image_archive=True, weights_source=True,
        ...                 download=False, shared=False)
        >>> bad = SourceCheck("/w/models--o--m", "c0ffee", (Shard("m-1.safetensors", 9, 9),
        ...                                                  Shard("m-2.safetensors", None, None)))
        >>> first, *nodes = refused_source(sp, bad, ["n1", "n2"], where="group_vars/all.yml", model="o/m")
        >>> first.split(": ")[2]
        '1 of its 2 shards missing (m-2.safetensors)'
        >>> first.split(": ")[3].split(" (")[1]
        '`hf download o/m --cache-dir /w` fetches what is missing) and run again; nothing was copied to any node'
        >>> for line in nodes:
        ...     print(line.split(";")[0])
          [n1] did not start the stage: it was to copy the weights from k3_weights_source first
          [n2] did not start the stage: it was to get the weights from n1 in round 1
    """
    source = check.source.rstrip("/")
    parent = source.rsplit("/", 1)[0] or "/"
    if check.error is not None:
        fix = "give the models--ORG--NAME directory that `hf download` filled"
    else:
        short = [s for s in check.bad if s.size is not None]
        first = "remove the short shards' blobs, then " if short else ""
        fix = (f"complete it from the hub or a whole copy ({first}`hf download {model} --cache-dir {parent}` fetches "
               "what is missing) and run again")
    snapshot = f" (snapshot {check.revision[:12]})" if check.revision else ""
    return [f"k3_weights_source: {check.source} ({where}) lacks part of the checkpoint its index names{snapshot}: "
            f"{check.problem()}: {fix}; nothing was copied to any node", *not_started(plan.weights, hosts,
                                                                                       "k3_weights_source")]


def refused_archive(plan: StagePlan, problem: str, hosts: Sequence[str], *, archive: str, where: str,
                    image: str) -> list[str]:
    """Why a run whose stage copies the image from a broken archive (see
    :func:`k3deploy.model.checkpoint.check_archive`) is refused before anything moves: one line naming the archive,
    what is wrong and the fix, then one line per host of the stage.

        >>> sp = plan_stage(["n1", "n2"], [], [], mode="fanout", sources=1, image_archive=True, weights_source=False,
        ...                 download=True, shared=False)
        >>> first, *nodes = refused_archive(sp, "no manifest.json", ["n1", "n2"], archive="/a/i.tar", where="all.yml",
        ...                                 image="r/i:t")
        >>> print(first.replace(": write", ":\\n write"))
        k3_image_archive: /a/i.tar (all.yml) is not a whole docker save archive: no manifest.json:
         write it again (`docker save -o /a/i.tar r/i:t`) and run again; nothing was copied to any node
        >>> nodes[1]
        '  [n2] did not start the stage: it was to get the image from n1 in round 1; nothing was copied to it'
    """
    return [f"k3_image_archive: {archive} ({where}) is not a whole docker save archive: {problem}: write it again "
            f"(`docker save -o {archive} {image}`) and run again; nothing was copied to any node",
            *not_started(plan.image, hosts, "k3_image_archive")]


def not_started(artifact: Artifact, hosts: Sequence[str], source: str) -> list[str]:
    """One line per host of a refused stage: what it was to do with ``artifact`` (from ``source``, the variable
    naming the control machine's copy) and that nothing was copied to it."""
    lines = []
    for host in hosts:
        if host in artifact.fetch:
            role = f"it was to copy the {artifact.what} from {source} first"
        elif host in artifact.receivers:
            step = next(i for i, r in enumerate(artifact.rounds) if host in r)
            role = f"it was to get the {artifact.what} from {artifact.rounds[step][host]} in round {step + 1}"
        else:
            role = f"it holds the {artifact.what} already"
        lines.append(f"  [{host}] did not start the stage: {role}; nothing was copied to it")
    return lines
