"""The README's variable table is the variables model's table."""

from k3deploy.variables import markdown_table

from conftest import ROOT


def test_readme_lists_every_variable_with_its_default():
    assert markdown_table() in (ROOT / "README.md").read_text()
