"""The argv each exported pod runs (LWS values filled in for a concrete group, as tests/unit/test_kubernetes.py
derives it) under the real ``vllm serve`` parser, as tests/unit/test_conformance.py checks the plans' argv.

Needs the engine venv (``tools/engine-venv.sh``): ``$K3_ENGINE_PYTHON`` or ``.venv-engine/bin/python``; skipped
without it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT
from helpers.kubernetes import cases, node_runs

CHECK = ROOT / "tests" / "helpers" / "check_argv.py"
ENGINE_PYTHON = Path(os.environ.get("K3_ENGINE_PYTHON") or ROOT / ".venv-engine" / "bin" / "python")

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.skipif(not ENGINE_PYTHON.exists(), reason=f"engine venv not found ({ENGINE_PYTHON}): create it with "
                       "tools/engine-venv.sh or point K3_ENGINE_PYTHON at its python"),
]


def test_every_pods_argv_passes_the_vllm_parser(tmp_path):
    entries = []
    for case in sorted(cases()):
        for unit, argv, env, _ in node_runs(case, tmp_path):
            entries.append({"id": f"{case}/{unit.group}/{unit.rank}", "argv": argv,
                            "env": {k: v for k, v in env.items() if k.startswith("VLLM_")}})
    proc = subprocess.run([str(ENGINE_PYTHON), str(CHECK)], input=json.dumps(entries), text=True,
                          capture_output=True, env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"), timeout=900, cwd=ROOT)
    report = json.loads(proc.stdout)
    assert report["checked"] == len(entries)
    assert report["failures"] == [], json.dumps(report["failures"][:3], indent=1)[:4000]
