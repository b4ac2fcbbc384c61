#!/bin/bash
# The Debian package, checked without booting anything; scenario 15 of the e2e
# harness then installs it in a real systemd host and runs the lifecycle with it.
#
#   tests/deb.sh STATIC-BINARY [RUNNER]   prints the .deb's path on stdout (target/debian/...);
#                                         RUNNER runs a binary of another architecture (qemu)
#
# Builds the package from the binary twice and requires identical bytes (deterministic build),
# checks its file list and its maintainer scripts, then runs lintian (which must be
# installed: tests/run-all.sh installs it) and fails on any error or warning it reports.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# = 1 ] || [ $# = 2 ] || { echo "usage: tests/deb.sh STATIC-BINARY [RUNNER]" >&2; exit 2; }
bin=$1 runner=${2:-}
fail() { echo "FAIL: $*" >&2; exit 1; }
run() { ${runner:+"$runner"} "$bin" "$@"; }

deb=$(assets/debian/build-deb.sh --binary "$bin" --out target/debian ${runner:+--runner "$runner"})
again=$(assets/debian/build-deb.sh --binary "$bin" --out target/debian/again ${runner:+--runner "$runner"})
cmp "$deb" "$again" || fail "two builds of the package from $bin differ (not deterministic)"
echo "deterministic: $(sha256sum < "$deb" | cut -c1-16) twice" >&2

# The maintainer scripts are the repository's, byte for byte, and executable; nothing else.
ctrl=$(dpkg-deb --ctrl-tarfile "$deb" | tar -t | sed 's|^\./||; /^$/d' | LC_ALL=C sort | tr '\n' ' ')
[ "$ctrl" = "control md5sums postinst postrm prerm " ] || fail "control members are '$ctrl', want control, md5sums, postinst, postrm, prerm"
for s in postinst prerm postrm; do
    dpkg-deb --ctrl-tarfile "$deb" | tar -xO "./$s" | cmp -s - "assets/debian/$s" || fail "$s in $deb is not assets/debian/$s"
    dpkg-deb --ctrl-tarfile "$deb" | tar -tv "./$s" | grep -q '^-rwxr-xr-x root/root ' || fail "$s in $deb is not 0755 root:root"
    sh -n "assets/debian/$s" || fail "assets/debian/$s is not valid sh"
done

exe=nspawn-lifecycle-helper
files=$(dpkg-deb --fsys-tarfile "$deb" | tar -t | sed 's|^\./|/|' | grep -v '/$' | LC_ALL=C sort)
want="/usr/lib/systemd/system/nspawn-lifecycle-metrics.service
/usr/lib/systemd/system/nspawn-lifecycle-metrics.timer
/usr/bin/$exe
/usr/share/nspawn-lifecycle/prometheus/nspawn-lifecycle.rules.test.yml
/usr/share/nspawn-lifecycle/prometheus/nspawn-lifecycle.rules.yml
/usr/share/bash-completion/completions/$exe
/usr/share/doc/nspawn-lifecycle/README.md.gz
/usr/share/doc/nspawn-lifecycle/changelog.gz
/usr/share/doc/nspawn-lifecycle/copyright
/usr/share/fish/vendor_completions.d/$exe.fish
/usr/share/lintian/overrides/nspawn-lifecycle
/usr/share/zsh/vendor-completions/_$exe"
# The JSON Schemas of every --json output, as in the repository.
want+=$'\n'$(for f in assets/json-schema/*.json; do echo "/usr/share/nspawn-lifecycle/json-schema/${f##*/}"; done)
# The documentation the README links to, every page of docs/.
want+=$'\n'$(for d in docs/*.md; do echo "/usr/share/doc/nspawn-lifecycle/$d.gz"; done)
# One man page per visible command, exactly the ones the binary generates.
pages=$(mktemp -d)
trap 'rm -rf "$pages"' EXIT
run manpages "$pages" >/dev/null
want+=$'\n'$(cd "$pages/man1" && for p in *.1; do echo "/usr/share/man/man1/$p.gz"; done)
want+=$'\n'$(cd "$pages/man5" && for p in *.5; do echo "/usr/share/man/man5/$p.gz"; done)
want=$(printf '%s\n' "$want" | LC_ALL=C sort)
[ "$files" = "$want" ] || fail "the package's files differ from the expected list:
$(diff <(printf '%s\n' "$want") <(printf '%s\n' "$files") || true)"
dpkg-deb --fsys-tarfile "$deb" | tar -tv | awk '$2 != "root/root" {bad = 1; print} END {exit bad}' >&2 \
    || fail "files not owned by root/root in $deb"
[ "$(dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/bin/$exe" | sha256sum)" = "$(sha256sum < "$bin")" ] \
    || fail "/usr/bin/$exe in the package is not $bin"
# docs/packaging.md names every file of the package (a path, a directory ending in /, or a *
# pattern, each in backquotes in its table's first column).
named=$(sed -n '/^| path in the package |/,/^$/p' docs/packaging.md | awk -F' [|] ' 'NR > 2 {print $1}' \
    | grep -o '`/[^`]*`' | tr -d '`')
while read -r f; do
    hit=""
    while read -r n; do
        # shellcheck disable=SC2053 # $n is a pattern
        case $n in */) [[ $f == "$n"* ]] && hit=1 ;; *) [[ $f == $n ]] && hit=1 ;; esac
    done <<<"$named"
    [ -n "$hit" ] || fail "docs/packaging.md's table does not name $f, which the package holds"
done <<<"$files"
echo "contents: $(printf '%s\n' "$files" | wc -l) files, each named in docs/packaging.md; maintainer scripts postinst, prerm, postrm" >&2
# What it asks of the system: nspawn's package, and the node exporter for the metrics timer.
[ "$(dpkg-deb -f "$deb" Recommends)" = systemd-container ] || fail "Recommends: $(dpkg-deb -f "$deb" Recommends)"
[ "$(dpkg-deb -f "$deb" Suggests)" = prometheus-node-exporter ] || fail "Suggests: $(dpkg-deb -f "$deb" Suggests)"

if command -v lintian >/dev/null; then
    # --fail-on warning: a warning is a defect to fix or to override with a reason
    # (assets/debian/lintian-overrides), never to ignore.
    lintian --fail-on error,warning --display-info "$deb" >&2 || fail "lintian reports problems in $deb (above)"
    echo "lintian: no error or warning" >&2
else
    fail "lintian is not installed (apt-get install lintian)"
fi
echo "$deb"
