"""docs/architecture.md stays short and true: every file or folder it names exists."""

from __future__ import annotations

import re

from helpers import ROOT

DOC = ROOT / "docs" / "architecture.md"
#: a path the document names: under one of the repository's top folders, or a module written bare (model/steps.py)
PATH = re.compile(r"(?<![\w/.])((?:k3deploy|tests|docs|templates|deploy|tools|benchmarks)/[\w./<>-]*[\w/])")
BARE = re.compile(r"(?<![\w/.])((?:recipe|vendors|model|facts|preflight|runtime|cli|sim)/[\w/]+\.py)")


def named_paths(text: str) -> list[str]:
    return sorted({m.group(1) for m in PATH.finditer(text)} | {f"k3deploy/{m.group(1)}" for m in BARE.finditer(text)})


def test_the_architecture_document_is_short():
    assert len(DOC.read_text().splitlines()) < 150


def test_every_path_the_architecture_document_names_exists():
    paths = named_paths(DOC.read_text())
    assert len(paths) > 30    # the document names the modules it explains
    missing = []
    for path in paths:
        if "<family>" in path:    # a pattern: it must hold for every vendor family
            checked = [path.replace("<family>", family) for family in ("nvidia", "amd", "ascend")]
        else:
            checked = [path]
        missing += [p for p in checked if not (ROOT / p).exists()]
    assert missing == []


def test_a_missing_path_is_found():
    assert named_paths("see `k3deploy/vendors/nvidia/nope.py` and model/gone.py") == [
        "k3deploy/model/gone.py", "k3deploy/vendors/nvidia/nope.py"]
