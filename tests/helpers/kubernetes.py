"""The Kubernetes export's cases, their rollouts and manifests, the vendored schemas, and the golden files.

Every strategy the recipe offers on one hardware of each vendor family (b300 and the NVL trays gb300 for NVIDIA,
mi355x for AMD, ascend_910c for Ascend), at the recipes site's node count, plus replicas; each case is built as
``k3deploy export kubernetes --hardware H --strategy S [--replicas R]`` builds it (host placeholders; the site's
interface and RDMA ports given, :data:`SITE`); and GPUs and RDMA claimed through DRA. The golden files are
``tests/golden/kubernetes/<case>.yaml``; regenerate them after an intended change::

    cd tests && ../.venv/bin/python -m helpers.kubernetes --write

The schemas (``tests/fixtures/kubernetes/*.schema.json``, their sources in README.md there): the CRDs' own
``openAPIV3Schema`` (jsonschema, unknown fields refused as the API server's pruning would drop them silently) and
the built-in kinds with ``kubernetes-validate`` (strict).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from helpers import FIXTURES, GOLDEN
from k3deploy.model import kubernetes
from k3deploy.model.hosttext import parse_env
from k3deploy.model.kubernetes import expand

SCHEMAS = FIXTURES / "kubernetes"
GOLDEN_K8S = GOLDEN / "kubernetes"
#: the Kubernetes release whose built-in schemas the objects must satisfy (kubernetes-validate's, strict)
K8S_VERSION = "1.34.0"
HARDWARE = ("b300", "gb300", "mi355x", "ascend_910c")
#: what the export needs of the site that it cannot read (``--iface``, ``--ib-hca``), for every case
SITE = {"k3_iface": "eth1", "k3_ib_hca": "mlx5_0:1,mlx5_1:1"}
#: extra cases beyond one per strategy: replicas behind a router
EXTRA: dict[str, dict[str, Any]] = {
         "b300-multi_node_dep-r2": {"hardware": "b300", "strategy": "multi_node_dep", "replicas": 2},
         "mi355x-multi_node_tp-r3": {"hardware": "mi355x", "strategy": "multi_node_tp", "replicas": 3},
         "b300-single_node_tp-r2": {"hardware": "b300", "strategy": "single_node_tp", "replicas": 2},
         # GPUs and RDMA devices claimed through DRA (k3_k8s_gpus, k3_k8s_rdma: dra), beside the IMEX channel
         "gb300-multi_node_tp-dra": {"hardware": "gb300", "strategy": "multi_node_tp", "overrides": {
             "k3_k8s_gpus": "dra", "k3_k8s_rdma": "dra", "k3_k8s_rdma_class": "rdma.example.com",
             "k3_k8s_rdma_count": 2}},
         "mi355x-multi_node_tp-dra": {"hardware": "mi355x", "strategy": "multi_node_tp", "overrides": {
             "k3_k8s_gpus": "dra"}}}


@cache
def cases() -> dict[str, dict[str, Any]]:
    from k3deploy import load_recipe
    from k3deploy.recipe.offering import offering

    data = offering(load_recipe(None))
    out: dict[str, dict[str, Any]] = {}
    for hw in HARDWARE:
        variant = next(k for k, v in data["variants"].items() if hw in v["hardware"])
        for row in data["hardware"][hw]["strategies"]:
            out[f"{hw}-{row['strategy']}"] = {"hardware": hw, "strategy": row["strategy"], "variant": variant}
    return {**out, **EXTRA}


@cache
def built(case: str) -> tuple[Any, list[Any], dict[str, str]]:
    """``(rollout, blanks, tokens)`` of a case, as the export builds them from a selection."""
    from k3deploy.cli.export import _from_selection

    sel = dict(cases()[case])
    replicas = int(sel.pop("replicas", 1))
    overrides = {**SITE, **sel.pop("overrides", {})}
    params: dict[str, Any] = {"hardware": None, "strategy": None, "variant": "default", "features": None,
                              "nodes": None, "prefill_nodes": None, "decode_nodes": None, "image": None, **sel}
    rollout, blanks, _, tokens = _from_selection(params, None, overrides, replicas)
    return rollout, blanks, tokens


def manifests(case: str) -> list[dict[str, Any]]:
    from k3deploy.model.kubernetes import manifests as make

    rollout, blanks, _ = built(case)
    return make(rollout, {b.token: f"@{b.name}@" for b in blanks})


def golden_text(case: str) -> str:
    return yaml.safe_dump_all(manifests(case), sort_keys=False, width=120)


# ---------------------------------------------------------------------------------------------- schemas


def _closed(schema: Any) -> Any:
    """The schema with unknown fields refused wherever it lists its fields and keeps no unknown ones."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """``(apiVersion, kind) -> the vendored schema file``."""
    out = {}
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        data = json.loads(path.read_text())
        out[(data["apiVersion"], data["kind"])] = data
    return out


def crd_errors(obj: dict[str, Any]) -> list[str]:
    import jsonschema

    data = crd_schemas()[(obj["apiVersion"], obj["kind"])]
    schema = _closed(data["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}   # ObjectMeta: checked by the API server, not the CRD
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def builtin_errors(obj: dict[str, Any]) -> list[str]:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


def pod_templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The pod templates of an LWS (``leader``, ``worker``), a Deployment (``pod``)."""
    if obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        return [(role, lwt[key]) for role, key in (("leader", "leaderTemplate"), ("worker", "workerTemplate"))
                if key in lwt]
    if obj["kind"] == "Deployment":
        return [("pod", obj["spec"]["template"])]
    return []


def as_pod(template: dict[str, Any], name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **template.get("metadata", {})},
            "spec": template["spec"]}


# ---------------------------------------------------------------------------------------------- argv per node


def _fake_vllm(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "vllm"
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def node_argv(container: dict[str, Any], values: dict[str, str], tmp: Path) -> list[str]:
    """What ``container`` runs once Kubernetes expanded its command (and a shell ran it, where it is one)."""
    words = [expand(w, values) for w in container["command"] + container.get("args", [])]
    if words[0] not in ("/bin/sh", "bash"):
        return words
    assert words[1] in ("-c", "-lc") and len(words) == 3, words
    env = {**os.environ, **values, "PATH": f"{_fake_vllm(tmp)}:{os.environ['PATH']}"}
    proc = subprocess.run([words[0], "-c", words[2]], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return ["vllm", *json.loads(proc.stdout.strip().splitlines()[-1])]


def node_runs(case: str, tmp: Path) -> list[tuple[Any, list[str], dict[str, str], dict[str, str]]]:
    """Each engine node of the case: ``(unit, argv its pod runs, env its pod has, the unit's env)``."""
    rollout, blanks, _ = built(case)
    shared = {b.token: f"@{b.name}@" for b in blanks}
    lws = {o["metadata"]["name"]: o for o in [o for o in manifests(case) if o["kind"] == "LeaderWorkerSet"]}
    out = []
    for pool, groups in kubernetes.pools(rollout):
        obj = lws[kubernetes.Names("k3-engine").lws(pool)]
        lwt = obj["spec"]["leaderWorkerTemplate"]
        for units in groups:
            head = units[0]
            for u in units:
                key = "leaderTemplate" if u.rank == 0 and "leaderTemplate" in lwt else "workerTemplate"
                container = lwt[key]["spec"]["containers"][0]
                values = {kubernetes.LEADER_ADDRESS: head.node.address, kubernetes.WORKER_INDEX: str(u.rank),
                          "LWS_GROUP_SIZE": str(len(units)), kubernetes.POD_IP: u.node.address}
                env = {e["name"]: expand(e["value"], values) for e in container["env"] if "value" in e}
                want = parse_env(u.env_text)
                for token, one in shared.items():
                    want = {k: v.replace(token, one) for k, v in want.items()}
                out.append((u, node_argv(container, values, tmp), env, want))
    return out


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print("usage: python -m helpers.kubernetes --write   (rewrites tests/golden/kubernetes/*.yaml)")
        return 2
    GOLDEN_K8S.mkdir(parents=True, exist_ok=True)
    for old in GOLDEN_K8S.glob("*.yaml"):
        old.unlink()
    for case in cases():
        (GOLDEN_K8S / f"{case}.yaml").write_text(golden_text(case))
        print(f"wrote {GOLDEN_K8S / case}.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
