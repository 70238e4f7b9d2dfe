"""The runbook is proven by running it: its command blocks, executed in order over SSH on a fresh simulated
cluster, bring the cluster to serving."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from helpers import PYINFRA, ROOT, k3, parts, why
from k3deploy.model.runbook import blocks

pytestmark = pytest.mark.sim

FAKE_TOKEN = "hf_runbookE2EfakeTOKEN0123456789"


def _ssh(sim, host: str) -> list[str]:
    d = Path(sim.inventory).parent
    ip = next(n["ip"] for n in sim.info["nodes"] if n["name"] == host)
    return ["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o",
            "BatchMode=yes", f"root@{ip}"]


def run_block(sim, node: str, script: str) -> subprocess.CompletedProcess:
    if node == "control":
        return subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=300)
    return subprocess.run([*_ssh(sim, node), "bash -e -c " + shlex.quote(script)], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("name, hardware, nodes, strategy, layout", [
    ("e6r", "gb300", 2, "multi_node_tp", None),
    ("e6s", "b300", 3, "pd_cluster", "pd:1,2"),
])
def test_runbook_brings_a_fresh_cluster_to_serving(sim_factory, tmp_path, name, hardware, nodes, strategy, layout):
    sim = sim_factory(name, hardware, nodes, *(["--layout", layout] if layout else []))
    token = tmp_path / "hf-token"
    token.write_text(FAKE_TOKEN + "\n")
    token.chmod(0o600)
    sim.set_vars(f"k3_strategy: {strategy}\nk3_hf_token_file: {token}\n")
    out = tmp_path / "runbook.md"
    k3("runbook", sim.inventory, "-o", str(out), check=True)
    text = out.read_text()
    assert FAKE_TOKEN not in text and str(token) in text
    steps = [b for b in blocks(text) if b.when is None]
    hosts = {n["name"] for n in sim.info["nodes"]}
    assert {b.node for b in steps} == hosts | {"control"}  # every node has work, nothing runs elsewhere
    # nothing is installed before the runbook runs
    assert sim.ssh(0, "systemctl is-active k3-engine.service").stdout.strip() != "active"
    for i, b in enumerate(steps):
        res = run_block(sim, b.node, b.text)
        assert res.returncode == 0, f"block {i} on {b.node} failed:\n{b.text}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"
    # the token reached each engine node by reference, 0600, and was used by the weights download
    for rank in range(nodes):
        got = sim.ssh(rank, "stat -c %a /etc/k3deploy/hf-token && cat /etc/k3deploy/hf-token")
        assert got.stdout.split() == ["600", FAKE_TOKEN], got.stdout + got.stderr
    # what the runbook installed is what the deploy would install: plan sees no difference
    plan = k3("plan", sim.inventory, "--json", check=False)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    endpoint = json.loads(plan.stdout)["endpoint"]
    models = sim.ssh(0, f"curl -sf {endpoint}/v1/models")
    assert "moonshotai/Kimi-K3" in models.stdout
    chat = sim.ssh(0, f"curl -sf -H 'Content-Type: application/json' -d "
                      f"'{{\"model\":\"moonshotai/Kimi-K3\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}' "
                      f"{endpoint}/v1/chat/completions")
    assert '"choices"' in chat.stdout
    for rank in range(nodes):
        active = sim.ssh(rank, "systemctl is-active k3-engine.service k3-engine-prefill.service "
                               "k3-engine-decode.service 2>/dev/null | grep -c '^active'")
        assert active.stdout.strip() == "1", (rank, active.stdout)


def _executed(log: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The ``sh -c`` scripts pyinfra ran per host (``-vv``): (before the operations ran, while they ran). Facts
    are read in both stages, so what only ran while operations ran is what the operations ran."""
    before, after = log.split("--> Beginning operation run", 1)

    def parse(text: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        # a command runs from its ">>>" line to the next log line (a heredoc spans several lines)
        for m in re.finditer(r"^\s*\[(?P<host>[^\]]+)\] >>> (?P<cmd>.*?)(?=^\s*\[[^\]]+\] |^-->|\Z)", text,
                             re.M | re.S):
            argv = shlex.split(m["cmd"].rstrip("\n"))
            script = None
            while argv[:2] == ["sh", "-c"] and len(argv) == 3:  # the gate's own sh -c inside pyinfra's
                script = argv[2]
                try:
                    argv = shlex.split(script)
                except ValueError:
                    break
            if script is not None:
                out.setdefault(m["host"], set()).update(parts(script))
        return out

    return parse(before), parse(after)


def _inner(script: str, mark: str) -> str | None:
    """The script wrapped as ``( SCRIPT ) ...; echo MARK$?`` by the gate or the smoke-test fact."""
    m = re.fullmatch(r"\( (?P<s>.*) \)(?: 2>&1)?; echo " + re.escape(mark) + r"\$\?", script, re.S)
    return m["s"] if m else None


def test_the_runbook_runs_exactly_the_commands_the_operations_run(sim_factory, tmp_path):
    sim = sim_factory("e10c", "gb300", 2)
    sim.set_vars("k3_strategy: multi_node_tp\n")
    out = tmp_path / "runbook.md"
    k3("runbook", sim.inventory, "-o", str(out), check=True)  # written before anything is installed, as a site would
    # without -y pyinfra first detects changes (every operation reads its facts) and then asks to go on
    run = subprocess.run([PYINFRA, sim.inventory, "deploy/k3.py", "-vv"], input="\n", stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, why(run)
    facts, during = _executed(run.stdout)
    ops = {h: {s for s in scripts if s not in facts.get(h, set()) and not _inner(s, "K3_SMOKE_RC=")
               and not _inner(s, "K3_PROBE=")} for h, scripts in during.items()}
    probes = {h: {p for s in scripts if (p := _inner(s, "K3_PROBE="))} for h, scripts in during.items()}
    smokes = {h: {p for s in scripts if (p := _inner(s, "K3_SMOKE_RC="))} for h, scripts in during.items()}
    steps = [b for b in blocks(out.read_text()) if b.when is None and b.node != "control"]
    runbook = {h: "\n".join(b.text for b in steps if b.node == h) for h in {b.node for b in steps}}

    # every command an operation ran (files are uploaded by the deploy and written by heredoc in the runbook:
    # their bytes are compared by the plan after the runbook test above) is a command of the runbook, on that node
    # (pyinfra looks up its temporary directory for the first upload)
    # (a file goes to a new root-only temporary file of a random name, then into place: commands.new_temp, put_in_place)
    # (several files of a host in one command, their contents on its stdin: commands.write_from_stdin)
    uploads = re.compile(r"^(mkdir -p \S+|umask 022 && mkdir -p .* && : > \S+|t=\S+; trap .* mv -f \"\$t\" \S+|"
                         r"if \[ -n \"\$TMPDIR\" \].*|IFS= read -r n && .* mv -f \"\$t\" \S+ \) \|\| exit 1)$", re.S)
    # the deploy also keeps what it starts as the group's revision 1 (k3deploy history; the runbook's rollback
    # section restores from those) before it moves the staged files into place, and marks it current once it
    # serves, keeping its units' starts and marking the compile caches they served from (a node other than the smoke
    # test's gives the deployment lock back in that command, its last): bookkeeping with the time it ran, not a
    # bring-up step
    revision = re.compile(r"^(umask 077 && install -d -m 0700 \S+/revisions/\S+ .*meta\.json.*|"
                          r"\{ \[ -f \S+ \].* && mv -f \S+ \S+|"
                          r"echo \d+ > \S+/revisions/\S+/current && \{ \[ ! -d \S+ \] \|\| touch \S+/served; \}"
                          # the node's stage record kept with the revision where newer than the group's last mark
                          r"(?: && \{ k3_staged=; if .*; fi; touch \S+/stage\.seen; \})?"
                          # the units' starts kept with the revision, the compile caches they served from marked whole
                          r"(?: && \{ \[ ! -d \S+ \] \|\| \{ umask 077; .* > \S+/startup-\S+\.log; \}; \})?"
                          r"(?: && mkdir -p \S+/k3-compile/[0-9a-f]+ && touch \S+/k3-compile/[0-9a-f]+/\.k3-complete)*"
                          r"(?: && \{ if grep -qF .* \S+/deploy\.lock 2>/dev/null; then .*; fi; true; \})?)$", re.S)
    ran = {h: sorted(s for s in scripts if not uploads.match(s) and not revision.match(s)) for h, scripts in ops.items()}
    assert all(any(revision.match(s) for s in scripts) for scripts in ops.values())  # on every node of the group
    # the lock goes back with the mark on every node but the smoke test's (the first), whose lock goes as it ends
    gives_back = {h for h, scripts in ops.items() if any("/current" in s and "deploy.lock" in s for s in scripts)}
    assert gives_back == set(ops) - {sorted(ops)[0]}, gives_back
    assert all(ran.values()) and set(ran) == set(runbook)
    for h, scripts in ran.items():
        for s in scripts:
            assert s in runbook[h], f"{h} ran a command the runbook does not have:\n{s}"
    # and every command of the runbook is one the deploy ran on that node: the waits poll with the gate's probe
    for b in steps:
        if "<<'K3_EOF'" in b.text:
            continue  # the env and unit files, checked byte for byte by `plan` after the runbook test above
        probe = re.search(r"^k3_probe\(\) \{ (?P<p>.*); \}$", b.text, re.M)
        if probe:
            assert probe["p"] in probes[b.node], f"{b.node}: the runbook waits with a probe the gate never ran"
            continue
        done = ops.get(b.node, set()) | smokes.get(b.node, set())
        if b.text.strip() in done:
            continue  # one script spanning lines
        for line in b.text.strip().splitlines():
            assert line in done, f"{b.node}: the runbook runs a command the deploy never ran:\n{line}"
