"""The real vllm-router for the simulated nodes: installed once on the host, mounted read-only into every node.

The router k3deploy starts on a router host (``/usr/local/bin/vllm-router``, ``k3_router_bin``) is the real
``vllm-router`` 0.1.17 from PyPI (a Python launcher and its Rust core, ``vllm_router_rs.abi3.so``), not a stand-in.
It and its dependencies (``orjson`` included, which the launcher imports without declaring it everywhere) are
installed with ``pip install --target`` into :func:`router_dir` on the host, as wheels for the nodes' Python
(Debian 12: CPython 3.11, glibc 2.36), by ``tools/sim-router.sh`` (which ``tools/setup.sh`` runs as root).
Every node gets that directory read-only at :data:`NODE_DIR`; the node's ``/usr/local/bin/vllm-router``
(``node_tools``) puts it on ``sys.path`` and runs ``vllm_router.launch_router.main``, as the wheel's console
script does.

``python -m k3sim.router`` installs it (idempotent); ``--check`` only checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from k3deploy.runtime.progress import tree_bytes, watch
from k3sim.base import cache_dir
from k3sim.host import SimError

VERSION = "0.1.17"
#: what is installed: the router and the module its launcher imports undeclared
REQUIREMENTS = (f"vllm-router=={VERSION}", "orjson")
#: the nodes' interpreter (the base root is Debian 12 bookworm) and the newest glibc its wheels may need
NODE_PYTHON = "3.11"
NODE_PLATFORMS = ("manylinux_2_28", "manylinux2014")
#: where a node sees the installation (read-only bind mount)
NODE_DIR = "/opt/k3sim/vllm-router"
STAMP = ".k3sim-router-stamp"
#: what the installation takes on disk (vllm-router 0.1.17 and its dependencies, x86_64), for its progress
ROUTER_BYTES = 106 * 2**20
INSTALL_HINT = "run 'sudo tools/sim-router.sh' (installs it from PyPI; tools/setup.sh does it as root)"


def router_dir() -> Path:
    """``K3SIM_ROUTER_DIR``, else ``<K3SIM_CACHE>/vllm-router-<version>``."""
    env = os.environ.get("K3SIM_ROUTER_DIR")
    return Path(env) if env else cache_dir() / f"vllm-router-{VERSION}"


def _stamp() -> str:
    return f"{' '.join(REQUIREMENTS)} python={NODE_PYTHON} platforms={','.join(NODE_PLATFORMS)}\n"


def installed(path: Path | None = None) -> bool:
    d = path or router_dir()
    try:
        stamp = (d / STAMP).read_text()
    except OSError:
        return False
    return stamp == _stamp() and (d / "vllm_router_rs.abi3.so").is_file() and (d / "vllm_router").is_dir()


def check() -> Path:
    """The installation's directory; one line naming the fix when it is missing."""
    d = router_dir()
    if not installed(d):
        raise SimError(f"vllm-router {VERSION} for the simulated nodes is not installed in {d}: {INSTALL_HINT}")
    return d


def install(python: str = sys.executable) -> Path:
    """Install the router for the nodes into :func:`router_dir` (nothing to do when it is there)."""
    d = router_dir()
    if installed(d):
        return d
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}-", dir=d.parent))
    try:
        arch = os.uname().machine
        cmd = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--target", str(tmp), "--only-binary=:all:", "--implementation", "cp",
               "--python-version", NODE_PYTHON]
        for plat in NODE_PLATFORMS:
            cmd += ["--platform", f"{plat}_{arch}"]
        # pip --quiet says nothing until it is done: the installed bytes against what an installation takes
        with watch(f"vllm-router {VERSION} (pip install)", lambda: tree_bytes(tmp), total=ROUTER_BYTES):
            res = subprocess.run([*cmd, *REQUIREMENTS], capture_output=True, text=True)
        if res.returncode != 0:
            raise SimError(f"installing {' '.join(REQUIREMENTS)} failed: {res.stderr.strip()[-2000:]}")
        (tmp / STAMP).write_text(_stamp())
        os.chmod(tmp, 0o755)
        if d.exists():
            shutil.rmtree(d)
        os.replace(tmp, d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return d


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["--check"]:
            print(check())
        else:
            print(install())
    except SimError as exc:
        print(f"k3deploy sim: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
