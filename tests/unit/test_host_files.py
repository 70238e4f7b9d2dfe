"""A host's files in one command (:func:`k3deploy.runtime.operations.write_files`): the script is the command line,
the contents come on its stdin, run here with a real ``sh`` on a real directory: every file lands whole with its
mode, root's; no content is in the command line; a taken temporary name stops the command there (the files before
it are whole, that one is not written); a file up to date is not written."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.command import StringCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from k3deploy.runtime.operations import Written, write_files

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the files are root's: run as root")


def commands_of(files: list[Written]) -> list[StringCommand]:
    host = create_host(FakeState())
    with ctx_state.use(FakeState()), ctx_host.use(host):
        return list(write_files._inner(files=files))


def run(command: StringCommand) -> subprocess.CompletedProcess[bytes]:
    stdin = str(command.connector_arguments.get("_stdin", ""))
    return subprocess.run(command.get_raw_value(), shell=True, capture_output=True,
                          input=(stdin + "\n").encode())   # pyinfra ends what it sends on stdin with a newline


@root_only
def test_every_file_lands_whole_with_its_mode_and_no_content_is_in_argv(tmp_path):
    tmp_path.chmod(0o755)
    secret = "HF_TOKEN=hf_hostFILESsecret0123\n"
    files = [Written(str(tmp_path / "etc" / "k3-engine.env"), secret, "600", "env", seen=(None, None)),
             Written(str(tmp_path / "etc" / "k3-engine.service"), "[Unit]\nDescription=ü\n", "644", "unit",
                     seen=(None, None)),
             Written(str(tmp_path / "lib" / "helper"), "#!/bin/sh\necho no newline at the end", "755",
                     seen=(None, None))]
    cmds = commands_of(files)
    assert len(cmds) == 1 and "hf_hostFILESsecret" not in cmds[0].get_raw_value()   # one command, no content
    assert "hf_hostFILESsecret" not in repr(files)
    proc = run(cmds[0])
    assert proc.returncode == 0, proc.stderr
    for f in files:
        st = os.stat(f.dest)
        assert (st.st_uid, oct(st.st_mode & 0o777)[2:]) == (0, f.mode) and Path(f.dest).read_text() == f.content
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == ["k3-engine.env", "k3-engine.service"]


@root_only
def test_a_taken_temporary_name_stops_the_command_there_and_that_file_is_not_written(tmp_path):
    tmp_path.chmod(0o755)
    files = [Written(str(tmp_path / "a.env"), "A=1\n", "600", seen=(None, None)),
             Written(str(tmp_path / "b.env"), "B=2\n", "600", seen=(None, None))]
    cmd = commands_of(files)[0]
    taken = next(p for p in shlex.split(shlex.split(cmd.get_raw_value())[2]) if p.endswith("-1.tmp"))
    Path(taken).write_text("someone else's\n")   # the second file's name exists already
    assert run(cmd).returncode != 0
    assert (tmp_path / "a.env").read_text() == "A=1\n"   # the first one, written before, is whole
    assert not (tmp_path / "b.env").exists() and Path(taken).read_text() == "someone else's\n"


def test_a_file_up_to_date_is_not_written_and_a_condition_that_fails_writes_nothing():
    same = Written("/etc/k3deploy/a.env", "A=1\n", "600", seen=(hashlib.sha256(b"A=1\n").hexdigest(), "A=1\n"))
    held = Written("/etc/k3deploy/b.env", "B=2\n", "600", seen=(None, None), when=lambda: False)
    assert commands_of([same, held]) == []


def test_a_file_as_the_hosts_reading_found_it_is_not_read_again(monkeypatch):
    from k3deploy.facts.rollout import FileState
    from k3deploy.model.observed import FileMeta

    content = "[Socket]\n"
    sha = hashlib.sha256(content.encode()).hexdigest()
    host = create_host(FakeState())
    asked: list[object] = []

    def get_fact(*args: object, **kwargs: object) -> FileState:
        asked.append(args)
        return FileState()

    monkeypatch.setattr(host, "get_fact", get_fact, raising=False)

    def commands(read: FileState | None) -> list[StringCommand]:
        with ctx_state.use(FakeState()), ctx_host.use(host):
            return list(write_files._inner(files=[Written("/etc/systemd/system/k3-fence-8479.socket", content,
                                                          "644", read=read)]))

    assert commands(FileState(sha, FileMeta(0, 0, "644"))) == [] and asked == []   # up to date
    drifted = commands(FileState(sha, FileMeta(0, 0, "600")))
    assert len(drifted) == 1 and "chmod 644" in drifted[0].get_raw_value() and "_stdin" not in \
        drifted[0].connector_arguments   # its mode back, the content left
    assert len(commands(FileState("0" * 64, FileMeta(0, 0, "644")))) == 1 and asked == []   # written
    assert len(commands(None)) == 1 and len(asked) == 1   # not read with the facts: read here
