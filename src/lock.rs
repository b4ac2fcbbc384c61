//! One lock per machine: an `flock` on `/run/lock/nspawn-lifecycle/<machine>.lock`.
//!
//! Same-machine callers serialize; different machines never block each other. The lock file is a
//! stable inode (created once, never removed or replaced); the holder writes its PID into it so a
//! waiter can name who holds it, and blanks it again on release. The PID is written in place at a
//! fixed width (no truncation), so a reader sees either blanks or a whole PID. A waiter gives up at
//! its deadline or on SIGTERM/SIGINT, with exit code 4.

use crate::error::{Kind, classified};
use crate::failpoint::{self, Point};
use crate::host::HostRoot;
use crate::machine_name::MachineName;
use anyhow::{Context as _, Result};
use nix::fcntl::{Flock, FlockArg};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Directory of the lock files (under the host root).
pub const LOCK_DIR: &str = "/run/lock/nspawn-lifecycle";

/// Width of the PID record: `u32::MAX` has 10 digits, plus a newline.
const PID_RECORD: usize = 11;

/// How long a waiter holds back its "waiting" line hoping to name the holder: the holder writes
/// its PID microseconds after taking the lock, so only a holder that died mid-way stays unnamed.
const NAME_HOLDER_GRACE: Duration = Duration::from_secs(1);

/// Held while alive; dropping it blanks the PID record and releases the lock.
#[derive(Debug)]
pub struct MachineLock {
    lock: Flock<std::fs::File>,
    path: PathBuf,
}

impl Drop for MachineLock {
    fn drop(&mut self) {
        // Best effort: a stale PID left by a crash is overwritten by the next holder.
        let _ = self.lock.write_at(&[b' '; PID_RECORD], 0);
    }
}

impl MachineLock {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

static CANCELLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    CANCELLED.store(true, Ordering::SeqCst);
}

/// Restores default SIGTERM/SIGINT handling when dropped.
struct CancelOnSignal;

impl CancelOnSignal {
    #[allow(unsafe_code)]
    fn install() -> Result<Self> {
        use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
        CANCELLED.store(false, Ordering::SeqCst);
        let act = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::empty(),
            SigSet::empty(),
        );
        for sig in [Signal::SIGTERM, Signal::SIGINT] {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
            unsafe { sigaction(sig, &act) }.with_context(|| format!("installing {sig} handler"))?;
        }
        Ok(CancelOnSignal)
    }
}

impl Drop for CancelOnSignal {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
        let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
        for sig in [Signal::SIGTERM, Signal::SIGINT] {
            // SAFETY: restoring the default disposition has no preconditions.
            let _ = unsafe { sigaction(sig, &dfl) };
        }
    }
}

/// Take `machine`'s lock, waiting at most `timeout`.
pub fn lock(host: &HostRoot, machine: &MachineName, timeout: Duration) -> Result<MachineLock> {
    let dir = host.path(LOCK_DIR);
    fs_err::create_dir_all(&dir)?;
    let path = dir.join(format!("{machine}.lock"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(&path)
        .with_context(|| format!("opening lock file {}", path.display()))?;
    let _signals = CancelOnSignal::install()?;
    let start = Instant::now();
    let mut file = file;
    let mut pause = Duration::from_millis(5);
    let mut logged = false;
    let lock = loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => break l,
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => file = f,
            Err((_, e)) => {
                return Err(e).with_context(|| format!("flock {}", path.display()));
            }
        }
        let holder = holder_pid(&file);
        if CANCELLED.load(Ordering::SeqCst) {
            return Err(classified(
                Kind::Lock,
                format!(
                    "machine {machine}: interrupted while waiting for lock {} (held by {})",
                    path.display(),
                    Holder(holder)
                ),
            ));
        }
        if start.elapsed() >= timeout {
            return Err(classified(
                Kind::Lock,
                format!(
                    "machine {machine}: lock {} still held by {} after {}s",
                    path.display(),
                    Holder(holder),
                    timeout.as_secs_f32()
                ),
            ));
        }
        if !logged && (holder.is_some() || start.elapsed() >= NAME_HOLDER_GRACE) {
            let holder = Holder(holder);
            tracing::info!(%machine, lock = %path.display(), %holder, "waiting for the machine lock");
            logged = true;
        }
        std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
        pause = (pause * 2).min(Duration::from_millis(100));
    };
    // Record the holder for waiters, in place: the inode is never replaced and the record never
    // passes through an empty or partial state a waiter could read.
    let record = format!("{:<width$}\n", std::process::id(), width = PID_RECORD - 1);
    lock.write_all_at(record.as_bytes(), 0)
        .with_context(|| format!("recording PID in {}", path.display()))?;
    failpoint::hit(Point::AfterLock);
    Ok(MachineLock { lock, path })
}

/// The PID recorded in the lock file, if there is one.
fn holder_pid(file: &std::fs::File) -> Option<u32> {
    let mut buf = [0u8; PID_RECORD];
    let n = file.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

/// How a waiter names the holder.
struct Holder(Option<u32>);

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(pid) => write!(f, "PID {pid}"),
            None => f.write_str("an unknown process"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::exit_code;

    #[test]
    fn same_machine_waits_then_times_out_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let m: MachineName = "kube1".parse().unwrap();
        let held = lock(&host, &m, Duration::from_secs(1)).unwrap();
        let path = held.path().to_owned();
        let ino = std::fs::metadata(&path).unwrap();
        // flock locks belong to the open file description, so a second open in this process
        // contends like another process would.
        let err = lock(&host, &m, Duration::from_millis(120)).unwrap_err();
        assert_eq!(exit_code(&err), 4);
        let msg = format!("{err:#}");
        assert!(
            msg.contains(&format!("PID {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("kube1"), "{msg}");
        // Another machine is not blocked.
        let other = lock(&host, &"kube2".parse().unwrap(), Duration::from_millis(50)).unwrap();
        drop(other);
        drop(held);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            [b' '; PID_RECORD],
            "a released lock names no holder"
        );
        let again = lock(&host, &m, Duration::from_millis(50)).unwrap();
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(
            std::fs::metadata(again.path()).unwrap().ino(),
            ino.ino(),
            "lock inode must be stable"
        );
    }
}
