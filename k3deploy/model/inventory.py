"""An inventory as k3deploy reads it: plain host records, their roles, the deployment's variables and its plan.

Pure: the caller loads the pyinfra inventory (:func:`k3deploy.runtime.connections.load_inventory`) and passes its
hosts; nothing here connects to a host.

Roles come from the inventory's groups: ``head`` and ``workers`` for single- and multi-node strategies,
``prefill``/``decode``/``router`` for ``pd_cluster``. A bare host list (no such group anywhere, e.g. ``@local``
or ``host1,host2``) is read as the head followed by its workers, in inventory order. Hosts of the group ``spares``
have no role: they stand by for a lost member (:mod:`k3deploy.model.spares`).

Example::

    >>> recs = with_roles([HostRecord("a", (), {}), HostRecord("b", (), {})])
    >>> [(r.name, r.groups) for r in recs]
    [('a', ('head',)), ('b', ('workers',))]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from k3deploy.errors import K3Error
from k3deploy.model.binding import HostRecord, replica_of
from k3deploy.model.variables import (
    MAX_ARGV,
    Resolved,
    Variables,
    address_error,
    group_vars_dirs,
    merge_vars,
    name_in_path_error,
    reader,
)
from k3deploy.recipe.plan import Plan

if TYPE_CHECKING:
    from k3deploy.recipe.schema import Recipe

ROLE_GROUPS = ("head", "workers", "prefill", "decode", "router")
#: the group of the hosts that stand by for a lost member (same hardware; staged, run nothing)
SPARES = "spares"
#: the variables every host of one deployment must agree on
SELECTION_KEYS = ("k3_hardware", "k3_strategy", "k3_variant", "k3_features", "k3_recipe", "k3_image")


def records_of(inv: Iterable[Any]) -> list[HostRecord]:
    """Plain host records of a pyinfra inventory (connector groups such as ``@local`` left out), with where the
    inventory set each key: ``--data``, the host's own data, or a group's data (inline or ``group_data/*.py``)."""
    out = []
    for h in inv:
        groups = tuple(g for g in getattr(h, "groups", ()) if not g.startswith("@"))
        origins: dict[str, str] = {}
        source = getattr(h, "inventory", None)
        if source is not None:
            for g in getattr(h, "groups", ()):
                origins.update({k: f"inventory group {g}" for k in source.get_group_data(g)})
            origins.update({k: f"inventory host {h.name}" for k in source.get_host_data(h.name)})
            origins.update({k: "--data" for k in source.get_override_data()})
        out.append(HostRecord(h.name, groups, dict(h.data.dict()), origins))
    return out


def with_roles(records: list[HostRecord]) -> list[HostRecord]:
    """The records with their roles: unchanged when any host is in a role group, else head + workers (the hosts of
    ``spares`` keep none). A host in ``spares`` and in a role group is refused.

    >>> [r.groups for r in with_roles([HostRecord("a", (), {}), HostRecord("s", ("spares",), {}),
    ...                                HostRecord("b", (), {})])]
    [('head',), ('spares',), ('workers',)]
    """
    for r in records:
        both = [g for g in r.groups if g in ROLE_GROUPS]
        if SPARES in r.groups and both:
            raise K3Error(f"host {r.name} is in group {SPARES} and in {', '.join(both)}: a spare runs nothing until "
                          f"it takes a lost member's place; put it in one of them")
    if any(set(ROLE_GROUPS) & set(r.groups) for r in records):
        return records
    engines = [r.name for r in records if SPARES not in r.groups]
    return [r if SPARES in r.groups else
            HostRecord(r.name, (*r.groups, "head" if r.name == engines[0] else "workers"), r.data, r.origins)
            for r in records]


def host_variables(records: list[HostRecord], inventory_file: str | None,
                   overrides: Mapping[str, Any] | None = None) -> dict[str, Resolved]:
    """Each host's variables and connection settings, with where each value came from: group_vars and the
    inventory's data merged per host (``overrides`` on top, e.g. a CLI's ``--hardware``). Host and group names that
    are not plain names (they become paths) are refused."""
    if not records:
        raise K3Error(f"inventory {inventory_file} has no hosts: add hosts to it")
    dirs = group_vars_dirs(inventory_file)
    for r in records:
        if not (r.data.get("k3_ip") or r.data.get("ssh_hostname") or r.name.startswith("@")):
            if why := address_error(r.name):   # the host name is its address
                raise K3Error(f"host {r.name!r}: {why}: name the host by its address or set k3_ip")
        if why := name_in_path_error("host", r.name):
            raise K3Error(why)
        for g in r.groups:
            if why := name_in_path_error("group", g):
                raise K3Error(f"host {r.name}: {why}")
    read = reader()
    return {r.name: merge_vars(r.groups, r.data, dirs, source=f"host {r.name}: ", overrides=overrides,
                               origins=r.origins, read=read) for r in records}


def variables_for(records: list[HostRecord], inventory_file: str | None,
                  overrides: Mapping[str, Any] | None = None) -> dict[str, Resolved]:
    """Every host's variables (:func:`host_variables`); every host must agree on the selection."""
    out = host_variables(records, inventory_file, overrides)
    first = out[records[0].name]
    for r in records:
        res = out[r.name]
        for key in SELECTION_KEYS:
            if getattr(res.vars, key) != getattr(first.vars, key):
                raise K3Error(f"hosts disagree on {key} ({records[0].name}: {getattr(first.vars, key)!r} from "
                              f"{first.source(key)}, {r.name}: {getattr(res.vars, key)!r} from {res.source(key)}): "
                              f"one deployment has one selection; set {key} once in group_vars")
    if not first.vars.k3_hardware:
        where = " or ".join(first.files[-1:]) or "group_vars/all.yml next to the inventory"
        raise K3Error(f"k3_hardware is not set: set it in {where} (e.g. k3_hardware: gb300)")
    return out


def engine_count(records: list[HostRecord]) -> int:
    """How many hosts of one engine group (one replica) run an engine (the router needs no GPU)."""
    return len([r for r in records if {"head", "workers", "prefill", "decode"} & set(r.groups)
                and replica_of(r) == 0])


def plan_for(records: list[HostRecord], variables: Variables, recipe: Recipe | None = None) -> Plan:
    """The deployable plan of these hosts: node count and pool sizes from the groups, the rest from ``variables``
    (the recipe it names read here unless given)."""
    from k3deploy.recipe import load_recipe
    from k3deploy.recipe.fixes import deployable
    from k3deploy.recipe.resolve import resolve

    recipe = recipe if recipe is not None else load_recipe(variables.k3_recipe)
    engines = [r for r in records if {"head", "workers"} & set(r.groups) and replica_of(r) == 0]
    pools = {g: len([r for r in records if g in r.groups]) for g in ("prefill", "decode")}
    kwargs: dict[str, Any] = dict(hardware=variables.k3_hardware, strategy=variables.k3_strategy,
                                  variant=variables.k3_variant, features=variables.k3_features,
                                  image=variables.k3_image, extra_args=variables.k3_extra_args)
    if variables.k3_strategy == "pd_cluster" or (not engines and pools["prefill"]):
        kwargs.update(strategy="pd_cluster", prefill_nodes=pools["prefill"], decode_nodes=pools["decode"])
    else:
        if not engines:
            raise K3Error("the inventory has no head group (and no prefill/decode groups): add a head group")
        kwargs["nodes"] = len(engines)   # one replica's hosts: every replica runs the same plan
    plan = deployable(resolve(recipe, **kwargs))
    for node in plan.nodes:
        size = sum(len(word) + 1 for word in node.argv)
        if size > MAX_ARGV:
            raise K3Error(f"the argv of {node.role} rank {node.rank} is {size} characters long, over the limit of "
                          f"{MAX_ARGV}: shorten k3_extra_args")
    return plan
