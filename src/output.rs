//! What more than one command prints: the discovery report, and stdout that a closed pipe does
//! not turn into an error.

use crate::discovery::{Inventory, UserspaceDriver, Verdict};
use anyhow::{Context as _, Result};
use std::fmt::Write as _;

/// Human-readable discovery report.
pub fn discovery_text(inv: &Inventory) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "verdict: {}",
        match &inv.verdict {
            Verdict::None => "none (no NVIDIA device nodes; GPU work is skipped)".to_owned(),
            Verdict::Complete => "complete".to_owned(),
            Verdict::Incomplete { reasons } => format!("incomplete: {}", reasons.join("; ")),
        }
    );
    let _ = writeln!(
        s,
        "kernel module: {}",
        inv.kernel_module.as_deref().unwrap_or("not loaded")
    );
    let _ = writeln!(
        s,
        "userspace driver: {}",
        inv.driver
            .as_ref()
            .map_or("not found", |d| d.version.as_str())
    );
    gpus_text(&mut s, inv);
    if let Some(d) = &inv.driver {
        driver_text(&mut s, d);
    }
    s
}

/// The GPUs, the device nodes and `/dev/kvm` of [`discovery_text`].
fn gpus_text(s: &mut String, inv: &Inventory) {
    let _ = writeln!(s, "gpus: {}", inv.gpus.len());
    for g in &inv.gpus {
        let _ = writeln!(
            s,
            "  {} minor {} {} {} {} {}{}",
            g.index,
            g.minor,
            g.uuid,
            g.bus_id,
            g.model,
            g.device.as_deref().unwrap_or("(no device node)"),
            if g.dri.is_empty() {
                String::new()
            } else {
                format!(" {}", g.dri.join(" "))
            }
        );
    }
    let _ = writeln!(s, "device nodes: {}", inv.devices.len());
    for d in &inv.devices {
        let _ = writeln!(
            s,
            "  {} {}:{} {}",
            d.path,
            d.major,
            d.minor,
            d.role.as_str()
        );
    }
    let _ = writeln!(
        s,
        "kvm: {}",
        inv.kvm.as_ref().map_or("absent".to_owned(), |k| format!(
            "{} {}:{}",
            k.path, k.major, k.minor
        ))
    );
    let _ = writeln!(s, "host devices: {}", inv.host_devices.len());
    for d in &inv.host_devices {
        let _ = writeln!(
            s,
            "  {} {} {} {}:{}{}",
            d.category.as_str(),
            d.path,
            d.kind.as_str(),
            d.major,
            d.minor,
            if d.create {
                " (registered without a node: pre-start makes it)"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(s, "disks: {}", inv.disks.len());
    for d in &inv.disks {
        let _ = writeln!(
            s,
            "  {} {}:{} {}",
            d.path,
            d.major,
            d.minor,
            match &d.used {
                Some(why) => format!("the host's: {why}"),
                None => "free".to_owned(),
            }
        );
    }
}

/// The userspace driver's files of [`discovery_text`].
fn driver_text(s: &mut String, d: &UserspaceDriver) {
    for dir in &d.lib_dirs {
        let _ = writeln!(
            s,
            "library dir: {} ({}, {} files)",
            dir.path,
            dir.triplet,
            dir.files.len()
        );
        for f in &dir.files {
            let _ = writeln!(
                s,
                "  {}{}",
                f.name,
                f.soname
                    .as_ref()
                    .map_or(String::new(), |so| format!(" (SONAME {so})"))
            );
        }
    }
    for b in &d.binaries {
        let _ = writeln!(s, "binary: {b}");
    }
    let _ = writeln!(s, "firmware: {}", d.firmware.as_deref().unwrap_or("absent"));
    for sock in &d.sockets {
        let _ = writeln!(s, "ipc: {sock}");
    }
}

/// Whether this process printed to stdout through [`print_all`]: a command's JSON error object
/// is printed only when its report was not (one JSON document on stdout, never two).
static PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether anything was printed to stdout through [`print_all`].
pub fn printed() -> bool {
    PRINTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Print to stdout; a reader that went away (`demo | head`) is not an error.
pub fn print_all(text: &str) -> Result<()> {
    PRINTED.store(true, std::sync::atomic::Ordering::Relaxed);
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("writing to standard output")
        }
        _ => Ok(()),
    }
}

/// `text` as it may reach an operator's terminal: what a machine wrote (a link target, a file
/// name) may hold control characters that rewrite the screen (`\r`, `ESC [2K`), forge a line
/// (`\n`) or reorder it (Unicode bidi controls). Each such character is written as its Rust
/// escape (`\u{1b}`); a backslash stays as it is. Borrowed when there is nothing to escape.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    escaped(text, false)
}

/// [`printable`] for a message of several lines of ours (an error with a command's output):
/// newlines are kept, every other control character escaped.
pub fn printable_lines(text: &str) -> std::borrow::Cow<'_, str> {
    escaped(text, true)
}

fn escaped(text: &str, keep_newlines: bool) -> std::borrow::Cow<'_, str> {
    let hides = |c: char| {
        (c.is_control() && !(keep_newlines && c == '\n'))
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hides) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hides(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod printable_tests {
    use super::printable;

    #[test]
    fn control_and_bidi_characters_are_escaped_the_rest_kept() {
        assert_eq!(printable("kube1: in sync"), "kube1: in sync");
        assert_eq!(
            printable("a\r\u{1b}[2Kkube1: in sync\n"),
            "a\\u{d}\\u{1b}[2Kkube1: in sync\\u{a}"
        );
        assert_eq!(printable("x\u{202e}gpj.exe"), "x\\u{202e}gpj.exe");
        assert_eq!(printable("Grüße /ä\\b"), "Grüße /ä\\b");
        assert_eq!(
            super::printable_lines("output so far:\nline\r\u{1b}"),
            "output so far:\nline\\u{d}\\u{1b}"
        );
    }
}

/// The one JSON object a `--json` command prints when it fails before its report, for a script
/// to parse: its kind (`StatusError`, `PlanError`, …), the machine (or `host`), `status`'s
/// `state`, the exit code the command exits with, and the error, which also goes to stderr
/// (`assets/json-schema/status-error.schema.json`, `command-error.schema.json`).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ErrorObject<'a> {
    api_version: &'static str,
    kind: &'static str,
    machine: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'static str>,
    exit_code: u8,
    error: String,
}

/// Print the [`ErrorObject`] of `e` and return `e` (with why printing failed, if it did).
pub fn print_error_object(
    kind: &'static str,
    machine: Option<&str>,
    state: Option<&'static str>,
    e: anyhow::Error,
) -> anyhow::Error {
    let object = ErrorObject {
        api_version: crate::discovery::API_VERSION,
        kind,
        machine,
        state,
        exit_code: crate::error::exit_code(&e),
        error: format!("{e:#}"),
    };
    let printed = serde_json::to_string_pretty(&object)
        .map_err(anyhow::Error::from)
        .and_then(|text| print_all(&format!("{text}\n")));
    match printed {
        Ok(()) => e,
        Err(p) => e.context(format!("{p:#}")),
    }
}
