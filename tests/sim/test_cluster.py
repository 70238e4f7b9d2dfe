"""End-to-end tests of the simulated cluster: real systemd-nspawn nodes, real sshd, real pyinfra.

The ``sim`` tests need root, systemd-nspawn and the cached base root (built on first use, about a
minute, from a Debian mirror). Input validation tests run anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import BIN, k3, k3_here, present
from helpers.simulated import bring_up, leftovers, resources, ssh
from k3deploy.errors import K3Error
from k3deploy.runtime.connections import connect, disconnect, open_inventory
from k3sim import base as sim_base
from k3sim import cluster as sim
from k3sim import processes
from k3sim.state import state_dir


def pyinfra_exec(inventory: str, command: str, *extra: str) -> tuple[int, dict[str, list[str]], str]:
    """Run ``pyinfra INV exec -y -- COMMAND`` over real SSH; returns (rc, output lines per host, all text)."""
    exe = BIN / "pyinfra"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "pyinfra"]
    res = subprocess.run(
        [*cmd, inventory, "exec", "-y", *extra, "--", command],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines: dict[str, list[str]] = {}
    for line in (res.stdout + res.stderr).splitlines():
        if line.startswith("[") and "] " in line:
            host, _, text = line[1:].partition("] ")
            lines.setdefault(host, []).append(text)
    return res.returncode, lines, res.stdout + res.stderr


def port_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def gb300():
    cluster = bring_up("tgb300", "gb300", 2)
    yield cluster
    res = resources("tgb300")
    assert k3_here("sim", "down", "--name", "tgb300").returncode == 0
    assert leftovers(res) == []


@pytest.fixture(scope="module")
def h200():
    cluster = bring_up("th200", "h200", 2)
    yield cluster
    res = resources("th200")
    assert k3_here("sim", "down", "--name", "th200").returncode == 0
    assert leftovers(res) == []


# ----------------------------------------------------------------------------- validation (no root needed)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--hardware", "h900", "--nodes", "2"], "unknown hardware 'h900'"),
        (["--hardware", "h200", "--nodes", "0"], "bad node count 0"),
        (["--hardware", "h200", "--nodes", "129"], "bad node count 129"),
        (["--hardware", "h200", "--nodes", "2", "--fault", "banana"], "bad fault 'banana'"),
        (["--hardware", "h200", "--nodes", "2", "--fault", "1:melt"], "melt"),
        (["--hardware", "h200", "--nodes", "2", "--fault", "2:disk-full"], "rank 2 is not in 0..1"),
        (["--hardware", "h200", "--nodes", "2", "--name", "Bad_Name"], "bad cluster name 'Bad_Name'"),
        (["--hardware", "h200", "--nodes", "2", "--subnet", "10.77"], "bad subnet '10.77'"),
    ],
)
def test_up_rejects_bad_input_with_one_line(args, needle):
    res = k3_here("sim", "up", *args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_up_without_the_real_router_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("K3SIM_ROUTER_DIR", str(tmp_path / "nowhere"))
    res = k3_here("sim", "up", "--hardware", "h200", "--nodes", "2", "--name", "norouter")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "vllm-router 0.1.17 for the simulated nodes is not installed in" in lines[0]
    assert "tools/sim-router.sh" in lines[0] and "Traceback" not in res.stderr
    assert not state_dir("norouter").exists()  # nothing was created


def test_missing_nspawn_names_the_package(tmp_path, monkeypatch):
    # a PATH that has every tool the simulation needs except systemd-nspawn
    for tool in ("ip", "ssh", "ssh-keygen", "nsenter", "mount", "umount"):
        found = shutil.which(tool)
        if found:
            (tmp_path / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(tmp_path))
    if os.geteuid() != 0:
        with pytest.raises(K3Error, match="needs root"):
            sim.check_host()
        return
    with pytest.raises(K3Error, match=r"systemd-nspawn not found: install the systemd-container package"):
        sim.check_host()


def test_not_root_is_one_clear_line():
    if os.geteuid() == 0:
        # drop to an unprivileged user for real; the project tree must be readable for it
        probe = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", "import k3deploy"],
            capture_output=True, text=True,
        )  # fmt: skip
        if probe.returncode != 0:
            pytest.skip("the project tree is not readable by an unprivileged user here")
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
               "from k3deploy.cli import main; main()", "sim", "up", "-H", "h200", "-n", "2"]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    else:
        res = k3("sim", "up", "-H", "h200", "-n", "2", timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip() == "error: the simulated cluster needs root: run k3deploy sim as root (sudo)"


def test_layout_names_fit_linux_limits():
    for name in ("k3sim", "abcdefghij"):
        nodes = sim.layout(name, sim.default_subnet(name), sim.MAX_NODES)
        assert len({n.ip for n in nodes}) == sim.MAX_NODES
        for n in nodes:
            assert len(n.veth) <= 15  # IFNAMSIZ - 1
        assert len(sim.bridge_name(name)) <= 15
    assert sim.default_subnet("k3sim") == "10.77.0"


def test_base_id_tracks_package_list(monkeypatch):
    before = sim_base.base_id()
    monkeypatch.setattr(sim_base, "PACKAGES", (*sim_base.PACKAGES, "strace"))
    assert sim_base.base_id() != before


def test_base_mirror_follows_the_hosts_apt_sources(tmp_path, monkeypatch):
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    assert sim_base._host_mirror(apt) is None
    (apt / "sources.list").write_text(
        "# deb http://old.example/debian bookworm main\n"
        "deb http://security.example/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://list.example/debian bookworm main contrib\n"
    )
    assert sim_base._host_mirror(apt) == "http://list.example/debian"
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb deb-src\nURIs: http://deb822.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n"
    )
    assert sim_base._host_mirror(apt) == "http://deb822.example/debian"
    monkeypatch.setenv("K3SIM_MIRROR", "http://env.example/debian")
    assert sim_base.mirror() == "http://env.example/debian"


# ----------------------------------------------------------------------------- end to end


@pytest.mark.sim
def test_up_json_and_inventory(gb300):
    assert set(gb300) == {"name", "inventory", "nodes", "outside", "strategy"}
    assert gb300["strategy"] == "multi_node_tp"   # the recommended strategy fits 2 trays
    assert gb300["name"] == "tgb300"
    assert gb300["outside"]["ip"] == gb300["nodes"][0]["ip"].rsplit(".", 1)[0] + ".254"
    assert [n["rank"] for n in gb300["nodes"]] == [0, 1]
    assert [n["name"] for n in gb300["nodes"]] == ["tgb300-node1", "tgb300-node2"]
    ips = [n["ip"] for n in gb300["nodes"]]
    assert ips[0].endswith(".11") and ips[1].endswith(".12")
    exe = BIN / "pyinfra"
    res = subprocess.run([str(exe), gb300["inventory"], "debug-inventory"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    text = res.stdout + res.stderr
    for key in ('"rank": 0', '"rank": 1', f'"k3_ip": "{ips[0]}"', '"ssh_user": "root"'):
        assert key in text
    node1, node2 = text.split("[tgb300-node2]")
    assert "Groups: head" in node1 and "Groups: workers" in node2
    st = k3_here("sim", "status", "--json")
    mine = [c for c in json.loads(st.stdout)["clusters"] if c["name"] == "tgb300"]
    assert mine and mine[0]["phase"] == "up"
    assert all(n["running"] and n["ssh"] for n in mine[0]["nodes"])


@pytest.mark.sim
def test_pyinfra_reaches_gb300_nodes_and_reads_tools(gb300):
    rc, out, text = pyinfra_exec(
        gb300["inventory"],
        "hostname; cat /etc/k3sim/node.json"
        " | python3 -c 'import json,sys; print(\"rank\", json.load(sys.stdin)[\"rank\"])';"
        " nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; systemctl is-system-running",
    )
    assert rc == 0, text
    for node in gb300["nodes"]:
        lines = out[node["name"]]
        assert lines[0] == node["name"]
        assert f"rank {node['rank']}" in lines
        gpus = [ln for ln in lines if "GB300" in ln]
        assert len(gpus) == 4, lines  # a GB300 compute tray carries 4 GPUs
        assert lines[-1] == "running"


@pytest.mark.sim
def test_connections_negotiate_gcm_and_wake_every_half_keepalive(gb300):
    """k3deploy's connections (the CLI's, and a deploy's through config.py) use AES-GCM with the nodes' OpenSSH,
    and an idle one wakes every half keepalive interval (k3_link_timeout 30: keepalives every 10 s, wakes every 5 s)."""
    state, _ = open_inventory(gb300["inventory"])
    hosts = list(state.inventory)
    try:
        for h in hosts:
            assert connect(h, 30) is None
            transport = getattr(h.connector, "client").get_transport()  # noqa: B009 (the SSH connector's)
            assert (transport.local_cipher, transport.remote_cipher) == ("aes128-gcm@openssh.com",) * 2
            assert transport.sock.gettimeout() == 5.0
    finally:
        disconnect(hosts)


@pytest.mark.sim
def test_pyinfra_reaches_h200_nodes_and_reads_tools(h200):
    rc, out, text = pyinfra_exec(h200["inventory"], "hostname; nvidia-smi -L")
    assert rc == 0, text
    for node in h200["nodes"]:
        lines = out[node["name"]]
        assert lines[0] == node["name"]
        gpus = [ln for ln in lines if ln.startswith("GPU ") and "H200" in ln]
        assert len(gpus) == 8, lines


@pytest.mark.sim
def test_unit_runs_under_node1_systemd_only(gb300):
    n1, n2 = gb300["nodes"]
    unit = (
        "[Unit]\nDescription=k3 sim test server\n[Service]\n"
        "ExecStart=/usr/bin/python3 -m http.server 8080 --directory /var/lib/k3test\nRestart=always\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    script = (
        "mkdir -p /var/lib/k3test && hostname > /var/lib/k3test/index.html && "
        f"printf '%s' '{unit}' > /etc/systemd/system/k3test.service && "
        "systemctl daemon-reload && systemctl enable --now k3test.service && systemctl is-active k3test.service"
    )
    rc, out, text = pyinfra_exec(gb300["inventory"], script, "--limit", n1["name"])
    assert rc == 0, text
    assert out[n1["name"]][-1] == "active"
    assert n2["name"] not in out
    # served from node1's own address, reachable from the host over the bridge
    body = ""
    for _ in range(50):
        try:
            body = urllib.request.urlopen(f"http://{n1['ip']}:8080/index.html", timeout=2).read().decode()
            break
        except OSError:
            time.sleep(0.1)
    assert body.strip() == n1["name"]
    # and from node2 over the bridge, by node name (every node's /etc/hosts lists the cluster)
    res = ssh(gb300, n2["ip"], f"curl -s --max-time 3 http://{n1['name']}:8080/index.html")
    assert res.stdout.strip() == n1["name"], res.stderr

    # the unit's process sits in node1's own cgroup tree, under its systemd's system.slice
    st = present(sim.load_state("tgb300"))
    unified = [Path(c) for c in st["cgroups"] if (Path(c) / "cgroup.controllers").exists()]  # cgroup2
    procs = list(unified[0].glob(f"{n1['name']}/payload/system.slice/k3test.service/cgroup.procs"))
    assert procs and procs[0].read_text().split(), "k3test.service is not in node1's cgroup"
    # node2: no such unit, no listener
    res = ssh(gb300, n2["ip"], "systemctl is-active k3test.service; test -e /etc/systemd/system/k3test.service")
    assert res.returncode != 0 and res.stdout.strip() in ("inactive", "unknown")
    assert not port_open(n2["ip"], 8080)
    # Restart=always under the node's real systemd
    res = ssh(gb300, n1["ip"], "systemctl kill -s KILL k3test; sleep 0.5; systemctl show -p NRestarts --value k3test")
    assert res.stdout.strip() == "1", res.stdout + res.stderr


@pytest.mark.sim
def test_start_units_reloads_and_enables_only_when_needed(gb300):
    """The rollout's start script on the node's real systemd: a unit systemd saw missing before its file was
    written starts; a restart with the same unit file neither reloads systemd nor enables again; a changed unit file
    is reloaded and its new command runs."""
    from k3deploy.model.commands import start_units

    n2 = gb300["nodes"][1]
    unit = "k3start.service"

    def write(word: str) -> None:
        body = (f"[Unit]\nDescription=k3 start test\n[Service]\nExecStart=/bin/sh -c 'echo {word}; exec sleep 600'\n"
                "[Install]\nWantedBy=multi-user.target\n")
        assert ssh(gb300, n2["ip"], f"printf '%s' \"{body}\" > /etc/systemd/system/{unit}").returncode == 0

    def start() -> None:
        res = ssh(gb300, n2["ip"], start_units([unit]))
        assert res.returncode == 0, res.stderr

    def reloads() -> int:   # systemd logs "Reloading." at each daemon-reload (an enable reloads too)
        out = ssh(gb300, n2["ip"], "journalctl -b _PID=1 -o cat --no-pager | grep -c '^Reloading' || true").stdout
        return int(out.strip())

    def ran() -> list[str]:
        return ssh(gb300, n2["ip"], f"journalctl -u {unit} -o cat --no-pager | grep -x 'one\\|two' || true"
                   ).stdout.split()

    try:
        assert "LoadState=not-found" in ssh(gb300, n2["ip"], f"systemctl show -p LoadState {unit}").stdout
        write("one")
        start()
        state = ssh(gb300, n2["ip"], f"systemctl is-active {unit}; systemctl is-enabled {unit}").stdout.split()
        assert state == ["active", "enabled"]
        before = reloads()
        start()   # same unit file, enabled already
        assert reloads() == before
        assert ran() == ["one", "one"]
        write("two")
        start()
        assert reloads() == before + 1
        assert ran() == ["one", "one", "two"]
    finally:
        ssh(gb300, n2["ip"], f"systemctl disable --now {unit}; rm -f /etc/systemd/system/{unit}; "
                             "systemctl daemon-reload")



@pytest.mark.sim
def test_pyinfra_deploy_uploads_files_over_sftp(h200, tmp_path):
    (tmp_path / "k3test.conf").write_text("uploaded by pyinfra\n")
    (tmp_path / "deploy.py").write_text(
        "from pyinfra import host\n"
        "from pyinfra.operations import files, server\n"
        f"files.put(name='upload', src={str(tmp_path / 'k3test.conf')!r}, dest='/etc/k3test.conf', mode='640')\n"
        "server.shell(name='mark rank', commands=[f\"echo {host.data.rank} > /etc/k3test.rank\"])\n"
    )
    exe = BIN / "pyinfra"
    res = subprocess.run([str(exe), h200["inventory"], str(tmp_path / "deploy.py"), "-y"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    for node in h200["nodes"]:
        r = ssh(h200, node["ip"], "stat -c %a /etc/k3test.conf; cat /etc/k3test.conf /etc/k3test.rank")
        assert r.stdout.split("\n")[:3] == ["640", "uploaded by pyinfra", str(node["rank"])]
    # a second run changes nothing for the upload (pyinfra compares checksums on the node)
    res = subprocess.run([str(exe), h200["inventory"], str(tmp_path / "deploy.py"), "-y"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert res.returncode == 0
    text = res.stdout + res.stderr
    upload = [ln.split() for ln in text.splitlines() if ln.strip().startswith("upload ")]
    assert upload and upload[0][1:] == ["2", "-", "-", "2"], text  # hosts, success, error, no change


@pytest.mark.sim
def test_base_root_is_cached_and_has_what_nodes_need(gb300):
    t0 = time.monotonic()
    res = k3_here("sim", "base")
    assert res.returncode == 0 and time.monotonic() - t0 < 5  # cached: no debootstrap
    path = Path(res.stdout.strip())
    assert path.name == f"base-{sim_base.base_id()}"
    assert json.loads((path / sim_base.MARKER).read_text())["packages"] == list(sim_base.PACKAGES)
    assert not list((path / "etc/ssh").glob("ssh_host_*"))  # each node gets its own host key
    r = ssh(gb300, gb300["nodes"][0]["ip"],
            "python3 -c 'import sys, http.server, ssl; print(sys.version_info >= (3, 11))';"
            " for c in ps ip curl dbus-daemon /usr/sbin/sshd systemctl;"
            " do command -v $c >/dev/null || echo missing $c; done")  # fmt: skip
    assert r.stdout.strip() == "True", r.stdout + r.stderr


@pytest.mark.sim
def test_simulated_tools_run_from_code_compiled_at_boot(gb300):
    # docker and the engine are small fronts over modules the node's boot compiled (warm.sh): a call loads their
    # code (python -v says which pyc "matches" which source) instead of compiling ~3000 lines each time
    ip = gb300["nodes"][1]["ip"]
    r = ssh(gb300, ip, "python3 -v /usr/lib/k3sim/tools/docker version --format '{{.Server.Version}}' 2>&1"
                       " | grep -E 'matches|^[0-9]'; python3 -v /usr/lib/k3sim/engine.py serve m1 m2 2>&1"
                       " | grep -E 'matches|error:'")
    lines = r.stdout.splitlines()
    for module in ("dockersim", "gotemplate", "k3simlib", "vllmsim"):
        assert any(f"/usr/lib/k3sim/__pycache__/{module}." in ln and f"matches /usr/lib/k3sim/{module}.py" in ln
                   for ln in lines), r.stdout + r.stderr
    assert "28.2.2" in lines and "vllm serve: error: unrecognized arguments: m2" in lines, lines   # they still answer
    for front in ("/usr/lib/k3sim/tools/docker", "/usr/lib/k3sim/engine.py"):
        assert int(ssh(gb300, ip, f"wc -l < {front}").stdout) < 30


@pytest.mark.sim
def test_writes_are_private_to_the_node(gb300):
    n1, n2 = gb300["nodes"]
    marker = "/etc/k3test-marker"
    assert ssh(gb300, n1["ip"], f"echo node1-only > {marker}").returncode == 0
    assert ssh(gb300, n1["ip"], f"cat {marker}").stdout.strip() == "node1-only"
    assert ssh(gb300, n2["ip"], f"test ! -e {marker}").returncode == 0
    assert not Path(marker).exists()
    st = present(sim.load_state("tgb300"))
    assert not (Path(st["base"]) / marker.lstrip("/")).exists()
    # node2's host key differs from node1's: every node has its own identity
    kh = (Path(gb300["inventory"]).parent / "known_hosts").read_text().splitlines()
    assert len({line.split()[2] for line in kh}) == 2


@pytest.mark.sim
def test_sshd_down_and_disk_full_faults():
    name = "tfault"
    cluster = bring_up(name, "h200", 2, "1:sshd-down", "0:disk-full")
    res = resources(name)
    try:
        n1, n2 = cluster["nodes"]
        assert not port_open(n2["ip"], 22)
        rc, out, text = pyinfra_exec(cluster["inventory"], "hostname")
        assert rc != 0  # one host unreachable: pyinfra reports the failure
        assert out[n1["name"]] == [n1["name"]]
        assert n2["name"] not in out or all(n2["name"] not in ln for ln in out[n1["name"]])
        assert f"[{n2['name']}]" in text
        # node2 is booted all the same: its systemd answers from inside
        pid1 = sim.node_init_pid(present(sim.load_state(name))["nodes"][1])
        r = subprocess.run(["nsenter", "-t", str(pid1), "-m", "-u", "-i", "-n", "-p", "systemctl",
                            "is-active", "ssh.service"], capture_output=True, text=True)  # fmt: skip
        assert r.stdout.strip() in ("inactive", "masked")
        # node1: its image/weights disk and docker's data dir are nearly full
        r = ssh(cluster, n1["ip"], "df -B1 --output=avail /var/lib/k3deploy /var/lib/k3sim/docker | tail -n +2")
        avail = [int(x) for x in r.stdout.split()]
        assert len(avail) == 2 and all(a < 2 * 2**20 for a in avail), r.stdout
        r = ssh(cluster, n1["ip"], "head -c 4194304 /dev/zero > /var/lib/k3deploy/blob")
        assert r.returncode != 0 and "No space left on device" in r.stderr
        # clear everything at runtime: node2 answers on ssh, node1 has room again
        r = k3_here("sim", "fault", name, "--clear")
        assert r.returncode == 0, r.stderr
        for _ in range(100):
            if port_open(n2["ip"], 22):
                break
            time.sleep(0.05)
        assert ssh(cluster, n2["ip"], "hostname").stdout.strip() == n2["name"]
        r = ssh(cluster, n1["ip"], "df -B1 --output=avail /var/lib/k3deploy | tail -n 1")
        assert int(r.stdout) > 2**40
        assert ssh(cluster, n1["ip"], "head -c 4194304 /dev/zero > /var/lib/k3deploy/blob").returncode == 0
        # switch faults on at runtime; the tools read the new node.json
        r = k3_here("sim", "fault", name, "1:disk-full", "0:sshd-down")
        assert r.returncode == 0, r.stderr
        doc = json.loads(ssh(cluster, n2["ip"], "cat /etc/k3sim/node.json").stdout)
        assert "1:disk-full" in doc["faults"]
        r = ssh(cluster, n2["ip"], "head -c 4194304 /dev/zero > /var/lib/k3sim/docker/blob")
        assert "No space left on device" in r.stderr
        assert not port_open(n1["ip"], 22)
        st = json.loads(k3_here("sim", "status", "--name", name, "--json").stdout)["clusters"][0]
        assert [n["faults"] for n in st["nodes"]] == [["0:sshd-down"], ["1:disk-full"]]
        assert [n["ssh"] for n in st["nodes"]] == [False, True]
        # clear one kind on one node; switch tool-side faults on node2 and read them back
        r = k3_here("sim", "fault", name, "--clear", "1:disk-full")
        assert r.returncode == 0, r.stderr
        r = k3_here("sim", "fault", name, "1:driver=570.86.15", "1:no-nvidia-smi")
        assert r.returncode == 0, r.stderr
        r = ssh(cluster, n2["ip"], "df -B1 --output=avail /var/lib/k3sim/docker | tail -n 1; command -v nvidia-smi")
        assert int(r.stdout.split()[0]) > 2**40 and r.returncode != 0  # room again; nvidia-smi gone
        r = k3_here("sim", "fault", name, "--clear", "1:no-nvidia-smi")
        assert r.returncode == 0, r.stderr
        r = ssh(cluster, n2["ip"], "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u")
        assert r.stdout.strip() == "570.86.15", r.stdout + r.stderr
        st = json.loads(k3_here("sim", "status", "--name", name, "--json").stdout)["clusters"][0]
        assert [n["faults"] for n in st["nodes"]] == [["0:sshd-down"], ["1:driver=570.86.15"]]
        r = k3_here("sim", "fault", name, "--clear", "1:melt")
        assert r.returncode == 2 and "bad fault to clear '1:melt'" in r.stderr
    finally:
        assert k3_here("sim", "down", "--name", name).returncode == 0
    assert leftovers(res) == []


@pytest.mark.sim
def test_down_removes_everything_and_up_recovers_from_a_crash():
    try:
        _crash_and_recover("tcrash")
    finally:
        sim.down("tcrash")


def _crash_and_recover(name: str) -> None:
    cluster = bring_up(name, "mi355x", 2)
    n1 = cluster["nodes"][0]
    # a service with a child process inside node1, so that there is more to stop than PID 1
    assert ssh(cluster, n1["ip"], "systemd-run --unit k3sleep sh -c 'sleep 600 & sleep 600'").returncode == 0
    before = resources(name)
    assert len(before["cg_pids"]) > 6
    # crash: node2's nspawn dies abruptly, the cluster is left half-alive
    os.kill(before["nspawn"][1][0], signal.SIGKILL)
    for _ in range(100):
        if not processes.alive(before["nspawn"][1][0]):
            break
        time.sleep(0.05)
    st = json.loads(k3_here("sim", "status", "--name", name, "--json").stdout)["clusters"][0]
    assert st["phase"] == "degraded"
    # up again cleans the leftovers first, then comes up
    again = bring_up_again(name)
    assert again["nodes"][1]["name"] == f"{name}-node2"
    assert ssh(again, again["nodes"][1]["ip"], "hostname").stdout.strip() == f"{name}-node2"
    # every process of the crashed cluster was stopped (by PID, found in its cgroups)
    for pid, start in before["starts"].items():
        stat = processes.proc_stat(pid)
        assert stat is None or stat[0] in ("Z", "X") or stat[1] != start, f"{pid} {processes.comm(pid)} survived"
    after = resources(name)
    # the leftover check sees every kind of resource while the cluster runs
    kinds = {item.split()[0] for item in leftovers(after)}
    assert kinds == {"netns", "veth", "bridge", "nspawn", "mount", "cgroup", "process", "state"}, kinds
    t0 = time.monotonic()
    assert k3_here("sim", "down", "--name", name).returncode == 0
    assert time.monotonic() - t0 < 20
    assert leftovers(after) == []
    # down again: nothing to do, still success
    r = k3_here("sim", "down", "--name", name)
    assert r.returncode == 0 and "nothing to do" in r.stderr


def bring_up_again(name: str, hardware: str = "mi355x", nodes: int = 2) -> dict:
    res = k3("sim", "up", "--hardware", hardware, "--nodes", str(nodes), "--name", name, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.sim
def test_up_after_a_killed_up_cleans_leftovers_first():
    name = "tkill"
    sim.down(name)
    exe = BIN / "k3deploy"
    proc = subprocess.Popen([str(exe), "sim", "up", "-H", "b200", "-n", "4", "--name", name, "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        # kill the CLI once it has started some nodes but before it has finished
        deadline = time.monotonic() + 60
        st = None
        while time.monotonic() < deadline:
            st = sim.load_state(name)
            if st and st.get("nodes") and st["nodes"][0].get("pid"):
                break
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        st = sim.load_state(name)
        assert st is not None and st["phase"] == "starting"
        crashed = resources(name)
        assert leftovers(crashed)
        again = bring_up_again(name, "b200", 2)
        assert [n["name"] for n in again["nodes"]] == [f"{name}-node1", f"{name}-node2"]
        # nodes 3 and 4 of the killed run are gone, with everything they had
        for r in crashed["state"]["nodes"][2:]:
            assert not Path(f"/run/netns/{r['netns']}").exists()
            assert not Path(f"/sys/class/net/{r['veth']}").exists()
        for pid, start in crashed["starts"].items():
            stat = processes.proc_stat(pid)
            assert stat is None or stat[0] in ("Z", "X") or stat[1] != start
        assert ssh(again, again["nodes"][1]["ip"], "hostname").stdout.strip() == f"{name}-node2"
        final = resources(name)
    finally:
        sim.down(name)
    assert leftovers(final) == []
