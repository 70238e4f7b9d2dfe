#!/usr/bin/env bash
# Set up (tools/setup.sh) and run the whole test suite. Extra arguments go to pytest.
#
#   bash tools/test.sh            # the whole suite (= CI, .ci/run): gates, unit, simulator and end-to-end tests
#   bash tools/test.sh --quick    # the inner loop: ruff, mypy, the unit tests and doctests (tests/unit); no root,
#                                 # no simulated cluster, no engine venv; sets up .venv only where it is missing
#                                 # (docs/testing.md)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --quick ]; then
  shift
  [ -x .venv/bin/python ] || bash tools/setup.sh
  bash tools/lint.sh
  # the conformance tests need the 2.3 GB engine venv: the whole suite runs them
  exec .venv/bin/pytest -q -n 2 -m "not conformance" tests/unit "$@"
fi
bash tools/setup.sh
# the code gates: ruff and mypy (tools/lint.sh)
bash tools/lint.sh
# the real vLLM 0.33.0 / vllm-router 0.1.17 parsers, in their own venv, for the conformance tests
bash tools/engine-venv.sh >/dev/null
# four test processes (pytest-xdist), a test module at a time each (a module-scoped simulated cluster stays in one
# process), the longest modules first (tests/conftest.py orders them by their measured times): the simulated
# clusters' waits overlap with the other processes' work (on 2 cores: 20m18s against 22m50s with three,
# docs/testing.md). K3_TEST_PROCESSES sets another count; `-n 0` among the arguments runs it in one process.
exec .venv/bin/pytest -q -n "${K3_TEST_PROCESSES:-4}" --dist loadscope --no-loadscope-reorder "$@"
