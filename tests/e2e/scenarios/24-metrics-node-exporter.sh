# shellcheck shell=bash
# Scenario 24: fleet metrics through the real node exporter. Debian 12's prometheus-node-exporter
# (tests/metrics/fetch-prometheus.sh) runs in the host with only its textfile collector, on the
# directory the product's nspawn-lifecycle-metrics.service writes (assets/systemd, the packaged
# units with the helper's path); its /metrics, fetched on the loopback, must say what
# `status --json` says: in sync after a start; drift for kube1 after the host's driver changed
# under the running machine (the driver-version check, both versions); in sync again after
# `reconcile`. A scraper racing twelve writer runs only ever sees whole files (the collector's own
# node_textfile_scrape_error stays 0 and our timestamp is in every scrape). The unit has its
# deadline; a link swapped in for the collector's directory fails the run, nothing written where
# it points. The timer starts and names the service.
scenario "fleet metrics: the node exporter's textfile collector sees drift and its repair" --needs-helper
baseline
NEWVER=580.95.05
DIR=/var/lib/prometheus/node-exporter
PORT=19100
NE=$("$E2E_SRC/../metrics/fetch-prometheus.sh")/usr/bin/prometheus-node-exporter

H mkdir -p /usr/local/lib/e2e "$DIR"
H sh -c 'cat > /usr/local/lib/e2e/prometheus-node-exporter && chmod 0755 /usr/local/lib/e2e/prometheus-node-exporter' <"$NE"
for u in nspawn-lifecycle-metrics.service nspawn-lifecycle-metrics.timer; do
    sed "s|/usr/bin/nspawn-lifecycle-helper|$HP|" "$E2E_SRC/../../assets/systemd/$u" | H sh -c "cat > /etc/systemd/system/$u"
done
H systemctl daemon-reload
# A daemon-reload makes systemd forget the last run of every ExecStartPost= (systemd 252): start
# kube1 afresh, so its last post-start is known again.
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c fresh-start)" 0 "$rc"
assert_cmd "$(c machine-up)" wait_machine_up kube1 60
H systemctl stop e2e-node-exporter.service >/dev/null 2>&1
H systemd-run --unit=e2e-node-exporter --collect /usr/local/lib/e2e/prometheus-node-exporter \
    --collector.disable-defaults --collector.textfile "--collector.textfile.directory=$DIR" \
    "--web.listen-address=127.0.0.1:$PORT" >/dev/null 2>&1
scrape() {
    H bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT && printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3 && cat <&3" 2>/dev/null
}
exporter_up() { scrape | grep -q '^node_textfile_scrape_error '; }
assert_cmd "$(c node-exporter-up)" wait_until 30 exporter_up
write_metrics() { H timeout 120 systemctl start nspawn-lifecycle-metrics.service; }
# value <text> <metric line prefix>: the sample's value (labels as the node exporter prints them:
# sorted by name)
value() { printf '%s\n' "$1" | grep -F -- "$2 " | tail -1 | awk '{print $NF}'; }
status_state() { H timeout 60 "$HP" status kube1 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>&1; }

# ---- in sync ----------------------------------------------------------------------------------
assert_cmd "$(c writer-runs)" write_metrics
assert_eq "$(c writer-result)" "success" "$(H systemctl show -p Result --value nspawn-lifecycle-metrics.service)"
assert_eq "$(c writer-wrote-one-file)" "nspawn_lifecycle.prom" "$(H ls -A "$DIR")"
m=$(scrape)
assert_eq "$(c status-json-in-sync)" "in-sync" "$(status_state)"
assert_eq "$(c metrics-in-sync)" 1 "$(value "$m" 'nspawn_lifecycle_state{machine="kube1",state="in_sync"}')"
assert_eq "$(c metrics-not-drift)" 0 "$(value "$m" 'nspawn_lifecycle_state{machine="kube1",state="drift"}')"
assert_eq "$(c metrics-gpus)" "$E2E_GPUS" "$(value "$m" 'nspawn_lifecycle_gpus{machine="kube1"}')"
assert_eq "$(c metrics-host-gpus)" "$E2E_GPUS" "$(value "$m" 'nspawn_lifecycle_host_gpus')"
assert_eq "$(c metrics-no-errors)" 0 "$(value "$m" 'nspawn_lifecycle_status_errors')"
assert_eq "$(c metrics-post-start-success)" 1 "$(value "$m" 'nspawn_lifecycle_last_post_start_success{machine="kube1"}')"
assert_eq "$(c collector-no-error)" 0 "$(value "$m" 'node_textfile_scrape_error')"
info "in sync: $(printf '%s\n' "$m" | grep '^nspawn_lifecycle_' | tr '\n' ' ')"

# ---- the host's driver changes under the running machine ---------------------------------------
fake_driver_version "$NEWVER"
assert_cmd "$(c writer-runs-drift)" write_metrics
m=$(scrape)
assert_eq "$(c status-json-drift)" "drift" "$(status_state)"
assert_eq "$(c metrics-drift)" 1 "$(value "$m" 'nspawn_lifecycle_state{machine="kube1",state="drift"}')"
assert_eq "$(c metrics-drift-not-in-sync)" 0 "$(value "$m" 'nspawn_lifecycle_state{machine="kube1",state="in_sync"}')"
assert_eq "$(c metrics-drift-check)" 1 "$(value "$m" 'nspawn_lifecycle_check_failed{check="driver-version",machine="kube1"}')"
assert_eq "$(c metrics-driver-info-both-versions)" 1 \
    "$(value "$m" "nspawn_lifecycle_driver_info{host_version=\"$NEWVER\",machine=\"kube1\",machine_version=\"$DRIVER_VERSION\"}")"
info "drift: $(printf '%s\n' "$m" | grep '^nspawn_lifecycle_\(state\|check_failed\|driver_info\)' | tr '\n' ' ')"

# ---- a scraper racing the writer only sees whole files -------------------------------------------
racer=$(mktemp)
( for _ in $(seq 1 400); do
      s=$(scrape)
      printf '%s %s\n' "$(value "$s" node_textfile_scrape_error)" \
          "$(printf '%s\n' "$s" | grep -c '^nspawn_lifecycle_status_timestamp_seconds ')"
  done >"$racer" ) &
rpid=$!
for _ in $(seq 1 12); do write_metrics; done
wait "$rpid"
assert_eq "$(c scrapes-during-writes)" 400 "$(wc -l <"$racer")"
assert_eq "$(c no-partial-file-seen)" "0 1" "$(sort -u "$racer" | tr '\n' ' ' | sed 's/ $//')"
rm -f "$racer"

# ---- reconcile: in sync again --------------------------------------------------------------------
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-exit-0)" 0 "$rc"
assert_cmd "$(c machine-up-after-reconcile)" wait_machine_up kube1 60
assert_cmd "$(c writer-runs-after-reconcile)" write_metrics
m=$(scrape)
assert_eq "$(c status-json-in-sync-again)" "in-sync" "$(status_state)"
assert_eq "$(c metrics-in-sync-again)" 1 "$(value "$m" 'nspawn_lifecycle_state{machine="kube1",state="in_sync"}')"
assert_eq "$(c metrics-new-version)" 1 \
    "$(value "$m" "nspawn_lifecycle_driver_info{host_version=\"$NEWVER\",machine=\"kube1\",machine_version=\"$NEWVER\"}")"

# ---- the collector's account swaps its directory for a link ------------------------------------
# The node exporter's account owns /var/lib/prometheus: it can make node-exporter a link to a
# root-only directory. ReadWritePaths= follows the link (the sandbox then lets the service write
# there): the writer itself must refuse, and the run fail, writing nothing where it points.
assert_eq "$(c unit-deadline)" 50s "$(H systemctl show -p TimeoutStartUSec --value nspawn-lifecycle-metrics.service)"
H mkdir -p /etc/e2e-root-only
H chmod 0700 /etc/e2e-root-only
H mv "$DIR" "$DIR.real"
H ln -s /etc/e2e-root-only "$DIR"
# What the unit's sandbox does with the link (systemd.exec(5)): the same ProtectSystem= and
# ReadWritePaths= around a shell that writes through it.
if H timeout 60 systemd-run --wait --collect -q -p ProtectSystem=strict -p "ReadWritePaths=$DIR" \
    sh -c "echo x > $DIR/through-the-link" >/dev/null 2>&1; then
    info "ReadWritePaths= followed the link: the sandbox let a write reach /etc/e2e-root-only"
else
    info "ReadWritePaths= did not let a write through the link"
fi
H rm -f /etc/e2e-root-only/through-the-link
write_metrics
assert_eq "$(c writer-refuses-a-linked-dir)" exit-code "$(H systemctl show -p Result --value nspawn-lifecycle-metrics.service)"
assert_eq "$(c nothing-written-through-the-link)" "" "$(H ls -A /etc/e2e-root-only)"
assert_match "$(c refusal-names-the-link)" "node-exporter or one of its parents is a symlink" \
    "$(H journalctl -u nspawn-lifecycle-metrics.service --no-pager -n 20 2>&1)"
H rm "$DIR"
H mv "$DIR.real" "$DIR"
H rmdir /etc/e2e-root-only
H systemctl reset-failed nspawn-lifecycle-metrics.service >/dev/null 2>&1

# ---- the timer ---------------------------------------------------------------------------------
assert_cmd "$(c timer-starts)" H systemctl start nspawn-lifecycle-metrics.timer
assert_eq "$(c timer-active)" active "$(H systemctl show -p ActiveState --value nspawn-lifecycle-metrics.timer)"
assert_eq "$(c timer-triggers-service)" nspawn-lifecycle-metrics.service "$(H systemctl show -p Triggers --value nspawn-lifecycle-metrics.timer)"

# leave the host as the next scenario expects it
H systemctl stop nspawn-lifecycle-metrics.timer e2e-node-exporter.service >/dev/null 2>&1
H rm -f /etc/systemd/system/nspawn-lifecycle-metrics.service /etc/systemd/system/nspawn-lifecycle-metrics.timer
H rm -rf /var/lib/prometheus
H systemctl daemon-reload
fake_driver_version "$DRIVER_VERSION"
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c back-to-baseline-driver)" 0 "$rc"
assert_cmd "$(c machine-up-at-the-end)" wait_machine_up kube1 60
scenario_end
