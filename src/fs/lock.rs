//! One lock per machine: an `flock` on `/run/nspawn-lifecycle/locks/<machine>.lock`.
//!
//! Same-machine callers serialize; different machines never block each other. The lock file is a
//! stable inode (created once, never removed or replaced); the holder writes its PID into it so a
//! waiter can name who holds it, and blanks it again on release. The PID is written in place at a
//! fixed width (no truncation), so a reader sees either blanks or a whole PID. A waiter gives up at
//! its deadline or on SIGTERM/SIGINT, with exit code 4.
//!
//! No other local user can take or block the lock, nor make root write through it: the lock
//! directory is root's own (mode 0700, verified component by component and held as a descriptor,
//! see [`crate::fs::host_dir`]), so nobody else can open a lock file, even read-only for a shared
//! `flock`, or plant anything in it. The lock file is opened relative to that descriptor without
//! following a symlink, and must be a regular file of ours, mode 0600 or narrower, with one link.
//! Anything else is refused (exit 1) naming the path, before a byte is written. Not under the
//! world-writable `/run/lock`: any user could hold a shared lock there and stop every start, or
//! pre-create the directory and a symlink in it.

use crate::error::{Kind, classified};
use crate::failpoint::{self, Point};
use crate::fs::host::HostRoot;
use crate::types::machine_name::MachineName;
use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::{Mode, SFlag};
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Directory of the lock files (under the host root): root's own, mode [`LOCK_DIR_MODE`]. Its
/// parent holds the unit gate's drop-in too (`crate::model::gate::HOST_FILE`).
pub const LOCK_DIR: &str = "/run/nspawn-lifecycle/locks";

/// Nobody but the helper's user may look into the lock directory.
pub const LOCK_DIR_MODE: u32 = 0o700;

/// Mode a lock file is created with: the owner's alone.
pub const LOCK_FILE_MODE: u32 = 0o600;

/// Width of the PID record: `u32::MAX` has 10 digits, plus a newline.
const PID_RECORD: usize = 11;

/// How long a waiter holds back its "waiting" line hoping to name the holder: the holder writes
/// its PID microseconds after taking the lock, so only a holder that died mid-way stays unnamed.
const NAME_HOLDER_GRACE: Duration = Duration::from_secs(1);

/// Held while alive; dropping it blanks the PID record and releases the lock.
#[derive(Debug)]
pub struct MachineLock {
    lock: Flock<std::fs::File>,
}

impl Drop for MachineLock {
    fn drop(&mut self) {
        // Best effort: a stale PID left by a crash is overwritten by the next holder.
        let _ = self.lock.write_at(&[b' '; PID_RECORD], 0);
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
    take(host, Some(machine), &format!("{machine}.lock"), timeout)
}

/// The lock file of host mode, in the same directory as the machines' locks. No
/// `.lock` suffix, so no machine name can ever be it: host mode and every machine's hooks hold
/// locks of their own and never wait for each other.
pub const HOST_LOCK_NAME: &str = "host";

/// Take host mode's lock ([`HOST_LOCK_NAME`]), waiting at most `timeout`.
pub fn lock_host(host: &HostRoot, timeout: Duration) -> Result<MachineLock> {
    take(host, None, HOST_LOCK_NAME, timeout)
}

/// Take the lock file `name` of [`LOCK_DIR`], `machine`'s or (`None`) host mode's, which starts
/// every message (`machine kube1: …`, `host mode: …`).
fn take(
    host: &HostRoot,
    machine: Option<&MachineName>,
    name: &str,
    timeout: Duration,
) -> Result<MachineLock> {
    let who = match machine {
        Some(m) => format!("machine {m}"),
        None => "host mode".to_owned(),
    };
    let dir = crate::fs::host_dir::open(host, LOCK_DIR, LOCK_DIR_MODE)
        .with_context(|| format!("{who}: lock directory"))?;
    let path = dir.path().join(name);
    let file =
        open_lock_file(dir.fd(), name, &path).with_context(|| format!("{who}: lock file"))?;
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
                    "{who}: interrupted while waiting for lock {} (held by {})",
                    path.display(),
                    Holder(holder)
                ),
            ));
        }
        if start.elapsed() >= timeout {
            return Err(classified(
                Kind::Lock,
                format!(
                    "{who}: lock {} still held by {} after {}s",
                    path.display(),
                    Holder(holder),
                    timeout.as_secs_f32()
                ),
            ));
        }
        if !logged && (holder.is_some() || start.elapsed() >= NAME_HOLDER_GRACE) {
            let holder = Holder(holder);
            match machine {
                Some(machine) => {
                    tracing::info!(%machine, lock = %path.display(), %holder, "waiting for the machine lock")
                }
                None => {
                    tracing::info!(lock = %path.display(), %holder, "waiting for the host mode lock")
                }
            }
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
    Ok(MachineLock { lock })
}

/// Open (creating it 0600 when missing) the lock file `name` in the lock directory `dir` without
/// following a symlink, and check it is a lock file of ours; `path` only names it in messages.
fn open_lock_file(dir: &std::os::fd::OwnedFd, name: &str, path: &Path) -> Result<std::fs::File> {
    // O_NONBLOCK|O_NOCTTY: a FIFO or device planted here is refused below, never waited on.
    let flags = OFlag::O_RDWR
        | OFlag::O_CREAT
        | OFlag::O_NOFOLLOW
        | OFlag::O_CLOEXEC
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY;
    let fd = match nix::fcntl::openat(dir, name, flags, Mode::from_bits_truncate(LOCK_FILE_MODE)) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => bail!(
            "{} is a symbolic link, not a lock file: refusing to follow it; remove it and the \
             helper creates the lock file again",
            path.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    let st = nix::sys::stat::fstat(&fd).with_context(|| format!("stat {}", path.display()))?;
    let euid = nix::unistd::geteuid().as_raw();
    let regular = st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFREG.bits();
    let problem = if !regular {
        Some(format!("is {}", crate::fs::host_dir::kind(&st)))
    } else if st.st_uid != euid {
        Some(format!("is owned by uid {}, not {euid}", st.st_uid))
    } else if st.st_nlink != 1 {
        Some(format!("has {} hard links", st.st_nlink))
    } else if st.st_mode & 0o777 & !LOCK_FILE_MODE != 0 {
        Some(format!("has mode {:o}", st.st_mode & 0o777))
    } else {
        None
    };
    if let Some(problem) = problem {
        bail!(
            "{} {problem}: a lock file must be a regular file of ours, mode {LOCK_FILE_MODE:o} \
             with one link; refusing to use it; remove it and the helper creates it again",
            path.display()
        );
    }
    Ok(std::fs::File::from(fd))
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

    /// Host mode's lock is its own file, which no machine's lock can be (not even a
    /// machine named `host`), and a second host mode waits for the first.
    #[test]
    fn host_mode_has_a_lock_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let held = lock_host(&host, Duration::from_secs(1)).unwrap();
        let locks = dir.path().join("run/nspawn-lifecycle/locks");
        assert!(locks.join("host").is_file());
        let _m = lock(&host, &"host".parse().unwrap(), Duration::from_millis(50)).unwrap();
        assert!(
            locks.join("host.lock").is_file(),
            "a machine named host has its own file"
        );
        let err = lock_host(&host, Duration::from_millis(120)).unwrap_err();
        assert_eq!(exit_code(&err), 4);
        let msg = format!("{err:#}");
        assert!(msg.starts_with("host mode: lock "), "{msg}");
        drop(held);
        lock_host(&host, Duration::from_millis(50)).unwrap();
    }

    #[test]
    fn same_machine_waits_then_times_out_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let m: MachineName = "kube1".parse().unwrap();
        let held = lock(&host, &m, Duration::from_secs(1)).unwrap();
        let path = dir.path().join("run/nspawn-lifecycle/locks/kube1.lock");
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
        let _again = lock(&host, &m, Duration::from_millis(50)).unwrap();
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(
            std::fs::metadata(&path).unwrap().ino(),
            ino.ino(),
            "lock inode must be stable"
        );
    }

    #[test]
    fn the_lock_directory_and_file_are_ours_alone() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let _held = lock(&host, &"kube1".parse().unwrap(), Duration::from_secs(1)).unwrap();
        let path = dir.path().join("run/nspawn-lifecycle/locks/kube1.lock");
        let euid = nix::unistd::geteuid().as_raw();
        let d = std::fs::symlink_metadata(path.parent().unwrap()).unwrap();
        assert!(d.is_dir());
        assert_eq!((d.mode() & 0o7777, d.uid()), (0o700, euid));
        let f = std::fs::symlink_metadata(&path).unwrap();
        assert!(f.is_file());
        assert_eq!((f.mode() & 0o7777, f.uid(), f.nlink()), (0o600, euid, 1));
    }

    /// Take kube1's lock on a host whose lock file `plant` replaced; the error text.
    fn refused_after(plant: impl FnOnce(&Path)) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let m: MachineName = "kube1".parse().unwrap();
        drop(lock(&host, &m, Duration::from_secs(1)).unwrap());
        let path = dir.path().join("run/nspawn-lifecycle/locks/kube1.lock");
        std::fs::remove_file(&path).unwrap();
        plant(&path);
        let err = lock(&host, &m, Duration::from_millis(50)).unwrap_err();
        assert_eq!(exit_code(&err), 1, "{err:#}");
        let msg = format!("{err:#}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        (dir, msg)
    }

    #[test]
    fn a_symlink_planted_as_the_lock_file_is_refused_and_its_target_untouched() {
        let target = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(target.path(), b"known bytes, not a PID\n").unwrap();
        let (_dir, msg) = refused_after(|p| std::os::unix::fs::symlink(target.path(), p).unwrap());
        assert!(msg.contains("is a symbolic link"), "{msg}");
        assert_eq!(
            std::fs::read(target.path()).unwrap(),
            b"known bytes, not a PID\n"
        );
    }

    #[test]
    fn a_lock_file_of_the_wrong_kind_mode_or_link_count_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let (_d, msg) =
            refused_after(|p| nix::unistd::mkfifo(p, Mode::from_bits_truncate(0o600)).unwrap());
        assert!(msg.contains("is a FIFO"), "{msg}");
        let (_d, msg) = refused_after(|p| std::fs::create_dir(p).unwrap());
        // O_RDWR on a directory fails with EISDIR, named with the path.
        assert!(msg.contains("Is a directory"), "{msg}");
        let (_d, msg) = refused_after(|p| {
            std::fs::write(p, "").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
        });
        assert!(msg.contains("has mode 644"), "{msg}");
        let other = tempfile::tempdir().unwrap();
        let (_d, msg) = refused_after(|p| {
            std::fs::write(p, "").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::fs::hard_link(p, other.path().join("second-name")).unwrap_or_else(|_| {
                // Another filesystem: a second name beside it does the same.
                std::fs::hard_link(p, p.with_extension("second")).unwrap()
            });
        });
        assert!(msg.contains("has 2 hard links"), "{msg}");
    }

    #[test]
    fn privileged_a_lock_directory_another_user_made_is_refused_and_left_alone() {
        use std::os::unix::fs::MetadataExt as _;
        assert!(
            nix::unistd::geteuid().is_root(),
            "privileged: chowns to uid 65534 and must run as root"
        );
        let nobody = Some(nix::unistd::Uid::from_raw(65534));
        for dir_rel in ["run/nspawn-lifecycle", "run/nspawn-lifecycle/locks"] {
            let dir = tempfile::tempdir().unwrap();
            let theirs = dir.path().join(dir_rel);
            std::fs::create_dir_all(&theirs).unwrap();
            nix::unistd::chown(&theirs, nobody, None).unwrap();
            let host = HostRoot::new(dir.path());
            let err =
                lock(&host, &"kube1".parse().unwrap(), Duration::from_millis(50)).unwrap_err();
            let msg = format!("{err:#}");
            assert_eq!(exit_code(&err), 1, "{msg}");
            assert!(
                msg.contains(&format!("{} is owned by uid 65534", theirs.display())),
                "{msg}"
            );
            assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0, "{dir_rel}");
            assert_eq!(
                std::fs::metadata(&theirs).unwrap().uid(),
                65534,
                "not repaired"
            );
        }
    }
}
