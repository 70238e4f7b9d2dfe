"""AMD facts: ROCm/amdgpu versions (``amd-smi version``, ``rocm-smi --showdriverversion``) and GPUs."""

from __future__ import annotations

import re
from dataclasses import dataclass

from k3deploy.facts.base import EXIT_MARK, SECTION_MARK, Jsonable, K3Fact, Unparsable, sections

ROCM_HINT = "is the amdgpu driver with ROCm SMI (amd-smi / rocm-smi) installed?"


@dataclass(frozen=True)
class AmdSmiVersions(Jsonable):
    tool: str | None
    library: str | None
    rocm: str | None  # None: no host ROCm userspace ("ROCm version: N/A")
    amdgpu: str | None


def _value(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text)
    if not match:
        return None
    value = match.group(1).strip()
    return None if value in ("N/A", "") else value


def parse_amd_smi_version(lines: list[str]) -> AmdSmiVersions:
    """``amd-smi version`` (leading ERROR lines tolerated).

    >>> parse_amd_smi_version(["AMDSMI Tool: 26.0.2+39589fda | AMDSMI Library version: 26.0.2 | "
    ...     "ROCm version: 7.0.2 | amdgpu version: 6.14.14 | amd_hsmp version: N/A"]).rocm
    '7.0.2'
    """
    for line in lines:
        if "AMDSMI Tool:" in line or "ROCm version:" in line:
            return AmdSmiVersions(
                tool=_value(r"AMDSMI Tool:\s*([^\s|]+)", line),
                library=_value(r"AMDSMI Library version:\s*([^\s|]+)", line),
                rocm=_value(r"ROCm version:\s*([^\s|]+)", line),
                amdgpu=_value(r"amdgpu version:\s*([^\s|]+)", line),
            )
    raise Unparsable("no 'AMDSMI Tool' / 'ROCm version' line")


class AmdSmiVersion(K3Fact[AmdSmiVersions]):
    """ROCm userspace and amdgpu driver versions from ``amd-smi version``.

    ``AMDSMI Tool: 26.0.2+39589fda | AMDSMI Library version: 26.0.2 | ROCm version: 7.0.2 |
    amdgpu version: 6.14.14`` → ``AmdSmiVersions(rocm='7.0.2', amdgpu='6.14.14', ...)``.
    """

    tool = required_binary = "amd-smi"
    hint = ROCM_HINT
    shown_command = "amd-smi version"


    def parse(self, lines: list[str]) -> AmdSmiVersions:
        return parse_amd_smi_version(lines)


@dataclass(frozen=True)
class RocmDriver(Jsonable):
    driver: str


def parse_rocm_driver(lines: list[str]) -> RocmDriver:
    """``rocm-smi --showdriverversion``: ``Driver version: 6.7.0`` → ``RocmDriver(driver='6.7.0')``.

    >>> parse_rocm_driver(["===== ROCm System Management Interface =====", "Driver version: 6.7.0"])
    RocmDriver(driver='6.7.0')
    """
    for line in lines:
        match = re.search(r"Driver version:\s*(\S+)", line)
        if match:
            return RocmDriver(driver=match.group(1))
    raise Unparsable("no 'Driver version' line")


class RocmDriverVersion(K3Fact[RocmDriver]):
    """amdgpu kernel driver version (``rocm-smi --showdriverversion``): ``Driver version: 6.7.0``."""

    tool = required_binary = "rocm-smi"
    hint = ROCM_HINT
    shown_command = "rocm-smi --showdriverversion"


    def parse(self, lines: list[str]) -> RocmDriver:
        return parse_rocm_driver(lines)


@dataclass(frozen=True)
class AmdGpu(Jsonable):
    index: int
    vram_bytes: int | None
    name: str | None


_VRAM_RE = re.compile(r"GPU\[(\d+)\]\s*:\s*VRAM Total Memory \(B\):\s*(\d+)")
_SERIES_RE = re.compile(r"GPU\[(\d+)\]\s*:\s*Card Series:\s*(.+?)\s*$")


def parse_amd_gpus(lines: list[str]) -> list[AmdGpu]:
    """Sections ``vram`` (``rocm-smi --showmeminfo vram``) and ``name`` (``--showproductname``).

    >>> parse_amd_gpus(["K3_SECTION=vram", "GPU[0]\\t\\t: VRAM Total Memory (B): 309237645312",
    ...                 "K3_SECTION=name", "GPU[0]\\t\\t: Card Series: \\t\\tAMD Instinct MI355X"])
    [AmdGpu(index=0, vram_bytes=309237645312, name='AMD Instinct MI355X')]
    """
    parts = sections(lines)
    vram: dict[int, int] = {}
    for line in parts.get("vram", []):
        match = _VRAM_RE.search(line)
        if match:
            vram[int(match.group(1))] = int(match.group(2))
    names: dict[int, str] = {}
    for line in parts.get("name", []):
        match = _SERIES_RE.search(line)
        if match:
            names[int(match.group(1))] = match.group(2)
    indices = sorted(set(vram) | set(names))
    if not indices:
        raise Unparsable("no 'GPU[N] : VRAM Total Memory (B)' lines")
    return [AmdGpu(index=i, vram_bytes=vram.get(i), name=names.get(i)) for i in indices]


class AmdGpus(K3Fact[list[AmdGpu]]):
    """AMD GPUs with total VRAM (bytes) and product series, from ``rocm-smi``.

    ``GPU[0] : VRAM Total Memory (B): 309237645312`` + ``GPU[0] : Card Series: AMD Instinct MI355X``
    → ``AmdGpu(index=0, vram_bytes=309237645312, name='AMD Instinct MI355X')``.
    """

    tool = required_binary = "rocm-smi"
    hint = ROCM_HINT
    shown_command = "rocm-smi --showmeminfo vram; rocm-smi --showproductname"

    def command(self) -> str:
        return (
            f"echo {SECTION_MARK}vram; rocm-smi --showmeminfo vram 2>&1; "
            f"echo {SECTION_MARK}name; rocm-smi --showproductname 2>&1; echo {EXIT_MARK}0"
        )

    def parse(self, lines: list[str]) -> list[AmdGpu]:
        return parse_amd_gpus(lines)
