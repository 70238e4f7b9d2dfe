"""The examples in the fact and settings docstrings are run, so they stay true."""

import doctest

import pytest

from k3deploy.facts import amd, ascend, base, batch, host, nvidia, rdma
from k3deploy.preflight import settings


@pytest.mark.parametrize("module", [base, batch, nvidia, rdma, host, amd, ascend, settings], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
