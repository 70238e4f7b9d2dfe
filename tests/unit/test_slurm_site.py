"""Slurm as the site runs it (k3deploy/model/slurm.py): the GRES name each vendor's pack gives an engine job's
``--gres``, ``--segment`` only where the site's Slurm accepts it with ``--nodelist``, and IMEX as the site manages
it (a standing domain, or a channel per job), read from the submit host's ``scontrol``."""

from __future__ import annotations

import pytest

from helpers.clusters import FAMILIES, records, smallest_rollout
from k3deploy.errors import K3Error
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


# ---------------------------------------------------------------------------------------------- --segment


@pytest.mark.parametrize("version", ["22.05", "23.11", "24.05", "25.05"])
def test_segment_true_is_refused_before_25_11_in_one_line_naming_the_version_and_the_fix(version: str) -> None:
    with pytest.raises(K3Error) as exc:
        slurm.jobs(_rollout(k3_slurm_segment=True, k3_slurm_version=version))
    text = str(exc.value)
    assert f"the site's Slurm is {version}" in text and "25.11" in text and "k3_slurm_segment: auto" in text
    assert "\n" not in text


def test_segment_true_with_no_known_version_is_refused_naming_the_variable() -> None:
    with pytest.raises(K3Error, match=r"not known here: set k3_slurm_version"):
        slurm.jobs(_rollout(k3_slurm_segment=True))


@pytest.mark.parametrize(("segment", "version", "kept"), [
    (True, "25.11", True), (True, "26.05.1", True),
    ("auto", "25.11", True), ("auto", "25.05", False), ("auto", "22.05", False), ("auto", "auto", False),
    (False, "25.11", False)])
def test_segment_is_kept_only_where_the_sites_slurm_accepts_it_with_nodelist(segment: object, version: str,
                                                                             kept: bool) -> None:
    (job,) = slurm.jobs(_rollout(k3_slurm_segment=segment, k3_slurm_version=version))
    lines = _sbatch(job.script)
    assert ("--segment=2" in lines) is kept and "--nodelist=n0,n1" in lines
