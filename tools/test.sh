#!/usr/bin/env bash
# Set up (tools/setup.sh) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# the code gates: ruff and mypy (tools/lint.sh)
bash tools/lint.sh
# the real vLLM 0.33.0 / vllm-router 0.1.17 parsers, in their own venv, for the conformance tests
bash tools/engine-venv.sh >/dev/null
# two test processes (pytest-xdist), a test module at a time each (a module-scoped simulated cluster stays in one
# process), in file order (the long end-to-end modules first): the simulated clusters' waits overlap with the other
# process's work. `-n 0` among the arguments runs it in one process.
exec .venv/bin/pytest -q -n 2 --dist loadscope --no-loadscope-reorder "$@"
