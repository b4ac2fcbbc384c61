//! The fleet metrics, checked with Prometheus's own tools (Debian 12's `promtool`, fetched by
//! tests/metrics/fetch-prometheus.sh): `status --format prometheus` of every state passes
//! `promtool check metrics` and says the state; the alert rules pass `promtool check rules` and
//! their unit tests (`promtool test rules`); the `metrics` writer writes one file atomically, into
//! the collector's directory only.
//!
//! Privileged (mknod for the fixture hosts): fails, not skips, when not run as root.

#![allow(clippy::unwrap_used)]

mod common;
use common::{installed_host as host, machine_tree as machine, run_helper, snapshot};
use nspawn_lifecycle::commands::status::metrics::{self, Report};
use nspawn_lifecycle::commands::status::{HostFacts, State, Status, UnitFacts};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const SPEC: &str = "run/cdi/nvidia.com-gpu.json";
const ASSETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/prometheus");

fn prometheus_tools() -> PathBuf {
    common::fetched("metrics/fetch-prometheus.sh")
}

fn promtool(args: &[&str], stdin: &[u8], dir: &Path) -> Output {
    let mut child = Command::new(prometheus_tools().join("usr/bin/promtool"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// `promtool check metrics` accepts `text` with no complaint at all (lint included).
fn check_metrics(what: &str, text: &str) {
    let out = promtool(&["check", "metrics"], text.as_bytes(), Path::new("/"));
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics on {what}: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn prometheus(host: &Path, machine: Option<&Path>) -> (String, Option<i32>) {
    let mut args = vec!["status", "--all", "--format", "prometheus"];
    if let Some(m) = machine {
        args.extend(["--machine-root", m.to_str().unwrap()]);
    }
    let out = run_helper(host, &args);
    (String::from_utf8(out.stdout).unwrap(), out.status.code())
}

fn has(text: &str, line: &str) {
    assert!(
        text.lines().any(|l| l == line),
        "no line {line:?} in\n{text}"
    );
}

#[test]
fn privileged_every_state_is_valid_exposition_naming_the_state() {
    let m = machine();
    // In sync: no GPUs, no NVIDIA state.
    let cpu = host("cpu-only", &["kube1"]);
    let (text, code) = prometheus(cpu.path(), Some(m.path()));
    assert_eq!(code, Some(0), "{text}");
    check_metrics("in sync", &text);
    has(
        &text,
        r#"nspawn_lifecycle_state{machine="kube1",state="in_sync"} 1"#,
    );
    has(
        &text,
        r#"nspawn_lifecycle_state{machine="kube1",state="drift"} 0"#,
    );
    has(&text, "nspawn_lifecycle_host_gpus 0");
    has(&text, "nspawn_lifecycle_status_errors 0");
    has(&text, "nspawn_lifecycle_machines_installed 1");
    // Which helper wrote them: the version and the commit it was built from.
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    has(
        &text,
        &format!(
            r#"nspawn_lifecycle_build_info{{version="{}",commit="{head}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        ),
    );

    // Drift: two GPUs the machine never saw, two machines.
    let gpus = host("two-gpus", &["kube1", "kube2"]);
    let (text, code) = prometheus(gpus.path(), Some(m.path()));
    assert_eq!(code, Some(5), "{text}");
    check_metrics("drift", &text);
    for k in ["kube1", "kube2"] {
        has(
            &text,
            &format!(r#"nspawn_lifecycle_state{{machine="{k}",state="drift"}} 1"#),
        );
        has(
            &text,
            &format!(
                r#"nspawn_lifecycle_driver_info{{machine="{k}",host_version="580.95.05",machine_version=""}} 1"#
            ),
        );
    }
    has(&text, "nspawn_lifecycle_host_gpus 2");
    has(&text, "nspawn_lifecycle_machines_installed 2");

    // Broken: a spec that does not load.
    std::fs::create_dir_all(m.path().join("run/cdi")).unwrap();
    std::fs::write(m.path().join(SPEC), "{\"cdiVersion\": 5}").unwrap();
    let (text, code) = prometheus(gpus.path(), Some(m.path()));
    assert_eq!(code, Some(6), "{text}");
    check_metrics("broken", &text);
    has(
        &text,
        r#"nspawn_lifecycle_state{machine="kube1",state="broken"} 1"#,
    );
    has(
        &text,
        r#"nspawn_lifecycle_check_failed{machine="kube1",check="cdi-spec"} 1"#,
    );

    // No machine installed: nothing to judge, said as such (exit 8, as `status --all`).
    let none = host("two-gpus", &[]);
    let (text, code) = prometheus(none.path(), Some(m.path()));
    assert_eq!(code, Some(8), "{text}");
    check_metrics("no machines", &text);
    has(&text, "nspawn_lifecycle_machines_installed 0");
    assert!(!text.contains("nspawn_lifecycle_state{"), "{text}");

    // Status cannot judge (here: no machine tree and no systemd to ask): still a whole,
    // parseable answer, with the error counted, and exit 1.
    let (text, code) = prometheus(gpus.path(), None);
    assert_eq!(code, Some(1), "{text}");
    check_metrics("status failing", &text);
    has(&text, "nspawn_lifecycle_status_errors 2");
    has(&text, "nspawn_lifecycle_machines_installed 2");

    // A configuration that does not load: the same.
    std::fs::create_dir_all(gpus.path().join("etc/nspawn-lifecycle")).unwrap();
    std::fs::write(gpus.path().join("etc/nspawn-lifecycle/config.json"), "{").unwrap();
    let (text, code) = prometheus(gpus.path(), Some(m.path()));
    assert_eq!(code, Some(1), "{text}");
    check_metrics("bad config", &text);
    has(&text, "nspawn_lifecycle_status_errors 1");
}

/// Host mode installed beside a machine: judged as `host status` does (here, never run: its gate
/// holds both services, broken), in families of its own; before `install --host`, installed 0.
#[test]
fn privileged_host_mode_has_metrics_of_its_own() {
    let m = machine();
    let gpus = host("two-gpus", &["kube1"]);
    let (text, _) = prometheus(gpus.path(), Some(m.path()));
    has(&text, "nspawn_lifecycle_host_mode_installed 0");
    assert!(
        !text.contains("nspawn_lifecycle_host_mode_state{"),
        "{text}"
    );
    let out = common::install(gpus.path(), &["--host"]);
    assert!(out.status.success(), "{out:?}");
    let (text, code) = prometheus(gpus.path(), Some(m.path()));
    assert_eq!(
        code,
        Some(5),
        "the machines' worst state, as status --all: {text}"
    );
    check_metrics("host mode", &text);
    has(&text, "nspawn_lifecycle_host_mode_installed 1");
    has(
        &text,
        r#"nspawn_lifecycle_host_mode_state{state="broken"} 1"#,
    );
    has(
        &text,
        r#"nspawn_lifecycle_host_mode_check_failed{check="gate"} 1"#,
    );
    has(&text, "nspawn_lifecycle_status_errors 0");
}

/// Not running, and a last post-start that failed: states the fixture hosts cannot reach without
/// a systemd, rendered from the values `status` builds.
#[test]
fn not_running_and_a_failed_post_start_are_valid_exposition() {
    let status = |machine: &str, state: State, unit: Option<UnitFacts>| Status {
        api_version: "nspawn-lifecycle/v1",
        kind: "MachineStatus",
        machine: machine.into(),
        state,
        exit_code: state.exit_code(),
        summary: String::new(),
        host: HostFacts {
            verdict: "complete",
            kernel_module: Some("580.95.05".into()),
            gpus: Vec::new(),
        },
        unit,
        running: false,
        machine_facts: None,
        services: None,
        findings: Vec::new(),
        assignment: None,
        judged_by: nspawn_lifecycle::build_info::this(),
    };
    let unit = UnitFacts {
        unit: "systemd-nspawn@kube2.service".into(),
        active_state: "failed".into(),
        sub_state: "failed".into(),
        result: "exit-code".into(),
        invocation_id: String::new(),
        last_post_start: Some(nspawn_lifecycle::commands::status::PostStartRun {
            started_at: "2026-12-03T12:00:00Z".into(),
            exited_at: Some("2026-12-03T12:00:02Z".into()),
            exit_status: None,
            signal: Some(9),
            succeeded: false,
            started_usec: 1_796_385_600_000_000,
            exited_usec: 1_796_385_602_500_000,
        }),
    };
    let report = Report {
        machines: vec![
            status("kube1", State::NotRunning, None),
            status("kube2", State::Broken, Some(unit.clone())),
        ],
        host: None,
        installed: 2,
        host_mode_installed: true,
        host_mode: Some(Status {
            findings: vec![nspawn_lifecycle::commands::status::Finding {
                state: State::Broken,
                check: nspawn_lifecycle::model::Check::Gate,
                message: String::new(),
            }],
            ..status("host", State::Broken, Some(unit))
        }),
        errors: Vec::new(),
        now: 1_796_385_700.0,
    };
    let text = metrics::render(&report);
    check_metrics("not running", &text);
    has(
        &text,
        r#"nspawn_lifecycle_state{machine="kube1",state="not_running"} 1"#,
    );
    has(
        &text,
        r#"nspawn_lifecycle_last_post_start_timestamp_seconds{machine="kube2"} 1796385600"#,
    );
    has(
        &text,
        r#"nspawn_lifecycle_last_post_start_duration_seconds{machine="kube2"} 2.5"#,
    );
    has(
        &text,
        r#"nspawn_lifecycle_last_post_start_exit_status{machine="kube2"} 137"#,
    );
    has(
        &text,
        r#"nspawn_lifecycle_last_post_start_success{machine="kube2"} 0"#,
    );
    // Host mode: its own families, no machine label (a machine named `host` stays apart).
    has(&text, "nspawn_lifecycle_host_mode_installed 1");
    has(
        &text,
        r#"nspawn_lifecycle_host_mode_state{state="broken"} 1"#,
    );
    has(
        &text,
        r#"nspawn_lifecycle_host_mode_state{state="in_sync"} 0"#,
    );
    has(
        &text,
        r#"nspawn_lifecycle_host_mode_check_failed{check="gate"} 1"#,
    );
    has(
        &text,
        "nspawn_lifecycle_host_mode_last_post_start_success 0",
    );
    assert!(!text.contains(r#"machine="host""#), "{text}");
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = Path::new(ASSETS);
    let out = promtool(&["check", "rules", "nspawn-lifecycle.rules.yml"], b"", dir);
    assert!(out.status.success(), "{out:?}");
    let out = promtool(
        &["test", "rules", "nspawn-lifecycle.rules.test.yml"],
        b"",
        dir,
    );
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The writer puts exactly one file into the collector's directory, replaced atomically (a
/// reader racing it only ever sees whole files), and refuses a directory that is not there.
#[test]
fn privileged_the_writer_writes_one_whole_file_and_nothing_else() {
    let h = host("two-gpus", &["kube1"]);
    let dir = "var/lib/prometheus/node-exporter";
    // Missing directory (no node exporter): exit 1 naming it, nothing written.
    let before = snapshot(h.path(), &[]);
    let out = run_helper(h.path(), &["metrics"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(dir),
        "{out:?}"
    );
    assert_eq!(before, snapshot(h.path(), &[]));

    std::fs::create_dir_all(h.path().join(dir)).unwrap();
    let before = snapshot(h.path(), &[dir]);
    let file = h.path().join(dir).join(metrics::TEXTFILE);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (file, stop) = (file.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(text) = std::fs::read_to_string(&file) {
                    assert!(
                        text.ends_with("\n")
                            && text.contains("\nnspawn_lifecycle_status_timestamp_seconds "),
                        "a partial file: {text:?}"
                    );
                    seen += 1;
                }
            }
            seen
        })
    };
    for _ in 0..30 {
        let out = run_helper(h.path(), &["metrics"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0, "the reader never saw the file");
    assert_eq!(
        before,
        snapshot(h.path(), &[dir]),
        "the writer wrote outside its directory"
    );
    let names: Vec<_> = std::fs::read_dir(h.path().join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, [metrics::TEXTFILE]);
    let text = std::fs::read_to_string(&file).unwrap();
    check_metrics("the writer's file", &text);
    // No machine tree to read on a fixture host: the file says status could not judge kube1.
    has(&text, "nspawn_lifecycle_status_errors 1");
}

/// The node exporter's account owns the collector's directory and its parent (Debian's package
/// gives `/var/lib/prometheus` to `prometheus`), so it can put a link where root's writer goes.
/// A link on the way to the directory: exit 1 naming it, nothing written where it points. A
/// link, a FIFO or an endless file in place of the textfile: replaced by the writer's file,
/// never followed, never read past the size of what it writes (the helper runs with 256 MiB of
/// address space: reading `/dev/zero` to its end would fail it).
#[test]
fn privileged_the_writer_follows_no_link_the_collectors_account_plants() {
    use std::os::unix::fs::{FileTypeExt as _, symlink};
    let h = host("two-gpus", &["kube1"]);
    let metrics_bounded = |root: &Path| {
        // util-linux's prlimit (installed by tests/run-all.sh) bounds the address space.
        let mut cmd = Command::new("prlimit");
        cmd.arg(format!("--as={}", 256 << 20))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_nspawn-lifecycle-helper"))
            .arg("--host-root")
            .arg(root)
            .arg("metrics");
        cmd.output().unwrap()
    };
    let lib = h.path().join("var/lib/prometheus");
    let sudoers = h.path().join("etc/sudoers.d");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(&sudoers).unwrap();
    // The directory itself a link (absolute and relative), then a parent of it.
    for (link, target) in [
        ("var/lib/prometheus/node-exporter", "/etc/sudoers.d"),
        ("var/lib/prometheus/node-exporter", "../../../etc/sudoers.d"),
    ] {
        let _ = std::fs::remove_file(h.path().join(link));
        symlink(target, h.path().join(link)).unwrap();
        let out = metrics_bounded(h.path());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            err.contains("node-exporter or one of its parents is a symlink"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&sudoers).unwrap().count(), 0, "{target}");
    }
    std::fs::remove_file(lib.join("node-exporter")).unwrap();
    std::fs::remove_dir(&lib).unwrap();
    std::fs::create_dir_all(h.path().join("srv/elsewhere/node-exporter")).unwrap();
    symlink("../../srv/elsewhere", &lib).unwrap();
    let out = metrics_bounded(h.path());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        std::fs::read_dir(h.path().join("srv/elsewhere/node-exporter"))
            .unwrap()
            .count(),
        0
    );
    std::fs::remove_file(&lib).unwrap();

    // The textfile itself: a link to an endless device, to a root-only file, a FIFO.
    let dir = lib.join("node-exporter");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(metrics::TEXTFILE);
    std::fs::write(sudoers.join("keep"), "root ALL=(ALL) ALL\n").unwrap();
    for plant in ["/dev/zero", "link-out", "fifo", "sparse"] {
        let _ = std::fs::remove_file(&file);
        match plant {
            "link-out" => symlink(sudoers.join("keep"), &file).unwrap(),
            "fifo" => {
                nix::unistd::mkfifo(&file, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap()
            }
            "sparse" => std::fs::File::create(&file)
                .unwrap()
                .set_len(8 << 30)
                .unwrap(),
            _ => symlink(plant, &file).unwrap(),
        }
        let out = metrics_bounded(h.path());
        assert_eq!(out.status.code(), Some(0), "{plant}: {out:?}");
        let meta = std::fs::symlink_metadata(&file).unwrap();
        assert!(meta.is_file() && !meta.file_type().is_fifo(), "{plant}");
        check_metrics(plant, &std::fs::read_to_string(&file).unwrap());
        assert_eq!(
            std::fs::read_to_string(sudoers.join("keep")).unwrap(),
            "root ALL=(ALL) ALL\n"
        );
    }
}

/// Every alert carries what an on-call needs: a summary, a description, and a runbook_url whose
/// anchor is a section of docs/monitoring.md (GitHub's heading anchors: the alert's name in
/// lower case).
#[test]
fn every_alert_has_a_description_and_a_runbook_section() {
    let rules =
        std::fs::read_to_string(Path::new(ASSETS).join("nspawn-lifecycle.rules.yml")).unwrap();
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/monitoring.md"))
            .unwrap();
    let anchors: Vec<String> = docs
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    let blocks: Vec<&str> = rules.split("      - alert: ").skip(1).collect();
    assert_eq!(blocks.len(), 10, "{rules}");
    for b in blocks {
        let name = b.lines().next().unwrap().trim();
        for key in ["summary: '", "description: '", "runbook_url: '"] {
            assert!(b.contains(key), "{name} has no {key}");
        }
        let url = b
            .split("runbook_url: '")
            .nth(1)
            .unwrap()
            .split('\'')
            .next()
            .unwrap();
        assert_eq!(
            url,
            format!("docs/monitoring.md#{}", name.to_lowercase()),
            "{name}"
        );
        assert!(
            anchors.contains(&name.to_lowercase()),
            "docs/monitoring.md has no section '### {name}'"
        );
    }
}
