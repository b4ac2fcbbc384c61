//! The one atomic writer, for host files and (through [`replace_at`]) the machine's: temp file in
//! the same directory, mode, fsync, rename, fsync the directory; nothing happens when the bytes
//! are already there. How the temp file is named differs: here on the host, a random name held by
//! an `flock` (below); in the machine, a fixed name the machine lock makes exclusive (see
//! `machine_root`). What is done to it once it exists is [`replace_at`], for both.
//!
//! A writer killed between creating its temp file and the rename leaves that temp file behind.
//! Each writer holds an `flock` on its temp file for as long as it lives, so the next write of the
//! same file removes every temp file nobody holds: a dead writer's, never a live one's (two
//! installs for different machines may copy the shared helper at the same time).

use crate::failpoint::{self, Point};
use anyhow::{Context as _, Result};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;
use std::hash::{BuildHasher as _, Hasher as _};
use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// Replace `name` in the directory `dir` with `contents` atomically unless it already holds
/// exactly those bytes and `mode`. `shown` is the directory's host path, for messages; `point`
/// names the moment between the temp file's fsync and the rename for crash tests. Returns
/// whether the file was written. (Host files: [`crate::fs::host::HostRoot::write_if_changed`].)
pub fn write_if_changed(
    dir: &OwnedFd,
    shown: &Path,
    name: &str,
    contents: &[u8],
    mode: u32,
    point: Point,
) -> Result<bool> {
    write_if_changed_at(dir, shown, name, contents, mode, Some(point))
}

/// [`write_if_changed`] where no crash test names the moment (a file nothing else depends on,
/// such as the metrics textfile).
pub fn write_if_changed_unnamed(
    dir: &OwnedFd,
    shown: &Path,
    name: &str,
    contents: &[u8],
    mode: u32,
) -> Result<bool> {
    write_if_changed_at(dir, shown, name, contents, mode, None)
}

fn write_if_changed_at(
    dir: &OwnedFd,
    shown: &Path,
    name: &str,
    contents: &[u8],
    mode: u32,
    point: Option<Point>,
) -> Result<bool> {
    let path = shown.join(name);
    // A leading dot and a non-.json/.nspawn suffix keep half-written files invisible to readers
    // that scan the directory (nspawn, the CDI cache).
    let prefix = format!(".{name}.");
    remove_dead_temps(dir, shown, &prefix)?;
    if holds(dir, name, contents, mode).with_context(|| format!("reading {}", path.display()))? {
        return Ok(false);
    }
    let (tmp, tmp_name) = locked_temp(dir, shown, &prefix)?;
    replace_at(dir, tmp, &tmp_name, name, contents, mode, point)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(true)
}

/// Whether `name` in `dir` is a regular file holding exactly `contents` with `mode`. Never
/// follows a symlink there (another account may own the directory and plant one: it is then
/// replaced, never read through), never opens anything but a regular file, and reads nothing
/// unless the size is that of `contents`, and then no more than that.
pub(crate) fn holds(dir: &OwnedFd, name: &str, contents: &[u8], mode: u32) -> Result<bool> {
    let pinned = match nix::fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let st = nix::sys::stat::fstat(&pinned)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_mode & 0o7777 != mode
        || u64::try_from(st.st_size).ok() != Some(contents.len() as u64)
    {
        return Ok(false);
    }
    // The checked inode, opened for reading without following or blocking: anything swapped
    // in meanwhile is another inode, and then simply not ours.
    let fd = match open_read_nofollow(dir, name) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ELOOP) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let again = nix::sys::stat::fstat(&fd)?;
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
        return Ok(false);
    }
    let file = std::fs::File::from(fd);
    let mut bytes = Vec::with_capacity(contents.len());
    file.take(contents.len() as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes == contents)
}

/// `name` in `dir` opened for reading: never through a symlink (`ELOOP`), never blocking on a
/// FIFO, never becoming our controlling terminal.
fn open_read_nofollow(dir: &OwnedFd, name: &str) -> nix::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// The steps every atomic write shares, host or machine: `tmp` (the file `tmp_name` in `dir`,
/// just created with `O_EXCL` by the caller's naming scheme) gets `contents` and `mode`, is
/// fsynced, renamed over `name` and the directory fsynced; `point` names the moment between the
/// fsync and the rename for crash tests. On an error before the rename the temp file is unlinked.
pub fn replace_at(
    dir: &OwnedFd,
    tmp: std::fs::File,
    tmp_name: &str,
    name: &str,
    contents: &[u8],
    mode: u32,
    point: Option<Point>,
) -> Result<()> {
    let written = (|| -> Result<()> {
        let mut tmp = tmp;
        nix::sys::stat::fchmod(&tmp, Mode::from_bits_truncate(mode)).context("fchmod")?;
        tmp.write_all(contents).context("write")?;
        tmp.sync_all().context("fsync")?;
        if let Some(point) = point {
            failpoint::hit(point);
        }
        nix::fcntl::renameat(dir, tmp_name, dir, name).context("rename")?;
        Ok(())
    })();
    if let Err(e) = written {
        let _ = nix::unistd::unlinkat(dir, tmp_name, UnlinkatFlags::NoRemoveDir);
        return Err(e);
    }
    nix::unistd::fsync(dir).context("fsync the directory")
}

/// A new temp file `<prefix>XXXXXXXXXXXXXXXX.tmp` in `dir`, created with `O_EXCL` and flock-ed
/// by us, and its name. A cleaner may lock and unlink a temp file in the instant between its
/// creation and our lock; then it has no link left and we make another.
fn locked_temp(dir: &OwnedFd, shown: &Path, prefix: &str) -> Result<(std::fs::File, String)> {
    for _ in 0..16 {
        // Random per call: std's hasher keys are seeded from the OS and differ per instance.
        let random = std::hash::RandomState::new().build_hasher().finish();
        let name = format!("{prefix}{random:016x}.tmp");
        let fd = match nix::fcntl::openat(
            dir,
            name.as_str(),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        ) {
            Ok(fd) => fd,
            Err(Errno::EEXIST) => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("creating a temporary file in {}", shown.display()));
            }
        };
        let file = std::fs::File::from(fd);
        if file.try_lock().is_err() {
            continue;
        }
        let links = file
            .metadata()
            .with_context(|| format!("stat {}", shown.join(&name).display()))?
            .nlink();
        if links > 0 {
            return Ok((file, name));
        }
    }
    anyhow::bail!(
        "could not create a temporary file in {} that stayed in place",
        shown.display()
    )
}

/// Remove the temp files `<prefix>*.tmp` in `dir` that no live writer holds.
fn remove_dead_temps(dir: &OwnedFd, shown: &Path, prefix: &str) -> Result<()> {
    let listing = || format!("listing {}", shown.display());
    // A fresh open file description: a dup would share the read offset.
    let mut entries = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .with_context(listing)?;
    let mut dead = Vec::new();
    for e in entries.iter() {
        let e = e.with_context(listing)?;
        let Ok(name) = e.file_name().to_str() else {
            continue;
        };
        if name.starts_with(prefix) && name.ends_with(".tmp") {
            dead.push(name.to_owned());
        }
    }
    let mut removed = false;
    for name in dead {
        // A device node is never opened (opening one can act).
        let regular = nix::sys::stat::fstatat(dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG);
        if !regular {
            continue;
        }
        // Opened without following a symlink swapped in meanwhile, and without blocking on a
        // FIFO; only a regular file nobody holds is removed.
        let Ok(fd) = open_read_nofollow(dir, &name) else {
            continue;
        };
        let file = std::fs::File::from(fd);
        if !file.metadata().is_ok_and(|m| m.is_file()) || file.try_lock().is_err() {
            continue;
        }
        let path = shown.join(&name);
        match nix::unistd::unlinkat(dir, name.as_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) => {
                tracing::info!(file = %path.display(), "removed a temporary file a killed run left");
                removed = true;
            }
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }
    if removed {
        nix::unistd::fsync(dir).with_context(|| format!("fsync directory {}", shown.display()))?;
    }
    Ok(())
}

/// Remove `name` from `dir` if it exists (never a directory) and fsync `dir`. Returns whether
/// something was removed. (Host files: [`crate::fs::host::HostRoot::remove_file`].)
pub fn remove_at(dir: &OwnedFd, name: &str) -> Result<bool> {
    match nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => {
            nix::unistd::fsync(dir).context("fsync the directory")?;
            Ok(true)
        }
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    const P: Point = Point::PreStartMidNspawnWrite;

    /// Through the host root, as every caller writes.
    fn write(p: &Path, contents: &[u8], mode: u32) -> Result<bool> {
        let h = crate::fs::host::HostRoot::new("/");
        h.write_if_changed(p, contents, mode, P)
    }

    #[test]
    fn writes_once_then_leaves_the_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/kube1.nspawn");
        assert!(write(&p, b"a\n", 0o644).unwrap());
        let ino = std::fs::metadata(&p).unwrap().ino();
        assert!(!write(&p, b"a\n", 0o644).unwrap());
        assert_eq!(
            std::fs::metadata(&p).unwrap().ino(),
            ino,
            "unchanged file was replaced"
        );
        assert!(write(&p, b"b\n", 0o644).unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"b\n");
        assert!(
            write(&p, b"b\n", 0o600).unwrap(),
            "mode change must rewrite"
        );
        let leftovers: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from("kube1.nspawn")]);
        let h = crate::fs::host::HostRoot::new("/");
        assert!(h.remove_file(&p).unwrap());
        assert!(!h.remove_file(&p).unwrap());
    }

    /// The shared steps: a rename that fails (the name is a non-empty directory) leaves the
    /// directory as it was, temp file gone, and says which step failed.
    #[test]
    fn a_failed_rename_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("kube1.nspawn/sub")).unwrap();
        let fd: OwnedFd = std::fs::File::open(dir.path()).unwrap().into();
        let tmp = std::fs::File::create(dir.path().join(".kube1.nspawn.tmp")).unwrap();
        let err = replace_at(
            &fd,
            tmp,
            ".kube1.nspawn.tmp",
            "kube1.nspawn",
            b"x",
            0o644,
            None,
        )
        .unwrap_err();
        assert!(format!("{err:#}").starts_with("rename: "), "{err:#}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("kube1.nspawn")]);
    }

    #[test]
    fn temp_files_of_dead_writers_are_removed_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kube1.nspawn");
        std::fs::write(&p, b"old\n").unwrap();
        let dead = dir.path().join(".kube1.nspawn.dead01.tmp");
        std::fs::write(&dead, b"half").unwrap();
        let live = dir.path().join(".kube1.nspawn.live01.tmp");
        let holder = std::fs::File::create(&live).unwrap();
        holder.lock().unwrap();
        let other = dir.path().join(".other.nspawn.dead02.tmp");
        std::fs::write(&other, b"not ours to judge").unwrap();
        // Unchanged bytes still clear what a killed writer left.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(!write(&p, b"old\n", 0o644).unwrap());
        assert!(!dead.exists(), "a dead writer's temp file was left");
        assert!(live.exists(), "a live writer's temp file was removed");
        assert!(other.exists(), "another file's temp file was removed");
        drop(holder);
        assert!(write(&p, b"new\n", 0o644).unwrap());
        assert!(!live.exists());
        assert_eq!(std::fs::read(&p).unwrap(), b"new\n");
    }
}
