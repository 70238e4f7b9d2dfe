"""Run the preflight facts on every host of a pyinfra inventory, through pyinfra's Python API.

All hosts are connected and read in parallel (gevent greenlets, like pyinfra's own fact
gathering); an unreachable host becomes a failed host with its connection error, the others are
still reported. Nothing on the hosts is changed.

One-shot capture of every fact on this machine (raw output + parsed value), e.g. to keep a real
GPU node's outputs as test fixtures::

    python -m k3deploy.preflight.runner --local --json [--save DIR]
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()  # before anything imports socket/ssl/threading: pyinfra's I/O runs in greenlets

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import ipaddress  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
from pyinfra.api import Config, Inventory, State, StringCommand  # noqa: E402
from pyinfra.api.exceptions import ConnectError  # noqa: E402
from pyinfra.api.facts import get_fact  # noqa: E402
from pyinfra.context import ctx_config, ctx_host, ctx_state  # noqa: E402

from k3deploy.errors import K3Error  # noqa: E402
from k3deploy.facts import amd, ascend, nvidia, rdma  # noqa: E402
from k3deploy.facts import host as hostfacts
from k3deploy.facts.base import FactError, K3Fact  # noqa: E402
from k3deploy.preflight.checks import (  # noqa: E402
    NVSWITCH_HARDWARE,
    CheckResult,
    HostFacts,
    Selection,
    failed_hosts,
    run_checks,
    summarize,
)
from k3deploy.preflight.settings import HostSettings, derive_settings  # noqa: E402

#: where weights are cached on a node (``k3_model_cache`` / ``--cache-dir`` override it); images are
#: measured in Docker's own DockerRootDir unless ``k3_image_dir`` / ``--image-dir`` name a directory
DEFAULT_CACHE_DIR = "/var/lib/k3deploy/cache"


# ---------------------------------------------------------------------------- inventory input


def load_inventory(spec: str) -> State:
    """A pyinfra state holding the inventory from a file, a host list or a connector (``@local``), read as
    the ``pyinfra`` command line reads it (group_data next to the file included)."""
    from pyinfra_cli.inventory import make_inventory

    if not ("@" in spec or "," in spec or Path(spec).exists()):
        raise K3Error(f"inventory {spec!r} not found: pass an inventory file (inventories/x.py), a host list "
                      "or @local")
    cwd = str(Path.cwd())
    if cwd not in sys.path:  # inventory files may import modules next to them, as with the pyinfra CLI
        sys.path.append(cwd)
    state = State()
    state.cwd = cwd
    config = Config()
    try:
        with ctx_state.use(state), ctx_config.use(config):
            inventory = make_inventory(spec, cwd=cwd)
            state.init(inventory, config)
    except K3Error:
        raise
    except Exception as exc:  # the inventory file is user code
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise K3Error(f"cannot load inventory {spec!r}: {first}: fix the inventory file") from None
    if len(inventory) == 0:
        raise K3Error(f"inventory {spec!r} has no hosts: add hosts to it")
    return state


def _host_value(host: Any, key: str) -> Any:
    return getattr(host.data, key, None)


def selection_from_inventory(
    inventory: Inventory,
    hardware: str | None = None,
    strategy: str | None = None,
    variant: str | None = None,
    nodes: int | None = None,
) -> Selection:
    """The planned selection: CLI values first, else the inventory's host/group data (``k3_hardware``,
    ``k3_strategy``, ``k3_variant``); every host must agree. Bad values raise :class:`K3Error`."""
    from k3deploy.recipe.schema import load_recipe
    from k3deploy.recipe.taxonomy import hardware as hardware_profiles
    from k3deploy.recipe.taxonomy import strategies as strategy_defs

    hosts = list(inventory)

    def pick(cli_value: str | None, key: str) -> str | None:
        if cli_value:
            return cli_value
        values = {h.name: _host_value(h, key) for h in hosts}
        distinct = {v for v in values.values() if v}
        if len(distinct) > 1:
            shown = ", ".join(f"{h}={v}" for h, v in values.items())
            raise K3Error(f"hosts disagree on {key} ({shown}): set one {key} for the whole inventory")
        return distinct.pop() if distinct else None

    profiles = hardware_profiles()
    hw_id = pick(hardware, "k3_hardware")
    if not hw_id:
        raise K3Error("no hardware given: set k3_hardware in the inventory's data or pass --hardware "
                      f"(one of {', '.join(sorted(profiles))})")
    hw_id = str(hw_id).lower()
    if hw_id not in profiles:
        raise K3Error(f"unknown hardware {hw_id!r}: choose one of {', '.join(sorted(profiles))}")
    profile = profiles[hw_id]
    if profile.brand not in ("NVIDIA", "AMD", "Huawei"):
        raise K3Error(f"hardware {hw_id!r} ({profile.brand}) has no preflight checks: use an NVIDIA, AMD or "
                      "Ascend profile")

    recipe = load_recipe()
    variant_key = pick(variant, "k3_variant") or "default"
    if variant_key not in recipe.variants:
        raise K3Error(f"unknown variant {variant_key!r}: choose one of {', '.join(recipe.variants)}")

    strategy_key = pick(strategy, "k3_strategy")
    known = strategy_defs()
    if strategy_key and strategy_key not in known:
        raise K3Error(f"unknown strategy {strategy_key!r}: choose one of {', '.join(sorted(known))}")
    strat = known.get(strategy_key) if strategy_key else None

    count = nodes if nodes is not None else len(hosts)
    if count < 1:
        raise K3Error(f"--nodes {count}: plan at least one node")
    return Selection(
        hardware=profile,
        variant=variant_key,
        vram_minimum_gb=recipe.variant(variant_key).vram_minimum_gb,
        nodes=count,
        strategy=strategy_key,
        multi_node=count > 1 or bool(strat and strat.multi_node),
        pd=bool(strat and strat.pd),
    )


def selection_for_plan(plan: Any, recipe_path: str | None = None) -> Selection:
    """What a resolved plan asks of the cluster (engine nodes only; the router needs no GPU)."""
    from k3deploy.recipe.schema import load_recipe
    from k3deploy.recipe.taxonomy import hardware as hardware_profiles

    engines = [n for n in plan.nodes if n.role != "router"]
    variant = load_recipe(recipe_path).variant(plan.variant)
    return Selection(hardware=hardware_profiles()[plan.hardware], variant=plan.variant,
                     vram_minimum_gb=variant.vram_minimum_gb, nodes=len(engines), strategy=plan.strategy,
                     multi_node=len(engines) > 1, pd=plan.strategy == "pd_cluster")


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

FactSpec = tuple[str, type[K3Fact], dict[str, Any]]


def fact_plan(sel: Selection, address: str, cache_dir: str, image_dir: str) -> list[FactSpec]:
    """Which facts to read on a host of this selection (attribute of HostFacts, fact, arguments)."""
    brand = sel.brand
    plan: list[FactSpec] = []
    if brand == "NVIDIA":
        plan += [
            ("gpus", nvidia.NvidiaGpus, {}),
            ("toolkit", nvidia.NvidiaContainerToolkit, {}),
        ]
        if sel.hardware.id in NVSWITCH_HARDWARE:
            plan.append(("fabric_manager", nvidia.FabricManager, {}))
        if getattr(sel.hardware, "nvl", False):
            plan.append(("fabric", nvidia.NvlinkFabric, {}))
            if sel.mnnvl:
                plan.append(("imex", nvidia.Imex, {}))
        if sel.needs_rdma:
            plan += [
                ("flavour", nvidia.NvidiaDriverFlavour, {}),
                ("modules", rdma.KernelModules, {}),
                ("dmabuf", rdma.DmabufPrerequisites, {}),
            ]
    elif brand == "AMD":
        plan += [
            ("amd_gpus", amd.AmdGpus, {}),
            ("amd_versions", amd.AmdSmiVersion, {}),
            ("rocm_driver", amd.RocmDriverVersion, {}),
        ]
    elif brand == "Huawei":
        plan += [("npu", ascend.NpuSmiInfo, {}), ("ascend", ascend.AscendVersions, {})]
    if sel.needs_rdma and brand != "Huawei":
        plan.append(("rdma", rdma.RdmaDevices, {}))
    plan += [
        ("kernel", hostfacts.KernelVersion, {}),
        ("runtime", hostfacts.DockerRuntime, {}),
        ("disk_images", hostfacts.DiskFree, {"path": image_dir}) if image_dir
        else ("disk_images", hostfacts.ImageStoreFree, {}),
        ("disk_cache", hostfacts.DiskFree, {"path": cache_dir}),
        ("shm", hostfacts.ShmSize, {}),
        ("interface", hostfacts.InterfaceForAddress, {"address": address}),
    ]
    return plan


# ------------------------------------------------------------------------------- collection


def _quiet_pyinfra() -> None:
    # pyinfra logs connection and fact errors itself; here they become results instead
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)


def _connect(host: Any) -> str | None:
    try:
        host.connect(raise_exceptions=True, show_errors=False)
    except ConnectError as exc:
        return str(exc.args[0]) if exc.args else "could not connect"
    except Exception as exc:  # paramiko/socket errors not wrapped by the connector
        return f"{type(exc).__name__}: {exc}"
    return None


def host_facts(state: State, host: Any, sel: Selection, cache_dir: str | None = None,
               image_dir: str | None = None) -> HostFacts:
    """Read the facts of one connected host (usable from a deploy file too: ``host_facts(state, host, sel)``).

    A lost connection marks the host unreachable; any other error while reading one fact becomes a
    failed fact, and the remaining facts are still read.
    """
    address = host_address(host)
    cdir = str(cache_dir or _host_value(host, "k3_model_cache") or DEFAULT_CACHE_DIR)
    idir = str(image_dir or _host_value(host, "k3_image_dir") or "")
    facts = HostFacts(host=host.name, address=address)
    for attr, cls, kwargs in fact_plan(sel, address, cdir, idir):
        try:
            with ctx_state.use(state), ctx_host.use(host):
                value = get_fact(state, host, cls, kwargs=kwargs, apply_failed_hosts=False)
        except ConnectError as exc:
            facts.unreachable = f"lost the connection while reading {cls.__name__}: {exc}"
            return facts
        except Exception as exc:  # a dropped SSH channel, a timeout: this fact fails, the others go on
            value = FactError(kind="failed", tool=cls.tool, command=cls.shown_command,
                              first_line=f"{type(exc).__name__}: {exc}"[:200])
        setattr(facts, attr, value)
    return facts


def _collect_host(state: State, host: Any, sel: Selection, cache_dir: str | None,
                  image_dir: str | None) -> HostFacts:
    reason = _connect(host)
    if reason is not None:
        return HostFacts(host=host.name, address=host_address(host), unreachable=reason)
    return host_facts(state, host, sel, cache_dir, image_dir)


def collect(state: State, sel: Selection, cache_dir: str | None = None,
            image_dir: str | None = None) -> list[HostFacts]:
    """Connect to every host of the state's inventory in parallel and read its facts, in inventory order."""
    _quiet_pyinfra()
    hosts = list(state.inventory)
    with ctx_state.use(state), ctx_config.use(state.config):
        jobs = [state.pool.spawn(_collect_host, state, host, sel, cache_dir, image_dir) for host in hosts]
        gevent.joinall(jobs)
    results: list[HostFacts] = []
    for host, job in zip(hosts, jobs):
        if job.successful():
            results.append(job.value)
        else:
            results.append(HostFacts(host=host.name, unreachable=f"preflight crashed: {job.exception}"))
    for host in hosts:
        if host.connected:
            try:
                host.disconnect()
            except Exception:
                pass
    return results


# ---------------------------------------------------------------------------------- report


@dataclass
class PreflightReport:
    selection: Selection
    hosts: list[HostFacts]
    results: list[CheckResult]
    settings: dict[str, HostSettings] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(r.status == "fail" for r in self.results)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        sel = self.selection
        hosts: dict[str, Any] = {}
        for f in self.hosts:
            data = dataclasses.asdict(f)
            name = data.pop("host")
            unreachable = data.pop("unreachable")
            address = data.pop("address")
            data.pop("extra")
            s = self.settings.get(name)
            hosts[name] = {
                "address": address,
                "reachable": unreachable is None,
                "error": unreachable,
                "ok": not any(r.status == "fail" and r.host == name for r in self.results),
                "results": [dataclasses.asdict(r) for r in self.results if r.host == name],
                "settings": dict(s.env) if s else {},
                "settings_reasons": dict(s.reasons) if s else {},
                "peermem_required": bool(s and s.peermem_required),
                "facts": {k: v for k, v in data.items() if v is not None},
            }
        return {
            "selection": {
                "hardware": sel.hardware.id,
                "strategy": sel.strategy,
                "variant": sel.variant,
                "nodes": sel.nodes,
                "vram_minimum_gb": sel.vram_minimum_gb,
            },
            "ok": self.ok,
            "summary": summarize(self.results),
            "failed_hosts": failed_hosts(self.results),
            "hosts": hosts,
            "cluster": [dataclasses.asdict(r) for r in self.results if r.host == "cluster"],
        }


def run_preflight(
    inventory_spec: str,
    hardware: str | None = None,
    strategy: str | None = None,
    variant: str | None = None,
    nodes: int | None = None,
    cache_dir: str | None = None,
    image_dir: str | None = None,
) -> PreflightReport:
    state = load_inventory(inventory_spec)
    if Path(inventory_spec).is_file() and not (hardware and strategy):
        # the deployment's own selection: group_vars/*.yml and the inventory's groups, as deploy/k3.py reads them
        from k3deploy.cluster.inventory import load_records, plan_for, variables_for

        records = load_records(inventory_spec)
        deployment = any({"head", "prefill"} & set(r.groups) for r in records)
        v = variables_for(records, inventory_spec) if deployment and not hardware else None
        if v is not None:
            if strategy or variant:
                v = v.model_copy(update={k: val for k, val in (("k3_strategy", strategy), ("k3_variant", variant)) if val})
            plan = plan_for(records, v)
            sel = selection_for_plan(plan, v.k3_recipe)
            if nodes is not None:
                sel = dataclasses.replace(sel, nodes=nodes, multi_node=nodes > 1 or sel.multi_node)
            cache_dir = cache_dir or v.k3_model_cache
            facts = collect(state, sel, cache_dir, image_dir)
            results = run_checks(sel, facts)
            settings = {f.host: derive_settings(sel, f) for f in facts}
            return PreflightReport(selection=sel, hosts=facts, results=results, settings=settings)
    sel = selection_from_inventory(state.inventory, hardware, strategy, variant, nodes)
    facts = collect(state, sel, cache_dir, image_dir)
    results = run_checks(sel, facts)
    settings = {f.host: derive_settings(sel, f) for f in facts}
    return PreflightReport(selection=sel, hosts=facts, results=results, settings=settings)


# ------------------------------------------------------------------------- local raw capture

#: every fact with the arguments used for a capture run
CAPTURE_FACTS: list[tuple[type[K3Fact], dict[str, Any]]] = [
    (nvidia.NvidiaGpus, {}),
    (nvidia.NvidiaDriverFlavour, {}),
    (nvidia.NvidiaContainerToolkit, {}),
    (nvidia.FabricManager, {}),
    (nvidia.Imex, {}),
    (nvidia.NvlinkFabric, {}),
    (rdma.RdmaDevices, {}),
    (rdma.KernelModules, {}),
    (rdma.DmabufPrerequisites, {}),
    (amd.AmdSmiVersion, {}),
    (amd.RocmDriverVersion, {}),
    (amd.AmdGpus, {}),
    (ascend.NpuSmiInfo, {}),
    (ascend.AscendVersions, {}),
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
    _quiet_pyinfra()
    inventory = Inventory((["@local"], {}))
    state = State(inventory=inventory, config=Config())
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
