"""k3deploy.runtime.oporder: pyinfra's per-operation bookkeeping, computed more cheaply, with the same results."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

import pyinfra.api.arguments
import pyinfra.api.facts
from pyinfra.api import util as pyinfra_util

from k3deploy.runtime import oporder


def _orders(state: Any) -> tuple[list[int], list[int]]:  # a stand-in of pyinfra's State
    return pyinfra_util.get_operation_order_from_stack(state), oporder.operation_order_from_stack(state)  # one line


def _nested(state: SimpleNamespace, depth: int) -> tuple[list[int], list[int]]:
    return _orders(state) if depth == 0 else _nested(state, depth - 1)


def test_operation_order_is_pyinfras_from_the_deploy_file_down():
    state = SimpleNamespace(current_deploy_filename=__file__, current_op_file_number=7)
    for depth in (0, 3):
        theirs, ours = _nested(state, depth)
        assert ours == theirs
        assert len(ours) >= depth + 2   # this test's frame, each nested call, the line calling both


def test_global_arguments_are_pyinfras_computed_once(monkeypatch):
    original = oporder._pyinfra_global_arguments
    calls = []

    def counted():
        calls.append(1)
        return original()

    oporder._global_arguments.cache_clear()
    monkeypatch.setattr(oporder, "_pyinfra_global_arguments", counted)
    try:
        assert oporder.all_global_arguments() == original() == oporder.all_global_arguments()
        assert len(calls) == 1
        names = [name for name, _ in oporder.all_global_arguments()]
        assert {"_sudo", "_if", "_serial", "_retries"} <= set(names)
        oporder.install()
        assert pyinfra.api.arguments.all_global_arguments is oporder.all_global_arguments
        assert pyinfra.api.facts.all_global_arguments is oporder.all_global_arguments
    finally:
        oporder._global_arguments.cache_clear()


def test_the_collector_runs_young_passes_less_often_and_leaves_the_settled_state_alone():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, *before[1:])
        oporder.install()
        assert gc.get_threshold() == (oporder.YOUNG, *before[1:])
        settled = [[i] for i in range(1000)]   # containers the collector tracks
        oporder.settle_heap()
        assert gc.get_freeze_count() >= len(settled)
        assert all(gc.is_tracked(x) for x in settled)   # still tracked: frozen, not lost
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
