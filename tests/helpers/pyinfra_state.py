"""A pyinfra ``State`` as pyinfra's command line makes it before it calls a deploy file, for tests that call the
deploy's phases for every host without connecting to any.

    >>> state = cli_state(["n0", "n1"])
    >>> [h.name for h in state.inventory], state.current_stage.name
    (['n0', 'n1'], 'Prepare')
"""

from __future__ import annotations

from collections.abc import Sequence

from pyinfra.api import Config, Inventory, State
from pyinfra.api.state import StateStage


def cli_state(hosts: Sequence[str], deploy_file: str = __file__) -> State:
    """An inventory of ``hosts`` and its state in the prepare stage, its operations counted from ``deploy_file``
    (set ``pyinfra.is_cli`` too, as the tests' monkeypatch does, for the operations to be collected)."""
    state = State(Inventory((list(hosts), {})), Config())
    state.current_deploy_filename = deploy_file
    state.current_op_file_number = 0
    state.set_stage(StateStage.Prepare)
    return state


__all__ = ["cli_state"]
