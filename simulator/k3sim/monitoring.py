"""``k3deploy sim up --monitoring``: a real Prometheus on the control host, scraping the simulated cluster with the
configuration ``k3deploy export prometheus`` writes for its inventory (docs/monitoring.md).

The export goes to ``<state>/prometheus/`` and Prometheus (Debian's ``prometheus``, :data:`BINARY`) keeps its data
in ``<state>/prometheus/data``, listening on a free port of 127.0.0.1 (never the 9090 a system Prometheus may hold);
it starts once the cluster's inventory is written and stops with the cluster (by PID, checked to be the one started
here). The cluster's group_vars set short intervals (:data:`GROUP_VARS`), so that a test sees a figure or an alert
within seconds, and no exporter targets (the simulated nodes run none; a router's target stays: the nodes run the real
vllm-router, which k3deploy starts with its metrics on ``k3_router_host``).

Example::

    >>> GROUP_VARS[0]
    'k3_prom_scrape_interval: 1s'
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from k3sim import processes
from k3sim.host import SimError
from k3sim.state import save_state

BINARY = "prometheus"
#: what the cluster's group_vars/all.yml says with --monitoring
GROUP_VARS = ("k3_prom_scrape_interval: 1s", "k3_prom_evaluation_interval: 1s", "k3_prom_rate_window: 30s",
              "k3_alert_for: 2s", "k3_node_exporter_port: 0", "k3_gpu_exporter_port: 0")
INSTALL_HINT = "install Debian's prometheus package (apt-get install prometheus; .ci/install-sim.sh does it)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(state: dict[str, Any], sdir: Path, timeout: float = 30) -> str:
    """Export the cluster's monitoring into ``sdir/prometheus`` and start Prometheus on it; its URL."""
    binary = shutil.which(BINARY)
    if binary is None:
        raise SimError(f"--monitoring runs Prometheus, which is not installed here: {INSTALL_HINT}")
    d = sdir / "prometheus"
    cmd = [sys.executable, "-c", "from k3deploy.cli import main; main()", "export", "prometheus",
           state["inventory"], "-o", str(d), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise SimError(f"--monitoring: k3deploy export prometheus failed: {out.stderr.strip()[-500:]}")
    (d / "data").mkdir(parents=True, exist_ok=True)
    port = _free_port()
    rec: dict[str, Any] = {"dir": str(d), "port": port, "url": f"http://127.0.0.1:{port}",
                           "export": json.loads(out.stdout), "pid": None, "pid_start": None}
    state["prometheus"] = rec
    save_state(state)
    argv = [binary, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d"]
    with open(d / "prometheus.log", "ab") as log:
        proc = subprocess.Popen(argv, cwd=d, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    st = processes.proc_stat(proc.pid)
    rec["pid"], rec["pid_start"] = proc.pid, st[1] if st else None
    save_state(state)
    proc.returncode = 0   # it outlives this process: stop tracking it as a child
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{rec['url']}/-/ready", timeout=1) as r:
            if r.status == 200:
                return str(rec["url"])
        if not processes.alive(proc.pid):
            break
        time.sleep(0.1)
    log_lines = (d / "prometheus.log").read_text(errors="replace").strip().splitlines()
    raise SimError(f"Prometheus did not become ready on {rec['url']}: {log_lines[-1] if log_lines else 'no output'} "
                   f"(see {d / 'prometheus.log'})")


def stop(state: dict[str, Any]) -> None:
    """Stop the cluster's Prometheus (by PID, only the process started here)."""
    rec = state.get("prometheus") or {}
    pid, start_ticks = int(rec.get("pid") or 0), rec.get("pid_start")
    if not processes.ours(pid, start_ticks, BINARY):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while processes.ours(pid, start_ticks, BINARY) and time.monotonic() < deadline:
        processes.reap(pid)
        time.sleep(0.05)
    if processes.ours(pid, start_ticks, BINARY):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    processes.reap(pid)


def status(state: dict[str, Any]) -> dict[str, Any]:
    """``{"prometheus": URL}`` while the cluster's Prometheus runs (None where it stopped); nothing without one."""
    rec = state.get("prometheus")
    if not rec:
        return {}
    running = processes.ours(rec.get("pid"), rec.get("pid_start"), BINARY)
    return {"prometheus": rec["url"] if running else None}
