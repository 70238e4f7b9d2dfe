"""The opt-in NCCL probe (``k3_nccl_probe``): before anything changes, a two-node NCCL all-reduce inside the plan's
image on the planned nodes, with ``NCCL_DEBUG=INFO``, and a check that NCCL's network transport uses GPUDirect RDMA.

Host facts can show what GPUDirect RDMA needs (kernel, open modules, mlx5 driver, ports), not whether a registration
works: an mlx5 kernel driver without DMA-BUF memory regions fails it with ``errno 524``, a missing peer-memory path
makes NCCL stage through host memory. NCCL's own log says what it uses: ``Channel 00/0 : 0[0] -> 1[0] [send] via
NET/IB/0/GDRDMA`` is GPUDirect RDMA; ``via NET/IB/0`` without ``/GDRDMA`` stages through host memory (with ``GPU
Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)`` before it); ``via NET/Socket`` is TCP.

The nodes are probed in pairs, every node once (an odd one out pairs again with the first node), each pair on its
own port, all pairs at once. Each side runs ``docker run --rm --pull never`` (the image must be on the node: the probe
pulls nothing) with the host's derived NCCL settings, ``NCCL_MNNVL_ENABLE=0`` (so trays of one NVLink domain talk
over the network too) and one GPU.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from k3deploy.facts.base import EXIT_MARK, FactError, K3Fact, split_exit
from k3deploy.facts.parallel import each_host
from k3deploy.preflight.base import CheckResult, HostFacts

CHECK = "nccl.probe"
#: seconds one probe container may run (rendezvous, NCCL init, one all-reduce)
PROBE_TIMEOUT_S = 240
#: the first pair's rendezvous port (pair i listens on BASE_PORT + i)
BASE_PORT = 29517
RESULT_MARK = "K3_PROBE_RESULT"

#: the all-reduce, run by the image's python with torch (env:// rendezvous from MASTER_ADDR/PORT, RANK, WORLD_SIZE)
SCRIPT = (
    "import torch, torch.distributed as dist\n"
    "torch.cuda.set_device(0)\n"
    "dist.init_process_group('nccl')\n"
    "x = torch.ones(1 << 24, device='cuda')\n"
    "dist.all_reduce(x)\n"
    "torch.cuda.synchronize()\n"
    f"print('{RESULT_MARK}', int(x[0].item()), flush=True)\n"
    "dist.destroy_process_group()\n"
)

_TRANSPORT_RE = re.compile(r"Channel \d+(?:/\d+)? : .*\bvia (NET/\S+|P2P/\S+|SHM/\S+)")
_WHY_RE = re.compile(r"(GPU Direct RDMA (?:Disabled|Enabled|\(DMABUF\) enabled)[^\n]*|"
                     r"\S*reg_dmabuf_mr failed[^\n]*|Got completion from peer[^\n]*)")


@dataclass(frozen=True)
class ProbeResult:
    """What one side of the probe saw: its exit status, NCCL's transport lines (``via NET/IB/0/GDRDMA``), the lines
    that say why (GPU Direct RDMA enabled/disabled, a failed registration), the all-reduce's sum, the last error."""

    exit_code: int | None
    transports: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    result: int | None = None
    error: str = ""

    @property
    def gdrdma(self) -> bool:
        net = [t for t in self.transports if t.startswith("NET/")]
        return bool(net) and all(t.startswith("NET/IB/") and t.endswith("/GDRDMA") for t in net)


def parse_probe(lines: list[str], status: int | None) -> ProbeResult:
    """One side's output (stdout and stderr of ``docker run``).

    >>> r = parse_probe(["n1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
    ...                  "K3_PROBE_RESULT 2"], 0)
    >>> r.gdrdma, r.transports, r.result
    (True, ['NET/IB/0/GDRDMA'], 2)
    >>> parse_probe(["x NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0"], 0).gdrdma
    False
    """
    transports: list[str] = []
    why: list[str] = []
    result = None
    error = ""
    for raw in lines:
        line = raw.strip()
        m = _TRANSPORT_RE.search(line)
        if m and m.group(1) not in transports:
            transports.append(m.group(1))
        w = _WHY_RE.search(line)
        if w and w.group(1) not in why:
            why.append(w.group(1))
        if line.startswith(RESULT_MARK):
            parts = line.split()
            result = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        if not error and (re.match(r"^[\w.]+(Error|Exception): ", line) or line.startswith("docker: ")):
            error = line[:300]  # the raised exception's first line (its message goes on: ncclSystemError ...)
    return ProbeResult(exit_code=status, transports=transports, why=why, result=result, error=error)


class NcclProbe(K3Fact[ProbeResult]):
    """One side of the two-node NCCL all-reduce, in the image (``docker run --rm --pull never``)."""

    tool = required_binary = "docker"
    hint = "the probe runs in the plan's image with docker"
    shown_command = "docker run --rm --pull never --gpus all --network host ... IMAGE (NCCL all-reduce)"

    def requires_command(self, *args: Any, **kwargs: Any) -> str | None:
        return str(kwargs.get("docker") or "docker").split()[0]

    def command(self, docker: str = "docker", image: str = "", rank: int = 0, master: str = "", port: int = 0,
                env: str = "", container: str = "k3-nccl-probe") -> str:
        # env: "KEY=VALUE\n..." (a string, so pyinfra can hash the fact's arguments)
        pairs = [line.split("=", 1) for line in env.splitlines() if "=" in line]
        flags = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in pairs)
        return (
            f"timeout {PROBE_TIMEOUT_S} {docker} run --rm --pull never --name {shlex.quote(container)} --gpus all "
            "--network host --ipc host --device /dev/infiniband --ulimit memlock=-1 "
            f"-e NCCL_DEBUG=INFO -e NCCL_DEBUG_SUBSYS=INIT,NET -e NCCL_MNNVL_ENABLE=0 "
            f"-e MASTER_ADDR={shlex.quote(master)} -e MASTER_PORT={port} -e RANK={rank} -e WORLD_SIZE=2 "
            f"-e LOCAL_RANK=0 {flags} --entrypoint python3 {shlex.quote(image)} -c {shlex.quote(SCRIPT)} 2>&1; "
            f"echo {EXIT_MARK}$?"
        )

    def process(self, output: list[str]) -> ProbeResult | FactError:  # type: ignore[override]
        lines, status = split_exit(output)
        return parse_probe(lines, status)


def pairs(hosts: list[str]) -> list[list[tuple[str, str]]]:
    """Rounds of (rank 0, rank 1) pairs covering every host once: ``a-b, c-d`` then, for an odd one out, ``a-e``.

    >>> pairs(["a", "b", "c", "d", "e"])
    [[('a', 'b'), ('c', 'd')], [('a', 'e')]]
    """
    first = [(hosts[i], hosts[i + 1]) for i in range(0, len(hosts) - 1, 2)]
    rounds = [first] if first else []
    if len(hosts) % 2 and len(hosts) > 1:
        rounds.append([(hosts[0], hosts[-1])])
    return rounds


PROBE_ENV = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DMABUF_ENABLE", "NCCL_IB_GID_INDEX",
             "NCCL_NET_GDR_LEVEL", "NCCL_IB_DISABLE")


def probe_env(env: dict[str, str]) -> str:
    """The host's derived settings the probe passes to NCCL (one ``KEY=VALUE`` a line)."""
    return "\n".join(f"{k}={env[k]}" for k in PROBE_ENV if k in env)


REQUIRED = "a two-node NCCL all-reduce in the image runs over NET/IB with GPUDirect RDMA (via NET/IB/<n>/GDRDMA)"


def judge(host: str, peer: str, result: ProbeResult | FactError) -> CheckResult:
    """The ``nccl.probe`` result of one side: observed (transport, why, error) against the requirement."""
    if isinstance(result, FactError):
        return CheckResult(host, CHECK, "fail", result.message(host), REQUIRED,
                           "install docker, or turn k3_nccl_probe off")
    seen = ", ".join(result.transports)
    # NCCL's warning names the HCA; the exception repeats it without: the one that names it first, whichever of
    # stdout and stderr came first
    why = sorted(result.why, key=lambda w: w.startswith("Got completion from peer") and " hca " not in w)
    detail = "; ".join(why[:1] if result.error else why[:2])
    if result.exit_code == 0 and result.result == 2 and result.gdrdma:
        shown = f"all-reduce with {peer} via {seen}" + (f" ({detail})" if detail else "")
        return CheckResult(host, CHECK, "pass", shown, REQUIRED)
    if "No such image" in result.error:
        return CheckResult(host, CHECK, "fail", f"the image is not on {host}: {result.error}", REQUIRED,
                           "the probe runs in the plan's image and pulls nothing: pull it on every node first "
                           "(docker pull IMAGE), or turn k3_nccl_probe off for the first rollout")
    if result.gdrdma and "remote process exited" in result.error:
        return CheckResult(host, CHECK, "warn", f"via {seen} here; the all-reduce failed on {peer} (see its result)",
                           REQUIRED, f"repair {peer}, then rerun preflight")
    observed = f"with {peer}: " + (f"via {seen}" if seen else "no NCCL transport set up") + (
        f"; {detail}" if detail else "")
    if result.exit_code == 124:
        observed += f"; no result within {PROBE_TIMEOUT_S} s (NCCL init hangs)"
    elif result.error:
        observed += f"; {result.error}"
    elif result.exit_code not in (0, None):
        observed += f"; exit {result.exit_code}"
    if any("reg_dmabuf_mr failed" in w for w in result.why):
        fix = ("the mlx5 kernel driver cannot register DMA-BUF memory (errno 524): update MLNX/DOCA-OFED or the "
               "kernel; on x86 the fallback is NCCL_DMABUF_ENABLE=0 with nvidia_peermem loaded (deprecated with "
               "CUDA 13); Grace trays need DMA-BUF")
    elif any("Got completion from peer" in w for w in result.why):
        fix = ("an HCA in NCCL_IB_HCA does not reach the peer (a front-end or storage NIC): name the GPU fabric's "
               "ports in k3_ib_hca")
    elif any("Socket" in t for t in result.transports):
        fix = "NCCL found no usable RDMA port: check the HCAs (ibv_devinfo), /dev/infiniband and k3_ib_hca"
    else:
        fix = ("NCCL stages through host memory: load the NVIDIA open kernel modules on kernel >= 5.12 (DMA-BUF), or "
               "on x86 modprobe nvidia-peermem; check NCCL_NET_GDR_LEVEL and the NIC's distance to the GPU "
               "(nvidia-smi topo -m)")
    return CheckResult(host, CHECK, "fail", observed, REQUIRED, fix)


def run_probe(state: Any, hosts: dict[str, Any], facts: list[HostFacts], env: dict[str, dict[str, str]],
              docker: str, image: str) -> list[CheckResult]:
    """Probe every reachable host in pairs (see the module docstring); one ``nccl.probe`` result per host."""
    from pyinfra.api.facts import get_fact

    names = [f.host for f in facts if f.unreachable is None and f.host in hosts]
    addresses = {f.host: f.address for f in facts}
    out: list[CheckResult] = []
    if len(names) < 2:
        return out
    for rnd in pairs(names):
        roles: dict[str, tuple[int, str, int, str]] = {}
        for i, (a, b) in enumerate(rnd):
            master = addresses.get(a) or str(hosts[a].data.get("ssh_hostname") or a)
            roles[a] = (0, master, BASE_PORT + i, b)
            roles[b] = (1, master, BASE_PORT + i, a)
        order = [h for h in names if h in roles]

        def one(h: Any, roles: dict[str, tuple[int, str, int, str]] = roles) -> ProbeResult | FactError:
            rank, master, port, _ = roles[h.name]
            kwargs = {"docker": docker, "image": image, "rank": rank, "master": master, "port": port,
                      "env": probe_env(env.get(h.name, {})), "container": f"k3-nccl-probe-{port}-{rank}"}
            try:
                value = get_fact(state, h, NcclProbe, kwargs=kwargs, apply_failed_hosts=False)
            except Exception as exc:  # a dropped connection: that side has no result
                return FactError(kind="failed", tool="docker", command=NcclProbe.shown_command,
                                 first_line=f"{type(exc).__name__}: {exc}"[:200])
            return value if value is not None else NcclProbe.default()

        results = each_host(state, [hosts[h] for h in order], one)
        for h, r in zip(order, results, strict=True):
            verdict = judge(h, roles[h][3], r)
            earlier = next((c for c in out if c.host == h), None)
            if earlier is None:
                out.append(verdict)
            elif earlier.status == "pass" and verdict.status != "pass":  # the first node's second pairing failed
                out[out.index(earlier)] = verdict
    return out
