"""What a site loads into its Prometheus to see the deployment serve: scrape targets, rules, rule tests.

Pure: from a rendered :class:`~k3deploy.model.rollout.Rollout` and its variables come

- the scrape targets (Prometheus ``file_sd`` lists, :func:`targets`): every engine unit that answers HTTP (its
  ``/metrics``: vLLM 0.33 shows every data-parallel rank an API server fronts in that one ``/metrics``, each with
  its ``engine`` label, ``vllm/v1/metrics/loggers.py`` ``PrometheusStatLogger``, ``docs/design/metrics.md``; where
  ranks serve their own port, hybrid-LB, each node is its own target), the router (vllm-router's
  ``--prometheus-port``, ``k3_router_metrics_port``), every node's node exporter (``k3_node_exporter_port``) and
  every engine node's accelerator exporter (the vendor pack's :class:`~k3deploy.vendors.base.Exporter`,
  ``k3_gpu_exporter_port``), each labelled ``cluster``, ``group``, ``replica``, ``role``, ``node``, ``revision``,
  ``hardware``;
- with ``--read-nodes``, the exporters a node runs: a port that listens counts only where its ``/metrics`` serves
  that exporter's metrics (:func:`served`, :func:`confirmed`: a metric name or prefix each exporter always serves,
  :data:`NODE_EXPORTER` and each pack's ``Exporter.serves``), anything else there named in a warning;
- ``prometheus.yml`` using them (:func:`prometheus_config`);
- recording rules (``k3:ttft_seconds:p95`` ... per cluster, group and revision) and alerting rules with llm-d's
  default thresholds (``docs/monitoring/prometheus-alerting-rules.yaml`` of llm-d: P99 TTFT > 10 s warning, > 30 s
  critical, KV cache > 90 %, queue > 50, preemptions > 1/s, P/D imbalance > 3x, decode KV > 95 %, prefix hits
  < 30 %; and an engine that stops answering), each threshold a variable (:func:`rule_files`);
- the rules' unit tests for ``promtool test rules``, made from the same :data:`ALERTS` (each alert's firing and
  quiet input), so a changed threshold is tested at its own value (:func:`rule_tests`).

The metric names are vLLM 0.33's (:data:`VLLM_METRICS`; counters carry prometheus_client's ``_total``).

Example::

    >>> from k3deploy.model.variables import Variables
    >>> v = Variables(k3_hardware="gb300")
    >>> [r["record"] for r in recording_rules(v)][:3]
    ['k3:ttft_seconds:p50', 'k3:ttft_seconds:p95', 'k3:ttft_seconds:p99']
    >>> alert_rule(ALERTS[0], v)["expr"]
    'k3:ttft_seconds:p99 > 10'
    >>> seconds("1m30s"), seconds("5m")
    (90, 300)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from k3deploy.errors import K3Error
from k3deploy.model.rollout import Rollout, UnitWork
from k3deploy.model.variables import Variables
from k3deploy.vendors.base import Exporter

#: vLLM 0.33's metric names (``vllm/v1/metrics/loggers.py``; counters as exposed: prometheus_client appends
#: ``_total``), each with its type: what the simulated engines expose too
VLLM_METRICS: dict[str, str] = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:num_preemptions_total": "counter",
    "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:request_success_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}
#: the labels every target carries (besides Prometheus's own ``job`` and ``instance``)
TARGET_LABELS = ("cluster", "group", "replica", "role", "node", "revision", "hardware")
#: what the group-level figures are aggregated by
BY = "cluster, group, revision"
JOBS = {"engines": "k3-engine", "routers": "k3-router", "nodes": "node", "gpus": "k3-gpu"}
QUANTILES = (("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99"))
LATENCIES = (("ttft", "vllm:time_to_first_token_seconds"), ("itl", "vllm:inter_token_latency_seconds"),
             ("e2e", "vllm:e2e_request_latency_seconds"))
_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")


def seconds(duration: str) -> int:
    """A Prometheus duration in whole seconds (milliseconds rounded up)."""
    m = _DURATION.match(duration)
    if m is None or not duration:
        raise K3Error(f"{duration!r} is not a Prometheus duration: write e.g. 15s, 1m or 1h30m")
    y, w, d, h, mi, s, ms = (int(g or 0) for g in m.groups())
    return ((((y * 365 + w * 7 + d) * 24 + h) * 60 + mi) * 60 + s) + (1 if ms else 0)


# ---------------------------------------------------------------------------------------------- targets


def group_revision(rollout: Rollout, group: str) -> str:
    """The ``revision`` label of a group's targets: 16 hex digits of the hash of the unit files its hosts run, as
    rendered (the same files give the same label; any change of the group, a new one)."""
    texts = [[u.host, u.unit, u.unit_text] for u in rollout.group(group)]
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16]


def _labels(rollout: Rollout, unit: UnitWork, cluster: str, revisions: dict[str, str]) -> dict[str, str]:
    return {"cluster": cluster, "group": unit.group, "replica": str(unit.node.replica), "role": unit.node.role,
            "node": unit.host, "revision": revisions[unit.group], "hardware": rollout.plan.hardware}


def _hostport(url_or_address: str, port: int) -> str:
    host = url_or_address.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0] if "://" in url_or_address \
        else url_or_address
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def gpu_exporter_port(rollout: Rollout, exporter_port: int | None) -> int:
    """The accelerator exporter's port: ``k3_gpu_exporter_port``, else the pack's (0: none)."""
    if rollout.vars.k3_gpu_exporter_port is not None:
        return rollout.vars.k3_gpu_exporter_port
    return exporter_port or 0


#: the Prometheus node exporter (github.com/prometheus/node_exporter): every metric of its collectors is named
#: ``node_*`` (``node_exporter_build_info``, ``node_scrape_collector_success``, ``node_cpu_seconds_total`` ...)
NODE_EXPORTER = ("the node exporter", "node_")


def _names(page: str) -> list[str]:
    """The metric names of a ``/metrics`` page in the Prometheus text format, in order (``# HELP`` and ``# TYPE``
    lines name them too)."""
    out: list[str] = []
    for line in page.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "#" and words[1] in ("HELP", "TYPE"):
            out.append(words[2])
        elif words and not line.startswith("#"):
            out.append(re.split(r"[{\s]", line, maxsplit=1)[0])
    return out


def served(page: str | None, serves: str) -> str | None:
    r"""None where ``page`` (what ``GET /metrics`` answered: status line, headers, the body's first bytes,
    :class:`k3deploy.facts.monitoring.MetricsPages`) is the exporter's: an HTTP 200 whose body names ``serves`` (a
    metric name, also under a prefix the exporter was configured with, ``amd_gpu_nodes_total``; or a prefix of
    every name where it ends in ``_``); else, for people, what answered instead.

        >>> ok = "HTTP/1.1 200 OK\nContent-Type: text/plain\n\n# HELP node_load1 1m load average.\nnode_load1 0.2"
        >>> served(ok, "node_") is None
        True
        >>> served("HTTP/1.0 404 File not found\nServer: SimpleHTTP/0.6\n\n<html>", "node_")
        'HTTP 404 File not found'
        >>> served("HTTP/1.1 200 OK\n\n# HELP vllm:num_requests_running x\nvllm:num_requests_running 0", "node_")
        'metrics without node_* (vllm:num_requests_running, ...)'
        >>> served("HTTP/1.0 200 OK\nContent-Type: text/html\n\n<!DOCTYPE HTML>\n<html>", "gpu_nodes_total")
        "a page that is no metrics ('<!DOCTYPE HTML>', text/html)"
        >>> served("curl: (52) Empty reply from server", "node_")
        'no HTTP answer (curl: (52) Empty reply from server)'
    """
    text = (page or "").replace("\r\n", "\n")
    head, _, body = text.partition("\n\n")
    status = head.split("\n", 1)[0].split(None, 2)
    if not status or not status[0].startswith("HTTP/") or len(status) < 2:
        first = text.strip().splitlines()[0][:120] if text.strip() else "nothing within 3 s"
        return f"no HTTP answer ({first})"
    if status[1] != "200":
        return f"HTTP {' '.join(status[1:])}"
    names = _names(body)
    prefix = serves.endswith("_")
    if any(n.startswith(serves) if prefix else n == serves or n.endswith("_" + serves) for n in names):
        return None
    want = f"{serves}*" if prefix else serves
    if names and all(re.fullmatch(r"[A-Za-z_:][\w:]*", n) for n in names[:3]):
        shown = ", ".join(dict.fromkeys(names[:2]))
        return f"metrics without {want} ({shown}, ...)"
    kind = next((line.split(":", 1)[1].strip().split(";")[0] for line in head.split("\n")[1:]
                 if line.lower().startswith("content-type:")), "")
    first = body.strip().splitlines()[0][:60] if body.strip() else "an empty body"
    return f"a page that is no metrics ({first!r}{', ' + kind if kind else ''})"


def confirmed(rollout: Rollout, listening: dict[str, frozenset[int]], pages: dict[str, dict[int, str]],
              exporter: Exporter | None) -> tuple[dict[str, frozenset[int]], list[str]]:
    """Of the ports each host listens on (``listening``), those whose exporter answered as that exporter
    (:func:`served` of ``pages``: host -> port -> page; the node exporter at ``k3_node_exporter_port``, the pack's
    accelerator ``exporter`` at its port), and one warning per port that listens but serves something else: the
    host, the port, the exporter expected there and what answered instead."""
    v = rollout.vars
    expected: dict[int, tuple[str, str, str]] = {}
    gpu_port = gpu_exporter_port(rollout, exporter.port if exporter is not None else None)
    if v.k3_node_exporter_port:
        expected[v.k3_node_exporter_port] = (*NODE_EXPORTER, "k3_node_exporter_port")
    if gpu_port and exporter is not None and exporter.serves:
        expected[gpu_port] = (exporter.name, exporter.serves, "k3_gpu_exporter_port")
    out: dict[str, frozenset[int]] = {}
    warnings: list[str] = []
    for host, ports in listening.items():
        keep = set(ports)
        for port, (name, serves, variable) in expected.items():
            if port not in ports:
                continue
            got = served(pages.get(host, {}).get(port), serves)
            if got is not None:
                keep.discard(port)
                want = f"{serves}*" if serves.endswith("_") else serves
                warnings.append(f"{host}: port {port} listens but is not {name} (GET /metrics: {got}; {name} "
                                f"serves {want}): not listed; run {name} there, or set {variable} to its port")
        out[host] = frozenset(keep)
    return out, warnings


def targets(rollout: Rollout, cluster: str, exporter_port: int | None = None,
            listening: dict[str, frozenset[int]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """The ``file_sd`` lists by kind (``engines``, ``routers``, ``nodes``, ``gpus``): each target's ``host:port``
    with its labels. ``exporter_port``: the vendor pack's accelerator exporter port (None: the pack has none).
    ``listening``: the TCP ports each host was found listening on (read from the nodes): an exporter is listed
    only where its port is one of them (None: nothing read, every node's listed)."""
    v = rollout.vars
    revisions = {g: group_revision(rollout, g) for g in rollout.groups}
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in JOBS}
    for u in rollout.units:
        labels = _labels(rollout, u, cluster, revisions)
        if u.group == "router":
            if v.k3_router_metrics_port:
                out["routers"].append({"targets": [_hostport(u.node.address, v.k3_router_metrics_port)],
                                       "labels": labels})
        elif u.serves:
            out["engines"].append({"targets": [u.serves.split("://", 1)[-1].rstrip("/")], "labels": labels})
    gpu_port = gpu_exporter_port(rollout, exporter_port)
    for host in rollout.hosts:
        units = rollout.on_host(host)
        engine = next((u for u in units if u.group != "router"), None)
        first = engine or units[0]
        labels = {**_labels(rollout, first, cluster, revisions)}
        found = listening.get(host, frozenset()) if listening is not None else None
        if v.k3_node_exporter_port and (found is None or v.k3_node_exporter_port in found):
            out["nodes"].append({"targets": [_hostport(first.node.address, v.k3_node_exporter_port)],
                                 "labels": labels})
        if engine is not None and gpu_port and (found is None or gpu_port in found):
            out["gpus"].append({"targets": [_hostport(engine.node.address, gpu_port)], "labels": labels})
    return out


def prometheus_config(variables: Variables, kinds: list[str]) -> dict[str, Any]:
    """``prometheus.yml``: the intervals, the rule files, one scrape job per kind of target (its ``file_sd`` list
    in ``targets/<kind>.json``, beside it)."""
    return {
        "global": {"scrape_interval": variables.k3_prom_scrape_interval,
                   "evaluation_interval": variables.k3_prom_evaluation_interval,
                   "scrape_timeout": variables.k3_prom_scrape_interval
                   if seconds(variables.k3_prom_scrape_interval) < 10 else "10s"},
        "rule_files": ["rules/k3-recording.yml", "rules/k3-alerts.yml"],
        "scrape_configs": [{"job_name": JOBS[k], "metrics_path": "/metrics",
                            "file_sd_configs": [{"files": [f"targets/{k}.json"]}]} for k in kinds],
    }


# ---------------------------------------------------------------------------------------------- rules


def recording_rules(variables: Variables) -> list[dict[str, str]]:
    """Per cluster, group and revision: latency percentiles, throughput, KV-cache use, queue, preemptions, prefix
    hits (what the dashboard and the alerts read)."""
    w = variables.k3_prom_rate_window
    rules = [{"record": f"k3:{short}_seconds:{q}",
              "expr": f"histogram_quantile({value}, sum by ({BY}, le) (rate({metric}_bucket[{w}])))"}
             for short, metric in LATENCIES for q, value in QUANTILES]
    rules += [
        {"record": "k3:generation_tokens:rate", "expr": f"sum by ({BY}) (rate(vllm:generation_tokens_total[{w}]))"},
        {"record": "k3:prompt_tokens:rate", "expr": f"sum by ({BY}) (rate(vllm:prompt_tokens_total[{w}]))"},
        {"record": "k3:requests:rate", "expr": f"sum by ({BY}) (rate(vllm:request_success_total[{w}]))"},
        {"record": "k3:kv_cache_usage:max", "expr": f"max by ({BY}) (vllm:kv_cache_usage_perc)"},
        {"record": "k3:requests_running:sum", "expr": f"sum by ({BY}) (vllm:num_requests_running)"},
        {"record": "k3:requests_waiting:sum", "expr": f"sum by ({BY}) (vllm:num_requests_waiting)"},
        {"record": "k3:preemptions:rate", "expr": f"sum by ({BY}) (rate(vllm:num_preemptions_total[{w}]))"},
        {"record": "k3:prefix_cache_queries:rate",
         "expr": f"sum by ({BY}) (rate(vllm:prefix_cache_queries_total[{w}]))"},
        {"record": "k3:prefix_cache_hit:ratio",
         "expr": f"sum by ({BY}) (rate(vllm:prefix_cache_hits_total[{w}])) / k3:prefix_cache_queries:rate"},
    ]
    return rules


#: one engine's labels in the rules' tests (what the targets give every engine series)
ENGINE = {"cluster": "c1", "group": "engine", "replica": "0", "role": "node", "node": "n0", "revision": "r1",
          "hardware": "gb300", "job": "k3-engine", "instance": "10.0.0.1:8000"}
GROUP = {k: ENGINE[k] for k in ("cluster", "group", "revision")}


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    shown = ",".join(f'{k}="{val}"' for k, val in labels.items())
    return {"series": f"{name}{{{shown}}}", "values": values}


def _ttft(edges: tuple[float, float, float], into: int) -> list[dict[str, str]]:
    """TTFT buckets where every request (60 a minute) took between ``edges[into - 1]`` and ``edges[into]``."""
    out = []
    for i, le in enumerate([*(repr(float(e)) for e in edges), "+Inf"]):
        out.append(_series("vllm:time_to_first_token_seconds_bucket", {**ENGINE, "engine": "0", "le": le},
                           "0+60x40" if i >= into else "0x40"))
    return out


@dataclass(frozen=True)
class Alert:
    """One alerting rule: its condition (from the variables), severity and words, and the input series its unit
    test fires it with and keeps it quiet with (``labels``: the labels it fires with, besides ``severity``)."""

    name: str
    severity: str
    expr: Callable[[Variables], str]
    summary: str
    firing: Callable[[Variables], list[dict[str, str]]]
    quiet: Callable[[Variables], list[dict[str, str]]]
    labels: dict[str, str]


def _mid(variables: Variables) -> float:
    return (variables.k3_alert_ttft_p99_warn_s + variables.k3_alert_ttft_p99_critical_s) / 2


def _gauge(name: str, value: float, **extra: str) -> list[dict[str, str]]:
    return [_series(name, {**ENGINE, "engine": "0", **extra}, f"{value:g}x40")]


def _counter(name: str, per_s: float, **extra: str) -> list[dict[str, str]]:
    return [_series(name, {**ENGINE, "engine": "0", **extra}, f"0+{per_s * 60:g}x40")]


def _pd(prefill: float, decode: float) -> list[dict[str, str]]:
    return [_series("vllm:num_requests_waiting", {**ENGINE, "engine": "0", "group": "prefill", "role": "prefill"},
                    f"{prefill:g}x40"),
            _series("vllm:num_requests_waiting", {**ENGINE, "engine": "0", "group": "decode", "role": "decode",
                                                  "instance": "10.0.0.2:8000"}, f"{decode:g}x40")]


def _prefix(ratio: float) -> list[dict[str, str]]:
    return [*_counter("vllm:prefix_cache_queries_total", 100), *_counter("vllm:prefix_cache_hits_total", 100 * ratio)]


_ENGINE_LABELS = {**ENGINE, "engine": "0"}
ALERTS: tuple[Alert, ...] = (
    Alert("K3TTFTHigh", "warning",
          lambda v: f"k3:ttft_seconds:p99 > {v.k3_alert_ttft_p99_warn_s:g}",
          "time to first token at p99 of {{ $labels.group }} (revision {{ $labels.revision }}) above the warning "
          "level",
          lambda v: _ttft((v.k3_alert_ttft_p99_warn_s, _mid(v), 2 * v.k3_alert_ttft_p99_critical_s), 1),
          lambda v: _ttft((v.k3_alert_ttft_p99_warn_s / 4, v.k3_alert_ttft_p99_warn_s / 2,
                           2 * v.k3_alert_ttft_p99_critical_s), 1), GROUP),
    Alert("K3TTFTCritical", "critical",
          lambda v: f"k3:ttft_seconds:p99 > {v.k3_alert_ttft_p99_critical_s:g}",
          "time to first token at p99 of {{ $labels.group }} (revision {{ $labels.revision }}) above the critical "
          "level",
          lambda v: _ttft((v.k3_alert_ttft_p99_warn_s, v.k3_alert_ttft_p99_critical_s,
                           2 * v.k3_alert_ttft_p99_critical_s), 2),
          lambda v: _ttft((v.k3_alert_ttft_p99_warn_s, _mid(v), 2 * v.k3_alert_ttft_p99_critical_s), 1), GROUP),
    Alert("K3KVCacheHigh", "warning",
          lambda v: f"vllm:kv_cache_usage_perc > {v.k3_alert_kv_cache:g}",
          "KV cache of {{ $labels.node }} engine {{ $labels.engine }} ({{ $labels.group }}) nearly full",
          lambda v: _gauge("vllm:kv_cache_usage_perc", (1 + v.k3_alert_kv_cache) / 2),
          lambda v: _gauge("vllm:kv_cache_usage_perc", v.k3_alert_kv_cache / 2), _ENGINE_LABELS),
    Alert("K3DecodeKVCacheHigh", "warning",
          lambda v: f'vllm:kv_cache_usage_perc{{role="decode"}} > {v.k3_alert_decode_kv_cache:g}',
          "KV cache of decode node {{ $labels.node }} engine {{ $labels.engine }} nearly full",
          lambda v: _gauge("vllm:kv_cache_usage_perc", (1 + v.k3_alert_decode_kv_cache) / 2, role="decode"),
          lambda v: _gauge("vllm:kv_cache_usage_perc", (1 + v.k3_alert_decode_kv_cache) / 2, role="prefill"),
          {**_ENGINE_LABELS, "role": "decode"}),
    Alert("K3QueueLong", "warning",
          lambda v: f"vllm:num_requests_waiting > {v.k3_alert_queue:g}",
          "requests queue up in {{ $labels.node }} engine {{ $labels.engine }} ({{ $labels.group }})",
          lambda v: _gauge("vllm:num_requests_waiting", v.k3_alert_queue + 1),
          lambda v: _gauge("vllm:num_requests_waiting", v.k3_alert_queue), _ENGINE_LABELS),
    Alert("K3Preemptions", "warning",
          lambda v: f"rate(vllm:num_preemptions_total[{v.k3_prom_rate_window}]) > {v.k3_alert_preemptions_per_s:g}",
          "{{ $labels.node }} engine {{ $labels.engine }} ({{ $labels.group }}) preempts requests: KV cache too small",
          lambda v: _counter("vllm:num_preemptions_total", 2 * v.k3_alert_preemptions_per_s + 1),
          lambda v: _counter("vllm:num_preemptions_total", v.k3_alert_preemptions_per_s / 2), _ENGINE_LABELS),
    Alert("K3PDImbalance", "warning",
          lambda v: (f'sum by (cluster) (vllm:num_requests_waiting{{role="prefill"}}) > {v.k3_alert_pd_imbalance:g} '
                     f'* clamp_min(sum by (cluster) (vllm:num_requests_waiting{{role="decode"}}), 1) or sum by '
                     f'(cluster) (vllm:num_requests_waiting{{role="decode"}}) > {v.k3_alert_pd_imbalance:g} * '
                     'clamp_min(sum by (cluster) (vllm:num_requests_waiting{role="prefill"}), 1)'),
          "requests waiting in the P/D pools of {{ $labels.cluster }} are out of balance",
          lambda v: _pd(10 * (v.k3_alert_pd_imbalance + 1), 10),
          lambda v: _pd(10 * v.k3_alert_pd_imbalance, 10), {"cluster": ENGINE["cluster"]}),
    Alert("K3PrefixHitLow", "warning",
          lambda v: f"k3:prefix_cache_hit:ratio < {v.k3_alert_prefix_hit:g} and k3:prefix_cache_queries:rate > 0",
          "prefix-cache hits of {{ $labels.group }} (revision {{ $labels.revision }}) low",
          lambda v: _prefix(v.k3_alert_prefix_hit / 2),
          lambda v: _prefix((1 + v.k3_alert_prefix_hit) / 2), GROUP),
    Alert("K3EngineDown", "critical",
          lambda v: 'up{job="k3-engine"} == 0',
          "the engine of {{ $labels.group }} on {{ $labels.node }} ({{ $labels.instance }}) does not answer /metrics",
          lambda v: [_series("up", ENGINE, "0x40")],
          lambda v: [_series("up", ENGINE, "1x40")], ENGINE),
)


RUNBOOK = "docs/monitoring.md of k3deploy: what each alert means and what to do"


def alert_rule(alert: Alert, variables: Variables) -> dict[str, Any]:
    return {"alert": alert.name, "expr": alert.expr(variables), "for": variables.k3_alert_for,
            "labels": {"severity": alert.severity},
            "annotations": {"summary": alert.summary, "runbook": RUNBOOK}}


def summary_of(alert: Alert, labels: dict[str, str]) -> str:
    """An alert's summary as Prometheus renders it for these labels (summaries name labels only).

    >>> summary_of(ALERTS[-1], ENGINE)
    'the engine of engine on n0 (10.0.0.1:8000) does not answer /metrics'
    """
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], alert.summary)


def rule_files(variables: Variables) -> dict[str, dict[str, Any]]:
    """``rules/k3-recording.yml`` and ``rules/k3-alerts.yml`` (file name -> the rule file)."""
    if variables.k3_alert_ttft_p99_warn_s >= variables.k3_alert_ttft_p99_critical_s:
        raise K3Error(f"k3_alert_ttft_p99_warn_s ({variables.k3_alert_ttft_p99_warn_s:g}) is not below "
                      f"k3_alert_ttft_p99_critical_s ({variables.k3_alert_ttft_p99_critical_s:g}): make the warning "
                      "the lower")
    for name in ("k3_prom_scrape_interval", "k3_prom_evaluation_interval", "k3_prom_rate_window", "k3_alert_for"):
        if seconds(getattr(variables, name)) == 0:
            raise K3Error(f"{name}: {getattr(variables, name)!r} is no time: give a Prometheus duration above zero, "
                          "e.g. 15s")
    return {"k3-recording.yml": {"groups": [{"name": "k3-recording", "rules": recording_rules(variables)}]},
            "k3-alerts.yml": {"groups": [{"name": "k3-alerts",
                                          "rules": [alert_rule(a, variables) for a in ALERTS]}]}}


def rule_tests(variables: Variables) -> dict[str, Any]:
    """``rules/k3-rules.test.yml`` for ``promtool test rules``: for each alert, the input that fires it (checked
    once its ``for:`` passed, with the labels it carries) and the input that keeps it quiet, at 1-minute steps."""
    wait = seconds(variables.k3_alert_for) + max(2 * seconds(variables.k3_prom_rate_window), 120)
    minutes = (wait + 59) // 60
    tests = []
    for a in ALERTS:
        for fires, series in ((True, a.firing(variables)), (False, a.quiet(variables))):
            long_enough = [{**s, "values": s["values"].replace("x40", f"x{minutes + 5}")} for s in series]
            tests.append({"name": f"{a.name} {'fires' if fires else 'stays quiet'}", "interval": "1m",
                          "input_series": long_enough,
                          "alert_rule_test": [{"eval_time": f"{minutes}m", "alertname": a.name,
                                               "exp_alerts": [{"exp_labels": {**a.labels, "severity": a.severity},
                                                               "exp_annotations": {"summary": summary_of(a, a.labels),
                                                                                   "runbook": RUNBOOK}}]
                                               if fires else []}]})
    return {"rule_files": ["k3-recording.yml", "k3-alerts.yml"], "evaluation_interval": "1m", "tests": tests}


def dump(doc: Any) -> str:
    """A rule or configuration file's YAML text."""
    return yaml.safe_dump(doc, sort_keys=False, width=120)
