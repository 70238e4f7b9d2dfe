"""The engines' compile and JIT caches: on the node's persistent model cache, one directory per cache key.

Where vLLM 0.33.0 and the libraries in its images write what they compile, and what moves it:

- vLLM's torch.compile cache: ``$VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_<r>_<dp>/<prefix>``
  (``VLLM_CACHE_ROOT``, default ``~/.cache/vllm``: ``vllm/envs.py``; the directory: ``vllm/compilation/backends.py``
  ``VllmBackend``, its ``<hash>`` over ``envs.compile_factors()``, ``VllmConfig.compute_hash()``, the traced source
  files and the compiler's ``compute_hash``); the docs say the directory can be copied to another machine;
- inductor and Triton: ``vllm/compilation/compiler_interface.py`` ``InductorAdaptor.initialize_cache`` points
  ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` into that directory, but only when vLLM compiles (inductor
  runs only then): where compilation is off (K3 on CUDA auto-enables ``VLLM_USE_BREAKABLE_CUDAGRAPH``, which forces
  compilation mode NONE: ``vllm/config/vllm.py``) Triton's kernels (the KDA layers') go to Triton's default
  ``~/.triton/cache`` (``triton/knobs.py``), inside the container, lost at every restart;
- DeepGEMM: ``DG_JIT_CACHE_DIR`` (``deep_gemm/jit``), which vLLM sets to ``$VLLM_CACHE_ROOT/deep_gemm`` when unset
  (``vllm/utils/deep_gemm.py``), so it follows the root; FlashInfer:
  ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>`` (``flashinfer/jit/env.py``); the CUDA driver's
  PTX JIT cache, ``CUDA_CACHE_PATH`` (default ``~/.nv/ComputeCache``); AMD's AITER (``AITER_JIT_DIR``,
  ``aiter/jit/core.py``) and MIOpen (``MIOPEN_USER_DB_PATH``, ``MIOPEN_CUSTOM_CACHE_DIR``); Ascend's CANN operator
  cache (``ASCEND_CACHE_PATH``, default ``~/atc_data``). Each vendor's are data in its pack
  (``Container.jit_caches``); :data:`COMMON` are every vendor's.

Every one of them is pointed at ``<k3_model_cache>/k3-compile/<key>/`` on the host (the container's
``~/.cache/k3-compile/<key>``), where :func:`cache_key` covers what those caches depend on: the image build, the
hardware profile (its GPU, so its compute capability), the engine arguments that vLLM's ``VllmConfig.compute_hash``
covers and the ``VLLM_*`` variables that ``envs.compile_factors()`` hashes (every registered one but its
``ignored_factors``). So a different image, GPU or configuration gets a directory of its own and never reads
another's entries; a restart that changes none of them (a port, a served name, a timeout, a ``NCCL_*`` or other
non-vLLM variable, the node's address or rank) keeps its directory and so its caches. The nodes that run the same
key are a class: once one holds the class's caches, the stage hands them to the others
(:func:`k3deploy.model.staging.cache_shares`). Pure.

Example::

    >>> k = cache_key(["vllm", "serve", "m", "--port", "8000", "-tp", "8"], {"VLLM_HOST_IP": "10.0.0.1"},
    ...               image="img@sha256:ab", hardware="gb300")
    >>> k == cache_key(["vllm", "serve", "m", "--port", "9000", "-tp", "8"], {"NCCL_DEBUG": "INFO"},
    ...                image="img@sha256:ab", hardware="gb300")
    True
    >>> k == cache_key(["vllm", "serve", "m", "-tp", "4"], {}, image="img@sha256:ab", hardware="gb300")
    False
    >>> cache_env(k, (("DG_JIT_CACHE_DIR", "deep_gemm"),))["DG_JIT_CACHE_DIR"] == container_dir(k) + "/deep_gemm"
    True
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence

#: the directory under the model cache (the container's ``~/.cache``) that holds one directory per key
DIRNAME = "k3-compile"
#: where the model cache is mounted in the container (:data:`k3deploy.model.units.CONTAINER_CACHE`)
CONTAINER_CACHE = "/root/.cache"
#: the file a key's directory holds once an engine served from it (written when its revision is marked current)
COMPLETE = ".k3-complete"
#: the variable whose value names the key (``<container_dir(key)>/vllm``): vLLM's cache root
KEY_ENV = "VLLM_CACHE_ROOT"

#: every vendor's caches: (variable, directory under the key's): vLLM's root (its torch.compile cache, inductor's
#: and Triton's where vLLM compiles: inductor runs only then; DeepGEMM's, which vLLM puts at ``deep_gemm`` under
#: it), then Triton's for the kernels that compile outside vLLM's compile (K3's KDA layers with compilation off)
COMMON: tuple[tuple[str, str], ...] = (
    ("VLLM_CACHE_ROOT", "vllm"),
    ("TRITON_CACHE_DIR", "triton"),
)

#: ``vllm/envs.py`` ``compile_factors()``: the ``VLLM_*`` variables its hash leaves out (0.33.0); every other
#: ``VLLM_*`` variable is hashed, and no variable without the prefix is
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

#: ``vllm serve`` flags that no part of ``VllmConfig.compute_hash`` covers (the API server's, the node's place in
#: the rendezvous), each with whether it takes a value; every other flag and value is part of the key
IGNORED_FLAGS: dict[str, bool] = {
    "--host": True, "--port": True, "--uds": True, "--api-key": True, "--served-model-name": True,
    "--api-server-count": True, "-asc": True, "--headless": False, "--node-rank": True, "-r": True,
    "--master-addr": True, "--master-port": True, "--data-parallel-address": True, "-dpa": True,
    "--data-parallel-rpc-port": True, "-dpp": True, "--data-parallel-start-rank": True, "-dpr": True,
    "--data-parallel-rank": True, "-dpn": True, "--distributed-timeout-seconds": True,
    "--disable-log-requests": False, "--enable-log-requests": False, "--disable-uvicorn-access-log": False,
    "--disable-log-stats": False, "--enable-auto-tool-choice": False, "--tool-call-parser": True,
    "--chat-template": True, "--ssl-keyfile": True, "--ssl-certfile": True, "--root-path": True,
}


def hashed_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of an engine's environment that vLLM's compile cache hash covers.

    >>> hashed_env({"VLLM_HOST_IP": "1", "VLLM_USE_DEEP_GEMM": "1", "NCCL_DEBUG": "INFO"})
    {'VLLM_USE_DEEP_GEMM': '1'}
    """
    return {k: v for k, v in sorted(env.items()) if k.startswith("VLLM_") and k not in IGNORED_ENV}


def hashed_argv(argv: Sequence[str]) -> list[str]:
    """The engine's arguments less those no part of ``VllmConfig.compute_hash`` covers (``--flag=value`` too).

    >>> hashed_argv(["vllm", "serve", "m", "--port=8000", "--headless", "--node-rank", "1", "--nnodes", "2"])
    ['vllm', 'serve', 'm', '--nnodes', '2']
    """
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        flag, eq, _ = word.partition("=")
        if flag in IGNORED_FLAGS:
            skip = IGNORED_FLAGS[flag] and not eq
            continue
        out.append(word)
    return out


def cache_key(argv: Sequence[str], env: Mapping[str, str], *, image: str, hardware: str) -> str:
    """The key of a unit's compile caches: 16 hex digits of the sha256 of the image, the hardware profile, the
    hashed arguments and the hashed environment."""
    doc = json.dumps({"image": image, "hardware": hardware, "argv": hashed_argv(argv), "env": hashed_env(env)},
                     sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def container_dir(key: str) -> str:
    """The key's directory as the container sees it."""
    return f"{CONTAINER_CACHE}/{DIRNAME}/{key}"


def host_root(model_cache: str) -> str:
    """The directory on the host that holds every key's directory."""
    return f"{model_cache.rstrip('/')}/{DIRNAME}"


def host_dir(model_cache: str, key: str) -> str:
    """The key's directory on the host."""
    return f"{host_root(model_cache)}/{key}"


def cache_env(key: str, vendor: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """The environment that points every compile and JIT cache (:data:`COMMON`, then the vendor's) into the key's
    directory."""
    base = container_dir(key)
    return {name: f"{base}/{sub}" if sub else base for name, sub in (*COMMON, *vendor)}


_KEYED = re.compile(rf"{re.escape(CONTAINER_CACHE)}/{DIRNAME}/([0-9a-f]{{16}})/vllm")


def key_of(env: Mapping[str, str]) -> str | None:
    """The cache key an env file names, by its ``VLLM_CACHE_ROOT`` (None: the unit keeps no keyed caches).

    >>> key_of(cache_env("0123456789abcdef")), key_of({"VLLM_CACHE_ROOT": "/elsewhere"})
    ('0123456789abcdef', None)
    """
    m = _KEYED.fullmatch(env.get(KEY_ENV, ""))
    return m[1] if m else None
