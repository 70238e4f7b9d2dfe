"""Simulated AMD and Ascend tools, hardware profiles, fault parsing and tool installation."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import present
from k3deploy.errors import K3Error
from k3sim.faults import FAULT_KINDS, Fault, check_ranks, parse_fault
from k3sim.profiles import NODE_TOOLS, PROFILES, excluded_paths, install_node_tools, node_config

UUID = "8f7e1c2a-3b4d-4e5f-9a6b-7c8d9e0f1a2b"
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "kimi-k3.yaml"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# rocm-smi --showdriverversion, as printed by a real MI3xx host (driver version aside)
REAL_ROCM_DRIVER = """\
============================ ROCm System Management Interface ============================
============================== Version of System Component ===============================
Driver version: {version}
==========================================================================================
================================== End of ROCm SMI Log ==================================="""

# npu-smi info on an A3 (910C) node: banner and the first NPU (two chip rows)
REAL_NPU_SMI_HEAD = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 25.3.rc1                 Version: 25.3.rc1                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     Ascend910           | OK            | 166.6       37                0    / 0             |
| 0     0                   | 0000:9D:00.0  | 0           0    / 0          3150 / 65536         |
+------------------------------------------------------------------------------------------------+
| 0     Ascend910           | OK            | -           36                0    / 0             |
| 1     1                   | 0000:9F:00.0  | 0           0    / 0          2886 / 65536         |"""

REAL_VERSION_INFO = """\
Version=25.3.rc1
ascendhal_version=7.35.23
aicpu_version=1.0
tdt_version=1.0
log_version=1.0
prof_version=2.0
dvppkernels_version=1.1
tsfw_version=1.0
Innerversion=V100R001C23SPC002B212
compatible_version=[V100R001C19],[V100R001C20],[V100R001C21],[V100R001C22],[V100R001C23]
compatible_version_fw=[7.0.0,8.9.9]
package_version=25.3.rc1
"""


def node(tmp_path: Path, hardware: str, *faults: str, name: str = "node1") -> dict:
    cfg = node_config(hardware, 0, 1, name, "10.77.0.11", [parse_fault(f) for f in faults], 0.01, UUID)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    cfg["_path"] = str(path)
    return cfg


def tool(cfg: dict, rel: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, K3SIM_NODE_CONFIG=cfg["_path"], K3SIM_STATE_DIR=str(Path(cfg["_path"]).parent / "st"))
    return subprocess.run([sys.executable, str(NODE_TOOLS / rel), *args], capture_output=True, text=True,
                          env=env, timeout=30)


# ----------------------------------------------------------------------------------- AMD


@pytest.mark.parametrize("hardware,vram", [("mi300x", 206158430208), ("mi325x", 274877906944),
                                           ("mi355x", 309237645312)])
def test_rocm_smi_memory_and_count(tmp_path, hardware, vram):
    cfg = node(tmp_path, hardware)
    out = tool(cfg, "usr/bin/rocm-smi", "--showmeminfo", "vram").stdout
    totals = [int(m) for m in re.findall(r"VRAM Total Memory \(B\):\s*(\d+)", out)]
    assert totals == [vram] * 8
    ids = tool(cfg, "usr/bin/rocm-smi", "-i").stdout
    assert len({line.split("]")[0] for line in ids.splitlines() if line.startswith("GPU[")}) == 8
    names = tool(cfg, "usr/bin/rocm-smi", "--showproductname").stdout
    assert f"Card Series: \t\t{PROFILES[hardware]['product']}" in names


def test_rocm_driver_version_block_and_amd_smi_version(tmp_path):
    cfg = node(tmp_path, "mi355x")
    out = tool(cfg, "usr/bin/rocm-smi", "--showdriverversion").stdout
    assert REAL_ROCM_DRIVER.format(version="6.14.14") in out
    line = tool(cfg, "usr/bin/amd-smi", "version").stdout.strip()
    assert line == ("AMDSMI Tool: 26.0.2+39589fda | AMDSMI Library version: 26.0.2 | ROCm version: 7.0.2 | "
                    "amdgpu version: 6.14.14 | amd_hsmp version: N/A")
    assert present(re.search(r"ROCm version:\s*([^\s|]+)", line)).group(1) == "7.0.2"
    bad = node(tmp_path, "mi355x", "0:driver=6.7.0", name="old")
    assert "Driver version: 6.7.0\n" in tool(bad, "usr/bin/rocm-smi", "--showdriverversion").stdout
    listing = tool(cfg, "usr/bin/amd-smi", "list").stdout
    assert listing.count("GPU: ") == 8 and "BDF: 0000:05:00.0" in listing


# -------------------------------------------------------------------------------- Ascend


def test_npu_smi_info_matches_the_real_table(tmp_path):
    cfg = node(tmp_path, "ascend_910c")
    out = tool(cfg, "usr/local/bin/npu-smi", "info").stdout
    assert out.startswith(REAL_NPU_SMI_HEAD + "\n")
    chip_rows = [line for line in out.splitlines() if re.search(r"\| [0-9A-F]{4}:[0-9A-F]{2}:00\.0 ", line)]
    assert len(chip_rows) == 16
    hbm = {int(m) for m in re.findall(r"\d+ / (\d+)\s+\|$", "\n".join(chip_rows), re.M)}
    assert hbm == {65536}


def test_npu_smi_faults(tmp_path):
    eight = node(tmp_path, "ascend_910c", "0:gpu-count=8", name="eight")
    out = tool(eight, "usr/local/bin/npu-smi", "info").stdout
    assert len(re.findall(r"\| [0-9A-F]{4}:[0-9A-F]{2}:00\.0 ", out)) == 8
    none = tool(node(tmp_path, "ascend_910c", "0:gpu-count=0", name="none"), "usr/local/bin/npu-smi", "info")
    assert none.returncode != 0 and "dcmi module initialize failed. ret is -8005" in none.stdout + none.stderr
    old = node(tmp_path, "ascend_910c", "0:driver=24.1.0", name="old")
    assert "| npu-smi 24.1.0                   Version: 24.1.0 " in tool(old, "usr/local/bin/npu-smi", "info").stdout


def test_version_info_files_and_hccn_tool(tmp_path):
    assert (NODE_TOOLS / "usr/local/Ascend/driver/version.info").read_text() == REAL_VERSION_INFO
    fw = (NODE_TOOLS / "usr/local/Ascend/firmware/version.info").read_text()
    assert fw.splitlines()[0] == "Version=7.7.0.1.231"
    cfg = node(tmp_path, "ascend_910c")
    assert tool(cfg, "usr/local/Ascend/driver/tools/hccn_tool", "-i", "15", "-link", "-g").stdout == \
        "link status: UP\n"
    # the driver fault is reflected in the installed version.info
    old = node(tmp_path, "ascend_910c", "0:driver=24.1.0", name="old")
    root = tmp_path / "root"
    install_node_tools(root, old)
    info = dict(line.split("=", 1) for line in (root / "usr/local/Ascend/driver/version.info").read_text().split())
    assert info["package_version"] == "24.1.0" and info["Version"] == "24.1.0"
    assert info["Innerversion"] == "V100R001C23SPC002B212"


# hccn_tool's answers as the Ascend driver prints them: its format strings (tool_ops.c / tool_ops_ext.c of
# src/custom/network/hccn/ascend910B/hccn_tool in the open CANN driver) and the captured outputs of
# tests/fixtures/ascend/hccn-*.txt
HCCN_ANSWERS = {
    "-link": "link status: UP\n",
    "-net_health": "net health status: Success\n",
    "-netdetect": "netdetect address: 192.168.100.254\n",
    "-gateway": "default gateway:192.168.100.254, Iface:eth15\n",
    "-ip": "ipaddr:192.168.100.16\nnetmask:255.255.255.0\n",
    "-vnic": "vnic link status: UP\nvnic ipaddr: 192.169.0.184\nvnic netmask: 255.255.255.0\n",
}


@pytest.mark.parametrize("query", sorted(HCCN_ANSWERS))
def test_hccn_tool_prints_the_real_formats(tmp_path, query):
    cfg = node(tmp_path, "ascend_910c")
    res = tool(cfg, "usr/local/Ascend/driver/tools/hccn_tool", "-i", "15", query, "-g")
    assert (res.stdout, res.returncode) == (HCCN_ANSWERS[query], 0)
    fixture = FIXTURES / "ascend" / {"-link": "hccn-link-a2.txt", "-net_health": "hccn-net-health-a2.txt",
                                     "-netdetect": "hccn-netdetect-a2.txt", "-gateway": "hccn-gateway-a2.txt",
                                     "-ip": "hccn-ip-a2.txt", "-vnic": "hccn-vnic-a3.txt"}[query]
    def shape(line: str) -> str:  # the line with its numbers and addresses taken out
        return re.sub(r"\d+(?:\.\d+)*", "#", line)

    assert {shape(line) for line in res.stdout.splitlines()} <= {shape(line) for line in fixture.read_text().splitlines()}


def test_hccn_tool_device_range_and_the_link_down_fault(tmp_path):
    hccn = "usr/local/Ascend/driver/tools/hccn_tool"
    bad = tool(node(tmp_path, "ascend_910c"), hccn, "-i", "16", "-link", "-g")
    assert bad.returncode != 0 and "Get invalid device id." in bad.stderr
    cfg = node(tmp_path, "ascend_910c", "0:npu-link-down=3,11", name="down")
    for dev in range(16):
        link = tool(cfg, hccn, "-i", str(dev), "-link", "-g").stdout
        health = tool(cfg, hccn, "-i", str(dev), "-net_health", "-g").stdout
        down = dev in (3, 11)
        assert link == f"link status: {'DOWN' if down else 'UP'}\n", dev
        assert health == f"net health status: {'Fault' if down else 'Success'}\n", dev
    with pytest.raises(K3Error, match="Ascend hardware only"):
        node_config("h200", 0, 1, "n", "ip", [parse_fault("0:npu-link-down=1")], 0.01, UUID)


def test_mount_missing_takes_the_path_off_the_node(tmp_path):
    for path, rel in [("/usr/local/Ascend/driver/tools/hccn_tool", "usr/local/Ascend/driver/tools/hccn_tool"),
                      ("/usr/local/dcmi/", "usr/local/dcmi"), ("/usr/local/bin/npu-smi", "usr/local/bin/npu-smi")]:
        root = tmp_path / rel.replace("/", "_")
        install_node_tools(root, node_config("ascend_910c", 0, 1, "n", "ip", [], 0.01, UUID))
        assert (root / rel).exists()
        cfg = node_config("ascend_910c", 0, 1, "n", "ip", [parse_fault(f"0:mount-missing={path}")], 0.01, UUID)
        assert cfg["paths_missing"] == [path.rstrip("/")]
        from k3sim.rootfs import install_tools

        install_tools(root, cfg)
        assert not (root / rel).exists() and not (root / rel).is_symlink(), path
        assert (root / "usr/local/Ascend/driver/version.info").exists()
        install_tools(root, node_config("ascend_910c", 0, 1, "n", "ip", [], 0.01, UUID))  # cleared: back again
        assert (root / rel).exists()
    with pytest.raises(K3Error, match="Ascend hardware only"):
        node_config("gb300", 0, 1, "n", "ip", [parse_fault("0:mount-missing=/usr/local/dcmi")], 0.01, UUID)


# ----------------------------------------------------------------------------- profiles


def test_every_recipe_hardware_id_has_a_profile_with_the_right_gpu_count():
    recipe = yaml.safe_load(RECIPE.read_text())
    ids = {hw for v in recipe["variants"].values() for hw in v.get("supported_hardware", [])}
    assert ids <= set(PROFILES)
    expected = {"gb200": 4, "gb300": 4, "ascend_910c": 16}
    for hw, prof in PROFILES.items():
        assert prof["gpus"] == expected.get(hw, 8), hw
        assert len(node_config(hw, 0, 1, "n", "10.77.0.11", [], 0.5, UUID)["gpu"]["bus_ids"]) == prof["gpus"]


def test_node_config_shape_and_scaling():
    cfg = node_config("gb300", 1, 4, "node2", "10.77.0.12", [parse_fault("1:engine-slow=2.5")], 0.01, UUID)
    assert (cfg["name"], cfg["ip"], cfg["rank"], cfg["nodes"], cfg["hardware"]) == \
        ("node2", "10.77.0.12", 1, 4, "gb300")
    assert cfg["load_seconds"] == pytest.approx(3.0)  # 300 s nominal x 0.01
    assert cfg["engine"]["extra_load_seconds"] == 2.5
    assert cfg["fabric"]["cluster_uuid"] == UUID
    assert json.loads(json.dumps(cfg)) == cfg
    with pytest.raises(K3Error, match="unknown hardware 'b900'"):
        node_config("b900", 0, 1, "n", "ip", [], 0.01, UUID)
    with pytest.raises(K3Error, match="NVIDIA hardware only"):
        node_config("mi355x", 0, 1, "n", "ip", [parse_fault("0:no-peermem")], 0.01, UUID)
    with pytest.raises(K3Error, match="gb200, gb300"):  # HGX boards take fabric= (their NVSwitch registration)
        node_config("h200", 0, 1, "n", "ip", [parse_fault(f"0:cluster-uuid={UUID}")], 0.01, UUID)


def test_excluded_paths_leave_out_other_vendors_tools(tmp_path):
    h200 = set(excluded_paths(node_config("h200", 0, 1, "n", "ip", [], 0.01, UUID)))
    assert {"/usr/local/bin/npu-smi", "/usr/bin/amd-smi", "/usr/bin/rocm-smi", "/usr/bin/nvidia-imex"} <= h200
    assert not {"/usr/bin/nvidia-smi", "/usr/bin/docker", "/usr/bin/nv-fabricmanager"} & h200
    gb = set(excluded_paths(node_config("gb300", 0, 1, "n", "ip", [], 0.01, UUID)))
    assert "/usr/bin/nv-fabricmanager" in gb and "/usr/bin/nvidia-imex" not in gb
    npu = set(excluded_paths(node_config("ascend_910c", 0, 1, "n", "ip", [], 0.01, UUID)))
    assert "/usr/bin/nvidia-smi" in npu and "/usr/local/bin/npu-smi" not in npu


def test_install_node_tools_gives_executable_python_scripts(tmp_path):
    cfg = node_config("h200", 0, 1, "node1", "10.77.0.11", [parse_fault("0:no-nvidia-smi")], 0.01, UUID)
    installed = install_node_tools(tmp_path, cfg)
    assert "/usr/bin/nvidia-smi" not in installed and not (tmp_path / "usr/bin/nvidia-smi").exists()
    assert json.loads((tmp_path / "etc/k3sim/node.json").read_text()) == cfg
    for rel in ("usr/lib/k3sim/tools/docker", "usr/lib/k3sim/tools/nvidia-ctk", "usr/local/bin/vllm-router",
                "usr/lib/k3sim/tools/lsmod", "usr/lib/k3sim/engine.py"):
        path = tmp_path / rel
        assert path.read_text().startswith("#!/usr/bin/python3\n"), rel
        assert path.stat().st_mode & stat.S_IXUSR, rel
    # the tools whose answers depend only on node.json answer through the cache front at their own path
    for rel in ("usr/bin/docker", "usr/bin/nvidia-ctk", "usr/local/bin/lsmod", "usr/bin/ibv_devinfo"):
        front = (tmp_path / rel).read_text()
        assert front.startswith("#!/bin/sh\n") and f"exec /usr/lib/k3sim/cached {rel.rsplit('/', 1)[-1]} " in front
    # the installed copy runs from its own root and finds its library there
    env = dict(os.environ, K3SIM_NODE_CONFIG=str(tmp_path / "etc/k3sim/node.json"))
    res = subprocess.run([sys.executable, str(tmp_path / "usr/lib/k3sim/tools/ibv_devinfo"), "-l"],
                         capture_output=True, text=True, env=env, timeout=30)
    assert res.stdout.startswith("8 HCAs found:")


def _cache_front(tmp_path):
    """The tools' cache front (``cached``) with its paths moved under ``tmp_path``; returns its ``lib`` folder (the
    front in ``lib/cached``, the tools it runs in ``lib/tools``)."""
    cached = (NODE_TOOLS / "usr/lib/k3sim/cached").read_text()
    lib = tmp_path / "lib"
    (lib / "tools").mkdir(parents=True)
    script = cached.replace("/usr/lib/k3sim/tools", str(lib / "tools")).replace("/etc/k3sim/node.json",
                                                                                 str(tmp_path / "node.json"))
    script = script.replace("/var/lib/k3sim", str(tmp_path / "state")).replace("/run/k3sim/cache",
                                                                               str(tmp_path / "cache"))
    (lib / "cached").write_text(script)
    return lib


def test_the_tool_cache_answers_until_the_node_changes(tmp_path):
    """The front replays a tool's answer (out, err, exit status) until node.json or the module state changes."""
    lib = _cache_front(tmp_path)
    calls = tmp_path / "calls"
    (lib / "tools" / "fake").write_text(f"#!/bin/sh\necho call >> {calls}\necho \"out $*\"\necho err >&2\nexit 3\n")
    (lib / "tools" / "fake").chmod(0o755)
    (tmp_path / "node.json").write_text("{}")
    import time

    time.sleep(1.1)  # the cache must be newer than node.json (second-resolution mtimes)

    def run(*args):
        return subprocess.run(["sh", str(lib / "cached"), "fake", *args], capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if not k.startswith("K3SIM_")})

    first, second = run("-q"), run("-q")
    assert (first.stdout, first.stderr, first.returncode) == ("out -q\n", "err\n", 3)
    assert (second.stdout, second.stderr, second.returncode) == ("out -q\n", "err\n", 3)
    assert calls.read_text().count("call") == 1  # answered from the cache
    assert run("-L").stdout == "out -L\n" and calls.read_text().count("call") == 2  # other arguments, other answer
    time.sleep(1.1)
    (tmp_path / "node.json").write_text('{"fault": 1}')  # a fault switched on: the tool runs again
    assert run("-q").returncode == 3 and calls.read_text().count("call") == 3


def test_the_tool_cache_answers_image_inspect_and_ls_while_the_image_store_is_unchanged(tmp_path):
    """``docker image inspect`` (and ``image ls --format`` without the relative CreatedSince) is replayed while the
    image store's index (images.json) is unchanged; other docker commands always run; arguments with slashes and
    spaces are keys of their own."""
    lib = _cache_front(tmp_path)
    calls = tmp_path / "calls"
    (lib / "tools" / "docker").write_text(f"#!/bin/sh\necho call >> {calls}\ncat {tmp_path}/state/docker/images.json"
                                          " 2>/dev/null || echo none\necho \"$*\"\n")
    (lib / "tools" / "docker").chmod(0o755)
    (tmp_path / "node.json").write_text("{}")
    import time

    time.sleep(1.1)  # the cache must be newer than node.json (the shell's test -nt may compare seconds only)

    def run(*args):
        return subprocess.run(["sh", str(lib / "cached"), "docker", *args], capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if not k.startswith("K3SIM_")}).stdout

    def count():
        return calls.read_text().count("call")

    assert run("image", "inspect", "x") == "none\nimage inspect x\n" == run("image", "inspect", "x")
    assert count() == 1
    (tmp_path / "state" / "docker").mkdir(parents=True)
    (tmp_path / "state" / "docker" / "images.json").write_text('{"a": 1}')  # pulled or loaded: asked again
    time.sleep(1.1)
    assert run("image", "inspect", "x") == '{"a": 1}image inspect x\n' and count() == 2
    assert run("image", "inspect", "x") == '{"a": 1}image inspect x\n' and count() == 2
    # a listing with a format is replayed, one with the relative creation time is not
    listing = ("image", "ls", "--format", "{{.Tag}} {{.Digest}}", "vllm/vllm-openai")
    assert run(*listing) == run(*listing) and count() == 3
    run("image", "ls", "--format", "{{.Tag}}", "{{.Digest}}", "vllm/vllm-openai")
    assert count() == 4   # the same words split otherwise: another command line, asked again
    assert run("image", "inspect", "a/b") != run("image", "inspect", "a%b") and count() == 6
    assert run("image", "ls", "--format", "{{.CreatedSince}}") == run("image", "ls", "--format", "{{.CreatedSince}}")
    assert count() == 8
    assert run("images") == run("images") and count() == 10   # never cached


# ------------------------------------------------------------------------------- faults


def test_parse_fault_accepts_every_kind():
    samples = {"driver": "=570.86.15", "gpu-count": "=7", "gpu-model": "=NVIDIA H100",
               "fabric": "=In Progress", "fabric-health": "=degraded-bandwidth", "cluster-uuid": f"={UUID}", "engine-slow": "=5", "docker-slow-create": "=5", "engine-api-key": "=k3", "npu-link-down": "=3",
               "mount-missing": "=/usr/local/dcmi", "default-route": "=front-end", "xid": "=79", "ecc": "=uncorrectable:1",
               "nvlink-down": "=3", "npu-health": "=5:Alarm", "recovery": "=reboot:1"}
    for kind in FAULT_KINDS:
        fault = parse_fault(f"2:{kind}{samples.get(kind, '')}")
        assert fault == Fault(2, kind, samples[kind][1:] if kind in samples else None)
        assert str(fault) == f"2:{kind}{samples.get(kind, '')}"


@pytest.mark.parametrize("text,words", [
    ("driver=570", ["RANK:KIND"]),
    ("1:bogus", ["unknown fault kind 'bogus'", "no-nvidia-smi"]),
    ("1:driver", ["needs a value"]),
    ("1:driver=abc", ["bad driver version 'abc'"]),
    ("1:gpu-count=many", ["bad GPU count 'many'"]),
    ("1:fabric=Broken", ["bad fabric state 'Broken'", "In Progress"]),
    ("1:cluster-uuid=xyz", ["bad ClusterUUID 'xyz'"]),
    ("1:engine-slow=-1", ["bad engine-slow value"]),
    ("1:disk-full=yes", ["takes no value"]),
    ("1:npu-link-down=eth3", ["bad NPU list 'eth3'"]),
    ("1:mount-missing=/usr/lib", ["bad path '/usr/lib'", "/usr/local/Ascend/driver/tools/hccn_tool"]),
    ("1:xid=fell", ["bad XID 'fell'", "79"]),
    ("1:ecc=double", ["bad ECC kind 'double'", "uncorrectable", "remap-failure"]),
    ("1:nvlink-down=18", ["bad NVLink link '18'", "0 to 17"]),
    ("1:npu-health=3:Broken", ["bad NPU health '3:Broken'", "Critical"]),
    ("1:recovery=flr", ["bad recovery action 'flr'", "drain-and-reset"]),
    ("1:xid=79:gpu1", ["bad GPU index 'gpu1'"]),
])
def test_bad_faults_name_the_text_and_the_fix(text, words):
    with pytest.raises(K3Error) as info:
        parse_fault(text)
    msg = str(info.value)
    assert "\n" not in msg
    for word in words:
        assert word in msg


def test_check_ranks():
    check_ranks([parse_fault("1:disk-full")], 2)
    with pytest.raises(K3Error, match="rank 2, but the cluster has 2 node"):
        check_ranks([parse_fault("2:disk-full")], 2)


def _pinger(tmp_path: Path, rank: int, nodes: int, *faults: str, name: str = "pinger", **ascend: object) -> dict:
    """Node ``rank`` of a ``nodes``-node cluster on TEST-NET-1 (192.0.2.0/24): no peer there answers on port 22."""
    cfg = node_config("ascend_910c", rank, nodes, name, f"192.0.2.{11 + rank}", [parse_fault(f) for f in faults],
                      0.01, UUID)
    cfg["ascend"].update(ascend)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    cfg["_path"] = str(path)
    return cfg


def test_hccn_tool_hccs_ping_prints_tool_ping_printf(tmp_path):
    # to itself (rank 0, NPU 5: VNIC 192.169.0.194): the node runs, the port is up
    cfg = _pinger(tmp_path, 0, 2)
    hccn = "usr/local/Ascend/driver/tools/hccn_tool"
    ok = tool(cfg, hccn, "-i", "5", "-hccs_ping", "-g", "address", "192.169.0.194")
    assert ok.returncode == 0 and ok.stdout.startswith("device 5 PING 192.169.0.194\n")
    assert "3 packets transmitted, 3 received, 0.00% packets loss\n" in ok.stdout
    assert "This pkt ping success!" in ok.stdout and "TP95 time " in ok.stdout
    # to NPU 5 of rank 1: its sshd does not answer (no such node running): every packet lost
    lost = tool(cfg, hccn, "-i", "5", "-hccs_ping", "-g", "address", "192.169.1.194")
    assert "3 packets transmitted, 0 received, 100.00% packets loss" in lost.stdout
    assert "This pkt send fail!" in lost.stdout
    # -ping to the port address (192.168.<100+rank>.<N+1>)
    plain = tool(cfg, hccn, "-i", "5", "-ping", "-g", "address", "192.168.100.6")
    assert plain.stdout.startswith("device 5 PING 192.168.100.6\n") and "3 packets transmitted, 3 received" in plain.stdout


def test_hccn_tool_ping_faults_and_unsupported_boards(tmp_path):
    hccn = "usr/local/Ascend/driver/tools/hccn_tool"
    own = _pinger(tmp_path, 0, 2, "0:npu-link-down=5", name="own")
    assert "0 received" in tool(own, hccn, "-i", "5", "-hccs_ping", "-g", "address", "192.169.0.194").stdout
    assert "3 received" in tool(own, hccn, "-i", "4", "-hccs_ping", "-g", "address", "192.169.0.195").stdout
    # a peer's downed port: rank 1's fault is in rank 0's view (its pings to NPU 5 of rank 1 fail)
    cfg = node_config("ascend_910c", 0, 2, "n", "127.0.0.11", [parse_fault("1:npu-link-down=5")], 0.01, UUID)
    assert cfg["ascend"]["peer_links_down"] == {"1": [5]} and cfg["ascend"]["links_down"] == []
    board = _pinger(tmp_path, 0, 2, name="a2", hccs_ping=False)
    res = tool(board, hccn, "-i", "0", "-hccs_ping", "-g", "address", "192.169.0.199")
    assert res.returncode != 0 and "This device does not support this function." in res.stdout + res.stderr
    assert "3 received" in tool(board, hccn, "-i", "0", "-ping", "-g", "address", "192.168.100.1").stdout
