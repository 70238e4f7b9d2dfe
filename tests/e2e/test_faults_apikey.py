"""An endpoint protected by an API key, on a simulated 2-node cluster: the key lives in a 0600 file on the control
machine (``k3_api_key_file``) and in the units' 0600 env files (``VLLM_API_KEY``); the cluster deploys, passes the
readiness gate, the SLO gate's probe load and the smoke test, and ``status`` says it serves; a client with the key
gets an answer and one without gets 401; the key is in no command's output, no process's argv on the nodes and no
file but 0600 ones; ``--api-key`` in ``k3_extra_args`` is refused at the door; an engine that requires another key
fails the gate at once, naming the key, instead of waiting out the deadline."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ROOT, deploy, k3, k3_here, member, pyinfra, why
from helpers.simulated import Sim, endpoint_of

pytestmark = [pytest.mark.sim, pytest.mark.faults]

NAME = "akey"
MODEL = "moonshotai/Kimi-K3"
CONF = "/etc/k3deploy"


class Keyed:
    def __init__(self, sim: Sim, key: str, key_file: Path, deployed: str) -> None:
        self.sim, self.key, self.key_file, self.deployed = sim, key, key_file, deployed

    @property
    def endpoint(self) -> str:
        return endpoint_of(self.deployed)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    """Two gb300 trays in one group, keyed, with the SLO gate on, deployed once."""
    tmp = tmp_path_factory.mktemp("apikey")
    key = "k3-" + secrets.token_hex(16)
    key_file = tmp / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    sim = Sim(NAME, "gb300", 2)
    try:
        sim.set_vars(f"k3_strategy: multi_node_tp\nk3_stage: per_node\nk3_api_key_file: {key_file}\n"
                     "k3_slo_gate: 'on'\nk3_slo_requests: 6\nk3_slo_output_tokens: 8\nk3_slo_ttft_p95_ms: 60000\n")
        run = deploy(sim.inventory)
        assert run.returncode == 0, why(run)
        yield Keyed(sim, key, key_file, run.stdout)
    finally:
        sim.down()


def ask(endpoint: str, key: str | None) -> tuple[int, str]:
    body = json.dumps({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(endpoint + "/v1/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_keyed_cluster_deploys_gates_and_serves_only_with_the_key(keyed: Keyed, tmp_path: Path) -> None:
    out = keyed.deployed
    assert "SLO gate: group engine meets the targets" in out, out[-3000:]
    assert "smoke test:" in out and "answered" in out
    st = k3("status", keyed.sim.inventory, "--json", check=False)
    assert st.returncode == 0, st.stdout + st.stderr
    status = json.loads(st.stdout)
    assert status["verdict"] == "serving" and status["endpoint_models"] == [MODEL]
    # a client with the key gets an answer, one without (or with another key) 401, as vLLM answers
    code, text = ask(keyed.endpoint, keyed.key)
    assert code == 200 and json.loads(text)["choices"][0]["message"]["content"], text
    assert ask(keyed.endpoint, None)[0] == 401 and ask(keyed.endpoint, "not-the-key")[0] == 401
    # the README's client takes the key from a file; with the wrong one it says so in one line, at once
    chat = [sys.executable, str(ROOT / "tools" / "chat.py"), keyed.endpoint, "--max-tokens", "8"]
    ok = subprocess.run([*chat, "--api-key-file", str(keyed.key_file)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "Generated text: " in ok.stdout, ok.stderr
    wrong = tmp_path / "wrong-key"
    wrong.write_text("not-the-key\n")
    start = time.monotonic()
    bad = subprocess.run([*chat, "--api-key-file", str(wrong)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and time.monotonic() - start < 30
    assert bad.stderr.count("\n") == 1 and "answered 401" in bad.stderr and str(wrong) in bad.stderr
    # the history records the gate's figures of the keyed revision: its probe load got answers
    engine = json.loads(k3("history", keyed.sim.inventory, "--json", check=True).stdout)["groups"]["engine"]
    assert engine["revisions"][-1]["slo"]["verdict"] == "hit"


def test_the_key_is_in_no_output_no_argv_and_no_file_but_0600_ones(keyed: Keyed, tmp_path: Path) -> None:
    sim, inv, key = keyed.sim, keyed.sim.inventory, keyed.key
    md, bundle = tmp_path / "rb.md", tmp_path / "b.tar.gz"
    runs = [["plan", inv], ["plan", inv, "--json"], ["vars", inv, "--all"], ["vars", inv, "--json"],
            ["resolve", "--inventory", inv], ["resolve", "--inventory", inv, "--json"], ["history", inv],
            ["history", inv, "--json"], ["status", inv], ["status", inv, "--json"], ["runbook", inv, "-o", str(md)],
            ["bundle", inv, "-o", str(bundle)], ["export", "slurm", inv, "-o", str(tmp_path / "slurm")],
            ["export", "kubernetes", inv, "-o", str(tmp_path / "k8s"), "--read-nodes"]]
    seen = {"deploy": keyed.deployed}
    for args in runs:
        # the commands that read no host run in this process (the same output, without an interpreter's start)
        reads_no_host = args[0] in ("vars", "resolve") or args[:2] == ["export", "slurm"]
        proc = (k3_here if reads_no_host else k3)(*args, check=False)
        assert proc.returncode in (0, 3), (args, proc.stdout[-2000:], proc.stderr[-2000:])
        seen[" ".join(args)] = proc.stdout + proc.stderr
    for path in (md, *(f for d in ("slurm", "k8s") for f in (tmp_path / d).rglob("*") if f.is_file())):
        seen[str(path.relative_to(tmp_path))] = path.read_text()
    with tarfile.open(bundle) as tar:
        for m in tar.getmembers():
            if m.isfile():
                seen[f"bundle:{m.name}"] = member(tar, m).decode(errors="replace")
    dry = pyinfra(inv, "deploy/k3.py", "--dry", "--diff", timeout=120)
    assert dry.returncode == 0, why(dry)
    seen["deploy --dry --diff"] = dry.stdout
    assert not [where for where, text in seen.items() if key in text]
    # the exports take it by reference: the Secret's key, the runbook's 0600 file on the node
    assert "VLLM_API_KEY=@SECRET_VLLM_API_KEY@" in md.read_text() and f"< {keyed.key_file}" in md.read_text()
    assert "secretKeyRef" in "".join(f.read_text() for f in (tmp_path / "k8s").rglob("*.yaml"))
    for rank in (0, 1):
        # no process's argv on the node holds it (the engines and their containers run; the probes ran)
        ps = sim.ssh(rank, "ps -eo args")
        assert ps.returncode == 0 and "vllm" in ps.stdout.lower() and key not in ps.stdout
        # every file that holds it is root's and 0600: the env file and its revision's copy
        found = sim.ssh(rank, f"grep -rlF {key} /etc /var/lib/k3deploy /run /tmp /var/log 2>/dev/null | "
                              "xargs -r stat -c '%a %U %n'").stdout.split("\n")
        files = [line for line in found if line]
        assert files and all(line.startswith("600 root ") for line in files), files
        assert f"600 root {CONF}/k3-engine.env" in files


def test_a_secret_in_the_engine_argv_is_refused_at_the_door(keyed: Keyed) -> None:
    sim = keyed.sim
    before = sim.group_vars.read_text()
    try:
        sim.set_vars(f'k3_extra_args: ["--api-key", "{keyed.key}"]\n')
        for args in (["plan", sim.inventory], ["vars", sim.inventory], ["resolve", "--inventory", sim.inventory]):
            proc = (k3 if args[0] == "plan" else k3_here)(*args, check=False)
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            line = proc.stderr.strip()
            assert "\n" not in line and "--api-key carries a secret" in line and "k3_api_key_file" in line
            assert keyed.key not in proc.stdout + proc.stderr
        run = deploy(sim.inventory)
        assert run.returncode == 2 and keyed.key not in run.stdout and "k3_api_key_file" in run.stdout
    finally:
        sim.group_vars.write_text(before)


def test_an_engine_that_requires_another_key_fails_the_gate_at_once_naming_the_key(keyed: Keyed) -> None:
    """The head's image sets a key of its own (fault ``engine-api-key``): the readiness probe's ``/v1/models`` gets 401
    and the run fails within a minute (not the 1,500 s deadline), naming the key; with the fault cleared the next run
    serves again."""
    sim, inv = keyed.sim, keyed.sim.inventory
    k3_here("sim", "fault", NAME, "0:engine-api-key=the-images-own-key", check=True)
    try:
        sim.set_vars('k3_extra_args: ["--max-num-seqs", "64"]\n')   # a change: the group restarts
        start = time.monotonic()
        run = deploy(inv)
        took = time.monotonic() - start
        out = run.stdout
        assert run.returncode != 0 and took < 240, (took, out[-3000:])
        assert "/v1/models -> 401: the endpoint refused the API key sent" in out and "k3_api_key_file" in out
        assert keyed.key not in out
    finally:
        k3_here("sim", "fault", NAME, "--clear", "0:engine-api-key", check=True)
    again = deploy(inv)
    assert again.returncode == 0, why(again)
    assert ask(keyed.endpoint, keyed.key)[0] == 200
