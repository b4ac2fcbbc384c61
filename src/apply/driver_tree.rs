//! The driver tree on the host: pre-start builds each machine's [`layout::Tree`] under
//! [`layout::TREE_HOST_DIR`]`/<machine>` before the machine boots; its `.nspawn` file binds it
//! read-only at `/run/nvidia/driver`, with the directory binds (and any file binds) on the mount
//! points it holds.
//!
//! The tree is made of directories, hard links of the host's driver files (the very host inodes:
//! real files at their standard names, no mount each), and SONAME links relative to their own
//! directory, so every name resolves inside it wherever it is seen. A file that cannot be linked
//! is an empty mount point with a read-only bind of the file instead: [`plan`] foresees a file on
//! another mount than the tree, an immutable or append-only one, and one at its filesystem's
//! link limit; one the kernel still refuses when linking (a flag set since the plan, an
//! overlayfs copy-up: `EPERM`, `EXDEV`, …) is bound by [`ensure`], which names it and the errno.
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

use crate::fs::host::HostRoot;
use crate::fs::host_dir;
use crate::model::layout::{self, TreeNode};
use crate::model::tree::{FileId, Plan, resolve};
use crate::types::machine_name::MachineName;
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

fn id(st: &FileStat) -> FileId {
    (st.st_dev, st.st_ino)
}

fn is_kind(st: &FileStat, kind: SFlag) -> bool {
    st.st_mode & SFlag::S_IFMT.bits() == kind.bits()
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

/// Make `machine`'s host tree exactly `plan.tree`; a file the kernel refuses to link becomes a
/// bound mount point, in the tree and in [`Built::unlinked`]. A tree whose stamp matches is not
/// read; one walked and found right is stamped; one rebuilt is stamped once it is in place.
pub fn ensure(host: &HostRoot, machine: &MachineName, plan: &mut Plan) -> Result<Built> {
    // Whether the tree is right is [`observe`]'s to say, for pre-start's diff and here alike.
    let seen = observe(host, machine, plan)?;
    let top = host_dir::open(host, layout::TREE_HOST_DIR, DIR_MODE)?;
    let shown = host.path(layout::tree_host_path(machine));
    let [new, old] = leftover_names(machine);
    // What a killed pre-start left.
    for leftover in [&new, &old] {
        remove_tree(top.fd(), leftover)
            .with_context(|| format!("removing {}/{leftover}", top.path().display()))?;
    }
    match seen.state {
        TreeState::Stamped => return Ok(Built::default()),
        TreeState::Unstamped => {
            if let Some(text) = &seen.stamp {
                write_stamp(top.fd(), machine, text)
                    .with_context(|| format!("stamping {}", shown.display()))?;
            }
            return Ok(Built::default());
        }
        TreeState::Differs | TreeState::Missing => {}
    }
    let current = open_current(&top, machine, &shown)?;
    forget_at(top.fd(), machine.as_str())
        .with_context(|| format!("forgetting {}", shown.display()))?;
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
    nix::fcntl::renameat2(top.fd(), new.as_str(), top.fd(), machine.as_str(), flags)
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

/// `machine`'s tree as found against a plan ([`observe`]): what [`ensure`] would do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeState {
    /// Its stamp says `plan` (the usual restart: only the stamp and the directories are read).
    Stamped,
    /// Walked and found exactly `plan`, with no stamp saying so: [`ensure`] stamps it.
    Unstamped,
    /// Not `plan` (not a directory, or an entry differs): [`ensure`] builds it afresh.
    Differs,
    /// No tree: [`ensure`] builds it.
    Missing,
}

/// What [`observe`] read: the tree, and what a killed pre-start left beside it (host paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSeen {
    pub state: TreeState,
    pub leftovers: Vec<String>,
    /// The stamp the tree has now ([`stamp_text`]), taken before the walk, so an edit after it
    /// shows in the next start's stamp: what [`ensure`] writes for [`TreeState::Unstamped`].
    stamp: Option<String>,
}

/// `machine`'s tree against `plan`, as [`ensure`] judges it (the same stamp, the same walk),
/// and the leftovers [`ensure`] removes first. Reads only, below the verified tree directory.
pub fn observe(host: &HostRoot, machine: &MachineName, plan: &Plan) -> Result<TreeSeen> {
    let Some(top) = host_dir::check(host, layout::TREE_HOST_DIR, DIR_MODE)? else {
        return Ok(TreeSeen {
            state: TreeState::Missing,
            leftovers: Vec::new(),
            stamp: None,
        });
    };
    let shown = host.path(layout::tree_host_path(machine));
    let leftovers = leftover_names(machine)
        .into_iter()
        .filter(|n| {
            nix::sys::stat::fstatat(top.fd(), n.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
        })
        .map(|n| format!("{}/{n}", layout::TREE_HOST_DIR))
        .collect();
    let (state, stamp) =
        match nix::fcntl::openat(top.fd(), machine.as_str(), dir_flags(), Mode::empty()) {
            Err(Errno::ENOENT) => (TreeState::Missing, None),
            Err(Errno::ELOOP | Errno::ENOTDIR) => (TreeState::Differs, None),
            Err(e) => return Err(e).with_context(|| format!("opening {}", shown.display())),
            Ok(fd) => {
                let now = stamp_text(top.fd(), machine, plan);
                let state = if now
                    .as_deref()
                    .is_some_and(|t| stamp_reads(top.fd(), machine, t))
                {
                    TreeState::Stamped
                } else if matches(&fd, plan)
                    .with_context(|| format!("reading {}", shown.display()))?
                {
                    TreeState::Unstamped
                } else {
                    TreeState::Differs
                };
                (state, now)
            }
        };
    Ok(TreeSeen {
        state,
        leftovers,
        stamp,
    })
}

/// What [`remove`] would remove (host paths). Reads only.
pub fn remains(host: &HostRoot, machine: &MachineName) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for dir in [layout::TREE_HOST_DIR, layout::LEGACY_TREE_HOST_DIR] {
        let Some(top) = open_existing(host, dir)? else {
            continue;
        };
        for name in removed_names(machine) {
            if nix::sys::stat::fstatat(&top, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
                out.push(format!("{dir}/{name}"));
            }
        }
    }
    Ok(out)
}

/// The names [`remove`] removes in each tree directory.
fn removed_names(machine: &MachineName) -> [String; 5] {
    let [new, old] = leftover_names(machine);
    [
        machine.to_string(),
        new,
        old,
        stamp_name(machine.as_str()),
        stamp_tmp_name(machine.as_str()),
    ]
}

/// Where [`ensure`] builds the new tree and what a killed one left: `.<machine>.new`,
/// `.<machine>.old`.
fn leftover_names(machine: &MachineName) -> [String; 2] {
    [format!(".{machine}.new"), format!(".{machine}.old")]
}

/// The machine's current tree, if it is a directory; anything else at its name is removed
/// (replaced below, never followed).
fn open_current(
    top: &host_dir::HostDir,
    machine: &MachineName,
    shown: &std::path::Path,
) -> Result<Option<OwnedFd>> {
    match nix::fcntl::openat(top.fd(), machine.as_str(), dir_flags(), Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        Err(Errno::ELOOP | Errno::ENOTDIR) => {
            remove_tree(top.fd(), machine.as_str())
                .with_context(|| format!("removing {}", shown.display()))?;
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("opening {}", shown.display())),
    }
}

/// Remove `machine`'s tree, and what versions before the hard links left on `/run`. Returns
/// whether there was anything. Creates nothing: a host without a tree stays without one.
pub fn remove(host: &HostRoot, machine: &MachineName) -> Result<bool> {
    let mut any = false;
    for dir in [layout::TREE_HOST_DIR, layout::LEGACY_TREE_HOST_DIR] {
        let Some(top) = open_existing(host, dir)? else {
            continue;
        };
        for name in removed_names(machine) {
            any |= remove_tree(&top, &name)
                .with_context(|| format!("removing {}", host.path(dir).join(&name).display()))?;
        }
    }
    Ok(any)
}

/// Remove the tree at `path` (a host path: `uninstall`) and its stamp, never following a link
/// below its parent. Returns whether the tree existed.
pub(crate) fn remove_path(host: &HostRoot, abs: &str) -> Result<bool> {
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
fn stamp_text(top: &OwnedFd, machine: &MachineName, plan: &Plan) -> Option<String> {
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
    machine: &MachineName,
    rel: &str,
    kind: SFlag,
) -> Option<()> {
    use std::fmt::Write as _;
    let path = if rel.is_empty() {
        machine.to_string()
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
fn stamp_reads(top: &OwnedFd, machine: &MachineName, want: &str) -> bool {
    use std::io::Read as _;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let Ok(fd) = nix::fcntl::openat(
        top,
        stamp_name(machine.as_str()).as_str(),
        flags,
        Mode::empty(),
    ) else {
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
fn write_stamp(top: &OwnedFd, machine: &MachineName, text: &str) -> Result<()> {
    forget_at(top, machine.as_str())?;
    let tmp = stamp_tmp_name(machine.as_str());
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
        &stamp_name(machine.as_str()),
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

/// post-start found `machine`'s driver root wrong (`err`, from its driver root check, [`crate::model::driver_root::diff`]):
/// remove the stamp of its host tree, so the next pre-start walks the tree entry by entry
/// instead of trusting it (and rebuilds what differs). Returns `err`, with a failure to remove
/// the stamp added to it.
pub(crate) fn distrust(
    host: &HostRoot,
    machine: &MachineName,
    err: anyhow::Error,
) -> anyhow::Error {
    let forgot = open_existing(host, layout::TREE_HOST_DIR)
        .and_then(|top| top.map_or(Ok(false), |top| forget_at(&top, machine.as_str())));
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
mod tests;
