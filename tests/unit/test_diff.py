"""The plan model: ExecStart parsing, argv and env diffs, what restarts (no hosts needed)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import k3, present
from k3deploy.model.diff import (
    Installed,
    argv_lines,
    build,
    env_diff,
    image_of,
    line_diff,
    render_text,
)
from k3deploy.model.hosttext import exec_start, split_exec
from k3deploy.model.rollout import sha256
from k3deploy.model.units import exec_line
from k3deploy.runtime.gather import gather
from k3deploy.runtime.views import INVENTORY_ONLY


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00\r"),
                        min_size=1), min_size=1, max_size=6))
@settings(max_examples=200, deadline=None)
def test_split_exec_reads_back_what_the_unit_writer_quotes(argv):
    assert split_exec(exec_line(argv)) == argv


def test_split_exec_handles_unquoted_and_single_quoted_words():
    assert split_exec("/bin/echo  a 'b c' \"d\\\"e\" 100%% $$HOME") == ["/bin/echo", "a", "b c", 'd"e', "100%", "$HOME"]


@pytest.fixture(scope="module")
def gb300():
    return gather("inventories/gb300.py", INVENTORY_ONLY).require_rollout()


def installed_as_planned(r, running=True):
    return {(u.host, u.unit): Installed(u.unit_text, u.env_text, sha256(u.unit_text), sha256(u.env_text),
                                        "active" if running else "inactive") for u in r.units}


def test_image_and_argv_lines_of_the_planned_unit(gb300):
    head = gb300.units[0]
    argv = present(exec_start(head.unit_text))
    assert argv[:2] == ["/usr/bin/docker", "run"]
    assert image_of(argv) == gb300.plan.image
    lines = argv_lines(argv)
    assert lines[0] == "/usr/bin/docker run"
    assert "--name k3-engine" in lines and f"image {gb300.plan.image}" in lines
    # the engine's own flags: one flag with its value per line, exactly the plan's argv after `vllm serve`
    engine = lines[lines.index(f"image {gb300.plan.image}") + 1:]
    assert engine[0] == gb300.plan.model
    assert " ".join(engine).split(" ") == " ".join(head.node.argv[2:]).split(" ")
    assert "--tensor-parallel-size 8" in engine


def test_env_diff_masks_secret_names():
    old = "A=1\nHF_TOKEN=hf_old_secret\nB=2\n"
    new = "A=1\nB=3\nMY_API_KEY=abc\nC=4\n"
    diff = env_diff(old, new)
    assert {"op": "~", "name": "B", "from": "2", "to": "3"} in diff
    assert {"op": "+", "name": "MY_API_KEY", "from": None, "to": "****"} in diff
    assert {"op": "-", "name": "HF_TOKEN", "from": "****", "to": None} in diff
    assert "hf_old_secret" not in json.dumps(diff) and "abc" not in json.dumps(diff)


def test_line_diff_reports_an_insertion_as_one_added_line():
    assert line_diff(["a", "b", "c"], ["a", "b", "x", "c"]) == [("+", "x")]
    assert line_diff(["a", "b"], ["a", "c"]) == [("-", "b"), ("+", "c")]


def test_nothing_to_do_when_the_hosts_run_the_plan(gb300):
    report = build(gb300, installed_as_planned(gb300))
    assert report.exit_code == 0 and report.restart_order == []
    assert all(not h.changes for h in report.hosts)
    assert "No changes" in render_text(report, gb300)


def test_never_deployed_everything_changes_head_first(gb300):
    report = build(gb300, {})
    assert report.exit_code == 3
    assert report.restart_order == ["gb300-node1:k3-engine.service", "gb300-node2:k3-engine.service"]
    for h in report.hosts:
        assert any(c["kind"] == "image" and c["from"] is None for c in h.changes)
        assert any(c["kind"] == "file" and c["path"].endswith(".env") for c in h.changes)


def test_one_changed_flag_on_the_worker_restarts_the_whole_group(gb300):
    installed = installed_as_planned(gb300)
    worker = gb300.units[1]
    old = worker.unit_text.replace('"--gpu-memory-utilization" "0.95"', '"--gpu-memory-utilization" "0.9"')
    assert old != worker.unit_text
    installed[(worker.host, worker.unit)] = Installed(old, worker.env_text, sha256(old), sha256(worker.env_text),
                                                      "active")
    report = build(gb300, installed)
    assert report.exit_code == 3
    assert report.restart_order == ["gb300-node1:k3-engine.service", "gb300-node2:k3-engine.service"]
    head, w = report.hosts
    assert head.changes == [{"kind": "restart", "unit": "k3-engine.service", "position": 1, "group": "engine",
                             "reason": "group engine restarts"}]
    assert [c for c in w.changes if c["kind"] == "argv"] == [
        {"kind": "argv", "unit": "k3-engine.service", "op": "-", "line": "--gpu-memory-utilization 0.9"},
        {"kind": "argv", "unit": "k3-engine.service", "op": "+", "line": "--gpu-memory-utilization 0.95"}]
    text = render_text(report, gb300)
    assert "- --gpu-memory-utilization 0.9\n" in text and "+ --gpu-memory-utilization 0.95\n" in text
    # the restart as it will run: phases, each on its hosts at once (not a node-by-node order)
    phases = text.split("Restart, in this order (each phase on its hosts at once):\n", 1)[1].splitlines()[:6]
    assert phases == [
        "  1. stop workers: gb300-node2: k3-engine.service",
        "  2. stop heads: gb300-node1: k3-engine.service",
        "  3. start heads: gb300-node1: k3-engine.service",
        "  4. workers wait for the head's rendezvous port: gb300-node2 -> 192.0.2.11:29501",
        "  5. start workers: gb300-node2: k3-engine.service",
        "  6. engine groups serve: engine",
    ]


def test_an_image_change_is_shown_as_now_to_planned(gb300):
    installed = installed_as_planned(gb300)
    for u in gb300.units:
        old = u.unit_text.replace(f'"{gb300.plan.image}"', '"vllm/vllm-openai:v0.32.0"')
        installed[(u.host, u.unit)] = Installed(old, u.env_text, sha256(old), sha256(u.env_text), "active")
    report = build(gb300, installed)
    for h in report.hosts:
        assert [c for c in h.changes if c["kind"] in ("image", "argv")] == [
            {"kind": "image", "unit": "k3-engine.service", "from": "vllm/vllm-openai:v0.32.0",
             "to": gb300.plan.image}]
    assert f"image: vllm/vllm-openai:v0.32.0 -> {gb300.plan.image}" in render_text(report, gb300)


def test_a_stopped_unit_restarts_its_group(gb300):
    installed = installed_as_planned(gb300)
    head = gb300.units[0]
    installed[(head.host, head.unit)] = replace(installed[(head.host, head.unit)], active="failed")
    report = build(gb300, installed)
    assert report.exit_code == 3 and len(report.restart_order) == 2
    assert report.hosts[0].changes[0]["reason"] == "not running (failed)"


def test_pd_cluster_router_restarts_after_the_pools():
    r = gather("inventories/pd_b300.py", INVENTORY_ONLY).require_rollout()
    installed = installed_as_planned(r)
    decode = next(u for u in r.units if u.group == "decode")
    installed[(decode.host, decode.unit)] = replace(installed[(decode.host, decode.unit)], active="inactive")
    report = build(r, installed)
    groups = [key.split(":")[1] for key in report.restart_order]
    assert groups[-1].endswith("router.service")
    assert all("prefill" not in g for g in groups)  # the prefill pool keeps running


def test_resolve_inventory_fills_the_placeholders():
    out = k3("resolve", "--inventory", "inventories/gb300.py")
    assert out.returncode == 0, out.stderr
    assert "$HEAD_IP" not in out.stdout
    for host, rank in (("gb300-node1", 0), ("gb300-node2", 1)):
        section = out.stdout.split(f"## {host}:")[1].split("\n## ")[0]
        assert f"--node-rank {rank}" in section and "--master-addr 192.0.2.11" in section
        assert "vllm serve moonshotai/Kimi-K3" in section and "/usr/bin/docker run" in section
    data = json.loads(k3("resolve", "--inventory", "inventories/gb300.py", "--json").stdout)
    assert [u["host"] for u in data["units"]] == ["gb300-node1", "gb300-node2"]
    assert data["units"][1]["argv"][data["units"][1]["argv"].index("--master-addr") + 1] == "192.0.2.11"


def test_resolve_inventory_rejects_a_second_selection():
    out = k3("resolve", "--inventory", "inventories/gb300.py", "--hardware", "b300")
    assert out.returncode == 2 and "--hardware cannot be combined with --inventory" in out.stderr


def test_plan_bad_input_and_unreachable_hosts_exit_2(tmp_path):
    missing = k3("plan", str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and "nope.py" in missing.stderr and "Traceback" not in missing.stderr
    inv = tmp_path / "closed.py"
    inv.write_text("head = [('n1', {'ssh_hostname': '127.0.0.1', 'ssh_port': 1, 'k3_ip': '127.0.0.1'})]\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("k3_hardware: b300\n")
    closed = k3("plan", str(inv))
    assert closed.returncode == 2, closed.stdout + closed.stderr
    assert closed.stderr.startswith("error: cannot reach n1: ") and "Traceback" not in closed.stderr
