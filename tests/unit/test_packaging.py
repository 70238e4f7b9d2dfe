"""What ``pip install .`` gives: the product's wheel holds the tool, the deploy file and its pyinfra configuration,
and nothing of the simulator (``simulator/``, package ``k3sim``, installed for development only); other installed
packages add commands through the entry point group ``k3deploy.commands``, as the simulator adds ``k3deploy sim``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from helpers import K3DEPLOY, ROOT


def wheel_files(out: Path) -> list[str]:
    """The files setuptools puts into the product's wheel (its build_py step: the packages and their package data,
    symbolic links copied as the files they name), relative to the wheel's root."""
    proc = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q",
                           "egg_info", "--egg-base", str(out), "build_py", "--build-lib", str(out / "lib")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return sorted(str(p.relative_to(out / "lib")) for p in (out / "lib").rglob("*") if p.is_file())


def test_the_product_wheel_holds_the_tool_and_no_simulator(tmp_path):
    files = wheel_files(tmp_path)
    assert "k3deploy/cli/__init__.py" in files and "k3deploy/cli/deploy.py" in files
    assert [f for f in files if not f.startswith("k3deploy/")] == []
    assert [f for f in files if "k3sim" in f or "node_tools" in f or f.startswith("k3deploy/sim")] == []
    # the deploy file and its configuration, as real files (the clone's deploy/k3.py and config.py run them)
    built = tmp_path / "lib" / "k3deploy" / "data" / "deploy"
    for name in ("k3.py", "config.py"):
        assert not (built / name).is_symlink() and not (ROOT / "k3deploy" / "data" / "deploy" / name).is_symlink()
        assert (built / name).read_text() == (ROOT / "k3deploy" / "data" / "deploy" / name).read_text()
    assert "roll_out(ctx=run)" in (built / "k3.py").read_text()
    assert "give_pyinfra_group_vars()" in (built / "config.py").read_text()


def test_the_clones_deploy_file_and_configuration_run_the_packaged_ones():
    """``pyinfra INVENTORY deploy/k3.py`` in a clone runs what ``k3deploy deploy INVENTORY`` runs, not a copy."""
    for shim, name in ((ROOT / "deploy" / "k3.py", "DEPLOY"), (ROOT / "config.py", "CONFIG")):
        body = ast.parse(shim.read_text()).body[1:]   # after the docstring
        assert [ast.unparse(node) for node in body] == [
            f"from k3deploy.runtime.command import {name}", f"exec(compile({name}.read_text(), str({name}), 'exec'))"]


def test_the_simulator_is_a_package_of_its_own():
    text = (ROOT / "simulator" / "pyproject.toml").read_text()
    assert '[project.entry-points."k3deploy.commands"]\nsim = "k3sim.cli:sim_group"' in text
    assert not (ROOT / "k3deploy" / "sim").exists()


PLUGIN = '''import click


@click.command("hello")
def hello():
    """Say hello."""
    click.echo("hello from a plugin")


@click.command("resolve")
def resolve():
    click.echo("a plugin's resolve")
'''


def test_an_installed_package_adds_a_command_and_hides_none(tmp_path):
    (tmp_path / "k3demo.py").write_text(PLUGIN)
    info = tmp_path / "k3demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: k3demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[k3deploy.commands]\nhello = k3demo:hello\nresolve = k3demo:resolve\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    def k3(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*K3DEPLOY, *args], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)

    hello = k3("hello")
    assert (hello.returncode, hello.stdout) == (0, "hello from a plugin\n"), hello.stderr
    listing = k3("--help").stdout
    assert "hello" in listing and "Say hello." in listing
    resolve = k3("resolve", "--hardware", "h200", "--nodes", "2", "--json")
    assert resolve.returncode == 0, resolve.stderr
    assert "a plugin's resolve" not in resolve.stdout and resolve.stdout.lstrip().startswith("{")
    unknown = k3("no-such-command")
    assert unknown.returncode == 2 and "No such command 'no-such-command'" in unknown.stderr


def test_a_runs_inventory_and_command_are_read_as_pyinfra_reads_them_whatever_the_folders(tmp_path):
    """The inventory of a run (its group_vars, its lock record) is pyinfra's own reading of the command line: an
    inventory in a folder named ``deploy`` is the inventory, the deploy file in one is not; an interrupted run names
    the command the user ran."""
    from k3deploy.runtime.command import DEPLOY, inventory_argument, pyinfra_argv, shown_command

    inv = tmp_path / "deploy" / "site.py"
    inv.parent.mkdir()
    inv.write_text("nodes = ['n1']\n")
    assert inventory_argument(["pyinfra", *pyinfra_argv(str(inv), ["-y"])]) == str(inv)
    assert inventory_argument(["pyinfra", "-y", "--limit", "n1", str(inv), "deploy/k3.py", "--dry"]) == str(inv)
    assert inventory_argument(["pyinfra", "@local", str(DEPLOY)]) is None
    assert shown_command(["pyinfra", *pyinfra_argv(str(inv), ["--dry", "--diff"])]) == \
        f"k3deploy deploy {inv} --dry --diff"
    assert shown_command(["pyinfra", str(inv), "deploy/k3.py", "-y"]) == f"pyinfra {inv} deploy/k3.py -y"
