"""What a node offers Prometheus: the TCP ports something listens on where another host can reach it (not only on
loopback), read with ``ss -Hltn`` (iproute2's ss(8): ``-H`` no header, ``-l`` listening, ``-t`` TCP, ``-n`` numeric).
``k3deploy export prometheus --read-nodes`` lists a node's exporter (node exporter, DCGM / AMD / Ascend exporter)
only where its port is one of them.

Example::

    >>> sorted(ListeningPorts().process(["LISTEN 0 4096 0.0.0.0:9100 0.0.0.0:*",
    ...                                  "LISTEN 0 128 [::]:9400 [::]:*", "LISTEN 0 5 127.0.0.1:29000 0.0.0.0:*",
    ...                                  "LISTEN 0 5 [::1]:5000 [::]:*", "LISTEN 0 64 10.0.0.1:8000 0.0.0.0:*"]))
    [8000, 9100, 9400]
"""

from __future__ import annotations

from pyinfra.api.facts import FactBase


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
