//! Directories of our own on the host (`/run/nspawn-lifecycle`, its `locks/`), created or verified
//! component by component and held open as a descriptor.
//!
//! The host tree is trusted, but a directory the helper shares with other users is not: under a
//! world-writable one (`/run/lock`, `/tmp`) another user can create our directory first, or a
//! symlink in its place, and root would then lock, create or write through it. So every component
//! is opened with `O_DIRECTORY | O_NOFOLLOW` relative to its parent's descriptor, created with
//! `mkdirat` when missing, and must then be a directory owned by the helper's effective uid that
//! nobody else can write to. One that is not is refused with a message naming it; it is never
//! "repaired" (a directory another user owns is theirs), and nothing is created inside it.
//! Refusals are exit 1: the message names the path, and the fix is an operator's (remove it), not
//! a retry (exit 4) or a different command line (exit 2).

use crate::fs::host::HostRoot;
use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Mode of a directory the helper creates on the way to the one it wants (`/run` under a bare
/// `--host-root`, `/run/nspawn-lifecycle`): readable by all (nspawn reads the unit gate there as
/// root anyway), writable by its owner only.
pub const PARENT_MODE: u32 = 0o755;

/// A directory of ours under the host root, open as a descriptor.
#[derive(Debug)]
pub struct HostDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl HostDir {
    /// The directory's descriptor: open files in it with `openat`, never by path.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Where it is, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Open (creating what is missing) the directory `abs` under `host`, and verify every component
/// below the host root: not a symlink, a directory, owned by our effective uid, not writable by
/// group or others. The last component is created with `mode` and may carry no permission bit
/// beyond it (`0o700`: nobody else may even look inside); the ones before it are created with
/// [`PARENT_MODE`].
pub fn open(host: &HostRoot, abs: &str, mode: u32) -> Result<HostDir> {
    walk(host, abs, mode, true)?
        .with_context(|| format!("internal error: {abs} was created, then not found"))
}

/// [`open`] without creating anything: the directory `abs`, verified the same way, or `None`
/// when it (or a component) does not exist. Reads only: what observes a part of ours on the
/// host before anything is written.
pub fn check(host: &HostRoot, abs: &str, mode: u32) -> Result<Option<HostDir>> {
    walk(host, abs, mode, false)
}

fn walk(host: &HostRoot, abs: &str, mode: u32, create: bool) -> Result<Option<HostDir>> {
    let names: Vec<&str> = abs.split('/').filter(|c| !c.is_empty()).collect();
    if !abs.starts_with('/') || names.is_empty() || names.iter().any(|c| *c == "." || *c == "..") {
        bail!("internal error: {abs:?} is not a plain absolute directory path");
    }
    let mut fd = nix::fcntl::openat(
        host.fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("opening the host root {}", host.root().display()))?;
    let mut path = host.root().to_path_buf();
    for (i, name) in names.iter().enumerate() {
        path.push(name);
        let last = i + 1 == names.len();
        let want = if last { mode } else { PARENT_MODE };
        fd = match open_component(&fd, name, &path, want, last, create)? {
            Some(fd) => fd,
            None => return Ok(None),
        };
    }
    Ok(Some(HostDir { fd, path }))
}

/// Open (with `create`, or create) `name` in `parent` and check it; `None` when it is missing
/// and not to be created; `path` only names it in messages.
fn open_component(
    parent: &OwnedFd,
    name: &str,
    path: &Path,
    mode: u32,
    last: bool,
    create: bool,
) -> Result<Option<OwnedFd>> {
    let mut created = false;
    let fd = loop {
        match nix::fcntl::openat(parent, name, dir_flags(), Mode::empty()) {
            Ok(fd) => break fd,
            Err(Errno::ENOENT) if !create => return Ok(None),
            Err(Errno::ENOENT) if !created => {
                match nix::sys::stat::mkdirat(parent, name, Mode::from_bits_truncate(mode)) {
                    // Someone created it in between: open and check what is there.
                    Ok(()) | Err(Errno::EEXIST) => created = true,
                    Err(e) => {
                        return Err(e).with_context(|| format!("creating {}", path.display()));
                    }
                }
            }
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                bail!(
                    "{} is {}, not a directory of ours: refusing to use it; remove it and the \
                     helper creates it again",
                    path.display(),
                    describe(parent, name)
                );
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        }
    };
    let st = nix::sys::stat::fstat(&fd).with_context(|| format!("stat {}", path.display()))?;
    let euid = nix::unistd::geteuid().as_raw();
    if st.st_uid == 0 && euid != 0 {
        // Not another user's doing: the caller is not root, and the directory is root's own.
        return Err(crate::error::bad_input(format!(
            "this command needs root: it writes {} and the host's files as root (run it as root, e.g. with sudo)",
            path.display()
        )));
    }
    if st.st_uid != euid {
        bail!(
            "{} is owned by uid {}, not by uid {euid} that runs the helper: another user made \
             it; refusing to use it or create anything in it; remove it and the helper creates \
             it again",
            path.display(),
            st.st_uid
        );
    }
    if created && st.st_mode & 0o7777 != mode {
        // Ours, just made: the umask does not decide the mode.
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode))
            .with_context(|| format!("chmod {:o} {}", mode, path.display()))?;
        return Ok(Some(fd));
    }
    let perms = st.st_mode & 0o777;
    let extra = if last { perms & !mode } else { perms & 0o022 };
    if extra != 0 {
        bail!(
            "{} has mode {:o}: {}; refusing to use it; remove it (or chmod {:o} it) and run \
             again",
            path.display(),
            perms,
            if last {
                format!("it must not grant more than {mode:o}")
            } else {
                "others than its owner can write to it".to_owned()
            },
            mode
        );
    }
    Ok(Some(fd))
}

/// "a symbolic link", "a regular file", … for what is at `name` in `parent` (not followed).
fn describe(parent: &OwnedFd, name: &str) -> &'static str {
    match nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => kind(&st),
        Err(_) => "not a directory",
    }
}

/// What a stat says the file is, as words for a message.
pub fn kind(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFLNK => "a symbolic link",
        SFlag::S_IFREG => "a regular file",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFSOCK => "a socket",
        _ => "of an unknown type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    fn mode_of(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn creates_the_chain_with_exact_modes_and_reopens_it() {
        let t = tempfile::tempdir().unwrap();
        let host = HostRoot::new(t.path());
        let d = open(&host, "/run/nspawn-lifecycle/locks", 0o700).unwrap();
        assert_eq!(d.path(), t.path().join("run/nspawn-lifecycle/locks"));
        assert_eq!(mode_of(&t.path().join("run")), 0o755);
        assert_eq!(mode_of(&t.path().join("run/nspawn-lifecycle")), 0o755);
        assert_eq!(mode_of(&t.path().join("run/nspawn-lifecycle/locks")), 0o700);
        let st = nix::sys::stat::fstat(d.fd()).unwrap();
        assert_eq!(
            st.st_ino,
            std::fs::metadata(d.path()).unwrap().ino(),
            "the descriptor is the directory"
        );
        open(&host, "/run/nspawn-lifecycle/locks", 0o700).unwrap();
    }

    #[test]
    fn a_symlink_or_a_file_in_the_chain_is_refused_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir_all(t.path().join("host/run")).unwrap();
        let host = HostRoot::new(t.path().join("host"));
        std::os::unix::fs::symlink(&elsewhere, t.path().join("host/run/nspawn-lifecycle")).unwrap();
        let err = format!(
            "{:#}",
            open(&host, "/run/nspawn-lifecycle/locks", 0o700).unwrap_err()
        );
        assert!(
            err.contains(&format!(
                "{}/host/run/nspawn-lifecycle is a symbolic link",
                t.path().display()
            )),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);

        std::fs::remove_file(t.path().join("host/run/nspawn-lifecycle")).unwrap();
        std::fs::write(t.path().join("host/run/nspawn-lifecycle"), "x").unwrap();
        let err = format!(
            "{:#}",
            open(&host, "/run/nspawn-lifecycle/locks", 0o700).unwrap_err()
        );
        assert!(err.contains("nspawn-lifecycle is a regular file"), "{err}");
    }

    #[test]
    fn a_directory_others_can_write_or_read_is_refused_not_repaired() {
        let t = tempfile::tempdir().unwrap();
        let host = HostRoot::new(t.path());
        let parent = t.path().join("run/nspawn-lifecycle");
        std::fs::create_dir_all(&parent).unwrap();
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = format!(
            "{:#}",
            open(&host, "/run/nspawn-lifecycle/locks", 0o700).unwrap_err()
        );
        assert!(
            err.contains(&format!("{} has mode 777", parent.display())),
            "{err}"
        );
        assert!(
            !parent.join("locks").exists(),
            "created inside a refused dir"
        );
        assert_eq!(
            mode_of(&parent),
            0o1777,
            "a refused directory is left as it was"
        );

        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(parent.join("locks")).unwrap();
        std::fs::set_permissions(parent.join("locks"), std::fs::Permissions::from_mode(0o750))
            .unwrap();
        let err = format!(
            "{:#}",
            open(&host, "/run/nspawn-lifecycle/locks", 0o700).unwrap_err()
        );
        assert!(err.contains("locks has mode 750"), "{err}");
        assert!(err.contains("must not grant more than 700"), "{err}");
    }
}
