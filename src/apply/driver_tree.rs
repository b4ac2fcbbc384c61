//! The driver tree on the host: pre-start builds each machine's [`layout::Tree`] under
//! [`layout::TREE_HOST_DIR`]`/<machine>` before the machine boots; its `.nspawn` file binds it
//! read-only at `/run/nvidia/driver`, with the directory binds (and any file binds) on the mount
//! points it holds.
//!
//! The tree is made of directories, hard links of the host's driver files (the very host inodes:
//! real files at their standard names, no mount each), and SONAME links relative to their own
//! directory, so every name resolves inside it wherever it is seen. A file that cannot be linked
//! — on another filesystem than the tree ([`plan`] sees it from `st_dev`), or refused by the
//! kernel when linking (`EPERM`, `EMLINK`, …; [`ensure`] names it and the errno in one log line)
//! — is an empty mount point with a read-only bind of the file instead, as before hard links.
//! The tree is built fresh beside the current one and swapped in with one
//! `renameat2(RENAME_EXCHANGE)`, so a reader (nspawn) sees the old tree or the new, never half of
//! one; a tree that is already exactly right is left alone (the usual restart: nothing is
//! written). Whether it is right is known without reading the tree back entry by entry: beside
//! it, a stamp (`.<machine>.stamp`) holds the plan it was built or found to match and the inode
//! and ctime of each of its directories, which any edit of the tree changes ([`stamp_text`]);
//! only when the stamp does not match (first start, driver changed, tree edited, stamp missing
//! or garbage, or removed by post-start when its check of the driver root failed: [`distrust`])
//! is the tree walked, and rebuilt when it differs. The stamp goes before the tree is changed
//! and is written last, atomically: a pre-start killed at any point leaves a tree the next one
//! walks. Every step goes through directory descriptors opened with `O_NOFOLLOW` below
//! [`host_dir::open`]'s verified directory, so no link anyone placed there is followed; the host
//! driver files are linked without following a link (`linkat` without `AT_SYMLINK_FOLLOW`), and
//! each new entry is checked to be the inode [`plan`] stat'ed.

use crate::discovery::UserspaceDriver;
use crate::fs::host::HostRoot;
use crate::fs::host_dir;
use crate::model::layout::{self, Tree, TreeNode};
use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};

const DIR_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o644;

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// A file's identity: device and inode.
type FileId = (u64, u64);

fn id(st: &FileStat) -> FileId {
    (st.st_dev, st.st_ino)
}

fn is_kind(st: &FileStat, kind: SFlag) -> bool {
    st.st_mode & SFlag::S_IFMT.bits() == kind.bits()
}

/// What pre-start will build: the tree, each driver file placed ([`TreeNode::Hard`] when it is
/// on the tree's filesystem, else [`TreeNode::Bound`]), and the identity of each host file as
/// stat'ed now, which the tree's hard links must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub tree: Tree,
    ids: BTreeMap<String, FileId>,
}

/// What [`ensure`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Built {
    /// Whether anything was written.
    pub changed: bool,
    /// Files the kernel refused to link (tree path, errno), bound instead: the plan's tree now
    /// says so, and the `.nspawn` file must carry their binds ([`layout::file_binds`]).
    pub unlinked: Vec<(String, Errno)>,
}

/// Plan `driver`'s tree for the host: stat every host driver file (a regular file; a link, such
/// as Debian's `/usr/bin/nvidia-smi` → `/etc/alternatives/…`, resolved inside the host root as
/// the host sees it) and the mount the tree is on: a file on another mount cannot be hard-linked
/// there (`EXDEV`, whatever `st_dev` says: overlayfs reports the upper layer's device for a
/// file, a bind mount its source's), so it is bound. Reads only.
pub fn plan(host: &HostRoot, driver: &UserspaceDriver) -> Result<Plan> {
    let mut tree = layout::driver_tree(driver)?;
    let tree_mnt = tree_mount(host)?;
    let root = host.fd();
    let mut ids = BTreeMap::new();
    for node in tree.values_mut() {
        let TreeNode::Hard(source) = node else {
            continue;
        };
        let rel = source.trim_start_matches('/');
        let mut st = statx(root, rel, libc::AT_SYMLINK_NOFOLLOW)
            .with_context(|| format!("host driver file {source} (stat)"))?;
        if st.mode & libc::S_IFMT == libc::S_IFLNK {
            let (fd, _) = resolve(host, source)?;
            st = statx(&fd, "", libc::AT_EMPTY_PATH)
                .with_context(|| format!("host driver file {source} (stat)"))?;
        }
        if st.mode & libc::S_IFMT != libc::S_IFREG {
            bail!(
                "host driver file {source} is {}, not a regular file (the driver changed \
                 since discovery?)",
                kind_name(st.mode)
            );
        }
        ids.insert(source.clone(), (st.dev, st.ino));
        if st.mnt_id.is_some() && st.mnt_id != tree_mnt {
            *node = TreeNode::Bound(std::mem::take(source));
        }
    }
    Ok(Plan { tree, ids })
}

/// What `statx` says of a file: device, inode, mode, and mount id (`None` before Linux 5.8).
struct Statx {
    dev: u64,
    ino: u64,
    mode: u32,
    mnt_id: Option<u64>,
}

/// nix 0.32 has no `statx`, and `fstatat` has no mount id.
#[allow(unsafe_code)]
fn statx(dir: &impl AsFd, path: &str, flags: libc::c_int) -> nix::Result<Statx> {
    use std::os::fd::AsRawFd as _;
    let c = std::ffi::CString::new(path).map_err(|_| Errno::EINVAL)?;
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    let mask = libc::STATX_TYPE | libc::STATX_INO | libc::STATX_MNT_ID;
    // SAFETY: `c` is a valid C string, `buf` is a writable statx buffer, the fd is open.
    let r = unsafe {
        libc::statx(
            dir.as_fd().as_raw_fd(),
            c.as_ptr(),
            flags,
            mask,
            buf.as_mut_ptr(),
        )
    };
    Errno::result(r)?;
    // SAFETY: statx succeeded and filled the buffer.
    let b = unsafe { buf.assume_init() };
    Ok(Statx {
        dev: libc::makedev(b.stx_dev_major, b.stx_dev_minor),
        ino: b.stx_ino,
        mode: u32::from(b.stx_mode),
        mnt_id: (b.stx_mask & libc::STATX_MNT_ID != 0).then_some(b.stx_mnt_id),
    })
}

fn kind_name(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFREG => "a regular file",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        _ => "of an unknown type",
    }
}

/// The mount [`layout::TREE_HOST_DIR`] is on (or will be: its nearest existing ancestor's).
fn tree_mount(host: &HostRoot) -> Result<Option<u64>> {
    let mut p = std::path::PathBuf::from(layout::TREE_HOST_DIR);
    loop {
        match host.open_dir(&p) {
            Ok(fd) => {
                return Ok(statx(&fd, "", libc::AT_EMPTY_PATH)
                    .with_context(|| format!("stat {}", host.path(&p).display()))?
                    .mnt_id);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && p.pop() => {}
            Err(e) => {
                return Err(e).with_context(|| format!("opening {}", host.path(&p).display()));
            }
        }
    }
}

/// The host file `source` resolved inside the host root (links followed as the host would, never
/// out of it), as an `O_PATH` descriptor, and its stat.
fn resolve(host: &HostRoot, source: &str) -> Result<(OwnedFd, FileStat)> {
    let fd = host
        .pin(source)
        .with_context(|| format!("host driver file {source} (resolving it)"))?;
    let st = nix::sys::stat::fstat(&fd).with_context(|| format!("stat {source}"))?;
    Ok((fd, st))
}

/// pre-start's step: build (or check) the tree `r` binds and, when the kernel refused to link a
/// file, add its bind to `r`'s `.nspawn` file; without a driver, remove the machine's tree so it
/// holds no old driver's files.
pub fn apply(host: &HostRoot, machine: &str, r: &mut crate::model::render::Rendered) -> Result<()> {
    let dir = layout::tree_host_path(machine);
    let Some(plan) = &mut r.tree else {
        if remove(host, machine)? {
            tracing::info!(%machine, %dir, "driver tree removed: no NVIDIA driver for this machine");
        }
        return Ok(());
    };
    let built = ensure(host, machine, plan)?;
    if !built.unlinked.is_empty() {
        let named: Vec<String> = built
            .unlinked
            .iter()
            .map(|(p, e)| format!("{p} ({e})"))
            .collect();
        tracing::warn!(
            %machine, %dir,
            "{} driver files could not be hard-linked into the tree and are bound instead: {}",
            named.len(),
            named.join(", ")
        );
        let tree: Tree = built
            .unlinked
            .iter()
            .filter_map(|(p, _)| plan.tree.get_key_value(p))
            .map(|(p, n)| (p.clone(), n.clone()))
            .collect();
        r.file.bind_driver_files(layout::file_binds(&tree)?);
    }
    if built.changed {
        let bound = layout::file_binds(&plan.tree)?.len();
        tracing::info!(%machine, %dir, entries = plan.tree.len(), bound, "driver tree built");
    }
    Ok(())
}

/// Make `machine`'s host tree exactly `plan.tree`; a file the kernel refuses to link becomes a
/// bound mount point, in the tree and in [`Built::unlinked`]. A tree whose stamp matches is not
/// read; one walked and found right is stamped; one rebuilt is stamped once it is in place.
pub fn ensure(host: &HostRoot, machine: &str, plan: &mut Plan) -> Result<Built> {
    let top = host_dir::open(host, layout::TREE_HOST_DIR, DIR_MODE)?;
    let shown = host.path(layout::tree_host_path(machine));
    let (new, old) = (format!(".{machine}.new"), format!(".{machine}.old"));
    // What a killed pre-start left.
    for leftover in [&new, &old] {
        remove_tree(top.fd(), leftover)
            .with_context(|| format!("removing {}/{leftover}", top.path().display()))?;
    }
    let current = open_current(&top, machine, &shown)?;
    if let Some(fd) = &current {
        // Taken before the walk below, so an edit after it shows in the next start's stamp.
        let now = stamp_text(top.fd(), machine, plan);
        if now
            .as_deref()
            .is_some_and(|t| stamp_reads(top.fd(), machine, t))
        {
            return Ok(Built::default());
        }
        if matches(fd, plan).with_context(|| format!("reading {}", shown.display()))? {
            if let Some(text) = now {
                write_stamp(top.fd(), machine, &text)
                    .with_context(|| format!("stamping {}", shown.display()))?;
            }
            return Ok(Built::default());
        }
    }
    forget_at(top.fd(), machine).with_context(|| format!("forgetting {}", shown.display()))?;
    nix::sys::stat::mkdirat(top.fd(), new.as_str(), Mode::from_bits_truncate(DIR_MODE))
        .with_context(|| format!("creating {}/{new}", top.path().display()))?;
    let fd = nix::fcntl::openat(top.fd(), new.as_str(), dir_flags(), Mode::empty())
        .with_context(|| format!("opening {}/{new}", top.path().display()))?;
    fix_mode(&fd, DIR_MODE)?;
    let unlinked = build(&fd, host, plan)
        .with_context(|| format!("building {}/{new}", top.path().display()))?;
    let flags = if current.is_some() {
        RenameFlags::RENAME_EXCHANGE
    } else {
        RenameFlags::RENAME_NOREPLACE
    };
    nix::fcntl::renameat2(top.fd(), new.as_str(), top.fd(), machine, flags)
        .with_context(|| format!("swapping in {}", shown.display()))?;
    // After an exchange `new` holds the old tree.
    remove_tree(top.fd(), &new).with_context(|| format!("removing the old {}", shown.display()))?;
    // Last, once the tree is complete and in place (a kill before leaves no stamp: the next
    // start walks the tree). A tree with files the kernel refused to link is not stamped: its
    // plan says hard links where it holds mount points, so it is rebuilt at every start, and a
    // file that has become linkable is linked.
    if unlinked.is_empty()
        && let Some(text) = stamp_text(top.fd(), machine, plan)
    {
        write_stamp(top.fd(), machine, &text)
            .with_context(|| format!("stamping {}", shown.display()))?;
    }
    Ok(Built {
        changed: true,
        unlinked,
    })
}

/// The machine's current tree, if it is a directory; anything else at its name is removed
/// (replaced below, never followed).
fn open_current(
    top: &host_dir::HostDir,
    machine: &str,
    shown: &std::path::Path,
) -> Result<Option<OwnedFd>> {
    match nix::fcntl::openat(top.fd(), machine, dir_flags(), Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        Err(Errno::ELOOP | Errno::ENOTDIR) => {
            remove_tree(top.fd(), machine)
                .with_context(|| format!("removing {}", shown.display()))?;
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("opening {}", shown.display())),
    }
}

/// Remove `machine`'s tree, and what versions before the hard links left on `/run`. Returns
/// whether there was anything. Creates nothing: a host without a tree stays without one.
pub fn remove(host: &HostRoot, machine: &str) -> Result<bool> {
    let mut any = false;
    for dir in [layout::TREE_HOST_DIR, layout::LEGACY_TREE_HOST_DIR] {
        let Some(top) = open_existing(host, dir)? else {
            continue;
        };
        for name in [
            machine.to_owned(),
            format!(".{machine}.new"),
            format!(".{machine}.old"),
            stamp_name(machine),
            stamp_tmp_name(machine),
        ] {
            any |= remove_tree(&top, &name)
                .with_context(|| format!("removing {}", host.path(dir).join(&name).display()))?;
        }
    }
    Ok(any)
}

/// Remove the tree at `path` (a host path: `uninstall`) and its stamp, never following a link
/// below its parent. Returns whether the tree existed.
pub fn remove_path(host: &HostRoot, abs: &str) -> Result<bool> {
    let Some((parent, name)) = abs.rsplit_once('/').filter(|(_, n)| !n.is_empty()) else {
        bail!("internal error: {abs} has no parent");
    };
    let Some(fd) = open_existing(host, parent)? else {
        return Ok(false);
    };
    let shown = host.path(abs);
    forget_at(&fd, name).with_context(|| format!("removing the stamp of {}", shown.display()))?;
    remove_tree(&fd, name).with_context(|| format!("removing {}", shown.display()))
}

/// The directory `abs` under `host`, opened component by component without following a link;
/// `None` when it (or a component) does not exist.
fn open_existing(host: &HostRoot, abs: &str) -> Result<Option<OwnedFd>> {
    let mut fd = host
        .fd()
        .try_clone()
        .with_context(|| format!("opening the host root {}", host.root().display()))?;
    for name in abs.split('/').filter(|c| !c.is_empty()) {
        fd = match nix::fcntl::openat(&fd, name, dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| format!("opening {}", host.path(abs).display()));
            }
        };
    }
    Ok(Some(fd))
}

fn fix_mode(fd: &OwnedFd, mode: u32) -> Result<()> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode)).context("chmod")?;
    Ok(())
}

/// Create every node of `plan.tree` (parents sort before their children) under the directory
/// `top`; returns the files it had to bind instead of linking.
fn build(top: &OwnedFd, host: &HostRoot, plan: &mut Plan) -> Result<Vec<(String, Errno)>> {
    let mut dirs: BTreeMap<String, OwnedFd> = BTreeMap::new();
    let mut unlinked = Vec::new();
    for (path, node) in plan.tree.iter_mut() {
        let (parent, name) = match path.rsplit_once('/') {
            Some((p, n)) => (
                dirs.get(p)
                    .with_context(|| format!("{p} is not a directory of the tree"))?,
                n,
            ),
            None => (top, path.as_str()),
        };
        match node {
            TreeNode::Dir => {
                nix::sys::stat::mkdirat(parent, name, Mode::from_bits_truncate(DIR_MODE))
                    .with_context(|| format!("mkdir {path}"))?;
                let fd = nix::fcntl::openat(parent, name, dir_flags(), Mode::empty())
                    .with_context(|| format!("opening {path}"))?;
                fix_mode(&fd, DIR_MODE)?;
                dirs.insert(path.clone(), fd);
            }
            TreeNode::Hard(source) => {
                let want = plan.ids[source.as_str()];
                match hard_link(host, source, parent, name, want) {
                    Ok(()) => {}
                    Err(Err(e)) => return Err(e.context(format!("linking {source} at {path}"))),
                    Err(Ok(e)) => {
                        mount_point(parent, name).with_context(|| format!("creating {path}"))?;
                        unlinked.push((path.clone(), e));
                        *node = TreeNode::Bound(std::mem::take(source));
                    }
                }
            }
            TreeNode::Bound(_) => {
                mount_point(parent, name).with_context(|| format!("creating {path}"))?;
            }
            TreeNode::File(bytes) => {
                write_file(parent, name, bytes).with_context(|| format!("writing {path}"))?;
            }
            TreeNode::Link(target) => {
                if target.contains('/') || target == ".." || target == "." {
                    bail!("internal error: link {path} -> {target} leaves its directory");
                }
                nix::unistd::symlinkat(target.as_str(), parent, name)
                    .with_context(|| format!("symlink {path} -> {target}"))?;
            }
        }
    }
    Ok(unlinked)
}

/// Why a hard link was not made: `Ok(errno)` when the file is to be bound instead, `Err` when
/// pre-start must fail.
type LinkError = std::result::Result<Errno, anyhow::Error>;

/// Hard-link the host file `source` (resolved inside the host root, as [`plan`] did) as `name`
/// in `parent`, and check it is the inode `want` that [`plan`] stat'ed. `Err(Ok(errno))`: the
/// kernel refused the link, the file is to be bound instead; `Err(Err(_))`: pre-start fails.
fn hard_link(
    host: &HostRoot,
    source: &str,
    parent: &OwnedFd,
    name: &str,
    want: FileId,
) -> std::result::Result<(), LinkError> {
    let (fd, st) = resolve(host, source).map_err(|e| {
        Err(e.context("the host file changed since discovery; the next start retries"))
    })?;
    if !is_kind(&st, SFlag::S_IFREG) || id(&st) != want {
        return Err(Err(anyhow::anyhow!(
            "the host file was replaced while the tree was built; the next start retries"
        )));
    }
    // The very inode stat'ed, by descriptor (needs CAP_DAC_READ_SEARCH, which root has).
    nix::unistd::linkat(&fd, "", parent, name, AtFlags::AT_EMPTY_PATH).map_err(Ok)?;
    // overlayfs links a lower-layer file by copying it up: the new name is another inode than
    // the host path shows (which keeps the lower file's identity), as good as a file on another
    // filesystem. It is bound instead, reported as EXDEV.
    let made = nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(|e| Err(anyhow::Error::from(e).context("stat of the new link")))?;
    if id(&made) != want {
        nix::unistd::unlinkat(parent, name, UnlinkatFlags::NoRemoveDir)
            .map_err(|e| Err(anyhow::Error::from(e).context("removing the copied-up link")))?;
        return Err(Ok(Errno::EXDEV));
    }
    Ok(())
}

/// A new file `name` in `parent` holding `bytes` (the tree's loader cache).
fn write_file(parent: &OwnedFd, name: &str, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let fd = nix::fcntl::openat(
        parent,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(FILE_MODE),
    )?;
    fix_mode(&fd, FILE_MODE)?;
    std::fs::File::from(fd).write_all(bytes)?;
    Ok(())
}

/// Whether `name` in `dir` is a regular file holding exactly `want` (read no further than
/// one byte past it, never following a link, never blocking on a FIFO).
fn holds(dir: &OwnedFd, name: &str, want: &[u8]) -> Result<bool> {
    use std::io::Read as _;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("opening {name}")),
    };
    let st = nix::sys::stat::fstat(&fd).with_context(|| format!("stat {name}"))?;
    if !is_kind(&st, SFlag::S_IFREG) || st.st_size != want.len() as i64 {
        return Ok(false);
    }
    let mut got = Vec::with_capacity(want.len() + 1);
    std::fs::File::from(fd)
        .take(want.len() as u64 + 1)
        .read_to_end(&mut got)
        .with_context(|| format!("reading {name}"))?;
    Ok(got == want)
}

/// FNV-1a of `bytes`: the stamp names a written file's content by it (the file's ctime, also
/// in the stamp, catches any edit; this catches a plan whose bytes changed).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// An empty file: the mount point of a file bind.
fn mount_point(parent: &OwnedFd, name: &str) -> Result<()> {
    write_file(parent, name, &[])
}

/// The names in directory `fd` (without `.` and `..`).
fn names(fd: &OwnedFd) -> Result<Vec<String>> {
    let dup = fd.try_clone().context("dup")?;
    let mut dir = nix::dir::Dir::from_fd(dup).context("opendir")?;
    let mut out = Vec::new();
    for e in dir.iter() {
        let e = e.context("readdir")?;
        let n = e.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        out.push(String::from_utf8_lossy(n).into_owned());
    }
    Ok(out)
}

/// Whether the tree under the directory `fd` is exactly `plan`: the same names, each directory a
/// directory, each hard link the host file's inode, each mount point an empty file (and not the
/// host file: that would be a link where a bind is planned), each SONAME link the same link.
fn matches(fd: &OwnedFd, plan: &Plan) -> Result<bool> {
    let mut seen = 0usize;
    let mut stack = vec![(String::new(), fd.try_clone().context("dup")?)];
    while let Some((prefix, dir)) = stack.pop() {
        for name in names(&dir)? {
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let Some(node) = plan.tree.get(&rel) else {
                return Ok(false);
            };
            seen += 1;
            // One call per entry: a directory is opened (`O_NOFOLLOW | O_DIRECTORY` refuses
            // anything else), a link read (`EINVAL` for anything else), a file stat'ed.
            let stat = || {
                nix::sys::stat::fstatat(&dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .with_context(|| format!("stat {rel}"))
            };
            let same = match node {
                TreeNode::Dir => {
                    match nix::fcntl::openat(&dir, name.as_str(), dir_flags(), Mode::empty()) {
                        Ok(sub) => {
                            stack.push((rel, sub));
                            true
                        }
                        Err(Errno::ENOTDIR | Errno::ELOOP) => false,
                        Err(e) => return Err(e).with_context(|| format!("opening {rel}")),
                    }
                }
                TreeNode::Hard(source) => {
                    let st = stat()?;
                    is_kind(&st, SFlag::S_IFREG) && plan.ids.get(source) == Some(&id(&st))
                }
                TreeNode::Bound(source) => {
                    let st = stat()?;
                    is_kind(&st, SFlag::S_IFREG)
                        && st.st_size == 0
                        && plan.ids.get(source) != Some(&id(&st))
                }
                TreeNode::File(bytes) => holds(&dir, &name, bytes)?,
                TreeNode::Link(target) => match nix::fcntl::readlinkat(&dir, name.as_str()) {
                    Ok(got) => got.to_str() == Some(target.as_str()),
                    Err(Errno::EINVAL) => false,
                    Err(e) => return Err(e).with_context(|| format!("readlink {rel}")),
                },
            };
            if !same {
                return Ok(false);
            }
        }
    }
    Ok(seen == plan.tree.len())
}

/// The stamp beside `machine`'s tree ([`stamp_text`]): the tree as pre-start last built or
/// walked it.
fn stamp_name(machine: &str) -> String {
    format!(".{machine}.stamp")
}

/// The stamp's temp file ([`atomic::replace_at`]); the machine lock makes the fixed name ours.
fn stamp_tmp_name(machine: &str) -> String {
    format!(".{machine}.stamp.tmp")
}

const STAMP_HEADER: &str = "nspawn-lifecycle driver tree stamp v1\n";

/// What the stamp of `machine`'s tree (in `top`) must say for [`ensure`] to trust the tree
/// without walking it: `plan` (every entry, its kind, each hard link's host device and inode,
/// each SONAME link's target) and the device, inode, mode and change time, as they are now, of
/// the tree's top, of each directory and of each mount point in it. Adding, removing, renaming or
/// replacing an entry changes its directory's ctime, as a chmod or a write into a mount point
/// changes the file's own, and a directory put in place of another has another inode: so a stamp
/// written when the tree was right stops matching at the first edit of the tree since (Linux ≥
/// 6.13 gives a ctime read since its last change a fine-grained timestamp at the next one).
/// `None` when one of them cannot be stat'ed or is not of its kind: no stamp matches then.
fn stamp_text(top: &OwnedFd, machine: &str, plan: &Plan) -> Option<String> {
    use std::fmt::Write as _;
    let mut out = String::from(STAMP_HEADER);
    stamp_stat(&mut out, top, machine, "", SFlag::S_IFDIR)?;
    for (path, node) in &plan.tree {
        match node {
            TreeNode::Dir => {
                writeln!(out, "dir {path:?}").ok()?;
                stamp_stat(&mut out, top, machine, path, SFlag::S_IFDIR)?;
            }
            TreeNode::Hard(source) => {
                let (dev, ino) = plan.ids.get(source)?;
                writeln!(out, "hard {path:?} {source:?} {dev}:{ino}").ok()?;
            }
            TreeNode::Bound(source) => {
                writeln!(out, "bound {path:?} {source:?}").ok()?;
                stamp_stat(&mut out, top, machine, path, SFlag::S_IFREG)?;
            }
            TreeNode::Link(target) => writeln!(out, "link {path:?} {target:?}").ok()?,
            TreeNode::File(bytes) => {
                writeln!(out, "file {path:?} {} {:016x}", bytes.len(), fnv1a(bytes)).ok()?;
                stamp_stat(&mut out, top, machine, path, SFlag::S_IFREG)?;
            }
        }
    }
    Some(out)
}

/// One line of [`stamp_text`]: `rel` in `machine`'s tree, which must be of `kind`.
fn stamp_stat(
    out: &mut String,
    top: &OwnedFd,
    machine: &str,
    rel: &str,
    kind: SFlag,
) -> Option<()> {
    use std::fmt::Write as _;
    let path = if rel.is_empty() {
        machine.to_owned()
    } else {
        format!("{machine}/{rel}")
    };
    let st = nix::sys::stat::fstatat(top, path.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
    if !is_kind(&st, kind) {
        return None;
    }
    writeln!(
        out,
        "stat {rel:?} {}:{} {:o} {}.{:09}",
        st.st_dev, st.st_ino, st.st_mode, st.st_ctime, st.st_ctime_nsec
    )
    .ok()
}

/// Whether the stamp beside `machine`'s tree says exactly `want`. One that is missing,
/// unreadable, cut short, longer, garbage or not a file does not: the tree is then walked.
fn stamp_reads(top: &OwnedFd, machine: &str, want: &str) -> bool {
    use std::io::Read as _;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let Ok(fd) = nix::fcntl::openat(top, stamp_name(machine).as_str(), flags, Mode::empty()) else {
        return false;
    };
    let mut buf = Vec::with_capacity(want.len() + 1);
    let read = std::fs::File::from(fd)
        .take(want.len() as u64 + 1)
        .read_to_end(&mut buf);
    read.is_ok() && buf == want.as_bytes()
}

/// Write the stamp of `machine`'s tree (in `top`) atomically: whatever was at its name goes
/// first, then temp file, fsync, rename ([`atomic::replace_at`]). Killed before the rename,
/// there is no stamp and the next start walks the tree.
fn write_stamp(top: &OwnedFd, machine: &str, text: &str) -> Result<()> {
    forget_at(top, machine)?;
    let tmp = stamp_tmp_name(machine);
    let fd = nix::fcntl::openat(
        top,
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(FILE_MODE),
    )
    .with_context(|| format!("creating {tmp}"))?;
    crate::fs::atomic::replace_at(
        top,
        std::fs::File::from(fd),
        &tmp,
        &stamp_name(machine),
        text.as_bytes(),
        FILE_MODE,
        None,
    )
}

/// Remove the stamp of `machine`'s tree (in `top`) and a temp file of it a killed pre-start
/// left, whatever they are. Returns whether there was a stamp.
fn forget_at(top: &impl AsFd, machine: &str) -> Result<bool> {
    remove_tree(top, &stamp_tmp_name(machine))?;
    remove_tree(top, &stamp_name(machine))
}

/// post-start found `machine`'s driver root wrong (`err`, from `rewire::verify_driver_root`):
/// remove the stamp of its host tree, so the next pre-start walks the tree entry by entry
/// instead of trusting it (and rebuilds what differs). Returns `err`, with a failure to remove
/// the stamp added to it.
pub fn distrust(host: &HostRoot, machine: &str, err: anyhow::Error) -> anyhow::Error {
    let forgot = open_existing(host, layout::TREE_HOST_DIR)
        .and_then(|top| top.map_or(Ok(false), |top| forget_at(&top, machine)));
    match forgot {
        Ok(_) => err,
        Err(e) => err.context(format!(
            "and the stamp of {} could not be removed ({e:#})",
            host.path(layout::tree_host_path(machine)).display()
        )),
    }
}

/// Remove `name` in `parent` and everything under it, never following a link. Returns whether
/// it existed.
fn remove_tree(parent: &impl AsFd, name: &str) -> Result<bool> {
    let st = match nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("stat {name}")),
    };
    if is_kind(&st, SFlag::S_IFDIR) {
        let fd = nix::fcntl::openat(parent, name, dir_flags(), Mode::empty())
            .with_context(|| format!("opening {name}"))?;
        for child in names(&fd)? {
            remove_tree(&fd, &child)?;
        }
        nix::unistd::unlinkat(parent, name, UnlinkatFlags::RemoveDir)
            .with_context(|| format!("rmdir {name}"))?;
    } else {
        nix::unistd::unlinkat(parent, name, UnlinkatFlags::NoRemoveDir)
            .with_context(|| format!("unlink {name}"))?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{DriverFile, LibDir};
    use std::os::unix::fs::MetadataExt as _;
    use std::path::Path;

    const LIB: &str = "usr/lib/x86_64-linux-gnu";

    /// A host with one library and one tool; the driver discovery would report for it.
    fn host() -> (tempfile::TempDir, HostRoot, UserspaceDriver) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(LIB)).unwrap();
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        std::fs::write(dir.path().join(LIB).join("libcuda.so.9.1"), b"ELF cuda 9.1").unwrap();
        std::fs::write(dir.path().join("usr/bin/nvidia-smi"), b"smi").unwrap();
        let host = HostRoot::new(dir.path());
        let driver = UserspaceDriver {
            version: "9.1".into(),
            lib_dirs: vec![LibDir {
                path: format!("/{LIB}").parse().unwrap(),
                triplet: "x86_64-linux-gnu".into(),
                files: vec![DriverFile {
                    name: "libcuda.so.9.1".into(),
                    soname: Some("libcuda.so.1".into()),
                }],
            }],
            binaries: vec!["/usr/bin/nvidia-smi".parse().unwrap()],
            firmware: None,
            sockets: vec![],
            runtime: vec![],
        };
        (dir, host, driver)
    }

    fn tree_dir(dir: &Path) -> std::path::PathBuf {
        dir.join("var/lib/nspawn-lifecycle/driver-root/kube1")
    }

    /// Past a coarse timestamp's tick before an edit of a stamped tree, so its ctime moves
    /// (kernels before 6.13 stamp at most once per jiffy; later ones give a ctime read since its
    /// last change a fine-grained one).
    fn tick() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    fn ino(p: &Path) -> u64 {
        std::fs::symlink_metadata(p).unwrap().ino()
    }

    /// Every driver file in the tree is a hard link of the host file (its inode), so
    /// the `.nspawn` file binds none of them; the SONAME is the link beside it.
    #[test]
    fn driver_files_are_hard_links_of_the_host_files_and_need_no_bind() {
        let (dir, host, driver) = host();
        let mut plan = plan(&host, &driver).unwrap();
        let built = ensure(&host, "kube1", &mut plan).unwrap();
        assert_eq!(
            built,
            Built {
                changed: true,
                unlinked: vec![]
            }
        );
        let t = tree_dir(dir.path());
        let lib = t.join(LIB).join("libcuda.so.9.1");
        assert_eq!(ino(&lib), ino(&dir.path().join(LIB).join("libcuda.so.9.1")));
        assert_eq!(std::fs::read(&lib).unwrap(), b"ELF cuda 9.1");
        assert_eq!(
            ino(&t.join("usr/bin/nvidia-smi")),
            ino(&dir.path().join("usr/bin/nvidia-smi"))
        );
        assert_eq!(
            std::fs::read_link(t.join(LIB).join("libcuda.so.1")).unwrap(),
            Path::new("libcuda.so.9.1")
        );
        assert!(layout::file_binds(&plan.tree).unwrap().is_empty());
    }

    /// The tree carries the tools' C runtime as host inodes and a loader cache naming the tree's
    /// libraries at their paths in it; an edit of the cache (same size, new bytes) is found and
    /// undone at the next start, and a host C library replaced (an upgrade) is linked anew.
    #[test]
    fn the_c_runtime_and_the_trees_loader_cache_are_kept_exact() {
        let (dir, host, mut driver) = host();
        std::fs::create_dir_all(dir.path().join("lib64")).unwrap();
        std::fs::write(dir.path().join(LIB).join("libc.so.6"), b"libc 1").unwrap();
        std::fs::write(dir.path().join("lib64/ld.so"), b"loader").unwrap();
        driver.runtime = vec![
            crate::discovery::RuntimeFile {
                path: "/lib64/ld.so".into(),
                source: "/lib64/ld.so".parse().unwrap(),
            },
            crate::discovery::RuntimeFile {
                path: format!("/{LIB}/libc.so.6"),
                source: format!("/{LIB}/libc.so.6").parse().unwrap(),
            },
        ];
        assert!(
            ensure(&host, "kube1", &mut plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
        let t = tree_dir(dir.path());
        assert_eq!(
            ino(&t.join("lib64/ld.so")),
            ino(&dir.path().join("lib64/ld.so"))
        );
        let libc = t.join(LIB).join("libc.so.6");
        assert_eq!(ino(&libc), ino(&dir.path().join(LIB).join("libc.so.6")));
        let cache = std::fs::read(t.join("etc/ld.so.cache")).unwrap();
        let names: Vec<(String, String)> = crate::discovery::ldcache::parse(&cache)
            .unwrap()
            .into_iter()
            .map(|e| (e.soname, e.path))
            .collect();
        assert_eq!(
            names,
            [
                ("libcuda.so.1".to_owned(), format!("/{LIB}/libcuda.so.1")),
                ("libc.so.6".to_owned(), format!("/{LIB}/libc.so.6")),
            ]
        );
        assert!(
            !ensure(&host, "kube1", &mut plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
        tick();
        let mut edited = cache.clone();
        edited[cache.len() - 2] ^= 0xff;
        std::fs::write(t.join("etc/ld.so.cache"), &edited).unwrap();
        assert!(
            ensure(&host, "kube1", &mut plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
        assert_eq!(std::fs::read(t.join("etc/ld.so.cache")).unwrap(), cache);
        let upgraded = dir.path().join(LIB).join("libc.so.6.new");
        std::fs::write(&upgraded, b"libc 2").unwrap();
        std::fs::rename(&upgraded, dir.path().join(LIB).join("libc.so.6")).unwrap();
        assert!(
            ensure(&host, "kube1", &mut plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
        assert_eq!(std::fs::read(&libc).unwrap(), b"libc 2");
    }

    #[test]
    fn built_once_then_left_alone_then_swapped_when_it_changes() {
        let (dir, host, driver) = host();
        let t = tree_dir(dir.path());
        assert!(
            ensure(&host, "kube1", &mut plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
        let top = ino(&t);
        assert!(
            !ensure(&host, "kube1", &mut plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
        assert_eq!(ino(&t), top);
        // An upgrade as dpkg does it: a new file renamed over the old name. The tree still
        // holds the old inode until the next pre-start, which sees it and relinks.
        let host_lib = dir.path().join(LIB).join("libcuda.so.9.1");
        std::fs::write(dir.path().join(LIB).join(".new"), b"ELF cuda 9.1 rebuilt").unwrap();
        std::fs::rename(dir.path().join(LIB).join(".new"), &host_lib).unwrap();
        assert_ne!(ino(&t.join(LIB).join("libcuda.so.9.1")), ino(&host_lib));
        assert!(
            ensure(&host, "kube1", &mut plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
        assert_eq!(ino(&t.join(LIB).join("libcuda.so.9.1")), ino(&host_lib));
        assert!(
            !dir.path()
                .join("var/lib/nspawn-lifecycle/driver-root/.kube1.new")
                .exists()
        );
        // Something else put in the tree makes it differ: rebuilt without it.
        tick();
        std::fs::write(t.join(LIB).join("extra"), b"x").unwrap();
        assert!(
            ensure(&host, "kube1", &mut plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
        assert!(!t.join(LIB).join("extra").exists());
        // A copy of the right content is not the host's file: rebuilt.
        tick();
        let lib = t.join(LIB).join("libcuda.so.9.1");
        std::fs::remove_file(&lib).unwrap();
        std::fs::write(&lib, b"ELF cuda 9.1 rebuilt").unwrap();
        assert!(
            ensure(&host, "kube1", &mut plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
        assert_eq!(ino(&lib), ino(&host_lib));
        // A link to a copy where a directory belongs, a file where a SONAME link belongs: both
        // rebuilt, the copy never followed into.
        let changed = |host: &HostRoot| {
            ensure(host, "kube1", &mut plan(host, &driver).unwrap())
                .unwrap()
                .changed
        };
        let bin = t.join("usr/bin");
        tick();
        let copy = dir.path().join("copy");
        std::fs::rename(&bin, &copy).unwrap();
        std::os::unix::fs::symlink(&copy, &bin).unwrap();
        assert!(changed(&host));
        assert!(std::fs::symlink_metadata(&bin).unwrap().is_dir());
        assert!(copy.join("nvidia-smi").is_file());
        let soname = t.join(LIB).join("libcuda.so.1");
        tick();
        std::fs::remove_file(&soname).unwrap();
        std::fs::write(&soname, b"").unwrap();
        assert!(changed(&host));
        assert!(std::fs::symlink_metadata(&soname).unwrap().is_symlink());
        assert!(!changed(&host));
    }

    fn top_dir(dir: &Path) -> std::path::PathBuf {
        dir.join("var/lib/nspawn-lifecycle/driver-root")
    }

    fn stamp_path(dir: &Path) -> std::path::PathBuf {
        top_dir(dir).join(".kube1.stamp")
    }

    /// What the stamp says for the tree as it is now.
    fn stamp_now(dir: &Path, host: &HostRoot, driver: &UserspaceDriver) -> String {
        let top = nix::fcntl::open(&top_dir(dir), dir_flags(), Mode::empty()).unwrap();
        stamp_text(&top, "kube1", &plan(host, driver).unwrap()).unwrap()
    }

    fn changed(host: &HostRoot, driver: &UserspaceDriver) -> bool {
        ensure(host, "kube1", &mut plan(host, driver).unwrap())
            .unwrap()
            .changed
    }

    /// A stamp that matches is trusted: the tree is not walked. Here a stamp forged for a tree
    /// edited by hand hides the edit (which only a walk would see); without it the walk sees the
    /// edit and the tree is rebuilt.
    #[test]
    fn a_matching_stamp_is_trusted_without_walking_the_tree() {
        let (dir, host, driver) = host();
        assert!(changed(&host, &driver));
        let stamp = stamp_path(dir.path());
        assert_eq!(
            std::fs::read_to_string(&stamp).unwrap(),
            stamp_now(dir.path(), &host, &driver)
        );
        let extra = tree_dir(dir.path()).join(LIB).join("extra");
        std::fs::write(&extra, b"x").unwrap();
        std::fs::write(&stamp, stamp_now(dir.path(), &host, &driver)).unwrap();
        assert!(!changed(&host, &driver));
        assert!(extra.exists());
        std::fs::remove_file(&stamp).unwrap();
        assert!(changed(&host, &driver));
        assert!(!extra.exists());
        assert!(stamp.is_file());
    }

    /// Each edit of the tree by hand changes its directory's ctime (or a directory's inode): the
    /// stamp no longer matches, the walk sees the edit and the tree is rebuilt and stamped again.
    #[test]
    fn a_tree_edited_by_hand_is_rebuilt_despite_its_stamp() {
        let (dir, host, driver) = host();
        let t = tree_dir(dir.path());
        let lib = t.join(LIB);
        type Edit = Box<dyn Fn()>;
        let edits: Vec<(&str, Edit)> = vec![
            ("entry removed", {
                let p = t.join("usr/bin/nvidia-smi");
                Box::new(move || std::fs::remove_file(&p).unwrap())
            }),
            ("entry added", {
                let p = lib.join("extra");
                Box::new(move || std::fs::write(&p, b"x").unwrap())
            }),
            ("entry added at the top", {
                let p = t.join("extra");
                Box::new(move || std::fs::create_dir(&p).unwrap())
            }),
            ("link retargeted", {
                let p = lib.join("libcuda.so.1");
                Box::new(move || {
                    std::fs::remove_file(&p).unwrap();
                    std::os::unix::fs::symlink("libcuda.so.9.2", &p).unwrap();
                })
            }),
            ("hard link replaced by a copy", {
                let p = lib.join("libcuda.so.9.1");
                Box::new(move || {
                    std::fs::remove_file(&p).unwrap();
                    std::fs::write(&p, b"ELF cuda 9.1").unwrap();
                })
            }),
            ("directory replaced by a copy", {
                let (bin, copy) = (t.join("usr/bin"), t.join("usr/bin.copy"));
                Box::new(move || {
                    std::fs::create_dir(&copy).unwrap();
                    std::fs::write(copy.join("nvidia-smi"), b"smi").unwrap();
                    std::fs::remove_file(bin.join("nvidia-smi")).unwrap();
                    std::fs::remove_dir(&bin).unwrap();
                    std::fs::rename(&copy, &bin).unwrap();
                })
            }),
        ];
        assert!(changed(&host, &driver));
        for (what, edit) in edits {
            assert!(!changed(&host, &driver), "{what}: before");
            tick();
            edit();
            assert!(changed(&host, &driver), "{what}: not seen");
            assert_eq!(
                std::fs::read_to_string(stamp_path(dir.path())).unwrap(),
                stamp_now(dir.path(), &host, &driver),
                "{what}"
            );
        }
        assert!(!t.join("extra").exists() && !lib.join("extra").exists());
        assert_eq!(
            std::fs::read_link(lib.join("libcuda.so.1")).unwrap(),
            Path::new("libcuda.so.9.1")
        );
        assert_eq!(
            ino(&lib.join("libcuda.so.9.1")),
            ino(&dir.path().join(LIB).join("libcuda.so.9.1"))
        );
    }

    /// A stamp that is garbage, cut short, too long, empty or not a file is no error: the tree
    /// is walked (left alone when right, rebuilt when not) and stamped again.
    #[test]
    fn a_corrupt_stamp_means_a_walk_not_an_error() {
        let (dir, host, driver) = host();
        assert!(changed(&host, &driver));
        let stamp = stamp_path(dir.path());
        let good = std::fs::read(&stamp).unwrap();
        let garbage: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"\xff\x00 not a stamp".to_vec(),
            good[..good.len() / 2].to_vec(),
            [good.as_slice(), b"x"].concat(),
        ];
        for bytes in garbage {
            std::fs::write(&stamp, &bytes).unwrap();
            assert!(!changed(&host, &driver));
            assert_eq!(std::fs::read(&stamp).unwrap(), good);
        }
        std::fs::remove_file(&stamp).unwrap();
        std::fs::create_dir_all(stamp.join("sub")).unwrap();
        assert!(!changed(&host, &driver));
        assert_eq!(std::fs::read(&stamp).unwrap(), good);
        std::fs::remove_file(&stamp).unwrap();
        nix::unistd::mkfifo(&stamp, Mode::from_bits_truncate(0o600)).unwrap();
        assert!(!changed(&host, &driver));
        assert_eq!(std::fs::read(&stamp).unwrap(), good);
        // Garbage and an edited tree: rebuilt.
        std::fs::write(&stamp, b"garbage").unwrap();
        std::fs::remove_file(tree_dir(dir.path()).join("usr/bin/nvidia-smi")).unwrap();
        assert!(changed(&host, &driver));
        assert!(tree_dir(dir.path()).join("usr/bin/nvidia-smi").is_file());
    }

    /// What a pre-start killed at any point leaves is repaired by the next: the stamp goes
    /// before the tree changes and is written last, so a tree without its stamp is walked.
    #[test]
    fn a_kill_while_building_or_stamping_is_repaired_by_the_next_start() {
        let (dir, host, driver) = host();
        let top = top_dir(dir.path());
        let stamp = stamp_path(dir.path());
        assert!(changed(&host, &driver));
        let first = std::fs::read(&stamp).unwrap();
        // Killed mid-build after a driver upgrade: half a new tree, a temp stamp, the old tree
        // unstamped (the stamp went first).
        let host_lib = dir.path().join(LIB).join("libcuda.so.9.1");
        std::fs::write(dir.path().join(LIB).join(".new"), b"ELF cuda 9.1 rebuilt").unwrap();
        std::fs::rename(dir.path().join(LIB).join(".new"), &host_lib).unwrap();
        std::fs::create_dir_all(top.join(".kube1.new/usr")).unwrap();
        std::fs::write(top.join(".kube1.stamp.tmp"), &first[..10]).unwrap();
        std::fs::remove_file(&stamp).unwrap();
        assert!(changed(&host, &driver));
        assert!(!top.join(".kube1.new").exists() && !top.join(".kube1.stamp.tmp").exists());
        assert_eq!(
            ino(&tree_dir(dir.path()).join(LIB).join("libcuda.so.9.1")),
            ino(&host_lib)
        );
        let second = std::fs::read(&stamp).unwrap();
        assert_ne!(first, second);
        assert_eq!(
            String::from_utf8(second.clone()).unwrap(),
            stamp_now(dir.path(), &host, &driver)
        );
        // Killed after the swap, before the stamp: the new tree is walked, found right, stamped.
        std::fs::remove_file(&stamp).unwrap();
        assert!(!changed(&host, &driver));
        assert_eq!(std::fs::read(&stamp).unwrap(), second);
        // A stamp of an earlier tree at the same plan (its top was another directory): walked.
        tick();
        std::fs::remove_file(tree_dir(dir.path()).join("usr/bin/nvidia-smi")).unwrap();
        assert!(changed(&host, &driver));
        std::fs::write(&stamp, &second).unwrap();
        assert!(!changed(&host, &driver));
        assert_ne!(std::fs::read(&stamp).unwrap(), second);
    }

    /// post-start's verification of the driver root failed: the stamp goes (the error is
    /// returned as it was), so the next pre-start walks the tree; no tree directory is fine.
    #[test]
    fn distrust_removes_the_stamp_and_keeps_the_error() {
        let (dir, host, driver) = host();
        let e = distrust(&host, "kube1", anyhow::anyhow!("driver root wrong"));
        assert_eq!(format!("{e:#}"), "driver root wrong");
        assert!(!top_dir(dir.path()).exists());
        assert!(changed(&host, &driver));
        let stamp = stamp_path(dir.path());
        assert!(stamp.is_file());
        let e = distrust(&host, "kube1", anyhow::anyhow!("driver root wrong"));
        assert_eq!(format!("{e:#}"), "driver root wrong");
        assert!(!stamp.exists());
        assert!(!changed(&host, &driver));
        assert!(stamp.is_file());
    }

    #[test]
    fn a_link_in_place_of_the_tree_is_replaced_not_followed() {
        let (dir, host, driver) = host();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("keep")).unwrap();
        let top = dir.path().join("var/lib/nspawn-lifecycle/driver-root");
        std::fs::create_dir_all(&top).unwrap();
        std::os::unix::fs::symlink(&elsewhere, top.join("kube1")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, top.join(".kube1.new")).unwrap();
        assert!(
            ensure(&host, "kube1", &mut plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
        assert!(elsewhere.join("keep").is_dir());
        assert!(top.join("kube1").symlink_metadata().unwrap().is_dir());
    }

    /// A driver file that is a link on the host (Debian's `/usr/bin/nvidia-smi` →
    /// `/etc/alternatives/…`, absolute) resolves inside the host root: the tree links the file it
    /// names there; one whose target is missing in the host root is refused by name, and the
    /// real `/etc/shadow` it names is never reached.
    #[test]
    fn a_host_driver_file_that_is_a_link_resolves_inside_the_host_root() {
        let (dir, host, driver) = host();
        let smi = dir.path().join("usr/bin/nvidia-smi");
        std::fs::remove_file(&smi).unwrap();
        std::fs::create_dir_all(dir.path().join("etc/alternatives")).unwrap();
        std::fs::create_dir_all(dir.path().join("usr/lib/nvidia")).unwrap();
        let real = dir.path().join("usr/lib/nvidia/nvidia-smi");
        std::fs::write(&real, b"real smi").unwrap();
        std::os::unix::fs::symlink(
            "/usr/lib/nvidia/nvidia-smi",
            dir.path().join("etc/alternatives/nvidia-smi"),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/alternatives/nvidia-smi", &smi).unwrap();
        ensure(&host, "kube1", &mut plan(&host, &driver).unwrap()).unwrap();
        assert_eq!(
            ino(&tree_dir(dir.path()).join("usr/bin/nvidia-smi")),
            ino(&real)
        );
        std::fs::remove_file(&smi).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", &smi).unwrap();
        let e = format!("{:#}", plan(&host, &driver).unwrap_err());
        assert!(
            e.contains("host driver file /usr/bin/nvidia-smi (resolving it)"),
            "{e}"
        );
    }

    /// No driver: the tree (and one older versions left on /run) goes, with the old driver's
    /// inodes it held; nothing is created on a host that never had one.
    #[test]
    fn remove_takes_the_tree_and_the_legacy_one_and_creates_nothing() {
        let (dir, host, driver) = host();
        assert!(!remove(&host, "kube1").unwrap());
        assert!(!dir.path().join("var/lib/nspawn-lifecycle").exists());
        ensure(&host, "kube1", &mut plan(&host, &driver).unwrap()).unwrap();
        let legacy = dir
            .path()
            .join("run/nspawn-lifecycle/driver-root/kube1/usr");
        std::fs::create_dir_all(&legacy).unwrap();
        std::fs::write(legacy.join("f"), b"").unwrap();
        assert!(stamp_path(dir.path()).is_file());
        assert!(remove(&host, "kube1").unwrap());
        assert!(!tree_dir(dir.path()).exists());
        assert!(!stamp_path(dir.path()).exists());
        assert!(!legacy.exists());
        assert!(dir.path().join(LIB).join("libcuda.so.9.1").is_file());
    }

    /// `uninstall`'s removal takes the stamp beside the tree too.
    #[test]
    fn remove_path_takes_the_stamp_too() {
        let (dir, host, driver) = host();
        assert!(changed(&host, &driver));
        assert!(stamp_path(dir.path()).is_file());
        let tree = "/var/lib/nspawn-lifecycle/driver-root/kube1";
        assert!(remove_path(&host, tree).unwrap());
        assert!(!stamp_path(dir.path()).exists() && !tree_dir(dir.path()).exists());
        assert!(!remove_path(&host, tree).unwrap());
    }

    /// Root only: a driver file on another filesystem than the tree (here a tmpfs mounted on the
    /// host's /usr/bin) cannot be hard-linked (EXDEV): it is a mount point with a read-only bind.
    #[test]
    fn privileged_a_file_on_another_filesystem_is_bound_instead() {
        assert!(nix::unistd::geteuid().is_root(), "this test mounts a tmpfs");
        let (dir, host, driver) = host();
        let bin = dir.path().join("usr/bin");
        nix::mount::mount(
            Some("tmpfs"),
            &bin,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        struct Umount<'a>(&'a Path);
        impl Drop for Umount<'_> {
            fn drop(&mut self) {
                let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        let _u = Umount(&bin);
        std::fs::write(bin.join("nvidia-smi"), b"smi").unwrap();
        let mut plan = plan(&host, &driver).unwrap();
        assert_eq!(
            plan.tree.get("usr/bin/nvidia-smi"),
            Some(&TreeNode::Bound("/usr/bin/nvidia-smi".into()))
        );
        assert!(ensure(&host, "kube1", &mut plan).unwrap().changed);
        let mp = tree_dir(dir.path()).join("usr/bin/nvidia-smi");
        let st = std::fs::symlink_metadata(&mp).unwrap();
        assert!(st.is_file() && st.len() == 0 && st.ino() != ino(&bin.join("nvidia-smi")));
        let binds: Vec<_> = layout::file_binds(&plan.tree)
            .unwrap()
            .into_iter()
            .map(|b| (b.source.to_string(), b.target.to_string()))
            .collect();
        assert_eq!(
            binds,
            [(
                "/usr/bin/nvidia-smi".to_owned(),
                "/run/nvidia/driver/usr/bin/nvidia-smi".to_owned()
            )]
        );
        // Unchanged next time: the mount point is not taken for a missing link.
        assert!(
            !ensure(&host, "kube1", &mut super::plan(&host, &driver).unwrap())
                .unwrap()
                .changed
        );
    }

    /// Root only: a file the kernel refuses to link (immutable: EPERM) is bound instead, named
    /// with its errno in [`Built::unlinked`].
    #[test]
    fn privileged_a_file_the_kernel_refuses_to_link_is_bound_and_named() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test sets the immutable flag"
        );
        let (dir, host, driver) = host();
        let smi = dir.path().join("usr/bin/nvidia-smi");
        let chattr = |flag: &str| {
            let ok = std::process::Command::new("chattr")
                .arg(flag)
                .arg(&smi)
                .status()
                .unwrap()
                .success();
            assert!(ok, "chattr {flag} failed");
        };
        chattr("+i");
        let mut plan = plan(&host, &driver).unwrap();
        let built = ensure(&host, "kube1", &mut plan);
        chattr("-i");
        let built = built.unwrap();
        // Not stamped: its plan says a hard link where it holds a mount point.
        assert!(!stamp_path(dir.path()).exists());
        assert_eq!(
            built.unlinked,
            [("usr/bin/nvidia-smi".to_owned(), Errno::EPERM)]
        );
        assert_eq!(
            plan.tree.get("usr/bin/nvidia-smi"),
            Some(&TreeNode::Bound("/usr/bin/nvidia-smi".into()))
        );
        let mp = tree_dir(dir.path()).join("usr/bin/nvidia-smi");
        assert_eq!(std::fs::symlink_metadata(&mp).unwrap().len(), 0);
        // The library beside it is still a link.
        let lib = tree_dir(dir.path()).join(LIB).join("libcuda.so.9.1");
        assert_eq!(ino(&lib), ino(&dir.path().join(LIB).join("libcuda.so.9.1")));
    }
}
