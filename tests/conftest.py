import json
from pathlib import Path

import pytest

from k3deploy import load_recipe

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture(scope="session")
def recipe():
    return load_recipe()


def golden(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text())
