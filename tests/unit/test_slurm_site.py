"""Slurm as the site runs it (k3deploy/model/slurm.py): the GRES name each vendor's pack gives an engine job's
``--gres``, ``--segment`` only where the site's Slurm accepts it with ``--nodelist``, and IMEX as the site manages
it (a standing domain, or a channel per job), read from the submit host's ``scontrol``."""

from __future__ import annotations

import pytest

from helpers.clusters import FAMILIES, records, smallest_rollout
from k3deploy.model import slurm
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import Rollout
from k3deploy.recipe.taxonomy import hardware


def _rollout(strategy: str = "multi_node_tp", hardware: str = "gb300", nodes: int = 2, **extra: object) -> Rollout:
    return desired_rollout(target(records(hardware, strategy, nodes, **extra), None))


def _sbatch(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


# ---------------------------------------------------------------------------------------------- GRES per vendor


@pytest.mark.parametrize(("family", "name"), [("NVIDIA", "gpu"), ("AMD", "gpu"), ("Ascend", "npu")])
def test_an_engine_job_asks_for_its_vendors_gres_name(family: str, name: str) -> None:
    r = next(r for s in ("multi_node_tp", "multi_node_tp_dp") if (r := smallest_rollout(FAMILIES[family], s)))
    gpus = hardware()[r.plan.hardware].gpu_count
    gres = [x for x in _sbatch(slurm.jobs(r)[0].script) if x.startswith("--gres=")]
    assert gres == [f"--gres={name}:{gpus}"]


def test_the_gres_variable_overrides_the_packs_name() -> None:
    r = smallest_rollout(FAMILIES["Ascend"], "multi_node_tp_dp", k3_slurm_gres="gpu:{gpus_per_node}")
    assert r is not None
    assert "--gres=gpu:16" in _sbatch(slurm.jobs(r)[0].script)
    r = _rollout(k3_slurm_gres="gpu:a100:{gpus_per_node}")
    assert "--gres=gpu:a100:4" in _sbatch(slurm.jobs(r)[0].script)
