#!/usr/bin/env bash
# Create the "engine" virtualenv: the pinned vLLM and vllm-router, installed for argument parsing only.
#
#   tools/engine-venv.sh [DIR]          # default DIR: .venv-engine (relative to the repository root)
#
# What it holds:
#   * torch (CPU build; vLLM imports torch at module level),
#   * vllm==0.33.0 installed with --no-deps, plus only the packages that the import path of
#     `vllm serve`'s argument parser, `AsyncEngineArgs`, `vllm.envs` and the backend registries needs,
#     each at the version vLLM's own metadata asks for (read from the installed wheel),
#   * vllm-router==0.1.17 with its (small) dependencies.
#
# vLLM 0.33.0 pins torch==2.14.0 and a CUDA 13 stack (flashinfer, cutlass-dsl, ...). None of that is needed to
# build the parser, so torch 2.13.0 CPU is used and the GPU packages are skipped. The parser imports with
# VLLM_TARGET_DEVICE=cpu on a machine without a GPU.
#
# Idempotent: a stamp file records what was installed; a second run with the same pins only re-checks the
# imports. Override the pins with the environment variables below (TORCH_SPEC is handy where the default
# index would resolve torch to a CUDA build: point PIP_INDEX_URL/PIP_EXTRA_INDEX_URL at a CPU wheel index).
#
#   PYTHON          interpreter used to create the venv (default: python3; needs >= 3.10)
#   TORCH_SPEC      default "torch==2.13.0"
#   VLLM_VERSION    default 0.33.0
#   ROUTER_VERSION  default 0.1.17
#
# Used by: tests/helpers/check_argv.py, tests/unit/test_conformance.py, tools/gen_catalogs.py.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.venv-engine}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
ROUTER_VERSION="${ROUTER_VERSION:-0.1.17}"

# Packages (by their names in vLLM's Requires-Dist) that the parser / registry import path needs.
# xgrammar is installed separately with --no-deps: its only heavy dependency is triton (1 GB), which the
# parser never uses.
VLLM_DEPS=(
  aiohttp cachetools cbor2 cloudpickle einops "fastapi[standard]" huggingface_hub llguidance msgspec numpy openai
  orjson oss-harmony partial-json-parser pillow prometheus_client psutil py-cpuinfo pybase64 pydantic pyyaml
  pyzmq regex requests safetensors setproctitle tokenizers tqdm transformers watchfiles
)
NO_DEPS=(xgrammar apache-tvm-ffi)
IMPORT_CHECK='import vllm.entrypoints.cli.serve, vllm.envs, vllm.engine.arg_utils, vllm_router.launch_router, vllm_router.router'

STAMP_WANT="python=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') torch=$TORCH_SPEC vllm=$VLLM_VERSION router=$ROUTER_VERSION deps=${VLLM_DEPS[*]} nodeps=${NO_DEPS[*]}"
STAMP="$DIR/.k3deploy-engine-stamp"

log() { printf '[engine-venv] %s\n' "$*" >&2; }

check_imports() {
  VLLM_TARGET_DEVICE=cpu "$DIR/bin/python" -c "$IMPORT_CHECK" >/dev/null 2>&1
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_WANT" ]] && check_imports; then
  log "up to date: $DIR"
  exit 0
fi

start=$(date +%s)
if [[ ! -x "$DIR/bin/python" ]]; then
  log "creating $DIR with $PYTHON"
  "$PYTHON" -m venv "$DIR"
fi
PIP=("$DIR/bin/python" -m pip --disable-pip-version-check -q)
# pip reports conflicts against the packages deliberately left out (CUDA kernels, torch==2.14): expected.
pip_install() {
  "${PIP[@]}" install "$@" 2> >(grep -v -e "^ERROR: pip's dependency resolver" -e "requires .*, which is not installed" \
    -e "which is incompatible" -e "^WARNING: Location" >&2 || true)
}

log "installing $TORCH_SPEC"
pip_install "$TORCH_SPEC"

log "installing vllm==$VLLM_VERSION (--no-deps) and vllm-router==$ROUTER_VERSION"
pip_install --no-deps "vllm==$VLLM_VERSION"
pip_install "vllm-router==$ROUTER_VERSION"

# Take each needed dependency with the specifier (and marker) vLLM's metadata gives it.
mapfile -t SPECS < <("$DIR/bin/python" - "${VLLM_DEPS[@]}" <<'EOF'
import re, sys
from importlib.metadata import requires

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

wanted = {}
for arg in sys.argv[1:]:
    wanted[norm(re.split(r"[\[<>=!~; ]", arg, maxsplit=1)[0])] = arg
found = {}
for req in requires("vllm") or []:
    if "extra ==" in req:
        continue
    name = norm(re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0])
    if name in wanted:
        found[name] = req
for name, arg in wanted.items():
    print(found.get(name, arg))
EOF
)
mapfile -t NO_DEPS_SPECS < <("$DIR/bin/python" - "${NO_DEPS[@]}" <<'EOF'
import re, sys
from importlib.metadata import requires

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

reqs = {norm(re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0]): r for r in requires("vllm") or [] if "extra ==" not in r}
for arg in sys.argv[1:]:
    print(reqs.get(norm(arg), arg))
EOF
)

log "installing ${#SPECS[@]} parser dependencies at vLLM's pins"
# torch is already there and satisfies every dependent; pip keeps it.
pip_install "${SPECS[@]}"
pip_install --no-deps "${NO_DEPS_SPECS[@]}"

if ! VLLM_TARGET_DEVICE=cpu "$DIR/bin/python" -c "$IMPORT_CHECK"; then
  log "import check failed: see the error above"
  exit 1
fi
printf '%s' "$STAMP_WANT" > "$STAMP"
end=$(date +%s)
size=$(du -sh "$DIR" | cut -f1)
log "ready: $DIR ($size, $((end - start)) s)"
