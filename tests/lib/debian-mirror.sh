# shellcheck shell=bash
# debian_mirror: the Debian mirror this machine's own apt uses (deb822 sources, else the one-line
# format), the first URI of a non-security suite. No registry host is written into the
# repository: the e2e harness and tests/realdriver/fetch.sh both read it from here.
debian_mirror() {
    local m=""
    if [ -r /etc/apt/sources.list.d/debian.sources ]; then
        m=$(awk '/^URIs:/ {u=$2} /^Suites:/ {for (i = 2; i <= NF; i++) if ($i !~ /-security$/) {print u; exit}}' \
            /etc/apt/sources.list.d/debian.sources)
    fi
    if [ -z "$m" ] && [ -r /etc/apt/sources.list ]; then
        m=$(awk '$1 == "deb" && $3 !~ /-security$/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
    fi
    printf '%s' "$m"
}
