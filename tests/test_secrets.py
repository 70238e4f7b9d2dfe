"""The one masking rule (k3deploy.model.secrets) and the places that apply it outside a cluster: their docstring
examples are run, so they stay true."""

import doctest

import pytest

from k3deploy.model import revisions, secrets
from k3deploy.model.runbook import blanks


@pytest.mark.parametrize("module", [secrets, revisions, blanks], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("name, secret", [
    ("MY_API_KEY", True), ("DB_PASSWORD", True), ("LDAP_PASSWD", True), ("AWS_CREDENTIALS", True),
    ("TLS_PRIVATE", True), ("HF_TOKEN", True), ("client_secret", True), ("SSH_KEY", True),
    ("HF_TOKEN_PATH", False), ("DB_PASSWORD_FILE", False), ("NCCL_DEBUG", False), ("KEYBOARD", False),
])
def test_secret_names(name, secret):
    assert secrets.is_secret(name) is secret
