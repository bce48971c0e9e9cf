#!/usr/bin/env bash
# Cross-compiles the C++ CRC32C and header tests for aarch64 and runs them under qemu-user,
# which proves the aarch64 CRC32C paths on an x86-64 machine: qemu's "max" CPU has PMULL and
# the CRC32 extension, and KVTIER_REQUIRE_CRC32C_IMPL=armv8-pmull makes the tests fail unless
# the library detected PMULL and chose the folding kernel (csrc/src/util/crc32c_arm.cpp). Every
# implementation is checked against a bitwise reference in each run, and ctest runs the test
# once more per implementation forced through KVTIER_CRC32C_IMPL (test_crc32c_armv8-pmull,
# test_crc32c_armv8-crc, test_crc32c_table), each of which checks that the forced one ran.
# The fused copy and CRC (kvtier::crc32c_copy: the PMULL kernel storing what it folds, the
# blocked copy of the other two) is checked the same way, against memcpy and the reference.
#
#   .ci/aarch64-crc.sh
#
# Installs g++-aarch64-linux-gnu and qemu-user with apt-get when missing (CI runs as root).
# Environment: KVTIER_JOBS (parallel compile jobs, default 2).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${KVTIER_JOBS:-2}"
cxx=aarch64-linux-gnu-g++
sysroot=/usr/aarch64-linux-gnu  # where the cross toolchain's libc and libstdc++ live

if ! command -v "$cxx" >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu qemu-user
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-aarch64.XXXXXX")"
trap 'rm -rf "$work"' EXIT

generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

# ctest runs each test through the emulator (CMAKE_CROSSCOMPILING_EMULATOR).
cmake -S "$repo" -B "$work" "${generator[@]}" \
  -DCMAKE_SYSTEM_NAME=Linux \
  -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
  -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_FIND_ROOT_PATH="$sysroot" \
  -DCMAKE_CROSSCOMPILING_EMULATOR="qemu-aarch64;-cpu;max;-L;$sysroot" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVTIER_BUILD_TESTS=ON >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work" -j "$jobs" --target test_crc32c test_header

file "$work/tests/cpp/test_crc32c" 2>/dev/null || true
mkdir -p "$work/scratch"
log="$work/ctest.log"
TMPDIR="$work/scratch" KVTIER_REQUIRE_CRC32C_IMPL=armv8-pmull \
  ctest --test-dir "$work" --output-on-failure -V -R '^(test_crc32c.*|test_header)$' 2>&1 |
  tee "$log"
# ctest's verdict (its status is lost in the pipe), and every forced run must have happened.
grep -q "100% tests passed" "$log"
for impl in armv8-pmull armv8-crc table; do
  grep -q "crc32c implementation in use: $impl (KVTIER_CRC32C_IMPL=$impl;" "$log" ||
    { echo "=== the $impl run did not report $impl in use" >&2; exit 1; }
done
grep -q "crc32c implementation in use: armv8-pmull (KVTIER_CRC32C_IMPL=<unset>;" "$log" ||
  { echo "=== the automatic choice was not armv8-pmull" >&2; exit 1; }
# The copy tests ran (and passed: ctest's verdict above) on the fused PMULL kernel.
grep -q "crc32c_copy implementation in use: armv8-pmull" "$log" ||
  { echo "=== the fused copy did not run on armv8-pmull" >&2; exit 1; }
grep -q "\[  OK  \] copy_matches_memcpy_then_crc_on_every_length_to_4096" "$log" ||
  { echo "=== the copy tests did not run" >&2; exit 1; }
