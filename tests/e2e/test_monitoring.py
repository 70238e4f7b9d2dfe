"""Monitoring on the simulated cluster: ``k3deploy sim up --monitoring`` runs a real Prometheus on this host with
the configuration ``k3deploy export prometheus`` writes (short intervals from the sim's group_vars). After a deploy
and a probe load through the endpoint, Prometheus's HTTP API answers the time to first token at p95 per group (the
exported recording rule over the simulated engines' vLLM 0.33 histograms); a stopped engine fires K3EngineDown,
naming its node. Prometheus stops with the cluster."""

from __future__ import annotations

import json
import shlex
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from helpers import ROOT, deploy, k3, why
from helpers.simulated import Sim, endpoint_of
from k3sim import processes
from k3sim.state import load_state

pytestmark = pytest.mark.sim

NAME = "pmmon"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    doc = _get(f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def wait_until(what: str, probe: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout:g} s: {what}")


@pytest.fixture(scope="module")
def sim():
    s = Sim(NAME, "gb300", 2, "--monitoring")
    yield s
    s.down()


def test_prometheus_sees_the_cluster_serve_and_an_engine_stop(sim, tmp_path):
    url = sim.info["prometheus"]
    status = json.loads(k3("sim", "status", "--name", NAME, "--json", check=True).stdout)["clusters"][0]
    assert status["prometheus"] == url and url.startswith("http://127.0.0.1:") and not url.endswith(":9090")
    targets = wait_until("Prometheus's targets from file_sd", lambda: _get(f"{url}/api/v1/targets")["data"][
        "activeTargets"], 10)
    head = sim.info["nodes"][0]
    # the export's targets: the head's /metrics only (the worker serves no HTTP), labelled as exported
    assert [(t["labels"]["job"], t["labels"]["node"], t["labels"]["group"], t["scrapeUrl"]) for t in targets] == [
        ("k3-engine", head["name"], "engine", f"http://{head['ip']}:8000/metrics")]

    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    endpoint = endpoint_of(run.stdout)

    # --read-nodes lists an exporter only where its port listens and serves that exporter's metrics: on the worker
    # a node exporter's page (a real one's excerpt) on 9100, and on 9400 a server whose /metrics is a 404: named in
    # a warning, not listed
    worker = sim.info["nodes"][1]
    page = (ROOT / "tests" / "fixtures" / "exporters" / "node_exporter.http").read_bytes().decode()
    body = page.split("\r\n\r\n", 1)[1]
    started = sim.ssh(1, f"mkdir -p /tmp/pgexp/n /tmp/pgexp/g && printf %s {shlex.quote(body)} > /tmp/pgexp/n/metrics "
                         "&& for p in n:9100 g:9400; do setsid python3 -m http.server ${p#*:} --directory "
                         "/tmp/pgexp/${p%:*} </dev/null >/dev/null 2>&1 & done; for i in $(seq 50); do "
                         "[ $(ss -Hltn | grep -c -e ':9100 ' -e ':9400 ') = 2 ] && exit 0; sleep 0.1; done; exit 1")
    assert started.returncode == 0, started.stderr
    sim.set_vars("k3_node_exporter_port: 9100\nk3_gpu_exporter_port: 9400\n")   # (the sim's say 0: none)
    out = tmp_path / "read"
    read = k3("export", "prometheus", sim.inventory, "-o", str(out), "--read-nodes", "--json", check=True)
    written = json.loads(read.stdout)
    assert written["targets"] == {"engines": [f"{head['ip']}:8000"], "nodes": [f"{worker['ip']}:9100"]}
    assert "gpus: none found" in (out / "README.txt").read_text()
    assert (f"{worker['name']}: port 9400 listens but is not dcgm-exporter (GET /metrics: HTTP 404 File not found"
            in read.stderr), read.stderr

    def ask(_: int) -> int:   # the probe load: completions of 1000 prompt tokens, 16 out
        req = urllib.request.Request(f"{endpoint}/v1/completions", json.dumps(
            {"model": "moonshotai/Kimi-K3", "prompt": "word " * 1000, "max_tokens": 16, "ignore_eos": True}).encode(),
            {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status)

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(ask, range(12))) == [200] * 12
    # each request's first token after 1000 prompt tokens of prefill: 0.02 + 0.1 s (the simulated engine), in
    # vLLM's bucket (0.1, 0.25]; the deploy's smoke test, one short request, is below it: once Prometheus scraped
    # the load, the group's p95 is in that bucket
    p95 = wait_until("k3:ttft_seconds:p95 of group engine in (0.1, 0.25]", lambda: [
        r for r in query(url, "k3:ttft_seconds:p95") if r["metric"]["group"] == "engine"
        and r["value"][1] != "NaN" and 0.1 < float(r["value"][1]) <= 0.25])
    assert p95[0]["metric"]["cluster"] == NAME and len(p95[0]["metric"]["revision"]) == 16
    kv = query(url, 'vllm:kv_cache_usage_perc{group="engine"}')
    assert kv and {r["metric"]["engine"] for r in kv} == {"0"}
    assert not [a for a in _get(f"{url}/api/v1/alerts")["data"]["alerts"] if a["labels"]["alertname"] == "K3EngineDown"]

    stopped = sim.ssh(0, "systemctl stop k3-engine")
    assert stopped.returncode == 0, stopped.stderr
    firing = wait_until("K3EngineDown firing", lambda: [
        a for a in _get(f"{url}/api/v1/alerts")["data"]["alerts"]
        if a["labels"]["alertname"] == "K3EngineDown" and a["state"] == "firing"])
    assert firing[0]["labels"]["node"] == head["name"] and firing[0]["labels"]["severity"] == "critical"

    state = load_state(NAME)
    assert state is not None
    pid = state["prometheus"]["pid"]
    sim.down()   # Prometheus stops with the cluster
    assert not processes.alive(pid)
    with pytest.raises(OSError):
        _get(f"{url}/-/ready")
