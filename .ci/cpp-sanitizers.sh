#!/usr/bin/env bash
# Builds the C++ unit tests under AddressSanitizer+UndefinedBehaviorSanitizer and under
# ThreadSanitizer (each in its own build directory under a temporary directory) and runs
# them with ctest. Any sanitizer report fails the run. The tests include the staged device
# path (test_device_staging: SegmentCopier, pinned staging, stream events) against the CUDA
# stand-in runtime (tests/cuda_standin/fake_cudart.cpp), which is built with the same
# sanitizer and loaded by the core through $KVTIER_CUDART, as ctest's environment sets.
# Every engine test runs twice, once per I/O engine (`name` on psync, `name_io_uring` on
# io_uring: the kernel's io_uring works under both sanitizers' interceptors); the io_uring
# entries skip, with a note here, where the kernel refuses io_uring.
#
#   .ci/cpp-sanitizers.sh            # both
#   .ci/cpp-sanitizers.sh thread     # only one: 'address,undefined' or 'thread'
#
# Environment: KVTIER_JOBS (parallel compile jobs, default 2), KVTIER_KEEP_BUILD=1 keeps the
# build directories (their path is printed).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${KVTIER_JOBS:-2}"
if [[ $# -gt 0 ]]; then sanitizers=("$@"); else sanitizers=("address,undefined" "thread"); fi

work="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-sanitizers.XXXXXX")"
if [[ -z "${KVTIER_KEEP_BUILD:-}" ]]; then
  trap 'rm -rf "$work"' EXIT
else
  echo "build directories kept under $work"
fi

generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

# Halt at the first report; the harness exits non-zero, so ctest fails.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_init_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"

status=0
for san in "${sanitizers[@]}"; do
  case "$san" in
    address,undefined | thread) ;;
    *) echo "unknown sanitizer set '$san' (use 'address,undefined' or 'thread')" >&2; exit 2 ;;
  esac
  build="$work/${san//,/-}"
  echo "=== KVTIER_SANITIZE=$san ($build)"
  cmake -S "$repo" -B "$build" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKVTIER_BUILD_TESTS=ON \
    -DKVTIER_SANITIZE="$san" \
    -DCMAKE_CXX_FLAGS="-fno-sanitize-recover=all" >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log"; exit 1; }
  cmake --build "$build" -j "$jobs"
  log="$build.ctest.log"
  mkdir -p "$build/scratch"
  TMPDIR="$build/scratch" ctest --test-dir "$build" --output-on-failure -j 1 2>&1 | tee "$log" || true
  # gcc 12's TSan runtime now and then cannot map its shadow memory for a new region ("failed
  # to allocate ... (errno: 12)"; seen once in ~15 runs of the same test, never twice): the
  # runtime gave up before the test ran, not a report. Only then, and only once, the failed
  # tests run again; the checks below read the rerun's verdict, and any report still fails.
  if grep -q "ThreadSanitizer failed to allocate" "$log" && ! grep -qE "WARNING: ThreadSanitizer|ThreadSanitizer: reported" "$log"; then
    echo "=== the TSan runtime could not map memory; rerunning the failed tests once" >&2
    mv "$log" "$build.ctest.first.log"
    TMPDIR="$build/scratch" ctest --test-dir "$build" --output-on-failure -j 1 --rerun-failed 2>&1 | tee "$log" || true
    # The device-path checks below look for a pass line: carry the first run's over.
    grep -E "Test +#[0-9]+: .* Passed" "$build.ctest.first.log" >>"$log"
  fi
  # Belt and braces: a report from a child process or a recovered check still fails the run.
  if grep -qE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer|ThreadSanitizer: reported" "$log"; then
    echo "=== sanitizer report found in $log" >&2
    status=1
  fi
  # ctest's own verdict (its exit status is lost in the pipe above).
  grep -q "100% tests passed" "$log" || status=1
  # The device-path tests must have run, not been dropped from the build.
  for t in test_device_staging test_device_staging_per_run; do
    grep -qE "Test +#[0-9]+: $t \.+ +Passed" "$log" || { echo "=== $t did not run and pass" >&2; status=1; }
  done
  if grep -qE "_io_uring \.+\*+Skipped|test_uring_faults \.+\*+Skipped" "$log"; then
    echo "=== note: io_uring tests skipped (the kernel refuses io_uring or NOP injection here)" >&2
  fi
done
exit "$status"
