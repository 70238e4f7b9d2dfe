"""The NCCL probe's pieces without a cluster: the command, the reading of NCCL's log, the verdicts, the pairing."""

from __future__ import annotations

from k3deploy.vendors.nvidia.probe import NcclProbe, ProbeResult, judge, pairs, parse_probe, probe_env

# NCCL INFO lines as real NCCL prints them (NVIDIA/nccl#1537, #899; the DMA-BUF failure of NVIDIA/nccl#778)
GOOD = ["node1:99:120 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>",
        "node1:99:120 [0] NCCL INFO NET/IB : GPU Direct RDMA (DMABUF) enabled for HCA 0 'mlx5_0'",
        "node1:99:121 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
        "node1:99:121 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
        "K3_PROBE_RESULT 2"]
NO_MODULE = ["21346d5cefce:5325:5337 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)",
             "21346d5cefce:5325:5338 [0] NCCL INFO Channel 00 : 0[1a000] -> 1[1a000] [receive] via NET/IB/0",
             "K3_PROBE_RESULT 2"]
ERRNO_524 = ["node2:7:7 [0] NCCL WARN NET/IB : mlx5dv_reg_dmabuf_mr failed: Unknown error 524 (errno 524) on HCA "
             "'mlx5_0'. Perhaps your IB driver version is too old to support DMABUF? Try running with "
             "NCCL_DMABUF_ENABLE=0",
             "torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp:3690, unhandled system error"]


def test_gdrdma_passes():
    r = parse_probe(GOOD, 0)
    assert r.gdrdma and r.result == 2 and r.transports == ["NET/IB/0/GDRDMA"]
    shown = judge("node1", "node2", r)
    assert shown.status == "pass" and "via NET/IB/0/GDRDMA" in shown.observed and "GDRDMA" in shown.required


def test_host_staging_fails_with_observed_and_required():
    shown = judge("node2", "node1", parse_probe(NO_MODULE, 0))
    assert shown.status == "fail"
    assert shown.observed == ("with node1: via NET/IB/0; GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)")
    assert "via NET/IB/<n>/GDRDMA" in shown.required and "nvidia-peermem" in shown.fix


def test_a_failed_dmabuf_registration_names_the_mlx5_driver():
    shown = judge("node2", "node1", parse_probe(ERRNO_524, 1))
    assert shown.status == "fail" and "errno 524" in shown.observed and "mlx5 kernel driver" in shown.fix
    # the healthy peer of a failed node warns and points at it
    peer = parse_probe(GOOD[:-1] + ["torch.distributed.DistBackendError: NCCL error in: x, remote process exited or "
                                    "there was a network error, NCCL version 2.28.3"], 1)
    assert judge("node1", "node2", peer).status == "warn"


def test_sockets_and_missing_images_and_hangs():
    sock = parse_probe(["h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0", "K3_PROBE_RESULT 2"],
                       0)
    assert not sock.gdrdma and judge("a", "b", sock).status == "fail"
    gone = parse_probe(["docker: Error response from daemon: No such image: vllm/vllm-openai:kimi-k3"], 125)
    assert "image is not on a" in judge("a", "b", gone).observed
    assert "240 s" in judge("a", "b", ProbeResult(exit_code=124)).observed


def test_command_runs_the_image_with_the_hosts_nccl_settings():
    env = probe_env({"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_SOCKET_IFNAME": "=eth1", "VLLM_X": "1"})
    cmd = NcclProbe().command(docker="docker", image="vllm/vllm-openai:kimi-k3", rank=1, master="10.0.0.1",
                              port=29517, env=env)
    assert "--pull never" in cmd and "-e NCCL_DEBUG=INFO" in cmd and "-e RANK=1" in cmd
    assert "-e NCCL_IB_HCA==mlx5_0:1" in cmd and "VLLM_X" not in cmd and "init_process_group" in cmd
    assert cmd.endswith("echo K3_EXIT=$?")


def test_pairs_cover_every_node_once():
    assert pairs(["a", "b"]) == [[("a", "b")]]
    assert pairs(["a", "b", "c"]) == [[("a", "b")], [("a", "c")]]
    assert pairs(["a"]) == []


def test_an_hca_that_does_not_reach_the_peer_is_named_whichever_stream_came_first():
    warn = ("n1:1:1 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<43715> with error 12, opcode 0, len 0, "
            "vendor err 129 (Send) localGid ::ffff:10.0.0.1 remoteGids ::ffff:10.0.0.2 hca mlx5_bond_0")
    error = ["torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3690, remote process exited "
             "or there was a network error, NCCL version 2.28.3", "Last error:",
             "NET/IB : Got completion from peer with error 12, opcode 0, len 0, vendor err 129 (Send)"]
    for lines in ([warn, *error], [*error, warn]):
        r = judge("n1", "n2", parse_probe(lines, 1))
        assert r.status == "fail" and "hca mlx5_bond_0" in r.observed and "k3_ib_hca" in r.fix, r.observed
