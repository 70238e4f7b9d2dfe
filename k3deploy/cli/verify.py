"""``k3deploy verify INVENTORY``: hash every file of the model's snapshot on every engine node, whatever its time
stamps, against its blob's name (the check the deploy runs before an engine starts). Read-only: one command per
host, all hosts at once; it reads the whole checkpoint on each node (seconds to minutes).

Example::

    $ k3deploy verify inventories/gb300.py
    $ k3deploy verify inventories/gb300.py --json | jq '.hosts[] | .bad'
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import click

from k3deploy.cli.common import echo_json, json_option
from k3deploy.errors import K3Error


@dataclass
class HostCheck:
    """What one engine node's check found (``check`` None: the host was not reached, ``error`` says why)."""

    host: str
    check: Any = None          # k3deploy.facts.rollout.WeightsCheck
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.check is not None and self.check.ok

    def problems(self) -> list[str]:
        if self.error is not None:
            return [f"unreachable: {self.error}"]
        return self.check.problems() if self.check is not None else []

    def to_dict(self) -> dict[str, Any]:
        c = self.check
        return {"ok": self.ok, "reachable": self.error is None, "error": self.error,
                "files": c.files if c else 0, "bytes": c.bytes if c else 0, "seconds": c.seconds if c else None,
                "bad": [{"path": b.path, "kind": b.kind, "observed": b.observed, "blob": b.blob.rsplit("/", 1)[-1]}
                        for b in (c.bad if c else ())],
                "missing": list(c.missing) if c else [], "problems": self.problems()}


@dataclass
class Verification:
    model: str
    cache: str
    hosts: list[HostCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "cache": self.cache, "ok": self.ok,
                "hosts": {h.host: h.to_dict() for h in self.hosts}}


def verify_cluster(inventory: str) -> Verification:
    """Run the check on every engine host of the inventory's plan, in parallel (one command per host)."""
    from k3deploy.facts.batch import read_batch
    from k3deploy.facts.parallel import each_host
    from k3deploy.facts.rollout import WeightsHashes
    from k3deploy.model.staging import engines
    from k3deploy.preflight import runner
    from k3deploy.runtime.connections import connect, disconnect, open_inventory

    state, t = open_inventory(inventory)
    r = t.require_layout()   # which hosts run an engine: the rollout's files are not needed
    v = r.vars
    names = engines(r)
    hosts = [h for h in state.inventory if h.name in names]
    runner.quiet_pyinfra()
    kwargs = {"cache": v.k3_model_cache, "model": r.plan.model}

    def one(h: Any) -> HostCheck:
        reason = connect(h)
        if reason is not None:
            return HostCheck(h.name, error=reason)
        try:
            return HostCheck(h.name, read_batch(state, h, [("hashes", WeightsHashes, kwargs)])["hashes"])
        except Exception as exc:  # a dropped connection: that host is not verified
            return HostCheck(h.name, error=f"{type(exc).__name__}: {exc}"[:200])

    try:
        return Verification(r.plan.model, v.k3_model_cache, each_host(state, hosts, one))
    finally:
        disconnect(hosts)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def show(result: Verification, console: Any) -> None:
    from rich.table import Table

    table = Table("host", "files checked", "bytes", "seconds", "bad files", "verdict",
                  title=f"{result.model} in {result.cache}", title_justify="left")
    for h in result.hosts:
        c = h.check
        table.add_row(h.host, str(c.files) if c else "-", _size(c.bytes) if c else "-",
                      f"{c.seconds:.2f}" if c and c.seconds is not None else "-",
                      "\n".join(h.problems()) or "none", "[green]ok[/]" if h.ok else "[red]bad[/]")
    console.print(table)
    bad = [h.host for h in result.hosts if not h.ok]
    console.print("every file verified on every engine node" if not bad else
                  f"[red]not verified[/] on {', '.join(bad)}: the next deploy copies bad files again from a peer "
                  "(or delete them and rerun it); an engine restarted before then refuses to start")


@click.command("verify")
@click.argument("inventory")
@json_option
def verify(inventory: str, as_json: bool) -> None:
    """Hash every file of the model's snapshot on every engine node (in parallel, one file per CPU on each node),
    whatever its time stamps, against its blob's name: a shard's sha256, a small file's git blob id. Read-only.

    Exit code: 0 every file good on every node, 1 a bad or missing file or an unreachable node, 2 bad input.

    \b
    Example:
      k3deploy verify inventories/gb300.py
      k3deploy verify inventories/gb300.py --json | jq .ok
    """
    from rich.console import Console

    try:
        result = verify_cluster(inventory)
    except K3Error:
        raise
    except Exception as exc:  # never a traceback for the user
        raise K3Error(f"verify could not run: {type(exc).__name__}: {exc}") from None
    if as_json:
        echo_json(result.to_dict())
    else:
        show(result, Console(width=None if sys.stdout.isatty() else 160))
    sys.exit(0 if result.ok else 1)
