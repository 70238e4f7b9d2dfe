"""A bring-up runbook for people who type the commands, from the same rollout ``deploy/k3.py`` executes.

Every command block names the node it runs on, so the runbook can be executed and tested mechanically:

* Markdown: a fenced block whose info string is ``sh node=NAME`` (``node=control`` is the machine that holds
  the inventory); ``when=rollback`` or ``when=troubleshooting`` marks blocks that are not part of the bring-up.
* HTML: ``<pre><code class="language-sh" data-node="NAME" data-when="...">``.

:func:`blocks` extracts them from a Markdown runbook in document order.

Secrets: the Hugging Face token is referred to by its file, never included.
"""

from __future__ import annotations

import html
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from k3deploy.cluster.commands import download_argv, pull_script, snapshot_dir
from k3deploy.cluster.diff import exec_start, start_groups
from k3deploy.cluster.rollout import Rollout, UnitWork

CONTROL = "control"

#: the command a person runs for each preflight check (the facts read the same sources)
CHECK_COMMANDS: dict[str, str] = {
    "nvidia.driver": "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u",
    "nvidia.fabricmanager": "systemctl is-active nvidia-fabricmanager; nv-fabricmanager --version",
    "nvlink.fabric": "nvidia-smi -q | grep -A6 -E '^ *Fabric'",
    "nvidia.imex": "systemctl is-active nvidia-imex; ls /dev/nvidia-caps-imex-channels",
    "container.toolkit": "nvidia-ctk --version",
    "container.runtime": "docker version --format '{{.Server.Version}}'",
    "rdma.devices": "ibv_devinfo | grep -E 'hca_id|state|link_layer'",
    "rdma.gpudirect": "uname -r; lsmod | grep -E '^nvidia_peermem' || echo 'nvidia_peermem not loaded'",
    "disk.images": "df -h \"$(docker info --format '{{.DockerRootDir}}')\"",
    "disk.shm": "df -h /dev/shm",
    "rocm.driver": "rocm-smi --showdriverversion",
    "rocm.version": "amd-smi version",
    "rocm.devices": "rocm-smi --showmeminfo vram",
    "ascend.driver": "npu-smi info",
    "ascend.health": "npu-smi info",
    "ascend.versions": "cat /usr/local/Ascend/driver/version.info",
    "ascend.mounts": "ls -d /usr/local/dcmi /usr/local/bin/npu-smi /usr/local/Ascend/driver/lib64 /etc/ascend_install.info",
}
DEVICE_COMMANDS = {
    "NVIDIA": {"gpu.model": "nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c",
               "gpu.count": "nvidia-smi -L | wc -l"},
    "AMD": {"gpu.model": "rocm-smi --showproductname", "gpu.count": "rocm-smi --showproductname"},
    "Huawei": {"gpu.model": "npu-smi info", "gpu.count": "npu-smi info"},
}


def check_command(check: str, brand: str, address: str, cache: str) -> str:
    if check == "network.interface":
        return f"ip -o -4 addr show | grep -F ' {address}/'" if address else "ip -o -4 route show default"
    if check == "disk.cache":
        return f"p={shlex.quote(cache)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; df -h \"$p\""
    return DEVICE_COMMANDS.get(brand, {}).get(check) or CHECK_COMMANDS.get(check, "")


# ----------------------------------------------------------------------------------- model


@dataclass
class Block:
    node: str
    text: str
    when: str | None = None


@dataclass
class Doc:
    """The runbook as a flat list of items: ("h", level, text), ("p", text), ("block", Block),
    ("table", header, rows)."""

    items: list[tuple[Any, ...]] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.items.append(("h", level, text))

    def p(self, text: str) -> None:
        self.items.append(("p", text))

    def block(self, node: str, text: str, when: str | None = None) -> None:
        self.items.append(("block", Block(node, text.rstrip("\n"), when)))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.items.append(("table", header, rows))


def _heredoc(dest: str, content: str, mode: str, backup: str) -> str:
    tag = "K3_EOF"
    while tag in content.splitlines():
        tag += "_"
    new = f"{dest}.new"
    return (f"install -d -m 0755 {shlex.quote(dest.rsplit('/', 1)[0] or '/')}\n"
            f"install -m {mode} /dev/stdin {shlex.quote(new)} <<'{tag}'\n{content}{tag}\n"
            f"if [ -f {shlex.quote(dest)} ] && ! cmp -s {shlex.quote(new)} {shlex.quote(dest)}; then\n"
            f"  install -d -m 0700 {shlex.quote(backup)} && cp -p {shlex.quote(dest)} {shlex.quote(backup)}/\n"
            f"fi\n"
            f"mv -f {shlex.quote(new)} {shlex.quote(dest)}\n")


def _wait_tcp(address: str, port: int, timeout: int) -> str:
    return (f"end=$(( $(date +%s) + {timeout} ))\n"
            f"until timeout 2 bash -c '</dev/tcp/{address}/{port}' 2>/dev/null; do\n"
            f"  [ $(date +%s) -lt $end ] || {{ echo 'rendezvous {address}:{port} not open after {timeout}s' >&2; exit 1; }}\n"
            f"  sleep 1\ndone\necho 'rendezvous {address}:{port} open'\n")


def _wait_http(u: UnitWork, timeout: int, models: bool, docker: str) -> str:
    url = u.serves or ""
    unit = shlex.quote(u.unit)
    text = (f"end=$(( $(date +%s) + {timeout} ))\n"
            f"until [ \"$(curl -s -o /dev/null -m 5 -w '%{{http_code}}' {shlex.quote(url + '/health')})\" = 200 ]; do\n"
            f"  if systemctl is-failed -q {unit} || [ $(date +%s) -ge $end ]; then\n"
            f"    echo '{url}/health is not 200: last log lines follow' >&2\n"
            f"    journalctl -u {unit} -n 25 --no-pager >&2; {shlex.quote(docker)} logs --tail 25 {shlex.quote(u.container)} >&2\n"
            f"    exit 1\n  fi\n  sleep 2\ndone\n"
            f"echo '{url}/health: 200'\n")
    if models:
        text += f"curl -sf -m 10 {shlex.quote(url + '/v1/models')}\necho\n"
    return text


def _start(u: UnitWork) -> str:
    q = shlex.quote(u.unit)
    return f"systemctl daemon-reload\nsystemctl reset-failed {q} 2>/dev/null || true\nsystemctl enable {q}\nsystemctl restart {q}\n"


def _start_sequence(doc: Doc, r: Rollout, when: str | None) -> None:
    docker = r.vars.k3_docker
    timeout = r.deadline
    for g in start_groups(r):
        units = r.group(g)
        heads = [u for u in units if u.is_group_head]
        workers = [u for u in units if not u.is_group_head]
        doc.h(3, f"Group {g}" + (" (after every engine group serves)" if g == "router" else ""))
        for u in heads:
            doc.p(f"Start the {u.node.role} of group {g} on **{u.host}** ({u.unit}).")
            doc.block(u.host, _start(u), when)
        for u in workers:
            if u.join:
                doc.p(f"On **{u.host}**: wait until the head's rendezvous port {u.join[0]}:{u.join[1]} accepts TCP "
                      f"connections (the head listens there once it started), then start the worker "
                      f"({u.node.role} rank {u.rank}).")
                doc.block(u.host, _wait_tcp(u.join[0], u.join[1], r.vars.k3_rendezvous_timeout) + _start(u), when)
            else:
                doc.p(f"Start {u.node.role} rank {u.rank} on **{u.host}**.")
                doc.block(u.host, _start(u), when)
        serving = [u for u in units if u.serves]
        if serving:
            what = "/health" if g == "router" else "/health, then /v1/models"
            doc.p(f"Wait until every serving node of group {g} answers {what} (a multi-node head answers only after "
                  f"all its workers joined; deadline {timeout}s). On failure the block prints the unit journal and "
                  f"the container log.")
            for u in serving:
                doc.block(u.host, _wait_http(u, timeout, g != "router", docker), when)


def _notes(guide: str | None) -> list[str]:
    """The bullets of the recipe guide's Notes section."""
    if not guide:
        return []
    m = re.search(r"^##\s*Notes\s*$(.*?)(?=^##\s|\Z)", guide, re.M | re.S)
    if not m:
        return []
    return [b.strip() for b in re.findall(r"^\s*-\s+(.*)$", m.group(1), re.M)]


def _note(notes: list[str], *words: str) -> str:
    for n in notes:
        if all(w.lower() in n.lower() for w in words):
            return n
    return ""


def build(r: Rollout, *, inventory: str, preflight: list[Any], addresses: dict[str, str],
          ssh: dict[str, list[str]], brand: str, guide: str | None, version: str) -> Doc:
    """The runbook of one rollout. ``ssh``: per host the ``ssh ... user@host`` argv the control machine uses."""
    v = r.vars
    plan = r.plan
    cfg = v.k3_config_dir.rstrip("/")
    prev = f"{cfg}/previous"
    hosts = list(dict.fromkeys(u.host for u in r.units))
    doc = Doc()
    doc.h(1, f"Bring-up runbook: {plan.model} on {len(hosts)} x {plan.hardware} ({plan.strategy})")
    doc.p(f"Generated by k3deploy {version} from `{inventory}`: recipe {plan.recipe}, variant {plan.variant}, "
          f"features {', '.join(plan.features) or '(none)'}, image `{plan.image}`. Public endpoint: {r.endpoint}. "
          f"`pyinfra {inventory} deploy/k3.py` performs exactly these steps; `k3deploy plan {inventory}` shows what "
          f"differs from them on a running cluster.")
    doc.table(["host", "ssh address", "role", "rank", "unit", "serves"],
              [[u.host, addresses.get(u.host, u.host), u.node.role, str(u.rank), u.unit, u.serves or "-"]
               for u in r.units])
    doc.h(2, "How to use this runbook")
    doc.p("Run every command block as root on the node named in its header (`sh node=NAME`), in document order, "
          "each as one script (`bash -e`: it stops at the first failing command, and the waits exit 1 with the "
          "reason and the logs). Blocks marked `node=control` run on the machine that holds the inventory and the "
          "token file. Blocks marked `when=rollback` or `when=troubleshooting` are only for those situations.")

    # ---- 1. prerequisites
    doc.h(2, "1. Prerequisites")
    doc.p("Each node must pass these checks (the same checks `k3deploy preflight` runs). The table shows the "
          "expected value and what the node reported when this runbook was generated.")
    by_host: dict[str, list[Any]] = {}
    for row in preflight:
        by_host.setdefault(row.host, []).append(row)
    for h in hosts:
        rows = by_host.get(h, [])
        doc.h(3, f"{h} ({addresses.get(h, h)})")
        address = next((u.node.address for u in r.on_host(h)), "")
        cache = v.k3_model_cache
        doc.table(["check", "command", "expected", "observed", "status", "fix"],
                  [[x.check, f"`{check_command(x.check, brand, address, cache)}`", x.required, x.observed,
                    x.status, x.fix or "-"] for x in rows])
        cmds = list(dict.fromkeys(c for c in (check_command(x.check, brand, address, cache) for x in rows) if c))
        if cmds:
            doc.block(h, "\n".join(cmds) + "\n")
    cluster = by_host.get("cluster", [])
    if cluster:
        doc.h(3, "Cluster")
        doc.table(["check", "expected", "observed", "status", "fix"],
                  [[x.check, x.required, x.observed, x.status, x.fix or "-"] for x in cluster])

    # ---- 2. per node: stage and configure
    doc.h(2, "2. Stage and configure each node")
    doc.p("Pull the image, stage the weights once, and write the env file (0600) and the systemd unit. A file "
          f"that changes is first copied to `{prev}` (used by the rollback). Nothing is started yet.")
    first_host = r.units[0].host
    token_dest = f"{cfg}/hf-token" if v.k3_hf_token_file else None
    for h in hosts:
        mine = r.on_host(h)
        engines = [u for u in mine if u.group != "router"]
        doc.h(3, h)
        if token_dest and engines:
            doc.p(f"Copy the Hugging Face token from `{v.k3_hf_token_file}` on the control machine to {token_dest} "
                  "(0600); the value is never typed or shown.")
            remote = f"install -d -m 0755 {shlex.quote(cfg)} && install -m 0600 /dev/stdin {shlex.quote(token_dest)}"
            doc.block(CONTROL, f"{shlex.join(ssh.get(h, ['ssh', h]))} {shlex.quote(remote)} < "
                               f"{shlex.quote(v.k3_hf_token_file)}\n")
        if engines:
            pull = pull_script(v.k3_docker, plan.image)
            doc.p(f"Pull the image `{plan.image}`" + (" and verify its digest." if "@sha256:" in plan.image else "."))
            doc.block(h, pull)
            if not v.k3_weights_shared or h == first_host:
                snap = snapshot_dir(v.k3_model_cache, plan.model)
                args = download_argv(v.k3_docker, v.k3_model_cache, plan.image, plan.model, token_dest)
                doc.p(f"Stage the weights of {plan.model} in {v.k3_model_cache} (skipped when a snapshot is already "
                      "there)" + ("; the cache is shared, so only this node downloads." if v.k3_weights_shared else "."))
                doc.block(h, f"mkdir -p {shlex.quote(v.k3_model_cache)}\n"
                             f"if [ -n \"$(ls -A {shlex.quote(snap)} 2>/dev/null)\" ]; then echo 'weights present'; "
                             f"else {shlex.join(args)}; fi\n")
            else:
                doc.p(f"Weights: the shared cache {v.k3_model_cache} is filled from {first_host}.")
        for u in mine:
            doc.p(f"{u.unit}: the env file `{u.env_path}` and the unit `{u.unit_path}` "
                  f"({u.node.role} rank {u.rank}).")
            doc.block(h, _heredoc(u.env_path, u.env_text, "0600", prev) + _heredoc(u.unit_path, u.unit_text, "0644", prev)
                      + "systemctl daemon-reload\n")
            argv = exec_start(u.unit_text) or []
            if argv:
                doc.p("The unit runs this container command (shown for reading; the unit file is what counts):")
                doc.items.append(("code", shlex.join(argv)))

    # ---- 3. start order
    doc.h(2, "3. Start, in this order")
    doc.p("A multi-node head cannot become healthy before its workers joined, so each group starts as: head, "
          "wait for the head's rendezvous port, all workers, then wait for readiness. "
          + ("P/D pools start before the router, which starts once both pools serve. " if "router" in r.groups else "")
          + "Order: " + " -> ".join(f"{u.host}:{u.unit}" for g in start_groups(r) for u in r.group(g)) + ".")
    _start_sequence(doc, r, None)

    # ---- 4. smoke test
    doc.h(2, "4. Smoke test")
    body = json.dumps({"model": plan.model, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "Say hello in one word."}]})
    url = r.endpoint.rstrip("/") + "/v1/chat/completions"
    doc.p(f"One short chat completion through the public endpoint {r.endpoint}.")
    doc.block(first_host, f"curl -sf -m 120 -H 'Content-Type: application/json' -d {shlex.quote(body)} "
                          f"{shlex.quote(url)} | python3 -c 'import json,sys; "
                          f"print(json.load(sys.stdin)[\"choices\"][0][\"message\"][\"content\"])'\n")

    # ---- 5. rollback
    doc.h(2, "5. Rollback")
    doc.p(f"Restore the previous unit and env files from `{prev}` (kept when a file changed), stop the groups "
          "(routers, workers, heads) and start them again in the order of section 3 "
          f"(`pyinfra {inventory} deploy/k3.py -y --data k3_rollback=true` does the same).")
    for h in hosts:
        lines = []
        for u in r.on_host(h):
            for path in (u.env_path, u.unit_path):
                name = path.rsplit("/", 1)[-1]
                lines.append(f"[ -f {shlex.quote(prev + '/' + name)} ] && cp -p {shlex.quote(prev + '/' + name)} "
                             f"{shlex.quote(path)}")
        doc.block(h, "\n".join(lines) + "\nsystemctl daemon-reload\n", "rollback")
    stop_order = ([u for u in r.units if u.group == "router"] + sorted(
        [u for u in r.units if u.group != "router" and not u.is_group_head], key=lambda u: -u.rank)
                  + [u for u in r.units if u.group != "router" and u.is_group_head])
    for u in stop_order:
        doc.block(u.host, f"systemctl stop {shlex.quote(u.unit)}\n", "rollback")
    _start_sequence(doc, r, "rollback")

    # ---- 6. troubleshooting
    doc.h(2, "6. Troubleshooting")
    notes = _notes(guide)
    heads = [u for u in r.units if u.is_group_head]
    head = heads[0] if heads else r.units[0]
    doc.p("Logs of a unit and its container:")
    doc.block(head.host, f"journalctl -u {shlex.quote(head.unit)} -n 100 --no-pager\n"
                         f"{shlex.quote(v.k3_docker)} logs --tail 100 {shlex.quote(head.container)}\n",
              "troubleshooting")
    multi = len({u.host for u in r.units if u.group != "router"}) > 1
    if brand == "NVIDIA" and multi:
        text = _note(notes, "dmabuf") or ("mlx5 dmabuf registration failures (errno 524): set NCCL_DMABUF_ENABLE=0 "
                                          "to fall back to nvidia_peermem.")
        doc.h(3, "NCCL error at engine start: `mlx5dv_reg_dmabuf_mr` errno 524")
        doc.p(text)
        doc.p("Check the log for the errno and that nvidia_peermem is loaded; then add `NCCL_DMABUF_ENABLE=0` to the "
              "env file on every node of the group and restart the group in the order of section 3.")
        for u in [x for x in r.units if x.group != "router"]:
            doc.block(u.host, f"journalctl -u {shlex.quote(u.unit)} --no-pager | grep -m3 -E "
                              f"'mlx5dv_reg_dmabuf_mr|errno 524' || true\n"
                              f"modprobe nvidia_peermem && lsmod | grep -E '^nvidia_peermem'\n"
                              f"grep -q '^NCCL_DMABUF_ENABLE=' {shlex.quote(u.env_path)} || "
                              f"echo 'NCCL_DMABUF_ENABLE=0' >> {shlex.quote(u.env_path)}\n", "troubleshooting")
    from k3deploy.recipe.taxonomy import hardware

    if brand == "NVIDIA" and multi and getattr(hardware().get(plan.hardware), "nvl", False):
        doc.h(3, "Multi-node NVLink (GB200/GB300)")
        doc.p(_note(notes, "MNNVL") or "MNNVL: NCCL_MNNVL_ENABLE=1, NCCL_CUMEM_ENABLE=1, NCCL_NVLS_ENABLE=1.")
        doc.p("The env files already carry these variables when the plan uses NVLink across trays; check them and "
              "the IMEX channel on each node:")
        for u in [x for x in r.units if x.group != "router"]:
            doc.block(u.host, f"grep -E '^NCCL_(MNNVL|CUMEM|NVLS)_ENABLE=' {shlex.quote(u.env_path)}\n"
                              "systemctl is-active nvidia-imex; ls /dev/nvidia-caps-imex-channels\n",
                      "troubleshooting")
    if multi or plan.strategy == "pd_cluster":
        doc.h(3, "RDMA and KV-cache transfer")
        doc.p(_note(notes, "RDMA", "UCX_TLS") or 'RDMA: set UCX_TLS="rc,cuda_copy".')
        for u in [x for x in r.units if x.group != "router"][:1]:
            doc.block(u.host, f"grep -E '^(UCX_TLS|NCCL_IB_HCA|NCCL_SOCKET_IFNAME)=' {shlex.quote(u.env_path)} || true\n"
                              "ibv_devinfo | grep -E 'hca_id|state'\n", "troubleshooting")
    for words, title in ((("Rust Frontend",), "Frontend compatibility"), (("Tool calling",), "Tool calls"),
                         (("AMD",), "AMD MoE path")):
        if words == ("AMD",) and brand != "AMD":
            continue
        text = _note(notes, *words)
        if text:
            doc.h(3, title)
            doc.p(text)
    return doc


# ---------------------------------------------------------------------------------- render


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: Doc) -> str:
    out: list[str] = []
    for item in doc.items:
        kind = item[0]
        if kind == "h":
            out.append("#" * item[1] + " " + item[2])
        elif kind == "p":
            out.append(item[1])
        elif kind == "block":
            b: Block = item[1]
            info = f"sh node={b.node}" + (f" when={b.when}" if b.when else "")
            out.append(f"```{info}\n{b.text}\n```")
        elif kind == "code":
            out.append(f"```text\n{item[1]}\n```")
        elif kind == "table":
            header, rows = item[1], item[2]
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def _inline(text: str) -> str:
    s = html.escape(text)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)


def to_html(doc: Doc) -> str:
    title = next((i[2] for i in doc.items if i[0] == "h"), "Runbook")
    out = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">", f"<title>{html.escape(title)}</title>",
           "<style>body{font-family:sans-serif;max-width:70em;margin:auto}pre{background:#f4f4f4;padding:.6em;"
           "overflow-x:auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .4em;"
           "vertical-align:top}.node{font-size:.8em;color:#555}</style>", "</head><body>"]
    for item in doc.items:
        kind = item[0]
        if kind == "h":
            out.append(f"<h{item[1]}>{html.escape(item[2])}</h{item[1]}>")
        elif kind == "p":
            out.append(f"<p>{_inline(item[1])}</p>")
        elif kind == "block":
            b = item[1]
            when = f' data-when="{html.escape(b.when)}"' if b.when else ""
            label = f"on {b.node}" + (f" ({b.when})" if b.when else "")
            out.append(f"<div class=\"node\">{html.escape(label)}</div><pre><code class=\"language-sh\" "
                       f"data-node=\"{html.escape(b.node)}\"{when}>{html.escape(b.text)}</code></pre>")
        elif kind == "code":
            out.append(f"<pre><code>{html.escape(item[1])}</code></pre>")
        elif kind == "table":
            rows = "".join("<tr>" + "".join(f"<td>{_inline(str(c))}</td>" for c in row) + "</tr>" for row in item[2])
            head = "".join(f"<th>{html.escape(h)}</th>" for h in item[1])
            out.append(f"<table><tr>{head}</tr>{rows}</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


BLOCK = re.compile(r"^```sh node=(?P<node>\S+)(?: when=(?P<when>\S+))?\n(?P<text>.*?)^```$", re.M | re.S)


def blocks(markdown: str) -> list[Block]:
    """The command blocks of a Markdown runbook, in document order."""
    return [Block(m["node"], m["text"], m["when"]) for m in BLOCK.finditer(markdown)]
