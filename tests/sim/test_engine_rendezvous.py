"""The simulated vLLM engine: multi-node rendezvous in the right and the wrong order, HTTP API, faults."""

from __future__ import annotations

import time

import pytest

from helpers.engine import Node, chat, free_port, healthy, http, wait_for

MODEL = "moonshotai/Kimi-K3"


def tp16(node: Node, rank: int, head: Node, port: int, http_port: int, *extra: str) -> list[str]:
    args = [MODEL, "--served-model-name", "kimi-k3", "--tensor-parallel-size", "16", "--nnodes", "2",
            "--node-rank", str(rank), "--master-addr", head.ip, "--master-port", str(port),
            "--host", node.ip, "--port", str(http_port), *extra]
    return args + (["--headless"] if rank else [])


def test_nnodes_head_then_worker_becomes_healthy_and_serves(tmp_path, procs, net):
    head, worker = (Node(tmp_path, "h200", r, 2, net) for r in (0, 1))
    mport, hport = free_port(head.ip), free_port(head.ip)
    base = f"http://{head.ip}:{hport}"
    h = procs.engine(head, tp16(head, 0, head, mport, hport))
    # alone, the head never answers: the world has not joined
    time.sleep(0.5)
    assert http(base + "/health")[0] is None and h.poll() is None
    w = procs.engine(worker, tp16(worker, 1, head, mport, hport))
    assert wait_for(lambda: healthy(base), 5)
    code, models = http(base + "/v1/models")
    assert code == 200 and models["object"] == "list"
    assert [(m["id"], m["root"], m["owned_by"]) for m in models["data"]] == [("kimi-k3", MODEL, "vllm")]
    code, reply = chat(base, "kimi-k3", max_tokens=64)
    assert code == 200 and reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert "node1" in reply["choices"][0]["message"]["content"]
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert http(base + "/version") == (200, {"version": "0.33.0"})
    # the headless worker serves no HTTP
    assert http(f"http://{worker.ip}:{hport}/health")[0] is None
    assert w.poll() is None
    out = procs.output(w)
    assert (f"Launching vLLM (v0.33.0) headless multiproc executor, with head node address "
            f"{head.ip}:{mport} for torch.distributed process group.") in out
    assert "Application startup complete." in procs.output(h)


def test_nnodes_worker_first_times_out_and_head_never_becomes_healthy(tmp_path, procs, net):
    # time_scale 0.002: torch's 600 s process-group timeout lasts 1.2 s
    head, worker = (Node(tmp_path, "h200", r, 2, net, scale=0.002) for r in (0, 1))
    mport, hport = free_port(head.ip), free_port(head.ip)
    base = f"http://{head.ip}:{hport}"
    w = procs.engine(worker, tp16(worker, 1, head, mport, hport))
    assert w.wait(timeout=10) == 1
    assert (f"torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying "
            f"to connect to ({head.ip}, {mport}).") in procs.output(w)
    h = procs.engine(head, tp16(head, 0, head, mport, hport))
    states = []
    for _ in range(8):
        states.append(http(base + "/health", timeout=0.5)[0])
        time.sleep(0.1)
    assert set(states) == {None}
    assert h.wait(timeout=10) == 1
    assert ("torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 1/2 clients "
            "joined.") in procs.output(h)


def dp_args(node: Node, head: Node, rpc: int, port: int, start: int | None, *extra: str) -> list[str]:
    args = [MODEL, "--served-model-name", "kimi-k3", "--tensor-parallel-size", "1", "--data-parallel-size", "16",
            "--data-parallel-size-local", "8", "--enable-expert-parallel", "--data-parallel-address", head.ip,
            "--data-parallel-rpc-port", str(rpc), "--host", node.ip, "--port", str(port), *extra]
    return args + (["--data-parallel-start-rank", str(start)] if start is not None else [])


def test_dp_hybrid_lb_two_nodes_each_serve_their_own_port(tmp_path, procs, net):
    head, worker = (Node(tmp_path, "h200", r, 2, net) for r in (0, 1))  # 8 local DP ranks x TP1 = 8 GPUs
    rpc, port = free_port(head.ip), free_port(head.ip)
    procs.engine(head, dp_args(head, head, rpc, port, None, "--data-parallel-hybrid-lb"))
    time.sleep(0.3)
    assert http(f"http://{head.ip}:{port}/health")[0] is None
    procs.engine(worker, dp_args(worker, head, rpc, port, 8, "--data-parallel-hybrid-lb"))
    for n in (head, worker):
        base = f"http://{n.ip}:{port}"
        assert wait_for(lambda b=base: healthy(b), 5), n.name
        code, models = http(base + "/v1/models")
        assert code == 200 and models["data"][0]["id"] == "kimi-k3"
        code, reply = chat(base, "kimi-k3")
        assert code == 200 and n.name in reply["choices"][0]["message"]["content"]


def test_dp_worker_first_gives_up_after_the_handshake_window(tmp_path, procs, net):
    # time_scale 0.002: vLLM's 5-minute handshake window lasts 0.6 s; H200 tp_dp internal-LB form
    head, worker = (Node(tmp_path, "h200", r, 2, net, scale=0.002) for r in (0, 1))
    rpc, port = free_port(head.ip), free_port(head.ip)
    common = [MODEL, "-tp", "8", "--data-parallel-size", "2", "--data-parallel-size-local", "1",
              "--data-parallel-address", head.ip, "--data-parallel-rpc-port", str(rpc), "--port", str(port)]
    w = procs.engine(worker, common + ["--host", worker.ip, "--data-parallel-start-rank", "1", "--headless"])
    assert w.wait(timeout=10) == 1
    assert "RuntimeError: Did not receive response from front-end process within 5 minutes" in procs.output(w)
    h = procs.engine(head, common + ["--host", head.ip])
    time.sleep(1.0)  # longer than every scaled vLLM timeout: the head still waits, unhealthy
    assert h.poll() is None and http(f"http://{head.ip}:{port}/health")[0] is None
    # a worker started now (within its window) completes the world
    procs.engine(worker, common + ["--host", worker.ip, "--data-parallel-start-rank", "1", "--headless"], "w2")
    assert wait_for(lambda: healthy(f"http://{head.ip}:{port}"), 5)


def test_head_rejects_a_remote_engine_that_is_not_headless_in_internal_lb(tmp_path, procs, net):
    head, worker = (Node(tmp_path, "h200", r, 2, net) for r in (0, 1))
    rpc, port = free_port(head.ip), free_port(head.ip)
    common = [MODEL, "-tp", "8", "-dp", "2", "-dpl", "1", "-dpa", head.ip, "-dpp", str(rpc), "--port", str(port)]
    h = procs.engine(head, common + ["--host", head.ip])
    w = procs.engine(worker, common + ["--host", worker.ip, "-dpr", "1"])
    msg = "Remote engine 1 must use --headless unless in external or hybrid dp lb mode"
    assert w.wait(timeout=10) == 1 and msg in procs.output(w)
    assert h.wait(timeout=10) == 1 and msg in procs.output(h)


def test_worker_loss_fails_the_head(tmp_path, procs, net):
    head, worker = (Node(tmp_path, "h200", r, 2, net) for r in (0, 1))
    mport, hport = free_port(head.ip), free_port(head.ip)
    base = f"http://{head.ip}:{hport}"
    h = procs.engine(head, tp16(head, 0, head, mport, hport))
    w = procs.engine(worker, tp16(worker, 1, head, mport, hport))
    assert wait_for(lambda: healthy(base), 5)
    w.kill()
    assert h.wait(timeout=5) == 1
    assert "NCCL error" in procs.output(h)


@pytest.mark.parametrize("faults,env,expect,ok", [
    ((), {}, "NET/IB : GPU Direct RDMA (DMABUF) enabled for HCA 0 'mlx5_0'", True),
    (("0:no-dmabuf", "1:no-dmabuf"), {}, "mlx5dv_reg_dmabuf_mr failed: errno 524", False),
    (("0:no-dmabuf", "1:no-dmabuf"), {"NCCL_DMABUF_ENABLE": "0"},
     "NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'", True),
    (("0:no-dmabuf", "1:no-dmabuf", "0:no-peermem", "1:no-peermem"), {"NCCL_DMABUF_ENABLE": "0"},
     "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)", True),
])
def test_nccl_transport_follows_dmabuf_and_peermem(tmp_path, procs, net, faults, env, expect, ok):
    head, worker = (Node(tmp_path, "b200", r, 2, net, faults=faults) for r in (0, 1))
    mport, hport = free_port(head.ip), free_port(head.ip)
    h = procs.engine(head, tp16(head, 0, head, mport, hport), NCCL_DEBUG="INFO", **env)
    procs.engine(worker, tp16(worker, 1, head, mport, hport), NCCL_DEBUG="INFO", **env)
    if ok:
        assert wait_for(lambda: healthy(f"http://{head.ip}:{hport}"), 5)
    else:
        assert h.wait(timeout=5) == 1
    assert expect in procs.output(h)


def test_engine_crash_and_slow_faults(tmp_path, procs, net):
    crash = Node(tmp_path, "h200", 0, 1, net, faults=("0:engine-crash",))
    p = procs.engine(crash, [MODEL, "-tp", "8", "--host", crash.ip, "--port", str(free_port(crash.ip))])
    assert p.wait(timeout=5) == 1
    out = procs.output(p)
    assert "Traceback (most recent call last):" in out
    assert "RuntimeError: Engine core initialization failed. See root cause above." in out

    slow = Node(tmp_path / "slow", "h200", 0, 1, net, faults=("0:engine-slow=1",))
    port = free_port(slow.ip)
    t0 = time.monotonic()
    procs.engine(slow, [MODEL, "-tp", "8", "--host", slow.ip, "--port", str(port)], K3SIM_LOAD_SECONDS="0.1")
    assert wait_for(lambda: healthy(f"http://{slow.ip}:{port}"), 5)
    assert time.monotonic() - t0 >= 1.1


def test_ready_timeout_scales_with_the_setting(tmp_path, procs, net):
    n = Node(tmp_path, "b300", 0, 1, net)  # time_scale 0.01: 50 s nominal = 0.5 s
    p = procs.engine(n, [MODEL, "-tp", "8", "--host", n.ip, "--port", str(free_port(n.ip))],
                     K3SIM_LOAD_SECONDS="3", VLLM_ENGINE_READY_TIMEOUT_S="50")
    assert p.wait(timeout=5) == 1
    assert ("Timed out waiting for engine core processes to start. This is often caused by slow weight loading "
            "for large models. Waited 50s (configured by VLLM_ENGINE_READY_TIMEOUT_S)") in procs.output(p)


@pytest.mark.parametrize("args,code,text", [
    (["-tp", "eight"], 2, "vllm serve: error: argument --tensor-parallel-size/-tp: invalid int value: 'eight'"),
    (["-tp", "16"], 1, "The number of required GPUs on this node (16) exceeds the number of available GPUs (8)"),
    (["-dp", "2", "-dpl", "1", "--headless", "-dph"], 1, "data_parallel_hybrid_lb is not applicable in headless"),
    (["-tp", "8", "--attention-backend", "TOKENSPEED_MLA"], 1, "TOKENSPEED_MLA is not valid"),
    (["-tp", "8", "--moe-backend", "deep_gemm_mega_moe"], 1, "Kimi K3 MegaMoE requires expert parallel"),
])
def test_invalid_arguments_fail_before_anything_starts(tmp_path, procs, net, args, code, text):
    n = Node(tmp_path, "h200", 0, 1, net)
    p = procs.engine(n, [MODEL, *args, "--host", n.ip, "--port", str(free_port(n.ip))])
    assert p.wait(timeout=5) == code
    assert text in procs.output(p)


def test_api_key_model_name_and_flag_spellings(tmp_path, procs, net):
    n = Node(tmp_path, "gb200", 0, 1, net)
    port = free_port(n.ip)
    base = f"http://{n.ip}:{port}"
    # --x=v and _ spellings, an unknown flag with a value, and a BooleanOptionalAction negation
    procs.engine(n, [MODEL, "--tensor_parallel_size=4", "--served-model-name=kimi", "--api-key", "sekret",
                     "--some-future-flag", "7", "--no-enable-prefix-caching", "--host", n.ip, f"--port={port}"])
    assert wait_for(lambda: healthy(base), 5)
    assert http(base + "/v1/models")[0] == 401
    auth = {"Authorization": "Bearer sekret"}
    assert http(base + "/v1/models", headers=auth)[1]["data"][0]["id"] == "kimi"
    code, body = http(base + "/v1/chat/completions", {"model": "other", "messages": [{"role": "user",
                                                                                     "content": "x"}]}, auth)
    assert code == 404 and body["error"]["message"] == "The model `other` does not exist."
    code, body = http(base + "/v1/chat/completions", {"model": "kimi", "messages": [{"role": "user",
                                                                                    "content": "x"}],
                                                        "max_tokens": 2}, auth)
    assert code == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2
    assert http(base + "/ping")[0] == 200
    code, body = http(base + "/v1/completions", {"model": "kimi", "prompt": "Once upon", "max_tokens": 3}, auth)
    assert code == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Hello from node1:"


def test_unknown_vllm_environment_variables(tmp_path, procs, net):
    n = Node(tmp_path, "h200", 0, 1, net)
    port = free_port(n.ip)
    ok = procs.engine(n, [MODEL, "-tp", "8", "--host", n.ip, "--port", str(port)], "warn",
                      VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4="1")
    assert wait_for(lambda: healthy(f"http://{n.ip}:{port}"), 5) and ok.poll() is None
    assert "Unknown vLLM environment variable detected: VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4" in procs.output(ok)
    strict = procs.engine(n, [MODEL, "-tp", "8", "--fail-on-environ-validation", "--host", n.ip, "--port",
                              str(free_port(n.ip))], "strict", VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4="1")
    assert strict.wait(timeout=5) == 1
    assert "ValueError: Unknown vLLM environment variable detected" in procs.output(strict)
