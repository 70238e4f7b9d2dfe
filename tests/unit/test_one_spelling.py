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
