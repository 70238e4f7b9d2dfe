"""Fact parsers and fact classes against real command outputs kept in tests/fixtures/."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import FIXTURES, read
from k3deploy.facts import host, rdma
from k3deploy.facts.base import FactError, split_exit, version_at_least, version_key
from k3deploy.vendors.amd import facts as amd
from k3deploy.vendors.ascend import facts as ascend
from k3deploy.vendors.nvidia import facts as nvidia

FIX = FIXTURES


def lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


def run(fact_cls, output: list[str], status: int = 0):
    """What pyinfra hands to process(): the wrapped command's stdout, ending with the exit status."""
    return fact_cls().process([*output, f"K3_EXIT={status}"])


# ------------------------------------------------------------------------------- versions


def test_versions_compare_as_integers_not_strings():
    assert "580.126.09" < "580.65.06"  # the trap
    assert version_at_least("580.126.09", "580.65.06")
    assert not version_at_least("570.124.06", "580.65.06")
    assert version_at_least("580.65.06", "580.65.06")
    assert not version_at_least("580.65.05", "580.65.06")
    assert version_key("25.3.rc1") == (25, 3)
    assert not version_at_least("25.3.rc1", "25.5")
    assert version_at_least("26.0.rc1", "25.5")


def test_split_exit():
    assert split_exit(["a", "K3_EXIT=9", ""]) == (["a"], 9)
    assert split_exit(["a"]) == (["a"], None)


# ------------------------------------------------------------------------------ nvidia-smi

SAMPLES = {
    "h100": ("NVIDIA H100 80GB HBM3", 81559, "580.126.09", 8),
    "h200": ("NVIDIA H200", 143771, "580.126.09", 8),
    "b200": ("NVIDIA B200", 183359, "580.126.09", 8),
    "b300": ("NVIDIA B300 SXM6 AC", 275040, "580.95.05", 8),
    "gb200": ("NVIDIA GB200", 189471, "580.95.05", 4),
    "gb300": ("NVIDIA GB300", 284208, "580.95.05", 4),
}


def test_gpu_query_every_documented_sample_line():
    gpus = nvidia.parse_gpu_query(lines("nvidia/query-gpu-samples.txt"))
    assert [(g.name, g.memory_mib, g.driver) for g in gpus] == [v[:3] for v in SAMPLES.values()]


@pytest.mark.parametrize("model", sorted(SAMPLES))
def test_gpu_query_per_machine(model):
    name, mib, driver, count = SAMPLES[model]
    gpus = run(nvidia.NvidiaGpus, lines(f"nvidia/query-gpu-{model}.txt"))
    assert len(gpus) == count
    assert {(g.name, g.memory_mib, g.driver) for g in gpus} == {(name, mib, driver)}


def test_gpu_query_nounits_and_na_fields():
    gpus = run(nvidia.NvidiaGpus, lines("nvidia/query-gpu-h200-nounits.txt"))
    assert {g.memory_mib for g in gpus} == {143771}
    mig = run(nvidia.NvidiaGpus, lines("nvidia/query-gpu-mig-na.txt"))
    assert [(g.memory_mib, g.driver) for g in mig] == [(None, "580.126.09"), (None, None)]


def test_gpu_query_mixed_models_are_kept_apart():
    gpus = run(nvidia.NvidiaGpus, lines("nvidia/query-gpu-mixed.txt"))
    assert [g.name for g in gpus] == ["NVIDIA GB300"] * 3 + ["NVIDIA GB200"]


def test_gpu_query_driver_not_loaded_is_a_failed_fact_with_the_message():
    value = run(nvidia.NvidiaGpus, lines("nvidia/no-driver.txt"), status=9)
    assert isinstance(value, FactError) and value.kind == "failed" and value.exit_code == 9
    assert value.first_line.startswith("NVIDIA-SMI has failed because it couldn't communicate")
    msg = value.message("10.77.0.12")
    assert "10.77.0.12" in msg and "exit 9" in msg and "couldn't communicate" in msg


def test_gpu_query_no_devices_is_an_empty_list_whatever_the_exit_status():
    assert run(nvidia.NvidiaGpus, lines("nvidia/no-devices.txt"), status=6) == []
    assert run(nvidia.NvidiaGpus, lines("nvidia/no-devices.txt"), status=0) == []


def test_gpu_query_garbage_is_a_parse_error_naming_command_and_first_line():
    value = run(nvidia.NvidiaGpus, lines("nvidia/garbage.txt"))
    assert isinstance(value, FactError) and value.kind == "unparsable"
    msg = value.message("node1")
    assert "nvidia-smi --query-gpu=driver_version,name,memory.total,count" in msg
    assert "Segmentation fault (core dumped)" in msg


def test_missing_tool_is_absent_with_a_hint():
    # what pyinfra returns when requires_command is missing on the host
    value = nvidia.NvidiaGpus().default()
    assert value.kind == "absent"
    assert value.message("10.77.0.12") == "nvidia-smi not found on 10.77.0.12: is the NVIDIA driver installed?"
    # the shell's own "not found" (exit 127) gives the same
    shell = run(nvidia.NvidiaGpus, ["sh: 1: nvidia-smi: not found"], status=127)
    assert shell.kind == "absent" and shell.tool == "nvidia-smi"


def test_hanging_tool_is_stopped_and_reported():
    value = run(nvidia.NvidiaGpus, [], status=124)
    assert value.kind == "failed"
    assert value.message("n1").endswith("did not finish within 60 s on n1: the tool hangs")
    assert nvidia.NvidiaGpus().command().startswith("timeout 60 nvidia-smi ")


def test_cut_short_output_is_a_parse_error():
    value = nvidia.NvidiaGpus().process(["580.126.09, NVIDIA H200, 143771 MiB, 8"])
    assert isinstance(value, FactError) and value.kind == "unparsable"


# --------------------------------------------------------------------------- driver flavour


@pytest.mark.parametrize(
    "name, flavour, version",
    [
        ("proc-version-open.txt", "open", "580.105.08"),
        ("proc-version-open-aarch64.txt", "open", "580.95.05"),
        ("proc-version-proprietary.txt", "proprietary", "580.95.05"),
        ("modinfo-license-open.txt", "open", None),
        ("modinfo-license-proprietary.txt", "proprietary", None),
    ],
)
def test_driver_flavour(name, flavour, version):
    value = run(nvidia.NvidiaDriverFlavour, lines(f"nvidia/{name}"))
    assert (value.flavour, value.version) == (flavour, version)


def test_driver_flavour_absent_and_garbage():
    absent = run(nvidia.NvidiaDriverFlavour, ["K3_ABSENT=nvidia kernel module"])
    assert absent.kind == "absent" and "is the NVIDIA driver installed?" in absent.message("n1")
    missing_module = run(nvidia.NvidiaDriverFlavour, ["modinfo: ERROR: Module nvidia not found."], status=1)
    assert missing_module.kind == "absent"
    assert run(nvidia.NvidiaDriverFlavour, ["GPL"]).kind == "unparsable"


def test_container_toolkit():
    assert run(nvidia.NvidiaContainerToolkit, lines("nvidia/nvidia-ctk-version.txt")).version == "1.17.8"
    assert run(nvidia.NvidiaContainerToolkit, ["hello"]).kind == "unparsable"


# ---------------------------------------------------------------------- Fabric Manager / IMEX


def test_fabric_manager_and_imex():
    fm = run(nvidia.FabricManager, lines("nvidia/fabricmanager-active.txt"))
    assert (fm.service, fm.version) == ("active", "580.126.09")
    down = run(nvidia.FabricManager, ["K3_SECTION=state", "inactive", "K3_SECTION=version",
                                      "sh: 1: nv-fabricmanager: not found"])
    assert (down.service, down.version) == ("inactive", None)
    imex = run(nvidia.Imex, lines("nvidia/imex-active.txt"))
    assert (imex.service, imex.channels, imex.major) == ("active", ["channel0"], 234)
    nosystemd = run(nvidia.Imex, ["K3_SECTION=state", "System has not been booted with systemd as init system "
                                  "(PID 1). Can't operate.", "K3_SECTION=channels", "K3_SECTION=devices"])
    assert nosystemd.service == "unknown" and nosystemd.channels == [] and "PID 1" in nosystemd.detail


# ------------------------------------------------------------------------------- IMEX domain


def test_imex_domain_18_trays_570_172():
    d = run(nvidia.ImexDomain, lines("nvidia/imex-ctl-N-18-nodes-570.172.txt"))
    assert (d.domain_state, len(d.nodes), d.timestamp) == ("UP", 18, "5/4/2026 06:08:10.580")
    assert (d.nodes[10].index, d.nodes[10].address, d.nodes[10].status, d.nodes[10].version) == (
        10, "172.31.54.95", "READY", "570.172")
    assert all(n.links == ["C"] * 18 for n in d.nodes) and d.formed and d.not_connected() == []


def test_imex_domain_2_trays_570_00_without_version_column():
    d = run(nvidia.ImexDomain, lines("nvidia/imex-ctl-N-2-nodes-570.00.txt"))
    assert [(n.address, n.status, n.version, n.links) for n in d.nodes] == [
        ("10.136.206.47", "READY", None, ["C", "C"]), ("10.136.206.48", "READY", None, ["C", "C"])]
    assert d.formed


def _degraded(text: str) -> str:
    """The real 18-tray output with node 17 gone: what its peers show (UNAVAILABLE, its row I, its column N)."""
    out = text.replace("172.31.56.47    - READY               ", "172.31.56.47    - UNAVAILABLE         ")
    out = out.replace("Domain State: UP", "Domain State: DEGRADED")
    rows = out.splitlines()
    for i, row in enumerate(rows):
        if row.startswith("      17        "):
            rows[i] = "      17        " + "I   " * 17 + "I"
        elif row.rstrip().endswith("C") and row[:8].strip().isdigit():
            rows[i] = row.rstrip()[:-1] + "N"
    return "\n".join(rows)


def test_imex_domain_degraded_names_the_peer_and_the_links():
    d = run(nvidia.ImexDomain, _degraded((FIX / "nvidia/imex-ctl-N-18-nodes-570.172.txt").read_text()).splitlines())
    assert d.domain_state == "DEGRADED" and not d.formed
    assert d.nodes[17].status == "UNAVAILABLE"
    bad = {(a.index, b.index if b else None, code) for a, b, code in d.not_connected()}
    assert (0, 17, "N") in bad and (17, 0, "I") in bad and len(bad) == 17 + 18


def test_imex_domain_errors():
    assert run(nvidia.ImexDomain, ["Nodes:"]).kind == "unparsable"
    assert run(nvidia.ImexDomain, lines("nvidia/garbage.txt")).kind == "unparsable"
    failed = run(nvidia.ImexDomain, ["Connection refused"], status=255)
    assert (failed.kind, failed.exit_code, failed.first_line) == ("failed", 255, "Connection refused")
    assert nvidia.ImexDomain().requires_command() == "nvidia-imex-ctl"
    assert nvidia.ImexDomain().default().kind == "absent"
    torn = lines("nvidia/imex-ctl-N-2-nodes-570.00.txt")
    torn[-2] = "       1        C"
    assert run(nvidia.ImexDomain, torn).kind == "unparsable"


# ------------------------------------------------------------------------------- NVLink fabric


def test_fabric_gb300_completed():
    gpus = run(nvidia.NvlinkFabric, lines("nvidia/smi-q-gb300-completed.txt"))
    assert len(gpus) == 4 and all(g.completed and g.has_cluster for g in gpus)
    assert {g.cluster_uuid for g in gpus} == {"9f3c1a52-6b7e-4c1d-8e2f-3a4b5c6d7e8f"}
    assert {g.clique_id for g in gpus} == {"32766"} and {g.health for g in gpus} == {"Healthy"}
    assert [g.gpu for g in gpus][:2] == ["00000008:06:00.0", "00000009:06:00.0"]


def test_fabric_in_progress_gpu_is_reported():
    gpus = run(nvidia.NvlinkFabric, lines("nvidia/smi-q-gb300-in-progress.txt"))
    bad = [g for g in gpus if not g.completed]
    assert [(g.gpu, g.state, g.status, g.has_cluster) for g in bad] == [
        ("00000018:06:00.0", "In Progress", None, False)]


def test_fabric_pcie_na_and_excerpt():
    (gpu,) = run(nvidia.NvlinkFabric, lines("nvidia/smi-q-pcie-na.txt"))
    assert (gpu.state, gpu.status, gpu.clique_id, gpu.cluster_uuid) == (None, None, None, None)
    (excerpt,) = run(nvidia.NvlinkFabric, lines("nvidia/smi-q-fabric-excerpt.txt"))
    assert excerpt.gpu == "0" and not excerpt.completed
    (hgx,) = run(nvidia.NvlinkFabric, lines("nvidia/smi-q-hgx-completed.txt"))
    assert hgx.completed and not hgx.has_cluster


def test_fabric_old_driver_without_block_and_garbage():
    assert run(nvidia.NvlinkFabric, lines("nvidia/smi-q-no-fabric-block.txt")) == []
    assert run(nvidia.NvlinkFabric, ["random text"]).kind == "unparsable"


# ------------------------------------------------------------------------------------ RDMA


def test_ibv_devinfo_documented_sample():
    (dev,) = run(rdma.RdmaDevices, lines("rdma/ibv_devinfo-mlx5_0.txt"))
    assert (dev.name, dev.fw_ver, dev.node_guid, dev.transport) == (
        "mlx5_0", "20.39.2048", "b859:9f03:00ca:e2f8", "InfiniBand (0)")
    assert [(p.port, p.state, p.link_layer, p.active_mtu) for p in dev.ports] == [
        (1, "PORT_ACTIVE", "InfiniBand", 4096)]


def test_ibv_devinfo_several_devices_and_ports():
    devs = run(rdma.RdmaDevices, lines("rdma/ibv_devinfo-multi.txt"))
    got = [(d.name, p.port, p.state, p.link_layer) for d in devs for p in d.ports]
    assert got == [
        ("mlx5_0", 1, "PORT_ACTIVE", "InfiniBand"),
        ("mlx5_1", 1, "PORT_ACTIVE", "InfiniBand"),
        ("mlx5_1", 2, "PORT_DOWN", "InfiniBand"),
        ("rocep1s0f0", 1, "PORT_ACTIVE", "Ethernet"),
    ]


def test_ibv_devinfo_none_and_down():
    assert run(rdma.RdmaDevices, lines("rdma/ibv_devinfo-none.txt"), status=255) == []
    (dev,) = run(rdma.RdmaDevices, lines("rdma/ibv_devinfo-down.txt"))
    assert not any(p.active for p in dev.ports)
    assert run(rdma.RdmaDevices, ["\tport:\t1"]).kind == "unparsable"


def test_ibv_devinfo_ports_get_their_network_interface_from_sysfs():
    # the netdev section follows ibv_devinfo's own output in the fact's one command
    out = [*lines("rdma/ibv_devinfo-multi.txt"), "K3_SECTION=netdev", "mlx5_0 1 -", "mlx5_1 1 -", "mlx5_1 2 -",
           "rocep1s0f0 1 enp1s0f0np0"]
    devs = run(rdma.RdmaDevices, out)
    assert [(d.name, p.port, p.netdev) for d in devs for p in d.ports] == [
        ("mlx5_0", 1, None), ("mlx5_1", 1, None), ("mlx5_1", 2, None), ("rocep1s0f0", 1, "enp1s0f0np0")]
    command = rdma.RdmaDevices().command()
    assert "/sys/class/infiniband/" in command and "gid_attrs/ndevs/0" in command
    # a missing ibv_devinfo is still "absent", whatever the netdev section says
    missing = rdma.RdmaDevices().process(["sh: 1: ibv_devinfo: not found", "K3_SECTION=netdev", "K3_EXIT=127"])
    assert isinstance(missing, FactError) and missing.kind == "absent"


def test_kernel_modules_lsmod_and_proc_modules():
    assert "nvidia_peermem" in run(rdma.KernelModules, lines("rdma/lsmod-peermem.txt"))
    assert "nvidia_peermem" in run(rdma.KernelModules, lines("rdma/proc-modules.txt"))
    assert "nvidia_peermem" not in run(rdma.KernelModules, ["Module  Size  Used by", "nvidia 1 0"])
    assert run(rdma.KernelModules, ["K3_ABSENT=lsmod"]).kind == "absent"


OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.105.08  Release Build"
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 2025"


@pytest.mark.parametrize(
    "kernel, nvrm, kconfig, mlx5, met",
    [
        ("6.8.0-45-generic", OPEN, "CONFIG_DMA_SHARED_BUFFER=y", ["loaded", "24.10-1.1.4"], True),
        ("6.8.0-45-generic", OPEN, None, ["loaded"], True),  # inbox mlx5_ib (no version), no /boot/config
        ("5.4.0-150-generic", OPEN, None, ["loaded"], False),  # kernel < 5.12
        ("6.8.0-45-generic", OPEN, "# CONFIG_DMA_SHARED_BUFFER is not set", ["loaded"], False),  # no dma-buf
        ("6.8.0-45-generic", PROPRIETARY, None, ["loaded"], False),  # proprietary modules
        ("6.8.0-45-generic", "", None, ["loaded"], None),  # no NVIDIA module loaded: unknown
        ("6.8.0-45-generic", OPEN, None, ["absent"], None),  # mlx5_ib not loaded
        ("6.8.0-45-generic", OPEN, None, [], None),  # neither lsmod nor /proc/modules answered
        ("6.8.0-45-generic", "Dual MIT/GPL", None, ["loaded"], True),  # modinfo license when /proc is not readable
        ("6.8.0-45-generic", "NVIDIA", None, ["loaded"], False),
    ],
)
def test_dmabuf_prerequisites(kernel, nvrm, kconfig, mlx5, met):
    out = ["K3_SECTION=kernel", kernel, "K3_SECTION=nvidia"]
    out += [nvrm] if nvrm else []
    out += ["K3_SECTION=kconfig"] + ([kconfig] if kconfig else []) + ["K3_SECTION=mlx5", *mlx5]
    value = run(rdma.DmabufPrerequisites, out)
    assert value.prerequisites_met is met
    assert bool(value.reasons) is (met is not True)
    assert value.mlx5_version == ("24.10-1.1.4" if len(mlx5) > 1 else None)


def test_dmabuf_prerequisites_ignore_the_hosts_libibverbs():
    """NCCL registers memory through the image's rdma-core, so a host library without ibv_reg_dmabuf_mr (the old
    check's verbs section) says nothing any more."""
    out = ["K3_SECTION=kernel", "6.8.0-45-generic", "K3_SECTION=nvidia", OPEN, "K3_SECTION=verbs",
           "/usr/lib/x86_64-linux-gnu/libibverbs.so.1 no", "K3_SECTION=mlx5", "loaded"]
    assert run(rdma.DmabufPrerequisites, out).prerequisites_met is True
    assert "libibverbs" not in rdma.DmabufPrerequisites().command()


# ------------------------------------------------------------------------------------- host


def test_df_and_shm_from_real_output():
    shm = run(host.ShmSize, ["K3_PATH=/dev/shm", *lines("host/df-dev-shm.txt")])
    assert shm.mount == "/dev/shm" and shm.size_bytes > 0 and shm.filesystem == "tmpfs"
    disk = run(host.DiskFree, ["K3_PATH=/var/lib", *lines("host/df-var-lib.txt")])
    assert disk.path == "/var/lib" and disk.available_bytes <= disk.size_bytes
    assert run(host.DiskFree, ["K3_PATH=/x", "df: /x: No such file or directory"], status=1).kind == "failed"


def test_df_measures_nearest_existing_parent(tmp_path):
    command = host.DiskFree().command(path=str(tmp_path / "not" / "yet"))
    import subprocess

    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout.splitlines()
    value = read(host.DiskFree().process(out))
    assert value.path == str(tmp_path) and value.available_bytes > 0


def test_image_store_is_measured_in_dockers_root_dir(tmp_path):
    import os
    import subprocess

    root = tmp_path / "docker-root"
    root.mkdir()
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "docker").write_text(f"#!/bin/sh\necho {root}\n")
    (stub / "docker").chmod(0o755)
    env = dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}")
    out = subprocess.run(["sh", "-c", host.ImageStoreFree().command()], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert read(host.ImageStoreFree().process(out)).path == str(root)
    (stub / "docker").write_text("#!/bin/sh\nexit 1\n")  # daemon down: Docker's default root
    out = subprocess.run(["sh", "-c", host.ImageStoreFree().command()], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert "/var/lib/docker".startswith(read(host.ImageStoreFree().process(out)).path)


def test_ip_addr_finds_the_interface_of_an_address():
    addr = lines("host/ip-o-4-addr.txt")
    route = lines("host/ip-route-default.txt")
    eth = next(line for line in addr if " lo " not in line)
    address = eth.split()[3].split("/")[0]
    value = run(host.InterfaceForAddress, [f"K3_ADDR={address}", *addr, "K3_SECTION=route", *route])
    assert value.interface == eth.split()[1] and value.default_interface == eth.split()[1]
    missing = run(host.InterfaceForAddress, ["K3_ADDR=10.99.0.1", *addr, "K3_SECTION=route", *route])
    assert missing.interface is None
    veth = run(host.InterfaceForAddress, ["K3_ADDR=10.77.0.12",
                                          "5: eth0@if6    inet 10.77.0.12/24 brd 10.77.0.255 scope global eth0"])
    assert veth.interface == "eth0"


def test_interface_fact_only_sends_literal_addresses_to_the_host():
    with pytest.raises(ValueError):
        host.InterfaceForAddress().command(address="10.0.0.1; rm -rf /")


def test_kernel_and_docker():
    assert run(host.KernelVersion, lines("host/uname-r.txt")).version[0] >= 3
    assert run(host.KernelVersion, ["6.8.0-45-generic"]).version == (6, 8, 0)
    up = run(host.DockerRuntime, ["K3_SECTION=version", "28.3.2", "K3_SECTION=runtimes",
                                  "io.containerd.runc.v2 nvidia runc "])
    assert up.server_version == "28.3.2" and "nvidia" in up.runtimes
    down = run(host.DockerRuntime, ["K3_SECTION=version", "Cannot connect to the Docker daemon at "
                                    "unix:///var/run/docker.sock. Is the docker daemon running?", "K3_SECTION=runtimes"])
    assert down.server_version is None and down.error.startswith("Cannot connect")


# -------------------------------------------------------------------------------------- AMD


def test_amd_smi_versions():
    new = run(amd.AmdSmiVersion, lines("amd/amd-smi-version-7.txt"))
    assert (new.rocm, new.amdgpu, new.tool) == ("7.0.2", "6.14.14", "26.0.2+39589fda")
    old = run(amd.AmdSmiVersion, lines("amd/amd-smi-version-6.txt"))
    assert (old.rocm, old.amdgpu) == ("6.2.0", None)
    na = run(amd.AmdSmiVersion, lines("amd/amd-smi-version-na.txt"))
    assert (na.rocm, na.amdgpu) == (None, None)


def test_rocm_smi_driver_and_memory():
    assert run(amd.RocmDriverVersion, lines("amd/rocm-smi-driverversion.txt")).driver == "6.7.0"
    gpus = run(amd.AmdGpus, ["K3_SECTION=vram", *lines("amd/rocm-smi-meminfo-mi355x.txt"), "K3_SECTION=name"])
    assert len(gpus) == 8 and {g.vram_bytes for g in gpus} == {309237645312}
    assert round(gpus[0].vram_bytes / 1024**3) == 288
    assert run(amd.AmdGpus, ["K3_SECTION=vram", "nothing here"]).kind == "unparsable"


def smi_names(name: str) -> list[str]:
    """``AmdGpus`` output on a host whose sysfs shows no AMD card (a container): rocm-smi's sections only."""
    return ["K3_SECTION=sysfs", "K3_SECTION=vram", "K3_SECTION=name", *lines(name)]


def test_rocm_smi_product_names_are_read_in_either_case_as_amd_publishes_them():
    mi250 = run(amd.AmdGpus, smi_names("amd/rocm-smi-productname-mi250-rocm5.txt"))  # ROCm 5: "Card series"
    assert [g.name for g in mi250] == ["AMD INSTINCT MI250 (MCM) OAM AC MBA"] * 2
    (mi300x,) = run(amd.AmdGpus, smi_names("amd/rocm-smi-productname-mi300x.txt"))  # ROCm 6: "Card Series"
    assert mi300x.name == "AMD Instinct MI300X OAM"


def test_rocm_smi_prints_an_unknown_product_as_its_pci_device_id():
    (gpu,) = run(amd.AmdGpus, smi_names("amd/rocm-smi-productname-unknown-name.txt"))
    assert (gpu.name, gpu.device_id) == (None, "0x740f")


def test_amd_gpus_are_read_from_sysfs_on_a_host_without_rocm_smi():
    gpus = run(amd.AmdGpus, lines("amd/sysfs-drm-mi300x.txt"))
    assert [(g.index, g.device_id, g.vram_bytes, g.name) for g in gpus] == [
        (i, "0x74a1", 206158430208, "AMD Instinct MI300X OAM") for i in range(8)]
    nameless = run(amd.AmdGpus, lines("amd/sysfs-drm-mi355x-no-product-name.txt"))
    assert {(g.device_id, g.vram_bytes, g.name) for g in nameless} == {("0x75a3", 309237645312, None)}
    # rocm-smi fills in the name sysfs does not give
    both = lines("amd/sysfs-drm-mi355x-no-product-name.txt")[:-1] + [
        "K3_SECTION=name", "GPU[0]\t\t: Card Series: \t\tAMD Instinct MI355X"]
    assert {g.name for g in run(amd.AmdGpus, both)} == {"AMD Instinct MI355X"}


def test_amd_gpus_are_absent_only_without_amd_cards_in_sysfs_and_without_rocm_smi():
    value = run(amd.AmdGpus, ["K3_SECTION=sysfs", "K3_SECTION=nosmi"])
    assert value.kind == "absent" and "amdgpu" in value.message("mi-0")
    command = amd.AmdGpus().command()
    assert "/sys/class/drm/card" in command and "0x1002" in command
    assert amd.AmdGpus().requires_command() is None  # a host with only amdgpu-dkms still answers


def test_rocm_driver_is_the_amdgpu_module_version_from_sysfs_without_rocm_smi():
    assert run(amd.RocmDriverVersion, ["K3_AMDGPU_MODULE=6.10.5"]).driver == "6.10.5"
    assert run(amd.RocmDriverVersion, ["K3_ABSENT=rocm-smi"], status=127).kind == "absent"
    assert amd.RocmDriverVersion().requires_command() is None
    assert "/sys/module/amdgpu/version" in amd.RocmDriverVersion().command()


# ----------------------------------------------------------------------------------- Ascend


def test_npu_smi_documented_excerpt():
    info = run(ascend.NpuSmiInfo, lines("ascend/npu-smi-info-excerpt.txt"))
    assert info.version == "25.3.rc1"
    assert [(c.npu, c.chip, c.name, c.health, c.bus_id, c.hbm_total_mb) for c in info.chips] == [
        (0, 0, "Ascend910", "OK", "0000:9D:00.0", 65536),
        (0, 1, "Ascend910", "OK", "0000:9F:00.0", 65536),
    ]


def test_npu_smi_full_a3_table_has_16_dies_and_ignores_process_table():
    info = run(ascend.NpuSmiInfo, lines("ascend/npu-smi-info-a3.txt"))
    assert len(info.chips) == 16
    assert sorted({c.npu for c in info.chips}) == list(range(8))
    assert sum(c.hbm_total_mb for c in info.chips) / 1024 == 1024


def test_npu_smi_a2_layout_and_failure():
    info = run(ascend.NpuSmiInfo, lines("ascend/npu-smi-info-a2.txt"))
    assert [(c.name, c.health) for c in info.chips] == [("910B3", "OK"), ("910B3", "Warning")]
    failed = run(ascend.NpuSmiInfo, lines("ascend/npu-smi-dcmi-failed.txt"), status=255)
    assert failed.kind == "failed" and "dcmi module initialize failed" in failed.message("a3-0")


def test_ascend_version_files():
    out = ["K3_SECTION=driver", *lines("ascend/driver-version.info"),
           "K3_SECTION=firmware", *lines("ascend/firmware-version.info"),
           "K3_SECTION=cann", *lines("ascend/ascend_toolkit_install.info"),
           "K3_SECTION=paths", "present /etc/ascend_install.info", "missing /usr/local/dcmi"]
    value = run(ascend.AscendVersions, out)
    assert (value.driver, value.firmware, value.cann) == ("25.3.rc1", "7.7.0.1.231", "8.5.0")
    assert value.missing_paths == ["/usr/local/dcmi"]


def test_ascend_mounted_paths_come_from_the_container_spec():
    """The paths the fact probes are the engine unit's own -v sources (hccn_tool included), not a second list;
    an empty directory (what docker -v leaves where a path was missing) is reported apart."""
    from k3deploy.model.units import ContainerSpec, container_argv
    from k3deploy.vendors.ascend import MOUNTS

    spec = ContainerSpec("k3-engine", "img", "npu", "/etc/k3.env", "/var/lib/k3deploy/cache", 16)
    argv = container_argv(spec, ["vllm", "serve", "m"])
    mounted = [argv[i + 1].split(":", 1)[0] for i, a in enumerate(argv) if a == "-v"]
    probed = ascend.ascend_mount_sources()
    assert probed == [m for m in mounted if m != spec.cache_dir] == [h for h, _ in MOUNTS]
    assert "/usr/local/Ascend/driver/tools/hccn_tool" in probed
    command = ascend.AscendVersions().command()
    assert all(p in command for p in probed)
    value = run(ascend.AscendVersions, ["K3_SECTION=paths", "present /usr/local/dcmi",
                                        "empty /usr/local/bin/npu-smi", "missing /etc/ascend_install.info"])
    assert (value.missing_paths, value.empty_paths) == (["/etc/ascend_install.info"], ["/usr/local/bin/npu-smi"])


def hccn_output(per_device: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for i, answers in enumerate(per_device):
        out.append(f"K3_NPU={i}")
        rc: dict[str, int] = answers.get("rc", {})
        for query in ascend.HCCN_QUERIES:
            out += [f"K3_HCCN={query}", *answers.get(query, []), f"K3_RC={rc.get(query, 0)}"]
    return out


def test_hccn_ports_from_a_real_a2_capture():
    """Eight NPUs of an A2 node as captured (link, net health, netdetect and gateway of each)."""
    link, health, detect = lines("ascend/hccn-link-a2.txt"), lines("ascend/hccn-net-health-a2.txt"), \
        lines("ascend/hccn-netdetect-a2.txt")
    gateways = lines("ascend/hccn-gateway-a2.txt")
    devices = [{"link": [link[0]], "net_health": [health[0]], "netdetect": [detect[0]], "gateway": [gw]}
               for gw in gateways]
    ports = run(ascend.HccnNetwork, hccn_output(devices))
    assert [p.device for p in ports] == list(range(8))
    assert all(p.healthy and p.netdetect == p.gateway == "11.12.165.1" and not p.errors for p in ports)


def test_hccn_port_down_errors_and_both_netdetect_spellings():
    devices: list[dict[str, Any]] = [
        {"link": ["link status: DOWN"], "net_health": ["net health status: Fault"],
         "netdetect": ["netdetect addr: 192.168.1.1"], "gateway": ["default gateway:192.168.1.1, Iface:eth0"]},
        {"link": ["link status: UP"], "net_health": ["net health status: Init"],
         "netdetect": ["Command execute failed!"], "gateway": ["Get gateway failed, because no gateway was preset there!"],
         "rc": {"netdetect": 247, "gateway": 247}},
        {"link": ["Get invalid device id."], "net_health": [], "rc": {"link": 1, "net_health": 1}},
    ]
    ports = run(ascend.HccnNetwork, hccn_output(devices))
    assert (ports[0].link, ports[0].net_health, ports[0].netdetect, ports[0].healthy) == ("DOWN", "Fault",
                                                                                        "192.168.1.1", False)
    assert (ports[1].net_health, ports[1].netdetect, ports[1].gateway) == ("Init", None, None)
    assert ports[1].errors == ["-netdetect: Command execute failed!",
                               "-gateway: Get gateway failed, because no gateway was preset there!"]
    assert ports[2].link is None and ports[2].errors[:2] == ["-link: Get invalid device id.",
                                                              "-net_health: no output (exit 1)"]
    assert run(ascend.HccnNetwork, ["K3_ABSENT=hccn_tool"], status=127).kind == "absent"
    assert run(ascend.HccnNetwork, ["K3_NPU=0", "K3_HCCN=link"], status=124).kind == "failed"  # the loop hung


def test_hccn_addresses_are_read_and_their_absence_is_no_port_error():
    devices = [{"link": ["link status: UP"], "net_health": ["net health status: Success"],
                "ip": lines("ascend/hccn-ip-a2.txt")[:2], "vnic": lines("ascend/hccn-vnic-a3.txt")},
               {"link": ["link status: UP"], "net_health": ["net health status: Success"],
                "ip": ["Command execute failed!"], "vnic": ["This device does not support this function."]}]
    ports = run(ascend.HccnNetwork, hccn_output(devices))
    assert ports[0].ip and ports[0].ip.count(".") == 3 and ports[0].vnic == "192.168.2.199"
    assert (ports[1].ip, ports[1].vnic) == (None, None)
    assert [e for p in ports for e in p.errors if e.startswith(("-ip", "-vnic"))] == []


def test_hccn_ping_answers_from_the_source_formats():
    """tool_ping_printf (-hccs_ping) and dsmi_ping_fun (-ping) of hccn_product_ext/tool_cmd.c, ds_net_ext.c."""
    out = ["K3_PING=3 hccs_ping 192.169.1.196", "device 3 PING 192.169.1.196", "",
           "This pkt ping success!", "recv seq 0, time = 3.125us, L1 plane check result = 0x0", "",
           "3 packets transmitted, 3 received, 0.00% packets loss", "max time 3.125us", "K3_RC=0",
           "K3_PING=4 hccs_ping 192.169.1.195", "device 4 PING 192.169.1.195", "",
           "3 packets transmitted, 0 received, 100.00% packets loss", "K3_RC=0",
           "K3_PING=5 ping 192.168.101.6", "device 5 PING 192.168.101.6", "3 packets transmitted, 3 received, "
           "0% packet loss", "K3_RC=0",
           "K3_PING=6 ping 192.168.101.7", "K3_RC=124",
           "K3_PING=7 hccs_ping 192.169.1.192", "PING IP header is invalid.", "K3_RC=1"]
    pings = run(ascend.HccnPing, out)
    assert [(p.device, p.method, p.ok) for p in pings] == [(3, "hccs_ping", True), (4, "hccs_ping", False),
                                                           (5, "ping", True), (6, "ping", False),
                                                           (7, "hccs_ping", False)]
    assert pings[1].shown == "3 packets transmitted, 0 received, 100.00% packets loss"
    assert pings[3].shown == f"no answer within {ascend.PING_TIMEOUT_S}s"
    assert pings[4].shown == "PING IP header is invalid."
    assert run(ascend.HccnPing, ["K3_ABSENT=hccn_tool"], status=127).kind == "absent"
    command = ascend.HccnPing().command([[0, "192.169.1.199", "192.168.101.1"], [1, "", "192.168.101.2"]])
    assert "-i 0 -hccs_ping -g address 192.169.1.199" in command and ascend.UNSUPPORTED in command
    assert "-i 0 -ping -g address 192.168.101.1" in command and "-i 1 -ping -g address 192.168.101.2" in command
    assert "-i 1 -hccs_ping" not in command


# ------------------------------------------------------------------------------ nvidia-smi topo -m


@pytest.mark.parametrize("name, gpus, near, far", [
    # H100 x8, 8 NICs each PIX to one GPU (spaces)
    ("topo-m-h100.txt", 8, [f"mlx5_{i}" for i in range(8)], []),
    # H200 with a bonded front-end/storage NIC: NODE to the first socket's GPUs, SYS to the others
    ("topo-m-h200-bond.txt", 8, ["mlx5_0", "mlx5_3", "mlx5_9"], ["mlx5_bond_0"]),
    # A100 x8 (tabs), 8 NICs two per PCIe switch (PXB), and a dual-port NIC no GPU reaches but through SYS
    ("topo-m-a100-tabs.txt", 8, [f"mlx5_{i}" for i in range(8)], ["mlx5_8", "mlx5_9"]),
])
def test_topo_matrix_from_real_output(name, gpus, near, far):
    topo = run(nvidia.GpuNicTopology, lines(f"nvidia/{name}"))
    assert len(topo.gpus) == gpus and topo.separates
    assert {n: topo.nearest(n) for n in near} == {n: topo.nearest(n) for n in near if topo.nearest(n) in ("PIX", "PXB")}
    assert all(topo.nearest(n) not in ("PIX", "PXB") for n in far)
    assert set(near + far) <= set(topo.nics)


def test_topo_matrix_of_a_grace_tray_tells_no_nic_apart():
    topo = run(nvidia.GpuNicTopology, lines("nvidia/topo-m-gb200.txt"))  # GB200: every NIC SYS from every GPU
    assert topo.gpus == ["GPU0", "GPU1", "GPU2", "GPU3"] and len(topo.nics) == 8
    assert {topo.nearest(n) for n in topo.nics} == {"SYS"} and not topo.separates


def test_topo_matrix_errors():
    assert run(nvidia.GpuNicTopology, ["garbage"]).kind == "unparsable"
    assert run(nvidia.GpuNicTopology, lines("nvidia/no-driver.txt"), status=9).kind == "failed"
    # an older nvidia-smi names the NIC columns by device and prints no NIC legend
    old = nvidia.parse_topo(["\tGPU0\tGPU1\tmlx5_0\tCPU Affinity", "GPU0\t X \tNV2\tPIX\t0-19", "GPU1\tNV2\t X \tSYS\t0-19"])
    assert old.nics == {"mlx5_0": ["PIX", "SYS"]}
