# shellcheck shell=bash
# Scenario 9 (issue 10 item 6): the NVIDIA daemons' socket directories are bound into the machine
# read-only, and a client in the machine still connects through that bind (connect(2) needs write
# permission on the socket inode, not a writable mount). A stand-in nvidia-persistenced (perl, a
# transient unit in the host) listens on /run/nvidia-persistenced/socket; after a restart the
# .nspawn file binds the directory with BindReadOnly=, the machine cannot create a file in it, and
# a client in the machine gets the daemon's answer over the socket. Cleans up and restarts kube1
# without the daemon, so later scenarios see the baseline.
scenario "daemon socket directory: read-only bind, still connectable" --needs-helper
baseline

SOCKDIR=/run/nvidia-persistenced
IN=/run/nvidia/driver/run/nvidia-persistenced
ANSWER=persistenced-e2e-answer
DAEMON=e2e-persistenced.service

H systemctl stop "$DAEMON" >/dev/null 2>&1
H rm -rf "$SOCKDIR"
H mkdir -p "$SOCKDIR"
H systemd-run --unit="$DAEMON" --quiet --collect -- perl -MIO::Socket::UNIX -e '
    unlink $ARGV[0];
    my $s = IO::Socket::UNIX->new(Local => $ARGV[0], Listen => 5) or die "listen $ARGV[0]: $!\n";
    while (my $c = $s->accept) { print $c "$ARGV[1]\n"; close $c }' "$SOCKDIR/socket" "$ANSWER"
assert_cmd "$(c daemon-listening)" wait_until 10 H test -S "$SOCKDIR/socket"

out=$(reconcile kube1 2>&1); rc=$?
info "reconcile with the daemon socket: rc=$rc $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
assert_eq "$(c reconcile)" 0 "$rc"
assert_cmd "$(c machine-up)" wait_machine_up kube1 60

nf=$(nspawn_file kube1)
assert_match "$(c nspawn-socket-dir-read-only)" "^BindReadOnly=$SOCKDIR:$IN\$" "$nf"
assert_no_match "$(c nspawn-socket-dir-not-writable)" "^Bind=$SOCKDIR" "$nf"
assert_cmd "$(c socket-visible-in-machine)" M test -S "$IN/socket"
# Writing into the host daemon's directory from the machine fails on the read-only mount.
err=$(M touch "$IN/planted-by-machine" 2>&1); rc=$?
assert_ne "$(c machine-cannot-create-in-socket-dir)" 0 "$rc"
assert_match "$(c socket-dir-is-a-read-only-mount)" 'Read-only file system' "$err"
assert_cmd "$(c nothing-planted-on-host)" H test ! -e "$SOCKDIR/planted-by-machine"
# A client in the machine connects through the read-only bind and gets the daemon's answer.
got=$(M perl -MIO::Socket::UNIX -e '
    my $c = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "connect $ARGV[0]: $!\n";
    print scalar <$c>' "$IN/socket" 2>&1)
assert_eq "$(c client-connects-through-read-only-bind)" "$ANSWER" "$got"
assert_eq "$(c containerd-active)" active "$(inner_state containerd.service)"
assert_eq "$(c kubelet-active)" active "$(inner_state kubelet.service)"

# ---- clean up: no daemon, kube1 restarted without the bind -----------------------------------
H systemctl stop "$DAEMON" >/dev/null 2>&1
H rm -rf "$SOCKDIR"
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-without-daemon)" 0 "$rc"
assert_cmd "$(c machine-up-without-daemon)" wait_machine_up kube1 60
assert_no_match "$(c nspawn-no-socket-bind-without-daemon)" "$SOCKDIR" "$(nspawn_file kube1)"
scenario_end
