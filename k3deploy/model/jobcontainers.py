"""The container runtime of a Slurm site (``k3_slurm_container``): how a job's step runs a unit's engine container.
Pure, frozen. The differences between the runtimes are data (:class:`Runtime`, one per name in :data:`RUNTIMES`);
:func:`k3deploy.model.slurm.launch_script` and the batch script's steps render from it and the unit's
:class:`~k3deploy.model.engine.EngineSpec`, nothing else.

- ``pyxis`` (NVIDIA's SPANK plugin for Slurm, over enroot): the step itself is the container: ``srun
  --container-image=<staged squashfs> --container-mounts=... --container-name=... <launch script>``; the launch
  script runs inside it, reads the unit's env file and execs the engine's argv. The container is a process of the
  step, so it lives in the job's cgroup and gets the job's GPUs (Slurm's GRES environment reaches it). Option names
  from pyxis's README and ``args.c`` (github.com/NVIDIA/pyxis, release 0.24.0).
- ``docker``: the launch script runs ``docker run`` on the node (the systemd unit's argv), and stops the container
  on SIGTERM; dockerd's containers are children of containerd, outside the job's cgroup.
- ``apptainer``: the launch script runs ``apptainer exec --nv|--rocm --bind ... <staged SIF> <argv>`` on the node;
  the env file is handed in as ``APPTAINERENV_<NAME>`` (the Apptainer user guide, "Environment and Metadata": such a
  variable is set in the container, over the image's own value).

The image is staged in the form the runtime reads (:func:`staged_image`, :func:`import_image`): a squashfs made by
``enroot import`` (pyxis), a SIF by ``apptainer build`` (apptainer), each from the image the stage put in the node's
docker, and named after the image's reference, which pins its digest: a changed image is a new file.

Example::

    >>> RUNTIMES["pyxis"].step_flags("/s/i.sqsh", [("/c", "/root/.cache")], "/etc/k3deploy", "k3-engine")[:2]
    ['--container-image=/s/i.sqsh', '--container-mounts=/c:/root/.cache,/etc/k3deploy:/etc/k3deploy:ro']
    >>> staged_image("/var/lib/k3deploy/stage", "vllm/vllm-openai@sha256:" + "ab" * 32, RUNTIMES["pyxis"])[-21:]
    'abababababababab.sqsh'
    >>> RUNTIMES["docker"].staged is None
    True
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from k3deploy.model.images import run_ref

RuntimeName = Literal["pyxis", "docker", "apptainer"]

#: the loop a launch script reads the unit's env file with: one ``NAME=value`` per line, the value taken literally
#: (docker's ``--env-file`` format, which the env file is), blank lines and comments skipped; ``{prefix}`` before
#: each name (apptainer: ``APPTAINERENV_``)
READ_ENV = ("while IFS= read -r line || [ -n \"$line\" ]; do case $line in ''|'#'*) ;; *) export \"{prefix}$line\" "
            ";; esac; done < {path}")


@dataclass(frozen=True)
class Runtime:
    """A container runtime under Slurm, as data.

    ``staged``: the suffix of the image file it reads (None: it reads the image from its own store, docker);
    ``import_command``: how a node makes that file (``{out}``) from ``{source}``: ``local_source``, the image in the
    node's docker (``{ref}``: its local reference), or ``registry_source``, the image in its registry;
    ``tool``/``probe``/``required``/``fix``: what preflight looks for on every engine node, the command that shows
    it, what is required and the usual fix; ``in_job``: its containers run inside the job's cgroup; ``inside``: the
    launch script runs inside the container (the step's srun carries the container: pyxis); ``env_prefix``: before
    each env file name it exports. The flags that hand a vendor's accelerators to an apptainer container are the
    pack's (:attr:`k3deploy.vendors.base.Container.apptainer_flags`)."""

    name: RuntimeName
    staged: str | None
    import_command: str
    tool: str
    probe: str
    required: str
    fix: str
    in_job: bool
    inside: bool
    env_prefix: str = ""
    local_source: str = ""
    registry_source: str = ""
    #: the source form of a ``docker save`` archive on the node (``{archive}``: its path)
    archive_source: str = ""
    #: ``(test, what a node lacks where it fails)``: what the stage checks on each node before it makes the file
    needs: tuple[tuple[str, str], ...] = ()

    def require(self) -> str:
        """Shell that fails, in one line naming what the node lacks (observed), what is required and the fix,
        unless the node has this runtime's tools (:attr:`needs`); empty where it needs nothing checked here.

        >>> "no enroot on PATH" in RUNTIMES["pyxis"].require(), RUNTIMES["docker"].require()
        (True, '')
        """
        if not self.needs:
            return ""
        tests = "; ".join(f"{test} || o=\"${{o:+$o, }}{lacks}\"" for test, lacks in self.needs)
        said = (f"k3deploy: k3_slurm_container: {self.name}: observed $o; required {self.required}; fix: "
                f"{self.fix}")
        return f"o=; {tests}; [ -z \"$o\" ] || {{ echo \"{said}\" >&2; exit 1; }}"

    def step_flags(self, image: str, mounts: Sequence[tuple[str, str]], config_dir: str, name: str) -> list[str]:
        """The srun options of a step that runs a unit's container (pyxis's; none for the others): the image file,
        the mounts (the vendor's driver files, the model cache, then the unit's launch script and env file read
        only), its name, the user's home not mounted, the image's entrypoint not run (the launch script runs the
        engine), a writable root (the engine writes its caches there)."""
        if not self.inside:
            return []
        binds = [f"{host}:{inside}" for host, inside in mounts] + [f"{config_dir}:{config_dir}:ro"]
        return [f"--container-image={image}", f"--container-mounts={','.join(binds)}", f"--container-name={name}",
                "--no-container-mount-home", "--no-container-entrypoint", "--container-writable"]

    def run_argv(self, image: str, mounts: Sequence[tuple[str, str]], env: Sequence[tuple[str, str]],
                 argv: Sequence[str]) -> list[str]:
        """A command run once, on the node, in a container of the staged ``image`` file, outside any job: the
        stage's download of the weights with the image's own CLI where the node has no docker. ``enroot start``
        takes a squashfs image itself (enroot's doc/cmd/start.md: ``enroot start [options] NAME|IMAGE``, ``--mount``
        ``SRC:DST``, ``--env KEY=VAL``); ``apptainer exec --bind SRC:DST --env KEY=VAL SIF``.

        >>> RUNTIMES["pyxis"].run_argv("/s/i.sqsh", [("/c", "/root/.cache")], [("A", "1")], ["hf", "download", "m"])
        ['enroot', 'start', '--mount', '/c:/root/.cache', '--env', 'A=1', '/s/i.sqsh', 'hf', 'download', 'm']
        """
        env_flags = [w for k, v in env for w in ("--env", f"{k}={v}")]
        if self.name == "pyxis":
            return ["enroot", "start", *[w for h, c in mounts for w in ("--mount", f"{h}:{c}")], *env_flags, image,
                    *argv]
        binds = ",".join(f"{h}:{c}" for h, c in mounts)
        return ["apptainer", "exec", *(["--bind", binds] if binds else []), *env_flags, image, *argv]

    def download_argv(self, image: str, cache: str, model: str, token_file: str | None = None,
                      endpoint: str | None = None) -> list[str]:
        """The download of ``model``'s weights with the image's own Hugging Face CLI, run from the staged ``image``
        file (:meth:`run_argv`) as :func:`k3deploy.model.commands.download_argv` runs it with docker: the cache as
        ``~/.cache``, the token's 0600 file read by the CLI through ``HF_TOKEN_PATH`` (never in argv), the mirror.

        >>> RUNTIMES["apptainer"].download_argv("/s/i.sif", "/c", "o/m", "/t")[2:6]
        ['--bind', '/c:/root/.cache,/t:/run/secrets/hf-token', '--env', 'HF_TOKEN_PATH=/run/secrets/hf-token']
        """
        mounts = [(cache, "/root/.cache")]
        env: list[tuple[str, str]] = []
        if token_file:
            mounts.append((token_file, "/run/secrets/hf-token"))
            env.append(("HF_TOKEN_PATH", "/run/secrets/hf-token"))
        if endpoint:
            env.append(("HF_ENDPOINT", endpoint))
        return self.run_argv(image, mounts, env, ["hf", "download", model])

    def read_env(self, env_path: str) -> str:
        """The launch script's line that exports the unit's env file (:data:`READ_ENV`)."""
        return READ_ENV.format(prefix=self.env_prefix, path=shlex.quote(env_path))

    def exec_argv(self, image: str, gpu_flags: Sequence[str], mounts: Sequence[tuple[str, str]],
                  argv: Sequence[str]) -> list[str]:
        """What the launch script execs after reading the env file: the engine's argv itself where the script runs
        inside the container (pyxis), else the runtime's command around it (apptainer; ``gpu_flags``: the pack's)."""
        if self.inside:
            return list(argv)
        binds = ",".join(f"{host}:{inside}" for host, inside in mounts)
        return ["apptainer", "exec", *gpu_flags, *(["--bind", binds] if binds else []), image, *argv]


RUNTIMES: dict[str, Runtime] = {
    "pyxis": Runtime(
        "pyxis", ".sqsh", "enroot import -o {out} {source}", "enroot",
        "enroot version && srun --help | grep -c -- --container-image",
        "enroot on every engine node, and pyxis in Slurm (srun --help lists --container-image)",
        "install enroot and pyxis (github.com/NVIDIA/pyxis: plugstack.conf.d/pyxis.conf) and restart slurmd, or set "
        "k3_slurm_container to the site's runtime (docker, apptainer)", in_job=True, inside=True,
        local_source="dockerd://{ref}", registry_source="docker://{enroot}",
        archive_source="docker-archive://{archive}",
        needs=(("command -v enroot >/dev/null", "no enroot on PATH"),
               ("srun --help 2>/dev/null | grep -q -- --container-image",
                "srun --help lists no --container-image (pyxis is not loaded: plugstack.conf)"))),
    "docker": Runtime(
        "docker", None, "", "docker", "docker version --format '{{.Server.Version}}'",
        "dockerd on every engine node (its containers run outside the job's cgroup)",
        "install Docker Engine, or set k3_slurm_container to the site's runtime (pyxis, apptainer)",
        in_job=False, inside=False),
    "apptainer": Runtime(
        "apptainer", ".sif", "apptainer build {out} {source}", "apptainer", "apptainer version",
        "apptainer on every engine node",
        "install Apptainer (apptainer.org/docs/admin), or set k3_slurm_container to the site's runtime (pyxis, "
        "docker)", in_job=True, inside=False, env_prefix="APPTAINERENV_", local_source="docker-daemon:{ref}",
        registry_source="docker://{ref}", archive_source="docker-archive:{archive}",
        needs=(("command -v apptainer >/dev/null", "no apptainer on PATH"),)),
}


#: the lines :func:`tools_probe` prints: a tool the node lacks (what it lacks follows), a staged image file it holds
LACKS, HOLDS = "K3_LACKS", "K3_FILE"


def tools_probe(rt: Runtime, folder: str | None = None) -> str:
    """Shell that prints, on a node, one ``K3_LACKS <what>`` line per tool of ``rt`` the node lacks
    (:attr:`Runtime.needs`) and one ``K3_FILE <name>`` line per image file of ``rt`` in ``folder`` (the stage's
    :func:`images_dir`) with its checksum beside it (:func:`checksum_path`: a whole file); it always succeeds.

    >>> print(tools_probe(RUNTIMES["apptainer"], "/s/images").replace("; ", ";\\n"))
    { command -v apptainer >/dev/null;
    } || echo 'K3_LACKS no apptainer on PATH';
    for f in /s/images/*.sif;
    do [ -s "$f.sha256" ] && echo "K3_FILE ${f##*/}";
    done;
    true
    """
    parts = [f"{{ {test}; }} || echo {shlex.quote(f'{LACKS} {lacks}')}" for test, lacks in rt.needs]
    if folder and rt.staged:
        parts.append(f'for f in {shlex.quote(folder)}/*{rt.staged}; do [ -s "$f.sha256" ] && echo "{HOLDS} '
                     '${f##*/}"; done')
    return "; ".join([*parts, "true"])


def parse_tools(lines: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What :func:`tools_probe` printed: (what the node lacks, the names of the image files it holds).

    >>> parse_tools(["K3_LACKS no enroot on PATH", "K3_FILE a.sqsh"])
    (('no enroot on PATH',), ('a.sqsh',))
    """
    def after(key: str) -> tuple[str, ...]:
        return tuple(ln.split(" ", 1)[1].strip() for ln in lines if ln.startswith(key + " "))
    return after(LACKS), after(HOLDS)


def stale_files(stage_dir: str, rt: Runtime, held: Collection[str], kept: Collection[str]) -> tuple[str, ...]:
    """The image files a node holds (``held``: their names in :func:`images_dir`) that no ``kept`` image runs from:
    the files of images that no kept revision names and that the plan does not run (a rollback finds the file of
    each revision it can go back to), to be removed with their checksums.

    >>> keep = ["r@sha256:" + "a" * 64]
    >>> stale_files("/s", RUNTIMES["pyxis"], ["r_k3-sha256-" + "a" * 64 + ".sqsh", "r_k3-sha256-bb.sqsh"], keep)
    ('/s/images/r_k3-sha256-bb.sqsh',)
    """
    names = {staged_image(stage_dir, run_ref(image), rt).rsplit("/", 1)[1] for image in kept}
    return tuple(f"{images_dir(stage_dir)}/{name}" for name in held if name not in names)


def images_dir(stage_dir: str) -> str:
    """Where a node keeps the image files its runtime reads: ``<k3_stage_dir>/images``."""
    return f"{stage_dir.rstrip('/')}/images"


def checksum_path(image_file: str) -> str:
    """Where the sha256 of a staged image file is kept, beside it (written where the file is made, checked where it
    lands)."""
    return image_file + ".sha256"


def enroot_uri(ref: str) -> str:
    """An image reference as enroot's ``docker://`` URI writes it: the registry, where named, before a ``#``
    (enroot's ``import`` usage: ``docker://[USER@][REGISTRY#]IMAGE[:TAG]``).

    >>> enroot_uri("nvcr.io/nvidia/pytorch:24.01-py3"), enroot_uri("vllm/vllm-openai:v0.11")
    ('nvcr.io#nvidia/pytorch:24.01-py3', 'vllm/vllm-openai:v0.11')
    """
    first, slash, rest = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref


def runtime(name: str) -> Runtime:
    """The runtime of this name (``k3_slurm_container``, or the pack's ``slurm_runtime``)."""
    return RUNTIMES[name]


def staged_image(stage_dir: str, image: str, rt: Runtime) -> str:
    """Where a node keeps ``image`` in the form ``rt`` reads: ``<stage_dir>/images/<reference>.<suffix>``, the
    reference (with its digest) made a file name; ``image`` itself for a runtime that reads its own store."""
    if rt.staged is None:
        return image
    return f"{images_dir(stage_dir)}/{re.sub(r'[^A-Za-z0-9_.-]', '_', image)}{rt.staged}"


def import_image(rt: Runtime, ref: str, path: str, *, local: bool = True, archive: str | None = None) -> str:
    """Shell that makes ``path`` from the image the node's docker holds as ``ref`` (``local``; else from the
    registry, ``ref`` then pinned by its digest), or from the ``docker save`` ``archive`` on the node, unless it is
    there already with its checksum (the name carries the digest: a present file is the planned image); written
    beside and moved into place, its sha256 beside it (:func:`checksum_path`, what a peer that receives it checks),
    so that an interrupted import leaves no file that looks staged.

    >>> import_image(RUNTIMES["pyxis"], "r:k3-sha256-ab", "/s/images/r.sqsh").split("} && ", 1)[1]
    '[ -s /s/images/r.sqsh ] && [ -s /s/images/r.sqsh.sha256 ] || { mkdir -p /s/images && rm -f /s/images/r.sqsh.part \
/s/images/r.sqsh.sha256 && enroot import -o /s/images/r.sqsh.part dockerd://r:k3-sha256-ab && sha256sum \
/s/images/r.sqsh.part | cut -d" " -f1 > /s/images/r.sqsh.sha256.part && mv -f /s/images/r.sqsh.part /s/images/r.sqsh \
&& mv -f /s/images/r.sqsh.sha256.part /s/images/r.sqsh.sha256; }'
    >>> import_image(RUNTIMES["apptainer"], "r@sha256:ab", "/s/r.sif", archive="/s/r.tar").split(" && ")[4]
    'apptainer build /s/r.sif.part docker-archive:/s/r.tar'

    The runtime's tools are checked first (:meth:`Runtime.require`): a node without them fails the stage, before
    anything is configured or submitted.
    """
    q = shlex.quote(path)
    part = shlex.quote(path + ".part")
    total = shlex.quote(checksum_path(path))
    total_part = shlex.quote(checksum_path(path) + ".part")
    folder = shlex.quote(path.rsplit("/", 1)[0] or "/")
    if archive is not None:
        source = rt.archive_source.format(archive=archive)
    else:
        source = (rt.local_source if local else rt.registry_source).format(ref=ref, enroot=enroot_uri(ref))
    made = rt.import_command.format(out=part, source=shlex.quote(source))
    check = rt.require()
    return (f"{{ {check}; }} && " if check else "") + \
        (f"[ -s {q} ] && [ -s {total} ] || {{ mkdir -p {folder} && rm -f {part} {total} && {made} && "
         f"sha256sum {part} | cut -d\" \" -f1 > {total_part} && mv -f {part} {q} && mv -f {total_part} {total}; }}")
