# shellcheck shell=bash
# apt_need CMD:PKG...: install, from the machine's own apt, each PKG whose CMD is not on PATH (an
# update first only if the install fails: a fresh machine's lists may be stale). Says on stderr
# what it installs; status 1 naming the packages when apt fails.
apt_need() {
    local pair need=()
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
    done
    [ ${#need[@]} -gt 0 ] || return 0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 \
        --no-install-recommends "${need[@]}" >&2 ||
        { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            -o DPkg::Lock::Timeout=600 --no-install-recommends "${need[@]}" >&2; } ||
        { echo "apt-get install ${need[*]} failed" >&2; return 1; }
}
