"""How files reach the nodes: managed_file's commands, run here with a real ``sh`` on a real directory (the SFTP
upload in between is a plain write into the file, as SFTP does it); the runbook's form; the owner-and-mode repair."""

from __future__ import annotations

import io
import os
import re
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from k3deploy.model.commands import install_file
from k3deploy.runtime.operations import managed_file

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the files are root's: run as root")


def commands_of(dest: str, content: str, mode: str, **global_args: object) -> list:
    """What managed_file yields for a file the host does not have yet."""
    host = create_host(FakeState())
    host.current_op_global_arguments = global_args or None
    with ctx_state.use(FakeState()), ctx_host.use(host):
        return list(managed_file._inner(dest=dest, content=content, mode=mode, seen=(None, None)))


def run(command: StringCommand) -> subprocess.CompletedProcess:
    return subprocess.run(command.get_raw_value(), shell=True, capture_output=True, text=True)


def written(cmds: list, upload_as=None) -> None:
    """Run the commands; the upload writes into the file as SFTP does (an existing file keeps owner and mode)."""
    for c in cmds:
        if isinstance(c, FileUploadCommand):
            with open(c.dest, "wb") as f:
                assert isinstance(c.src, io.BytesIO)
                f.write(c.src.getvalue())
        else:
            proc = run(c)
            assert proc.returncode == 0, proc.stderr


@root_only
def test_a_secret_goes_through_a_new_root_only_file_of_an_unpredictable_name(tmp_path):
    d = tmp_path / "etc"
    dest = d / "k3-engine.env"
    cmds = commands_of(str(dest), "HF_TOKEN=hf_secret\n", "600")
    again = commands_of(str(dest), "HF_TOKEN=hf_secret\n", "600")
    assert [type(c) for c in cmds] == [StringCommand, FileUploadCommand, StringCommand]
    temp = cmds[1].dest
    assert re.fullmatch(re.escape(f"{d}/.k3-") + "[0-9a-f]{32}" + re.escape(".tmp"), temp)
    assert temp != again[1].dest   # drawn anew each time: nobody can name it beforehand
    assert not any("pyinfra-" in str(getattr(c, "dest", "")) + (c.get_raw_value() if isinstance(c, StringCommand)
                                                                 else "") for c in cmds)
    assert run(cmds[0]).returncode == 0
    st = os.lstat(temp)   # made before a byte of the content is written: root's, 0600
    assert (st.st_uid, st.st_mode & 0o777, st.st_size) == (0, 0o600, 0)
    assert run(cmds[0]).returncode != 0   # created only where no file of that name exists
    written(cmds[1:])
    st = os.stat(dest)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o600) and dest.read_text() == "HF_TOKEN=hf_secret\n"
    assert [p.name for p in d.iterdir()] == ["k3-engine.env"]


@root_only
def test_a_temporary_file_someone_else_got_hold_of_is_not_installed(tmp_path):
    d = tmp_path / "etc"
    dest = d / "k3-engine.service"
    for change in (lambda p: os.chown(p, 1000, 1000), lambda p: os.chmod(p, 0o666)):
        cmds = commands_of(str(dest), "[Unit]\n", "644")
        assert run(cmds[0]).returncode == 0
        change(cmds[1].dest)
        written([cmds[1]])
        proc = run(cmds[2])
        assert proc.returncode == 1 and "not a plain file of root's with mode 0600" in proc.stderr
        assert not dest.exists() and not Path(cmds[1].dest).exists()


@root_only
def test_no_file_goes_into_a_directory_others_can_write_to(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o777)
    cmds = commands_of(str(d / "k3-engine.env"), "A=1\n", "600")
    proc = run(cmds[0])
    assert proc.returncode == 1 and f"{d} is owned by uid 0 with mode 777" in proc.stderr
    assert list(d.iterdir()) == []
    d.chmod(0o755)
    os.chown(d, 1000, 1000)
    proc = run(cmds[0])
    assert proc.returncode == 1 and f"{d} is owned by uid 1000" in proc.stderr


def test_under_sudo_the_ssh_user_uploads_into_a_private_directory_root_then_installs_from():
    cmds = commands_of("/etc/k3deploy/hf-token", "hf_secret\n", "600", _sudo=True)
    make, upload, install = cmds
    private = upload.dest.rsplit("/", 1)[0]
    assert re.fullmatch(r".*/k3-[0-9a-f]{32}", private)   # in pyinfra's temporary directory, a name drawn anew
    # the SSH user, as itself (SFTP cannot write a file of root's): a new 0700 directory, mkdir fails if it exists
    assert make.connector_arguments["_sudo"] is False and upload.connector_arguments["_sudo"] is False
    assert f"umask 077 && mkdir {private}" in make.get_raw_value() and "-p" not in make.get_raw_value()
    # then root (the operation's sudo): a new 0600 file in /etc/k3deploy filled from it, the directory removed
    assert "_sudo" not in install.connector_arguments
    raw = install.get_raw_value()
    assert "set -C" in raw and f"p={private};" in raw and 'cat "$p/f"' in raw and 'rm -rf "$p"' in raw
    assert "/etc/k3deploy/.k3-" in raw and "mv -f" in raw


@root_only
def test_the_runbook_writes_through_mktemp_in_the_destination_directory(tmp_path):
    d = tmp_path / "etc"
    dest = d / "a.env"
    d.mkdir()
    (d / "a.env.new").symlink_to(tmp_path / "elsewhere")   # the old fixed name, taken beforehand
    proc = subprocess.run(["bash", "-e", "-c", install_file(str(dest), "S=1\n", "0600")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert dest.read_text() == "S=1\n" and not (tmp_path / "elsewhere").exists()
    st = os.stat(dest)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert sorted(p.name for p in d.iterdir()) == ["a.env", "a.env.new"]
    os.chown(d, 1000, 1000)   # (its mode the script sets itself)
    proc = subprocess.run(["bash", "-e", "-c", install_file(str(dest), "S=2\n", "0600")], capture_output=True,
                          text=True)
    assert proc.returncode != 0 and "writable by root only" in proc.stderr and dest.read_text() == "S=1\n"


@root_only
def test_owner_and_mode_come_back_and_the_content_stays(tmp_path):
    from k3deploy.model.commands import lock_down

    env, link = tmp_path / "k3.env", tmp_path / "link"
    env.write_text("A=1\n")
    env.chmod(0o644)
    os.chown(env, 1000, 1000)
    link.symlink_to(env)
    proc = subprocess.run(["sh", "-c", lock_down([(str(env), "600"), (str(link), "600"),
                                                  (str(tmp_path / "none"), "600")])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    st = os.stat(env)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o600) and env.read_text() == "A=1\n"


@root_only
def test_a_users_file_gets_its_mode_back_and_stays_that_users(tmp_path):
    """A Slurm job's env file (``k3_slurm_user``): its mode drifted, it gets the mode back and stays its user's."""
    import pwd

    from k3deploy.model.commands import lock_down
    from k3deploy.model.observed import FileMeta

    user = pwd.getpwuid(65534)   # nobody: a user that is not root
    env = tmp_path / "k3.env"
    env.write_text("A=1\n")
    env.chmod(0o644)
    os.chown(env, user.pw_uid, user.pw_gid)
    st = os.stat(env)
    assert FileMeta(st.st_uid, st.st_gid, f"{st.st_mode & 0o777:o}").drift("600", owned=True) is not None
    proc = subprocess.run(["sh", "-c", lock_down([(str(env), "600", user.pw_name)])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    st = os.stat(env)
    assert (st.st_uid, st.st_mode & 0o777) == (user.pw_uid, 0o600) and env.read_text() == "A=1\n"
    assert FileMeta(st.st_uid, st.st_gid, f"{st.st_mode & 0o777:o}").drift("600", owned=True) is None
