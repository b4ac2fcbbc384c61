//! The machine's rootfs, opened once as a directory fd; every path inside it is resolved inside it.
//!
//! The rootfs is untrusted: root in the machine can plant symlinks (absolute or `../../..`),
//! FIFOs, device nodes or files of the wrong type anywhere. The rules that keep the host safe:
//! - Paths are machine-absolute strings (`/run/nvidia`) resolved from the root fd by libpathrs
//!   ([`resolve_in_root`]: `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`): a planted symlink resolves
//!   inside the machine, never on the host, and `/proc/<pid>/…` magic links are refused. Never
//!   `root.join(p)`.
//! - What the helper creates, replaces or deletes is addressed as (directory fd, one name) with
//!   `*at()` calls that never follow the last component (`mkdirat`, `symlinkat`, `renameat`,
//!   `unlinkat`, `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`).
//! - Directories the helper creates are opened without following symlinks, so a symlink swapped
//!   in after `mkdirat` is refused rather than followed.
//! - Trees are removed by fd, never following a symlink, never crossing a mount, to a bounded depth.
//! - Only regular files are ever opened for reading: an `O_PATH` descriptor pins the inode, is
//!   checked with `fstat`, and only then reopened for reading ([`MachineDir::open_regular`]), so
//!   a FIFO or device node swapped in at any moment is never opened.
//!
//! The same type holds a container's root for the CDI hooks ([`RootKind::Container`], opened by
//! [`MachineRoot::open_container`]): the rules are the same, the messages say "container", and
//! every directory walked to (and so written in) must also be on the root's own filesystem
//! (`RESOLVE_NO_XDEV`), so an image symlink cannot steer a write into `/proc`, `/sys`, `/dev` or
//! a volume the runtime mounted. libpathrs has no such flag (its resolver flags are
//! `NO_SYMLINKS` alone), so a container's paths are resolved by `openat2` itself with
//! `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`: the kernel's walk, refused at the
//! first mount crossed, which a check of the final mount would not be.
//!
//! Ownership: the helper runs as host root and our `.nspawn` sets `PrivateUsers=no`, so host uid 0
//! is the machine's uid 0 and everything created here is `root:root` in the machine too. A
//! user-namespaced machine (`PrivateUsers=pick`) would need `fchownat` to the machine's base uid.

use crate::failpoint::Point;
use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, RenameFlags, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;
use std::ffi::{OsStr, OsString};
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

/// Deepest tree [`MachineDir::remove_tree`] and [`MachineDir::walk`] descend into; the trees we
/// own are about six levels deep, so anything deeper was planted and is refused.
pub(crate) const MAX_DEPTH: usize = 32;
/// Most entries one directory listing returns before it is refused as hostile.
pub(crate) const MAX_ENTRIES: usize = 1_000_000;

/// What a directory entry is, from `lstat` (symlinks are never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FileKind {
    Dir,
    File,
    Symlink,
    Fifo,
    CharDevice,
    BlockDevice,
    Socket,
}

impl FileKind {
    /// The kind an `lstat`/`fstat` result describes.
    pub(crate) fn from_stat(st: &FileStat) -> FileKind {
        match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFDIR => FileKind::Dir,
            SFlag::S_IFLNK => FileKind::Symlink,
            SFlag::S_IFIFO => FileKind::Fifo,
            SFlag::S_IFCHR => FileKind::CharDevice,
            SFlag::S_IFBLK => FileKind::BlockDevice,
            SFlag::S_IFSOCK => FileKind::Socket,
            _ => FileKind::File,
        }
    }

    /// The kind a directory entry's `d_type` names.
    pub(crate) fn from_dirent(t: nix::dir::Type) -> FileKind {
        use nix::dir::Type;
        match t {
            Type::Directory => FileKind::Dir,
            Type::Symlink => FileKind::Symlink,
            Type::Fifo => FileKind::Fifo,
            Type::CharacterDevice => FileKind::CharDevice,
            Type::BlockDevice => FileKind::BlockDevice,
            Type::Socket => FileKind::Socket,
            Type::File => FileKind::File,
        }
    }

    pub fn is_file(self) -> bool {
        self == FileKind::File
    }

    pub fn is_dir(self) -> bool {
        self == FileKind::Dir
    }

    pub fn is_symlink(self) -> bool {
        self == FileKind::Symlink
    }

    /// A short word for messages and listings.
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::Dir => "directory",
            FileKind::File => "regular file",
            FileKind::Symlink => "symlink",
            FileKind::Fifo => "FIFO",
            FileKind::CharDevice => "character device",
            FileKind::BlockDevice => "block device",
            FileKind::Socket => "socket",
        }
    }
}

/// What [`MachineDir::symlink`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkOutcome {
    /// The link already pointed there; nothing was touched.
    Unchanged,
    Created,
    /// Another symlink was atomically replaced.
    Replaced,
    /// Something that is not a symlink holds the name; it was left alone.
    Blocked(FileKind),
}

/// What [`MachineRoot::lookup_dir`] found, following symlinks inside the machine.
#[derive(Debug)]
pub(crate) enum Lookup {
    Dir(MachineDir),
    /// The path or one of its parents does not exist (a dangling symlink included).
    Missing,
    /// The path or one of its parents is not a directory.
    NotDir,
}

/// What [`MachineDir::open_subdir`] found under a name, without following it.
#[derive(Debug)]
pub enum Subdir {
    Dir(MachineDir),
    Missing,
    /// Not a directory (a symlink is reported as such, never followed).
    Other(FileKind),
}

/// A file of a container image, as [`MachineRoot::read_image_file`] found it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ImageFile {
    /// Its bytes.
    Bytes(Vec<u8>),
    /// Nothing there (or a parent is missing).
    Absent,
    /// Something a hook must not read (why, for the log): a link out of the root's filesystem,
    /// a FIFO or device, a file larger than the bound.
    Unusable(String),
}

/// Which untrusted tree a [`MachineRoot`] is: how strictly directories are walked and what the
/// messages call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RootKind {
    /// A machine's rootfs (post-start, status): directories resolve anywhere inside the root,
    /// across the machine's own mounts (`/run`, `/var/run → ../run`).
    Machine,
    /// A container's root as its runtime set it up (the CDI hooks): directories must also be on
    /// the root's own filesystem (`RESOLVE_NO_XDEV`).
    Container,
}

impl RootKind {
    /// What messages call the tree: "… in the machine", "… in the container".
    pub(crate) fn noun(self) -> &'static str {
        match self {
            RootKind::Machine => "machine",
            RootKind::Container => "container",
        }
    }

    /// Resolution flags added to every directory walk.
    fn walk(self) -> ResolveFlag {
        match self {
            RootKind::Machine => ResolveFlag::empty(),
            RootKind::Container => ResolveFlag::RESOLVE_NO_XDEV,
        }
    }

    /// The temporary name a file or link is made under before the rename: ours alone in a
    /// container image, where `.<name>.tmp` may be the image's own file.
    fn tmp_name(self, name: &str) -> String {
        match self {
            RootKind::Machine => format!(".{name}.tmp"),
            RootKind::Container => format!(".{name}.nspawn-lifecycle.tmp"),
        }
    }
}

/// The machine's (or a container's, see [`RootKind`]) root directory, opened once.
#[derive(Debug)]
pub struct MachineRoot {
    fd: OwnedFd,
    origin: PathBuf,
    tree: RootKind,
}

/// A directory inside the machine, held open; `path` is its machine path, for messages.
#[derive(Debug)]
pub struct MachineDir {
    fd: OwnedFd,
    path: String,
    tree: RootKind,
}

/// Resolve a path as if the directory were `/`, refusing `/proc` magic links (shared with the host
/// side, [`crate::fs::host::HostRoot`]).
pub(crate) fn in_root() -> ResolveFlag {
    ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

fn beneath_no_symlinks() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// Why [`resolve_in_root`] found nothing: the errno when the kernel gave one, and libpathrs's
/// error for the message.
#[derive(Debug)]
pub(crate) struct Unresolved {
    pub errno: Option<Errno>,
    pub error: pathrs::error::Error,
}

/// How [`resolve_in_root`] treats symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Links {
    /// Followed, inside the root, the last component too.
    Follow,
    /// None anywhere on the way; a symlink at the last component is itself what is named.
    None,
}

/// `path` under `root` as the root's own `/`, by libpathrs: every symlink resolved inside the
/// root, `..` never above it, magic links refused; an `O_PATH` descriptor of what it names.
pub(crate) fn resolve_in_root(
    root: &OwnedFd,
    path: &str,
    links: Links,
) -> std::result::Result<OwnedFd, Unresolved> {
    use std::os::fd::AsFd as _;
    let r = pathrs::RootRef::from_fd(root.as_fd());
    let resolved = match links {
        Links::Follow => r.resolve(path),
        Links::None => r
            .with_resolver_flags(pathrs::flags::ResolverFlags::NO_SYMLINKS)
            .resolve_nofollow(path),
    };
    resolved.map(OwnedFd::from).map_err(|error| Unresolved {
        errno: match error.kind() {
            pathrs::error::ErrorKind::OsError(Some(n)) => Some(Errno::from_raw(n)),
            _ => None,
        },
        error,
    })
}

/// How often an `openat2` that the kernel refused with `EAGAIN` is retried.
const OPENAT2_RETRIES: usize = 64;

/// `openat2`, retried on `EAGAIN`: with `RESOLVE_IN_ROOT`/`RESOLVE_BENEATH` the kernel answers
/// `EAGAIN` when any rename or mount elsewhere in the system raced with resolving a `..`
/// (the machine's own `/var/run → ../run` has one), and asks the caller to retry.
pub(crate) fn openat2<P: ?Sized + nix::NixPath>(
    dirfd: &OwnedFd,
    path: &P,
    how: OpenHow,
) -> nix::Result<OwnedFd> {
    let mut tries = 0;
    loop {
        match nix::fcntl::openat2(dirfd, path, how) {
            Err(Errno::EAGAIN) if tries < OPENAT2_RETRIES => tries += 1,
            r => return r,
        }
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC
}

/// Check that `name` is one ordinary path component.
pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        bail!("{name:?} is not a single file name");
    }
    Ok(())
}

/// Split a machine-absolute path into its components, refusing `.`/`..`/empty ones: the paths
/// the helper uses are its own constants and configuration, never relative tricks.
pub fn components(path: &str) -> Result<Vec<&str>> {
    let Some(rest) = path.strip_prefix('/') else {
        bail!("{path:?} is not an absolute path inside the machine");
    };
    let comps: Vec<&str> = rest.split('/').filter(|c| !c.is_empty()).collect();
    for c in &comps {
        check_name(c).with_context(|| format!("machine path {path:?}"))?;
    }
    Ok(comps)
}

/// Split a machine-absolute path into its parent directory and last component, checked like
/// [`components`]. The root itself has no last component and is refused.
pub(crate) fn split_parent(path: &str) -> Result<(String, &str)> {
    let comps = components(path)?;
    let Some((name, parents)) = comps.split_last() else {
        bail!("{path} is the machine root, not an entry in a directory");
    };
    Ok((format!("/{}", parents.join("/")), name))
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// What an `O_PATH` descriptor pins, for reading: a regular file reopened through it, or why
/// it is not opened.
enum Pinned {
    File(std::fs::File, FileStat),
    /// Not a regular file (a FIFO or device node is never opened).
    Not(FileKind),
    /// A kernel pseudo-file bound where a file belongs (`/proc/kmsg`): a regular file to `stat`,
    /// but no one's file: reading it could block or take what another reader is owed.
    PseudoFs,
}

/// Reopen what `pinned` names for reading when it is a regular file on a real filesystem
/// (`O_NONBLOCK`, the same inode, checked). `path` and `noun` are for messages.
fn reopen_pinned(pinned: &OwnedFd, path: &str, noun: &str) -> Result<Pinned> {
    use std::os::fd::AsRawFd as _;
    let st = nix::sys::stat::fstat(pinned).with_context(|| format!("stat {path}"))?;
    let kind = FileKind::from_stat(&st);
    if kind != FileKind::File {
        return Ok(Pinned::Not(kind));
    }
    let fs = nix::sys::statfs::fstatfs(pinned).with_context(|| format!("statfs {path}"))?;
    if is_pseudo_fs(&fs) {
        return Ok(Pinned::PseudoFs);
    }
    let fd = nix::fcntl::open(
        format!("/proc/self/fd/{}", pinned.as_raw_fd()).as_str(),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("reopening {path} in the {noun} for reading"))?;
    let again = nix::sys::stat::fstat(&fd).with_context(|| format!("stat {path}"))?;
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
        bail!("{path} in the {noun} changed while it was being opened");
    }
    Ok(Pinned::File(std::fs::File::from(fd), again))
}

/// The regular file an `O_PATH` descriptor pins, reopened for reading; `None` when it is not a
/// regular file on a real filesystem ([`reopen_pinned`]).
fn reopen_regular(
    pinned: &OwnedFd,
    path: &str,
    noun: &str,
) -> Result<Option<(std::fs::File, FileStat)>> {
    Ok(match reopen_pinned(pinned, path, noun)? {
        Pinned::File(file, st) => Some((file, st)),
        Pinned::Not(_) | Pinned::PseudoFs => None,
    })
}

/// The bytes of the file `pinned` (an `O_PATH` descriptor) when it is a regular file of at most
/// `max` bytes on no kernel pseudo-filesystem, read through that descriptor with that bound;
/// else why not: its kind when it is no regular file, or the reason. The size is checked before
/// a byte is read, so a sparse or endless file costs no read.
fn read_pinned(
    pinned: &OwnedFd,
    path: &str,
    noun: &str,
    max: usize,
) -> Result<std::result::Result<Vec<u8>, NotRead>> {
    let (file, st) = match reopen_pinned(pinned, path, noun)? {
        Pinned::File(file, st) => (file, st),
        Pinned::Not(kind) => return Ok(Err(NotRead::Kind(kind))),
        Pinned::PseudoFs => {
            return Ok(Err(NotRead::Why(
                "it is a file of a kernel pseudo-filesystem".into(),
            )));
        }
    };
    if usize::try_from(st.st_size).unwrap_or(usize::MAX) > max {
        return Ok(Err(NotRead::Why(format!(
            "it holds {} bytes, more than the {max} read",
            st.st_size
        ))));
    }
    // Grew past the bound since the stat: the writer's doing, like a file too large.
    Ok(read_bounded(file, max, path, noun).map_err(|e| NotRead::Why(format!("{e:#}"))))
}

/// Why [`read_pinned`] read nothing.
enum NotRead {
    Kind(FileKind),
    Why(String),
}

impl NotRead {
    fn unusable(self) -> ImageFile {
        ImageFile::Unusable(match self {
            NotRead::Kind(kind) => format!("it is a {}", kind.as_str()),
            NotRead::Why(why) => why,
        })
    }
}

/// Whether `fs` is one of the kernel's pseudo-filesystems, whose "regular files" may block a
/// reader or have effects when read (`/proc/kmsg`), never an image's.
fn is_pseudo_fs(fs: &nix::sys::statfs::Statfs) -> bool {
    use nix::sys::statfs as f;
    const DEVPTS: f::FsType = f::FsType(0x1cd1);
    const SECURITYFS: f::FsType = f::FsType(0x7363_6673);
    const BPF: f::FsType = f::FsType(0xcafe_4a11);
    const TRACEFS: f::FsType = f::FsType(0x7472_6163);
    const DEBUGFS: f::FsType = f::FsType(0x6462_6720);
    [
        f::PROC_SUPER_MAGIC,
        f::SYSFS_MAGIC,
        f::CGROUP_SUPER_MAGIC,
        f::CGROUP2_SUPER_MAGIC,
        DEVPTS,
        SECURITYFS,
        BPF,
        TRACEFS,
        DEBUGFS,
    ]
    .contains(&fs.filesystem_type())
}

/// All of `file`, at most `max` bytes; more is an error naming `path`.
fn read_bounded(file: std::fs::File, max: usize, path: &str, noun: &str) -> Result<Vec<u8>> {
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let mut bytes = Vec::new();
    file.take(limit)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {path} in the {noun}"))?;
    if bytes.len() > max {
        bail!("{path} in the {noun} is larger than {max} bytes");
    }
    Ok(bytes)
}

impl std::os::fd::AsFd for MachineRoot {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl MachineRoot {
    /// Open the machine root at a host path. The host path itself is trusted (it comes from the
    /// operator's configuration or from the leader's `/proc/<pid>/root`), so it may be a symlink.
    pub fn open(path: &Path) -> Result<MachineRoot> {
        let fd = nix::fcntl::open(path, dir_flags(), Mode::empty())
            .with_context(|| format!("opening machine root {}", path.display()))?;
        Ok(MachineRoot {
            fd,
            origin: path.to_path_buf(),
            tree: RootKind::Machine,
        })
    }

    /// Open a container's root at `path` (from its runtime's OCI state, trusted; may itself be a
    /// symlink) as a [`RootKind::Container`]. A root that is the runtime's own `/` is refused:
    /// every write would land outside any container.
    pub(crate) fn open_container(path: &Path) -> Result<MachineRoot> {
        let fd = nix::fcntl::open(path, dir_flags(), Mode::empty())
            .with_context(|| format!("opening container root {}", path.display()))?;
        let ours = nix::sys::stat::fstat(&fd).context("stat container root")?;
        let slash = nix::sys::stat::stat("/").context("stat /")?;
        if (ours.st_dev, ours.st_ino) == (slash.st_dev, slash.st_ino) {
            bail!(
                "container root {} is the runtime's own root directory; refusing to write there",
                path.display()
            );
        }
        Ok(MachineRoot {
            fd,
            origin: path.to_path_buf(),
            tree: RootKind::Container,
        })
    }

    /// Open the root of the machine whose leader is `pid`, as that process sees it (its mount
    /// namespace, so the machine's own `/run` and `/dev` tmpfs are what we resolve through),
    /// through a `/proc/<pid>` descriptor the caller already holds (`O_PATH` is enough): the
    /// descriptor is bound to the process, so if the leader exits and its pid is reused in
    /// between, the lookup fails instead of handing us another process's root, and the root and
    /// whatever else the caller reads there belong to one process. (The caller still checks that
    /// machined names the same leader afterwards.) A root that is the host's own `/` is refused:
    /// every write below would land on the host.
    pub(crate) fn for_leader_dir(proc_dir: &OwnedFd, pid: u32) -> Result<MachineRoot> {
        let proc_path = format!("/proc/{pid}");
        let fd = nix::fcntl::openat(proc_dir, "root", dir_flags(), Mode::empty())
            .with_context(|| format!("opening {proc_path}/root (machine leader gone?)"))?;
        let root = MachineRoot {
            fd,
            origin: PathBuf::from(format!("{proc_path}/root")),
            tree: RootKind::Machine,
        };
        root.refuse_host_root(Path::new("/"))?;
        Ok(root)
    }

    /// Fail when this root is the same directory as `host_root`.
    pub(crate) fn refuse_host_root(&self, host_root: &Path) -> Result<()> {
        let ours = nix::sys::stat::fstat(&self.fd).context("stat machine root")?;
        let host = nix::sys::stat::stat(host_root)
            .with_context(|| format!("stat {}", host_root.display()))?;
        if (ours.st_dev, ours.st_ino) == (host.st_dev, host.st_ino) {
            bail!(
                "machine root {} is the host's root directory {}; refusing to rewire it",
                self.origin.display(),
                host_root.display()
            );
        }
        Ok(())
    }

    /// `path` resolved in the root by [`resolve_in_root`]: the errno of a path that does not
    /// resolve, for the caller to tell apart; an error for anything else libpathrs refuses.
    fn resolve(&self, path: &str, links: Links) -> Result<nix::Result<OwnedFd>> {
        match resolve_in_root(&self.fd, path, links) {
            Ok(fd) => Ok(Ok(fd)),
            Err(Unresolved { errno: Some(e), .. }) => Ok(Err(e)),
            Err(u) => Err(anyhow::Error::new(u.error))
                .with_context(|| format!("resolving {path} in the {}", self.tree.noun())),
        }
    }

    /// The host path the root was opened from.
    pub(crate) fn origin(&self) -> &Path {
        &self.origin
    }

    /// The root directory itself.
    pub(crate) fn root_dir(&self) -> Result<MachineDir> {
        let fd = nix::unistd::dup(&self.fd).context("duplicating the root fd")?;
        Ok(MachineDir {
            fd,
            path: "/".into(),
            tree: self.tree,
        })
    }

    /// Open an existing directory, following symlinks inside the machine only.
    /// `None` when it (or a parent) does not exist; an error when it is not a directory.
    pub fn open_dir(&self, path: &str) -> Result<Option<MachineDir>> {
        let noun = self.tree.noun();
        match self.lookup_dir(path)? {
            Lookup::Dir(d) => Ok(Some(d)),
            Lookup::Missing => Ok(None),
            Lookup::NotDir => {
                bail!("{path} in the {noun} is not a directory (or one of its parents is not)")
            }
        }
    }

    /// Like [`MachineRoot::open_dir`], telling "missing" and "not a directory" apart for callers
    /// that have nothing to do in either case.
    pub(crate) fn lookup_dir(&self, path: &str) -> Result<Lookup> {
        let noun = self.tree.noun();
        components(path)?;
        let opened = match self.tree {
            RootKind::Machine => self
                .resolve(path, Links::Follow)?
                .and_then(|pinned| nix::fcntl::openat(&pinned, ".", dir_flags(), Mode::empty())),
            RootKind::Container => {
                let how = OpenHow::new()
                    .flags(dir_flags())
                    .resolve(in_root() | ResolveFlag::RESOLVE_NO_XDEV);
                openat2(&self.fd, path, how)
            }
        };
        match opened {
            Ok(fd) => Ok(Lookup::Dir(MachineDir {
                fd,
                path: path.to_owned(),
                tree: self.tree,
            })),
            Err(Errno::ENOENT) => Ok(Lookup::Missing),
            Err(Errno::ENOTDIR) => Ok(Lookup::NotDir),
            Err(Errno::EXDEV) => bail!(
                "{path} in the {noun} is on another filesystem than the {noun} root (a mount, or \
                 a symlink into one); refusing to write there"
            ),
            Err(e) => Err(e).with_context(|| format!("opening {path} in the {noun}")),
        }
    }

    /// `mkdir -p` inside the machine. Existing components are resolved in the machine root (the
    /// machine may legitimately have `/var/run → ../run`); components created here get `mode`
    /// and are opened without following symlinks.
    pub fn create_dir_all(&self, path: &str, mode: u32) -> Result<MachineDir> {
        let noun = self.tree.noun();
        let comps = components(path)?;
        let mut cur = self.root_dir()?;
        for (i, name) in comps.iter().enumerate() {
            let prefix = format!("/{}", comps[..=i].join("/"));
            cur = match self.open_dir(&prefix)? {
                Some(d) => d,
                None => {
                    if let Some(target) = cur.read_link(name)? {
                        bail!(
                            "{prefix} in the {noun} is a symlink to {} that does not resolve \
                             to a directory inside the {noun}",
                            target.to_string_lossy()
                        );
                    }
                    cur.create_subdir(name, mode)?
                }
            };
        }
        Ok(cur)
    }

    /// Read a regular file, following symlinks in its parents inside the machine only; `None`
    /// when it is missing or not a regular file.
    pub fn read_file(&self, path: &str, max: usize) -> Result<Option<Vec<u8>>> {
        let (parent, name) = split_parent(path)?;
        match self.open_dir(&parent)? {
            Some(d) => d.read_regular(name, max),
            None => Ok(None),
        }
    }

    /// What is at `path` (never following its last component), resolving its parents inside the
    /// machine only; `None` when it or a parent is missing.
    pub(crate) fn kind_of(&self, path: &str) -> Result<Option<FileKind>> {
        Ok(self.stat(path)?.map(|st| FileKind::from_stat(&st)))
    }

    /// `lstat` of `path` ([`MachineRoot::kind_of`]'s walk): its kind, and a node's numbers.
    pub fn stat(&self, path: &str) -> Result<Option<nix::sys::stat::FileStat>> {
        let (parent, name) = split_parent(path)?;
        match self.open_dir(&parent)? {
            Some(d) => d.stat(name),
            None => Ok(None),
        }
    }

    /// Whether `path` resolves inside the machine, following every symlink (the last component
    /// too) inside the machine only: false for a dangling link, a loop or a missing parent. Opens
    /// an `O_PATH` descriptor, which runs no driver's open and reads nothing.
    pub fn resolves(&self, path: &str) -> Result<bool> {
        let noun = self.tree.noun();
        components(path)?;
        match self.resolve(path, Links::Follow)? {
            Ok(_) => Ok(true),
            Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => Ok(false),
            Err(e) => Err(e).with_context(|| format!("resolving {path} in the {noun}")),
        }
    }

    /// What a container image holds at `path`, for a hook to read: resolved
    /// `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV` as `O_PATH` (symlinks inside
    /// the image are followed, never onto another mount: not the container's fresh procfs, not
    /// `/dev`, not a volume), then opened only when it is a regular file on the root's own
    /// filesystem of at most `max` bytes, reopened through its descriptor with `O_NONBLOCK` and
    /// read with that bound. Anything else is [`ImageFile::Unusable`] with the reason: the image
    /// controls this file, so it is never an error of ours.
    pub(crate) fn read_image_file(&self, path: &str, max: usize) -> Result<ImageFile> {
        let noun = self.tree.noun();
        components(path)?;
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(in_root() | ResolveFlag::RESOLVE_NO_XDEV);
        let pinned = match openat2(&self.fd, path, how) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(ImageFile::Absent),
            Err(e @ (Errno::ELOOP | Errno::EXDEV | Errno::EACCES | Errno::EPERM)) => {
                return Ok(ImageFile::Unusable(format!(
                    "it does not resolve to a file on the {noun}'s own filesystem ({})",
                    e.desc()
                )));
            }
            Err(e) => return Err(e).with_context(|| format!("opening {path} in the {noun}")),
        };
        // RESOLVE_NO_XDEV kept the walk on the root's mount; the file's filesystem type must be
        // the root's too. (Not `st_dev`: overlayfs, the usual container rootfs, reports a
        // regular file's underlying layer's device.)
        let fs = nix::sys::statfs::fstatfs(&pinned).with_context(|| format!("statfs {path}"))?;
        let root_fs = nix::sys::statfs::fstatfs(&self.fd).context("statfs the root")?;
        if fs.filesystem_type() != root_fs.filesystem_type() {
            return Ok(ImageFile::Unusable(format!(
                "it is on another filesystem than the {noun} root"
            )));
        }
        Ok(read_pinned(&pinned, path, noun, max)?.map_or_else(NotRead::unusable, ImageFile::Bytes))
    }

    /// What a reader inside the machine gets when it opens `path` (every symlink followed, the
    /// last component too, inside the machine only): for judging a file the machine may have
    /// planted where a consumer of ours reads (a CDI spec directory). [`ImageFile::Bytes`] only
    /// for a regular file of at most `max` bytes on a real filesystem, read through the
    /// descriptor that was checked; a dangling link, a loop or a directory is
    /// [`ImageFile::Absent`] (the reader gets no file either); a FIFO, device, kernel pseudo-file
    /// or larger file
    /// is [`ImageFile::Unusable`], never opened for reading.
    pub(crate) fn read_followed(&self, path: &str, max: usize) -> Result<ImageFile> {
        let noun = self.tree.noun();
        components(path)?;
        match self.resolve(path, Links::Follow)? {
            Ok(pinned) => Ok(match read_pinned(&pinned, path, noun, max)? {
                Ok(bytes) => ImageFile::Bytes(bytes),
                Err(NotRead::Kind(FileKind::Dir)) => ImageFile::Absent,
                Err(why) => why.unusable(),
            }),
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => Ok(ImageFile::Absent),
            Err(e) => Err(e).with_context(|| format!("resolving {path} in the {noun}")),
        }
    }

    /// An `O_PATH` descriptor of `path`, resolved inside the root with no symlink anywhere on
    /// the way (a mount target must be the very file named); `None` when missing.
    pub(crate) fn pin_no_symlinks(&self, path: &str) -> Result<Option<OwnedFd>> {
        let noun = self.tree.noun();
        components(path)?;
        let pinned = match self.tree {
            RootKind::Machine => self.resolve(path, Links::None)?,
            RootKind::Container => {
                let how = OpenHow::new()
                    .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
                    .resolve(in_root() | ResolveFlag::RESOLVE_NO_SYMLINKS);
                openat2(&self.fd, path, how)
            }
        };
        match pinned {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("opening {path} in the {noun}")),
        }
    }
}

impl std::os::fd::AsFd for MachineDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

mod dir;
pub use dir::WalkEntry;

#[cfg(test)]
mod tests;
