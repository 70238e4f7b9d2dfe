"""Offline unit-file verification with the real ``systemd-analyze verify`` (no running systemd needed).

A throw-away fake root holds the host's stock units, the unit under test and stub executables (each with a
same-named stub service), and ``--recursive-errors=one`` makes syntax warnings fail the check.

Example::

    >>> rc, output = verify_unit(text, "k3-engine.service", stubs=["/usr/bin/docker"])   # doctest: +SKIP
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from k3deploy.errors import K3Error


def verify_unit(text: str, name: str, stubs: list[str] | tuple[str, ...] = ("/usr/bin/docker",)) -> tuple[int, str]:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        raise K3Error("systemd-analyze not found: install the systemd package to verify unit files")
    with tempfile.TemporaryDirectory(prefix="k3-unit-verify.") as tmp:
        root = Path(tmp)
        for d in ("usr/bin", "usr/sbin", "etc/systemd/system", "usr/lib/systemd"):
            (root / d).mkdir(parents=True, exist_ok=True)
        for link in ("bin", "sbin", "lib"):
            (root / link).symlink_to(f"usr/{link}")
        shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
        for stub in stubs:
            target = root / stub.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("#!/bin/sh\nexit 0\n")
            target.chmod(0o755)
            svc = root / "usr/lib/systemd/system" / f"{Path(stub).name}.service"
            if not svc.exists():
                svc.write_text(f"[Service]\nExecStart={stub}\n")
        (root / "etc/systemd/system" / name).write_text(text)
        proc = subprocess.run([tool, "verify", f"--root={root}", "--man=no", "--generators=no",
                               "--recursive-errors=one", name], capture_output=True, text=True)
        return proc.returncode, (proc.stdout + proc.stderr).strip()
