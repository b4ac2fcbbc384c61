//! The host tree every read and write goes through: `/` in production, a fixture under `--host-root`.
//!
//! [`HostRoot`] holds the root directory open, like the machine side ([`crate::fs::machine_root`]):
//! every host path (`/dev/nvidia0`) is resolved from that descriptor with `openat2`
//! `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS` (the semantics libpathrs gives the machine side), so an
//! absolute symlink in a `--host-root` fixture resolves inside the fixture, as it would on a real
//! host, and never into the real `/`. What is created or removed is addressed as (directory
//! descriptor, one name); the one atomic writer is [`crate::fs::atomic`]'s, for both sides.
//!
//! [`HostRoot::path`] still joins a string: only for what is a string by nature (text rendered
//! into `.nspawn`/unit files, subprocess arguments, messages), never to open a file
//! (`tests/source_shape.rs` refuses `fs::…(….path(…))` in `src/`).
//!
//! `/proc` magic links (`/proc/self/…`, `/proc/<pid>/root`) are refused by this resolution; the
//! code that needs them (the running helper `/proc/self/exe`, a machine leader's root, a lock
//! holder's `/proc/<pid>`) opens them by their real path, never through a `HostRoot`.

use crate::failpoint::Point;
use crate::fs::machine_root::FileKind;
use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use std::ffi::OsString;
use std::io::{self, Read as _};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The host tree, opened once at the edge (`O_PATH | O_DIRECTORY`) and passed down.
#[derive(Debug, Clone)]
pub struct HostRoot {
    fd: Arc<OwnedFd>,
    root: PathBuf,
}

/// The host path relative to the root: what `openat2` resolves from the root descriptor.
fn relative(abs: &Path) -> &Path {
    let rel = abs.strip_prefix("/").unwrap_or(abs);
    if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    }
}

/// An `io::Error` that keeps the errno (so `ErrorKind::NotFound` still tells "missing").
fn io(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

impl HostRoot {
    /// Open the directory that stands for `/`. The path itself is the operator's (`--host-root`),
    /// so it may be a symlink.
    pub fn open(root: impl Into<PathBuf>) -> Result<HostRoot> {
        let root = root.into();
        let fd = nix::fcntl::open(
            &root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("opening the host root {}", root.display()))?;
        Ok(HostRoot {
            fd: Arc::new(fd),
            root,
        })
    }

    /// [`HostRoot::open`] for fixtures, tests and benchmarks, where a root that cannot be opened
    /// is a bug of the caller: panics with the reason.
    pub fn new(root: impl Into<PathBuf>) -> HostRoot {
        HostRoot::open(root).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// The directory that stands for `/`, as the operator named it (messages, subprocesses).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root directory's descriptor (`O_PATH`): resolve from it, never from [`Self::root`].
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Whether this is the real `/` (some steps, like talking to systemd, only make sense then).
    pub(crate) fn is_real_root(&self) -> bool {
        self.root == Path::new("/")
    }

    /// The string an absolute host path (`/dev/nvidia0`) has under this root, for what is a
    /// string by nature: rendered text, subprocess arguments, messages. Never open it: use the
    /// methods below, which resolve inside the root.
    pub fn path(&self, abs: impl AsRef<Path>) -> PathBuf {
        self.root.join(relative(abs.as_ref()))
    }

    /// A descriptor of the host path `abs`, resolved inside the root with `flags`: one `openat2`
    /// (`RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`). The host's root is the host's own, not a
    /// machine's, and discovery opens hundreds of files: libpathrs's resolve-then-reopen through
    /// its procfs handle made pre-start 2.4 times slower (hooks bench, `1gpu`: 2.09 → 4.93 ms),
    /// so the machine side alone resolves through it.
    fn at(&self, abs: &Path, flags: OFlag) -> io::Result<OwnedFd> {
        let how = nix::fcntl::OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(crate::fs::machine_root::in_root());
        crate::fs::machine_root::openat2(&self.fd, relative(abs), how).map_err(io)
    }

    /// An `O_PATH` descriptor of `abs`, following links inside the root: names the very inode
    /// (a bind mount's source through `/proc/self/fd`) without opening it.
    pub fn pin(&self, abs: impl AsRef<Path>) -> io::Result<OwnedFd> {
        self.at(abs.as_ref(), OFlag::O_PATH)
    }

    /// Open a file for reading, following links inside the root. Non-blocking, so a FIFO never
    /// waits for a writer (callers that need a regular file check [`std::fs::File::metadata`]).
    pub(crate) fn open_read(&self, abs: impl AsRef<Path>) -> io::Result<std::fs::File> {
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        Ok(self.at(abs.as_ref(), flags)?.into())
    }

    /// All of a file's bytes (`std::fs::read` inside the root).
    pub fn read(&self, abs: impl AsRef<Path>) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        self.open_read(abs)?.read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// A UTF-8 file's text (`std::fs::read_to_string` inside the root).
    pub fn read_to_string(&self, abs: impl AsRef<Path>) -> io::Result<String> {
        let mut text = String::new();
        self.open_read(abs)?.read_to_string(&mut text)?;
        Ok(text)
    }

    /// `stat`, following links inside the root.
    pub fn metadata(&self, abs: impl AsRef<Path>) -> io::Result<std::fs::Metadata> {
        std::fs::File::from(self.at(abs.as_ref(), OFlag::O_PATH)?).metadata()
    }

    /// `lstat`: the last component is never followed; its parents resolve inside the root.
    pub fn symlink_metadata(&self, abs: impl AsRef<Path>) -> io::Result<std::fs::Metadata> {
        std::fs::File::from(self.at(abs.as_ref(), OFlag::O_PATH | OFlag::O_NOFOLLOW)?).metadata()
    }

    /// Whether `abs` resolves to a directory inside the root.
    pub fn is_dir(&self, abs: impl AsRef<Path>) -> bool {
        self.metadata(abs).is_ok_and(|m| m.is_dir())
    }

    /// Whether `abs` resolves to a regular file inside the root.
    pub fn is_file(&self, abs: impl AsRef<Path>) -> bool {
        self.metadata(abs).is_ok_and(|m| m.is_file())
    }

    /// Whether `abs` resolves to anything inside the root (a dangling link does not).
    pub fn exists(&self, abs: impl AsRef<Path>) -> bool {
        self.metadata(abs).is_ok()
    }

    /// The target of the symlink `abs` (its parents resolved inside the root).
    pub fn read_link(&self, abs: impl AsRef<Path>) -> io::Result<PathBuf> {
        let fd = self.at(abs.as_ref(), OFlag::O_PATH | OFlag::O_NOFOLLOW)?;
        let target = nix::fcntl::readlinkat(&fd, "").map_err(io)?;
        Ok(target.into())
    }

    /// Open the directory `abs` with no symlink anywhere on the way (inside the root): for a
    /// directory another account may own a parent of, which could otherwise point a link of its
    /// own anywhere. A symlink on the way is `ELOOP`.
    pub(crate) fn open_dir_no_symlinks(&self, abs: impl AsRef<Path>) -> io::Result<OwnedFd> {
        let how = nix::fcntl::OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(
                crate::fs::machine_root::in_root() | nix::fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS,
            );
        crate::fs::machine_root::openat2(&self.fd, relative(abs.as_ref()), how).map_err(io)
    }

    /// Open the directory `abs`, following links inside the root.
    pub fn open_dir(&self, abs: impl AsRef<Path>) -> io::Result<OwnedFd> {
        self.at(abs.as_ref(), OFlag::O_RDONLY | OFlag::O_DIRECTORY)
    }

    /// The entries of directory `abs` in directory order, `.` and `..` left out, each with its
    /// kind (from `d_type`, or an `lstat` of the entry where the filesystem does not say; an
    /// entry is never followed).
    pub fn read_dir(&self, abs: impl AsRef<Path>) -> io::Result<Vec<(OsString, FileKind)>> {
        let fd = self.open_dir(abs)?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(io)?;
        let mut out = Vec::new();
        let mut unknown = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_bytes();
            if matches!(name, b"." | b"..") {
                continue;
            }
            let name = std::ffi::OsStr::from_bytes(name).to_owned();
            match entry.file_type() {
                Some(t) => out.push((name, FileKind::from_dirent(t))),
                None => unknown.push(name),
            }
        }
        for name in unknown {
            let st = nix::sys::stat::fstatat(&dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(io)?;
            out.push((name, FileKind::from_stat(&st)));
        }
        Ok(out)
    }

    /// The parent directory of `abs` (resolved inside the root) and its last component.
    fn parent_of<'a>(&self, abs: &'a Path) -> Result<(OwnedFd, &'a str)> {
        let (parent, name) = split(abs)?;
        let dir = self
            .open_dir(parent)
            .with_context(|| format!("opening {}", self.path(parent).display()))?;
        Ok((dir, name))
    }

    /// `mkdir -p` inside the root: existing components resolve inside it, missing ones are
    /// created with `mode` (less the umask). Returns the directory, open.
    pub fn create_dir_all(&self, abs: impl AsRef<Path>, mode: u32) -> Result<OwnedFd> {
        let abs = abs.as_ref();
        match self.open_dir(abs) {
            Ok(fd) => return Ok(fd),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("opening {}", self.path(abs).display()));
            }
        }
        let (parent, name) = split(abs)?;
        let dir = self.create_dir_all(parent, mode)?;
        match nix::sys::stat::mkdirat(&dir, name, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => {
                return Err(e).with_context(|| format!("creating {}", self.path(abs).display()));
            }
        }
        self.open_dir(abs)
            .with_context(|| format!("opening {}", self.path(abs).display()))
    }

    /// Replace the file `abs` atomically with `contents` and `mode` unless it already holds
    /// them, creating its missing parent directories (`0o755`); see [`crate::fs::atomic`]. Returns
    /// whether the file was written.
    pub(crate) fn write_if_changed(
        &self,
        abs: impl AsRef<Path>,
        contents: &[u8],
        mode: u32,
        point: Point,
    ) -> Result<bool> {
        let abs = abs.as_ref();
        let (parent, name) = split(abs)?;
        let dir = self.create_dir_all(parent, 0o755)?;
        crate::fs::atomic::write_if_changed(&dir, &self.path(parent), name, contents, mode, point)
    }

    /// Whether `abs` is a regular file holding exactly `contents` with `mode`: what
    /// [`HostRoot::write_if_changed`] would leave alone. Reads only; a missing file or directory
    /// does not hold it.
    pub fn holds(&self, abs: impl AsRef<Path>, contents: &[u8], mode: u32) -> Result<bool> {
        let abs = abs.as_ref();
        let (dir, name) = match self.parent_of(abs) {
            Ok(d) => d,
            Err(e) if is_not_found(&e) => return Ok(false),
            Err(e) => return Err(e),
        };
        crate::fs::atomic::holds(&dir, name, contents, mode)
            .with_context(|| format!("reading {}", self.path(abs).display()))
    }

    /// Remove the file (or symlink) `abs` if it exists and fsync its directory. Returns whether
    /// something was removed.
    pub fn remove_file(&self, abs: impl AsRef<Path>) -> Result<bool> {
        let abs = abs.as_ref();
        let (dir, name) = match self.parent_of(abs) {
            Ok(d) => d,
            Err(e) if is_not_found(&e) => return Ok(false),
            Err(e) => return Err(e),
        };
        crate::fs::atomic::remove_at(&dir, name)
            .with_context(|| format!("removing {}", self.path(abs).display()))
    }

    /// Make `abs` a symlink to `target`, atomically (a temp link renamed over it), creating its
    /// missing parent directories (`0o755`).
    pub fn symlink(&self, abs: impl AsRef<Path>, target: &str) -> Result<()> {
        let abs = abs.as_ref();
        let (parent, name) = split(abs)?;
        let dir = self.create_dir_all(parent, 0o755)?;
        let tmp = format!(".{name}.tmp");
        crate::fs::atomic::remove_at(&dir, &tmp)
            .with_context(|| format!("removing {}", self.path(parent).join(&tmp).display()))?;
        nix::unistd::symlinkat(target, &dir, tmp.as_str())
            .with_context(|| format!("linking {} to {target}", self.path(abs).display()))?;
        nix::fcntl::renameat(&dir, tmp.as_str(), &dir, name)
            .with_context(|| format!("renaming to {}", self.path(abs).display()))
    }

    /// Remove the empty directory `abs` (`rmdir`).
    pub fn remove_dir(&self, abs: impl AsRef<Path>) -> io::Result<()> {
        let (parent, name) = split(abs.as_ref())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{e:#}")))?;
        let dir = self.open_dir(parent)?;
        nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::RemoveDir).map_err(io)
    }
}

/// Whether `e` says "no such file or directory" anywhere in its chain.
fn is_not_found(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<io::Error>())
        .any(|io| io.kind() == io::ErrorKind::NotFound)
}

/// An absolute host path's parent and last component (one plain UTF-8 name).
fn split(abs: &Path) -> Result<(&Path, &str)> {
    let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else {
        bail!("{} is not a file in a directory", abs.display());
    };
    let Some(name) = name.to_str() else {
        bail!("{} is not a UTF-8 name", abs.display());
    };
    if !abs.is_absolute() || name == ".." || name == "." {
        bail!("{} is not a plain absolute host path", abs.display());
    }
    Ok((parent, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_absolute_paths_under_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let h = HostRoot::new(dir.path());
        assert_eq!(h.path("/dev/nvidia0"), dir.path().join("dev/nvidia0"));
        assert_eq!(HostRoot::new("/").path("/etc"), PathBuf::from("/etc"));
        assert!(HostRoot::new("/").is_real_root());
        assert!(!h.is_real_root());
    }

    #[test]
    fn a_root_that_cannot_be_opened_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = format!("{:#}", HostRoot::open(&missing).unwrap_err());
        assert!(err.contains(&missing.display().to_string()), "{err}");
        std::fs::write(dir.path().join("file"), b"").unwrap();
        assert!(HostRoot::open(dir.path().join("file")).is_err());
    }

    /// An absolute symlink in a `--host-root` fixture resolves inside the fixture, as it would on
    /// the real host, and `..` stops at the root: the real `/etc/passwd` is never read.
    #[test]
    fn absolute_links_resolve_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let h = HostRoot::new(dir.path());
        std::fs::create_dir_all(dir.path().join("etc/alternatives")).unwrap();
        std::fs::write(dir.path().join("etc/passwd"), b"fixture\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../../../../etc/passwd", dir.path().join("up")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("etc/alternatives/e")).unwrap();
        assert_eq!(h.read("/abs").unwrap(), b"fixture\n");
        assert_eq!(h.read("/up").unwrap(), b"fixture\n");
        assert_eq!(
            h.read_to_string("/etc/alternatives/e/passwd").unwrap(),
            "fixture\n"
        );
        assert!(h.symlink_metadata("/abs").unwrap().is_symlink());
        assert!(h.metadata("/abs").unwrap().is_file());
        assert_eq!(h.read_link("/abs").unwrap(), PathBuf::from("/etc/passwd"));
        // Writes through a link land inside the root too.
        assert!(
            h.write_if_changed(
                "/etc/alternatives/e/new/x",
                b"y",
                0o644,
                Point::PreStartMidNspawnWrite
            )
            .unwrap()
        );
        assert_eq!(std::fs::read(dir.path().join("etc/new/x")).unwrap(), b"y");
        let mut names: Vec<_> = h.read_dir("/").unwrap();
        names.sort();
        assert_eq!(
            names,
            vec![
                ("abs".into(), FileKind::Symlink),
                ("etc".into(), FileKind::Dir),
                ("up".into(), FileKind::Symlink)
            ]
        );
        assert!(h.remove_file("/etc/new/x").unwrap());
        assert!(!h.remove_file("/etc/new/x").unwrap());
        assert!(!h.remove_file("/etc/gone/x").unwrap());
        h.remove_dir("/etc/new").unwrap();
        assert!(!h.exists("/etc/new"));
    }

    /// `/proc` magic links are refused under the real root too: code that needs one opens it by
    /// its real path (see the module docs).
    #[test]
    fn magic_links_are_refused() {
        let h = HostRoot::new("/");
        assert!(h.read("/proc/self/exe").is_err());
        assert!(h.read("/proc/self/status").is_ok());
    }
}
