"""The simulated enroot's image forms: ``enroot import`` from the registry (no docker on the node) and from a
``docker save`` archive give the same squashfs, which carries the image's layers (as large as the image); a damaged
archive is refused; ``enroot start IMAGE COMMAND`` (enroot's own form) runs a command with the image's environment
and the given ``--env``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.engine import DOCKER, NODE_TOOLS, Node

pytestmark = pytest.mark.usefixtures("outside_server")  # pulls fetch from the simulated outside

ENROOT = NODE_TOOLS / "usr/bin/enroot"
IMAGE = "vllm/vllm-openai:kimi-k3"
DIGEST = "sha256:3a2eb08c964042fec5afa5e174f485f7147648f1f78227112edacc7bcc2efd4a"


def run(tool: object, node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True, env=node.env(),
                          timeout=60)


def test_imports_from_the_registry_and_from_an_archive_give_the_same_file(tmp_path, net):
    a = Node(tmp_path / "a", "gb300", 0, 2, net)
    b = Node(tmp_path / "b", "gb300", 1, 2, net)
    pulled = tmp_path / "a.sqsh"
    made = run(ENROOT, a, "import", "-o", str(pulled), f"docker://vllm/vllm-openai@{DIGEST}")
    assert made.returncode == 0, made.stderr
    head, doc, _ = pulled.read_bytes().split(b"\n", 2)
    assert head == b"hsqs" and DIGEST.encode() in doc
    archive = tmp_path / "image.tar"
    assert run(DOCKER, a, "pull", "-q", IMAGE).returncode == 0
    assert run(DOCKER, a, "save", "-o", str(archive), IMAGE).returncode == 0
    loaded = tmp_path / "b.sqsh"
    made = run(ENROOT, b, "import", "-o", str(loaded), f"docker-archive://{archive}")
    assert made.returncode == 0, made.stderr
    assert loaded.read_bytes() == pulled.read_bytes()
    assert loaded.stat().st_size > 0.9 * archive.stat().st_size          # the layers are in the file
    again = run(ENROOT, b, "import", "-o", str(loaded), f"docker-archive://{archive}")
    assert again.returncode == 1 and "File already exists" in again.stderr
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad.tar").write_bytes(bytes(data))
    bad = run(ENROOT, b, "import", "-o", str(tmp_path / "c.sqsh"), f"docker-archive://{tmp_path / 'bad.tar'}")
    assert bad.returncode == 1 and not (tmp_path / "c.sqsh").exists(), bad.stderr
    started = run(ENROOT, b, "start", "--env", "K3_X=1", str(loaded), "sh", "-c",
                  'echo "$K3_X $K3SIM_CONTAINER_IMAGE"')
    assert started.returncode == 0 and started.stdout.split() == ["1", DIGEST], started.stderr
