"""A cheaper way for pyinfra to name each operation call: the same line numbers, without reading source files.

pyinfra (CLI mode) identifies an operation call by the line numbers of the call stack from the deploy file down
(``pyinfra.api.util.get_operation_order_from_stack``). It takes them from ``inspect.stack()`` and then
``inspect.getframeinfo`` per frame, which reads each frame's source line (``linecache``) and scans ``sys.modules``
to find each frame's module: on a rollout of N hosts, with ~20 operation calls per host and a stack of ~30 frames,
this is most of the control machine's own CPU time while the run prepares, and it grows with N. The frames already
hold what pyinfra keeps (``f_code.co_filename``, ``f_lineno``), so :func:`operation_order_from_stack` returns the
same list of line numbers directly; :func:`install` puts it in place of pyinfra's (pyinfra 3.10's ``operation``
module looks the function up by name at each call).

Likewise for the global arguments (``_sudo``, ``_if``, ...) pyinfra takes out of every operation and deploy call:
``pyinfra.api.arguments.all_global_arguments`` computes ``typing.get_type_hints`` of the same class at every call (a
twentieth of the control machine's CPU time at 18 hosts); :func:`install` makes it compute them once. And for each
of them ``pop_global_arguments`` looks the argument up in the host's data (``getattr(host.data, key)``), which walks
every layer of the host's data (override, host, each group, global, deploy data), evaluating each layer and raising
a ``KeyError`` per layer that lacks the key: some thirty lookups per operation and host, most of the control
machine's CPU time per operation; :func:`pop_global_arguments` gives it the host's data merged once per call (the
same values: :meth:`HostData.dict` merges the layers in the same order of precedence).

And for the garbage collector, which a run keeps busy: its full passes walked everything the run holds (the modules,
the inventory, every host's facts and the plan) again and again, and its young passes ran every 700 allocations;
:func:`install` makes the young passes rarer and :func:`settle_heap` (once the run's state is built) leaves what it
holds by then out of every pass. At 36 hosts: 59 ms of the control machine's CPU in the collector, 9 ms after.
"""

from __future__ import annotations

import gc
import sys
from copy import copy
from functools import cache
from typing import Any

import pyinfra
import pyinfra.api.arguments
import pyinfra.api.deploy  # noqa: F401 (the module: ``pyinfra.api.deploy`` is also the decorator)
import pyinfra.api.facts
import pyinfra.api.operation  # noqa: F401 (the module; ``pyinfra.api.operation`` is also the decorator)
from pyinfra.api.util import PYINFRA_INSTALL_DIR

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


class _Merged:
    """A host's data as ``pop_global_arguments`` reads it (``getattr(data, key, default)``), its layers merged once."""

    def __init__(self, data: Any) -> None:
        self._values: dict[str, Any] = data.dict()

    def __getattr__(self, key: str) -> Any:
        try:
            return copy(self._values[key])
        except KeyError:
            raise AttributeError(key) from None


def pop_global_arguments(state: Any, host: Any, kwargs: dict[str, Any]) -> Any:
    """What ``pyinfra.api.arguments.pop_global_arguments`` returns, reading the host's data merged once (no
    greenlet runs in between: the data is the host's own again when it returns)."""
    data = host.data
    host.data = _Merged(data)
    try:
        return _pyinfra_pop_global_arguments(state, host, kwargs)
    finally:
        host.data = data


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
    """Use :func:`operation_order_from_stack` for the operations called from now on, and
    :func:`all_global_arguments` for pyinfra's global arguments; the youngest generation of the garbage collector
    collected every :data:`YOUNG` allocations (idempotent)."""
    gc.set_threshold(YOUNG, *gc.get_threshold()[1:])
    setattr(_operation, "get_operation_order_from_stack", operation_order_from_stack)  # noqa: B010
    for module in (pyinfra.api.arguments, pyinfra.api.facts):
        setattr(module, "all_global_arguments", all_global_arguments)  # noqa: B010
    for module in (_operation, sys.modules["pyinfra.api.deploy"], pyinfra.api.facts):
        setattr(module, "pop_global_arguments", pop_global_arguments)  # noqa: B010

