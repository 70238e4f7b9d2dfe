"""``k3deploy export kubernetes``: the manifests of an inventory or of a selection, as files for ``kubectl apply``,
with nothing left to fill; README.txt with the prerequisites, and check.sh, which verifies them with kubectl (here
against recorded clusters: ``tests/helpers/fake_kubectl.py``, ``tests/fixtures/kubectl/``)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from helpers import FIXTURES, ROOT, k3, k3_here, two_tray_site

#: a placeholder of a value to fill (``@IFACE@``, ``@IB_HCA_gpu01@``, ``@NODE0_IP@``): none may be written
PLACEHOLDER = re.compile(r"@[A-Z][A-Z0-9_]*@")
CLUSTERS = FIXTURES / "kubectl"
SITE = ("--iface", "eth1", "--ib-hca", "mlx5_0:1,mlx5_1:1")


def _export(*args: str) -> subprocess.CompletedProcess[str]:
    return k3("export", "kubernetes", *args, timeout=300)


def _all_text(out: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(out.rglob("*")) if p.is_file())


def _no_placeholder(out: Path) -> None:
    for path in sorted(out.rglob("*")):
        if path.is_file():
            found = PLACEHOLDER.findall(path.read_text())
            assert not found, f"{path} holds {found} to fill"


def test_export_from_an_inventory_follows_its_group_vars(tmp_path):
    inventory = two_tray_site(tmp_path, (
        "k3_hardware: gb300\nk3_strategy: multi_node_tp\nk3_iface: eth1\nk3_ib_hca: mlx5_0:1,mlx5_3:1\n"
        "k3_k8s_cache_pvc: kimi-cache\nk3_extra_env:\n  SITE_API_TOKEN: s3cr3t-value\n"))
    out = tmp_path / "out"
    proc = _export(str(inventory), "-o", str(out), "--json", "--secret", "site-secrets", "--namespace", "kimi")
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)
    assert [(o["kind"], o["name"]) for o in written["objects"]] == [
        ("Namespace", "kimi"), ("ComputeDomain", "k3-engine-imex"), ("LeaderWorkerSet", "k3-engine"),
        ("Service", "k3-engine-api")]
    docs = [yaml.safe_load(Path(f["file"]).read_text()) for f in written["files"]]
    assert docs[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert all(d["metadata"]["namespace"] == "kimi" for d in docs[1:])
    lws = docs[2]
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "kimi-cache"}} in pod["volumes"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NCCL_SOCKET_IFNAME"]["value"] == "=eth1"
    assert env["NCCL_IB_HCA"]["value"] == "=mlx5_0:1,mlx5_3:1"     # the inventory's RDMA ports, not a blank
    assert env["SITE_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "site-secrets", "key": "SITE_API_TOKEN"}
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 4, "rdma/rdma_shared_device_a": 1}
    assert not any(v.get("hostPath", {}).get("path") == "/dev/infiniband" for v in pod["volumes"])
    text = _all_text(out)
    assert "s3cr3t-value" not in text and "s3cr3t-value" not in proc.stdout
    assert "10.1.0.2" not in text      # every per-node address comes from LWS or the pod's IP
    _no_placeholder(out)
    readme = (out / "README.txt").read_text()
    assert "kubectl create secret generic -n kimi site-secrets" in readme
    assert "nvidia.imex:" in readme and "container.runtime:" not in readme
    for need in ("LeaderWorkerSet >= v0.9.0", "Kubernetes >= 1.34", "NVIDIA DRA driver >= v25.8.0",
                 "nvidia.com/gpu.clique", "GPU Feature Discovery >= v0.17.0", "PodSecurity level privileged",
                 "host networking", "rdma/rdma_shared_device_a"):
        assert need in readme, need
    steps = [line for line in readme.splitlines() if line.strip()]
    assert steps[-2].startswith(f"3. sh {out}/check.sh")
    assert steps[-1].startswith(f"4. kubectl apply -f {out} ")   # the last command
    assert written["check"] == str(out / "check.sh") and os.stat(out / "check.sh").st_mode & stat.S_IXUSR


def test_export_from_a_selection_with_replicas(tmp_path):
    out = tmp_path / "k8s"
    proc = _export("--hardware", "b300", "--strategy", "multi_node_dep", "--replicas", "2", "--max-unavailable", "2",
                   *SITE, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote 4 file(s) to {out}: Namespace k3, LeaderWorkerSet k3-engine, "
                                  "Deployment k3-engine-router")
    lws = yaml.safe_load((out / "01-leaderworkerset-k3-engine.yaml").read_text())
    assert lws["spec"]["replicas"] == 2
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxUnavailable"] == 2
    assert ".invalid" not in _all_text(out)
    _no_placeholder(out)


def test_what_the_nodes_would_tell_is_given_or_refused(tmp_path):
    """Nothing is read from the nodes: across nodes their interface and RDMA ports come from the inventory or the
    options, else the export refuses in one line naming both, and writes nothing."""
    out = tmp_path / "x"
    proc = k3_here("export", "kubernetes", "--hardware", "b300", "--strategy", "multi_node_tp", "-o", str(out))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--iface NAME (k3_iface" in proc.stderr and "--ib-hca DEV:PORT" in proc.stderr, proc.stderr
    assert not out.exists()
    proc = k3_here("export", "kubernetes", "--hardware", "b300", "--strategy", "multi_node_tp", "--iface", "eth1",
                   "-o", str(out))
    assert proc.returncode == 2 and "--ib-hca" in proc.stderr and "--iface" not in proc.stderr, proc.stderr
    proc = k3_here("export", "kubernetes", "--hardware", "b300", "--strategy", "multi_node_tp", "--iface", "eth1",
                   "--ib-hca", "mlx5_0", "-o", str(out))   # a device without its port: only the node knows them
    assert proc.returncode == 2 and "--ib-hca" in proc.stderr, proc.stderr
    proc = k3_here("export", "kubernetes", "--hardware", "ascend_910c", "--variant", "ascend_w4a8", "--strategy",
                   "multi_node_tp_dp", "--iface", "eth1", "-o", str(out))     # Ascend: HCCL's own ports, no RDMA blank
    assert proc.returncode == 0, proc.stderr
    _no_placeholder(out)
    proc = k3_here("export", "kubernetes", "--hardware", "b300", "--strategy", "single_node_tp", "-o",
                   str(tmp_path / "one"))   # one node: its interface still goes into NCCL/GLOO's settings
    assert proc.returncode == 2 and "--iface" in proc.stderr and "--ib-hca" not in proc.stderr, proc.stderr
    proc = k3_here("export", "kubernetes", "--hardware", "b300", "--strategy", "single_node_tp", "--iface", "eth1",
                   "-o", str(tmp_path / "one"))
    assert proc.returncode == 0, proc.stderr
    _no_placeholder(tmp_path / "one")


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, words in (
        (["--hardware", "b300", "--strategy", "pd_cluster", "--replicas", "2"], "--replicas 2: pd_cluster"),
        (["inventories/does-not-matter.py", "--hardware", "b300"], "--hardware cannot be combined"),
        (["--hardware", "b300", "--iface", "eth1", "--namespace", "K3_NS"], "k3_k8s_namespace: 'K3_NS' is not a namespace name"),
        (["--hardware", "b300", "--strategy", "multi_node_tp", *SITE, "--rdma", "dra"], "--rdma-class NAME"),
        (["--hardware", "ascend_910c", "--variant", "ascend_w4a8", "--strategy", "multi_node_tp_dp", "--iface", "eth1",
          "--gpus", "dra"], "have no DRA driver"),
        (["--hardware", "b300", "--read-nodes"], "--read-nodes reads an inventory's nodes"),
        (["--hardware", "b300", "--iface", "eth1", "--rdma-resource", "infiniband"], "--rdma-resource DOMAIN/NAME"),
    ):
        proc = k3_here("export", "kubernetes", *args, "-o", str(tmp_path / "x"))
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_nodes_of_a_pool_that_differ_are_refused(tmp_path):
    """One pod template runs every worker of a pool: a per-host interface cannot be written into it."""
    inventory = two_tray_site(tmp_path, "k3_hardware: b300\nk3_strategy: multi_node_tp\nk3_ib_hca: mlx5_0:1\n")
    text = inventory.read_text().replace('"rank": 1}', '"rank": 1, "k3_iface": "eth2"}').replace(
        '"k3_ip": "10.1.0.1"}', '"k3_ip": "10.1.0.1", "k3_iface": "eth1"}')
    inventory.write_text(text)
    (tmp_path / "site" / "inventory.py").write_text(text.replace(
        'workers = [', 'workers = [("gpu03", {"ssh_hostname": "10.1.0.3", "k3_ip": "10.1.0.3", "rank": 2, '
                       '"k3_iface": "eth1"}), '))
    inventory.parent.joinpath("group_vars", "all.yml").write_text(
        "k3_hardware: b300\nk3_strategy: multi_node_tp_pp\nk3_ib_hca: mlx5_0:1\n")
    proc = k3_here("export", "kubernetes", str(inventory), "-o", str(tmp_path / "x"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "SOCKET_IFNAME" in proc.stderr and "k3_iface" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------- check.sh


def _fake_kubectl(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'helpers' / 'fake_kubectl.py'} \"$@\"\n")
    kubectl.chmod(0o755)
    return bin_dir


def _check(out: Path, cluster: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{_fake_kubectl(tmp_path)}:{os.environ['PATH']}",
           "K3_KUBECTL_CLUSTER": str(CLUSTERS / f"{cluster}.yaml")}
    return subprocess.run(["sh", str(out / "check.sh")], capture_output=True, text=True, env=env, timeout=120)


def _gb300(tmp_path: Path) -> Path:
    out = tmp_path / "gb300"
    proc = k3_here("export", "kubernetes", "--hardware", "gb300", "--strategy", "multi_node_tp", *SITE,
                   "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_check_passes_on_a_cluster_that_has_every_prerequisite(tmp_path):
    out = _gb300(tmp_path)
    proc = _check(out, "gb300-ready", tmp_path)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    assert lines and all(line.startswith("ok: ") for line in lines), proc.stdout
    readme = (out / "README.txt").read_text()
    assert len(lines) == readme.count("\n   - "), "one line per prerequisite README.txt lists"
    assert "ok: LeaderWorkerSet >= v0.9.0" in proc.stdout and "ok: the NVIDIA DRA driver v25.8.0" in proc.stdout


def test_the_check_names_what_an_older_cluster_lacks(tmp_path):
    out = _gb300(tmp_path)
    proc = _check(out, "gb300-old", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    missing = [line for line in proc.stdout.splitlines() if line.startswith("missing: ")]
    assert all("; fix: " in line for line in missing)
    text = "\n".join(missing)
    assert "Kubernetes >= 1.34, the server is 1.33" in text
    assert "LeaderWorkerSet >= v0.9.0: the installed CRD has no restartPolicy RecreateGroupAfterStart" in text
    assert "the NVIDIA DRA driver >= v25.8.0, it is v25.3.2" in text
    assert "nvidia.com/gpu.clique: at most 0 nodes in one domain" in text
    assert "rdma/rdma_shared_device_a allocatable: 0 of 2" in text
    assert "ok: nodes with 4 or more nvidia.com/gpu allocatable: 2" in proc.stdout


def test_the_check_names_a_missing_leaderworkerset(tmp_path):
    out = _gb300(tmp_path)
    proc = _check(out, "gb300-no-lws", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    missing = [line for line in proc.stdout.splitlines() if line.startswith("missing: ")]
    assert missing == ["missing: LeaderWorkerSet >= v0.9.0: no CRD leaderworkersets.leaderworkerset.x-k8s.io; fix: "
                       "install LWS: kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases/"
                       "download/v0.9.0/manifests.yaml"], proc.stdout


def test_the_check_wants_the_secret_keys_and_the_dra_classes_the_pods_use(tmp_path):
    out = tmp_path / "dra"
    proc = k3_here("export", "kubernetes", "--hardware", "gb300", "--strategy", "multi_node_tp", *SITE,
                   "--gpus", "dra", "--cache-pvc", "kimi-cache", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    result = _check(out, "gb300-ready", tmp_path)
    assert "ok: DeviceClass gpu.nvidia.com" in result.stdout
    assert "missing: PVC k3/kimi-cache (the model cache)" in result.stdout
    assert "nvidia.com/gpu allocatable" not in result.stdout   # claimed through DRA, not the device plugin
    assert result.returncode == 1
