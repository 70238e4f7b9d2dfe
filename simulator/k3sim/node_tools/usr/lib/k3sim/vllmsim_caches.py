"""The simulated engine's compile phase: a miss compiles, a hit loads, keyed as vLLM 0.33.0 keys its cache.

After the weights load, every node's engine (head and headless alike: each compiles its own ranks) looks for its
compiled graphs where vLLM does: ``$VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_<r>_<dp>/backbone`` (default
``VLLM_CACHE_ROOT``: ``~/.cache/vllm``; the directory: ``vllm/compilation/backends.py`` ``VllmBackend``), where
``<hash>`` is, as vLLM's, a hash of the environment factors (``vllm/envs.py`` ``compile_factors()``: every
``VLLM_*`` variable but its ignored ones), the configuration (``VllmConfig.compute_hash()``: the engine arguments
but the API server's and the node's place in the rendezvous) and the compiler's system factors (the simulated
GPU's product and compute capability, the vLLM version, as inductor's ``CacheBase.get_system()`` and
``torch_key()``). So a cache copied from a node of another GPU, image or configuration is a miss, never a crash.

- miss: it "compiles" for ``compile_seconds`` (the node's configuration, ``k3deploy sim up --compile-seconds``,
  nominal seconds times the time scale; ``K3SIM_COMPILE_SECONDS`` in the engine's environment overrides it), then
  writes its rank's ``vllm_compile_cache.py`` and its JIT kernels (Triton's under ``TRITON_CACHE_DIR``, DeepGEMM's
  under ``DG_JIT_CACHE_DIR``, else ``$VLLM_CACHE_ROOT/deep_gemm`` as vLLM sets it, FlashInfer's under
  ``FLASHINFER_WORKSPACE_BASE``, where they are set); it logs
  vLLM's ``Using cache directory: ... for vLLM's torch.compile``, ``Dynamo bytecode transform time``,
  ``Compiling a graph for dynamic shape takes`` and ``torch.compile takes ... in total`` lines;
- hit (any rank's graphs of the same hash: the inductor and Triton caches they point into are content-addressed,
  so another rank of the same model finds its kernels there): it loads for a twentieth of that and logs
  ``Directly load the compiled graph(s) for dynamic shape from the cache, took ...``.

Hooked into :mod:`vllmsim` after the weights load (``compile_phase``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time

#: nominal seconds of a cold compile of the K3 graphs and JIT kernels (vllm#19824: ~70 s of torch.compile on a
#: 70B model; cold FlashInfer/DeepGEMM/Triton JIT on a new architecture takes minutes more)
NOMINAL_COMPILE_SECONDS = 100.0
#: a hit's share of a cold compile's time
HIT_SHARE = 0.05

#: ``vllm/envs.py`` ``compile_factors()``'s ignored ``VLLM_*`` variables (0.33.0)
IGNORED_ENV = frozenset({
    "VLLM_RPC_BASE_PATH", "VLLM_USE_MODELSCOPE", "VLLM_RINGBUFFER_WARNING_INTERVAL", "VLLM_DEBUG_DUMP_PATH",
    "VLLM_PORT", "VLLM_CACHE_ROOT", "VLLM_SERVER_DEV_MODE", "VLLM_USE_RUST_FRONTEND", "VLLM_RUST_FRONTEND_PATH",
    "VLLM_USE_PRECOMPILED_RUST", "VLLM_USE_FASTOKENS", "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT",
    "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_RANDOMIZE_DP_DUMMY_INPUTS", "VLLM_CI_USE_S3", "VLLM_MODEL_REDIRECT_PATH",
    "VLLM_HOST_IP", "VLLM_FORCE_AOT_LOAD", "VLLM_USAGE_STATS_SERVER", "VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK",
    "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_PREFIX", "VLLM_LOGGING_STREAM", "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_LOGGING_COLOR", "VLLM_LOG_STATS_INTERVAL", "VLLM_DEBUG_LOG_API_SERVER_RESPONSE", "VLLM_TUNED_CONFIG_FOLDER",
    "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "VLLM_ENGINE_ITERATION_TIMEOUT_S", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "VLLM_IMAGE_FETCH_TIMEOUT",
    "VLLM_VIDEO_FETCH_TIMEOUT", "VLLM_AUDIO_FETCH_TIMEOUT", "VLLM_MEDIA_CACHE", "VLLM_ASSETS_CACHE",
    "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE",
    "VLLM_SKIP_MODEL_NAME_VALIDATION", "VLLM_API_KEY",
})
#: parsed arguments no part of ``VllmConfig.compute_hash`` covers (the API server's, the rendezvous place)
IGNORED_ARGS = frozenset({
    "host", "port", "uds", "api_key", "served_model_name", "api_server_count", "headless", "node_rank",
    "master_addr", "master_port", "dp_address", "dp_rpc_port", "dp_start", "dp_rank", "pg_timeout",
    "enable_auto_tool_choice", "tool_call_parser",
})


def compile_hash(args: dict, unknown: list[str], env: dict, cfg: dict, version: str) -> str:
    """The first ten hex digits of the hash vLLM names the cache directory by (``backends.py``)."""
    gpu = cfg.get("gpu", {})
    factors = [
        sorted((k, v) for k, v in env.items() if k.startswith("VLLM_") and k not in IGNORED_ENV),
        sorted((k, json.dumps(v)) for k, v in args.items() if k not in IGNORED_ARGS),
        list(unknown),
        [version, gpu.get("product"), gpu.get("compute_cap") or gpu.get("gfx"), cfg.get("vendor")],
    ]
    return hashlib.sha256(json.dumps(factors).encode()).hexdigest()[:10]


def compile_seconds(cfg: dict, env: dict) -> float:
    override = env.get("K3SIM_COMPILE_SECONDS")
    if override not in (None, ""):
        return float(override)
    if "compile_seconds" in cfg:
        return float(cfg["compile_seconds"])
    return NOMINAL_COMPILE_SECONDS * float(cfg.get("time_scale", 1.0))


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def compile_phase(engine, host_path, log, version: str) -> bool:
    """Compile or load the engine's graphs; False when the engine was stopped meanwhile. ``host_path``: a
    container path as the node holds it; ``log``: vllmsim's logger."""
    env, args, cfg = engine.env, engine.a, engine.cfg
    root_c = env.get("VLLM_CACHE_ROOT") or "/root/.cache/vllm"
    # an engine run outside a container with no cache root of its own keeps nothing (never the machine's ~/.cache)
    keeps = bool(env.get("VLLM_CACHE_ROOT") or env.get("K3SIM_VOLUMES"))
    digest = compile_hash(args, list(getattr(engine, "unknown", [])), env, cfg, version)
    rank = int(args.get("node_rank") or 0) * int(getattr(engine, "local_gpus", 0) or 1)
    dp = int(args.get("dp_start") or args.get("dp_rank") or 0)
    local_c = f"{root_c}/torch_compile_cache/{digest}/rank_{rank}_{dp}/backbone"
    hash_dir = host_path(f"{root_c}/torch_compile_cache/{digest}")
    held = keeps and os.path.isdir(hash_dir) and any(
        os.path.isfile(os.path.join(hash_dir, r, "backbone", "vllm_compile_cache.py")) for r in os.listdir(hash_dir))
    cold = compile_seconds(cfg, env)
    log("INFO", "backends.py:548", f"Using cache directory: {local_c} for vLLM's torch.compile")
    t0 = time.monotonic()
    if held:
        if not engine.sleep(cold * HIT_SHARE):
            return False
        took = time.monotonic() - t0
        log("INFO", "backends.py:215", "Directly load the compiled graph(s) for dynamic shape from the cache, "
            f"took {took:.3f} s")
    else:
        if not engine.sleep(cold):
            return False
        took = time.monotonic() - t0
        log("INFO", "monitor.py:34", f"Dynamo bytecode transform time: {took * 0.2:.2f} s")
        log("INFO", "backends.py:226", f"Compiling a graph for dynamic shape takes {took * 0.8:.2f} s")
        jit = {"TRITON_CACHE_DIR": env.get("TRITON_CACHE_DIR"),
               "DG_JIT_CACHE_DIR": env.get("DG_JIT_CACHE_DIR") or f"{root_c}/deep_gemm",
               "FLASHINFER_WORKSPACE_BASE": env.get("FLASHINFER_WORKSPACE_BASE")}
        for var, name in (("TRITON_CACHE_DIR", "kda_chunk_fwd.json"), ("DG_JIT_CACHE_DIR", "kernel.sm_gemm.so"),
                          ("FLASHINFER_WORKSPACE_BASE", ".cache/flashinfer/cached_ops/mla.so")):
            if keeps and jit[var]:
                _write(host_path(f"{jit[var]}/{digest}/{name}"), f"{digest}\n")
    if keeps:
        _write(host_path(f"{local_c}/vllm_compile_cache.py"), json.dumps({"hash": digest, "rank": rank}) + "\n")
    log("INFO", "monitor.py:45", f"torch.compile takes {took:.2f} s in total")
    return True
