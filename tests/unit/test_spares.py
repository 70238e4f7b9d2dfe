"""Hot spares: the substitution model (a lost member's rank to a spare, recorded substitutions applied, stale ones
left alone), the inventory group ``spares`` (no role, staged like an engine host), the records the nodes keep (read
and written by real sh), and the reading of an inventory whose member is lost (@fake GB300 trays, an unreachable
SSH host)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from helpers import FAKE_HOSTS
from k3deploy.errors import K3Error
from k3deploy.facts.spares import SpareRecords
from k3deploy.model import commands
from k3deploy.model.binding import HostRecord
from k3deploy.model.health import Health, HealthEvent
from k3deploy.model.inventory import with_roles
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.spares import (
    QUARANTINE_FILE,
    RELEASED_FILE,
    SUBSTITUTIONS_FILE,
    Quarantine,
    Substitution,
    apply,
    is_spare,
    merged,
    parse_released,
    parse_substitutions,
    places,
    quarantine_for,
    released_text,
    settle,
    substitutions_text,
)
from k3deploy.model.staging import stage_for
from k3deploy.model.steps import stage

GB300 = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp"}


def records(spares: int = 1) -> list[HostRecord]:
    out = [HostRecord("n1", ("head",), {**GB300, "k3_ip": "10.0.0.1", "rank": 0}),
           HostRecord("n2", ("workers",), {**GB300, "k3_ip": "10.0.0.2", "rank": 1})]
    out += [HostRecord(f"s{i}", ("spares",), {**GB300, "k3_ip": f"10.0.0.{10 + i}"}) for i in range(1, spares + 1)]
    return out


def placed_of(recs: list[HostRecord]) -> dict[str, tuple[str, int]]:
    layout = target(recs, None).layout
    assert layout is not None
    return places(layout)


# ------------------------------------------------------------------------------- the inventory group


def test_a_spare_has_no_role_runs_nothing_and_is_staged_like_an_engine_host():
    wanted = target(records(), None)
    layout = wanted.require_layout()
    assert wanted.plan is not None and len(wanted.plan.nodes) == 2          # the plan counts the engine hosts only
    assert layout.hosts == ["n1", "n2"] and layout.on_host("s1") == []
    assert layout.spares == {"s1": "10.0.0.11"}
    plan = stage_for(layout, {}, {})
    assert "s1" in plan.image.receivers or "s1" in plan.image.fetch        # the image reaches it too
    assert "s1" in plan.weights.receivers or "s1" in plan.weights.fetch    # and the weights
    mine = [s for s in stage(desired_rollout(wanted), plan) if s.host == "s1" and s.applies]
    assert mine and all("systemctl restart" not in s.script for s in mine)


def test_a_host_in_spares_and_a_role_group_is_refused():
    with pytest.raises(K3Error, match="host n2 is in group spares and in workers"):
        with_roles([HostRecord("n1", ("head",), {}), HostRecord("n2", ("workers", "spares"), {})])


def test_a_bare_host_list_leaves_its_spares_out_of_the_roles():
    recs = with_roles([HostRecord("a", (), {}), HostRecord("s", ("spares",), {}), HostRecord("b", (), {})])
    assert [(r.name, r.groups) for r in recs] == [("a", ("head",)), ("s", ("spares",)), ("b", ("workers",))]


# ----------------------------------------------------------------------------- the substitution model


def test_a_lost_member_gets_the_first_usable_spare_in_its_rank_and_role():
    recs = records(spares=3)
    s = settle(recs, [], placed_of, unreachable={"n2": "timed out"}, quarantined={"s1": "XID 79 on GPU 0"},
               unusable={"s2": "disk.shm"}, when="2026-12-05T10:00:00Z")
    assert [(x.group, x.rank, x.lost, x.spare) for x in s.new] == [("engine", 1, "n2", "s3")]
    assert s.new[0].why == "unreachable: timed out" and s.unfilled == []
    layout = target(s.records, None).require_layout()
    assert [(u.host, u.rank, u.node.address) for u in layout.units] == [("n1", 0, "10.0.0.1"), ("s3", 1, "10.0.0.13")]
    assert "--master-addr" in layout.units[1].node.argv                  # a worker of the same head
    assert s.out == {"n2": "unreachable: timed out", "s1": "quarantined: XID 79 on GPU 0",
                     "s2": "a spare that fails disk.shm"}
    assert s.standby == []


def test_a_lost_head_gives_its_spare_rank_zero_and_the_workers_its_address():
    s = settle(records(), [], placed_of, unreachable={}, quarantined={"n1": "XID 48"}, unusable={}, when="t")
    layout = target(s.records, None).require_layout()
    assert [(u.host, u.rank) for u in layout.units] == [("s1", 0), ("n2", 1)]
    assert layout.units[1].join is not None and layout.units[1].join[0] == "10.0.0.11"


def test_no_spare_left_names_the_group_and_the_lost_member():
    s = settle(records(spares=0), [], placed_of, unreachable={"n2": "refused"}, quarantined={}, unusable={},
               when="t")
    assert s.new == [] and [u.line() for u in s.unfilled] == [
        "group engine: n2 (rank 1) is lost (unreachable: refused) and no spare is left"]
    assert [r.name for r in s.records] == ["n1", "n2"]                    # nothing moved: nothing half-applied


def test_a_recorded_substitution_holds_and_the_lost_member_back_is_a_spare():
    sub = Substitution("engine", 1, "n2", "s1", "unreachable: refused", "t1")
    s = settle(records(), [sub], placed_of, unreachable={}, quarantined={}, unusable={}, when="t2")
    assert s.new == [] and s.substitutions == [sub]
    assert [r.name for r in s.records if not is_spare(r)] == ["n1", "s1"] and s.standby == ["n2"]
    # n2 lost again later is nobody's business; s1 lost next gets n2, the spare it became
    again = settle(records(), [sub], placed_of, unreachable={"s1": "refused"}, quarantined={}, unusable={},
                   when="t3")
    assert [(x.lost, x.spare, x.rank) for x in again.new] == [("s1", "n2", 1)]


def test_a_substitution_the_inventory_made_permanent_is_left_alone():
    sub = Substitution("engine", 1, "n2", "s1", "x", "t")
    edited = [HostRecord("n1", ("head",), {**GB300, "rank": 0}), HostRecord("s1", ("workers",), {**GB300, "rank": 1}),
              HostRecord("n2", ("spares",), dict(GB300))]
    recs, applied = apply(edited, [sub])
    assert applied == [] and recs == edited
    gone, none = apply(records(), [Substitution("engine", 1, "n2", "n9", "x", "t")])
    assert none == [] and gone == records()


# ------------------------------------------------------------------------------------------ the records


def test_substitutions_and_quarantine_records_round_trip():
    subs = [Substitution("engine", 1, "n2", "s1", "unreachable: x", "2026-12-05T10:00:00Z")]
    assert parse_substitutions(substitutions_text(subs)) == subs
    assert json.loads(substitutions_text(subs))[0] == {"group": "engine", "rank": 1, "lost": "n2", "spare": "s1",
                                                       "why": "unreachable: x", "when": "2026-12-05T10:00:00Z"}
    assert merged([subs, subs, []]) == subs
    xid = HealthEvent("GPU 0", "xid", "79", "NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.", True)
    q = quarantine_for(Health((xid, HealthEvent("GPU 1", "ecc", "correctable=3", "", False))), [], "t")
    assert q is not None and len(q.events) == 1 and q.events[0]["code"] == "79"
    assert Quarantine.from_text(q.to_json()) == q
    released = parse_released(released_text([], q))
    assert quarantine_for(Health((xid,)), released, "t2") is None        # released events do not come back
    other = HealthEvent("GPU 2", "xid", "48", "Xid 48", True)
    assert quarantine_for(Health((xid, other)), released, "t2") is not None   # a new one does


def test_the_nodes_records_are_read_and_released_by_real_sh(tmp_path):
    cfg = tmp_path / "etc"
    cfg.mkdir()
    subs = substitutions_text([Substitution("engine", 1, "n2", "s1", "x", "t")])
    (cfg / SUBSTITUTIONS_FILE).write_text(subs)
    q = Quarantine("XID 79 on GPU 0", ({"device": "GPU 0", "kind": "xid", "code": "79", "text": "t",
                                        "fatal": True},), "t")
    (cfg / QUARANTINE_FILE).write_text(q.to_json().rstrip("\n"))        # a last line without its newline
    names = [SUBSTITUTIONS_FILE, QUARANTINE_FILE, RELEASED_FILE]
    out = subprocess.run(["sh", "-c", commands.spare_records_read(str(cfg), names)], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    read = SpareRecords().process(out)
    assert parse_substitutions(read.substitutions) == parse_substitutions(subs)
    assert Quarantine.from_text(read.quarantine) == q and read.released is None
    script = commands.release_quarantine(str(cfg), QUARANTINE_FILE, RELEASED_FILE, released_text([], q))
    subprocess.run(["sh", "-c", script], check=True)
    assert not (cfg / QUARANTINE_FILE).exists()
    assert parse_released((cfg / RELEASED_FILE).read_text())[0]["code"] == "79"
    assert SpareRecords().process(subprocess.run(["sh", "-c", commands.spare_records_read(str(cfg), names)],
                                                 capture_output=True, text=True).stdout.splitlines()).quarantine is None


# ------------------------------------------------------------------- an inventory with a lost member


def fake_trays(tmp_path: Path, *, worker: str = "fake", spare: bool = True, quarantined: bool = False) -> str:
    """head: a @fake GB300 tray; workers: another (``worker="fake"``, its quarantine record on it with
    ``quarantined``) or an SSH host nothing answers on (``"closed"``); spares: a third @fake tray (``spare``)."""
    spec = importlib.util.spec_from_file_location("_runner", Path(__file__).parent / "test_preflight_runner.py")
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)   # its @fake GB300 trays' answers (each node's facts from the fixtures)

    def tray(i: int, extra: dict[str, list[str]] | None = None) -> list[object]:
        address = f"10.77.0.{11 + i}"
        return [f"@fake/gb300-{i}", {"k3_ip": address, "fake_delay": 0, "fake_delay_jitter": 0,
                                     "fake_responses": {**(extra or {}), **runner.responses(address)}}]

    record = {"K3_SPARE_FILE": ["K3_SPARE_FILE=quarantine", Quarantine("XID 79 on GPU 0", when="t").to_json(), ""]}
    groups = {"head": [tray(0)],
              "workers": [tray(1, record if quarantined else None)] if worker == "fake" else
              [["closed", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "k3_ip": "10.77.0.12"}]]}
    if spare:
        groups["spares"] = [tray(2)]
    (tmp_path / "hosts.json").write_text(json.dumps(groups))
    (tmp_path / "group_vars").mkdir(exist_ok=True)
    (tmp_path / "group_vars" / "all.yml").write_text("k3_hardware: gb300\nk3_strategy: multi_node_tp\n")
    inventory = tmp_path / "trays.py"
    inventory.write_text(FAKE_HOSTS + "import json\nfrom pathlib import Path\n"
                         "_g = json.loads((Path(__file__).parent / 'hosts.json').read_text())\n"
                         + "".join(f"{g} = [tuple(h) for h in _g[{g!r}]]\n" for g in groups))
    return str(inventory)


def test_an_unreachable_member_is_replaced_and_fails_no_check(tmp_path):
    from k3deploy.cli.status import status_of
    from k3deploy.runtime.gather import gather, require_reachable
    from k3deploy.runtime.views import PLAN, STATUS

    gathered = gather(fake_trays(tmp_path, worker="closed"), PLAN)
    assert gathered.spares is not None
    assert [(s.group, s.rank, s.lost, s.spare) for s in gathered.spares.new] == [
        ("engine", 1, "closed", "@fake/gb300-2")]
    assert gathered.require_rollout().hosts == ["@fake/gb300-0", "@fake/gb300-2"]
    assert gathered.preflight is not None    # (@fake trays do not answer the registry: image.digest fails)
    assert [(r.host, r.check) for r in gathered.preflight.results if r.status == "fail"] == [
        ("@fake/gb300-0", "image.digest")]
    reach = next(r for r in gathered.preflight.results if r.host == "closed")
    assert reach.status == "warn" and "it runs nothing" in reach.observed
    require_reachable(gathered)                                           # the lost member is not the plan's
    assert ("@fake/gb300-2", "k3-engine.service") in gathered.installed   # read as a member now
    st = status_of(gather(fake_trays(tmp_path, worker="closed"), STATUS))
    assert "closed" not in st.unreachable


def test_an_unreachable_member_without_spares_fails_the_preflight_as_before(tmp_path):
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import PLAN

    gathered = gather(fake_trays(tmp_path, worker="closed", spare=False), PLAN)
    assert gathered.spares is not None and gathered.spares.new == [] and gathered.spares.unfilled == []
    assert gathered.preflight is not None
    assert [(r.host, r.check) for r in gathered.preflight.results if r.status == "fail"] == [
        ("closed", "host.reachable"), ("cluster", "gpu.memory"), ("@fake/gb300-0", "image.digest")]


def test_a_quarantined_member_is_replaced_and_without_a_spare_the_plan_says_so(tmp_path):
    from helpers import k3
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import PLAN

    gathered = gather(fake_trays(tmp_path, quarantined=True), PLAN)
    assert gathered.spares is not None
    assert [(s.lost, s.spare, s.why) for s in gathered.spares.new] == [
        ("@fake/gb300-1", "@fake/gb300-2", "quarantined: XID 79 on GPU 0")]
    assert gathered.spares.out == {"@fake/gb300-1": "quarantined: XID 79 on GPU 0"}
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    out = k3("plan", fake_trays(lonely, quarantined=True, spare=False))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "group engine: @fake/gb300-1 (rank 1) is lost (quarantined: XID 79 on GPU 0) and no spare is left" \
        in out.stderr


def test_sim_up_spares_writes_the_spares_group_after_the_engine_nodes(tmp_path):
    from k3deploy.model.inventory import records_of
    from k3deploy.runtime.connections import inventory_file, load_inventory
    from k3sim.inventory import write_inventory

    nodes = [{"name": f"ssx-node{i + 1}", "ip": f"10.9.0.{11 + i}", "rank": i} for i in range(3)]
    inventory = str(tmp_path / "ssx.py")
    write_inventory({"name": "ssx", "hardware": "gb300", "nodes": nodes, "spares": 1, "strategy": "multi_node_tp",
                     "inventory": inventory, "key": "/k", "known_hosts": "/kh"})
    loaded = load_inventory(inventory)
    recs = records_of(loaded.inventory)
    assert [(r.name, [g for g in r.groups if g in ("head", "workers", "spares")], r.data.get("rank"))
            for r in recs] == [("ssx-node1", ["head"], 0), ("ssx-node2", ["workers"], 1), ("ssx-node3", ["spares"], None)]
    layout = target(recs, inventory_file(inventory)).require_layout()
    assert layout.hosts == ["ssx-node1", "ssx-node2"] and layout.spares == {"ssx-node3": "10.9.0.13"}


def dry_run(inventory: str) -> subprocess.CompletedProcess[str]:
    from helpers import pyinfra

    with Path(inventory).parent.joinpath("group_vars", "all.yml").open("a") as fh:   # @fake trays have no registry
        fh.write("k3_image_resolve: false\n")
    return pyinfra(inventory, "deploy/k3.py", "--dry", "-y")


def test_the_deploy_does_not_fail_for_an_unreachable_member_a_spare_replaces(tmp_path):
    run = dry_run(fake_trays(tmp_path, worker="closed"))
    assert run.returncode == 0, run.stdout
    assert "[closed]        Could not connect" in run.stdout                   # pyinfra's own line stays
    assert "k3deploy: @fake/gb300-2 takes closed's place: rank 1 of group engine (unreachable: Could not connect" \
        in run.stdout
    assert "preflight passed on 3 host(s)" in run.stdout


def test_the_deploy_without_a_spare_says_which_group_and_node_and_changes_nothing(tmp_path):
    run = dry_run(fake_trays(tmp_path, quarantined=True, spare=False))
    assert run.returncode == 1, run.stdout
    assert "group engine: @fake/gb300-1 (rank 1) is lost (quarantined: XID 79 on GPU 0) and no spare is left" \
        in run.stdout
    assert "no spare left for @fake/gb300-1: nothing was changed" in run.stdout


def test_the_deploy_and_the_plan_refuse_a_lost_member_without_a_spare_in_the_same_words(tmp_path):
    from helpers import k3
    from k3deploy.runtime.decide import no_spare
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import PLAN

    inventory = fake_trays(tmp_path, quarantined=True, spare=False)
    refusal = no_spare(gather(inventory, PLAN))
    assert refusal is not None and refusal.lines == (
        "group engine: @fake/gb300-1 (rank 1) is lost (quarantined: XID 79 on GPU 0) and no spare is left",)
    assert refusal.reason.startswith("no spare left for @fake/gb300-1: nothing was changed (bring the node back")
    assert refusal.reason.endswith(f"k3deploy spares {inventory})")
    plan = k3("plan", inventory)
    assert plan.returncode == 2 and refusal.line() in plan.stderr, plan.stderr
    run = dry_run(inventory)
    assert run.returncode == 1 and f"--> k3deploy: {refusal.reason}" in run.stdout, run.stdout
    assert all(f"k3deploy: {line}" in run.stdout for line in refusal.lines)


def test_the_spares_command_lists_and_releases_only_a_quarantined_node(tmp_path):
    from helpers import k3

    inventory = fake_trays(tmp_path, quarantined=True)
    out = k3("spares", inventory, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [(h["host"], h["state"]) for h in data["hosts"]] == [("@fake/gb300-2", "in use"),
                                                                ("@fake/gb300-1", "runs nothing")]
    assert [(q["host"], q["reason"], q["recorded"]) for q in data["quarantined"]] == [
        ("@fake/gb300-1", "XID 79 on GPU 0", True)]
    assert data["substitutions"][0]["new"] is True
    text = k3("spares", inventory).stdout
    assert "@fake/gb300-1: quarantined: XID 79 on GPU 0" in text and "--release @fake/gb300-1" in text
    released = k3("spares", inventory, "--release", "@fake/gb300-1", "--json")
    assert released.returncode == 0 and json.loads(released.stdout)["reason"] == "XID 79 on GPU 0"
    wrong = k3("spares", inventory, "--release", "@fake/gb300-0")
    assert wrong.returncode == 2 and "it is not quarantined" in wrong.stderr
    absent = k3("spares", inventory, "--release", "nope")
    assert absent.returncode == 2 and "no such host" in absent.stderr
