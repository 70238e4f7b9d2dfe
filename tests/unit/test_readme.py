"""The variable table of docs/variables.md is the variables model's table."""

from helpers import ROOT
from k3deploy.model.variables import markdown_table


def test_the_variables_doc_lists_every_variable_with_its_default():
    assert markdown_table() in (ROOT / "docs" / "variables.md").read_text()
