"""``k3deploy export prometheus``: targets, prometheus.yml, rules and their tests, checked by the real promtool
(Debian's prometheus package), and the Grafana dashboard, whose queries read only what the export provides."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, k3, two_tray_site
from k3deploy.model import monitoring
from k3deploy.vendors import PACKS

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian's prometheus "
                                    "package: apt-get install prometheus; .ci/install-sim.sh installs it)")


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def pd_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("prom") / "pd"
    proc = k3("export", "prometheus", str(ROOT / "inventories" / "pd_b300.py"), "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


@needs_promtool
def test_promtool_accepts_the_config_and_the_rules_and_the_rule_tests_pass(pd_export):
    out, _ = pd_export
    for args in (("check", "config", "prometheus.yml"),
                 ("check", "rules", "rules/k3-recording.yml", "rules/k3-alerts.yml"),
                 ("test", "rules", "rules/k3-rules.test.yml")):
        proc = _promtool(*args, cwd=out)
        assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    tests = yaml.safe_load((out / "rules" / "k3-rules.test.yml").read_text())["tests"]
    assert {t["name"] for t in tests} == {f"{a.name} {w}" for a in monitoring.ALERTS for w in ("fires", "stays quiet")}


@needs_promtool
def test_the_rule_tests_fail_where_a_rule_is_not_what_they_test(pd_export, tmp_path):
    """The shipped tests test the rules: an alert whose threshold moved (the test still expecting the old one) and
    one that no longer fires both fail ``promtool test rules``."""
    out, _ = pd_export
    for old, new in (("vllm:kv_cache_usage_perc > 0.9", "vllm:kv_cache_usage_perc > 0.99"),
                     ('up{job="k3-engine"} == 0', 'up{job="k3-engine"} == 2')):
        copy = tmp_path / re.sub(r"\W", "", new)
        shutil.copytree(out, copy)
        alerts = copy / "rules" / "k3-alerts.yml"
        assert old in alerts.read_text()
        alerts.write_text(alerts.read_text().replace(old, new))
        proc = _promtool("test", "rules", "rules/k3-rules.test.yml", cwd=copy)
        assert proc.returncode == 1 and "FAILED" in proc.stdout + proc.stderr, proc.stdout


def test_every_engine_router_and_exporter_is_a_target_with_its_labels(pd_export):
    out, written = pd_export
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j["file_sd_configs"][0]["files"][0] for j in config["scrape_configs"]}
    assert jobs == {"k3-engine": "targets/engines.json", "k3-router": "targets/routers.json",
                    "node": "targets/nodes.json", "k3-gpu": "targets/gpus.json"}
    engines = json.loads((out / "targets" / "engines.json").read_text())
    # pd_b300: one prefill node (its own port), two decode nodes; the router on the prefill node
    assert [(t["labels"]["group"], t["labels"]["node"], t["targets"][0]) for t in engines] == [
        ("prefill", "pd-prefill1", "192.0.2.21:8001"), ("decode", "pd-decode1", "192.0.2.31:8002"),
        ("decode", "pd-decode2", "192.0.2.32:8002")]
    for kind in ("engines", "routers", "nodes", "gpus"):
        for t in json.loads((out / "targets" / f"{kind}.json").read_text()):
            assert set(t["labels"]) == set(monitoring.TARGET_LABELS)
            assert t["labels"]["cluster"] == "pd_b300" and t["labels"]["hardware"] == "b300"
    assert written["targets"]["routers"] == ["192.0.2.21:29000"]
    assert written["targets"]["gpus"] == ["192.0.2.21:9400", "192.0.2.31:9400", "192.0.2.32:9400"]
    revisions = {t["labels"]["group"]: t["labels"]["revision"] for t in engines}
    assert len(set(revisions.values())) == 2 and all(re.fullmatch(r"[0-9a-f]{16}", r) for r in revisions.values())
    readme = (out / "README.txt").read_text()
    assert "promtool test rules rules/k3-rules.test.yml" in readme and "Prometheus 2.42" in readme
    assert "grafana/k3deploy-dashboard.json" in readme and "--prometheus-host 0.0.0.0" in readme


def _metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once strings, label matchers, ranges, grouping
    clauses, functions and numbers are taken out."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    words = re.findall(r"(?<![\w:.])[A-Za-z_:][\w:]*(?![\w:])(?!\s*\()", expr)
    return {w for w in words if w not in {"and", "or", "unless", "bool", "offset"}}


def test_metric_names_of_a_query():
    assert _metric_names('sum by (node) (rate(vllm:x_total{a="b"}[5m])) / up{job="k"} > 0.5') == {
        "vllm:x_total", "up"}


def test_the_dashboard_is_valid_json_and_reads_only_what_the_export_provides(pd_export):
    out, _ = pd_export
    doc = json.loads((out / "grafana" / "k3deploy-dashboard.json").read_text())
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    recorded = {r["record"] for g in yaml.safe_load((out / "rules" / "k3-recording.yml").read_text())["groups"]
                for r in g["rules"]}
    nvidia = next(p for p in PACKS if p.name == "nvidia").exporter
    assert nvidia is not None
    provided = recorded | set(monitoring.VLLM_METRICS) | set(nvidia.metrics) | {"up"}
    read = set()
    for p in panels:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            read |= _metric_names(t["expr"])
    assert read <= provided, read - provided
    titles = " ".join(p["title"] for p in panels)
    for words in ("Time to first token", "Inter-token latency", "End-to-end", "Throughput", "KV-cache",
                  "Running and waiting", "Preemptions", "Accelerator health"):
        assert words in titles
    # the recording rules it reads are per group and revision, and read vLLM 0.33's names only
    rules = yaml.safe_load((out / "rules" / "k3-recording.yml").read_text())["groups"][0]["rules"]
    for r in rules:
        assert _metric_names(r["expr"]) - recorded <= {n + s for n in monitoring.VLLM_METRICS
                                                       for s in ("", "_bucket")}, r


def test_thresholds_intervals_and_ports_come_from_the_variables(tmp_path):
    inventory = two_tray_site(tmp_path, (
        "k3_hardware: gb300\nk3_strategy: multi_node_tp\nk3_alert_kv_cache: 0.8\nk3_alert_for: 30s\n"
        "k3_prom_scrape_interval: 2s\nk3_node_exporter_port: 0\nk3_gpu_exporter_port: 9500\nk3_cluster_name: site-a\n"))
    out = tmp_path / "out"
    proc = k3("export", "prometheus", str(inventory), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert not (out / "targets" / "nodes.json").exists()
    gpus = json.loads((out / "targets" / "gpus.json").read_text())
    assert [t["targets"][0] for t in gpus] == ["10.1.0.1:9500", "10.1.0.2:9500"]
    assert {t["labels"]["cluster"] for t in gpus} == {"site-a"}
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] == "2s"
    alerts = {a["alert"]: a for a in yaml.safe_load((out / "rules" / "k3-alerts.yml").read_text())["groups"][0]["rules"]}
    assert alerts["K3KVCacheHigh"]["expr"] == "vllm:kv_cache_usage_perc > 0.8"
    assert {a["for"] for a in alerts.values()} == {"30s"}
    if PROMTOOL is not None:
        proc = _promtool("test", "rules", "rules/k3-rules.test.yml", cwd=out)
        assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize(("group_vars", "named"), [
    ("k3_alert_for: 5 minutes\n", "k3_alert_for"),
    ("k3_alert_ttft_p99_warn_s: 40\n", "k3_alert_ttft_p99_warn_s (40)"),
])
def test_a_bad_setting_is_one_line_and_nothing_is_written(tmp_path, group_vars, named):
    inventory = two_tray_site(tmp_path, "k3_hardware: gb300\nk3_strategy: multi_node_tp\n" + group_vars)
    out = tmp_path / "out"
    proc = k3("export", "prometheus", str(inventory), "-o", str(out))
    assert proc.returncode == 2 and named in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize(("overrides", "metrics"), [
    ({}, ["--prometheus-host", "0.0.0.0", "--prometheus-port", "29000"]),
    ({"k3_router_metrics_port": 29100, "k3_router_host": "192.0.2.21"},
     ["--prometheus-host", "192.0.2.21", "--prometheus-port", "29100"]),
    ({"k3_router_metrics_port": 0}, []),
])
def test_the_router_serves_its_metrics_where_the_exported_target_scrapes_them(overrides, metrics):
    """vllm-router binds its Prometheus listener to 127.0.0.1 unless told otherwise: the router's unit passes its
    bind address and the exported port (the target of ``targets/routers.json``), from the engine spec; a port of 0
    (not scraped) leaves the builder's argv as it is."""
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import INVENTORY_ONLY

    r = gather("inventories/pd_b300.py", INVENTORY_ONLY, overrides).require_rollout()
    router = next(u for u in r.units if u.group == "router")
    assert router.spec is not None
    argv = router.spec.argv
    assert [a for a in argv if a.startswith("--prometheus")] == metrics[0::2]
    assert argv[len(argv) - len(metrics):] == metrics
    assert router.spec.command[len(router.spec.command) - len(metrics):] == metrics   # the unit's ExecStart=
    routers = monitoring.targets(r, "pd_b300")["routers"]
    assert [t["targets"][0] for t in routers] == ([f"{router.node.address}:{metrics[3]}"] if metrics else [])


EXPORTER_PAGES = ROOT / "tests" / "fixtures" / "exporters"


def _page(name: str) -> str:
    """A fixture's response as the node's read hands it over: its lines, each without its newline."""
    from k3deploy.facts.monitoring import MetricsPages

    lines = ["K3_PAGE=1", *(EXPORTER_PAGES / name).read_bytes().decode().split("\n")]
    return MetricsPages().process([line.rstrip("\n") for line in lines])[1]


@pytest.mark.parametrize(("fixture", "pack"), [
    ("dcgm_exporter.http", "nvidia"), ("amd_device_metrics_exporter.http", "amd"), ("npu_exporter.http", "ascend")])
def test_each_accelerator_exporter_is_known_by_what_it_serves_and_by_nothing_else(fixture, pack):
    exporter = next(p for p in PACKS if p.name == pack).exporter
    assert exporter is not None and exporter.serves
    assert monitoring.served(_page(fixture), exporter.serves) is None
    others = {"dcgm_exporter.http", "amd_device_metrics_exporter.http", "npu_exporter.http", "node_exporter.http"}
    for other in others - {fixture}:
        assert monitoring.served(_page(other), exporter.serves) is not None, other
    assert monitoring.served(_page(fixture), monitoring.NODE_EXPORTER[1]) is not None


def test_node_exporter_is_known_past_its_go_runtime_families():
    page = _page("node_exporter.http")
    assert page.splitlines()[0].startswith("HTTP/1.1 200") and "\r" in page   # curl -i keeps the CRLF
    assert monitoring.served(page, "node_") is None
    assert monitoring.served(_page("python_http_server.http"), "node_") == "HTTP 404 File not found"


def test_a_port_that_serves_something_else_is_named_and_not_listed():
    """pd_b300's nodes: the prefill node's node exporter port answers with the vLLM engine's metrics, a decode
    node's with Python's 404, the other decode node's with the node exporter; every accelerator exporter port is
    DCGM's but one that gives no HTTP answer."""
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import INVENTORY_ONLY

    r = gather("inventories/pd_b300.py", INVENTORY_ONLY).require_rollout()
    hosts = r.hosts
    vllm = "HTTP/1.1 200 OK\ncontent-type: text/plain\n\n# HELP vllm:num_requests_running x\nvllm:num_requests_running 0"
    pages = {hosts[0]: {9100: vllm, 9400: _page("dcgm_exporter.http")},
             hosts[1]: {9100: _page("python_http_server.http"), 9400: "curl: (52) Empty reply from server"},
             hosts[2]: {9100: _page("node_exporter.http"), 9400: _page("dcgm_exporter.http")}}
    listening = {h: frozenset({8000, 9100, 9400}) for h in hosts}
    nvidia = next(p for p in PACKS if p.name == "nvidia").exporter
    assert nvidia is not None
    kept, warnings = monitoring.confirmed(r, listening, pages, nvidia)
    assert kept == {hosts[0]: frozenset({8000, 9400}), hosts[1]: frozenset({8000}),
                    hosts[2]: frozenset({8000, 9100, 9400})}
    assert [w.split(" listens")[0] for w in warnings] == [f"{hosts[0]}: port 9100", f"{hosts[1]}: port 9100",
                                                           f"{hosts[1]}: port 9400"]
    assert "is not the node exporter" in warnings[0] and "k3_node_exporter_port" in warnings[0]
    assert "vllm:num_requests_running" in warnings[0] and "node_*" in warnings[0]
    assert "is not dcgm-exporter" in warnings[2] and "DCGM_FI_DEV_*" in warnings[2]
    assert "HTTP 404 File not found" in warnings[1] and "no HTTP answer (curl: (52)" in warnings[2]
    listed = monitoring.targets(r, "pd_b300", nvidia.port, kept)
    assert [t["labels"]["node"] for t in listed["nodes"]] == [hosts[2]]
    assert [t["labels"]["node"] for t in listed["gpus"]] == [hosts[0], hosts[2]]


def test_the_read_asks_each_exporter_port_at_the_address_its_target_names():
    from k3deploy.facts.monitoring import MetricsPages
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.reading import ReadMetricsPages, plan_host
    from k3deploy.runtime.views import EXPORT_PROMETHEUS, INVENTORY_ONLY

    r = gather("inventories/pd_b300.py", INVENTORY_ONLY).require_rollout()
    host = r.hosts[1]
    read = [q for q in plan_host(r, host, EXPORT_PROMETHEUS, None).requests if isinstance(q, ReadMetricsPages)]
    address = r.on_host(host)[0].node.address
    assert read == [ReadMetricsPages(address, (9100, 9400))]
    command = MetricsPages().command(address, (9100, 9400))
    assert f"curl -sS -i -m 3 http://{address}:9400/metrics" in command and "head -c 65536" in command
