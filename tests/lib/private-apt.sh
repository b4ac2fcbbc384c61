# shellcheck shell=bash
# A private apt configuration: every directory apt reads or writes lies under one directory of the
# caller's cache, so the machine's own sources, lists, dpkg status and archive cache are neither
# read nor written (the rule: use the mirror's other suites, never change the machine's sources).
# Used by tests/realdriver/fetch.sh, tests/cdihooks/fetch-lib64-glibc.sh and tests/e2e/lib/engines.sh.
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

# A mirror mid-sync answers "File has unexpected size" or a hash mismatch for a minute or two:
# downloads retry (Acquire::Retries), and an `update` that fails is tried again after a pause,
# three times in all, before the caller sees the failure.
private_apt() {
    local a=$1 try
    shift
    for try in 1 2 3; do
        APT_CONFIG=$a/apt.conf apt-get -q -o Dpkg::Use-Pty=0 -o Acquire::Retries=3 "$@" && return 0
        [ "$1" = update ] && [ "$try" -lt 3 ] || return 1
        echo "private_apt: apt-get update failed (try $try of 3); again in 20 s" >&2
        sleep 20
    done
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
