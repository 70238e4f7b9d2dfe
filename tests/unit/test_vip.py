"""The site's virtual address (``k3_vip``): its variables refused in one line when bad, the endpoint on it, which
host holds it, keepalived's configuration per host, the plan's note and the runbook's section."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from helpers import k3, two_tray_site
from k3deploy.errors import K3Error
from k3deploy.model import commands, vip
from k3deploy.model.binding import HostRecord
from k3deploy.model.diff import build
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import Rollout
from k3deploy.model.runbook import Context, to_markdown
from k3deploy.model.runbook import build as runbook
from k3deploy.model.variables import Variables

COMMON = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp", "k3_vip": "10.0.0.250"}


def rollout_of(extra: dict[str, object] | None = None, replicas: bool = False) -> Rollout:
    data = {**COMMON, **(extra or {})}
    if replicas:
        hosts = [HostRecord(f"n{i + 1}", ("head",) if i % 2 == 0 else ("workers",),
                            {**data, "k3_ip": f"10.0.0.{i + 1}", "rank": i % 2, "k3_replica": i // 2})
                 for i in range(4)]
    else:
        hosts = [HostRecord("n1", ("head",), {**data, "k3_ip": "10.0.0.1"}),
                 HostRecord("n2", ("workers",), {**data, "k3_ip": "10.0.0.2", "rank": 1})]
    hosts.append(HostRecord("n9", ("spares",), {**data, "k3_ip": "10.0.0.9"}))
    return desired_rollout(target(hosts, None), ifaces={h.name: "eth0" for h in hosts})


@pytest.mark.parametrize("value, needle", [
    ("vip.example", "'vip.example' is not an IPv4 address"),
    ("10.0.0.300", "'10.0.0.300' is not an IPv4 address"),
    ("fd00::1", "cannot be a virtual address (IPv4 unicast only)"),
    ("224.0.0.18", "cannot be a virtual address"),
])
def test_a_bad_virtual_address_is_refused_naming_it(value, needle):
    with pytest.raises(ValidationError) as exc:
        Variables(k3_vip=value)
    assert needle in str(exc.value)


def test_a_bad_interface_or_router_id_is_refused():
    with pytest.raises(ValidationError, match="is not a network interface name"):
        Variables(k3_vip_interface="eth0; reboot")
    with pytest.raises(ValidationError):
        Variables(k3_vip_router_id=256)


def test_the_cli_refuses_a_bad_virtual_address_in_one_line_exit_2(tmp_path):
    inventory = two_tray_site(tmp_path, "k3_hardware: gb300\nk3_strategy: multi_node_tp\nk3_vip: 10.1.0.999\n")
    proc = k3("resolve", "--inventory", str(inventory))
    assert proc.returncode == 2, (proc.stdout[-500:], proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "k3_vip" in proc.stderr and "'10.1.0.999' is not an IPv4 address" in proc.stderr, proc.stderr


def test_a_virtual_address_that_a_host_has_or_outside_the_subnet_is_refused():
    with pytest.raises(K3Error, match="k3_vip 10.0.0.2 is the address of host n2"):
        rollout_of({"k3_vip": "10.0.0.2"})
    with pytest.raises(K3Error, match=r"k3_vip 10.9.0.250 is not in the subnet of n1 \(10.0.0.0/24, k3_vip_prefix 24"):
        rollout_of({"k3_vip": "10.9.0.250"})
    assert rollout_of({"k3_vip": "10.0.9.250", "k3_vip_prefix": 16}).endpoint == "http://10.0.9.250:8000"


def test_the_cli_refuses_a_virtual_address_outside_the_subnet_in_one_line_exit_2(tmp_path):
    inventory = two_tray_site(tmp_path, "k3_hardware: gb300\nk3_strategy: multi_node_tp\nk3_vip: 10.2.0.250\n")
    proc = k3("resolve", "--inventory", str(inventory))
    assert proc.returncode == 2, (proc.stdout[-500:], proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "k3_vip 10.2.0.250 is not in the subnet of gpu01 (10.1.0.0/24" in proc.stderr, proc.stderr


def test_the_endpoint_is_the_virtual_address_and_the_head_holds_it():
    r = rollout_of()
    assert r.endpoint == "http://10.0.0.250:8000" and r.vip_holder == "n1"
    assert vip.members(r) == ["n1", "n2", "n9"]
    confs = {h: vip.keepalived_conf(r, h, "eth0") for h in vip.members(r)}
    assert "priority 150" in confs["n1"] and all("priority 100" in confs[h] for h in ("n2", "n9"))
    for h, text in confs.items():   # one VRRP instance, the same router id, each host checking its own /health
        assert "virtual_router_id 51" in text and "10.0.0.250/24 dev eth0" in text and "init_fail" in text
        assert f"http://{vip.address_of(r, h)}:8000/health" in text
    assert rollout_of({"k3_vip": None}).endpoint == "http://10.0.0.1:8000" and not vip.members(rollout_of(
        {"k3_vip": None}))
    assert 'interface bond0' in vip.keepalived_conf(rollout_of({"k3_vip_interface": "bond0"}), "n1", "bond0")


def test_with_replicas_the_routers_host_holds_it_on_the_routers_port():
    r = rollout_of(replicas=True)
    router = next(u for u in r.units if u.group == "router")
    assert r.endpoint == "http://10.0.0.250:30000" and r.vip_holder == router.host == "n1"
    assert "http://10.0.0.3:30000/health" in vip.keepalived_conf(r, "n3", "eth0")


def test_the_plan_and_the_runbook_show_it():
    r = rollout_of()
    report = build(r, {})
    assert report.endpoint == "http://10.0.0.250:8000"
    assert any(n.startswith("virtual address 10.0.0.250 (keepalived VRRP, router id 51): held by n1") for n in
               report.notes), report.notes
    text = to_markdown(runbook(r, Context(inventory="site.py", preflight=[], addresses={}, ssh={}, brand="NVIDIA",
                                          guide=None, version="test")))
    assert "## 4b. The virtual address" in text and "keepalived -t -f /etc/keepalived/keepalived.conf.k3-next" in text
    assert commands.wait_vip(r.endpoint, "10.0.0.250", 60) in text


def test_keepalived_apply_keeps_the_running_configuration_when_the_check_refuses(tmp_path: Path):
    """The apply script under a real ``sh`` with stub ``keepalived`` and ``systemctl``: a refused configuration is
    removed and fails, naming what keepalived said; a valid one is moved into place, then the unit enabled and
    reloaded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    (bin_dir / "keepalived").write_text(f"#!/bin/sh\necho \"keepalived $*\" >> {log}\n"
                                        "grep -q bad \"$3\" && { echo 'Unknown keyword bogus' >&2; exit 3; }\nexit 0\n")
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho \"systemctl $*\" >> {log}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    staged, live = tmp_path / "k.conf.k3-next", tmp_path / "k.conf"
    live.write_text("running\n")
    script = commands.keepalived_apply(str(staged), str(live), "keepalived.service")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    staged.write_text("bad\n")
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "keepalived -t refused" in proc.stderr and "Unknown keyword" in proc.stderr
    assert live.read_text() == "running\n" and not staged.exists() and "systemctl" not in log.read_text()
    staged.write_text("good\n")
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert live.read_text() == "good\n" and not staged.exists()
    assert log.read_text().splitlines()[-2:] == ["systemctl enable --quiet keepalived.service",
                                                 "systemctl reload-or-restart keepalived.service"]
    assert shlex.quote(str(staged)) in script
