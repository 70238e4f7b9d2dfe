"""Code shared by the simulated vendor tools (standard library only).

Every tool re-reads the node configuration on each call, so a fault switched on a running node
takes effect at the next call. Paths:

- ``K3SIM_NODE_CONFIG`` (default ``/etc/k3sim/node.json``): the node configuration;
- ``K3SIM_STATE_DIR`` (default ``/var/lib/k3sim``): runtime state (loaded modules, docker).
- ``K3SIM_OUTSIDE`` (``ADDRESS:PORT``, unset on nodes): where the outside's names (registry-1.docker.io, quay.io,
  huggingface.co, k3sim-outside) connect to instead of what ``/etc/hosts`` says; the tests use it on the host.
"""

from __future__ import annotations

import json
import os
import sys
import time

# socket, urllib.parse and typing are imported where used: a tool's start-up is most of what it costs
TYPE_CHECKING = False
if TYPE_CHECKING:
    import http.client
    from typing import BinaryIO, NoReturn

CONFIG_PATH = "/etc/k3sim/node.json"
STATE_DIR = "/var/lib/k3sim"
LIB_DIR = os.path.dirname(os.path.abspath(__file__))


def config_path() -> str:
    return os.environ.get("K3SIM_NODE_CONFIG") or CONFIG_PATH


def load_config() -> dict:
    path = config_path()
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        sys.stderr.write(f"k3sim: node configuration {path} not found\n")
        sys.exit(1)


def state_dir() -> str:
    return os.environ.get("K3SIM_STATE_DIR") or STATE_DIR


def scaled(config: dict, seconds: float) -> float:
    """Nominal seconds in simulated wall-clock time."""
    return float(seconds) * float(config.get("time_scale", 1.0))


def timestamp(fmt: str = "%a %b %e %H:%M:%S %Y") -> str:
    return time.strftime(fmt)


# ---------------------------------------------------------------- kernel modules

def _modules_file() -> str:
    return os.path.join(state_dir(), "modules.json")


def _module_overrides() -> dict:
    try:
        with open(_modules_file()) as fh:
            return json.load(fh)
    except (FileNotFoundError, ValueError):
        return {}


def set_module_loaded(name: str, loaded: bool) -> None:
    data = _module_overrides()
    data[name] = loaded
    os.makedirs(state_dir(), exist_ok=True)
    tmp = _modules_file() + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, _modules_file())


def known_modules(config: dict) -> list[dict]:
    """Every module the node's kernel has (loaded or not): name, size, holders, license, version."""
    vendor = config["vendor"]
    drv = config["driver"]["version"]
    mods: list[dict] = []
    if config.get("rdma"):
        mods += [
            {"name": "mlx5_ib", "size": 565248, "used_by": ["rdma_ucm"], "license": "Dual BSD/GPL",
             "version": "24.10-1.1.4", "file": "kernel/drivers/infiniband/hw/mlx5/mlx5_ib.ko"},
            {"name": "ib_uverbs", "size": 196608, "used_by": ["nvidia_peermem", "rdma_ucm", "mlx5_ib"],
             "license": "Dual BSD/GPL", "version": "", "file": "kernel/drivers/infiniband/core/ib_uverbs.ko"},
            {"name": "mlx5_core", "size": 2510848, "used_by": ["mlx5_ib"], "license": "Dual BSD/GPL",
             "version": "24.10-1.1.4", "file": "kernel/drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko"},
        ]
    if vendor == "nvidia":
        open_km = drv and config["driver"].get("kernel_module") == "open"
        lic = "Dual MIT/GPL" if open_km else "NVIDIA"
        mods += [
            {"name": "nvidia_uvm", "size": 2084864, "used_by": [], "license": lic, "version": drv,
             "file": "updates/dkms/nvidia-uvm.ko"},
            {"name": "nvidia_drm", "size": 143360, "used_by": [], "license": lic, "version": drv,
             "file": "updates/dkms/nvidia-drm.ko"},
            {"name": "nvidia_modeset", "size": 1835008, "used_by": ["nvidia_drm"], "license": lic,
             "version": drv, "file": "updates/dkms/nvidia-modeset.ko"},
            {"name": "nvidia", "size": 14376960, "used_by": ["nvidia_uvm", "nvidia_peermem", "nvidia_modeset"],
             "license": lic, "version": drv, "file": "updates/dkms/nvidia.ko"},
        ]
        if config.get("rdma"):
            mods.append({"name": "nvidia_peermem", "size": 16384, "used_by": [], "license": "Dual BSD/GPL",
                         "version": drv, "file": "updates/dkms/nvidia-peermem.ko"})
    elif vendor == "amd":
        mods.append({"name": "amdgpu", "size": 19595264, "used_by": [], "license": "GPL and additional rights",
                     "version": config["driver"]["version"], "file": "updates/dkms/amdgpu.ko"})
    elif vendor == "ascend":
        mods += [
            {"name": "drv_davinci_intf_host", "size": 49152, "used_by": [], "license": "GPL v2",
             "version": drv, "file": "updates/drv_davinci_intf_host.ko"},
            {"name": "drv_devmm_host", "size": 798720, "used_by": [], "license": "GPL v2",
             "version": drv, "file": "updates/drv_devmm_host.ko"},
        ]
    return mods


def loaded_modules(config: dict) -> list[dict]:
    overrides = _module_overrides()
    unloaded = set(config.get("modules_unloaded", []))
    out = []
    for mod in known_modules(config):
        loaded = overrides.get(mod["name"], mod["name"] not in unloaded)
        if loaded:
            out.append(mod)
    names = {m["name"] for m in out}
    for mod in out:
        mod["used_by"] = [h for h in mod["used_by"] if h in names]
    return out


def kernel_release() -> str:
    return os.uname().release


# ---------------------------------------------------------------- misc

def die(msg: str, code: int = 1) -> NoReturn:
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.exit(code)


def tool_missing(config: dict, tool: str) -> bool:
    return tool in config.get("tools_missing", [])


def command_not_found(tool: str) -> NoReturn:
    """Behave like a shell that cannot find the tool (exit 127)."""
    die(f"bash: {tool}: command not found", 127)


# ---------------------------------------------------------------- HTTP to the simulated outside

#: names the nodes' /etc/hosts map to the simulated outside
OUTSIDE_HOSTS = ("k3sim-outside", "registry-1.docker.io", "quay.io", "huggingface.co")


def net_errors() -> tuple[type[BaseException], ...]:
    """What a failed request raises (``except k.net_errors():``). http.client is imported on first use only: most
    runs of the simulated tools answer from local state, and its import is a third of a tool's start-up here."""
    import http.client

    return (OSError, http.client.HTTPException)


def http_open(url: str, method: str = "GET", headers: dict | None = None,
              timeout: float = 30.0) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
    """Send one request; returns the response (headers read, body not) and its connection (close it when done).

    The simulation speaks plain HTTP whatever the scheme (no TLS): to the URL's port, else 80. Raises OSError when
    nothing answers (``socket.gaierror`` for an unknown name)."""
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    host = u.hostname or ""
    addr, port = host, u.port or 80
    override = os.environ.get("K3SIM_OUTSIDE")
    if override and host in OUTSIDE_HOSTS:
        addr, _, p = override.rpartition(":")
        port = int(p)
    import http.client

    conn = http.client.HTTPConnection(addr, port, timeout=timeout)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    try:
        conn.request(method, path, headers={"Host": u.netloc, "User-Agent": "k3sim", **(headers or {})})
        return conn.getresponse(), conn
    except BaseException:
        conn.close()
        raise


def copy_body(resp: http.client.HTTPResponse, out: BinaryIO, want: int, hasher=None, chunk: int = 1 << 20) -> int:
    """Copy up to ``want`` body bytes to ``out`` (and ``hasher``); returns how many came (fewer: the stream broke)."""
    got = 0
    while got < want:
        try:
            block = resp.read(min(chunk, want - got))
        except net_errors():
            break
        if not block:
            break
        out.write(block)
        if hasher is not None:
            hasher.update(block)
        got += len(block)
    return got


def net_error(exc: BaseException, host: str, port: int = 80) -> str:
    """A connection failure as Go's net package words it (docker's daemon prints those)."""
    import socket

    if isinstance(exc, socket.gaierror):
        return f"dial tcp: lookup {host}: no such host"
    if isinstance(exc, ConnectionRefusedError):
        return f"dial tcp {host}:{port}: connect: connection refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"dial tcp {host}:{port}: i/o timeout"
    return f"dial tcp {host}:{port}: {getattr(exc, 'strerror', None) or exc}"


# ---------------------------------------------------------------- NCCL's network transport

#: the NCCL release the images carry (vllm/vllm-openai CUDA 13 builds)
NCCL_VERSION = "2.28.3"


def _ib_hca_filter(devs: list, setting: str) -> list:
    """The devices ``NCCL_IB_HCA`` selects: ``=name[:port],...`` exact, ``^...`` excluded, else name prefixes."""
    setting = setting.strip()
    if not setting:
        return devs
    exclude = setting.startswith("^")
    exact = setting.lstrip("^").startswith("=")
    names = [item.split(":")[0] for item in setting.lstrip("^").lstrip("=").split(",") if item.strip()]

    def hit(name: str) -> bool:
        return any(name == n if exact else name.startswith(n) for n in names)

    return [d for d in devs if hit(d["name"]) != exclude]


def nccl_net_lines(cfg: dict, env: dict, prefix: str, peer: str = "") -> tuple[list[str], tuple[str, str] | None]:
    """What NCCL 2.28 logs (``NCCL_DEBUG=INFO``) about its network transport between two nodes, from the node's fabric
    state, and the error it raises (``(exception type, message)``) when the transport cannot work; ``prefix`` is
    ``host:pid:tid [dev] NCCL INFO ``. Modelled on real logs: ``NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO];
    OOB ...``, ``NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'`` (NVIDIA/nccl#1537), ``... (no module)`` and
    ``Channel 00 : 0[1a000] -> 1[1a000] [receive] via NET/IB/0`` (NVIDIA/nccl#899), ``via NET/IB/0/GDRDMA`` and the
    DMA-BUF registration failure with errno 524 (NVIDIA/nccl#778, ai-dynamo/nixl#1854). An HCA that is not on the GPU
    fabric (a front-end/storage NIC: the peers are not reachable through it) fails the connection with the completion
    error NCCL prints for a transport retry timeout."""
    rdma = cfg.get("rdma") or []
    ib = [d for d in rdma if d["link_layer"] == "InfiniBand"]
    rdma = ib or rdma  # NCCL prefers the IB HCAs; RoCE-only nodes use their Ethernet ones
    rdma = [d for d in _ib_hca_filter(rdma, env.get("NCCL_IB_HCA", "")) if d.get("state", "").startswith("PORT_ACTIVE")]
    warn = prefix.replace("NCCL INFO", "NCCL WARN")
    ip = cfg.get("ip", "127.0.0.1")
    out: list[str] = []
    if env.get("NCCL_IB_DISABLE") == "1" or not rdma:
        out += [prefix + f"NET/Socket : Using [0]eth0:{ip}<0>", prefix + "Using network Socket",
                prefix + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
                prefix + "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"]
        return out, None
    kind = "RoCE" if rdma[0]["link_layer"] == "Ethernet" else "IB"
    devs = " ".join(f"[{i}]{d['name']}:1/{kind}" for i, d in enumerate(rdma))
    out += [prefix + f"NET/IB : Using {devs} [RO]; OOB eth0:{ip}<0>", prefix + "Using network IB"]
    off = [d for d in rdma if d.get("fabric") in ("storage", "front-end")]
    if off:
        d = off[0]
        out.append(warn + f"NET/IB : Got completion from peer {peer or '10.0.0.2'}<43715> with error 12, opcode 0, "
                          f"len 0, vendor err 129 (Send) localGid ::ffff:{ip} remoteGids ::ffff:{peer or '10.0.0.2'} "
                          f"hca {d['name']}")
        return out, ("torch.distributed.DistBackendError",
                     "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3690, remote process "
                     f"exited or there was a network error, NCCL version {NCCL_VERSION}\nncclRemoteError: A call "
                     "failed possibly due to a network error or a remote process exiting prematurely.\nLast error:\n"
                     "NET/IB : Got completion from peer with error 12, opcode 0, len 0, vendor err 129 (Send)")
    dmabuf_on = env.get("NCCL_DMABUF_ENABLE", "1") != "0"
    peermem = any(m["name"] == "nvidia_peermem" for m in loaded_modules(cfg))
    hca = rdma[0]["name"]
    if dmabuf_on and cfg.get("dmabuf"):
        out += [prefix + "DMA-BUF is available on GPU device 0",
                prefix + f"NET/IB : GPU Direct RDMA (DMABUF) enabled for HCA 0 '{hca}'",
                prefix + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
                prefix + "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA"]
        return out, None
    if dmabuf_on:
        out += [warn + f"NET/IB : mlx5dv_reg_dmabuf_mr failed: Unknown error 524 (errno 524) on HCA '{hca}'. Perhaps "
                       "your IB driver version is too old to support DMABUF? Try running with NCCL_DMABUF_ENABLE=0",
                prefix + "transport/net.cc:1023 -> 2"]
        return out, ("torch.distributed.DistBackendError",
                     "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3690, unhandled system "
                     f"error (run with NCCL_DEBUG=INFO for details), NCCL version {NCCL_VERSION}\nncclSystemError: "
                     "System call (e.g. socket, malloc) or external library call failed or device error.\nLast error:\n"
                     "mlx5dv_reg_dmabuf_mr failed: errno 524")
    if peermem:
        out += [prefix + f"NET/IB : GPU Direct RDMA Enabled for HCA 0 '{hca}'",
                prefix + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
                prefix + "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA"]
        return out, None
    out += [prefix + f"NET/IB : GPU Direct RDMA Disabled for HCA 0 '{hca}' (no module)",
            prefix + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0",
            prefix + "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0"]
    return out, None
