"""The deploy's command lines: what ``k3deploy deploy INVENTORY [options]`` runs (pyinfra with the deploy file and the
configuration the package ships: :data:`DEPLOY`, :data:`CONFIG`), and, inside a run, what pyinfra's command line
was given: the inventory (:func:`inventory_argument`, read by pyinfra's own parser) and the command as the user typed
it (:func:`shown_command`: ``k3deploy deploy ...`` where that started the run, else ``pyinfra ...``).

    >>> pyinfra_argv("site/inventory.py", ["-y"])[-3:]
    ['site/inventory.py', '.../k3deploy/data/deploy/k3.py', '-y']
    >>> shown_command(["pyinfra", *pyinfra_argv("site/inventory.py", ["-y", "--data", "k3_rollback=true"])])
    'k3deploy deploy site/inventory.py -y --data k3_rollback=true'
    >>> shown_command(["pyinfra", "inventories/gb300.py", "deploy/k3.py", "-y"])
    'pyinfra inventories/gb300.py deploy/k3.py -y'
    >>> repair_argv("site/inventory.py")[1:]
    ['-m', 'k3deploy.cli', 'deploy', 'site/inventory.py', '-y']
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

#: what pyinfra runs for ``k3deploy deploy``: the deploy file and the configuration it loads before the inventory
#: (a clone's ``deploy/k3.py`` and ``config.py``, shipped inside the package)
DEPLOY = Path(__file__).resolve().parents[1] / "data" / "deploy" / "k3.py"
CONFIG = DEPLOY.with_name("config.py")
#: what the run says to converge every group when it cannot tell what the user ran
CONVERGE = "pyinfra INVENTORY deploy/k3.py -y"


def pyinfra_argv(inventory: str, options: list[str]) -> list[str]:
    """pyinfra's command line (without the program) for the deploy of ``inventory``, with pyinfra's ``options``."""
    return ["--config", str(CONFIG), inventory, str(DEPLOY), *options]


def repair_argv(inventory: str) -> list[str]:
    """The deploy of the whole inventory as a process of this interpreter runs it (``k3deploy deploy INVENTORY -y``:
    the installed deploy, from any directory)."""
    return [sys.executable, "-m", "k3deploy.cli", "deploy", inventory, "-y"]


def _parsed(argv: list[str]) -> tuple[str | None, tuple[str, ...]]:
    """(inventory, deploy files) of pyinfra's command line ``argv`` (without the program), as pyinfra's own parser
    reads them; (None, ()) where it cannot."""
    import click
    from pyinfra_cli.main import cli

    try:
        params = cli.make_context("pyinfra", list(argv), resilient_parsing=True).params
    except click.ClickException:
        return None, ()
    inventory = params.get("inventory")
    return (str(inventory) if inventory else None), tuple(str(o) for o in params.get("operations") or ())


def inventory_argument(argv: list[str] | None = None) -> str | None:
    """The inventory file of this ``pyinfra`` run (``argv``: its ``sys.argv``), whatever the folders of it and of the
    deploy file are called; None when it is no .py file here (a host list, ``@local``)."""
    inventory, _ = _parsed((sys.argv if argv is None else argv)[1:])
    if inventory is None or not inventory.endswith(".py") or not Path(inventory).is_file():
        return None
    return inventory


def shown_command(argv: list[str] | None = None) -> str:
    """The command that started this ``pyinfra`` run (``argv``: its ``sys.argv``), as the user typed it: ``k3deploy
    deploy INVENTORY OPTIONS`` where that ran it (pyinfra's command line is then :func:`pyinfra_argv`'s), else the
    ``pyinfra`` line."""
    args = (sys.argv if argv is None else argv)[1:]
    if not args:
        return CONVERGE
    inventory, operations = _parsed(args)
    if inventory is not None and args[:2] == ["--config", str(CONFIG)] and operations == (str(DEPLOY),):
        options = args[args.index(str(DEPLOY), 3) + 1:]
        return shlex.join(["k3deploy", "deploy", inventory, *options])
    return shlex.join(["pyinfra", *args])
