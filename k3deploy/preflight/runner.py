"""Read the preflight facts of one host, through pyinfra's Python API (:func:`host_facts`); which facts apply
to a deployment is :func:`fact_plan`. :mod:`k3deploy.runtime.gather` runs them on every host in parallel.

One-shot capture of every fact on this machine (raw output + parsed value), e.g. to keep a real
GPU node's outputs as test fixtures::

    python -m k3deploy.preflight.runner --local --json [--save DIR]
"""

from __future__ import annotations

if __name__ == "__main__":  # run as a program: green I/O first, as the k3deploy command does (k3deploy.cli)
    from gevent import monkey

    monkey.patch_all()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import ipaddress  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from pyinfra.api.command import StringCommand  # noqa: E402
from pyinfra.api.config import Config  # noqa: E402
from pyinfra.api.exceptions import ConnectError  # noqa: E402
from pyinfra.api.inventory import Inventory  # noqa: E402
from pyinfra.api.state import State  # noqa: E402
from pyinfra.context import ctx_host, ctx_state  # noqa: E402

from k3deploy.facts import host as hostfacts  # noqa: E402
from k3deploy.facts import rdma  # noqa: E402
from k3deploy.facts.base import FactError, K3Fact  # noqa: E402
from k3deploy.facts.batch import Spec, read_batch  # noqa: E402
from k3deploy.facts.rollout import StagePeers  # noqa: E402
from k3deploy.model.requirements import Requirements  # noqa: E402
from k3deploy.preflight.base import FactSpec, Read  # noqa: E402
from k3deploy.preflight.checks import VENDOR_CHECKS, HostFacts, vendor_checks  # noqa: E402

#: where weights are cached on a node (``k3_model_cache`` overrides it); images are measured in Docker's own
#: DockerRootDir unless ``k3_image_dir`` names a directory
DEFAULT_CACHE_DIR = "/var/lib/k3deploy/cache"
#: where the deploy keeps its records on a node (``k3_config_dir`` overrides it): the health fact reads the quarantine
#: record there
DEFAULT_CONFIG_DIR = "/etc/k3deploy"


def _host_value(host: Any, key: str) -> Any:
    return host.data.get(key)


def quiet_pyinfra() -> None:
    """pyinfra logs connection and fact errors itself; k3deploy reports them as results instead."""
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)


def host_address(host: Any) -> str:
    """The node's cluster address as a literal IPv4 address, or "" when it is not known."""
    value = _host_value(host, "k3_ip") or _host_value(host, "ssh_hostname")
    if not value:
        value = "" if host.name.startswith("@") else host.name
    value = str(value)
    if not value:
        return ""
    try:
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(value)
    except OSError:
        return ""


# ------------------------------------------------------------------------------ fact plan

def fact_plan(sel: Requirements, address: str, cache_dir: str, image_dir: str,
              config_dir: str = DEFAULT_CONFIG_DIR) -> list[FactSpec]:
    """Which facts to read on a host of this selection (each a :class:`~k3deploy.preflight.base.Read`: the field of
    its pack's facts type it fills, the fact, its arguments): the pack's
    (:meth:`k3deploy.preflight.base.VendorChecks.facts`), its hardware health with the quarantine record in
    ``config_dir`` (:meth:`~k3deploy.preflight.base.VendorChecks.health`), the RDMA ports where its engines use
    them, then the common ones."""
    judges = vendor_checks(sel)
    plan: list[FactSpec] = judges.facts(sel)
    health = judges.health(sel, config_dir)
    if health is not None:
        plan.append(health)
    if sel.needs_rdma and judges.pack.transport.rdma_ports:
        plan.append(Read("rdma", rdma.RdmaDevices, HostFacts.read_rdma))
    plan += [
        Read("kernel", hostfacts.KernelVersion, HostFacts.read_kernel),
        Read("runtime", hostfacts.DockerRuntime, HostFacts.read_runtime),
        Read("disk_images", hostfacts.DiskFree, HostFacts.read_disk_images, {"path": image_dir}) if image_dir
        else Read("disk_images", hostfacts.ImageStoreFree, HostFacts.read_disk_images),
        Read("disk_cache", hostfacts.DiskFree, HostFacts.read_disk_cache, {"path": cache_dir}),
        Read("shm", hostfacts.ShmSize, HostFacts.read_shm),
        Read("interface", hostfacts.InterfaceForAddress, HostFacts.read_interface, {"address": address}),
        Read("stage_peers", StagePeers, HostFacts.read_stage_peers),
    ]
    return plan


# ------------------------------------------------------------------------------- collection


#: how a host that did not answer its facts' command is said (the connection error follows)
LOST_CONNECTION = "lost the connection while reading the facts: "


def host_facts(state: State, host: Any, sel: Requirements, cache_dir: str | None = None,
               image_dir: str | None = None, extra: list[Spec] | None = None,
               ib_hca: str | None = None, iface: str | None = None, config_dir: str | None = None) -> HostFacts:
    """Read the facts of one connected host in one command (one round trip), ``extra`` facts included (their
    values land in ``HostFacts.extra`` by name). ``ib_hca`` (``k3_ib_hca``; default: the host's inventory data)
    names the RDMA ports the site wants NCCL and UCX to use, ``iface`` (``k3_iface``; the same default) the
    interface for their sockets.

    A lost connection marks the host unreachable; any other error fails every fact of the host, with the reason.
    """
    address = host_address(host)
    cdir = str(cache_dir or _host_value(host, "k3_model_cache") or DEFAULT_CACHE_DIR)
    idir = str(image_dir or _host_value(host, "k3_image_dir") or "")
    hca = ib_hca or _host_value(host, "k3_ib_hca")
    itf = iface or _host_value(host, "k3_iface")
    facts = vendor_checks(sel).facts_type(host=host.name, address=address, ib_hca=str(hca) if hca else None,
                                          iface=str(itf) if itf else None)
    config = str(config_dir or _host_value(host, "k3_config_dir") or DEFAULT_CONFIG_DIR)
    plan = fact_plan(sel, address, cdir, idir, config)
    extra = list(extra or [])
    try:
        with ctx_state.use(state), ctx_host.use(host):
            got = read_batch(state, host, [*(read.spec for read in plan), *extra])
    except ConnectError as exc:
        facts.unreachable = f"{LOST_CONNECTION}{exc}"
        return facts
    except Exception as exc:  # a dropped SSH channel, a timeout: every fact of this host failed
        reason = f"{type(exc).__name__}: {exc}"[:200]
        for read in plan:
            read.into(facts, FactError(kind="failed", tool=read.fact.tool, command=read.fact.shown_command,
                                       first_line=reason))
        facts.unreachable = None if plan else reason
        return facts
    for read in plan:
        read.into(facts, got[read.name])
    for name, _, _ in extra:
        facts.extra[name] = got[name]
    return facts


# ------------------------------------------------------------------------- local raw capture

#: every fact with the arguments used for a capture run: each pack's (its preflight side's ``capture``), then the
#: RDMA and the common ones
CAPTURE_FACTS: list[tuple[type[K3Fact[Any]], dict[str, Any]]] = [
    *(fact for checks in VENDOR_CHECKS.values() for fact in checks.capture),
    (rdma.RdmaDevices, {}),
    (rdma.KernelModules, {}),
    (rdma.DmabufPrerequisites, {}),
    (hostfacts.KernelVersion, {}),
    (hostfacts.DockerRuntime, {}),
    (hostfacts.ImageStoreFree, {}),
    (hostfacts.DiskFree, {"path": DEFAULT_CACHE_DIR}),
    (hostfacts.ShmSize, {}),
    (hostfacts.InterfaceForAddress, {"address": ""}),
]

#: plain commands whose output is also worth keeping from a real machine
CAPTURE_EXTRA = ["nvidia-smi", "nvidia-smi -L", "nvidia-smi --query-gpu=driver_version,name,memory.total,count "
                 "--format=csv,noheader", "nvidia-smi topo -m"]


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def capture_local(save: Path | None = None) -> dict[str, Any]:
    """Run every fact's command on this machine through pyinfra's ``@local`` connector; keep the raw
    output next to the parsed value."""
    quiet_pyinfra()
    inventory = Inventory((["@local"], {}))  # type: ignore[no-untyped-call]
    state = State(inventory=inventory, config=Config())  # type: ignore[no-untyped-call]
    host = inventory.get_host("@local")
    out: dict[str, Any] = {"facts": {}, "extra": {}}
    with ctx_state.use(state), ctx_host.use(host):
        host.connect(raise_exceptions=True)
        for cls, kwargs in CAPTURE_FACTS:
            fact = cls()
            command = fact.command(**kwargs)
            required = fact.requires_command(**kwargs)
            present = True
            if required:
                ok, probe = host.run_shell_command(StringCommand(f"command -v {required}"))
                present = ok
            if present:
                ok, output = host.run_shell_command(StringCommand(command))
                stdout, stderr = output.stdout_lines, output.stderr_lines
                parsed: Any = fact.process(stdout) if stdout else fact.default()
            else:
                ok, stdout, stderr, parsed = True, [], [], fact.default()
            key = cls.__name__ + "".join(f"[{k}={v}]" for k, v in kwargs.items() if v)
            out["facts"][key] = {
                "fact": cls.name,
                "command": command,
                "requires_command": required,
                "present": present,
                "success": ok,
                "stdout": stdout,
                "stderr": stderr,
                "parsed": _jsonable(parsed),
            }
            if save is not None:
                save.mkdir(parents=True, exist_ok=True)
                (save / f"{cls.__name__}.out").write_text("\n".join(stdout) + ("\n" if stdout else ""))
        for command in CAPTURE_EXTRA:
            ok, output = host.run_shell_command(StringCommand(command + " 2>&1"))
            out["extra"][command] = {"success": ok, "output": output.stdout_lines}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m k3deploy.preflight.runner",
                                     description="Capture every preflight fact on this machine.")
    parser.add_argument("--local", action="store_true", required=True, help="run on this machine (@local)")
    parser.add_argument("--json", action="store_true", help="print JSON (the default and only format)")
    parser.add_argument("--save", type=Path, help="also write each fact's raw stdout to DIR/<Fact>.out")
    args = parser.parse_args(argv)
    data = capture_local(args.save)
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
