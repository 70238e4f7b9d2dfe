"""Preflight's output for people, rendered from an 18-tray GB300 rack's facts: all passing fits a screen, folded to
one line per check; a failing check stands first with what was observed, required and the fix; ``--all`` shows
every host's rows; nothing is wider than 100 columns (or the terminal, where narrower) and no check name is broken."""

from __future__ import annotations

import io
import re

import pytest

from helpers import FIXTURES
from k3deploy.cli.preflight import WIDTH, render
from k3deploy.facts.host import AddressInterface, ContainerRuntime, DiskSpace, Ipv4Address, KernelRelease
from k3deploy.facts.rdma import DmabufSupport, LoadedModules, RdmaDevice, RdmaPort
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.base import HostFacts
from k3deploy.preflight.report import PreflightReport, check
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors.nvidia.checks import NvidiaFacts
from k3deploy.vendors.nvidia.facts import (
    Imex,
    ImexDomainState,
    ImexNode,
    NvidiaContainerToolkit,
    NvidiaGpu,
    NvidiaGpus,
    NvlinkFabric,
)

TRAYS = 18
GIB = 2**30


def recorded(name: str) -> list[str]:
    """A real command output under tests/fixtures/, as a fact reads it (with the exit status line)."""
    return [*(FIXTURES / name).read_text().splitlines(), "K3_EXIT=0"]


def tray(name: str, address: str, domain: list[str], gpus: list[NvidiaGpu] | None) -> NvidiaFacts:
    """A GB300 tray: its GPUs, fabric, toolkit and IMEX from the recorded outputs; the rest as a healthy tray has
    it (docker 28, 800 GiB for images, 3 TiB for the weights, four InfiniBand GPU NICs, the 6.14-nvidia kernel)."""
    space = DiskSpace("/var/lib", "/dev/nvme0n1p2", 6000 * GIB, 3000 * GIB, "/")
    return NvidiaFacts(
        host=name, address=address, kernel=KernelRelease("6.14.0-1007-nvidia-64k", (6, 14, 0)),
        runtime=ContainerRuntime("docker", "28.3.2", ["io.containerd.runc.v2", "nvidia", "runc"]),
        disk_images=space, disk_cache=space, shm=DiskSpace("/dev/shm", "tmpfs", 64 * GIB, 64 * GIB, "/dev/shm"),
        interface=AddressInterface(address, "eth0", "eth0", [Ipv4Address("eth0", address, 24)]),
        rdma=[RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand", 4096)]) for i in range(4)],
        modules=LoadedModules(["ib_core", "nvidia"]),
        dmabuf=DmabufSupport("6.14.0-1007-nvidia-64k", True, True, True, True, [], "25.04-0.6.1"),
        gpus=gpus or NvidiaGpus().process(recorded("nvidia/query-gpu-gb300.txt")),
        toolkit=NvidiaContainerToolkit().process(recorded("nvidia/nvidia-ctk-version.txt")),
        fabric=NvlinkFabric().process(recorded("nvidia/smi-q-gb300-completed.txt")),
        imex=Imex().process(recorded("nvidia/imex-active.txt")),
        imex_domain=ImexDomainState("UP", [ImexNode(i, a, "READY", "580.95", ["C"] * len(domain))
                                           for i, a in enumerate(domain)]),
    )


def rack(tray5_gpus: list[NvidiaGpu] | None = None) -> PreflightReport:
    """The preflight of 18 GB300 trays in one NVLink domain; ``tray5_gpus``: what tray 5's nvidia-smi lists."""
    addresses = [f"10.77.0.{11 + i}" for i in range(TRAYS)]
    hosts: list[HostFacts] = [tray(f"gb300-{i:02d}", a, addresses, tray5_gpus if i == 5 else None)
                              for i, a in enumerate(addresses)]
    need = Requirements(hardware=hardware()["gb300"], variant="default", vram_minimum_gb=1680, nodes=TRAYS,
                        multi_node=True, strategy="multi_node_tp")
    return check(need, hosts)


def shown(report: PreflightReport, width: int = WIDTH, every_row: bool = False) -> list[str]:
    from rich.console import Console

    out = io.StringIO()
    render(report, Console(file=out, width=width, color_system=None), {}, every_row)
    return out.getvalue().splitlines()


def test_eighteen_passing_trays_fit_a_screen_one_line_per_check():
    report = rack()
    assert report.ok
    lines = shown(report)
    assert len(lines) <= 40, "\n".join(lines)
    assert max(len(line) for line in lines) <= WIDTH
    checks = list(dict.fromkeys(r.check for r in report.results))
    folded = [line for line in lines if line.startswith("PASS")]
    assert [line.split()[1] for line in folded] == checks          # every check once, whole, in order
    assert all(re.search(r"\bon 18 nodes\b", line) for line in folded if "gpu.memory" not in line)
    assert lines[-1].startswith(f"18 host(s), {len(report.results)} checks: {len(report.results)} passed")


def test_a_failing_check_stands_first_with_observed_required_and_fix():
    bad = [NvidiaGpu("NVIDIA GB300", 284208, "570.86.15") for _ in range(4)]
    report = rack(bad)
    lines = shown(report)
    first = next(i for i, line in enumerate(lines) if re.match(r"(FAIL|WARN|PASS)\b", line))
    assert lines[first].split() == ["FAIL", "nvidia.driver", "gb300-05"]
    (failure,) = report.failures()
    assert lines[first + 1].split() == ["observed", "570.86.15"]
    assert lines[first + 2].split() == ["required", *failure.required.split()]
    fix = " ".join(line.strip() for line in lines[first + 3:first + 6]).removeprefix("fix").split()
    assert fix[:len(failure.fix.split())] == failure.fix.split()     # the whole fix, wrapped under its label
    assert any(re.search(r"PASS\s+nvidia\.driver\s+on 17 of 18 nodes", line) for line in lines)
    assert "failed: gb300-05" in lines[-1]
    assert max(len(line) for line in lines) <= WIDTH


@pytest.mark.parametrize("width", [80, WIDTH])
def test_all_shows_every_row_and_never_breaks_a_check_name(width):
    report = rack()
    lines = shown(report, width=width, every_row=True)
    assert max(len(line) for line in lines) <= width
    names = {r.check for r in report.results}
    rows = [line.split() for line in lines if line.startswith("PASS")]
    assert len(rows) == len(report.results)                       # every host's every row
    assert {row[1] for row in rows} == names                      # each name whole on its row
    assert {(row[1], row[2]) for row in rows} == {(r.check, r.host) for r in report.results}


def test_json_is_the_report_unchanged():
    """``--json`` prints :meth:`PreflightReport.to_dict`: every host's every row, as before the folded view."""
    data = rack().to_dict()
    assert sum(len(h["results"]) for h in data["hosts"].values()) + len(data["cluster"]) == len(rack().results)
