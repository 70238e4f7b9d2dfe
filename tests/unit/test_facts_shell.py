"""Facts read on every run, their commands run by a real ``sh`` (on files made here, or with a stand-in command)."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from helpers import FIXTURES
from k3deploy.facts.base import FactError
from k3deploy.facts.health import HealthReading
from k3deploy.facts.rdma import DmabufPrerequisites
from k3deploy.facts.rollout import UnitOnHost, WeightsState
from k3deploy.vendors.nvidia import facts as nvidia
from k3deploy.vendors.nvidia.facts import parse_nvidia_health


def _fact(fact, **kwargs):
    out = subprocess.run(["sh", "-c", fact.command(**kwargs)], capture_output=True, text=True, check=True).stdout
    return fact.process(out.splitlines())


def test_a_unit_as_its_host_has_it_exactly(tmp_path):
    unit, env = tmp_path / "k3 engine.service", tmp_path / "k3-engine.env"
    texts = {unit: "[Unit]\nDescription=x\n\n", env: "A=1\nB=two words"}   # a blank last line; no final newline
    for path, text in texts.items():
        path.write_text(text)
    got = _fact(UnitOnHost(), unit="k3-none-such.service", unit_path=str(unit), env_path=str(env))
    assert (got.unit_sha, got.unit_text) == (hashlib.sha256(texts[unit].encode()).hexdigest(), texts[unit])
    assert got.env_sha == hashlib.sha256(texts[env].encode()).hexdigest()
    assert got.env_text == texts[env] + "\n"   # shown in diffs as lines; the sha256 says what changed
    env.unlink()
    got = _fact(UnitOnHost(), unit="k3-none-such.service", unit_path=str(unit), env_path=str(env))
    assert got.unit_sha == hashlib.sha256(texts[unit].encode()).hexdigest()
    assert (got.env_sha, got.env_text) == (None, None)


def test_weights_count_interrupted_downloads_and_find_missing_shards_named_in_quotes(tmp_path):
    d = tmp_path / "huggingface/hub/models--org--m"
    snap = d / "snapshots/abc"
    snap.mkdir(parents=True)
    (d / "blobs").mkdir()
    (d / "refs").mkdir()
    (d / "refs/main").write_text("abc")
    (snap / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-1.safetensors", "b": "model-1.safetensors", "c": "model-2.safetensors"}}')
    (snap / "model-1.safetensors").write_bytes(b"x")
    got = _fact(WeightsState(), cache=str(tmp_path), model="org/m")
    assert (got.revision, got.missing, got.partial) == ("abc", ("model-2.safetensors",), 0)
    for name in ("1.incomplete", "2.incomplete"):
        (d / "blobs" / name).write_bytes(b"")
    assert _fact(WeightsState(), cache=str(tmp_path), model="org/m").partial == 2


@pytest.mark.parametrize(("modules", "mlx5"), [
    ("", None),
    ("mlx5_ib 516096 0 - Live 0x0000000000000000", "loaded"),
    ("Module                  Size  Used by\nnvidia_peermem         16384  0\nmlx5_ib               516096  0", "loaded"),
    ("nvidia_peermem 16384 0\nib_core 1 2 mlx5_ib,ib_uverbs", "absent"),   # used by, not loaded itself
])
def test_dmabuf_sees_mlx5_ib_only_as_a_loaded_module(modules, mlx5):
    command = f"lsmod() {{ printf '%s\\n' \"$K3_MODULES\"; }}; {DmabufPrerequisites().command()}"
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "K3_MODULES": modules}).stdout.splitlines()
    section = out[out.index("K3_SECTION=mlx5") + 1:]
    assert section[0] == (mlx5 or "K3_EXIT=0")
    assert out[out.index("K3_SECTION=kernel") + 1] == subprocess.run(["uname", "-r"], capture_output=True,
                                                                       text=True).stdout.strip()


# ------------------------------------------- NVIDIA reports the node filters before sending them (sh, awk, grep)

def _nvidia_smi(tmp_path, **outputs: str) -> dict[str, str]:
    """A stand-in ``nvidia-smi`` on PATH printing ``outputs``: ``q`` for ``-q``, ``ecc`` for ``-q -d ...``, ``nvlink``
    for ``nvlink -s``, ``gpus`` for ``--query-gpu``; and a ``dmesg`` with nothing to say."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for key, text in outputs.items():
        (tmp_path / key).write_text(text)
    (bin_dir / "nvidia-smi").write_text(
        '#!/bin/sh\nd="$(dirname "$0")/.."\ncase "$*" in\n'
        '  "-q") cat "$d/q";;\n  "-q -d "*) cat "$d/ecc";;\n  "nvlink -s") cat "$d/nvlink";;\n'
        '  --query-gpu*) cat "$d/gpus";;\n  *) echo "Invalid combination of input arguments."; exit 2;;\nesac\n')
    (bin_dir / "dmesg").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("nvidia-smi", "dmesg"):
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def _sent(fact, env, **kwargs) -> list[str]:
    return subprocess.run(["sh", "-c", fact.command(**kwargs)], capture_output=True, text=True, check=True,
                          env=env).stdout.splitlines()


@pytest.mark.parametrize("name", sorted(p.name for p in (FIXTURES / "nvidia").glob("smi-q-*.txt")))
def test_the_fabric_fact_reads_from_the_filtered_report_what_it_reads_from_the_whole(tmp_path, name):
    whole = (FIXTURES / "nvidia" / name).read_text()
    sent = _sent(nvidia.NvlinkFabric(), _nvidia_smi(tmp_path, q=whole))
    assert nvidia.NvlinkFabric().process(sent) == nvidia.NvlinkFabric().process(whole.splitlines() + ["K3_EXIT=0"])
    assert sent[-1] == "K3_EXIT=0"
    # the report's other rows stay on the node
    assert not [line for line in sent if line.startswith(("Timestamp", "Driver Version", "    Product Name"))]


def test_the_fabric_fact_keeps_the_tools_error_and_its_exit_status(tmp_path):
    env = _nvidia_smi(tmp_path, q="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    (tmp_path / "bin" / "nvidia-smi").write_text(f"#!/bin/sh\ncat {tmp_path}/q\nexit 9\n")
    got = nvidia.NvlinkFabric().process(_sent(nvidia.NvlinkFabric(), env))
    assert isinstance(got, FactError)
    assert (got.kind, got.exit_code) == ("failed", 9)
    assert got.first_line.startswith("NVIDIA-SMI has failed")


def _faulty(name: str, *swaps: tuple[str, str]) -> str:
    text = (FIXTURES / "nvidia" / name).read_text()
    for old, new in swaps:
        assert old in text
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize("ecc, nvlink", [
    (_faulty("nvidia-smi-q-a100-remap-pending.txt"), _faulty("nvlink-s-v100-inactive-azhpc73.txt")),
    (_faulty("nvidia-smi-q-ecc-a10g-535.txt"), _faulty("nvlink-s-all-inactive-siboehm.txt")),
    (_faulty("nvidia-smi-q-ecc-a10g-535.txt", ("Remapping Failure Occurred        : No",
                                                "Remapping Failure Occurred        : Yes")), ""),
    ("GPU 00000000:10:1C.0\n" + _faulty("nvidia-smi-q-ecc-sram-uncorrectable.txt"), ""),
    (_faulty("nvidia-smi-q-ecc-a10g-535.txt", ("Pending                           : No",
                                                "Pending                           : Yes")), ""),
])
def test_the_health_fact_reads_from_the_filtered_reports_every_event_of_the_whole(tmp_path, ecc, nvlink):
    env = _nvidia_smi(tmp_path, ecc=ecc, nvlink=nvlink, gpus="0, 00000000:10:1C.0\n3, 00000000:00:1E.0\n")
    sent = _sent(nvidia.NvidiaHealth(), env, config_dir=str(tmp_path), nvl=True)
    whole = parse_nvidia_health(["K3_SECTION=nvl", "1", "K3_SECTION=gpus", "0, 00000000:10:1C.0",
                                 "3, 00000000:00:1E.0", "K3_SECTION=ecc", *ecc.splitlines(),
                                 "K3_SECTION=nvlink", *nvlink.splitlines()])
    got = nvidia.NvidiaHealth().process(sent)
    assert isinstance(got, HealthReading)
    assert got.events == whole.events and whole.events   # every fixture here has an event
    assert len(sent) < 12 + len(ecc.splitlines()) + len(nvlink.splitlines())
