"""A site's own inventory, and what it may not hold: the connection settings of every group_vars file that applies
to a host reach pyinfra before it connects (``pyinfra`` runs through ``config.py``, k3deploy's own commands through
the loader), with the inventory's own data winning and ``vars`` naming each file; a group_vars file that is too
large or whose aliases expand without bound is refused in one line, quickly and in little memory; a host name that
would become a path outside ``export slurm``'s ``-o`` is refused and nothing is written."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest

from helpers import k3, pyinfra
from k3deploy.errors import K3Error
from k3deploy.model.variables import SSH_SETTINGS, _read_yaml
from k3deploy.runtime.connections import load_inventory, open_inventory

HOSTS = ('head = [("gpu01", {"ssh_hostname": "10.1.0.1", "k3_ip": "10.1.0.1"})]\n'
         'workers = [("gpu02", {"ssh_hostname": "10.1.0.2", "k3_ip": "10.1.0.2", "rank": 1}),\n'
         '           ("gpu03", {"ssh_hostname": "10.1.0.3", "k3_ip": "10.1.0.3", "rank": 2, "ssh_port": 2203})]\n'
         'spares = [("gpu04", {"ssh_hostname": "10.1.0.4", "k3_ip": "10.1.0.4"})]\n')

#: group_vars/<file> -> its text: every connection setting only here, in group files as much as in all.yml
GROUP_VARS = {
    "all.yml": "k3_hardware: h200\nk3_strategy: multi_node_tp\nssh_user: nobody\nssh_port: 2200\n"
               "ssh_known_hosts_file: /site/known_hosts\n",
    "site.yml": "ssh_key: /site/id_ed25519\n",          # the group named after the inventory file
    "head.yml": "ssh_user: head-admin\n",
    "workers.yml": "ssh_user: ops\n_sudo: true\n",
    "spares.yml": "ssh_user: standby\n",
}


def site(tmp_path: Path, hosts: str = HOSTS, **files: str) -> Path:
    """An inventory in its own directory (``site/site.py``) with its group_vars beside it, as ``sim up`` lays one
    out; no ``group_data/`` anywhere."""
    d = tmp_path / "site"
    (d / "group_vars").mkdir(parents=True)
    (d / "site.py").write_text(hosts)
    for name, text in {**GROUP_VARS, **files}.items():
        (d / "group_vars" / name).write_text(text)
    return d / "site.py"


#: what each host connects with: group files over all.yml, the inventory's own data over group_vars
EXPECTED = {
    "gpu01": {"ssh_user": "head-admin", "ssh_port": 2200, "ssh_key": "/site/id_ed25519"},
    "gpu02": {"ssh_user": "ops", "ssh_port": 2200, "ssh_key": "/site/id_ed25519", "_sudo": True},
    "gpu03": {"ssh_user": "ops", "ssh_port": 2203, "ssh_key": "/site/id_ed25519", "_sudo": True},
    "gpu04": {"ssh_user": "standby", "ssh_port": 2200, "ssh_key": "/site/id_ed25519"},
}


def test_k3deploy_connects_with_every_group_vars_file_of_a_host(tmp_path):
    inv = str(site(tmp_path))
    for state in (open_inventory(inv)[0], load_inventory(inv)):
        for host in state.inventory:
            connector = host.connector.data   # what the SSH connector takes when the state is initialised
            want = EXPECTED[host.name]
            assert {k: connector.get(k) for k in ("ssh_user", "ssh_port", "ssh_key")} == \
                {k: want[k] for k in ("ssh_user", "ssh_port", "ssh_key")}, host.name
            assert connector.get("ssh_known_hosts_file") == "/site/known_hosts"
            assert host.data.get("_sudo") == want.get("_sudo"), host.name


def test_pyinfra_connects_with_them_wherever_the_inventory_lives(tmp_path):
    inv = site(tmp_path)
    proc = pyinfra(str(inv), "debug-inventory", "--json", timeout=120, merged=False)
    assert proc.returncode == 0, proc.stderr
    hosts = {h["name"]: h["data"] for h in json.loads(proc.stdout)}
    for name, want in EXPECTED.items():
        assert {k: hosts[name].get(k) for k in want} == want, (name, hosts[name])


def test_vars_names_the_file_each_setting_came_from(tmp_path):
    inv = site(tmp_path)
    data = json.loads(k3("vars", str(inv), "--json", cwd=tmp_path).stdout)
    w = data["hosts"]["gpu02"]
    assert w["ssh_user"] == {"value": "ops", "from": "site/group_vars/workers.yml"}
    assert w["ssh_key"] == {"value": "/site/id_ed25519", "from": "site/group_vars/site.yml"}
    assert w["ssh_port"] == {"value": 2200, "from": "site/group_vars/all.yml"}
    assert data["hosts"]["gpu03"]["ssh_port"] == {"value": 2203, "from": "inventory host gpu03"}
    assert data["hosts"]["gpu01"]["ssh_user"]["from"] == "site/group_vars/head.yml"
    assert data["hosts"]["gpu04"]["ssh_user"]["from"] == "site/group_vars/spares.yml"
    assert set(data["files"]) == {f"site/group_vars/{f}" for f in GROUP_VARS}


def test_a_replica_group_file_applies_to_its_hosts(tmp_path):
    hosts = ('head = [("r0a", {"ssh_hostname": "10.1.0.1", "rank": 0}), ("r1a", {"ssh_hostname": "10.1.0.3", '
             '"rank": 0})]\nworkers = [("r0b", {"ssh_hostname": "10.1.0.2", "rank": 1}), ("r1b", {"ssh_hostname": '
             '"10.1.0.4", "rank": 1})]\nreplica1 = [("r1a", {}), ("r1b", {})]\n')
    inv = site(tmp_path, hosts, **{"replica1.yml": "k3_replica: 1\nssh_user: r1ops\n", "head.yml": "",
                                   "workers.yml": ""})
    state, wanted = open_inventory(str(inv))
    users = {h.name: h.connector.data.get("ssh_user") for h in state.inventory}
    assert users == {"r0a": "nobody", "r0b": "nobody", "r1a": "r1ops", "r1b": "r1ops"}
    assert wanted.resolved["r1b"].vars.k3_replica == 1


def test_a_group_vars_file_pyinfra_cannot_use_ends_the_run_in_one_line(tmp_path):
    inv = site(tmp_path, **{"workers.yml": "ssh_usr: ops\n"})
    proc = pyinfra(str(inv), "deploy/k3.py", "-y", timeout=120, merged=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ssh_usr" in ln]
    assert len(lines) == 1 and "group_vars/workers.yml: 'ssh_usr' is neither a k3deploy variable" in lines[0]
    assert "(did you mean ssh_user?)" in lines[0]
    assert "Traceback" not in proc.stderr and "Connecting" not in proc.stderr


def test_the_ssh_settings_are_those_of_pyinfras_ssh_connector():
    from pyinfra.connectors.ssh import SSHConnector

    assert set(SSH_SETTINGS) == set(SSHConnector.data_meta)


# ------------------------------------------------------------------------------------------ input bombs


def alias_bomb(levels: int) -> str:
    """A value of 9**levels strings built from ``levels`` lines of nested aliases."""
    names = "abcdefghijkl"
    lines = ["k3_hardware: h200", "k3_extra_env:", "  L0: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  L{i}: &{names[i]} [" + ", ".join([f"*{names[i - 1]}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [8, 9])
def test_an_alias_bomb_is_refused_while_parsing_quickly_and_in_little_memory(tmp_path, levels):
    path = tmp_path / "all.yml"
    path.write_text(alias_bomb(levels))
    tracemalloc.start()
    began = time.monotonic()
    try:
        with pytest.raises(K3Error) as refused:
            _read_yaml(path)
        took = time.monotonic() - began
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{path}:8: its YAML aliases expand to more than 100000 values (an alias bomb)" in str(refused.value)
    assert took < 0.5 and peak < 4 << 20, (took, peak)


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "all.yml"
    path.write_text("k3_hardware: h200\nk3_extra_args: &x [--a, *x]\n")
    with pytest.raises(K3Error, match="all.yml:2: an alias that contains itself expands without end"):
        _read_yaml(path)


def test_a_50_mb_group_vars_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "all.yml"
    with path.open("w") as fh:
        fh.write("k3_hardware: h200\n")
        fh.writelines(["# " + "c" * 97 + "\n"] * 500_000)
    tracemalloc.start()
    began = time.monotonic()
    try:
        with pytest.raises(K3Error) as refused:
            _read_yaml(path)
        took = time.monotonic() - began
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{path}: 50000018 bytes, over the limit of 1048576 for a YAML file" in str(refused.value)
    assert took < 0.1 and peak < 1 << 20, (took, peak)


def test_a_few_aliases_still_work(tmp_path):
    path = tmp_path / "all.yml"
    path.write_text("k3_hardware: h200\nk3_extra_env: &env {A: '1'}\nx: &args [--enforce-eager]\n")
    assert _read_yaml(path)["x"] == ["--enforce-eager"]


@pytest.mark.parametrize("command", [("plan",), ("vars",), ("resolve", "--inventory")])
def test_every_command_refuses_a_bomb_in_one_line(tmp_path, command):
    inv = site(tmp_path, **{"all.yml": alias_bomb(8)})
    proc = k3(*command, str(inv), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-500:] + proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "site/group_vars/all.yml:8: its YAML aliases" in proc.stderr


# -------------------------------------------------------------------------------------------- names as paths


def test_export_slurm_refuses_a_host_named_like_a_path(tmp_path):
    target = tmp_path / "x"
    hosts = HOSTS.replace('"gpu01"', repr(f"../../../..{target}"))
    inv = site(tmp_path, hosts, **{"all.yml": GROUP_VARS["all.yml"] + "k3_launcher: slurm\n"
                                             "k3_slurm_submit_host: gpu02\n"})
    out = tmp_path / "out" / "deep"
    proc = k3("export", "slurm", str(inv), "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-500:] + proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "host '../../../../tmp/" in proc.stderr and "is not a plain name" in proc.stderr
    assert not target.exists() and not out.exists()


@pytest.mark.parametrize("name", ["..", "a/b", "-rf", "a\\b", ".hidden", "tab\there"])
def test_a_host_name_that_is_not_one_path_component_is_refused(tmp_path, name):
    inv = site(tmp_path, HOSTS.replace('"gpu02"', repr(name)))
    proc = k3("plan", str(inv), cwd=tmp_path)
    assert proc.returncode == 2 and "is not a plain name" in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0


def test_a_group_name_that_is_not_one_path_component_is_refused(tmp_path):
    # a group's name would name its group_vars file
    inv = site(tmp_path, HOSTS + 'globals()["..weird"] = [("gpu02", {})]\n')
    proc = k3("plan", str(inv), cwd=tmp_path)
    assert proc.returncode == 2 and "group '..weird' is not a plain name" in proc.stderr, proc.stderr
