#!/usr/bin/python3
"""The real ``vllm bench serve`` in a simulated container: ``vllmsim_bench.py SCRIPT [ARGS...]``.

``k3deploy bench`` runs vLLM's own benchmark client from the engines' image (``docker run --entrypoint python3 IMAGE
-c SCRIPT ARGS``, the script importing ``vllm.benchmarks.serve``). A simulated image holds no vLLM, so the simulated
docker (``dockersim.py``) runs the script here, with the real vLLM 0.33.0 of the engine venv (``tools/engine-venv.sh``)
that every node sees read-only at ``/opt/k3sim/vllm-engine`` (``k3sim.processes.ENGINE_VENV_NODE_DIR``) on the
node's own python3 (Debian 12: CPython 3.11, the venv's): the client is real, only the engines it measures are
simulated. As a container would, it sees the Hugging Face cache where the container mounts it (its bind mounts,
``K3SIM_VOLUMES``), so the tokenizer comes from the staged snapshot (the simulated checkpoint's word-level
``tokenizer.json``, ``k3sim.outside.tokenizer_json``).

Without the engine venv on the node it says so in one line and exits 127, as a container whose image lacks the
program does.
"""
import glob
import os
import site
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: the engine venv as the node sees it (``K3SIM_ENGINE_VENV`` where the tools run on the host itself, as in tests)
VENV = os.environ.get("K3SIM_ENGINE_VENV") or "/opt/k3sim/vllm-engine"
#: where the container looks for the Hugging Face cache (vLLM's images: HF_HOME unset, the root user)
HUB = "/root/.cache/huggingface/hub"


def main(argv: list) -> int:
    if not argv:
        sys.stderr.write("usage: vllmsim_bench.py SCRIPT [ARGS...]\n")
        return 2
    sites = sorted(glob.glob(os.path.join(VENV, "lib", "python3*", "site-packages")))
    if not sites:
        sys.stderr.write(f"vllm bench serve: the real vLLM client is not on this simulated node ({VENV} is empty): "
                         "build the engine venv with tools/engine-venv.sh, then bring the cluster up again\n")
        return 127
    site.addsitedir(sites[-1])
    from vllmsim import _host_path

    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(os.environ.get("HF_HOME") or os.path.dirname(HUB), "hub")
    os.environ["HF_HUB_CACHE"] = _host_path(hub)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.argv = ["-c", *argv[1:]]
    exec(compile(argv[0], "<string>", "exec"), {"__name__": "__main__"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
