"""What a cluster needs before ``kubectl apply`` of the Kubernetes export, pure: each prerequisite with its minimum
version and where that minimum comes from (README.txt lists them), and ``check.sh``, plain ``kubectl`` commands that
verify each one on the cluster kubectl points at and print one line per check (``ok: ...`` or ``missing: ...; fix:
...``), exiting 1 when one is missing.

The minimums, each from its source:

* LeaderWorkerSet >= v0.9.0: ``restartPolicy: RecreateGroupAfterStart`` became an API value in kubernetes-sigs/lws
  #757, first released in v0.9.0 (its CRD, ``config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml``,
  lists the value from that tag on; v0.8.0's does not), which the check reads from the installed CRD.
* Kubernetes >= 1.34 where a pod claims a device through DRA (a ComputeDomain's IMEX channel, ``k3_k8s_gpus: dra``,
  ``k3_k8s_rdma: dra``): ``resource.k8s.io/v1`` is GA and on by default from 1.34 (kubernetes.io blog, "Kubernetes
  v1.34: DRA has graduated to GA", 2025-09-01); else >= 1.27, LWS's own floor (its installation docs at v0.9.0:
  1.26 only with the StatefulSet start-ordinal feature gate).
* The NVIDIA DRA driver >= v25.8.0 for a ComputeDomain with ``numNodes: 0``: from v25.8.0 its feature gate
  ``IMEXDaemonsWithDNSNames`` is on by default (kubernetes-sigs/dra-driver-nvidia-gpu
  ``pkg/featuregates/featuregates.go`` at v25.8.0; v25.3.2 has no such gate), and with it ``numNodes`` is
  recommended to be 0 (``api/nvidia.com/resource/v1beta1/computedomain.go``); it needs GPU driver >= 570.158.01
  (``IMEXDaemonsWithDNSNamesMinDriverVersion``, ``cmd/compute-domain-kubelet-plugin``). The check reads the
  version from the tag of the driver's image (``nvcr.io/nvidia/k8s-dra-driver-gpu:v<version>``, the Helm chart's
  ``image.repository``).
* GPU Feature Discovery's ``nvidia.com/gpu.clique`` (``<ClusterUUID>.<CliqueId>``) labels NVLink-domain nodes from
  NVIDIA/k8s-device-plugin v0.17.0 (``internal/lm/imex.go``); each group must fit in one domain.
* The PodSecurity level of the namespace: ``privileged`` where the pods use host networking, hostPath volumes or
  capabilities beyond ``baseline`` (kubernetes.io, "Pod Security Standards";
  :func:`k3deploy.model.kubernetes.pod_security`).
* The device plugins or DRA drivers that the chosen resources need: the vendor pack's data
  (``Container.k8s_device_plugin``, ``k8s_dra_class``, ``k8s_dra_driver``), and the RDMA resource's plugin.

Example::

    >>> ver_ge_sh()[:9]
    'ver_ge() '
    >>> jsonpath_key("nvidia.com/gpu")
    'nvidia\\\\.com/gpu'
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from k3deploy.model.kubernetes import DRA_API, EXCLUSIVE_TOPOLOGY, LWS_API, POD_SECURITY, pod_security, templates_of
from k3deploy.model.rollout import Rollout
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors import pack_for_container

Obj = dict[str, Any]

LWS_MIN = "0.9.0"
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
LWS_INSTALL = ("kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases/download/"
               f"v{LWS_MIN}/manifests.yaml")
#: the Kubernetes release from which DRA (resource.k8s.io/v1) is GA and on by default
K8S_DRA_MIN = "1.34"
#: LWS's own floor (its installation docs)
K8S_LWS_MIN = "1.27"
NVIDIA_DRA_MIN = "25.8.0"
NVIDIA_DRA_IMAGE = "k8s-dra-driver-gpu"
COMPUTE_DOMAIN_CRD = "computedomains.resource.nvidia.com"
GFD_MIN = "0.17.0"


@dataclass(frozen=True)
class Need:
    """One prerequisite: what (with its minimum version), where that comes from, and the ``sh`` lines of
    ``check.sh`` that verify it and print one line."""

    what: str
    source: str
    check: str


def jsonpath_key(key: str) -> str:
    """A map key (a label, a resource name) as one step of a kubectl JSONPath: its dots escaped."""
    return key.replace(".", "\\.")


def ver_ge_sh() -> str:
    """The ``sh`` function ``ver_ge A B``: whether the dotted version A >= B (each part's digits compared as
    numbers; a part that is absent counts 0)."""
    return ("ver_ge() {\n"
            "  a=$1; b=$2\n"
            "  while [ -n \"$a$b\" ]; do\n"
            "    x=$(printf '%s' \"${a%%.*}\" | tr -cd 0-9); y=$(printf '%s' \"${b%%.*}\" | tr -cd 0-9)\n"
            "    [ \"${x:-0}\" -gt \"${y:-0}\" ] && return 0\n"
            "    [ \"${x:-0}\" -lt \"${y:-0}\" ] && return 1\n"
            "    case $a in *.*) a=${a#*.} ;; *) a= ;; esac\n"
            "    case $b in *.*) b=${b#*.} ;; *) b= ;; esac\n"
            "  done\n"
            "  return 0\n"
            "}\n")


def _q(text: str) -> str:
    return shlex.quote(text)


def _engines(objects: Sequence[Obj]) -> tuple[int, int]:
    """(engine pods in all, the largest group) of the LeaderWorkerSets."""
    total = largest = 0
    for obj in objects:
        if obj["kind"] == "LeaderWorkerSet":
            size = obj["spec"]["leaderWorkerTemplate"]["size"]
            total += size * obj["spec"]["replicas"]
            largest = max(largest, size)
    return total, largest


def _required_keys(objects: Sequence[Obj], secret: str) -> list[str]:
    """The keys of the Secret ``secret`` that some container needs (a reference that is not optional)."""
    keys: dict[str, None] = {}
    for obj in objects:
        for t in templates_of(obj):
            for c in t["spec"].get("containers", []):
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref and ref["name"] == secret and not ref.get("optional"):
                        keys[ref["key"]] = None
    return list(keys)


def _nodes_with(resource: str, count: int, nodes: int, fix: str) -> str:
    """Lines that count the nodes whose allocatable ``resource`` is >= ``count`` and want ``nodes`` of them."""
    path = f"{{range .items[*]}}{{.status.allocatable.{jsonpath_key(resource)}}}{{\"\\n\"}}{{end}}"
    what = f"nodes with {count} or more {resource} allocatable"
    return (f"have=$(kubectl get nodes -o {_q('jsonpath=' + path)} 2>/dev/null | awk -v n={count} '$1 + 0 >= n' "
            "| wc -l | tr -d ' ')\n"
            f"if [ \"$have\" -ge {nodes} ]; then ok \"{what}: $have ({nodes} needed)\"; "
            f"else missing \"{what}: $have of {nodes}\" {_q(fix)}; fi\n")


def _device_class(name: str, fix: str) -> str:
    return (f"if kubectl get deviceclass {_q(name)} -o name >/dev/null 2>&1; then ok {_q(f'DeviceClass {name}')}; "
            f"else missing {_q(f'DeviceClass {name} (DRA)')} {_q(fix)}; fi\n")


def needs(rollout: Rollout, objects: Sequence[Obj]) -> list[Need]:
    """The prerequisites of ``objects`` (the export of ``rollout``), in the order ``check.sh`` checks them."""
    v = rollout.vars
    pack = pack_for_container(rollout.plan.vendor)
    box = pack.container if pack is not None else None
    kinds = {o["kind"] for o in objects}
    dra = bool(kinds & {"ResourceClaimTemplate", "ComputeDomain"})
    total, largest = _engines(objects)
    gpus = hardware()[rollout.plan.hardware].gpu_count
    out: list[Need] = []

    k8s_min = K8S_DRA_MIN if dra else K8S_LWS_MIN
    k8s_source = ("resource.k8s.io/v1 (DRA) is GA and on by default from 1.34: kubernetes.io/blog/2025/09/01/"
                  "kubernetes-v1-34-dra-updates" if dra else
                  "LWS's floor: kubernetes-sigs/lws site/content/en/docs/installation/_index.md at v0.9.0")
    out.append(Need(
        f"Kubernetes >= {k8s_min}" + (" (pods claim devices through DRA, resource.k8s.io/v1)" if dra else ""),
        k8s_source,
        "if v=$(kubectl get --raw /version 2>&1); then :; else\n"
        "  echo \"missing: the cluster's API server (kubectl get --raw /version: $(printf '%s\\n' \"$v\" | head -n 1));"
        " fix: point kubectl at the cluster (KUBECONFIG, --context)\"\n  exit 1\nfi\n"
        "major=$(printf '%s\\n' \"$v\" | sed -n 's/.*\"major\": *\"\\([0-9]*\\).*/\\1/p' | head -n 1)\n"
        "minor=$(printf '%s\\n' \"$v\" | sed -n 's/.*\"minor\": *\"\\([0-9]*\\).*/\\1/p' | head -n 1)\n"
        f"if ver_ge \"$major.$minor\" {k8s_min}; then ok \"Kubernetes $major.$minor (>= {k8s_min})\"; "
        f"else missing \"Kubernetes >= {k8s_min}, the server is $major.$minor\" "
        f"{_q(f'upgrade the cluster to {k8s_min} or later')}; fi\n"))

    restart = ("{.spec.versions[*].name} {.spec.versions[*].schema.openAPIV3Schema.properties.spec.properties."
               "leaderWorkerTemplate.properties.restartPolicy.enum}")
    lws_ok = _q(f"LeaderWorkerSet >= v{LWS_MIN} (restartPolicy RecreateGroupAfterStart)")
    lws_old = _q(f"LeaderWorkerSet >= v{LWS_MIN}: the installed CRD has no restartPolicy RecreateGroupAfterStart (an "
                 "older release)")
    lws_none = _q(f"LeaderWorkerSet >= v{LWS_MIN}: no CRD {LWS_CRD}")
    out.append(Need(
        f"LeaderWorkerSet >= v{LWS_MIN} ({LWS_API}, restartPolicy RecreateGroupAfterStart)",
        "kubernetes-sigs/lws#757, released in v0.9.0: the CRD's restartPolicy enum lists RecreateGroupAfterStart "
        "from v0.9.0 (config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml)",
        f"if crd=$(kubectl get crd {LWS_CRD} -o {_q('jsonpath=' + restart)} 2>/dev/null); then\n"
        "  case $crd in\n"
        f"    *v1*RecreateGroupAfterStart*) ok {lws_ok} ;;\n"
        f"    *) missing {lws_old} "
        f"{_q(f'upgrade LWS: {LWS_INSTALL}')} ;;\n"
        "  esac\n"
        f"else missing {lws_none} {_q(f'install LWS: {LWS_INSTALL}')}; fi\n"))

    nvidia_dra = box is not None and box.k8s_dra_class == "gpu.nvidia.com" and (
        "ComputeDomain" in kinds or v.k3_k8s_gpus == "dra")
    if "ComputeDomain" in kinds:
        api = next(o["apiVersion"] for o in objects if o["kind"] == "ComputeDomain")
        version = api.rsplit("/", 1)[1]
        fix = f"install the NVIDIA DRA driver >= v{NVIDIA_DRA_MIN} (github.com/kubernetes-sigs/dra-driver-nvidia-gpu)"
        out.append(Need(
            f"ComputeDomain ({api}) of the NVIDIA DRA driver, for each group's IMEX channel",
            "kubernetes-sigs/dra-driver-nvidia-gpu deployments/helm/.../crds/resource.nvidia.com_computedomains.yaml",
            f"if cd=$(kubectl get crd {COMPUTE_DOMAIN_CRD} -o 'jsonpath={{.spec.versions[*].name}}' 2>/dev/null) "
            f"&& case \" $cd \" in *\" {version} \"*) true ;; *) false ;; esac; then "
            f"ok {_q(f'CRD {COMPUTE_DOMAIN_CRD} serves {version}')}; "
            f"else missing {_q(f'CRD {COMPUTE_DOMAIN_CRD} serving {version}')} {_q(fix)}; fi\n"))
    if nvidia_dra:
        out.append(Need(
            f"the NVIDIA DRA driver >= v{NVIDIA_DRA_MIN} (IMEXDaemonsWithDNSNames on by default: ComputeDomain "
            "numNodes 0; GPU driver >= 570.158.01)",
            "kubernetes-sigs/dra-driver-nvidia-gpu pkg/featuregates/featuregates.go at v25.8.0, "
            "api/nvidia.com/resource/v1beta1/computedomain.go",
            "images=$(kubectl get daemonsets -A -o 'jsonpath={.items[*].spec.template.spec.containers[*].image}' "
            "2>/dev/null || true)\n"
            "dra=\nfor image in $images; do\n"
            f"  case $image in */{NVIDIA_DRA_IMAGE}:v*) dra=${{image##*:v}} ;; esac\n"
            "done\n"
            f"if [ -z \"$dra\" ]; then missing "
            f"{_q(f'the NVIDIA DRA driver >= v{NVIDIA_DRA_MIN}: no DaemonSet runs its image ({NVIDIA_DRA_IMAGE})')} "
            f"{_q(f'install it (helm chart nvidia-dra-driver-gpu >= {NVIDIA_DRA_MIN})')}\n"
            f"elif ver_ge \"$dra\" {NVIDIA_DRA_MIN}; then ok \"the NVIDIA DRA driver v$dra (>= v{NVIDIA_DRA_MIN})\"\n"
            f"else missing \"the NVIDIA DRA driver >= v{NVIDIA_DRA_MIN}, it is v$dra (numNodes 0 needs "
            f"IMEXDaemonsWithDNSNames)\" {_q(f'upgrade it to v{NVIDIA_DRA_MIN} or later')}; fi\n"))

    for obj in objects:
        if obj["kind"] != "ResourceClaimTemplate":
            continue
        request = obj["spec"]["spec"]["devices"]["requests"][0]
        cls = request["exactly"]["deviceClassName"]
        if request["name"] == "gpus" and box is not None:
            driver = box.k8s_dra_driver
            out.append(Need(f"the DeviceClass {cls} ({DRA_API}) of {driver}",
                            f"the driver creates the DeviceClass {cls} (the vendor pack's k8s_dra_class, with its "
                            "source)", _device_class(cls, f"install {driver}")))
        else:
            out.append(Need(f"the DeviceClass {cls} of the site's RDMA DRA driver (k3_k8s_rdma_class)",
                            "the site's DRA driver", _device_class(cls, "install the RDMA DRA driver, or give "
                                                                        "--rdma-class the DeviceClass it creates")))

    if any(EXCLUSIVE_TOPOLOGY in o["metadata"].get("annotations", {}) for o in objects):
        key = v.k3_k8s_topology_key
        gfd = key == "nvidia.com/gpu.clique"
        path = f"{{range .items[*]}}{{.metadata.labels.{jsonpath_key(key)}}}{{\"\\n\"}}{{end}}"
        fix = (f"run GPU Feature Discovery >= v{GFD_MIN} (NVIDIA/k8s-device-plugin, or the GPU Operator)" if gfd
               else f"label each node with its NVLink domain as {key} (k3_k8s_topology_key)")
        out.append(Need(
            f"the node label {key} (one value per NVLink domain), {largest} nodes in one domain"
            + (f": GPU Feature Discovery >= v{GFD_MIN}" if gfd else ""),
            "NVIDIA/k8s-device-plugin internal/lm/imex.go (from v0.17.0)" if gfd else "k3_k8s_topology_key",
            f"best=$(kubectl get nodes -l {_q(key)} -o {_q('jsonpath=' + path)} 2>/dev/null | sort | uniq -c | "
            "sort -rn | awk 'NR == 1 {print $1}')\n"
            f"if [ \"${{best:-0}}\" -ge {largest} ]; then ok \"{key}: ${{best:-0}} nodes in one domain "
            f"({largest} needed)\"; else missing \"{key}: at most ${{best:-0}} nodes in one domain, a group "
            f"needs {largest}\" {_q(fix)}; fi\n"))

    if box is not None and box.k8s_resource and v.k3_k8s_gpus == "device-plugin":
        out.append(Need(f"{box.k8s_resource} (device plugin): {gpus} per node on {total} nodes",
                        box.k8s_device_plugin,
                        _nodes_with(box.k8s_resource, gpus, total, f"install {box.k8s_device_plugin}")))
    rdma = any(v.k3_k8s_rdma_resource in c.get("resources", {}).get("limits", {})
               for o in objects for t in templates_of(o) for c in t["spec"]["containers"])
    if rdma:
        out.append(Need(
            f"{v.k3_k8s_rdma_resource} (RDMA device plugin): {v.k3_k8s_rdma_count} per node on {total} nodes",
            "NVIDIA Network Operator's rdmaSharedDevicePlugin (Mellanox/k8s-rdma-shared-dev-plugin; resourceName "
            "rdma_shared_device_a in its NicClusterPolicy examples), or the site's (k3_k8s_rdma_resource)",
            _nodes_with(v.k3_k8s_rdma_resource, v.k3_k8s_rdma_count, total,
                        "install an RDMA device plugin advertising it (k8s-rdma-shared-dev-plugin, or NVIDIA's "
                        "Network Operator), or give --rdma-resource the one the site has")))

    ns = v.k3_k8s_namespace
    level, why = pod_security(objects)
    label_path = f"{{.metadata.labels.{jsonpath_key(POD_SECURITY)}}}"
    need_text = f"{POD_SECURITY}={level}" + (f" ({'; '.join(why)})" if why else "")
    out.append(Need(
        f"the namespace {ns} with the PodSecurity level {level}" + (f": {'; '.join(why)}" if why else ""),
        "kubernetes.io/docs/concepts/security/pod-security-standards (baseline forbids each of these)",
        f"if level=$(kubectl get namespace {_q(ns)} -o {_q('jsonpath=' + label_path)} 2>/dev/null); then\n"
        "  case $level in\n"
        f"    {'|'.join(dict.fromkeys(('privileged', level)))}) ok \"namespace {ns}: {POD_SECURITY}=$level\" ;;\n"
        f"    '') ok {_q(f'namespace {ns}: no PodSecurity label (kubectl apply sets {POD_SECURITY}={level})')} ;;\n"
        f"    *) missing \"namespace {ns} enforces $level, its pods need {need_text}\" "
        + _q(f"kubectl label --overwrite namespace {ns} {POD_SECURITY}={level} (kubectl apply does it where you "
             "may)") + " ;;\n"
        "  esac\n"
        f"else ok {_q(f'namespace {ns}: kubectl apply creates it with {POD_SECURITY}={level}')}; fi\n"))

    secret = v.k3_k8s_secret
    keys = _required_keys(objects, secret)
    if keys:
        lines = "lack=\n"
        for key in keys:
            lines += (f"[ \"$(kubectl get secret -n {_q(ns)} {_q(secret)} -o {_q('jsonpath={.data.' + key + '}')} "
                      f"2>/dev/null | wc -c | tr -d ' ')\" -gt 0 ] || lack=\"$lack {key}\"\n")
        create = f"kubectl create secret generic -n {ns} {secret} " + " ".join(
            f"--from-file={k}=<file holding it>" for k in keys)
        lines += (f"if [ -z \"$lack\" ]; then ok {_q(f'Secret {ns}/{secret} holds ' + ', '.join(keys))}; "
                  f"else missing \"Secret {ns}/{secret}: no$lack\" {_q(create)}; fi\n")
        out.append(Need(f"the Secret {secret} in {ns} with {', '.join(keys)}", "k3_k8s_secret", lines))
    if v.k3_k8s_cache_pvc:
        pvc = v.k3_k8s_cache_pvc
        out.append(Need(
            f"the PersistentVolumeClaim {pvc} in {ns} (the model cache)", "k3_k8s_cache_pvc",
            f"if kubectl get pvc -n {_q(ns)} {_q(pvc)} -o name >/dev/null 2>&1; then ok {_q(f'PVC {ns}/{pvc}')}; "
            f"else missing {_q(f'PVC {ns}/{pvc} (the model cache)')} "
            f"{_q('create it (ReadWriteMany) and put the weights in it')}; fi\n"))
    return out



def script(checks: Sequence[Need], directory: str) -> str:
    """``check.sh``: every prerequisite's check, one line each, exit 1 when one is missing."""
    head = ("#!/bin/sh\n"
            f"# Checks that the cluster kubectl points at has what the manifests of {directory} need (README.txt\n"
            "# says each and where its minimum comes from): one line per check, ok or missing (with the fix);\n"
            "# exit 1 when one is missing. It changes nothing. Written by `k3deploy export kubernetes`.\n"
            "set -eu\n"
            "failed=0\n"
            "ok() { printf 'ok: %s\\n' \"$1\"; }\n"
            "missing() { printf 'missing: %s; fix: %s\\n' \"$1\" \"$2\"; failed=1; }\n"
            + ver_ge_sh())
    body = "".join(f"# {c.what}\n{c.check}" for c in checks)
    return head + body + "exit $failed\n"
