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
twentieth of the control machine's CPU time at 18 hosts); :func:`install` makes it compute them once.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import pyinfra
import pyinfra.api.arguments
import pyinfra.api.facts
import pyinfra.api.operation  # noqa: F401 (the module; ``pyinfra.api.operation`` is also the decorator)
from pyinfra.api.util import PYINFRA_INSTALL_DIR

_operation = sys.modules["pyinfra.api.operation"]
_pyinfra_global_arguments = pyinfra.api.arguments.all_global_arguments


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


def install() -> None:
    """Use :func:`operation_order_from_stack` for the operations called from now on, and
    :func:`all_global_arguments` for pyinfra's global arguments (idempotent)."""
    setattr(_operation, "get_operation_order_from_stack", operation_order_from_stack)  # noqa: B010
    for module in (pyinfra.api.arguments, pyinfra.api.facts):
        setattr(module, "all_global_arguments", all_global_arguments)  # noqa: B010

