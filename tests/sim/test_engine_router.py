"""The simulated vllm-router in front of simulated engines: startup wait, proxying, P/D order."""

from __future__ import annotations

import subprocess
import sys

from .test_engine_harness import ROUTER, Node, chat, free_port, healthy, http, wait_for

MODEL = "moonshotai/Kimi-K3"


def engine(procs, node: Node, port: int, log: str | None = None):
    return procs.engine(node, [MODEL, "--served-model-name", "kimi-k3", "-tp", "8", "--host", node.ip,
                               "--port", str(port)], log)


def router(procs, node: Node, *args: str):
    return procs.start([sys.executable, str(ROUTER), *args], node.env(), "router")


def test_router_waits_for_its_workers_then_round_robins(tmp_path, procs, net):
    a, b = Node(tmp_path, "h200", 0, 2, net), Node(tmp_path, "h200", 1, 2, net)
    port, rport = free_port(a.ip), free_port(a.ip)
    urls = [f"http://{a.ip}:{port}", f"http://{b.ip}:{port}"]
    r = router(procs, a, "--worker-urls", *urls, "--policy", "round_robin", "--host", a.ip, "--port", str(rport))
    base = f"http://{a.ip}:{rport}"
    # started before its workers: no endpoint yet
    assert wait_for(lambda: procs.output(r).count("Waiting for 2 workers"), 3)
    assert http(base + "/health")[0] is None
    engine(procs, a, port)
    engine(procs, b, port)
    assert wait_for(lambda: healthy(base), 8)
    assert http(base + "/v1/models")[1]["data"][0]["id"] == "kimi-k3"
    answers = {chat(base, "kimi-k3")[1]["choices"][0]["message"]["content"].split(":")[0] for _ in range(4)}
    assert answers == {"Hello from node1", "Hello from node2"}
    code, body = http(base + "/v1/chat/completions", {"model": "kimi-k3", "stream": True,
                                                      "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and body.rstrip().endswith("data: [DONE]")


def test_pd_router_prefills_then_decodes(tmp_path, procs, net):
    p, d = Node(tmp_path, "b200", 0, 2, net), Node(tmp_path, "b200", 1, 2, net)
    port, rport = free_port(p.ip), free_port(p.ip)
    pe = engine(procs, p, port, "prefill")
    engine(procs, d, port, "decode")
    router(procs, p, "--vllm-pd-disaggregation", "--prefill", f"http://{p.ip}:{port}", "none",
           "--decode", f"http://{d.ip}:{port}", "--prefill-policy", "cache_aware", "--decode-policy",
           "power_of_two", "--intra-node-data-parallel-size", "1", "--host", p.ip, "--port", str(rport),
           "--worker-startup-timeout-secs", "7200")
    base = f"http://{p.ip}:{rport}"
    assert wait_for(lambda: healthy(base), 8)
    code, reply = chat(base, "kimi-k3")
    assert code == 200
    assert reply["choices"][0]["message"]["content"].startswith("Hello from node2")  # the decode instance
    assert 'POST /v1/chat/completions HTTP/1.1" 200' in procs.output(pe)  # the prefill instance ran first


def test_router_flag_spelling_and_startup_timeout(tmp_path, procs, net):
    n = Node(tmp_path, "gb200", 0, 1, net, scale=0.001)  # 600 s worker-startup timeout = 0.6 s
    res = subprocess.run([sys.executable, str(ROUTER), "--pd-disaggregation", "--prefill", "http://x:8000",
                          "--decode", "http://y:8000"], capture_output=True, text=True, env=n.env(), timeout=30)
    assert res.returncode == 2
    assert "vllm-router: error: unrecognized arguments: --pd-disaggregation" in res.stderr
    port = free_port(n.ip)
    r = router(procs, n, "--worker-urls", f"http://{n.ip}:{port}", "--host", n.ip, "--port", str(free_port(n.ip)))
    assert r.wait(timeout=10) == 1
    assert f"Timeout 600s waiting for workers ['http://{n.ip}:{port}'] to become healthy" in procs.output(r)
