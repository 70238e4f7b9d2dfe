"""pyinfra operations of the rollout. Each describes desired state and does nothing (``host.noop``) when the
host already has it.

Example (in a deploy file)::

    from k3deploy.runtime.operations import managed_file, wait_tcp
    managed_file(name="env file", dest="/etc/k3deploy/k3-engine.env", content="A=1\\n", mode="600",
                 backup_dir="/etc/k3deploy/previous")
    wait_tcp(name="head rendezvous port", address="10.0.0.1", port=29501, timeout=300, active=True)
"""

from __future__ import annotations

import difflib
import hashlib
import re
import shlex
from io import BytesIO

from pyinfra import host, logger, state
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.facts.files import FileContents, Sha256File

from k3deploy.cluster.commands import download_argv, pull_script
from k3deploy.facts.rollout import ChatAnswer, ImageDigest, UnitState, WeightsPresent

#: env names whose values never appear in diffs or logs
SECRET = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|_KEY$)", re.I)


def mask_line(line: str) -> str:
    name, sep, value = line.partition("=")
    if sep and SECRET.search(name):
        return f"{name}=****"
    return line


def _sh(script: str) -> StringCommand:
    return StringCommand("sh", "-c", shlex.quote(script))


@operation()
def managed_file(dest: str, content: str, mode: str = "644", backup_dir: str | None = None, secret: bool = False):
    """Write ``content`` to ``dest`` with ``mode`` when it differs; keep the previous version in ``backup_dir``.

    With ``--diff`` the change is shown line by line, secret values masked (``secret=True`` shows nothing).
    """
    data = content.encode()
    want = hashlib.sha256(data).hexdigest()
    have = host.get_fact(Sha256File, path=dest)
    if have == want:
        host.noop(f"{dest} is up to date")
        return
    if state.config.DIFF:
        if secret:
            host.log(f"Will {'modify' if have else 'create'} {dest} (secret: contents not shown)", logger.info)
        else:
            old = host.get_fact(FileContents, path=dest) or [] if have else []
            host.log(f"Will {'modify' if have else 'create'} {dest}", logger.info)
            for line in difflib.unified_diff([mask_line(x) for x in old],
                                             [mask_line(x) for x in content.splitlines()], lineterm="", n=2):
                if not line.startswith(("---", "+++")):
                    logger.info("    %s", line)
    parent = dest.rsplit("/", 1)[0] or "/"
    prep = f"mkdir -p {shlex.quote(parent)}"
    if backup_dir and have:
        prep += (f" && mkdir -p {shlex.quote(backup_dir)} && chmod 700 {shlex.quote(backup_dir)}"
                 f" && cp -p {shlex.quote(dest)} {shlex.quote(backup_dir)}/")
    yield _sh(prep)
    tmp = host.get_temp_filename(dest)
    yield FileUploadCommand(BytesIO(data), tmp, remote_temp_filename=tmp)
    yield _sh(f"chmod {mode} {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(dest)}")


@operation()
def image(image: str, docker: str = "docker"):
    """The container image is present locally (pulled when missing); with a pinned digest, it is verified."""
    have = host.get_fact(ImageDigest, image=image, docker=docker)
    if have:
        if "@sha256:" in image and not have.endswith(image.split("@", 1)[1]):
            yield _sh(f"echo 'image {image} on this node has digest {have}; required {image.split('@', 1)[1]}' >&2; exit 1")
            return
        host.noop(f"image {image} present ({have.split('@')[-1][:19]}...)")
        return
    yield _sh(pull_script(docker, image).strip().replace("\n", " && "))


@operation()
def weights(model: str, cache: str, image: str, docker: str = "docker", token_file: str | None = None,
            download: bool = True, active: bool = True):
    """The model's weights are in the Hugging Face cache under ``cache`` (downloaded once when missing).

    The download runs the image's own Hugging Face tooling; the token, if any, is read by the tool from a 0600
    file (``HF_TOKEN_PATH``), so it never appears in argv or logs.
    """
    if not active:
        host.noop("weights are staged by another node (shared cache)")
        return
    if host.get_fact(WeightsPresent, cache=cache, model=model):
        host.noop(f"weights of {model} present in {cache}")
        return
    if not download:
        yield _sh(f"echo 'weights of {model} are not in {cache}/huggingface and k3_download_weights is false: "
                  f"stage them first' >&2; exit 1")
        return
    yield _sh(f"mkdir -p {shlex.quote(cache)} && " + shlex.join(download_argv(docker, cache, image, model, token_file)))


@operation(is_idempotent=False)
def stop_units(units: list[str], active: bool = True):
    """Stop these units (and so their containers); nothing when ``active`` is false or they are not running."""
    if not active:
        host.noop("not part of a group that restarts")
        return
    running = [u for u in units if host.get_fact(UnitState, unit=u).active not in ("inactive", "absent", "failed")]
    if not running:
        host.noop("already stopped")
        return
    yield _sh("systemctl stop " + " ".join(shlex.quote(u) for u in running))


@operation(is_idempotent=False)
def start_units(units: list[str], active: bool = True):
    """daemon-reload, reset failure counters, enable and start these units."""
    if not active or not units:
        host.noop("nothing to start here")
        return
    q = " ".join(shlex.quote(u) for u in units)
    yield _sh(f"systemctl daemon-reload && systemctl reset-failed {q} 2>/dev/null; systemctl enable --now {q}")


@operation(is_idempotent=False)
def wait_tcp(address: str, port: int, timeout: int = 300, interval: float = 1.0, active: bool = True):
    """Wait until ``address:port`` accepts a TCP connection, tried from this host (no payload is sent)."""
    if not active:
        host.noop("no rendezvous to wait for")
        return
    yield _sh(
        f"end=$(( $(date +%s) + {int(timeout)} )); "
        f"until timeout 2 bash -c '</dev/tcp/{address}/{int(port)}' 2>/dev/null; do "
        f"if [ $(date +%s) -ge $end ]; then echo 'rendezvous {address}:{int(port)} not open after {int(timeout)}s "
        f"(is the head engine running?)' >&2; exit 1; fi; sleep {interval}; done")


@operation(is_idempotent=False)
def smoke_test(endpoint: str, model: str, active: bool = True):
    """One short chat completion through the public endpoint, as the recipe guide's client sends it.

    A check, not a change: it reads the answer as a fact and reports "No change" when the model answers.
    """
    if not active:
        host.noop("smoke test runs on the first node")
        return
    answer = host.get_fact(ChatAnswer, endpoint=endpoint, model=model)
    if answer is not None and answer.ok:  # no output at all (nothing listening) reads as None
        host.noop(f"{endpoint} answered {answer.text!r}")
        logger.info(f"    [{host.name}] smoke test: {endpoint} answered {answer.text!r}")
        return
    got = answer.text[:200] if answer is not None else ""
    msg = f"smoke test: POST {endpoint}/v1/chat/completions answered {got!r}; required a chat completion"
    yield _sh(f"echo {shlex.quote(msg)} >&2; exit 1")
