"""Secrets and revisions on a simulated 2-node cluster: no command that prints (nor a revision's ``meta.json``)
shows the value of a secret-named ``k3_extra_env`` setting or of the Hugging Face token; ``k3deploy history``
marks a revision restorable only when every host of its group holds it, and a rollback to one that some host lacks
is refused in one line before anything changes."""

from __future__ import annotations

import json
import secrets
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import deploy, k3, k3_here, member, pyinfra, why
from helpers.simulated import Sim
from k3deploy.cli import COMMANDS

pytestmark = [pytest.mark.sim, pytest.mark.faults]

#: commands that print nothing of a deployment's variables, and why they are not run here
NOT_RUN = {
    "lint": "checks a recipe file, not an inventory",
    "options": "lists the recipe's hardware and strategies, not an inventory's variables",
}
CONF = "/etc/k3deploy"
FILES = f"{CONF}/k3-engine.env /etc/systemd/system/k3-engine.service {CONF}/revisions/engine/current"


class Deployed:
    def __init__(self, sim: Sim, values: dict[str, str]) -> None:
        self.sim, self.values = sim, values
        self.outputs: dict[str, str] = {}

    def leaks(self, text: str) -> list[str]:
        return [name for name, value in self.values.items() if value in text]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """Two gb300 nodes in one multi-node group, with two secret-named env settings and a token, deployed once
    (revision 1)."""
    tmp = tmp_path_factory.mktemp("secrets")
    values = {"MY_API_KEY": "k" + secrets.token_hex(12), "DB_PASSWORD": "p" + secrets.token_hex(12),
              "token": "hf_" + secrets.token_hex(16)}
    token = tmp / "hf-token"
    token.write_text(values["token"] + "\n")
    token.chmod(0o600)
    sim = Sim("fsec", "gb300", 2)
    try:
        # (the benchmark's load as small as it goes: its output is read for leaks, not for figures)
        sim.set_vars(f"k3_strategy: multi_node_tp\nk3_stage: per_node\nk3_hf_token_file: {token}\n"
                     "k3_bench_input_tokens: 16\nk3_bench_output_tokens: 8\nk3_bench_concurrency: [1]\n"
                     "k3_bench_rounds: 1\n"
                     f"k3_extra_env: {{MY_API_KEY: {values['MY_API_KEY']}, DB_PASSWORD: {values['DB_PASSWORD']}}}\n")
        run = deploy(sim.inventory)
        assert run.returncode == 0, why(run)
        d = Deployed(sim, values)
        d.outputs["deploy"] = run.stdout
        yield d
    finally:
        sim.down()


def meta_files(sim: Sim) -> str:
    return "".join(sim.ssh(rank, f"cat {CONF}/revisions/*/*/meta.json").stdout for rank in (0, 1))


def test_no_output_shows_a_secret(deployed: Deployed, tmp_path: Path) -> None:
    sim, inv = deployed.sim, deployed.sim.inventory
    # a pending change of a secret: the env diffs (plan, --dry --diff) show it changes, never its values
    new_password = "q" + secrets.token_hex(12)
    sim.group_vars.write_text(sim.group_vars.read_text().replace(deployed.values["DB_PASSWORD"], new_password))
    deployed.values["DB_PASSWORD (new)"] = new_password
    md, html, offline, bundle, svg = (tmp_path / n for n in ("rb.md", "rb.html", "offline.md", "b.tar.gz", "t.svg"))
    runs = {
        "plan": [[inv], [inv, "--json"]],
        "vars": [[inv], [inv, "--json"], [inv, "--all"], [inv, "--all", "--json"]],
        "history": [[inv], [inv, "--json"]],
        "status": [[inv], [inv, "--json"]],
        "resolve": [["--inventory", inv], ["--inventory", inv, "--json"]],
        "runbook": [[inv, "-o", str(md)], [inv, "-o", str(html)], [inv, "-o", str(offline), "--offline"]],
        "bundle": [[inv, "-o", str(bundle)], [inv, "-o", str(bundle), "--json"]],
        "preflight": [[inv], [inv, "--json"]],
        "verify": [[inv], [inv, "--json"]],
        "unlock": [[inv], [inv, "--json"]],
        "watch": [[inv, "--once"], [inv, "--once", "--json"], [inv, "--repair", "--print-unit"]],
        "spares": [[inv], [inv, "--json"]],
        "deploy": [[inv, "--dry", "--diff"]],
        "timeline": [[inv, "-o", str(svg)], [inv, "-o", str(svg), "--json"]],
        "bench": [[inv, "--json"]],
        "export": [["slurm", inv, "-o", str(tmp_path / "slurm")], ["slurm", inv, "-o", str(tmp_path / "slurm"), "--json"],
                   ["kubernetes", inv, "-o", str(tmp_path / "k8s"), "--read-nodes"],
                   ["kubernetes", inv, "-o", str(tmp_path / "k8s"), "--read-nodes", "--json"]],
    }
    assert set(runs) | set(NOT_RUN) == set(COMMANDS), "a new command: add it to runs (or NOT_RUN with a reason)"
    seen = dict(deployed.outputs)
    for command, variants in runs.items():
        for args in variants:
            # the commands that read no host run in this process (the same output, without an interpreter's start)
            reads_no_host = command in ("vars", "resolve") or "--offline" in args or args[0] == "slurm"
            proc = (k3_here if reads_no_host else k3)(command, *args, check=False)
            assert proc.returncode in (0, 3), (command, args, proc.stdout[-2000:], proc.stderr[-2000:])
            seen[f"k3deploy {command} {' '.join(args)}"] = proc.stdout + proc.stderr
    for path in (md, html, offline, svg, *(f for d in ("slurm", "k8s") for f in (tmp_path / d).rglob("*") if f.is_file())):
        seen[str(path.relative_to(tmp_path))] = path.read_text()
    with tarfile.open(bundle) as tar:
        for m in tar.getmembers():
            if m.isfile():
                seen[f"bundle:{m.name}"] = member(tar, m).decode(errors="replace")
    dry = pyinfra(inv, "deploy/k3.py", "--dry", "--diff", timeout=120)
    assert dry.returncode == 0, why(dry)
    seen["deploy --dry --diff"] = dry.stdout
    seen["meta.json"] = meta_files(sim)
    leaks = {where: deployed.leaks(text) for where, text in seen.items() if deployed.leaks(text)}
    assert not leaks, leaks
    # they say that there are secrets and that they change
    assert "DB_PASSWORD: **** -> ****" in dry.stdout and "MY_API_KEY" in seen[f"k3deploy vars {inv}"]
    assert "@SECRET_MY_API_KEY@" in md.read_text() and f"{CONF}/secrets/DB_PASSWORD" in md.read_text()
    assert "k3_extra_env" in json.loads(seen[f"k3deploy history {inv} --json"])["groups"]["engine"][
        "revisions"][0]["variables"]
    # the env file on the nodes (0600) holds the value: that is where it belongs
    assert sim.ssh(1, f"stat -c %a {CONF}/k3-engine.env; grep -c {deployed.values['MY_API_KEY']} "
                      f"{CONF}/k3-engine.env").stdout.split() == ["600", "1"]


def test_a_revision_some_host_lacks_is_not_restorable(deployed: Deployed) -> None:
    sim, inv = deployed.sim, deployed.sim.inventory
    sim.set_vars('k3_extra_args: ["--max-num-seqs", "64"]\n')
    run = deploy(inv)   # revision 2
    assert run.returncode == 0, why(run)
    assert not deployed.leaks(run.stdout + meta_files(sim))
    engine = json.loads(k3("history", inv, "--json", check=True).stdout)["groups"]["engine"]
    assert engine["current"] == 2 and [(r["number"], r["restorable"]) for r in engine["revisions"]] == [
        (1, True), (2, True)]

    worker = sim.info["nodes"][1]["name"]
    sim.ssh(1, f"rm -rf {CONF}/revisions/engine/1")
    engine = json.loads(k3("history", inv, "--json", check=True).stdout)["groups"]["engine"]
    assert [(r["number"], r["restorable"], r["missing_on"]) for r in engine["revisions"]] == [
        (1, False, [worker]), (2, True, [])]
    text = k3("history", inv, check=True).stdout
    assert f"revision 1 is not restorable: {worker} lacks its files" in text, text

    before = [sim.ssh(rank, f"sha256sum {FILES}; systemctl show -p ActiveEnterTimestamp k3-engine.service").stdout
              for rank in (0, 1)]
    preview = k3("plan", inv, "--rollback", "1", check=False)
    assert preview.returncode == 2 and "cannot roll group engine back to revision 1" in preview.stderr
    back = deploy(inv, "--data", "k3_rollback=1")
    assert back.returncode != 0, why(back)
    refusal = [line for line in back.stdout.splitlines() if "cannot roll group engine back to revision 1" in line]
    assert len(refusal) == 1 and worker in refusal[0] and "nothing was changed" in refusal[0], why(back)
    after = [sim.ssh(rank, f"sha256sum {FILES}; systemctl show -p ActiveEnterTimestamp k3-engine.service").stdout
             for rank in (0, 1)]
    assert after == before
