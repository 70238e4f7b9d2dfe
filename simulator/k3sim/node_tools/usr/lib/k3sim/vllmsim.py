"""Simulated vLLM 0.33.0 engine: ``engine.py [serve] MODEL [--flags ...]`` runs it.

Reads the real ``vllm serve`` argv and reproduces what a deploy tool can observe of vLLM:

- ``--nnodes`` ranks rendezvous at ``--master-addr:--master-port`` (torch TCPStore); rank 0 waits for
  every rank up to the process-group timeout, other ranks retry connecting for that long;
- then, where a DP group spans nodes, its leader (rank 0 of the group) advertises its message queue on vLLM's
  ``get_ip()`` (``VLLM_HOST_IP``, else the address of the default route, else ``0.0.0.0``) and the group's other
  nodes connect to it there, retrying for ever as ZeroMQ does: a queue advertised on an address they cannot reach
  (``0.0.0.0``, a front-end network) leaves them waiting, and the head's API server times out
  (``VLLM_ENGINE_READY_TIMEOUT_S``);
- DP engines (``--data-parallel-address`` / ``--data-parallel-rpc-port``) say HELLO to the head and
  give up after the 5-minute handshake window; the head waits for every remote engine without bound;
- the API port is bound early but only listened on once the world has joined and weights are
  "loaded" (connection refused before); headless nodes serve no HTTP; hybrid-LB nodes serve their own;
- ``/health``, ``/ping``, ``/version``, ``/load``, ``/metrics``, ``/v1/models``, ``/v1/chat/completions``,
  ``/v1/completions`` (``stream: true`` as server-sent events), and what vllm-router 0.1.17 asks before routing:
  ``/v1/chat/completions/render``, ``/v1/completions/render`` (the request as token ids and sampling parameters),
  ``/tokenize``, ``/detokenize``;
- with ``--kv-transfer-config`` (NixlConnector), a request whose ``kv_transfer_params`` asks for a remote decode is
  answered with the parameters a decode instance reads the KV blocks with, as a prefill instance does;
- generation takes time: the first token after a prefill of the prompt, each next one :data:`TOKEN_SECONDS` later
  (a stream sends each token as it is made), all ``K3SIM_SLOWDOWN`` times slower when the engine's environment sets
  it (a slow new image or flag); ``/metrics`` shows, as vLLM 0.33 does, the histograms of time to first token and
  inter-token latency with vLLM's bucket edges (each token's simulated compute time, not the simulating machine's
  scheduling delays) and the finished requests by reason.

All timeouts are nominal vLLM/torch values multiplied by the node's ``time_scale``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import k3simlib as k
import vllmsim_answers
import vllmsim_caches
import vllmsim_metrics
import vllmsim_phases

VERSION = "0.33.0"
HANDSHAKE_TIMEOUT_MINS = 5
DEFAULT_PG_TIMEOUT_S = 600
DEFAULT_READY_TIMEOUT_S = 600

# flag -> (dest, type); type: int, float, str, bool (BooleanOptionalAction / store_true), list (nargs='+')
FLAGS = {
    "--model": ("model", str),
    "--host": ("host", str), "--port": ("port", int), "--uds": ("uds", str),
    "--served-model-name": ("served_model_name", list),
    "--api-key": ("api_key", str),
    "--tensor-parallel-size": ("tp", int), "-tp": ("tp", int),
    "--pipeline-parallel-size": ("pp", int), "-pp": ("pp", int),
    "--nnodes": ("nnodes", int), "-n": ("nnodes", int),
    "--node-rank": ("node_rank", int), "-r": ("node_rank", int),
    "--master-addr": ("master_addr", str), "--master-port": ("master_port", int),
    "--headless": ("headless", bool),
    "--api-server-count": ("api_server_count", int), "-asc": ("api_server_count", int),
    "--data-parallel-size": ("dp", int), "-dp": ("dp", int),
    "--data-parallel-size-local": ("dp_local", int), "-dpl": ("dp_local", int),
    "--data-parallel-rank": ("dp_rank", int), "-dpn": ("dp_rank", int),
    "--data-parallel-start-rank": ("dp_start", int), "-dpr": ("dp_start", int),
    "--data-parallel-address": ("dp_address", str), "-dpa": ("dp_address", str),
    "--data-parallel-rpc-port": ("dp_rpc_port", int), "-dpp": ("dp_rpc_port", int),
    "--data-parallel-backend": ("dp_backend", str), "-dpb": ("dp_backend", str),
    "--data-parallel-hybrid-lb": ("hybrid_lb", bool), "-dph": ("hybrid_lb", bool),
    "--data-parallel-external-lb": ("external_lb", bool), "-dpe": ("external_lb", bool),
    "--data-parallel-multi-port-external-lb": ("multi_port_lb", bool), "-dpm": ("multi_port_lb", bool),
    "--enable-expert-parallel": ("ep", bool), "-ep": ("ep", bool),
    "--distributed-timeout-seconds": ("pg_timeout", int),
    "--distributed-executor-backend": ("executor", str),
    "--decode-context-parallel-size": ("dcp", int), "-dcp": ("dcp", int),
    "--max-model-len": ("max_model_len", str),
    "--moe-backend": ("moe_backend", str),
    "--attention-backend": ("attention_backend", str),
    "--kv-cache-dtype": ("kv_cache_dtype", str),
    "--kv-transfer-config": ("kv_transfer_config", str),
    "--trust-remote-code": ("trust_remote_code", bool),
    "--enable-auto-tool-choice": ("enable_auto_tool_choice", bool),
    "--tool-call-parser": ("tool_call_parser", str),
    "--reasoning-parser": ("reasoning_parser", str),
    "--fail-on-environ-validation": ("fail_on_environ_validation", bool),
}
# boolean flags the simulation does not interpret (so that they never swallow the next token)
OTHER_BOOLS = {
    "--language-model-only", "--enable-prefix-caching", "--disable-custom-all-reduce", "--enforce-eager",
    "--disable-log-requests", "--disable-log-stats", "--enable-chunked-prefill", "--grpc",
    "--enable-flashinfer-autotune", "--disable-hybrid-kv-cache-manager", "--enable-log-requests",
    "--disable-uvicorn-access-log", "--enable-sleep-mode", "--async-scheduling", "--enable-dbo",
    "--enable-eplb", "--enable-return-routed-experts", "--skip-tokenizer-init", "--enable-lora",
    "--disable-frontend-multiprocessing", "--enable-request-id-headers", "--enable-prompt-tokens-details",
    "--enable-force-include-usage", "--enable-server-load-tracking", "--safetensors-load-strategy-eager",
}
KNOWN_VLLM_ENV = {
    "VLLM_ENGINE_READY_TIMEOUT_S", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "VLLM_USE_V2_MODEL_RUNNER",
    "VLLM_ALLREDUCE_USE_FLASHINFER", "VLLM_USE_RUST_FRONTEND", "VLLM_USE_BREAKABLE_CUDAGRAPH",
    "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT", "VLLM_SSM_CONV_STATE_LAYOUT", "VLLM_NIXL_SIDE_CHANNEL_HOST",
    "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_USE_DIRECT_DCP_A2A", "VLLM_USE_DIRECT_DCP_Q_GATHER",
    "VLLM_USE_DIRECT_DCP_KV_GATHER", "VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MOE",
    "VLLM_ROCM_USE_AITER_MOE_SITUV2", "VLLM_HOST_IP", "VLLM_CACHE_ROOT", "VLLM_USE_MODELSCOPE",
    "VLLM_GPU_NIC_PCIE_MAPPING", "VLLM_NIC_SELECTION_VARS", "VLLM_API_KEY", "VLLM_LOGGING_LEVEL",
    "VLLM_PORT", "VLLM_RPC_BASE_PATH", "VLLM_USE_NCCL_SYMM_MEM", "VLLM_DP_RANK", "VLLM_DP_SIZE",
    "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT", "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_CONFIGURE_LOGGING", "VLLM_ATTENTION_BACKEND", "VLLM_USE_DEEP_GEMM", "VLLM_ALL2ALL_BACKEND",
    "VLLM_MOE_DP_CHUNK_SIZE", "VLLM_SERVER_DEV_MODE", "VLLM_TORCH_PROFILER_DIR", "VLLM_NO_USAGE_STATS",
    "VLLM_DO_NOT_TRACK", "VLLM_USAGE_SOURCE", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "VLLM_ENABLE_V1_MULTIPROCESSING",
}


class UsageError(Exception):
    pass


def _host_path(container_path: str) -> str:
    """Where a container path lives on the node, through the container's bind mounts (longest first)."""
    mounts = []
    for spec in json.loads(os.environ.get("K3SIM_VOLUMES", "[]")):
        src, _, rest = spec.partition(":")
        mounts.append((rest.split(":")[0].rstrip("/"), src))
    for dst, src in sorted(mounts, key=lambda m: -len(m[0])):
        if dst and (container_path == dst or container_path.startswith(dst + "/")):
            return src + container_path[len(dst):]
    return container_path


def missing_shard(model: str) -> str | None:
    """The first shard that the index of the served model's snapshot names and that is not there (a dangling link
    counts as missing), as vLLM's loader would open it; None when all are there, or when there is no snapshot to
    check (weights not staged in a mounted cache: nothing is checked then).

    The snapshot: ``MODEL`` itself when it is a directory (a local path), else ``refs/main`` of the model in the
    Hugging Face cache: ``HF_HUB_CACHE``, ``HF_HOME/hub`` or ``~/.cache/huggingface/hub`` of the container, seen
    through its bind mounts (so only a mounted cache is found)."""
    mounted = [spec.partition(":")[2].split(":")[0].rstrip("/")
               for spec in json.loads(os.environ.get("K3SIM_VOLUMES", "[]"))]
    if model.startswith("/"):
        if not any(model == m or model.startswith(m + "/") for m in mounted if m):
            return None
        snap = _host_path(model)
    else:
        hub = os.environ.get("HF_HUB_CACHE") or os.path.join(os.environ.get("HF_HOME") or "/root/.cache/huggingface",
                                                               "hub")
        if not any(hub == m or hub.startswith(m + "/") for m in mounted if m):
            return None
        base = os.path.join(_host_path(hub), "models--" + model.replace("/", "--"))
        try:
            with open(os.path.join(base, "refs", "main")) as fh:
                snap = os.path.join(base, "snapshots", fh.read().strip())
        except OSError:
            return None
    try:
        with open(os.path.join(snap, "model.safetensors.index.json")) as fh:
            shards = sorted(set(json.load(fh).get("weight_map", {}).values()))
    except (OSError, ValueError, AttributeError):
        return None
    for name in shards:
        if not os.path.exists(os.path.join(snap, name)):
            return os.path.join(snap, name)
    return None


class EngineFailure(Exception):
    """Exit 1 after printing this exception as the last traceback line."""

    def __init__(self, exc_type: str, message: str, lines: list[str] | None = None):
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        self.lines = lines or []


# ----------------------------------------------------------------------------- logging

_log_lock = threading.RLock()   # re-entrant: the SIGTERM handler logs from the main thread


def log(level: str, where: str, msg: str) -> None:
    line = f"{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}"
    with _log_lock:
        stream = sys.stderr if level in ("ERROR", "WARNING") else sys.stdout
        stream.write(line + "\n")
        stream.flush()


def print_failure(exc: EngineFailure) -> None:
    with _log_lock:
        sys.stdout.flush()
        for line in exc.lines:
            sys.stderr.write(line + "\n")
        sys.stderr.write("Traceback (most recent call last):\n"
                         '  File "/usr/local/bin/vllm", line 10, in <module>\n'
                         "    sys.exit(main())\n"
                         '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/cli/main.py", '
                         "line 75, in main\n    args.dispatch_function(args)\n")
        sys.stderr.write(f"{exc.exc_type}: {exc.message}\n")
        sys.stderr.flush()


# ----------------------------------------------------------------------------- argv

def parse_args(argv: list[str]) -> tuple[dict, list[str]]:
    args: dict = {"model": None, "host": None, "port": 8000, "tp": 1, "pp": 1, "nnodes": 1, "node_rank": 0,
                  "master_addr": "127.0.0.1", "master_port": 29501, "headless": False, "dp": 1,
                  "dp_local": None, "dp_rank": None, "dp_start": None, "dp_address": None,
                  "dp_rpc_port": 29550, "hybrid_lb": False, "external_lb": False, "ep": False,
                  "pg_timeout": None, "served_model_name": None, "api_key": None, "max_model_len": None,
                  "dcp": 1, "api_server_count": None}
    unknown: list[str] = []
    if argv and argv[0] == "serve":
        argv = argv[1:]
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("-") or tok == "-":
            if args["model"] is None:
                args["model"] = tok
            else:
                raise UsageError(f"unrecognized arguments: {tok}")
            i += 1
            continue
        name, eq, inline = tok.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        negated = False
        if name.startswith("--no-") and "--" + name[5:] in FLAGS and FLAGS["--" + name[5:]][1] is bool:
            name, negated = "--" + name[5:], True
        spec = FLAGS.get(name)
        if spec is None:  # not interpreted here; dotted config keys (--x.y v) take a value too
            takes_value = not (name in OTHER_BOOLS or name.startswith("--no-"))
            if eq or not takes_value:
                unknown.append(tok)
                i += 1
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                unknown.append(f"{tok} {argv[i + 1]}")
                i += 2
            else:
                unknown.append(tok)
                i += 1
            continue
        dest, typ = spec
        name = "/".join(n for n, sp in FLAGS.items() if sp[0] == dest)  # argparse shows every alias
        if typ is bool:
            if eq:
                raise UsageError(f"argument {name}: ignored explicit argument '{inline}'")
            args[dest] = not negated
            i += 1
            continue
        if typ is list:
            vals = [inline] if eq else []
            j = i + 1
            while not eq and j < len(argv) and not argv[j].startswith("-"):
                vals.append(argv[j])
                j += 1
            if not vals:
                raise UsageError(f"argument {name}: expected at least one argument")
            args[dest] = vals
            i = j if not eq else i + 1
            continue
        if eq:
            raw = inline
            i += 1
        else:
            if i + 1 >= len(argv):
                raise UsageError(f"argument {name}: expected one argument")
            raw = argv[i + 1]
            i += 2
        if typ is int:
            try:
                args[dest] = int(raw)
            except ValueError:
                raise UsageError(f"argument {name}: invalid int value: '{raw}'") from None
        else:
            args[dest] = raw
    if args["model"] is None:
        args["model"] = "Qwen/Qwen3-0.6B"
    return args, unknown


def parse_len(text: str | None) -> int:
    if not text:
        return 1048576
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        mult, t = 1024, t[:-1]
    elif t.endswith("m"):
        mult, t = 1024 * 1024, t[:-1]
    try:
        return int(float(t) * mult)
    except ValueError:
        return 1048576


# ----------------------------------------------------------------------------- the node's address

def get_ip(env: dict) -> str:
    """vLLM's ``get_ip()`` (``vllm/utils/network_utils.py``): ``VLLM_HOST_IP``, else the source address of the
    route to a public address (a UDP socket's connect: nothing is sent), IPv4 then IPv6, else ``0.0.0.0`` with a
    warning. So without ``VLLM_HOST_IP`` it is the address of the default route's interface."""
    if "HOST_IP" in env and "VLLM_HOST_IP" not in env:
        log("WARNING", "network_utils.py:52", "The environment variable HOST_IP is deprecated and ignored, as it is "
            "often used by Docker and other software to interact with the container's network stack. Please use "
            "VLLM_HOST_IP instead to set the IP address for vLLM processes to communicate with each other.")
    host_ip = env.get("VLLM_HOST_IP", "")
    if host_ip:
        return host_ip
    for family, target in ((socket.AF_INET, ("8.8.8.8", 80)), (socket.AF_INET6, ("2001:4860:4860::8888", 80))):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(target)  # Doesn't need to be reachable
                return str(s.getsockname()[0])
        except OSError:
            pass
    with _log_lock:
        sys.stderr.write("/usr/local/lib/python3.12/dist-packages/vllm/utils/network_utils.py:79: UserWarning: "
                         "Failed to get the IP address, using 0.0.0.0 by default.The value can be set by the "
                         "environment variable VLLM_HOST_IP or HOST_IP.\n")
        sys.stderr.flush()
    return "0.0.0.0"


# ----------------------------------------------------------------------------- the engine

class Engine:
    def __init__(self, cfg: dict, args: dict, env: dict):
        self.cfg = cfg
        self.a = args
        self.env = env
        self.node = cfg.get("name") or socket.gethostname()
        self.scale = float(cfg.get("time_scale", 1.0))
        self.stop = threading.Event()
        self.failed: EngineFailure | None = None
        self.dead = False
        self.ready = False
        self.listen_sock: socket.socket | None = None
        self.httpd: ThreadingHTTPServer | None = None
        self.peer_socks: list[socket.socket] = []
        self.served = (args["served_model_name"] or [args["model"]])
        self.started = int(time.time())
        self.requests = 0
        self.running = 0          # requests being generated (vllm:num_requests_running)
        self.lock = threading.Lock()
        self.metrics = vllmsim_metrics.RankMetrics(args, TTFT_BUCKETS, ITL_BUCKETS,
                                                   int(env.get("K3SIM_KV_TOKENS") or vllmsim_metrics.KV_TOKENS))
        self.slowdown = slowdown(env)
        self.unknown: list[str] = []    # the flags the simulation does not interpret (part of the compile hash)
        try:
            kv = json.loads(args.get("kv_transfer_config") or "null")
        except ValueError:
            kv = None
        self.kv = kv if isinstance(kv, dict) else None
        self.engine_id = str((self.kv or {}).get("engine_id") or uuid.uuid4())

    # -- small utilities
    def s(self, nominal: float) -> float:
        """A nominal vLLM/torch timeout in simulated seconds (``timeout_scale``: the time scale, stretched when many
        nodes share the simulating machine's CPUs, so a join is not timed out by the simulation's own load)."""
        return nominal * float(self.cfg.get("timeout_scale", self.scale))

    def fail(self, exc_type: str, message: str, lines: list[str] | None = None) -> None:
        if self.failed is None:
            self.failed = EngineFailure(exc_type, message, lines)
        self.stop.set()

    def sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; True when the full time passed."""
        return not self.stop.wait(max(0.0, seconds))

    # -- topology
    def topology(self) -> None:
        a = self.a
        self.world = a["tp"] * a["pp"] * a["dp"]
        self.torch_mode = a["nnodes"] > 1
        self.dp_mode = not self.torch_mode and a["dp"] > 1 and (
            a["dp_local"] is not None and a["dp_local"] < a["dp"] or a["dp_start"] not in (None, 0)
            or a["dp_rank"] is not None)
        if a["hybrid_lb"] and a["headless"]:
            raise EngineFailure("ValueError", "data_parallel_hybrid_lb is not applicable in headless mode")
        if a["hybrid_lb"] and a["external_lb"]:
            raise EngineFailure("ValueError", "data_parallel_hybrid_lb and data_parallel_external_lb "
                                "cannot both be True.")
        if self.torch_mode:
            if self.world % a["nnodes"]:
                raise EngineFailure("ValueError", f"world_size ({self.world}) must be divisible by nnodes "
                                    f"({a['nnodes']}).")
            if not 0 <= a["node_rank"] < a["nnodes"]:
                raise EngineFailure("ValueError", f"node_rank ({a['node_rank']}) must be in [0, nnodes="
                                    f"{a['nnodes']}).")
            if a.get("dp_backend") not in (None, "mp"):
                raise EngineFailure("ValueError", "--nnodes > 1 requires --data-parallel-backend mp")
            self.local_gpus = self.world // a["nnodes"]
            self.is_head = a["node_rank"] == 0
            dp_local = max(1, self.local_gpus // (a["tp"] * a["pp"]))
            self.serves_http = self.is_head or (a["dp"] > 1 and not a["headless"])
            self.rdv_addr, self.rdv_port = a["master_addr"], a["master_port"]
            self.expected_peers = a["nnodes"] - 1
            self.dp_local = dp_local
            # vLLM: nnodes_within_dp nodes per DP group; node_rank_within_dp 0 leads it (its message queue)
            self.nnodes_within_dp = max(1, a["nnodes"] // a["dp"])
            self.mq_readers = self.nnodes_within_dp - 1 if a["node_rank"] % self.nnodes_within_dp == 0 else 0
        else:
            if a["hybrid_lb"] and a["dp_local"] is None:
                raise EngineFailure("ValueError", "--data-parallel-hybrid-lb requires --data-parallel-size-local")
            start = a["dp_start"] if a["dp_start"] is not None else (a["dp_rank"] or 0)
            if self.dp_mode:
                local = a["dp_local"] if a["dp_local"] is not None else (
                    1 if start or a["dp_rank"] is not None else a["dp"])
            else:
                local = a["dp"]
            self.dp_local = local
            self.dp_start = start
            self.local_gpus = a["tp"] * a["pp"] * local
            self.is_head = start == 0
            self.serves_http = not a["headless"]
            self.rdv_addr = a["dp_address"] or a["master_addr"]
            self.rdv_port = a["dp_rpc_port"]
            self.expected_remote_engines = a["dp"] - local if self.is_head else 0
            self.hybrid = a["hybrid_lb"] and 1 < local < a["dp"]
            self.external = a["external_lb"] or a["dp_rank"] is not None or (a["hybrid_lb"] and local == 1)
        if a["dcp"] > 1 and a["tp"] % a["dcp"]:
            raise EngineFailure("ValueError", f"tp_size={a['tp']} must be divisible by dcp_size={a['dcp']}")
        if a.get("moe_backend") == "deep_gemm_mega_moe" and not a["ep"]:
            raise EngineFailure("ValueError", "Kimi K3 MegaMoE requires expert parallel")

    def check_hardware(self) -> None:
        cfg = self.cfg
        platform = self.env.get("K3SIM_IMAGE_PLATFORM", "")
        vendor = cfg.get("vendor")
        want = {"cuda": "nvidia", "rocm": "amd", "npu": "ascend"}.get(platform)
        if want and want != vendor:
            raise EngineFailure("RuntimeError", "Failed to infer device type")
        have = cfg["gpu"]["count"]
        visible = self.env.get("K3SIM_GPUS_VISIBLE")
        if visible not in (None, ""):
            have = min(have, int(visible))
        if have == 0:
            raise EngineFailure("RuntimeError", "Failed to infer device type")
        if self.local_gpus > have:
            raise EngineFailure("ValueError", f"The number of required GPUs on this node ({self.local_gpus}) "
                                f"exceeds the number of available GPUs ({have}): check --tensor-parallel-size, "
                                "--pipeline-parallel-size and --data-parallel-size-local")
        ab = (self.a.get("attention_backend") or "").upper()
        cc = cfg["gpu"].get("compute_cap", "")
        if ab == "TOKENSPEED_MLA" and vendor == "nvidia" and not cc.startswith("10."):
            raise EngineFailure("ValueError", "Selected backend AttentionBackendEnum.TOKENSPEED_MLA is not valid "
                                "for this configuration. Reason: ['compute capability not supported']")

    # -- env
    def check_env(self) -> None:
        bad = sorted(k_ for k_ in self.env if k_.startswith("VLLM_") and k_ not in KNOWN_VLLM_ENV)
        for name in bad:
            log("WARNING", "interface.py:1469", f"Unknown vLLM environment variable detected: {name}")
        if bad and self.a.get("fail_on_environ_validation"):
            raise EngineFailure("ValueError", f"Unknown vLLM environment variable detected: {bad[0]}")

    # -- HTTP socket: bound early, listened on when ready
    def bind_http(self) -> None:
        if not self.serves_http:
            return
        host = self.a["host"] or "0.0.0.0"
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, self.a["port"]))
        except OSError as exc:
            sock.close()
            raise EngineFailure("OSError", f"[Errno {exc.errno}] {exc.strerror}: ('{host}', {self.a['port']})") from exc
        self.listen_sock = sock

    def start_http(self) -> None:
        if self.listen_sock is None:
            return
        host = self.a["host"] or "0.0.0.0"
        port = self.a["port"]
        log("INFO", "api_server.py:1890", "Supported tasks: ['generate']")
        log("INFO", "entry.py:137", f"Starting vLLM server on http://{host}:{port}")
        log("INFO", "launcher.py:190", "Available routes are:")
        for route, methods in (("/health", "GET"), ("/ping", "GET, POST"), ("/version", "GET"),
                               ("/v1/models", "GET"), ("/v1/chat/completions", "POST"),
                               ("/v1/completions", "POST"), ("/v1/chat/completions/render", "POST"),
                               ("/v1/completions/render", "POST"), ("/tokenize", "POST"), ("/detokenize", "POST"),
                               ("/metrics", "GET"), ("/load", "GET")):
            log("INFO", "launcher.py:198", f"Route: {route}, Methods: {methods}")
        engine = self

        class Handler(_Handler):
            eng = engine

        self.listen_sock.listen(128)
        httpd = ThreadingHTTPServer((host, port), Handler, bind_and_activate=False)
        httpd.socket.close()
        httpd.socket = self.listen_sock
        httpd.daemon_threads = True
        self.httpd = httpd
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        log("INFO", "server.py:62", f"Started server process [{os.getpid()}]")
        log("INFO", "on.py:48", "Waiting for application startup.")
        log("INFO", "on.py:62", "Application startup complete.")

    # -- rendezvous (head side)
    def serve_rendezvous(self) -> None:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((self.rdv_addr, self.rdv_port))
        except OSError as exc:
            srv.close()
            if self.torch_mode:
                raise EngineFailure("torch.distributed.DistNetworkError",
                                    f"The server socket has failed to listen on any local network address. "
                                    f"port: {self.rdv_port}, useIpv6: false, code: -{exc.errno}, name: "
                                    f"{exc.strerror}, message: address {self.rdv_addr}") from exc
            raise EngineFailure("zmq.error.ZMQError", f"{exc.strerror} (addr='tcp://{self.rdv_addr}:"
                                f"{self.rdv_port}')") from exc
        srv.listen(64)
        srv.settimeout(0.1)
        self.rdv_srv = srv
        self.peers: dict[str, dict] = {}
        self.peer_conns: dict[str, socket.socket] = {}
        self.world_done = threading.Event()
        self.loaded_peers: set[str] = set()
        self.peer_lock = threading.Lock()
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.rdv_srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._peer, args=(conn,), daemon=True).start()

    def _peer(self, conn: socket.socket) -> None:
        reader = LineReader(conn)
        try:
            line = reader.readline(None)
            if not line:
                conn.close()
                return
            hello = json.loads(line)
        except ValueError:
            conn.close()
            return
        err = self._check_peer(hello)
        if err:
            _send(conn, {"type": "error", "exc": err[0], "msg": err[1]})
            conn.close()
            if err[2]:
                self.fail(err[0], err[1])
            return
        key = hello["key"]
        with self.peer_lock:
            self.peers[key] = hello
            self.peer_conns[key] = conn
            self.peer_socks.append(conn)
            complete = self._world_complete()
        if self.torch_mode:
            log("INFO", "parallel_state.py:1871", f"rank(s) of node_rank={hello['node_rank']} joined from "
                f"{hello['name']} ({len(self.peers) + 1}/{self.a['nnodes']} nodes)")
        else:
            log("INFO", "utils.py:1440", f"Remote core engine(s) DP{hello['start']}..DP"
                f"{hello['start'] + hello['local'] - 1} connected from {hello['name']}")
        if complete:
            with self.peer_lock:
                for k_, p in self.peers.items():  # each with the queue address of its DP group's leader
                    _send(self.peer_conns[k_], {"type": "go", "mq": self._leader_mq(p["node_rank"])
                                                if self.torch_mode else None})
            self.world_done.set()
        # after the world formed: watch for the peer going away
        while not self.stop.is_set():
            line = reader.readline(None)
            if not line:
                if self.world_done.is_set() and not self.stop.is_set():
                    self.peer_lost(hello)
                elif not self.stop.is_set():
                    with self.peer_lock:
                        self.peers.pop(key, None)
                        self.peer_conns.pop(key, None)
                        if conn in self.peer_socks:
                            self.peer_socks.remove(conn)
                return
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("type") == "loaded":
                with self.peer_lock:
                    self.loaded_peers.add(key)
            elif msg.get("type") == "failed":
                self.peer_lost(hello, msg.get("msg"))
                return

    def _check_peer(self, hello: dict) -> tuple[str, str, bool] | None:
        a = self.a
        mode = "torch" if self.torch_mode else "dp"
        if hello.get("mode") != mode:
            return ("RuntimeError", f"peer {hello.get('name')} uses a different rendezvous ({hello.get('mode')})",
                    False)
        if self.torch_mode:
            if hello["world"] != self.world or hello["nnodes"] != a["nnodes"]:
                return ("RuntimeError", f"node {hello['name']} has world_size={hello['world']} nnodes="
                        f"{hello['nnodes']}, the head has world_size={self.world} nnodes={a['nnodes']}", True)
            if any(p["node_rank"] == hello["node_rank"] for p in self.peers.values()) or hello["node_rank"] == 0:
                return ("torch.distributed.DistStoreError", f"node_rank {hello['node_rank']} joined twice "
                        f"(from {hello['name']}): every node needs its own --node-rank", True)
            return None
        if hello["dp"] != a["dp"]:
            return ("RuntimeError", f"Remote engine data_parallel_size={hello['dp']} does not match the head's "
                    f"{a['dp']}", True)
        lb = self.hybrid or self.external
        if not lb and not hello["headless"]:
            return ("RuntimeError", f"Remote engine {hello['start']} must use --headless unless in external or "
                    "hybrid dp lb mode", True)
        if lb and hello["headless"]:
            return ("RuntimeError", f"Remote engine {hello['start']} must not use --headless in external or "
                    "hybrid dp lb mode", True)
        mine = set(range(0, self.dp_local))
        taken = set(mine)
        for p in self.peers.values():
            taken |= set(range(p["start"], p["start"] + p["local"]))
        theirs = set(range(hello["start"], hello["start"] + hello["local"]))
        if theirs & taken or max(theirs) >= a["dp"]:
            return ("RuntimeError", f"Remote engine ranks {sorted(theirs)} overlap ranks already started or "
                    f"exceed data_parallel_size={a['dp']}: every node needs a unique --data-parallel-start-rank",
                    True)
        return None

    def _world_complete(self) -> bool:
        if self.torch_mode:
            return len(self.peers) == self.expected_peers
        return sum(p["local"] for p in self.peers.values()) == self.expected_remote_engines

    def peer_lost(self, hello: dict, why: str | None = None) -> None:
        if self.stop.is_set():
            return
        self.dead = True
        if self.torch_mode:
            log("ERROR", "multiproc_executor.py:262", f"Worker proc(s) on node_rank={hello['node_rank']} "
                f"({hello['name']}) died unexpectedly{': ' + why if why else ''}, shutting down executor.")
            exc = ("RuntimeError", "NCCL error: remote process exited or there was a network error, "
                   "NCCL version 2.28.3 (ncclRemoteError)")
        else:
            log("ERROR", "core_client.py:612", f"Engine core proc DP{hello['start']} ({hello['name']}) died "
                "unexpectedly, shutting down client.")
            exc = ("vllm.v1.engine.exceptions.EngineDeadError", "EngineCore encountered an issue. See stack "
                   "trace (above) for the root cause.")
        threading.Thread(target=self._die_soon, args=exc, daemon=True).start()

    def _die_soon(self, exc_type: str, msg: str) -> None:
        time.sleep(0.5)  # /health answers 503 meanwhile
        self.fail(exc_type, msg)

    # -- rendezvous (worker side)
    def _connect_until(self, deadline: float, nominal: float):
        """Connect to the head's rendezvous port, retrying until ``deadline``; None when stopped meanwhile.

        Past the deadline it fails as vLLM does: torch's client-socket timeout (``--nnodes``) or the DP
        handshake's five-minute limit.
        """
        while not self.stop.is_set():
            try:
                return socket.create_connection((self.rdv_addr, self.rdv_port), timeout=0.5)
            except OSError:
                if time.monotonic() >= deadline:
                    if self.torch_mode:
                        raise EngineFailure("torch.distributed.DistNetworkError",
                                            f"The client socket has timed out after {int(nominal * 1000)}ms while "
                                            f"trying to connect to ({self.rdv_addr}, {self.rdv_port}).") from None
                    raise EngineFailure("RuntimeError", "Did not receive response from front-end process within "
                                        f"{HANDSHAKE_TIMEOUT_MINS} minutes") from None
                time.sleep(0.05)
        return None

    def join(self) -> None:
        a = self.a
        start = time.monotonic()
        if self.torch_mode:
            nominal = a["pg_timeout"] or DEFAULT_PG_TIMEOUT_S
        else:
            nominal = HANDSHAKE_TIMEOUT_MINS * 60
        deadline = start + self.s(nominal)
        hello = {"mode": "torch" if self.torch_mode else "dp", "name": self.node,
                 "key": f"{self.node}/{os.getpid()}", "headless": a["headless"], "dp": a["dp"],
                 "world": self.world, "nnodes": a["nnodes"], "node_rank": a["node_rank"],
                 "start": getattr(self, "dp_start", 0), "local": self.dp_local, "mq": getattr(self, "mq_addr", None)}
        sock = self._connect_until(deadline, nominal)
        if sock is None:
            return
        _send(sock, hello)
        reader = LineReader(sock)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                sock.close()
                if self.torch_mode:
                    raise EngineFailure("torch.distributed.DistStoreError",
                                        f"wait timeout after {int(nominal * 1000)}ms, keys: /default_pg/0//cuda//0")
                raise EngineFailure("RuntimeError", "Did not receive response from front-end process within "
                                    f"{HANDSHAKE_TIMEOUT_MINS} minutes")
            line = reader.readline(min(0.2, remaining))
            if line is None:  # nothing yet: a read timeout is not a lost head
                if self.stop.is_set():
                    return
                continue
            if not line:
                sock.close()
                time.sleep(0.05)
                # the head went away before the world formed: reconnect within the same window
                sock = self._connect_until(deadline, nominal)
                if sock is None:
                    return
                _send(sock, hello)
                reader = LineReader(sock)
                continue
            msg = json.loads(line)
            if msg["type"] == "error":
                raise EngineFailure(msg["exc"], msg["msg"])
            if msg["type"] == "go":
                self.mq_leader_addr = msg.get("mq")
                break
        self.head_sock = sock
        self.peer_socks.append(sock)
        threading.Thread(target=self._watch_head, args=(reader,), daemon=True).start()

    def _watch_head(self, reader: LineReader) -> None:
        while not self.stop.is_set():
            line = reader.readline(None)
            if not line:
                break
        if self.stop.is_set():
            return
        if self.torch_mode:
            log("ERROR", "multiproc_executor.py:712", "Lost the connection to the head node's message queue.")
            self.fail("RuntimeError", "NCCL error: remote process exited or there was a network error, NCCL "
                      "version 2.28.3 (ncclRemoteError)")
        else:
            # vLLM does not stop headless DP engines when the head dies (vllm#32136)
            log("WARNING", "core.py:1180", "Lost the connection to the DP front-end process; engine keeps running.")

    # -- NCCL transport (multi-node, NVIDIA)
    def nccl_init(self) -> None:
        cfg = self.cfg
        if cfg.get("vendor") != "nvidia":
            return
        debug = self.env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE")
        host = f"{self.node}:{os.getpid()}:{os.getpid()} [0] NCCL INFO "
        out, error = k.nccl_net_lines(cfg, self.env, host)
        out = [line.replace("0[0] -> 1[0]", "0[0] -> 8[0]").replace("1[0] -> 0[0]", "8[0] -> 0[0]") for line in out]
        if error is not None:
            raise EngineFailure(error[0], error[1], [line for line in out if "NCCL WARN" in line or "->" in line
                                                    and "Channel" not in line])
        if debug:
            with _log_lock:
                for line in out:
                    sys.stdout.write(line + "\n")
                sys.stdout.flush()

    # -- main flow
    def load_time(self) -> float:
        override = self.env.get("K3SIM_LOAD_SECONDS")
        base = float(override) if override not in (None, "") else float(self.cfg.get("load_seconds", 1.0))
        return base + float(self.cfg.get("engine", {}).get("extra_load_seconds", 0.0))

    def run(self) -> None:
        a = self.a
        self.t0 = time.monotonic()
        log("INFO", "utils.py:253", f"non-default args: {{'model': '{a['model']}', 'tensor_parallel_size': "
            f"{a['tp']}, 'data_parallel_size': {a['dp']}, 'nnodes': {a['nnodes']}, 'node_rank': {a['node_rank']}}}")
        self.topology()
        self.check_env()
        self.check_hardware()
        if self.cfg.get("engine", {}).get("crash"):
            self.sleep(min(2.0, max(0.2, self.load_time() / 4)))
            raise EngineFailure("RuntimeError", "Engine core initialization failed. See root cause above. "
                                "Failed core proc(s): {'EngineCore_DP0': 1}",
                                ["ERROR " + time.strftime("%m-%d %H:%M:%S") + " [core.py:866] EngineCore failed "
                                 "to start.",
                                 "Traceback (most recent call last):",
                                 '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", '
                                 "line 857, in run_engine_core",
                                 "    engine_core = EngineCoreProc(*args, **kwargs)",
                                 "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"])
        self.bind_http()
        remote = (self.torch_mode and a["nnodes"] > 1) or (self.dp_mode and (
            not self.is_head or self.expected_remote_engines > 0))
        if self.torch_mode:
            if a["node_rank"] % self.nnodes_within_dp == 0:
                self.mq_ip = get_ip(self.env)
                log("INFO", "multiproc_executor.py:168", f"DP group leader: node_rank={a['node_rank']}, "
                    f"node_rank_within_dp=0, master_addr={a['master_addr']}, mq_connect_ip={self.mq_ip} (local), "
                    f"world_size={self.world}, local_world_size={self.local_gpus}")
                if self.mq_readers:
                    self.open_mq()
            if not self.is_head:
                log("INFO", "serve.py:224", f"Launching vLLM (v{VERSION}) headless multiproc executor, with head "
                    f"node address {a['master_addr']}:{a['master_port']} for torch.distributed process group.")
        elif self.dp_mode and self.is_head:
            log("DEBUG", "utils.py:1412", f"Waiting for {self.dp_local} local, {self.expected_remote_engines} "
                "remote core engine proc(s) to connect/start.")
        if remote and self.is_head:
            self.serve_rendezvous()
            if self.torch_mode:
                if not self.world_done.wait(self.s(a["pg_timeout"] or DEFAULT_PG_TIMEOUT_S)):
                    if self.stop.is_set():
                        return
                    nominal = a["pg_timeout"] or DEFAULT_PG_TIMEOUT_S
                    raise EngineFailure("torch.distributed.DistStoreError",
                                        f"Timed out after {nominal + 1} seconds waiting for clients. "
                                        f"{len(self.peers) + 1}/{a['nnodes']} clients joined.")
            else:
                while not self.world_done.wait(0.1):  # no deadline (vllm#48031)
                    if self.stop.is_set():
                        return
        elif remote:
            self.join()
            if self.stop.is_set():
                return
        if remote:
            self.nccl_init()
        if remote and self.torch_mode:
            self.mq_ready()
            if self.stop.is_set():
                return
        # weight load / compile / graph capture
        missing = missing_shard(a["model"])
        if missing:
            raise EngineFailure("FileNotFoundError", f"[Errno 2] No such file or directory: '{missing}'")
        load = self.load_time()
        log("INFO", "gpu_model_runner.py:3120", f"Starting to load model {a['model']}...")
        ready_timeout = self.s(float(self.env.get("VLLM_ENGINE_READY_TIMEOUT_S") or DEFAULT_READY_TIMEOUT_S))
        waits_ready = self.serves_http and (self.is_head or not remote or self.dp_mode)
        if waits_ready and load > ready_timeout:
            if not self.sleep(ready_timeout):
                return
            raise self.ready_timeout()
        # weights, compile (the compile cache's hit or miss: vllmsim_caches), KV cache, graphs
        if not vllmsim_phases.load(self, load, log,
                                   lambda: vllmsim_caches.compile_phase(self, _host_path, log, VERSION)):
            return
        if remote and not self.is_head:
            _send(self.head_sock, {"type": "loaded"})
        if remote and self.is_head:
            while True:
                with self.peer_lock:
                    if len(self.loaded_peers) >= len(self.peers):
                        break
                if not self.sleep(0.05):
                    return
        log("INFO", "core.py:281", "init engine (profile, create kv cache, warmup model) took "
            f"{load:.2f} seconds")
        self.ready = True
        self.start_http()
        if not self.serves_http:
            log("INFO", "core.py:1130", "Engine core is ready; this node serves no API (headless).")
        self.stop.wait()

    def ready_timeout(self) -> EngineFailure:
        nominal = int(float(self.env.get("VLLM_ENGINE_READY_TIMEOUT_S") or DEFAULT_READY_TIMEOUT_S))
        return EngineFailure("TimeoutError", "Timed out waiting for engine core processes to start. This is "
                             "often caused by slow weight loading for large models. Waited "
                             f"{nominal}s (configured by VLLM_ENGINE_READY_TIMEOUT_S). To increase the timeout, "
                             "set the environment variable: VLLM_ENGINE_READY_TIMEOUT_S=<seconds>")

    # -- the DP group's message queue (vLLM: MultiprocExecutor's rpc_broadcast_mq, a ZeroMQ XPUB for remote readers)
    def open_mq(self) -> None:
        """Bind the queue for the group's other nodes on ``get_ip()``, as ``MessageQueue`` binds
        ``tcp://{connect_ip}:{port}`` and hands that address to the readers."""
        ip = self.mq_ip
        with socket.socket() as probe:  # get_open_port()
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((ip, port))
        except OSError as exc:
            srv.close()
            raise EngineFailure("zmq.error.ZMQError", f"{exc.strerror} (addr='tcp://{ip}:{port}')") from exc
        srv.listen(64)
        srv.settimeout(0.1)
        self.mq_srv = srv
        self.mq_addr = f"{ip}:{port}"
        self.mq_subscribers = 0
        threading.Thread(target=self._mq_accept, daemon=True).start()

    def _mq_accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.mq_srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.peer_socks.append(conn)
                self.mq_subscribers += 1

    def _leader_mq(self, node_rank: int) -> str | None:
        """The queue address the leader of ``node_rank``'s DP group advertised (head side)."""
        leader = node_rank - node_rank % self.nnodes_within_dp
        if leader == node_rank:
            return None
        if leader == 0:
            return getattr(self, "mq_addr", None)
        return next((p.get("mq") for p in self.peers.values() if p["node_rank"] == leader), None)

    def mq_ready(self) -> None:
        """``MessageQueue.wait_until_ready``: a leader waits for every reader of its group to subscribe (the head
        until its API server's ready timeout), a reader connects to its leader's advertised address for ever."""
        if self.mq_readers:
            deadline = self.t0 + self.s(float(self.env.get("VLLM_ENGINE_READY_TIMEOUT_S") or DEFAULT_READY_TIMEOUT_S))
            while self.mq_subscribers < self.mq_readers:
                if self.is_head and time.monotonic() >= deadline:
                    raise self.ready_timeout()
                if not self.sleep(0.05):
                    return
            return
        addr = getattr(self, "mq_leader_addr", None)
        if not addr:
            return
        host, _, port = addr.rpartition(":")
        while not self.stop.is_set():
            if host not in ("0.0.0.0", "::", ""):  # the unspecified address is this node: no leader's queue here
                try:
                    sock = socket.create_connection((host, int(port)), timeout=0.5)
                except OSError:
                    pass
                else:
                    self.peer_socks.append(sock)
                    return
            self.sleep(0.2)

    def shutdown(self) -> None:
        for s in self.peer_socks:
            try:
                s.close()
            except OSError:
                pass
        if self.httpd is not None:
            self.httpd.shutdown()
        if self.listen_sock is not None:
            self.listen_sock.close()


class LineReader:
    """Newline-framed messages from a socket. A read timeout is "nothing yet" (None), never a lost peer: only an
    orderly close or a connection error ends the stream (b"")."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def readline(self, timeout: float | None) -> bytes | None:
        while b"\n" not in self.buf:
            try:
                self.sock.settimeout(timeout)
                chunk = self.sock.recv(4096)
            except TimeoutError:
                return None
            except OSError:
                return b""
            if not chunk:
                return b""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line + b"\n"


def _send(sock: socket.socket, obj: dict) -> None:
    try:
        sock.sendall((json.dumps(obj) + "\n").encode())
    except OSError:
        pass


# ----------------------------------------------------------------------------- HTTP

#: seconds each generated token takes (a completion of the answer below is in flight for ~0.3 s)
TOKEN_SECONDS = 0.02
#: seconds of prefill per prompt token, before the first token (which takes TOKEN_SECONDS itself)
PREFILL_SECONDS_PER_TOKEN = 0.0001
#: vLLM's bucket edges (vllm/v1/metrics/loggers.py): time to first token, inter-token latency
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)


def slowdown(env: dict) -> float:
    """``K3SIM_SLOWDOWN=F``: every token F times slower (1 when unset or not a positive number)."""
    try:
        value = float(env.get("K3SIM_SLOWDOWN") or 1)
    except ValueError:
        return 1.0
    return value if value > 0 else 1.0


ANSWER = "Hello from {node}: this is {model} (simulated vLLM {version}) answering your request."
POST_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/chat/completions/render", "/v1/completions/render",
               "/tokenize", "/detokenize")
VOCAB = 163840


def token_ids(text: str, chat: bool) -> list[int]:
    """Deterministic stand-in token ids: one per word (a chat prompt framed by the template's start/end ids)."""
    ids = [zlib.crc32(w.encode()) % (VOCAB - 1000) + 1000 for w in text.split()]
    return [163584, *ids, 163585] if chat else (ids or [0])


class _Handler(BaseHTTPRequestHandler):
    eng: Engine
    protocol_version = "HTTP/1.0"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt: str, *args) -> None:  # uvicorn-style access log
        with _log_lock:
            code = str(args[1]) if len(args) > 1 else ""
            phrase = self.responses.get(int(code), ("",))[0] if code.isdigit() else ""
            sys.stdout.write(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" '
                             f"{code} {phrase}\n")
            sys.stdout.flush()

    def _json(self, code: int, obj, headers: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        for h, v in (headers or {}).items():
            self.send_header(h, v)
        self.end_headers()
        self.wfile.write(body)

    def _empty(self, code: int) -> None:
        self.send_response(code)
        self.send_header("content-length", "0")
        self.end_headers()

    def _error(self, code: int, etype: str, message: str, param=None) -> None:
        self._json(code, {"error": {"message": message, "type": etype, "param": param, "code": code}})

    def _auth_ok(self) -> bool:
        key = (self.eng.cfg.get("engine", {}).get("api_key") or self.eng.a.get("api_key")
               or self.eng.env.get("VLLM_API_KEY"))
        if not key:
            return True
        path = self.path.split("?")[0]
        if not path.startswith(("/v1", "/v2", "/inference", "/cohere")):
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    def _health(self) -> None:
        self._empty(503 if self.eng.dead else 200)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        eng = self.eng
        if not self._auth_ok():
            return
        if path in ("/health", "/ping"):
            self._health()
        elif path == "/version":
            self._json(200, {"version": VERSION})
        elif path == "/load":
            self._json(200, {"server_load": 0})
        elif path == "/metrics":
            body = eng.metrics.text(eng.served[0], eng.running).encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif path == "/v1/models":
            data = [{"id": name, "object": "model", "created": eng.started, "owned_by": "vllm",
                     "root": eng.a["model"], "parent": None, "max_model_len": parse_len(eng.a["max_model_len"]),
                     "permission": [{"id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_URL, name).hex}",
                                     "object": "model_permission", "created": eng.started, "allow_create_engine":
                                     False, "allow_sampling": True, "allow_logprobs": True,
                                     "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                                     "organization": "*", "group": None, "is_blocking": False}]}
                    for name in eng.served]
            self._json(200, {"object": "list", "data": data})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        if path == "/ping":
            return self._health()
        if not self._auth_ok():
            return
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path not in POST_ROUTES:
            return self._json(404, {"detail": "Not Found"})
        if self.eng.dead:
            return self._error(500, "InternalServerError", "EngineCore encountered an issue.")
        try:
            req = json.loads(raw or b"{}")
            if not isinstance(req, dict):
                raise ValueError
        except ValueError:
            return self._error(400, "BadRequestError", "Invalid JSON body")
        model = req.get("model")
        eng = self.eng
        if model is not None and model not in eng.served:
            return self._error(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
        if path == "/detokenize":
            ids = req.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                return self._error(400, "BadRequestError", "'tokens' must be a list of token ids", "tokens")
            return self._json(200, {"prompt": " ".join(f"<{t}>" for t in ids)})
        chat = path.startswith("/v1/chat/completions") or (path == "/tokenize" and "messages" in req)
        if chat:
            msgs = req.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return self._error(400, "BadRequestError", "'messages' must be a non-empty list", "messages")
            prompt_text = "\n".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        else:
            if "prompt" not in req:
                return self._error(400, "BadRequestError", "'prompt' is required", "prompt")
            prompt_text = str(req["prompt"])
        prompt_ids = token_ids(prompt_text, chat)
        limit = req.get("max_completion_tokens") or req.get("max_tokens")
        if isinstance(limit, int) and limit < 1:
            return self._error(400, "BadRequestError", "max_tokens must be at least 1", "max_tokens")
        if path == "/tokenize":
            return self._json(200, {"count": len(prompt_ids), "max_model_len": parse_len(eng.a["max_model_len"]),
                                    "tokens": prompt_ids, "token_strs": None})
        if path.endswith("/render"):
            return self._render(req, prompt_ids, chat)
        prompt_words = len(prompt_text.split())
        words = ANSWER.format(node=eng.node, model=eng.served[0], version=VERSION).split()
        if chat:   # the correctness probe's questions, fault wrong-output (vllmsim_answers.py)
            words = vllmsim_answers.answer(prompt_text, eng.cfg.get("engine", {}), sys.argv, eng.env) or words
        finish = "stop"
        if isinstance(limit, int) and req.get("ignore_eos"):
            # no end of sequence: exactly max_tokens tokens (the answer, again and again)
            words, finish = [words[i % len(words)] for i in range(limit)], "length"
        elif isinstance(limit, int) and limit < len(words):
            words, finish = words[:limit], "length"
        kv_params = self._kv_transfer(req.get("kv_transfer_params"), len(prompt_ids))
        eng.requests += 1
        with eng.lock:
            eng.running += 1
        eng.metrics.admit(prompt_ids)
        # generation takes time: a request is in flight meanwhile, and an engine stopped then drops it, as vLLM does
        timing = Timing(ttft=eng.slowdown * (TOKEN_SECONDS + PREFILL_SECONDS_PER_TOKEN * len(prompt_ids)),
                        itl=eng.slowdown * TOKEN_SECONDS)
        try:
            if not req.get("stream"):
                time.sleep(timing.ttft + timing.itl * (len(words) - 1))
            self._answer(req, chat, model, words, finish, prompt_words, kv_params, timing)
        finally:
            with eng.lock:
                eng.running -= 1
        # each token's simulated compute time, as vLLM's histograms observe it
        eng.metrics.finished(timing.ttft, [timing.itl] * (len(words) - 1) if timing.done else [],
                             finish if timing.done else "abort")

    def _answer(self, req, chat, model, words, finish, prompt_words, kv_params, timing) -> None:
        eng = self.eng
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        name = model or eng.served[0]
        usage = {"prompt_tokens": prompt_words, "total_tokens": prompt_words + len(words),
                 "completion_tokens": len(words), "prompt_tokens_details": None}
        if req.get("stream"):
            return self._stream(rid, created, name, words, finish, chat, timing,
                                stream_usage(req.get("stream_options"), "--enable-force-include-usage" in sys.argv),
                                prompt_words)
        text = " ".join(words)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None,
                                              "annotations": None, "audio": None, "function_call": None,
                                              "tool_calls": [], "reasoning_content": None},
                      "logprobs": None, "finish_reason": finish, "stop_reason": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            obj = "text_completion"
        self._json(200, {"id": rid, "object": obj, "created": created, "model": name, "choices": [choice],
                         "service_tier": None, "system_fingerprint": None, "usage": usage,
                         "prompt_logprobs": None, "kv_transfer_params": kv_params})

    def _render(self, req: dict, prompt_ids: list[int], chat: bool) -> None:
        """``/v1/chat/completions/render`` (one GenerateRequest) and ``/v1/completions/render`` (a list of them):
        the request as the engine would run it, token ids and sampling parameters, generating nothing."""
        limit = req.get("max_completion_tokens") or req.get("max_tokens")
        max_model_len = parse_len(self.eng.a["max_model_len"])
        max_tokens = limit if isinstance(limit, int) else max(1, max_model_len - len(prompt_ids))
        params: dict = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                        "temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "stop": [], "stop_token_ids": [],
                        "max_tokens": max_tokens, "output_kind": 1 if req.get("stream") else 2,
                        "skip_clone": True, "bad_words": [], "skip_reading_prefix_cache": False}
        for key in ("temperature", "top_p", "top_k", "min_p", "seed", "n", "presence_penalty",
                    "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos"):
            if req.get(key) is not None and req.get(key) is not False:
                params[key] = req[key]
        kv = req.get("kv_transfer_params")
        base = self.headers.get("X-Request-Id") or req.get("request_id") or uuid.uuid4().hex
        gen = {"request_id": f"{'chatcmpl' if chat else 'cmpl'}-{base}", "token_ids": prompt_ids,
               "token_offsets": None, "features": None, "content_parts": None, "sampling_params": params,
               "model": req.get("model"), "reasoning_ended": None, "reasoning_parser_kwargs": None,
               "return_token_ids": None, "output_mode": "tokens", "parse_context": None,
               "stream": bool(req.get("stream")), "stream_options": req.get("stream_options") if req.get("stream")
               else None, "cache_salt": req.get("cache_salt"), "priority": req.get("priority") or 0,
               "kv_transfer_params": kv if isinstance(kv, dict) else None, "ec_transfer_params": None}
        self._json(200, gen if chat else [gen])

    def _kv_transfer(self, params, prompt_tokens: int):
        """NixlConnector (pull): a prefill asked for a remote decode answers where its KV blocks are; a decode given
        them "reads" them (logged) and answers none."""
        eng = self.eng
        if eng.kv is None or not isinstance(params, dict):
            return None
        if params.get("do_remote_prefill"):
            log("INFO", "nixl_connector.py:1420", f"Reading {len(sum(params.get('remote_block_ids') or [[]], []))} "
                f"KV blocks from engine {params.get('remote_engine_id')} at {params.get('remote_host')}:"
                f"{params.get('remote_port')} (request {params.get('remote_request_id')})")
            return None
        if not params.get("do_remote_decode"):
            return None
        blocks = max(1, -(-prompt_tokens // 16))
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": [list(range(1, blocks + 1))], "remote_engine_id": eng.engine_id,
                "remote_request_id": "chatcmpl-" + uuid.uuid4().hex,
                "remote_host": eng.env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
                "remote_port": int(eng.env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600") or 5600),
                "tp_size": eng.a.get("tp") or 1, "dcp_size": 1, "pp_size": eng.a.get("pp") or 1,
                "remote_num_tokens": prompt_tokens, "remote_blocks_expiry_time": None,
                "remote_registration_generation": 0, "transfer_mode": "pull"}

    def _stream(self, rid, created, name, words, finish, chat, timing, usage=(False, False), prompt_tokens=0) -> None:
        """Server-sent events, each token as it is made: the first after ``timing.ttft``, each next one
        ``timing.itl`` later. A client that goes away ends it (the request counts as aborted). ``usage``: whether
        a last chunk with the usage and no choice comes before ``[DONE]``, and whether every chunk carries the usage
        so far (:func:`stream_usage`), in vLLM 0.33's shapes (``chat_completion/serving.py``,
        ``completion/serving.py``: the last chunk ``{"id", "object", "created", "model", "choices": [], "usage"}``)."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.end_headers()
        obj = "chat.completion.chunk" if chat else "text_completion"
        include, continuous = usage

        def counted(done):
            out = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + done, "completion_tokens": done}
            return {**out, "completion_tokens_details": None} if chat else out

        def chunk(delta, fin=None, done=0):
            if chat:
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": fin}
            else:
                choice = {"index": 0, "text": delta.get("content", ""), "logprobs": None, "finish_reason": fin}
            data = {"id": rid, "object": obj, "created": created, "model": name, "choices": [choice]}
            if continuous:
                data["usage"] = counted(done)
            self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        try:
            self.wfile.flush()
            time.sleep(timing.ttft)
            if chat:
                chunk({"role": "assistant", "content": ""})
            for i, w in enumerate(words):
                if i:
                    time.sleep(timing.itl)
                chunk({"content": (" " if i else "") + w}, done=i + 1)
            chunk({}, finish, done=len(words))
            if include:
                last = {"id": rid, "object": obj, "created": created, "model": name, "choices": [],
                        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + len(words),
                                  "completion_tokens": len(words)}}
                self.wfile.write(f"data: {json.dumps(last)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            timing.done = False


def stream_usage(options, forced: bool) -> tuple[bool, bool]:
    """(a last usage chunk, the usage on every chunk) of a stream, as vLLM 0.33 decides it
    (``vllm/entrypoints/serve/utils/api_utils.py`` ``should_include_usage``): both with
    ``--enable-force-include-usage``; else ``stream_options.include_usage``, and ``continuous_usage_stats`` with it.

    >>> stream_usage(None, False), stream_usage({"include_usage": True}, False), stream_usage({}, True)
    ((False, False), (True, False), (True, True))
    >>> stream_usage({"continuous_usage_stats": True}, False)
    (False, False)
    """
    if forced:
        return True, True
    if not isinstance(options, dict):
        return False, False
    include = bool(options.get("include_usage"))
    return include, include and bool(options.get("continuous_usage_stats"))


class Timing:
    """How long one request's tokens take (seconds): the first (prefill included), each next one."""

    def __init__(self, ttft: float, itl: float) -> None:
        self.ttft, self.itl, self.done = ttft, itl, True


# ----------------------------------------------------------------------------- entry point

def main(argv: list[str]) -> int:
    cfg = k.load_config()
    env = dict(os.environ)
    try:
        args, unknown = parse_args(argv)
    except UsageError as exc:
        sys.stderr.write("usage: vllm serve [model_tag] [options]\n"
                         f"vllm serve: error: {exc}\n")
        return 2
    engine = Engine(cfg, args, env)
    engine.unknown = unknown

    # A stop sends several signals at once (Slurm's to every process of the step, docker's client forwarding its own,
    # docker stop's): a handler runs in the main thread between two bytecodes, so a second signal can interrupt the
    # first one's handler in the middle of its log line. The first signal alone stops and logs; the log lock is
    # re-entrant, and a write that re-enters the stream is dropped (a nested handler that waited on the log lock
    # deadlocked the engine: it then ran until docker stop's SIGKILL, 60 s later).
    signalled: list[int] = []

    def on_signal(signum, frame):
        if signalled:
            return
        signalled.append(signum)
        engine.stop.set()
        with contextlib.suppress(RuntimeError):   # "reentrant call inside <_io.BufferedWriter ...>"
            log("INFO", "launcher.py:121", "Shutting down FastAPI HTTP server.")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if unknown:
        log("INFO", "k3sim", "flags not interpreted by the simulation: " + " ".join(unknown))
    try:
        engine.run()
    except EngineFailure as exc:
        engine.failed = exc
    except Exception:  # a bug in the simulation: show it as such
        traceback.print_exc()
        engine.shutdown()
        return 1
    engine.shutdown()
    if engine.failed is not None:
        # tell the head (if any) why this rank stops
        head = getattr(engine, "head_sock", None)
        if head is not None:
            _send(head, {"type": "failed", "msg": engine.failed.message.splitlines()[0]})
        print_failure(engine.failed)
        return 1
    return 0

