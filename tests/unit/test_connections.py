"""k3deploy.runtime.connections: the SSH connections' cipher order and idle wake-ups (the simulated nodes negotiate
them: tests/sim/test_cluster.py)."""

from __future__ import annotations

import runpy

import paramiko
import pytest

from helpers import ROOT
from k3deploy.runtime.connections import prefer_aead_ciphers, wake_every


def offered() -> tuple[str, ...]:
    """The ciphers paramiko offers now, in order."""
    return tuple(getattr(paramiko.Transport, "_preferred_ciphers"))  # noqa: B009 (untyped)


def test_gcm_is_offered_first_and_nothing_else_changes(monkeypatch):
    monkeypatch.setattr(paramiko.Transport, "_preferred_ciphers",
                        ("aes128-ctr", "aes256-ctr", "aes128-gcm@openssh.com", "aes256-gcm@openssh.com"))
    assert prefer_aead_ciphers() == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")
    assert prefer_aead_ciphers() == offered()   # idempotent


def test_pyinfras_config_file_offers_gcm_first(monkeypatch):
    """``config.py``, which pyinfra runs from the working directory before it connects."""
    monkeypatch.setattr(paramiko.Transport, "_preferred_ciphers", ("aes128-ctr", "aes128-gcm@openssh.com"))
    runpy.run_path(str(ROOT / "config.py"))
    assert offered() == ("aes128-gcm@openssh.com", "aes128-ctr")


@pytest.mark.parametrize(("link_timeout", "wakes"), [(5, 1.0), (10, 1.5), (30, 5.0), (3600, 5.0)])
def test_an_idle_transport_wakes_at_most_half_a_keepalive_late(link_timeout, wakes):
    keepalive = max(1, link_timeout // 3)   # as bound_silence sets it
    assert wake_every(keepalive) == wakes
    assert wake_every(keepalive) <= max(1.0, keepalive / 2)
