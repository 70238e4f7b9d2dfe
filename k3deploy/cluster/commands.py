"""Shell commands shared by the rollout's operations and the runbook, so the two cannot drift.

Example::

    >>> download_argv("docker", "/var/lib/k3deploy/cache", "vllm/vllm-openai:kimi-k3", "moonshotai/Kimi-K3")[-3:]
    ['vllm/vllm-openai:kimi-k3', 'download', 'moonshotai/Kimi-K3']
"""

from __future__ import annotations

import shlex


def snapshot_dir(cache: str, model: str) -> str:
    """Where the Hugging Face cache under ``cache`` keeps ``model``'s snapshots."""
    return f"{cache.rstrip('/')}/huggingface/hub/models--{model.replace('/', '--')}/snapshots"


def download_argv(docker: str, cache: str, image: str, model: str, token_file: str | None = None) -> list[str]:
    """Download the weights with the image's own Hugging Face CLI into ``cache`` (mounted as ``~/.cache``).

    The token, if any, is read by the CLI from a 0600 file (``HF_TOKEN_PATH``): it never appears in argv.
    """
    args = [docker, "run", "--rm", "--network", "host", "-v", f"{cache}:/root/.cache"]
    if token_file:
        args += ["-v", f"{token_file}:/run/secrets/hf-token:ro", "-e", "HF_TOKEN_PATH=/run/secrets/hf-token"]
    return args + ["--entrypoint", "hf", image, "download", model]


def digest_check(docker: str, image: str) -> str:
    """Shell that fails unless the local ``image`` carries the digest it pins (empty when it pins none)."""
    if "@sha256:" not in image:
        return ""
    want = image.split("@", 1)[1]
    return (f"got=$({shlex.quote(docker)} image inspect --format '{{{{index .RepoDigests 0}}}}' {shlex.quote(image)}) "
            f"&& case \"$got\" in *{want}) echo \"digest ok: $got\";; *) echo \"image digest $got, required {want}\" >&2;"
            f" exit 1;; esac")


def pull_script(docker: str, image: str) -> str:
    """Pull ``image`` when it is not present locally, then verify a pinned digest."""
    d, i = shlex.quote(docker), shlex.quote(image)
    script = f"{d} image inspect {i} >/dev/null 2>&1 || {d} pull -q {i}"
    check = digest_check(docker, image)
    return f"{script}\n{check}\n" if check else script + "\n"
