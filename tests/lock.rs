//! The machine lock against another local user, driving the binary as systemd would (as root).
//!
//! Each test first lets pre-start take the lock once and finds the lock file where the helper put
//! it (any `<machine>.lock` under the host's `run/`), so the attack aims at wherever the lock
//! really lives, not at a path this file assumes:
//! - another user (uid 65534) holding a shared `flock` on it must neither take nor block it;
//! - a symlink planted where the lock file goes is refused naming the path, its target untouched;
//! - the lock directory or its parent, made by another user or replaced by a symlink, is refused
//!   naming the path, with nothing created inside and no `.nspawn` written.
//!
//! The host root is mode 0755 like `/`, so the other user can reach whatever the helper leaves
//! reachable. Privileged: runs as root (CI does) and fails, not skips, otherwise.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_nspawn-lifecycle-helper");
const NSPAWN: &str = "etc/systemd/nspawn/kube1.nspawn";
const NOBODY: u32 = 65534;

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "privileged tests act as uid {NOBODY} against root's lock and must run as root"
    );
}

/// An empty host (verdict none) with machine kube1, reachable by other users like `/`, with a
/// 1 s lock deadline; pre-start has run once. Returns it and the lock file pre-start used.
fn host() -> (tempfile::TempDir, PathBuf) {
    require_root();
    let t = tempfile::Builder::new()
        .prefix("lock-host.")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(t.path().join("var/lib/machines/kube1")).unwrap();
    let cfg = t.path().join("etc/nspawn-lifecycle");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(
        cfg.join("config.json"),
        "{\"defaults\": {\"lockTimeoutSeconds\": 1}}\n",
    )
    .unwrap();
    let out = pre_start(t.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lock = find_lock(&t.path().join("run"), "kube1.lock").unwrap_or_else(|| {
        panic!(
            "pre-start left no kube1.lock under {}/run",
            t.path().display()
        )
    });
    (t, lock)
}

fn find_lock(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()? {
        let e = e.unwrap();
        let p = e.path();
        if e.file_name() == name {
            return Some(p);
        }
        if e.file_type().unwrap().is_dir()
            && let Some(found) = find_lock(&p, name)
        {
            return Some(found);
        }
    }
    None
}

fn pre_start(root: &Path) -> Output {
    Command::new(BIN)
        .arg("--host-root")
        .arg(root)
        .args(["nspawn-lifecycle", "pre-start", "kube1"])
        .env_remove("NSPAWN_LIFECYCLE_LOG")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Run pre-start on a host where something was planted; it must fail with exit 1 naming
/// `culprit`, and write no `.nspawn` file.
fn assert_refused(root: &Path, culprit: &Path, what: &str) {
    let nspawn = root.join(NSPAWN);
    std::fs::remove_file(&nspawn).unwrap();
    let out = pre_start(root);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    assert!(
        err.contains(&culprit.display().to_string()),
        "{what}: the message does not name {}: {err}",
        culprit.display()
    );
    assert!(
        !nspawn.exists(),
        "{what}: pre-start went on and wrote {NSPAWN}"
    );
}

#[test]
fn privileged_another_users_shared_lock_neither_takes_nor_blocks_it() {
    let (h, lock) = host();
    // The attacker: `flock -s` opens the file read-only, which is all a shared flock needs; it
    // then holds it for a minute. It must not even open the file.
    let attacker = Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "flock",
            "-s",
        ])
        .arg(&lock)
        .args(["sh", "-c", "echo HELD; exec sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its first line, or the end of its output when it failed: no clock, the attempt is over.
    let mut attacker = attacker;
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(attacker.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let holding = first.trim() == "HELD";
    let out = pre_start(h.path());
    if holding {
        attacker.kill().unwrap();
    }
    let attacker_out = attacker.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "uid {NOBODY} held {} (attacker still running: {holding}): {}",
        lock.display(),
        stderr(&out)
    );
    assert!(
        !stderr(&out).contains("waiting for the machine lock"),
        "pre-start waited for the lock: {}",
        stderr(&out)
    );
    assert!(
        !holding,
        "uid {NOBODY} could take a shared lock on {}",
        lock.display()
    );
    let why = String::from_utf8_lossy(&attacker_out.stderr);
    assert!(
        why.contains("Permission denied"),
        "the attacker failed otherwise: {why}"
    );
}

#[test]
fn privileged_a_symlink_where_the_lock_file_goes_is_refused_and_its_target_kept() {
    let (h, lock) = host();
    // A root-owned file outside the host root, as /etc/shadow would be.
    let victim_dir = tempfile::tempdir().unwrap();
    let victim = victim_dir.path().join("shadow");
    std::fs::write(&victim, "root:known-bytes:20000::::::\n").unwrap();
    let before = std::fs::metadata(&victim).unwrap();
    std::fs::remove_file(&lock).unwrap();
    std::os::unix::fs::symlink(&victim, &lock).unwrap();
    assert_refused(h.path(), &lock, "symlink as the lock file");
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "root:known-bytes:20000::::::\n"
    );
    let after = std::fs::metadata(&victim).unwrap();
    assert_eq!(
        (before.mtime(), before.mtime_nsec()),
        (after.mtime(), after.mtime_nsec())
    );
    assert!(
        std::fs::symlink_metadata(&lock).unwrap().is_symlink(),
        "left as it was"
    );
}

#[test]
fn privileged_a_lock_directory_or_parent_another_user_made_is_refused() {
    let (_h, lock) = host();
    let dir = lock.parent().unwrap().to_owned();
    let parent = dir.parent().unwrap().to_owned();
    for culprit in [dir, parent] {
        let (h, lock) = host();
        let culprit = h.path().join(culprit.strip_prefix(_h.path()).unwrap());
        // Another user made it first (mode 0755: the most a careful user would leave).
        std::fs::remove_dir_all(&culprit).unwrap();
        std::fs::create_dir(&culprit).unwrap();
        nix::unistd::chown(&culprit, Some(nix::unistd::Uid::from_raw(NOBODY)), None).unwrap();
        assert_refused(h.path(), &culprit, "a directory made by another user");
        assert_eq!(
            std::fs::read_dir(&culprit).unwrap().count(),
            0,
            "{} created inside {}",
            lock.display(),
            culprit.display()
        );
        assert_eq!(
            std::fs::metadata(&culprit).unwrap().uid(),
            NOBODY,
            "not repaired"
        );
    }
}

#[test]
fn privileged_a_symlinked_lock_directory_or_parent_is_refused() {
    let (_h, lock) = host();
    let dir = lock.parent().unwrap().to_owned();
    let parent = dir.parent().unwrap().to_owned();
    for culprit in [dir, parent] {
        let (h, _) = host();
        let culprit = h.path().join(culprit.strip_prefix(_h.path()).unwrap());
        // A root-owned, private directory elsewhere: following the link would be "safe" by
        // owner and mode, so only refusing the link itself passes.
        let target = tempfile::tempdir().unwrap();
        std::fs::remove_dir_all(&culprit).unwrap();
        std::os::unix::fs::symlink(target.path(), &culprit).unwrap();
        assert_refused(h.path(), &culprit, "a symlinked directory");
        assert_eq!(
            std::fs::read_dir(target.path()).unwrap().count(),
            0,
            "created through the symlink {}",
            culprit.display()
        );
    }
}

/// A command that needs root, run by another user, says so, and writes nothing; it is not told
/// that another user made root's directories.
#[test]
fn privileged_a_non_root_caller_is_told_the_command_needs_root() {
    let (h, _lock) = host();
    let nspawn = h.path().join("etc/systemd/nspawn/kube1.nspawn");
    let before = std::fs::read(&nspawn).unwrap();
    // A copy that user can reach (the build directory may be under root's 0700 home).
    let bin = h.path().join("helper-copy");
    std::fs::copy(BIN, &bin).unwrap();
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
        ])
        .arg(&bin)
        .arg("--host-root")
        .arg(h.path())
        .args(["nspawn-lifecycle", "pre-start", "kube1"])
        .env_remove("NSPAWN_LIFECYCLE_LOG")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("this command needs root"), "{err}");
    assert!(!err.contains("another user"), "{err}");
    assert_eq!(std::fs::read(&nspawn).unwrap(), before);
}
