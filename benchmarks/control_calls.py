"""What the deploy's bookkeeping per operation and one command cost the control machine's CPU, per call.

1. The global arguments pyinfra takes out of every operation, deploy and fact call on every host (``_sudo``, ``_if``,
   ...): pyinfra 3.10's ``pop_global_arguments`` (with the host's data merged once, as k3deploy called it before)
   against :func:`k3deploy.runtime.pyinfra_internals.pop_global_arguments`, on a host of INVENTORY, called as an
   operation calls it (through pyinfra's context object); no connection needed. A first rollout makes about 18
   such calls per tray.
2. With ``--command``: one command (``true``) over a held SSH connection to the inventory's first host, as pyinfra
   runs it (what each fact read or operation with a command costs besides its own work); the host must answer.

Run as root, ``PYTHONPATH`` set to the checkout and its ``simulator/``:
python benchmarks/control_calls.py INVENTORY [--calls 2000] [--command 300]
"""

from __future__ import annotations

import argparse
import functools
import time
from copy import copy
from typing import Any

import gevent.monkey

gevent.monkey.patch_all()  # as pyinfra's command line runs: its SSH connections are gevent's sockets

import pyinfra  # noqa: E402
from pyinfra.context import ctx_host, ctx_state  # noqa: E402
from pyinfra.context import host as host_context  # noqa: E402

from k3deploy.runtime import pyinfra_internals as internals  # noqa: E402
from k3deploy.runtime.connections import prefer_aead_ciphers  # noqa: E402


class _Merged:
    """A host's data merged once, read attribute by attribute (how k3deploy called pyinfra's function before)."""

    def __init__(self, data: Any) -> None:
        self._values: dict[str, Any] = data.dict()

    def __getattr__(self, key: str) -> Any:
        try:
            return copy(self._values[key])
        except KeyError:
            raise AttributeError(key) from None


def merged_once(state: Any, host: Any, kwargs: dict[str, Any]) -> Any:
    data = host.data
    host.data = _Merged(data)
    try:
        return internals._pyinfra_pop_global_arguments(state, host, kwargs)
    finally:
        host.data = data


def per_call(calls: int, call: Any) -> float:
    """CPU microseconds per call."""
    began = time.process_time()
    for _ in range(calls):
        call()
    return 1e6 * (time.process_time() - began) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("inventory")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--command", type=int, default=0, metavar="N", help="also N commands over a held connection")
    args = ap.parse_args()
    pyinfra.is_cli = True
    state, inventory, config = internals.make_cli_inventory(args.inventory, ".")
    prefer_aead_ciphers()
    state.init(inventory, config)
    host = next(iter(inventory))
    kwargs = {"name": "Configure", "_if": functools.partial(bool, 1), "_timeout": 30, "files": []}
    with ctx_state.use(state), ctx_host.use(host):
        for name, pop in (("pyinfra's", internals._pyinfra_pop_global_arguments),
                          ("pyinfra's, host data merged once", merged_once),
                          ("k3deploy's", internals.pop_global_arguments)):
            us = per_call(args.calls, lambda pop=pop: pop(state, host_context, dict(kwargs)))
            print(f"pop_global_arguments, {name}: {us:.1f} us per call")
        if args.command:
            host.connect(raise_exceptions=True)
            run = functools.partial(host.run_shell_command, "true", print_output=False, print_input=False)
            per_call(20, run)
            print(f"one command over a held connection: {per_call(args.command, run) / 1000:.3f} ms per command")


if __name__ == "__main__":
    main()
