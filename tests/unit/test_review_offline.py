"""Review before change, without a cluster: validated variables with their provenance, pyinfra's connection
settings in group_vars, engine flags checked before anything changes, refusals printed once with a non-zero
exit (``@fake`` hosts: pyinfra's own connector without SSH), revisions and rollback targets, and fixes that
point the right way."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import FAKE_HOSTS, ROOT, k3, k3_here, pyinfra


def layout(tmp_path: Path, all_yml: str, group_yml: str = "", hosts: str | None = None) -> Path:
    """A project layout: inventories/site.py with its group_vars/ one level up."""
    inv = tmp_path / "inventories" / "site.py"
    inv.parent.mkdir(parents=True)
    inv.write_text(hosts or (
        'head = [("n1", {"ssh_hostname": "192.0.2.11", "k3_ip": "192.0.2.11"})]\n'
        'workers = [("n2", {"ssh_hostname": "192.0.2.12", "k3_ip": "192.0.2.12", "rank": 1})]\n'))
    gv = tmp_path / "group_vars"
    gv.mkdir()
    (gv / "all.yml").write_text(all_yml)
    if group_yml:
        (gv / "site.yml").write_text(group_yml)
    return inv


SELECTION = "k3_hardware: gb300\n"


# ------------------------------------------------------------------------------------------- provenance


def test_vars_names_the_file_of_every_value(tmp_path):
    inv = layout(tmp_path, SELECTION + "k3_poll_interval: 2.0\n", "k3_strategy: multi_node_tp\n")
    proc = k3_here("vars", str(inv), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["files"] == ["group_vars/all.yml", "group_vars/site.yml"]
    n2 = data["hosts"]["n2"]
    assert n2["k3_hardware"] == {"value": "gb300", "from": "group_vars/all.yml"}
    assert n2["k3_strategy"] == {"value": "multi_node_tp", "from": "group_vars/site.yml"}
    assert n2["k3_ip"] == {"value": "192.0.2.12", "from": "inventory host n2"}
    everything = json.loads(k3_here("vars", str(inv), "--host", "n1", "--all", "--json", cwd=tmp_path).stdout)
    assert everything["hosts"]["n1"]["k3_unit_name"] == {"value": "k3-engine", "from": "default"}
    assert list(everything["hosts"]) == ["n1"]
    resolved = json.loads(k3_here("resolve", "--inventory", str(inv), "--json", cwd=tmp_path).stdout)
    assert resolved["variables"]["k3_strategy"]["from"] == "group_vars/site.yml"
    text = k3_here("resolve", "--inventory", str(inv), cwd=tmp_path).stdout
    assert "# k3_strategy = 'multi_node_tp'  (group_vars/site.yml)" in text


def test_group_vars_of_the_working_directory_do_not_leak_in(tmp_path):
    inv = layout(tmp_path / "site", SELECTION + "k3_strategy: multi_node_tp\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("k3_image: ':leaked'\n")
    data = json.loads(k3_here("vars", str(inv), "--json", cwd=tmp_path).stdout)
    assert "k3_image" not in data["hosts"]["n1"] and data["files"] == ["site/group_vars/all.yml"]


def test_a_misspelt_variable_names_its_file_and_the_closest_name(tmp_path):
    inv = layout(tmp_path, SELECTION + "k3_stratgy: multi_node_tp\n")
    proc = k3("plan", str(inv), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "group_vars/all.yml: unknown variable 'k3_stratgy' (did you mean k3_strategy?)" in proc.stderr


def test_pyinfra_connection_settings_pass_through_group_vars(tmp_path):
    inv = layout(tmp_path, SELECTION + "k3_strategy: multi_node_tp\nssh_port: 22\nssh_connect_retries: 2\n"
                 "_sudo: true\n")
    data = json.loads(k3_here("vars", str(inv), "--json", cwd=tmp_path).stdout)
    assert data["hosts"]["n1"]["ssh_port"] == {"value": 22, "from": "group_vars/all.yml"}
    assert data["hosts"]["n1"]["ssh_connect_retries"]["value"] == 2
    # and pyinfra runs get them too, from the project's directory (its config.py reads them; no group_data/)
    proc = pyinfra(str(inv), "debug-inventory", "--json", timeout=120, merged=False)
    assert proc.returncode == 0, proc.stderr
    hosts = {h["name"]: h["data"] for h in json.loads(proc.stdout)}
    assert hosts["n1"]["ssh_port"] == 22 and hosts["n2"]["ssh_connect_retries"] == 2
    # anything else that is not k3_* is refused, naming the file
    (tmp_path / "group_vars" / "all.yml").write_text(SELECTION + "hardware: gb300\n")
    bad = k3_here("vars", str(inv), cwd=tmp_path)
    assert bad.returncode == 2 and "group_vars/all.yml: 'hardware' is neither a k3deploy variable" in bad.stderr


# --------------------------------------------------------------------------------------- engine flags


@pytest.mark.parametrize("args, message", [
    ('["--max-modle-len", "262144"]', "vllm 0.33.0 has no flag --max-modle-len: use --max-model-len"),
    ('["--max-model-len 262144"]', "is one argv word holding a space, which vLLM does not split: write it as two "
                                   "items, ['--max-model-len', '262144']"),
    ('["--max-num-seqs", "many"]', "--max-num-seqs"),
])
def test_k3_extra_args_are_checked_against_the_pinned_engine(tmp_path, args, message):
    inv = layout(tmp_path, SELECTION + f"k3_strategy: multi_node_tp\nk3_extra_args: {args}\n")
    for command in (("resolve", "--inventory", str(inv)), ("lint", "--inventory", str(inv)), ("plan", str(inv))):
        proc = (k3 if command[0] == "plan" else k3_here)(*command, cwd=tmp_path)
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert message in proc.stderr and "k3_extra_args (group_vars/all.yml)" in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_lint_inventory_lints_what_the_inventory_deploys(tmp_path):
    inv = layout(tmp_path, SELECTION + 'k3_strategy: multi_node_tp\nk3_extra_args: ["--max-num-seqs", "64"]\n')
    proc = k3_here("lint", "--inventory", str(inv), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["errors"] == 0 and all(f["severity"] != "error" for f in data["findings"])


def test_an_abbreviated_flag_in_k3_extra_args_is_warned_with_its_file(tmp_path):
    inv = layout(tmp_path, SELECTION + 'k3_strategy: multi_node_tp\nk3_extra_args: ["--max-num-seq", "64"]\n')
    needle = ("k3_extra_args (group_vars/all.yml): --max-num-seq is an abbreviation argparse expands to "
              "--max-num-seqs: write --max-num-seqs in full")
    resolved = k3_here("resolve", "--inventory", str(inv), cwd=tmp_path)
    assert resolved.returncode == 0 and f"warning: {needle}" in resolved.stderr, resolved.stderr
    # lint --inventory blames the file that set it, not a recipe key
    linted = k3_here("lint", "--inventory", str(inv), "--json", cwd=tmp_path)
    found = [f for f in json.loads(linted.stdout)["findings"] if f["code"] == "flag-abbrev"]
    assert [f["path"] for f in found] == ["k3_extra_args (group_vars/all.yml)"], found
    # the deploy says so even when it stops at the preflight (@fake hosts have no GPU), before its verdict
    run = pyinfra_run(layout(tmp_path / "fake", SELECTION + 'k3_strategy: multi_node_tp\n'
                             'k3_extra_args: ["--max-num-seq", "64"]\n', hosts=FAKE.replace("RANK", "1")), "--dry")
    said = [line for line in run.stdout.splitlines() if "is an abbreviation" in line]
    assert len(said) == 1 and "k3deploy: k3_extra_args (" in said[0] and needle.split(" (", 1)[1] in said[0], said
    assert run.stdout.index(said[0]) < run.stdout.index("preflight failed"), run.stdout[-3000:]


def test_k3_extra_env_is_applied_last_and_validated(tmp_path):
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import INVENTORY_ONLY

    inv = layout(tmp_path, SELECTION + "k3_strategy: multi_node_tp\n"
                 "k3_extra_env: {NCCL_DEBUG: INFO, HF_HUB_OFFLINE: '0'}\n")
    r = gather(str(inv), INVENTORY_ONLY).require_rollout()
    for u in r.units:
        lines = u.env_text.splitlines()
        assert "NCCL_DEBUG=INFO" in lines and "HF_HUB_OFFLINE=0" in lines and "HF_HUB_OFFLINE=1" not in lines
    (tmp_path / "group_vars" / "all.yml").write_text(SELECTION + "k3_extra_env: {'BAD NAME': x}\n")
    bad = k3_here("resolve", "--inventory", str(inv), cwd=tmp_path)
    assert bad.returncode == 2 and "group_vars/all.yml: variable k3_extra_env" in bad.stderr
    assert "'BAD NAME' is not an environment variable name" in bad.stderr


# ------------------------------------------------------------------- refusals in a pyinfra run (@fake hosts)


FAKE = ('head = [("@fake/n1", {"k3_ip": "192.0.2.11", "fake_delay": 0, "fake_delay_jitter": 0})]\n'
        'workers = [("@fake/n2", {"k3_ip": "192.0.2.12", "rank": RANK, "fake_delay": 0, "fake_delay_jitter": 0})]\n')


def pyinfra_run(inv: Path, *args: str) -> subprocess.CompletedProcess:
    return pyinfra(str(inv), str(ROOT / "deploy" / "k3.py"), *args, timeout=120)


@pytest.mark.parametrize("all_yml, rank, code, message", [
    (SELECTION + "k3_strategy: multi_node_tp\nk3_stratgy: x\n", "1", 2,
     "unknown variable 'k3_stratgy' (did you mean k3_strategy?)"),
    (SELECTION + "k3_strategy: multi_node_tp\n", "2", 2, "workers must have ranks 1..1; host @fake/n2 has rank 2"),
    (SELECTION + 'k3_strategy: multi_node_tp\nk3_extra_args: ["--max-modle-len", "1"]\n', "1", 2,
     "use --max-model-len"),
    # @fake hosts answer every fact command with nothing: no GPU, no driver; the preflight fails on both
    (SELECTION + "k3_strategy: multi_node_tp\n", "1", 1, "preflight failed on @fake/n1, @fake/n2"),
])
@pytest.mark.parametrize("mode", [("--dry", "--diff"), ("-y",)], ids=["dry", "apply"])
def test_a_refused_run_says_why_once_and_exits_non_zero(tmp_path, all_yml, rank, code, message, mode):
    inv = layout(tmp_path, all_yml, hosts=FAKE_HOSTS + FAKE.replace("RANK", rank))
    run = pyinfra_run(inv, *mode)
    assert run.returncode == code, run.stdout[-3000:]
    assert run.stdout.count(message) == 1, run.stdout[-3000:]
    assert "nothing was changed" in run.stdout
    assert "No hosts remaining" not in run.stdout and "Traceback" not in run.stdout
    assert "--> Beginning operation run" not in run.stdout and "Detected changes" not in run.stdout


# ----------------------------------------------------------------------------------------- revisions


def test_history_shows_what_each_revision_changed_since_the_one_before():
    from k3deploy.cli.history import shown
    from k3deploy.model.revisions import GroupHistory, Revision

    common = {f"k3_setting_{i}": f"'{i}' (group_vars/all.yml)" for i in range(12)}
    one = Revision(group="engine", number=1, created="t1", image="img@sha256:1", summary="gb300 x 2",
                   variables={**common, "k3_extra_env": "{'MY_API_KEY': 's3cr3t'} (group_vars/all.yml)"})
    two = Revision(group="engine", number=2, created="t2", image="img@sha256:2", summary="gb300 x 2",
                   variables={**common, "k3_extra_env": "{'MY_API_KEY': 'n3w'} (group_vars/all.yml)",
                              "k3_extra_args": "['--max-num-seqs', '64'] (group_vars/site.yml)"})
    h = GroupHistory("engine", {1: one, 2: two}, current=2, hosts=["n1"], held={1: ["n1"], 2: ["n1"]})
    first, second = shown(h, 1, ["s3cr3t", "n3w"]), shown(h, 2, ["s3cr3t", "n3w"])
    assert len(first["changes"]) == 13 and first["since"] is None     # the first: what it was deployed with
    assert second["since"] == 1 and second["changes"] == [
        "image img@sha256:1 -> img@sha256:2",
        "k3_extra_args: default -> ['--max-num-seqs', '64'] (group_vars/site.yml)",
        "k3_extra_env: a secret's value changed (masked) (group_vars/all.yml)"], second["changes"]
    assert "s3cr3t" not in str(first) + str(second) and "n3w" not in str(first) + str(second)


def test_revisions_are_recorded_listed_and_chosen(tmp_path):
    from k3deploy.model.commands import list_revisions, record_revision, set_current
    from k3deploy.model.revisions import Revision, parse_listing, rollback_target, runs

    d = tmp_path / "revisions" / "engine"
    unit, env = tmp_path / "k3-engine.service", tmp_path / "k3-engine.env"
    for n in (1, 2):
        unit.write_text(f"unit {n}\n")
        env.write_text(f"A={n}\n")
        meta = Revision(group="engine", number=n, created=f"t{n}", image="img", summary="s",
                        files={"h:/u": f"sha{n}"}).to_json()
        subprocess.run(["sh", "-c", record_revision(str(d), n, [(str(unit), unit.name), (str(env), env.name)],
                                                    meta)], check=True)
    assert (d / "1" / "k3-engine.env").read_text() == "A=1\n" and oct((d / "2").stat().st_mode & 0o777) == "0o700"
    listing = subprocess.run(["sh", "-c", list_revisions(str(d))], capture_output=True, text=True).stdout
    # a revision is recorded before its restart; it becomes the current one only once the group serves
    assert parse_listing(listing.splitlines()).current is None
    subprocess.run(["sh", "-c", set_current(str(d), 2)], check=True)
    history = parse_listing(subprocess.run(["sh", "-c", list_revisions(str(d))], capture_output=True,
                                           text=True).stdout.splitlines())
    assert history.current == 2 and history.numbers == [1, 2] and history.revisions[1].created == "t1"
    assert history.next_number() == 3
    subprocess.run(["sh", "-c", set_current(str(d), 1)], check=True)
    assert (d / "current").read_text() == "1\n"
    assert rollback_target([1, 2], 2, True) == 1
    assert rollback_target([1, 2], 2, True, runs_current=False) == 2  # a failed, unrecorded change runs
    assert rollback_target([1, 2], 1, 2) == 2
    with pytest.raises(Exception, match="revision 1 is the oldest recorded"):
        rollback_target([1, 2], 1, True)
    with pytest.raises(Exception, match="k3_rollback=7: no such revision"):
        rollback_target([1, 2], 2, 7)
    assert runs(history.revisions[2], {"h:/u": "sha2"}) and not runs(history.revisions[2], {"h:/u": "sha1"})


# ------------------------------------------------------------------------------ fixes that point right


def test_fixes_name_where_the_selection_lives_and_the_driver_being_moved_to():
    from dataclasses import replace

    from k3deploy.model.requirements import Requirements
    from k3deploy.preflight.checks import run_checks
    from k3deploy.recipe.taxonomy import hardware
    from k3deploy.vendors.nvidia.checks import NvidiaFacts
    from k3deploy.vendors.nvidia.facts import FabricManagerState, NvidiaGpu

    req = Requirements(hardware()["h200"], "default", 1680.0, nodes=1, strategy="single_node_tp",
                       hardware_from="group_vars/site.yml", image="vllm/vllm-openai:kimi-k3@sha256:" + "a" * 64)
    old = [NvidiaGpu(name="NVIDIA H200", driver="550.54.15", memory_mib=143771) for _ in range(8)]
    facts = NvidiaFacts(host="n1", gpus=old, fabric_manager=FabricManagerState("active", "580.126.09", ""))
    rows = {r.check: r for r in run_checks(req, [facts])}
    assert "image vllm/vllm-openai:kimi-k3@sha256:" in rows["nvidia.driver"].fix
    assert rows["nvidia.fabricmanager"].fix.startswith("after the driver upgrade to r580")
    assert "550.54.15" not in rows["nvidia.fabricmanager"].fix
    wrong = replace(facts, gpus=[replace(g, name="NVIDIA H100 80GB HBM3") for g in old])
    rows = {r.check: r for r in run_checks(req, [wrong])}
    assert "set k3_hardware (now from group_vars/site.yml)" in rows["gpu.model"].fix


def test_options_give_pd_pools_their_gpu_floor():
    data = json.loads(k3_here("options", "--hardware", "b300", "--json").stdout)
    pd = next(r for r in data["hardware"]["b300"]["strategies"] if r["strategy"] == "pd_cluster")
    assert pd["min_gpus"] > 0 and pd["min_gpus"] == sum(pd["min_gpus_per_pool"].values())
    assert "(per pool)" in k3_here("options", "--hardware", "b300").stdout


def test_files_on_the_control_machine_are_checked_before_anything_else(tmp_path):
    token = tmp_path / "token"
    token.write_text("hf_x\n")
    token.chmod(0o644)
    cases = [
        (f"k3_hf_token_file: {token}\n", f"k3_hf_token_file: {token} (0/group_vars/all.yml) has mode 0644",
         f"chmod 600 {token}"),
        (f"k3_image_archive: {tmp_path / 'nope.tar'}\n", "k3_image_archive:", "docker save"),
        (f"k3_weights_source: {tmp_path}\n", "is not a model's Hugging Face cache directory", "hf download"),
    ]
    for i, (extra, what, fix) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        inv = layout(tmp_path / str(i), SELECTION + "k3_strategy: multi_node_tp\n" + extra)
        bad = k3_here("resolve", "--inventory", str(inv), cwd=tmp_path)
        assert bad.returncode == 2 and what in bad.stderr and fix in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    token.chmod(0o600)
    (tmp_path / "ok").mkdir()
    inv = layout(tmp_path / "ok", SELECTION + "k3_strategy: multi_node_tp\n" + f"k3_hf_token_file: {token}\n")
    assert k3_here("resolve", "--inventory", str(inv), cwd=tmp_path).returncode == 0


def test_plan_after_a_rollback_says_the_variables_ask_for_newer_settings_only_when_they_do():
    from types import SimpleNamespace

    from k3deploy.cli.plan import revision_notes
    from k3deploy.model.revisions import GroupHistory, Revision

    revs = {n: Revision("engine", n, "t", "img", "s") for n in (1, 2)}
    gathered = SimpleNamespace(history={"engine": GroupHistory("engine", revs, current=1, marked={1, 2})},
                               rollback_to={})
    (pending,) = revision_notes(gathered, True)   # type: ignore[arg-type]
    assert "runs revision 1, rolled back from 2: the variables still ask for the newer settings" in pending
    (none,) = revision_notes(gathered, False)   # type: ignore[arg-type]
    assert "still ask" not in none and "runs revision 1, rolled back from 2; the variables describe it" in none
