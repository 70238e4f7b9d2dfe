"""Self-healing groups, without the control machine: what the engine units carry (the crash-loop backoff, the
watcher of a member's head) and the node-side helper ``k3-group-member`` run for real (bash, a real HTTP server for
the head's /health; ``systemctl`` is a recording stand-in: the real one acts on the simulated cluster's e2e tests)."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers import present
from k3deploy import resolve
from k3deploy.model.binding import HostRecord
from k3deploy.model.hosttext import exec_start
from k3deploy.model.rollout import plan_rollout
from k3deploy.model.units import GROUP_MEMBER, GROUP_MEMBER_SOURCE
from k3deploy.model.variables import Variables
from k3deploy.recipe.fixes import deployable

HELPER = str(GROUP_MEMBER_SOURCE)


def _rollout(recipe, strategy: str, nodes: int, **variables):
    plan = deployable(resolve(recipe, hardware="gb300", strategy=strategy, nodes=nodes))
    hosts = [HostRecord("n0", ("head",), {"k3_ip": "10.77.0.11"})]
    hosts += [HostRecord(f"n{i}", ("workers",), {"k3_ip": f"10.77.0.{11 + i}"}) for i in range(1, nodes)]
    return plan_rollout(plan, hosts, Variables(k3_hardware="gb300", **variables), ifaces={h.name: "eth0" for h in hosts})


def _lines(text: str, key: str) -> list[str]:
    return [ln[len(key) + 1:] for ln in text.splitlines() if ln.startswith(key + "=")]


@pytest.mark.parametrize("strategy", ["multi_node_tp", "multi_node_dep"])
def test_every_member_but_the_head_watches_the_head_and_every_engine_backs_off(recipe, strategy):
    r = _rollout(recipe, strategy, 4)
    engines = [u for u in r.units if u.group == "engine"]
    head = next(u for u in engines if u.rank == 0)
    head_http = head.serves.removeprefix("http://")
    for u in engines:
        post = _lines(u.unit_text, "ExecStartPost")
        if u.rank == 0:
            assert post == []
        else:
            assert len(post) == 1 and post[0].startswith('-"/usr/bin/systemd-run"')
            assert f'"--property=BindsTo={u.unit}" ' in post[0]
            assert f'"{GROUP_MEMBER}" "watch" "{u.unit}" "{head_http}" "30" "5"' in post[0]
            # a member that serves its own API (hybrid DP) is watched from when it serves; a headless one is not
            own = u.serves.removeprefix("http://") if u.serves else None
            assert post[0].endswith(f'"30" "5" "{own}"' if own else '"30" "5"'), post[0]
            assert (own is not None) == (strategy == "multi_node_dep")
        assert f'"{GROUP_MEMBER}" "backoff" "{u.unit}" "10" "300"' in _lines(u.unit_text, "ExecStartPre")[0]
        assert _lines(u.unit_text, "ExecStopPost") == [f'-"{GROUP_MEMBER}" "stopped" "{u.unit}"']
        assert present(exec_start(u.unit_text))[:2] == ["/usr/bin/docker", "run"]   # the engine runs as before
    routers = [u for u in r.units if u.group == "router"]
    assert all("k3-group-member" not in u.unit_text for u in routers)


def test_the_knobs_turn_watching_and_backoff_off(recipe):
    plain = _rollout(recipe, "multi_node_tp", 2, k3_heal=False, k3_restart_max_delay=0, k3_restart_sec=3)
    for u in plain.units:
        # (the helper's one use left: the fence's start check, which the knobs do not turn off)
        assert [ln for ln in u.unit_text.splitlines() if "k3-group-member" in ln] == [
            "ExecCondition=" + x for x in _lines(u.unit_text, "ExecCondition")]
        assert "RestartSec=3" in u.unit_text.splitlines()
    tuned = _rollout(recipe, "multi_node_tp", 2, k3_heal_grace=7, k3_heal_interval=2)
    worker = next(u for u in tuned.units if u.rank == 1)
    assert '"watch" "k3-engine.service" "10.77.0.11:8000" "7" "2"' in _lines(worker.unit_text, "ExecStartPost")[0]


def test_a_single_node_has_no_watcher(recipe):
    plan = deployable(resolve(recipe, hardware="b300", strategy="single_node_tp"))
    r = plan_rollout(plan, [HostRecord("n0", ("head",), {"k3_ip": "10.77.0.11"})], Variables(k3_hardware="b300"),
                ifaces={"n0": "eth0"})
    assert _lines(r.units[0].unit_text, "ExecStartPost") == []
    assert "backoff" in r.units[0].unit_text


# ------------------------------------------------------------------ the helper, run for real


class _Head(http.server.BaseHTTPRequestHandler):
    code = 503

    def do_GET(self):  # noqa: N802 (the base class names it so)
        self.send_response(type(self).code if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def _server(code: int):
    """A real HTTP server on a free port whose /health answers ``handler.code`` (changed by the test)."""
    handler = type("Health", (_Head,), {"code": code})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, handler


@pytest.fixture
def head():
    srv, handler = _server(503)
    yield srv, handler
    srv.shutdown()


@pytest.fixture
def systemctl(tmp_path):
    """A ``systemctl`` that records its arguments, first on PATH for the helper."""
    log = tmp_path / "systemctl.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_dir / "systemctl").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def test_a_member_is_restarted_only_after_its_head_served_and_then_stopped_for_the_grace(head, systemctl):
    srv, handler = head
    env, log = systemctl
    target = f"127.0.0.1:{srv.server_address[1]}"
    w = subprocess.Popen([HELPER, "watch", "k3-engine.service", target, "2", "1"], env=env, stdout=subprocess.PIPE,
                         text=True)
    try:
        time.sleep(3.5)                  # the group is forming: the head does not serve yet, nobody restarts
        assert not log.exists() and w.poll() is None
        handler.code = 200               # the group serves
        time.sleep(2.5)
        assert not log.exists()
        handler.code = 503               # the head restarted: it waits for its members
        assert w.wait(timeout=10) == 0
    finally:
        w.kill()
    assert log.read_text().split() == ["kill", "--kill-whom=main", "--signal=SIGKILL", "k3-engine.service"]
    assert "lost its group" in (w.stdout.read() if w.stdout else "")


def test_a_member_that_serves_while_its_head_never_did_is_restarted_after_the_grace(head, systemctl):
    """The head died before it served once and its next start waits for this member, which serves (hybrid DP) but
    is attached to nothing: the member serving means its group formed, so the head's silence counts from then."""
    srv, _handler = head                         # the head never serves (503, then nothing)
    own, own_handler = _server(503)              # the member is still loading
    env, log = systemctl
    w = subprocess.Popen([HELPER, "watch", "k3-engine.service", f"127.0.0.1:{srv.server_address[1]}", "2", "1",
                          f"127.0.0.1:{own.server_address[1]}"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(3.5)                          # both forming: nobody restarts
        assert not log.exists() and w.poll() is None
        own_handler.code = 200                   # the member serves: its group formed
        assert w.wait(timeout=10) == 0
    finally:
        w.kill()
        own.shutdown()
    assert log.read_text().split() == ["kill", "--kill-whom=main", "--signal=SIGKILL", "k3-engine.service"]
    out = w.stdout.read() if w.stdout else ""
    assert "its group formed" in out and "lost its group" in out


def test_a_short_blip_of_the_head_is_not_a_lost_group(head, systemctl):
    srv, handler = head
    env, log = systemctl
    handler.code = 200
    w = subprocess.Popen([HELPER, "watch", "k3-engine.service", f"127.0.0.1:{srv.server_address[1]}", "4", "1"],
                         env=env, stdout=subprocess.DEVNULL)
    try:
        time.sleep(2.5)
        handler.code = 503
        time.sleep(2)                    # shorter than the grace
        handler.code = 200
        time.sleep(4)
        assert not log.exists() and w.poll() is None
    finally:
        w.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="the helper notes failures in /run/k3deploy (root)")
def test_the_backoff_grows_with_failures_in_a_row_and_a_clean_stop_forgets_them():
    unit = f"k3-test-{os.getpid()}.service"
    notes = Path("/run/k3deploy") / f"{unit}.failures"

    def stopped(result: str) -> None:
        subprocess.run([HELPER, "stopped", unit], env={**os.environ, "SERVICE_RESULT": result}, check=True)

    def backoff() -> tuple[float, str]:
        t0 = time.monotonic()
        out = subprocess.run([HELPER, "backoff", unit, "1", "3"], capture_output=True, text=True, check=True).stdout
        return time.monotonic() - t0, out

    try:
        stopped("exit-code")
        took, out = backoff()                      # one failure: RestartSec only
        assert took < 0.5 and out == ""
        stopped("signal")
        took, out = backoff()
        assert 0.9 < took < 1.9 and "failed 2 times in a row" in out and "waiting 1 s" in out
        stopped("exit-code")
        took, out = backoff()
        assert 1.9 < took < 2.9 and "waiting 2 s" in out
        stopped("exit-code")
        stopped("exit-code")
        took, out = backoff()
        assert "waiting 3 s" in out              # at most the maximum
        stopped("success")                         # an explicit stop or restart
        assert not notes.exists()
        assert backoff()[0] < 0.5
    finally:
        notes.unlink(missing_ok=True)


def test_bad_arguments_are_refused():
    bad = subprocess.run([HELPER, "watch", "k3-engine.service"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage:" in bad.stderr
    extra = subprocess.run([HELPER, "watch", "u", "h:1", "1", "1", "o:2", "more"], capture_output=True, text=True)
    assert extra.returncode == 2 and "[OWN_HOST:PORT]" in extra.stderr
