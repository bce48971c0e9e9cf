#!/usr/bin/env bash
# The virtual environment the SGLang integration tests (tests/integration/sglang) run in.
#
#   bash .ci/sglang-env.sh [VENV]                 create or update VENV (default: .venv-sglang)
#   bash .ci/sglang-env.sh --test [VENV] [ARGS]   run tests/integration/sglang in VENV; ARGS go
#                                                 to pytest
#
# The environment is reproducible: every package is pinned by
# tests/integration/sglang/constraints.txt. It holds
#   1. the CPU build of torch 2.13.0 (installed first, so nothing else can pull a CUDA build),
#   2. SGLang 0.5.23 without its dependency tree (--no-deps),
#   3. just the packages SGLang's HiCache storage and host-pool modules import
#      (tests/integration/sglang/requirements.txt), and on the path a stand-in for
#      torchvision, whose only wheel for torch 2.13 cannot load on a CPU torch
#      (tests/integration/sglang/cpu_standins/torchvision says why),
#   4. the build tools for kvtier's C++ core and pytest,
#   5. kvtier itself, built from this checkout (build tree kept in VENV/kvtier-build, so a
#      rerun rebuilds incrementally).
# Steps 1-4 are skipped when VENV already holds exactly what the pin files describe.
# Any failure exits non-zero: CI must fail when the environment cannot be built.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pins="$repo/tests/integration/sglang"
constraints="$pins/constraints.txt"
requirements="$pins/requirements.txt"
standins="$pins/cpu_standins"

log() { printf '[sglang-env] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

run_tests() {
    local venv="${1:-.venv-sglang}"
    [[ $# -gt 0 ]] && shift
    [[ -x "$venv/bin/python" ]] \
        || die "no virtual environment at '$venv'; create it with: bash .ci/sglang-env.sh $venv"
    local python
    python="$(cd "$venv" && pwd)/bin/python"
    cd "$repo"
    exec "$python" -m pytest tests/integration/sglang "$@"
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

venv="${1:-.venv-sglang}"
python="${PYTHON:-python3}"
[[ -f "$constraints" && -f "$requirements" ]] || die "missing pin files under $pins"

# The stamp records what steps 1-4 installed; a changed pin file or script redoes them.
stamp_value="$(cat "$constraints" "$requirements" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
stamp="$venv/.kvtier-sglang-env"

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv with $("$python" --version 2>&1)"
    "$python" -m venv "$venv"
fi

if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]]; then
    log "dependencies already match the pin files; skipping to kvtier"
else
    rm -f "$stamp"
    install_cpu_torch
    log "SGLang 0.5.23 (without dependencies)"
    pip_in install --quiet --no-deps -c "$constraints" "sglang==0.5.23"
    log "packages SGLang's HiCache modules import (pip then lists SGLang's other declared"
    log "requirements as missing or conflicting: expected, SGLang was installed --no-deps)"
    pip_in install --quiet -c "$constraints" -r "$requirements"
    log "build tools and pytest"
    pip_in install --quiet -c "$constraints" scikit-build-core pybind11 cmake ninja pytest
    # Belt and braces: nothing above may have replaced the CPU torch or brought torchvision
    # (whose CUDA build would shadow the stand-in and fail to load).
    "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' \
        || die "a CUDA build of torch ended up in $venv"
    ! pip_in show --quiet torchvision >/dev/null 2>&1 \
        || die "torchvision ended up in $venv; it cannot load on the CPU torch"
    printf '%s\n' "$stamp_value" > "$stamp"
fi

# A path entry (no code) in site-packages: the stand-ins come after the real packages.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
printf '%s\n' "$standins" > "$site/kvtier-ci-cpu-standins.pth"

log "kvtier from $repo (C++ build in $venv/kvtier-build)"
pip_in install --quiet --no-build-isolation --no-deps \
    -C "build-dir=$(cd "$venv" && pwd)/kvtier-build" "$repo"

log "checking that SGLang's HiCache code and the kvtier backend import"
"$venv/bin/python" -W ignore - <<'PY'
import sglang.srt.mem_cache.pool_host.mha  # noqa: F401  (the host pools the tests build)
import sglang.srt.mem_cache.storage.backend_factory  # noqa: F401
import kvtier.integrations.sglang as integration

print(f"[sglang-env] ok: {integration.__name__} on SGLang {integration.SGLANG_VERSION}")
PY
