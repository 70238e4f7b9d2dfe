"""``k3deploy export prometheus INVENTORY -o DIR``: what a site loads into its Prometheus and Grafana to see the
deployment serve (docs/monitoring.md): ``targets/*.json`` (file_sd), ``prometheus.yml``, ``rules/`` (recording and
alerting rules with their ``promtool test rules`` tests), ``grafana/k3deploy-dashboard.json`` and README.txt.
Nothing is contacted: the targets come from the rollout the deploy renders (:mod:`k3deploy.model.monitoring`,
:mod:`k3deploy.model.dashboard`).

Example::

    k3deploy export prometheus inventories/gb300.py -o monitoring
    promtool check config monitoring/prometheus.yml && promtool test rules monitoring/rules/k3-rules.test.yml
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click

from k3deploy.cli.common import echo_json, json_option
from k3deploy.errors import K3Error

#: the oldest Prometheus and Grafana the written files are for (file_sd, rule tests, humanizeDuration; the
#: dashboard's schema version 36)
PROMETHEUS_MIN = "2.42"
GRAFANA_MIN = "9.0"


def cluster_label(inventory: str, configured: str | None) -> str:
    """The ``cluster`` label: ``k3_cluster_name``, else the inventory file's name without its extension.

    >>> cluster_label("inventories/gb300.py", None), cluster_label("x/site.py", "prod-a")
    ('gb300', 'prod-a')
    """
    if configured:
        return configured
    stem = Path(inventory.rstrip("/")).name.split(".", 1)[0]
    return re.sub(r"[^A-Za-z0-9._-]", "-", stem) or "k3"


@click.command("prometheus")
@click.argument("inventory")
@click.option("-o", "--output", "output", required=True, metavar="DIR",
              help="Directory to write into (created; files already there are replaced).")
@click.option("--read-nodes", is_flag=True, default=False,
              help="Read each node over SSH for the ports it listens on and what their /metrics serve: list a "
                   "node's exporters only where they run (without it every node's are listed, at the variables' "
                   "ports).")
@json_option
def export_prometheus(inventory: str, output: str, as_json: bool, read_nodes: bool) -> None:
    """Write the Prometheus scrape targets of INVENTORY (every engine's /metrics, the router, the node and
    accelerator exporters, labelled cluster, group, replica, role, node, revision and hardware), a prometheus.yml
    using them, recording and alerting rules with their tests (promtool test rules), a Grafana dashboard and
    README.txt saying what to load where. Thresholds, intervals and ports are variables (k3_alert_*, k3_prom_*,
    *_exporter_port: docs/variables.md). Nothing is contacted, unless --read-nodes: then each node is read over SSH
    (ss -Hltn, and its exporters' /metrics fetched once on the node) and an exporter listed only where its port
    listens and serves that exporter's metrics (anything else there is named in a warning).

    \b
    Example:
      k3deploy export prometheus inventories/gb300.py -o monitoring
    """
    from k3deploy.cli.common import read_cluster
    from k3deploy.model import dashboard, monitoring
    from k3deploy.runtime.gather import require_reachable
    from k3deploy.runtime.views import EXPORT_PROMETHEUS, OFFLINE_RUNBOOK
    from k3deploy.vendors import pack_for_container

    gathered = read_cluster("export", inventory, view=EXPORT_PROMETHEUS if read_nodes else OFFLINE_RUNBOOK)
    rollout = gathered.require_rollout()
    pack = pack_for_container(rollout.plan.vendor)
    exporter = pack.exporter if pack is not None else None
    listening: dict[str, frozenset[int]] | None = None
    if read_nodes:
        require_reachable(gathered)
        # a port that listens counts only where what answers there is the exporter (what it serves, read once)
        listening, warnings = monitoring.confirmed(
            rollout, {h: r.listening or frozenset() for h, r in gathered.readings.items()},
            {h: r.metrics_pages or {} for h, r in gathered.readings.items()}, exporter)
        for line in warnings:
            click.echo(f"k3deploy: warning: {line}", err=True)
    v = rollout.vars
    cluster = cluster_label(inventory, v.k3_cluster_name)
    rules = monitoring.rule_files(v)   # refused here, before anything is written, where the thresholds contradict
    targets = monitoring.targets(rollout, cluster, exporter.port if exporter else None, listening)
    kinds = [k for k, listed in targets.items() if listed]
    texts: dict[str, str] = {"prometheus.yml": monitoring.dump(monitoring.prometheus_config(v, kinds))}
    texts.update({f"targets/{k}.json": json.dumps(targets[k], indent=2) + "\n" for k in kinds})
    texts.update({f"rules/{name}": monitoring.dump(doc) for name, doc in rules.items()})
    texts["rules/k3-rules.test.yml"] = monitoring.dump(monitoring.rule_tests(v))
    gpu_port = monitoring.gpu_exporter_port(rollout, exporter.port if exporter else None)
    texts["grafana/k3deploy-dashboard.json"] = dashboard.dashboard_json(cluster, exporter if gpu_port else None)
    texts["README.txt"] = _readme(rollout, cluster, inventory, targets, exporter, gpu_port, listening is not None)
    out = Path(output)
    try:
        for rel, text in texts.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise K3Error(f"-o {output}: cannot write {exc.filename}: {exc.strerror}: choose a writable path") from None
    written = {"dir": str(out), "cluster": cluster, "files": [str(out / rel) for rel in texts],
               "config": str(out / "prometheus.yml"), "readme": str(out / "README.txt"),
               "targets": {k: [t["targets"][0] for t in targets[k]] for k in kinds}}
    if as_json:
        echo_json(written)
        return
    counts = ", ".join(f"{len(targets[k])} {k}" for k in kinds)
    click.echo(f"wrote {len(texts)} file(s) to {output}: targets ({counts}), prometheus.yml, rules, dashboard; "
               f"what to load where: {out / 'README.txt'}")


def _readme(rollout: Any, cluster: str, inventory: str, targets: dict[str, list[dict[str, Any]]],
            exporter: Any, gpu_port: int, read: bool) -> str:
    v = rollout.vars
    lines = [f"Monitoring of {rollout.plan.model} ({rollout.plan.strategy} on {rollout.plan.hardware}), cluster "
             f"label {cluster!r}, written by `k3deploy export prometheus` from {inventory}.", "",
             f"Minimum versions: Prometheus {PROMETHEUS_MIN} (promtool of the same release), Grafana {GRAFANA_MIN}.",
             "", "1. Prometheus: copy this directory to the Prometheus host (paths in prometheus.yml are relative to "
             "it) and run", "     promtool check config prometheus.yml && promtool test rules "
             "rules/k3-rules.test.yml", "     prometheus --config.file=prometheus.yml", "   or merge its "
             "scrape_configs and rule_files into the site's own prometheus.yml (the file_sd lists in targets/ are "
             "re-read when they change: a new export needs no restart).",
             f"   Scrape interval {v.k3_prom_scrape_interval}, rules every {v.k3_prom_evaluation_interval}, rates over "
             f"{v.k3_prom_rate_window}, alerts after {v.k3_alert_for} (k3_prom_*, k3_alert_for).", "",
             "2. Targets (targets/<kind>.json), each labelled " + ", ".join(monitoring_labels()) + ":"]
    said = {"engines": "vLLM's /metrics (no API key needed); every data-parallel rank an API server fronts is in its "
                       "one target, with its `engine` label",
            "routers": f"vllm-router's metrics on :{v.k3_router_metrics_port}; vllm-router binds them to 127.0.0.1 "
                       f"unless started with --prometheus-host 0.0.0.0: k3deploy starts it with --prometheus-host "
                       f"{v.k3_router_host} --prometheus-port {v.k3_router_metrics_port} (k3_router_metrics_port: 0 "
                       "leaves them out)",
            "nodes": f"the Prometheus node exporter on :{v.k3_node_exporter_port} on every node, where the site runs "
                     "one (k3_node_exporter_port: 0 leaves them out)",
            "gpus": (f"{exporter.name} on :{gpu_port} on every engine node ({exporter.source}; k3_gpu_exporter_port: "
                     "another port, or 0 to leave them out)") if exporter is not None else ""}
    for kind, listed in targets.items():
        if listed:
            lines.append(f"   {kind}: {said[kind]}: " + ", ".join(t["targets"][0] for t in listed))
    lines.append("   The exporters are listed where the nodes were found listening on their ports (--read-nodes): "
                 + ("; ".join(f"{k}: none found" for k, port in (("nodes", v.k3_node_exporter_port), ("gpus", gpu_port))
                              if port and not targets[k]) or "each found where listed")
                 if read else "   The exporters are listed on every node, not read (--read-nodes lists only those "
                 "found running); a target of an exporter that is not there is up == 0, and no alert reads it.")
    lines += ["", "3. Alertmanager: the alerts (rules/k3-alerts.yml) carry severity warning or critical; route them as "
              "the site does. Each alert's summary names the group, node and engine; docs/monitoring.md of "
              "k3deploy says what each means and what to do.", "",
              "4. Grafana: Dashboards > New > Import, upload grafana/k3deploy-dashboard.json and pick the Prometheus "
              "data source that scrapes these targets (or provision the file from a dashboards directory). Its "
              "variables cluster and group select; every series is per group and revision."]
    return "\n".join(lines) + "\n"


def monitoring_labels() -> tuple[str, ...]:
    from k3deploy.model.monitoring import TARGET_LABELS

    return TARGET_LABELS
