"""The simulated engine's ``/metrics`` per data-parallel rank, with vLLM 0.33's names and labels.

vLLM 0.33's API server shows every engine (data-parallel rank) it fronts in its one ``/metrics``, each series with
the labels ``engine`` (the rank) and ``model_name`` (``vllm/v1/metrics/loggers.py``: ``PrometheusStatLogger``,
``create_metric_per_engine``; ``docs/design/metrics.md``): with the internal load balancer the head's server fronts
every rank (``--data-parallel-size``), with ``--data-parallel-hybrid-lb`` / ``--data-parallel-external-lb`` each
node's server its own (``--data-parallel-start-rank`` .. ``+ --data-parallel-size-local``, or
``--data-parallel-rank``). Each request goes to one rank (round robin, as the front end's balancer spreads them).

Per rank: ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (requests beyond :data:`MAX_NUM_SEQS`
wait), ``vllm:kv_cache_usage_perc`` (the running requests' tokens over :data:`KV_TOKENS` of cache, 0..1; a request
that does not fit preempts, counted in ``vllm:num_preemptions_total``), ``vllm:prefix_cache_queries_total`` /
``vllm:prefix_cache_hits_total`` (prompt tokens queried, and those in blocks of :data:`BLOCK` tokens the rank saw
before), ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total`` by finish
reason, and the histograms ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:e2e_request_latency_seconds`` with vLLM's bucket edges. Counters are shown as prometheus_client shows them
(``_total``; ``_created`` beside).

Example::

    >>> m = RankMetrics({"dp": 2, "dp_local": None, "dp_start": None, "dp_rank": None, "hybrid_lb": False,
    ...                  "external_lb": False, "headless": False}, (0.1, 1.0), (0.01, 0.1))
    >>> m.ranks
    [0, 1]
    >>> r = m.admit([1] * 40); m.finished(0.05, [0.02] * 3, "stop", rank=r)
    >>> [line for line in m.text("k3", 0).splitlines() if line.startswith("vllm:prefix_cache_queries_total")]
    ['vllm:prefix_cache_queries_total{engine="0",model_name="k3"} 40.0', \
'vllm:prefix_cache_queries_total{engine="1",model_name="k3"} 0.0']
"""

from __future__ import annotations

import threading
import time

#: vLLM's end-to-end latency bucket edges (``vllm/v1/metrics/loggers.py``, ``request_latency_buckets``)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort", "error")
#: tokens of KV cache per rank (the simulated engine's; ``K3SIM_KV_TOKENS`` sets another)
KV_TOKENS = 65536
#: requests a rank runs at once (vLLM's ``--max-num-seqs`` default); more wait
MAX_NUM_SEQS = 256
#: tokens per KV block (vLLM's default ``--block-size``): prefix hits count whole blocks
BLOCK = 16


class _Histogram:
    def __init__(self, edges: tuple) -> None:
        self.edges = edges
        self.counts = [0] * (len(edges) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        i = next((n for n, le in enumerate(self.edges) if value <= le), len(self.edges))
        self.counts[i] += 1
        self.sum += value


def served_ranks(args: dict) -> list[int]:
    """The data-parallel ranks this API server fronts (see the module's docstring).

    >>> base = {"dp": 4, "dp_local": 2, "dp_start": 2, "dp_rank": None, "hybrid_lb": True, "external_lb": False}
    >>> served_ranks(base), served_ranks({**base, "hybrid_lb": False}), served_ranks({**base, "dp": None})
    ([2, 3], [0, 1, 2, 3], [0])
    """
    dp = args.get("dp") or 1
    if args.get("hybrid_lb") or args.get("external_lb"):
        if args.get("dp_rank") is not None and not args.get("dp_local"):
            return [args["dp_rank"]]
        start = args.get("dp_start") or args.get("dp_rank") or 0
        return list(range(start, start + (args.get("dp_local") or 1)))
    return list(range(dp))


class _Rank:
    def __init__(self, ttft: tuple, itl: tuple) -> None:
        self.ttft, self.itl, self.e2e = _Histogram(ttft), _Histogram(itl), _Histogram(E2E_BUCKETS)
        self.success = {r: 0 for r in FINISH_REASONS}
        self.running: dict[int, int] = {}     # request id -> its tokens in the cache
        self.waiting = 0
        self.prompt = self.generation = self.queries = self.hits = self.preemptions = 0
        self.blocks: set[int] = set()


class RankMetrics:
    """What ``/metrics`` shows, per rank; :meth:`admit` a request (its prompt's token ids; the rank it runs on),
    :meth:`finished` it (its time to first token, the gaps between its tokens, its finish reason)."""

    def __init__(self, args: dict, ttft_buckets: tuple, itl_buckets: tuple, kv_tokens: int = KV_TOKENS) -> None:
        self.lock = threading.Lock()
        self.ranks = served_ranks(args)
        self.per = {r: _Rank(ttft_buckets, itl_buckets) for r in self.ranks}
        self.kv_tokens = max(1, kv_tokens)
        self.created = time.time()
        self.next = 0
        self.ids = 0
        self.started: dict[int, tuple[int, int, float]] = {}   # request id -> (rank, prompt tokens, start)
        self.local = threading.local()

    def admit(self, prompt_ids: list[int]) -> int:
        """Account a new request's prompt on the next rank; returns the rank (its request id is kept per thread)."""
        with self.lock:
            rank = self.ranks[self.next % len(self.ranks)]
            self.next += 1
            self.ids += 1
            rid = self.ids
            st = self.per[rank]
            st.prompt += len(prompt_ids)
            st.queries += len(prompt_ids)
            full = len(prompt_ids) // BLOCK
            prefix = 0
            for b in range(full):
                key = hash(tuple(prompt_ids[:(b + 1) * BLOCK]))
                if key not in st.blocks:
                    break
                prefix += 1
            st.hits += prefix * BLOCK
            st.blocks.update(hash(tuple(prompt_ids[:(b + 1) * BLOCK])) for b in range(full))
            if len(st.running) >= MAX_NUM_SEQS:
                st.waiting += 1
            used = sum(st.running.values())
            if used + len(prompt_ids) > self.kv_tokens and st.running:
                st.preemptions += 1       # vLLM preempts the newest running request to make room
            st.running[rid] = len(prompt_ids)
            self.started[rid] = (rank, len(prompt_ids), time.time())
        self.local.rid = rid
        return rank

    def finished(self, ttft: float, gaps: list, reason: str, rank: int | None = None) -> None:
        rid = getattr(self.local, "rid", None)
        with self.lock:
            if rid is None or rid not in self.started:
                rank = self.ranks[0] if rank is None else rank
            else:
                rank = self.started.pop(rid)[0]
            st = self.per[rank]
            st.running.pop(rid, None) if rid is not None else None
            if st.waiting:
                st.waiting -= 1
            st.ttft.observe(ttft)
            for g in gaps:
                st.itl.observe(g)
            st.e2e.observe(ttft + sum(gaps))
            st.generation += len(gaps) + 1 if reason != "abort" else len(gaps)
            st.success[reason] = st.success.get(reason, 0) + 1
        self.local.rid = None

    def text(self, model: str, running: int) -> str:
        """The ``/metrics`` text (``running``: the engine's own count, unused: each rank counts its own)."""
        def lab(rank: int, **extra: str) -> str:
            parts = [f'engine="{rank}"', *(f'{k}="{v}"' for k, v in extra.items()), f'model_name="{model}"']
            return "{" + ",".join(parts) + "}"

        def family(name: str, kind: str, doc: str, values: list[str]) -> list[str]:
            return [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *values]

        with self.lock:
            per = [(r, self.per[r]) for r in self.ranks]
            out = family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                         [f"vllm:num_requests_running{lab(r)} {float(len(s.running) - s.waiting)}" for r, s in per])
            out += family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                          [f"vllm:num_requests_waiting{lab(r)} {float(s.waiting)}" for r, s in per])
            out += family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                          [f"vllm:kv_cache_usage_perc{lab(r)} "
                           f"{min(1.0, sum(s.running.values()) / self.kv_tokens)}" for r, s in per])
            for name, attr, doc in (
                    ("vllm:prefix_cache_queries", "queries", "Prefix cache queries, in terms of number of queried "
                                                             "tokens."),
                    ("vllm:prefix_cache_hits", "hits", "Prefix cache hits, in terms of number of cached tokens."),
                    ("vllm:num_preemptions", "preemptions", "Cumulative number of preemption from the engine."),
                    ("vllm:prompt_tokens", "prompt", "Number of prefill tokens processed."),
                    ("vllm:generation_tokens", "generation", "Number of generation tokens processed.")):
                out += family(f"{name}_total", "counter", doc,
                              [f"{name}_total{lab(r)} {float(getattr(s, attr))}" for r, s in per])
                out += family(f"{name}_created", "gauge", doc,
                              [f"{name}_created{lab(r)} {self.created}" for r, _ in per])
            doc = "Count of successfully processed requests."
            out += family("vllm:request_success_total", "counter", doc,
                          [f"vllm:request_success_total{lab(r, finished_reason=k)} {float(n)}"
                           for r, s in per for k, n in s.success.items()])
            out += family("vllm:request_success_created", "gauge", doc,
                          [f"vllm:request_success_created{lab(r, finished_reason=k)} {self.created}"
                           for r, s in per for k in s.success])
            for name, which, doc in (("vllm:time_to_first_token_seconds", "ttft",
                                      "Histogram of time to first token in seconds."),
                                     ("vllm:inter_token_latency_seconds", "itl",
                                      "Histogram of inter-token latency in seconds."),
                                     ("vllm:e2e_request_latency_seconds", "e2e",
                                      "Histogram of e2e request latency in seconds.")):
                lines = []
                for r, s in per:
                    h: _Histogram = getattr(s, which)
                    total = 0
                    for le, n in zip([*(repr(float(e)) for e in h.edges), "+Inf"], h.counts, strict=True):
                        total += n
                        lines.append(f"{name}_bucket{lab(r, le=le)} {float(total)}")
                    lines += [f"{name}_count{lab(r)} {float(total)}", f"{name}_sum{lab(r)} {h.sum}"]
                out += family(name, "histogram", doc, lines)
                out += family(f"{name}_created", "gauge", doc,
                              [f"{name}_created{lab(r)} {getattr(s, which).created}" for r, s in per])
        return "\n".join(out) + "\n"
