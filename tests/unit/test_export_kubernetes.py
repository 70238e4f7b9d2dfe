"""``k3deploy export kubernetes``: the manifests of an inventory or of a selection, as files for ``kubectl apply``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from helpers import k3, two_tray_site


def _export(*args: str) -> subprocess.CompletedProcess[str]:
    return k3("export", "kubernetes", *args, timeout=300)


def _all_text(out: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(out.rglob("*")) if p.is_file())


def test_export_from_an_inventory_follows_its_group_vars(tmp_path):
    inventory = two_tray_site(tmp_path, (
        "k3_hardware: gb300\nk3_strategy: multi_node_tp\nk3_iface: eth1\nk3_k8s_cache_pvc: kimi-cache\n"
        "k3_extra_env:\n  SITE_API_TOKEN: s3cr3t-value\n"))
    out = tmp_path / "out"
    proc = _export(str(inventory), "-o", str(out), "--json", "--secret", "site-secrets")
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)
    assert [(o["kind"], o["name"]) for o in written["objects"]] == [
        ("ComputeDomain", "k3-engine-imex"), ("LeaderWorkerSet", "k3-engine"), ("Service", "k3-engine-api")]
    assert written["blanks"] == ["@IB_HCA@"]     # the RDMA ports: read on the nodes (README.txt says how)
    docs = [yaml.safe_load(Path(f["file"]).read_text()) for f in written["files"]]
    lws = docs[1]
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "kimi-cache"}} in pod["volumes"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NCCL_SOCKET_IFNAME"]["value"] == "=eth1"
    assert env["SITE_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "site-secrets", "key": "SITE_API_TOKEN"}
    text = _all_text(out)
    assert "s3cr3t-value" not in text and "s3cr3t-value" not in proc.stdout
    assert "10.1.0.2" not in text      # every per-node address comes from LWS or the pod's IP
    readme = (out / "README.txt").read_text()
    assert f"kubectl apply -f {out}" in readme and "kubectl create secret generic site-secrets" in readme
    assert "nvidia.imex:" in readme and "container.runtime:" not in readme


def test_export_from_a_selection_with_replicas(tmp_path):
    out = tmp_path / "k8s"
    proc = _export("--hardware", "b300", "--strategy", "multi_node_dep", "--replicas", "2", "--max-unavailable", "2",
                   "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote 3 file(s) to {out}: LeaderWorkerSet k3-engine, Deployment k3-engine-router")
    lws = yaml.safe_load((out / "00-leaderworkerset-k3-engine.yaml").read_text())
    assert lws["spec"]["replicas"] == 2
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxUnavailable"] == 2
    readme = (out / "README.txt").read_text()
    assert "@IFACE@" in readme and ".invalid" not in _all_text(out)


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, words in (
        (["--hardware", "b300", "--strategy", "pd_cluster", "--replicas", "2"], "--replicas 2: pd_cluster"),
        (["inventories/does-not-matter.py", "--hardware", "b300"], "--hardware cannot be combined"),
    ):
        proc = _export(*args, "-o", str(tmp_path / "x"))
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr
