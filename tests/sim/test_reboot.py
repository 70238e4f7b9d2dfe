"""``k3deploy sim reboot``: a node reboots as with ``systemctl reboot`` and comes back with its root, address, faults
and enabled units; the other nodes are not touched."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from helpers import k3, k3_here
from helpers.simulated import bring_up, leftovers, resources, ssh
from k3sim import cluster as sim
from k3sim import processes

NAME = "treboot"

#: oneshot at every boot: counts boots on the disk, leaves a per-boot id in /run (a tmpfs, empty after a reboot);
#: its ExecStop runs when the node shuts down
BOOT_UNIT = """[Unit]
Description=k3 sim reboot test: runs at every boot
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'echo boot >> /var/lib/k3boot/boots; cat /proc/sys/kernel/random/uuid > /run/k3boot-id'
ExecStop=/bin/sh -c 'echo stop >> /var/lib/k3boot/stops'
[Install]
WantedBy=multi-user.target
"""

#: a long-running service that notes the SIGTERM systemd sends it at shutdown
TERM_UNIT = """[Unit]
Description=k3 sim reboot test: notes SIGTERM
[Service]
ExecStart=/usr/bin/python3 /usr/local/bin/k3term.py
[Install]
WantedBy=multi-user.target
"""

TERM_SCRIPT = """import signal, sys, time
def term(*_):
    with open("/var/lib/k3boot/sigterm", "a") as fh:
        fh.write("TERM\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
while True:
    time.sleep(3600)
"""


def one_error_line(res: subprocess.CompletedProcess[str], needle: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def node_rec(rank: int) -> dict:
    st = sim.load_state(NAME)
    assert st is not None
    return st["nodes"][rank]


def multi_user_since(cluster: dict, ip: str) -> int:
    r = ssh(cluster, ip, "systemctl show -p ActiveEnterTimestampMonotonic --value multi-user.target")
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def reboot(*args: str, env: dict[str, str] | None = None) -> dict:
    r = k3("sim", "reboot", NAME, *args, "--json", env=env or {})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def cluster():
    c = bring_up(NAME, "gb300", 2)
    yield c
    res = resources(NAME)
    assert k3_here("sim", "down", "--name", NAME).returncode == 0
    assert leftovers(res) == []


# ----------------------------------------------------------------------------- validation (no root needed)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([NAME], "no node rank given"),
        ([NAME, "-1"], "bad rank '-1'"),
        ([NAME, "1", "2"], "give one node rank"),
        (["Bad_Name", "1"], "bad cluster name 'Bad_Name'"),
    ],
)
def test_reboot_rejects_bad_input_with_one_line(args, needle):
    one_error_line(k3("sim", "reboot", *args, timeout=60), needle)


# ----------------------------------------------------------------------------- end to end


@pytest.mark.sim
def test_reboot_rejects_bad_rank_and_unknown_cluster(cluster):
    one_error_line(k3("sim", "reboot", NAME, "2"), f"bad rank 2: cluster {NAME!r} has node ranks 0..1")
    one_error_line(k3("sim", "reboot", "--name", NAME, "7"), "bad rank 7")
    one_error_line(k3("sim", "reboot", "tnone", "0"), "no simulated cluster 'tnone' is up")
    assert all(processes.ours(node_rec(i)["pid"], node_rec(i)["pid_start"]) for i in (0, 1))


@pytest.mark.sim
def test_reboot_restarts_the_node_and_its_enabled_units(cluster):
    n0, n1 = cluster["nodes"]
    setup = (
        "mkdir -p /var/lib/k3boot && "
        f"cat > /etc/systemd/system/k3boot.service <<'EOF'\n{BOOT_UNIT}EOF\n"
        f"cat > /etc/systemd/system/k3term.service <<'EOF'\n{TERM_UNIT}EOF\n"
        f"cat > /usr/local/bin/k3term.py <<'EOF'\n{TERM_SCRIPT}EOF\n"
        "systemctl daemon-reload && systemctl enable --now k3boot.service k3term.service && "
        "touch /run/k3marker && cat /run/k3boot-id"
    )
    r = ssh(cluster, n1["ip"], setup)
    assert r.returncode == 0, r.stdout + r.stderr
    boot_id = r.stdout.strip()
    assert boot_id
    assert ssh(cluster, n0["ip"], "touch /run/k3marker").returncode == 0
    assert k3_here("sim", "fault", NAME, "1:driver=570.86.15").returncode == 0
    since = [multi_user_since(cluster, n["ip"]) for n in (n0, n1)]
    before = [node_rec(0), node_rec(1)]

    res = reboot("1")
    assert res["rank"] == 1 and res["name"] == n1["name"] and res["ip"] == n1["ip"]
    assert res["was_running"] and res["clean"]
    assert res["previous_pid"] == before[1]["pid"] and res["pid"] != before[1]["pid"]

    # the state file follows the new nspawn; the old one is gone
    after = node_rec(1)
    assert after["pid"] == res["pid"] and processes.ours(after["pid"], after["pid_start"])
    assert not processes.ours(before[1]["pid"], before[1]["pid_start"])
    # a new boot: /run emptied, the oneshot ran again (new id, two boots), systemd reached multi-user.target later
    r = ssh(cluster, n1["ip"], "hostname; test ! -e /run/k3marker && echo run-empty; cat /run/k3boot-id; "
                               "cat /var/lib/k3boot/boots /var/lib/k3boot/stops /var/lib/k3boot/sigterm; "
                               "systemctl is-active k3boot.service k3term.service")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.split()
    assert lines[0] == n1["name"] and lines[1] == "run-empty"
    assert lines[2] != boot_id
    # boots (2), then stops and sigterm: the shutdown stopped the units (ExecStop; SIGTERM to the service)
    assert lines[3:] == ["boot", "boot", "stop", "TERM", "active", "active"], r.stdout
    assert multi_user_since(cluster, n1["ip"]) > since[1]
    # same root (the unit files), same faults
    r = ssh(cluster, n1["ip"], "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u")
    assert r.stdout.strip() == "570.86.15", r.stdout + r.stderr
    assert after["faults"] == ["1:driver=570.86.15"]
    # node 0 untouched: same nspawn, same boot, its /run intact
    assert node_rec(0)["pid"] == before[0]["pid"] and processes.ours(before[0]["pid"], before[0]["pid_start"])
    assert multi_user_since(cluster, n0["ip"]) == since[0]
    assert ssh(cluster, n0["ip"], "test -e /run/k3marker").returncode == 0
    # status: both nodes running and answering on SSH
    st = json.loads(k3_here("sim", "status", "--name", NAME, "--json").stdout)["clusters"][0]
    assert st["phase"] == "up"
    assert [(n["running"], n["ssh"]) for n in st["nodes"]] == [(True, True), (True, True)]
    assert "rank 1" in k3_here("sim", "status", "--name", NAME).stdout
    assert k3_here("sim", "fault", NAME, "--clear", "1").returncode == 0


@pytest.mark.sim
def test_reboot_inside_the_node_ends_it_until_sim_reboot(cluster):
    n1 = cluster["nodes"][1]
    rec = node_rec(1)
    r = ssh(cluster, n1["ip"], "systemctl --no-block reboot")
    assert r.returncode in (0, 255), r.stderr  # the connection may drop as sshd stops
    deadline = time.monotonic() + 60
    while processes.ours(rec["pid"], rec["pid_start"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes.ours(rec["pid"], rec["pid_start"])  # nspawn exited (133): nothing relaunches it
    st = json.loads(k3_here("sim", "status", "--name", NAME, "--json").stdout)["clusters"][0]
    assert st["phase"] == "degraded" and not st["nodes"][1]["running"]
    res = reboot("1")
    assert not res["was_running"] and res["previous_pid"] == rec["pid"]
    assert ssh(cluster, n1["ip"], "hostname; systemctl is-system-running").stdout.split() == [n1["name"], "running"]
    st = json.loads(k3_here("sim", "status", "--name", NAME, "--json").stdout)["clusters"][0]
    assert st["phase"] == "up" and all(n["running"] and n["ssh"] for n in st["nodes"])


@pytest.mark.sim
def test_reboot_resets_a_node_that_does_not_stop_and_times_out_in_one_line(cluster):
    n1 = cluster["nodes"][1]
    since = multi_user_since(cluster, n1["ip"])
    cg = processes.node_cgroups(NAME, n1["name"])[0]
    old = {p: st[1] for p in processes.cgroup_pids(cg) if (st := processes.proc_stat(p))}
    assert len(old) > 3
    res = reboot("1", env={"K3SIM_STOP_TIMEOUT": "0"})
    assert res["was_running"] and not res["clean"]  # SIGKILLed: a reset
    assert multi_user_since(cluster, n1["ip"]) > since
    for pid, start in old.items():  # nothing of the old node survived the reset
        st = processes.proc_stat(pid)
        assert st is None or st[0] in ("Z", "X") or st[1] != start, f"{pid} {processes.comm(pid)} survived"
    # a node that is not back in time: one line, exit 2; it comes up all the same
    r = k3("sim", "reboot", NAME, "1", env={"K3SIM_BOOT_TIMEOUT": "0"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()  # progress, then the error
    assert lines[0] == f"rebooting {n1['name']}" and len(lines) == 2, r.stderr
    assert lines[1] == f"error: node(s) {n1['name']} not reachable over SSH after 0 s (raise K3SIM_BOOT_TIMEOUT)"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and ssh(cluster, n1["ip"], "true").returncode != 0:
        time.sleep(0.2)
    assert ssh(cluster, n1["ip"], "hostname").stdout.strip() == n1["name"]
    st = json.loads(k3_here("sim", "status", "--name", NAME, "--json").stdout)["clusters"][0]
    assert all(n["running"] and n["ssh"] for n in st["nodes"])
