//! [`nspawn_lifecycle::fs::fd_mount`] as the CDI hook uses it: a file of a tmpfs attached nowhere,
//! bound read-only onto a pinned target, with the kernel's own clone and with the
//! private-namespace hop of older kernels (which this kernel may never take, so it is called by
//! name). A test binary of its own without the libtest harness: `unshare`/`setns` of a mount
//! namespace need a single-threaded process. Privileged (mounts): CI runs as root.

#![allow(clippy::unwrap_used)] // a panic is the failure report

use nix::fcntl::OFlag;
use nix::sched::{CloneFlags, unshare};
use nix::sys::stat::Mode;
use nspawn_lifecycle::fs::fd_mount::{self, Tmpfs};
use std::path::Path;

fn mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn ns() -> std::path::PathBuf {
    std::fs::read_link("/proc/self/ns/mnt").unwrap()
}

fn check(name: &str, through_private_namespace: bool) {
    let dir = tempfile::tempdir().unwrap();
    let target_path = dir.path().join("params");
    std::fs::write(&target_path, "ModifyDeviceFiles: 1\n").unwrap();
    let target = nix::fcntl::open(
        &target_path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    let before = mounts();
    let ns_before = ns();

    let tmpfs = Tmpfs::new(c"64k").unwrap();
    tmpfs
        .create_file(c"params", b"ModifyDeviceFiles: 0\n", 0o444)
        .unwrap();
    tmpfs.seal().unwrap();
    let clone = if through_private_namespace {
        tmpfs.clone_through_private_namespace(c"params").unwrap()
    } else {
        tmpfs.clone_file(c"params").unwrap()
    };
    // Nothing is attached in our namespace before the one attach below.
    assert_eq!(
        mounts(),
        before,
        "{name}: a mount appeared before the attach"
    );
    assert_eq!(ns(), ns_before, "{name}: not back in our mount namespace");
    fd_mount::attach(&clone, &target).unwrap();
    // As the hook's exit does: the descriptors would keep the mount busy.
    drop((clone, tmpfs));

    assert_eq!(
        std::fs::read_to_string(&target_path).unwrap(),
        "ModifyDeviceFiles: 0\n",
        "{name}"
    );
    let err = std::fs::write(&target_path, "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{name}: {err}");
    let meta = std::fs::metadata(&target_path).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
        0o444,
        "{name}"
    );
    let after = mounts();
    let new: Vec<_> = after.iter().filter(|m| !before.contains(m)).collect();
    assert_eq!(
        new.len(),
        1,
        "{name}: exactly one new mount, the bind: {new:?}"
    );
    let line = new[0];
    assert!(
        line.contains(&format!(" {} ", target_path.display())),
        "{name}: {line}"
    );
    assert!(
        line.contains(" ro,") && line.contains("nosuid") && line.contains("nodev"),
        "{name}: {line}"
    );
    assert!(line.contains(" - tmpfs "), "{name}: {line}");

    nix::mount::umount(&target_path).unwrap();
    assert_eq!(
        std::fs::read_to_string(&target_path).unwrap(),
        "ModifyDeviceFiles: 1\n",
        "{name}"
    );
    assert_eq!(mounts(), before, "{name}: something stayed mounted");
}

fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "tests/fd_mount.rs needs root (mounts); CI runs as root"
    );
    // A namespace of the test's own, so nothing here reaches this machine's mounts.
    unshare(CloneFlags::CLONE_NEWNS).unwrap();
    nix::mount::mount(
        None::<&str>,
        Path::new("/"),
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .unwrap();
    for (name, hop) in [("clone", false), ("private namespace", true)] {
        check(name, hop);
        println!("test fd_mount {name} ... ok");
    }
}
