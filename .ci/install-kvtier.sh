# kvtier from this checkout into an environment: sourced (never run) by the engine and peer
# environment scripts (.ci/engine-env.sh, .ci/peer-env.sh, .ci/vllm-engine-env.sh), after they
# define `log`, `pip_in`, `repo` and `venv`.
#
# KVTIER_WHEEL names a wheel already built from this checkout: .ci/run builds it once and
# installs it into every environment instead of compiling the C++ core again for each (four
# builds of about a minute on a 2-core machine). Unset, the checkout is built in place, with
# the build tree kept in VENV/kvtier-build so that a rerun only recompiles what changed.

install_kvtier() {
    if [[ -n "${KVTIER_WHEEL:-}" ]]; then
        [[ -f "$KVTIER_WHEEL" ]] || { log "error: KVTIER_WHEEL=$KVTIER_WHEEL is not a file"; exit 1; }
        log "kvtier from $KVTIER_WHEEL (built from $repo)"
        pip_in install --quiet --no-deps --force-reinstall "$KVTIER_WHEEL"
    else
        log "kvtier from $repo (C++ build in $venv/kvtier-build)"
        pip_in install --quiet --no-build-isolation --no-deps \
            -C "build-dir=$(cd "$venv" && pwd)/kvtier-build" "$repo"
    fi
}
