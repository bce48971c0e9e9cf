#!/usr/bin/env bash
# Builds kvtier on a CUDA machine and runs the tests marked `gpu`, in one call, offline.
#
#   bash tests/gpu/run.sh            # from anywhere; PYTHON=... picks the interpreter
#
# Expects Python >= 3.10 with scikit-build-core, pybind11, pytest, numpy and CUDA torch
# installed, plus cmake (>= 3.21), ninja and a C++17 compiler. Prints the versions it finds,
# fails fast on a missing dependency, builds with `pip install --no-build-isolation --no-deps .`,
# runs the GPU tests (then the CUDA stand-in tests) and, when $OUT is set, copies the log, the
# JUnit reports and the bandwidth figures (gpu_results.json) there. Stays under 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3}
RESULTS=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-gpu.XXXXXX")
LOG="$RESULTS/run.log"
exec > >(tee "$LOG") 2>&1

publish() {
  local rc=$?
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT" && cp -r "$RESULTS"/. "$OUT"/ || true
  fi
  echo "==== run.sh finished with status $rc after ${SECONDS}s (results: ${OUT:-$RESULTS})"
}
trap publish EXIT

step() { printf '\n==== %s (%ss)\n' "$*" "$SECONDS"; }
die() { echo "ERROR: $*" >&2; exit 2; }

export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

step "versions"
command -v "$PY" >/dev/null || die "no '$PY' interpreter (set PYTHON=/path/to/python3)"
"$PY" --version
"$PY" - <<'EOF' || true
try:
    import torch
    print(f"torch {torch.__version__}, torch.version.cuda {torch.version.cuda}, "
          f"cuda available {torch.cuda.is_available()}")
    if torch.cuda.is_available():
        print(f"device: {torch.cuda.get_device_name()}, capability {torch.cuda.get_device_capability()}")
except Exception as e:  # reported again, as a failure, by the dependency check below
    print(f"torch: not importable ({e})")
EOF
timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader \
  || echo "nvidia-smi: not available"
nvcc=$(command -v nvcc || ls "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" 2>/dev/null || true)
if [ -n "$nvcc" ]; then echo "nvcc ($nvcc): $("$nvcc" --version | tail -n 1)"; else echo "nvcc: not found"; fi
for tool in cmake ninja c++; do
  if command -v "$tool" >/dev/null; then echo "$tool: $("$tool" --version | head -n 1)"; else echo "$tool: not found"; fi
done

step "build dependencies"
"$PY" - <<'EOF' || die "missing Python build/test dependencies (see above); this machine is offline, so preinstall them"
import importlib, sys
if sys.version_info < (3, 10):
    sys.exit(f"Python >= 3.10 required, found {sys.version.split()[0]}")
missing = []
for name in ("scikit_build_core", "pybind11", "pytest", "numpy", "torch"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except ImportError as e:
        missing.append(f"{name} ({e})")
import torch
if not torch.cuda.is_available():
    missing.append(f"a CUDA-enabled torch that sees a GPU (torch {torch.__version__}, "
                   f"torch.version.cuda={torch.version.cuda})")
if missing:
    sys.exit("missing: " + "; ".join(missing))
EOF
command -v cmake >/dev/null || die "cmake (>= 3.21) is not installed"
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler (c++/g++)"
command -v ninja >/dev/null || echo "note: ninja not found; CMake falls back to make"

step "build (pip install --no-build-isolation --no-deps .)"
timeout 130 "$PY" -m pip install --no-build-isolation --no-deps . \
  || die "building kvtier failed (or took more than 130 s)"
"$PY" -c "import kvtier, kvtier._core as c; print('kvtier', kvtier.__version__, c.__file__)"

status=0
step "GPU tests"
export KVTIER_GPU_RESULTS="$RESULTS/gpu_results.json"
timeout 100 "$PY" -m pytest -m gpu tests/python/test_gpu_cuda.py tests/python/test_gpu_transfer.py \
  -v -rs -s -p no:cacheprovider --junitxml="$RESULTS/junit-gpu.xml" || status=1

step "CUDA stand-in tests"
timeout 60 "$PY" -m pytest tests/python/test_cuda_standin.py -q -rs -p no:cacheprovider \
  --junitxml="$RESULTS/junit-standin.xml" || status=1

if [ -f "$KVTIER_GPU_RESULTS" ]; then cat "$KVTIER_GPU_RESULTS"; fi
exit "$status"
