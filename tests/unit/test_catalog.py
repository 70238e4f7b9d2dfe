"""k3deploy.recipe.catalog against the generated engine catalogs.

Expected values come from vLLM 0.33.0 / vllm-router 0.1.17 documentation and source (flag tables, envs.py
defaults), not from the catalog itself; the golden builder argvs are a second, independent source of flags.
"""

from __future__ import annotations

import json

import pytest

from helpers import GOLDEN
from k3deploy.errors import K3Error
from k3deploy.recipe.catalog import CATALOG_DIR, Catalog, CatalogError, available, load_catalog

BUILDER_CASES = GOLDEN / "builder-cases.json"


@pytest.fixture(scope="module")
def vllm() -> Catalog:
    return load_catalog("vllm", "0.33.0")


@pytest.fixture(scope="module")
def router() -> Catalog:
    return load_catalog("vllm-router", "0.1.17")


def test_defaults_and_cache():
    assert load_catalog() is load_catalog("vllm", "0.33.0")
    assert load_catalog("vllm-router").version == "0.1.17"
    assert ("vllm", "0.33.0") in available() and ("vllm-router", "0.1.17") in available()


def test_unknown_version_is_one_line_user_error():
    with pytest.raises(CatalogError) as exc:
        load_catalog("vllm", "9.9.9")
    assert isinstance(exc.value, K3Error)
    msg = str(exc.value)
    assert "9.9.9" in msg and "\n" not in msg and "gen_catalogs" in msg
    with pytest.raises(CatalogError):
        load_catalog("sglang")


@pytest.mark.parametrize("name", sorted(p.name for p in CATALOG_DIR.glob("*.json")))
def test_catalog_files_match_their_names_and_are_sorted(name):
    data = json.loads((CATALOG_DIR / name).read_text())
    assert name == f"{data['engine']}-{data['version']}.json"
    names = [f["name"] for f in data["flags"]]
    assert names == sorted(names) and len(names) == len(set(names))


# -- vllm serve flags ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", [
    "--no-enable-flashinfer-autotune", "--no-disable-hybrid-kv-cache-manager", "--no-enable-prefix-caching",
    "--no-data-parallel-hybrid-lb", "--no-enable-expert-parallel",
])
def test_boolean_optional_negations_are_known(vllm, option):
    assert vllm.knows_flag(option)
    assert vllm.is_negation(option)
    positive = vllm.flag(option)
    assert positive.boolean_optional and not vllm.is_negation(positive.name)


def test_negation_targets(vllm):
    assert vllm.flag("--no-enable-flashinfer-autotune").dest == "enable_flashinfer_autotune"
    assert vllm.flag("--no-disable-hybrid-kv-cache-manager").dest == "disable_hybrid_kv_cache_manager"
    # a store_true flag has no --no- form
    assert vllm.flag("--headless").negations == ()
    assert not vllm.knows_flag("--no-headless")


@pytest.mark.parametrize("short,long", [
    ("-tp", "--tensor-parallel-size"), ("-pp", "--pipeline-parallel-size"), ("-n", "--nnodes"),
    ("-r", "--node-rank"), ("-asc", "--api-server-count"), ("-dp", "--data-parallel-size"),
    ("-dpl", "--data-parallel-size-local"), ("-dpn", "--data-parallel-rank"), ("-dpr", "--data-parallel-start-rank"),
    ("-dpa", "--data-parallel-address"), ("-dpp", "--data-parallel-rpc-port"), ("-dpb", "--data-parallel-backend"),
    ("-dph", "--data-parallel-hybrid-lb"), ("-dpe", "--data-parallel-external-lb"),
    ("-dpm", "--data-parallel-multi-port-external-lb"), ("-ep", "--enable-expert-parallel"),
    ("-dcp", "--decode-context-parallel-size"),
])
def test_short_aliases(vllm, short, long):
    assert vllm.flag(short).name == long


def test_underscores_and_dotted_keys(vllm, router):
    assert vllm.flag("--safetensors_load_strategy").name == "--safetensors-load-strategy"
    assert vllm.flag("--max_model_len=131072").name == "--max-model-len"
    assert vllm.flag("--kv-transfer-config.kv_role").name == "--kv-transfer-config"
    # vllm-router uses plain argparse: no underscore spelling
    assert router.flag("--vllm_pd_disaggregation") is None
    assert router.flag("--vllm-pd-disaggregation") is not None


def test_abbreviations_only_on_request(vllm):
    assert vllm.flag("--tensor-parallel") is None
    assert vllm.flag("--tensor-parallel", abbrev=True).name == "--tensor-parallel-size"
    assert vllm.flag("--data-parallel", abbrev=True) is None  # ambiguous


def test_unknown_flags(vllm):
    for bad in ("--tensor-paralel-size", "--pd-disaggregation", "--vllm-pd-disaggregation", "--no-x"):
        assert not vllm.knows_flag(bad)
    assert "no flag --tensor-paralel-size" in vllm.check_flag("--tensor-paralel-size", "2")


def test_flag_types_defaults_and_choices(vllm):
    tp = vllm.flag("--tensor-parallel-size")
    assert (tp.type, tp.default) == ("int", "1")
    gmu = vllm.flag("--gpu-memory-utilization")
    assert (gmu.type, gmu.default) == ("float", "0.92")
    assert "--device-memory-utilization" in gmu.aliases
    assert vllm.flag("--master-port").default == "29501"
    rpc = vllm.flag("--data-parallel-rpc-port")
    assert (rpc.default, rpc.config_default) == (None, "29550")
    assert vllm.flag("--enable-prefix-caching").config_default == "true"
    assert vllm.flag("--master-addr").default == "127.0.0.1"
    assert set(vllm.flag("--dcp-comm-backend").choices) == {"ag_rs", "a2a"}
    assert set(vllm.flag("--mm-encoder-tp-mode").choices) == {"weights", "data"}
    assert vllm.flag("--attention-config").type == "json:AttentionConfig"
    assert vllm.flag("--kv-transfer-config").is_json
    assert vllm.flag("--headless").takes_value is False


def test_check_flag_values(vllm):
    assert vllm.check_flag("--dcp-comm-backend", "a2a") is None
    assert "not one of" in vllm.check_flag("--dcp-comm-backend", "nope")
    assert "integer" in vllm.check_flag("--tensor-parallel-size", "x")
    assert vllm.check_flag("-tp", "8") is None
    assert vllm.check_flag("--gpu-memory-utilization", "0.95") is None
    assert "number" in vllm.check_flag("--gpu-memory-utilization", "most")
    assert vllm.check_flag("--max-model-len", "1M") is None and vllm.check_flag("--max-model-len", "auto") is None
    assert vllm.check_flag("--max-num-batched-tokens", "16k") is None
    assert vllm.check_flag("--moe-backend", "marlin") is None
    assert vllm.check_flag("--moe-backend", "deep_gemm_mega_moe") is None
    assert vllm.check_flag("--moe-backend", "nope") is not None
    assert vllm.check_flag("--enable-expert-parallel") is None
    assert "takes no value" in vllm.check_flag("--enable-expert-parallel", "yes")
    assert "needs a value" in vllm.check_flag("--tensor-parallel-size")
    assert vllm.check_flag("--limit-mm-per-prompt", '{"vision_chunk": 2}') is None


def test_choice_sets(vllm):
    assert {"TOKENSPEED_MLA", "FLASHMLA", "TRITON_MLA", "CUTLASS_MLA", "FLASHINFER_MLA"} <= set(
        vllm.choices("attention_backend"))
    assert {"marlin", "deep_gemm_mega_moe", "auto", "aiter"} <= set(vllm.choices("moe_backend"))
    # the CLI drops "passthrough" from the config's all2all choices
    assert "passthrough" not in vllm.choices("all2all_backend")
    assert "passthrough" in vllm.choices("all2all_backend_config")
    assert {"deepep_v2", "flashinfer_nvlink_one_sided", "allgather_reducescatter"} <= set(
        vllm.choices("all2all_backend"))
    assert {"fp8", "fp8_e4m3", "auto", "nvfp4"} <= set(vllm.choices("kv_cache_dtype"))
    assert {"fastsafetensors", "auto", "safetensors", "runai_streamer"} <= set(vllm.choices("load_format"))
    assert set(vllm.choices("mla_prefill_backend")) == {
        "FLASH_ATTN", "FLASHINFER", "TRTLLM_RAGGED", "TOKENSPEED_MLA", "ROCM_AITER_FA", "CPU", "ZEN_CPU", "CUSTOM"}
    assert "kimi_k3" in vllm.choices("tool_call_parser") and "kimi_k3" in vllm.choices("reasoning_parser")
    assert {"dspark", "kimi_k3_mtp", "eagle3"} <= set(vllm.choices("speculative_method"))
    with pytest.raises(CatalogError):
        vllm.choices("colour")


def test_backend_compute_capability(vllm):
    ts = vllm.attention_backend("tokenspeed_mla")
    assert ts.majors == (10,)
    assert ts.supports("9.0") is False and ts.supports((10, 0)) is True and ts.supports("10.3") is True
    assert set(ts.supported_kv_cache_dtypes) == {"fp8", "fp8_e4m3"}
    fm = vllm.attention_backend("FLASHMLA")
    assert fm.majors == (9, 10)
    for name in ("FLASHINFER", "TRTLLM_RAGGED", "TOKENSPEED_MLA"):
        assert vllm.mla_prefill_backend(name).majors == (10,), name
    assert vllm.attention_backend("auto") is None and vllm.attention_backend("NOPE") is None


def test_attention_config_keys(vllm):
    assert {"backend", "backend_per_kind", "flash_attn_version", "tokenspeed_mla_min_split_kv",
            "use_trtllm_attention", "disable_flashinfer_q_quantization", "mla_prefill_backend",
            "use_prefill_query_quantization", "trtllm_ragged_backend", "indexer_kv_dtype"} <= set(
        vllm.attention_config_keys)


# -- environment variables ---------------------------------------------------------------------------------------


def test_env_vars(vllm):
    assert len(vllm.env_names) == 318
    assert vllm.reads_env("VLLM_ENGINE_READY_TIMEOUT_S")
    assert vllm.env_var("VLLM_ENGINE_READY_TIMEOUT_S").default == "600"
    assert vllm.env_var("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS").default == "300"
    assert vllm.env_var("VLLM_NIXL_SIDE_CHANNEL_PORT").default == "5600"
    assert vllm.env_var("VLLM_NIXL_SIDE_CHANNEL_HOST").default == "localhost"
    for name in ("VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4", "VLLM_RPC_TIMEOUT", "SAFETENSORS_FAST_GPU",
                 "AITER_BF16_FP8_MOE_BOUND"):
        assert not vllm.reads_env(name), name
    for name in ("VLLM_ROCM_USE_AITER_MOE_SITUV2", "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT",
                 "VLLM_SSM_CONV_STATE_LAYOUT", "VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_USE_RUST_FRONTEND"):
        assert vllm.reads_env(name), name


def test_env_choices(vllm):
    situ = vllm.env_var("VLLM_ROCM_USE_AITER_MOE_SITUV2")
    assert set(situ.choices) == {"auto", "a4w4", "a8w4", "a16w4", "0", "1"}
    assert situ.check_value("a8w4") is None and situ.check_value("A8W4") is None  # case-insensitive
    assert "not one of" in situ.check_value("a8w8")
    layout = vllm.env_var("VLLM_SSM_CONV_STATE_LAYOUT")
    assert layout.check_value("DS") is None and layout.check_value("ds") is not None  # case-sensitive


# -- vllm-router ---------------------------------------------------------------------------------------------


def test_router_flags(router):
    assert not router.knows_flag("--pd-disaggregation")
    assert router.knows_flag("--vllm-pd-disaggregation")
    assert router.flag("--host").default == "127.0.0.1"
    assert router.flag("--port").default == "30000"
    assert router.flag("--worker-startup-timeout-secs").default == "600"
    assert router.flag("--worker-startup-check-interval").default == "30"
    assert router.flag("--request-timeout-secs").default == "1800"
    assert set(router.flag("--kv-connector").choices) == {"nixl", "mooncake", "moriio"}
    policies = {"random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                "sticky_least_loaded"}
    for name in ("--policy", "--prefill-policy", "--decode-policy"):
        assert set(router.flag(name).choices) == policies
    assert router.flag("--prefill").nargs == "+" and router.flag("--prefill").action == "append"
    assert router.check_flag("--intra-node-data-parallel-size", "x") is not None
    assert router.env_names == frozenset()
    with pytest.raises(CatalogError):
        router.choices("attention_backend")


# -- cross-check with the builder's printed commands ---------------------------------------------------------


def _golden_argvs():
    import shlex

    cases = json.loads(BUILDER_CASES.read_text())["cases"]
    for c in cases:
        for n in c["nodes"]:
            argv = n.get("argv") or shlex.split(n["command"].replace("\\\n", " "))
            yield argv


def test_every_golden_flag_is_in_the_catalog(vllm, router):
    seen = 0
    for argv in _golden_argvs():
        cat = router if argv[0] == "vllm-router" else vllm
        start = 1 if argv[0] == "vllm-router" else 3  # vllm serve <model>
        i = start
        while i < len(argv):
            tok = argv[i]
            assert tok.startswith("-"), (argv, tok)
            f = cat.flag(tok)
            assert f is not None, f"{cat.engine} does not know {tok}"
            if f.takes_value and "=" not in tok:
                values = [argv[i + 1]]
                i += 2
                while f.nargs == "+" and i < len(argv) and not argv[i].startswith("--"):
                    values.append(argv[i])
                    i += 1
                if "$" not in values[0]:
                    assert f.check_value(values[0]) is None, (tok, values)
            else:
                i += 1
            seen += 1
    assert seen > 500
