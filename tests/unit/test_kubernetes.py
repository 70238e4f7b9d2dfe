"""The Kubernetes form of a rollout (``k3deploy/model/kubernetes.py``): every strategy on every vendor family (and
replicas, P/D) exports objects that the vendored CRD schemas and the built-in schemas accept, that equal their golden
files, and whose containers run, once Kubernetes (and, where there is one, the shell) filled in the LWS values of a
concrete group, exactly the plan's argv and env of that node."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from helpers.kubernetes import (
    GOLDEN_K8S,
    as_pod,
    built,
    builtin_errors,
    cases,
    crd_errors,
    crd_schemas,
    golden_text,
    manifests,
    node_runs,
    pod_templates,
)
from k3deploy.errors import K3Error
from k3deploy.model import kubernetes as k8s
from k3deploy.model.rollout import sha256
from k3deploy.runtime.launchers import Launcher, Renderer, export_for

CASES = sorted(cases())
REGENERATE = "cd tests && ../.venv/bin/python -m helpers.kubernetes --write"


def _objects(case: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in manifests(case) if o["kind"] == kind]


@pytest.mark.parametrize("case", CASES)
def test_every_object_validates_against_its_schema(case):
    for obj in manifests(case):
        if (obj["apiVersion"], obj["kind"]) in crd_schemas():
            assert crd_errors(obj) == [], (case, obj["kind"])
        else:
            assert builtin_errors(obj) == [], (case, obj["kind"])
        for role, template in pod_templates(obj):
            assert builtin_errors(as_pod(template, f"{obj['metadata']['name']}-{role}")) == [], (case, role)


def test_the_schemas_refuse_what_they_should():
    obj = _objects("b300-multi_node_tp", "LeaderWorkerSet")[0]
    bad = json.loads(json.dumps(obj))
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    bad["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    errors = crd_errors(bad)
    assert any("restartPolicy" in e for e in errors) and any("sizee" in e for e in errors)
    pod = as_pod(pod_templates(obj)[0][1], "x")
    pod["spec"]["containers"][0]["imagee"] = "x"
    assert builtin_errors(pod)


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    path = GOLDEN_K8S / f"{case}.yaml"
    assert path.is_file(), f"no golden file for {case}: {REGENERATE}"
    assert golden_text(case) == path.read_text(), f"the export of {case} drifted from {path}: {REGENERATE}"


def test_no_golden_file_without_its_case():
    assert sorted(p.stem for p in GOLDEN_K8S.glob("*.yaml")) == CASES


def test_a_disaggregated_set_of_the_two_pools_validates_too():
    """P/D is exported as two LWS and the router's Deployment (docs/kubernetes.md says why); their specs are what a
    DisaggregatedSet's roles take, so a site that runs one can wrap them."""
    pools = _objects("b300-pd_cluster", "LeaderWorkerSet")
    ds = {"apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": "DisaggregatedSet", "metadata": {"name": "k3"},
          "spec": {"roles": [{"name": o["metadata"]["labels"]["k3deploy.io/pool"], "spec": o["spec"]}
                             for o in pools]}}
    assert crd_errors(ds) == []


# ---------------------------------------------------------------------------------------------- LWS settings


@pytest.mark.parametrize("case", CASES)
def test_one_lws_per_pool_with_the_plans_shape(case):
    rollout, _, _ = built(case)
    lws = _objects(case, "LeaderWorkerSet")
    pools = k8s.pools(rollout)
    assert [o["metadata"]["name"] for o in lws] == [k8s.Names("k3-engine").lws(p) for p, _ in pools]
    for obj, (_, groups) in zip(lws, pools, strict=True):
        spec = obj["spec"]
        assert spec["replicas"] == len(groups) == (max(1, len(rollout.replicas)) if len(pools) == 1 else 1)
        assert spec["leaderWorkerTemplate"]["size"] == len(groups[0])
        assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupAfterStart"
        assert spec["startupPolicy"] == "LeaderCreated"
        assert spec["rolloutStrategy"]["rollingUpdateConfiguration"]["maxUnavailable"] == \
            rollout.vars.k3_max_unavailable
        for _, template in pod_templates(obj):
            engine = template["spec"]["containers"][0]
            assert engine["image"] == rollout.plan.image
            assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in \
                template["spec"]["volumes"]
            assert any(r.endswith("gpu") or "Ascend" in r for r in engine["resources"].get("limits", {})) or \
                {"name": "gpus"} in engine["resources"]["claims"]
    nvl = case.startswith("gb300") and not case.endswith("single_node_tp")
    assert bool(_objects(case, "ComputeDomain")) == nvl
    assert ("router" in rollout.groups) == bool(_objects(case, "Deployment"))
    assert len(_objects(case, "Service")) == 1


def test_nvl_trays_get_a_compute_domain_claim_and_one_topology_domain_per_group():
    lws = _objects("gb300-multi_node_tp", "LeaderWorkerSet")[0]
    domain = _objects("gb300-multi_node_tp", "ComputeDomain")[0]
    claim = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    assert lws["metadata"]["annotations"][k8s.EXCLUSIVE_TOPOLOGY] == "nvidia.com/gpu.clique"
    for _, template in pod_templates(lws):
        assert template["spec"]["resourceClaims"] == [{"name": "imex-channel", "resourceClaimTemplateName": claim}]
        assert template["spec"]["containers"][0]["resources"]["claims"] == [{"name": "imex-channel"}]


def test_workers_wait_for_the_heads_rendezvous_port_and_serving_pods_have_probes():
    rollout, _, _ = built("b300-multi_node_tp")
    lws = _objects("b300-multi_node_tp", "LeaderWorkerSet")[0]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert "initContainers" not in leader
    wait = worker["initContainers"][0]["command"][2]
    assert "$(LWS_LEADER_ADDRESS) 29501" in wait
    probes = leader["containers"][0]
    assert probes["startupProbe"]["httpGet"]["path"] == "/v1/models"
    assert probes["startupProbe"]["failureThreshold"] * probes["startupProbe"]["periodSeconds"] >= \
        rollout.ready_timeout
    assert probes["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "LWS_LEADER_ADDRESS" in worker["containers"][0]["readinessProbe"]["exec"]["command"][2]
    assert leader["hostNetwork"] is True and "IPC_LOCK" in \
        leader["containers"][0]["securityContext"]["capabilities"]["add"]


def test_the_router_fronts_every_replicas_pods_by_name():
    deployment = _objects("b300-multi_node_dep-r2", "Deployment")[0]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    urls = args[args.index("--worker-urls") + 1:args.index("--host")]
    assert urls == ["http://k3-engine-0.k3-engine:8000", "http://k3-engine-0-1.k3-engine:8000",
                    "http://k3-engine-1.k3-engine:8000", "http://k3-engine-1-1.k3-engine:8000"]
    pd = _objects("b300-pd_cluster", "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "http://k3-engine-prefill-0.k3-engine-prefill:8001" in pd
    assert "http://k3-engine-decode-0-1.k3-engine-decode:8002" in pd


# ---------------------------------------------------------------------------------------------- argv per node


@pytest.mark.parametrize("case", CASES)
def test_each_pod_runs_its_nodes_argv_and_env(case, tmp_path):
    runs = node_runs(case, tmp_path)
    assert runs
    for unit, argv, env, want in runs:
        assert argv == unit.node.argv, (case, unit.group, unit.rank)
        assert env == want, (case, unit.group, unit.rank)


def test_per_node_values_come_from_lws():
    lws = _objects("b300-multi_node_dep", "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]
    script = lws["workerTemplate"]["spec"]["containers"][0]["command"][2]
    assert '"$$((LWS_WORKER_INDEX * 8 + 0))"' in script and "'$(LWS_LEADER_ADDRESS)'" in script
    tp = _objects("b300-multi_node_tp", "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]
    args = tp["workerTemplate"]["spec"]["containers"][0]["args"]
    assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
    assert args[args.index("--nnodes") + 1] == "$(LWS_GROUP_SIZE)"


def test_each_vendor_pack_names_its_kubernetes_resource():
    from k3deploy.vendors import PACKS

    assert all(pack.container.k8s_resource for pack in PACKS)


def test_a_value_that_does_not_follow_the_rank_is_refused():
    rollout, _, _ = built("gb300-multi_node_tp_pp")
    units = copy.deepcopy(rollout.group("engine"))
    assert len(units) >= 3
    spec = units[2].require_spec()
    words = list(spec.argv_words)
    words[spec.argv.index("--node-rank") + 1] = ("7",)
    units[2] = replace(units[2], spec=replace(spec, argv_words=tuple(words)))
    with pytest.raises(K3Error, match="not a multiple of the rank"):
        k8s.role_template(units[1:], {})


def test_secrets_are_referenced_never_written(tmp_path):
    from k3deploy.cli.export import _from_selection

    params: dict[str, Any] = {"hardware": "b300", "strategy": "multi_node_tp", "variant": "default", "features": None,
                              "nodes": None, "prefill_nodes": None, "decode_nodes": None, "image": None}
    rollout, _, _, _ = _from_selection(params, None, {"k3_extra_env": {"SITE_API_TOKEN": "s3cr3t-value"}})
    text = json.dumps(k8s.manifests(rollout))
    assert "s3cr3t-value" not in text
    lws = next(o for o in k8s.manifests(rollout) if o["kind"] == "LeaderWorkerSet")
    env = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs["SITE_API_TOKEN"] == {"name": "k3deploy-secrets", "key": "SITE_API_TOKEN"}
    assert refs["HF_TOKEN"]["name"] == "k3deploy-secrets" and refs["HF_TOKEN"]["optional"] is True


def test_a_name_kubernetes_refuses_is_one_line():
    from k3deploy.cli.export import _from_selection

    params: dict[str, Any] = {"hardware": "b300", "strategy": "single_node_tp", "variant": "default",
                              "features": None, "nodes": None, "prefill_nodes": None, "decode_nodes": None,
                              "image": None}
    rollout, _, _, _ = _from_selection(params, None, {"k3_unit_name": "K3_Engine"})
    with pytest.raises(K3Error, match="k3_unit_name: 'K3_Engine' cannot name Kubernetes objects"):
        k8s.manifests(rollout)


def _serve_health() -> tuple[Any, str]:
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_the_init_containers_wait_as_written(tmp_path):
    """The router waits until every engine it fronts serves; a worker until its head's rendezvous port is open: both
    scripts run here as Kubernetes would start them (the engine's address standing in for the head's pod)."""
    import re
    import subprocess
    import sys

    server, url = _serve_health()
    try:
        deployment = _objects("b300-pd_cluster", "Deployment")[0]["spec"]["template"]["spec"]
        script = k8s.expand(deployment["initContainers"][0]["command"][2], {})
        script = re.sub(r"urls = \[.*?\]", f"urls = [{url!r}, {url!r}]", script)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.count("serving:") == 2, proc.stderr
        worker = _objects("b300-multi_node_tp", "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]
        wait = worker["workerTemplate"]["spec"]["initContainers"][0]["command"]
        port = server.server_address[1]
        text = k8s.expand(wait[2], {k8s.LEADER_ADDRESS: "127.0.0.1"}).replace(" 29501 ", f" {port} ")
        proc = subprocess.run([*wait[:2], text], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "rendezvous 127.0.0.1:29501 open" in proc.stdout, proc.stderr
    finally:
        server.shutdown()


@pytest.mark.parametrize("case", ["b300-pd_cluster", "b300-multi_node_dep-r2", "gb300-multi_node_tp"])
def test_the_export_renders_its_files_behind_the_launchers_renderer(case):
    """The export is the files half of a launcher (:class:`Renderer`): each unit runs from the manifest whose pod
    template runs it, a group's revision is its objects' files; it starts nothing (no :class:`Launcher` part)."""
    rollout, blanks, _ = built(case)
    shared = {b.token: f"@{b.name}@" for b in blanks}
    renderer: Renderer = export_for(rollout, shared)   # (mypy: the export is a Renderer)
    export = export_for(rollout, shared)
    assert renderer.name == "kubernetes" and list(export.objects.values()) == manifests(case)
    assert not any(hasattr(export, m) for m in Launcher.__dict__ if not m.startswith("_")
                   and m not in Renderer.__dict__)
    for u in rollout.units:
        obj = export.objects[export.unit_file(u)]
        names = k8s.check(rollout)
        pool = u.group if rollout.plan.strategy == "pd_cluster" else "engine"
        assert (obj["kind"], obj["metadata"]["name"]) == (("Deployment", names.router) if u.group == "router"
                                                            else ("LeaderWorkerSet", names.lws(pool))), u.unit
        assert export.kept(u) == [export.unit_file(u)] and export.log_dir(u) is None
    for group in rollout.groups:
        files = export.revision_files(group)
        assert {export.unit_file(u) for u in rollout.group(group)} <= files.keys()
        assert all(sha256(export.text(f)) == sha for f, sha in files.items())
        assert all(export.objects[f]["kind"] != "Service" for f in files)


def test_the_export_is_the_same_whatever_starts_the_groups_on_bare_metal():
    rollout, blanks, _ = built("b300-multi_node_tp")
    slurm = replace(rollout, vars=rollout.vars.model_copy(update={"k3_launcher": "slurm"}))
    assert export_for(slurm).objects == export_for(rollout).objects


# ---------------------------------------------------------------------------------------------- resources, namespace


@pytest.mark.parametrize("case", CASES)
def test_every_object_is_in_the_namespace_that_comes_first(case):
    objects = manifests(case)
    assert objects[0]["kind"] == "Namespace" and objects[0]["metadata"]["name"] == "k3"
    level, why = k8s.pod_security(objects[1:])
    assert objects[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == level
    assert all(o["metadata"]["namespace"] == "k3" for o in objects[1:])
    rollout, _, _ = built(case)
    assert level == "privileged" and any("host networking" in w for w in why) == rollout.vars.k3_k8s_host_network


@pytest.mark.parametrize("case", CASES)
def test_rdma_comes_from_a_resource_never_a_host_path(case):
    rollout, _, _ = built(case)
    for obj in manifests(case):
        for _, template in pod_templates(obj):
            assert not any(v.get("hostPath", {}).get("path") == "/dev/infiniband" for v in template["spec"].get("volumes", []))
            engine = template["spec"]["containers"][0]
            rdma = engine.get("resources", {}).get("limits", {}).get("rdma/rdma_shared_device_a")
            claims = [c["name"] for c in engine.get("resources", {}).get("claims", [])]
            if obj["kind"] == "Deployment" or not k8s._needs_rdma(rollout):
                assert rdma is None and "rdma" not in claims, (case, obj["metadata"]["name"])
            elif rollout.vars.k3_k8s_rdma == "dra":
                assert rdma is None and "rdma" in claims
            else:
                assert rdma == 1 and "rdma" not in claims


def test_gpus_and_rdma_claimed_through_dra():
    objects = {(o["kind"], o["metadata"]["name"]): o for o in manifests("gb300-multi_node_tp-dra")}
    gpus = objects[("ResourceClaimTemplate", "k3-engine-gpus")]["spec"]["spec"]["devices"]["requests"][0]
    assert gpus == {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                                                "count": 4}}
    rdma = objects[("ResourceClaimTemplate", "k3-engine-rdma")]["spec"]["spec"]["devices"]["requests"][0]
    assert rdma["exactly"]["deviceClassName"] == "rdma.example.com" and rdma["exactly"]["count"] == 2
    for _, template in pod_templates(objects[("LeaderWorkerSet", "k3-engine")]):
        assert template["spec"]["resourceClaims"] == [
            {"name": "gpus", "resourceClaimTemplateName": "k3-engine-gpus"},
            {"name": "rdma", "resourceClaimTemplateName": "k3-engine-rdma"},
            {"name": "imex-channel", "resourceClaimTemplateName": "k3-engine-imex-channel"}]
        resources = template["spec"]["containers"][0]["resources"]
        assert "limits" not in resources       # no nvidia.com/gpu: a DRA-only cluster has none
        assert resources["claims"] == [{"name": "gpus"}, {"name": "rdma"}, {"name": "imex-channel"}]
    amd = [o for o in manifests("mi355x-multi_node_tp-dra") if o["kind"] == "ResourceClaimTemplate"]
    assert [o["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] for o in amd] == ["gpu.amd.com"]


def test_a_pod_network_with_a_volume_claim_needs_only_baseline():
    from k3deploy.cli.export import _from_selection

    params: dict[str, Any] = {"hardware": "b300", "strategy": "single_node_tp", "variant": "default",
                              "features": None, "nodes": None, "prefill_nodes": None, "decode_nodes": None,
                              "image": None}
    rollout, _, _, _ = _from_selection(params, None, {"k3_iface": "eth1", "k3_k8s_host_network": False,
                                                      "k3_k8s_cache_pvc": "kimi", "k3_k8s_namespace": "kimi"})
    objects = k8s.manifests(rollout)
    assert objects[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert k8s.pod_security(objects) == ("baseline", [])
    assert builtin_errors(objects[0]) == []
