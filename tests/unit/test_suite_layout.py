"""The tests' own shape: each test file in the folder of its kind, no two with the same name, no test module
importing another test module or a conftest (shared helpers live in ``tests/helpers/``, fixtures in conftest.py)."""

from __future__ import annotations

import ast
from collections import Counter

from helpers import TESTS

KINDS = ("unit", "sim", "e2e")
TEST_FILES = sorted(TESTS.rglob("test_*.py"))


def test_every_test_file_is_in_the_folder_of_its_kind():
    assert TEST_FILES
    assert [str(p.relative_to(TESTS)) for p in TEST_FILES if p.relative_to(TESTS).parts[0] not in KINDS] == []


def test_no_two_test_files_share_a_name():
    assert [name for name, n in Counter(p.name for p in TEST_FILES).items() if n > 1] == []


def test_no_test_module_imports_another_or_a_conftest():
    offenders = []
    for path in [*TEST_FILES, *TESTS.rglob("conftest.py"), *(TESTS / "helpers").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + ([a.name for a in node.names] if node.level else [])
                if node.level:
                    offenders.append(f"{path.relative_to(TESTS)}:{node.lineno} imports relatively ({names})")
                    continue
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            offenders += [f"{path.relative_to(TESTS)}:{node.lineno} imports {name}" for name in names
                          if name.split(".")[-1].startswith("test_") or name.split(".")[-1] == "conftest"]
    assert offenders == []


def test_the_helpers_docstring_examples_hold():
    import doctest

    import helpers

    result = doctest.testmod(helpers)
    assert result.attempted > 0 and result.failed == 0
