"""The logs a failed start shows: a unit stopped while its engine had just exited, or before ``docker run`` had
created its container (a crash loop stopped by the rollout), has an ``ExecStop`` (``docker stop``) that found no
container; the journal's line says so instead of docker's "No such container", which would read as a second fault.
The journal and docker are stand-ins on ``PATH`` that print what a real node printed in that race."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from k3deploy.model.commands import logs

JOURNAL = """\
Dec 06 16:43:18 n2 systemd[1]: Stopping k3-engine.service - k3deploy worker rank 1...
Dec 06 16:43:18 n2 docker[654]: Error response from daemon: No such container: {name}
Dec 06 16:43:18 n2 systemd[1]: k3-engine.service: Control process exited, code=exited, status=1/FAILURE
"""


def _shown(tmp_path: Path, journal: str, container: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\ncat <<'EOF'\n{journal}EOF\n")
    docker = bin_dir / "docker"
    docker.write_text('#!/bin/sh\necho "Error response from daemon: No such container: $4" >&2; exit 1\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return subprocess.run(["sh", "-c", logs("k3-engine.service", container, str(docker), 25)], capture_output=True,
                          text=True, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, check=True).stdout


def test_a_stop_that_found_no_container_is_explained_not_reported_as_a_fault(tmp_path):
    out = _shown(tmp_path, JOURNAL.format(name="k3-engine"), "k3-engine")
    assert "No such container" not in out, out
    assert ("docker[654]: (docker stop found no container k3-engine: stopped while its engine had exited or before "
            "its container was created; not a fault)") in out, out
    assert "Stopping k3-engine.service" in out and "status=1/FAILURE" in out      # the other lines as they are


def test_only_the_units_own_container_is_explained(tmp_path):
    out = _shown(tmp_path, JOURNAL.format(name="k3-other") + JOURNAL.format(name="k3xengine"), "k3.engine")
    assert out.count("No such container: k3-other") == 1 and out.count("No such container: k3xengine") == 1, out
