"""The container runtime of a Slurm site (k3deploy/model/jobcontainers.py, k3_slurm_container): every runtime's step
and launch script rendered from the unit's engine spec for every strategy and vendor family, the pack's default per
vendor, the image staged in the runtime's form keyed by its digest, and a pyxis launch script run by bash (the env
file exported word for word, the engine's argv exec'd)."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.clusters import FAMILIES, STRATEGIES, records, smallest_rollout
from k3deploy.errors import K3Error
from k3deploy.model import slurm, steps
from k3deploy.model.hosttext import launch_argv
from k3deploy.model.images import run_ref
from k3deploy.model.jobcontainers import RUNTIMES, enroot_uri, import_image, staged_image
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import Rollout
from k3deploy.model.staging import stage_for
from k3deploy.model.units import bind_mounts
from k3deploy.vendors import pack_for_container

PINNED = "vllm/vllm-openai@sha256:" + "ab" * 32


def _offered(**extra: object) -> list[tuple[str, str, Rollout]]:
    out = []
    for family, hardware in FAMILIES.items():
        for strategy in STRATEGIES:
            r = smallest_rollout(hardware, strategy, k3_slurm_exclusive="user", **extra)
            if r is not None:
                out.append((family, strategy, r))
    return out


def _steps(script: str) -> list[list[str]]:
    """The srun lines of a batch script's steps (one per node), as words."""
    return [shlex.split(line)[:-1] for line in script.splitlines()
            if line.startswith("srun --nodes=1 ") and line.endswith(" &")]


def test_the_pack_names_the_runtime_its_vendor_documents_for_slurm_and_the_variable_overrides_it():
    seen = {}
    for family, hardware in FAMILIES.items():
        strategy = next(s for s in STRATEGIES if smallest_rollout(hardware, s) is not None)
        r = smallest_rollout(hardware, strategy)
        pinned = smallest_rollout(hardware, strategy, k3_slurm_container="docker")
        assert r is not None and pinned is not None
        pack = pack_for_container(r.plan.vendor)
        assert pack is not None and pack.container.slurm_runtime_source
        seen[family] = slurm.container_runtime(r).name
        assert slurm.container_runtime(pinned).name == "docker"
    assert seen == {"NVIDIA": "pyxis", "AMD": "apptainer", "Ascend": "docker"}


@pytest.mark.parametrize("name", ["pyxis", "apptainer"])
def test_every_step_renders_from_the_spec_and_holds_no_docker(name: str):
    rt = RUNTIMES[name]
    for family, strategy, r in _offered(k3_slurm_container=name):
        for job in slurm.jobs(r):
            assert "docker" not in job.script, (family, strategy, job.group)
            lines = _steps(job.script)
            units = r.group(job.group)
            assert len(lines) == len(units)
            for u, words in zip(units, lines, strict=True):
                spec = u.require_spec().container
                script = slurm.launch_script(r, u)
                if spec is None:    # a router from k3_router_bin: no container
                    assert launch_argv(script) == u.require_spec().command
                    continue
                assert "docker" not in script, (family, strategy, u.unit)
                image = staged_image(r.vars.k3_stage_dir, spec.image, rt)
                inside = slurm.container_command(spec, u.require_spec().argv)
                if name == "pyxis":   # the step is the container; the script execs the engine's argv inside it
                    mounts = ",".join([*(f"{h}:{c}" for h, c in bind_mounts(spec)),
                                       f"{r.vars.k3_config_dir}:{r.vars.k3_config_dir}:ro"])
                    at = words.index(f"--container-image={image}")
                    assert words[at:at + 6] == [f"--container-image={image}", f"--container-mounts={mounts}",
                                                f"--container-name={u.container}", "--no-container-mount-home",
                                                "--no-container-entrypoint", "--container-writable"], words
                    last = words[-1]   # the launch script, or (a worker) the wait for its head, then it
                    assert last == slurm.launch_path(r, u) or last.endswith(f"&& exec {slurm.launch_path(r, u)}")
                    assert launch_argv(script) == inside
                else:                 # the launch script runs apptainer on the node; the step carries nothing
                    assert not any(w.startswith("--container") for w in words)
                    ran = launch_argv(script)
                    flag = {"nvidia": ["--nv"], "amd": ["--rocm"]}.get(spec.vendor, [])
                    assert ran[:2 + len(flag)] == ["apptainer", "exec", *flag]
                    assert ran[ran.index(image) + 1:] == inside and image.endswith(".sif")
                # the env file is read by the script, never put in argv
                assert u.env_path in script and not any(k + "=" in script for k in u.require_spec().env_map)


def test_docker_keeps_the_units_docker_run():
    for _family, _strategy, r in _offered(k3_slurm_container="docker"):
        for u in r.units:
            assert launch_argv(slurm.launch_script(r, u)) == u.require_spec().command
        for job in slurm.jobs(r):
            assert not any(w.startswith("--container") for line in _steps(job.script) for w in line)


def test_the_image_is_staged_as_the_runtimes_file_made_once_and_handed_on_keyed_by_its_digest(tmp_path: Path):
    """Under pyxis (and apptainer) the image travels as the runtime's file: the first node makes it once from the
    registry (``enroot import docker://``) or the archive (``docker-archive://``) with its checksum, the others get
    that file from their peers in the stage's rounds (checked against the checksum), nobody uses docker; a node that
    holds it is a holder; the weights come through the file's own CLI. Docker as the runtime stages as before."""
    def rollout(**extra: object) -> Rollout:
        return desired_rollout(target(records("gb300", "multi_node_tp", 2, k3_launcher="slurm",
                                              k3_slurm_submit_host="n0", k3_image=PINNED, **extra), None))

    def staged(r: Rollout, files: dict[str, list[str]] | None = None) -> dict[tuple[str, str], str]:
        path = slurm.engine_image_file(r)
        plan = stage_for(r, {}, {}, image_file=path, runtime=slurm.container_runtime(r).name, files=files)
        return {(s.host, s.name): s.script for s in steps.rollout(r, steps.JobSteps("n0"), plan).stage if s.applies}

    r = rollout()
    path = slurm.engine_image_file(r)
    assert path == staged_image(r.vars.k3_stage_dir, run_ref(PINNED), RUNTIMES["pyxis"])
    made = staged(r)
    pull = made[("n0", "Image " + PINNED + ": from the registry")]
    assert f"enroot import -o {path}.part docker://{PINNED}" in pull and f"> {path}.sha256.part" in pull
    got = made[("n1", "Stage round 1 of 1: from a peer")]
    # along the stage's chain (k3_stage: chain): the file from its peer's daemon, checked against its checksum
    assert f"k3_relay k3-stage images/{path.rsplit('/', 1)[1]}" in got and "K3_PEERS=n0=192.0.2.10 " in got
    assert '$K3_SHA256 < "$a.k3-part"' in got and 'mv -f "$a.k3-part" "$a"' in got
    assert "docker load" not in got
    hub = made[("n0", "Weights of moonshotai/Kimi-K3: from the hub")]
    assert f"enroot start --mount /var/lib/k3deploy/cache:/root/.cache {path} hf download" in hub
    assert not any(f"docker {verb}" in text for text in made.values() for verb in ("run", "load", "save", "pull", "tag"))
    assert not any(name == "Image: in the form the Slurm container runtime reads" for _, name in made)
    # a node that holds the file is its holder: the other gets it from there; both: nothing to do for the image
    name = path.rsplit("/", 1)[1]
    held = staged(r, {"n1": [name]})
    assert ("n0", "Stage round 1 of 1: from a peer") in held and not any("from the registry" in n for _, n in held)
    assert "K3_PEERS=n1=192.0.2.11 " in held[("n0", "Stage round 1 of 1: from a peer")]
    both = staged(r, {"n0": [name], "n1": [name]}).values()
    assert not any("enroot import" in text or f"images/{name}.part" in text for text in both)
    # the files of images no kept revision runs are removed, with their checksums, after the stage
    plan = replace(stage_for(r, {}, {}, image_file=path, runtime="pyxis", files={"n1": [name, "old.sqsh"]}),
                   stale={"n1": ("/x/old.sqsh",)})
    pruned = [s for s in steps.rollout(r, steps.JobSteps("n0"), plan).stage if s.kind == steps.PRUNE_IMAGES]
    assert [(s.host, s.applies, s.script) for s in pruned] == [("n0", False, ""), ("n1", True,
                                                                                   "rm -f /x/old.sqsh /x/old.sqsh.sha256")]
    # from the control machine's archive: copied, made into the file, removed
    (tmp_path / "image.tar").write_bytes(b"")
    archived = staged(rollout(k3_image_archive=str(tmp_path / "image.tar")))
    load = archived[("n0", "Image: load the archive")]
    assert "docker-archive:///var/lib/k3deploy/stage/" in load and re.search(r"&& rm -f \S+[.]tar \)", load)
    # apptainer: a SIF, from the registry
    sif = staged(rollout(k3_slurm_container="apptainer"))
    assert any("apptainer build" in t and f"docker://{PINNED}" in t and ".sif.part" in t for t in sif.values())
    # a changed image is another file, hence another batch script and another revision
    other = RUNTIMES["pyxis"]
    assert staged_image("/s", PINNED, other) != staged_image("/s", PINNED.replace("ab", "cd"), other)
    assert PINNED.split("@sha256:")[1] in staged_image("/s", PINNED, other)
    assert f"--container-image={path}" in slurm.jobs(r)[0].script
    # docker reads its own store: no file, the stage as the systemd units have it
    docker = rollout(k3_slurm_container="docker")
    assert slurm.engine_image_file(docker) is None
    assert not any(s.applies for s in steps.JobSteps("n0").staged(docker)) and steps.UNITS.staged(r) == []


def test_enroot_uris_put_the_registry_before_a_hash():
    assert enroot_uri("quay.io/org/img:1") == "quay.io#org/img:1"
    assert enroot_uri("localhost:5000/img") == "localhost:5000#img"
    assert enroot_uri("vllm/vllm-openai@sha256:" + "0" * 64) == "vllm/vllm-openai@sha256:" + "0" * 64


def test_a_bad_runtime_or_user_is_one_line_naming_the_value_and_the_fix():
    for key, value, fix in (("k3_slurm_container", "podman", "pyxis"), ("k3_slurm_user", "Bad User", "id -un")):
        with pytest.raises(K3Error) as exc:
            target(records("gb300", "multi_node_tp", 2, **{key: value}), None)
        text = str(exc.value)
        assert key in text and value in text and fix in text and "\n" not in text, text


def test_bash_runs_the_pyxis_launch_script_exporting_the_env_file_word_for_word(tmp_path: Path):
    """The script as pyxis runs it inside the container: a stand-in ``vllm`` on PATH records its argv and env."""
    cfg = tmp_path / "cfg"
    r = desired_rollout(target(records("gb300", "multi_node_tp", 2, k3_config_dir=str(cfg),
                                       k3_extra_env={"K3_ODD": "a b=c 'd' $HOME"}), None))
    u = r.units[1]
    cfg.mkdir()
    Path(u.env_path).write_text(u.env_text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "vllm"
    stub.write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$OUT.argv"\nprintf "%s" "$K3_ODD" > "$OUT.env"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "launch"
    script.write_text(slurm.launch_script(r, u))
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(script)], env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out)},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert ["vllm", *Path(f"{out}.argv").read_text().split("\0")[:-1]] == u.require_spec().argv
    assert Path(f"{out}.env").read_text() == "a b=c 'd' $HOME"


def test_a_restored_pyxis_launch_script_runs_from_the_image_it_names():
    """A rollback's unit keeps its revision's launch script: its step runs the image file that script names (read
    back from the host's script), not the current plan's, and the revision hash follows it."""
    r = desired_rollout(target(records("gb300", "multi_node_tp", 2), None))
    before = slurm.jobs(r)[0]
    old = "/var/lib/k3deploy/stage/images/vllm_vllm-openai_k3-sha256-" + "cd" * 32 + ".sqsh"
    for i, u in enumerate(r.units):
        script = slurm.launch_script(r, u)
        box = u.require_spec().container
        assert box is not None
        now = staged_image(r.vars.k3_stage_dir, box.image, RUNTIMES["pyxis"])
        assert f"# Container image: {now}\n" in script
        r.units[i] = replace(u, launch_text=script.replace(now, old))
    (job,) = slurm.jobs(r)
    assert job.script.count(f"--container-image={old} ") == 2 and job.revision != before.revision


@pytest.mark.parametrize("name, tool", [("pyxis", "enroot"), ("apptainer", "apptainer")])
def test_a_node_without_the_runtimes_tools_fails_the_stage_naming_them(tmp_path: Path, name: str, tool: str):
    """The stage's import on a node: without the runtime's tools, one line (observed, required, fix) and exit 1,
    nothing made; with them (stand-ins on PATH), the file is made once and a second run leaves it."""
    rt = RUNTIMES[name]
    out = tmp_path / "images" / f"r{rt.staged}"
    script = f"set -e\n{import_image(rt, 'r:1', str(out))}\n"
    bare = tmp_path / "bare"
    bare.mkdir()
    for prog in ("sh", "grep", "mkdir", "rm", "mv", "bash", "sha256sum", "cut"):
        os.symlink(f"/usr/bin/{prog}" if Path(f"/usr/bin/{prog}").exists() else f"/bin/{prog}", bare / prog)
    proc = subprocess.run(["bash", "-c", script], env={"PATH": str(bare)}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and not out.exists(), proc.stderr
    (line,) = proc.stderr.splitlines()
    assert f"k3_slurm_container: {name}: observed no {tool} on PATH" in line and "required" in line and "fix:" in line
    # the tools there: the stand-in writes the file; a second run finds it and makes nothing
    calls = tmp_path / "calls"
    for prog, text in ((tool, f'#!/bin/bash\necho "$@" >> {calls}\n'
                              'case $1 in import) echo made > "$3";; build) echo made > "$2";; esac\n'),
                       ("srun", "#!/bin/bash\necho '      --container-image=[USER@][REGISTRY#]IMAGE'\n")):
        (bare / prog).write_text(text)
        (bare / prog).chmod(0o755)
    for _ in range(2):
        proc = subprocess.run(["bash", "-c", script], env={"PATH": str(bare)}, capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode == 0 and out.read_text() == "made\n", proc.stderr
    assert len(calls.read_text().splitlines()) == 1


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_the_batch_script_sets_the_imex_channels_before_any_step_starts(tmp_path: Path, runtime: str):
    """Under a runtime that sets up the container inside the job (pyxis's enroot, apptainer), the batch script
    exports ``NVIDIA_IMEX_CHANNELS`` before its first container step: 0 with a standing domain, the job's own
    channel(s) with IMEX per job (read in a step on the head; a stand-in ``srun`` answers here), or it fails at once
    naming the head. Under docker it sets nothing (each launch script hands the channel as ``--device``)."""
    def script(**extra: object) -> str:
        r = desired_rollout(target(records("gb300", "multi_node_tp", 2, k3_launcher="slurm",
                                           k3_slurm_submit_host="n0", k3_slurm_container=runtime, **extra), None))
        (job,) = slurm.jobs(r)
        return job.script

    def before_steps(text: str) -> str:
        return text[:text.index("declare -A steps")]

    standing = script(k3_imex="standing")
    assert "export NVIDIA_IMEX_CHANNELS=0\n" in before_steps(standing)
    per_job = script(k3_imex="per_job")
    lines = before_steps(per_job).splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("ids=$(srun"))
    assert "-w n0 " in lines[start] and "channel0" not in per_job and "NVIDIA_IMEX_CHANNELS=0" not in per_job
    block = "\n".join(lines[start:start + 4])
    for listed, rc, seen in (("3,", 0, "3"), ("3,7,", 0, "3,7"), ("", 1, "")):
        stub = f"srun() {{ printf %s {shlex.quote(listed)}; }}\n"
        proc = subprocess.run(["bash", "-c", f"set -u\n{stub}{block}\necho \"$NVIDIA_IMEX_CHANNELS\""],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == rc, proc.stderr
        if rc == 0:
            assert proc.stdout.strip() == seen, proc.stdout
        else:
            (said,) = proc.stderr.splitlines()
            assert said.startswith("k3deploy: group engine: no IMEX channel") and "on n0" in said, said
    docker = desired_rollout(target(records("gb300", "multi_node_tp", 2, k3_launcher="slurm",
                                            k3_slurm_submit_host="n0", k3_slurm_container="docker",
                                            k3_imex="per_job"), None))
    assert "NVIDIA_IMEX_CHANNELS" not in before_steps(slurm.jobs(docker)[0].script)


def test_the_slurm_launcher_contributes_its_runtimes_tools_to_preflight_and_the_units_none():
    """``slurm.container``: each engine node's answer for the runtime's tools, failing in one line naming the node's
    lack, the runtime's requirement and fix; docker's own checks do not fail an engine node whose runtime runs no
    docker. Docker as the runtime, and the systemd units, contribute nothing."""
    from k3deploy.facts.status import RuntimeReading
    from k3deploy.preflight.base import CheckResult
    from k3deploy.runtime.launchers import launcher_for
    from k3deploy.runtime.reading import ReadRuntimeTools, plan_host
    from k3deploy.runtime.views import DEPLOY, PREFLIGHT

    def rollout(**extra: object) -> Rollout:
        return desired_rollout(target(records("gb300", "multi_node_tp", 2, k3_slurm_submit_host="n0", **extra),
                                      None))

    no_docker = CheckResult("n1", "container.runtime", "fail", "docker daemon not reachable: no docker", "docker")
    pyxis = launcher_for(rollout(k3_launcher="slurm"))
    assert pyxis.runtime_tools is RUNTIMES["pyxis"] and str(pyxis.image_file).endswith(".sqsh")
    got = pyxis.preflight([no_docker], {"n0": RuntimeReading(), "n1": RuntimeReading(("no enroot on PATH",))})
    by = {(r.host, r.check): r for r in got}
    bad = by[("n1", "slurm.container")]
    assert bad.status == "fail" and bad.observed == "k3_slurm_container: pyxis: no enroot on PATH", bad
    assert bad.required == RUNTIMES["pyxis"].required and bad.fix.startswith("install enroot and pyxis")
    assert by[("n0", "slurm.container")].status == "pass"
    assert by[("n1", "container.runtime")].status == "pass" and "not used" in by[("n1", "container.runtime")].observed
    for view in (PREFLIGHT, DEPLOY):   # preflight reads it too, not only the deploy
        asked = [q for q in plan_host(rollout(k3_launcher="slurm"), "n1", view, None).requests
                 if isinstance(q, ReadRuntimeTools)]
        assert [(q.runtime, q.folder) for q in asked] == [("pyxis", "/var/lib/k3deploy/stage/images")]
    for other in (launcher_for(rollout(k3_launcher="slurm", k3_slurm_container="docker")), launcher_for(rollout())):
        assert other.runtime_tools is None and other.image_file is None
        assert other.preflight([no_docker], {}) == [no_docker]
        assert not any(isinstance(q, ReadRuntimeTools) for q in plan_host(rollout(), "n1", DEPLOY, None).requests)
