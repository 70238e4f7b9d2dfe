"""The benchmark of a serving endpoint, pure: the load, what vLLM's own client measured, its record and its picture.

``k3deploy bench`` (:mod:`k3deploy.runtime.bench`) runs ``vllm bench serve`` (vLLM 0.33.0,
``vllm/benchmarks/serve.py``: its own ``add_cli_args`` and ``main``, once per concurrency of the sweep in one process)
from the engine's image on the endpoint's node, so the control machine needs nothing new and the client is the one
the engines were built with. InferenceX-like defaults: the random dataset at 1k tokens in and 1k out
(``ignore_eos``), greedy, a concurrency sweep (``k3_bench_concurrency``), ``k3_bench_rounds`` requests per unit of
concurrency. The tokenizer is the model's own, read from the snapshot in the mounted Hugging Face cache offline
(``HF_HUB_OFFLINE=1``). Each run prints one line ``K3_BENCH={json}`` (:data:`MARK`) with vLLM's result
(``p50_ttft_ms``, ``p99_itl_ms``, ``output_throughput``, ...); :func:`parse` reads the sweep into :class:`Point`\\ s.

The sweep is recorded per revision (``bench.json`` beside ``slo.json`` in each serving group's revision directory,
:func:`record`), shown by ``k3deploy history`` (:func:`cell`), drawn by :func:`svg` (output tokens/s per GPU
against the median end-to-end latency, one line per revision), and it can be the SLO gate's baseline
(``k3_slo_baseline: bench``, :func:`baseline`).

Example::

    >>> out = MARK + json.dumps({"concurrency": 4, "result": {"completed": 8, "failed": 0, "p50_ttft_ms": 40.0,
    ...     "p95_ttft_ms": 48.0, "p99_ttft_ms": 50.0, "p50_itl_ms": 20.0, "p95_itl_ms": 22.0, "p99_itl_ms": 25.0,
    ...     "p50_e2el_ms": 400.0, "p99_e2el_ms": 450.0, "output_throughput": 80.0, "duration": 1.6}})
    >>> points, why = parse(out, gpus=8)
    >>> summary(points)
    {'4': {'ttft_ms': {'p50': 40.0, 'p99': 50.0}, 'itl_ms': {'p50': 20.0, 'p99': 25.0}, 'output_tokens_per_s': 80.0}}
    >>> points[0].per_gpu
    10.0
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

if TYPE_CHECKING:
    from k3deploy.model.slo import Figures
    from k3deploy.model.variables import Variables

#: the mark before each run's one line of JSON
MARK = "K3_BENCH="
#: the file in a revision's directory that keeps its last benchmark
BENCH_FILE = "bench.json"
#: the client, as the record names it
CLIENT = "vllm bench serve"


@dataclass(frozen=True)
class Load:
    """The sweep: the random dataset's ``input``/``output`` tokens, each ``concurrency`` with ``rounds`` times as many
    requests."""

    input_tokens: int
    output_tokens: int
    concurrency: tuple[int, ...]
    rounds: int

    def line(self) -> str:
        """
        >>> Load(1024, 1024, (4, 16), 5).line()
        'random 1024/1024 tokens, concurrency 4, 16 (5 requests per unit of concurrency)'
        """
        return (f"random {self.input_tokens}/{self.output_tokens} tokens, concurrency "
                f"{', '.join(map(str, self.concurrency))} ({self.rounds} requests per unit of concurrency)")


def load_of(variables: Variables) -> Load:
    """The sweep the variables ask for (``k3_bench_*``)."""
    return Load(variables.k3_bench_input_tokens, variables.k3_bench_output_tokens,
                tuple(variables.k3_bench_concurrency), variables.k3_bench_rounds)


def client_args(load: Load, url: str, model: str, served: str) -> list[str]:
    """``vllm bench serve``'s arguments but the concurrency and the number of requests (one run each): the random
    dataset, greedy, exact output lengths, the percentiles recorded, the model's tokenizer from the cache.

    >>> args = client_args(Load(32, 16, (2,), 2), "http://10.0.0.1:8000", "moonshotai/Kimi-K3", "kimi-k3")
    >>> args[:6], args[args.index("--tokenizer") + 1]
    (['--backend', 'vllm', '--base-url', 'http://10.0.0.1:8000', '--endpoint', '/v1/completions'], 'moonshotai/Kimi-K3')
    """
    return ["--backend", "vllm", "--base-url", url.rstrip("/"), "--endpoint", "/v1/completions", "--model", model,
            "--served-model-name", served, "--tokenizer", model, "--trust-remote-code", "--dataset-name", "random",
            "--random-input-len", str(load.input_tokens), "--random-output-len", str(load.output_tokens),
            "--ignore-eos", "--temperature", "0", "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,95,99", "--disable-tqdm", "--ready-check-timeout-sec", "60"]


@dataclass(frozen=True)
class Point:
    """One run of the sweep: vLLM's figures (milliseconds; tokens/s), and per GPU."""

    concurrency: int
    completed: int
    failed: int
    ttft_ms: dict[str, float]             # p50, p95, p99
    itl_ms: dict[str, float]
    e2el_ms: dict[str, float]
    output_tokens_per_s: float
    per_gpu: float                        # output tokens/s per GPU of the engines behind the endpoint
    duration_s: float | None = None

    @classmethod
    def from_result(cls, concurrency: int, result: dict[str, Any], gpus: int) -> Point:
        def pct(name: str) -> dict[str, float]:
            return {p: round(float(result.get(f"{p}_{name}_ms") or 0.0), 3) for p in ("p50", "p95", "p99")}

        tput = round(float(result.get("output_throughput") or 0.0), 3)
        return cls(concurrency, int(result.get("completed") or 0), int(result.get("failed") or 0), pct("ttft"),
                   pct("itl"), pct("e2el"), tput, round(tput / gpus, 3) if gpus else tput,
                   result.get("duration"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Point:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def line(self) -> str:
        """
        >>> Point(4, 8, 0, {"p50": 40.0, "p95": 48, "p99": 50.0}, {"p50": 20.0, "p95": 22, "p99": 25.0},
        ...       {"p50": 400.0, "p95": 440, "p99": 450.0}, 80.0, 10.0).line()
        'concurrency 4: TTFT p50/p99 40/50 ms, ITL p50/p99 20/25 ms, 80 output tokens/s (10 per GPU), 0 of 8 failed'
        """
        return (f"concurrency {self.concurrency}: TTFT p50/p99 {self.ttft_ms['p50']:.0f}/{self.ttft_ms['p99']:.0f} "
                f"ms, ITL p50/p99 {self.itl_ms['p50']:.0f}/{self.itl_ms['p99']:.0f} ms, "
                f"{self.output_tokens_per_s:.0f} output tokens/s ({self.per_gpu:.3g} per GPU), {self.failed} of "
                f"{self.completed + self.failed} failed")


def parse(output: str, gpus: int) -> tuple[list[Point], str]:
    """The sweep's points from the client's output (each run's ``K3_BENCH=`` line), and why it stopped short ("" when
    every run printed its figures).

    >>> parse("ModuleNotFoundError: No module named 'vllm'", 8)
    ([], "the benchmark printed no result: ModuleNotFoundError: No module named 'vllm'")
    >>> parse(MARK + '{"concurrency": 4, "error": "ValueError: no tokenizer"}', 8)
    ([], 'the run at concurrency 4 failed: ValueError: no tokenizer')
    """
    points: list[Point] = []
    lines = [ln for ln in output.splitlines() if ln.startswith(MARK)]
    if not lines:
        return [], "the benchmark printed no result: " + (output.strip()[-300:] or "no output")
    for ln in lines:
        try:
            data = json.loads(ln[len(MARK):])
            if data.get("error"):
                return points, f"the run at concurrency {data.get('concurrency')} failed: {data['error']}"
            points.append(Point.from_result(int(data["concurrency"]), dict(data["result"]), gpus))
        except (ValueError, KeyError, TypeError) as exc:
            return points, f"the benchmark's result is not readable: {exc}"
    return points, ""


def summary(points: list[Point]) -> dict[str, dict[str, Any]]:
    """``bench --json``'s figures: per concurrency, TTFT and ITL at p50 and p99 and the output tokens/s."""
    return {str(p.concurrency): {"ttft_ms": {"p50": p.ttft_ms["p50"], "p99": p.ttft_ms["p99"]},
                                 "itl_ms": {"p50": p.itl_ms["p50"], "p99": p.itl_ms["p99"]},
                                 "output_tokens_per_s": p.output_tokens_per_s} for p in points}


@dataclass(frozen=True)
class Record:
    """What a revision's ``bench.json`` keeps: when, the client, the endpoint, the load, the GPUs, each point."""

    when: str
    endpoint: str
    load: Load
    gpus: int
    points: tuple[Point, ...]
    client: str = CLIENT
    revisions: dict[str, int] = field(default_factory=dict)   # group -> the revision it ran

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Record | None:
        """
        >>> r = Record("t", "http://e:8000", Load(32, 16, (2,), 2), 8, (), revisions={"engine": 2})
        >>> Record.from_json(r.to_json()) == r, Record.from_json("{")
        (True, None)
        """
        try:
            d = json.loads(text)
            load = d["load"]
            return cls(d["when"], d["endpoint"], Load(load["input_tokens"], load["output_tokens"],
                                                      tuple(load["concurrency"]), load["rounds"]),
                       int(d["gpus"]), tuple(Point.from_json(p) for p in d["points"]), d.get("client", CLIENT),
                       {str(k): int(v) for k, v in (d.get("revisions") or {}).items()})
        except (ValueError, KeyError, TypeError):
            return None


def cell(record: Record | None) -> str:
    """A revision's benchmark in ``k3deploy history``'s table: one line per concurrency.

    >>> cell(None)
    '-'
    >>> p = Point(4, 8, 0, {"p50": 40.0, "p95": 48, "p99": 50.0}, {"p50": 20.0, "p95": 22, "p99": 25.0},
    ...           {"p50": 400.0, "p95": 440, "p99": 450.0}, 80.0, 10.0)
    >>> print(cell(Record("2026-12-06T23:00:00Z", "http://e:8000", Load(32, 16, (4,), 2), 8, (p,))))
    c4: TTFT 40/50, ITL 20/25 ms, 80 tok/s (10/GPU)
    (32/16 tokens, 2026-12-06T23:00:00Z)
    """
    if record is None:
        return "-"
    rows = [f"c{p.concurrency}: TTFT {p.ttft_ms['p50']:.0f}/{p.ttft_ms['p99']:.0f}, ITL {p.itl_ms['p50']:.0f}/"
            f"{p.itl_ms['p99']:.0f} ms, {p.output_tokens_per_s:.0f} tok/s ({p.per_gpu:.3g}/GPU)"
            + (f", {p.failed} failed" if p.failed else "") for p in record.points]
    return "\n".join([*rows, f"({record.load.input_tokens}/{record.load.output_tokens} tokens, {record.when})"])


def baseline(record: Record, concurrency: int, requests: int) -> Figures | None:
    """The SLO gate's baseline from a benchmark (``k3_slo_baseline: bench``): TTFT and ITL at p95 of the run whose
    concurrency is nearest the gate's.

    >>> p = Point(4, 8, 0, {"p50": 40.0, "p95": 48, "p99": 50.0}, {"p50": 20.0, "p95": 22, "p99": 25.0},
    ...           {"p50": 400.0, "p95": 440, "p99": 450.0}, 80.0, 10.0)
    >>> f = baseline(Record("t", "e", Load(32, 16, (4,), 2), 8, (p,)), 2, 20)
    >>> f.ttft_p95_ms, f.itl_p95_ms, f.source
    (48, 22, 'bench')
    """
    from k3deploy.model.slo import Figures

    if not record.points:
        return None
    p = min(record.points, key=lambda x: (abs(x.concurrency - concurrency), x.concurrency))
    return Figures(requests=requests, failed=0, ttft_p95_ms=p.ttft_ms["p95"], itl_p95_ms=p.itl_ms["p95"],
                   source="bench")


#: the picture's colours, one per revision, in turn
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def svg(series: dict[str, Record]) -> str:
    """A self-contained SVG: output tokens/s per GPU against the median end-to-end latency, one line per revision
    (``series``: its label -> its record), each point marked with its concurrency.

    >>> p = Point(4, 8, 0, {"p50": 40.0, "p95": 48, "p99": 50.0}, {"p50": 20.0, "p95": 22, "p99": 25.0},
    ...           {"p50": 400.0, "p95": 440, "p99": 450.0}, 80.0, 10.0)
    >>> text = svg({"engine rev 1": Record("t", "e", Load(32, 16, (4,), 2), 8, (p,))})
    >>> text.startswith("<svg") and text.count("<polyline") == 1 and "engine rev 1" in text
    True
    """
    w, h, left, right, top, bottom = 720, 440, 70, 180, 40, 60
    pts = [p for r in series.values() for p in r.points]
    xmax = max([p.e2el_ms["p50"] / 1000 for p in pts] or [1.0]) * 1.1 or 1.0
    ymax = max([p.per_gpu for p in pts] or [1.0]) * 1.1 or 1.0

    def x(v: float) -> float:
        return round(left + (w - left - right) * v / xmax, 1)

    def y(v: float) -> float:
        return round(h - bottom - (h - top - bottom) * v / ymax, 1)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">Throughput against latency per revision '
           f'({escape(CLIENT)})</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
           f'<text x="{(left + w - right) / 2}" y="{h - 20}" text-anchor="middle">median end-to-end latency (s)'
           '</text>',
           f'<text x="18" y="{(top + h - bottom) / 2}" text-anchor="middle" transform="rotate(-90 18 '
           f'{(top + h - bottom) / 2})">output tokens/s per GPU</text>']
    for i in range(5):
        xv, yv = xmax * i / 4, ymax * i / 4
        out += [f'<text x="{x(xv)}" y="{h - bottom + 16}" text-anchor="middle">{xv:.3g}</text>',
                f'<text x="{left - 6}" y="{y(yv) + 4}" text-anchor="end">{yv:.3g}</text>']
    for n, (label, record) in enumerate(series.items()):
        colour = COLOURS[n % len(COLOURS)]
        line = sorted(record.points, key=lambda p: p.concurrency)
        coords = " ".join(f"{x(p.e2el_ms['p50'] / 1000)},{y(p.per_gpu)}" for p in line)
        out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for p in line:
            px, py = x(p.e2el_ms["p50"] / 1000), y(p.per_gpu)
            out += [f'<circle cx="{px}" cy="{py}" r="3" fill="{colour}"/>',
                    f'<text x="{px + 5}" y="{py - 5}" font-size="10">c{p.concurrency}</text>']
        ly = top + 20 * n
        out += [f'<line x1="{w - right + 10}" y1="{ly}" x2="{w - right + 30}" y2="{ly}" stroke="{colour}" '
                'stroke-width="2"/>', f'<text x="{w - right + 35}" y="{ly + 4}">{escape(label)}</text>']
    out.append("</svg>")
    return "\n".join(out) + "\n"
