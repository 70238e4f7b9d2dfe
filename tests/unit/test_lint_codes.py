"""Every lint finding code: reported by exactly one registered rule, and triggered by a test.

Each case takes a plan the linter accepts on that point, changes one thing (an argument, a variable, the
image, the recipe's memory figure) and checks that the findings the change adds are exactly the case's
code, with its severity, path and a fragment of its message or fix. The expected findings follow vLLM
0.33.0's behaviour (flag names and values, env registry, backend capabilities), not the linter's output.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import k3deploy.recipe.lint
from helpers import LINT_RECIPES
from k3deploy import resolve
from k3deploy.recipe.catalog import CATALOG_DIR, Catalog, _build
from k3deploy.recipe.fixes import deployable
from k3deploy.recipe.lint import Finding, lint_plan, lint_recipe, registry
from k3deploy.recipe.plan import NodePlan, Plan
from k3deploy.recipe.schema import Recipe, parse_recipe

PKG = Path(k3deploy.recipe.lint.__file__).resolve().parent
PINNED = "vllm/vllm-openai:v0.33.0@sha256:" + "ab" * 32

#: Every code the linter reported before it was split into one rule per code.
KNOWN_CODES = {
    "arg-positional", "backend-capability", "backend-kv-dtype", "dcp-divides-tp", "dp-endpoints", "dp-headless",
    "env-default", "env-hardware", "env-overwritten", "env-role", "env-unknown", "env-unused", "env-value",
    "flag-abbrev", "flag-deprecated", "flag-repeated", "flag-unknown", "flag-value", "image-digest",
    "image-invalid", "image-repository", "image-unpinned", "image-vendor", "lb-headless", "lb-hybrid-local",
    "lb-modes", "load-format", "megamoe-needs-ep", "memory-fit", "nnodes-world", "pd-conv-layout", "pd-hybrid-kv",
    "pd-side-channel", "router-timeout", "spec-decoding-pp", "spec-decoding-runner", "unresolvable",
}
#: Hyphenated string literals of the package that are not finding codes.
NOT_CODES = {"kimi-k3", "vllm-router"}
CODE_SHAPE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)+")


# ------------------------------------------------------------------------------------------- the registry


def _sources() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PKG.glob("*.py"))}


def _rule_decorator_codes() -> list[str]:
    out = []
    for tree in _sources().values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for d in node.decorator_list:
                    if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "rule":
                        assert len(d.args) == 1 and isinstance(d.args[0], ast.Constant), ast.dump(d)
                        assert isinstance(d.args[0].value, str), ast.dump(d)
                        out.append(d.args[0].value)
    return out


def test_registry_lists_every_code_once_each_from_one_function():
    decorated = _rule_decorator_codes()
    assert len(decorated) == len(set(decorated))  # one function per code
    assert set(registry.codes()) == set(decorated) == KNOWN_CODES
    assert len({(r.func.__module__, r.func.__name__) for r in registry.rules()}) == len(KNOWN_CODES)


def test_no_code_is_reported_outside_the_registry():
    # a code literal appears only in its @rule decorator (rules report through ctx.add/emit, which stamp the
    # running rule's code), and every code-shaped literal of the package is a registered code
    registered = set(registry.codes())
    seen: dict[str, int] = {}
    for name, tree in _sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in registered:
                    seen[node.value] = seen.get(node.value, 0) + 1
                elif CODE_SHAPE.fullmatch(node.value):
                    assert node.value in NOT_CODES, f"{name}: {node.value!r} looks like a finding code"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Finding":
                code = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "code"), None)
                assert not isinstance(code, ast.Constant), f"{name}: Finding built with a literal code"
    assert seen == {c: 1 for c in registered}


def test_every_code_has_a_triggering_case():
    assert set(CASES) == set(registry.codes())


def test_a_second_rule_for_a_code_is_refused():
    with pytest.raises(ValueError, match="already reported by"):
        registry.rule("memory-fit")(lambda ctx: None)


def test_findings_come_only_from_running_rules():
    e = registry.Emitter()
    with pytest.raises(RuntimeError):
        e.emit("error", "m", "f")


def test_clean_plan_has_no_errors(recipe):
    found = lint_plan(recipe, resolve(recipe, hardware="gb300"))
    assert [f for f in found if f.severity == "error"] == []
    assert {f.code for f in found} <= {"env-default", "image-digest"}


# ------------------------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Case:
    code: str
    name: str
    run: Callable[[Recipe], list[Finding]]
    severity: str
    path: str | None
    fragment: str


CASES: dict[str, list[Case]] = {}


def case(code: str, severity: str, fragment: str, path: str | None = None):
    def register(fn: Callable[[Recipe], list[Finding]]):
        CASES.setdefault(code, []).append(Case(code, fn.__name__, fn, severity, path, fragment))
        return fn
    return register


def added(recipe: Recipe, base: Plan, changed: Plan, *, catalog: Catalog | None = None,
          changed_recipe: Recipe | None = None) -> list[Finding]:
    """The findings of ``changed`` that ``base`` does not have."""
    before = {f.key for f in lint_plan(recipe, base, catalog=catalog)}
    return [f for f in lint_plan(changed_recipe or recipe, changed, catalog=catalog) if f.key not in before]


def edit(plan: Plan, change: Callable[[Plan], object]) -> Plan:
    out = plan.model_copy(deep=True)
    change(out)
    return out


def engines(plan: Plan) -> list[NodePlan]:
    return [n for n in plan.nodes if n.role != "router"]


def router(plan: Plan) -> NodePlan:
    return next(n for n in plan.nodes if n.role == "router")


def set_value(node: NodePlan, flag: str, value: str) -> None:
    node.argv[node.argv.index(flag) + 1] = value


def with_args(recipe: Recipe, hw: str, args: list[str], strategy: str | None = None, **selection) -> list[Finding]:
    """Findings that ``--extra-args`` adds to a selection."""
    base = resolve(recipe, hardware=hw, strategy=strategy, **selection)
    return added(recipe, base, resolve(recipe, hardware=hw, strategy=strategy, extra_args=args, **selection))


def with_env(recipe: Recipe, hw: str, env: dict[str, str], strategy: str | None = None,
             roles: tuple[str, ...] = ("head", "worker", "prefill", "decode"), **selection) -> list[Finding]:
    """Findings that setting ``env`` on the engine nodes of ``roles`` adds."""
    base = resolve(recipe, hardware=hw, strategy=strategy, **selection)

    def change(p: Plan) -> None:
        for n in engines(p):
            if n.role in roles:
                n.env.update(env)

    return added(recipe, base, edit(base, change))


def with_image(recipe: Recipe, image: str) -> list[Finding]:
    base = resolve(recipe, hardware="b300", strategy="single_node_tp", image=PINNED)
    return added(recipe, base, base.model_copy(update={"image": image}))


# ------------------------------------------------------------------------------------------- flags


@case("arg-positional", "error", "stray argument 'oops' after the model on head")
def stray_argument_after_the_model(recipe):
    base = resolve(recipe, hardware="b300", strategy="single_node_tp")
    return added(recipe, base, edit(base, lambda p: p.nodes[0].argv.insert(3, "oops")))


@case("flag-unknown", "error", "vllm 0.33.0 has no flag --max-modle-len")
def misspelt_engine_flag(recipe):
    found = with_args(recipe, "b300", ["--max-modle-len", "4096"], "single_node_tp")
    assert found[0].fix == "use --max-model-len"
    return found


@case("flag-unknown", "error", "vllm-router 0.1.17 has no flag --polcy", path="builder: router")
def misspelt_router_flag(recipe):
    base = resolve(recipe, hardware="b300", strategy="pd_cluster")
    found = added(recipe, base, edit(base, lambda p: router(p).argv.extend(["--polcy", "cache_aware"])))
    assert found[0].fix == "use --policy" and found[0].roles == ("router",)
    return found


@case("flag-abbrev", "warning", "--max-num-seq is an abbreviation argparse expands to --max-num-seqs")
def abbreviated_engine_flag(recipe):
    return with_args(recipe, "b300", ["--max-num-seq", "64"], "single_node_tp")


@case("flag-abbrev", "warning", "--queue-timeout is an abbreviation argparse expands to --queue-timeout-secs",
      path="builder: router")
def abbreviated_router_flag(recipe):
    base = resolve(recipe, hardware="b300", strategy="pd_cluster")
    return added(recipe, base, edit(base, lambda p: router(p).argv.extend(["--queue-timeout", "30"])))


def _deprecating(name: str) -> Catalog:
    data = json.loads((CATALOG_DIR / "vllm-0.33.0.json").read_text(encoding="utf-8"))
    flag = next(f for f in data["flags"] if f["name"] == name)
    flag["deprecated"] = True
    return _build(data)


@case("flag-deprecated", "warning", "--max-num-seqs is deprecated in vllm 0.33.0")
def deprecated_flag(recipe):
    cat = _deprecating("--max-num-seqs")  # vLLM 0.33.0 deprecates none of the flags k3deploy uses
    base = resolve(recipe, hardware="b300", strategy="single_node_tp")
    return added(recipe, base, resolve(recipe, hardware="b300", strategy="single_node_tp",
                                       extra_args=["--max-num-seqs", "64"]), catalog=cat)


@case("flag-value", "error", "--max-num-seqs needs an integer, got 'lots'")
def non_integer_value(recipe):
    return with_args(recipe, "b300", ["--max-num-seqs", "lots"], "single_node_tp")


@case("flag-value", "error", "--all2all-backend 'nvlink' is not one of: allgather_reducescatter")
def value_outside_argparse_choices(recipe):
    return with_args(recipe, "b300", ["--all2all-backend", "nvlink"], "single_node_tp")


@case("flag-value", "error", "--kv-cache-dtype 'fp9' is not a value vllm 0.33.0 registers (did you mean fp8?)")
def value_outside_a_registered_choice_set(recipe):
    found = with_args(recipe, "mi355x", ["--kv-cache-dtype", "fp9"], "single_node_tp")
    assert found[0].fix == "use a value vllm 0.33.0 registers (k3deploy catalog set kv_cache_dtype)"
    return found


@case("flag-value", "warning", "--kv-cache-dtype 'fp9' is not a value vllm 0.33.0 registers")
def value_a_platform_plugin_may_register(recipe):
    # vllm-ascend may extend the KV cache dtypes: only a warning on Ascend
    found = with_args(recipe, "ascend_910c", ["--kv-cache-dtype", "fp9"], variant="ascend_w4a8")
    return found


@case("flag-value", "error", "--compilation-config cudagraph_mode 'SOMETIMES' is not one of")
def bad_json_config_value(recipe):
    base = resolve(recipe, hardware="mi355x", strategy="single_node_tp")
    return added(recipe, base, edit(base, lambda p: set_value(p.nodes[0], "--compilation-config",
                                                             '{"cudagraph_mode":"SOMETIMES"}')))


@case("flag-value", "error", "--attention-config has no key 'mla_prefil_backend'")
def bad_dotted_config_key(recipe):
    return with_args(recipe, "b300", ["--attention-config.mla_prefil_backend", "FLASH_ATTN"], "single_node_tp")


@case("flag-value", "error", "--max-model-len needs a value")
def missing_value(recipe):
    base = resolve(recipe, hardware="b300", strategy="single_node_tp")

    def change(p: Plan) -> None:
        argv = p.nodes[0].argv
        i = argv.index("--max-model-len")
        del argv[i:i + 2]
        argv.append("--max-model-len")

    return added(recipe, base, edit(base, change))


@case("flag-value", "error", "--port needs an integer, got 'http'", path="builder: router")
def bad_router_value(recipe):
    base = resolve(recipe, hardware="b300", strategy="pd_cluster")
    return added(recipe, base, edit(base, lambda p: set_value(router(p), "--port", "http")))


@case("flag-repeated", "warning", "--tensor-parallel-size is set twice")
def flag_set_twice_under_two_spellings(recipe):
    found = with_args(recipe, "b300", ["-tp", "8"], "single_node_tp")
    assert "-tp" in found[0].message
    return found


# ------------------------------------------------------------------------------------------- backends


def _replace_backend(recipe: Recipe, hw: str, backend: str, strategy: str = "single_node_tp") -> list[Finding]:
    base = resolve(recipe, hardware=hw, strategy=strategy)
    if "--attention-backend" in base.nodes[0].argv:
        changed = edit(base, lambda p: set_value(p.nodes[0], "--attention-backend", backend))
    else:
        changed = edit(base, lambda p: p.nodes[0].argv.extend(["--attention-backend", backend]))
    return added(recipe, base, changed)


@case("backend-capability", "error", "FLASHINFER_MLA_SPARSE needs compute capability 10.x; hopper GPUs are 9.0")
def blackwell_backend_on_hopper(recipe):
    return _replace_backend(recipe, "h200", "FLASHINFER_MLA_SPARSE", "multi_node_tp")


@case("backend-capability", "error", "FLASHINFER_MLA_SPARSE is a CUDA kernel for compute capability 10.x")
def cuda_backend_on_amd(recipe):
    return _replace_backend(recipe, "mi355x", "FLASHINFER_MLA_SPARSE")


@case("backend-kv-dtype", "error", "--attention-backend TOKENSPEED_MLA supports KV cache dtypes fp8, fp8_e4m3 only")
def backend_without_its_kv_dtype(recipe):
    base = resolve(recipe, hardware="b300", strategy="single_node_tp")
    found = added(recipe, base, edit(base, lambda p: set_value(p.nodes[0], "--kv-cache-dtype", "auto")))
    assert found[0].fix == "add --kv-cache-dtype fp8 or use another backend"
    return found


# ------------------------------------------------------------------------------------------- parallel sizes


@case("dcp-divides-tp", "error", "--decode-context-parallel-size 3 does not divide the tensor-parallel size 8")
def dcp_not_dividing_tp(recipe):
    return with_args(recipe, "b300", ["--decode-context-parallel-size", "3"], "single_node_tp")


@case("megamoe-needs-ep", "error", "--moe-backend deep_gemm_mega_moe needs --enable-expert-parallel")
def megamoe_without_expert_parallel(recipe):
    return with_args(recipe, "b300", ["--moe-backend", "deep_gemm_mega_moe"], "single_node_tp")


@case("nnodes-world", "error", "world size 8 (DP×PP×TP) is not divisible by --nnodes 3")
def world_not_divisible_by_nodes(recipe):
    base = resolve(recipe, hardware="gb300", strategy="multi_node_tp")

    def change(p: Plan) -> None:
        for n in p.nodes:
            set_value(n, "--nnodes", "3")

    return added(recipe, base, edit(base, change))


# ------------------------------------------------------------------------------------------- load balancing


@case("lb-headless", "error", "--data-parallel-hybrid-lb with --headless")
def hybrid_lb_on_a_headless_node(recipe):
    return with_args(recipe, "b300", ["--data-parallel-hybrid-lb", "--data-parallel-size-local", "1", "--headless"],
                     "single_node_tp")


@case("lb-modes", "error", "--data-parallel-hybrid-lb and --data-parallel-external-lb together")
def two_lb_modes(recipe):
    return with_args(recipe, "b300", ["--data-parallel-hybrid-lb", "--data-parallel-size-local", "1",
                                      "--data-parallel-external-lb"], "single_node_tp")


@case("lb-hybrid-local", "error", "--data-parallel-hybrid-lb needs --data-parallel-size-local")
def hybrid_lb_without_local_size(recipe):
    return with_args(recipe, "b300", ["--data-parallel-hybrid-lb"], "single_node_tp")


@case("dp-headless", "error", "a worker node has --data-parallel-start-rank without --headless")
def internal_lb_worker_not_headless(recipe):
    # the builder's tp_dp workers lack --headless; k3deploy's deployable plan adds it
    plan = resolve(recipe, hardware="h200", strategy="multi_node_tp_dp")
    return added(recipe, deployable(plan), plan)


@case("dp-headless", "error", "a worker node is --headless but its head runs hybrid/external-LB data parallel")
def hybrid_lb_worker_headless(recipe):
    base = resolve(recipe, hardware="b300", strategy="multi_node_dep")

    def change(p: Plan) -> None:
        worker = p.nodes[1]
        worker.argv.remove("--data-parallel-hybrid-lb")
        worker.argv.append("--headless")

    return added(recipe, base, edit(base, change))


@case("dp-endpoints", "info", "every node serves its own API port", path="strategies/multi_node_dep.yaml:vllm_args[1]")
def hybrid_lb_over_several_nodes(recipe):
    plan = resolve(recipe, hardware="b300", strategy="multi_node_dep")

    def internal_lb(p: Plan) -> None:  # one endpoint: internal LB, the worker headless
        for n in p.nodes:
            n.argv.remove("--data-parallel-hybrid-lb")
        p.nodes[1].argv.append("--headless")

    return added(recipe, edit(plan, internal_lb), plan)


# ------------------------------------------------------------------------------------------- speculative decoding


@case("spec-decoding-pp", "warning", "speculative decoding (mtp) with --pipeline-parallel-size 2")
def speculative_decoding_with_pipeline_parallel(recipe):
    return with_args(recipe, "h200", ["--speculative-config", '{"method":"mtp","num_speculative_tokens":1}'],
                     "multi_node_tp_pp")


@case("spec-decoding-runner", "error", "DSpark runs only on Model Runner V2")
def dspark_on_the_v1_runner(recipe):
    base = resolve(recipe, hardware="b300", strategy="single_node_tp",
                   extra_args=["--speculative-config.method", "dspark"])

    def change(p: Plan) -> None:
        p.nodes[0].env["VLLM_USE_V2_MODEL_RUNNER"] = "0"

    return added(recipe, base, edit(base, change))


# ------------------------------------------------------------------------------------------- P/D


@case("pd-hybrid-kv", "error", "--disable-hybrid-kv-cache-manager turns it off")
def nixl_without_hybrid_kv_manager(recipe):
    base = resolve(recipe, hardware="b300", strategy="pd_cluster")

    def change(p: Plan) -> None:
        argv = p.nodes[0].argv
        argv[argv.index("--no-disable-hybrid-kv-cache-manager")] = "--disable-hybrid-kv-cache-manager"

    return added(recipe, base, edit(base, change))


@case("pd-conv-layout", "error", "needs VLLM_SSM_CONV_STATE_LAYOUT=DS")
def nixl_without_ds_conv_layout(recipe):
    base = resolve(recipe, hardware="b300", strategy="pd_cluster")

    def change(p: Plan) -> None:
        for n in engines(p):
            n.env.pop("VLLM_SSM_CONV_STATE_LAYOUT")

    return added(recipe, base, edit(base, change))


@case("pd-side-channel", "warning", "VLLM_NIXL_SIDE_CHANNEL_HOST is unset",
      path="strategies/pd_cluster.yaml:prefill.env")
def nixl_without_side_channel_host(recipe):
    base = resolve(recipe, hardware="b300", strategy="pd_cluster")
    return added(recipe, base, edit(base, lambda p: p.nodes[0].env.pop("VLLM_NIXL_SIDE_CHANNEL_HOST")))


# ------------------------------------------------------------------------------------------- environment


@case("env-unknown", "warning", "VLLM_USE_V2_MODEL_RUNER is not an environment variable vLLM 0.33.0 reads")
def misspelt_vllm_variable(recipe):
    found = with_env(recipe, "b300", {"VLLM_USE_V2_MODEL_RUNER": "1"}, "single_node_tp")
    assert found[0].fix == "use VLLM_USE_V2_MODEL_RUNNER"
    return found


@case("env-unknown", "info", "it may be a vllm-ascend variable")
def unknown_vllm_variable_on_ascend(recipe):
    return with_env(recipe, "ascend_910c", {"VLLM_ASCEND_SOMETHING_NEW": "1"}, variant="ascend_w4a8")


@case("env-value", "error", "VLLM_SSM_CONV_STATE_LAYOUT='ds' is not one of: DS, SD")
def variable_value_outside_its_choices(recipe):
    return with_env(recipe, "b300", {"VLLM_SSM_CONV_STATE_LAYOUT": "ds"}, "single_node_tp")


@case("env-value", "error", "VLLM_USE_V2_MODEL_RUNNER='yes': vLLM parses it with int()")
def model_runner_switch_not_an_int(recipe):
    return with_env(recipe, "b300", {"VLLM_USE_V2_MODEL_RUNNER": "yes"}, "single_node_tp")


@case("env-default", "info", "VLLM_ENGINE_READY_TIMEOUT_S=600 is vLLM 0.33.0's default")
def variable_set_to_its_default(recipe):
    return with_env(recipe, "b300", {"VLLM_ENGINE_READY_TIMEOUT_S": "600"}, "single_node_tp")


@case("env-overwritten", "warning", "AITER_SITUV2_A8W4 is overwritten by vLLM 0.33.0 at import")
def aiter_variable_vllm_overwrites(recipe):
    found = with_env(recipe, "mi355x", {"AITER_SITUV2_A8W4": "1"}, "single_node_tp")
    assert found[0].fix == "use VLLM_ROCM_USE_AITER_MOE_SITUV2=a8w4"
    return found


@case("env-unused", "info", "SAFETENSORS_FAST_GPU is not read by vLLM 0.33.0")
def variable_vllm_does_not_read(recipe):
    return with_env(recipe, "b300", {"SAFETENSORS_FAST_GPU": "1"}, "single_node_tp")


@case("env-hardware", "warning", "NCCL_MNNVL_ENABLE is meant for multi-node NVLink fabrics")
def nvlink_fabric_variable_off_nvl(recipe):
    return with_env(recipe, "b300", {"NCCL_MNNVL_ENABLE": "1"}, "single_node_tp")


@case("env-hardware", "error", "UCX_TLS=rc,cuda_copy names CUDA transports on mi355x")
def cuda_transports_on_amd(recipe):
    return with_env(recipe, "mi355x", {"UCX_TLS": "rc,cuda_copy"}, "single_node_tp")


@case("env-role", "warning", "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT has no effect here")
def shard_sp_without_sequence_parallel_moe(recipe):
    return with_env(recipe, "b300", {"VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT": "1"}, "single_node_tp")


@case("env-role", "info", "VLLM_NIXL_SIDE_CHANNEL_HOST has no effect without a NIXL --kv-transfer-config")
def nixl_variable_off_pd(recipe):
    return with_env(recipe, "b300", {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.1"}, "single_node_tp")


# ------------------------------------------------------------------------------------------- memory, router


def _clean(**replace: str) -> Recipe:
    text = (LINT_RECIPES / "clean.yaml").read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    return parse_recipe(text)


@case("load-format", "error", "--load-format sharded_state cannot load the staged checkpoint: it reads the per-rank")
def load_format_of_another_checkpoint_form(recipe):
    return with_args(recipe, "b300", ["--load-format", "sharded_state"], "single_node_tp")


@case("load-format", "warning", "--load-format runai_streamer imports runai_model_streamer, which the published "
      "image vllm/vllm-openai-rocm:kimi-k3 is not known to hold it")
def load_format_whose_package_the_image_may_lack(recipe):
    found = with_args(recipe, "mi355x", ["--load-format", "runai_streamer"])
    assert "set k3_image to an image built with `pip install vllm[runai]`" in found[0].fix
    assert not with_args(recipe, "b300", ["--load-format", "runai_streamer"], "single_node_tp")  # the image holds it
    return found


@case("load-format", "warning", "--load-format runai_streamer imports runai_model_streamer, which the image "
      "registry.example/vllm-rocm:k3 must hold it")
def load_format_on_an_image_of_the_site(recipe):
    base = resolve(recipe, hardware="mi355x", image="registry.example/vllm-rocm:k3")
    return added(recipe, base, resolve(recipe, hardware="mi355x", image="registry.example/vllm-rocm:k3",
                                       extra_args=["--load-format", "runai_streamer"]))


@case("memory-fit", "error", "single_node_tp on b300 plans 1 node × 2144 GB = 2144 GB, below the 3000 GB",
      path="variants.default.vram_minimum_gb")
def variant_larger_than_the_node(recipe):
    clean = _clean()
    plan = resolve(clean, hardware="b300", strategy="single_node_tp")
    found = added(clean, plan, plan, changed_recipe=_clean(**{"vram_minimum_gb: 900": "vram_minimum_gb: 3000"}))
    assert found[0].fix == "use ≥2 nodes (a multi_node_* strategy, --nodes 2)"
    return found


@case("memory-fit", "error", "the prefill pool on h200 has 1 node × 1128 GB = 1128 GB, below the 1680 GB",
      path="variants.default.vram_minimum_gb")
def pd_pool_smaller_than_the_variant(recipe):
    base = resolve(recipe, hardware="h200", strategy="pd_cluster")

    one_prefill_node = [n.model_copy(update={"pool_nodes": 1}) if n.role == "prefill" else n for n in base.nodes]
    return added(recipe, base, base.model_copy(update={"nodes": one_prefill_node}))


@case("router-timeout", "warning", "vllm-router waits 600 s for its workers")
def router_gives_up_before_the_engines(recipe):
    base = resolve(recipe, hardware="b300", strategy="pd_cluster")

    def change(p: Plan) -> None:
        for n in engines(p):
            n.env["VLLM_ENGINE_READY_TIMEOUT_S"] = "3600"

    found = added(recipe, base, edit(base, change))
    assert "3600" in found[0].message and found[0].roles == ("router",)
    return found


# ------------------------------------------------------------------------------------------- images


@case("image-invalid", "error", "image 'Vllm/vllm-openai:v1' is not a valid image reference")
def malformed_image(recipe):
    return with_image(recipe, "Vllm/vllm-openai:v1")


@case("image-repository", "error", "image repository vllm/vllm-openai_rocm does not exist")
def image_repository_that_does_not_exist(recipe):
    return with_image(recipe, "vllm/vllm-openai_rocm:v1@sha256:" + "ab" * 32)


@case("image-vendor", "error", "is the amd build, the hardware needs a nvidia image")
def other_vendors_image(recipe):
    found = with_image(recipe, "vllm/vllm-openai-rocm:v0.33.0@sha256:" + "ab" * 32)
    assert found[0].fix == "use vllm/vllm-openai:TAG"
    return found


@case("image-unpinned", "warning", "image vllm/vllm-openai:latest follows a moving tag (latest)")
def image_on_a_moving_tag(recipe):
    return with_image(recipe, "vllm/vllm-openai:latest")


@case("image-digest", "info", "image vllm/vllm-openai:v0.33.0 is not pinned by digest")
def image_without_digest(recipe):
    return with_image(recipe, "vllm/vllm-openai:v0.33.0")


# ------------------------------------------------------------------------------------------- offering


@case("unresolvable", "error", "the offered selection does not resolve: pd_cluster on b300 needs 5 nodes per pool")
def offered_selection_that_does_not_resolve(recipe):
    # 10 TB of weights: the recipe offers pd_cluster, whose default pools would need more than 4 nodes each
    heavy = {"vram_minimum_gb: 900": "vram_minimum_gb: 10000"}
    without = lint_recipe(_clean(**heavy))
    report = lint_recipe(_clean(**heavy, **{"  - multi_node_tep\n": "  - multi_node_tep\n  - pd_cluster\n"}))
    before = {g.finding.key for g in without.groups}
    found = [g for g in report.groups if g.finding.key not in before]
    assert {(s.hardware, s.strategy) for g in found for s in g.selections} == {("h200", "pd_cluster"),
                                                                                ("b300", "pd_cluster")}
    return [g.finding for g in found]


# ------------------------------------------------------------------------------------------- the cases


ALL_CASES = [c for cases in CASES.values() for c in cases]


@pytest.mark.parametrize("c", ALL_CASES, ids=lambda c: f"{c.code}:{c.name}")
def test_triggers_exactly_its_code(c: Case, recipe):
    found = c.run(recipe)
    assert {f.code for f in found} == {c.code}, [f.line() for f in found]
    assert any(f.severity == c.severity and (c.path is None or f.path == c.path)
               and c.fragment in f"{f.message} {f.fix}" for f in found), [f.line() for f in found]
