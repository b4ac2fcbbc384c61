# shellcheck shell=bash
# A private apt configuration: every directory apt reads or writes lies under one directory of the
# caller's cache, so the machine's own sources, lists, dpkg status and archive cache are neither
# read nor written (the rule: use the mirror's other suites, never change the machine's sources).
# Used by tests/realdriver/fetch.sh, tests/cdihooks/fetch-lib64-glibc.sh, tests/attack/fetch-runtimes.sh,
# tests/gpu/kit.sh and tests/e2e/lib/engines.sh.
#
#   private_apt_init DIR ARCH...  make DIR's layout and DIR/apt.conf; the first ARCH is native.
#                                 The caller then writes DIR/etc/sources.list (one-line format),
#                                 and may write DIR/etc/preferences.d/* and DIR/status (dpkg
#                                 status apt plans against; empty unless the caller fills it).
#   private_apt DIR ARGS...       apt-get under that configuration
#   private_apt_download DIR SUITE OUT PKG...  a fresh configuration for SUITE, the PKGs downloaded
private_apt_init() {
    local a=$1 native=$2 arch archs=""
    shift
    for arch in "$@"; do archs+="\"$arch\"; "; done
    mkdir -p "$a/etc/apt.conf.d" "$a/etc/preferences.d" "$a/etc/trusted.gpg.d" \
        "$a/lists/partial" "$a/cache/archives/partial"
    [ -e "$a/status" ] || : >"$a/status"
    cat >"$a/apt.conf" <<EOF
Dir::Etc "$a/etc";
Dir::Etc::sourcelist "$a/etc/sources.list";
Dir::Etc::sourceparts "-";
Dir::Etc::parts "$a/etc/apt.conf.d";
Dir::Etc::preferencesparts "$a/etc/preferences.d";
Dir::Etc::trustedparts "$a/etc/trusted.gpg.d";
Dir::State "$a";
Dir::State::lists "$a/lists";
Dir::State::status "$a/status";
Dir::Cache "$a/cache";
APT::Architecture "$native";
APT::Architectures { $archs};
APT::Install-Recommends "false";
Acquire::Languages "none";
APT::Sandbox::User "root";
Debug::NoLocking "true";
EOF
}

# A mirror mid-sync answers "File has unexpected size … Mirror sync in progress?" for an index
# or two, for minutes: downloads retry (Acquire::Retries), and an `update` that fails is tried
# again after a pause, four times in all. If the only failures left are indexes caught mid-sync,
# the update goes on with a warning: apt keeps every other index (and the old copy of those, if
# any), and a package that really needs a missing one then fails its download by name.
private_apt() {
    local a=$1 try out rc
    shift
    if [ "${1:-}" != update ]; then
        APT_CONFIG=$a/apt.conf apt-get -q -o Dpkg::Use-Pty=0 -o Acquire::Retries=3 "$@"
        return
    fi
    out=$(mktemp)
    for try in 1 2 3 4; do
        rc=0
        APT_CONFIG=$a/apt.conf apt-get -q -o Dpkg::Use-Pty=0 -o Acquire::Retries=3 "$@" >"$out" 2>&1 || rc=$?
        cat "$out"
        [ "$rc" = 0 ] && { rm -f "$out"; return 0; }
        [ "$try" = 4 ] && break
        echo "private_apt: apt-get update failed (try $try of 4); again in 30 s" >&2
        sleep 30
    done
    # Every error line about an index caught mid-sync, or the summary of those: go on.
    if grep -q 'Mirror sync in progress' "$out" &&
        ! grep '^E: ' "$out" | grep -qv -e 'File has unexpected size' -e 'Hash Sum mismatch' \
            -e 'Some index files failed to download'; then
        echo "private_apt: WARNING: going on without the indexes a mirror sync left behind (above)" >&2
        rm -f "$out"
        return 0
    fi
    rm -f "$out"
    return 1
}

# private_apt_download DIR SUITE OUT PKG...: DIR's configuration made afresh (empty dpkg status,
# amd64) for SUITE main of the machine's Debian mirror (debian_mirror, tests/lib/debian-mirror.sh),
# updated, and the PKGs downloaded into OUT (made afresh). Says on stderr what failed.
private_apt_download() {
    local a=$1 suite=$2 out=$3 mirror
    shift 3
    mirror=$(debian_mirror) || true
    [ -n "$mirror" ] || { echo "no Debian mirror in /etc/apt/sources.list.d/debian.sources" >&2; return 1; }
    rm -rf "$a/status" "$out"
    private_apt_init "$a" amd64
    mkdir -p "$out"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" \
        >"$a/etc/sources.list"
    private_apt "$a" update >&2 || { echo "apt-get update of $suite failed ($a/apt.conf)" >&2; return 1; }
    (cd "$out" && private_apt "$a" download "$@" >&2) || { echo "apt-get download $* failed" >&2; return 1; }
}
