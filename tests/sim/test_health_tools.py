"""The simulated nodes' health tools print what the real tools print (the samples in tests/fixtures, their sources in
its README), and the health faults change exactly the lines the real tools would."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from helpers import FIXTURES
from k3sim.faults import parse_fault
from k3sim.profiles import NODE_TOOLS, node_config

UUID = "8f7e1c2a-3b4d-4e5f-9a6b-7c8d9e0f1a2b"


def tool(tmp_path, hardware: str, faults: list[str], *argv: str) -> str:
    config = node_config(hardware, 1, 2, "node2", "10.77.0.12", [parse_fault(f) for f in faults], 1.0, UUID)
    path = tmp_path / "node.json"
    path.write_text(json.dumps(config))
    found = [NODE_TOOLS / d / argv[0] for d in ("usr/bin", "usr/local/bin") if (NODE_TOOLS / d / argv[0]).is_file()]
    env = dict(os.environ, K3SIM_NODE_CONFIG=str(path), K3SIM_STATE_DIR=str(tmp_path))
    return subprocess.run([str(found[0]), *argv[1:]], env=env, capture_output=True, text=True, check=True,
                          timeout=30).stdout


def keys(text: str) -> list[str]:
    """Each line's key (or block header) with its indent: the shape of an ``nvidia-smi -q`` report."""
    return [line.split(":")[0].rstrip() for line in text.splitlines() if line.strip()]


def test_nvidia_smi_ecc_and_remapped_rows_have_the_real_535_shape(tmp_path):
    real = (FIXTURES / "nvidia/nvidia-smi-q-ecc-a10g-535.txt").read_text()
    real = re.sub(r"    Retired Pages\n(        .*\n)+", "", real)          # -d ECC,ROW_REMAPPER leaves it out
    out = tool(tmp_path, "gb300", [], "nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER")
    first = out[out.index("GPU 00000008:01:00.0"):out.index("GPU 00000009:01:00.0")]
    assert keys(first)[1:] == keys(real)[1:]
    assert "Attached GPUs                             : 4" in out
    # the full report carries the blocks too, Retired Pages included, in the real order
    full = tool(tmp_path, "gb300", [], "nvidia-smi", "-q")
    assert full.index("    ECC Mode") < full.index("    Retired Pages") < full.index("    Remapped Rows") < \
        full.index("    Temperature")


@pytest.mark.parametrize("fault, lines", [
    ("1:ecc=uncorrectable", ["            DRAM Uncorrectable            : 2", "        Pending                           : Yes"]),
    ("1:ecc=remap-failure", ["        Remapping Failure Occurred        : Yes"]),
    ("1:ecc=pending-remap", ["        Correctable Error                 : 1", "        Pending                           : Yes"]),
])
def test_ecc_faults_change_their_gpus_counters(tmp_path, fault, lines):
    out = tool(tmp_path, "gb300", [f"{fault}:2"], "nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER", "-i", "2")
    assert out.count("GPU 0000") == 1 and "GPU 00000018:01:00.0" in out
    for line in lines:
        assert line in out.splitlines()
    other = tool(tmp_path, "gb300", [f"{fault}:2"], "nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER", "-i", "0")
    assert not any(line in other.splitlines() for line in lines)


def test_nvidia_smi_q_prints_the_recovery_action_where_the_real_565_report_does(tmp_path):
    real = (FIXTURES / "nvidia/nvidia-smi-q-h100-565.txt").read_text()
    out = tool(tmp_path, "h200", ["1:recovery=reset:3"], "nvidia-smi", "-q")
    gpus = out.split("\nGPU ")[1:]
    assert len(gpus) == 8
    around = [k for k in keys(real) if k.strip() in ("GPU Reset Status", "Reset Required",
                                                     "Drain and Reset Recommended", "GPU Recovery Action")]
    assert [k for k in keys(gpus[0]) if k.strip() in {a.strip() for a in around}] == around
    assert [m.group(1) for g in gpus if (m := re.search(r"GPU Recovery Action +: (.+)", g))] == [
        "None", "None", "None", "Reset", "None", "None", "None", "None"]


@pytest.mark.parametrize("action, words", [("reboot", "0x0 (None) to 0x2 (Node Reboot Required)"),
                                           ("reset", "0x0 (None) to 0x1 (GPU Reset Required)"),
                                           ("none", "0x1 (GPU Reset Required) to 0x0 (None)")])
def test_dmesg_announces_the_recovery_action_as_xid_154(tmp_path, action, words):
    real = (FIXTURES / "nvidia/dmesg-xid-79-154-reboot.txt").read_text().splitlines()[1]
    out = tool(tmp_path, "gb300", [f"1:recovery={action}:1"], "dmesg").splitlines()
    assert out[-1].endswith(f"NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from {words}")
    assert real.endswith("154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")


def test_npu_smi_prints_the_a2_layout_of_the_real_910b_tables(tmp_path):
    real = (FIXTURES / "ascend/npu-smi-info-a2-910b2-excerpt.txt").read_text().splitlines()
    out = tool(tmp_path, "ascend_910c", ["1:npu-smi-a2"], "npu-smi", "info").splitlines()
    assert out[3:6] == real[1:4]                              # the header: Chip without Phy-ID
    widths = [[len(cell) for cell in line.split("|")] for line in (real[4], real[5])]
    assert [[len(cell) for cell in line.split("|")] for line in out[6:8]] == widths
    assert out[6 + 3 * 15].startswith("| 15    Ascend910 ")           # NPU 15, then its one chip, chip 0
    assert re.fullmatch(r"\| 0 {25}\| 0000:[0-9A-F]{2}:00\.0 .*", out[6 + 3 * 15 + 1])
    a3 = tool(tmp_path, "ascend_910c", [], "npu-smi", "info").splitlines()
    assert a3[4].startswith("| Chip  Phy-ID ")


def test_nvlink_status_prints_every_link_as_the_real_tool(tmp_path):
    real = (FIXTURES / "nvidia/nvlink-s-v100-inactive-azhpc73.txt").read_text().splitlines()
    out = tool(tmp_path, "gb300", ["1:nvlink-down=3:1"], "nvidia-smi", "nvlink", "-s").splitlines()
    assert len(out) == 4 * 19
    assert re.fullmatch(r"GPU 0: NVIDIA GB300 \(UUID: GPU-[0-9a-f-]+\)", out[0])
    assert out[1] == "\t Link 0: 53.125 GB/s"
    assert real[4] == "\t Link 3: <inactive>" == out[19 + 4]     # GPU 1, link 3
    assert sum("<inactive>" in line for line in out) == 1
    hopper = tool(tmp_path, "h200", [], "nvidia-smi", "nvlink", "-s").splitlines()
    assert hopper[1] == "\t Link 0: 26.562 GB/s" and len(hopper) == 8 * 19


def test_dmesg_shows_an_xid_as_the_driver_prints_it(tmp_path):
    real = (FIXTURES / "nvidia/dmesg-ctime-xid-13-109-gpud46.txt").read_text().splitlines()[1]
    out = tool(tmp_path, "gb300", ["1:xid=79", "1:xid=48:3"], "dmesg").splitlines()
    assert out[-2] == ("[ 1843.308145] NVRM: Xid (PCI:0008:01:00): 79, pid='<unknown>', name=<unknown>, "
                       "GPU has fallen off the bus.")
    assert out[-1].startswith("[ 1855.808145] NVRM: Xid (PCI:0019:01:00): 48, pid='<unknown>', name=<unknown>, An ")
    shape = r"NVRM: Xid \(PCI:[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\): \d+, pid='<unknown>', name=<unknown>, "
    assert re.search(shape, real) and re.search(shape, out[-2])
    assert "Xid" not in tool(tmp_path, "gb300", [], "dmesg")


def test_amd_smi_metric_ecc_prints_the_changelogs_block(tmp_path):
    real = (FIXTURES / "amd/amd-smi-metric-ecc-clean.txt").read_text()
    out = tool(tmp_path, "mi355x", ["1:ecc=uncorrectable:1"], "amd-smi", "metric", "--ecc")
    assert out.startswith(real)
    gpu1 = out.split("GPU: 1\n")[1].split("GPU: 2\n")[0]
    assert "        TOTAL_UNCORRECTABLE_COUNT: 2\n" in gpu1


def test_npu_smi_health_prints_huaweis_form(tmp_path):
    real = (FIXTURES / "ascend/npu-smi-info-t-health-chip-ok.txt").read_text()
    assert tool(tmp_path, "ascend_910c", [], "npu-smi", "info", "-t", "health", "-i", "0", "-c", "0") == real
    sick = tool(tmp_path, "ascend_910c", ["1:npu-health=3:Alarm"], "npu-smi", "info", "-t", "health", "-i", "3",
                "-c", "1")
    assert sick.splitlines()[:2] == ["        Health Status                  : Alarm",
                                     "        Error Code                     : 80E18005"]
    table = tool(tmp_path, "ascend_910c", ["1:npu-health=3:Alarm"], "npu-smi", "info")
    assert len(re.findall(r"^\| 3     Ascend910\s+\| Alarm ", table, re.M)) == 2
