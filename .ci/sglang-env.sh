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
#      rerun rebuilds incrementally), or the wheel KVTIER_WHEEL names (.ci/install-kvtier.sh).
# Steps 1-4 are skipped when VENV already holds exactly what the pin files describe.
# Any failure exits non-zero: CI must fail when the environment cannot be built.
set -euo pipefail

engine=sglang
engine_name=SGLang
engine_version=0.5.23
engine_imports="SGLang's HiCache modules"
# shellcheck source=engine-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/engine-env.sh"

engine_verify_deps() {
    # torchvision's CUDA build would shadow the stand-in and fail to load.
    ! pip_in show --quiet torchvision >/dev/null 2>&1 \
        || die "torchvision ended up in $venv; it cannot load on the CPU torch"
}

engine_after_deps() {
    # A path entry (no code) in site-packages: the stand-ins come after the real packages.
    local site
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    printf '%s\n' "$pins/cpu_standins" > "$site/kvtier-ci-cpu-standins.pth"
}

engine_import_check() {
    log "checking that SGLang's HiCache code and the kvtier backend import"
    "$venv/bin/python" -W ignore - <<'PY'
import sglang.srt.mem_cache.pool_host.mha  # noqa: F401  (the host pools the tests build)
import sglang.srt.mem_cache.storage.backend_factory  # noqa: F401
import kvtier.integrations.sglang as integration

print(f"[sglang-env] ok: {integration.__name__} on SGLang {integration.SGLANG_VERSION}")
PY
}

engine_env_main "$@"
