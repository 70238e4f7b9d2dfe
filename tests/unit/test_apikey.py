"""The endpoint's API key: a secret-valued flag in ``k3_extra_args`` is refused at the door (one line naming the flag and
``k3_api_key_file``, never the value); the key file is checked; every unit's env file (0600) gets ``VLLM_API_KEY`` and no
argv, unit or printed text holds it; the clients k3deploy runs on a node (readiness probe, smoke test, status, SLO
probe) send it from the unit's env file, run here in a real ``sh`` against an HTTP server that guards ``/v1`` as vLLM
does, and a refused key fails the probe at once, naming the key; the Kubernetes export and the runbook take it by
reference."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from k3deploy.errors import K3Error
from k3deploy.model import commands
from k3deploy.model import kubernetes as k8s
from k3deploy.model.binding import HostRecord
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.runbook import Context, blocks, build, to_markdown
from k3deploy.model.secrets import MASK, argv_secret, mask_argv
from k3deploy.model.variables import merge_vars

KEY = "k3key-0b5e9c1d7a3f4e21"
MODEL = "moonshotai/Kimi-K3"


def resolve(extra_args: list[str], **more: object) -> None:
    merge_vars(["head"], {"k3_hardware": "gb300", "k3_extra_args": extra_args, **more}, [], "n1: ")


@pytest.mark.parametrize("args, flag", [
    (["--api-key", KEY], "--api-key"),
    ([f"--api-key={KEY}"], "--api-key"),
    (["--max-num-seqs", "64", f"--api_key={KEY}"], "--api_key"),
    (["--hf-token", "hf_" + "a" * 34], "--hf-token"),
    (["--served-model-name", "sk-" + "b" * 40], "--served-model-name"),
])
def test_a_secret_in_the_extra_args_is_refused_naming_the_flag_never_the_value(args, flag):
    with pytest.raises(K3Error) as err:
        resolve(args)
    line = str(err.value)
    assert "\n" not in line and flag in line and "k3_api_key_file" in line and "k3_extra_args" in line
    assert not any(a.split("=")[-1] in line for a in args if a != flag and not a.startswith("--max")
                   and a not in ("64",))


def test_flags_that_only_look_like_secrets_pass():
    resolve(["--max-num-batched-tokens", "8192", "--tokenizer", "moonshotai/Kimi-K3", "--hf-token",
             "--enable-prompt-tokens-details", "--ssl-keyfile", "/etc/ssl/k.pem"])
    assert argv_secret(["--tokenizer-mode", "auto", "--hf-token", "--max-num-seqs", "8"]) is None


def test_shown_argv_masks_a_secret_flag_and_a_token_shaped_word():
    assert mask_argv(["--api-key", KEY, "--x", "hf_" + "c" * 30, f"--hf-token={KEY}"]) == \
        ["--api-key", MASK, "--x", MASK, f"--hf-token={MASK}"]


def test_the_key_file_in_the_engine_env_too_is_refused(tmp_path):
    key = tmp_path / "key"
    key.write_text(KEY)
    with pytest.raises(K3Error, match="remove VLLM_API_KEY from k3_extra_env"):
        resolve([], k3_api_key_file=str(key), k3_extra_env={"VLLM_API_KEY": "x"})


def hosts(**data: object) -> list[HostRecord]:
    common = {"k3_hardware": "gb300", **data}
    return [HostRecord("n1", ("head",), {**common, "k3_ip": "10.0.0.1"}),
            HostRecord("n2", ("workers",), {**common, "k3_ip": "10.0.0.2"})]


def key_file(tmp_path: Path, text: str = KEY + "\n", mode: int = 0o600) -> str:
    p = tmp_path / "api-key"
    p.write_text(text)
    p.chmod(mode)
    return str(p)


@pytest.mark.parametrize("text, mode, why", [
    (KEY + "\n", 0o644, "chmod 600"),
    ("\n", 0o600, "is empty"),
    (KEY + "\nsecond\n", 0o600, "one line of printable characters"),
    ("two words\n", 0o600, "without spaces"),
])
def test_a_bad_key_file_is_one_line_naming_the_file_and_the_fix(tmp_path, text, mode, why):
    path = key_file(tmp_path, text, mode)
    with pytest.raises(K3Error) as err:
        target(hosts(k3_api_key_file=path), None)
    assert why in str(err.value) and path in str(err.value) and "\n" not in str(err.value)
    assert KEY not in str(err.value)


def test_every_unit_env_file_holds_the_key_and_nothing_else_does(tmp_path):
    r = desired_rollout(target(hosts(k3_api_key_file=key_file(tmp_path), k3_replica=0), None))
    assert [u.env_text.splitlines().count(f"VLLM_API_KEY={KEY}") for u in r.units] == [1] * len(r.units)
    assert all(KEY not in u.unit_text and KEY not in " ".join(u.node.argv) for u in r.units)
    assert KEY not in repr(r)
    # the probes, the smoke test and the waits read the key on the node: it is in none of their texts
    scripts = [commands.probe(u.unit, u.serves, MODEL, u.env_path) for u in r.units]
    scripts += [commands.smoke_test(r.endpoint, MODEL, r.units[0].env_path),
                commands.slo_probe(r.endpoint, [r.endpoint], MODEL, 2, 1, 4, 4, env_file=r.units[0].env_path)]
    assert all(KEY not in s for s in scripts)


# ------------------------------------------------------------------------------------- clients against a keyed API


class Guarded(BaseHTTPRequestHandler):
    """What vLLM's ``--api-key`` middleware does: ``/v1`` needs ``Authorization: Bearer <key>`` (401 without it),
    ``/health`` and ``/metrics`` stay open. Every request's headers are kept."""

    key: str | None = KEY
    seen: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def guarded(self) -> bool:
        self.seen.append(self.headers.get("Authorization", ""))
        if self.path.startswith("/v1") and self.key and self.headers.get("Authorization") != f"Bearer {self.key}":
            self.reply(401, b'{"error": "Unauthorized"}')
            return False
        return True

    def do_GET(self) -> None:
        if not self.guarded():
            return
        if self.path == "/health":
            self.reply(200, b"")
        elif self.path == "/metrics":
            self.reply(200, b"vllm:num_requests_running{engine=\"0\"} 0.0\n", "text/plain")
        else:
            self.reply(200, json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if not self.guarded():
            return
        if self.path == "/v1/chat/completions":
            self.reply(200, json.dumps({"choices": [{"message": {"content": "Hello"}}]}).encode())
        else:
            body = b"".join(f"data: {json.dumps({'choices': [{'text': 'x'}]})}\n\n".encode() for _ in range(2))
            self.reply(200, body + b"data: [DONE]\n\n", "text/event-stream")


@pytest.fixture
def server() -> Iterator[str]:
    Guarded.key, Guarded.seen = KEY, []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Guarded)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def sh(script: str, tmp_path: Path) -> tuple[int, str]:
    """``script`` in a real sh; ``systemctl`` says the unit runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text("#!/bin/sh\necho ActiveState=active; echo SubState=running; echo NRestarts=0\n")
    (bin_dir / "systemctl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


def env_file(tmp_path: Path, key: str | None) -> str:
    p = tmp_path / "k3-engine.env"
    p.write_text("A=1\n" + (f"VLLM_API_KEY={key}\n" if key else ""))
    p.chmod(0o600)
    return str(p)


def test_the_probe_sends_the_key_of_the_units_env_file(tmp_path, server):
    rc, out = sh(commands.probe("k3-engine.service", server, MODEL, env_file(tmp_path, KEY)), tmp_path)
    assert rc == commands.PROBE_READY, out
    assert f"Bearer {KEY}" in Guarded.seen


@pytest.mark.parametrize("key, said", [
    ("wrong-key", "refused the API key sent"),
    (None, "requires an API key and none was sent"),
])
def test_a_refused_key_fails_the_probe_at_once_naming_the_key(tmp_path, server, key, said):
    rc, out = sh(commands.probe("k3-engine.service", server, MODEL, env_file(tmp_path, key)), tmp_path)
    assert rc == commands.PROBE_FAILED
    assert "/v1/models -> 401" in out and said in out and "k3_api_key_file" in out
    assert KEY not in out


def test_an_endpoint_without_a_key_is_probed_as_before(tmp_path, server):
    Guarded.key = None
    assert sh(commands.probe("k3-engine.service", server, MODEL, env_file(tmp_path, None)), tmp_path)[0] == 0
    assert set(Guarded.seen) == {""}   # /health, then /v1/models: no header


def test_smoke_test_status_and_slo_probe_send_the_key(tmp_path, server):
    env = env_file(tmp_path, KEY)
    rc, out = sh(commands.smoke_test(server, MODEL, env), tmp_path)
    assert rc == 0 and out.strip() == "Hello"
    rc, out = sh(commands.endpoint_models(server, env), tmp_path)
    assert json.loads(out)["data"][0]["id"] == MODEL
    rc, out = sh(commands.unit_status("k3-engine.service", "k3-engine", "true", server, env), tmp_path)
    assert f'K3_MODELS={{"object": "list", "data": [{{"id": "{MODEL}"}}]}}' in out and "K3_HEALTH=200" in out
    rc, out = sh(commands.slo_probe(server, [server], MODEL, 3, 2, 4, 2, env_file=env), tmp_path)
    results = json.loads(out.split("K3_SLO=", 1)[1])["results"]
    assert [r["ok"] for r in results] == [True] * 3
    assert Guarded.seen.count(f"Bearer {KEY}") >= 6


def test_smoke_test_and_slo_probe_with_a_refused_key_name_the_key(tmp_path, server):
    env = env_file(tmp_path, "wrong-key")
    rc, out = sh(commands.smoke_test(server, MODEL, env), tmp_path)
    assert rc != 0 and "401 Unauthorized: the endpoint refused the API key sent" in out and "k3_api_key_file" in out
    rc, out = sh(commands.slo_probe(server, [server], MODEL, 1, 1, 4, 2, env_file=env), tmp_path)
    [result] = json.loads(out.split("K3_SLO=", 1)[1])["results"]
    assert not result["ok"] and result["error"].startswith("401: the endpoint refused the API key sent")


# ------------------------------------------------------------------------------------------ exports and the runbook


def test_kubernetes_takes_the_key_from_the_secret_and_probes_with_it(tmp_path):
    r = desired_rollout(target(hosts(k3_api_key_file=key_file(tmp_path)), None))
    objs = k8s.manifests(r)
    text = yaml.safe_dump_all(objs)
    assert KEY not in text
    assert "secretKeyRef" in text and "VLLM_API_KEY" in text
    probes = [c["readinessProbe"] for o in objs for c in _containers(o) if "readinessProbe" in c]
    assert probes and not any(p.get("httpGet", {}).get("path") == "/v1/models" for p in probes)
    assert any("Bearer" in " ".join(p.get("exec", {}).get("command", [])) for p in probes)


def _containers(obj: dict) -> list[dict]:
    out: list[dict] = []

    def walk(x: object) -> None:
        if isinstance(x, dict):
            if "containers" in x and isinstance(x["containers"], list):
                out.extend(x["containers"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(obj)
    return out


def test_the_runbook_copies_the_key_file_and_never_shows_the_key(tmp_path):
    path = key_file(tmp_path)
    r = desired_rollout(target(hosts(k3_api_key_file=path), None))
    md = to_markdown(build(r, Context(inventory="inventories/x.py", preflight=[], addresses={"n1": "n1", "n2": "n2"},
                                      ssh={h: ["ssh", f"root@{h}"] for h in ("n1", "n2")}, brand="NVIDIA", guide=None,
                                      version="0")))
    assert KEY not in md and "VLLM_API_KEY=@SECRET_VLLM_API_KEY@" in md
    copies = [b for b in blocks(md) if b.node == "control" and "secrets/VLLM_API_KEY" in b.text]
    assert len(copies) == 2 and all(b.text.rstrip("\n").endswith(f"< {path}") for b in copies)


def test_a_recipe_whose_argv_carries_a_key_is_refused(tmp_path):
    text = (Path(__file__).resolve().parents[2] / "recipes" / "kimi-k3.yaml").read_text()
    assert text.count('  base_args:\n    - "--trust-remote-code"\n') == 1
    recipe = tmp_path / "keyed.yaml"
    recipe.write_text(text.replace('  base_args:\n    - "--trust-remote-code"\n',
                                   f'  base_args:\n    - "--trust-remote-code"\n    - "--api-key"\n    - "{KEY}"\n'))
    with pytest.raises(K3Error) as err:
        target(hosts(k3_recipe=str(recipe)), None)
    assert "--api-key carries a secret" in str(err.value) and "k3_api_key_file" in str(err.value)
    assert KEY not in str(err.value)
