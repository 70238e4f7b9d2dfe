"""The SLO gate, pure: what a probe load measured (:class:`Figures`), the targets (:class:`Targets`) and the verdict.

A probe (:func:`k3deploy.model.commands.slo_probe`) sends the same load to one group's own endpoint and reads each of
its serving engines' ``/metrics`` before and after. From the engine's side the figures are the p95 of time to first
token and of inter-token latency over the probe alone: the difference of the histograms
``vllm:time_to_first_token_seconds`` and ``vllm:inter_token_latency_seconds`` (summed over the engines), its quantile
interpolated in the buckets as Prometheus' ``histogram_quantile`` does (:func:`quantile`). From the client's side: how
many requests failed (not answered 200, or a stream that did not end) and the p95 of time to first token as the
client saw it (the engine's figures stand where the engine has no histograms).

:func:`judge` compares: a group *misses* when any probe request failed, or its TTFT or ITL at p95 is above
``k3_slo_relative`` times the baseline's (the replicas still on the previous revision under the same load, or the
previous revision's recorded figures), or above the absolute targets ``k3_slo_ttft_p95_ms`` /
``k3_slo_itl_p95_ms`` where set.

Example::

    >>> before = parse_metrics('vllm:time_to_first_token_seconds_bucket{le="0.1"} 2.0\\n'
    ...                        'vllm:time_to_first_token_seconds_bucket{le="0.25"} 2.0\\n'
    ...                        'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 2.0\\n')
    >>> after = parse_metrics('vllm:time_to_first_token_seconds_bucket{le="0.1"} 4.0\\n'
    ...                       'vllm:time_to_first_token_seconds_bucket{le="0.25"} 12.0\\n'
    ...                       'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 12.0\\n')
    >>> round(quantile(0.95, delta(before, after).histograms[TTFT]), 4)   # 10 new requests, 8 of them above 0.1
    0.2406
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from k3deploy.model.rollout import Rollout
    from k3deploy.model.variables import Variables

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
SUCCESS = "vllm:request_success_total"
#: the metric families a probe reads of ``/metrics`` (what :func:`parse_metrics` uses)
FAMILIES = (TTFT, ITL, SUCCESS)
#: the percentile the gate judges
PERCENTILE = 0.95
#: one sample line of the Prometheus text format: name, labels, value (a timestamp may follow)
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets ``(upper bound, count)`` in increasing order, ``+Inf`` last, as Prometheus keeps them."""

    buckets: tuple[tuple[float, float], ...] = ()

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0


@dataclass(frozen=True)
class Snapshot:
    """What one ``/metrics`` read (or several, summed) says of the gate's families: each histogram, summed over its
    series (engines, models), and finished requests by reason."""

    histograms: dict[str, Histogram] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)


def parse_metrics(text: str) -> Snapshot:
    """The gate's families of a Prometheus text exposition (``GET /metrics``); other lines are ignored.

    >>> s = parse_metrics('# TYPE vllm:request_success_total counter\\n'
    ...                   'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0\\n'
    ...                   'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="m"} 5.0\\n'
    ...                   'vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 6.0\\n'
    ...                   'vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 6.0\\n')
    >>> s.finished, s.histograms[ITL].buckets
    ({'stop': 3.0}, ((0.025, 5.0), (inf, 6.0)))
    """
    return merge([_parse_one(text)])


def _parse_one(text: str) -> Snapshot:
    buckets: dict[str, dict[float, float]] = {}
    finished: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if m is None:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        name = m["name"]
        labels = {x["key"]: x["value"] for x in _LABEL.finditer(m["labels"] or "")}
        if name == SUCCESS:
            reason = labels.get("finished_reason", "")
            finished[reason] = finished.get(reason, 0.0) + value
        elif name.endswith("_bucket") and name[:-len("_bucket")] in (TTFT, ITL) and "le" in labels:
            try:
                le = float(labels["le"])   # "+Inf" reads as inf
            except ValueError:
                continue
            series = buckets.setdefault(name[:-len("_bucket")], {})
            series[le] = series.get(le, 0.0) + value
    return Snapshot({n: Histogram(tuple(sorted(b.items()))) for n, b in buckets.items()}, finished)


def merge(snapshots: list[Snapshot]) -> Snapshot:
    """Several engines' snapshots as one (a group with several serving engines): buckets and counts summed."""
    hist: dict[str, dict[float, float]] = {}
    finished: dict[str, float] = {}
    for s in snapshots:
        for name, h in s.histograms.items():
            into = hist.setdefault(name, {})
            for le, n in h.buckets:
                into[le] = into.get(le, 0.0) + n
        for reason, n in s.finished.items():
            finished[reason] = finished.get(reason, 0.0) + n
    return Snapshot({n: Histogram(tuple(sorted(b.items()))) for n, b in hist.items()}, finished)


def delta(before: Snapshot, after: Snapshot) -> Snapshot:
    """What happened between two reads of the same engines: ``after - before`` per bucket and per reason. A series
    that went down (the engine restarted in between) counts from zero, as Prometheus' ``increase`` does.

    >>> b = Snapshot({TTFT: Histogram(((0.1, 2.0), (math.inf, 3.0)))}, {"stop": 3.0})
    >>> a = Snapshot({TTFT: Histogram(((0.1, 5.0), (math.inf, 7.0)))}, {"stop": 7.0, "abort": 1.0})
    >>> d = delta(b, a)
    >>> d.histograms[TTFT].buckets, d.finished
    (((0.1, 3.0), (inf, 4.0)), {'stop': 4.0, 'abort': 1.0})
    """
    hist = {}
    for name, h in after.histograms.items():
        was = dict(before.histograms[name].buckets) if name in before.histograms else {}
        restarted = any(n < was.get(le, 0.0) for le, n in h.buckets)
        hist[name] = Histogram(tuple((le, n if restarted else n - was.get(le, 0.0)) for le, n in h.buckets))
    finished = {r: (n - before.finished.get(r, 0.0) if n >= before.finished.get(r, 0.0) else n)
                for r, n in after.finished.items()}
    return Snapshot(hist, finished)


def quantile(q: float, histogram: Histogram) -> float | None:
    """The ``q``-quantile of a histogram, interpolated linearly within its bucket as Prometheus'
    ``histogram_quantile`` does (a rank in the ``+Inf`` bucket: the highest finite bound); None without
    observations.

    >>> h = Histogram(((0.01, 0.0), (0.025, 90.0), (0.05, 100.0), (math.inf, 100.0)))
    >>> round(quantile(0.5, h), 5), round(quantile(0.95, h), 5), quantile(0.95, Histogram(((math.inf, 0.0),)))
    (0.01833, 0.0375, None)
    >>> quantile(0.95, Histogram(((0.1, 0.0), (0.25, 1.0), (math.inf, 3.0))))   # beyond the last finite bound
    0.25
    """
    buckets = [b for b in histogram.buckets]
    if len(buckets) < 2 or buckets[-1][0] != math.inf or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    b = next(i for i, (_, n) in enumerate(buckets) if n >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count) if count > 0 else end


def exact_quantile(q: float, values: list[float]) -> float | None:
    """The ``q``-quantile of samples (nearest rank), None without any.

    >>> exact_quantile(0.95, [float(v) for v in range(1, 21)]), exact_quantile(0.95, [])
    (19.0, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class Load:
    """The probe load: ``requests`` streamed completions, ``concurrency`` at a time, each with a prompt of
    ``prompt_tokens`` words and exactly ``output_tokens`` tokens out (``ignore_eos``)."""

    requests: int
    concurrency: int
    prompt_tokens: int
    output_tokens: int

    def line(self) -> str:
        """
        >>> Load(20, 4, 256, 64).line()
        '20 streamed completions, 4 at a time, 256 prompt tokens, 64 output tokens each'
        """
        return (f"{self.requests} streamed completions, {self.concurrency} at a time, {self.prompt_tokens} prompt "
                f"tokens, {self.output_tokens} output tokens each")


@dataclass(frozen=True)
class Figures:
    """What one probe load measured on one group. Times in milliseconds; None: nothing to measure it from."""

    requests: int
    failed: int
    ttft_p95_ms: float | None              # the engines' histograms (else the client's)
    itl_p95_ms: float | None               # the engines' histograms
    client_ttft_p95_ms: float | None = None
    errors: tuple[str, ...] = ()           # the first failures, as the client saw them
    source: str = "metrics"                # "metrics": TTFT and ITL from the histograms; "client": from the client

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Figures:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["errors"] = tuple(known.get("errors") or ())
        return cls(**known)

    def line(self) -> str:
        """
        >>> Figures(20, 0, 45.0, 24.25, 52.1).line()
        'TTFT p95 45.0 ms, ITL p95 24.2 ms, 0 of 20 requests failed (client TTFT p95 52.1 ms)'
        """
        client = f" (client TTFT p95 {_ms(self.client_ttft_p95_ms)})" if self.client_ttft_p95_ms is not None else ""
        return (f"TTFT p95 {_ms(self.ttft_p95_ms)}, ITL p95 {_ms(self.itl_p95_ms)}, {self.failed} of {self.requests} "
                f"requests failed{client}")


def _ms(value: float | None) -> str:
    """
    >>> _ms(145.0), _ms(24.25), _ms(0.5), _ms(None)
    ('145 ms', '24.2 ms', '0.5 ms', 'n/a')
    """
    if value is None:
        return "n/a"
    return f"{value:.0f} ms" if value >= 100 else f"{value:.1f} ms"


#: the mark before the probe's one line of JSON (:func:`k3deploy.model.commands.slo_probe`)
PROBE_MARK = "K3_SLO="


def parse_probe(output: str) -> tuple[Figures | None, str]:
    """The figures of a probe's output (:func:`k3deploy.model.commands.slo_probe`: one line ``K3_SLO={json}`` with the
    ``/metrics`` texts before and after, per engine, and each request's result), or None and why.

    >>> line = PROBE_MARK + json.dumps({"before": {"u": ""}, "after": {"u": ""},
    ...                                 "results": [{"ok": True, "ttft": 0.05}, {"ok": False, "error": "HTTP 500"}]})
    >>> figures, why = parse_probe("noise\\n" + line)
    >>> figures.failed, figures.client_ttft_p95_ms, figures.ttft_p95_ms, figures.source, figures.errors
    (1, 50.0, 50.0, 'client', ('HTTP 500',))
    >>> parse_probe("python3: not found")
    (None, 'the probe printed no result: python3: not found')
    """
    lines = [ln for ln in output.splitlines() if ln.startswith(PROBE_MARK)]
    if not lines:
        return None, "the probe printed no result: " + (output.strip()[-300:] or "no output")
    try:
        data = json.loads(lines[-1][len(PROBE_MARK):])
        results = list(data["results"])
        before = merge([parse_metrics(t) for t in data.get("before", {}).values()])
        after = merge([parse_metrics(t) for t in data.get("after", {}).values()])
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"the probe's result is not readable: {exc}"
    failed = [r for r in results if not r.get("ok")]
    client = exact_quantile(PERCENTILE, [float(r["ttft"]) for r in results if r.get("ok") and r.get("ttft")])
    d = delta(before, after)
    ttft = quantile(PERCENTILE, d.histograms[TTFT]) if TTFT in d.histograms else None
    itl = quantile(PERCENTILE, d.histograms[ITL]) if ITL in d.histograms else None
    source = "metrics" if ttft is not None else "client"
    return Figures(requests=len(results), failed=len(failed),
                   ttft_p95_ms=_to_ms(ttft if ttft is not None else client), itl_p95_ms=_to_ms(itl),
                   client_ttft_p95_ms=_to_ms(client),
                   errors=tuple(str(r.get("error") or "failed")[:200] for r in failed[:3]), source=source), ""


def _to_ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


@dataclass(frozen=True)
class Targets:
    """What the gate requires: at most ``relative`` times the baseline's p95 (TTFT and ITL), at most the absolute
    p95s where set, no failed probe request."""

    relative: float | None = 1.5
    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None

    def line(self) -> str:
        """
        >>> Targets().line()
        'no failed request; TTFT and ITL p95 at most 1.5x the previous revision'
        >>> Targets(None, 500, 50).line()
        'no failed request; TTFT p95 at most 500 ms; ITL p95 at most 50.0 ms'
        """
        parts = ["no failed request"]
        if self.relative is not None:
            parts.append(f"TTFT and ITL p95 at most {self.relative:g}x the previous revision")
        if self.ttft_p95_ms is not None:
            parts.append(f"TTFT p95 at most {_ms(self.ttft_p95_ms)}")
        if self.itl_p95_ms is not None:
            parts.append(f"ITL p95 at most {_ms(self.itl_p95_ms)}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Verdict:
    """The gate's judgement of one group: ``ok``, and one line per figure against its target."""

    ok: bool
    lines: tuple[str, ...]
    figures: Figures
    baseline: Figures | None = None

    def report(self, group: str, against: str) -> str:
        head = (f"SLO gate: group {group} {'meets' if self.ok else 'misses'} the targets "
                f"(measured against {against})")
        return "\n".join([head, *(f"  {ln}" for ln in self.lines)])


def judge(figures: Figures, baseline: Figures | None, targets: Targets) -> Verdict:
    """Compare one group's figures with the baseline's (None: no baseline: the absolute targets only) and the
    targets; every line says measured, against what, hit or miss.

    >>> base = Figures(20, 0, 40.0, 24.0)
    >>> v = judge(Figures(20, 0, 120.0, 24.5), base, Targets())
    >>> v.ok
    False
    >>> print("\\n".join(v.lines))
    failed requests: 0 of 20 (target 0): hit
    TTFT p95: 120 ms against 40.0 ms on the previous revision (target at most 1.5x = 60.0 ms): miss
    ITL p95: 24.5 ms against 24.0 ms on the previous revision (target at most 1.5x = 36.0 ms): hit
    >>> judge(Figures(20, 1, 40.0, 24.0, errors=("HTTP 500",)), base, Targets()).lines[0]
    'failed requests: 1 of 20 (target 0): miss (HTTP 500)'
    >>> judge(Figures(20, 0, 40.0, 24.0), None, Targets(1.5, ttft_p95_ms=30.0)).lines[1:]
    ('TTFT p95: 40.0 ms (target at most 30.0 ms): miss',)
    """
    lines = []
    ok = True
    miss = figures.failed > 0 or figures.requests == 0
    ok &= not miss
    why = f" ({'; '.join(figures.errors)})" if figures.errors else ""
    lines.append(f"failed requests: {figures.failed} of {figures.requests} (target 0): "
                 f"{'miss' if miss else 'hit'}{why if miss else ''}")
    for name, now, was, absolute in (("TTFT", figures.ttft_p95_ms, baseline.ttft_p95_ms if baseline else None,
                                      targets.ttft_p95_ms),
                                     ("ITL", figures.itl_p95_ms, baseline.itl_p95_ms if baseline else None,
                                      targets.itl_p95_ms)):
        if targets.relative is not None and was is not None:
            limit = targets.relative * was
            hit = now is not None and now <= limit
            ok &= hit
            lines.append(f"{name} p95: {_ms(now)} against {_ms(was)} on the previous revision (target at most "
                         f"{targets.relative:g}x = {_ms(limit)}): {'hit' if hit else 'miss'}")
        if absolute is not None:
            hit = now is not None and now <= absolute
            ok &= hit
            lines.append(f"{name} p95: {_ms(now)} (target at most {_ms(absolute)}): {'hit' if hit else 'miss'}")
    return Verdict(ok=bool(ok), lines=tuple(lines), figures=figures, baseline=baseline)


#: the file in a revision's directory that keeps its measured figures (JSON: :meth:`Figures.to_json`, with the load)
FIGURES_FILE = "slo.json"


def figures_record(figures: Figures, load: Load, verdict: Verdict | None, when: str) -> str:
    """What a revision's ``slo.json`` holds: the figures, the load they were measured under, the verdict, when.

    >>> json.loads(figures_record(Figures(2, 0, 4.0, 2.0), Load(2, 1, 8, 4), None, "t"))["figures"]["requests"]
    2
    """
    return json.dumps({"figures": figures.to_json(), "load": asdict(load), "when": when,
                       "verdict": None if verdict is None else ("hit" if verdict.ok else "miss")},
                      sort_keys=True)


def read_record(text: str) -> tuple[Figures | None, dict[str, Any]]:
    """A revision's ``slo.json`` -> its figures and the whole record (None and {} when unreadable).

    >>> read_record(figures_record(Figures(2, 0, 4.0, 2.0), Load(2, 1, 8, 4), None, "t"))[0].ttft_p95_ms
    4.0
    >>> read_record("{")
    (None, {})
    """
    try:
        data = json.loads(text)
        return Figures.from_json(data["figures"]), data
    except (ValueError, KeyError, TypeError):
        return None, {}


# ------------------------------------------------------------------------------------------- the gate of a run


@dataclass(frozen=True)
class GatePlan:
    """Which gate a run's restart gets (:func:`plan_gate`). ``canary``: the groups of the roll's first step, each
    against ``baseline`` (a replica still on the previous revision) under the same load, before they are put back
    into the router; a miss takes them back to their previous revision and stops the roll. ``group``: each restarted
    engine group against its previous revision's recorded figures and the absolute targets (``auto_rollback``: a
    miss takes it back)."""

    kind: str                     # "canary" | "group"
    groups: tuple[str, ...]
    baseline: str | None
    load: Load
    targets: Targets
    auto_rollback: bool = False

    @property
    def kind_title(self) -> str:
        """
        >>> GatePlan("group", ("engine",), None, Load(1, 1, 1, 2), Targets()).kind_title
        'the group against its previous revision'
        """
        return ("the canary against a replica on the previous revision" if self.kind == "canary"
                else "the group against its previous revision")

    def lines(self) -> list[str]:
        """What ``k3deploy plan`` shows of the gate.

        >>> g = GatePlan("canary", ("engine-r0",), "engine-r1", Load(20, 4, 256, 64), Targets())
        >>> g.lines()[0][:99]
        'after step 1, before it is put back into the router, engine-r0 (the canary) and engine-r1 (still on'
        >>> g.lines()[2][:64]
        'a miss: engine-r0 goes back to the previous revision (out of the'
        """
        targets = f"targets: {self.targets.line()} (p95 from the engines' /metrics histograms)"
        if self.kind == "canary":
            canaries = ", ".join(self.groups)
            against = (f" and {self.baseline} (still on the previous revision)" if self.baseline
                       else " (no replica stays on the previous revision: against its recorded figures)")
            return [f"after step 1, before it is put back into the router, {canaries} (the canary){against} each "
                    f"get the same load through their own endpoint: {self.load.line()}", targets,
                    f"a miss: {canaries} {'goes' if len(self.groups) == 1 else 'go'} back to the previous revision "
                    "(out of the router, restored, gated, back in), the roll stops, the run exits non-zero with the "
                    "figures"]
        return [f"once {', '.join(self.groups)} serves, the load through its own endpoint: {self.load.line()}; "
                "against the previous revision's recorded figures", targets,
                "a miss: " + ("the group goes back to its previous revision (k3_auto_rollback: true; the endpoint "
                              "is down for another restart)" if self.auto_rollback else
                              "the group keeps the change (k3_auto_rollback: false)")
                + ", the run exits non-zero with the figures"]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def load_of(variables: Variables) -> Load:
    """The probe load the variables ask for (``k3_slo_requests``, ...)."""
    return Load(variables.k3_slo_requests, variables.k3_slo_concurrency, variables.k3_slo_prompt_tokens,
                variables.k3_slo_output_tokens)


def targets_of(variables: Variables) -> Targets:
    """The targets the variables set (``k3_slo_relative``, ``k3_slo_ttft_p95_ms``, ``k3_slo_itl_p95_ms``)."""
    return Targets(variables.k3_slo_relative, variables.k3_slo_ttft_p95_ms, variables.k3_slo_itl_p95_ms)


def plan_gate(rollout: Rollout, rollback: bool = False, gated: bool = True) -> GatePlan | None:
    """The gate of a restart (``rollout`` with its changed groups marked), or None:
    ``k3_slo_gate: off``, a rollback (it goes back to what served), nothing restarts, P/D pools, or a launcher the
    gate does not judge yet (``gated`` false: :attr:`k3deploy.runtime.launchers.Launcher.slo_gated`). ``auto``: a
    rolling change over replicas gets the canary; ``on``: also a single group."""
    v = rollout.vars
    if v.k3_slo_gate == "off" or rollback or not gated or rollout.plan.strategy == "pd_cluster":
        return None
    waves = rollout.waves()
    engines = [g for w in waves for g in w if g != "router"]
    if not engines:
        return None
    if rollout.rolling and "router" in rollout.groups:
        first = tuple(g for g in waves[0] if g != "router")
        later = [g for g in rollout.replicas if g not in first]
        return GatePlan("canary", first, later[0] if later else None, load_of(v), targets_of(v))
    if v.k3_slo_gate != "on":
        return None
    return GatePlan("group", tuple(engines), None, load_of(v), targets_of(v), v.k3_auto_rollback)
