"""What a node offers Prometheus: the TCP ports something listens on where another host can reach it (not only on
loopback), read with ``ss -Hltn`` (iproute2's ss(8): ``-H`` no header, ``-l`` listening, ``-t`` TCP, ``-n`` numeric).
``k3deploy export prometheus --read-nodes`` lists a node's exporter (node exporter, DCGM / AMD / Ascend exporter)
only where its port is one of them and what answers there is that exporter: :class:`MetricsPages` reads, from the
node itself, the first bytes of ``/metrics`` at each exporter's port (``curl``: the status line, the headers and the
start of the body, at most :data:`PAGE_BYTES` of it), which :func:`k3deploy.model.monitoring.served` judges.

Example::

    >>> sorted(ListeningPorts().process(["LISTEN 0 4096 0.0.0.0:9100 0.0.0.0:*",
    ...                                  "LISTEN 0 128 [::]:9400 [::]:*", "LISTEN 0 5 127.0.0.1:29000 0.0.0.0:*",
    ...                                  "LISTEN 0 5 [::1]:5000 [::]:*", "LISTEN 0 64 10.0.0.1:8000 0.0.0.0:*"]))
    [8000, 9100, 9400]
    >>> MetricsPages().process(["K3_PAGE=9100", "HTTP/1.1 200 OK", "", "node_load1 0.5", "K3_PAGE=9400"])
    {9100: 'HTTP/1.1 200 OK\\n\\nnode_load1 0.5', 9400: ''}
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from pyinfra.api.facts import FactBase

#: how much of each page is read: enough for an exporter's first metric families (node exporter serves the Go
#: runtime's ``go_*`` families before its ``node_*`` ones, a few KiB), never a whole page
PAGE_BYTES = 65536
#: the line before each port's page
PAGE_MARK = "K3_PAGE="


class ListeningPorts(FactBase[frozenset[int]]):
    """The TCP ports something listens on, on an address other hosts reach (wildcard or the host's own)."""

    def command(self) -> str:
        return "ss -Hltn"

    def process(self, output: list[str]) -> frozenset[int]:
        ports: set[int] = set()
        for line in output:
            cols = line.split()
            if len(cols) < 4 or ":" not in cols[3]:
                continue
            address, _, port = cols[3].rpartition(":")
            address = address.strip("[]").split("%", 1)[0]
            if address.startswith("127.") or address == "::1" or not port.isdigit():
                continue
            ports.add(int(port))
        return frozenset(ports)

    @staticmethod
    def default() -> frozenset[int]:
        return frozenset()


class MetricsPages(FactBase[dict[int, str]]):
    """What answers ``GET /metrics`` on each of ``ports`` at ``address`` (the address the exported target names),
    asked from the node itself: per port the response as ``curl -sS -i`` prints it (status line, headers, body),
    cut to :data:`PAGE_BYTES`; empty where nothing answered over HTTP within 3 s (curl's own error line then)."""

    def command(self, address: str, ports: Sequence[int]) -> str:
        host = f"[{address}]" if ":" in address else address
        return "; ".join(f"echo {PAGE_MARK}{int(p)}; curl -sS -i -m 3 {shlex.quote(f'http://{host}:{int(p)}/metrics')} "
                         f"2>&1 | head -c {PAGE_BYTES}; echo" for p in ports) or "true"

    def process(self, output: list[str]) -> dict[int, str]:
        pages: dict[int, list[str]] = {}
        current: list[str] | None = None
        for line in output:
            if line.startswith(PAGE_MARK) and line[len(PAGE_MARK):].isdigit():
                current = pages.setdefault(int(line[len(PAGE_MARK):]), [])
            elif current is not None:
                current.append(line)
        return {port: "\n".join(lines).strip("\n") for port, lines in pages.items()}

    @staticmethod
    def default() -> dict[int, str]:
        return {}
