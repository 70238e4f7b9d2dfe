"""The collective/transport settings are derived once (the pack's ``Transport.settings``): online from a host's facts
(``k3deploy preflight``, the deploy) and offline with blanks for what the host would answer (the offline runbook, the
Kubernetes export). For every vendor, the offline settings with their blanks filled from a host's facts are the
settings the online derivation gives for those facts: UCX_* and the vendors' NVLink and RDMA settings included."""

from __future__ import annotations

import re
import subprocess

import pytest

from helpers import K3DEPLOY, ROOT
from k3deploy.facts.host import AddressInterface, Ipv4Address
from k3deploy.facts.rdma import DmabufSupport, LoadedModules, RdmaDevice, RdmaPort
from k3deploy.model.requirements import Requirements
from k3deploy.model.runbook.blanks import assumed, offline_env
from k3deploy.preflight.settings import derive_settings
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors.nvidia.checks import NvidiaFacts

ADDRESS = "192.0.2.11"

#: (hardware, engine nodes, P/D): every vendor, one node and several, with and without P/D
CASES = [
    ("h200", 1, False), ("h200", 2, False), ("h200", 2, True),
    ("gb300", 1, False), ("gb300", 3, False), ("gb300", 2, True),
    ("mi355x", 1, False), ("mi355x", 2, False), ("mi355x", 2, True),
    ("ascend_910c", 1, False), ("ascend_910c", 2, False),
]


def host(ports: int = 4) -> NvidiaFacts:
    """A host whose cluster address is on eth1, with ``ports`` active RDMA ports and working DMA-BUF: one that
    passes preflight."""
    return NvidiaFacts(
        host="n1", address=ADDRESS,
        interface=AddressInterface(ADDRESS, "eth1", "eth0", [Ipv4Address("eth0", "198.51.100.7", 24),
                                                             Ipv4Address("eth1", ADDRESS, 24)]),
        rdma=[RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand", 4096)]) for i in range(ports)],
        modules=LoadedModules(["ib_core", "nvidia"]),
        dmabuf=DmabufSupport("6.8.0-45-generic", True, True, True, True, []),
    )


def answers(facts: NvidiaFacts) -> dict[str, str]:
    """What each blank's command prints on the host of ``facts``."""
    assert isinstance(facts.interface, AddressInterface) and isinstance(facts.rdma, list)
    return {"IFACE": str(facts.interface.interface),
            "IB_HCA": ",".join(f"{d.name}:{p.port}" for d in facts.rdma for p in d.ports if p.active)}


@pytest.mark.parametrize(("hw", "nodes", "pd"), CASES, ids=[f"{h}-{n}{'-pd' if pd else ''}" for h, n, pd in CASES])
def test_the_offline_settings_are_the_online_derivation_of_the_same_facts(hw, nodes, pd):
    need = Requirements(hardware()[hw], "default", None, nodes=nodes, multi_node=nodes > 1, pd=pd)
    facts = host()
    online = derive_settings(need, facts).env
    env, blanks = offline_env(need, facts.host, ADDRESS)
    values = answers(facts)
    filled = {}
    for key, value in env.items():
        for blank in blanks:
            value = value.replace(blank.token, values[blank.name])
        filled[key] = value
    assert filled == online
    assert list(filled) == list(online)   # in the same order: the env file is written in this order
    assert "@" not in "".join(filled.values())


def test_the_offline_settings_carry_ucx_and_the_vendors_nvlink_settings():
    """What the offline runbook lacked while it derived the settings a second time."""
    pd = Requirements(hardware()["mi355x"], "default", None, nodes=2, multi_node=True, pd=True)
    env, _ = offline_env(pd, "n1", ADDRESS)
    assert env["UCX_TLS"] == "rc,rocm_copy" and env["UCX_NET_DEVICES"] == "@IB_HCA_n1@"
    one_tray = Requirements(hardware()["gb300"], "default", None, nodes=1)
    env, _ = offline_env(one_tray, "n1", ADDRESS)
    assert env["NCCL_MNNVL_ENABLE"] == env["NCCL_CUMEM_ENABLE"] == env["NCCL_NVLS_ENABLE"] == "1"
    assert derive_settings(one_tray, host()).env["NCCL_MNNVL_ENABLE"] == "1"


def test_a_host_without_dma_buf_gets_the_vendors_gpu_path_setting_online():
    """Online, the facts say more than a blank can: the GPU's path to the ports where DMA-BUF is not usable."""
    need = Requirements(hardware()["h200"], "default", None, nodes=2, multi_node=True)
    facts = host()
    facts.dmabuf = DmabufSupport("5.4.0-42-generic", False, True, True, False, ["kernel 5.4.0 < 5.12"])
    s = derive_settings(need, facts)
    assert s.env["NCCL_DMABUF_ENABLE"] == "0" and s.peermem_required
    assert list(s.env).index("NCCL_DMABUF_ENABLE") == list(s.env).index("NCCL_IB_HCA") + 1


def test_the_offline_derivation_says_what_it_assumes_of_the_gpu_path():
    """Offline, no fact tells whether DMA-BUF is usable: the settings assume what passes preflight (no
    NCCL_DMABUF_ENABLE, as online for such a host), and say so with what a node where it does not hold gets online."""
    need = Requirements(hardware()["h200"], "default", None, nodes=2, multi_node=True)
    env, blanks = offline_env(need, "n1", ADDRESS)
    (text,) = assumed("NVIDIA", blanks)
    assert "NCCL_DMABUF_ENABLE" not in env and "NCCL_DMABUF_ENABLE" not in derive_settings(need, host()).env
    without = host()
    without.dmabuf = DmabufSupport("5.4.0-42-generic", False, True, True, False, ["kernel 5.4.0 < 5.12"])
    online = derive_settings(need, without)
    assert f"NCCL_DMABUF_ENABLE={online.env['NCCL_DMABUF_ENABLE']}" in text and online.peermem_required
    assert "nvidia_peermem" in text
    # no RDMA ports read (one node), or a vendor whose GPU path no fact decides: nothing assumed
    assert assumed("NVIDIA", offline_env(Requirements(hardware()["h200"], "default", None, nodes=1), "n1",
                                         ADDRESS)[1]) == []
    mi = Requirements(hardware()["mi355x"], "default", None, nodes=2, multi_node=True)
    assert assumed("AMD", offline_env(mi, "n1", ADDRESS)[1]) == []


def test_the_offline_runbook_says_what_it_assumes_of_each_node(tmp_path):
    out = tmp_path / "runbook.md"
    proc = subprocess.run([*K3DEPLOY, "runbook", "inventories/b200.py", "-o", str(out), "--offline"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    first = out.read_text().split("## Values to read from the nodes first", 1)[1].split("\n## ", 1)[0]
    assert "Not read, assumed" in first and "NCCL_DMABUF_ENABLE=0" in first
    blocks = re.findall(r"```[^\n]*\n(.*?)```", first, re.S)
    assert blocks and all("# assumed, not read: DMA-BUF GPUDirect RDMA is usable" in b for b in blocks)


@pytest.mark.parametrize("kind", ["kubernetes", "slurm"])
def test_the_exports_say_what_they_assume_of_each_node(tmp_path, kind):
    out = tmp_path / kind
    exclusive = ["--exclusive", "user"] if kind == "slurm" else []   # the router shares the head's node
    # Kubernetes leaves nothing to fill: the ports are given; Slurm's launch scripts name them as blanks
    site = ["--iface", "eth1", "--ib-hca", "mlx5_0:1"] if kind == "kubernetes" else []
    proc = subprocess.run([*K3DEPLOY, "export", kind, "--hardware", "b300", "--strategy", "multi_node_dep", "-o",
                           str(out), *exclusive, *site], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    readme = (out / "README.txt").read_text()
    assert ("@IB_HCA" in readme) == (kind == "slurm")
    assert "Assumed, not read: DMA-BUF GPUDirect RDMA is usable on every node" in readme
    assert "NCCL_DMABUF_ENABLE=0" in readme
