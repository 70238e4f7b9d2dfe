"""The hosts of an inventory and the connections to them: the inventory loaded as the ``pyinfra`` command line loads
it (:func:`load_inventory`, :func:`open_inventory`), each host given the connection settings (``ssh_user``,
``ssh_key``, ...) of every group_vars file that applies to it before it gets its connector (:func:`give_group_vars`;
``config.py`` makes ``pyinfra`` runs do the same: :func:`give_pyinfra_group_vars`), each host connected read-only
with a bound on how long a silent node may hold a command (:func:`connect`, :func:`bound_silence`, idle transports
woken every :func:`wake_every`), AES-GCM offered first (:func:`prefer_aead_ciphers`; ``config.py`` does the same for
``pyinfra`` runs), and disconnected again (:func:`disconnect`); the ``ssh`` command a person runs to reach a host
(:func:`ssh_argv`).

Example::

    >>> state, target = open_inventory("inventories/gb300.py")        # doctest: +SKIP
    >>> [connect(host) for host in state.inventory]                    # doctest: +SKIP
    [None, None]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pyinfra.api.config import Config
from pyinfra.api.exceptions import ConnectError
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State
from pyinfra.context import ctx_config, ctx_state

from k3deploy.errors import K3Error
from k3deploy.model.inventory import host_variables, records_of, with_roles
from k3deploy.model.pipeline import Target, target
from k3deploy.model.variables import Resolved
from k3deploy.runtime.pyinfra_internals import (
    after_cli_inventory,
    lost_connection_fails_host,
    make_cli_inventory,
    ssh_transport,
)

# ------------------------------------------------------------------------------------- inventory


def _made(spec: str) -> tuple[State, Inventory, Config]:
    """The inventory of a file, a host list or a connector (``@local``), made as the ``pyinfra`` command line makes
    it (its ``group_data`` included: :func:`make_cli_inventory`); the state is not initialised yet (its hosts have no
    connector yet)."""
    if not ("@" in spec or "," in spec or Path(spec).exists()):
        raise K3Error(f"inventory {spec!r} not found: pass an inventory file (inventories/x.py), a host list "
                      "or @local")
    cwd = str(Path.cwd())
    if cwd not in sys.path:  # inventory files may import modules next to them, as with the pyinfra CLI
        sys.path.append(cwd)
    try:
        state, inventory, config = make_cli_inventory(spec, cwd)
    except Exception as exc:  # the inventory file is user code
        raise _unloadable(spec, exc) from None
    if len(inventory) == 0:
        raise K3Error(f"inventory {spec!r} has no hosts: add hosts to it")
    return state, inventory, config


def _unloadable(spec: str, exc: Exception) -> K3Error:
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return K3Error(f"cannot load inventory {spec!r}: {first}: fix the inventory file")


def _init(state: State, inventory: Inventory, config: Config, spec: str) -> State:
    """The state initialised: each host gets its connector, which takes the connection settings the host's data
    holds now."""
    try:
        with ctx_state.use(state), ctx_config.use(config):
            state.init(inventory, config)
    except Exception as exc:  # a connector that refuses the host's data
        raise _unloadable(spec, exc) from None
    return state


def load_inventory(spec: str) -> State:
    """A pyinfra state holding the inventory of ``spec`` (:func:`_made`), its hosts given the connection settings
    their group_vars hold (:func:`give_group_vars`)."""
    state, inventory, config = _made(spec)
    give_group_vars(inventory, spec)
    return _init(state, inventory, config, spec)


def host_data(host: Any) -> dict[str, Any]:
    """A host's inventory data (its own and its groups'), as pyinfra merged it."""
    return dict(host.data.dict())


def inventory_file(spec: str | None) -> str | None:
    """The inventory's file when it is one (group_vars are looked up next to it), else None."""
    return spec if spec and spec.endswith(".py") and Path(spec).is_file() else None


def open_inventory(spec: str, overrides: Mapping[str, Any] | None = None) -> tuple[State, Target]:
    """An inventory loaded (:func:`_made`) with its variables read and the connection settings its group_vars give
    applied to its hosts before they get their connectors; no host is contacted."""
    state, inventory, config = _made(spec)
    wanted = target(records_of(inventory), inventory_file(spec), overrides)
    apply_connector_settings(inventory, wanted.resolved)
    return _init(state, inventory, config, spec), wanted


def give_group_vars(inventory: Inventory, spec: str) -> None:
    """Give each host of a newly made inventory the connection settings (``ssh_user``, ``ssh_key``, ``_sudo``, ...)
    of every group_vars file that applies to it (all, the inventory's name, each of its groups), where the
    inventory's own data does not set them; before the state is initialised, since a host's connector takes its
    settings then. Raises :class:`K3Error` for a group_vars file or a name that cannot be read."""
    if (file := inventory_file(spec)) is None:
        return
    apply_connector_settings(inventory, host_variables(with_roles(records_of(inventory)), file))


def apply_connector_settings(inventory: Iterable[Any], resolved: Mapping[str, Resolved]) -> None:
    """The connection settings group_vars give each host (``ssh_user``, ``ssh_port``, ...), where its inventory data
    does not set them already (the inventory's own data wins, as for every variable)."""
    for host in inventory:
        if (res := resolved.get(host.name)) is None:
            continue
        have = host_data(host)
        for key, value in res.connector.items():
            if key not in have:
                setattr(host.data, key, value)


def connector_drift(state: State, wanted: Target) -> list[str]:
    """Connection settings group_vars give a host that the running pyinfra did not connect with (a ``pyinfra``
    run that did not read the project's ``config.py``), one line each."""
    out = []
    for host in state.inventory:
        resolved = wanted.resolved.get(host.name)
        if resolved is None:
            continue
        have = host_data(host)
        for key, value in resolved.connector.items():
            if have.get(key) != value:
                out.append(f"{host.name}: {key}={value!r} in {resolved.connector_sources[key]} is not what pyinfra "
                           f"connected with ({have.get(key)!r}): run pyinfra from the project's directory (its "
                           "config.py hands group_vars' connection settings to pyinfra)")
    return out


def give_pyinfra_group_vars() -> None:
    """Make the ``pyinfra`` command line give each host the connection settings of its group_vars
    (:func:`give_group_vars`) as it loads the inventory, before it connects: ``config.py`` calls this (pyinfra runs
    it before it loads the inventory; pyinfra itself reads only ``group_data/*.py``). A group_vars file that cannot
    be read ends the run there, in one line, exit 2. Idempotent."""
    from pyinfra import logger

    def hook(inventory: Inventory, spec: str) -> None:
        try:
            give_group_vars(inventory, spec)
        except K3Error as exc:
            logger.error(f"--> k3deploy: {exc}; nothing was changed")
            raise SystemExit(exc.exit_code) from None

    after_cli_inventory(hook)


# ------------------------------------------------------------------------------------ connections


def prefer_aead_ciphers() -> tuple[str, ...]:
    """Offer AES-GCM first in this process's SSH connections, the same ciphers still on offer (OpenSSH has offered
    GCM since 6.2; a server that does not still gets AES-CTR). paramiko offers GCM last: with CTR each packet also
    carries an HMAC, computed and compared in Python, about 0.4 ms of the control machine's CPU per connection and 0.06
    ms per command. Idempotent; the order now on offer.

    >>> prefer_aead_ciphers()[:2]
    ('aes128-gcm@openssh.com', 'aes256-gcm@openssh.com')
    """
    import paramiko

    offered: tuple[str, ...] = tuple(getattr(paramiko.Transport, "_preferred_ciphers"))  # noqa: B009 (untyped)
    aead = tuple(c for c in offered if c.endswith("-gcm@openssh.com"))
    order = aead + tuple(c for c in offered if c not in aead)
    setattr(paramiko.Transport, "_preferred_ciphers", order)  # noqa: B010 (paramiko's documented preference order)
    return order


def connect(host: Any, silent_after: int | None = None) -> str | None:
    """Connect one host (with :func:`bound_silence`); the reason when it cannot be reached, else None."""
    prefer_aead_ciphers()
    try:
        host.connect(raise_exceptions=True, show_errors=False)
    except ConnectError as exc:
        return str(exc.args[0]) if exc.args else "could not connect"
    except Exception as exc:  # paramiko/socket errors not wrapped by the connector
        return f"{type(exc).__name__}: {exc}"
    if silent_after:
        bound_silence(host, silent_after)
    return None


def bound_silence(host: Any, seconds: int) -> bool:
    """Make a host's SSH connection fail, instead of waiting forever, once its node has not answered for about
    ``seconds`` (a cut link, a node that froze): SSH keepalives every ``seconds / 3``, TCP keepalives on the
    socket, and ``TCP_USER_TIMEOUT`` (data sent and not acknowledged for ``seconds`` closes the connection). A command
    that was running there then ends with an error naming the host, and the run goes on with the other hosts.
    False when the host has no SSH connection (``@local``, ``@fake``)."""
    import socket

    transport = ssh_transport(host)
    sock: Any = getattr(transport, "sock", None)
    if transport is None or not hasattr(sock, "setsockopt"):
        return False
    keepalive = max(1, seconds // 3)
    transport.set_keepalive(keepalive)
    every = max(1, seconds // 6)
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", every), ("TCP_KEEPINTVL", every), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", seconds * 1000)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, opt, value in options:
        try:
            sock.setsockopt(level, opt, value)
        except OSError:  # not a TCP socket (a proxy command)
            return False
    # paramiko's transport wakes every 0.1 s to look for a close or a keepalive due: on a control machine holding a
    # rack's connections through a rollout that is most of its idle CPU (each wake ~60 us here: 72 connections
    # through a 30 s rollout, 1.8 ms per tray at once a second); a keepalive sent up to half its interval late is as
    # good (a close from this side, or a socket the kernel shut for TCP_USER_TIMEOUT, wakes it at once)
    sock.settimeout(wake_every(keepalive))
    lost_connection_fails_host(host)
    return True


#: the longest time (seconds) an idle SSH transport sleeps before it looks for a keepalive due (see
#: :func:`bound_silence`)
WAKE_EVERY = 5.0


def wake_every(keepalive: int) -> float:
    """How often (seconds) an idle SSH transport whose keepalive is due every ``keepalive`` seconds wakes to send
    it: half that interval, between 1 s and :data:`WAKE_EVERY` (a keepalive goes out at most half an interval late).

    >>> wake_every(10), wake_every(3), wake_every(1), wake_every(1200)
    (5.0, 1.5, 1.0, 5.0)
    """
    return max(1.0, min(WAKE_EVERY, keepalive / 2))



def disconnect(hosts: list[Any]) -> None:
    for host in hosts:
        if host.connected:
            try:
                host.disconnect()
            except Exception:  # a connection that already broke
                pass


def ssh_argv(data: Mapping[str, Any], address: str) -> list[str]:
    """``ssh`` with the inventory's connection settings (user, port, key, known hosts).

    >>> ssh_argv({"ssh_user": "ops", "ssh_port": 2222}, "10.0.0.1")
    ['ssh', '-p', '2222', 'ops@10.0.0.1']
    """
    argv = ["ssh"]
    if data.get("ssh_port"):
        argv += ["-p", str(data["ssh_port"])]
    if data.get("ssh_key"):
        argv += ["-i", str(data["ssh_key"])]
    if data.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={data['ssh_known_hosts_file']}"]
    strict = data.get("ssh_strict_host_key_checking")
    if strict:
        argv += ["-o", f"StrictHostKeyChecking={strict}"]
    user = data.get("ssh_user")
    return argv + [f"{user}@{address}" if user else address]
