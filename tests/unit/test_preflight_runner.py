"""The preflight runner and CLI: pyinfra inventories (@fake hosts scripted with real outputs, @local on this
CPU machine, an unreachable SSH host), exit codes, JSON, and the one-shot local capture."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import FAKE_HOSTS, FIXTURES, ROOT, k3

FIX = FIXTURES
GIB = 1024**3


def fixture(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


def imex_domain(addresses: list[str]) -> list[str]:
    """``nvidia-imex-ctl -N`` of a formed domain of these trays: the real 2-node output
    (``nvidia/imex-ctl-N-2-nodes-570.00.txt``) with its node lines and table rewritten for the trays."""
    real = fixture("nvidia/imex-ctl-N-2-nodes-570.00.txt")
    head = real[:real.index("Nodes:") + 1]
    nodes = [f"Node #{i:<3} - {a:<15} - READY" for i, a in enumerate(addresses)]
    table = [" Nodes From\\To  " + "  ".join(str(i) for i in range(len(addresses)))]
    table += [f"{i:>8}        " + "  ".join("C" for _ in addresses) for i in range(len(addresses))]
    return [*head, *nodes, "", *table, "Domain State: UP"]


TRAYS = [f"10.77.0.{11 + i}" for i in range(3)]


def responses(address: str, fabric: str = "nvidia/smi-q-gb300-completed.txt") -> dict[str, list[str]]:
    """@fake answers for every fact command of a GB300 tray (first matching substring wins)."""
    ok = ["K3_EXIT=0"]
    return {
        "K3_SECTION=kernel": ["K3_SECTION=kernel", "6.14.0-1007-nvidia-64k", "K3_SECTION=nvidia",
                              fixture("nvidia/proc-version-open-aarch64.txt")[0], "K3_SECTION=kconfig",
                              "CONFIG_DMA_SHARED_BUFFER=y", "K3_SECTION=mlx5", "loaded", "25.04-0.6.1", *ok],
        "nvidia-smi --query-gpu": fixture("nvidia/query-gpu-gb300.txt") + ok,
        "nvidia-smi -q": fixture(fabric) + ok,
        "nvidia-ctk --version": fixture("nvidia/nvidia-ctk-version.txt") + ok,
        "systemctl is-active nvidia-imex": fixture("nvidia/imex-active.txt") + ok,
        "nvidia-imex-ctl -N": imex_domain(TRAYS) + ok,
        # a tray's four GPU NICs (one per GPU): the one-HCA fixture, renamed mlx5_0..mlx5_3
        "ibv_devinfo": [line.replace("mlx5_0", f"mlx5_{i}") for i in range(4)
                        for line in fixture("rdma/ibv_devinfo-mlx5_0.txt")] + ok,
        "lsmod": fixture("rdma/lsmod-peermem.txt") + ok,
        "/proc/driver/nvidia/version": fixture("nvidia/proc-version-open-aarch64.txt") + ok,
        "uname -r": ["6.14.0-1007-nvidia-64k", *ok],
        "docker version": ["K3_SECTION=version", "28.3.2", "K3_SECTION=runtimes", "io.containerd.runc.v2 nvidia runc",
                           *ok],
        "p=/dev/shm": ["K3_PATH=/dev/shm", "Filesystem 1-blocks Used Available Capacity Mounted on",
                       f"tmpfs {256 * GIB} 0 {256 * GIB} 0% /dev/shm", *ok],
        "df -P -B1": ["K3_PATH=/var/lib", "Filesystem 1-blocks Used Available Capacity Mounted on",
                      f"/dev/nvme0n1p2 {7000 * GIB} {1000 * GIB} {6000 * GIB} 15% /", *ok],
        "ip -o -4 addr show": [f"K3_ADDR={address}", "1: lo    inet 127.0.0.1/8 scope host lo",
                               f"2: enP6p3s0f0np0    inet {address}/24 brd 10.77.0.255 scope global enP6p3s0f0np0",
                               "K3_SECTION=route", "default via 10.77.0.1 dev enP6p3s0f0np0", *ok],
    }


def write_fake_inventory(tmp_path: Path, bad_fabric_on: int | None = None, **data: object) -> Path:
    hosts = []
    for i in range(3):
        address = f"10.77.0.{11 + i}"
        fabric = "nvidia/smi-q-gb300-in-progress.txt" if i == bad_fabric_on else "nvidia/smi-q-gb300-completed.txt"
        hosts.append([f"@fake/gb300-{i}", {"k3_ip": address, "fake_delay": 0, "fake_delay_jitter": 0,
                                           "fake_responses": responses(address, fabric), **data}])
    (tmp_path / "hosts.json").write_text(json.dumps(hosts))
    inventory = tmp_path / "fake_gb300.py"
    inventory.write_text(
        FAKE_HOSTS + "import json\nfrom pathlib import Path\n"
        "trays = ([tuple(h) for h in json.loads((Path(__file__).parent / 'hosts.json').read_text())],\n"
        "         {'k3_hardware': 'gb300', 'k3_strategy': 'multi_node_tp'})\n"
    )
    return inventory


def main_in_process(capsys, *args: str) -> tuple[int, str, str]:
    from k3deploy.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


# ------------------------------------------------------------------------------- @fake cluster


def test_fake_gb300_trays_all_pass_in_process(tmp_path):
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import PREFLIGHT

    report = gather(str(write_fake_inventory(tmp_path)), PREFLIGHT).preflight
    assert report is not None
    bad = [(r.host, r.check, r.observed) for r in report.results if r.status != "pass"]
    assert bad == [] and report.exit_code == 0
    assert report.settings["@fake/gb300-1"].env["NCCL_SOCKET_IFNAME"] == "=enP6p3s0f0np0"
    assert report.settings["@fake/gb300-1"].env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert report.settings["@fake/gb300-1"].env["NCCL_MNNVL_ENABLE"] == "1"


def test_k3_ib_hca_in_the_inventory_names_the_rdma_ports_and_a_wrong_name_fails_preflight(tmp_path):
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import PREFLIGHT

    report = gather(str(write_fake_inventory(tmp_path, k3_ib_hca="mlx5_0")), PREFLIGHT).preflight
    assert report is not None and report.exit_code == 0
    settings = report.settings["@fake/gb300-1"]
    assert (settings.env["NCCL_IB_HCA"], settings.reasons["NCCL_IB_HCA"]) == ("=mlx5_0:1", "k3_ib_hca")
    wrong = gather(str(write_fake_inventory(tmp_path, k3_ib_hca="mlx5_7:1")), PREFLIGHT).preflight
    assert wrong is not None and wrong.exit_code == 1
    assert {(r.host, r.check) for r in wrong.results if r.status == "fail"} == {
        (f"@fake/gb300-{i}", "rdma.devices") for i in range(3)}


def test_fake_tray_with_fabric_in_progress_fails_alone_via_cli_json(tmp_path):
    proc = k3("preflight", str(write_fake_inventory(tmp_path, bad_fabric_on=2)), "--json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["failed_hosts"] == ["@fake/gb300-2"]
    failed = [(h, r["check"]) for h, v in data["hosts"].items() for r in v["results"] if r["status"] == "fail"]
    assert failed == [("@fake/gb300-2", "nvlink.fabric")]
    assert data["hosts"]["@fake/gb300-0"]["ok"] and not data["hosts"]["@fake/gb300-2"]["ok"]
    assert data["selection"] == {"hardware": "gb300", "strategy": "multi_node_tp", "variant": "default",
                                 "nodes": 3, "vram_minimum_gb": 1680.0}
    assert data["hosts"]["@fake/gb300-1"]["facts"]["gpus"][0]["name"] == "NVIDIA GB300"


# ------------------------------------------------------------------------------------ @local


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_local_cpu_machine_fails_clearly_naming_the_missing_driver():
    proc = k3("preflight", "@local", "--hardware", "h200")
    assert proc.returncode == 1
    # the table wraps long cells: the message's start and end are on separate lines of its cell
    assert "nvidia-smi not found on @local" in proc.stdout and "NVIDIA driver installed?" in proc.stdout
    assert "nvidia.driver" in proc.stdout and "FAIL" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "failed: @local" in proc.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_local_json_and_unreachable_host_in_an_inventory_file(tmp_path):
    inventory = tmp_path / "mixed.py"
    inventory.write_text(
        "nodes = ([('@local', {}), ('badnode', {'ssh_hostname': '127.0.0.1', 'ssh_port': 1})],\n"
        "         {'k3_hardware': 'h200'})\n"
    )
    proc = k3("preflight", str(inventory), "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    data = json.loads(proc.stdout)
    assert data["hosts"]["badnode"]["reachable"] is False
    assert "Could not connect" in data["hosts"]["badnode"]["error"]
    assert [r["check"] for r in data["hosts"]["badnode"]["results"]] == ["host.reachable"]
    local = {r["check"]: r for r in data["hosts"]["@local"]["results"]}
    assert local["nvidia.driver"]["status"] == "fail"
    assert local["nvidia.driver"]["observed"] == "nvidia-smi not found on @local: is the NVIDIA driver installed?"
    assert data["hosts"]["@local"]["facts"]["gpus"]["kind"] == "absent"


@pytest.mark.parametrize(
    "args, message",
    [
        (["@local"], "k3_hardware is not set"),
        (["@local", "--hardware", "b900"], "unknown hardware 'b900'"),
        (["@local", "--hardware", "h200", "--variant", "fp2"], "unknown variant 'fp2'"),
        (["@local", "--hardware", "h200", "--strategy", "warp"], "unknown strategy 'warp'"),
        (["no-such-inventory.py", "--hardware", "h200"], "inventory 'no-such-inventory.py' not found"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message, capsys):
    code, out, err = main_in_process(capsys, "preflight", *args)
    assert code == 2
    assert err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and out == ""


def test_broken_inventory_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "broken.py"
    bad.write_text("nodes = [\n")
    code, _, err = main_in_process(capsys, "preflight", str(bad), "--hardware", "h200")
    assert code == 2 and "cannot load inventory" in err and "Traceback" not in err


def test_hosts_that_disagree_on_hardware_exit_2(tmp_path, capsys):
    inv = tmp_path / "two.py"
    inv.write_text("nodes = [('@fake/a', {'k3_hardware': 'h200'}), ('@fake/b', {'k3_hardware': 'b200'})]\n")
    code, _, err = main_in_process(capsys, "preflight", str(inv))
    assert code == 2 and "hosts disagree on k3_hardware" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------- local capture


def test_local_capture_prints_raw_and_parsed_for_every_fact(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "k3deploy.preflight.runner", "--local", "--json",
                           "--save", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    from k3deploy.preflight.runner import CAPTURE_FACTS

    assert len(data["facts"]) == len(CAPTURE_FACTS)
    kernel = data["facts"]["KernelVersion"]
    assert kernel["stdout"][-1] == "K3_EXIT=0" and kernel["parsed"]["release"] == kernel["stdout"][0]
    shm = data["facts"]["ShmSize"]["parsed"]
    assert shm["mount"] == "/dev/shm" and shm["size_bytes"] > 0
    assert (tmp_path / "KernelVersion.out").read_text().startswith(kernel["stdout"][0])
    if shutil.which("nvidia-smi") is None:
        assert data["facts"]["NvidiaGpus"]["present"] is False
        assert data["facts"]["NvidiaGpus"]["parsed"]["kind"] == "absent"


def test_facts_work_with_the_pyinfra_fact_command():
    proc = subprocess.run([sys.executable, "-m", "pyinfra", "@local", "fact", "k3deploy.facts.host.KernelVersion",
                           "k3deploy.vendors.nvidia.facts.NvidiaGpus", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["k3deploy.facts.host.KernelVersion"]["@local"]["release"]
    gpus = data["k3deploy.vendors.nvidia.facts.NvidiaGpus"]["@local"]
    assert isinstance(gpus, list) if shutil.which("nvidia-smi") else gpus["kind"] == "absent"


def test_k3_ib_hca_in_group_vars_reaches_every_host(tmp_path):
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import PREFLIGHT

    inventory = write_fake_inventory(tmp_path)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("k3_ib_hca: mlx5_0\n")
    report = gather(str(inventory), PREFLIGHT).preflight
    assert report is not None and report.exit_code == 0
    assert {h: (s.env["NCCL_IB_HCA"], s.reasons["NCCL_IB_HCA"]) for h, s in report.settings.items()} == {
        f"@fake/gb300-{i}": ("=mlx5_0:1", "k3_ib_hca") for i in range(3)}
