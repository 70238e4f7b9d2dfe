"""A pyxis Slurm site whose trays have no docker (``sim up --slurm``, fault ``no-docker`` on both trays): the stage
makes the engine's squashfs once, on the first tray, from the registry (``enroot import docker://``, pulled by
enroot itself), downloads the weights with that file's own CLI (``enroot start ... hf download``), hands the file to
the other tray through the stage's fan-out (rsync from its peer, checked against the sha256 written where it was
made), and the job serves from it: the uplink carried the image once. A file of an image that no kept revision runs
(an earlier run staged it and never served it) is removed; the file the revision runs is kept.

The image is pinned by its digest (``k3_image: REPO@sha256:...``): a tag is resolved through ``docker buildx`` on
the first engine node, which such a site does not have (docs/slurm.md)."""

from __future__ import annotations

import json
import re

import pytest

from helpers import deploy, k3, why
from helpers.simulated import endpoint_of, openai_client
from k3sim.processes import engine_venv

pytestmark = pytest.mark.sim

IMAGE = "vllm/vllm-openai@sha256:61cc6dfa5c964d4173101c03edfefd24b24851268df888c9d7e4e0dc9440dcae"
FILE = "/var/lib/k3deploy/stage/images/vllm_vllm-openai_k3-sha256-" + IMAGE.split(":")[-1] + ".sqsh"
STRAY = "/var/lib/k3deploy/stage/images/vllm_vllm-openai_k3-sha256-" + "0" * 64 + ".sqsh"


def ran_on(output: str, operation: str) -> int:
    """On how many hosts an operation of the stage did something (pyinfra's summary table at the end of a run)."""
    m = re.search(r"^\s*Stage \| " + re.escape(operation) + r"\s+(\d+)\s+(\S+)", output, re.M)
    return 0 if m is None or m[2] == "-" else int(m[2])


def test_a_pyxis_site_without_docker_serves_from_the_file_the_stage_made_once(sim_factory):
    sim = sim_factory("pxnodock", "gb300", 2, "--slurm", "--fault", "0:no-docker", "--fault", "1:no-docker")
    sim.set_vars(f"k3_strategy: multi_node_tp\nk3_image: {IMAGE}\nk3_bench_input_tokens: 8\n"
                 "k3_bench_output_tokens: 4\nk3_bench_concurrency: [1]\nk3_bench_rounds: 1\n")   # bench's least load
    for rank in (0, 1):
        assert sim.ssh(rank, "command -v docker").returncode != 0
    made = sim.ssh(1, f"mkdir -p {STRAY.rsplit('/', 1)[0]} && echo hsqs > {STRAY} && echo 0 > {STRAY}.sha256")
    assert made.returncode == 0, made.stderr

    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert "Kimi-K3" in openai_client(endpoint_of(run.stdout))
    assert ran_on(run.stdout, f"Image {IMAGE}: from the registry") == 1        # made once, from the registry
    assert ran_on(run.stdout, "Stage round 1 of 1: from a peer") == 1          # then handed on as the file
    status = json.loads(k3("sim", "status", "--name", sim.name, "--json", check=True).stdout)
    cluster = next(c for c in status["clusters"] if c["name"] == sim.name)
    served, artifacts = cluster["outside_bytes"], cluster["artifact_bytes"]
    assert artifacts <= served <= 1.2 * artifacts, (served, artifacts)         # the uplink carried it once
    sums = []
    for rank in (0, 1):
        got = sim.ssh(rank, f"sha256sum < {FILE} | cut -d' ' -f1; cat {FILE}.sha256; head -c 4 {FILE}")
        assert got.returncode == 0, got.stderr
        sums.append(got.stdout.split())
    assert sums[0] == sums[1] and sums[0][0] == sums[0][1] and sums[0][2] == "hsqs", sums
    # the file of an image no kept revision runs is gone, with its checksum; the revision's file stays
    assert sim.ssh(1, f"ls {STRAY} {STRAY}.sha256 2>/dev/null").stdout.strip() == ""
    assert "Image files: remove those of images no kept revision runs" in run.stdout
    # vLLM's benchmark client from that same file (enroot start: no docker here), its figures kept with the revision
    if engine_venv() is not None:   # the real client (tools/engine-venv.sh)
        ran = k3("bench", sim.inventory, "--json")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        figures = json.loads(ran.stdout)
        assert list(figures) == ["1"] and figures["1"]["output_tokens_per_s"] > 0, figures
        for rank in (0, 1):
            kept = json.loads(sim.ssh(rank, "cat /etc/k3deploy/revisions/engine/*/bench.json").stdout)
            assert [p["concurrency"] for p in kept["points"]] == [1] and kept["gpus"] == 8, kept
