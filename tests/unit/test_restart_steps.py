"""The restart as one list of actions (:func:`k3deploy.model.steps.restart`): its order, its conditions and its
barriers, for the systemd units and for Slurm jobs alike; the runbook renders one step of it
(:func:`k3deploy.model.steps.start_of`), and the whole rollout's steps (:func:`k3deploy.model.steps.rollout`) are
what both the runbook and the deploy's operations render."""

from __future__ import annotations

from helpers import present
from helpers.pyinfra_state import cli_state
from k3deploy.model import commands, steps
from k3deploy.model.binding import HostRecord
from k3deploy.model.observed import Installed
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import Rollout, mark_changes, sha256


def replicas(r: int, per: int, **data: object) -> list[HostRecord]:
    return [HostRecord(f"r{i}n{j}", ("head",) if j == 0 else ("workers",),
                       {"k3_ip": f"192.0.2.{10 * i + j + 10}", "rank": j, "k3_replica": i, "k3_hardware": "gb300",
                        **data}) for i in range(r) for j in range(per)]


def installed_as(r: Rollout) -> dict[tuple[str, str], Installed]:
    return {(u.host, u.unit): Installed(unit_sha=sha256(u.unit_text), env_sha=sha256(u.env_text), active="active")
            for u in r.units}


def rolling_change() -> Rollout:
    before = desired_rollout(target(replicas(3, 2), None))
    after = desired_rollout(target(replicas(3, 2, k3_extra_env={"FOO": "1"}), None))
    after = after.decided(mark_changes(after, installed_as(before)))
    assert after.rolling
    return after


def test_a_first_rollout_starts_heads_then_workers_then_the_router_once_the_engines_serve():
    r = desired_rollout(target(replicas(2, 2), None))
    r = r.decided(mark_changes(r, {}))
    stopped = frozenset((u.host, u.unit) for u in r.units)   # a fresh cluster: nothing runs
    actions = steps.restart(r, steps.UNITS, steps.Decisions(stopped=stopped))
    # (the router's host writes its worker file, listing every replica, before anything starts)
    assert [(a.kind, a.hosts) for a in actions][0] == ("swap", ["r0n0"])
    # then each group marked current on every host (a barrier each) once it serves
    assert [(a.kind, a.role, a.barrier, a.when) for a in actions[-3:]] == [
        ("current", "", True, (steps.Keeps(g),)) for g in r.groups]
    actions = actions[1:-3]
    assert [(a.kind, a.role) for a in actions] == [
        ("start", "heads"), ("start", "workers"), ("gate", ""), ("start", "routers"), ("gate", "")]
    heads, workers, gate, router, router_gate = actions
    assert heads.hosts == ["r0n0", "r1n0"] and workers.hosts == ["r0n1", "r1n1"]
    assert all(p.joins for p in workers.parts)   # each worker waits for its head's rendezvous port
    # the router starts only once every engine group serves, and its host waits for them too
    assert router.when == router_gate.when == (steps.Serves(("engine-r0", "engine-r1")),)
    assert "r0n0" in gate.hosts and set(present(gate.on("r0n0")).groups) == {"engine-r0", "engine-r1"}


def test_a_running_cluster_is_stopped_routers_then_workers_then_heads_before_the_swap():
    r = desired_rollout(target(replicas(1, 2), None))
    r = r.decided(mark_changes(r, {}))
    kinds = [(a.kind, a.role) for a in steps.restart(r, steps.UNITS)]
    assert kinds[:4] == [("stop", "workers"), ("stop", "heads"), ("start", "heads"), ("start", "workers")]
    changes = {(u.host, u.unit): ((f"{u.unit_path}.next", u.unit_path),) for u in r.units}
    order = [a.kind for a in steps.restart(r, steps.UNITS, steps.Decisions(changes=changes))]
    assert order.index("swap") == order.index("stop") + 2 and order.index("swap") < order.index("start")


def test_a_roll_is_bounded_by_barriers_and_each_step_waits_for_the_one_before():
    r = rolling_change()
    actions = steps.restart(r, steps.UNITS)
    waves = r.waves()
    assert len(waves) == 3
    for i, wave in enumerate(waves):
        mine = [a for a in actions if a.wave == i]
        assert mine[0].kind == "out" and mine[0].barrier and mine[0].call == steps.RouterCall("remove", i)
        assert mine[-1].kind == "in" and mine[-1].barrier and mine[-1].call == steps.RouterCall("add", i)
        # the step goes ahead only once the earlier replicas serve and are back in the router
        earlier = tuple(g for w in waves[:i] for g in w)
        assert mine[0].when == (steps.Serves(earlier, tuple(steps.RouterCall("add", j) for j in range(i))),
                                steps.Begins(i, tuple(wave)))
        # the replica restarts only once it is out of the router and its requests drained
        drain = next(a for a in mine if a.kind == "drain")
        assert steps.Serves(earlier, (*(steps.RouterCall("add", j) for j in range(i)), steps.RouterCall("remove", i))) in drain.when
        assert drain.hosts == [u.host for u in r.group(wave[0]) if u.serves]
        assert [a.kind for a in mine[1:-1]][:2] == ["drain", "stage"]
        assert all(a.barrier is False for a in mine[1:-1])
    # the router is not restarted by a roll
    assert not any(a.kind in ("stop", "start") and a.role == "routers" for a in actions)


def test_slurm_jobs_take_the_launchers_place_in_the_same_order():
    r = rolling_change()
    actions = steps.restart(r, steps.JobSteps("r0n0"), steps.Decisions(numbers={"engine-r0": 2},
                                                                     metas={"engine-r0": "{}"}))
    first = [a.kind for a in actions if a.wave == 0]
    assert first == ["out", "drain", "record", "submit", "gate", "in"]
    submit = next(a for a in actions if a.kind == "submit")
    assert submit.hosts == ["r0n0"] and present(submit.on("r0n0")).stops == ("engine-r0",)
    record = next(a for a in actions if a.kind == "record")
    assert record.hosts == ["r0n0", "r0n1"] and "launch" in record.parts[0].script
    # the router's worker file is the systemd units' (the jobs' router reads its URLs from its argv)
    out = next(a for a in actions if a.kind == "out")
    systemd_out = next(a for a in steps.restart(r, steps.UNITS) if a.kind == "out")
    assert out.parts[0].script != systemd_out.parts[0].script


def test_the_runbooks_start_is_one_step_of_the_restart():
    r = desired_rollout(target(replicas(2, 2), None))
    r = r.decided(mark_changes(r, {}))
    whole = [a for a in steps.restart(r, steps.UNITS) if a.kind != "current"]

    def what(actions: list[steps.Action]) -> list[tuple[str, str, tuple[steps.Part, ...]]]:
        return [(a.kind, a.role, a.parts) for a in actions]

    assert what(steps.start_of(r, r.groups)) == what(whole)
    assert [name for name, _ in steps.order(r, whole)] == [
        "stop routers", "stop workers", "stop heads", "start heads", "workers wait for the head's rendezvous port",
        "start workers", "engine groups serve", "start router", "router serves"]
    heads = next(a for a in whole if a.kind == "start" and a.role == "heads")
    assert heads.parts[0].script == commands.start_units(list(heads.parts[0].units))


def test_operations_are_told_apart_in_one_place():
    """Barriers are actions of the list: nothing but one function edits pyinfra's loop position (an operation's
    identity and order), and only :mod:`k3deploy.runtime.phases` holds it."""
    import ast
    from pathlib import Path

    import k3deploy

    package = Path(k3deploy.__file__).parent
    found: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        if "node_tools" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Attribute) and node.attr == "loop_position":
                        found.setdefault(f"{path.relative_to(package)}:{fn.name}", node.lineno)
    assert list(found) == ["runtime/pyinfra_internals.py:operation_kind"]


def test_the_runbook_and_the_operations_render_the_one_builder(monkeypatch):
    """The runbook's start and the deploy's operations are the steps of :func:`k3deploy.model.steps.rollout`: a
    reordering there (here the workers started before their heads) shows in both, and nothing else orders them."""
    from dataclasses import replace

    import pyinfra
    from pyinfra.context import ctx_host, ctx_state

    from helpers.clusters import records
    from k3deploy.model.runbook import Context, blocks, build, to_markdown
    from k3deploy.model.staging import stage_for
    from k3deploy.runtime import phases
    from k3deploy.runtime.decide import Decided
    from k3deploy.runtime.gather import Gathered
    from k3deploy.runtime.reading import HostReading

    wanted = target(records("gb300", "multi_node_tp", 2), None)
    r = desired_rollout(wanted)
    r = r.decided(mark_changes(r, {}))
    gathered = Gathered(target=wanted, rollout=r, stage=stage_for(r, {}, {}),
                        readings={h: HostReading(h, helper_read=True) for h in r.hosts})
    starts = {a.parts[0].script: a.role for a in steps.rollout(r).start if a.kind == "start"}
    assert set(starts.values()) == {"heads", "workers"}

    def runbook() -> list[str]:
        """Whose starts the runbook's bring-up runs, in order (not its rolling change or rollback)."""
        doc = build(r, Context(inventory="inventories/x.py", preflight=[], addresses={h: h for h in r.hosts},
                               ssh={h: ["ssh", h] for h in r.hosts}, brand="NVIDIA", guide=None, version="0"))
        return [starts[b.text.strip()] for b in blocks(to_markdown(doc))
                if b.when is None and b.text.strip() in starts]

    def operations() -> list[str]:
        """The start phase's starts, in the order pyinfra runs them (its operations called for every host as
        pyinfra's CLI calls them, on fresh nodes, connecting to none)."""
        monkeypatch.setattr(pyinfra, "is_cli", True)
        state = cli_state(r.hosts, __file__)
        inventory = state.inventory
        decided = Decided(rollout=r, numbers={}, metas={}, marks={}, repairs=(), rollback_to={}, gate=None)
        ctx = phases.RunContext(gathered, decided, state=state)
        with ctx_state.use(state):
            for h in inventory:
                monkeypatch.setattr(h, "get_fact", lambda fact, **kwargs: fact.default())
                with ctx_host.use(h):
                    phases.start_phase(ctx=ctx)
        names = [sorted(state.op_meta[op].names)[0].split(" | ", 1)[-1] for op in state.get_op_order()]
        return [n for n in names if n.startswith(("Start group heads", "Start workers"))]

    assert runbook() == ["heads", "workers"]
    assert operations() == ["Start group heads", "Start workers once their head's rendezvous port accepts connections"]
    real = steps.rollout

    def workers_first(*args: object, **kwargs: object) -> steps.RolloutSteps:
        made = real(*args, **kwargs)  # type: ignore[arg-type]
        start = list(made.start)
        heads = next(i for i, a in enumerate(start) if a.kind == "start" and a.role == "heads")
        workers = next(i for i, a in enumerate(start) if a.kind == "start" and a.role == "workers")
        start[heads], start[workers] = start[workers], start[heads]
        return replace(made, start=tuple(start))

    monkeypatch.setattr(steps, "rollout", workers_first)
    assert runbook() == ["workers", "heads"]
    assert operations() == ["Start workers once their head's rendezvous port accepts connections", "Start group heads"]


def test_the_rollout_order_is_one_tuple(monkeypatch):
    """The deploy's phases and the runbook's sections after the preflight follow :data:`steps.ORDER`: a reordering
    there shows in both, and the deploy file calls no phase of the rollout by name."""
    import ast

    from k3deploy.model.runbook import sections
    from k3deploy.runtime import command, phases

    assert set(phases.PHASES) == set(sections.PARTS) == set(steps.ORDER)
    phase_names = {getattr(f, "__name__", "") for f in phases.PHASES.values()}
    order = ("configure", "stage", "smoke", "virtual address", "start")
    assert sorted(order) == sorted(steps.ORDER) and order != steps.ORDER
    monkeypatch.setattr(steps, "ORDER", order)
    called: list[str] = []

    def recorder(part: str):
        return lambda *, ctx: called.append(part)

    monkeypatch.setattr(phases, "PHASES", {p: recorder(p) for p in phases.PHASES})
    phases.roll_out(ctx=None)  # type: ignore[arg-type]   # the recorders read no context
    assert called == list(order)
    written = [s for s in sections.sections() if s in sections.PARTS.values()]
    assert written == [sections.PARTS[p] for p in order]
    tree = ast.parse(command.DEPLOY.read_text())
    named = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "roll_out" in named and not named & phase_names


def test_the_runbooks_virtual_address_and_the_deploys_are_the_same_steps(monkeypatch):
    """The runbook's virtual address and the deploy's operations of its phase are the steps of
    :func:`k3deploy.model.steps.virtual_address`: the same files and scripts, the holder's wait under its typed
    condition; a change there (here the holder's wait dropped, a configuration changed) shows in both."""
    import io
    import shlex
    from dataclasses import replace

    import pyinfra
    from pyinfra.api.command import FileUploadCommand, StringCommand
    from pyinfra.context import ctx_host, ctx_state

    from k3deploy.facts.rollout import KeepalivedState, KeepalivedStatus
    from k3deploy.model.runbook import Context, blocks, build, to_markdown
    from k3deploy.model.staging import stage_for
    from k3deploy.runtime import phases
    from k3deploy.runtime.decide import Decided
    from k3deploy.runtime.gather import Gathered
    from k3deploy.runtime.reading import HostReading

    common = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp", "k3_vip": "10.0.0.250"}
    records = [HostRecord("n1", ("head",), {**common, "k3_ip": "10.0.0.1"}),
               HostRecord("n2", ("workers",), {**common, "k3_ip": "10.0.0.2", "rank": 1}),
               HostRecord("n9", ("spares",), {**common, "k3_ip": "10.0.0.9"})]
    wanted = target(records, None)
    r = desired_rollout(wanted, ifaces={"n1": "eth0", "n9": "eth1"})   # n2's interface was not read
    r = r.decided(mark_changes(r, {}))
    made = steps.virtual_address(r)
    assert [(type(s).__name__, s.host) for s in made] == [
        ("Keepalived", "n1"), ("Refusal", "n2"), ("Keepalived", "n9"), ("Hold", "n1")]
    hold = made[-1]
    assert isinstance(hold, steps.Hold) and hold.when == (steps.Serves(tuple(r.groups)),)
    assert steps.rollout(r).vip == made

    def runbook() -> list[str]:
        """The runbook's blocks of the virtual address, in order."""
        doc = build(r, Context(inventory="inventories/x.py", preflight=[], addresses={h: h for h in r.hosts},
                               ssh={h: ["ssh", h] for h in r.hosts}, brand="NVIDIA", guide=None, version="0"))
        text = to_markdown(doc)
        section = text[text.index("## 4b. The virtual address"):text.index("## 5. ")]
        return [b.text for b in blocks(section)]

    def written(step: steps.VipStep) -> str:
        if isinstance(step, steps.Keepalived):
            return commands.install_file(step.staged, step.content, "0644") + step.apply + "\n"
        return step.script + "\n"

    def operations() -> list[tuple[str, str, list[str], list[bytes]]]:
        """The phase's operations as pyinfra's CLI calls them for every host (keepalived read as installed, not yet
        configured), connecting to none: each one's host, name, scripts and uploads."""
        monkeypatch.setattr(pyinfra, "is_cli", True)
        state = cli_state([*r.hosts, *r.spares], __file__)
        inventory = state.inventory
        gathered = Gathered(target=wanted, rollout=r, stage=stage_for(r, {}, {}),
                            readings={h: HostReading(h, helper_read=True) for h in r.hosts})
        decided = Decided(rollout=r, numbers={}, metas={}, marks={}, repairs=(), rollback_to={}, gate=None)
        ctx = phases.RunContext(gathered, decided, state=state)

        def fact(kind: type, **kwargs: object) -> object:
            if kind is KeepalivedState:
                return KeepalivedStatus("/usr/sbin/keepalived", None, "inactive", "disabled")
            return kind().default()

        with ctx_state.use(state):
            for h in inventory:
                monkeypatch.setattr(h, "get_fact", fact)
                with ctx_host.use(h):
                    phases.vip_phase(ctx=ctx)
            out = []
            for op in state.get_op_order():
                for h in inventory:
                    data = state.ops[h].get(op)
                    if data is None:
                        continue
                    with ctx_host.use(h):
                        cmds = list(data.command_generator())
                    out.append((h.name, sorted(state.op_meta[op].names)[0].split(" | ", 1)[-1],
                                [c.get_raw_value() for c in cmds if isinstance(c, StringCommand)],
                                [c.src.getvalue() for c in cmds
                                 if isinstance(c, FileUploadCommand) and isinstance(c.src, io.BytesIO)]))
        return out

    def check(made: tuple[steps.VipStep, ...]) -> None:
        blanked = steps.virtual_address(r, blank="IFACE")   # the runbook's: an interface not read is a blank
        assert [s.host for s in blanked] == [s.host for s in made]
        assert runbook() == [written(s) for s in blanked]
        ops = operations()
        assert sorted((h, n) for h, n, _, _ in ops) == sorted((s.host, s.name) for s in made)
        for s in made:
            (_, _, scripts, uploads), = [o for o in ops if o[:2] == (s.host, s.name)]
            if isinstance(s, steps.Keepalived):   # the runbook's file and script, as the deploy writes and runs them
                assert uploads == [s.content.encode()] and scripts[-1] == f"sh -c {shlex.quote(s.apply)}"
            elif isinstance(s, steps.Refusal):
                assert scripts == [f"sh -c {shlex.quote(s.script)}"] and "set k3_vip_interface" in s.script
            else:   # the wait runs at execution, once its condition holds
                assert scripts == [] and uploads == []

    check(made)
    real = steps.virtual_address

    def changed(layout: Rollout, **kwargs: object) -> tuple[steps.VipStep, ...]:
        made = real(layout, **kwargs)  # type: ignore[arg-type]
        return tuple(replace(s, content=s.content + "# changed\n") if isinstance(s, steps.Keepalived) else s
                     for s in made if not isinstance(s, steps.Hold))

    monkeypatch.setattr(steps, "virtual_address", changed)
    again = steps.rollout(r).vip
    assert not any(isinstance(s, steps.Hold) for s in again) and all(
        s.content.endswith("# changed\n") for s in again if isinstance(s, steps.Keepalived))
    check(again)
    assert "wait until it holds" not in "".join(runbook())


def test_the_stages_steps_are_typed_kinds_in_their_order():
    """Each stage step names its kind (:class:`~k3deploy.model.steps.StageKind`): the kinds come in their order, the
    fan-out's rounds numbered within their part, and a step of no stage (the smoke test) has none."""
    r = desired_rollout(target(replicas(2, 2), None))
    plan = steps.fresh(r)
    made = steps.stage(r, plan)
    assert all(isinstance(s.kind, steps.StageKind) for s in made)
    orders = [present(s.kind).order for s in made]
    assert orders == sorted(orders)
    kinds = list(dict.fromkeys(present(s.kind) for s in made))
    assert [k.part for k in kinds][:2] == [steps.StagePart.STOP_LEFTOVER, steps.StagePart.TOKEN]
    assert kinds[-1] == steps.VERIFY_BEFORE_START
    rounds = [k.round for k in kinds if k.part is steps.StagePart.ROUND]
    assert plan.rounds > 0 and rounds == list(range(plan.rounds))
    # every host has one step of each kind, in the same order
    for h in r.hosts:
        assert [s.kind for s in made if s.host == h] == kinds
    assert steps.smoke(r).kind is None


def test_a_slurm_nodes_unit_files_are_written_only_while_its_group_is_intact():
    """The configure step's "no member of the group failed an earlier step" is a condition of the restart's kind
    (:class:`~k3deploy.model.steps.Intact`), evaluated by the one :meth:`RunContext.holds`."""
    from pyinfra.api import Config, Inventory, State

    from k3deploy.model.slurm import launch_path
    from k3deploy.runtime import phases
    from k3deploy.runtime.decide import Decided

    r = desired_rollout(target(replicas(2, 2, k3_slurm_exclusive="user"), None))
    r = r.decided(mark_changes(r, {}))
    configure = present(steps.JobSteps("r0n0").configure(r, "r1n1"))
    unit = next(u for u in r.units if u.host == "r1n1")
    conditions = {f.dest: f.when for f in configure.files}
    assert conditions[unit.env_path] == conditions[launch_path(r, unit)] == (steps.Intact("engine-r1"),)
    inventory = Inventory((r.hosts, {}))
    state = State(inventory, Config())
    state.failed_hosts.add(present(inventory.get_host("r1n0")))
    decided = Decided(rollout=r, numbers={}, metas={}, marks={}, repairs=(), rollback_to={}, gate=None)
    ctx = phases.RunContext(None, decided, state=state)
    assert not ctx.holds(conditions[unit.env_path])()
    assert ctx.holds((steps.Intact("engine-r0"),))()
