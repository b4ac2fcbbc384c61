//! The binary's command line as an operator meets it: shell completions and man pages generated
//! from the clap definition, and error lines that name each cause once.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_nspawn-lifecycle-helper");

/// The first `: `-separated segment of `line` that appears twice, if any.
fn repeated_segment(line: &str) -> Option<&str> {
    let segments: Vec<&str> = line.split(": ").collect();
    segments
        .iter()
        .enumerate()
        .find(|(i, s)| segments[..*i].contains(s))
        .map(|(_, s)| *s)
}

#[test]
fn repeated_segment_finds_the_issue_16_line() {
    let old = "error: connecting to the host's system bus: failed to connect to \
               `unix:path=/nonexistent`: No such file or directory (os error 2): No such file or \
               directory (os error 2)";
    assert_eq!(
        repeated_segment(old),
        Some("No such file or directory (os error 2)")
    );
    assert_eq!(repeated_segment("error: a: b: c"), None);
}

/// Needs root: post-start takes the machine lock under /run before it connects to the bus.
#[test]
fn privileged_no_system_bus_names_each_cause_once() {
    let machine = "cli-test-no-bus";
    let out = Command::new(BIN)
        .args(["nspawn-lifecycle", "post-start", machine])
        .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent")
        .output()
        .expect("running the helper");
    let _ = std::fs::remove_file(format!("/run/nspawn-lifecycle/locks/{machine}.lock"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {stderr:?}"));
    assert!(
        line.contains("system bus") && line.contains("No such file or directory"),
        "{line}"
    );
    assert_eq!(repeated_segment(line), None, "{line}");
}
