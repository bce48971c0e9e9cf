#!/usr/bin/env bash
# The virtual environment for `kvtier bench --peer vllm` on vLLM's native I/O path.
#
#   bash .ci/vllm-native-env.sh [VENV]   create or update VENV (default: .venv-vllm-native)
#   VENV/bin/python -m kvtier bench --peer vllm ...
#
# vLLM's fs tier moves its blocks in a native extension, vllm.fs_io_C, where that loads, and
# in pure Python otherwise. vllm.fs_io_C links libtorch_cuda, so under the CPU build of torch
# (the vLLM integration environment, .ci/vllm-env.sh) it never loads and the bench measured
# vLLM's slower pure-Python path. Under torch 2.13.0's CUDA build it loads on a machine
# without a GPU, and vLLM's fs tier runs on it. This environment (about 5.6 GB: the CUDA
# runtime wheels) holds, every package pinned by bench/peers/vllm-native/constraints.txt,
#   1. torch 2.13.0's CUDA build from the package index (never a local CPU wheel: the
#      machine's pip configuration, which may point at one, is ignored for this step),
#   2. vLLM 0.33.0 without its dependency tree (--no-deps),
#   3. the packages vLLM's offloading code imports (bench/peers/vllm-native/requirements.txt),
#   4. the build tools for kvtier's C++ core,
#   5. kvtier itself, built from this checkout (build tree kept in VENV/kvtier-build, so a
#      rerun rebuilds incrementally), or the wheel KVTIER_WHEEL names (.ci/install-kvtier.sh).
# Steps 1-4 are skipped when VENV already holds exactly what the pin files describe. The last
# check imports vllm.fs_io_C, confirms that torch sees no GPU (the point: the native path
# without one) and that vLLM's fs tier selected the native path. Any failure exits non-zero.
set -euo pipefail

peer=vllm-native
peer_title="vLLM (native I/O)"
# shellcheck source=peer-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/peer-env.sh"

peer_install() {
    log "torch 2.13.0, CUDA build (with its CUDA runtime wheels, ~5 GB)"
    # PIP_CONFIG_FILE=/dev/null: no configuration file's find-links or index can substitute a
    # CPU wheel; the constraints pin every CUDA wheel torch pulls.
    PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS='' PIP_EXTRA_INDEX_URL='' \
        pip_in install --quiet -c "$constraints" "torch==2.13.0"
    "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' \
        || die "torch in $venv is not a CUDA build (torch.version.cuda is None); vllm.fs_io_C
needs libtorch_cuda. Remove $venv and retry; check that pip can reach the package index."
    log "vLLM 0.33.0 (without dependencies)"
    pip_in install --quiet --no-deps -c "$constraints" "vllm==0.33.0"
    log "packages vLLM's offloading code imports (pip then lists vLLM's other declared"
    log "requirements as missing or conflicting: expected, vLLM was installed --no-deps)"
    pip_in install --quiet -c "$constraints" -r "$requirements"
    "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' \
        || die "a CPU build of torch replaced the CUDA build in $venv"
}

peer_import_check() {
    log "checking that vllm.fs_io_C loads without a GPU and that vLLM's fs tier uses it"
    "$venv/bin/python" - <<'PY'
import sys

import torch

if torch.cuda.is_available():
    sys.exit(
        "[vllm-native-env] error: torch.cuda.is_available() is True: this environment shows "
        "vLLM's native path on a machine without a GPU; on a GPU machine measure the vLLM "
        "install you run in production instead"
    )
import vllm.fs_io_C  # noqa: F401  (fails loudly here if the extension cannot load)

from kvtier.bench.peer_vllm import vllm_status

status = vllm_status()
if not status.get("available") or status.get("io_path_kind") != "native":
    sys.exit(f"[vllm-native-env] error: vLLM's fs tier does not use vllm.fs_io_C: {status}")
print(
    f"[vllm-native-env] ok: vLLM {status['version']}, {status['io_path']}, torch "
    f"{torch.__version__} (CUDA {torch.version.cuda}), torch.cuda.is_available() False"
)
PY
}

peer_env_main "$@"
