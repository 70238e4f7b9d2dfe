"""Read a pyinfra inventory file the way ``pyinfra`` does, without connecting, and plan on it.

Example::

    >>> r = rollout_for_inventory("inventories/gb300.py")        # doctest: +SKIP
    >>> [(u.host, u.unit) for u in r.units]                       # doctest: +SKIP
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from k3deploy.cluster.binding import HostRecord
from k3deploy.cluster.variables import Variables, group_vars_dirs, merge_vars
from k3deploy.errors import K3Error


def load_records(spec: str) -> list[HostRecord]:
    """Hosts (name, groups, data) of an inventory file, read by pyinfra's own inventory loader."""
    from pyinfra.api import Config, State
    from pyinfra.context import ctx_config, ctx_state
    from pyinfra_cli.inventory import make_inventory

    if not Path(spec).is_file():
        raise K3Error(f"inventory file {spec!r} not found: pass a pyinfra inventory file (e.g. inventories/gb300.py)")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.append(cwd)
    state = State()
    config = Config()
    try:
        with ctx_state.use(state), ctx_config.use(config):
            inv = make_inventory(spec, cwd=cwd)
    except Exception as exc:  # the inventory file is user code
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise K3Error(f"cannot load inventory {spec!r}: {first}: fix the inventory file") from None
    return records_of(inv)


def records_of(inv: Any) -> list[HostRecord]:
    """Plain host records of a pyinfra inventory (connector groups such as ``@local`` left out)."""
    out = []
    for h in inv:
        groups = tuple(g for g in getattr(h, "groups", ()) if not g.startswith("@"))
        out.append(HostRecord(h.name, groups, dict(h.data.dict())))
    return out


def variables_for(records: list[HostRecord], inventory_file: str | None) -> Variables:
    dirs = group_vars_dirs(inventory_file)
    merged = [merge_vars(r.groups, r.data, dirs, source=f"host {r.name}: ") for r in records]
    if not merged:
        raise K3Error(f"inventory {inventory_file} has no hosts")
    first = merged[0]
    for r, v in zip(records, merged):
        for key in ("k3_hardware", "k3_strategy", "k3_variant", "k3_features", "k3_recipe", "k3_image"):
            if getattr(v, key) != getattr(first, key):
                raise K3Error(f"{key} differs between hosts ({records[0].name}: {getattr(first, key)!r}, "
                              f"{r.name}: {getattr(v, key)!r}): one deployment has one selection")
    if not first.k3_hardware:
        raise K3Error("k3_hardware is not set: set it in group_vars (e.g. group_vars/all.yml: k3_hardware: gb300)")
    return first


def plan_for(records: list[HostRecord], v: Variables) -> Any:
    from k3deploy import load_recipe, resolve

    recipe = load_recipe(v.k3_recipe)
    engines = [r for r in records if {"head", "workers"} & set(r.groups)]
    pools = {g: len([r for r in records if g in r.groups]) for g in ("prefill", "decode")}
    kwargs: dict[str, Any] = dict(hardware=v.k3_hardware, strategy=v.k3_strategy, variant=v.k3_variant,
                                  features=v.k3_features, image=v.k3_image, extra_args=v.k3_extra_args)
    if v.k3_strategy == "pd_cluster" or (not engines and pools["prefill"]):
        kwargs.update(strategy="pd_cluster", prefill_nodes=pools["prefill"], decode_nodes=pools["decode"])
    else:
        if not engines:
            raise K3Error("the inventory has no head group (and no prefill/decode groups): add a head group")
        kwargs["nodes"] = len(engines)
    from k3deploy.recipe.fixes import deployable

    return deployable(resolve(recipe, **kwargs))


def rollout_for_inventory(spec: str, *, ifaces: dict[str, str] | None = None,
                          host_env: dict[str, dict[str, str]] | None = None) -> Any:
    from k3deploy.cluster.rollout import compute

    records = load_records(spec)
    v = variables_for(records, spec)
    plan = plan_for(records, v)
    return compute(plan, records, v, ifaces=ifaces, host_env=host_env)
