"""The engine spec is the source of truth: what the rollout renders (unit files, env files, launch scripts) is never
read back. Text is parsed only where it was read from a host (:mod:`k3deploy.model.hosttext`), so the Kubernetes
pods, the plan, ``resolve`` and the runbook take the argv, env and image from each unit's
:class:`~k3deploy.model.engine.EngineSpec`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import ROOT
from helpers.clusters import FAMILIES, STRATEGIES, smallest_rollout
from k3deploy.model import kubernetes
from k3deploy.model.engine import GroupSize, Rank, Ref, text
from k3deploy.model.hosttext import exec_start, parse_env

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
