"""The runbook document: built from the rollout, machine-extractable blocks, secrets by reference (no hosts
needed; ``tests/e2e/test_runbook.py`` runs a generated runbook on a simulated cluster)."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT
from k3deploy.model.commands import install_file
from k3deploy.model.inventory import plan_for, records_of, variables_for
from k3deploy.model.rollout import plan_rollout
from k3deploy.model.runbook import Context, blocks, build, to_html, to_markdown
from k3deploy.preflight.checks import CheckResult
from k3deploy.runtime.connections import load_inventory

TOKEN = "hf_runbookFAKEtoken0123456789"


def rollout(inventory: str, **overrides):
    records = records_of(load_inventory(inventory).inventory)
    v = variables_for(records, inventory)[records[0].name].vars.model_copy(update=overrides)
    return plan_rollout(plan_for(records, v), records, v)


def doc_for(r, **kw):
    rows = [CheckResult("gb300-node1", "nvidia.driver", "pass", "580.95.05", ">= 580.65.06"),
            CheckResult("gb300-node1", "disk.shm", "fail", "1.0 GiB size on /dev/shm", ">= 16.0 GiB of /dev/shm",
                        "enlarge /dev/shm")]
    hosts = list(dict.fromkeys(u.host for u in r.units))
    return build(r, Context(inventory="inventories/x.py", preflight=rows, addresses={h: h for h in hosts},
                 ssh={h: ["ssh", f"root@{h}"] for h in hosts}, brand="NVIDIA",
                 guide=kw.get("guide", "## Notes\n\n- **mlx5 dmabuf registration failures**: errno 524 ... "
                                       "`NCCL_DMABUF_ENABLE=0` ... nvidia_peermem\n- **MNNVL environments**: x\n"
                                       "- **RDMA**: set `UCX_TLS=\"rc,cuda_copy\"`\n"),
                 version="0"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("secret") / "hf-token"
    p.write_text(TOKEN + "\n")
    p.chmod(0o600)
    return str(p)


def test_token_appears_only_as_a_file_reference(token_file):
    r = rollout("inventories/gb300.py", k3_hf_token_file=token_file)
    doc = doc_for(r)
    md, page = to_markdown(doc), to_html(doc)
    assert TOKEN not in md and TOKEN not in page
    control = [b for b in blocks(md) if b.node == "control" and "hf-token" in b.text]
    assert len(control) == 2  # one copy per engine node
    assert all(b.text.rstrip("\n").endswith(f"< {token_file}") and "install -m 0600 /dev/stdin /etc/k3deploy/hf-token" in b.text
               for b in control)
    # the weights download reads the token from the file on the node, never from argv
    download = [b for b in blocks(md) if "download moonshotai/Kimi-K3" in b.text]
    assert download and all("HF_TOKEN_PATH=/run/secrets/hf-token" in b.text for b in download)


def test_every_unit_and_env_file_is_written_verbatim_and_steps_are_ordered():
    r = rollout("inventories/gb300.py")
    md = to_markdown(doc_for(r))
    steps = [b for b in blocks(md) if b.when is None]
    for u in r.units:
        mine = "\n".join(b.text for b in steps if b.node == u.host)
        assert f"<<'K3_EOF'\n{u.env_text}K3_EOF\n" in mine
        assert f"<<'K3_EOF'\n{u.unit_text}K3_EOF\n" in mine
    texts = [b.text for b in steps]

    def first(pred):
        return next(i for i, t in enumerate(texts) if pred(t))

    pull = first(lambda t: "pull -q vllm/vllm-openai:kimi-k3" in t)
    files = first(lambda t: "mv -f \"$t\" /etc/k3deploy/k3-engine.env" in t)
    head_start = first(lambda t: "systemctl restart k3-engine.service" in t)
    worker = first(lambda t: "bash -c '</dev/tcp/$1/$2' _ 192.0.2.11 " in t and "rendezvous" in t)
    # the stage before the files: the first node pulls and serves, the second copies from it
    serve = first(lambda t: "systemd-run --quiet --unit k3-stage-peers" in t)
    copy = first(lambda t: "K3_PEERS=gb300-node1=192.0.2.11 K3_PORT=8873 " in t and "k3_relay k3-hub" in t)
    assert pull < serve < copy < files
    health = first(lambda t: "http://192.0.2.11:8000/health" in t)
    smoke = first(lambda t: "/v1/chat/completions" in t)
    assert pull < files < head_start < worker < health < smoke
    assert steps[head_start].node == "gb300-node1" and steps[worker].node == "gb300-node2"
    worker_start = first(lambda t: "systemctl restart k3-engine.service" in t and t is not texts[head_start])
    assert worker <= worker_start < health and steps[worker_start].node == "gb300-node2"
    text = texts[worker_start]   # after the rendezvous (the wait and the start are one block: the wait first)
    assert worker < worker_start or text.index("</dev/tcp/") < text.index("systemctl restart k3-engine.service")
    assert "/v1/models" in steps[health].text


def test_prerequisites_rollback_and_troubleshooting():
    r = rollout("inventories/gb300.py")
    md = to_markdown(doc_for(r))
    assert "| disk.shm | `df -h /dev/shm` | >= 16.0 GiB of /dev/shm | 1.0 GiB size on /dev/shm | fail | enlarge" in md
    check = next(b for b in blocks(md) if b.node == "gb300-node1" and "df -h /dev/shm" in b.text)
    assert check.when == "check"  # what a prerequisite reads; not a bring-up step
    assert "nvidia-smi --query-gpu=driver_version" in check.text
    rollback = [b for b in blocks(md) if b.when == "rollback"]
    assert any('cp -p /etc/k3deploy/revisions/engine/"$n"/k3-engine.env /etc/k3deploy/k3-engine.env' in b.text
               for b in rollback)
    assert all(b.text.startswith("n=${K3_REVISION:?") for b in rollback if "revisions/" in b.text)
    stops = [b.node for b in rollback if b.text.startswith("systemctl stop")]
    assert stops == ["gb300-node2", "gb300-node1"]  # workers before the head
    marks = [b for b in rollback if "/current" in b.text]
    assert [b.node for b in marks] == ["gb300-node1", "gb300-node2"]  # the revision it went back to is current
    trouble = "\n".join(b.text for b in blocks(md) if b.when == "troubleshooting")
    assert "NCCL_DMABUF_ENABLE=0" in trouble and "nvidia_peermem" in trouble
    assert "### Multi-node NVLink (GB200/GB300)" in md and "NCCL_(MNNVL|CUMEM|NVLS)_ENABLE" in trouble
    assert "UCX_TLS" in trouble


def test_single_node_runbook_has_no_multi_node_troubleshooting():
    r = rollout("inventories/b300.py")
    md = to_markdown(doc_for(r))
    assert "NCCL_DMABUF_ENABLE" not in md and "Multi-node NVLink" not in md
    assert "</dev/tcp/" not in md  # no rendezvous to wait for


def test_pd_router_starts_after_both_pools_serve():
    r = rollout("inventories/pd_b300.py")
    steps = [b for b in blocks(to_markdown(doc_for(r))) if b.when is None]
    starts = [b.text.split("systemctl restart ")[1].split()[0] for b in steps if "systemctl restart" in b.text]
    assert starts[-1] == "k3-engine-router.service"
    router = next(i for i, b in enumerate(steps) if "systemctl restart k3-engine-router.service" in b.text)
    decode_health = max(i for i, b in enumerate(steps) if "/health" in b.text and "k3-engine-decode" in b.text)
    assert decode_health < router


def test_html_carries_the_same_blocks():
    r = rollout("inventories/gb300.py")
    doc = doc_for(r)
    md, page = to_markdown(doc), to_html(doc)
    for b in blocks(md):
        attrs = f'data-node="{b.node}"' + (f' data-when="{b.when}">' if b.when else ">")
        assert attrs in page
        assert html.escape(b.text.rstrip("\n")) in page
    assert page.count("language-sh") == len(blocks(md))


@pytest.mark.skipif(sys.platform != "linux", reason="GNU install")
def test_heredoc_writes_exact_bytes(tmp_path):
    dest = tmp_path / "etc" / "a.env"
    tricky = 'A=$HOME `x` \\n "q"\nK3_EOF\nB=100%\n'
    for content in ("OLD=1\n", tricky):
        proc = subprocess.run(["bash", "-e", "-c", install_file(str(dest), content, "0600")],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert dest.read_text() == content
        assert oct(os.stat(dest).st_mode & 0o777) == "0o600"


def test_runbook_cli_errors_are_one_line(tmp_path):
    def k3(*args):
        return subprocess.run([sys.executable, "-c", "from k3deploy.cli import main; main()", *args],
                              capture_output=True, text=True)

    missing = k3("runbook", str(tmp_path / "nope.py"), "-o", str(tmp_path / "r.md"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "nope.py" in missing.stderr
    bad_dir = k3("runbook", "inventories/gb300.py", "-o", str(tmp_path / "no" / "r.md"))
    assert bad_dir.returncode == 2 and "does not exist" in bad_dir.stderr and "Traceback" not in bad_dir.stderr


@pytest.mark.parametrize("inventory", sorted(p.name for p in (ROOT / "inventories").glob("*.py")))
def test_an_offline_runbook_is_written_for_every_example_inventory_without_any_node(inventory, tmp_path):
    out = tmp_path / "runbook.md"
    proc = subprocess.run([sys.executable, "-c", "from k3deploy.cli import main; main()", "runbook",
                           f"inventories/{inventory}", "-o", str(out), "--offline"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import INVENTORY_ONLY

    r = gather(f"inventories/{inventory}", INVENTORY_ONLY).require_rollout()
    for h in r.hosts:
        token = "@IFACE_" + re.sub(r"[^A-Za-z0-9]", "_", h) + "@"
        assert f"| `{token}` | {h} |" in text                        # named, with the command that finds it
        engines = [u for u in r.on_host(h) if u.group != "router"]
        if engines:
            mine = "\n".join(b.text for b in blocks(text) if b.node == h and b.when is None)
            assert f"SOCKET_IFNAME={token}" in mine                 # where the value goes in the env file
    assert "Values to read from the nodes first" in text


def test_the_smoke_section_asks_the_correctness_probes_questions_where_it_is_on():
    """With ``k3_correctness_probe`` the runbook's smoke test asks what the deploy's smoke test asks: each question
    and its expected answer named, the probe's command from the smoke test's node (the key read from the env file)."""
    from k3deploy.model.correctness import PROMPTS

    off = to_markdown(doc_for(rollout("inventories/gb300.py")))
    on = to_markdown(doc_for(rollout("inventories/gb300.py", k3_correctness_probe=True)))
    smoke = on[on.index("## 5. Smoke test"):]
    smoke = smoke[:smoke.index("\n## ", 4)]
    assert all(q.prompt in smoke and repr(q.expected) in smoke for q in PROMPTS), smoke
    assert "K3_ANSWERS=" in smoke and "k3_correctness_probe" in smoke
    assert "K3_ANSWERS=" not in off
