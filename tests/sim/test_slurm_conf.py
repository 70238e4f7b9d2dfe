"""What ``sim up --slurm`` writes, without a cluster: slurm.conf and gres.conf from the node list, the state's
record, what sinfo/squeue are read into, the inventory's launcher variables and the base root's disabled units."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from k3sim import base as sim_base
from k3sim import slurm
from k3sim.host import SimError
from k3sim.inventory import write_inventory

NODES = [("sl9-node1", "10.9.0.11"), ("sl9-node2", "10.9.0.12"), ("sl9-node3", "10.9.0.13")]


def conf_dict(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_slurm_conf_from_the_node_list():
    conf = conf_dict(slurm.render_conf("sl9", NODES, 2, 4))
    assert conf["ClusterName"] == ["sl9"]
    assert conf["SlurmctldHost"] == ["sl9-node1(10.9.0.11)"]  # the rank-0 node runs slurmctld
    for key, value in {"AuthType": "auth/munge", "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
                       "JobAcctGatherType": "jobacct_gather/none", "SelectType": "select/cons_tres",
                       "ReturnToService": "2", "KillWait": str(slurm.KILL_WAIT), "GresTypes": "gpu"}.items():
        assert conf[key] == [value], key
    assert conf["NodeName"] == [f"{nm} NodeAddr={ip} CPUs=2 Gres=gpu:4 State=UNKNOWN" for nm, ip in NODES]
    assert conf["PartitionName"] == ["k3 Nodes=sl9-node1,sl9-node2,sl9-node3 Default=YES MaxTime=INFINITE State=UP"]


def test_slurm_conf_without_gpus_has_no_gres():
    conf = conf_dict(slurm.render_conf("sl9", NODES[:1], 8, 0))
    assert "GresTypes" not in conf and conf["NodeName"] == ["sl9-node1 NodeAddr=10.9.0.11 CPUs=8 State=UNKNOWN"]
    with pytest.raises(SimError):
        slurm.render_conf("sl9", [], 8, 0)


def test_gres_conf_names_each_gpu_by_its_device_file():
    assert slurm.render_gres(slurm.gpu_files("nvidia", 4)).splitlines()[1:] == \
        [f"Name=gpu File=/dev/nvidia{i}" for i in range(4)]
    assert slurm.gpu_files("amd", 2) == ["/dev/dri/renderD128", "/dev/dri/renderD129"]


def test_sinfo_and_squeue_are_read_into_nodes_and_jobs():
    got = slurm.parse_query("sl9-node1|k3*|idle\nsl9-node2|k3*|mixed\n--squeue--\n"
                            "12|k3-head|root|RUNNING|k3|2|sl9-node[1-2]|None\n13|k3-router|root|PENDING|k3|1||"
                            "Resources\n")
    assert [(n["name"], n["state"]) for n in got["nodes"]] == [("sl9-node1", "idle"), ("sl9-node2", "mixed")]
    assert [(j["id"], j["state"], j["nodes"], j["nodelist"], j["reason"]) for j in got["jobs"]] == \
        [("12", "RUNNING", 2, "sl9-node[1-2]", "None"), ("13", "PENDING", 1, "", "Resources")]
    assert slurm.parse_query("") == {"nodes": [], "jobs": []}


def _state(tmp_path: Path, pools: dict[str, int] | None) -> dict:
    st = {"name": "sl9", "hardware": "gb300", "inventory": str(tmp_path / "sl9.py"), "key": "/k", "known_hosts": "/h",
          "pools": pools, "strategy": "pd_cluster" if pools else "multi_node_tp", "strategy_default": False,
          "nodes": [{"name": nm, "ip": ip, "rank": i} for i, (nm, ip) in enumerate(NODES)]}
    st["slurm"] = slurm.record(st, 2, 4)
    return st


def test_inventory_selects_the_slurm_launcher(tmp_path):
    st = _state(tmp_path, None)
    assert st["slurm"]["controller"] == st["slurm"]["submit_host"] == "sl9-node1"
    write_inventory(st)
    text = (tmp_path / "group_vars" / "all.yml").read_text()
    gv = yaml.safe_load(text)
    assert (gv["k3_launcher"], gv["k3_slurm_submit_host"], gv["k3_slurm_partition"]) == ("slurm", "sl9-node1", "k3")
    assert "k3_slurm_exclusive" not in gv
    lines = text.splitlines()
    for key in ("k3_launcher", "k3_slurm_submit_host", "k3_slurm_partition"):  # each says why, on the line above
        i = next(n for n, ln in enumerate(lines) if ln.startswith(key + ":"))
        assert lines[i - 1].startswith("# ")


def test_inventory_of_a_pd_layout_lets_jobs_share_nodes(tmp_path):
    write_inventory(_state(tmp_path, {"prefill": 1, "decode": 2}))
    gv = yaml.safe_load((tmp_path / "group_vars" / "all.yml").read_text())
    assert gv["k3_slurm_exclusive"] == "user" and gv["k3_launcher"] == "slurm"


def test_inventory_without_slurm_names_no_launcher(tmp_path):
    st = _state(tmp_path, None)
    del st["slurm"]
    write_inventory(st)
    assert not any(k.startswith("k3_slurm") or k == "k3_launcher"
                   for k in yaml.safe_load((tmp_path / "group_vars" / "all.yml").read_text()))


def test_the_base_root_has_slurm_with_its_units_disabled():
    path = sim_base.base_path()
    if not sim_base.is_complete(path):
        pytest.skip(f"no cached base root {path} (k3deploy sim base builds it)")
    assert set(slurm.UNITS_ALL + slurm.UNITS_CONTROLLER) <= set(sim_base.DISABLED_UNITS)
    slurm.check_base(path)
    wants = [p.name for p in (path / "etc/systemd/system").glob("*.wants/*")]
    assert not set(wants) & set(sim_base.DISABLED_UNITS)
    assert not (path / "etc/munge/munge.key").exists()  # each cluster writes its own
    assert set(json.loads((path / sim_base.MARKER).read_text())["packages"]) >= {"slurmd", "slurmctld", "munge"}


def test_inventory_of_replicas_or_hybrid_lb_lets_the_front_router_share_the_heads_node(tmp_path):
    st = {**_state(tmp_path, None), "replicas": 3}
    write_inventory(st)
    gv = yaml.safe_load((tmp_path / "group_vars" / "all.yml").read_text())
    assert gv["k3_slurm_exclusive"] == "user" and gv["k3_launcher"] == "slurm"
    st = {**_state(tmp_path, None), "strategy": "multi_node_dep"}
    write_inventory(st)
    text = (tmp_path / "group_vars" / "all.yml").read_text()
    assert yaml.safe_load(text)["k3_slurm_exclusive"] == "user"
    lines = text.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith("k3_slurm_exclusive:"))
    assert lines[i - 1].startswith("# ") and "router" in lines[i - 1]


def test_an_ascend_cluster_names_its_npus_as_the_pack_does():
    assert slurm.gres_name("ascend") == "npu" and slurm.gres_name("amd") == "gpu"
    conf = conf_dict(slurm.render_conf("sl9", NODES[:1], 8, 16, slurm.gres_name("ascend")))
    assert conf["GresTypes"] == ["npu"] and conf["NodeName"] == ["sl9-node1 NodeAddr=10.9.0.11 CPUs=8 Gres=npu:16 "
                                                                 "State=UNKNOWN"]
    assert slurm.render_gres(slurm.gpu_files("ascend", 2), "npu").splitlines()[1:] == [
        "Name=npu File=/dev/davinci0", "Name=npu File=/dev/davinci1"]


def test_imex_per_job_adds_the_simulated_switch_s_prolog_and_epilog(tmp_path):
    conf = conf_dict(slurm.render_conf("sl9", NODES, 2, 4, imex_per_job=True))
    assert conf["Prolog"] == [slurm.IMEX_PROLOG] and conf["Epilog"] == [slurm.IMEX_EPILOG]
    assert conf["PrologFlags"] == ["Alloc"] and "Prolog" not in conf_dict(slurm.render_conf("sl9", NODES, 2, 4))
    files = slurm.imex_files()
    dev = tmp_path / "dev"
    prolog = files[slurm.IMEX_PROLOG.lstrip("/")].replace("/dev/", f"{dev}/")
    epilog = files[slurm.IMEX_EPILOG.lstrip("/")].replace("/dev/", f"{dev}/")
    env = {"SLURM_JOB_ID": "4095", "PATH": "/usr/bin:/bin"}
    assert subprocess.run(["sh", "-c", prolog], env=env, check=False).returncode == 0
    assert sorted(p.name for p in (dev / "nvidia-caps-imex-channels").iterdir()) == ["channel2"]   # 4095 % 2047 + 1
    assert subprocess.run(["sh", "-c", epilog], env=env, check=False).returncode == 0
    assert list((dev / "nvidia-caps-imex-channels").iterdir()) == []


def test_the_per_job_scontrol_answers_as_a_24_05_site_with_switch_nvidia_imex(tmp_path):
    real = tmp_path / "real-scontrol"
    text = (Path(__file__).resolve().parents[1] / "fixtures/slurm/scontrol-show-config-22.05-debian.txt").read_text()
    text = text.replace("Prolog                  = (null)", f"Prolog                  = {slurm.IMEX_PROLOG}")
    (tmp_path / "config.txt").write_text(text)
    real.write_text(f"#!/bin/sh\ncat {tmp_path / 'config.txt'}\n")
    real.chmod(0o755)
    wrapper = slurm.imex_files()["usr/local/bin/scontrol"].replace("/usr/bin/scontrol", str(real))
    got = subprocess.run(["bash", "-c", wrapper, "scontrol", "show", "config"], capture_output=True, text=True,
                         check=True).stdout
    from k3deploy.model.slurm import parse_site
    version = subprocess.run(["bash", "-c", wrapper, "scontrol", "--version"], capture_output=True, text=True,
                             check=True).stdout
    site = parse_site(version, got)
    assert (site.version, site.switch, site.prolog, site.imex_per_job) == ("24.05.3", "switch/nvidia_imex", (), True)


def test_an_nvidia_cluster_runs_the_packs_pyxis_and_an_amd_one_docker(tmp_path):
    write_inventory(_state(tmp_path, None))
    assert "k3_slurm_container" not in yaml.safe_load((tmp_path / "group_vars" / "all.yml").read_text())
    st = _state(tmp_path, None)
    st["hardware"] = "mi300x"   # the AMD pack's Apptainer is not simulated
    write_inventory(st)
    assert yaml.safe_load((tmp_path / "group_vars" / "all.yml").read_text())["k3_slurm_container"] == "docker"


def test_the_simulators_pyxis_builds_once_and_exports_spank_symbols(tmp_path):
    if not slurm.SPANK_HEADER.is_file():
        pytest.skip("no slurm/spank.h (libslurm-dev, .ci/install-sim.sh)")
    first = slurm.build_plugin(tmp_path)
    assert slurm.build_plugin(tmp_path) == first and len(list(tmp_path.glob("*.so"))) == 1   # cached
    symbols = subprocess.run(["nm", "-D", str(first)], capture_output=True, text=True, check=True).stdout
    for name in ("slurm_spank_init", "slurm_spank_task_init", "spank_options", "plugin_name"):
        assert name in symbols


def test_a_node_root_gets_the_plugin_its_plugstack_line_and_the_job_user(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\nmunge:x:101:101::/:/bin/false\n"
                                     "slurm:x:64030:64030::/:/bin/false\n")
    (root / "etc/group").write_text("root:x:0:\n")
    plugin = tmp_path / "p.so"
    plugin.write_bytes(b"\x7fELF")
    slurm.prepare_node(root, "conf\n", "gres\n", b"k" * 1024, controller=False, plugin=plugin)
    slurm.prepare_node(root, "conf\n", "gres\n", b"k" * 1024, controller=False, plugin=plugin)   # twice: one user
    assert (root / slurm.PLUGIN.lstrip("/")).read_bytes() == b"\x7fELF"
    assert (root / "etc/slurm/plugstack.conf").read_text().splitlines()[-1] == f"required {slurm.PLUGIN}"
    users = [ln.split(":") for ln in (root / "etc/passwd").read_text().splitlines()]
    assert [u[2:4] for u in users if u[0] == slurm.JOB_USER] == [[str(slurm.JOB_UID)] * 2]
