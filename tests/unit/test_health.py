"""Hardware health: the health facts' parsers on real tools' output (tests/fixtures, sources in its README), which
events are fatal, the ``hardware.health`` and ``node.quarantine`` checks, and ``status`` showing each node's
health."""

from __future__ import annotations

import io
import json
import re
import subprocess

import pytest

from helpers import FIXTURES
from k3deploy.facts.health import HealthReading
from k3deploy.model.health import Health, HealthEvent
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.base import HEALTH
from k3deploy.preflight.checks import HostFacts, run_checks
from k3deploy.preflight.runner import fact_plan
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors.amd.facts import AmdHealth, parse_amd_ecc
from k3deploy.vendors.ascend.facts import AscendHealth, parse_npu_health
from k3deploy.vendors.nvidia.facts import (
    NvidiaHealth,
    parse_ecc_remap,
    parse_nvidia_health,
    parse_nvlink_status,
    parse_recovery_actions,
    parse_xid_log,
    recovery_events,
)


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def shown(events: list[HealthEvent]) -> list[tuple[str, str, str, bool]]:
    return [(e.device, e.kind, e.code, e.fatal) for e in events]


# ---------------------------------------------------------------------- the parsers on real outputs


def test_an_xid_79_in_the_journal_is_fatal_on_the_gpu_its_address_names():
    events = parse_xid_log(lines("nvidia/journalctl-k-xid79-pop3363.txt"), {(0, 1, 0): "GPU 0"})
    # the driver's second "fallen off the bus" line (no XID, no "The NVIDIA GPU" before it) is not counted again
    assert shown(events) == [("GPU 0", "xid", "79", True)]
    assert events[0].text == "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."


def test_a_gpu_fallen_off_the_bus_without_an_xid_counts_as_xid_79():
    events = parse_xid_log(lines("nvidia/dmesg-fallen-off-bus-nvsentinel155.txt"), {})
    assert shown(events) == [("GPU 0000:b3:00", "xid", "79", True)]
    assert Health(tuple(events)).summary() == "XID 79 on GPU 0000:b3:00 (fallen off the bus)"


def test_application_xids_are_shown_not_fatal():
    events = parse_xid_log(lines("nvidia/dmesg-ctime-xid-13-109-gpud46.txt"), {(0, 0xCB, 0): "GPU 5"})
    assert [(e.device, e.code, e.fatal) for e in Health.of(events).events] == [
        ("GPU 5", "13", False), ("GPU 5", "13", False), ("GPU 5", "13", False), ("GPU 5", "109", False)]
    assert not Health.of(events).fatal


def test_nvlink5_xids_are_fatal_only_where_the_driver_says_fatal():
    events = parse_xid_log(lines("nvidia/kmsg-xid-nvlink5-gpud1174.txt"), {(0x19, 1, 0): "GPU 3"})
    assert shown(events) == [("GPU 3", "xid", "149", True), ("GPU 0018:01:00", "xid", "145", False),
                             ("GPU 0000:9b:00", "xid", "94", False)]


def test_a_pending_row_remap_warns_unless_the_recovery_action_asks_for_more():
    events = parse_ecc_remap(lines("nvidia/nvidia-smi-q-a100-remap-pending.txt"), {})
    # 177 correctable DRAM errors are no event; the pending remap is, shown: running and new work continue
    assert shown(events) == [("GPU 0000:10:1c", "row-remap", "pending", False)]
    assert shown(parse_ecc_remap(lines("nvidia/nvidia-smi-q-a100-remap-pending.txt"), {},
                                 {"GPU 0000:10:1c": "None"})) == [("GPU 0000:10:1c", "row-remap", "pending", False)]
    for action in ("Reset", "Reboot", "Drain P2P"):
        assert shown(parse_ecc_remap(lines("nvidia/nvidia-smi-q-a100-remap-pending.txt"), {},
                                     {"GPU 0000:10:1c": action})) == [("GPU 0000:10:1c", "row-remap", "pending", True)]


def test_a_volatile_uncorrectable_ecc_error_warns_the_aggregate_alone_is_no_event():
    block = lines("nvidia/nvidia-smi-q-ecc-sram-uncorrectable.txt")
    events = parse_ecc_remap(["GPU 00000000:10:1C.0", *block], {(0, 0x10, 0x1C): "GPU 2"})
    assert shown(events) == [("GPU 2", "ecc", "uncorrectable=1", False)]
    assert shown(parse_ecc_remap(["GPU 00000000:10:1C.0", *block], {(0, 0x10, 0x1C): "GPU 2"}, {"GPU 2": "Reset"})
                 ) == [("GPU 2", "ecc", "uncorrectable=1", True)]
    assert events[0].text == "Volatile SRAM Uncorrectable : 1"
    only_aggregate = [line.replace("Uncorrectable            : 1", "Uncorrectable            : 0") for line in block]
    assert parse_ecc_remap(["GPU 00000000:10:1C.0", *only_aggregate], {}) == []


def test_a_clean_535_report_has_no_event():
    assert parse_ecc_remap(lines("nvidia/nvidia-smi-q-ecc-a10g-535.txt"), {}) == []
    failed = [line.replace("Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes")
              for line in lines("nvidia/nvidia-smi-q-ecc-a10g-535.txt")]
    assert shown(parse_ecc_remap(failed, {})) == [("GPU 0000:00:1e", "row-remap", "failure", True)]


def test_the_recovery_action_of_a_real_565_report_is_read_and_none_is_no_event():
    report = lines("nvidia/nvidia-smi-q-h100-565.txt")
    actions = parse_recovery_actions(report, {(0, 0x18, 0): "GPU 0"})
    assert actions == {"GPU 0": "None"}
    assert recovery_events(actions) == [] and parse_ecc_remap(report, {(0, 0x18, 0): "GPU 0"}, actions) == []
    # the same report with the driver asking for each action: one fatal event on that GPU, named as nvidia-smi does
    for printed, name in (("Reset", "Reset"), ("Reboot", "Reboot"), ("Drain P2P", "Drain P2P"),
                          ("GPU_RESET", "Reset"), ("Drain and Reset", "Drain and Reset"), ("N/A", "None")):
        changed = [line.replace(": None", f": {printed}") if "GPU Recovery Action" in line else line
                   for line in report]
        events = recovery_events(parse_recovery_actions(changed, {(0, 0x18, 0): "GPU 0"}))
        assert shown(events) == ([] if name == "None" else [("GPU 0", "recovery", name, True)])
    # a driver before 565 prints no such row: nothing is read, nothing is judged by it
    assert parse_recovery_actions(lines("nvidia/nvidia-smi-q-ecc-a10g-535.txt"), {}) == {}


def test_xid_154_is_judged_by_the_action_it_announces_and_the_newest_decides():
    events = parse_xid_log(lines("nvidia/dmesg-xid-79-154-reboot.txt"), {(0, 1, 0): "GPU 0"})
    assert shown(events) == [("GPU 0", "xid", "79", True), ("GPU 0", "xid", "154", True)]
    assert Health.of(events).summary() == ("XID 79 on GPU 0 (fallen off the bus); "
                                           "XID 154 on GPU 0 (GPU recovery action changed)")
    line = lines("nvidia/dmesg-xid-79-154-reboot.txt")[1]
    for words, fatal in (("0x0 (None)", False), ("0x1 (GPU Reset Required)", True), ("0x3 (Drain P2P)", True),
                         ("0x4 (Drain and Reset)", True), ("0x9 (PF FLR)", True)):
        changed = line.replace("0x2 (Node Reboot Required)", words)
        assert [e.fatal for e in parse_xid_log([changed], {})] == [fatal], words
    # a reset that brought the action back to None: the earlier announcement is shown, not fatal
    back = line.replace("from 0x0 (None) to 0x2 (Node Reboot Required)", "from 0x2 (Node Reboot Required) to 0x0 (None)")
    assert [e.fatal for e in parse_xid_log([line, back], {})] == [False, False]
    assert [e.fatal for e in parse_xid_log([back, line], {})] == [False, True]


def test_the_health_reading_joins_the_recovery_action_to_the_ecc_rows():
    remap = lines("nvidia/nvidia-smi-q-a100-remap-pending.txt")
    gpus = ["K3_SECTION=nvl", "0", "K3_SECTION=gpus", "0, 00000000:10:1C.0"]
    calm = parse_nvidia_health([*gpus, "K3_SECTION=recovery", "GPU 00000000:10:1C.0",
                                "    GPU Recovery Action                   : None", "K3_SECTION=ecc", *remap])
    assert calm.health.fatal == () and calm.health.summary() == "row remap pending on GPU 0 (not fatal)"
    acting = parse_nvidia_health([*gpus, "K3_SECTION=recovery", "GPU 00000000:10:1C.0",
                                  "    GPU Recovery Action                   : Reset", "K3_SECTION=ecc", *remap])
    assert shown(list(acting.health.fatal)) == [("GPU 0", "recovery", "Reset", True),
                                                ("GPU 0", "row-remap", "pending", True)]
    assert acting.health.summary().startswith("GPU recovery action Reset on GPU 0 (GPU reset required)")
    assert any(fix.startswith("stop the engines on the node and reset the GPU") for fix in acting.health.fixes())


def test_inactive_nvlinks_are_fatal_on_nvl72_trays_only():
    text = lines("nvidia/nvlink-s-v100-inactive-azhpc73.txt")
    assert shown(parse_nvlink_status(text, fatal=True)) == [("GPU 3", "nvlink", "link 3 inactive", True),
                                                            ("GPU 3", "nvlink", "link 5 inactive", True)]
    assert {e.fatal for e in parse_nvlink_status(text, fatal=False)} == {False}
    assert shown(parse_nvlink_status(lines("nvidia/nvlink-s-all-inactive-siboehm.txt"), fatal=True)) == [
        ("GPU 2", "nvlink", "all links inactive", True)]


def test_amd_uncorrectable_ras_errors_are_fatal():
    clean = lines("amd/amd-smi-metric-ecc-clean.txt")
    assert parse_amd_ecc(clean) == []
    bad = [line.replace("TOTAL_UNCORRECTABLE_COUNT: 0", "TOTAL_UNCORRECTABLE_COUNT: 3") for line in clean]
    assert shown(parse_amd_ecc(bad)) == [("GPU 0", "ras", "uncorrectable=3", True)]


def test_amd_health_reads_the_ras_counters_in_sysfs_without_amd_smi_else_says_unknown(tmp_path):
    """The fact's own command over a sysfs tree laid out as the kernel's (card1 a GPU with its ras/ folder, a
    connector beside it, card2 without RAS): amd-smi missing, the counters decide; with none, health is unknown."""
    doc = (FIXTURES / "amd/sysfs-ras-err-count-kernel-doc.txt").read_text()     # the kernel docs' "ue: 0\nce: 1"
    ras = tmp_path / "drm/card1/device/ras"
    ras.mkdir(parents=True)
    (ras / "gfx_err_count").write_text(doc)
    (ras / "umc_err_count").write_text("ue: 2\nce: 1\nde: 1\n")   # UMC adds "de" (deferred) since Linux 6.8
    (tmp_path / "drm/card1-DP-1/device/ras").mkdir(parents=True)
    (tmp_path / "drm/card1-DP-1/device/ras/umc_err_count").write_text("ue: 9\nce: 0\n")
    (tmp_path / "drm/card2/device").mkdir(parents=True)
    command = AmdHealth().command(config_dir=str(tmp_path)).replace("/sys/class/drm", str(tmp_path / "drm"))
    env = {"PATH": "/usr/bin:/bin"}                                 # no amd-smi on this PATH
    assert "grep -H . /sys/class/drm/card*/device/ras/*_err_count" in AmdHealth().command()
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env).stdout.splitlines()
    reading = AmdHealth().process(out)
    assert isinstance(reading, HealthReading)
    assert shown(list(reading.events)) == [("card1", "ras", "uncorrectable=2", True), ("card1", "ras", "deferred=1", False)]
    assert reading.events[0].text == "card1 umc_err_count: ue: 2"
    for f in ras.iterdir():
        f.unlink()
    ras.rmdir()
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env).stdout.splitlines()
    unknown = AmdHealth().process(out)
    assert isinstance(unknown, HealthReading) and not unknown.health.fatal
    assert shown(list(unknown.events)) == [("node", "unread", "unknown", False)]
    assert "amd-smi" in unknown.events[0].text and "/sys/class/drm/card*/device/ras/*_err_count" in unknown.events[0].text


def test_npu_health_alarm_and_critical_are_fatal_warning_is_not():
    ok = lines("ascend/npu-smi-info-t-health-chip-ok.txt")
    assert parse_npu_health(["K3_NPU=0 0", *ok]) == []
    for state, fatal in (("Warning", False), ("Alarm", True), ("Critical", True), ("UNKNOWN", True)):
        chip = [line.replace(": OK", f": {state}") for line in ok]
        assert shown(parse_npu_health(["K3_NPU=4 1", *chip])) == [("NPU 4 chip 1", "npu-health", state, fatal)]


@pytest.mark.parametrize("table, expected", [
    ("ascend/npu-smi-info-a2-910b2-excerpt.txt", ["1 0"]),       # A2: the chip row carries the chip id alone
    ("ascend/npu-smi-info-a2.txt", ["1 0"]),                     # its NPU 1 is in Warning already
    ("ascend/npu-smi-info-a3.txt", ["1 0", "1 1"]),              # A3: chip and Phy-ID
    ("ascend/npu-smi-info-a3-26.0.rc2-excerpt.txt", []),         # NPU 0 only
])
def test_the_health_command_finds_the_chips_not_ok_in_a2_and_a3_tables(table, expected, tmp_path):
    """The command's own awk over real tables, NPU 1 turned to Alarm where the table has one: each chip of it is
    named (A2 tables were never read before: their chip rows have one number)."""
    from k3deploy.vendors.ascend.facts import _NPU_CHIPS

    text = (FIXTURES / table).read_text()
    sick = re.sub(r"(\| 1 +\S+ +\| )OK   ", r"\1Alarm", text)
    (tmp_path / "table").write_text(sick)
    script = _NPU_CHIPS.replace("npu-smi info |", f"cat {tmp_path / 'table'} |")
    got = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    assert got == expected


def test_one_rule_for_an_ascend_warning_in_preflight_and_the_health_model():
    from k3deploy.vendors.ascend import NPU_FATAL_STATES

    assert "Warning" not in NPU_FATAL_STATES and {"Alarm", "Critical", "UNKNOWN"} == NPU_FATAL_STATES
    ok = lines("ascend/npu-smi-info-t-health-chip-ok.txt")
    warning = parse_npu_health(["K3_NPU=1 0", *[line.replace(": OK", ": Warning") for line in ok]])
    assert [e.fatal for e in warning] == [False]


@pytest.mark.parametrize("fact, kwargs", [(NvidiaHealth, {"nvl": True}), (AmdHealth, {}), (AscendHealth, {})])
def test_every_health_command_ends_with_its_exit_and_reads_the_quarantine_record(fact, kwargs):
    command = fact().command(config_dir="/srv/k3", **kwargs)
    assert "cat /srv/k3/quarantine" in command and command.endswith("echo K3_EXIT=0")
    assert "timeout 20" in command
    # a record written without a last newline is still read
    out = fact().process(["K3_SECTION=quarantine", '{"reason": "XID 79 on GPU 0"}', "K3_EXIT=0"])
    assert isinstance(out, HealthReading) and out.quarantined == "XID 79 on GPU 0"


def test_the_fact_plan_reads_health_with_the_config_dir():
    for hw, variant in (("gb300", "default"), ("mi355x", "default"), ("ascend_910c", "ascend_w4a8")):
        sel = Requirements(hardware=hardware()[hw], variant=variant, vram_minimum_gb=None, nodes=2, multi_node=True)
        plan = {name: kwargs for name, _, kwargs in fact_plan(sel, "", "/c", "", "/srv/k3")}
        assert plan[HEALTH]["config_dir"] == "/srv/k3"
    sel = Requirements(hardware=hardware()["h200"], variant="default", vram_minimum_gb=None, nodes=1)
    assert {name: kw for name, _, kw in fact_plan(sel, "", "/c", "")}[HEALTH] == {"config_dir": "/etc/k3deploy",
                                                                                "nvl": False}


# ----------------------------------------------------------------------------------------- the checks


def facts_with(host: str, events: tuple[HealthEvent, ...] = (), quarantined: str | None = None) -> HostFacts:
    facts = HostFacts(host=host)
    facts.read_health(HealthReading(events, quarantined))
    return facts


XID79 = HealthEvent("GPU 0", "xid", "79", "NVRM: Xid (PCI:0008:01:00): 79, GPU has fallen off the bus.", True)
SEL = Requirements(hardware=hardware()["gb300"], variant="default", vram_minimum_gb=None, nodes=2, multi_node=True)


def results_of(*hosts: HostFacts) -> dict[tuple[str, str], tuple[str, str, str]]:
    return {(r.host, r.check): (r.status, r.observed, r.fix) for r in run_checks(SEL, list(hosts))
            if r.check in ("hardware.health", "node.quarantine")}


def test_a_fatal_event_refuses_that_node_naming_the_device_the_event_and_the_fix():
    got = results_of(facts_with("node1"), facts_with("node2", (XID79,)))
    assert got[("node1", "hardware.health")][:2] == ("pass", "no fatal event")
    status, observed, fix = got[("node2", "hardware.health")]
    assert status == "fail"
    assert observed == "XID 79 on GPU 0 (fallen off the bus): NVRM: Xid (PCI:0008:01:00): 79, GPU has fallen off the bus."
    assert fix.startswith("node2 must not serve") and "reseat or replace the GPU or tray" in fix


def test_a_quarantined_node_is_refused_until_released_and_an_unread_health_warns():
    got = results_of(facts_with("node1", quarantined="XID 79 on GPU 0 (fallen off the bus)"), HostFacts(host="node2"))
    status, observed, fix = got[("node1", "node.quarantine")]
    assert (status, observed) == ("fail", "quarantined: XID 79 on GPU 0 (fallen off the bus)")
    assert "k3deploy spares INVENTORY --release node1" in fix
    assert ("node2", "hardware.health") not in got     # the fact was not read there: nothing to judge


def test_several_events_each_fix_once():
    ecc = HealthEvent("GPU 1", "ecc", "uncorrectable=2", "Volatile DRAM Uncorrectable : 2", True)
    remap = HealthEvent("GPU 1", "row-remap", "pending", "Pending : Yes", True)
    slow = HealthEvent("GPU 1", "xid", "13", "13, Graphics Exception", False)
    health = Health.of([ecc, remap, slow, ecc])
    assert len(health.events) == 3 and health.fatal == (ecc, remap)
    assert len(health.fixes()) == 2
    assert health.summary() == ("ECC uncorrectable=2 on GPU 1; row remap pending on GPU 1; "
                                "XID 13 on GPU 1 (graphics engine exception)")


# ----------------------------------------------------------------------------------------- status


def test_status_shows_each_nodes_health_and_carries_the_events_in_json():
    from rich.console import Console

    from k3deploy.cli.status import show
    from k3deploy.model.status import ClusterStatus, NodeHealth

    st = ClusterStatus("http://10.0.0.1:8000", "m", ["m"], [], [],
                       nodes=[NodeHealth("node1", Health()), NodeHealth("node2", Health((XID79,)))])
    out = io.StringIO()
    show(st, Console(file=out, width=200, color_system=None))
    assert "health: node2: XID 79 on GPU 0 (fallen off the bus): must not serve" in out.getvalue()
    assert "node1" not in out.getvalue()        # a clean node among sick ones is not listed
    doc = json.loads(json.dumps(st.to_dict()))
    assert doc["nodes"][1] == {"host": "node2", "health": "XID 79 on GPU 0 (fallen off the bus)", "fatal": True,
                               "events": [XID79.as_dict()], "quarantined": None}
    out = io.StringIO()
    show(ClusterStatus("http://x", "m", ["m"], [], [], nodes=[NodeHealth("node1", Health())]),
         Console(file=out, width=200, color_system=None))
    assert "health: ok on every node (1)" in out.getvalue()


def test_health_that_could_not_be_read_warns_with_the_command_to_run():
    from k3deploy.facts.base import FactError

    facts = HostFacts(host="node1")
    facts.read_health(FactError(kind="failed", tool="nvidia-smi", command="x", first_line="channel closed"))
    status, observed, fix = results_of(facts)[("node1", "hardware.health")]
    assert status == "warn" and "channel closed" in observed
    assert fix.startswith("run `dmesg | grep -E") and fix.endswith("on node1 and read it")
