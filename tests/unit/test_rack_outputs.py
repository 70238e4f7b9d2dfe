"""Outputs sized for a rack: resolve prints what a group's nodes share once, then each node's differences; the
deploy's front router shows without an inventory; a flag that only moved shows as moved in a plan's diff."""

from __future__ import annotations

import shlex

import pytest

from helpers import k3
from k3deploy import resolve
from k3deploy.model.diff import change_lines, line_diff, unit_file_changes


def _rebuilt(shared_argv: list[str], sets: list[str]) -> list[str]:
    """The shared command with one node's variables filled in (as a shell would: $NODE_FLAGS word-split)."""
    values = dict(s.split("=", 1) for s in sets)
    out: list[str] = []
    for word in shared_argv:
        name = word[1:] if word.startswith("$") else None
        if name in values:
            out += " ".join(shlex.split(values[name])).split()
        else:
            out.append(word)
    return out


@pytest.mark.parametrize("strategy,nodes", [("multi_node_tp", 18), ("multi_node_dep", 8), ("multi_node_tp_dp", 4)])
def test_shared_command_with_a_nodes_line_is_that_nodes_command(recipe, strategy, nodes):
    from k3deploy.recipe.compact import Member, _items, shared_and_differences

    plan = resolve(recipe, hardware="gb300", strategy=strategy, nodes=nodes)
    engines = [n for n in plan.nodes if n.role in ("head", "worker")]
    shared = shared_and_differences([Member(f"rank {n.rank}", n.argv, n.env) for n in engines])
    for node, (_, sets, own_env) in zip(engines, shared.per_node, strict=True):
        rebuilt = _rebuilt(shared.argv, sets)
        assert rebuilt[:3] == node.argv[:3]
        assert sorted(_items(rebuilt[3:])) == sorted(_items(node.argv[3:]))
        assert {**shared.env, **own_env} == node.env


def test_resolve_of_a_rack_prints_the_shared_command_once():
    proc = k3("resolve", "--hardware", "gb300", "--nodes", "18")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("vllm serve") == 1, out
    assert len(out.splitlines()) < 80
    assert "## shared by the 18 engine nodes" in out
    assert "worker (rank 17), headless: NODE_RANK=17 NODE_FLAGS=--headless" in out
    assert "--node-rank $NODE_RANK" in out
    full = k3("resolve", "--hardware", "gb300", "--nodes", "18", "--full").stdout
    assert full.count("vllm serve") == 18
    small = k3("resolve", "--hardware", "gb300", "--nodes", "2").stdout
    assert small.count("vllm serve") == 2 and "shared by" not in small


def test_resolve_json_of_a_rack_keeps_every_node():
    import json

    data = json.loads(k3("resolve", "--hardware", "gb300", "--nodes", "18", "--json").stdout)
    assert len(data["nodes"]) == 18


def test_resolve_shows_the_router_the_deploy_puts_in_front_of_hybrid_lb_nodes():
    out = k3("resolve", "--hardware", "gb300", "--strategy", "multi_node_dep", "--nodes", "4").stdout
    assert "## router, port 30000 (added by the deploy" in out
    assert "http://$NODE3_IP:8000" in out and "vllm-router" in out
    tp = k3("resolve", "--hardware", "gb300", "--strategy", "multi_node_tp", "--nodes", "4").stdout
    assert "router" not in tp


def test_pd_router_is_not_called_headless():
    out = k3("resolve", "--hardware", "gb300", "--strategy", "pd_cluster", "--prefill-nodes", "2",
             "--decode-nodes", "4").stdout
    assert "## router, port $ROUTER_PORT" in out and "router, headless" not in out
    assert "## shared by the 4 decode nodes" in out


def _unit(argv: str) -> str:
    return f"[Service]\nExecStart=/usr/bin/docker run --rm --name k3 img:1 {argv}\n"


def test_a_flag_that_only_moved_shows_as_moved():
    old = _unit("vllm serve m --max-num-seqs 128 --tensor-parallel-size 8")
    new = _unit("vllm serve m --tensor-parallel-size 8 --max-num-seqs 128 --enforce-eager")
    lines = change_lines(unit_file_changes(old, new))
    assert lines == ["> --max-num-seqs 128 (moved)", "+ --enforce-eager"] or \
        lines == ["> --tensor-parallel-size 8 (moved)", "+ --enforce-eager"], lines
    assert not any(line.startswith(("- ", "+ --max", "+ --tensor")) for line in lines)


def test_a_changed_value_is_still_minus_and_plus():
    assert line_diff(["--a 1", "--b 2"], ["--b 2", "--a 3"]) == [("-", "--a 1"), ("+", "--a 3")]


def rack(tmp_path):
    """An inventory of 18 GB300 trays (inventories/site.py, group_vars/ beside it)."""
    inv = tmp_path / "inventories" / "site.py"
    inv.parent.mkdir(parents=True)
    workers = ", ".join(f'("n{i + 1}", {{"ssh_hostname": "192.0.2.{11 + i}", "k3_ip": "192.0.2.{11 + i}", '
                        f'"rank": {i}}})' for i in range(1, 18))
    inv.write_text(f'head = [("n1", {{"ssh_hostname": "192.0.2.11", "k3_ip": "192.0.2.11"}})]\n'
                   f'workers = [{workers}]\n')
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("k3_hardware: gb300\nk3_strategy: multi_node_tp\n")
    return inv


def test_resolve_of_a_rack_inventory_prints_the_shared_command_once_and_each_hosts_address(tmp_path):
    out = k3("resolve", "--inventory", str(rack(tmp_path))).stdout
    assert out.count("vllm serve") == 1 and out.count("/usr/bin/docker run") == 1
    assert "n18 (192.0.2.28): worker (rank 17), k3-engine.service: NODE_RANK=17 NODE_FLAGS=--headless" in out
    assert len(out.splitlines()) < 40
    full = k3("resolve", "--inventory", str(rack(tmp_path / "again")), "--full").stdout
    assert full.count("vllm serve") == 18


def test_the_offline_runbook_of_a_rack_writes_the_node_helper_once(tmp_path):
    from k3deploy.model.runbook import blocks
    from k3deploy.model.units import group_member_text

    inv = rack(tmp_path)
    out = tmp_path / "rb.md"
    proc = k3("runbook", str(inv), "-o", str(out), "--offline")
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    helper = group_member_text()
    assert text.count(helper.splitlines()[3]) == 1          # the script's text appears once
    shared = tmp_path / "rb-files" / "k3-group-member"
    written = [b for b in blocks(text) if b.node == "control" and f"cat > {shared} <<" in b.text]
    assert len(written) == 1 and helper in written[0].text
    copies = [b for b in blocks(text) if b.node == "control" and b.text.rstrip().endswith(f"< {shared}")]
    assert len(copies) == 18
    assert all("install -o 0 -g 0 -m 0755 /dev/stdin /usr/local/lib/k3deploy/k3-group-member" in b.text
               for b in copies)
    assert len(text.splitlines()) < 4100     # each env file names its node's compile caches (four lines)


def test_the_deploy_counts_the_checks_preflight_counts(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_runner", Path(__file__).parent / "test_preflight_runner.py")
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)   # its @fake GB300 trays (each node's facts from the fixtures)
    from k3deploy.preflight.across import BEYOND_PREFLIGHT, preflight_count
    from k3deploy.runtime import views
    from k3deploy.runtime.gather import gather

    inv = str(runner.write_fake_inventory(tmp_path))
    alone = gather(inv, views.PREFLIGHT).preflight
    deploy = gather(inv, views.DEPLOY).preflight
    assert alone is not None and deploy is not None
    assert len(deploy.results) > len(alone.results)          # the deploy also resolves the image's digest
    assert {r.check for r in deploy.results} - {r.check for r in alone.results} <= set(BEYOND_PREFLIGHT)
    said = preflight_count(deploy.results)
    assert said.startswith(f"{len(alone.results)} checks (as k3deploy preflight counts them) and image.digest")
    assert preflight_count(alone.results) == f"{len(alone.results)} checks"


def test_preflight_shows_the_derived_settings_as_the_env_file_gets_them():
    from k3deploy.cli.preflight import settings_lines
    from k3deploy.model.binding import BoundNode
    from k3deploy.model.rollout import engine_env
    from k3deploy.model.units import env_file_text
    from k3deploy.preflight.settings import HostSettings
    from k3deploy.recipe.plan import NodePlan

    derived = {"NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "=mlx5_0:1"}
    extra = {"NCCL_IB_HCA": "=mlx5_1:1", "NCCL_DEBUG": "INFO"}
    lines = settings_lines({"n1": HostSettings("n1", dict(derived))}, extra)
    node = BoundNode(NodePlan(role="head", rank=0, argv=[], env={}), [], {"NCCL_SOCKET_IFNAME": "$IFACE_NAME"},
                     "10.0.0.11")
    env_file = env_file_text(engine_env(node, derived, extra)).splitlines()
    shown = [w for w in lines[1].split(": ", 1)[1].split() if "=" in w and not w.endswith(")")]
    assert shown == ["NCCL_SOCKET_IFNAME==eth0", "GLOO_SOCKET_IFNAME=eth0", "NCCL_IB_HCA==mlx5_1:1"]
    assert set(shown) <= set(env_file)          # every value shown is a line of the env file
    assert "(k3_extra_env; derived: =mlx5_0:1)" in lines[1]
    assert "exact-name match" in lines[0]
