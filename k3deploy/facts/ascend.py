"""Huawei Ascend facts: NPUs (``npu-smi info``), driver/firmware/CANN versions, bind-mounted paths."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from k3deploy.facts.base import EXIT_MARK, SECTION_MARK, Jsonable, K3Fact, Unparsable, sections

NPU_HINT = "is the Ascend driver (HDK) with npu-smi installed?"
_BUS_ID_RE = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_USAGE_RE = re.compile(r"(\d+)\s*/\s*(\d+)")


@dataclass(frozen=True)
class NpuChip(Jsonable):
    npu: int
    chip: int
    name: str
    health: str
    bus_id: str
    hbm_used_mb: int | None
    hbm_total_mb: int | None


@dataclass(frozen=True)
class NpuInfo(Jsonable):
    version: str | None
    chips: list[NpuChip] = field(default_factory=list)


def parse_npu_smi(lines: list[str]) -> NpuInfo:
    """Parse the ``npu-smi info`` table: one :class:`NpuChip` per row with a Bus-Id (A3: 16 dies).

    >>> info = parse_npu_smi([
    ...  "| npu-smi 25.3.rc1                 Version: 25.3.rc1                                             |",
    ...  "| 0     Ascend910           | OK            | 166.6       37                0    / 0             |",
    ...  "| 0     0                   | 0000:9D:00.0  | 0           0    / 0          3150 / 65536         |"])
    >>> info.version, info.chips[0].name, info.chips[0].hbm_total_mb
    ('25.3.rc1', 'Ascend910', 65536)
    """
    version = None
    chips: list[NpuChip] = []
    pending: tuple[int, str, str] | None = None  # (npu id, name, health) of the last NPU row
    for line in lines:
        text = line.strip()
        if "Process id" in text:
            break
        match = re.search(r"Version:\s*(\S+)", text)
        if match and version is None:
            version = match.group(1)
            continue
        if not text.startswith("|"):
            continue
        cells = [cell.strip() for cell in text.strip("|").split("|")]
        if len(cells) < 3:
            continue
        first = cells[0].split()
        if not first or not first[0].isdigit():
            continue
        if _BUS_ID_RE.match(cells[1]):
            if pending is None:
                raise Unparsable("chip row without an NPU row before it")
            npu, name, health = pending
            usages = _USAGE_RE.findall(cells[2])
            used, total = (int(usages[-1][0]), int(usages[-1][1])) if usages else (None, None)
            chips.append(
                NpuChip(
                    npu=npu,
                    chip=int(first[0]),
                    name=name,
                    health=health,
                    bus_id=cells[1],
                    hbm_used_mb=used,
                    hbm_total_mb=total,
                )
            )
        elif len(first) >= 2 and not first[1].isdigit():
            pending = (int(first[0]), " ".join(first[1:]), cells[1])
    if not chips:
        raise Unparsable("no NPU chip rows with a Bus-Id")
    return NpuInfo(version=version, chips=chips)


class NpuSmiInfo(K3Fact[NpuInfo]):
    """Ascend NPU dies from ``npu-smi info``: name, health, Bus-Id, HBM in MB.

    ``| 0     Ascend910 | OK | ...`` + ``| 0     0 | 0000:9D:00.0 | ... 3150 / 65536 |`` →
    ``NpuChip(npu=0, chip=0, name='Ascend910', health='OK', hbm_total_mb=65536, ...)``.
    ``dcmi module initialize failed. ret is -8005`` → ``FactError(kind='failed')``.
    """

    tool = required_binary = "npu-smi"
    hint = NPU_HINT
    shown_command = "npu-smi info"


    def parse(self, lines: list[str]) -> NpuInfo:
        return parse_npu_smi(lines)


ASCEND_MOUNTED_PATHS = (
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64",
)


@dataclass(frozen=True)
class AscendVersionInfo(Jsonable):
    driver: str | None  # package_version, else Version, of driver/version.info
    firmware: str | None
    cann: str | None  # host CANN toolkit (optional: the image ships CANN)
    missing_paths: list[str] = field(default_factory=list)


def parse_key_values(lines: list[str]) -> dict[str, str]:
    """``key=value`` lines (version.info / ascend_toolkit_install.info)."""
    values: dict[str, str] = {}
    for line in lines:
        if "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def parse_ascend_versions(lines: list[str]) -> AscendVersionInfo:
    """Sections ``driver``, ``firmware``, ``cann`` (``key=value`` files) and ``paths``.

    >>> parse_ascend_versions(["K3_SECTION=driver", "Version=25.3.rc1", "package_version=25.3.rc1",
    ...     "K3_SECTION=firmware", "Version=7.7.0.1.231", "K3_SECTION=cann", "version=8.5.0",
    ...     "K3_SECTION=paths", "missing /usr/local/dcmi"])
    AscendVersionInfo(driver='25.3.rc1', firmware='7.7.0.1.231', cann='8.5.0', missing_paths=['/usr/local/dcmi'])
    """
    parts = sections(lines)
    if "paths" not in parts:
        raise Unparsable("no paths section")
    driver = parse_key_values(parts.get("driver", []))
    firmware = parse_key_values(parts.get("firmware", []))
    cann = parse_key_values(parts.get("cann", []))
    missing = [line.split(None, 1)[1].strip() for line in parts["paths"] if line.startswith("missing ")]
    return AscendVersionInfo(
        driver=driver.get("package_version") or driver.get("Version"),
        firmware=firmware.get("Version"),
        cann=cann.get("version"),
        missing_paths=missing,
    )


class AscendVersions(K3Fact[AscendVersionInfo]):
    """Ascend driver, firmware and host CANN versions from their ``version.info`` files, and which of
    the paths the vllm-ascend container bind-mounts are missing.

    ``package_version=25.3.rc1`` → ``driver='25.3.rc1'``; ``Version=7.7.0.1.231`` (firmware);
    ``version=8.5.0`` (``ascend_toolkit_install.info``) → ``cann='8.5.0'``.
    """

    tool = "Ascend version.info"
    hint = NPU_HINT
    shown_command = "cat /usr/local/Ascend/driver/version.info"

    def command(self) -> str:
        arch = "$(uname -m)"
        cann = (
            f"/usr/local/Ascend/ascend-toolkit/latest/{arch}-linux/ascend_toolkit_install.info "
            f"/usr/local/Ascend/cann/{arch}-linux/ascend_toolkit_install.info"
        )
        paths = " ".join(ASCEND_MOUNTED_PATHS)
        return (
            f"echo {SECTION_MARK}driver; cat /usr/local/Ascend/driver/version.info 2>/dev/null; "
            f"echo {SECTION_MARK}firmware; cat /usr/local/Ascend/firmware/version.info 2>/dev/null; "
            f"echo {SECTION_MARK}cann; for f in {cann}; do if [ -r \"$f\" ]; then cat \"$f\"; break; fi; done; "
            f"echo {SECTION_MARK}paths; for p in {paths}; do if [ -e \"$p\" ]; then echo \"present $p\"; "
            f"else echo \"missing $p\"; fi; done; echo {EXIT_MARK}0"
        )

    def parse(self, lines: list[str]) -> AscendVersionInfo:
        return parse_ascend_versions(lines)
