"""k3deploy lint: synthetic recipes with one known problem per key, the vendored recipe's known problems
against vLLM 0.33.0, and the command line (exit codes 0/1/2, resolve and preflight printing findings).

Expected findings are written from the recipes' YAML (which key holds the problem) and from vLLM 0.33.0's
behaviour (flag names, choices, env registry, backend capabilities), not from the linter's output.
"""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import LINT_RECIPES, ROOT, k3, present
from k3deploy import load_recipe, resolve
from k3deploy.errors import K3Error, SelectionError
from k3deploy.recipe.catalog import load_catalog
from k3deploy.recipe.lint import Finding, check_image, lint_plan, lint_recipe, parse_argv

HERE = LINT_RECIPES
AMD = {"mi300x", "mi325x", "mi355x"}


def groups(report, code: str, path: str | None = None):
    return [g for g in report.groups if g.finding.code == code and (path is None or g.finding.path == path)]


def only(report, code: str, path: str | None = None):
    found = groups(report, code, path)
    assert len(found) == 1, [g.finding for g in report.groups]
    return found[0]


def hw_strategies(group) -> set[tuple[str, str]]:
    return {(s.hardware, s.strategy) for s in group.selections}


# ------------------------------------------------------------------------------------------- synthetic


@pytest.fixture(scope="module")
def broken():
    return lint_recipe(load_recipe(HERE / "broken.yaml"))


def test_misspelt_flag_is_an_error_with_the_right_spelling(broken):
    g = only(broken, "flag-unknown", "model.base_args[1]")
    assert g.finding.severity == "error"
    assert "--max-modle-len" in g.finding.message and g.finding.fix == "use --max-model-len"
    assert {s.hardware for s in g.selections} == {"h200", "b300"}


def test_misspelt_config_key_in_dotted_form(broken):
    g = only(broken, "flag-value", "model.base_args[3]")
    assert g.finding.severity == "error" and "'mla_prefil_backend'" in g.finding.message
    assert "mla_prefill_backend" in g.finding.fix


def test_bad_choices(broken):
    # --dcp-comm-backend is an argparse choice (ag_rs | a2a)
    dcp = only(broken, "flag-value", "hardware_overrides.blackwell.extra_args[0]")
    assert dcp.finding.severity == "error" and "'a3a'" in dcp.finding.message
    assert "a2a" in dcp.finding.fix and "ag_rs" in dcp.finding.fix
    assert {s.hardware for s in dcp.selections} == {"b300"}
    # --kv-cache-dtype is type=str, checked against the registered KV cache dtypes
    kv = only(broken, "flag-value", "hardware_overrides.hopper.extra_args[0]")
    assert kv.finding.severity == "error" and "'fp9'" in kv.finding.message and "fp8" in kv.finding.message
    assert {s.hardware for s in kv.selections} == {"h200"}
    # env choices are case-sensitive for VLLM_SSM_CONV_STATE_LAYOUT
    env = only(broken, "env-value", "hardware_overrides.blackwell.extra_env.VLLM_SSM_CONV_STATE_LAYOUT")
    assert env.finding.severity == "error" and "'ds'" in env.finding.message


def test_unknown_env_var_is_a_warning_naming_the_real_one(broken):
    g = only(broken, "env-unknown", "variants.default.extra_env.VLLM_USE_V2_MODEL_RUNER")
    assert g.finding.severity == "warning"  # vLLM only warns, unless --fail-on-environ-validation
    assert g.finding.fix == "use VLLM_USE_V2_MODEL_RUNNER"


def test_impossible_memory_fit(broken):
    fits = groups(broken, "memory-fit", "variants.default.vram_minimum_gb")
    got = {(s.hardware, s.strategy) for g in fits for s in g.selections}
    # 3000 GB: one h200 (1128), one b300 (2144) and two h200 (2256) are short; two b300 (4288) are not
    assert got == {("h200", "single_node_tp"), ("b300", "single_node_tp"), ("h200", "multi_node_tp_pp")}
    h200 = next(g for g in fits if hw_strategies(g) == {("h200", "single_node_tp")})
    assert "1128" in h200.finding.message and "3000" in h200.finding.message
    assert "3 nodes" in h200.finding.fix and all(g.finding.severity == "error" for g in fits)


def test_backend_gates_and_parallel_rules(broken):
    cap = only(broken, "backend-capability", "hardware_overrides.hopper.extra_args[2]")
    assert "TOKENSPEED_MLA" in cap.finding.message and "10.x" in cap.finding.message
    assert {s.hardware for s in cap.selections} == {"h200"}
    kv = only(broken, "backend-kv-dtype", "hardware_overrides.blackwell.extra_args[2]")
    assert "auto" in kv.finding.message and "--kv-cache-dtype fp8" in kv.finding.fix
    assert not groups(broken, "backend-capability", "hardware_overrides.blackwell.extra_args[2]")  # fine on B300
    dcp = only(broken, "dcp-divides-tp", "features.dcp.args[0]")
    assert {(s.hardware, s.strategy, s.extra) for s in dcp.selections} == {
        ("h200", "single_node_tp", ("dcp",)), ("b300", "single_node_tp", ("dcp",))}
    spec = only(broken, "spec-decoding-pp", "features.spec.args[0]")
    assert spec.finding.severity == "error"
    assert {(s.strategy, s.extra) for s in spec.selections} == {("multi_node_tp_pp", ("spec",))}


def test_clean_recipe_has_no_findings():
    report = lint_recipe(load_recipe(HERE / "clean.yaml"))
    assert [g.finding for g in report.groups] == []
    # h200 and b300 x (single_node_tp, multi_node_tp, multi_node_tep) x (default, +fp8_kv)
    assert len(report.checked) == 12 and report.exit_code == 0


def test_abbreviation_warns_and_points_at_the_key():
    report = lint_recipe(load_recipe(HERE / "warnings-only.yaml"))
    g = only(report, "flag-abbrev")
    assert g.finding.severity == "warning" and g.finding.path == "model.base_args[0]"
    assert "--trust-remote-code" in g.finding.message
    assert report.exit_code == 0 and report.counts == {"error": 0, "warning": 3, "info": 0}


def test_flag_set_twice_under_two_spellings_warns():
    report = lint_recipe(load_recipe(HERE / "warnings-only.yaml"))
    g = only(report, "flag-repeated")
    assert g.finding.path == "hardware_overrides.blackwell.extra_args[0]"
    assert "--tensor-parallel-size" in g.finding.message and "-tp" in g.finding.message


# ------------------------------------------------------------------------------------------- vendored


@pytest.fixture(scope="module")
def vendored():
    return lint_recipe(load_recipe())


def test_vendored_rocm_situv2_variable(vendored):
    g = only(vendored, "env-unknown", "hardware_overrides.amd.extra_env.VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4")
    assert g.finding.severity == "warning"
    assert "VLLM_ROCM_USE_AITER_MOE_SITUV2=a8w4" in g.finding.fix
    assert {s.hardware for s in g.selections} == AMD


def test_vendored_memory_single_node_h200(vendored):
    fits = groups(vendored, "memory-fit", "variants.default.vram_minimum_gb")
    h200 = [g for g in fits if hw_strategies(g) == {("h200", "single_node_tp")}]
    assert len(h200) == 1 and h200[0].finding.severity == "error"
    assert "1128" in h200[0].finding.message and "1680" in h200[0].finding.message
    got = {hs for g in fits for hs in hw_strategies(g)}
    # B200 (1440) and MI300X (1536) single nodes, two GB200 trays (1536) are short too; B300 (2144) is not
    assert {("b200", "single_node_tp"), ("mi300x", "single_node_tp"), ("gb200", "multi_node_tep")} <= got
    assert ("b300", "single_node_tp") not in got and ("h200", "multi_node_tp") not in got


def test_vendored_shard_sp_on_prefill(vendored):
    g = only(vendored, "env-role", "strategy_overrides.pd_cluster.prefill.env.VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT")
    assert g.roles == {"prefill"} and {s.strategy for s in g.selections} == {"pd_cluster"}
    assert "prefill" in g.finding.message


def test_vendored_router_timeout_shorter_than_engine_ready(vendored):
    g = only(vendored, "router-timeout")
    assert "600" in g.finding.message and "3600" in g.finding.message
    assert g.finding.path == "hardware_overrides.hopper.extra_env.VLLM_ENGINE_READY_TIMEOUT_S"
    assert ("h200", "pd_cluster") in hw_strategies(g)


def test_vendored_dcp_feature_on_hopper_and_amd(vendored):
    caps = groups(vendored, "backend-capability")
    where = {(s.hardware, s.extra) for g in caps for s in g.selections}
    assert ("h200", ("decode_context_parallelism",)) in where
    assert ("mi355x", ("decode_context_parallelism",)) in where
    assert not {h for h, _ in where} & {"b200", "b300", "gb200", "gb300"}
    names = {g.finding.message.split()[1] for g in caps}
    assert names == {"TOKENSPEED_MLA", "TRTLLM_RAGGED"}
    kv = only(vendored, "backend-kv-dtype")
    assert {s.hardware for s in kv.selections} == {"h200"} | AMD


def test_vendored_image_names(vendored):
    g = only(vendored, "image-repository", "guide")
    assert "vllm/vllm-openai_rocm" in g.finding.message and "vllm/vllm-openai-rocm:kimi-k3" in g.finding.fix
    assert g.selections == []  # the guide concerns the recipe, not one selection


def test_vendored_tp_dp_workers_not_headless(vendored):
    g = only(vendored, "dp-headless")
    assert g.finding.severity == "error" and g.roles == {"worker"}
    assert {s.strategy for s in g.selections} == {"multi_node_tp_dp"}


def test_vendored_flags_are_all_accepted_by_vllm_0_33(vendored):
    assert groups(vendored, "flag-unknown") == [] and groups(vendored, "flag-value") == []
    assert groups(vendored, "flag-abbrev") == []


def test_vendored_harmless_settings_are_info(vendored):
    safetensors = only(vendored, "env-unused", "hardware_overrides.amd.extra_env.SAFETENSORS_FAST_GPU")
    assert safetensors.finding.severity == "info"
    default = only(vendored, "env-default", "hardware_overrides.blackwell.extra_env.VLLM_ALLREDUCE_USE_FLASHINFER")
    assert default.finding.severity == "info"


def test_flagship_b300_plan_is_clean(recipe):
    found = lint_plan(recipe, resolve(recipe, hardware="b300"))
    assert [f for f in found if f.severity != "info"] == []


# ------------------------------------------------------------------------------------------- pieces


def test_parse_argv_follows_argparse_value_rules():
    router = load_catalog("vllm-router")
    args, stray = parse_argv(["--prefill", "http://p:8001", "none", "--decode", "http://d:8002",
                              "--vllm-pd-disaggregation", "--port", "8000"], router)
    assert stray == []
    assert [(a.option, a.value) for a in args] == [("--prefill", "http://p:8001 none"), ("--decode", "http://d:8002"),
                                                   ("--vllm-pd-disaggregation", None), ("--port", "8000")]
    vllm = load_catalog("vllm")
    args, _ = parse_argv(["--max_model_len=4096", "--no-enable-prefix-caching", "-tp", "8"], vllm)
    assert [(present(a.flag).name, a.value) for a in args] == [("--max-model-len", "4096"), ("--enable-prefix-caching", None),
                                                      ("--tensor-parallel-size", "8")]


@pytest.mark.parametrize("ref, vendor, code", [
    ("vllm/vllm-openai_rocm:kimi-k3", None, "image-repository"),
    ("vllm/vllm-openai:kimi-k3", "amd", "image-vendor"),
    ("vllm/vllm-openai-rocm:latest", "amd", "image-unpinned"),
    ("Vllm/Vllm-OpenAI", None, "image-invalid"),
])
def test_image_checks(ref, vendor, code):
    assert code in {f.code for f in check_image(ref, "x", vendor=vendor)}


def test_good_pinned_image_passes():
    ref = "vllm/vllm-openai:v0.33.0@sha256:" + "ab" * 32
    assert check_image(ref, "x", vendor="nvidia") == []


def test_finding_line_is_one_line():
    f = Finding("warning", "env-unknown", "X is unknown", "use Y", "a.b", ("prefill",))
    assert f.line() == "env-unknown: X is unknown (on prefill) [a.b]: use Y" and "\n" not in f.line()


# ------------------------------------------------------------------------------------------- CLI


def test_cli_exit_0_clean_and_warnings_only():
    clean = k3("lint", "--recipe", str(HERE / "clean.yaml"))
    assert clean.returncode == 0, clean.stderr
    assert "12 selections checked: 0 errors, 0 warnings, 0 info" in clean.stdout
    warn = k3("lint", "--recipe", str(HERE / "warnings-only.yaml"), "--json")
    assert warn.returncode == 0, warn.stderr
    data = json.loads(warn.stdout)
    assert data["summary"]["errors"] == 0 and data["summary"]["warnings"] == 3


def test_cli_exit_1_on_errors_json_shape():
    proc = k3("lint", "--hardware", "h200", "--json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"findings", "summary"} and data["summary"]["errors"] >= 1
    sels = {(s["hardware"], s["strategy"]) for f in data["findings"] for s in f["selections"]}
    assert {h for h, _ in sels} == {"h200"}
    f = next(f for f in data["findings"] if f["code"] == "memory-fit")
    assert f["severity"] == "error" and f["path"] == "variants.default.vram_minimum_gb" and f["fix"]


def test_cli_text_table():
    proc = k3("lint", "--recipe", str(HERE / "broken.yaml"))
    assert proc.returncode == 1
    assert "flag-unknown" in proc.stdout and "model.base_args[1]" in proc.stdout and "errors found" in proc.stdout


@pytest.mark.parametrize("args, needle", [
    (["--hardware", "b900"], "unknown hardware 'b900'"),
    (["--strategy", "multi_node_magic"], "unknown strategy 'multi_node_magic'"),
    (["--variant", "fp8"], "unknown variant 'fp8'"),
    (["--hardware", "h200", "--strategy", "multi_node_dep"], "offers no selection"),
    (["--recipe", "/nonexistent/recipe.yaml"], "not found"),
])
def test_cli_exit_2_on_bad_input(args, needle):
    proc = k3("lint", *args)
    assert proc.returncode == 2, proc.stdout
    assert needle in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_lint_recipe_bad_selection_raises_k3error(recipe):
    with pytest.raises(K3Error):
        lint_recipe(recipe, hardware_id="ascend_910c", variant="default")


def test_resolve_prints_lint_on_stderr_and_keeps_json(recipe):
    proc = k3("resolve", "--hardware", "h200", "--strategy", "single_node_tp", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == resolve(recipe, hardware="h200", strategy="single_node_tp").to_dict()
    assert "lint error: memory-fit" in proc.stderr and "1128" in proc.stderr
    clean = k3("resolve", "--hardware", "b300", "--json")
    assert clean.returncode == 0 and "lint " not in clean.stderr


def test_resolve_prints_lint_warnings_for_amd():
    proc = k3("resolve", "--hardware", "mi355x", "--strategy", "pd_cluster")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("lint warning:")]
    assert any("VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4" in line for line in lines)
    assert any("VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT" in line and "prefill" in line for line in lines)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_preflight_prints_lint_for_its_selection():
    proc = k3("preflight", "@local", "--hardware", "h200", "--strategy", "single_node_tp", "--nodes", "1")
    assert "lint error: memory-fit" in proc.stderr and "Traceback" not in proc.stderr


def test_preflight_lints_the_deployed_plan():
    from types import SimpleNamespace

    from k3deploy.recipe.lint import echo_selection_findings
    from k3deploy.recipe.taxonomy import hardware

    def lines(strategy, nodes):
        out: list[str] = []
        sel = SimpleNamespace(hardware=hardware()["h200"], strategy=strategy, variant="default", nodes=nodes)
        echo_selection_findings(sel, out.append)
        return out

    # the builder's tp_dp workers lack --headless; k3deploy deploys them with it, so preflight stays quiet
    assert not any("dp-headless" in line for line in lines("multi_node_tp_dp", 2))
    assert any(line.startswith("lint error: memory-fit") for line in lines("single_node_tp", 1))
    skipped = lines("multi_node_dep", 2)  # not offered on h200: one line, no exception
    assert len(skipped) == 1 and skipped[0].startswith("lint skipped: ") and "multi_node_dep" in skipped[0]


@pytest.mark.parametrize("name", ["DeepSeek-V3.2.yaml", "GLM-5.1.yaml"])
def test_dotted_config_keys_of_upstream_recipes_are_accepted(name):
    # --kernel-config.enable_flashinfer_autotune=False, --speculative-config.method mtp: valid vLLM spellings
    report = lint_recipe(load_recipe(ROOT / "tests" / "recipes" / name))
    assert [g.finding for g in report.groups if g.finding.code.startswith("flag-")] == []
    spec = [g for g in report.groups if g.finding.code == "spec-decoding-pp"]
    assert all("(configured)" not in g.finding.message for g in spec)


def test_lint_narrowed_to_hardware_speaks_of_that_selection_only():
    from k3deploy.recipe.lint import lint_recipe

    report = lint_recipe(load_recipe(), hardware_id="gb300")
    text = " ".join(f"{g.finding.message} {g.finding.fix} {g.finding.path}" for g in report.groups)
    assert "rocm" not in text, text           # the AMD image of the guide is not gb300's
    assert "rocm" in " ".join(g.finding.message for g in lint_recipe(load_recipe(), hardware_id="mi355x").groups)
    (dp,) = [g.finding for g in report.groups if g.finding.code == "dp-endpoints"]
    assert "the deploy puts a vllm-router in front of them" in dp.message and "nothing to do" in dp.fix


def test_lint_takes_the_sizes_resolve_takes():
    from k3deploy.recipe.lint import lint_recipe

    report = lint_recipe(load_recipe(), hardware_id="gb300", nodes=3)
    assert report.checked and {s.nodes for s in report.checked} == {"3"}, report.checked
    assert all(s.strategy != "pd_cluster" for s in report.checked)
    with pytest.raises(SelectionError, match=r"no selection for hardware gb300 at --nodes 1 \(multi_node_tp needs"):
        lint_recipe(load_recipe(), hardware_id="gb300", nodes=1)
    proc = k3("lint", "--hardware", "gb300", "--nodes", "3")
    assert proc.returncode == 0 and "selections checked" in proc.stdout, proc.stderr
    bad = k3("lint", "--hardware", "gb300", "--nodes", "0")
    assert bad.returncode == 2 and "--nodes must be ≥ 1, got 0" in bad.stderr
