#!/usr/bin/env bash
# Cross-compiles the C++ CRC32C and header tests for aarch64 and runs them under qemu-user,
# which proves the ARMv8 CRC32 path (csrc/src/util/crc32c.cpp) on an x86-64 machine: qemu's
# default CPU has the CRC32 extension, and KVTIER_REQUIRE_CRC32C_HARDWARE=1 makes the tests
# fail unless the library detected and used it (and matched the software path).
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
  -DCMAKE_CROSSCOMPILING_EMULATOR="qemu-aarch64;-L;$sysroot" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVTIER_BUILD_TESTS=ON >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work" -j "$jobs" --target test_crc32c test_header

file "$work/tests/cpp/test_crc32c" 2>/dev/null || true
mkdir -p "$work/scratch"
TMPDIR="$work/scratch" KVTIER_REQUIRE_CRC32C_HARDWARE=1 \
  ctest --test-dir "$work" --output-on-failure -V -R '^(test_crc32c|test_header)$'
