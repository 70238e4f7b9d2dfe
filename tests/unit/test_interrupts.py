"""An interrupted run's handler in a real process: SIGINT, SIGTERM and SIGHUP each end it with 128 + the signal's
number after its state lines and the lock's release; a second signal meanwhile changes nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from helpers import ROOT

PROGRAM = """
import sys, gevent, pyinfra
from gevent import monkey
monkey.patch_all()
pyinfra.is_cli = True
from k3deploy.runtime import interrupts
def release():
    gevent.sleep(0.3)      # the lock given back over the hosts' connections takes a moment
    print("RELEASED", flush=True)
assert interrupts.install(lambda: ["group engine: restarting"], release)
print("READY", flush=True)
while True:
    gevent.sleep(0.05)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_interruption_reports_releases_and_exits_non_zero(signum):
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    proc.send_signal(signum)
    time.sleep(0.1)
    proc.send_signal(signum)      # a second one while the first is handled is ignored
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum, out
    name = signal.Signals(signum).name
    assert f"the run was interrupted ({name})" in out and "group engine: restarting" in out
    assert out.index("group engine: restarting") < out.index("RELEASED") < out.index("lock was given back")
    assert f"exit code {128 + signum}" in out and "Traceback" not in out
