"""What a simulated 2-tray cluster's nodes record of their revisions, read over SSH, for the fault tests that check
that a cluster runs a recorded revision after a fault (``test_faults_runs``, ``test_faults_interrupts``)."""

from __future__ import annotations

from helpers.simulated import Sim

#: the engine's unit and env file, its revisions' directory and the deployment lock on a node (the defaults)
UNIT, ENV = "/etc/systemd/system/k3-engine.service", "/etc/k3deploy/k3-engine.env"
REVISIONS = "/etc/k3deploy/revisions/engine"
LOCK = "/etc/k3deploy/deploy.lock"


def sha(sim: Sim, rank: int, path: str) -> str:
    return sim.ssh(rank, f"sha256sum {path} | cut -d' ' -f1").stdout.strip()


def recorded(sim: Sim, rank: int) -> dict[int, tuple[str, str]]:
    """Revision number -> (sha256 of its unit file, of its env file) on one node."""
    out = sim.ssh(rank, f"cd {REVISIONS} && for d in */; do n=${{d%/}}; echo \"$n $(sha256sum < $n/k3-engine.service"
                        f" | cut -d' ' -f1) $(sha256sum < $n/k3-engine.env | cut -d' ' -f1)\"; done").stdout
    return {int(n): (u, e) for n, u, e in (line.split() for line in out.splitlines())}


def current(sim: Sim) -> int:
    """The revision the head node's ``current`` marker names."""
    return int(sim.ssh(0, f"cat {REVISIONS}/current").stdout.strip())


def live_and_recorded(sim: Sim, rank: int) -> tuple[tuple[str, str], dict[int, tuple[str, str]]]:
    """(sha256 of the live unit file, of the live env file) and :func:`recorded` of one node, read in one SSH
    command (an empty checksum where a live file is missing)."""
    out = sim.ssh(rank, f"echo live $(sha256sum < {UNIT} | cut -d' ' -f1) - $(sha256sum < {ENV} | cut -d' ' -f1); "
                        f"cd {REVISIONS} && for d in */; do n=${{d%/}}; echo \"$n $(sha256sum < $n/k3-engine.service"
                        f" | cut -d' ' -f1) $(sha256sum < $n/k3-engine.env | cut -d' ' -f1)\"; done").stdout
    first, *rest = out.splitlines() or ["live -"]
    unit, _, env = first.removeprefix("live").partition("-")
    return (unit.strip(), env.strip()), {int(n): (u, e) for n, u, e in (line.split() for line in rest)}


def runs_a_recorded_revision(sim: Sim) -> int:
    """Every node's live unit and env file are those of one recorded revision (the same on every node): its number."""
    numbers = set()
    for rank in (0, 1):
        live, revisions = live_and_recorded(sim, rank)
        match = [n for n, files in revisions.items() if files == live]
        assert match, f"node {rank} runs files no revision recorded ({live})"
        numbers.add(max(match))
    assert len(numbers) == 1, numbers
    return numbers.pop()
