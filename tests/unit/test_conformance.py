"""Argument vectors against the real vLLM 0.33.0 ``vllm serve`` and vllm-router 0.1.17 parsers.

Needs the engine venv (``tools/engine-venv.sh``, about 2.3 GB): its interpreter is ``$K3_ENGINE_PYTHON``, or
``.venv-engine/bin/python`` in the repository root. Without it every test here is skipped.

    tools/engine-venv.sh && .venv/bin/pytest -m conformance tests/unit/test_conformance.py

Each check runs ``tests/helpers/check_argv.py`` in the engine venv (one process per batch: importing vLLM takes seconds).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "tests" / "helpers" / "check_argv.py"
GOLDEN = ROOT / "tests" / "golden" / "builder-cases.json"
ENGINE_PYTHON = Path(os.environ.get("K3_ENGINE_PYTHON") or ROOT / ".venv-engine" / "bin" / "python")

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.skipif(
        not ENGINE_PYTHON.exists(),
        reason=f"engine venv not found ({ENGINE_PYTHON}): create it with tools/engine-venv.sh "
               f"or point K3_ENGINE_PYTHON at its python",
    ),
]

MODEL = "moonshotai/Kimi-K3"


def run_check(entries: list[dict[str, Any]], *args: str, timeout: int = 600) -> tuple[int, dict[str, Any]]:
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    proc = subprocess.run([str(ENGINE_PYTHON), str(CHECK), *args], input=json.dumps(entries), text=True,
                          capture_output=True, env=env, timeout=timeout, cwd=ROOT)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"check_argv.py printed no report (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.returncode, report


def serve(*flags: str) -> list[str]:
    return ["vllm", "serve", MODEL, *flags]


# -- known good and bad argvs ----------------------------------------------------------------------------------

GOOD: dict[str, list[str]] = {
    "tp8-dcp-tokenspeed": serve(
        "--trust-remote-code", "-tp", "8", "--decode-context-parallel-size", "8", "--dcp-comm-backend", "a2a",
        "--attention-backend", "TOKENSPEED_MLA", "--kv-cache-dtype", "fp8",
        "--attention-config", '{"use_prefill_query_quantization":true,"mla_prefill_backend":"TRTLLM_RAGGED"}'),
    "negations": serve("--no-enable-flashinfer-autotune", "--no-disable-hybrid-kv-cache-manager",
                       "--no-enable-prefix-caching", "--no-enable-expert-parallel"),
    "underscore-spelling": serve("--safetensors_load_strategy", "lazy", "--max_model_len", "131072"),
    "human-readable-ints": serve("--max-model-len", "1M", "--max-num-batched-tokens", "16k"),
    "dotted-json": serve("--kv-transfer-config.kv_connector", "NixlConnector",
                         "--kv-transfer-config.kv_role", "kv_both"),
    "dep-worker-headless": serve("--data-parallel-size", "16", "--data-parallel-size-local", "4",
                                 "--data-parallel-start-rank", "4", "--data-parallel-address", "$HEAD_IP",
                                 "--data-parallel-rpc-port", "$DECODE_DP_RPC_PORT", "--enable-expert-parallel",
                                 "--headless"),
    "tools": serve("--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3", "--reasoning-parser", "kimi_k3"),
    "moe-mega": serve("--moe-backend", "deep_gemm_mega_moe", "--enable-expert-parallel",
                      "--all2all-backend", "flashinfer_nvlink_one_sided"),
    # argparse's allow_abbrev is on in both parsers: unique prefixes are accepted (a lint concern, not a parse error)
    "abbreviated-flag": serve("--tensor-parallel", "8"),
    "router-abbreviated-flag": ["vllm-router", "--vllm-pd", "--prefill", "http://10.0.0.1:8000",
                                "--decode", "http://10.0.0.2:8000"],
    "router-pd": ["vllm-router", "--vllm-pd-disaggregation", "--prefill", "http://$PREFILL_NODE_1:8000",
                  "--prefill", "http://$PREFILL_NODE_2:8000", "none", "--decode", "http://$DECODE_NODE_1:8000",
                  "--prefill-policy", "cache_aware", "--decode-policy", "power_of_two",
                  "--intra-node-data-parallel-size", "1", "--host", "0.0.0.0", "--port", "8000",
                  "--worker-startup-timeout-secs", "7200"],
}

BAD: dict[str, tuple[list[str], str]] = {
    "misspelt-flag": (serve("--tensor-paralel-size", "2"), "unrecognized arguments: --tensor-paralel-size"),
    "bad-choice-literal": (serve("--dcp-comm-backend", "nope"), "invalid choice: 'nope'"),
    "bad-int": (serve("--tensor-parallel-size", "x"), "invalid int value: 'x'"),
    "bad-moe-backend": (serve("--moe-backend", "warp_drive"), "invalid choice"),
    "bad-attention-backend": (serve("--attention-backend", "TOKENSPEED"), "TOKENSPEED"),
    "bad-mla-prefill-backend": (serve("--attention-config", '{"mla_prefill_backend":"FAST"}'),
                                "Unknown MLA prefill backend"),
    "unknown-attention-config-key": (serve("--attention-config", '{"mla_prefill":"FLASHINFER"}'), "mla_prefill"),
    "bad-json": (serve("--compilation-config", "{cudagraph_mode: FULL"), "compilation-config"),
    "auto-tool-without-parser": (serve("--enable-auto-tool-choice"), "requires --tool-call-parser"),
    "two-lb-modes": (serve("--data-parallel-size", "4", "--data-parallel-external-lb",
                           "--data-parallel-start-rank", "2"), "more than one data parallel load balancing mode"),
    "headless-with-api-servers": (serve("--headless", "--api-server-count", "2"), "cannot be used with --headless"),
    "router-sglang-flag": (["vllm-router", "--pd-disaggregation", "--prefill", "http://10.0.0.1:8000"],
                           "unrecognized arguments: --pd-disaggregation"),
    "router-bad-policy": (["vllm-router", "--policy", "fastest"], "invalid choice: 'fastest'"),
    "router-pd-without-decode": (["vllm-router", "--vllm-pd-disaggregation", "--prefill", "http://10.0.0.1:8000"],
                                 "requires --decode"),
    "router-bad-bootstrap-port": (["vllm-router", "--vllm-pd-disaggregation", "--prefill", "http://10.0.0.1:8000",
                                   "port", "--decode", "http://10.0.0.2:8000"], "Invalid bootstrap port"),
    "not-an-engine-command": (["python", "-m", "http.server"], "neither"),
}


@pytest.fixture(scope="module")
def known_report():
    entries: list[dict[str, Any]] = [{"id": k, "argv": v} for k, v in GOOD.items()]
    entries += [{"id": k, "argv": v[0]} for k, v in BAD.items()]
    entries.append({"id": "env", "argv": serve(), "env": {
        "VLLM_ENGINE_READY_TIMEOUT_S": "7200", "VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4": "1",
        "VLLM_USE_V2_MODEL_RUNNER": "true", "VLLM_ROCM_USE_AITER_MOE_SITUV2": "a8w4", "NCCL_CUMEM_ENABLE": "1"}})
    return run_check(entries)


def test_report_shape(known_report):
    rc, report = known_report
    assert rc == 1  # the bad ones fail
    assert report["checked"] == len(GOOD) + len(BAD) + 1


@pytest.mark.parametrize("case", sorted(GOOD))
def test_known_good_argv_accepted(known_report, case):
    _, report = known_report
    failed = {f["id"]: f["error"] for f in report["failures"]}
    assert case not in failed, failed.get(case)


@pytest.mark.parametrize("case", sorted(BAD))
def test_known_bad_argv_rejected(known_report, case):
    _, report = known_report
    failed = {f["id"]: f["error"] for f in report["failures"]}
    assert case in failed, f"{case} was accepted by the real parser"
    assert BAD[case][1] in failed[case]


def test_launch_modes(known_report):
    _, report = known_report
    assert report["launch"]["dep-worker-headless"] == {"mode": "headless", "api_server_count": 0}
    assert report["launch"]["tools"]["mode"] == "api_server"
    assert report["launch"]["router-pd"] == {"mode": "router"}


def test_env_checked_by_vllm(known_report):
    _, report = known_report
    errors = [e["error"] for e in report["env_failures"] if e["id"] == "env"]
    assert any("Unknown vLLM environment variable detected: VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4" in e
               for e in errors)
    assert any(e.startswith("VLLM_USE_V2_MODEL_RUNNER='true'") for e in errors)
    assert len(errors) == 2  # the registered, well-formed ones and non-VLLM names pass


def test_strict_env_exit_status():
    entries = [{"id": "e", "argv": serve(), "env": {"VLLM_RPC_TIMEOUT": "100"}}]
    rc, report = run_check(entries, "--strict-env")
    assert rc == 1 and not report["failures"]
    assert report["env_failures"][0]["error"].endswith("VLLM_RPC_TIMEOUT")


# -- the builder's printed commands and every plan over the offered matrix ---------------------------------------


def golden_entries() -> list[dict[str, Any]]:
    cases = json.loads(GOLDEN.read_text())["cases"]
    out = []
    for c in cases:
        sel = c["case"]
        label = "/".join(str(sel.get(k)) for k in ("hw", "strategy", "variant"))
        label += "/" + (",".join(sel.get("features") or []) or "-")
        for n in c["nodes"]:
            entry: dict[str, Any] = {"id": f"golden:{label}:{n['role']}{n['rank']}"}
            entry["argv"] = n["argv"] if "argv" in n else shlex.split(n["command"].replace("\\\n", " "))
            entry["env"] = n.get("env") or {}
            out.append(entry)
    return out


def matrix_entries() -> list[dict[str, Any]] | None:
    """argv + env of every node of every plan over the offered matrix (deduplicated), or None if the resolver
    is not importable."""
    try:
        from k3deploy import load_recipe, resolve
        from k3deploy.recipe.offering import iter_matrix
    except ImportError:
        return None
    recipe = load_recipe()
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for sel in iter_matrix(recipe):
        kwargs = sel if isinstance(sel, dict) else dict(
            zip(("hardware", "strategy", "variant", "features", "nodes"), sel, strict=False))
        plan = resolve(recipe, **kwargs).to_dict()
        label = f"{plan['hardware']}/{plan['strategy']}/{plan['variant']}/{','.join(plan['features']) or '-'}"
        for node in plan["nodes"]:
            key = (tuple(node["argv"]), tuple(node["env"].items()))
            if key not in seen:
                seen[key] = {"id": f"matrix:{label}:{node['role']}{node['rank']}", "argv": node["argv"],
                             "env": node["env"], "also": 0}
            else:
                seen[key]["also"] += 1
    return [{k: v for k, v in e.items() if k != "also"} for e in seen.values()]


def scale_entries() -> list[dict[str, Any]]:
    """Plans beyond the builder's 16 nodes (a full NVL72 rack of 18 trays, 36, 72) and P/D pools of several
    nodes, every node's argv as k3deploy deploys it."""
    from k3deploy import load_recipe, resolve
    from k3deploy.recipe.fixes import deployable

    recipe = load_recipe()
    plans = [deployable(resolve(recipe, hardware=hw, strategy=s, nodes=n))
             for hw in ("gb300", "gb200") for s in ("multi_node_dep", "multi_node_tp", "multi_node_tep",
                                                     "multi_node_tp_dp") for n in (18, 36, 72)]
    plans += [deployable(resolve(recipe, hardware="b300", strategy="multi_node_tp_pp", nodes=n)) for n in (18, 36)]
    plans += [deployable(resolve(recipe, hardware="b300", strategy="pd_cluster", prefill_nodes=p, decode_nodes=d))
              for p, d in ((4, 8), (18, 18))]
    out = []
    for plan in plans:
        n = len([x for x in plan.nodes if x.role != "router"])
        for node in plan.nodes:
            out.append({"id": f"scale:{plan.hardware}/{plan.strategy}/{n}:{node.role}{node.rank}",
                        "argv": node.argv, "env": node.env})
    return out


@pytest.fixture(scope="module")
def golden_and_matrix_report():
    entries = golden_entries()
    matrix = matrix_entries()
    if matrix is not None:
        entries += matrix + scale_entries()
    rc, report = run_check(entries)
    return rc, report, len(golden_entries()), matrix


def _summary(report: dict[str, Any], prefix: str) -> str:
    lines = [f"{f['id']}: {f['error']}\n    {shlex.join(f['argv'])}" for f in report["failures"]
             if f["id"].startswith(prefix)]
    return "\n".join(lines)


def test_every_golden_argv_accepted(golden_and_matrix_report):
    rc, report, n_golden, _ = golden_and_matrix_report
    assert n_golden > 0
    bad = _summary(report, "golden:")
    assert not bad, "builder argvs rejected by the real parsers:\n" + bad
    if not report["failures"]:
        # env problems alone (the builder's ROCm env has one) do not fail the run without --strict-env
        assert rc == 0


def test_every_matrix_argv_accepted(golden_and_matrix_report):
    _, report, _, matrix = golden_and_matrix_report
    if matrix is None:
        pytest.skip("k3deploy.resolver.iter_matrix is not available")
    assert len(matrix) > 100
    bad = _summary(report, "matrix:")
    assert not bad, "resolver argvs rejected by the real parsers:\n" + bad


def test_every_argv_beyond_the_builder_accepted(golden_and_matrix_report):
    _, report, _, matrix = golden_and_matrix_report
    if matrix is None:
        pytest.skip("k3deploy's resolver is not available")
    bad = _summary(report, "scale:")
    assert not bad, "argvs of plans beyond 16 nodes rejected by the real parsers:\n" + bad
    assert report["checked"] >= len(scale_entries()) > 300  # 18 to 72 trays, P/D pools of 4 + 8 and 18 + 18


def test_matrix_env_names_known_to_vllm(golden_and_matrix_report):
    """Report (not fail on) the env vars vLLM itself rejects in the resolved plans: they are lint findings."""
    _, report, _, matrix = golden_and_matrix_report
    if matrix is None:
        pytest.skip("k3deploy.resolver.iter_matrix is not available")
    problems = sorted({e["error"] for e in report["env_failures"] if e["id"].startswith("matrix:")})
    for p in problems:
        print("env:", p, file=sys.stderr)
    # Every problem is one vLLM reports as an unknown name or a bad value, never a crash of the checker.
    assert all(("Unknown vLLM environment variable" in p) or ("=" in p.split(":")[0]) for p in problems)


# -- the catalogs are what the installed engine says -------------------------------------------------------------


def test_catalogs_match_installed_engine():
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    proc = subprocess.run([str(ENGINE_PYTHON), str(ROOT / "tools" / "gen_catalogs.py"), "--check"], text=True,
                          capture_output=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


# -- the router's argv as k3deploy renders it ---------------------------------------------------------------------

_ROUTER_ARGS = ("import json, sys\nfrom vllm_router.launch_router import parse_router_args\n"
                "sys.argv[0] = 'vllm-router'\n"
                "a = parse_router_args(json.loads(sys.stdin.read())[1:])\n"
                "print(json.dumps([a.prometheus_host, a.prometheus_port]))\n")


def test_the_rendered_routers_serve_their_metrics_where_the_export_scrapes_them():
    """The P/D router and the replicas' front router as their units run them (the builder's argv plus
    ``--prometheus-host``/``--prometheus-port``, from the engine spec): the real parser accepts both and reads the
    bind address and the exported port from them (its defaults are 127.0.0.1 and 29000)."""
    from k3deploy.model.binding import BoundNode
    from k3deploy.model.rollout import front_router_argv, with_router_metrics
    from k3deploy.model.variables import Variables
    from k3deploy.recipe.plan import NodePlan
    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import INVENTORY_ONLY

    pd = gather("inventories/pd_b300.py", INVENTORY_ONLY, {"k3_router_metrics_port": 29100}).require_rollout()
    spec = next(u.spec for u in pd.units if u.group == "router")
    assert spec is not None
    v = Variables(k3_router_metrics_port=29100)
    front = front_router_argv(["http://10.0.0.1:8000", "http://10.0.0.2:8000"], v)
    node = BoundNode(NodePlan(role="router", rank=0, argv=front, env={}), front, {}, "10.0.0.1")
    argvs = {"router-rendered-pd": spec.argv, "router-rendered-front": with_router_metrics(node, v).argv}
    rc, report = run_check([{"id": k, "argv": a} for k, a in argvs.items()])
    assert rc == 0 and not report["failures"], report["failures"]
    for argv in argvs.values():
        got = subprocess.run([str(ENGINE_PYTHON), "-c", _ROUTER_ARGS], input=json.dumps(argv), text=True,
                             capture_output=True, timeout=120)
        assert got.returncode == 0, got.stderr[-2000:]
        assert json.loads(got.stdout) == ["0.0.0.0", 29100]
    default = subprocess.run([str(ENGINE_PYTHON), "-c", _ROUTER_ARGS], input=json.dumps(["vllm-router"]), text=True,
                             capture_output=True, timeout=120)
    assert json.loads(default.stdout) == ["127.0.0.1", 29000]   # why the flags are passed
