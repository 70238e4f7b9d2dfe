"""The simulator's ``default-route`` fault: parsed, accepted by every profile, and the ``ip``
commands that leave a node without a default route or with it on a front-end network."""

from __future__ import annotations

import subprocess

import pytest

from k3deploy.errors import K3Error
from k3sim import network
from k3sim.faults import parse_fault
from k3sim.profiles import node_config


@pytest.mark.parametrize("text, value", [("0:default-route=none", "none"), ("1:default-route=Front-End", "front-end")])
def test_the_fault_takes_none_or_front_end(text, value):
    assert parse_fault(text).value == value


@pytest.mark.parametrize("text, needle", [("0:default-route", "needs a value"),
                                          ("0:default-route=mgmt", "choose one of none, front-end")])
def test_a_bad_default_route_fault_says_what_to_write(text, needle):
    with pytest.raises(K3Error, match=needle):
        parse_fault(text)


@pytest.mark.parametrize("hw", ["gb300", "h200", "mi355x", "ascend_910c"])
def test_every_profile_takes_it_and_records_it(hw):
    doc = node_config(hw, 0, 2, "n1", "10.77.0.11", [parse_fault("0:default-route=front-end")], 0.01,
                      "8f7e1c2a-3b4d-4e5f-9a6b-7c8d9e0f1a2b")
    assert doc["faults"] == ["0:default-route=front-end"]


def _commands(monkeypatch, mode: str | None, has_fe: bool) -> list[str]:
    seen: list[str] = []

    def run(cmd: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        seen.append(" ".join(cmd))
        rc = 0 if has_fe or cmd[3:5] != ["link", "show"] else 1
        return subprocess.CompletedProcess(cmd, rc, "", "")

    monkeypatch.setattr(network, "run", run)
    network.set_default_route("c-node2", "10.77.0", 1, mode)
    return seen[1:]  # after the probe for fe0


def test_front_end_puts_the_default_route_on_fe0(monkeypatch):
    assert _commands(monkeypatch, "front-end", has_fe=False) == [
        "ip -n c-node2 link add fe0 type veth peer name fe0p",
        "ip -n c-node2 addr add 198.51.100.12/24 dev fe0",
        "ip -n c-node2 link set fe0p up",
        "ip -n c-node2 link set fe0 up",
        "ip -n c-node2 route replace default via 198.51.100.1 dev fe0"]


def test_none_removes_it_and_clearing_puts_it_back_via_the_bridge(monkeypatch):
    assert _commands(monkeypatch, "none", has_fe=True) == ["ip -n c-node2 link del fe0",
                                                           "ip -n c-node2 route del default"]
    assert _commands(monkeypatch, None, has_fe=False) == [
        "ip -n c-node2 route replace default via 10.77.0.1 dev eth0"]
