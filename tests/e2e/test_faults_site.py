"""A site's own inventory on a simulated 2-node cluster: the inventory in its own directory, its connection settings
(``ssh_user``, ``ssh_key``, the known hosts) only in the group_vars beside it, spread over ``all.yml``, the file
named after the inventory and the group files: the deploy connects and serves, ``preflight`` and ``status``
connect, ``vars`` names each setting's file. Then, on that serving cluster, what a site's files may not hold: a
group_vars file of nested aliases (a YAML bomb) or of 50 MB, and a host named ``../../../../tmp/x`` that ``export
slurm`` would write outside ``-o``, are each refused in one line, exit 2, before any host is touched: the cluster
keeps serving its recorded revision."""

from __future__ import annotations

import ast
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import deploy, k3, k3_here, preflight, why
from helpers.simulated import Sim, endpoint_of, openai_client

pytestmark = [pytest.mark.sim, pytest.mark.faults]

#: what a node holds of the deploy: k3deploy's files with their hashes, and when the engine unit started
NODE_STATE = ("find /etc/k3deploy -type f ! -name deploy.lock -exec sha256sum {} + | sort; "
              "systemctl show k3-engine.service -p ActiveEnterTimestamp -p NRestarts")


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    s = Sim("sisite", "h200", 2)
    s.set_vars("k3_strategy: multi_node_tp\n")
    inventory = Path(s.inventory)
    text = inventory.read_text()
    found = re.search(r"^_ssh = (\{.*\})$", text, re.M)
    assert found, text
    ssh = ast.literal_eval(found.group(1))
    # the connection settings leave the inventory: only its group_vars hold them (no group_data/ anywhere)
    inventory.write_text(re.sub(r"^_ssh = .*\n", "", text, flags=re.M).replace("{**_ssh, **{", "{**{"))
    assert "ssh_user" not in inventory.read_text() and not (inventory.parent / "group_data").exists()
    gv = inventory.parent / "group_vars"
    s.set_vars(f"ssh_user: nobody\nssh_known_hosts_file: {ssh['ssh_known_hosts_file']}\n"
               f"ssh_strict_host_key_checking: 'yes'\n")
    (gv / f"{inventory.stem}.yml").write_text(f"ssh_key: {ssh['ssh_key']}\n")   # the inventory's own group
    for group in ("head", "workers"):
        (gv / f"{group}.yml").write_text(f"ssh_user: {ssh['ssh_user']}\n")      # beats all.yml's
    try:
        yield s
    finally:
        s.down()


def node_state(sim: Sim) -> list[str]:
    out = []
    for rank in (0, 1):
        proc = sim.ssh(rank, NODE_STATE)
        assert proc.returncode == 0, proc.stderr
        out.append(proc.stdout)
    return out


def test_connection_settings_only_in_group_vars_deploy_end_to_end(sim):
    inv = sim.inventory
    shown = json.loads(k3_here("vars", inv, "--json", check=True).stdout)   # reads no host: in this process
    head, worker = (shown["hosts"][h] for h in list(shown["hosts"])[:2])
    stem = Path(inv).stem
    assert head["ssh_user"]["value"] == "root" and head["ssh_user"]["from"].endswith("group_vars/head.yml")
    assert worker["ssh_user"]["from"].endswith("group_vars/workers.yml")
    assert worker["ssh_key"]["from"].endswith(f"group_vars/{stem}.yml")
    assert worker["ssh_known_hosts_file"]["from"].endswith("group_vars/all.yml")

    rc, report = preflight(inv)
    assert rc == 0, json.dumps(report)[-2000:]
    assert set(shown["hosts"]) <= set(report["hosts"])
    assert not [r for h in report["hosts"].values() for r in h["results"] if r["check"] == "host.reachable"]

    run = deploy(inv)
    assert run.returncode == 0, why(run)
    assert "is not what pyinfra connected with" not in run.stdout
    assert "Kimi-K3" in openai_client(endpoint_of(run.stdout))
    status = k3("status", inv)
    assert status.returncode == 0 and "cluster: serving" in status.stdout, status.stdout[-1500:] + status.stderr


def refused_everywhere(sim: Sim, needle: str, *commands: tuple[str, ...]) -> None:
    """``plan``, ``status``, the deploy (and ``commands``) refuse in one line with ``needle``, exit 2, in seconds;
    nothing on the nodes changed and the cluster serves on."""
    before = node_state(sim)
    for command in (("plan",), ("status",), *commands):
        began = time.monotonic()
        proc = k3(*command, sim.inventory)
        took = time.monotonic() - began
        assert proc.returncode == 2, (command, proc.stdout[-500:], proc.stderr)
        assert needle in proc.stderr and proc.stderr.strip().count("\n") == 0, (command, proc.stderr)
        assert "Traceback" not in proc.stderr and len(proc.stderr) < 600
        assert took < 30, (command, took)   # the process's start included; the refusal itself is instant
    began = time.monotonic()
    run = deploy(sim.inventory, timeout=120)
    assert run.returncode == 2, why(run)
    assert sum(needle in line for line in run.stdout.splitlines()) == 1 and "Traceback" not in run.stdout, why(run)
    assert "Connecting to hosts" not in run.stdout and time.monotonic() - began < 30, why(run)
    assert node_state(sim) == before


@pytest.mark.parametrize("bomb, needle", [
    ("".join([
        "k3_extra_env:\n", "  L0: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
        *(f"  L{i}: &{'abcdefgh'[i]} [" + ", ".join([f"*{'abcdefgh'[i - 1]}"] * 9) + "]\n" for i in range(1, 8)),
    ]), "workers.yml:8: its YAML aliases expand to more than 100000 values (an alias bomb)"),
    ("# " + "c" * 97 + "\n", "workers.yml: 50000000 bytes, over the limit of 1048576 for a YAML file"),
])
def test_a_group_vars_bomb_is_refused_and_the_cluster_serves_on(sim, bomb, needle):
    path = Path(sim.inventory).parent / "group_vars" / "workers.yml"
    before = path.read_text()
    with path.open("w") as fh:
        if bomb.startswith("#"):
            fh.writelines([bomb] * 500_000)
        else:
            fh.write(before + bomb)
    try:
        refused_everywhere(sim, needle, ("vars",))
    finally:
        path.write_text(before)
    assert "cluster: serving" in k3("status", sim.inventory).stdout


def test_a_host_named_like_a_path_is_refused_and_nothing_is_written_outside(sim, tmp_path):
    inventory = Path(sim.inventory)
    text = inventory.read_text()
    worker = sim.info["nodes"][1]["name"]
    escape = tmp_path / "escaped"
    hostile = text.replace(repr(worker), repr(f"../../../..{escape}"), 1)
    assert hostile != text
    inventory.write_text(hostile)
    out = tmp_path / "out"
    try:
        refused_everywhere(sim, "is not a plain name", ("export", "slurm", "-o", str(out)),
                           ("export", "kubernetes", "-o", str(out)))
    finally:
        inventory.write_text(text)
    assert not escape.exists() and not out.exists()
    assert "cluster: serving" in k3("status", sim.inventory).stdout
