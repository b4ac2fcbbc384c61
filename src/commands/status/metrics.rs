//! `status` as Prometheus metrics: the text exposition format, one family per fact, so a fleet's
//! Prometheus (through the node exporter's textfile collector, [`write_textfile`]) sees each
//! node's GPU wiring the way `status` judges it. Pure rendering from [`Status`] values; the
//! writer is the only side effect, and it holds no lock.
//!
//! Families (every sample of a machine is labelled `machine`):
//! - `nspawn_lifecycle_state{state}`: 1 for the machine's state, 0 for the others
//!   (`in_sync`, `drift`, `broken`, `not_running`);
//! - `nspawn_lifecycle_check_failed{check}`: 1 per check out of line (the `check` of each
//!   finding of `status --json`), nothing when all hold;
//! - `nspawn_lifecycle_gpus`: GPUs wired into the machine (its CDI spec's devices by index);
//!   `nspawn_lifecycle_host_gpus`: GPUs the host has now;
//! - `nspawn_lifecycle_driver_info{host_version,machine_version}`: 1 (the host's kernel module and
//!   the version the machine's spec mounts; empty when there is none);
//! - `nspawn_lifecycle_last_post_start_timestamp_seconds`, `…_duration_seconds`,
//!   `…_exit_status` (128 + signal when killed), `…_success`: the unit's last post-start;
//! - `nspawn_lifecycle_host_mode_installed` (0 or 1), and for an installed host mode
//!   (`install --host`, judged as `host status` does) `nspawn_lifecycle_host_mode_state{state}`,
//!   `nspawn_lifecycle_host_mode_check_failed{check}` and
//!   `nspawn_lifecycle_host_mode_last_post_start_success`: no `machine` label, so a machine
//!   named `host` cannot be mistaken for it;
//! - `nspawn_lifecycle_build_info{version,commit}` (1): the helper that wrote them, the node
//!   exporter's convention for which build runs where;
//! - `nspawn_lifecycle_machines_installed`, `nspawn_lifecycle_status_errors` (1 when status
//!   could not judge: the node exporter then still gets a parseable file saying so) and
//!   `nspawn_lifecycle_status_timestamp_seconds` (when this was judged).

use super::{HostFacts, PostStartRun, State, Status};
use anyhow::Result;
use std::fmt::Write as _;

/// The file the writer puts in the textfile collector's directory.
pub const TEXTFILE: &str = "nspawn_lifecycle.prom";

/// What one run of `status --all` found, for rendering.
#[derive(Debug, Default)]
pub struct Report {
    pub machines: Vec<Status>,
    /// The host as discovered (none when discovery itself failed).
    pub host: Option<HostFacts>,
    /// Machines installed (judged or not).
    pub installed: usize,
    /// Whether host mode is installed, and its status when it could be judged.
    pub host_mode_installed: bool,
    pub host_mode: Option<Status>,
    /// Why status could not judge (a machine or the whole host), if it could not.
    pub errors: Vec<String>,
    /// When it was judged, seconds since the epoch.
    pub now: f64,
}

const STATES: [(State, &str); 4] = [
    (State::InSync, "in_sync"),
    (State::Drift, "drift"),
    (State::Broken, "broken"),
    (State::NotRunning, "not_running"),
];

/// A label value escaped as the exposition format wants (`\`, `"`, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One sample: its labels and value.
type Sample<'a> = (Vec<(&'static str, &'a str)>, f64);

/// A gauge family: HELP, TYPE and its samples (a family with no sample is still declared, so a
/// reader knows the metric exists).
fn gauge<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = Sample<'a>>,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    for (labels, value) in samples {
        out.push_str(name);
        if !labels.is_empty() {
            let inner: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = write!(out, "{{{}}}", inner.join(","));
        }
        let _ = writeln!(out, " {value}");
    }
}

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// GPUs wired into the machine: its spec's devices named by index.
fn wired_gpus(s: &Status) -> Option<usize> {
    let facts = s.machine_facts.as_ref()?;
    Some(
        facts
            .cdi_spec
            .devices
            .iter()
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .count(),
    )
}

fn machine_version(s: &Status) -> String {
    s.machine_facts
        .as_ref()
        .map(|m| {
            let v = if m.cdi_spec.driver_versions.is_empty() {
                &m.driver_root_versions
            } else {
                &m.cdi_spec.driver_versions
            };
            v.join(",")
        })
        .unwrap_or_default()
}

/// The text exposition of `report`.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    machine_families(&mut out, report);
    post_start_families(&mut out, &report.machines);
    host_mode_families(&mut out, report);
    let host_gpus = report.host.as_ref().map(|h| h.gpus.len() as f64);
    gauge(
        &mut out,
        "nspawn_lifecycle_host_gpus",
        "NVIDIA GPUs the host has now (absent when discovery failed).",
        host_gpus.map(|n| (vec![], n)),
    );
    gauge(
        &mut out,
        "nspawn_lifecycle_machines_installed",
        "Machines installed on this host (with the helper's unit drop-in).",
        [(vec![], report.installed as f64)],
    );
    gauge(
        &mut out,
        "nspawn_lifecycle_status_errors",
        "Machines (or the host) status could not judge in this run; 0 when it judged all.",
        [(vec![], report.errors.len() as f64)],
    );
    gauge(
        &mut out,
        "nspawn_lifecycle_status_timestamp_seconds",
        "When status judged the machines, seconds since the epoch.",
        [(vec![], report.now)],
    );
    let build = crate::build_info::this();
    gauge(
        &mut out,
        "nspawn_lifecycle_build_info",
        "The helper that wrote these metrics: its version and git commit (always 1).",
        [(
            vec![("version", build.version), ("commit", build.commit)],
            1.0,
        )],
    );
    out
}

fn machine_families(out: &mut String, report: &Report) {
    let ms = &report.machines;
    gauge(
        out,
        "nspawn_lifecycle_state",
        "State of the machine's GPU wiring: 1 for the current state (status: 0 in sync, 5 drift, 6 broken, 7 not running).",
        ms.iter()
            .flat_map(|s| state_samples(s, vec![("machine", s.machine.as_str())])),
    );
    gauge(
        out,
        "nspawn_lifecycle_check_failed",
        "1 for each status check that is out of line for the machine (the check of a finding of status --json).",
        ms.iter()
            .flat_map(|s| check_samples(s, vec![("machine", s.machine.as_str())])),
    );
    gauge(
        out,
        "nspawn_lifecycle_gpus",
        "GPUs wired into the running machine (devices by index in its CDI spec).",
        ms.iter().filter_map(|s| {
            wired_gpus(s).map(|n| (vec![("machine", s.machine.as_str())], n as f64))
        }),
    );
    let host_version = report
        .host
        .as_ref()
        .and_then(|h| h.kernel_module.as_deref())
        .unwrap_or_default();
    let versions: Vec<String> = ms.iter().map(machine_version).collect();
    gauge(
        out,
        "nspawn_lifecycle_driver_info",
        "The host's NVIDIA kernel module version and the driver version the machine's CDI spec mounts (empty: none).",
        ms.iter().zip(&versions).map(|(s, v)| {
            (
                vec![
                    ("machine", s.machine.as_str()),
                    ("host_version", host_version),
                    ("machine_version", v.as_str()),
                ],
                1.0,
            )
        }),
    );
}

/// One sample per state, 1 for `s`'s and 0 for the others, with `labels` and `state`.
fn state_samples<'a>(
    s: &'a Status,
    labels: Vec<(&'static str, &'a str)>,
) -> impl Iterator<Item = Sample<'a>> {
    STATES.iter().map(move |(state, name)| {
        let mut l = labels.clone();
        l.push(("state", *name));
        (l, flag(s.state == *state))
    })
}

/// One sample (1) per check out of line in `s`, each once, with `labels` and `check`.
fn check_samples<'a>(
    s: &'a Status,
    labels: Vec<(&'static str, &'a str)>,
) -> impl Iterator<Item = Sample<'a>> {
    let mut checks: Vec<&'static str> = s.findings.iter().map(|f| f.check.as_str()).collect();
    checks.sort_unstable();
    checks.dedup();
    checks.into_iter().map(move |c| {
        let mut l = labels.clone();
        l.push(("check", c));
        (l, 1.0)
    })
}

fn post_start_families(out: &mut String, machines: &[Status]) {
    let runs: Vec<(&str, &PostStartRun)> = machines
        .iter()
        .filter_map(|s| {
            Some((
                s.machine.as_str(),
                s.unit.as_ref()?.last_post_start.as_ref()?,
            ))
        })
        .collect();
    let secs = |usec: u64| usec as f64 / 1e6;
    let exited = || {
        runs.iter()
            .filter(|(_, r)| r.exited_usec >= r.started_usec && r.exited_usec != 0)
    };
    gauge(
        out,
        "nspawn_lifecycle_last_post_start_timestamp_seconds",
        "When the machine unit's last post-start began, seconds since the epoch.",
        runs.iter()
            .map(|(m, r)| (vec![("machine", *m)], secs(r.started_usec))),
    );
    gauge(
        out,
        "nspawn_lifecycle_last_post_start_duration_seconds",
        "How long the last post-start ran (absent while it runs).",
        exited().map(|(m, r)| (vec![("machine", *m)], secs(r.exited_usec - r.started_usec))),
    );
    gauge(
        out,
        "nspawn_lifecycle_last_post_start_exit_status",
        "Exit status of the last post-start (128 + the signal when killed; absent while it runs).",
        runs.iter().filter_map(|(m, r)| {
            let code = r.exit_status.or(r.signal.map(|sig| 128 + sig))?;
            Some((vec![("machine", *m)], f64::from(code)))
        }),
    );
    gauge(
        out,
        "nspawn_lifecycle_last_post_start_success",
        "1 when the last post-start exited 0, else 0 (absent while it runs).",
        exited().map(|(m, r)| (vec![("machine", *m)], flag(r.succeeded))),
    );
}

/// Host mode's state, failed checks and last run: the machine families without a `machine`
/// label.
fn host_mode_families(out: &mut String, report: &Report) {
    let hm = report.host_mode.as_ref();
    gauge(
        out,
        "nspawn_lifecycle_host_mode_installed",
        "1 when host mode is installed on this host (install --host), else 0.",
        [(vec![], flag(report.host_mode_installed))],
    );
    gauge(
        out,
        "nspawn_lifecycle_host_mode_state",
        "State of host mode's GPU wiring: 1 for the current state (host status: 0 in sync, 5 drift, 6 broken, 7 not run).",
        hm.into_iter().flat_map(|s| state_samples(s, vec![])),
    );
    gauge(
        out,
        "nspawn_lifecycle_host_mode_check_failed",
        "1 for each host status check that is out of line.",
        hm.into_iter().flat_map(|s| check_samples(s, vec![])),
    );
    gauge(
        out,
        "nspawn_lifecycle_host_mode_last_post_start_success",
        "1 when the last host post-start (nspawn-lifecycle-host.service) exited 0, else 0 (absent while it runs or before it ran).",
        hm.and_then(|s| s.unit.as_ref()?.last_post_start.as_ref())
            .filter(|r| r.exited_usec != 0)
            .map(|r| (vec![], flag(r.succeeded))),
    );
}

/// Write `text` as [`TEXTFILE`] in `dir` (a directory of the host tree, which must exist: it is
/// the collector's), atomically: a temporary name the collector ignores (it reads `*.prom` only),
/// fsync, rename over the old file, so a scrape reads the old file or the new one, never half.
/// Writes nothing else.
pub(crate) fn write_textfile(
    host: &crate::fs::host::HostRoot,
    dir: &std::path::Path,
    text: &str,
) -> Result<()> {
    // The node exporter's account owns the directory and its parent (Debian's package): a link
    // it puts anywhere on the way is refused, never followed, and the file in it is replaced
    // by rename, never written or read through a link (`write_if_changed_unnamed`).
    let fd = host.open_dir_no_symlinks(dir).map_err(|e| {
        let shown = host.path(dir);
        if e.raw_os_error() == Some(libc::ELOOP) {
            anyhow::anyhow!(
                "the textfile collector's directory {} or one of its parents is a symlink: \
                 metrics writes only into a directory reached without one (give the resolved \
                 path with --textfile-dir)",
                shown.display()
            )
        } else {
            anyhow::Error::new(e).context(format!(
                "opening the textfile collector's directory {} (is prometheus-node-exporter \
                 installed?)",
                shown.display()
            ))
        }
    })?;
    crate::fs::atomic::write_if_changed_unnamed(
        &fd,
        &host.path(dir),
        TEXTFILE,
        text.as_bytes(),
        0o644,
    )?;
    Ok(())
}
