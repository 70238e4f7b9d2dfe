"""The real vllm-router 0.1.17 in front of simulated engines: startup wait, proxying, render, P/D order."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.engine import ROUTER, Node, chat, free_port, healthy, http, wait_for
from k3sim import router as sim_router
from k3sim.host import SimError

MODEL = "moonshotai/Kimi-K3"
NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


@pytest.fixture(scope="module")
def router_dir() -> str:
    try:
        return str(sim_router.check())
    except SimError as exc:
        pytest.fail(str(exc))


def engine(procs, node: Node, port: int, log: str | None = None, *extra: str):
    return procs.engine(node, [MODEL, "--served-model-name", "kimi-k3", "-tp", "8", "--host", node.ip,
                               "--port", str(port), *extra], log)


def router(procs, router_dir: str, node: Node, *args: str):
    """The node's vllm-router command on the host; its metrics listener on the node's own address."""
    metrics = ["--prometheus-host", node.ip, "--prometheus-port", str(free_port(node.ip))]
    return procs.start([sys.executable, str(ROUTER), *args, *metrics], node.env(K3SIM_ROUTER_DIR=router_dir),
                       "router")


def test_router_waits_for_its_workers_then_round_robins(tmp_path, procs, net, router_dir):
    a, b = Node(tmp_path, "h200", 0, 2, net), Node(tmp_path, "h200", 1, 2, net)
    port, rport = free_port(a.ip), free_port(a.ip)
    urls = [f"http://{a.ip}:{port}", f"http://{b.ip}:{port}"]
    r = router(procs, router_dir, a, "--worker-urls", *urls, "--policy", "round_robin", "--host", a.ip,
               "--port", str(rport), "--worker-startup-check-interval", "1")
    base = f"http://{a.ip}:{rport}"
    # started before its workers: no endpoint yet
    assert wait_for(lambda: "Waiting for 2 unique hosts (representing 2 workers) to become healthy"
                    in procs.output(r), 20)
    assert http(base + "/health")[0] is None
    engine(procs, a, port)
    engine(procs, b, port)
    assert wait_for(lambda: healthy(base), 30)
    assert "Router ready" in procs.output(r)
    assert http(base + "/v1/models")[1]["data"][0]["id"] == "kimi-k3"
    answers = {chat(base, "kimi-k3")[1]["choices"][0]["message"]["content"].split(":")[0] for _ in range(4)}
    assert answers == {"Hello from node1", "Hello from node2"}
    code, body = http(base + "/v1/chat/completions", {"model": "kimi-k3", "stream": True,
                                                      "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and body.rstrip().endswith("data: [DONE]")
    # workers at run time: listed, removed (requests go to the others), added back
    assert sorted(http(base + "/list_workers")[1]["urls"]) == urls
    assert http(base + f"/remove_worker?url={urls[1]}", {})[0] == 200
    assert {chat(base, "kimi-k3")[1]["choices"][0]["message"]["content"].split(":")[0] for _ in range(3)} == \
        {"Hello from node1"}
    code, text = http(base + f"/add_worker?url={urls[1]}", {}, timeout=60)
    assert code == 200 and f"Successfully added worker: {urls[1]}" in text
    assert sorted(http(base + "/list_workers")[1]["urls"]) == sorted(urls)


def test_cache_aware_router_renders_on_the_engine_first(tmp_path, procs, net, router_dir):
    """The default policy asks a worker for the request's token ids (/render) before sending it."""
    n = Node(tmp_path, "h200", 0, 1, net)
    port, rport = free_port(n.ip), free_port(n.ip)
    e = engine(procs, n, port)
    router(procs, router_dir, n, "--worker-urls", f"http://{n.ip}:{port}", "--host", n.ip, "--port", str(rport))
    base = f"http://{n.ip}:{rport}"
    assert wait_for(lambda: healthy(base), 30)
    assert chat(base, "kimi-k3")[0] == 200
    assert http(base + "/v1/completions", {"model": "kimi-k3", "prompt": "Say hello", "max_tokens": 3})[0] == 200
    log = procs.output(e)
    assert 'POST /v1/chat/completions/render HTTP/1.1" 200' in log
    assert 'POST /v1/completions/render HTTP/1.1" 200' in log
    assert "POST /tokenize" not in log  # the router's fallback when /render fails
    assert log.index("/v1/chat/completions/render") < log.index('POST /v1/chat/completions HTTP')


def test_pd_router_prefills_then_decodes(tmp_path, procs, net, router_dir):
    p, d = Node(tmp_path, "b200", 0, 2, net), Node(tmp_path, "b200", 1, 2, net)
    port, rport = free_port(p.ip), free_port(p.ip)
    pe = engine(procs, p, port, "prefill", "--kv-transfer-config", NIXL)
    de = engine(procs, d, port, "decode", "--kv-transfer-config", NIXL)
    pd = ["--vllm-pd-disaggregation", "--prefill", f"http://{p.ip}:{port}", "none", "--decode", f"http://{d.ip}:{port}"]
    # power_of_two needs two decode workers: the real router refuses to start with one
    bad = router(procs, router_dir, p, *pd, "--decode-policy", "power_of_two", "--host", p.ip, "--port", str(rport))
    assert bad.wait(timeout=60) != 0
    assert "Power-of-two policy for decode requires at least 2 decode workers" in procs.output(bad)
    router(procs, router_dir, p, "--policy", "round_robin", *pd, "--intra-node-data-parallel-size", "1",
           "--host", p.ip, "--port", str(rport), "--worker-startup-timeout-secs", "7200")
    base = f"http://{p.ip}:{rport}"
    assert wait_for(lambda: healthy(base), 30)
    code, reply = chat(base, "kimi-k3", max_tokens=5)
    assert code == 200
    assert reply["choices"][0]["message"]["content"].startswith("Hello from node2")  # the decode instance
    assert 'POST /v1/chat/completions HTTP/1.1" 200' in procs.output(pe)  # the prefill instance ran first
    # the decode instance got the prefill's KV transfer parameters (NixlConnector: where to read the blocks)
    assert wait_for(lambda: "Reading 1 KV blocks from engine" in procs.output(de), 5)


def test_router_flag_spelling_and_startup_timeout(tmp_path, procs, net, router_dir):
    n = Node(tmp_path, "gb200", 0, 1, net)
    res = subprocess.run([sys.executable, str(ROUTER), "--pd-disaggregation", "--prefill", "http://x:8000",
                          "--decode", "http://y:8000"], capture_output=True, text=True,
                         env=n.env(K3SIM_ROUTER_DIR=router_dir), timeout=60)
    assert res.returncode == 2
    assert "vllm-router: error: unrecognized arguments: --pd-disaggregation" in res.stderr
    port = free_port(n.ip)
    r = router(procs, router_dir, n, "--worker-urls", f"http://{n.ip}:{port}", "--host", n.ip,
               "--port", str(free_port(n.ip)), "--worker-startup-timeout-secs", "2",
               "--worker-startup-check-interval", "1")
    assert r.wait(timeout=60) == 1
    assert f'Timeout 2s waiting for hosts ["http://{n.ip}:{port}"] to become healthy' in procs.output(r)


def test_router_command_without_the_installation_says_how_to_install(tmp_path):
    res = subprocess.run([sys.executable, str(ROUTER), "--help"], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "K3SIM_ROUTER_DIR": str(tmp_path / "none")})
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "sudo tools/sim-router.sh" in res.stderr


def test_engine_answers_render_and_tokenize_as_vllm_does(tmp_path, procs, net):
    """vLLM 0.33's /v1/chat/completions/render answers one GenerateRequest, /v1/completions/render a list of them:
    the prompt's token ids and the sampling parameters, generating nothing; /tokenize the same ids."""
    n = Node(tmp_path, "h200", 0, 1, net)
    port = free_port(n.ip)
    e = engine(procs, n, port)
    base = f"http://{n.ip}:{port}"
    assert wait_for(lambda: healthy(base), 10)
    msgs = [{"role": "user", "content": "Say hello"}]
    code, gen = http(base + "/v1/chat/completions/render", {"model": "kimi-k3", "messages": msgs, "max_tokens": 7},
                     headers={"X-Request-Id": "abc"})
    assert code == 200
    assert set(gen) == {"request_id", "token_ids", "token_offsets", "features", "content_parts", "sampling_params",
                        "model", "reasoning_ended", "reasoning_parser_kwargs", "return_token_ids", "output_mode",
                        "parse_context", "stream", "stream_options", "cache_salt", "priority", "kv_transfer_params",
                        "ec_transfer_params"}
    assert gen["request_id"] == "chatcmpl-abc" and gen["model"] == "kimi-k3" and gen["output_mode"] == "tokens"
    assert gen["sampling_params"]["max_tokens"] == 7 and gen["stream"] is False
    assert len(gen["token_ids"]) == 4 and all(isinstance(t, int) and t >= 0 for t in gen["token_ids"])
    code, tok = http(base + "/tokenize", {"model": "kimi-k3", "messages": msgs})
    assert code == 200 and tok["tokens"] == gen["token_ids"] and tok["count"] == 4
    assert tok["max_model_len"] == 1048576
    code, gens = http(base + "/v1/completions/render", {"model": "kimi-k3", "prompt": "Say hello"})
    assert code == 200 and isinstance(gens, list) and len(gens) == 1 and gens[0]["request_id"].startswith("cmpl-")
    assert len(gens[0]["token_ids"]) == 2
    assert http(base + "/v1/chat/completions/render", {"model": "other", "messages": msgs})[0] == 404
    assert http(base + "/v1/chat/completions/render", {"model": "kimi-k3", "messages": []})[0] == 400
    assert http(base + "/detokenize", {"model": "kimi-k3", "tokens": gen["token_ids"]})[0] == 200
    # rendering generates nothing
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="kimi-k3"} 0.0' \
        in http(base + "/metrics")[1]
    assert 'POST /v1/chat/completions/render HTTP/1.1" 200' in procs.output(e)


def test_the_router_passes_the_clients_key_on_to_keyed_engines(tmp_path, procs, net, router_dir):
    """An engine with an API key behind the real router: the router needs no key of its own (its health checks ask
    the open ``/health``); the client's ``Authorization`` header reaches the engine, and a request without it, or with
    another key, gets the engine's 401."""
    a = Node(tmp_path, "h200", 0, 1, net)
    port, rport = free_port(a.ip), free_port(a.ip)
    engine(procs, a, port, None, "--api-key", "sekret")
    router(procs, router_dir, a, "--worker-urls", f"http://{a.ip}:{port}", "--host", a.ip, "--port", str(rport),
           "--worker-startup-check-interval", "1")
    base = f"http://{a.ip}:{rport}"
    assert wait_for(lambda: healthy(base), 30)
    auth = {"Authorization": "Bearer sekret"}
    assert http(base + "/v1/models")[0] == 401
    assert http(base + "/v1/models", headers=auth)[1]["data"][0]["id"] == "kimi-k3"
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert http(base + "/v1/chat/completions", body)[0] == 401
    assert http(base + "/v1/chat/completions", body, {"Authorization": "Bearer other"})[0] == 401
    code, reply = http(base + "/v1/chat/completions", body, auth)
    assert code == 200 and reply["choices"][0]["message"]["content"].startswith("Hello from node1")
