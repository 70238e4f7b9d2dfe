"""Huawei Ascend facts: NPUs (``npu-smi info``), driver/firmware/CANN versions, bind-mounted paths, the NPUs' network
ports (``hccn_tool``)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from k3deploy.facts.base import EXIT_MARK, FACT_TIMEOUT_S, SECTION_MARK, Jsonable, K3Fact, Unparsable, sections
from k3deploy.facts.health import (
    HEALTH_TOOL_TIMEOUT_S,
    QUARANTINE_SECTION,
    HealthReading,
    health_command,
    parse_quarantine,
)
from k3deploy.model.health import HealthEvent
from k3deploy.vendors.ascend import NPU_FATAL_STATES, PACK

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
    shown_command = PACK.command_of("ascend.driver")


    def parse(self, lines: list[str]) -> NpuInfo:
        return parse_npu_smi(lines)


def ascend_mount_sources() -> list[str]:
    """The host paths an Ascend engine container bind-mounts and the deploy does not create: the pack's driver
    mounts (:attr:`k3deploy.vendors.ascend.MOUNTS`, the list :func:`k3deploy.model.units.bind_mounts` writes)."""
    return [host for host, _ in PACK.container.mounts]


@dataclass(frozen=True)
class AscendVersionInfo(Jsonable):
    driver: str | None  # package_version, else Version, of driver/version.info
    firmware: str | None
    cann: str | None  # host CANN toolkit (optional: the image ships CANN)
    missing_paths: list[str] = field(default_factory=list)
    #: bind-mount sources that are empty directories: what ``docker run -v`` leaves where a path was missing
    empty_paths: list[str] = field(default_factory=list)


def parse_key_values(lines: list[str]) -> dict[str, str]:
    """``key=value`` lines (version.info / ascend_toolkit_install.info)."""
    values: dict[str, str] = {}
    for line in lines:
        if "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def parse_ascend_versions(lines: list[str]) -> AscendVersionInfo:
    """Sections ``driver``, ``firmware``, ``cann`` (``key=value`` files) and ``paths`` (``present``, ``missing``
    or ``empty`` and the path, one a line).

    >>> parse_ascend_versions(["K3_SECTION=driver", "Version=25.3.rc1", "package_version=25.3.rc1",
    ...     "K3_SECTION=firmware", "Version=7.7.0.1.231", "K3_SECTION=cann", "version=8.5.0",
    ...     "K3_SECTION=paths", "missing /usr/local/dcmi", "empty /usr/local/bin/npu-smi"])
    AscendVersionInfo(driver='25.3.rc1', firmware='7.7.0.1.231', cann='8.5.0', missing_paths=['/usr/local/dcmi'], ...)
    >>> _.empty_paths
    ['/usr/local/bin/npu-smi']
    """
    parts = sections(lines)
    if "paths" not in parts:
        raise Unparsable("no paths section")
    driver = parse_key_values(parts.get("driver", []))
    firmware = parse_key_values(parts.get("firmware", []))
    cann = parse_key_values(parts.get("cann", []))
    missing = [line.split(None, 1)[1].strip() for line in parts["paths"] if line.startswith("missing ")]
    empty = [line.split(None, 1)[1].strip() for line in parts["paths"] if line.startswith("empty ")]
    return AscendVersionInfo(
        driver=driver.get("package_version") or driver.get("Version"),
        firmware=firmware.get("Version"),
        cann=cann.get("version"),
        missing_paths=missing,
        empty_paths=empty,
    )


class AscendVersions(K3Fact[AscendVersionInfo]):
    """Ascend driver, firmware and host CANN versions from their ``version.info`` files, and which of
    the host paths the engine container bind-mounts (``paths``; default: :func:`ascend_mount_sources`) are missing
    or empty directories.

    ``package_version=25.3.rc1`` → ``driver='25.3.rc1'``; ``Version=7.7.0.1.231`` (firmware);
    ``version=8.5.0`` (``ascend_toolkit_install.info``) → ``cann='8.5.0'``.
    """

    tool = "Ascend version.info"
    hint = NPU_HINT
    shown_command = PACK.command_of("ascend.versions")

    def command(self, paths: list[str] | None = None) -> str:
        arch = "$(uname -m)"
        cann = (
            f"/usr/local/Ascend/ascend-toolkit/latest/{arch}-linux/ascend_toolkit_install.info "
            f"/usr/local/Ascend/cann/{arch}-linux/ascend_toolkit_install.info"
        )
        listed = " ".join(shlex.quote(p) for p in (ascend_mount_sources() if paths is None else paths))
        return (
            f"echo {SECTION_MARK}driver; cat /usr/local/Ascend/driver/version.info 2>/dev/null; "
            f"echo {SECTION_MARK}firmware; cat /usr/local/Ascend/firmware/version.info 2>/dev/null; "
            f"echo {SECTION_MARK}cann; for f in {cann}; do if [ -r \"$f\" ]; then cat \"$f\"; break; fi; done; "
            f"echo {SECTION_MARK}paths; for p in {listed}; do if [ ! -e \"$p\" ]; then echo \"missing $p\"; "
            f"elif [ -d \"$p\" ] && [ -z \"$(ls -A \"$p\" 2>/dev/null)\" ]; then echo \"empty $p\"; "
            f"else echo \"present $p\"; fi; done; echo {EXIT_MARK}0"
        )

    def parse(self, lines: list[str]) -> AscendVersionInfo:
        return parse_ascend_versions(lines)



# ------------------------------------------------------------------------------ NPU network ports (hccn_tool)

#: where the Ascend driver installs hccn_tool (not on PATH by default)
HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
#: what vllm-ascend's multi-node guides read on each NPU before a multi-node start, in this order
HCCN_QUERIES = ("link", "net_health", "netdetect", "gateway", "ip", "vnic")
#: read for the cross-node ping only: an answer without its line is not an error of the port
_ADDRESS_QUERIES = ("ip", "vnic")
NPU_MARK = "K3_NPU="
QUERY_MARK = "K3_HCCN="
RC_MARK = "K3_RC="

_NETDETECT_RE = re.compile(r"^netdetect addr(?:ess)?:\s*(\S+)")
_GATEWAY_RE = re.compile(r"^(?:default )?gateway:\s*([^\s,]+)")
_IP_RE = re.compile(r"^ipaddr:\s*(\S+)")
_VNIC_RE = re.compile(r"^vnic ipaddr:\s*(\S+)")


@dataclass(frozen=True)
class NpuPort(Jsonable):
    """The network port of one NPU as ``hccn_tool -i N -link/-net_health/-netdetect/-gateway -g`` reports it;
    None where the tool answered no such line (``errors`` then says what it printed)."""

    device: int
    link: str | None = None           # UP | DOWN
    net_health: str | None = None     # Success | Socket fail | Receive timeout | Unreachable | Time exceeded |
    #                                   Fault | Init | Thread error | Detect ip set | Unknown
    netdetect: str | None = None      # the address the port probes for its net health
    gateway: str | None = None
    errors: list[str] = field(default_factory=list)  # "-gateway: Get gateway failed, because no gateway ..."
    ip: str | None = None             # the port's RoCE address (-ip -g): what -ping reaches
    vnic: str | None = None           # the die's VNIC address (-vnic -g, A3): what -hccs_ping reaches

    @property
    def healthy(self) -> bool:
        return self.link == "UP" and self.net_health == "Success"


def parse_hccn_answer(port: NpuPort, query: str, lines: list[str], rc: int | None) -> NpuPort:
    """Fold one query's output into ``port``.

    >>> p = parse_hccn_answer(NpuPort(0), "link", ["link status: DOWN"], 0)
    >>> parse_hccn_answer(p, "net_health", ["net health status: Receive timeout"], 0)
    NpuPort(device=0, link='DOWN', net_health='Receive timeout', netdetect=None, gateway=None, errors=[], ...)
    >>> parse_hccn_answer(NpuPort(1), "gateway", ["Get gateway failed, because no gateway was preset there!"], 247)
    NpuPort(device=1, link=None, net_health=None, netdetect=None, gateway=None, errors=['-gateway: Get ...'], ...)
    """
    text = [line.strip() for line in lines if line.strip()]
    found: str | None = None
    for line in text:
        if query == "link" and line.startswith("link status:"):
            found = line.split(":", 1)[1].strip()
        elif query == "net_health" and line.startswith("net health status:"):
            found = line.split(":", 1)[1].strip()
        elif query == "netdetect" and (m := _NETDETECT_RE.match(line)):
            found = m.group(1)
        elif query == "gateway" and (m := _GATEWAY_RE.match(line)):
            found = m.group(1)
        elif query == "ip" and (m := _IP_RE.match(line)):
            found = m.group(1)
        elif query == "vnic" and (m := _VNIC_RE.match(line)):
            found = m.group(1)
        if found is not None:
            break
    if found is None and query in _ADDRESS_QUERIES:
        return port
    if found is None:
        shown = text[0][:160] if text else f"no output (exit {rc})"
        return replace(port, errors=[*port.errors, f"-{query}: {shown}"])
    if query == "link":
        return replace(port, link=found)
    if query == "net_health":
        return replace(port, net_health=found)
    if query == "netdetect":
        return replace(port, netdetect=found)
    if query == "ip":
        return replace(port, ip=found)
    if query == "vnic":
        return replace(port, vnic=found)
    return replace(port, gateway=found)


def parse_hccn(lines: list[str]) -> list[NpuPort]:
    """``K3_NPU=<id>`` opens a device, ``K3_HCCN=<query>`` one of its answers, ``K3_RC=<status>`` closes it."""
    ports: list[NpuPort] = []
    query: str | None = None
    answer: list[str] = []
    for line in lines:
        s = line.strip()
        if s.startswith(NPU_MARK):
            ports.append(NpuPort(int(s[len(NPU_MARK):])))
        elif s.startswith(QUERY_MARK):
            query, answer = s[len(QUERY_MARK):], []
        elif s.startswith(RC_MARK):
            if not ports or query is None:
                raise Unparsable("an hccn_tool answer outside a device")
            rc = s[len(RC_MARK):]
            ports[-1] = parse_hccn_answer(ports[-1], query, answer, int(rc) if rc.isdigit() else None)
            query = None
        elif query is not None:
            answer.append(line)
    if not ports:
        raise Unparsable("no NPU in the output")
    return ports


class HccnNetwork(K3Fact[list[NpuPort]]):
    """The network port of every NPU (device ids ``0..devices-1``), as vllm-ascend's multi-node guides check them
    before a start: ``for i in {0..15}; do hccn_tool -i $i -link -g; ... -net_health -g; ... -netdetect -g;
    ... -gateway -g; done`` (A3: 16 NPU dies per node), and each port's addresses (``-ip -g``, ``-vnic -g``) for the
    cross-node ping (:class:`HccnPing`), in one command.

    ``link status: UP`` + ``net health status: Success`` + ``netdetect address: 11.12.165.1`` +
    ``default gateway:11.12.165.1, Iface:eth0`` → ``NpuPort(device=0, link='UP', net_health='Success',
    netdetect='11.12.165.1', gateway='11.12.165.1')``; hccn_tool missing → ``FactError(kind='absent')``.
    """

    tool = "hccn_tool"
    hint = f"is the Ascend driver (HDK) installed? it puts hccn_tool at {HCCN_TOOL}"
    shown_command = "hccn_tool -i N -link -g; hccn_tool -i N -net_health -g (N = 0..15)"

    def command(self, devices: int = 16) -> str:
        # hccn_tool from PATH where a site put it there, else where the driver installs it; "$0" in the loop
        queries = "; ".join(f'echo {QUERY_MARK}{q}; "$0" -i $i -{q} -g 2>&1; echo {RC_MARK}$?' for q in HCCN_QUERIES)
        loop = f"for i in $(seq 0 {max(0, int(devices) - 1)}); do echo {NPU_MARK}$i; {queries}; done"
        return (f"t=$(command -v hccn_tool || echo {HCCN_TOOL}); if [ -x \"$t\" ]; then "
                f"timeout {FACT_TIMEOUT_S} sh -c {shlex.quote(loop)} \"$t\" 2>&1; echo {EXIT_MARK}$?; "
                f"else echo K3_ABSENT=hccn_tool; echo {EXIT_MARK}127; fi")

    def parse(self, lines: list[str]) -> list[NpuPort]:
        return parse_hccn(lines)


# ------------------------------------------------------------------ cross-node NPU ping (second round)

PING_MARK = "K3_PING="
#: hccn_tool's answer on a mainboard that is not a SuperPoD one (-hccs_ping), from its source
UNSUPPORTED = "This device does not support this function."
_PING_SUMMARY_RE = re.compile(r"(\d+) packets transmitted, (\d+) received")
#: seconds one ping may take before it counts as unanswered (hccn_tool sends 3 packets at no interval by default:
#: PING_PACKET_NUM_DEFAULT, PING_PACKET_INTERVAL_MIN of the driver's dsmi_network_interface.h)
PING_TIMEOUT_S = 10
#: seconds a host's whole round may take: the pings it has not done by then are reported as not pinged
PING_ROUND_TIMEOUT_S = 2 * FACT_TIMEOUT_S


@dataclass(frozen=True)
class NpuPing(Jsonable):
    """One ping from NPU ``device`` to ``address`` (``method``: hccs_ping or ping): ``ok`` when every packet sent
    came back; ``shown`` is the summary line or the tool's first line."""

    device: int
    address: str
    method: str
    ok: bool
    shown: str


def parse_pings(lines: list[str]) -> list[NpuPing]:
    """``K3_PING=<dev> <method> <address>`` opens one ping's answer, ``K3_RC=<status>`` closes it.

    >>> parse_pings(["K3_PING=0 hccs_ping 192.169.1.199", "device 0 PING 192.169.1.199",
    ...              "3 packets transmitted, 3 received, 0.00% packets loss", "K3_RC=0"])
    [NpuPing(device=0, address='192.169.1.199', method='hccs_ping', ok=True, shown='3 packets transmitted, \
3 received, 0.00% packets loss')]
    """
    out: list[NpuPing] = []
    head: tuple[int, str, str] | None = None
    answer: list[str] = []
    for line in lines:
        s = line.strip()
        if s.startswith(PING_MARK):
            dev, method, address = s[len(PING_MARK):].split()
            head, answer = (int(dev), method, address), []
        elif s.startswith(RC_MARK) and head is not None:
            rc = s[len(RC_MARK):]
            summary = next((a for a in answer if _PING_SUMMARY_RE.search(a)), None)
            ok = False
            if summary is not None and (m := _PING_SUMMARY_RE.search(summary)):
                ok = int(m.group(1)) > 0 and m.group(1) == m.group(2)
            texts = [a for a in answer if a]
            shown = summary or (texts[0][:160] if texts else f"no output (exit {rc})")
            if rc == "124":
                shown = f"no answer within {PING_TIMEOUT_S}s"
            out.append(NpuPing(head[0], head[2], head[1], ok and rc == "0", shown))
            head = None
        elif head is not None and s:
            answer.append(s)
    return out


class HccnPing(K3Fact[list[NpuPing]]):
    """The second round of a multi-node Ascend preflight, once every host's NPU addresses are read
    (:class:`HccnNetwork`): from NPU i, ping NPU i of each other planned host, as vllm-ascend's large-scale EP guide
    does (``hccn_tool -i $i -hccs_ping -g address <peer VNIC address>`` on A3 SuperPoD mainboards), falling back to
    ``hccn_tool -i $i -ping -g address <peer -ip address>`` where the tool answers that the board does not support
    -hccs_ping. Same-index pairs only (what the RoCE plane connects: NPU i talks to NPU i of the other node), one
    command per host, in turn, each ping cut at ``PING_TIMEOUT_S`` and the round at ``PING_ROUND_TIMEOUT_S``.

    ``targets``: ``[device, vnic address or "", ip address or ""]`` per ping.
    """

    tool = "hccn_tool"
    hint = f"is the Ascend driver (HDK) installed? it puts hccn_tool at {HCCN_TOOL}"
    shown_command = "hccn_tool -i N -hccs_ping -g address <peer NPU N> (or -ping -g address <peer NPU N>)"

    def command(self, targets: list[list[Any]] | None = None) -> str:
        steps = []
        for dev, vnic, ip in targets or []:
            d, v, i = int(dev), shlex.quote(str(vnic or "")), shlex.quote(str(ip or ""))
            t = f"timeout {PING_TIMEOUT_S}"
            fallback = (f'echo {PING_MARK}{d} ping {i}; {t} "$0" -i {d} -ping -g address {i} 2>&1; '
                        f'echo {RC_MARK}$?')
            if vnic:
                steps.append(
                    f'o=$({t} "$0" -i {d} -hccs_ping -g address {v} 2>&1); r=$?; '
                    f'if printf "%s" "$o" | grep -q {shlex.quote(UNSUPPORTED)}'
                    + (f'; then {fallback}; ' if ip else '; then :; ')
                    + f'else echo {PING_MARK}{d} hccs_ping {v}; printf "%s\\n" "$o"; echo {RC_MARK}$r; fi')
            elif ip:
                steps.append(fallback)
        script = "; ".join(steps) or "true"
        return (f"t=$(command -v hccn_tool || echo {HCCN_TOOL}); if [ -x \"$t\" ]; then "
                f"timeout {PING_ROUND_TIMEOUT_S} sh -c {shlex.quote(script)} \"$t\" 2>&1; echo {EXIT_MARK}0; "
                f"else echo K3_ABSENT=hccn_tool; echo {EXIT_MARK}127; fi")

    def parse(self, lines: list[str]) -> list[NpuPing]:
        return parse_pings(lines)


# ------------------------------------------------------------------------------ hardware health

#: the chips whose Health in the ``npu-smi info`` table is not OK, one ``<npu id> <chip id>`` line each (an NPU row
#: ``| 0     Ascend910 | OK | ...`` is followed by its chip row: on A3 ``| 0     0 | 0000:9D:00.0 | ...``, chip and
#: Phy-ID, on A2 ``| 0                         | 0000:C1:00.0 | ...``, the chip id alone): only those are asked for
#: their error code, so a healthy node costs one npu-smi call
_NPU_CHIPS = ("npu-smi info | awk -F'|' 'NF > 3 { split($2, a, \" \"); "
              "if (a[1] ~ /^[0-9]+$/ && a[2] != \"\" && a[2] !~ /^[0-9]+$/) { npu = a[1]; h = $3; gsub(/ /, \"\", h) } "
              "else if (a[1] ~ /^[0-9]+$/ && (a[2] == \"\" || a[2] ~ /^[0-9]+$/) && h != \"\") { "
              "if (h != \"OK\") print npu, a[1]; h = \"\" } }'")
_NPU_CHIP_MARK = "K3_NPU="


def parse_npu_health(lines: list[str]) -> list[HealthEvent]:
    """``npu-smi info -t health -i N -c C`` for each chip not OK in the ``npu-smi info`` table, each answer after a
    ``K3_NPU=N C`` line: ``Health Status`` (OK, Warning, Alarm, Critical, UNKNOWN), ``Error Code`` and ``Error
    Information``. Warning is shown, not fatal.

    >>> out = parse_npu_health(["K3_NPU=3 0", "        Health Status                  : Critical",
    ...     "        Error Code                     : 80E18005", "        Error Information              : HBM ECC",
    ...     "K3_NPU=3 1", "        Health Status                  : OK"])
    >>> [(e.device, e.code, e.fatal) for e in out]
    [('NPU 3 chip 0', 'Critical 80E18005', True)]
    """
    events: list[HealthEvent] = []
    chips: list[tuple[str, dict[str, str]]] = []
    for raw in lines:
        line = raw.strip()
        if line.startswith(_NPU_CHIP_MARK):
            npu, _, chip = line[len(_NPU_CHIP_MARK):].partition(" ")
            chips.append((f"NPU {npu} chip {chip or '0'}", {}))
            continue
        key, sep, value = line.partition(":")
        if sep and chips:
            chips[-1][1][key.strip()] = value.strip()
    for device, fields in chips:
        state = fields.get("Health Status") or fields.get("Health")
        if state is None or state == "OK":
            continue
        code = fields.get("Error Code", "NA")
        text = "; ".join(f"{key} : {fields[key]}" for key in ("Health Status", "Error Code", "Error Information")
                         if key in fields)
        events.append(HealthEvent(device, "npu-health", state + ("" if code in ("NA", "") else f" {code}"), text,
                                  state in NPU_FATAL_STATES))
    return events


def parse_ascend_health(lines: list[str]) -> HealthReading:
    """The sections of :class:`AscendHealth`: ``npu`` and ``quarantine``."""
    parts = sections(lines)
    return HealthReading(tuple(parse_npu_health(parts.get("npu", []))),
                         parse_quarantine(parts.get(QUARANTINE_SECTION, [])))


class AscendHealth(K3Fact[HealthReading]):
    """Each NPU chip that is not OK in the ``npu-smi info`` table, with its health state and error code (``npu-smi
    info -t health -i N -c C``), and the node's quarantine record (``<k3_config_dir>/quarantine``), in one
    command.

    ``Health Status : Critical`` + ``Error Code : 80E18005`` → ``HealthEvent(device='NPU 3 chip 0',
    kind='npu-health', code='Critical 80E18005', fatal=True)``.
    """

    tool = "npu-smi"
    hint = NPU_HINT
    shown_command = PACK.command_of("hardware.health")

    def command(self, config_dir: str = "/etc/k3deploy") -> str:
        t = HEALTH_TOOL_TIMEOUT_S
        return health_command([f"echo {SECTION_MARK}npu; timeout {t} {_NPU_CHIPS} | while read i c; do "
                               f"echo {_NPU_CHIP_MARK}$i $c; timeout {t} npu-smi info -t health -i $i -c $c 2>&1; "
                               "done"], config_dir)

    def parse(self, lines: list[str]) -> HealthReading:
        return parse_ascend_health(lines)
