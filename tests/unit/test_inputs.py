"""Bad input: one clear line naming the value and the fix, exit code 2, never a traceback."""

from __future__ import annotations

import hashlib
import sys

import pytest

from helpers import ROOT, k3, k3_here
from k3deploy import RecipeError, SelectionError, load_recipe, parse_recipe, resolve

K3 = sys.executable, "-m", "k3deploy"


def test_vendored_recipe_is_the_upstream_file_byte_for_byte():
    data = (ROOT / "recipes" / "kimi-k3.yaml").read_bytes()
    assert hashlib.sha256(data).hexdigest() == "2293186a1276dc7ac82d9b02c65844416a5e2664d224de3d46cd5763f05b9953"
    assert (ROOT / "k3deploy" / "data" / "kimi-k3.yaml").read_bytes() == data


@pytest.mark.parametrize("args, needle", [
    (["--hardware", "b900"], "unknown hardware 'b900'"),
    (["--hardware", "b300", "--strategy", "multi_node_magic"], "unknown strategy 'multi_node_magic'"),
    (["--hardware", "b300", "--variant", "fp8"], "unknown variant 'fp8'"),
    (["--hardware", "b300", "--features", "dcp"], "unknown feature 'dcp'"),
    (["--hardware", "h200", "--strategy", "multi_node_dep"], "multi_node_dep is not offered on h200"),
    (["--hardware", "h200", "--variant", "nvfp4"], "variant nvfp4 of kimi-k3 does not support h200"),
    (["--hardware", "ascend_910c"], "use --variant ascend_w4a8"),
    (["--hardware", "gb200", "--strategy", "multi_node_tp", "--nodes", "2"],
     "multi_node_tp on gb200 needs ≥16 GPUs = 4 nodes of 4"),
    (["--hardware", "b300", "--nodes", "0"], "--nodes must be ≥ 1, got 0"),
    (["--hardware", "b300", "--nodes", "-3"], "--nodes must be ≥ 1, got -3"),
    (["--hardware", "b300", "--strategy", "multi_node_tp", "--nodes", "257"], "--nodes must be ≤ 256, got 257"),
    (["--hardware", "b300", "--nodes", "2"], "single_node_tp runs on exactly 1 node"),
    (["--hardware", "b300", "--strategy", "multi_node_tp", "--nodes", "1"], "needs at least 2 nodes"),
    (["--hardware", "b300", "--strategy", "pd_cluster", "--prefill-nodes", "1"], "give both --prefill-nodes"),
    (["--hardware", "b300", "--strategy", "pd_cluster", "--prefill-nodes", "1", "--decode-nodes", "1"],
     "the decode pool (dep) on b300 needs ≥16 GPUs = 2 nodes of 8"),
    (["--hardware", "b300", "--prefill-nodes", "1", "--decode-nodes", "2"], "apply to pd_cluster only"),
    (["--hardware", "b300", "--image", "@sha256:1234"], "is not of the form @sha256:"),
    (["--hardware", "b300", "--image", "Not A Ref"], "is not a pinned image reference"),
    (["--hardware", "b300", "--recipe", "/nonexistent/k.yaml"], "recipe file /nonexistent/k.yaml not found"),
    ([], "missing --hardware"),
])
def test_cli_bad_input(args, needle):
    proc = k3_here("resolve", *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_cli_bad_integer_is_usage_error():
    proc = k3_here("resolve", "--hardware", "b300", "--nodes", "two")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "'two'" in proc.stderr


def test_malformed_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("meta:\n  slug: x\nmodel:\n  model_id: [unclosed\nvariants: {}\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(bad)
    assert str(bad) in str(exc.value) and ":5:" in str(exc.value)
    proc = k3_here("resolve", "--hardware", "b300", "--recipe", str(bad))
    assert proc.returncode == 2 and f"{bad}:5:" in proc.stderr and "Traceback" not in proc.stderr


def test_missing_required_key_names_key_path(tmp_path):
    p = tmp_path / "nomodel.yaml"
    p.write_text("meta: {slug: x}\nmodel: {min_vllm_version: '1'}\nvariants: {default: {}}\n")
    with pytest.raises(RecipeError, match=r"required key 'model.model_id' is missing"):
        load_recipe(p)


def test_unquoted_number_arg_names_key_path_and_fix():
    text = (ROOT / "recipes" / "kimi-k3.yaml").read_text().replace('- "0.95"\n', "- 0.95\n", 1)
    with pytest.raises(RecipeError) as exc:
        parse_recipe(text, "k.yaml")
    assert "model.base_args.2" in str(exc.value) and 'quote it: "0.95"' in str(exc.value)


def test_wrong_type_names_key_path():
    text = (ROOT / "recipes" / "kimi-k3.yaml").read_text().replace("vram_minimum_gb: 1680", "vram_minimum_gb: lots")
    with pytest.raises(RecipeError, match=r"variants\.default\.vram_minimum_gb"):
        parse_recipe(text, "k.yaml")


def test_not_a_mapping():
    with pytest.raises(RecipeError, match="a recipe is a YAML mapping"):
        parse_recipe("- a\n- b\n", "list.yaml")


def test_feature_outside_its_strategies_is_reported_not_silent(recipe):
    plan = resolve(recipe, hardware="b200", strategy="multi_node_tp_pp", features=["spec_decoding", "reasoning"])
    assert plan.features == ["reasoning"]
    assert any("spec_decoding does not apply to multi_node_tp_pp" in w for w in plan.warnings)
    assert "--speculative-config" not in plan.nodes[0].argv


def test_feature_order_follows_the_recipe(recipe):
    a = resolve(recipe, hardware="b300", features=["reasoning", "tool_calling"])
    b = resolve(recipe, hardware="b300", features=["tool_calling", "reasoning"])
    assert a.nodes[0].argv == b.nodes[0].argv and a.features == ["tool_calling", "reasoning"]
    none = resolve(recipe, hardware="b300", features=[])
    assert "--reasoning-parser" not in none.nodes[0].argv


def test_image_overrides(recipe):
    digest = "sha256:" + "ab" * 32
    assert resolve(recipe, hardware="b300").image == "vllm/vllm-openai:kimi-k3"
    assert resolve(recipe, hardware="mi355x").image == "vllm/vllm-openai-rocm:kimi-k3"
    asc = resolve(recipe, hardware="ascend_910c", variant="ascend_w4a8")
    assert asc.image == "quay.io/ascend/vllm-ascend:kimi-k3-a3" and asc.vendor == "npu"
    assert resolve(recipe, hardware="b300", image="@" + digest).image == "vllm/vllm-openai:kimi-k3@" + digest
    assert resolve(recipe, hardware="b300", image=":nightly").image == "vllm/vllm-openai:nightly"
    assert resolve(recipe, hardware="b300", image="registry.local:5000/vllm/k3:v1").image == "registry.local:5000/vllm/k3:v1"
    with pytest.raises(SelectionError):
        resolve(recipe, hardware="b300", image="vllm/vllm-openai")  # unpinned: no tag, no digest


# ------------------------------------------------------------------ inventory variables (group_vars, host data)


def inventory(tmp_path, all_yml: str, hosts: str | None = None):
    """inventories/site.py with group_vars/all.yml one level up (the project layout)."""
    inv = tmp_path / "inventories" / "site.py"
    inv.parent.mkdir(parents=True)
    inv.write_text(hosts or ('head = [("n1", {"ssh_hostname": "192.0.2.11", "k3_ip": "192.0.2.11"})]\n'
                             'workers = [("n2", {"ssh_hostname": "192.0.2.12", "k3_ip": "192.0.2.12", "rank": 1})]\n'))
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("k3_hardware: gb300\nk3_strategy: multi_node_tp\n" + all_yml)
    return inv


def refused(tmp_path, all_yml: str, hosts: str | None = None) -> str:
    """The one line ``resolve --inventory`` refuses these variables with."""
    proc = k3_here("resolve", "--inventory", str(inventory(tmp_path, all_yml, hosts)))
    assert proc.returncode == 2, (proc.stdout[-500:], proc.stderr)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert len(proc.stderr) < 600, proc.stderr    # a long value is shown cut short
    return proc.stderr


HOSTILE_IP = "10.0.0.2/29501' ; touch /tmp/pwned ; echo '"
NO_IP = ('head = [("n1", {"ssh_hostname": "192.0.2.11"})]\n'
         'workers = [("n2", {"ssh_hostname": "192.0.2.12", "rank": 1})]\n')


@pytest.mark.parametrize("all_yml, hosts, needles", [
    # addresses and host names: an IP address or an RFC 1123 host name
    ("", f'head = [("n1", {{"k3_ip": {HOSTILE_IP!r}}})]\n',
     ["variable k3_ip", "is not an IP address or host name"]),
    (f'k3_ip: "{HOSTILE_IP}"\n', NO_IP, ["group_vars/all.yml: variable k3_ip", "is not an IP address or host name"]),
    ('k3_router_host: "0.0.0.0; reboot"\n', None, ["variable k3_router_host", "is not an IP address or host name"]),
    ("", 'head = [("n1", {"ssh_hostname": "$(reboot)"})]\n', ["ssh_hostname", "is not an IP address or host name"]),
    ("ssh_hostname: 'a b'\n", None, ["group_vars/all.yml: ssh_hostname", "is not an IP address or host name"]),
    ("", 'head = [("n1;reboot", {})]\n', ["host 'n1;reboot'", "is not an IP address or host name"]),
    # limits: the variable, its length and the limit
    ('k3_extra_args: ["--served-model-name", "' + "x" * 65536 + '"]\n', None,
     ["variable k3_extra_args", "item 1 is 65536 characters long, over the limit of 4096"]),
    ('k3_extra_args: ["--served-model-name", "' + "x" * 300 + '"]\n', None,
     ["variable k3_extra_args", "the served model name is 300 characters long, over the limit of 256"]),
    ('k3_extra_args: ["--served-model-name=' + "x" * 300 + '"]\n', None, ["served model name is 300 characters"]),
    ("k3_extra_args: [" + ", ".join(['"' + "y" * 4000 + '"'] * 20) + "]\n", None,
     ["variable k3_extra_args", "80020 characters long together, over the limit of 65536"]),
    ('k3_hf_endpoint: "https://' + "h" * 5000 + '"\n', None,
     ["variable k3_hf_endpoint", "5008 characters long, over the limit of 4096"]),
    ('k3_extra_env: {A: "' + "v" * 5000 + '"}\n', None,
     ["variable k3_extra_env", "the value of A is 5000 characters long, over the limit of 4096"]),
    # validation gaps
    ("k3_unit_name: '../../tmp/evil'\n", None, ["variable k3_unit_name", "'../../tmp/evil' is not a plain unit name"]),
    ("k3_unit_name: 'k3 engine'\n", None, ["variable k3_unit_name", "is not a plain unit name"]),
    ("k3_config_dir: etc/k3deploy\n", None, ["variable k3_config_dir", "is not an absolute path without '..'"]),
    ("k3_model_cache: /var/lib/../../tmp\n", None, ["variable k3_model_cache", "absolute path without '..'"]),
    ("k3_stage_dir: stage\n", None, ["variable k3_stage_dir", "absolute path"]),
    ("k3_router_bin: vllm-router\n", None, ["variable k3_router_bin", "absolute path"]),
    ("k3_rendezvous_timeout: 0\n", None, ["variable k3_rendezvous_timeout", "greater than 0"]),
    ("k3_engine_ready_timeout: -5\n", None, ["variable k3_engine_ready_timeout", "greater than 0"]),
    ("k3_drain_timeout: 0\n", None, ["variable k3_drain_timeout", "greater than 0"]),
    ("k3_poll_interval: -1\n", None, ["variable k3_poll_interval", "greater than 0"]),
    ("k3_poll_interval: 0\n", None, ["variable k3_poll_interval", "greater than 0"]),
    ("k3_heal_interval: 0\n", None, ["variable k3_heal_interval"]),
    ("k3_rollout_deadline: 0\n", None, ["variable k3_rollout_deadline", "greater than 0"]),
    ('k3_extra_env: {A: "x\\ry"}\n', None, ["variable k3_extra_env", "the value of A holds the control character '\\r'"]),
    ('k3_extra_env: {A: "x\\ny"}\n', None, ["variable k3_extra_env", "control character '\\n'"]),
    ('k3_extra_env: {A: "x\\0y"}\n', None, ["variable k3_extra_env", "control character '\\x00'"]),
    ('k3_extra_env: {A: "x\\ey"}\n', None, ["variable k3_extra_env", "control character '\\x1b'"]),
    ('k3_extra_args: ["--max-num-seqs", "64\\n--x"]\n', None, ["variable k3_extra_args", "item 1 holds the control "
                                                                "character '\\n'"]),
    ('k3_extra_args: ["--served-model-name", "a\\tb"]\n', None, ["item 1 holds the control character '\\t'"]),
    ('k3_iface: "eth0\\nNCCL_X=1"\n', None, ["variable k3_iface", "control character '\\n'"]),
    ("k3_dp_rpc_port: 70000\n", None, ["variable k3_dp_rpc_port", "less than or equal to 65535"]),
])
def test_inventory_bad_value_is_one_line(tmp_path, all_yml, hosts, needles):
    line = refused(tmp_path, all_yml, hosts)
    for needle in needles:
        assert needle in line, line


def test_duplicate_key_in_group_vars_names_file_key_and_line(tmp_path):
    line = refused(tmp_path, "k3_unit_name: a\nk3_poll_interval: 2\nk3_unit_name: b\n")
    assert "group_vars/all.yml:5: duplicate key 'k3_unit_name' (first on line 3)" in line, line
    (tmp_path / "group_vars" / "all.yml").write_text("k3_hardware: gb300\nk3_extra_env: {A: '1', A: '2'}\n")
    proc = k3_here("resolve", "--inventory", str(tmp_path / "inventories" / "site.py"))
    assert proc.returncode == 2 and "all.yml:2: duplicate key 'A' (first on line 2)" in proc.stderr, proc.stderr


def test_good_values_pass(tmp_path):
    inv = inventory(tmp_path, 'k3_ip: "fd00::2"\nk3_router_host: router-1.example.org\nk3_unit_name: k3-engine_2.b\n'
                    'k3_extra_args: ["--served-model-name", "org/Kimi\\\\K3"]\nk3_extra_env: {A: "tab-free"}\n'
                    "k3_config_dir: /etc/k3deploy/site\n")
    proc = k3_here("resolve", "--inventory", str(inv))
    assert proc.returncode == 0, proc.stderr


def test_plan_refuses_a_hostile_address_before_reading_a_host(tmp_path):
    inv = inventory(tmp_path, f'k3_ip: "{HOSTILE_IP}"\n', NO_IP)
    proc = k3("plan", str(inv))
    assert proc.returncode == 2 and "variable k3_ip" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
