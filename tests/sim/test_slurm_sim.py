"""``k3deploy sim up --slurm``: a real Slurm (Debian 12's 22.05: slurmctld, slurmd, munge) in a simulated cluster;
jobs from the rank-0 node run steps on the nodes, and the simulated ``docker run`` lives as long as its step."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from helpers import k3, k3_here
from helpers.simulated import leftovers, resources, ssh
from k3sim import base as sim_base
from k3sim import cluster as sim
from k3sim import router as sim_router

NAME = "slt"
IMAGE = "vllm/vllm-openai:kimi-k3"


@pytest.fixture(scope="module")
def cluster():
    sim.down(NAME)  # a leftover of an interrupted earlier run
    res = k3("sim", "up", "--hardware", "gb300", "--nodes", "2", "--name", NAME, "--slurm", "--json")
    assert res.returncode == 0, res.stderr
    c = json.loads(res.stdout)
    yield c
    sim.down(NAME)


def on(c: dict, rank: int, command: str, timeout: float = 60) -> str:
    r = ssh(c, c["nodes"][rank]["ip"], command, timeout=timeout)
    assert r.returncode == 0, f"{command}: {r.stderr}"
    return r.stdout


def wait_for(what, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(every)


@pytest.mark.sim
def test_up_reports_slurm_and_writes_the_launcher_vars(cluster):
    head = cluster["nodes"][0]["name"]
    assert cluster["slurm"] == {"controller": head, "submit_host": head, "partition": "k3"}
    gv = yaml.safe_load((Path(cluster["inventory"]).parent / "group_vars" / "all.yml").read_text())
    assert gv["k3_launcher"] == "slurm"
    assert gv["k3_slurm_submit_host"] == head
    assert gv["k3_slurm_partition"] == "k3"
    assert "k3_slurm_exclusive" not in gv  # head and workers: each node runs one engine job
    # one munge key for the cluster, 0600 and owned by munge on every node
    keys = {on(cluster, r, "stat -c '%a %U' /etc/munge/munge.key; sha256sum < /etc/munge/munge.key") for r in (0, 1)}
    assert len(keys) == 1 and next(iter(keys)).startswith("600 munge\n")
    assert on(cluster, 0, "systemctl is-active munge slurmd slurmctld").split() == ["active"] * 3
    assert on(cluster, 1, "systemctl is-active munge slurmd; systemctl is-enabled slurmctld || true").split() == \
        ["active", "active", "disabled"]


@pytest.mark.sim
def test_sinfo_shows_both_nodes_idle_in_partition_k3(cluster):
    names = [n["name"] for n in cluster["nodes"]]
    rows = on(cluster, 0, "sinfo -h -N -o '%N %P %T %G'").splitlines()
    assert sorted(rows) == [f"{nm} k3* idle gpu:4" for nm in names]


@pytest.mark.sim
def test_a_batch_job_runs_a_step_on_each_node(cluster):
    names = [n["name"] for n in cluster["nodes"]]
    out = on(cluster, 0, f"cd /tmp && sbatch --wait -N2 -w {','.join(names)} --gres=gpu:4 -o /tmp/hosts-%j.out "
                         "--wrap 'srun -N2 --ntasks-per-node=1 hostname' && cat /tmp/hosts-*.out", timeout=120)
    assert sorted(ln for ln in out.splitlines() if ln in names) == names


def _engine_job(cluster: dict, container: str) -> str:
    """Submit, from the rank-0 node, a job whose step runs the engine image with docker run on node 2; its id."""
    node = cluster["nodes"][1]
    step = (f"srun docker run --rm --name {container} --gpus all --network host -e K3SIM_LOAD_SECONDS=0.2 {IMAGE} "
            f"moonshotai/Kimi-K3 -tp 4 --host {node['ip']} --port 8000")
    out = on(cluster, 0, f"cd /tmp && sbatch --parsable -N1 -w {node['name']} --gres=gpu:4 -o /tmp/{container}.out "
                         f"--wrap '{step}'")
    return out.strip()


def _running(cluster: dict, container: str) -> bool:
    ip = cluster["nodes"][1]["ip"]
    ps = on(cluster, 1, "docker ps --format '{{.Names}} {{.State}}'")
    health = ssh(cluster, ip, f"curl -s -o /dev/null -w '%{{http_code}}' http://{ip}:8000/health").stdout
    return f"{container} running" in ps.splitlines() and health == "200"


def _job_state(cluster: dict, job: str) -> str:
    return on(cluster, 0, f"squeue -h -j {job} -o %T 2>/dev/null || true").strip()


@pytest.mark.sim
def test_docker_run_in_a_step_stops_with_scancel(cluster):
    job = _engine_job(cluster, "k3-slurm-engine")
    assert wait_for(lambda: _running(cluster, "k3-slurm-engine"), 90), on(cluster, 1, "cat /tmp/k3-slurm-engine.out")
    time.sleep(2)  # the container runs as long as the step: still there, the job still running
    assert _running(cluster, "k3-slurm-engine") and _job_state(cluster, job) == "RUNNING"
    on(cluster, 0, f"scancel {job}")
    # SIGTERM to the step; the docker client proxies it to the container; SIGKILL after KillWait (5 s)
    assert wait_for(lambda: _job_state(cluster, job) == "" and on(cluster, 1, "docker ps -a -q") == "", 30)
    assert on(cluster, 1, "pgrep -f '[e]ngine[.]py' || true") == ""
    assert on(cluster, 1, "docker ps -a --filter name=k3-slurm-engine --format '{{.Names}}'") == ""


@pytest.mark.sim
def test_the_step_ends_when_its_container_stops(cluster):
    job = _engine_job(cluster, "k3-slurm-stop")
    assert wait_for(lambda: _running(cluster, "k3-slurm-stop"), 90), on(cluster, 1, "cat /tmp/k3-slurm-stop.out")
    on(cluster, 1, "docker stop k3-slurm-stop")
    assert wait_for(lambda: _job_state(cluster, job) == "", 30)
    assert on(cluster, 1, "docker ps -a -q") == ""


@pytest.mark.sim
def test_a_rebooted_node_is_seen_to_reboot_and_comes_back_idle(cluster):
    node = cluster["nodes"][1]["name"]

    def boot_time() -> str:
        return on(cluster, 0, f"scontrol show node {node}").split("BootTime=")[1].split()[0]

    before = boot_time()
    time.sleep(1.1)  # BootTime has whole seconds
    assert k3("sim", "reboot", NAME, "1").returncode == 0
    assert float(on(cluster, 1, "cut -d' ' -f1 /proc/uptime")) < 60  # its own boot clock, not the host's
    assert wait_for(lambda: on(cluster, 0, f"sinfo -h -n {node} -o %T").strip() == "idle" and boot_time() != before,
                    30), on(cluster, 0, f"scontrol show node {node}")


@pytest.mark.sim
def test_status_shows_the_slurm_side(cluster):
    res = k3_here("sim", "status", "--name", NAME, "--json")
    assert res.returncode == 0, res.stderr
    sl = json.loads(res.stdout)["clusters"][0]["slurm"]
    head = cluster["nodes"][0]["name"]
    assert (sl["controller"], sl["submit_host"], sl["partition"]) == (head, head, "k3")
    assert sorted((n["name"], n["partition"], n["state"]) for n in sl["nodes"]) == \
        [(n["name"], "k3", "idle") for n in cluster["nodes"]]
    assert sl["jobs"] == [] and "error" not in sl
    text = k3_here("sim", "status", "--name", NAME).stdout
    assert f"slurm            controller {head}, partition k3" in text


@pytest.mark.sim
def test_down_removes_everything(cluster):
    res = resources(NAME)
    assert k3_here("sim", "down", "--name", NAME).returncode == 0
    assert leftovers(res) == []


@pytest.mark.sim
def test_up_slurm_without_the_packages_is_one_line(tmp_path):
    # a cached base root without Slurm (as one built by an older k3deploy would be)
    fake = tmp_path / f"base-{sim_base.base_id()}"
    (fake / "usr/lib/systemd").mkdir(parents=True)
    (fake / "usr/lib/systemd/systemd").write_text("")
    (fake / sim_base.MARKER).write_text("{}")
    res = k3("sim", "up", "--hardware", "gb300", "--nodes", "2", "--name", "slnone", "--slurm",
             env={"K3SIM_CACHE": str(tmp_path), "K3SIM_ROUTER_DIR": str(sim_router.router_dir())})
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "has no Slurm" in lines[0] and "k3deploy sim base --rebuild" in lines[0], res.stderr
    assert not sim.state_dir("slnone").exists() and os.geteuid() == 0
