#!/bin/bash
# Build the Debian package nspawn-lifecycle_<version>_<arch>.deb from this repository with
# dpkg-deb alone (no cargo-deb: installing it from crates.io costs CI several minutes of compile on
# two cores, see docs/packaging.md).
#
#   assets/debian/build-deb.sh [--binary PATH] [--out DIR] [--runner CMD]
#
# --binary: the static helper to package (default: `cargo build --locked --release`, which is
#           static by .cargo/config.toml); a dynamically linked binary is refused (exit 2).
#           Its ELF machine sets the package's architecture: amd64 (x86-64) or arm64 (aarch64).
# --out:    where the .deb goes (default target/debian); its path is printed on stdout.
# --runner: how to run the binary when it is another architecture's (its man pages and
#           completions are its own output): an emulator, e.g. tests/aarch64/build.sh qemu.
#
# Deterministic: the same binary and tree give the same bytes. Every timestamp (files, ar members,
# the changelog date) is SOURCE_DATE_EPOCH, by default the time of the last commit; owners are
# root:root; man pages are gzipped without name or time.
#
# What the package holds, and why it holds nothing else (docs/packaging.md):
#   /usr/bin/nspawn-lifecycle-helper                      the static binary
#   /usr/share/man/man1/nspawn-lifecycle-helper*.1.gz     from the hidden `manpages DIR` subcommand
#   /usr/share/man/man5/nspawn-lifecycle.json.5.gz         the configuration file's page, from the same
#   /usr/share/bash-completion/completions/nspawn-lifecycle-helper
#   /usr/share/zsh/vendor-completions/_nspawn-lifecycle-helper
#   /usr/share/fish/vendor_completions.d/nspawn-lifecycle-helper.fish
#   /usr/share/doc/nspawn-lifecycle/{README.md.gz,docs/*.md.gz,copyright,changelog.gz}
#   /usr/share/lintian/overrides/nspawn-lifecycle
#   /usr/lib/systemd/system/nspawn-lifecycle-metrics.{service,timer}   fleet metrics for the node
#                                                         exporter; not enabled (an operator's
#                                                         choice: docs/monitoring.md)
#   /usr/share/nspawn-lifecycle/prometheus/               alert rules and their promtool tests
#   /usr/share/nspawn-lifecycle/json-schema/              the JSON Schemas of every --json output
# Maintainer scripts (assets/debian/{postinst,prerm,postrm}): exactly what dh_installsystemd
# --no-enable nspawn-lifecycle-metrics.timer writes: daemon-reload on install, upgrade and removal;
# the timer left disabled on a first install, kept as the operator set it across upgrades,
# stopped on removal, its enablement links removed on purge. They touch no machine. The hooks' stable path
# /usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper belongs to `install`, which copies the
# binary there per machine; Debian packages never ship files under /usr/local, and a path owned by
# both dpkg and `install` would be overwritten behind dpkg's back and deleted by a purge while
# machines still run it.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '5,12s/^# \{0,1\}//p' "$0"; }
die() { echo "build-deb.sh: $*" >&2; exit "${2:-1}"; }

bin="" out=target/debian runner=""
while [ $# -gt 0 ]; do
    case $1 in
        --binary) [ $# -ge 2 ] || die "--binary needs a path" 2; bin=$2; shift 2;;
        --out) [ $# -ge 2 ] || die "--out needs a directory" 2; out=$2; shift 2;;
        --runner) [ $# -ge 2 ] || die "--runner needs a command" 2; runner=$2; shift 2;;
        -h|--help) usage; exit 0;;
        *) usage >&2; die "unknown argument: $1" 2;;
    esac
done
for tool in dpkg-deb dpkg-query gzip md5sum ldd file; do
    command -v "$tool" >/dev/null || die "needs $tool (a Debian system: dpkg, gzip, coreutils, libc-bin, file)"
done

if [ -z "$bin" ]; then
    cargo build --locked --release >&2
    bin=${CARGO_TARGET_DIR:-target}/$(rustc -vV | sed -n 's/^host: //p')/release/nspawn-lifecycle-helper
fi
[ -f "$bin" ] && [ -x "$bin" ] || die "--binary $bin: not an executable file" 2
# ldd prints "statically linked" (static-pie) or "not a dynamic executable"; any "=>" is a library.
if ldd "$bin" 2>&1 | grep -q '=>'; then
    die "$bin is dynamically linked; the package ships the static build (cargo build --release)" 2
fi

# The package's architecture is the binary's, and so is the glibc linked into it: Debian records
# the source version of such a part (Policy 7.8): libc6-dev's for the native build, the cross
# toolchain's (libc6-dev-arm64-cross, from cross-toolchain-base) for aarch64.
case $(file -b "$bin") in
    *x86-64*) arch=amd64 libc=libc6-dev;;
    *"ARM aarch64"*) arch=arm64 libc=libc6-dev-arm64-cross;;
    *) die "$bin is neither an x86-64 nor an aarch64 executable: $(file -b "$bin")" 2;;
esac
if [ "$arch" != "$(dpkg --print-architecture)" ] && [ -z "$runner" ]; then
    die "$bin is an $arch binary: give --runner (an emulator) to run it for its man pages" 2
fi
run() { ${runner:+"$runner"} "$bin" "$@"; }

name=nspawn-lifecycle
exe=nspawn-lifecycle-helper
version=$(run --version | sed -n "s/^$exe //p")
[ -n "$version" ] || die "$bin --version did not print '$exe <version>'"
built_using=$(dpkg-query -W -f='${source:Package} (= ${source:Version})' "$libc" 2>/dev/null) \
    || die "$libc is not installed, so the static glibc this binary holds has no known version"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null) \
        || die "not a git checkout: set SOURCE_DATE_EPOCH (seconds) for the package's timestamps"
fi
export SOURCE_DATE_EPOCH
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)

umask 022
mkdir -p "$out"
stage=$(mktemp -d "$out/.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/root
doc=$root/usr/share/doc/$name
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/share/man/man1" "$root/usr/share/man/man5" \
    "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
    "$root/usr/share/fish/vendor_completions.d" "$doc" "$root/usr/share/lintian/overrides"

install -m 0755 "$bin" "$root/usr/bin/$exe"
# Generated by the binary being packaged, so pages and completions describe exactly its CLI.
run manpages "$root/usr/share/man" >/dev/null
[ -e "$root/usr/share/man/man1/$exe.1" ] || die "$bin manpages wrote no $exe.1"
[ -e "$root/usr/share/man/man5/nspawn-lifecycle.json.5" ] || die "$bin manpages wrote no section 5 page"
run completions bash > "$root/usr/share/bash-completion/completions/$exe"
run completions zsh > "$root/usr/share/zsh/vendor-completions/_$exe"
run completions fish > "$root/usr/share/fish/vendor_completions.d/$exe.fish"
install -m 0644 README.md "$doc/README.md"
# The README links to docs/: the same tree beside it.
install -d "$doc/docs"
install -m 0644 docs/*.md "$doc/docs/"
install -m 0644 assets/debian/copyright "$doc/copyright"
install -m 0644 assets/debian/lintian-overrides "$root/usr/share/lintian/overrides/$name"
install -d "$root/usr/lib/systemd/system" "$root/usr/share/$name/prometheus"
install -m 0644 assets/systemd/nspawn-lifecycle-metrics.service assets/systemd/nspawn-lifecycle-metrics.timer \
    "$root/usr/lib/systemd/system/"
install -m 0644 assets/prometheus/nspawn-lifecycle.rules.yml assets/prometheus/nspawn-lifecycle.rules.test.yml \
    "$root/usr/share/$name/prometheus/"
install -d "$root/usr/share/$name/json-schema"
install -m 0644 assets/json-schema/*.json "$root/usr/share/$name/json-schema/"
{
    printf '%s (%s) unstable; urgency=medium\n\n' "$name" "$version"
    printf '  * Built from the %s repository at commit %s.\n\n' "$name" "$commit"
    printf ' -- %s  %s\n' "$(sed -n 's/^Maintainer: //p' assets/debian/control.in)" \
        "$(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")"
} > "$doc/changelog"
gzip -9n "$root"/usr/share/man/man1/*.1 "$root"/usr/share/man/man5/*.5 "$doc/README.md" "$doc/changelog" \
    "$doc"/docs/*.md

find "$root" -path "$root/DEBIAN" -prune -o -type f -exec chmod 0644 {} + -o -type d -exec chmod 0755 {} +
chmod 0755 "$root/usr/bin/$exe" "$root/DEBIAN"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) \
    > "$root/DEBIAN/md5sums"
size=$(du -sk --apparent-size --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$size/" \
    -e "s/@BUILT_USING@/$built_using/" assets/debian/control.in > "$root/DEBIAN/control"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
install -m 0755 assets/debian/postinst assets/debian/prerm assets/debian/postrm "$root/DEBIAN/"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

deb=$out/${name}_${version}_$arch.deb
# One compressor thread: multi-threaded xz output depends on the number of CPUs.
dpkg-deb --root-owner-group -Zxz --threads-max=1 --build "$root" "$stage/pkg.deb" >/dev/null
mv -f "$stage/pkg.deb" "$deb"
echo "$deb"
