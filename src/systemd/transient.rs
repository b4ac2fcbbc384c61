//! Running a command inside a machine as a transient oneshot service, bus-only.
//!
//! stdout and stderr go to one pipe whose write end is handed to systemd with the
//! `StandardOutputFileDescriptor`/`StandardErrorFileDescriptor` properties (fd passing over the
//! bus); a reader thread keeps the last [`OUTPUT_LIMIT`] bytes so a chatty command never blocks.
//! `AddRef=yes` pins the unit until its exit status has been read (otherwise
//! `CollectMode=inactive-or-failed` could collect it first); `Unref` then lets systemd collect it.

use super::{JobResult, Systemd};
use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::fmt;
use std::io::Read as _;
use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zbus::{Fd, OwnedObjectPath, Variant};

/// The most output kept from one command (its tail).
pub const OUTPUT_LIMIT: usize = 64 * 1024;
/// Extra time past the unit's own start timeout before the helper stops waiting: systemd kills
/// the command at its timeout, and this leaves room to see that result.
const GRACE: Duration = Duration::from_secs(5);

/// How the command's main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Killed {
        signal: i32,
        core_dumped: bool,
    },
    /// systemd never started it (`ExecMainCode` 0).
    NotRun,
}

impl ExitStatus {
    /// From `ExecMainCode` (a `CLD_*` code) and `ExecMainStatus`.
    pub fn from_exec_main(code: i32, status: i32) -> ExitStatus {
        match code {
            1 => ExitStatus::Exited(status),
            2 => ExitStatus::Killed {
                signal: status,
                core_dumped: false,
            },
            3 => ExitStatus::Killed {
                signal: status,
                core_dumped: true,
            },
            _ => ExitStatus::NotRun,
        }
    }

    pub fn success(self) -> bool {
        self == ExitStatus::Exited(0)
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Exited(n) => write!(f, "exit status {n}"),
            ExitStatus::Killed {
                signal,
                core_dumped,
            } => {
                let name = nix::sys::signal::Signal::try_from(*signal)
                    .map_or_else(|_| signal.to_string(), |s| s.as_str().to_owned());
                write!(f, "killed by {name}")?;
                if *core_dumped {
                    f.write_str(" (core dumped)")?;
                }
                Ok(())
            }
            ExitStatus::NotRun => f.write_str("never started"),
        }
    }
}

/// What a transient command did.
#[derive(Debug, Clone)]
pub struct TransientOutcome {
    /// The transient unit's name (gone once this is returned).
    pub unit: String,
    pub exit_status: ExitStatus,
    /// The service's `Result` (`success`, `exit-code`, `signal`, `timeout`, …).
    pub result: String,
    /// stdout and stderr interleaved as written, at most [`OUTPUT_LIMIT`] bytes (the tail).
    pub output: String,
    /// Bytes dropped from the front of `output`.
    pub output_dropped: u64,
    pub elapsed: Duration,
}

impl TransientOutcome {
    pub fn success(&self) -> bool {
        self.exit_status.success()
    }

    /// `Ok` when the command exited 0, else an error naming the unit, status and output.
    pub fn check(&self, what: &str) -> Result<()> {
        if self.success() {
            return Ok(());
        }
        let output = self.output.trim_end();
        bail!(
            "{what} ({}) failed: {} (Result {}){}{}",
            self.unit,
            self.exit_status,
            self.result,
            if output.is_empty() { "" } else { "; output:\n" },
            output
        )
    }
}

pub(super) fn run(
    sd: &Systemd,
    name_prefix: &str,
    argv: &[&str],
    stdin: Option<std::os::fd::BorrowedFd<'_>>,
    timeout: Duration,
) -> Result<TransientOutcome> {
    let program = check_command(name_prefix, argv)?;
    let cmd = Command {
        program,
        argv,
        stdin,
        timeout,
    };
    let unit = unique_name(name_prefix);
    let started = Instant::now();
    let deadline = started + timeout + GRACE;
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).context("creating output pipe")?;
    let capture = Capture::start(read)?;
    tracing::debug!(bus = %sd.label(), %unit, ?argv, "starting transient unit");

    let outcome = zbus::block_on(async {
        let job = start_unit(sd, &unit, &cmd, write, deadline).await;
        let path = sd
            .load_unit(&unit, deadline.max(Instant::now() + GRACE))
            .await;
        let state = match (&job, &path) {
            (Ok(_), Ok(p)) => Some(sd.service_state_at(&unit, p, deadline + GRACE).await),
            _ => None,
        };
        if let Ok(p) = &path {
            let timed_out = job.as_ref().err().is_some_and(|e| {
                matches!(
                    e.downcast_ref::<super::SystemdError>(),
                    Some(super::SystemdError::Timeout { .. })
                )
            });
            release_unit(sd, &unit, p, timed_out).await;
        }
        (job, state)
    });
    let (output, dropped) = capture.finish();
    let (job, state) = outcome;
    let job = job.map_err(|e| {
        let tail = output.trim_end();
        if tail.is_empty() {
            e
        } else {
            e.context(format!("output so far:\n{tail}"))
        }
    })?;
    let state = state.context("reading the transient unit's exit status")??;
    if !matches!(
        job,
        JobResult::Done | JobResult::Failed | JobResult::Timeout
    ) {
        tracing::warn!(%unit, result = %job, "unexpected job result for transient unit");
    }
    let outcome = TransientOutcome {
        unit,
        exit_status: ExitStatus::from_exec_main(state.exec_main_code, state.exec_main_status),
        result: state.result,
        output,
        output_dropped: dropped,
        elapsed: started.elapsed(),
    };
    tracing::debug!(bus = %sd.label(), unit = %outcome.unit, status = %outcome.exit_status,
        "transient unit finished in {:.2}s", outcome.elapsed.as_secs_f64());
    Ok(outcome)
}

/// A command line for a transient unit, checked by [`check_command`].
struct Command<'a> {
    program: &'a str,
    argv: &'a [&'a str],
    stdin: Option<std::os::fd::BorrowedFd<'a>>,
    timeout: Duration,
}

/// The program of `argv`, once the unit name prefix and the command line are fit for systemd.
fn check_command<'a>(name_prefix: &str, argv: &[&'a str]) -> Result<&'a str> {
    if name_prefix.is_empty()
        || !name_prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ":_.-".contains(c))
    {
        bail!("transient unit prefix {name_prefix:?} is not a valid unit name part");
    }
    let Some(program) = argv.first() else {
        bail!("transient unit {name_prefix}: empty command line");
    };
    if !program.starts_with('/') {
        bail!("transient unit {name_prefix}: {program:?} must be an absolute path");
    }
    Ok(program)
}

/// `StartTransientUnit` of a oneshot service running `cmd` with stdout and stderr on `write`,
/// and wait for its start job.
async fn start_unit(
    sd: &Systemd,
    unit: &str,
    cmd: &Command<'_>,
    write: OwnedFd,
    deadline: Instant,
) -> Result<JobResult> {
    let description = format!("nspawn-lifecycle: {}", cmd.argv.join(" "));
    let exec: Vec<(&str, Vec<&str>, bool)> = vec![(cmd.program, cmd.argv.to_vec(), false)];
    let timeout_usec = u64::try_from(cmd.timeout.as_micros()).unwrap_or(u64::MAX);
    let stdin = cmd.stdin;
    sd.job("start", unit, deadline, None, |mgr| async move {
        let mut props: Vec<(&str, Variant<'_>)> = vec![
            ("Description", Variant::from(description.as_str())),
            ("Type", Variant::from("oneshot")),
            ("ExecStart", Variant::from(exec)),
            (
                "StandardOutputFileDescriptor",
                Variant::from(Fd::from(&write)),
            ),
            (
                "StandardErrorFileDescriptor",
                Variant::from(Fd::from(&write)),
            ),
            ("CollectMode", Variant::from("inactive-or-failed")),
            ("AddRef", Variant::from(true)),
            ("TimeoutStartUSec", Variant::from(timeout_usec)),
        ];
        if let Some(fd) = stdin {
            props.push(("StandardInputFileDescriptor", Variant::from(Fd::from(fd))));
        }
        let r = mgr.start_transient_unit(unit, "fail", &props, &[]).await;
        // systemd holds its own copy now; ours would keep the pipe open forever.
        drop(props);
        drop(write);
        r
    })
    .await
}

/// Let systemd collect the unit (`Unref`); after our own deadline, stop the command first.
async fn release_unit(sd: &Systemd, unit: &str, path: &OwnedObjectPath, timed_out: bool) {
    if timed_out {
        let stop_by = Instant::now() + GRACE;
        if let Err(e) = sd.unit_job_stop_quietly(unit, stop_by).await {
            tracing::warn!(%unit, "stopping transient unit after the deadline: {e:#}");
        }
    }
    if let Ok(u) = sd.unit_proxy(path).await {
        let what = format!("Unref({unit})");
        if let Err(e) = sd.call(&what, Instant::now() + GRACE, u.unref()).await {
            tracing::debug!(%unit, "Unref: {e:#}");
        }
    }
}

impl Systemd {
    /// Stop a unit and wait, without turning a non-`done` result into an error.
    async fn unit_job_stop_quietly(&self, unit: &str, deadline: Instant) -> Result<JobResult> {
        self.job("stop", unit, deadline, None, |mgr| async move {
            mgr.stop_unit(unit, "replace").await
        })
        .await
    }
}

fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}-{nanos:08x}.service", std::process::id())
}

/// The reader side of the output pipe: keeps the tail, never blocks the writer.
struct Capture {
    /// Closing it wakes the reader to finish: systemd may hold the output pipe's write end
    /// until it collects the unit, so the end of the output cannot be waited for.
    stop: OwnedFd,
    thread: JoinHandle<(Vec<u8>, u64)>,
}

impl Capture {
    fn start(read: OwnedFd) -> Result<Capture> {
        fcntl(&read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).context("output pipe O_NONBLOCK")?;
        let (stop_read, stop) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).context("creating the reader's stop pipe")?;
        let thread = std::thread::Builder::new()
            .name("unit-output".into())
            .spawn(move || read_tail(std::fs::File::from(read), &stop_read))
            .context("starting the output reader thread")?;
        Ok(Capture { stop, thread })
    }

    /// Drain what is left and return the kept text and the number of bytes dropped.
    fn finish(self) -> (String, u64) {
        drop(self.stop);
        match self.thread.join() {
            Ok((bytes, dropped)) => {
                let mut text = String::from_utf8_lossy(&bytes).into_owned();
                if dropped > 0 {
                    text.insert_str(
                        0,
                        &format!("[… {dropped} bytes of earlier output dropped …]\n"),
                    );
                }
                (text, dropped)
            }
            Err(_) => ("[output reader panicked]".into(), 0),
        }
    }
}

/// Read `pipe` until end of file, or until `stop` becomes readable (its write end closed) and
/// `pipe` is drained, so everything written before the stop is kept. Sleeps in `poll` on both,
/// so a stop is seen at once (a fixed sleep here cost every transient unit up to 10 ms).
fn read_tail(mut pipe: std::fs::File, stop: &OwnedFd) -> (Vec<u8>, u64) {
    let mut kept: Vec<u8> = Vec::new();
    let mut dropped = 0u64;
    let mut buf = [0u8; 8192];
    let mut stopping = false;
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > OUTPUT_LIMIT {
                    let excess = kept.len() - OUTPUT_LIMIT;
                    kept.drain(..excess);
                    dropped += excess as u64;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Checked only after an empty read, so everything written before `stop` is kept.
                if stopping {
                    break;
                }
                let mut fds = [
                    PollFd::new(pipe.as_fd(), PollFlags::POLLIN),
                    PollFd::new(stop.as_fd(), PollFlags::POLLIN),
                ];
                match poll(&mut fds, PollTimeout::NONE) {
                    // Read the pipe once more before leaving: data may have come with the stop.
                    Ok(_) => stopping = fds[1].revents().is_some_and(|r| !r.is_empty()),
                    Err(Errno::EINTR) => {}
                    Err(e) => {
                        kept.extend_from_slice(
                            format!("\n[waiting for output failed: {e}]").as_bytes(),
                        );
                        break;
                    }
                }
            }
            Err(e) => {
                kept.extend_from_slice(format!("\n[reading output failed: {e}]").as_bytes());
                break;
            }
        }
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn exit_statuses_read_like_systemctl() {
        assert_eq!(
            ExitStatus::from_exec_main(1, 3).to_string(),
            "exit status 3"
        );
        assert!(ExitStatus::from_exec_main(1, 0).success());
        assert_eq!(
            ExitStatus::from_exec_main(2, 9).to_string(),
            "killed by SIGKILL"
        );
        assert_eq!(
            ExitStatus::from_exec_main(3, 11).to_string(),
            "killed by SIGSEGV (core dumped)"
        );
        assert_eq!(ExitStatus::from_exec_main(0, 0), ExitStatus::NotRun);
    }

    #[test]
    fn capture_keeps_the_tail_and_counts_what_it_dropped() {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let cap = Capture::start(read).unwrap();
        let mut w = std::fs::File::from(write);
        let total = OUTPUT_LIMIT + 10_000;
        for i in 0..total {
            w.write_all(&[b'a' + (i % 26) as u8]).unwrap();
        }
        w.write_all(b"END").unwrap();
        // Keep the write end open: finish() must still return (systemd may hold it longer).
        std::thread::sleep(Duration::from_millis(50));
        let (text, dropped) = cap.finish();
        assert_eq!(dropped, 10_003);
        assert!(text.ends_with("END"), "{}", &text[text.len() - 20..]);
        assert!(text.starts_with("[… 10003 bytes"), "{}", &text[..40]);
        drop(w);
    }

    #[test]
    fn capture_finishes_at_once_and_keeps_what_came_just_before() {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let cap = Capture::start(read).unwrap();
        let mut w = std::fs::File::from(write);
        // Let the reader go to sleep on the empty pipe first.
        std::thread::sleep(Duration::from_millis(20));
        w.write_all(b"last words").unwrap();
        let started = Instant::now();
        // The write end stays open, as systemd's copy may.
        let (text, dropped) = cap.finish();
        assert_eq!((text.as_str(), dropped), ("last words", 0));
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(w);
    }

    #[test]
    fn outcome_check_names_unit_status_and_output() {
        let o = TransientOutcome {
            unit: "nspawn-lifecycle-ldconfig-1-0-0.service".into(),
            exit_status: ExitStatus::Exited(3),
            result: "exit-code".into(),
            output: "hi\n".into(),
            output_dropped: 0,
            elapsed: Duration::ZERO,
        };
        let msg = format!("{:#}", o.check("ldconfig in machine kube1").unwrap_err());
        assert!(
            msg.contains("nspawn-lifecycle-ldconfig-1-0-0.service"),
            "{msg}"
        );
        assert!(msg.contains("exit status 3"), "{msg}");
        assert!(msg.ends_with("output:\nhi"), "{msg}");
    }

    #[test]
    fn unit_names_are_unique_and_valid() {
        let a = unique_name("nspawn-lifecycle-ctr");
        let b = unique_name("nspawn-lifecycle-ctr");
        assert_ne!(a, b);
        assert!(a.ends_with(".service"));
        assert!(a.len() < 256);
    }
}
