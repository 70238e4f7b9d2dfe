"""Simulated NVIDIA-node tools run on the host against a node.json (K3SIM_NODE_CONFIG).

Expected lines are the real sample outputs (nvidia-smi query lines, the Fabric block of ``nvidia-smi -q``,
``ibv_devinfo``, ``lsmod``), written out here, not produced by the code under test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from k3sim.faults import parse_fault
from k3sim.profiles import NODE_TOOLS, excluded_paths, node_config

UUID = "8f7e1c2a-3b4d-4e5f-9a6b-7c8d9e0f1a2b"
QUERY = ["--query-gpu=driver_version,name,memory.total,count", "--format=csv,noheader"]

# vLLM deployment notes, nvidia-smi --query-gpu=driver_version,name,memory.total,count --format=csv,noheader
REAL_QUERY_LINES = {
    "h100": "580.126.09, NVIDIA H100 80GB HBM3, 81559 MiB, 8",
    "h200": "580.126.09, NVIDIA H200, 143771 MiB, 8",
    "b200": "580.126.09, NVIDIA B200, 183359 MiB, 8",
    "b300": "580.95.05, NVIDIA B300 SXM6 AC, 275040 MiB, 8",
    "gb200": "580.95.05, NVIDIA GB200, 189471 MiB, 4",
    "gb300": "580.95.05, NVIDIA GB300, 284208 MiB, 4",
}

# nvidia-smi -q on a GPU outside an NVLink multi-node domain
REAL_NA_FABRIC = """\
    Fabric
        State                             : N/A
        Status                            : N/A
        CliqueId                          : N/A
        ClusterUUID                       : N/A
        Health
            Bandwidth                     : N/A"""


def node(tmp_path: Path, hardware: str, *faults: str, rank: int = 0, name: str = "node1",
         file: str | None = None) -> dict:
    cfg = node_config(hardware, rank, 2, name, f"10.77.0.{11 + rank}", [parse_fault(f) for f in faults],
                      0.01, UUID)
    path = tmp_path / f"{file or name}.json"
    path.write_text(json.dumps(cfg))
    cfg["_path"] = str(path)
    return cfg


def tool(cfg: dict, rel: str, *args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, K3SIM_NODE_CONFIG=cfg["_path"])
    env["K3SIM_STATE_DIR"] = str(state or Path(cfg["_path"]).parent / "state")
    return subprocess.run([sys.executable, str(NODE_TOOLS / rel), *args], capture_output=True, text=True,
                          env=env, timeout=30)


def smi(cfg: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return tool(cfg, "usr/bin/nvidia-smi", *args)


def q_blocks(text: str) -> list[dict[str, str]]:
    """Parse ``nvidia-smi -q``: one dict per GPU of 'Section/Key' -> value (two levels)."""
    gpus: list[dict[str, str]] = []
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if line.startswith("GPU "):
            gpus.append({"bus": line[4:]})
            stack = []
            continue
        if not gpus or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([s for _, s in stack] + [key.strip()])
        if sep:
            gpus[-1][path] = value.strip()
        else:
            stack.append((indent, key.strip()))
    return gpus


@pytest.mark.parametrize("hardware", sorted(REAL_QUERY_LINES))
def test_query_lines_match_the_real_output(tmp_path, hardware):
    cfg = node(tmp_path, hardware)
    res = smi(cfg, *QUERY)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    gpus = 4 if hardware.startswith("gb") else 8
    assert lines == [REAL_QUERY_LINES[hardware]] * gpus


def test_query_units_header_and_more_fields(tmp_path):
    cfg = node(tmp_path, "h200")
    res = smi(cfg, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits")
    assert res.stdout.splitlines()[0] == "NVIDIA H200, 143771"
    res = smi(cfg, "--query-gpu", "index,name,memory.total,uuid,pci.bus_id,compute_cap", "--format=csv")
    lines = res.stdout.splitlines()
    assert lines[0] == "index, name, memory.total [MiB], uuid, pci.bus_id, compute_cap"
    rows = [line.split(", ") for line in lines[1:]]
    assert [r[0] for r in rows] == [str(i) for i in range(8)]
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", r[3]) for r in rows)
    assert len({r[3] for r in rows}) == 8
    assert all(re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", r[4]) for r in rows)
    assert {r[5] for r in rows} == {"9.0"}
    one = smi(cfg, "--query-gpu=index,name", "--format=csv,noheader", "-i", "3")
    assert one.stdout.splitlines() == ["3, NVIDIA H200"]


def test_bad_field_and_missing_format_fail_like_nvidia_smi(tmp_path):
    cfg = node(tmp_path, "b200")
    res = smi(cfg, "--query-gpu=name,bogus.field", "--format=csv")
    assert res.returncode == 2
    assert 'Field "bogus.field" is not a valid field to query.' in res.stdout + res.stderr
    assert smi(cfg, "--query-gpu=name").returncode != 0


def test_q_fabric_block_of_an_hgx_hopper_is_the_real_registered_block(tmp_path):
    """An HGX H100/H200's GPU registered with the NVSwitch fabric (tests/fixtures/nvidia/smi-q-h100-hgx-fabric-
    completed.txt, a real HGX H100); a GPU outside any fabric (fault fabric=N/A) prints the real N/A block."""
    real = (Path(__file__).parents[1] / "fixtures/nvidia/smi-q-h100-hgx-fabric-completed.txt").read_text()
    block = "\n".join(real.splitlines()[4:11])
    res = smi(node(tmp_path, "h200"), "-q", "-i", "0")
    assert block in res.stdout
    assert "Driver Version                            : 580.126.09" in res.stdout
    assert "CUDA Version                              : 13.0" in res.stdout
    assert REAL_NA_FABRIC in smi(node(tmp_path, "h200", "0:fabric=N/A", name="na"), "-q", "-i", "0").stdout


def test_hgx_fabric_fault_leaves_the_gpus_in_progress_with_fabric_manager_running(tmp_path):
    """NVSentinel #883/#889: the service active and of the driver's version, the GPUs In Progress."""
    cfg = node(tmp_path, "b200", "0:fabric=In Progress", name="stuck")
    gpus = q_blocks(smi(cfg, "-q").stdout)
    assert len(gpus) == 8 and {(g["Fabric/State"], g["Fabric/Status"]) for g in gpus} == {("In Progress", "N/A")}
    assert tool(cfg, "usr/bin/nv-fabricmanager", "--version").stdout.strip() == \
        "Fabric Manager version is : 580.126.09"
    assert "/usr/bin/nv-fabricmanager" not in excluded_paths(cfg)


def test_fabric_health_fault_degrades_every_gpu_of_the_tray(tmp_path):
    slow = q_blocks(smi(node(tmp_path, "gb300", "0:fabric-health=degraded-bandwidth", name="slow"), "-q").stdout)
    assert {(g["Fabric/Health/Summary"], g["Fabric/Health/Bandwidth"]) for g in slow} == {
        ("Limited Capacity", "Degraded")}
    ok = q_blocks(smi(node(tmp_path, "gb300", name="ok"), "-q").stdout)
    assert {(g["Fabric/Health/Summary"], g["Fabric/Health/Bandwidth"], g["Fabric/Health/Incorrect Configuration"])
            for g in ok} == {("Healthy", "Full", "None")}
    hgx = q_blocks(smi(node(tmp_path, "h200", "0:fabric-health=no-partition", name="hgx"), "-q").stdout)
    assert {g["Fabric/Health/Incorrect Configuration"] for g in hgx} == {"No Partition"}


def test_q_fabric_on_gb300_trays_is_completed_with_one_cluster_uuid(tmp_path):
    a, b = node(tmp_path, "gb300", rank=0, name="node1"), node(tmp_path, "gb300", rank=1, name="node2")
    gpus = q_blocks(smi(a, "-q").stdout) + q_blocks(smi(b, "-q").stdout)
    assert len(gpus) == 8
    assert {g["Fabric/State"] for g in gpus} == {"Completed"}
    assert {g["Fabric/Status"] for g in gpus} == {"Success"}
    assert {g["Fabric/ClusterUUID"] for g in gpus} == {UUID}
    assert len({g["Fabric/CliqueId"] for g in gpus}) == 1
    assert {g["Product Name"] for g in gpus} == {"NVIDIA GB300"}
    assert {g["FB Memory Usage/Total"] for g in gpus} == {"284208 MiB"}
    assert len({g["GPU UUID"] for g in gpus}) == 8


def test_summary_banner_and_list(tmp_path):
    cfg = node(tmp_path, "gb200")
    out = smi(cfg).stdout
    assert re.search(r"\| NVIDIA-SMI 580\.95\.05\s+Driver Version: 580\.95\.05\s+CUDA Version: 13\.0\s+\|", out)
    assert out.count("NVIDIA GB200") == 4
    assert {len(line) for line in out.splitlines()[1:] if line.startswith(("|", "+"))} == {91}
    listing = smi(cfg, "-L").stdout.splitlines()
    assert len(listing) == 4 and listing[0].startswith("GPU 0: NVIDIA GB200 (UUID: GPU-")


# ------------------------------------------------------------------------------------ faults


def test_driver_fault_changes_the_driver_everywhere_and_nothing_else(tmp_path):
    base = node(tmp_path, "h200", file="a")
    bad = node(tmp_path, "h200", "0:driver=570.86.15", file="b")
    assert smi(bad, *QUERY).stdout.splitlines()[0] == "570.86.15, NVIDIA H200, 143771 MiB, 8"
    assert "CUDA Version                              : 12.8" in smi(bad, "-q").stdout
    assert tool(bad, "usr/local/bin/modinfo", "-F", "version", "nvidia").stdout.strip() == "570.86.15"
    fields = "name,memory.total,count,uuid,pci.bus_id,compute_cap"
    same = smi(base, f"--query-gpu={fields}", "--format=csv").stdout
    assert same.count("NVIDIA H200") == 8
    assert smi(bad, f"--query-gpu={fields}", "--format=csv").stdout == same
    # the Fabric Manager stays at the installed version: a mismatch the preflight must report
    assert tool(bad, "usr/bin/nv-fabricmanager", "--version").stdout.strip() == \
        "Fabric Manager version is : 580.126.09"


def test_gpu_count_and_model_faults(tmp_path):
    six = node(tmp_path, "b200", "0:gpu-count=6", name="six")
    lines = smi(six, *QUERY).stdout.splitlines()
    assert lines == ["580.126.09, NVIDIA B200, 183359 MiB, 6"] * 6
    none = node(tmp_path, "b200", "0:gpu-count=0", name="none")
    res = smi(none, *QUERY)
    assert res.returncode == 6 and "No devices were found" in res.stdout + res.stderr
    model = node(tmp_path, "b200", "0:gpu-model=NVIDIA H100 80GB HBM3", name="model")
    assert smi(model, *QUERY).stdout.splitlines()[0] == "580.126.09, NVIDIA H100 80GB HBM3, 183359 MiB, 8"


def test_fabric_and_cluster_uuid_faults(tmp_path):
    prog = node(tmp_path, "gb300", "0:fabric=in progress", name="p")
    g = q_blocks(smi(prog, "-q").stdout)[0]
    assert (g["Fabric/State"], g["Fabric/Status"], g["Fabric/ClusterUUID"]) == ("In Progress", "N/A", "N/A")
    other = "11111111-2222-4333-8444-555555555555"
    odd = node(tmp_path, "gb300", f"1:cluster-uuid={other}", rank=1, name="odd")
    assert {b["Fabric/ClusterUUID"] for b in q_blocks(smi(odd, "-q").stdout)} == {other}
    assert {b["Fabric/State"] for b in q_blocks(smi(odd, "-q").stdout)} == {"Completed"}


def test_no_nvidia_smi_fault_removes_the_tool(tmp_path):
    cfg = node(tmp_path, "h100", "0:no-nvidia-smi")
    assert "/usr/bin/nvidia-smi" in excluded_paths(cfg)
    assert "/usr/bin/nvidia-smi" not in excluded_paths(node(tmp_path, "h100", name="ok"))
    res = smi(cfg, *QUERY)  # a stale copy still behaves as "not installed"
    assert res.returncode == 127 and "nvidia-smi: command not found" in res.stderr


def test_faults_only_touch_their_own_part_of_the_config(tmp_path):
    base = node_config("gb300", 1, 2, "node2", "10.77.0.12", [], 0.01, UUID)
    expected = {
        "1:driver=570.86.15": {"driver", "faults"},
        "1:gpu-count=3": {"gpu", "faults"},
        "1:gpu-model=NVIDIA GB200": {"gpu", "faults"},
        "1:no-nvidia-smi": {"tools_missing", "faults"},
        "1:no-dmabuf": {"dmabuf", "faults"},
        "1:no-peermem": {"modules_unloaded", "faults"},
        "1:fabric=Not Started": {"fabric", "faults"},
        f"1:cluster-uuid={UUID.replace('8f', '9f')}": {"fabric", "faults"},
        "1:fabric-health=route-unhealthy": {"fabric", "faults"},
        "1:engine-crash": {"engine", "faults"},
        "1:engine-slow=5": {"engine", "faults"},
        "1:engine-api-key=k3": {"engine", "faults"},
        "1:disk-full": {"faults"},
        "1:sshd-down": {"faults"},
        "0:driver=570.86.15": set(),  # another rank's fault changes nothing here
    }
    for text, keys in expected.items():
        cfg = node_config("gb300", 1, 2, "node2", "10.77.0.12", [parse_fault(text)], 0.01, UUID)
        changed = {key for key in base if base[key] != cfg[key]}
        assert changed == keys, text


# ----------------------------------------------------------------- modules, toolkit, RDMA


def lsmod_names(res: subprocess.CompletedProcess[str]) -> dict[str, list[str]]:
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["Module", "Size", "Used", "by"]
    return {line.split()[0]: line.split() for line in lines[1:]}


def test_lsmod_modinfo_modprobe_and_the_peermem_fault(tmp_path):
    ok = node(tmp_path, "h200", name="ok")
    mods = lsmod_names(tool(ok, "usr/local/bin/lsmod"))
    assert mods["nvidia_peermem"][1:3] == ["16384", "0"]
    assert {"nvidia", "nvidia_uvm", "mlx5_ib", "ib_uverbs"} <= set(mods)
    assert tool(ok, "usr/local/bin/modinfo", "-F", "license", "nvidia").stdout == "Dual MIT/GPL\n"
    missing = tool(ok, "usr/local/bin/modinfo", "nvidia_bogus")
    assert missing.returncode == 1 and "modinfo: ERROR: Module nvidia_bogus not found." in missing.stderr

    bad = node(tmp_path, "h200", "0:no-peermem", name="bad")
    state = tmp_path / "bad-state"
    assert "nvidia_peermem" not in lsmod_names(tool(bad, "usr/local/bin/lsmod", state=state))
    assert tool(bad, "usr/local/bin/modprobe", "nvidia-peermem", state=state).returncode == 0
    assert "nvidia_peermem" in lsmod_names(tool(bad, "usr/local/bin/lsmod", state=state))
    res = tool(bad, "usr/local/bin/modprobe", "nope", state=state)
    assert res.returncode == 1 and "modprobe: FATAL: Module nope not found" in res.stderr


def test_container_toolkit(tmp_path):
    cfg = node(tmp_path, "b300")
    assert tool(cfg, "usr/bin/nvidia-ctk", "--version").stdout.splitlines()[0] == \
        "NVIDIA Container Toolkit CLI version 1.17.8"
    assert tool(cfg, "usr/bin/nvidia-container-runtime", "--version").stdout.splitlines()[0] == \
        "NVIDIA Container Runtime version 1.17.6"
    cdi = tool(cfg, "usr/bin/nvidia-ctk", "cdi", "list").stdout.splitlines()
    assert cdi[-1] == "nvidia.com/gpu=all" and len(cdi) == 9


def parse_ibv(text: str) -> list[dict[str, str]]:
    devs: list[dict[str, str]] = []
    for line in text.splitlines():
        if line.startswith("hca_id:\t"):
            devs.append({"hca_id": line.split("\t", 1)[1]})
        elif line.strip():
            key, _, value = line.strip().partition(":")
            devs[-1][key] = value.strip()
    return devs


def test_ibv_devinfo_blocks_are_tab_separated_like_rdma_core(tmp_path):
    cfg = node(tmp_path, "h200")
    out = tool(cfg, "usr/bin/ibv_devinfo").stdout
    # the real sample's field layout (tabs), device-specific values aside
    assert "\ttransport:\t\t\tInfiniBand (0)\n" in out
    assert "\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n" in out
    assert "\t\t\tlink_layer:\t\tInfiniBand\n" in out
    devs = parse_ibv(out)
    assert [d["hca_id"] for d in devs] == [f"mlx5_{i}" for i in range(8)]
    assert {d["link_layer"] for d in devs} == {"InfiniBand"}
    listing = tool(cfg, "usr/bin/ibv_devinfo", "-l").stdout.splitlines()
    assert listing[0] == "8 HCAs found:" and listing[1] == "\tmlx5_0"
    one = parse_ibv(tool(cfg, "usr/bin/ibv_devinfo", "-d", "mlx5_3").stdout)
    assert [d["hca_id"] for d in one] == ["mlx5_3"]
    roce = parse_ibv(tool(node(tmp_path, "mi355x", name="amd"), "usr/bin/ibv_devinfo").stdout)
    assert {d["link_layer"] for d in roce} == {"Ethernet"} and {d["sm_lid"] for d in roce} == {"0"}
    none = tool(node(tmp_path, "ascend_910c", name="npu"), "usr/bin/ibv_devinfo")
    assert none.stdout == "" and "No IB devices found" in none.stderr


def test_proprietary_kernel_module_flavour(tmp_path):
    cfg = node(tmp_path, "h100")
    cfg["driver"]["kernel_module"] = "proprietary"
    Path(cfg["_path"]).write_text(json.dumps({k: v for k, v in cfg.items() if k != "_path"}))
    assert tool(cfg, "usr/local/bin/modinfo", "-F", "license", "nvidia").stdout == "NVIDIA\n"
    lines = tool(cfg, "usr/local/bin/modinfo", "nvidia").stdout.splitlines()
    assert "license:        NVIDIA" in lines and "version:        580.126.09" in lines


def test_topo_matrix_places_the_nics_as_real_machines_do(tmp_path):
    from k3deploy.vendors.nvidia.facts import parse_topo

    hgx = tool(node(tmp_path, "b300"), "usr/bin/nvidia-smi", "topo", "-m").stdout
    real = (Path(__file__).parents[1] / "fixtures/nvidia/topo-m-h100.txt").read_text().splitlines()
    assert hgx.splitlines()[0] == real[0].replace("NIC7    CPU", "NIC7    NIC8    CPU")  # the real header layout
    assert hgx.splitlines()[1] == real[1].replace("SYS     0-47", "SYS     NODE    0-47")  # + the storage NIC column
    topo = parse_topo(hgx.splitlines())
    assert {n: topo.nearest(n) for n in topo.nics} == {**{f"mlx5_{i}": "PIX" for i in range(8)}, "mlx5_bond_0": "NODE"}
    assert "NIC Legend:" in hgx and "  NIC8: mlx5_bond_0" in hgx
    grace = parse_topo(tool(node(tmp_path, "gb300", name="gb"), "usr/bin/nvidia-smi", "topo", "-m").stdout.splitlines())
    assert {grace.nearest(n) for n in grace.nics} == {"SYS"} and len(grace.gpus) == 4
    assert tool(node(tmp_path, "h200", name="x"), "usr/bin/nvidia-smi", "topo", "-x").returncode == 2


def test_imex_mgmt_fault_lists_the_tray_by_its_management_address(tmp_path):
    """IMEX bound to a second network (NVIDIA's IMEX guide: BIND_INTERFACE_IP): the tray gets mgmt0, and every
    tray's nodes_config.cfg (nvidia-imex-ctl -N) names it by that address."""
    faults = [parse_fault("1:imex-mgmt")]
    one = node_config("gb300", 1, 2, "node2", "10.77.5.12", faults, 0.01, UUID)
    other = node_config("gb300", 0, 2, "node1", "10.77.5.11", faults, 0.01, UUID)
    assert one["management"] == {"interface": "mgmt0", "ip": "192.168.5.12"}
    assert "management" not in other
    assert one["imex"]["nodes"] == other["imex"]["nodes"] == ["10.77.5.11", "192.168.5.12"]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(one))
    listed = tool({**one, "_path": str(path)}, "usr/bin/nvidia-imex-ctl", "-N").stdout
    assert "Node #1   - 192.168.5.12" in listed and "Domain State: UP" in listed
    with pytest.raises(Exception, match="needs IMEX hardware"):
        node_config("h200", 0, 2, "node1", "10.77.5.11", [parse_fault("0:imex-mgmt")], 0.01, UUID)
