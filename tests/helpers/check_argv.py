"""Check argument vectors against the real ``vllm serve`` and ``vllm-router`` parsers.

Run it with the engine venv's interpreter (``tools/engine-venv.sh`` creates it)::

    VLLM_TARGET_DEVICE=cpu .venv-engine/bin/python tests/conformance/check_argv.py < cases.json

Input (stdin, or ``--input FILE``): a JSON list of entries::

    [{"id": "gb200/multi_node_dep/head", "argv": ["vllm", "serve", "moonshotai/Kimi-K3", "--flag", ...],
      "env": {"VLLM_ENGINE_READY_TIMEOUT_S": "7200"}},            # env is optional
     {"id": "router", "argv": ["vllm-router", "--vllm-pd-disaggregation", ...]},
     {"id": "router-as-text", "command": "vllm-router --policy round_robin \\\n  --host $ROUTER_HOST"}]

Output (stdout): ``{"checked": N, "failures": [{"id", "argv", "error"}], "env_failures": [...],
"warnings": [...], "launch": {...}}``. Exit status 1 when any argv is rejected (or, with ``--strict-env``,
when an env var is rejected), else 0.

What "accepted" means here, for ``vllm serve`` (the same steps ``vllm serve`` takes before it starts
anything):

1. the top-level ``FlexibleArgumentParser`` with the ``serve`` sub-command built by
   ``ServeSubcommand.subparser_init`` (``make_arg_parser``: frontend + engine flags); argparse rejects unknown
   flags, bad ``choices`` (``Literal`` fields) and values of the wrong type; nested configs
   (``--attention-config``, ``--speculative-config``, ``--kv-transfer-config``, ``--compilation-config`` ...)
   are validated by pydantic at parse time;
2. ``ServeSubcommand.validate`` (``validate_parsed_serve_args``);
3. ``ServeSubcommand.cmd`` up to the point where it launches servers or engines (``--headless`` vs
   ``--api-server-count``, one data-parallel load-balancing mode at most); the launchers themselves are
   replaced by recorders, and the chosen launch mode is reported under ``launch``;
4. ``AsyncEngineArgs.from_cli_args`` (``EngineArgs.__post_init__`` builds the nested configs) and
   ``AttentionConfig.validate_backend_before`` for ``--attention-backend`` (the conversion
   ``create_engine_config`` applies before it looks at the model).

Model-dependent validation (``create_engine_config`` needs the model's ``config.json``) is not run.

With an ``env``: every ``VLLM_*`` name must be registered in ``vllm.envs`` (the check of
``Platform.validate_environ(hard_fail=True)``, i.e. ``--fail-on-environ-validation``) and its value must be
accepted by the parser ``vllm.envs`` registers for it (``int()``, choices, ...). The node's env is also in
``os.environ`` while its argv is checked, as it would be on the node.

For ``vllm-router``: ``vllm_router.launch_router.parse_router_args`` (argparse), then
``RouterArgs._validate_router_args`` and ``Router.from_args`` (builds the Rust router object; ``start()`` is
never called).

Placeholders (``$HEAD_IP``, ``${PREFILL_NODE_1}``, ``$DECODE_DP_RPC_PORT`` ...) are replaced before parsing,
since argparse type-checks integers: addresses become 10.0.0.x, ports a plausible port, ``$IFACE_NAME`` eth0.
``--set NAME=VALUE`` overrides one.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import shlex
import sys
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# Keep vLLM's own log handler off stdout: the report is the only thing printed there.
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")

#: Fixed values for the placeholders the recipe builder prints.
KNOWN_PLACEHOLDERS = {
    "HEAD_IP": "10.0.0.1",
    "MASTER_ADDR": "10.0.0.1",
    "IFACE_NAME": "eth0",
    "ROUTER_HOST": "0.0.0.0",
    "ROUTER_PORT": "8000",
    "DP_RPC_PORT": "29550",
    "PREFILL_DP_RPC_PORT": "29550",
    "DECODE_DP_RPC_PORT": "29550",
    "MASTER_PORT": "29501",
    "NODE_RANK": "1",
}


class Placeholders:
    """Deterministic stand-ins for ``$NAME`` placeholders."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.values = dict(KNOWN_PLACEHOLDERS)
        self.values.update(overrides or {})
        self._next_ip = 10

    def value(self, name: str) -> str:
        if name not in self.values:
            upper = name.upper()
            m = re.search(r"(PREFILL|DECODE|WORKER)_NODE_(\d+)$", upper)
            if m:
                base = {"PREFILL": 100, "DECODE": 150, "WORKER": 50}[m.group(1)]
                self.values[name] = f"10.0.0.{base + int(m.group(2))}"
            elif upper.endswith("_PORT"):
                self.values[name] = "29600"
            elif upper.endswith(("_IP", "_ADDR", "_ADDRESS", "_HOST")) or "_NODE" in upper:
                self._next_ip += 1
                self.values[name] = f"10.0.1.{self._next_ip}"
            elif upper.endswith(("_SIZE", "_RANK", "_COUNT", "_NODES")):
                self.values[name] = "1"
            else:
                self.values[name] = "placeholder"
        return self.values[name]

    def fill(self, text: str) -> str:
        return PLACEHOLDER.sub(lambda m: self.value(m.group(1) or m.group(2)), text)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:  # a malformed log call must not break the check
            self.messages.append(str(record.msg))


def _argparse_error(text: str) -> str:
    """The ``prog: error: ...`` line argparse printed (plus any hint lines after it)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ": error: " in ln:
            return " ".join(x.strip() for x in lines[i:])
    return lines[-1] if lines else "argument parsing failed"


@contextlib.contextmanager
def _node_environ(env: dict[str, str]):
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class VllmServe:
    """``vllm serve`` as ``vllm.entrypoints.cli.main`` builds it, with the serve sub-command only."""

    def __init__(self) -> None:
        import vllm.entrypoints.cli.serve as serve_mod
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        self.serve_mod = serve_mod
        self.AsyncEngineArgs = AsyncEngineArgs
        parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
        subparsers = parser.add_subparsers(required=False, dest="subparser")
        self.cmd = serve_mod.ServeSubcommand()
        self.cmd.subparser_init(subparsers).set_defaults(dispatch_function=self.cmd.cmd)
        self.parser = parser

    def _launch_mode(self, args: argparse.Namespace) -> dict[str, Any]:
        """Run ``ServeSubcommand.cmd`` with its launchers replaced by recorders."""
        if getattr(args, "grpc", False):
            return {"mode": "grpc"}
        mod = self.serve_mod
        seen: dict[str, Any] = {}

        def record(mode):
            def _launcher(a, *rest, **kw):
                seen["mode"] = mode
                seen["api_server_count"] = a.api_server_count
            return _launcher

        class _Loop:
            @staticmethod
            def run(coro):
                seen["mode"] = "api_server"
                seen["api_server_count"] = 1
                coro.close()

        saved = {name: getattr(mod, name) for name in ("run_dp_supervisor", "run_headless", "run_multi_api_server",
                                                        "uvloop")}
        try:
            mod.run_dp_supervisor = record("dp_supervisor")
            mod.run_headless = record("headless")
            mod.run_multi_api_server = record("multi_api_server")
            mod.uvloop = _Loop
            self.cmd.cmd(args)
        finally:
            for name, value in saved.items():
                setattr(mod, name, value)
        return seen

    def check(self, argv: list[str]) -> tuple[str | None, dict[str, Any]]:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
                args = self.parser.parse_args(argv[1:])
        except SystemExit as exc:
            if exc.code in (0, None):
                return "argv asks for help/version output instead of serving", {}
            return _argparse_error(err.getvalue()), {}
        except Exception as exc:  # FlexibleArgumentParser raises ValueError for some misuse
            return f"{type(exc).__name__}: {exc}", {}
        try:
            self.cmd.validate(args)
            launch = self._launch_mode(args)
            engine_args = self.AsyncEngineArgs.from_cli_args(args)
            if engine_args.attention_backend is not None:
                from vllm.config.attention import AttentionConfig

                # the conversion create_engine_config applies; unknown names raise ValueError
                AttentionConfig.validate_backend_before(engine_args.attention_backend)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}", {}
        return None, launch


class VllmRouter:
    """``vllm-router`` (``vllm_router.launch_router:main``) up to, not including, ``Router.start()``."""

    def __init__(self) -> None:
        from vllm_router.launch_router import parse_router_args
        from vllm_router.router import Router

        self.parse = parse_router_args
        self.Router = Router

    def check(self, argv: list[str]) -> tuple[str | None, dict[str, Any]]:
        err = io.StringIO()
        saved_prog = sys.argv[0]
        sys.argv[0] = "vllm-router"  # argparse names the program after sys.argv[0]
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
                router_args = self.parse(argv[1:])
        except SystemExit as exc:
            if exc.code in (0, None):
                return "argv asks for help/version output instead of serving", {}
            return _argparse_error(err.getvalue()), {}
        except Exception as exc:  # e.g. "Invalid bootstrap port" from RouterArgs.from_cli_args
            return f"{type(exc).__name__}: {exc}", {}
        finally:
            sys.argv[0] = saved_prog
        try:
            router_args._validate_router_args()
            self.Router.from_args(router_args)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}", {}
        return None, {"mode": "router"}


def check_env(env: dict[str, str]) -> list[str]:
    """Problems vLLM itself reports for these variables (unknown ``VLLM_*`` name, unparsable value)."""
    import vllm.envs as envs
    from vllm.platforms import current_platform

    problems: list[str] = []
    with _node_environ(env):
        try:
            current_platform.validate_environ(True)
        except ValueError as exc:
            # validate_environ stops at the first unknown name; list them all with the same rule.
            unknown = sorted(k for k in env if k.startswith("VLLM_") and k not in envs.environment_variables)
            problems.extend(f"{exc.__class__.__name__}: Unknown vLLM environment variable detected: {k}"
                            for k in unknown)
            if not unknown:
                problems.append(f"{type(exc).__name__}: {exc}")
        for name in env:
            getter = envs.environment_variables.get(name)
            if getter is None:
                continue
            try:
                getter()
            except Exception as exc:
                problems.append(f"{name}={env[name]!r}: {type(exc).__name__}: {exc}")
    return problems


def command_to_argv(command: str) -> list[str]:
    """Shell text as the recipes site prints it (backslash-newline continuations) to an argv."""
    return shlex.split(command.replace("\\\n", " "))


def run(entries: list[dict[str, Any]], placeholders: Placeholders) -> dict[str, Any]:
    collector = _Collect()
    for name in ("vllm", "vllm_router", "router", "vllm_router.router_args"):
        lg = logging.getLogger(name)
        lg.addHandler(collector)
        lg.setLevel(logging.WARNING)
        lg.propagate = False

    serve: VllmServe | None = None
    router: VllmRouter | None = None
    failures: list[dict[str, Any]] = []
    env_failures: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    launch: dict[str, Any] = {}
    for i, entry in enumerate(entries):
        ident = str(entry.get("id", i))
        if "argv" in entry:
            raw = [str(a) for a in entry["argv"]]
        elif "command" in entry:
            raw = command_to_argv(str(entry["command"]))
        else:
            failures.append({"id": ident, "argv": [], "error": "entry has neither 'argv' nor 'command'"})
            continue
        argv = [placeholders.fill(a) for a in raw]
        env = {str(k): placeholders.fill(str(v)) for k, v in (entry.get("env") or {}).items()}
        collector.messages.clear()
        if argv[:2] == ["vllm", "serve"]:
            if serve is None:
                serve = VllmServe()
            with _node_environ(env):
                error, mode = serve.check(argv)
        elif argv[:1] == ["vllm-router"]:
            if router is None:
                router = VllmRouter()
            error, mode = router.check(argv)
        else:
            error, mode = "argv starts with neither 'vllm serve' nor 'vllm-router'", {}
        if error is not None:
            failures.append({"id": ident, "argv": raw, "error": error})
        else:
            launch[ident] = mode
        if env and argv[:2] == ["vllm", "serve"]:
            for problem in check_env(env):
                env_failures.append({"id": ident, "error": problem})
        for msg in dict.fromkeys(collector.messages):
            warnings.append({"id": ident, "warning": msg})
    return {"checked": len(entries), "failures": failures, "env_failures": env_failures, "warnings": warnings,
            "launch": launch, "placeholders": placeholders.values}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", help="JSON file with the entries (default: stdin)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="value for a $NAME placeholder (repeatable)")
    ap.add_argument("--strict-env", action="store_true", help="exit 1 on env problems too")
    opts = ap.parse_args(argv)
    overrides = {}
    for item in opts.set:
        name, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set {item!r}: expected NAME=VALUE")
        overrides[name.lstrip("$")] = value
    text = open(opts.input, encoding="utf-8").read() if opts.input else sys.stdin.read()
    entries = json.loads(text)
    if not isinstance(entries, list):
        ap.error("input must be a JSON list of {id, argv[, env]} objects")
    report = run(entries, Placeholders(overrides))
    json.dump(report, sys.stdout, indent=1)
    sys.stdout.write("\n")
    bad = bool(report["failures"]) or (opts.strict_env and bool(report["env_failures"]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
