"""The README's variable table is the variables model's table."""

from helpers import ROOT
from k3deploy.model.variables import markdown_table


def test_readme_lists_every_variable_with_its_default():
    assert markdown_table() in (ROOT / "README.md").read_text()
