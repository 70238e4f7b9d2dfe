"""The one masking rule (k3deploy.model.secrets); the examples in its docstrings and in those of the places that apply
it outside a cluster run in test_doctests.py."""

import pytest

from k3deploy.model import secrets


@pytest.mark.parametrize("name, secret", [
    ("MY_API_KEY", True), ("DB_PASSWORD", True), ("LDAP_PASSWD", True), ("AWS_CREDENTIALS", True),
    ("TLS_PRIVATE", True), ("HF_TOKEN", True), ("client_secret", True), ("SSH_KEY", True),
    ("HF_TOKEN_PATH", False), ("DB_PASSWORD_FILE", False), ("NCCL_DEBUG", False), ("KEYBOARD", False),
])
def test_secret_names(name, secret):
    assert secrets.is_secret(name) is secret
