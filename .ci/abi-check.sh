#!/usr/bin/env bash
# Checks the ABI the shared core library offers C++ programs: builds libkvtier_core (Release,
# in a temporary directory), lists the dynamic symbols it exports (demangled), prints them and
# their count, and fails when
#   - any internal symbol is exported: kvtier::detail, an Impl, a test hook;
#   - any exported symbol lies outside the versioned inline namespace kvtier::vMAJOR_MINOR
#     (typeinfo and vtables of its classes included);
#   - the SONAME is not libkvtier_core.so.MAJOR.MINOR (the CMake package's SameMinorVersion
#     promise), MAJOR.MINOR being the project version (pyproject.toml's).
#
#   .ci/abi-check.sh
#
# Environment: KVTIER_JOBS (parallel compile jobs, default 2), KVTIER_KEEP_BUILD=1 keeps the
# build directory (its path is printed).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${KVTIER_JOBS:-2}"

if ! command -v nm >/dev/null || ! command -v readelf >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq binutils
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-abi.XXXXXX")"
if [[ -z "${KVTIER_KEEP_BUILD:-}" ]]; then
  trap 'rm -rf "$work"' EXIT
else
  echo "build directory kept under $work"
fi

generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
cmake -S "$repo" -B "$work" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release >"$work.configure.log" 2>&1 ||
  { cat "$work.configure.log"; exit 1; }
cmake --build "$work" -j "$jobs" --target kvtier_core >"$work.build.log" 2>&1 ||
  { cat "$work.build.log"; exit 1; }

version_header="$work/include/kvtier/version.hpp"
major=$(sed -n 's/^#define KVTIER_VERSION_MAJOR \([0-9]*\)$/\1/p' "$version_header")
minor=$(sed -n 's/^#define KVTIER_VERSION_MINOR \([0-9]*\)$/\1/p' "$version_header")
[[ -n "$major" && -n "$minor" ]] || { echo "no version in $version_header" >&2; exit 1; }
namespace="kvtier::v${major}_${minor}"
library="$work/libkvtier_core.so.${major}.${minor}"
[[ -e "$library" ]] || { echo "no $library (the versioned library)" >&2; ls -l "$work" >&2; exit 1; }

status=0
soname=$(readelf -d "$library" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p')
echo "SONAME: $soname"
if [[ "$soname" != "libkvtier_core.so.${major}.${minor}" ]]; then
  echo "=== SONAME must be libkvtier_core.so.${major}.${minor}" >&2
  status=1
fi

# Defined dynamic symbols, demangled; absolute ones are the symbol version's own node.
symbols=$(nm -D --defined-only -C "$library" | awk '$2 != "A" { $1 = ""; $2 = ""; sub(/^  /, ""); print }' | sort)
count=$(grep -c . <<<"$symbols" || true)
echo "exported symbols: $count"
sed 's/^/  /' <<<"$symbols"

internal=$(grep -E 'kvtier::detail|(^|[^A-Za-z_])Impl([^A-Za-z_]|$)|set_submit_filter|set_openat2_enabled|nop_injection_supported|kvtest' <<<"$symbols" || true)
if [[ -n "$internal" ]]; then
  echo "=== internal symbols are exported:" >&2
  sed 's/^/  /' <<<"$internal" >&2
  status=1
fi
outside=$(grep -vE "^((typeinfo|typeinfo name|vtable) for )?${namespace}::" <<<"$symbols" || true)
if [[ -n "$outside" ]]; then
  echo "=== exported symbols outside ${namespace}:" >&2
  sed 's/^/  /' <<<"$outside" >&2
  status=1
fi
[[ "$status" == 0 ]] && echo "ABI check passed: $count symbols, all in ${namespace}"
exit "$status"
