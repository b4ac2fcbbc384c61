//! Timing a child process from spawn to reaped exit, with its own peak RSS, and summarizing
//! samples.

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One run of a child process.
#[derive(Debug, Clone, Copy)]
pub struct ProcRun {
    pub wall: Duration,
    /// `ru_maxrss` of that child alone (from `wait4`), KiB.
    pub max_rss_kib: u64,
    pub exit_code: i32,
}

/// Spawn `cmd` with stdio on /dev/null and reap it with `wait4`: wall time from just before the
/// spawn to just after the reap (so fork/exec and exit are included, as systemd pays them), and
/// the child's own peak RSS. The floor (`--version`) is measured the same way, so the difference
/// is what the work costs.
pub fn run_process(cmd: &mut Command) -> Result<ProcRun> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let start = Instant::now();
    let child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
    let (status, rusage) = wait4(child.id())?;
    let wall = start.elapsed();
    // The child was reaped by wait4; std's handle must not wait for it again.
    drop(child);
    let exit_code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        bail!("{cmd:?} did not exit normally (wait status {status:#x})");
    };
    Ok(ProcRun {
        wall,
        max_rss_kib: u64::try_from(rusage.ru_maxrss).unwrap_or(0),
        exit_code,
    })
}

/// `wait4(pid)`: std's `Child::wait` discards the child's rusage, which holds its peak RSS.
#[allow(unsafe_code)]
fn wait4(pid: u32) -> Result<(i32, libc::rusage)> {
    let pid = libc::pid_t::try_from(pid).context("pid out of range")?;
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `rusage` are valid, writable, and live across the call; `pid` is
        // our own unreaped child.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut rusage) };
        if r == pid {
            return Ok((status, rusage));
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).context("wait4");
        }
    }
}

/// Summary of one series of samples, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub p10: f64,
    pub p90: f64,
    pub max: f64,
    pub mean: f64,
}

/// Nearest-rank percentile of sorted samples (`q` in 0..=1).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

pub fn summarize(samples: &[f64]) -> Summary {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let median = if s.is_empty() {
        f64::NAN
    } else if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    Summary {
        n: s.len(),
        median,
        min: s.first().copied().unwrap_or(f64::NAN),
        p10: percentile(&s, 0.10),
        p90: percentile(&s, 0.90),
        max: s.last().copied().unwrap_or(f64::NAN),
        mean: s.iter().sum::<f64>() / s.len().max(1) as f64,
    }
}

pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
