"""Public real outputs (tests/fixtures/README.md names the source of each) through the facts' parsers, and the
simulated tools that print the same commands against them: the simulated output parses to the same shape."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from helpers import FIXTURES
from k3deploy.facts import host, rdma
from k3deploy.vendors.amd import facts as amd
from k3deploy.vendors.ascend import facts as ascend
from k3deploy.vendors.nvidia import facts as nvidia

FIX = FIXTURES
UUID = "9f3c1a52-6b7e-4c1d-8e2f-3a4b5c6d7e8f"
_KEY_RE = re.compile(r"^\s*([A-Za-z_][\w ]*?):")


def lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


def run(fact_cls, output: list[str], status: int = 0):
    return fact_cls().process([*output, f"K3_EXIT={status}"])


def simulated(tool: str, args: list[str], tmp_path, hw: str, change=None) -> list[str]:
    """The simulated tool's stdout on rank 0 of a ``hw`` node (``change`` edits the node config first)."""
    profiles = pytest.importorskip("k3sim.profiles")
    config = profiles.node_config(hw, 0, 1, "node0", "10.77.0.11", [], 1.0, UUID)
    if change:
        change(config)
    path = tmp_path / "node.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, K3SIM_NODE_CONFIG=str(path))
    exe = profiles.NODE_TOOLS / tool
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, check=True,
                          timeout=60).stdout.splitlines()


def keys(output: list[str]) -> set[str]:
    return {m.group(1).strip() for line in output if (m := _KEY_RE.match(line))}


# ------------------------------------------------------------------------------- ibv_devinfo


def test_ibv_devinfo_roce_only_four_hcas_aarch64():
    """DGX Spark (GB10, aarch64): four RoCE HCAs named rocep*/roceP* by PCI address, link layer Ethernet only."""
    devs = run(rdma.RdmaDevices, lines("rdma/ibv_devinfo-roce-4hca-dgx-spark.txt"))
    assert [(d.name, p.state, p.link_layer, p.active_mtu) for d in devs for p in d.ports] == [
        ("rocep1s0f0", "PORT_DOWN", "Ethernet", 1024), ("rocep1s0f1", "PORT_ACTIVE", "Ethernet", 4096),
        ("roceP2p1s0f0", "PORT_DOWN", "Ethernet", 1024), ("roceP2p1s0f1", "PORT_ACTIVE", "Ethernet", 4096)]
    assert {(d.transport, d.fw_ver) for d in devs} == {("InfiniBand (0)", "28.45.4028")}
    # no InfiniBand fabric: every active RoCE port is a candidate, the down ones are not, and a port with two names
    # (one adapter over two PCIe links: the same sys_image_guid) is taken once, by its name in the lowest PCI domain
    choice = rdma.choose_ports(devs)
    assert choice.nccl_ib_hca == "=rocep1s0f1:1"
    assert [(n, p) for n, p, _ in choice.excluded] == [("roceP2p1s0f1", 1)]


def test_ibv_devinfo_failed_to_open_device_lines_are_skipped():
    """ibv_devinfo prints "Failed to open device" for each device it cannot open (VFs not given to the container)
    and goes on; the parser used to reject the whole output. Also the older "Device ports:" line."""
    (dev,) = run(rdma.RdmaDevices, lines("rdma/ibv_devinfo-failed-to-open-vf.txt"))
    assert (dev.name, dev.fw_ver) == ("mlx4_2", "2.40.7000")
    assert [(p.port, p.state, p.link_layer) for p in dev.ports] == [(1, "PORT_ACTIVE", "InfiniBand")]
    assert run(rdma.RdmaDevices, ["Failed to open device"]).kind == "unparsable"  # nothing else: still no device


def test_ibv_devinfo_space_indented_azure_vf():
    """The same fields indented with spaces (as a bug report renders them), an Azure VF named rdmaP23800p0s2."""
    (dev,) = run(rdma.RdmaDevices, lines("rdma/ibv_devinfo-azure-ethernet-vf.txt"))
    assert (dev.name, dev.node_guid) == ("rdmaP23800p0s2", "000d:3aff:feac:5a53")
    assert [(p.state, p.link_layer, p.active_mtu) for p in dev.ports] == [("PORT_ACTIVE", "Ethernet", 1024)]


@pytest.mark.parametrize("hw", ["mi355x", "h200"])
def test_simulated_ibv_devinfo_prints_the_real_fields(hw, tmp_path):
    """The simulated ibv_devinfo prints every field the real one does, in the same form (RoCE on MI355X, InfiniBand
    and a storage port on H200), and parses to devices of the same shape."""
    real = lines("rdma/ibv_devinfo-roce-4hca-dgx-spark.txt")
    sim = simulated("usr/bin/ibv_devinfo", [], tmp_path, hw)
    assert keys(sim) == keys(real)
    assert all("\t" in line for line in sim if line.strip())  # tab-separated like the real tool
    devs = run(rdma.RdmaDevices, sim)
    assert devs and all(d.transport == "InfiniBand (0)" and re.fullmatch(r"\d+\.\d+\.\d+", d.fw_ver or "")
                        and re.fullmatch(r"([0-9a-f]{4}:){3}[0-9a-f]{4}", d.node_guid or "") for d in devs)
    ports = [p for d in devs for p in d.ports]
    assert all(p.state.startswith("PORT_") and p.link_layer in ("InfiniBand", "Ethernet")
               and p.active_mtu in (256, 512, 1024, 2048, 4096) for p in ports)
    if hw == "mi355x":
        assert {p.link_layer for p in ports} == {"Ethernet"}


# ------------------------------------------------------------------------ nvidia-smi -q Fabric


def test_fabric_completed_but_unhealthy_gb200():
    (gpu,) = run(nvidia.NvlinkFabric, lines("nvidia/smi-q-fabric-unhealthy-gb200.txt"))
    assert (gpu.state, gpu.status, gpu.clique_id, gpu.health) == ("Completed", "Success", "2", "Unhealthy")
    assert gpu.completed and gpu.has_cluster


def test_hgx_h100_fabric_registered_and_the_simulated_hgx_block(tmp_path):
    """A real HGX H100 (driver 565.57.01): registered with the NVSwitch fabric, CliqueId 0, the zero ClusterUUID,
    Health > Bandwidth N/A; the simulated HGX board prints the same block."""
    real = lines("nvidia/smi-q-h100-hgx-fabric-completed.txt")
    (gpu,) = run(nvidia.NvlinkFabric, real)
    assert (gpu.state, gpu.status, gpu.clique_id, gpu.has_cluster, gpu.bandwidth) == (
        "Completed", "Success", "0", False, None)
    assert _fabric_keys(real) == ["State", "Status", "CliqueId", "ClusterUUID", "Health/Bandwidth"]
    sim = simulated("usr/bin/nvidia-smi", ["-q"], tmp_path, "h100")
    assert _fabric_keys(sim) == _fabric_keys(real)
    assert {(g.state, g.status, g.clique_id) for g in run(nvidia.NvlinkFabric, sim)} == {("Completed", "Success", "0")}


def test_fabric_completed_with_insufficient_resources():
    (gpu,) = run(nvidia.NvlinkFabric, lines("nvidia/smi-q-fabric-insufficient-resources.txt"))
    assert (gpu.state, gpu.status, gpu.clique_id) == ("Completed", "Insufficient Resources", "0")
    assert not gpu.completed and not gpu.has_cluster


def _fabric_keys(output: list[str]) -> list[str]:
    """The Fabric block's keys, Health's sub-keys as Health/KEY, in order."""
    out: list[str] = []
    inside = health = False
    for line in output:
        text = line.strip()
        if text == "Fabric":
            inside, health = True, False
            continue
        if not inside:
            continue
        if not line.startswith("        ") or text.startswith("--"):
            break
        if text == "Health":
            health = True
            continue
        key = text.split(":")[0].strip()
        out.append(f"Health/{key}" if health and line.startswith("            ") else key)
    return out


#: the Health rows after Summary and Bandwidth of a real GB300 tray (driver 580.173.02; NVIDIA/k8s-test-infra,
#: tests/e2e/go/assertions/nvidiasmi/fabric_health.go, HealthyFabricBlock; Partition Assigned, N/A there, left out)
GB300_HEALTH_ROWS = ["Health/Route Recovery in progress", "Health/Route Unhealthy", "Health/Access Timeout Recovery",
                     "Health/Incorrect Configuration"]


def test_simulated_fabric_block_has_the_real_gb200_keys(tmp_path):
    real = _fabric_keys(lines("nvidia/smi-q-fabric-unhealthy-gb200.txt"))  # grep -C3: cut after Bandwidth
    assert real == ["State", "Status", "CliqueId", "ClusterUUID", "Health/Summary", "Health/Bandwidth"]
    sim = simulated("usr/bin/nvidia-smi", ["-q"], tmp_path, "gb200")
    assert _fabric_keys(sim) == real + GB300_HEALTH_ROWS
    fabric = run(nvidia.NvlinkFabric, sim)
    assert len(fabric) == 4 and all(g.completed and g.has_cluster and g.health == "Healthy" for g in fabric)

    def unhealthy(config):
        config["fabric"]["health"] = "Unhealthy"

    sick = run(nvidia.NvlinkFabric, simulated("usr/bin/nvidia-smi", ["-q"], tmp_path, "gb200", unhealthy))
    assert {g.health for g in sick} == {"Unhealthy"}


# ------------------------------------------------------------- nvidia-ctk, nv-fabricmanager


def test_container_toolkit_1_12_and_the_simulated_form(tmp_path):
    real = lines("nvidia/nvidia-ctk-version-1.12.0.txt")
    assert run(nvidia.NvidiaContainerToolkit, real).version == "1.12.0"
    sim = simulated("usr/bin/nvidia-ctk", ["--version"], tmp_path, "h200")
    form = [r"NVIDIA Container Toolkit CLI version \d+\.\d+\.\d+", r"commit: [0-9a-f]{40}"]
    for output in (real, sim):
        assert len(output) == 2 and all(re.fullmatch(f, line) for f, line in zip(form, output, strict=True))
    assert re.fullmatch(r"\d+\.\d+\.\d+", run(nvidia.NvidiaContainerToolkit, sim).version)


def test_fabric_manager_version_450_and_the_simulated_form(tmp_path):
    real = lines("nvidia/nv-fabricmanager-version-450.txt")
    fm = run(nvidia.FabricManager, ["K3_SECTION=state", "active", "K3_SECTION=version", *real])
    assert (fm.service, fm.version) == ("active", "450.102.04")
    sim = simulated("usr/bin/nv-fabricmanager", ["--version"], tmp_path, "h200")
    form = r"Fabric Manager version is : \d+\.\d+\.\d+"
    assert [bool(re.fullmatch(form, line)) for line in real + sim] == [True, True]


# ------------------------------------------------------ /proc/driver/nvidia/version, modinfo


@pytest.mark.parametrize("name, version", [
    ("proc-version-open-aarch64-jetson", "35.3.1"),  # a Jetson (L4T): aarch64, a version of its own
    ("proc-version-open-565", "565.57.01"),
    ("proc-version-open-arch", "525.60.11"),  # a distribution's build host, trailing blanks
])
def test_proc_driver_version_open_modules(name, version):
    real = lines(f"nvidia/{name}.txt")
    assert run(nvidia.NvidiaDriverFlavour, real) == nvidia.DriverFlavour("open", version, "proc")
    dmabuf = rdma.parse_dmabuf(["K3_SECTION=kernel", "6.8.0-45-generic", "K3_SECTION=nvidia", real[0],
                                "K3_SECTION=mlx5", "loaded"])
    assert dmabuf.open_modules is True


def test_modinfo_license_values_and_the_simulated_modinfo(tmp_path):
    """``modinfo -F license nvidia`` prints the value of modinfo's ``license:`` line: the real lines give both."""
    real = lines("nvidia/modinfo-grep-license.txt")
    values = [line.split(":", 1)[1].strip() for line in real]
    assert [run(nvidia.NvidiaDriverFlavour, [v]).flavour for v in values] == ["proprietary", "open"]
    full = simulated("usr/local/bin/modinfo", ["nvidia"], tmp_path, "h200")
    (line,) = [x for x in full if x.startswith("license:")]
    assert re.fullmatch(r"license:\s{8}\S.*", line) and all(re.fullmatch(r"\s*license:\s{8}\S.*", x) for x in real)
    value = simulated("usr/local/bin/modinfo", ["-F", "license", "nvidia"], tmp_path, "h200")
    assert value == [line.split(":", 1)[1].strip()]
    assert run(nvidia.NvidiaDriverFlavour, value).source == "modinfo"


# ------------------------------------------------------------------------------------- lsmod


def test_lsmod_lines_and_the_simulated_lsmod(tmp_path):
    """kmod prints ``%-19s %8lu  %d`` and the users: the size ends in column 28 in the real and the simulated."""
    real = lines("rdma/lsmod-grep-peermem-gpud.txt")
    assert {"nvidia_peermem", "ib_core", "nvidia"} <= set(run(rdma.KernelModules, real).names)
    sim = simulated("usr/local/bin/lsmod", [], tmp_path, "h200")
    assert sim[0] == "Module                  Size  Used by"
    assert "nvidia_peermem" in run(rdma.KernelModules, sim)
    for line in real + sim[1:]:
        match = re.match(r"^(\S+)\s+(\d+)  (\d+)( \S+)?$", line)
        assert match, line
        if len(match.group(1)) < 19:
            assert match.end(2) == 28, line


# ------------------------------------------------------------------------------- rocm-smi


def test_rocm_smi_driver_version_section_and_the_simulated_one(tmp_path):
    """``rocm-smi -a`` opens with the section ``--showdriverversion`` prints: a banner, ``Driver version: X``."""
    real = lines("amd/rocm-smi-a-driver-6.1.5.txt")
    assert run(amd.RocmDriverVersion, real).driver == "6.1.5"
    sim = simulated("usr/bin/rocm-smi", ["--showdriverversion"], tmp_path, "mi355x")
    assert re.fullmatch(r"\d+\.\d+\.\d+", run(amd.RocmDriverVersion, sim).driver)

    def shape(output: list[str]) -> list[str]:
        """The banners (``=== Title ===``, title only) and the key of each other line, up to the driver line."""
        out = []
        for line in output:
            if not line.strip():
                continue
            title = line.strip("= ")
            out.append(f"[{title}]" if line.startswith("=") and title else line.split(":")[0] if title else "[rule]")
            if line.startswith("Driver version:"):
                break
        return out

    assert shape(sim) == shape(real) == ["[ROCm System Management Interface]", "[Version of System Component]",
                                         "Driver version"]


# ------------------------------------------------------------------------------- npu-smi


def test_npu_smi_info_26_rc2_wider_table_and_the_simulated_table(tmp_path):
    """npu-smi 26.0.rc2 widens the third column; the cells, not the widths, carry the values."""
    real = lines("ascend/npu-smi-info-a3-26.0.rc2-excerpt.txt")
    info = run(ascend.NpuSmiInfo, real)
    assert info.version == "26.0.rc2"
    assert [(c.npu, c.chip, c.name, c.health, c.bus_id, c.hbm_total_mb) for c in info.chips] == [
        (0, 0, "Ascend910", "OK", "0000:9D:00.0", 65536), (0, 1, "Ascend910", "OK", "0000:9F:00.0", 65536)]
    sim = simulated("usr/local/bin/npu-smi", ["info"], tmp_path, "ascend_910c")

    def headers(output: list[str]) -> list[list[str]]:
        """The first cell word of the chip table's two header rows (the process table follows in a full output)."""
        return [[cell.split()[0] for cell in line.strip().strip("|").split("|")] for line in output
                if line.startswith(("| NPU ", "| Chip "))][:2]

    assert headers(sim) == headers(real) == [["NPU", "Health", "Power(W)"], ["Chip", "Bus-Id", "AICore(%)"]]
    chips = run(ascend.NpuSmiInfo, sim).chips
    assert len(chips) == 16 and {(c.name, c.health, c.hbm_total_mb) for c in chips} == {("Ascend910", "OK", 65536)}
    assert [c.chip for c in chips[:2]] == [0, 1] and chips[0].npu == chips[1].npu == 0


# ------------------------------------------------------------------------------------ docker


def test_docker_server_version_value():
    """``docker version --format '{{.Server.Version}}'`` prints the Server section's ``Version`` value alone (no
    public sample of the formatted form: the value is taken from a real plain ``docker version``)."""
    real = lines("host/docker-version-rhel-1.13.1.txt")
    server = real[real.index("Server:"):]
    (value,) = [line.split(":", 1)[1].strip() for line in server if line.startswith(" Version:")]
    runtime = run(host.DockerRuntime, ["K3_SECTION=version", value, "K3_SECTION=runtimes", "docker-runc runc "])
    assert (runtime.server_version, runtime.runtimes, runtime.error) == ("1.13.1", ["docker-runc", "runc"], "")


# ------------------------------------------------------------------ amd-smi, /sys/module/amdgpu


def test_amd_smi_version_with_the_kernels_own_amdgpu():
    """Without amdgpu-dkms amd-smi prints the kernel's /proc/version, blanks squeezed out, as the amdgpu version: the
    fact used to keep that whole string as the driver version; it keeps the kernel release."""
    versions = run(amd.AmdSmiVersion, lines("amd/amd-smi-version-inbox-amdgpu.txt"))
    assert (versions.tool, versions.library, versions.rocm, versions.amdgpu) == (
        "25.3.0+ede62f2", "25.3.0", "6.4.0", "6.8.0-79-generic")


def test_sys_module_amdgpu_version_dkms_and_inbox(tmp_path):
    """``/sys/module/amdgpu/version`` holds the DKMS module's version; the kernel's own module has none (the fact's
    ``[ -s ... ]`` then falls back to rocm-smi)."""
    (value,) = lines("amd/sys-module-amdgpu-version-dkms.txt")
    assert run(amd.RocmDriverVersion, [f"{amd.SYSFS_DRIVER_MARK}{value}"]).driver == "6.19.14.31400000"
    (missing,) = lines("amd/sys-module-amdgpu-version-inbox.txt")
    assert "No such file or directory" in missing and "[ -s /sys/module/amdgpu/version ]" in amd.RocmDriverVersion(
        ).command()
    sim = run(amd.AmdSmiVersion, simulated("usr/bin/amd-smi", ["version"], tmp_path, "mi355x"))
    assert re.fullmatch(r"\d+(\.\d+)+", sim.amdgpu or "") and re.fullmatch(r"\d+(\.\d+)+", sim.rocm or "")
