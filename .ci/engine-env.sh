# The part of .ci/vllm-env.sh and .ci/sglang-env.sh that does not depend on the engine:
# sourced (never run) by them, after they set
#   engine          the package name (vllm, sglang): pin folder tests/integration/$engine,
#                   log prefix, stamp file, default VENV .venv-$engine
#   engine_name     how the engine is written in messages (vLLM, SGLang)
#   engine_version  the pinned release (installed --no-deps)
#   engine_imports  what the requirements file feeds (for the log)
# and define
#   engine_verify_deps   extra checks after the dependencies are installed (may be a no-op)
#   engine_after_deps    run on every call before kvtier is built (may be a no-op)
#   engine_import_check  the final check that the engine and kvtier's integration import
# and then call engine_env_main "$@". The usage and the steps are in the engine scripts.

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=install-kvtier.sh
source "$repo/.ci/install-kvtier.sh"
pins="$repo/tests/integration/$engine"
constraints="$pins/constraints.txt"
requirements="$pins/requirements.txt"
env_script="$repo/.ci/$engine-env.sh"

log() { printf '[%s-env] %s\n' "$engine" "$*" >&2; }
die() { log "error: $*"; exit 1; }

run_tests() {
    local venv="${1:-.venv-$engine}"
    [[ $# -gt 0 ]] && shift
    [[ -x "$venv/bin/python" ]] \
        || die "no virtual environment at '$venv'; create it with: bash .ci/$engine-env.sh $venv"
    local python
    python="$(cd "$venv" && pwd)/bin/python"
    cd "$repo"
    exec "$python" -m pytest "tests/integration/$engine" "$@"
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

engine_env_main() {
    if [[ "${1:-}" == "--test" ]]; then
        shift
        run_tests "$@"
    fi

    venv="${1:-.venv-$engine}"
    local python="${PYTHON:-python3}"
    [[ -f "$constraints" && -f "$requirements" ]] || die "missing pin files under $pins"

    # The stamp records what steps 1-4 installed; a changed pin file or script redoes them.
    local stamp_value stamp
    stamp_value="$(cat "$constraints" "$requirements" "$env_script" "${BASH_SOURCE[0]}" \
        | sha256sum | cut -d' ' -f1)"
    stamp="$venv/.kvtier-$engine-env"

    if [[ ! -x "$venv/bin/python" ]]; then
        log "creating $venv with $("$python" --version 2>&1)"
        "$python" -m venv "$venv"
    fi

    if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]]; then
        log "dependencies already match the pin files; skipping to kvtier"
    else
        rm -f "$stamp"
        install_cpu_torch
        log "$engine_name $engine_version (without dependencies)"
        pip_in install --quiet --no-deps -c "$constraints" "$engine==$engine_version"
        log "packages $engine_imports import (pip then lists $engine_name's other declared"
        log "requirements as missing or conflicting: expected, $engine_name was installed --no-deps)"
        pip_in install --quiet -c "$constraints" -r "$requirements"
        log "build tools and pytest"
        pip_in install --quiet -c "$constraints" scikit-build-core pybind11 cmake ninja pytest
        # Belt and braces: nothing above may have replaced the CPU torch.
        "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' \
            || die "a CUDA build of torch ended up in $venv"
        engine_verify_deps
        printf '%s\n' "$stamp_value" > "$stamp"
    fi

    engine_after_deps

    install_kvtier

    engine_import_check
}
