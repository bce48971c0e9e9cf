#!/usr/bin/env bash
# The virtual environment for `kvtier bench --peer lmcache`: LMCache's storage layer beside
# kvtier, on a CPU-only machine.
#
#   bash .ci/lmcache-env.sh [VENV]   create or update VENV (default: .venv-lmcache)
#   VENV/bin/python -m kvtier bench --peer lmcache ...
#
# Every package is pinned by bench/peers/lmcache/constraints.txt. The environment holds
#   1. the CPU build of torch 2.13.0 (installed first, so nothing else can pull a CUDA build),
#   2. LMCache 0.5.6 without its dependency tree (--no-deps: it declares cupy, cuda-python
#      and cufile, which a CPU machine neither needs nor can use),
#   3. the packages LMCache's storage backends import (bench/peers/lmcache/requirements.txt;
#      numba is required, numpy at most 2.2.6),
#   4. the build tools for kvtier's C++ core,
#   5. kvtier itself, built from this checkout (build tree kept in VENV/kvtier-build, so a
#      rerun rebuilds incrementally), or the wheel KVTIER_WHEEL names (.ci/install-kvtier.sh).
# Steps 1-4 are skipped when VENV already holds exactly what the pin files describe. The last
# check imports LocalDiskBackend, RemoteBackend and FSConnector the way the bench's peer does.
# Any failure exits non-zero.
set -euo pipefail

peer=lmcache
peer_title="LMCache"
# shellcheck source=peer-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/peer-env.sh"

peer_install() {
    # Resolve first, install second: a plain torch requirement can resolve to a CUDA build
    # (gigabytes of nvidia-* wheels). Only a CPU build (local version "+cpu") is accepted.
    local report picked
    report="$(mktemp)"
    pip_in install --quiet --dry-run --ignore-installed --report "$report" \
        -c "$constraints" "torch==2.13.0"
    picked="$("$venv/bin/python" -c '
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    if item["metadata"]["name"].lower() == "torch":
        print(item["metadata"]["version"])
' "$report")"
    rm -f "$report"
    case "$picked" in
        *+cpu*) log "torch: $picked (CPU build)" ;;
        *) die "pip would install torch '${picked:-?}', which is not a CPU build. Make the CPU
wheel of torch 2.13.0 available to pip (e.g. --find-links to a folder holding
torch-2.13.0+cpu-*.whl, or PIP_EXTRA_INDEX_URL pointing at the CPU wheel index) and retry." ;;
    esac
    pip_in install --quiet -c "$constraints" "torch==2.13.0"
    log "LMCache 0.5.6 (without dependencies)"
    pip_in install --quiet --no-deps -c "$constraints" "lmcache==0.5.6"
    log "packages LMCache's storage backends import (pip then lists LMCache's other declared"
    log "requirements as missing: expected, LMCache was installed --no-deps)"
    pip_in install --quiet -c "$constraints" -r "$requirements"
    "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' \
        || die "a CUDA build of torch ended up in $venv"
}

peer_import_check() {
    log "checking that LMCache's storage backends and kvtier's LMCache peer import"
    "$venv/bin/python" - <<'PY'
import sys

from kvtier.bench.peer_lmcache import lmcache_status

status = lmcache_status()
if not status.get("available"):
    sys.exit(f"[lmcache-env] error: {status.get('reason')}")
print(f"[lmcache-env] ok: LMCache {status['version']} (LocalDiskBackend, FSConnector)")
PY
}

peer_env_main "$@"
