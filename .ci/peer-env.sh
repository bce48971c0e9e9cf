# The part of .ci/vllm-native-env.sh and .ci/lmcache-env.sh that does not depend on the peer:
# sourced (never run) by them, after they set
#   peer        the environment's name: pin folder bench/peers/$peer, log prefix, stamp file,
#               default VENV .venv-$peer
#   peer_title  how the peer is written in messages
# and define
#   peer_install        install the peer and everything it imports (the pin files' steps)
#   peer_import_check   the final check that the peer and kvtier's bench import as expected
# and then call peer_env_main "$@". The usage and the steps are in the peer scripts.
#
# These environments hold the peers `kvtier bench --peer ...` measures against; the bench
# runs in the environment's own Python (VENV/bin/python -m kvtier bench --peer ...), in the
# same process as the peer, so both move the same blocks in the same directory.

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=install-kvtier.sh
source "$repo/.ci/install-kvtier.sh"
pins="$repo/bench/peers/$peer"
constraints="$pins/constraints.txt"
requirements="$pins/requirements.txt"
env_script="$repo/.ci/$peer-env.sh"

log() { printf '[%s-env] %s\n' "$peer" "$*" >&2; }
die() { log "error: $*"; exit 1; }

pip_in() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }

peer_env_main() {
    case "${1:-}" in
        -h | --help)
            sed -n '2,/^set -euo/p' "$env_script" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
    esac
    venv="${1:-.venv-$peer}"
    local python="${PYTHON:-python3}"
    [[ -f "$constraints" && -f "$requirements" ]] || die "missing pin files under $pins"

    # The stamp records what peer_install installed; a changed pin file or script redoes it.
    local stamp_value stamp
    stamp_value="$(cat "$constraints" "$requirements" "$env_script" "${BASH_SOURCE[0]}" \
        | sha256sum | cut -d' ' -f1)"
    stamp="$venv/.kvtier-$peer-env"

    if [[ ! -x "$venv/bin/python" ]]; then
        log "creating $venv with $("$python" --version 2>&1)"
        "$python" -m venv "$venv"
    fi

    if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]]; then
        log "dependencies already match the pin files; skipping to kvtier"
    else
        rm -f "$stamp"
        peer_install
        log "build tools and pytest"
        pip_in install --quiet -c "$constraints" scikit-build-core pybind11 cmake ninja pytest
        printf '%s\n' "$stamp_value" > "$stamp"
    fi

    install_kvtier

    peer_import_check
    log "ready: $venv/bin/python -m kvtier bench --peer ..."
}
