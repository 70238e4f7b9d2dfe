"""One spelling of each thing people read: a variable's value in a hint as the docs write it, an image as one
reference in every command's output, the supported hardware as one list in every error that lists it."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from helpers import ROOT
from k3deploy.model.revisions import GroupHistory, Revision


@pytest.mark.parametrize("asked, said", [(True, "k3_rollback=true"), (1, "k3_rollback=1")])
def test_plan_names_the_rollback_as_it_was_asked_and_as_the_docs_write_it(asked, said):
    """``plan --rollback previous`` is ``k3_rollback=true`` (README, docs/operating.md), ``--rollback 1`` is
    ``k3_rollback=1``: the hint repeats what applies the preview, in the docs' words."""
    from k3deploy.cli.plan import revision_notes

    revs = {n: Revision("engine", n, "t", "img", "s") for n in (1, 2)}
    gathered = SimpleNamespace(history={"engine": GroupHistory("engine", revs, current=2, marked={1, 2})},
                               rollback_to={"engine": 1}, target=SimpleNamespace(vars=SimpleNamespace(k3_rollback=asked)))
    (note,) = revision_notes(gathered)   # type: ignore[arg-type]
    assert note.endswith(f"--data {said} applies it)"), note


def hints() -> list[tuple[str, str]]:
    """Every ``k3_rollback=VALUE`` the code and the docs say, with where."""
    out = []
    for path in [*ROOT.glob("k3deploy/**/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "deploy/k3.py"]:
        for m in re.finditer(r"k3_rollback=([A-Za-z0-9_{}\[\]-]+)", path.read_text()):
            out.append((str(path.relative_to(ROOT)), m[1]))
    return out


def test_every_rollback_hint_says_true_or_a_revision_number():
    """``k3_rollback`` takes ``true`` (the previous revision that served) or a revision number, and every hint
    writes one of them as the variables table does (not ``1`` for true, ``yes``, ``True``, ``previous``)."""
    found = hints()
    assert len(found) > 10
    odd = [(where, value) for where, value in found
           if value not in ("true", "N", "{value}", "{wanted}", "{never[-1]}") and not value.isdigit()]
    assert odd == []


SUPPORTED = "ascend_910c, b200, b300, gb200, gb300, h100, h200, mi300x, mi325x, mi355x"


@pytest.mark.parametrize("args", [
    ["resolve", "-H", "b900"], ["options", "-H", "b900"], ["lint", "-H", "b900"],
    ["resolve", "-H", "b900", "--strategy", "multi_node_tp", "--nodes", "2"],
], ids=["resolve", "options", "lint", "resolve-sized"])
def test_every_command_names_the_same_hardware_for_an_unknown_id(args):
    """An unknown hardware id gets one list, the recipe's supported hardware, whichever command reads it (``lint``
    listed the whole taxonomy, Intel and TPU parts k3deploy does not deploy, in another spelling)."""
    from helpers import k3_here

    proc = k3_here(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: unknown hardware 'b900': kimi-k3 runs on {SUPPORTED} (did you mean 'b300'?)"


def test_an_inventory_and_the_simulator_name_the_same_list():
    """The inventory's ``k3_hardware`` (through the pipeline) and ``sim up -H`` say the same line; the simulator
    simulates every supported id, and its faults that need a kind of tray list them from the same list."""
    from k3deploy import load_recipe
    from k3deploy.errors import K3Error
    from k3deploy.model.pipeline import _requirements
    from k3deploy.model.variables import Variables
    from k3deploy.recipe.offering import listing, supported_hardware
    from k3sim import profiles

    assert listing(supported_hardware(load_recipe())) == SUPPORTED == ", ".join(profiles.hardware_ids())
    with pytest.raises(K3Error) as pipeline:
        _requirements(Variables(k3_hardware="b900"), 2, load_recipe())
    with pytest.raises(K3Error) as sim:
        profiles.profile("b900")
    assert str(pipeline.value) == str(sim.value) == \
        f"unknown hardware 'b900': kimi-k3 runs on {SUPPORTED} (did you mean 'b300'?)"
    assert profiles.supported("imex") == "gb200, gb300" and profiles.supported("nvl") == "gb200, gb300"


REPO = "vllm/vllm-openai"
OLD, NEW = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_a_change_of_build_reads_as_the_plan_note_history_and_runbook_write_it():
    """The units run a pinned build by its local tag (``REPO:k3-sha256-...``, :func:`run_ref`); what the plan, the
    dry run's diff, ``history`` and the runbook say is ``REPO@sha256:DIGEST``, and ``status``'s narrow cell the
    same cut to 12 hex digits. ``--json`` keeps the exact reference the unit runs."""
    from k3deploy.cli.status import _image_cell
    from k3deploy.model.diff import change_lines, unit_file_changes
    from k3deploy.model.images import pin, run_ref

    def unit(digest: str) -> str:
        return f"[Service]\nExecStart=/usr/bin/docker run --rm --name k3 {run_ref(pin(REPO, digest))} vllm serve\n"

    changes = unit_file_changes(unit(OLD), unit(NEW))
    image = next(c for c in changes if c["kind"] == "image")
    assert image["to"] == run_ref(f"{REPO}@{NEW}")                       # JSON: what the unit runs
    assert change_lines([image]) == [f"image: {REPO}@{OLD} -> {REPO}@{NEW}"]
    assert _image_cell(run_ref(f"{REPO}@{NEW}"), None) == f"{REPO}@sha256:{'b' * 12}…"
    assert _image_cell(f"{REPO}:kimi-k3", None) == f"{REPO}:kimi-k3"
