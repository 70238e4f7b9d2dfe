"""The Kubernetes form of a rollout, pure: LeaderWorkerSet manifests running the plan's exact argv (docs/kubernetes.md).

Each engine group becomes one ``LeaderWorkerSet`` (``leaderworkerset.x-k8s.io/v1``): the rollout's replicas (the
groups ``engine-r0`` .. ``engine-r<R-1>``, identical but for their hosts) are one LWS with ``replicas: R``; a P/D
plan's pools are two LWS (``<name>-prefill``, ``<name>-decode``), each of one group. ``size`` is the group's node
count; ``restartPolicy: RecreateGroupAfterStart`` (a failed pod recreates its group, but not while the group is
still starting, pulling its image: lws#726); ``startupPolicy: LeaderCreated`` (the workers start beside the head:
a multi-node head cannot be ready before its workers joined, so ``LeaderReady`` would wait for ever); a rolling
update takes ``k3_max_unavailable`` groups at a time (``maxSurge: 0``: a group holds whole nodes).

Per-node values come from LWS, by Kubernetes' own ``$(NAME)`` expansion of a container's command, args and env,
rendered from each unit's engine spec (:class:`k3deploy.model.engine.EngineSpec`, whose per-node addresses are
symbolic): the head's address as seen by the workers is ``$(LWS_LEADER_ADDRESS)``, a node's own address
``$(K3_POD_IP)`` (the pod's IP, from the downward API: with ``hostNetwork`` the node's), a worker's index
``$(LWS_WORKER_INDEX)`` where a flag's value is the node's rank (``--node-rank``), the group's size
``$(LWS_GROUP_SIZE)`` (``--nnodes``: :class:`k3deploy.model.engine.GroupSize`).
A value that is a multiple of the index (the data-parallel start rank: ``--data-parallel-start-rank`` = index x
``--data-parallel-size-local``) needs arithmetic, which only a shell does: that role's command is then
``/bin/sh -c 'exec vllm serve ... "$((LWS_WORKER_INDEX * 8 + 0))" ...'``, every other word quoted as it is (on
Ascend the pack's login shell, ``bash -lc``, as the unit runs it). Which words are per node the engine spec says
(:class:`k3deploy.model.engine.Rank`); :func:`role_template` checks that every worker's spec gives the same template,
and refuses a value that is not the same linear function of the rank on every worker.
A literal ``$`` of the plan is written ``$$`` (Kubernetes' escape); :func:`expand` is the kubelet's expansion, which
the tests apply to get back each node's argv.

Workers wait for the head's rendezvous port before their engine starts (the order vLLM needs), in an init container
running :func:`k3deploy.model.commands.wait_tcp`, the wait every other launcher runs. The serving containers have a
startup probe sized to the plan's ready timeout, readiness on ``/v1/models`` and liveness on ``/health``; a headless
worker is ready when its head's ``/health`` answers (not long before: aws-do-eks#79).

Example::

    >>> expand("--node-rank $(LWS_WORKER_INDEX) $$HOME $(UNKNOWN)", {"LWS_WORKER_INDEX": "2"})
    '--node-rank 2 $HOME $(UNKNOWN)'
    >>> label_value("moonshotai/Kimi-K3")
    'moonshotai.Kimi-K3'
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, ClassVar

import yaml

from k3deploy.errors import K3Error
from k3deploy.model.commands import wait_tcp
from k3deploy.model.engine import GroupSize, Rank, Ref, text
from k3deploy.model.engine import Word as SpecWord
from k3deploy.model.rollout import Rollout, UnitWork, sha256
from k3deploy.model.secrets import API_KEY_ENV, is_secret
from k3deploy.model.units import CONTAINER_CACHE
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors import pack_for_container
from k3deploy.vendors.base import Pack
from k3deploy.vendors.common import SHM_MIN_GIB

Obj = dict[str, Any]

LWS_API = "leaderworkerset.x-k8s.io/v1"
#: DRA's API (GA in Kubernetes 1.34): the ResourceClaimTemplates of GPUs and RDMA devices (``k3_k8s_gpus``,
#: ``k3_k8s_rdma``: ``dra``)
DRA_API = "resource.k8s.io/v1"
#: the namespace label that sets the Pod Security Standard enforced on its pods
POD_SECURITY = "pod-security.kubernetes.io/enforce"
#: the capabilities the ``baseline`` Pod Security Standard allows a container to add (kubernetes.io, Pod Security
#: Standards, "Capabilities"); any other needs ``privileged``
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
#: an extended resource's name (a device plugin's: ``domain/name``)
RESOURCE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
#: the LWS annotation that keeps each group inside one topology domain (one value of the topology key)
EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
#: the labels LWS puts on its pods
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
WORKER_INDEX = "LWS_WORKER_INDEX"
GROUP_SIZE = "LWS_GROUP_SIZE"
#: the pod's own IP (downward API ``status.podIP``), every per-node address of the plan
POD_IP = "K3_POD_IP"
HF_TOKEN = "HF_TOKEN"
#: seconds a stopping engine gets (the units' ``docker stop -t 60``)
STOP_GRACE = 60
PROBE_PERIOD = 10
LABEL_PREFIX = "k3deploy.io"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: the longest engine name: its pods are ``<name>-<group>-<index>`` and a pod's host name is one DNS label (63)
MAX_NAME = 40
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of a command, an argument or an env value: ``$(NAME)`` -> its value where ``NAME`` is
    defined (else left as it is), ``$$`` -> ``$``."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _REF.sub(one, text)


def escape(text: str) -> str:
    """A literal text in a command, argument or env value: ``$`` written ``$$`` so that Kubernetes leaves it."""
    return text.replace("$", "$$")


def ref(name: str) -> str:
    return f"$({name})"


def label_value(text: str) -> str:
    """A label value (63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends) naming ``text``."""
    value = re.sub(r"[^A-Za-z0-9._-]", ".", text)[:63].strip("._-")
    return value or "none"


def plan_revision(rollout: Rollout) -> str:
    """A hash of the plan (image, and every node's argv and env): the ``revision`` label of every object."""
    plan = rollout.plan
    data = {"image": plan.image, "nodes": [[n.role, n.rank, n.argv, sorted(n.env.items())] for n in plan.nodes],
            "strategy": plan.strategy, "hardware": plan.hardware}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- per-node values


@dataclass(frozen=True)
class Derived:
    """A word that is ``scale * LWS_WORKER_INDEX + offset`` on each worker."""

    scale: int
    offset: int

    def shell(self) -> str:
        return f'"$$(({WORKER_INDEX} * {self.scale} + {self.offset}))"'

    @property
    def plain(self) -> bool:
        return self.scale == 1 and self.offset == 0


Word = str | Derived


def substituted(word: SpecWord, unit: UnitWork, tokens: Mapping[str, str]) -> str:
    """A word of ``unit``'s spec with its per-node values as LWS references: the head's address (on a worker)
    ``$(LWS_LEADER_ADDRESS)``, its own ``$(K3_POD_IP)``, the group's size ``$(LWS_GROUP_SIZE)``; the site's shared
    blanks (``tokens``) in place of each node's own."""
    out: list[str] = []
    for part in word:
        if isinstance(part, Ref):
            out.append(ref(LEADER_ADDRESS) if part.name == "head" and unit.rank > 0 else ref(POD_IP))
            continue
        if isinstance(part, GroupSize):
            out.append(ref(GROUP_SIZE))
            continue
        value = escape(part if isinstance(part, str) else part.value)
        for old, new in tokens.items():
            value = value.replace(escape(old), new)
        out.append(value)
    return "".join(out)


def _word(word: SpecWord, unit: UnitWork, tokens: Mapping[str, str]) -> Word:
    """A word of a pod template: a worker's rank-following value as :class:`Derived`, else :func:`substituted`."""
    if unit.rank > 0 and len(word) == 1 and isinstance(word[0], Rank):
        return Derived(word[0].scale, word[0].offset)
    return substituted(word, unit, tokens)


def role_template(units: Sequence[UnitWork], tokens: Mapping[str, str]) -> list[Word]:
    """The one argv of the pods of ``units`` (the head alone, or every worker rank of a group), from their engine
    specs: each word with its per-node addresses as LWS references (:func:`substituted`), and each value that
    follows the rank (:class:`k3deploy.model.engine.Rank`) as :class:`Derived`. Raises :class:`K3Error` when the
    nodes differ otherwise."""
    words = [[_word(a, u, tokens) for a in u.require_spec().argv_words] for u in units]
    first = words[0]
    if any(len(w) != len(first) for w in words):
        raise K3Error(f"group {units[0].group}: the workers' argv differ in length; one pod template cannot run them")
    if units[0].rank == 0:
        return list(first)
    out: list[Word] = []
    for i, word in enumerate(first):
        column = [w[i] for w in words]
        if all(c == word for c in column):
            out.append(word)
            continue
        flag = str(first[i - 1]) if i else ""
        if any(isinstance(c, Derived) for c in column):
            values = [text(u.require_spec().argv_words[i]) for u in units]
            raise K3Error(f"group {units[0].group}: {flag} is {', '.join(values)} on ranks "
                          f"{', '.join(str(u.rank) for u in units)}, not a multiple of the rank: one pod template "
                          "cannot run them")
        raise K3Error(f"group {units[0].group}: argv word {i} ({flag} {word}) differs between workers and "
                      "follows no rank: one pod template cannot run them")
    return out


def command(words: Sequence[Word], profile: str | None) -> tuple[list[str], list[str]]:
    """``(command, args)`` of a container running ``words``: exec form where Kubernetes' expansion does it all, else
    a shell (``profile``: the pack's login shell, ``bash -lc``, as the unit runs it; arithmetic: ``/bin/sh -c``)."""
    if profile is None and all(isinstance(w, str) or w.plain for w in words):
        plain = [w if isinstance(w, str) else ref(WORKER_INDEX) for w in words]
        return [plain[0]], plain[1:]
    script = " ".join(shlex.quote(w) if isinstance(w, str) else w.shell() for w in words)
    if profile is not None:
        return ["bash", "-lc", escape(profile) + "exec " + script], []
    return ["/bin/sh", "-c", "exec " + script], []


# ---------------------------------------------------------------------------------------------- the objects


@dataclass(frozen=True)
class Names:
    base: str

    def lws(self, pool: str) -> str:
        return self.base if pool == "engine" else f"{self.base}-{pool}"

    @property
    def router(self) -> str:
        return f"{self.base}-router"

    @property
    def api(self) -> str:
        return f"{self.base}-api"

    def pod(self, pool: str, replica: int, rank: int) -> str:
        """A pod's DNS name in the namespace (LWS's headless service is named after the LWS)."""
        lws = self.lws(pool)
        return f"{lws}-{replica}.{lws}" if rank == 0 else f"{lws}-{replica}-{rank}.{lws}"


def check(rollout: Rollout) -> Names:
    """The object names of a rollout; raises :class:`K3Error` where ``k3_unit_name`` is not a DNS label, nor the
    other names the export writes (namespace, Secret, PVC, RDMA resource or class) what Kubernetes takes."""
    v = rollout.vars
    base = v.k3_unit_name
    if not DNS_LABEL.fullmatch(base) or len(base) > MAX_NAME:
        raise K3Error(f"k3_unit_name: {base!r} cannot name Kubernetes objects: set a lowercase name of letters, "
                      f"digits and '-' (at most {MAX_NAME} characters), e.g. k3-engine")
    for name in (rollout.vars.k3_k8s_secret, rollout.vars.k3_k8s_cache_pvc):
        if name is not None and not DNS_LABEL.fullmatch(name):
            raise K3Error(f"{name!r} is not a Kubernetes object name: give k3_k8s_secret and k3_k8s_cache_pvc "
                          "lowercase names of letters, digits and '-'")
    if not DNS_LABEL.fullmatch(v.k3_k8s_namespace) or len(v.k3_k8s_namespace) > 63:
        raise K3Error(f"k3_k8s_namespace: {v.k3_k8s_namespace!r} is not a namespace name: give --namespace a "
                      "lowercase name of letters, digits and '-' (at most 63 characters), e.g. k3")
    if not RESOURCE_NAME.fullmatch(v.k3_k8s_rdma_resource):
        raise K3Error(f"k3_k8s_rdma_resource: {v.k3_k8s_rdma_resource!r} is not an extended resource name: give "
                      "--rdma-resource DOMAIN/NAME as the site's RDMA device plugin advertises it, e.g. "
                      "rdma/rdma_shared_device_a")
    if v.k3_k8s_rdma == "dra" and _needs_rdma(rollout):
        cls = v.k3_k8s_rdma_class
        if cls is None or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", cls):
            given = "" if cls is None else f", not {cls!r}"
            raise K3Error(f"k3_k8s_rdma: dra needs the DeviceClass of the site's RDMA DRA driver: give --rdma-class "
                          f"NAME (k3_k8s_rdma_class; `kubectl get deviceclasses` lists them){given}")
    pack = pack_for_container(rollout.plan.vendor)
    if v.k3_k8s_gpus == "dra" and (pack is None or pack.container.k8s_dra_class is None):
        brand = pack.brand if pack is not None else rollout.plan.vendor
        raise K3Error(f"k3_k8s_gpus: dra: {brand} accelerators have no DRA driver to claim them from: use "
                      "--gpus device-plugin (k3_k8s_gpus)")
    return Names(base)


def _multi(rollout: Rollout) -> bool:
    return len([n for n in rollout.plan.nodes if n.role != "router"]) > 1


def _needs_rdma(rollout: Rollout) -> bool:
    """Whether the engine pods need RDMA devices: across nodes, on a vendor whose engines use them."""
    pack = pack_for_container(rollout.plan.vendor)
    return _multi(rollout) and pack is not None and pack.container.rdma_devices


def pools(rollout: Rollout) -> list[tuple[str, list[list[UnitWork]]]]:
    """The LWS of a rollout: ``(pool, groups)`` with each group's units by rank (replicas: one group each)."""
    engines = [g for g in rollout.groups if g != "router"]
    if rollout.plan.strategy == "pd_cluster":
        return [(g, [rollout.group(g)]) for g in engines]
    return [("engine", [rollout.group(g) for g in engines])]


def labels(rollout: Rollout, names: Names, component: str, revision: str) -> dict[str, str]:
    plan = rollout.plan
    return {"app.kubernetes.io/name": label_value(plan.model), "app.kubernetes.io/instance": names.base,
            "app.kubernetes.io/component": component, "app.kubernetes.io/managed-by": "k3deploy",
            f"{LABEL_PREFIX}/strategy": plan.strategy, f"{LABEL_PREFIX}/hardware": label_value(plan.hardware),
            f"{LABEL_PREFIX}/variant": label_value(plan.variant), f"{LABEL_PREFIX}/revision": revision}


def _port(unit: UnitWork) -> int | None:
    return int(unit.serves.rsplit(":", 1)[1]) if unit.serves else None


def _http_probe(path: str, port: int, failures: int) -> Obj:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": PROBE_PERIOD, "failureThreshold": failures}


def _models_probe(port: int, failures: int) -> Obj:
    """``/v1/models`` answering 200 with the API key the container's ``VLLM_API_KEY`` holds (vLLM guards ``/v1``;
    an ``httpGet`` probe cannot take a header from a Secret): python3, which every engine image has."""
    code = ("import os, urllib.request; urllib.request.urlopen(urllib.request.Request("
            f"'http://127.0.0.1:{port}/v1/models', headers={{'Authorization': 'Bearer ' + "
            f"os.environ['{API_KEY_ENV}']}}), timeout=5)")
    return {"exec": {"command": ["python3", "-c", code]}, "periodSeconds": PROBE_PERIOD, "failureThreshold": failures}


def _leader_health(port: int) -> str:
    """A headless worker's readiness: its head's ``/health`` answers (python3: every engine image has it)."""
    return ("import os, urllib.request; urllib.request.urlopen('http://' + os.environ['LWS_LEADER_ADDRESS'] + "
            f"':{port}/health', timeout=5)")


def _env(rollout: Rollout, unit: UnitWork, tokens: Mapping[str, str]) -> list[Obj]:
    secret = rollout.vars.k3_k8s_secret
    out: list[Obj] = [{"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    env = dict(unit.require_spec().env)
    for name, value in env.items():
        if is_secret(name):
            out.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": name}}})
        else:
            out.append({"name": name, "value": substituted(value, unit, tokens)})
    if HF_TOKEN not in env:
        out.append({"name": HF_TOKEN, "valueFrom": {"secretKeyRef": {"name": secret, "key": HF_TOKEN,
                                                                     "optional": True}}})
    return out


def _pod(rollout: Rollout, units: Sequence[UnitWork], head: UnitWork, pack: Pack | None, names: Names, pool: str,
         tokens: Mapping[str, str], meta: dict[str, str]) -> Obj:
    """The pod template of ``units`` (the head, or the workers) of one group."""
    v = rollout.vars
    unit = units[0]
    hw = hardware()[rollout.plan.hardware]
    multi = _multi(rollout)
    box = pack.container if pack is not None else None
    words = role_template(units, tokens)
    cmd, args = command(words, box.login_profile if box else None)
    mounts: list[Obj] = [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "cache", "mountPath": CONTAINER_CACHE}]
    volumes: list[Obj] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{int(SHM_MIN_GIB)}Gi"}},
        {"name": "cache", **({"persistentVolumeClaim": {"claimName": v.k3_k8s_cache_pvc}} if v.k3_k8s_cache_pvc
                             else {"hostPath": {"path": v.k3_model_cache, "type": "DirectoryOrCreate"}})},
    ]
    for i, (host_path, inside) in enumerate(box.mounts if box else ()):
        volumes.append({"name": f"driver-{i}", "hostPath": {"path": host_path}})
        mounts.append({"name": f"driver-{i}", "mountPath": inside, "readOnly": True})
    limits: dict[str, Any] = {}
    claims = [(c.name, c.template) for c in claim_templates(rollout, names, pool)]
    if box is not None and box.k8s_resource and v.k3_k8s_gpus == "device-plugin":
        limits[box.k8s_resource] = hw.gpu_count
    caps = list(box.k8s_capabilities if box else ())
    if _needs_rdma(rollout):
        caps.append("IPC_LOCK")   # the units' --cap-add IPC_LOCK --ulimit memlock=-1: locks memory without limit
        if v.k3_k8s_rdma == "device-plugin":   # the plugin puts /dev/infiniband's devices into the container
            limits[v.k3_k8s_rdma_resource] = v.k3_k8s_rdma_count
    security: Obj = {}
    if caps:
        security["capabilities"] = {"add": caps}
    if box is not None and box.k8s_privileged:
        security["privileged"] = True
    if box is not None and box.k8s_unconfined:
        security["seccompProfile"] = {"type": "Unconfined"}
    container: Obj = {"name": "engine", "image": rollout.plan.image, "command": cmd}
    if args:
        container["args"] = args
    container["env"] = _env(rollout, unit, tokens)
    port = _port(unit)
    head_port = _port(head)
    if port is not None:
        container["ports"] = [{"name": "http", "containerPort": port}]
        models = _models_probe if API_KEY_ENV in unit.require_spec().env_map else partial(_http_probe, "/v1/models")
        container["startupProbe"] = models(port, -(-rollout.ready_timeout // PROBE_PERIOD))
        container["readinessProbe"] = models(port, 3)
        container["livenessProbe"] = _http_probe("/health", port, 6)
    elif head_port is not None:
        container["readinessProbe"] = {"exec": {"command": ["python3", "-c", _leader_health(head_port)]},
                                       "periodSeconds": PROBE_PERIOD, "failureThreshold": 3}
    if limits:
        container["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    if security:
        container["securityContext"] = security
    container["volumeMounts"] = mounts
    spec: Obj = {"terminationGracePeriodSeconds": STOP_GRACE}
    if v.k3_k8s_host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"   # the pods' and services' names resolve
    if unit.join is not None:
        wait = wait_tcp("K3LEADER", unit.join[1], v.k3_rendezvous_timeout)
        spec["initContainers"] = [{"name": "wait-rendezvous", "image": rollout.plan.image, "command": [
            "bash", "-c", escape(wait).replace("K3LEADER", ref(LEADER_ADDRESS))]}]
    spec["containers"] = [container]
    if hw.nvl and multi and box is not None and box.k8s_imex_api:
        claims.append(("imex-channel", _claim(names, pool)))
    if claims:
        spec["resourceClaims"] = [{"name": n, "resourceClaimTemplateName": t} for n, t in claims]
        container["resources"] = {**container.get("resources", {}), "claims": [{"name": n} for n, _ in claims]}
    spec["volumes"] = volumes
    return {"metadata": {"labels": dict(meta)}, "spec": spec}


def _claim(names: Names, pool: str) -> str:
    return f"{names.lws(pool)}-imex-channel"


@dataclass(frozen=True)
class Claim:
    """A DRA claim of every engine pod of a pool: ``count`` devices of the DeviceClass ``device_class``, from the
    ResourceClaimTemplate ``template`` (one claim per pod)."""

    name: str
    template: str
    device_class: str
    count: int

    def object(self, meta: Mapping[str, str]) -> Obj:
        return {"apiVersion": DRA_API, "kind": "ResourceClaimTemplate",
                "metadata": {"name": self.template, "labels": dict(meta)},
                "spec": {"spec": {"devices": {"requests": [{"name": self.name, "exactly": {
                    "deviceClassName": self.device_class, "allocationMode": "ExactCount", "count": self.count}}]}}}}


def claim_templates(rollout: Rollout, names: Names, pool: str) -> list[Claim]:
    """The DRA claims of a pool's engine pods: its GPUs (``k3_k8s_gpus: dra``, the pack's DeviceClass), its RDMA
    devices (``k3_k8s_rdma: dra`` across nodes, ``k3_k8s_rdma_class``)."""
    v = rollout.vars
    pack = pack_for_container(rollout.plan.vendor)
    out: list[Claim] = []
    if v.k3_k8s_gpus == "dra" and pack is not None and pack.container.k8s_dra_class:
        out.append(Claim("gpus", f"{names.lws(pool)}-gpus", pack.container.k8s_dra_class,
                         hardware()[rollout.plan.hardware].gpu_count))
    if v.k3_k8s_rdma == "dra" and _needs_rdma(rollout) and v.k3_k8s_rdma_class:
        out.append(Claim("rdma", f"{names.lws(pool)}-rdma", v.k3_k8s_rdma_class, v.k3_k8s_rdma_count))
    return out


def same_env(rollout: Rollout, pool: str, units: Sequence[UnitWork], tokens: Mapping[str, str]) -> None:
    """Refuses (:class:`K3Error`) ``units`` (the heads, or the workers, of a pool: one pod template each) whose env
    differs otherwise than by their per-node values, e.g. a cluster interface (``k3_iface``) or RDMA ports
    (``k3_ib_hca``) set per host."""
    if len(units) < 2:
        return
    first = {e["name"]: e.get("value") for e in _env(rollout, units[0], tokens)}
    for u in units[1:]:
        env = {e["name"]: e.get("value") for e in _env(rollout, u, tokens)}
        for key in sorted(first.keys() | env.keys()):
            if first.get(key) != env.get(key):
                raise K3Error(f"{key} is {first.get(key)!r} on {units[0].host} and {env.get(key)!r} on {u.host}, but "
                              f"one pod template runs both (pool {pool}): give the nodes of a pool the same "
                              "k3_iface, k3_ib_hca and k3_extra_env")


def lws(rollout: Rollout, pool: str, groups: Sequence[Sequence[UnitWork]], names: Names, revision: str,
        tokens: Mapping[str, str]) -> list[Obj]:
    """The LeaderWorkerSet of one pool (with its ComputeDomain where the trays share an NVLink domain)."""
    pack = pack_for_container(rollout.plan.vendor)
    units = list(groups[0])
    head = units[0]
    size = len(units)
    for other in groups[1:]:
        if len(other) != size:
            raise K3Error(f"the replicas of {pool} differ in size ({size} and {len(other)} nodes): give every "
                          "replica the same number of hosts")
    meta = {**labels(rollout, names, pool, revision), f"{LABEL_PREFIX}/pool": pool}
    role = f"{LABEL_PREFIX}/role"
    same_env(rollout, pool, [g[0] for g in groups], tokens)
    same_env(rollout, pool, [u for g in groups for u in g[1:]], tokens)
    leader = _pod(rollout, [head], head, pack, names, pool, tokens, {**meta, role: "leader"})
    worker = _pod(rollout, units[1:], head, pack, names, pool, tokens, {**meta, role: "worker"}) \
        if size > 1 else leader
    hw = hardware()[rollout.plan.hardware]
    out: list[Obj] = [c.object(meta) for c in claim_templates(rollout, names, pool)]
    annotations = {f"{LABEL_PREFIX}/model": rollout.plan.model}
    if hw.nvl and size > 1:
        annotations[EXCLUSIVE_TOPOLOGY] = rollout.vars.k3_k8s_topology_key
    if hw.nvl and _multi(rollout) and pack is not None and pack.container.k8s_imex_api:
        out.append({"apiVersion": pack.container.k8s_imex_api, "kind": "ComputeDomain",
                    "metadata": {"name": f"{names.lws(pool)}-imex", "labels": dict(meta)},
                    "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": _claim(names, pool)}}}})
    out.append({
        "apiVersion": LWS_API, "kind": "LeaderWorkerSet",
        "metadata": {"name": names.lws(pool), "labels": dict(meta), "annotations": annotations},
        "spec": {
            "replicas": len(groups),
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
                "maxUnavailable": rollout.vars.k3_max_unavailable, "maxSurge": 0}},
            "leaderWorkerTemplate": {"size": size, "restartPolicy": "RecreateGroupAfterStart",
                                     **({"leaderTemplate": leader} if size > 1 else {}), "workerTemplate": worker},
        },
    })
    return out


def router(rollout: Rollout, names: Names, revision: str) -> Obj:
    """The router's Deployment: the rollout's router argv, each engine URL as its pod's DNS name."""
    unit = rollout.group("router")[0]
    urls: dict[str, str] = {}
    for pool, groups in pools(rollout):
        for replica, units in enumerate(groups):
            for u in units:
                port = _port(u)
                if u.serves and port is not None:
                    urls[u.serves] = f"http://{names.pod(pool, replica, u.rank)}:{port}"
    argv = [escape(a) for a in unit.node.argv]
    argv = [urls.get(a, a) for a in argv]
    port = rollout.vars.k3_router_port
    meta = labels(rollout, names, "router", revision)
    container: Obj = {"name": "router", "image": rollout.vars.k3_router_image or rollout.plan.image,
                      "command": argv[:1], "args": argv[1:], "ports": [{"name": "http", "containerPort": port}],
                      "readinessProbe": _http_probe("/health", port, 3),
                      "livenessProbe": _http_probe("/health", port, 6)}
    wait: Obj = {"name": "wait-engines", "image": container["image"],
                 "command": ["python3", "-c", escape(_engines_serve(sorted(urls.values())))]}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": names.router, "labels": dict(meta)},
            "spec": {"replicas": 1, "selector": {"matchLabels": _selector(names, "router")},
                     "template": {"metadata": {"labels": dict(meta)},
                                  "spec": {"initContainers": [wait], "containers": [container]}}}}


def _engines_serve(urls: Sequence[str]) -> str:
    """The router's init container: until every engine it fronts answers ``/health`` (the order of every launcher:
    the router starts once the engine groups serve)."""
    return ("import time, urllib.request\n"
            f"urls = {list(urls)!r}\n"
            "while urls:\n"
            "    try:\n"
            "        urllib.request.urlopen(urls[0] + '/health', timeout=5)\n"
            "        print('serving:', urls.pop(0), flush=True)\n"
            "    except Exception:\n"
            "        time.sleep(5)\n")


def _selector(names: Names, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": names.base, "app.kubernetes.io/component": component}


def service(rollout: Rollout, names: Names, revision: str) -> Obj:
    """The public endpoint: the router, or the engine group's head."""
    if "router" in rollout.groups:
        selector, port = _selector(names, "router"), rollout.vars.k3_router_port
    else:
        head = rollout.group(rollout.groups[0])[0]
        selector = {LWS_NAME_LABEL: names.lws("engine"), LWS_INDEX_LABEL: "0"}
        port = _port(head) or 8000
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": names.api, "labels": labels(rollout, names, "api", revision)},
            "spec": {"type": "ClusterIP", "selector": selector,
                     "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}]}}


def pod_security(objects: Sequence[Obj]) -> tuple[str, list[str]]:
    """The Pod Security Standard level the pods of ``objects`` need (``baseline``, or ``privileged``) and what needs
    it, as the standard (kubernetes.io, "Pod Security Standards") defines the ``baseline`` level: no host
    networking, no privileged container, no hostPath volume, no added capability outside
    :data:`BASELINE_CAPABILITIES`, no ``Unconfined`` seccomp profile. (``restricted`` wants non-root containers
    dropping every capability: the engine images run as root.)

    >>> pod_security([{"kind": "Deployment", "spec": {"template": {"spec": {"containers": [{"name": "a"}]}}}}])
    ('baseline', [])
    """
    why: dict[str, None] = {}
    for obj in objects:
        for template in templates_of(obj):
            spec = template["spec"]
            if spec.get("hostNetwork"):
                why["host networking (hostNetwork: the engines use the node's interfaces and RDMA ports)"] = None
            paths = [vol["hostPath"]["path"] for vol in spec.get("volumes", ()) if "hostPath" in vol]
            if paths:
                why[f"hostPath volumes ({', '.join(paths)})"] = None
            for c in spec.get("initContainers", []) + spec.get("containers", []):
                sec = c.get("securityContext", {})
                if sec.get("privileged"):
                    why["privileged containers"] = None
                added = [x for x in sec.get("capabilities", {}).get("add", ()) if x not in BASELINE_CAPABILITIES]
                if added:
                    why[f"the capabilities {', '.join(added)}"] = None
                if sec.get("seccompProfile", {}).get("type") == "Unconfined":
                    why["an Unconfined seccomp profile"] = None
    return ("privileged" if why else "baseline"), list(why)


def templates_of(obj: Obj) -> list[Obj]:
    """The pod templates of an object: an LWS's leader and worker, a Deployment's; none of any other kind."""
    if obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        return [lwt[k] for k in ("leaderTemplate", "workerTemplate") if k in lwt]
    if obj["kind"] == "Deployment":
        return [obj["spec"]["template"]]
    return []


def namespace(rollout: Rollout, names: Names, revision: str, objects: Sequence[Obj]) -> Obj:
    """The ``Namespace`` of every object, labelled with the Pod Security Standard its pods need
    (:func:`pod_security`)."""
    level, _ = pod_security(objects)
    meta = {k: val for k, val in labels(rollout, names, "namespace", revision).items()
            if k.startswith("app.kubernetes.io/") and k != "app.kubernetes.io/component"}
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": rollout.vars.k3_k8s_namespace, "labels": {**meta, POD_SECURITY: level}}}


def _in_namespace(obj: Obj, ns: str) -> Obj:
    meta = obj["metadata"]
    return {**obj, "metadata": {"name": meta["name"], "namespace": ns,
                                **{k: val for k, val in meta.items() if k != "name"}}}


def _objects(rollout: Rollout, tokens: Mapping[str, str]) -> list[tuple[tuple[str, ...], Obj]]:
    """Every object of the rollout in apply order, each with the groups whose pods it runs (none: the Namespace,
    the Service)."""
    names = check(rollout)
    revision = plan_revision(rollout)
    ns = rollout.vars.k3_k8s_namespace
    out: list[tuple[tuple[str, ...], Obj]] = []
    for pool, groups in pools(rollout):
        members = tuple(units[0].group for units in groups)
        out += [(members, obj) for obj in lws(rollout, pool, groups, names, revision, tokens)]
    if "router" in rollout.groups:
        out.append((("router",), router(rollout, names, revision)))
    out.append(((), service(rollout, names, revision)))
    placed = [(groups, _in_namespace(obj, ns)) for groups, obj in out]
    return [((), namespace(rollout, names, revision, [obj for _, obj in out])), *placed]


def manifests(rollout: Rollout, tokens: Mapping[str, str] | None = None) -> list[Obj]:
    """Every object of the rollout, in apply order: the Namespace, then in it ResourceClaimTemplates,
    ComputeDomains, LeaderWorkerSets, the router's Deployment, the public Service. ``tokens``: a node's blank -> the
    one blank its pool's pod template carries."""
    return [obj for _, obj in _objects(rollout, tokens or {})]


def file_name(index: int, obj: Obj) -> str:
    """The file of an object: apply order, kind and name."""
    return f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


#: the kinds of object whose pod template runs a unit
POD_KINDS = ("LeaderWorkerSet", "Deployment")


@dataclass(frozen=True)
class Export:
    """The Kubernetes export of a rollout, as what renders its files (the half of a launcher that every launcher
    shares: :class:`k3deploy.runtime.launchers.Renderer`; an export starts nothing, so it is no launcher): one YAML
    file per object (:func:`manifests`), named in apply order (:func:`file_name`). A unit runs from the manifest
    of its pool's LeaderWorkerSet (the router: its Deployment); a revision of a group is those of its objects, as
    Kubernetes keeps them (ControllerRevisions); its output is its pod's log (``kubectl logs``). Got from
    :func:`k3deploy.runtime.launchers.export_for`.

    >>> from k3deploy.model.binding import HostRecord
    >>> from k3deploy.model.pipeline import desired_rollout, target
    >>> r = desired_rollout(target([HostRecord("n1", ("head",), {"k3_hardware": "b300", "k3_ip": "10.0.0.1"})],
    ...                            None))
    >>> export = Export(r)
    >>> list(export.objects)
    ['00-namespace-k3.yaml', '01-leaderworkerset-k3-engine.yaml', '02-service-k3-engine-api.yaml']
    >>> export.unit_file(r.units[0]), export.log_dir(r.units[0])
    ('01-leaderworkerset-k3-engine.yaml', None)
    """

    rollout: Rollout
    #: a node's blank -> the one blank its pool's pod template carries
    tokens: Mapping[str, str] = field(default_factory=dict, compare=False)
    name: ClassVar[str] = "kubernetes"

    @cached_property
    def _placed(self) -> list[tuple[str, tuple[str, ...], Obj]]:
        return [(file_name(i, obj), groups, obj) for i, (groups, obj) in enumerate(_objects(self.rollout,
                                                                                            self.tokens))]

    @property
    def objects(self) -> dict[str, Obj]:
        """file name -> object, in apply order."""
        return {f: obj for f, _, obj in self._placed}

    @property
    def revision(self) -> str:
        """The plan's revision, every object's ``revision`` label (:func:`plan_revision`)."""
        return plan_revision(self.rollout)

    def text(self, file: str) -> str:
        """The YAML of one file of :attr:`objects`."""
        text: str = yaml.safe_dump(self.objects[file], sort_keys=False, width=120)
        return text

    def unit_file(self, unit: UnitWork) -> str:
        """The manifest whose pod template runs ``unit``: its pool's LeaderWorkerSet, or the router's Deployment."""
        return next(f for f, groups, obj in self._placed if unit.group in groups and obj["kind"] in POD_KINDS)

    def log_dir(self, unit: UnitWork) -> str | None:
        """None: its pod's log (``kubectl logs``)."""
        return None

    def kept(self, unit: UnitWork) -> list[str]:
        """The manifest ``unit`` runs from (:meth:`unit_file`)."""
        return [self.unit_file(unit)]

    def revision_files(self, group: str) -> dict[str, str]:
        """``file -> sha256`` of the objects ``group``'s pods run from (its ComputeDomain, its LeaderWorkerSet)."""
        return {f: sha256(self.text(f)) for f, groups, _ in self._placed if group in groups}
