"""The pyxis path under Slurm on a simulated cluster (``sim up --slurm``): NVIDIA's default ``k3_slurm_container``.

The deploy stages the image as a squashfs (``enroot import`` on the first node, named by the image's digest, handed
on to the other node as that file by the stage's fan-out), submits each group's job as the configured user
(``k3_slurm_user``: the simulated cluster's ``k3job``, the same uid on every node), and each step runs its container
through the nodes' real slurmd: ``srun --container-image=...`` is taken by the simulator's pyxis (a SPANK plugin
built at ``sim up --slurm``), which hands the task to the simulated enroot. The engine is then a process of the job
(its step's slurmstepd is its parent, Slurm's job id and GRES GPUs are in its environment), no docker container
runs, and a changed image is a new squashfs and a new job.

The simulated nodes track a job's processes by parent (proctrack/linuxproc: the nodes share the host's cgroups,
whose v1 controllers a container cannot write), so the engine's ``/proc/PID/cgroup`` names slurmd's unit, not a
job cgroup, here: the test reads the process tree instead."""

from __future__ import annotations

import re

import pytest

from helpers import deploy, why
from helpers.simulated import Sim, endpoint_of, openai_client

pytestmark = pytest.mark.sim

NEW_IMAGE = "vllm/vllm-openai@sha256:61cc6dfa5c964d4173101c03edfefd24b24851268df888c9d7e4e0dc9440dcae"


def queue(sim: Sim) -> list[list[str]]:
    """``[id, name, state, user]`` of every job in the queue (read on the submit host as root)."""
    out = sim.ssh(0, "squeue -h -o '%i %j %T %u'")
    assert out.returncode == 0, out.stderr
    return [line.split() for line in out.stdout.splitlines() if line.strip()]


def engine(sim: Sim, rank: int) -> dict[str, str]:
    """The engine process on node ``rank``: its user, its parent's command line and what its environment says."""
    script = ("pid=$(pgrep -f 'engine.py serve' | head -n 1); [ -n \"$pid\" ] || exit 3; "
              "echo \"user=$(ps -o user= -p $pid)\"; echo \"parent=$(ps -o args= -p $(ps -o ppid= -p $pid))\"; "
              "tr '\\0' '\\n' < /proc/$pid/environ | grep -E '^(SLURM_JOB_ID|CUDA_VISIBLE_DEVICES|K3SIM_GPUS_VISIBLE|"
              "K3SIM_CONTAINER_IMAGE|K3SIM_CONTAINER)='")
    out = sim.ssh(rank, script)
    assert out.returncode == 0, (rank, out.stdout, out.stderr)
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def test_the_default_nvidia_path_runs_pyxis_through_slurmd_as_the_configured_user(sim_factory):
    sim = sim_factory("pxtp", "gb300", 2, "--slurm")
    sim.set_vars("k3_strategy: multi_node_tp\nk3_slurm_user: k3job\n")
    nodes = [n["name"] for n in sim.info["nodes"]]

    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    assert "Stage round 1 of 1: from a peer" in first.stdout   # the squashfs made once, handed on as a file
    assert "Kimi-K3" in openai_client(endpoint_of(first.stdout))
    (job,) = queue(sim)
    assert job[1:] == ["k3-engine", "RUNNING", "k3job"], job   # submitted as the configured user
    batch = sim.ssh(0, "cat /var/lib/k3deploy/slurm/k3-engine.sbatch").stdout
    assert "docker" not in batch and batch.count("--container-image=/var/lib/k3deploy/stage/images/") == 2, batch
    image = re.search(r"--container-image=(\S+\.sqsh)", batch)
    assert image is not None and "3a2eb08c9640" in image.group(1)
    for rank in range(len(nodes)):
        launch = sim.ssh(rank, "cat /etc/k3deploy/k3-engine.launch").stdout
        assert "docker" not in launch and "exec vllm serve moonshotai/Kimi-K3" in launch, launch
        # the job's files are its user's to read and write; the image file is the staged squashfs
        owned = sim.ssh(rank, f"stat -c '%U %a' /etc/k3deploy/k3-engine.env /var/lib/k3deploy/slurm/engine "
                              f"{image.group(1)}; head -c 4 {image.group(1)}").stdout.split("\n")
        assert owned[:3] == ["k3job 600", "k3job 755", "root 644"] and owned[3] == "hsqs", owned
        # the engine is the job's own process: its step's slurmstepd is its parent, the job's GPUs (GRES) its own
        seen = engine(sim, rank)
        assert seen["user"] == "k3job" and seen["parent"].startswith(f"slurmstepd: [{job[0]}."), seen
        assert seen["SLURM_JOB_ID"] == job[0] and seen["CUDA_VISIBLE_DEVICES"] == "0,1,2,3", seen
        assert seen["K3SIM_GPUS_VISIBLE"] == "4" and seen["K3SIM_CONTAINER"] == "k3-engine", seen
        assert sim.ssh(rank, "docker ps -q").stdout.strip() == ""   # no container of dockerd's

    # a changed image: a new squashfs on every node, a new job that runs it
    sim.set_vars(f"k3_image: {NEW_IMAGE}\n")
    changed = deploy(sim.inventory)
    assert changed.returncode == 0, why(changed)
    (job2,) = queue(sim)
    assert job2[0] != job[0] and job2[1:] == ["k3-engine", "RUNNING", "k3job"], job2
    for rank in range(len(nodes)):
        files = sim.ssh(rank, "ls /var/lib/k3deploy/stage/images").stdout.split()
        assert any("61cc6dfa5c96" in f for f in files) and any("3a2eb08c9640" in f for f in files), files
        seen = engine(sim, rank)
        assert seen["K3SIM_CONTAINER_IMAGE"] == "sha256:" + NEW_IMAGE.split("@sha256:")[1], seen
        assert seen["SLURM_JOB_ID"] == job2[0], seen
    openai_client(endpoint_of(changed.stdout))
