"""k3deploy.runtime.pyinfra_internals: written for one pyinfra version and refusing any other; pyinfra's per-operation
bookkeeping, computed more cheaply, with the same results."""

from __future__ import annotations

import gc
import importlib.metadata
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pyinfra.api.arguments
import pyinfra.api.exceptions
import pyinfra.api.facts
import pytest
from pyinfra.api import util as pyinfra_util

from helpers import ROOT
from k3deploy.runtime import pyinfra_internals as internals


def _orders(state: Any) -> tuple[list[int], list[int]]:  # a stand-in of pyinfra's State
    return pyinfra_util.get_operation_order_from_stack(state), internals.operation_order_from_stack(state)  # one line


def _nested(state: SimpleNamespace, depth: int) -> tuple[list[int], list[int]]:
    return _orders(state) if depth == 0 else _nested(state, depth - 1)


def test_operation_order_is_pyinfras_from_the_deploy_file_down():
    state = SimpleNamespace(current_deploy_filename=__file__, current_op_file_number=7)
    for depth in (0, 3):
        theirs, ours = _nested(state, depth)
        assert ours == theirs
        assert len(ours) >= depth + 2   # this test's frame, each nested call, the line calling both


def test_global_arguments_are_pyinfras_computed_once(monkeypatch):
    original = internals._pyinfra_global_arguments
    calls = []

    def counted():
        calls.append(1)
        return original()

    internals._global_arguments.cache_clear()
    monkeypatch.setattr(internals, "_pyinfra_global_arguments", counted)
    try:
        assert internals.all_global_arguments() == original() == internals.all_global_arguments()
        assert len(calls) == 1
        names = [name for name, _ in internals.all_global_arguments()]
        assert {"_sudo", "_if", "_serial", "_retries"} <= set(names)
        internals.install()
        assert pyinfra.api.arguments.all_global_arguments is internals.all_global_arguments
        assert pyinfra.api.facts.all_global_arguments is internals.all_global_arguments
    finally:
        internals._global_arguments.cache_clear()


def test_the_collector_runs_young_passes_less_often_and_leaves_the_settled_state_alone():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, *before[1:])
        internals.install()
        assert gc.get_threshold() == (internals.YOUNG, *before[1:])
        settled = [[i] for i in range(1000)]   # containers the collector tracks
        internals.settle_heap()
        assert gc.get_freeze_count() >= len(settled)
        assert all(gc.is_tracked(x) for x in settled)   # still tracked: frozen, not lost
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_only_the_pyinfra_it_was_written_for_is_accepted():
    assert internals.SUPPORTED == importlib.metadata.version("pyinfra") == "3.10.0"   # the pin of pyproject.toml
    internals.check_version("3.10.0")
    for other in ("3.10.1", "3.11.0", "4.0.0", "3.9.3"):
        with pytest.raises(internals.UnsupportedPyinfra) as refused:
            internals.check_version(other)
        assert str(refused.value) == internals.refusal(other)
        assert f"pyinfra {other} is installed" in str(refused.value) and "pyinfra==3.10.0" in str(refused.value)
        assert refused.value.exit_code == 2


#: a process that runs ``k3deploy ARGS`` with pyinfra's installed version read as ``FAKED``
_FAKED_VERSION = """
import importlib.metadata, sys
real = importlib.metadata.version
faked = sys.argv[1]
importlib.metadata.version = lambda name: faked if name == "pyinfra" else real(name)
sys.argv = ["k3deploy", *sys.argv[2:]]
from k3deploy.cli import main
main()
"""


@pytest.mark.parametrize("faked", ["3.11.0", "3.9.3"])
def test_another_pyinfra_is_refused_in_one_line_before_any_host_is_reached(faked):
    proc = subprocess.run([sys.executable, "-c", _FAKED_VERSION, faked, "status", "inventories/gb300.py"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {internals.refusal(faked)}"]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_the_same_process_with_the_supported_version_gets_past_the_check():
    code = _FAKED_VERSION.replace("from k3deploy.cli import main\nmain()", "import k3deploy.runtime.connections")
    proc = subprocess.run([sys.executable, "-c", code, "3.10.0"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr


def _host_with_layers():
    """A host whose global arguments come from every layer: its own data, its group's, the inventory's, a value
    pyinfra reads from a callable layer (a ``@deploy``'s data defaults), and the configuration."""
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory((["n1", ("n2", {"_sudo": True, "_timeout": 30})], {"_env": {"A": "1"}, "_retries": 2}),
                          gpus=(["n1"], {"_sudo_user": "k3", "_retries": 3}))
    config = Config()
    config.SHELL = "bash"
    state = State(inventory=inventory, config=config)
    return state, inventory


def _both(state, host, kwargs):
    """pyinfra's result and ours for the same call (each on its own copy of ``kwargs``), and what each left."""
    theirs_kwargs, ours_kwargs = dict(kwargs), dict(kwargs)
    outcomes: list[Any] = []
    for pop, left in ((internals._pyinfra_pop_global_arguments, theirs_kwargs),
                      (internals.pop_global_arguments, ours_kwargs)):
        try:
            outcomes.append(pop(state, host, left))
        except pyinfra.api.exceptions.ArgumentTypeError as exc:
            outcomes.append(("refused", str(exc)))
    return outcomes, (theirs_kwargs, ours_kwargs)


@pytest.mark.parametrize("kwargs", [
    {}, {"name": "x", "_sudo": False, "path": "/a"}, {"_if": [lambda: True], "_timeout": 5, "_env": {"B": "2"}},
    {"_retries": 0, "_stdin": "text"}, {"_sudo": "yes"}, {"_timeout": "soon"},
])
def test_global_arguments_are_popped_as_pyinfra_pops_them(kwargs):
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra.context import host as host_context

    state, inventory = _host_with_layers()
    for name in ("n1", "n2"):
        host = inventory.get_host(name)
        (theirs, ours), (theirs_left, ours_left) = _both(state, host, kwargs)
        assert ours == theirs and ours_left == theirs_left
        with ctx_state.use(state), ctx_host.use(host):   # through pyinfra's context object, as operations call it
            (theirs, ours), _ = _both(state, host_context, kwargs)
            assert ours == theirs
            host.current_deploy_kwargs = {"_sudo": True, "_timeout": 9}   # inside a @deploy's arguments
            (theirs, ours), _ = _both(state, host_context, kwargs)
            assert ours == theirs
            host.current_deploy_kwargs = None


def test_popped_global_arguments_come_from_the_nearest_layer():
    state, inventory = _host_with_layers()
    popped, found = internals.pop_global_arguments(state, inventory.get_host("n1"), {"name": "x", "_timeout": 5})
    assert sorted(found) == ["_timeout", "name"]   # an operation's name is one of them
    assert (popped["_sudo"], popped["_sudo_user"], popped["_retries"], popped["_timeout"]) == (False, "k3", 3, 5)
    assert popped["_env"] == {"A": "1"}   # the inventory's, through pyinfra's handler
    popped, _ = internals.pop_global_arguments(state, inventory.get_host("n2"), {})
    assert (popped["_sudo"], popped["_sudo_user"], popped["_retries"], popped["_timeout"]) == (True, None, 2, 30)


def test_an_operations_signature_is_made_once_per_function_and_is_inspects():
    import inspect

    import pyinfra.api.operation  # noqa: F401 (the module)

    from k3deploy.runtime.operations import write_files

    func = write_files._inner
    internals.signature.cache_clear()
    assert internals.signature(func) == inspect.signature(func)
    assert internals.signature(func) is internals.signature(func)
    assert internals.signature(internals.settle_heap) != internals.signature(func)   # one per function
    internals.install()
    assert sys.modules["pyinfra.api.operation"].signature is internals.signature
    assert sys.modules["pyinfra.api.operation"].pop_global_arguments is internals.pop_global_arguments
