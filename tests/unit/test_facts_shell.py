"""Facts read on every run, their commands run by a real ``sh`` (on files made here, or with a stand-in command)."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from k3deploy.facts.rdma import DmabufPrerequisites
from k3deploy.facts.rollout import UnitOnHost, WeightsState


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
