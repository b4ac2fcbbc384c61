//! The one atomic-write helper for host files: temp file in the same directory, mode, fsync,
//! rename, fsync the directory; nothing happens when the bytes are already there.

use anyhow::{Context as _, Result};
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// Replace `path` with `contents` atomically unless it already holds exactly those bytes.
/// Returns whether the file was written.
pub fn write_if_changed(path: &Path, contents: &[u8], mode: u32) -> Result<bool> {
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
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    fs_err::create_dir_all(dir)?;
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    // A leading dot and a non-.json/.nspawn suffix keep half-written files invisible to readers
    // that scan the directory (nspawn, the CDI cache).
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(contents)
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", tmp.path().display()))?;
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("fsync {}", tmp.path().display()))?;
    tmp.persist(path)
        .with_context(|| format!("renaming into {}", path.display()))?;
    fsync_dir(dir)?;
    Ok(true)
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
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn writes_once_then_leaves_the_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/kube1.nspawn");
        assert!(write_if_changed(&p, b"a\n", 0o644).unwrap());
        let ino = std::fs::metadata(&p).unwrap().ino();
        assert!(!write_if_changed(&p, b"a\n", 0o644).unwrap());
        assert_eq!(
            std::fs::metadata(&p).unwrap().ino(),
            ino,
            "unchanged file was replaced"
        );
        assert!(write_if_changed(&p, b"b\n", 0o644).unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"b\n");
        assert!(
            write_if_changed(&p, b"b\n", 0o600).unwrap(),
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
}
