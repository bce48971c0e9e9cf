#!/usr/bin/env bash
# The virtual environment the vLLM integration tests (tests/integration/vllm) run in.
#
#   bash .ci/vllm-env.sh [VENV]                 create or update VENV (default: .venv-vllm)
#   bash .ci/vllm-env.sh --test [VENV] [ARGS]   run tests/integration/vllm in VENV; ARGS go
#                                               to pytest
#
# The environment is reproducible: every package is pinned by
# tests/integration/vllm/constraints.txt. It holds
#   1. the CPU build of torch 2.13.0 (installed first, so nothing else can pull a CUDA build),
#   2. vLLM 0.33.0 without its dependency tree (--no-deps),
#   3. just the packages vLLM's scheduler-side KV offloading code imports
#      (tests/integration/vllm/requirements.txt),
#   4. the build tools for kvtier's C++ core and pytest,
#   5. kvtier itself, built from this checkout (build tree kept in VENV/kvtier-build, so a
#      rerun rebuilds incrementally).
# Steps 1-4 are skipped when VENV already holds exactly what the pin files describe.
# Any failure exits non-zero: CI must fail when the environment cannot be built.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pins="$repo/tests/integration/vllm"
constraints="$pins/constraints.txt"
requirements="$pins/requirements.txt"

log() { printf '[vllm-env] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

run_tests() {
    local venv="${1:-.venv-vllm}"
    [[ $# -gt 0 ]] && shift
    [[ -x "$venv/bin/python" ]] \
        || die "no virtual environment at '$venv'; create it with: bash .ci/vllm-env.sh $venv"
    local python
    python="$(cd "$venv" && pwd)/bin/python"
    cd "$repo"
    exec "$python" -m pytest tests/integration/vllm "$@"
}

pip_in() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }

install_cpu_torch() {
    # Resolve first, install second: a plain torch requirement can resolve to a CUDA build
    # (gigabytes of nvidia-* wheels). Only a CPU build (local version "+cpu") is accepted.
    local report
    report="$(mktemp)"
    pip_in install --quiet --dry-run --ignore-installed --report "$report" \
        -c "$constraints" "torch==2.13.0"
    local picked
    picked="$("$venv/bin/python" - "$report" <<'PY'
import json, sys
with open(sys.argv[1]) as f:
    report = json.load(f)
for item in report["install"]:
    if item["metadata"]["name"].lower() == "torch":
        print(item["metadata"]["version"], item["download_info"]["url"])
        break
PY
)"
    rm -f "$report"
    case "$picked" in
        *+cpu*) log "torch: ${picked%% *} (CPU build)" ;;
        *) die "pip would install torch '${picked:-?}', which is not a CPU build. Make the CPU
wheel of torch 2.13.0 available to pip (e.g. --find-links to a folder holding
torch-2.13.0+cpu-*.whl, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) and retry." ;;
    esac
    pip_in install --quiet -c "$constraints" "torch==2.13.0"
}

if [[ "${1:-}" == "--test" ]]; then
    shift
    run_tests "$@"
fi

venv="${1:-.venv-vllm}"
python="${PYTHON:-python3}"
[[ -f "$constraints" && -f "$requirements" ]] || die "missing pin files under $pins"

# The stamp records what steps 1-4 installed; a changed pin file or script redoes them.
stamp_value="$(cat "$constraints" "$requirements" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
stamp="$venv/.kvtier-vllm-env"

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv with $("$python" --version 2>&1)"
    "$python" -m venv "$venv"
fi

if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]]; then
    log "dependencies already match the pin files; skipping to kvtier"
else
    rm -f "$stamp"
    install_cpu_torch
    log "vLLM 0.33.0 (without dependencies)"
    pip_in install --quiet --no-deps -c "$constraints" "vllm==0.33.0"
    log "packages vLLM's offloading code imports (pip then lists vLLM's other declared"
    log "requirements as missing or conflicting: expected, vLLM was installed --no-deps)"
    pip_in install --quiet -c "$constraints" -r "$requirements"
    log "build tools and pytest"
    pip_in install --quiet -c "$constraints" scikit-build-core pybind11 cmake ninja pytest
    # Belt and braces: nothing above may have replaced the CPU torch.
    "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' \
        || die "a CUDA build of torch ended up in $venv"
    printf '%s\n' "$stamp_value" > "$stamp"
fi

log "kvtier from $repo (C++ build in $venv/kvtier-build)"
pip_in install --quiet --no-build-isolation --no-deps \
    -C "build-dir=$(cd "$venv" && pwd)/kvtier-build" "$repo"

log "checking that vLLM's tiering code and the kvtier tier import"
"$venv/bin/python" - <<'PY'
import vllm.v1.kv_offload.tiering.spec  # noqa: F401  (the CPU primary tier and the manager)
import kvtier.integrations.vllm as integration

print(f"[vllm-env] ok: {integration.__name__} on vLLM {integration.VLLM_VERSION}")
PY
