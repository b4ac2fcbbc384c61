//! The driver tree pre-start builds on the host for a machine, planned: every path of the
//! driver root and what it is (src/model/layout.rs), with each driver file's host identity as
//! stat'ed now and whether it can be hard-linked into the tree's filesystem or must be bound.
//! Reads only; src/apply/driver_tree.rs builds it.

use crate::discovery::UserspaceDriver;
use crate::fs::host::HostRoot;
use crate::model::layout::{self, Tree, TreeNode};
use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::sys::stat::FileStat;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};

/// A file's identity: device and inode.
pub(crate) type FileId = (u64, u64);

/// What pre-start will build: the tree, each driver file placed ([`TreeNode::Hard`] when it is
/// on the tree's filesystem, else [`TreeNode::Bound`]), and the identity of each host file as
/// stat'ed now, which the tree's hard links must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub tree: Tree,
    pub(crate) ids: BTreeMap<String, FileId>,
}

/// Plan `driver`'s tree for the host: stat every host driver file (a regular file; a link, such
/// as Debian's `/usr/bin/nvidia-smi` → `/etc/alternatives/…`, resolved inside the host root as
/// the host sees it) and the mount the tree is on, and bind what the kernel would refuse to
/// link (`linkable`). Reads only.
pub fn plan(host: &HostRoot, driver: &UserspaceDriver) -> Result<Plan> {
    let mut tree = layout::driver_tree(driver)?;
    let tree_fs = tree_mount(host)?;
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
        if !linkable(&st, &tree_fs) {
            *node = TreeNode::Bound(std::mem::take(source));
        }
    }
    Ok(Plan { tree, ids })
}

/// Whether the kernel would hard-link the file `st` into the tree on `tree`, as far as can be
/// known before trying: a file on another mount cannot be (`EXDEV`, whatever `st_dev` says:
/// overlayfs reports the upper layer's device for a file, a bind mount its source's); nor can an
/// immutable or append-only one (`EPERM`), nor one whose link count is at its filesystem's
/// limit (`EMLINK`). What stays unforeseeable (a flag set or a link made between this stat and
/// the link, an overlayfs copy-up) is bound by pre-start when it happens
/// (src/apply/driver_tree.rs).
fn linkable(st: &Statx, tree: &TreeFs) -> bool {
    let other_mount = st.mnt_id.is_some() && st.mnt_id != tree.mnt_id;
    let flags = (libc::STATX_ATTR_IMMUTABLE | libc::STATX_ATTR_APPEND).unsigned_abs();
    let refused_flags = st.attributes & u64::from(flags) != 0;
    !other_mount && !refused_flags && u64::from(st.nlink) < tree.link_max
}

/// What `statx` says of a file: device, inode, mode, link count, the attributes it reports
/// (immutable, append-only), and mount id (`None` before Linux 5.8).
struct Statx {
    dev: u64,
    ino: u64,
    mode: u32,
    nlink: u32,
    attributes: u64,
    mnt_id: Option<u64>,
}

/// nix 0.32 has no `statx`, and `fstatat` has no mount id.
#[allow(unsafe_code)]
fn statx(dir: &impl AsFd, path: &str, flags: libc::c_int) -> nix::Result<Statx> {
    use std::os::fd::AsRawFd as _;
    let c = std::ffi::CString::new(path).map_err(|_| Errno::EINVAL)?;
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    let mask = libc::STATX_TYPE | libc::STATX_INO | libc::STATX_NLINK | libc::STATX_MNT_ID;
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
        nlink: b.stx_nlink,
        attributes: b.stx_attributes & b.stx_attributes_mask,
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

/// The mount the tree is on and the most links its filesystem gives a file.
struct TreeFs {
    mnt_id: Option<u64>,
    link_max: u64,
}

/// Links per file: ext2/3/4's `EXT4_LINK_MAX`, btrfs's `BTRFS_LINK_MAX`, XFS's `XFS_MAXLINK`;
/// no limit known for another filesystem (tmpfs has none).
fn link_max(fs: nix::sys::statfs::FsType) -> u64 {
    use nix::sys::statfs::{BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC};
    match fs {
        EXT4_SUPER_MAGIC => 65_000,
        BTRFS_SUPER_MAGIC => 65_535,
        XFS_SUPER_MAGIC => (1 << 31) - 1,
        _ => u64::MAX,
    }
}

/// The mount [`layout::TREE_HOST_DIR`] is on (or will be: its nearest existing ancestor's).
fn tree_mount(host: &HostRoot) -> Result<TreeFs> {
    let mut p = std::path::PathBuf::from(layout::TREE_HOST_DIR);
    loop {
        match host.open_dir(&p) {
            Ok(fd) => {
                let shown = || format!("stat {}", host.path(&p).display());
                return Ok(TreeFs {
                    mnt_id: statx(&fd, "", libc::AT_EMPTY_PATH)
                        .with_context(shown)?
                        .mnt_id,
                    link_max: link_max(
                        nix::sys::statfs::fstatfs(&fd)
                            .with_context(shown)?
                            .filesystem_type(),
                    ),
                });
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
pub(crate) fn resolve(host: &HostRoot, source: &str) -> Result<(OwnedFd, FileStat)> {
    let fd = host
        .pin(source)
        .with_context(|| format!("host driver file {source} (resolving it)"))?;
    let st = nix::sys::stat::fstat(&fd).with_context(|| format!("stat {source}"))?;
    Ok((fd, st))
}
