"""The engine spec is the source of truth: what the rollout renders (unit files, env files, launch scripts) is never
read back. Text is parsed only where it was read from a host (:mod:`k3deploy.model.hosttext`), so the Kubernetes
pods, the plan, ``resolve``, the deploy's ``--diff`` and the runbook (its secrets blanked) take the argv, env and
image from each unit's :class:`~k3deploy.model.engine.EngineSpec`."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from helpers import ROOT
from helpers.clusters import FAMILIES, STRATEGIES, smallest_rollout
from k3deploy.model import kubernetes, steps
from k3deploy.model.engine import GroupSize, Rank, Ref, text
from k3deploy.model.hosttext import exec_start, parse_env
from k3deploy.model.rollout import Rollout
from k3deploy.model.runbook import Context, blocks, build, to_markdown
from k3deploy.model.runbook.blanks import secret_token, without_secrets
from k3deploy.recipe.taxonomy import hardware
from k3deploy.runtime.operations import file_diff

#: the readers of host text: defined in k3deploy/model/hosttext.py only
PARSERS = frozenset({"split_exec", "exec_start", "parse_env", "launch_argv", "_launch_argv", "env_of"})
#: attributes that hold what the rollout rendered (a unit's files); ``have.*`` is what a host holds
RENDERED = frozenset({"unit_text", "env_text"})
#: functions whose result is rendered text
RENDERERS = frozenset({"launch_script", "render_unit", "env_file_text", "render_template", "batch_script",
                       "engine_unit", "router_unit"})
HOST_READINGS = frozenset({"have", "installed", "i"})
SOURCES = [p for d in ("k3deploy", "deploy") for p in sorted((ROOT / d).rglob("*.py"))
           if "sim" not in p.relative_to(ROOT).parts]


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _reads_rendered(arg: ast.expr) -> str | None:
    """What in ``arg`` is rendered text of the rollout (None: nothing)."""
    for node in ast.walk(arg):
        if isinstance(node, ast.Attribute) and node.attr in RENDERED:
            base = node.value
            if not (isinstance(base, ast.Name) and base.id in HOST_READINGS):
                return ast.unparse(node)
        if isinstance(node, ast.Attribute) and node.attr == "spec":
            return ast.unparse(node)
        if isinstance(node, ast.Call) and _name(node.func) in RENDERERS:
            return ast.unparse(node)
    return None


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(ROOT).as_posix()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in PARSERS - {"_launch_argv"} \
                and rel != "k3deploy/model/hosttext.py":
            out.append(f"{rel}:{node.lineno}: defines {node.name}: a reader of host text lives in model/hosttext.py")
        if isinstance(node, ast.Call) and _name(node.func) in PARSERS:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                what = _reads_rendered(arg)
                if what is not None:
                    out.append(f"{rel}:{node.lineno}: {_name(node.func)}({what}) parses rendered text back: take "
                               "it from the unit's EngineSpec")
    return out


def test_nothing_parses_what_the_rollout_rendered():
    offences = [o for path in SOURCES for o in _offences(path)]
    assert offences == []


def test_the_check_catches_the_old_parse_backs(tmp_path):
    bad = ROOT / "k3deploy" / "model" / "_probe_parse_back.py"
    source = ("from k3deploy.model.hosttext import exec_start, parse_env\n"
              "def f(u, r):\n"
              "    return exec_start(u.unit_text), parse_env(u.env_text), launch_argv(launch_script(r, u))\n"
              "def env_of(text):\n    return text\n")
    bad.write_text(source)
    try:
        found = _offences(bad)
    finally:
        bad.unlink()
    assert len(found) == 4 and any("defines env_of" in o for o in found)
    assert any("exec_start(u.unit_text)" in o for o in found) and any("launch_script(r, u)" in o for o in found)


def test_the_kubernetes_export_reads_no_rendered_file_and_no_address():
    source = (ROOT / "k3deploy" / "model" / "kubernetes.py").read_text()
    tree = ast.parse(source)
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not attrs & {"unit_text", "env_text", "address"}, attrs & {"unit_text", "env_text", "address"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_unit_renders_from_its_spec_and_its_addresses_are_symbolic(family):
    for strategy in STRATEGIES:
        r = smallest_rollout(FAMILIES[family], strategy)
        if r is None:
            continue
        heads = {u.group: u.node.address for u in r.units if u.rank == 0}
        for u in r.units:
            spec = u.require_spec()
            assert spec.argv == u.node.argv and u.unit_text == spec.unit_text and u.env_text == spec.env_text
            assert exec_start(u.unit_text) == spec.unit.exec_words(), (family, strategy, u.unit)
            assert parse_env(u.env_text) == spec.env_map
            refs = [p for w in [*spec.argv_words, *(v for _, v in spec.env)] for p in w if isinstance(p, Ref)]
            for ref in refs:
                want = heads[u.group] if ref.name == "head" else u.node.address
                assert ref.value == want and (ref.name == "self" or u.rank > 0), (strategy, u.unit, ref)
            if u.node.role != "router":
                # a node's own address is never left literal in its env: it is the pod's IP on Kubernetes
                assert all(text(v) != u.node.address or v == (Ref("self", u.node.address),) for _, v in spec.env)
            if u.rank > 0 and u.group != "router" and heads[u.group] in " ".join(u.node.argv):
                assert any(ref.name == "head" for ref in refs), (strategy, u.unit)
        for u in r.units:
            ranks = [w[0] for w in u.require_spec().argv_words if len(w) == 1 and isinstance(w[0], Rank)]
            assert all(x.scale * u.rank + x.offset == int(x.value) for x in ranks), (strategy, u.unit, ranks)
            if "--node-rank" in u.node.argv:
                assert Rank(1, 0, str(u.rank)) in ranks, (strategy, u.unit)
            if "--nnodes" in u.node.argv:   # the group's size is symbolic: $(LWS_GROUP_SIZE) on Kubernetes
                at = u.node.argv.index("--nnodes") + 1
                assert u.require_spec().argv_words[at] == (GroupSize(str(len(r.group(u.group)))),), (strategy, u)
        if "router" not in r.groups or strategy != "pd_cluster":
            objs = kubernetes.manifests(r)
            assert all(a not in repr(objs) for a in heads.values()), strategy


#: what a poisoned unit's rendered files say (:func:`_poisoned`): whatever reads them back shows it
POISON_ENV = "K3_READ_BACK=the env file was read back\n"
POISON_EXEC = 'ExecStart="/bin/false" "the unit file was read back"'
SECRET = "s3cr3t-site-token"


def _poisoned(rollout: Rollout) -> Rollout:
    """``rollout`` whose units' rendered unit and env files (their specs' ``unit_text`` and ``env_text``) say
    something else than their specs (the unit's ``ExecStart=``, every setting): code that takes a unit's command
    and settings from its spec gives what it gives for ``rollout``; code that reads them back shows the poison."""
    units = []
    for u in rollout.units:
        spec = dataclasses.replace(u.require_spec())
        unit_text = "".join(f"{POISON_EXEC}\n" if line.startswith("ExecStart=") else line
                            for line in u.unit_text.splitlines(keepends=True))
        spec.__dict__.update(unit_text=unit_text, env_text=POISON_ENV)   # the rendered texts, cached
        assert POISON_EXEC in spec.unit_text and spec.env_map == u.require_spec().env_map
        units.append(dataclasses.replace(u, spec=spec))
    return dataclasses.replace(rollout, units=units)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_deploys_file_diff_takes_each_unit_file_from_its_spec(family):
    for strategy in STRATEGIES:
        r = smallest_rollout(FAMILIES[family], strategy, k3_extra_env={"SITE_API_TOKEN": SECRET})
        if r is None:
            continue
        other = r.units[-1]   # an old file a host holds: another unit's
        shown_lines = []
        for u, bad in zip(r.units, _poisoned(r).units, strict=True):
            for real, shown in zip(steps.unit_files(r, u, staged=True), steps.unit_files(r, bad, staged=True),
                                   strict=True):
                assert shown.spec is bad.spec and (shown.content == POISON_ENV or POISON_EXEC in shown.content)
                held = other.env_text if real.kind == "env" else other.unit_text
                for old in (None, held):
                    # the reference: the real rendered text read back (as a file a host holds is)
                    want = file_diff(real.kind, old, real.content)
                    assert file_diff(shown.kind, old, shown.content, shown.spec) == want, (strategy, u.unit)
                    shown_lines += want
        assert any(line.startswith("+ SITE_API_TOKEN=") for line in shown_lines), strategy   # shown, masked
        assert SECRET not in "\n".join(shown_lines)


def test_a_unit_that_keeps_a_hosts_files_is_diffed_from_them():
    r = smallest_rollout(FAMILIES["NVIDIA"], "multi_node_tp")
    assert r is not None
    u = r.units[0]
    kept = u.kept(unit_text=u.unit_text.replace("--tensor-parallel-size", "--tp"), env_text="A=1\n")
    env, unit = steps.unit_files(r, kept, staged=True)
    assert env.spec is None and unit.spec is None and env.settings == {"A": "1"}
    assert file_diff(env.kind, u.env_text, env.content, env.spec) == ["+ A=1"] + [
        f"- {k}={v}" for k, v in u.require_spec().env_map.items()]
    assert any(line.startswith("+ --tp ") for line in file_diff(unit.kind, u.unit_text, unit.content, unit.spec))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_runbook_blanks_each_secret_from_the_spec(family):
    r = next(r for s in ("multi_node_tp", "multi_node_tp_dp", "multi_node_dep")
             if (r := smallest_rollout(FAMILIES[family], s, k3_extra_env={"SITE_API_TOKEN": SECRET})) is not None)
    hosts = list(dict.fromkeys(u.host for u in r.units))
    context = Context(inventory="inventories/x.py", preflight=[], addresses={h: h for h in hosts},
                      ssh={h: ["ssh", h] for h in hosts}, brand=hardware()[r.plan.hardware].brand, guide=None,
                      version="0")
    md = to_markdown(build(_poisoned(r), context))
    assert "K3_READ_BACK" not in md and SECRET not in md
    written = "\n".join(b.text for b in blocks(md))
    for u in r.units:
        env, names = without_secrets(u.require_spec().env_map)
        assert names == ["SITE_API_TOKEN"] and f"SITE_API_TOKEN={secret_token('SITE_API_TOKEN')}\n" in env
        assert f"<<'K3_EOF'\n{env}K3_EOF\n" in written, u.unit


def test_the_slurm_export_blanks_each_secret_from_the_spec(tmp_path):
    from k3deploy.cli.export import _write

    r = smallest_rollout(FAMILIES["NVIDIA"], "multi_node_tp", k3_extra_env={"SITE_API_TOKEN": SECRET})
    assert r is not None
    written = _write(_poisoned(r), [], "a test", tmp_path, {})
    envs = {(f["host"], f["path"]): Path(f["file"]).read_text() for f in written["files"] if f["mode"] == "0600"}
    assert envs.keys() == {(u.host, u.env_path) for u in r.units}
    for u in r.units:
        assert envs[u.host, u.env_path] == without_secrets(u.require_spec().env_map)[0]
    everything = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert "K3_READ_BACK" not in everything and SECRET not in everything
    assert secret_token("SITE_API_TOKEN") in everything


def test_only_an_engine_units_files_are_diffed_as_units_and_each_carries_its_spec():
    """A file ``--diff`` shows per flag or per variable (kind ``unit``/``env``) is an engine unit's, rendered from its
    spec; the others (the fence's units, the group member helper) are shown line by line, never read back."""
    r = smallest_rollout(FAMILIES["NVIDIA"], "multi_node_tp")
    assert r is not None
    made = steps.rollout(r.decided(r.groups))
    files = [f for c in made.configure for f in c.files]
    assert any("k3-fence" in f.dest for f in files)   # the fence's units are among them
    for f in files:
        assert (f.spec is not None) == (f.kind in ("unit", "env")), f.dest
    fence = next(f for f in files if f.dest.endswith("@.service"))
    shown = [line for line in file_diff(fence.kind, None, fence.content, fence.spec) if not line.startswith("@@")]
    assert shown == [f"+{line}" for line in fence.content.splitlines()]
