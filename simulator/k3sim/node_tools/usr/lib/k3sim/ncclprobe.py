"""Simulated two-node NCCL all-reduce in the vLLM image (``python3 -c`` with ``torch.distributed``), as k3deploy's
preflight probe runs it: ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` from the environment, torch's TCP
rendezvous between the two containers (rank 0 listens), then what NCCL logs about its network transport on this node
(``k3simlib.nccl_net_lines``: the node's fabric state and faults, ``NCCL_IB_HCA``, ``NCCL_DMABUF_ENABLE``), and the
all-reduce result. Either side's failure ends the other with NCCL's remote error, as a real collective would."""

from __future__ import annotations

import os
import socket
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3simlib as k  # noqa: E402

TIMEOUT_S = 60.0


def fail(exc_type: str, message: str) -> None:
    sys.stderr.write("Traceback (most recent call last):\n  File \"<string>\", line 3, in <module>\n"
                     f"{exc_type}: {message}\n")
    sys.stderr.flush()
    sys.exit(1)


def rendezvous(rank: int, addr: str, port: int) -> socket.socket:
    """The other rank's connection (rank 0 accepts, rank 1 connects), or torch's timeout error."""
    deadline = time.time() + TIMEOUT_S
    if rank == 0:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", port))
        srv.listen(1)
        srv.settimeout(TIMEOUT_S)
        try:
            conn, _ = srv.accept()
        except OSError:
            fail("torch.distributed.DistStoreError", f"Timed out after {int(TIMEOUT_S)} seconds waiting for clients. "
                 "1/2 clients joined.")
        srv.close()
        return conn
    while True:
        try:
            return socket.create_connection((addr, port), timeout=5)
        except OSError:
            if time.time() > deadline:
                fail("torch.distributed.DistNetworkError", f"The client socket has timed out after "
                     f"{int(TIMEOUT_S)}s while trying to connect to ({addr}, {port}).")
            time.sleep(0.2)


def main() -> int:
    cfg = k.load_config()
    env = dict(os.environ)
    if env.get("K3SIM_GPUS_VISIBLE", "0") in ("", "0"):
        fail("RuntimeError", "No CUDA GPUs are available")
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    addr, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500"))
    if world != 2 or rank not in (0, 1):
        fail("ValueError", f"this probe runs on 2 ranks (RANK={rank}, WORLD_SIZE={world})")
    conn = rendezvous(rank, addr, port)
    conn.settimeout(TIMEOUT_S)
    peer = conn.getpeername()[0]
    name = cfg.get("name", socket.gethostname())
    prefix = f"{name}:{os.getpid()}:{os.getpid()} [0] NCCL INFO "
    debug = env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE")
    lines = [prefix + f"cudaDriverVersion {cfg['driver'].get('cuda_version', '13.0').replace('.', '0')}0",
             prefix + f"NCCL version {k.NCCL_VERSION}+cuda13.0" if rank == 0 else ""]
    net, error = k.nccl_net_lines(cfg, env, prefix, peer)
    lines += net
    if debug:
        print("\n".join(line for line in lines if line), flush=True)
    conn.sendall(b"fail\n" if error else b"ok\n")
    try:
        theirs = conn.recv(16).decode().strip()
    except OSError:
        theirs = ""
    conn.close()
    if error:
        fail(*error)
    if theirs != "ok":
        fail("torch.distributed.DistBackendError", "NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
             "ProcessGroupNCCL.cpp:3690, remote process exited or there was a network error, NCCL version "
             f"{k.NCCL_VERSION}\nncclRemoteError: A call failed possibly due to a network error or a remote process "
             "exiting prematurely.")
    print(f"K3_PROBE_RESULT {world}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
