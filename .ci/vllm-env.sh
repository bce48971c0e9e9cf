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
#      rerun rebuilds incrementally), or the wheel KVTIER_WHEEL names (.ci/install-kvtier.sh).
# Steps 1-4 are skipped when VENV already holds exactly what the pin files describe.
# Any failure exits non-zero: CI must fail when the environment cannot be built.
set -euo pipefail

engine=vllm
engine_name=vLLM
engine_version=0.33.0
engine_imports="vLLM's offloading code"
# shellcheck source=engine-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/engine-env.sh"

engine_verify_deps() { :; }
engine_after_deps() { :; }

engine_import_check() {
    log "checking that vLLM's tiering code and the kvtier tier import"
    "$venv/bin/python" - <<'PY'
import vllm.v1.kv_offload.tiering.spec  # noqa: F401  (the CPU primary tier and the manager)
import kvtier.integrations.vllm as integration

print(f"[vllm-env] ok: {integration.__name__} on vLLM {integration.VLLM_VERSION}")
PY
}

engine_env_main "$@"
