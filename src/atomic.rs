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
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{
    FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::Path;

/// Replace `path` with `contents` atomically unless it already holds exactly those bytes.
/// `point` names the moment between the temp file's fsync and the rename for crash tests.
/// Returns whether the file was written.
pub fn write_if_changed(path: &Path, contents: &[u8], mode: u32, point: Point) -> Result<bool> {
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?
        .to_string_lossy()
        .into_owned();
    // A leading dot and a non-.json/.nspawn suffix keep half-written files invisible to readers
    // that scan the directory (nspawn, the CDI cache).
    let prefix = format!(".{name}.");
    remove_dead_temps(dir, &prefix)?;
    match std::fs::read(path) {
        Ok(old) if old == contents => {
            let meta =
                std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
            if meta.permissions().mode() & 0o7777 == mode {
                return Ok(false);
            }
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    fs_err::create_dir_all(dir)?;
    let dir_fd: OwnedFd = std::fs::File::open(dir)
        .with_context(|| format!("opening directory {}", dir.display()))?
        .into();
    let tmp = locked_temp(dir, &prefix)?;
    let tmp_name = tmp
        .path()
        .file_name()
        .with_context(|| format!("{} has no file name", tmp.path().display()))?
        .to_string_lossy()
        .into_owned();
    // From here on `replace_at` owns the temp file: it renames it or unlinks it, so the
    // tempfile crate's own clean-up (by path, after the fact) must not run.
    let (file, temp_path) = tmp.into_parts();
    let _ = temp_path.keep();
    replace_at(&dir_fd, file, &tmp_name, &name, contents, mode, Some(point))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(true)
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

/// A new temp file `<prefix>XXXXXX.tmp` in `dir`, flock-ed by us. A cleaner may lock and unlink
/// a temp file in the instant between its creation and our lock; then it has no link left and
/// we make another.
fn locked_temp(dir: &Path, prefix: &str) -> Result<tempfile::NamedTempFile> {
    for _ in 0..16 {
        let tmp = tempfile::Builder::new()
            .prefix(prefix)
            .suffix(".tmp")
            .tempfile_in(dir)
            .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
        if tmp.as_file().try_lock().is_err() {
            continue;
        }
        let links = tmp
            .as_file()
            .metadata()
            .with_context(|| format!("stat {}", tmp.path().display()))?
            .nlink();
        if links > 0 {
            return Ok(tmp);
        }
    }
    anyhow::bail!(
        "could not create a temporary file in {} that stayed in place",
        dir.display()
    )
}

/// Remove the temp files `<prefix>*.tmp` in `dir` that no live writer holds.
fn remove_dead_temps(dir: &Path, prefix: &str) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    let mut removed = false;
    for e in entries {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(prefix) && name.ends_with(".tmp")) {
            continue;
        }
        let path = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_symlink() || ft.is_fifo() || ft.is_char_device() || ft.is_block_device() {
            continue;
        }
        // Opened without following a symlink swapped in meanwhile.
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => f,
            Err(_) => continue,
        };
        if !file.metadata().is_ok_and(|m| m.is_file()) || file.try_lock().is_err() {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(file = %path.display(), "removed a temporary file a killed run left");
                removed = true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }
    if removed {
        fsync_dir(dir)?;
    }
    Ok(())
}

/// Remove `path` if it exists and fsync its directory. Returns whether something was removed.
pub fn remove_if_exists(path: &Path) -> Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            if let Some(dir) = path.parent() {
                fsync_dir(dir)?;
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("fsync directory {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Point = Point::PreStartMidNspawnWrite;

    #[test]
    fn writes_once_then_leaves_the_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/kube1.nspawn");
        assert!(write_if_changed(&p, b"a\n", 0o644, P).unwrap());
        let ino = std::fs::metadata(&p).unwrap().ino();
        assert!(!write_if_changed(&p, b"a\n", 0o644, P).unwrap());
        assert_eq!(
            std::fs::metadata(&p).unwrap().ino(),
            ino,
            "unchanged file was replaced"
        );
        assert!(write_if_changed(&p, b"b\n", 0o644, P).unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"b\n");
        assert!(
            write_if_changed(&p, b"b\n", 0o600, P).unwrap(),
            "mode change must rewrite"
        );
        let leftovers: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from("kube1.nspawn")]);
        assert!(remove_if_exists(&p).unwrap());
        assert!(!remove_if_exists(&p).unwrap());
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
        assert!(!write_if_changed(&p, b"old\n", 0o644, P).unwrap());
        assert!(!dead.exists(), "a dead writer's temp file was left");
        assert!(live.exists(), "a live writer's temp file was removed");
        assert!(other.exists(), "another file's temp file was removed");
        drop(holder);
        assert!(write_if_changed(&p, b"new\n", 0o644, P).unwrap());
        assert!(!live.exists());
        assert_eq!(std::fs::read(&p).unwrap(), b"new\n");
    }
}
