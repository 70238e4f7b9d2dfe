"""The deployment pipeline's pure steps: inventory records -> variables -> requirements -> plan -> rollout.

Every entry point (``deploy/k3.py``, ``k3deploy plan``, ``preflight``, ``runbook``, ``resolve --inventory``) goes
through :func:`target` and :func:`desired_rollout`; :mod:`k3deploy.runtime.gather` adds what only the hosts can
tell (facts, derived settings, installed files) around them. Nothing here reads a host. The recipe is read once, by
:func:`target` (``Target.recipe``), and the plan laid out on the hosts once (``Target.layout``); the rollout is
rendered from that layout (:func:`desired_rollout`).

Example::

    >>> from k3deploy.model.binding import HostRecord
    >>> hosts = [HostRecord("n1", ("head",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.1"}),
    ...          HostRecord("n2", ("workers",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.2"})]
    >>> wanted = target(hosts, None)
    >>> wanted.plan.strategy, [u.host for u in desired_rollout(wanted).units]
    ('multi_node_tp', ['n1', 'n2'])
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from k3deploy.errors import K3Error, SelectionError
from k3deploy.model.binding import HostRecord
from k3deploy.model.inventory import engine_count, plan_for, variables_for, with_roles
from k3deploy.model.requirements import Requirements
from k3deploy.model.rollout import Placement, Rollout, lay_out, render
from k3deploy.model.secrets import argv_secret
from k3deploy.model.variables import Resolved, Variables, shown_path
from k3deploy.recipe import fit, load_recipe
from k3deploy.recipe.fit import did_you_mean
from k3deploy.recipe.offering import hardware_profile
from k3deploy.recipe.plan import Plan
from k3deploy.recipe.schema import Recipe
from k3deploy.recipe.taxonomy import strategies


@dataclass(frozen=True)
class Target:
    """What an inventory asks for, before any host is read.

    ``plan`` is None when the selection is valid but the plan cannot be made for these hosts (a node count the
    strategy does not take, a missing rank, ...); ``plan_error`` then says why. The preflight still checks the
    hosts against ``requirements``; everything that changes hosts calls :meth:`require_plan`. ``recipe`` is the
    recipe the variables name, read once; ``layout`` the plan bound to the hosts, its files not rendered yet
    (:func:`k3deploy.model.rollout.lay_out`; None without a plan).
    """

    inventory: str | None
    records: list[HostRecord]
    vars: Variables
    recipe: Recipe
    requirements: Requirements
    plan: Plan | None
    plan_error: str | None = None
    resolved: dict[str, Resolved] = field(default_factory=dict)   # host -> its variables and their sources
    layout: Placement | None = None
    overrides: Mapping[str, Any] | None = None   # what the command put over the variables (e.g. --rollback)

    def source(self, key: str) -> str:
        """Where the deployment's value of ``key`` came from (its first host's)."""
        first = self.resolved.get(self.records[0].name) if self.records else None
        return first.source(key) if first else "default"

    def host_vars(self, name: str) -> Variables:
        """The variables of host ``name`` (the deployment's where the host has none of its own)."""
        return self.resolved[name].vars if name in self.resolved else self.vars

    def require_plan(self) -> Plan:
        if self.plan is None:
            raise K3Error(self.plan_error or "no plan")
        return self.plan

    def require_layout(self) -> Placement:
        self.require_plan()
        if self.layout is None:
            raise K3Error("no layout")  # unreachable: a target with a plan has its layout
        return self.layout

    def with_image(self, image: str) -> Target:
        """The same target running ``image`` (the build its tag was pinned to)."""
        plan = self.require_plan().model_copy(update={"image": image})
        return replace(self, plan=plan, layout=replace(self.require_layout(), plan=plan))

    def with_router_image(self, image: str) -> Target:
        """The same target whose router runs ``image`` (the build ``k3_router_image``'s tag was pinned to)."""
        layout = self.require_layout()
        variables = self.vars.model_copy(update={"k3_router_image": image})
        return replace(self, vars=variables,
                       layout=replace(layout, vars=layout.vars.model_copy(update={"k3_router_image": image})))


def _requirements(variables: Variables, nodes: int, recipe: Recipe) -> Requirements:
    """Requirements from the variables alone; raises for an unknown hardware, variant or strategy."""
    hw = hardware_profile(str(variables.k3_hardware), recipe)
    if variables.k3_variant not in recipe.variants:
        raise SelectionError(f"unknown variant {variables.k3_variant!r} in recipe {recipe.slug}: choose one of "
                             f"{', '.join(recipe.variants)}")
    known = strategies()
    if variables.k3_strategy is not None and variables.k3_strategy not in known:
        raise SelectionError(f"unknown strategy {variables.k3_strategy!r}: choose one of {', '.join(sorted(known))}"
                             + did_you_mean(variables.k3_strategy, known))
    strat = known.get(variables.k3_strategy) if variables.k3_strategy else None
    return Requirements(hardware=hw, variant=variables.k3_variant,
                        vram_minimum_gb=recipe.variant(variables.k3_variant).vram_minimum_gb, nodes=nodes,
                        strategy=variables.k3_strategy, multi_node=nodes > 1 or bool(strat and strat.multi_node),
                        pd=bool(strat and strat.pd),
                        expert_parallel_across_nodes=bool(strat and strat.expert_parallel_across_nodes and nodes > 1))


def requirements_of(plan: Plan, recipe: Recipe) -> Requirements:
    """What a resolved plan asks of the cluster (engine nodes only)."""
    engines = len([n for n in plan.nodes if n.role != "router"])
    strat = strategies()[plan.strategy]
    return Requirements(hardware=hardware_profile(plan.hardware, recipe), variant=plan.variant,
                        vram_minimum_gb=recipe.variant(plan.variant).vram_minimum_gb,
                        nodes=engines, strategy=plan.strategy, multi_node=engines > 1,
                        pd=plan.strategy == "pd_cluster",
                        one_nvlink_domain=strat.tensor_parallel_across_nodes or strat.pd,
                        expert_parallel_across_nodes=expert_parallel_across_nodes(plan))


def nvlink_groups(layout: Placement) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The groups whose hosts share one NVLink domain when the strategy wants one (tensor parallelism across
    trays): each engine group (each replica its own), a P/D cluster's pools as one (their KV transfer).

    >>> from k3deploy.model.binding import HostRecord
    >>> hosts = [HostRecord(f"n{i}", ("head" if i % 2 == 0 else "workers",),
    ...                     {"k3_hardware": "gb300", "k3_ip": f"10.0.0.{i + 1}", "k3_replica": i // 2, "rank": i % 2})
    ...          for i in range(4)]
    >>> nvlink_groups(target(hosts, None).require_layout())
    (('engine-r0', ('n0', 'n1')), ('engine-r1', ('n2', 'n3')))
    """
    engines = [g for g in layout.groups if g != "router"]
    hosts = {g: tuple(dict.fromkeys(u.host for u in layout.group(g))) for g in engines}
    if layout.plan.strategy == "pd_cluster":
        return (("+".join(engines), tuple(dict.fromkeys(h for g in engines for h in hosts[g]))),)
    return tuple((g, hosts[g]) for g in engines)


def expert_parallel_across_nodes(plan: Plan) -> bool:
    """An expert-parallel group of the plan spans nodes: an engine with ``--enable-expert-parallel`` in a group (the
    nodes of a multi-node strategy, or a P/D pool) of more than one node.

    >>> from k3deploy import load_recipe, resolve
    >>> expert_parallel_across_nodes(resolve(load_recipe(), hardware="h200", strategy="multi_node_tep"))
    True
    >>> expert_parallel_across_nodes(resolve(load_recipe(), hardware="gb300", strategy="multi_node_tp"))
    False
    """
    engines = [n for n in plan.nodes if n.role != "router"]
    return any("--enable-expert-parallel" in n.argv and (n.pool_nodes or len(engines)) > 1 for n in engines)


#: lint codes for argv the pinned engine's parser refuses before the engine starts
ARGV_CODES = frozenset({"flag-unknown", "flag-value", "arg-positional"})


def extra_args_findings(records: list[HostRecord], variables: Variables, plan: Plan, source: str,
                        recipe: Recipe) -> list[Any]:
    """The lint findings ``k3_extra_args`` bring: those of ``plan`` that the plan without them does not have, each
    attributed to the variable and the file that set it (``source``), not to a recipe key."""
    from dataclasses import replace as with_path

    from k3deploy.recipe.lint import lint_plan

    def unplaced(f: Any) -> tuple[str, str, str, str]:
        return (f.severity, f.code, f.message, f.fix)

    before = {unplaced(f) for f in lint_plan(recipe, plan_for(records, variables.model_copy(
        update={"k3_extra_args": []}), recipe))}
    return [with_path(f, path=f"k3_extra_args ({source})") for f in lint_plan(recipe, plan)
            if unplaced(f) not in before]


def check_extra_args(records: list[HostRecord], variables: Variables, plan: Plan, source: str,
                     recipe: Recipe) -> list[str]:
    """Refuse ``k3_extra_args`` that the pinned engine would not start with: one word holding a flag and its value,
    or an argv error (unknown flag, bad value, stray word) that the plan without them does not have. Returns the
    warnings they bring (an abbreviated flag, a deprecated one, ...), one line each naming the file that set them.

    >>> args = {"k3_hardware": "gb300", "k3_extra_args": ["--max-num-seq", "64"]}
    >>> hosts = [HostRecord("n1", ("head",), {**args, "k3_ip": "10.0.0.1"}),
    ...          HostRecord("n2", ("workers",), {**args, "k3_ip": "10.0.0.2"})]
    >>> target(hosts, None).plan.warnings  # doctest: +ELLIPSIS
    ['k3_extra_args (inventory): --max-num-seq is an abbreviation argparse expands to --max-num-seqs: write...']
    """
    for item in variables.k3_extra_args:
        if item.startswith("-") and any(c.isspace() for c in item.split("=", 1)[0].strip()):
            words = item.split(None, 1)
            raise K3Error(f"k3_extra_args ({source}): {item!r} is one argv word holding a space, which vLLM does "
                          f"not split: write it as two items, {words!r}")
    found = extra_args_findings(records, variables, plan, source, recipe)
    new = [f for f in found if f.severity == "error" and f.code in ARGV_CODES]
    if new:
        more = f" (and {len(new) - 1} more: k3deploy lint --inventory)" if len(new) > 1 else ""
        raise K3Error(f"k3_extra_args ({source}): {new[0].message}: {new[0].fix}{more}")
    return [f"k3_extra_args ({source}): {f.message}: {f.fix}" for f in found if f.severity == "warning"]


def check_control_files(variables: Variables, source: Callable[[str], str]) -> None:
    """The files the variables name on the control machine exist and are what they must be (the token 0600, an
    image archive a file, a weights source a Hugging Face cache directory of one model)."""
    def bad(name: str, why: str, fix: str) -> K3Error:
        return K3Error(f"{name}: {getattr(variables, name)} ({source(name)}) {why}: {fix}")

    if variables.k3_hf_token_file:
        token = Path(variables.k3_hf_token_file)
        if not token.is_file():
            raise bad("k3_hf_token_file", "is not a file", "write the token there (mode 0600) or unset it")
        if token.stat().st_mode & 0o077:
            raise bad("k3_hf_token_file", f"has mode {token.stat().st_mode & 0o777:04o}; a token must be readable "
                      "by its owner only", f"chmod 600 {token}")
    api_key(variables, source)
    if variables.k3_image_archive and not Path(variables.k3_image_archive).is_file():
        raise bad("k3_image_archive", "is not a file", "give the path of a `docker save` archive of the image")
    if variables.k3_weights_source:
        src = Path(variables.k3_weights_source)
        if not (src / "refs" / "main").is_file() or not (src / "snapshots").is_dir():
            raise bad("k3_weights_source", "is not a model's Hugging Face cache directory (refs/main, snapshots/)",
                      "give the models--ORG--NAME directory that `hf download` filled")


def api_key(variables: Variables, source: Callable[[str], str]) -> str | None:
    """The API key ``k3_api_key_file`` holds (None: no key file), checked: a file of mode 0600 holding one line of
    printable characters without spaces (a trailing newline is not part of the key). Each refusal is one line that
    names the file and the fix, never the key."""
    if not variables.k3_api_key_file:
        return None
    path = Path(variables.k3_api_key_file)
    where = f"k3_api_key_file: {path} ({source('k3_api_key_file')})"
    if not path.is_file():
        raise K3Error(f"{where} is not a file: write the key there (one line, mode 0600) or unset k3_api_key_file")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise K3Error(f"{where} has mode {mode:04o}; a key must be readable by its owner only: chmod 600 {path}")
    try:
        key = path.read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
    except (OSError, UnicodeDecodeError) as exc:
        raise K3Error(f"{where} cannot be read ({type(exc).__name__}): write the key there as one line of text, "
                      "mode 0600") from None
    if not key:
        raise K3Error(f"{where} is empty: write the key there (one line, mode 0600)")
    if len(key) > 4096 or any(c.isspace() or not c.isprintable() for c in key):
        what = "more than 4096 characters" if len(key) > 4096 else "a space, a control character or a second line"
        raise K3Error(f"{where} holds {what}: a key is one line of printable characters without spaces (write only "
                      "the key)")
    return key


#: the fix ``resolve`` names in its own terms (command-line flags), cut off where an inventory's hosts fix the sizes
_CLI_FIX = re.compile(r": (use|pass|give) [^:]*$")


def in_inventory(exc: SelectionError, records: list[HostRecord], variables: Variables, recipe: Recipe,
                 first: Resolved, inventory_file: str | None) -> SelectionError:
    """A selection that does not fit an inventory's hosts, said in the inventory's terms: the variable and the file
    that sets it, the group to add hosts to, and which strategies fit these hosts (not ``resolve``'s flags)."""
    engines = engine_count(records) or len(records)
    hw = str(variables.k3_hardware)
    variant = variables.k3_variant
    src = first.source("k3_strategy")
    if src == "default":
        where = (shown_path(Path(inventory_file).resolve().parent / "group_vars" / "all.yml") if inventory_file
                 else "group_vars/all.yml next to the inventory")
    else:
        where = src
    groups = {g for r in records for g in r.groups}
    pools = {g: len([r for r in records if g in r.groups]) for g in ("prefill", "decode")}
    reason = _CLI_FIX.sub("", str(exc))
    reason = re.sub(r"--(prefill-|decode-)?nodes (\d+)", lambda m: f"{m.group(2)} host(s) in "
                    + (f"`{m.group(1)[:-1]}`" if m.group(1) else "the engine groups"), reason)
    if "prefill" in groups or "decode" in groups or variables.k3_strategy == "pd_cluster":
        p, d = pools["prefill"], pools["decode"]
        smallest = fit.pd_sizes(recipe, hw, max(p, 1), max(d, 1), variant)
        if smallest is None:
            return SelectionError(f"{reason}; no P/D pools of {hw} fit up to 16 nodes: set k3_strategy in {where}")
        adds = [f"{n - have} host(s) to `{g}`" for g, n, have in (("prefill", smallest[0], p),
                                                                   ("decode", smallest[1], d)) if n > have]
        fix = (f"add {' and '.join(adds)} in {inventory_file or 'the inventory'}" if adds else
               f"set k3_strategy in {where}")
        return SelectionError(f"{reason}: {fix} (pools of {smallest[0]} prefill and {smallest[1]} decode hosts fit)")
    fitting = fit.fitting(recipe, hw, engines, variant)
    hosts = f"{engines} engine host{'s' if engines != 1 else ''} (head + workers)"
    if fitting:
        return SelectionError(f"{reason}; strategies that fit this inventory's {hosts}: {', '.join(fitting)}: set "
                              f"`k3_strategy: {fitting[0]}` in {where}")
    sizes = fit.sizes_text(fit.sizes_that_fit(recipe, hw, variant))
    return SelectionError(f"{reason}: no strategy of {recipe.slug} fits this inventory's {hosts} of {hw}; sizes "
                          f"that fit: {sizes}: add hosts to `workers` in {inventory_file or 'the inventory'}")


def target(records: list[HostRecord], inventory_file: str | None,
           overrides: Mapping[str, Any] | None = None) -> Target:
    """Variables, requirements and plan of an inventory's hosts, the recipe read once and the plan laid out on the
    hosts. Raises :class:`K3Error` for bad variables or an unknown selection; a plan that does not fit the hosts is
    kept as ``plan_error``."""
    recs = with_roles(records)
    resolved = variables_for(recs, inventory_file, overrides)
    # a host's replica may come from group_vars too: the binding reads it from the record
    recs = [replace(r, data={**r.data, "k3_replica": resolved[r.name].vars.k3_replica}) for r in recs]
    variables = resolved[recs[0].name].vars
    check_control_files(variables, resolved[recs[0].name].source)
    recipe = load_recipe(variables.k3_recipe)
    hw_from = resolved[recs[0].name].source("k3_hardware")
    try:
        base = replace(_requirements(variables, engine_count(recs) or len(recs), recipe), hardware_from=hw_from,
                       imex_per_job=variables.k3_imex == "per_job")
    except SelectionError as exc:
        key = next((k for k in ("hardware", "variant", "strategy") if str(exc).startswith(f"unknown {k}")), None)
        if key is None:
            raise
        raise SelectionError(f"k3_{key} ({resolved[recs[0].name].source(f'k3_{key}')}): {exc}") from None
    try:
        try:
            plan = plan_for(recs, variables, recipe)
        except SelectionError as exc:
            raise in_inventory(exc, recs, variables, recipe, resolved[recs[0].name], inventory_file) from None
        # ranks, groups and counts checked before any fact
        layout = lay_out(plan, recs, variables, api_key(variables, resolved[recs[0].name].source))
    except K3Error as exc:
        return Target(inventory_file, recs, variables, recipe, base, None, str(exc), resolved, overrides=overrides)
    for node in plan.nodes:   # k3_extra_args were checked with the variables; a recipe's own argv is checked here
        if (found := argv_secret(node.argv)) is not None:
            raise K3Error(f"k3_recipe ({resolved[recs[0].name].source('k3_recipe')}): the {node.role} argv's "
                          f"{found[1]} carries a secret (seen by ps on the nodes, written into their 0644 unit files):"
                          " remove it from the recipe; the API key goes in a 0600 file named by k3_api_key_file")
    if variables.k3_extra_args:
        lines = [w for w in dict.fromkeys(check_extra_args(recs, variables, plan, resolved[recs[0].name].source(
            "k3_extra_args"), recipe)) if w not in plan.warnings]
        if lines:   # shown by the deploy, plan and resolve with the plan's own warnings
            plan = plan.model_copy(update={"warnings": [*plan.warnings, *lines]})
            layout = replace(layout, plan=plan)
    need = replace(requirements_of(plan, recipe), hardware_from=hw_from, image=plan.image,
                   imex_per_job=variables.k3_imex == "per_job", groups=nvlink_groups(layout),
                   spares=tuple(layout.spares))
    return Target(inventory_file, recs, variables, recipe, need, plan, None, resolved, layout, overrides)


def desired_rollout(wanted: Target, *, ifaces: Mapping[str, str] | None = None,
                    host_env: Mapping[str, Mapping[str, str]] | None = None) -> Rollout:
    """The rollout of a target: every unit and env file of its layout rendered, with the settings derived from each
    host's facts (``host_env``; interfaces in ``ifaces``) when they are known."""
    return render(wanted.require_layout(), ifaces=ifaces, host_env=host_env)
