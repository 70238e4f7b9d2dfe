"""The simulated engine's start after the rendezvous, phase by phase, logged as vLLM 0.33 logs it.

A start's load time (the node's ``load_seconds``, or ``K3SIM_LOAD_SECONDS``) is spent in the phases a real start
goes through, each ending with vLLM's own line (file and line as in 0.33's logs; the messages are the format strings
of ``model_executor/model_loader/default_loader.py``, ``v1/worker/gpu_model_runner.py``, ``compilation/backends.py``,
``compilation/monitor.py``, ``v1/worker/gpu_worker.py``, ``v1/core/kv_cache_utils.py``; vllm-facts §11,
field-notes §6): the weights, the compile (the profile run's ``torch.compile``), the KV cache and the CUDA-graph
capture. Their shares of the load (:data:`SHARES`) keep a start as long as it was, so a measured phase is the
simulation's own time. :func:`compile_phase` is the compile's one place (its cache: where ``Directly load the compiled
graph(s) for compile range ... from the cache, took %.3f s`` is logged on a hit).

Example::

    >>> [name for name, _ in SHARES]
    ['weights', 'compile', 'kv_cache', 'graphs']
    >>> round(sum(share for _, share in SHARES), 6)
    1.0
"""

from __future__ import annotations

#: each phase's share of a start's load time
SHARES: tuple[tuple[str, float], ...] = (("weights", 0.7), ("compile", 0.15), ("kv_cache", 0.05), ("graphs", 0.1))
#: what the simulated engine reports of its memory (a GB300's HBM3e less the weights of one rank)
WEIGHTS_GIB, KV_GIB, KV_TOKENS, GRAPH_GIB = 138.47, 96.31, 1_578_240, 0.66


def _share(name: str) -> float:
    return dict(SHARES)[name]


def compile_phase(engine, seconds: float, log) -> bool:
    """The profile run's torch.compile, ``seconds`` long (a miss: every graph compiled); False when stopped."""
    log("INFO", "backends.py:1051", "Using cache directory: /root/.cache/vllm/torch_compile_cache/"
        f"{engine.engine_id.replace('-', '')[:10]}/rank_0_0/backbone for vLLM's torch.compile")
    if not engine.sleep(seconds):
        return False
    log("INFO", "backends.py:1111", f"Dynamo bytecode transform time: {seconds * 0.3:.2f} s")
    log("INFO", "backends.py:320", f"Compiling a graph for compile range (1, 8192) takes {seconds * 0.7:.2f} s")
    log("INFO", "monitor.py:34", f"torch.compile takes {seconds:.2f} s in total")
    return True


def load(engine, seconds: float, log, compiled=None) -> bool:
    """The weights, the compile, the KV cache and the graphs of one start, ``seconds`` in all; False when the engine
    was stopped meanwhile. ``compiled``: the compile as the engine's compile cache runs it (a hit or a miss, its own
    time: ``vllmsim_caches.compile_phase``) instead of the compile's share of ``seconds``."""
    weights = seconds * _share("weights")
    if not engine.sleep(weights):
        return False
    log("INFO", "default_loader.py:384", f"Loading weights took {weights:.2f} seconds")
    log("INFO", "gpu_model_runner.py:3161", f"Model loading took {WEIGHTS_GIB:.2f} GiB memory and "
        f"{weights:.6f} seconds")
    if not (compiled() if compiled is not None else compile_phase(engine, seconds * _share("compile"), log)):
        return False
    if not engine.sleep(seconds * _share("kv_cache")):
        return False
    log("INFO", "gpu_worker.py:424", f"Available KV cache memory: {KV_GIB:.2f} GiB")
    log("INFO", "kv_cache_utils.py:1087", f"GPU KV cache size: {KV_TOKENS:,} tokens")
    graphs = seconds * _share("graphs")
    if not engine.sleep(graphs):
        return False
    log("INFO", "gpu_model_runner.py:4587", f"Graph capturing finished in {graphs:.0f} secs, took {GRAPH_GIB:.2f} GiB")
    return True
