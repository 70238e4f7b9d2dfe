"""Units, env files and container commands rendered from the plan; units checked by systemd-analyze."""

from __future__ import annotations

import shlex
import shutil

import pytest

from helpers import present
from k3deploy import resolve
from k3deploy.model.binding import HostRecord, bind
from k3deploy.model.rollout import plan_rollout
from k3deploy.model.unitcheck import verify_unit
from k3deploy.model.units import (
    GROUP_MEMBER,
    ContainerSpec,
    container_argv,
    engine_unit,
    env_file_text,
    exec_line,
    systemd_quote,
)
from k3deploy.model.variables import Variables
from k3deploy.recipe.fixes import deployable

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def _hosts(n, group_sizes=None):
    hosts = [HostRecord("n0", ("head",), {"k3_ip": "10.77.0.11"})]
    hosts += [HostRecord(f"n{i}", ("workers",), {"k3_ip": f"10.77.0.{11 + i}"}) for i in range(1, n)]
    return hosts


def _spec(plan, **kw):
    return ContainerSpec(name="k3-engine", image=plan.image, vendor=plan.vendor, env_file="/etc/k3deploy/engine.env",
                         cache_dir="/var/lib/k3deploy/cache", gpus_per_node=16 if plan.vendor == "npu" else 8, **kw)


def systemd_split(line: str) -> list[str]:
    """Undo systemd's Exec quoting as systemd documents it (for the tests' own round-trip check)."""
    out, i = [], 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        assert line[i] == '"'
        i += 1
        buf = []
        while line[i] != '"':
            c = line[i]
            if c == "\\":
                nxt = line[i + 1]
                buf.append({"n": "\n", "t": "\t"}.get(nxt, nxt))
                i += 2
                continue
            if c in "%$" and line[i + 1] == c:
                buf.append(c)
                i += 2
                continue
            buf.append(c)
            i += 1
        out.append("".join(buf))
        i += 1
    return out


NASTY = ["--x", "a b", "it's", 'say "hi"', "$HOME", "${X}", "100%", "%n", "back\\slash", "tab\there", "{\"k\": [1, 2]}"]


def test_systemd_quoting_round_trip():
    assert systemd_split(exec_line(NASTY)) == NASTY
    assert systemd_quote("%h") == '"%%h"' and systemd_quote("$X") == '"$$X"'


@pytest.mark.parametrize("hardware, strategy, variant", [
    ("gb300", "multi_node_tp", "default"), ("b300", "single_node_tp", "default"),
    ("mi355x", "single_node_tp", "default"), ("gb200", "multi_node_dep", "default"),
    ("ascend_910c", "multi_node_tp_dp", "ascend_w4a8"), ("b300", "pd_cluster", "default"),
])
@needs_analyze
def test_every_unit_the_rollout_installs_passes_systemd_analyze_verify(recipe, hardware, strategy, variant):
    plan = deployable(resolve(recipe, hardware=hardware, strategy=strategy, variant=variant))
    if plan.strategy == "pd_cluster":
        hosts = [HostRecord(f"n{i}", (n.role,), {"k3_ip": f"10.77.0.{11 + i}"})
                 for i, n in enumerate(x for x in plan.nodes if x.role != "router")]
        hosts[0] = HostRecord("n0", ("prefill", "router"), hosts[0].data)
    else:
        hosts = _hosts(len(plan.nodes))
    r = plan_rollout(plan, hosts, Variables(k3_hardware=hardware), ifaces={h.name: "eth0" for h in hosts})
    assert {u.group for u in r.units} >= ({"router"} if strategy in ("multi_node_dep", "pd_cluster") else set())
    for u in r.units:
        rc, out = verify_unit(u.unit_text, u.unit, stubs=["/usr/bin/docker", "/usr/local/bin/vllm-router", "/bin/true",
                                                          GROUP_MEMBER, "/usr/bin/systemd-run"])
        assert rc == 0, f"{u.host} {u.unit}: {out}"


@needs_analyze
def test_verify_catches_a_broken_unit(recipe):
    plan = resolve(recipe, hardware="b300")
    bound = bind(plan, _hosts(1))
    text = engine_unit(present(bound["n0"].engine), _spec(plan), model=plan.model, strategy=plan.strategy, hardware=plan.hardware,
                      ready_timeout=3600)
    rc, out = verify_unit(text.replace("Restart=on-failure", "Restart=sometimes"), "k3-engine.service")
    assert rc == 1 and "sometimes" in out


def test_container_argv_carries_the_plan_argv_exactly(recipe):
    plan = resolve(recipe, hardware="b300", extra_args=["--served-model-name", "k3 $prod 100%", "--chat-template",
                                                          "{% if x %}'\\n'{% endif %}"])
    node = present(bind(plan, _hosts(1))["n0"].engine)
    argv = container_argv(_spec(plan), node.argv)
    image_at = argv.index(plan.image)
    assert argv[image_at + 1:] == node.argv[2:]
    unit_line = engine_unit(node, _spec(plan), model=plan.model, strategy=plan.strategy, hardware=plan.hardware,
                      ready_timeout=60)
    exec_start = next(line for line in unit_line.splitlines() if line.startswith("ExecStart="))
    assert systemd_split(exec_start[len("ExecStart="):]) == argv


def test_ascend_runs_under_a_login_shell_with_both_quoting_layers(recipe):
    plan = resolve(recipe, hardware="ascend_910c", variant="ascend_w4a8", extra_args=["--served-model-name", "k3 'x' $y"])
    node = present(bind(plan, _hosts(4))["n1"].engine)
    argv = container_argv(_spec(plan), node.argv)
    assert argv[argv.index("--entrypoint") + 1] == "bash" and "/dev/davinci15" in argv and "/dev/davinci16" not in argv
    script = argv[-1]
    assert script.startswith("source /usr/local/Ascend/ascend-toolkit/set_env.sh; ")
    # what bash -lc runs: the plan argv, unchanged
    assert shlex.split(script.split("; exec ", 1)[1]) == node.argv


def test_amd_container_flags(recipe):
    plan = resolve(recipe, hardware="mi355x")
    argv = container_argv(_spec(plan), plan.nodes[0].argv)
    for flag in ("/dev/kfd", "/dev/dri", "video", "seccomp=unconfined"):
        assert flag in argv
    assert "--gpus" not in argv


def test_env_file_is_literal_and_filled(recipe):
    plan = resolve(recipe, hardware="gb300")
    bound = bind(plan, _hosts(2), ifaces={"n0": "enp1s0", "n1": "ib0"})
    assert env_file_text(present(bound["n1"].engine).env).splitlines()[:2] == ["GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME=ib0"]
    with pytest.raises(ValueError):
        env_file_text({"A": "x\ny"})


def test_engine_units_need_docker_the_cache_mount_and_start_after_the_fabric(recipe):
    """Issue findings on unit details: a container needs docker.service (Requires, not only After); the model
    cache's filesystem must be mounted first; NVIDIA engines order after the fabric manager (and IMEX on NVL
    trays); no --shm-size beside --ipc host (moot: the host's /dev/shm is shared)."""
    gb = plan_rollout(deployable(resolve(recipe, hardware="gb300", strategy="multi_node_tp", nodes=2)), _hosts(2),
                 Variables(k3_hardware="gb300", k3_model_cache="/mnt/shared/k3"), ifaces={"n0": "eth0", "n1": "eth0"})
    lines = gb.units[0].unit_text.splitlines()
    assert "Requires=docker.service" in lines and "RequiresMountsFor=/mnt/shared/k3" in lines
    after = next(ln for ln in lines if ln.startswith("After=")).split("=", 1)[1].split()
    assert after == ["network-online.target", "docker.service", "nvidia-fabricmanager.service", "nvidia-imex.service",
                     "k3-fence-8479.socket"]
    assert "--shm-size" not in gb.units[0].unit_text and '"--ipc" "host"' in gb.units[0].unit_text
    amd = plan_rollout(deployable(resolve(recipe, hardware="mi355x", strategy="single_node_tp")), _hosts(1),
                  Variables(k3_hardware="mi355x"), ifaces={"n0": "eth0"})
    after_line = next(ln for ln in amd.units[0].unit_text.splitlines() if ln.startswith("After="))
    assert after_line == "After=network-online.target docker.service k3-fence-8479.socket" and "--shm-size" not in amd.units[0].unit_text


def test_the_router_runs_the_absolute_path_of_vllm_router(recipe):
    plan = deployable(resolve(recipe, hardware="b300", strategy="pd_cluster"))
    hosts = [HostRecord(f"n{i}", (n.role,), {"k3_ip": f"10.77.0.{11 + i}"})
             for i, n in enumerate(x for x in plan.nodes if x.role != "router")]
    hosts[0] = HostRecord("n0", ("prefill", "router"), hosts[0].data)
    ifaces = {h.name: "eth0" for h in hosts}
    for v, want in ((Variables(k3_hardware="b300"), "/usr/local/bin/vllm-router"),
                    (Variables(k3_hardware="b300", k3_router_bin="/opt/venv/bin/vllm-router"), "/opt/venv/bin/vllm-router")):
        router = next(u for u in plan_rollout(plan, hosts, v, ifaces=ifaces).units if u.group == "router")
        start = next(ln for ln in router.unit_text.splitlines() if ln.startswith("ExecStart="))
        assert start.startswith(f'ExecStart="{want}" "--pd-disaggregation"') or start.startswith(f'ExecStart="{want}" ')
        assert "Requires=docker.service" not in router.unit_text   # the router on the host needs no docker


def test_a_retired_variable_says_why_and_what_to_do(tmp_path):
    from k3deploy.errors import K3Error
    from k3deploy.model.variables import merge_vars

    (tmp_path / "all.yml").write_text("k3_shm_size: 32g\n")
    with pytest.raises(K3Error, match=r"unknown variable 'k3_shm_size' \(no longer used: .*--ipc host.*remove it"):
        merge_vars([], {}, [tmp_path])
