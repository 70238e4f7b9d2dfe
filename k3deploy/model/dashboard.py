"""The Grafana dashboard of a deployment, built with grafana-foundation-sdk's typed builders (no hand-written JSON).

Rows: latency (time to first token, inter-token latency, end-to-end latency at p50/p95/p99, from the recording
rules of :mod:`k3deploy.model.monitoring`), load (output and prompt tokens/s, requests/s, running and waiting
requests, KV-cache use, preemptions, prefix-cache hits), health (engines answering, and the vendor's accelerator
exporter beside them: utilization, temperature, its error figure). Every series is per group and revision; the
variables ``cluster`` and ``group`` select. Pure.

Example::

    >>> import json
    >>> doc = json.loads(dashboard_json("pm1", None))
    >>> doc["uid"], [p["title"] for p in doc["panels"] if p["type"] == "row"]
    ('k3deploy-pm1', ['Latency', 'Load', 'Health'])
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard as DashboardBuilder
from grafana_foundation_sdk.builders.dashboard import DatasourceVariable, QueryVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.timeseries import Panel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from k3deploy.model.monitoring import LATENCIES, QUANTILES
from k3deploy.vendors.base import Exporter

SELECT = 'cluster=~"$cluster", group=~"$group"'
LEGEND = "{{group}} {{revision}}"
_SOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def _panel(title: str, unit: str, queries: list[tuple[str, str]], description: str = "") -> Panel:
    panel = Panel().title(title).unit(unit).datasource(_SOURCE).span(8).height(8)
    if description:
        panel = panel.description(description)
    for n, (expr, legend) in enumerate(queries):
        panel = panel.with_target(Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + n)))
    return panel


def dashboard_json(cluster: str, exporter: Exporter | None) -> str:
    """The dashboard of ``cluster`` (its uid ``k3deploy-<cluster>``) as Grafana's JSON model; ``exporter``: the
    vendor's accelerator exporter whose figures stand beside the engines' (None: no such panels)."""
    d = (DashboardBuilder(f"k3deploy: {cluster}").uid(f"k3deploy-{cluster}"[:40]).tags(["k3deploy", "vllm"])
         .refresh("30s").time("now-1h", "now").timezone("browser")
         .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
         .with_variable(QueryVariable("cluster").label("cluster").datasource(_SOURCE)
                        .query('label_values(up{job="k3-engine"}, cluster)').include_all(True).multi(True))
         .with_variable(QueryVariable("group").label("group").datasource(_SOURCE)
                        .query('label_values(up{job="k3-engine", cluster=~"$cluster"}, group)')
                        .include_all(True).multi(True))
         .with_row(Row("Latency")))
    titles = {"ttft": "Time to first token", "itl": "Inter-token latency", "e2e": "End-to-end request latency"}
    for short, metric in LATENCIES:
        d = d.with_panel(_panel(titles[short], "s",
                                [(f"k3:{short}_seconds:{q}{{{SELECT}}}", f"{q} {LEGEND}") for q, _ in QUANTILES],
                                f"{metric}, quantiles per group and revision"))
    d = d.with_row(Row("Load"))
    d = d.with_panel(_panel("Throughput", "short", [
        (f"k3:generation_tokens:rate{{{SELECT}}}", f"output tokens/s {LEGEND}"),
        (f"k3:prompt_tokens:rate{{{SELECT}}}", f"prompt tokens/s {LEGEND}"),
        (f"k3:requests:rate{{{SELECT}}}", f"requests/s {LEGEND}")]))
    d = d.with_panel(_panel("Running and waiting requests", "short", [
        (f"k3:requests_running:sum{{{SELECT}}}", f"running {LEGEND}"),
        (f"k3:requests_waiting:sum{{{SELECT}}}", f"waiting {LEGEND}")]))
    d = d.with_panel(_panel("KV-cache use", "percentunit", [
        (f"k3:kv_cache_usage:max{{{SELECT}}}", f"max {LEGEND}"),
        (f"vllm:kv_cache_usage_perc{{{SELECT}}}", "{{node}} engine {{engine}}")]).min(0).max(1))
    d = d.with_panel(_panel("Preemptions", "short", [(f"k3:preemptions:rate{{{SELECT}}}", f"per s {LEGEND}")]))
    d = d.with_panel(_panel("Prefix-cache hits", "percentunit",
                            [(f"k3:prefix_cache_hit:ratio{{{SELECT}}}", LEGEND)]).min(0).max(1))
    d = d.with_row(Row("Health"))
    d = d.with_panel(_panel("Engines answering /metrics", "short",
                            [(f'up{{job="k3-engine", {SELECT}}}', "{{node}} {{group}}")]).min(0).max(1))
    if exporter is not None:
        gpu = f'job="k3-gpu", {SELECT}'
        d = d.with_panel(_panel(f"Accelerator utilization ({exporter.name})", "percent",
                                [(f"avg by (node) ({exporter.utilization}{{{gpu}}})", "{{node}}")]))
        d = d.with_panel(_panel(f"Accelerator temperature ({exporter.name})", "celsius",
                                [(f"max by (node) ({exporter.temperature}{{{gpu}}})", "{{node}}")]))
        d = d.with_panel(_panel(f"Accelerator health ({exporter.name})", "short",
                                [(f"sum by (node) ({exporter.health}{{{gpu}}})", "{{node}}")],
                                f"{exporter.health}: {exporter.source}"))
    return JSONEncoder(sort_keys=True, indent=2).encode(d.build()) + "\n"
