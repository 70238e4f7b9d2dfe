"""Every use of pyinfra's internals, in one place, for the one pyinfra version it was written for
(:data:`SUPPORTED`, pinned in pyproject.toml): importing this module under another version raises
:class:`UnsupportedPyinfra` (one line naming both versions), so an upgrade fails loudly here instead of silently in a
rollout. The rest of k3deploy uses pyinfra's public API (``State``, ``Inventory``, ``Config``, the contexts,
``@operation``, facts) and comes here for the rest:

- the inventory made as the ``pyinfra`` command line makes it (:func:`make_cli_inventory`, from ``pyinfra_cli``),
  and a hook on the command line's own inventory loader (:func:`after_cli_inventory`);
- cheaper operation identities and global arguments (:func:`install`): pyinfra (CLI mode) identifies an operation
  call by the line numbers of the call stack from the deploy file down
  (``pyinfra.api.util.get_operation_order_from_stack``), taken from ``inspect.stack()`` and then
  ``inspect.getframeinfo`` per frame, which reads each frame's source line (``linecache``) and scans
  ``sys.modules`` to find each frame's module: on a rollout of N hosts, with ~20 operation calls per host and a
  stack of ~30 frames, this is most of the control machine's own CPU time while the run prepares, and it grows with
  N. The frames already hold what pyinfra keeps (``f_code.co_filename``, ``f_lineno``), so
  :func:`operation_order_from_stack` returns the same list of line numbers directly (pyinfra 3.10's ``operation``
  module looks the function up by name at each call). Likewise for the global arguments (``_sudo``, ``_if``, ...)
  pyinfra takes out of every operation and deploy call: ``pyinfra.api.arguments.all_global_arguments`` computes
  ``typing.get_type_hints`` of the same class at every call (a twentieth of the control machine's CPU time at 18
  hosts); :func:`install` makes it compute them once. And for each of them ``pop_global_arguments`` looks the
  argument up in the host's data (``getattr(host.data, key)``), which walks every layer of the host's data
  (override, host, each group, global, deploy data), evaluating each layer and raising a ``KeyError`` per layer that
  lacks the key: some thirty lookups per operation and host, most of the control machine's CPU time per operation;
  :func:`pop_global_arguments` does what pyinfra's does with the host's data merged once per call (the same values:
  :meth:`HostData.dict` merges the layers in the same order of precedence), each argument's description looked up
  once per process and the host's context object resolved once per call (pyinfra's reads ``host.data`` through it
  for every argument: ~0.2 ms of the control machine's CPU per operation and host). And where it does not run an
  operation's function to see whether it changes anything (``-y``), pyinfra checks the call's arguments against the
  function's ``inspect.signature``, made anew for every operation and host: :func:`signature` makes it once per
  function (a signature is immutable);
- the SSH connector's own objects: its paramiko transport (:func:`ssh_transport`), its methods wrapped so that a
  connection lost under a command fails that host and not the run (:func:`lost_connection_fails_host`), and work
  done as a host's connection closes (:func:`before_disconnect`).

And, installed with the rest since a pyinfra run keeps it busy, the garbage collector: its full passes walked
everything a run holds (the modules, the inventory, every host's facts and the plan) again and again, and its young
passes ran every 700 allocations; :func:`install` makes the young passes rarer and :func:`settle_heap` (once the
run's state is built) leaves what it holds by then out of every pass. At 36 hosts: 59 ms of the control machine's CPU
in the collector, 9 ms after.

Example::

    >>> SUPPORTED
    '3.10.0'
    >>> print(refusal("3.11.0"))
    pyinfra 3.11.0 is installed, k3deploy needs pyinfra 3.10.0 (it uses its internals): pip install 'pyinfra==3.10.0'
"""

from __future__ import annotations

import gc
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from copy import copy
from functools import cache
from importlib.metadata import version
from typing import Any

from k3deploy.errors import K3Error

#: the pyinfra version this module was written for (and pyproject.toml pins)
SUPPORTED = "3.10.0"


class UnsupportedPyinfra(K3Error):
    """The installed pyinfra is not the version whose internals this module uses."""


def refusal(installed: str) -> str:
    """The one line that refuses pyinfra ``installed``."""
    return (f"pyinfra {installed} is installed, k3deploy needs pyinfra {SUPPORTED} (it uses its internals): "
            f"pip install 'pyinfra=={SUPPORTED}'")


def check_version(installed: str) -> None:
    """Refuse (:class:`UnsupportedPyinfra`) any pyinfra but :data:`SUPPORTED`.

    >>> check_version("3.10.0")
    >>> check_version("3.9.1")
    Traceback (most recent call last):
    ...
    k3deploy.runtime.pyinfra_internals.UnsupportedPyinfra: pyinfra 3.9.1 is installed, ...
    """
    if installed != SUPPORTED:
        raise UnsupportedPyinfra(refusal(installed))


check_version(version("pyinfra"))  # before anything of pyinfra's is touched

import pyinfra  # noqa: E402 (only once its version is known)
import pyinfra.api.arguments  # noqa: E402
import pyinfra.api.deploy  # noqa: E402,F401 (the module: ``pyinfra.api.deploy`` is also the decorator)
import pyinfra.api.facts  # noqa: E402
import pyinfra.api.operation  # noqa: E402,F401 (the module; ``pyinfra.api.operation`` is also the decorator)
from pyinfra.api.config import Config  # noqa: E402
from pyinfra.api.exceptions import ArgumentTypeError  # noqa: E402
from pyinfra.api.inventory import Inventory  # noqa: E402
from pyinfra.api.state import State  # noqa: E402
from pyinfra.api.util import PYINFRA_INSTALL_DIR, raise_if_bad_type  # noqa: E402
from pyinfra.context import ctx_config, ctx_state  # noqa: E402

# ------------------------------------------------------------------------------- the inventory

#: pyinfra's run configuration, made as the ``pyinfra`` command line makes it (its defaults)
_new_config: Callable[[], Config] = Config


def make_cli_inventory(spec: str, cwd: str) -> tuple[State, Inventory, Config]:
    """The inventory of a file, a host list or a connector (``@local``), made as the ``pyinfra`` command line makes
    it (``pyinfra_cli.inventory.make_inventory``, its ``group_data`` included), with its state and configuration; the
    state is not initialised yet (its hosts have no connector yet). Exceptions of the inventory file (user code)
    pass through."""
    from pyinfra_cli.inventory import make_inventory

    state = State()
    state.cwd = cwd
    config = _new_config()
    with ctx_state.use(state), ctx_config.use(config):
        inventory = make_inventory(spec, cwd=cwd)
    return state, inventory, config


def after_cli_inventory(hook: Callable[[Inventory, str], None]) -> None:
    """Make the ``pyinfra`` command line call ``hook(inventory, spec)`` on the inventory it loads, before its hosts
    get their connectors (``pyinfra_cli.cli.make_inventory`` wrapped). Once per process: a second call does
    nothing."""
    import pyinfra_cli.cli as pyinfra_cli

    made: Callable[..., Inventory] = pyinfra_cli.make_inventory
    if getattr(made, "_k3_hooked", False):
        return

    def make_inventory(spec: str, *args: Any, **kwargs: Any) -> Inventory:
        inventory = made(spec, *args, **kwargs)
        hook(inventory, spec)
        return inventory

    setattr(make_inventory, "_k3_hooked", True)  # noqa: B010
    setattr(pyinfra_cli, "make_inventory", make_inventory)  # noqa: B010 (the command line's inventory loader)


# --------------------------------------------------------------- operation identities and arguments

_operation = sys.modules["pyinfra.api.operation"]
_pyinfra_global_arguments = pyinfra.api.arguments.all_global_arguments
_pyinfra_pop_global_arguments = pyinfra.api.arguments.pop_global_arguments


def operation_order_from_stack(state: Any) -> list[int]:
    """What ``pyinfra.api.util.get_operation_order_from_stack(state)`` returns, from the frames themselves."""
    frames = []
    frame = sys._getframe(1)  # the caller (pyinfra's, skipped below like pyinfra's own frame)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back  # type: ignore[assignment]
    frames.reverse()
    i = 0
    if state.current_deploy_filename:
        for i, f in enumerate(frames):  # noqa: B007 (i is used after the loop, as in pyinfra)
            if f.f_code.co_filename == state.current_deploy_filename:
                break
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    for f in frames[i:]:
        if f.f_code.co_filename.startswith(PYINFRA_INSTALL_DIR):
            continue
        line_numbers.append(f.f_lineno)
    return line_numbers


@cache
def _global_arguments() -> tuple[tuple[str, type], ...]:
    return tuple(_pyinfra_global_arguments())


def all_global_arguments() -> list[tuple[str, type]]:
    """What ``pyinfra.api.arguments.all_global_arguments()`` returns (the names and types of pyinfra's global
    arguments: fixed by its ``AllArguments`` class), computed once."""
    return list(_global_arguments())


@cache
def _argument_metas() -> tuple[tuple[str, type, Any], ...]:
    """Each global argument's name, type and description (``pyinfra.api.arguments.all_argument_meta``: its default
    and handler), in pyinfra's order."""
    metas = pyinfra.api.arguments.all_argument_meta
    return tuple((key, type_, metas[key]) for key, type_ in _global_arguments())


def pop_global_arguments(state: Any, host: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """What ``pyinfra.api.arguments.pop_global_arguments`` returns (and pops from ``kwargs``), step for step:
    each argument from ``kwargs``, else the current ``@deploy``'s arguments, else the host's data, else the
    configuration's default; its handler applied; a value other than the default type-checked as pyinfra checks
    it. The host's data is merged once per call (:meth:`HostData.dict`, the same precedence as its attribute
    lookups, a copy of each value taken as those take one)."""
    config = state.config
    if ctx_config.isset():  # type: ignore[no-untyped-call]
        config = ctx_config.get()  # type: ignore[no-untyped-call]
    meta_kwargs: dict[str, Any] = host.current_deploy_kwargs or {}
    merged: dict[str, Any] = host.data.dict()
    arguments: dict[str, Any] = {}
    found_keys: list[str] = []
    for key, type_, meta in _argument_metas():
        default: Any = meta.default(config)
        if key in merged:
            default = copy(merged[key])
        if key in kwargs:
            found_keys.append(key)
            value = kwargs.pop(key)
        else:
            value = meta_kwargs.get(key, default)
        if meta.handler:
            value = meta.handler(config, value)
        if value != default:
            raise_if_bad_type(value, type_, ArgumentTypeError, f"Invalid argument `{key}`:")
        arguments[key] = value
    return arguments, found_keys


@cache
def signature(func: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature(func)``, made once per function (what pyinfra's ``operation`` module checks each call's
    arguments against).

        >>> signature(refusal) is signature(refusal), list(signature(refusal).parameters)
        (True, ['installed'])
    """
    return inspect.signature(func)


def settle_heap() -> None:
    """Leave what the run holds by now (modules, the inventory, the facts, the plan: some 90,000 objects on 36
    hosts) out of the garbage collector's passes (``gc.freeze``): each full pass walked all of it again (~33 ms at 36
    hosts, more per pass as the inventory grows), while what the run makes from now on (commands, outputs) dies
    young."""
    gc.freeze()


#: allocations between two collections of the youngest generation (Python's default: 700); most of what a run
#: allocates is freed by its reference count before that, so fewer passes walk fewer survivors (at 36 hosts: 43
#: young passes instead of 120)
YOUNG = 10_000


def install() -> None:
    """Use :func:`operation_order_from_stack` and :func:`signature` for the operations called from now on,
    :func:`all_global_arguments` and :func:`pop_global_arguments` for pyinfra's global arguments; the youngest
    generation of the garbage collector collected every :data:`YOUNG` allocations (idempotent)."""
    gc.set_threshold(YOUNG, *gc.get_threshold()[1:])
    setattr(_operation, "get_operation_order_from_stack", operation_order_from_stack)  # noqa: B010
    setattr(_operation, "signature", signature)  # noqa: B010
    for module in (pyinfra.api.arguments, pyinfra.api.facts):
        setattr(module, "all_global_arguments", all_global_arguments)  # noqa: B010
    for module in (_operation, sys.modules["pyinfra.api.deploy"], pyinfra.api.facts):
        setattr(module, "pop_global_arguments", pop_global_arguments)  # noqa: B010


# ------------------------------------------------------------------------------ the SSH connector


def ssh_transport(host: Any) -> Any:
    """The paramiko transport of a host's SSH connection (the SSH connector's ``client``), or None where the host
    has none (``@local``, ``@fake``, not connected)."""
    client = getattr(getattr(host, "connector", None), "client", None)
    return client.get_transport() if client is not None else None


def lost_connection_fails_host(host: Any) -> None:
    """A connection that dies under a command fails that host, not the run: paramiko raises ``EOFError`` (or its
    own ``SSHException``) when the transport is gone, and pyinfra aborts the whole run on an ``EOFError``; here
    it becomes the ``OSError`` pyinfra reports as that host's failure (the connector's ``run_shell_command``,
    ``put_file`` and ``get_file`` wrapped; once per connector)."""
    connector = host.connector
    if getattr(connector, "_k3_guarded", False):
        return

    def guard(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except EOFError as exc:
                raise OSError(f"the SSH connection to {host.name} was lost (no answer within k3_link_timeout): "
                              f"{type(exc).__name__}") from exc
        return call

    for name in ("run_shell_command", "put_file", "get_file"):
        setattr(connector, name, guard(getattr(connector, name)))
    connector._k3_guarded = True


def before_disconnect(host: Any, first: Callable[[], None]) -> None:
    """Call ``first()`` as the host's connection closes, before the connector disconnects it (the connector's
    ``disconnect`` wrapped; nothing where the host has no connector)."""
    connector: Any = getattr(host, "connector", None)
    close = getattr(connector, "disconnect", None)
    if close is None:
        return

    def disconnect(*args: Any, **kwargs: Any) -> Any:
        first()
        return close(*args, **kwargs)

    connector.disconnect = disconnect


@contextmanager
def operation_kind(host: Any, kind: int) -> Iterator[None]:
    """Operations ``host`` calls in this block are told apart by ``kind`` (as pyinfra's ``host.loop`` tells the turns
    of a loop apart): the same kind is the same operation on every host, whatever else each host calls, and among the
    operations pyinfra may run next it orders them by kind (``host.loop_position``, which pyinfra appends to an
    operation's order and identity). The restart's barriers rely on it (:func:`k3deploy.runtime.phases.start_phase`).

        >>> class H: loop_position: list[int] = []
        >>> with operation_kind(H, 3): H.loop_position
        [3]
        >>> H.loop_position
        []
    """
    host.loop_position.append(kind)
    try:
        yield
    finally:
        host.loop_position.pop()
