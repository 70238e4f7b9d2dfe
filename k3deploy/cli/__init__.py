"""The ``k3deploy`` command line.

Sub-commands are imported lazily so that ``k3deploy resolve`` stays fast: pyinfra and rich are only imported by the
commands that need them, and gevent only by a command line that may reach hosts (:func:`reaches_hosts`). To add a
command, add one line to ``COMMANDS`` (and to ``OFFLINE`` if it never reaches a host).

Another installed package adds commands through the entry point group ``k3deploy.commands`` (name -> a click
command), read only for a name that is not one of ``COMMANDS`` and for the list in ``--help``; the simulated
cluster's ``k3deploy sim`` comes so (``simulator/pyproject.toml``). A plugin's name never hides a built-in command::

    >>> sorted(set(COMMANDS) - set(cli.list_commands(click.Context(cli))))
    []
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, cast

import click

from k3deploy.errors import K3Error

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

#: the entry point group through which other installed packages add commands
PLUGINS = "k3deploy.commands"
#: command name -> "module:attribute" of a click command
COMMANDS: dict[str, str] = {
    "resolve": "k3deploy.cli.resolve:resolve",
    "options": "k3deploy.cli.options:options",
    "preflight": "k3deploy.cli.preflight:preflight",
    "deploy": "k3deploy.cli.deploy:deploy",
    "lint": "k3deploy.cli.lint:lint",
    "plan": "k3deploy.cli.plan:plan", "runbook": "k3deploy.cli.runbook:runbook",
    "vars": "k3deploy.cli.vars:vars_cmd", "history": "k3deploy.cli.history:history",
    "status": "k3deploy.cli.status:status", "bundle": "k3deploy.cli.bundle:bundle",
    "unlock": "k3deploy.cli.unlock:unlock",
    "verify": "k3deploy.cli.verify:verify",
    "export": "k3deploy.cli.export:export",
    "watch": "k3deploy.cli.watch:watch",
    "spares": "k3deploy.cli.spares:spares",
    "bench": "k3deploy.cli.bench:bench",
    "timeline": "k3deploy.cli.timeline:timeline",
}

#: commands that reach no host unless given ``--inventory``: their process is not patched for gevent
OFFLINE: frozenset[str] = frozenset({"lint", "options", "resolve"})


def reaches_hosts(args: list[str]) -> bool:
    """Whether a command line may reach hosts, and so wants :func:`green_io`: any command but an ``OFFLINE`` one
    without ``--inventory``. The group's own options (``--help``, ``--version``) take no value, so the first word
    that is not an option names the command.

    >>> reaches_hosts(["resolve", "--hardware", "gb300", "--json"])
    False
    >>> reaches_hosts(["resolve", "--inventory", "inventories/gb300.py"])
    True
    >>> reaches_hosts(["plan", "inventories/gb300.py"])
    True
    >>> reaches_hosts(["--version"])
    False
    """
    command = next((arg for arg in args if not arg.startswith("-")), None)
    if command is None:
        return False
    if command not in OFFLINE:
        return True
    return any(arg == "--inventory" or arg.startswith("--inventory=") for arg in args)


def plugins() -> dict[str, EntryPoint]:
    """The commands other installed packages add (entry point group :data:`PLUGINS`), by name; the built-in
    ``COMMANDS`` keep their names (read here, not at import: the built-in commands start without it)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=PLUGINS) if ep.name not in COMMANDS}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *plugins()})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            plugin = plugins().get(name)
            return None if plugin is None else cast(click.Command, plugin.load())
        module, _, attr = target.partition(":")
        return cast(click.Command, getattr(importlib.import_module(module), attr))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="k3deploy")
def cli() -> None:
    """Deploy Kimi-K3 on vLLM to bare-metal GPU clusters."""


def green_io() -> None:
    """Patch the standard library's blocking I/O for gevent, as pyinfra's own command does: the commands that reach
    hosts read them in parallel greenlets over pyinfra's connections. Done by the process's own entry point only, first
    thing, before any command is imported, and only for a command line that may reach hosts (:func:`reaches_hosts`):
    the others do without importing gevent."""
    from gevent import monkey

    monkey.patch_all()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line on stderr and exit code 2.

    Called with ``argv`` (from Python, e.g. a test), the caller's process is left as it is: its hosts are read one
    after another instead of in parallel greenlets (see :func:`green_io`)."""
    if argv is None and reaches_hosts(sys.argv[1:]):
        green_io()
    try:
        rv = cli.main(args=argv, prog_name="k3deploy", standalone_mode=False)
    except K3Error as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    sys.exit(rv if isinstance(rv, int) else 0)
