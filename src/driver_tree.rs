//! The driver tree on the host: pre-start builds each machine's [`layout::Tree`] under
//! [`layout::TREE_HOST_DIR`]`/<machine>` before the machine boots; its `.nspawn` file binds it
//! read-only at `/run/nvidia/driver` and the per-file binds land on the mount points it holds.
//!
//! The tree is made of directories, empty mount-point files and SONAME links relative to their
//! own directory, so every name resolves inside it wherever it is seen. It is built fresh beside
//! the current one and swapped in with one `renameat2(RENAME_EXCHANGE)`, so a reader (nspawn)
//! sees the old tree or the new, never half of one; a tree that is already exactly right is left
//! alone (the usual restart: nothing is written). Every step goes through directory descriptors
//! opened with `O_NOFOLLOW` below [`host_dir::open`]'s verified directory, so no link anyone
//! placed there is followed.

use crate::host::HostRoot;
use crate::host_dir;
use crate::layout::{self, Tree, TreeNode};
use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::UnlinkatFlags;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};

const DIR_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o644;

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Make `machine`'s host tree exactly `tree`. Returns whether anything was written.
pub fn ensure(host: &HostRoot, machine: &str, tree: &Tree) -> Result<bool> {
    let top = host_dir::open(host, layout::TREE_HOST_DIR, DIR_MODE)?;
    let shown = host.path(layout::tree_host_path(machine));
    let (new, old) = (format!(".{machine}.new"), format!(".{machine}.old"));
    // What a killed pre-start left.
    for leftover in [&new, &old] {
        remove_tree(top.fd(), leftover)
            .with_context(|| format!("removing {}/{leftover}", top.path().display()))?;
    }
    let current = match nix::fcntl::openat(top.fd(), machine, dir_flags(), Mode::empty()) {
        Ok(fd) => Some(fd),
        Err(Errno::ENOENT) => None,
        Err(Errno::ELOOP | Errno::ENOTDIR) => {
            // Not a directory we made: replaced below, never followed.
            remove_tree(top.fd(), machine)
                .with_context(|| format!("removing {}", shown.display()))?;
            None
        }
        Err(e) => return Err(e).with_context(|| format!("opening {}", shown.display())),
    };
    if let Some(fd) = &current
        && read_tree(fd).with_context(|| format!("reading {}", shown.display()))? == *tree
    {
        return Ok(false);
    }
    nix::sys::stat::mkdirat(top.fd(), new.as_str(), Mode::from_bits_truncate(DIR_MODE))
        .with_context(|| format!("creating {}/{new}", top.path().display()))?;
    let fd = nix::fcntl::openat(top.fd(), new.as_str(), dir_flags(), Mode::empty())
        .with_context(|| format!("opening {}/{new}", top.path().display()))?;
    fix_mode(&fd, DIR_MODE)?;
    build(&fd, tree).with_context(|| format!("building {}/{new}", top.path().display()))?;
    if current.is_some() {
        nix::fcntl::renameat2(
            top.fd(),
            new.as_str(),
            top.fd(),
            machine,
            RenameFlags::RENAME_EXCHANGE,
        )
        .with_context(|| format!("swapping in {}", shown.display()))?;
        // `new` now holds the old tree.
        remove_tree(top.fd(), &new)
            .with_context(|| format!("removing the old {}", shown.display()))?;
    } else {
        nix::fcntl::renameat2(
            top.fd(),
            new.as_str(),
            top.fd(),
            machine,
            RenameFlags::RENAME_NOREPLACE,
        )
        .with_context(|| format!("renaming into {}", shown.display()))?;
    }
    Ok(true)
}

fn fix_mode(fd: &OwnedFd, mode: u32) -> Result<()> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode)).context("chmod")?;
    Ok(())
}

/// Create every node of `tree` (parents sort before their children) under the directory `top`.
fn build(top: &OwnedFd, tree: &Tree) -> Result<()> {
    let mut dirs: BTreeMap<&str, OwnedFd> = BTreeMap::new();
    for (path, node) in tree {
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
                dirs.insert(path, fd);
            }
            TreeNode::File => {
                let fd = nix::fcntl::openat(
                    parent,
                    name,
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(FILE_MODE),
                )
                .with_context(|| format!("creating {path}"))?;
                fix_mode(&fd, FILE_MODE)?;
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
    Ok(())
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

/// What is under the directory `fd`, as a [`Tree`]; anything that is not one of its node kinds
/// (a non-empty file, a device, a name that is not UTF-8) is recorded as a link to a name no
/// tree can hold, so it never compares equal.
fn read_tree(fd: &OwnedFd) -> Result<Tree> {
    let mut tree = Tree::new();
    let mut stack = vec![(String::new(), fd.try_clone().context("dup")?)];
    let odd = || TreeNode::Link("/".to_owned());
    while let Some((prefix, dir)) = stack.pop() {
        for name in names(&dir)? {
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let st = nix::sys::stat::fstatat(&dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .with_context(|| format!("stat {rel}"))?;
            let node = match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
                SFlag::S_IFDIR => {
                    let sub = nix::fcntl::openat(&dir, name.as_str(), dir_flags(), Mode::empty())
                        .with_context(|| format!("opening {rel}"))?;
                    stack.push((rel.clone(), sub));
                    TreeNode::Dir
                }
                SFlag::S_IFREG if st.st_size == 0 => TreeNode::File,
                SFlag::S_IFLNK => match nix::fcntl::readlinkat(&dir, name.as_str()) {
                    Ok(t) => t.into_string().map_or_else(|_| odd(), TreeNode::Link),
                    Err(e) => return Err(e).with_context(|| format!("readlink {rel}")),
                },
                _ => odd(),
            };
            tree.insert(rel, node);
        }
    }
    Ok(tree)
}

/// Remove `name` in `parent` and everything under it, never following a link. Returns whether
/// it existed.
fn remove_tree(parent: &impl AsFd, name: &str) -> Result<bool> {
    let st = match nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("stat {name}")),
    };
    if st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFDIR.bits() {
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
    use std::os::unix::fs::MetadataExt as _;

    fn tree() -> Tree {
        let mut t = Tree::new();
        t.insert("usr".into(), TreeNode::Dir);
        t.insert("usr/lib".into(), TreeNode::Dir);
        t.insert(
            "usr/lib/libcuda.so.1".into(),
            TreeNode::Link("libcuda.so.9".into()),
        );
        t.insert("usr/lib/libcuda.so.9".into(), TreeNode::File);
        t.insert("run".into(), TreeNode::Dir);
        t.insert("run/nvidia-persistenced".into(), TreeNode::Dir);
        t
    }

    #[test]
    fn built_once_then_left_alone_then_swapped_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let p = dir.path().join("run/nspawn-lifecycle/driver-root/kube1");
        assert!(ensure(&host, "kube1", &tree()).unwrap());
        assert_eq!(
            std::fs::read_link(p.join("usr/lib/libcuda.so.1")).unwrap(),
            std::path::Path::new("libcuda.so.9")
        );
        let ino = std::fs::metadata(&p).unwrap().ino();
        assert!(!ensure(&host, "kube1", &tree()).unwrap());
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino);
        let mut t = tree();
        t.remove("usr/lib/libcuda.so.1");
        assert!(ensure(&host, "kube1", &t).unwrap());
        assert!(!p.join("usr/lib/libcuda.so.1").exists());
        assert!(
            !dir.path()
                .join("run/nspawn-lifecycle/driver-root/.kube1.new")
                .exists()
        );
        // Something else put in the tree makes it differ: rebuilt.
        std::fs::write(p.join("usr/lib/extra"), b"x").unwrap();
        assert!(ensure(&host, "kube1", &t).unwrap());
        assert!(!p.join("usr/lib/extra").exists());
    }

    #[test]
    fn a_link_in_place_of_the_tree_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("keep")).unwrap();
        let top = dir.path().join("run/nspawn-lifecycle/driver-root");
        std::fs::create_dir_all(&top).unwrap();
        std::os::unix::fs::symlink(&elsewhere, top.join("kube1")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, top.join(".kube1.new")).unwrap();
        assert!(ensure(&host, "kube1", &tree()).unwrap());
        assert!(elsewhere.join("keep").is_dir());
        assert!(top.join("kube1").symlink_metadata().unwrap().is_dir());
    }
}
