"""Many facts of a host in one command: the values are the ones each fact gives when read alone, a missing tool
included; an ``@fake`` host is read one fact at a time, since it answers one scripted output per command."""

from __future__ import annotations

import dataclasses
import os

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.facts import get_fact
from pyinfra.context import ctx_host, ctx_state

from helpers import FIXTURES
from k3deploy.facts.batch import MARK, Batch, read_batch, specs
from k3deploy.preflight import runner
from k3deploy.vendors.ascend.facts import NpuSmiInfo
from k3deploy.vendors.nvidia.facts import NvidiaGpus

#: every preflight fact, by a name of its own
ITEMS = [(f"f{i}", cls, kwargs) for i, (cls, kwargs) in enumerate(runner.CAPTURE_FACTS)]


def _connected(name: str, data: dict | None = None):
    runner.quiet_pyinfra()
    inventory = Inventory(([name], data or {}))
    state = State(inventory=inventory, config=Config())
    host = inventory.get_host(name)
    host.connect(raise_exceptions=True)
    return state, host


@pytest.fixture
def gpu_tools(tmp_path, monkeypatch):
    """This machine with an ``nvidia-smi`` that answers as a GB300 tray does (its recorded output)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in\n"
                   f"  *--query-gpu*) cat {FIXTURES / 'nvidia/query-gpu-gb300.txt'} ;;\n"
                   f"  *-q*) cat {FIXTURES / 'nvidia/smi-q-gb300-completed.txt'} ;;\n"
                   "  *) exit 1 ;;\nesac\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_a_batch_gives_each_fact_the_value_it_has_alone(gpu_tools):
    state, host = _connected("@local")
    with ctx_state.use(state), ctx_host.use(host):
        batched = read_batch(state, host, ITEMS)
        alone = {name: get_fact(state, host, cls, kwargs=kwargs, apply_failed_hosts=False)
                 for name, cls, kwargs in ITEMS}
    # free space moves between the two reads (other processes write): compare it apart, within 64 MiB; interfaces
    # that came or went between the two reads (simulated clusters of tests running beside this one) are left out
    def interfaces(values: dict) -> set:
        return {a.interface for v in values.values() if isinstance(v, runner.hostfacts.AddressInterface)
                for a in v.addresses}

    both = interfaces(batched) & interfaces(alone)

    def steady(v):
        if isinstance(v, runner.hostfacts.DiskSpace):
            return dataclasses.replace(v, available_bytes=0)
        if isinstance(v, runner.hostfacts.AddressInterface):
            return dataclasses.replace(v, addresses=[a for a in v.addresses if a.interface in both])
        return v

    assert {k: steady(v) for k, v in batched.items()} == {k: steady(v) for k, v in alone.items()}
    for k, v in batched.items():
        if isinstance(v, runner.hostfacts.DiskSpace):
            assert abs(v.available_bytes - alone[k].available_bytes) < 64 << 20
    gpus = batched[f"f{[c for c, _ in runner.CAPTURE_FACTS].index(NvidiaGpus)}"]
    assert gpus and len(gpus) == 4 and "GB300" in gpus[0].name   # a tool that is there: its parsed output
    missing = [name for name, cls, _ in ITEMS if cls is NpuSmiInfo]
    assert batched[missing[0]] == NpuSmiInfo.default()  # a tool that is not: the fact's default


def test_one_command_holds_every_fact_behind_its_own_marker():
    command = Batch().command(specs(ITEMS))
    assert [line for line in command.splitlines() if line.startswith(f"echo {MARK}")] == \
        [f"echo {MARK}{name}" for name, _, _ in ITEMS]


def test_a_fake_host_is_read_one_fact_at_a_time(monkeypatch):
    from pyinfra.connectors.fake import FakeConnector

    from k3deploy.facts import batch

    # the fact-source seam: a test names the hosts that answer one scripted output per command
    monkeypatch.setattr(batch, "one_at_a_time", lambda host: isinstance(host.connector, FakeConnector))
    state, host = _connected("@fake/n1", {"fake_delay": 0, "fake_delay_jitter": 0,
                                          "fake_responses": {"uname -r": ["6.8.0-1031-nvidia-64k"]}})
    kernel = [item for item in ITEMS if item[1] is runner.hostfacts.KernelVersion]
    shm = [item for item in ITEMS if item[1] is runner.hostfacts.ShmSize]
    with ctx_state.use(state), ctx_host.use(host):
        values = read_batch(state, host, kernel + shm)
    assert len(host.connector.executed_commands) == 2
    assert values[kernel[0][0]] is not None and "6.8.0" in str(values[kernel[0][0]])


def test_the_output_comes_packed_where_the_host_has_gzip_and_base64_and_plain_otherwise(tmp_path):
    import shutil
    import subprocess

    from k3deploy.facts.batch import PACKED
    from k3deploy.facts.host import KernelVersion

    command = Batch().command(specs([("kernel", KernelVersion, {})]))

    def run(*tools: str) -> list[str]:
        bin_dir = tmp_path / "-".join(tools)
        bin_dir.mkdir()
        for tool in tools:
            (bin_dir / tool).symlink_to(shutil.which(tool))
        res = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env={"PATH": str(bin_dir)})
        assert res.returncode == 0, res.stderr
        return res.stdout.splitlines()

    kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()
    packed, plain = run("uname", "timeout", "gzip", "base64"), run("uname", "timeout")
    assert packed[0].startswith(PACKED) and not any(line.startswith(MARK) for line in packed)
    assert plain[0] == f"{MARK}kernel"
    assert Batch().process(packed) == Batch().process(plain) == {"kernel": [kernel, "K3_EXIT=0"]}
