"""``k3deploy deploy INVENTORY [pyinfra options...]``: the deploy from any directory, without a clone.

The same run as ``pyinfra INVENTORY deploy/k3.py`` from a clone's top directory: pyinfra runs the deploy file the
package ships (:data:`k3deploy.runtime.command.DEPLOY`, which the clone's ``deploy/k3.py`` runs) with the package's
``config.py`` (:data:`k3deploy.runtime.command.CONFIG`: each host gets the connection settings of its group_vars, SSH
offers AES-GCM first, an interruption ends the run saying what it left and the ``k3deploy deploy`` line that
converges it), so the working directory does not matter. The process becomes
pyinfra's (same exit codes, same output); every option after INVENTORY goes to pyinfra as it is::

    k3deploy deploy site/inventory.py -y                           # roll out
    k3deploy deploy site/inventory.py --dry --diff                 # review first
    k3deploy deploy site/inventory.py -y --data k3_rollback=true   # back to each group's previous revision

    >>> pyinfra_argv("site/inventory.py", ["-y"])[:1]
    ['--config']
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from k3deploy.errors import K3Error
from k3deploy.runtime.command import pyinfra_argv


def check_inventory(inventory: str) -> None:
    """A pyinfra inventory file that is there, else one line naming it and the fix (pyinfra would take any other word
    for a host name and try to connect to it).

    >>> check_inventory("no/such/inventory.py")
    Traceback (most recent call last):
    k3deploy.errors.K3Error: inventory 'no/such/inventory.py': no such file: give the path of a pyinfra ...
    """
    path = Path(inventory)
    if not path.exists():
        raise K3Error(f"inventory {inventory!r}: no such file: give the path of a pyinfra inventory file (a .py "
                      "file, e.g. inventories/gb300.py of a clone)")
    if not path.is_file() or path.suffix != ".py":
        raise K3Error(f"inventory {inventory!r}: not a pyinfra inventory file: give the path of one (a .py file, "
                      "e.g. inventories/gb300.py of a clone)")


#: pyinfra's options that leave nothing to confirm at its "Press enter to execute" prompt
NO_PROMPT = ("-y", "--yes", "--dry")


def check_confirmable(options: tuple[str, ...] | list[str], interactive: bool) -> None:
    """Refuse, in one line with the fix, a run whose changes pyinfra would ask to confirm with no terminal to
    answer (cron, CI, a pipe): its prompt would meet the end of input and fail with a traceback.

    >>> check_confirmable(["-y"], interactive=False)
    >>> check_confirmable([], interactive=False)
    Traceback (most recent call last):
    k3deploy.errors.K3Error: k3deploy deploy: standard input is not a terminal, so no one can confirm the changes ...
    """
    if interactive or any(o in NO_PROMPT for o in options):
        return
    raise K3Error("k3deploy deploy: standard input is not a terminal, so no one can confirm the changes at pyinfra's "
                  "prompt: add -y to apply them, or --dry to see them")


@click.command("deploy", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("inventory")
@click.argument("options", nargs=-1, type=click.UNPROCESSED)
def deploy(inventory: str, options: tuple[str, ...]) -> None:
    """Run the deploy on INVENTORY from any directory: the same run as `pyinfra INVENTORY deploy/k3.py` in a clone.

    Every option after INVENTORY goes to pyinfra: -y (apply), --dry, --diff, --data k3_rollback=true, --limit ...
    """
    check_inventory(inventory)
    check_confirmable(options, sys.stdin is not None and sys.stdin.isatty())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "pyinfra", *pyinfra_argv(inventory, list(options))])
