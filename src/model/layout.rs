//! Where host driver files appear inside the machine: the driver root, laid out as a driver install.
//!
//! One mapping shared by the `.nspawn` renderer, pre-start's host tree (src/apply/driver_tree.rs),
//! post-start's check of the driver root, its links into it, and the CDI spec (which points at the
//! tree's files).
//!
//! The driver root `/run/nvidia/driver` is pre-start's host tree ([`driver_tree`]) bound
//! read-only ([`tree_bind`]): each library at `usr/lib/<triplet>/<name>`, each binary at
//! `usr/bin/<name>`, the firmware directory at `lib/firmware/nvidia/<version>`, the daemons'
//! socket directories at `run/<name>`. Each driver file is a hard link of the host file in the
//! tree ([`TreeNode::Hard`]: the very host inode, a real file at its standard name), or, when it
//! cannot be linked (another filesystem), an empty mount point with a read-only bind of the file
//! ([`TreeNode::Bound`], [`file_binds`]); the two directories are binds ([`dir_binds`]). Each
//! SONAME is a link in the tree to the library file beside it, as `ldconfig` makes it on a real
//! install. Every name resolves inside the tree, so the tree works wherever it is seen: at
//! `/run/nvidia/driver` in the machine, or bound at `/driver-root` in a pod (what the NVIDIA
//! device plugin, GPU Operator and `nvidia-ctk --driver-root` do). Library files must be real
//! files at their standard names: `nvidia-ctk` resolves links and mounts a library at its
//! resolved path, so a link to a bound host directory elsewhere in the tree would move the
//! library in every container. The tree exists complete from the first instant of the
//! boot and changes only with the machine, so no service can see it half-built or stale. Each
//! mount costs the machine's systemd a mount unit at boot and an unmount at shutdown, hence hard
//! links rather than a bind per file, and no bind per name.

use crate::discovery::UserspaceDriver;
use crate::types::machine_name::MachineName;
use crate::types::paths::{HostPath, MachinePath};
use anyhow::Result;
use std::collections::BTreeSet;

/// The legacy layout's directory of whole host directories bound into a machine (`lib/<n>`,
/// `bin/`, …). Nothing is bound there; links into it found in a machine are stale and removed.
pub(crate) const LEGACY_HOST_NVIDIA: &str = "/run/host-nvidia";
/// The driver root in the machine: shaped like a host driver install, made of bind mounts.
pub(crate) const DRIVER_ROOT: &str = "/run/nvidia/driver";

/// Where the machine sees this helper, bound read-only from its stable host path at every start:
/// the CDI spec names it as the OCI hook binary (`cdi-hook …`), since the machine has no
/// `nvidia-cdi-hook`. Outside [`DRIVER_ROOT`] so the driver binds never touch it.
pub const HOOK_BINARY: &str = "/run/nspawn-lifecycle/nspawn-lifecycle-helper";

/// The bind of the helper at `helper` (its stable host path) to [`HOOK_BINARY`].
pub(crate) fn hook_bind(helper: &HostPath) -> Bind {
    Bind {
        source: helper.clone(),
        target: HOOK_BINARY
            .parse()
            .expect("HOOK_BINARY is a valid machine path"),
        read_only: true,
        dir: false,
    }
}

/// A host path bound into the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: HostPath,
    pub target: MachinePath,
    pub read_only: bool,
    /// Whether the source is a directory (firmware, socket directories) rather than a file.
    pub dir: bool,
}

fn host_path(what: &str, p: String) -> Result<HostPath> {
    p.parse::<HostPath>().map_err(|e| {
        anyhow::anyhow!("{what} from host discovery cannot be bound into the machine: {e}")
    })
}

fn machine_path(what: &str, p: String) -> Result<MachinePath> {
    p.parse::<MachinePath>().map_err(|e| {
        anyhow::anyhow!("{what} from host discovery cannot be bound into the machine: {e}")
    })
}

/// Where pre-start builds each machine's driver tree on the host (`<this>/<machine>`), bound
/// read-only at [`DRIVER_ROOT`] by the `.nspawn` file. Its own directory, not beside `locks/` or
/// the unit gate, so no machine name can collide with them. On a disk filesystem, not the `/run`
/// tmpfs, so the tree can hold hard links of the driver files (the same filesystem as `/usr` on
/// a usual host); it outlives a reboot and is checked, and rebuilt if needed, at every pre-start.
pub(crate) const TREE_HOST_DIR: &str = "/var/lib/nspawn-lifecycle/driver-root";

/// Where versions before the hard links built the tree (tmpfs; its mount points are empty
/// files). pre-start and `uninstall` remove what is left of it.
pub(crate) const LEGACY_TREE_HOST_DIR: &str = "/run/nspawn-lifecycle/driver-root";

/// The host path of `machine`'s driver tree.
pub(crate) fn tree_host_path(machine: &MachineName) -> String {
    format!("{TREE_HOST_DIR}/{machine}")
}

/// The read-only bind of `machine`'s host tree at [`DRIVER_ROOT`]. systemd-nspawn sorts its binds
/// by target, so this one is made before the binds inside it ([`dir_binds`], [`file_binds`]),
/// whose mount points the tree holds.
pub fn tree_bind(machine: &MachineName) -> Result<Bind> {
    Ok(Bind {
        source: host_path("driver tree", tree_host_path(machine))?,
        target: machine_path("driver tree", DRIVER_ROOT.to_owned())?,
        read_only: true,
        dir: true,
    })
}

/// One node of the driver tree pre-start builds on the host (paths relative to its top).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum TreeNode {
    /// A directory: a parent of other nodes, or the mount point of a directory bind.
    Dir,
    /// A hard link of the host file at this absolute host path: the same inode, so a real file
    /// for every reader, and no mount.
    Hard(String),
    /// An empty file: the mount point of a read-only bind of the host file at this absolute host
    /// path (one that cannot be hard-linked into the tree: another filesystem).
    Bound(String),
    /// A relative symlink to a name in the same directory (a SONAME to its library file).
    Link(String),
    /// A file of these bytes, written by pre-start: the tree's own `etc/ld.so.cache`.
    File(Vec<u8>),
}

/// The driver tree: every path of [`DRIVER_ROOT`], relative to it, and what it is on the host.
/// With the directory binds (and any file binds) inside it, it is the driver root the machine
/// sees.
pub type Tree = std::collections::BTreeMap<String, TreeNode>;

/// The tree for `driver`: every driver file of [`driver_binds`] as a hard link of its host file
/// (pre-start turns the ones it cannot link into [`TreeNode::Bound`]), mount points for the
/// directory binds, their parent directories, and each SONAME as a link to its library file
/// beside it (what `ldconfig` makes on a real install, and what NVIDIA's tools resolve). A name
/// already taken (two host directories of one triplet: the first wins) is not linked again.
pub fn driver_tree(driver: &UserspaceDriver) -> Result<Tree> {
    let mut tree = Tree::new();
    let rel = |t: &str| -> String {
        t.strip_prefix(DRIVER_ROOT)
            .and_then(|r| r.strip_prefix('/'))
            .expect("driver binds are inside DRIVER_ROOT")
            .to_owned()
    };
    let add_parents = |tree: &mut Tree, p: &str| {
        let comps: Vec<&str> = p.split('/').collect();
        for i in 1..comps.len() {
            tree.insert(comps[..i].join("/"), TreeNode::Dir);
        }
    };
    for b in driver_binds(driver)? {
        let p = rel(b.target.as_str());
        add_parents(&mut tree, &p);
        let node = if b.dir {
            TreeNode::Dir
        } else {
            TreeNode::Hard(b.source.to_string())
        };
        tree.insert(p, node);
    }
    for e in driver_entries(driver) {
        if e.kind != EntryKind::SonameLink {
            continue;
        }
        let p = rel(&format!("{DRIVER_ROOT}{}", e.path));
        if tree.contains_key(&p) {
            continue;
        }
        machine_path("driver library SONAME", format!("{DRIVER_ROOT}/{p}"))?;
        let name = p.rsplit('/').next().unwrap_or(&p);
        if [".", ".."].contains(&name) || e.path.ends_with('/') {
            anyhow::bail!(
                "driver library SONAME {:?} cannot be a name in the tree",
                e.path
            );
        }
        tree.insert(p, TreeNode::Link(e.source));
    }
    add_runtime(&mut tree, driver)?;
    Ok(tree)
}

/// Where the tree's loader cache is, relative to the tree.
pub(crate) const TREE_LD_CACHE: &str = "etc/ld.so.cache";

/// The C runtime of the driver's tools (src/discovery/runtime.rs) as hard links of the host's
/// files, and a loader cache naming every library of the tree by SONAME at its path in the tree,
/// so the tools run in the tree as a root (`chroot <driver root> nvidia-smi`) wherever it is
/// seen. Without a runtime (no loader found) the tree holds neither: nothing could run in it.
fn add_runtime(tree: &mut Tree, driver: &UserspaceDriver) -> Result<()> {
    if driver.runtime.is_empty() {
        return Ok(());
    }
    for f in &driver.runtime {
        machine_path("C runtime file", format!("{DRIVER_ROOT}{}", f.path))?;
        let p = f.path.trim_start_matches('/').to_owned();
        let comps: Vec<&str> = p.split('/').collect();
        let parents_ok = (1..comps.len())
            .all(|i| matches!(tree.get(&comps[..i].join("/")), None | Some(TreeNode::Dir)));
        if tree.contains_key(&p) || !parents_ok {
            continue;
        }
        for i in 1..comps.len() {
            tree.insert(comps[..i].join("/"), TreeNode::Dir);
        }
        tree.insert(p, TreeNode::Hard(f.source.to_string()));
    }
    let runtime: BTreeSet<&str> = driver.runtime.iter().map(|f| f.path.as_str()).collect();
    let own_soname: BTreeSet<String> = driver
        .lib_dirs
        .iter()
        .flat_map(|d| {
            d.files
                .iter()
                .filter(|f| f.soname.is_none() && !f.name.contains('/'))
                .map(move |f| format!("usr/lib/{}/{}", d.triplet, f.name))
        })
        .collect();
    let mut entries = Vec::new();
    for (rel, node) in tree.iter() {
        let mut comps = rel.split('/');
        let (Some("usr"), Some("lib"), Some(_), Some(name), None) = (
            comps.next(),
            comps.next(),
            comps.next(),
            comps.next(),
            comps.next(),
        ) else {
            continue;
        };
        let abs = format!("/{rel}");
        let listed = matches!(node, TreeNode::Link(_))
            || runtime.contains(abs.as_str())
            || own_soname.contains(rel);
        if listed {
            entries.push(crate::discovery::ldcache::Entry::new(
                crate::discovery::ldcache::flags_for(&abs),
                name,
                &abs,
            ));
        }
    }
    let bytes =
        crate::discovery::ldcache::render(&crate::discovery::ldcache::merge(Vec::new(), &entries));
    tree.insert("etc".to_owned(), TreeNode::Dir);
    tree.insert(TREE_LD_CACHE.to_owned(), TreeNode::File(bytes));
    Ok(())
}

/// The host source of every driver file and directory in the driver root, in a stable order: per
/// library directory (discovery order) its files, then binaries, firmware, IPC socket
/// directories. Only the directories are bound into the machine ([`dir_binds`]); a file is a hard
/// link in the tree, or bound when it cannot be ([`file_binds`]). SONAME names are links in the
/// tree ([`driver_tree`]), never binds: each mount costs the machine's systemd a mount unit at
/// boot and an unmount at shutdown. A path of the tree has one source: of two host directories
/// for one triplet the first wins.
pub(crate) fn driver_binds(driver: &UserspaceDriver) -> Result<Vec<Bind>> {
    let mut binds = Vec::new();
    let mut seen = BTreeSet::new();
    let mut push = |binds: &mut Vec<Bind>, what: &str, source: String, target: String, dir| {
        if !seen.insert(target.clone()) {
            return Ok::<(), anyhow::Error>(());
        }
        binds.push(Bind {
            source: host_path(what, source)?,
            target: machine_path(what, target)?,
            read_only: true,
            dir,
        });
        Ok(())
    };
    for dir in &driver.lib_dirs {
        for f in &dir.files {
            push(
                &mut binds,
                "driver library",
                format!("{}/{}", dir.path, f.name),
                format!("{DRIVER_ROOT}/usr/lib/{}/{}", dir.triplet, f.name),
                false,
            )?;
        }
    }
    for bin in &driver.binaries {
        push(
            &mut binds,
            "driver binary",
            bin.to_string(),
            format!("{DRIVER_ROOT}/usr/bin/{}", basename(bin)),
            false,
        )?;
    }
    if let Some(fw) = &driver.firmware {
        push(
            &mut binds,
            "firmware directory",
            fw.to_string(),
            format!("{DRIVER_ROOT}/lib/firmware/nvidia/{}", driver.version),
            true,
        )?;
    }
    // Whole socket directories, not the sockets: a daemon restart replaces the socket inode,
    // which would leave a bind of the old socket dead. Read-only: connect(2) to a unix socket
    // needs write permission on the socket, not a writable mount, so clients still connect, while
    // the machine can no longer create, replace or remove files in the host daemons' directories.
    for dir in &driver.sockets {
        push(
            &mut binds,
            "socket directory",
            dir.to_string(),
            format!("{DRIVER_ROOT}/run/{}", basename(dir)),
            true,
        )?;
    }
    Ok(binds)
}

/// The binds of whole directories inside the driver tree (firmware, socket directories): a
/// directory cannot be hard-linked.
pub fn dir_binds(driver: &UserspaceDriver) -> Result<Vec<Bind>> {
    Ok(driver_binds(driver)?
        .into_iter()
        .filter(|b| b.dir)
        .collect())
}

/// The read-only binds of the files `tree` holds as mount points ([`TreeNode::Bound`]), in tree
/// order.
pub fn file_binds(tree: &Tree) -> Result<Vec<Bind>> {
    let mut out = Vec::new();
    for (rel, node) in tree {
        if let TreeNode::Bound(source) = node {
            out.push(Bind {
                source: host_path("driver file", source.clone())?,
                target: machine_path("driver file", format!("{DRIVER_ROOT}/{rel}"))?,
                read_only: true,
                dir: false,
            });
        }
    }
    Ok(out)
}

/// What a driver entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A library file (`source` is its path in the driver root).
    Library,
    /// A SONAME name: `source` is the file name of the library it names, in the same directory.
    /// In the driver root it is a bind of that library; in the machine's library directories
    /// and containers, a link or mount of it.
    SonameLink,
    /// An executable (`source` is its path in the driver root).
    Binary,
    /// The firmware directory (`source` is its path in the driver root).
    Firmware,
    /// An IPC socket (`source` is its path in the driver root).
    Socket,
}

/// One piece of a driver install, at its standard path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    /// Standard absolute path in a driver install or container: `/usr/lib/x86_64-linux-gnu/libcuda.so.1`.
    pub path: String,
    /// See [`EntryKind`].
    pub source: String,
}

/// The socket file name each IPC directory holds.
const SOCKET_NAME: &str = "socket";

/// Every piece of the driver at its standard path, in a stable order: per library directory its
/// files then their SONAME links, then binaries, firmware and sockets. A source in the driver
/// root is the standard path under [`DRIVER_ROOT`], where [`driver_binds`] puts the host file.
pub(crate) fn driver_entries(driver: &UserspaceDriver) -> Vec<Entry> {
    let mut out = Vec::new();
    for dir in &driver.lib_dirs {
        let std_dir = format!("/usr/lib/{}", dir.triplet);
        for f in &dir.files {
            let path = format!("{std_dir}/{}", f.name);
            out.push(Entry {
                kind: EntryKind::Library,
                source: format!("{DRIVER_ROOT}{path}"),
                path,
            });
        }
        for f in &dir.files {
            if let Some(soname) = &f.soname {
                let (sub, file) = split_dir(&f.name);
                out.push(Entry {
                    kind: EntryKind::SonameLink,
                    path: format!("{std_dir}/{sub}{soname}"),
                    source: file.to_owned(),
                });
            }
        }
    }
    for bin in &driver.binaries {
        let path = format!("/usr/bin/{}", basename(bin));
        out.push(Entry {
            kind: EntryKind::Binary,
            source: format!("{DRIVER_ROOT}{path}"),
            path,
        });
    }
    if driver.firmware.is_some() {
        let path = format!("/lib/firmware/nvidia/{}", driver.version);
        out.push(Entry {
            kind: EntryKind::Firmware,
            source: format!("{DRIVER_ROOT}{path}"),
            path,
        });
    }
    for dir in &driver.sockets {
        let path = format!("/run/{}/{SOCKET_NAME}", basename(dir));
        out.push(Entry {
            kind: EntryKind::Socket,
            source: format!("{DRIVER_ROOT}{path}"),
            path,
        });
    }
    out
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `vdpau/libx.so.1` → (`vdpau/`, `libx.so.1`); `libx.so.1` → (``, `libx.so.1`).
fn split_dir(name: &str) -> (&str, &str) {
    match name.rfind('/') {
        Some(i) => (&name[..=i], &name[i + 1..]),
        None => ("", name),
    }
}

#[cfg(test)]
mod tests {
    /// The configuration refuses mounts over the driver root by this path.
    #[test]
    fn the_configuration_knows_the_driver_root() {
        assert_eq!(super::DRIVER_ROOT, crate::config::DRIVER_ROOT);
    }

    use super::*;
    use crate::discovery::{DriverFile, LibDir};

    fn driver() -> UserspaceDriver {
        UserspaceDriver {
            version: "580.82.07".into(),
            lib_dirs: vec![LibDir {
                path: "/usr/lib/x86_64-linux-gnu".parse().unwrap(),
                triplet: "x86_64-linux-gnu".into(),
                files: vec![
                    DriverFile {
                        name: "libcuda.so.580.82.07".into(),
                        soname: Some("libcuda.so.1".into()),
                    },
                    DriverFile {
                        name: "vdpau/libvdpau_nvidia.so.580.82.07".into(),
                        soname: Some("libvdpau_nvidia.so.1".into()),
                    },
                ],
            }],
            binaries: vec!["/usr/bin/nvidia-smi".parse().unwrap()],
            firmware: Some("/lib/firmware/nvidia/580.82.07".parse().unwrap()),
            sockets: vec!["/run/nvidia-persistenced".parse().unwrap()],
            runtime: vec![],
        }
    }

    #[test]
    fn no_driver_bind_is_writable() {
        // The machine's root must not write into the host daemons' socket directories (or any
        // other driver path): every driver bind is read-only, sockets included.
        let mut d = driver();
        d.sockets.push("/run/nvidia-fabricmanager".parse().unwrap());
        let writable: Vec<_> = driver_binds(&d)
            .unwrap()
            .into_iter()
            .filter(|b| !b.read_only)
            .map(|b| b.source)
            .collect();
        assert!(writable.is_empty(), "writable driver binds: {writable:?}");
    }

    /// Every file of the driver root is a bind of a host file inside the tree,
    /// never a link out of it. One bind per file, not per name; the SONAMEs are links
    /// of the tree ([`driver_tree`]).
    #[test]
    fn the_driver_root_is_binds_of_host_files_at_every_name() {
        let binds = driver_binds(&driver()).unwrap();
        let got: Vec<_> = binds
            .iter()
            .map(|b| (b.source.as_str(), b.target.as_str(), b.dir))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07",
                    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07",
                    false
                ),
                (
                    "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.580.82.07",
                    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.580.82.07",
                    false
                ),
                (
                    "/usr/bin/nvidia-smi",
                    "/run/nvidia/driver/usr/bin/nvidia-smi",
                    false
                ),
                (
                    "/lib/firmware/nvidia/580.82.07",
                    "/run/nvidia/driver/lib/firmware/nvidia/580.82.07",
                    true
                ),
                (
                    "/run/nvidia-persistenced",
                    "/run/nvidia/driver/run/nvidia-persistenced",
                    true
                ),
            ]
        );
        assert!(
            binds
                .iter()
                .all(|b| !b.source.starts_with(LEGACY_HOST_NVIDIA)
                    && !b.target.starts_with(LEGACY_HOST_NVIDIA))
        );
    }

    /// The tree holds every driver file as a hard link of its host file, the mount
    /// points of the directory binds, their parents, and each SONAME as a link to the file beside
    /// it; nothing links out of its own directory. Only the directories are bound, and a file
    /// the tree cannot link becomes a bound mount point.
    #[test]
    fn the_tree_has_mount_points_and_soname_links_beside_their_files() {
        let tree = driver_tree(&driver()).unwrap();
        let got: Vec<_> = tree.iter().map(|(p, n)| (p.as_str(), n.clone())).collect();
        let l = |t: &str| TreeNode::Link(t.to_owned());
        let h = |s: &str| TreeNode::Hard(s.to_owned());
        assert_eq!(
            got,
            [
                ("lib", TreeNode::Dir),
                ("lib/firmware", TreeNode::Dir),
                ("lib/firmware/nvidia", TreeNode::Dir),
                ("lib/firmware/nvidia/580.82.07", TreeNode::Dir),
                ("run", TreeNode::Dir),
                ("run/nvidia-persistenced", TreeNode::Dir),
                ("usr", TreeNode::Dir),
                ("usr/bin", TreeNode::Dir),
                ("usr/bin/nvidia-smi", h("/usr/bin/nvidia-smi")),
                ("usr/lib", TreeNode::Dir),
                ("usr/lib/x86_64-linux-gnu", TreeNode::Dir),
                (
                    "usr/lib/x86_64-linux-gnu/libcuda.so.1",
                    l("libcuda.so.580.82.07")
                ),
                (
                    "usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07",
                    h("/usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07")
                ),
                ("usr/lib/x86_64-linux-gnu/vdpau", TreeNode::Dir),
                (
                    "usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.1",
                    l("libvdpau_nvidia.so.580.82.07")
                ),
                (
                    "usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.580.82.07",
                    h("/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.580.82.07")
                ),
            ]
        );
        let dirs: Vec<_> = dir_binds(&driver())
            .unwrap()
            .into_iter()
            .map(|b| b.target.to_string())
            .collect();
        assert_eq!(
            dirs,
            [
                "/run/nvidia/driver/lib/firmware/nvidia/580.82.07",
                "/run/nvidia/driver/run/nvidia-persistenced"
            ]
        );
        assert!(file_binds(&tree).unwrap().is_empty());
        let mut t = tree.clone();
        t.insert(
            "usr/bin/nvidia-smi".into(),
            TreeNode::Bound("/usr/bin/nvidia-smi".into()),
        );
        let fb: Vec<_> = file_binds(&t)
            .unwrap()
            .into_iter()
            .map(|b| (b.source.to_string(), b.target.to_string(), b.read_only))
            .collect();
        assert_eq!(
            fb,
            [(
                "/usr/bin/nvidia-smi".to_owned(),
                "/run/nvidia/driver/usr/bin/nvidia-smi".to_owned(),
                true
            )]
        );
        let b = tree_bind(&"kube1".parse().unwrap()).unwrap();
        assert_eq!(
            (b.source.as_str(), b.target.as_str(), b.read_only, b.dir),
            (
                "/var/lib/nspawn-lifecycle/driver-root/kube1",
                DRIVER_ROOT,
                true,
                true
            )
        );
    }

    #[test]
    fn every_entry_source_is_in_the_driver_root_where_a_bind_puts_it() {
        let d = driver();
        let targets: Vec<String> = driver_binds(&d)
            .unwrap()
            .into_iter()
            .map(|b| b.target.to_string())
            .collect();
        for e in driver_entries(&d) {
            match e.kind {
                EntryKind::SonameLink => {
                    let lib = format!("{}/{}", e.path.rsplit_once('/').unwrap().0, e.source);
                    assert!(
                        driver_entries(&d)
                            .iter()
                            .any(|l| l.kind == EntryKind::Library && l.path == lib),
                        "{e:?}"
                    );
                    let tree = driver_tree(&d).unwrap();
                    assert_eq!(
                        tree.get(e.path.trim_start_matches('/')),
                        Some(&TreeNode::Link(e.source.clone())),
                        "{e:?}"
                    );
                }
                EntryKind::Socket => assert!(
                    targets
                        .iter()
                        .any(|t| e.source.starts_with(&format!("{t}/"))),
                    "{e:?}"
                ),
                _ => {
                    assert_eq!(e.source, format!("{DRIVER_ROOT}{}", e.path));
                    assert!(targets.contains(&e.source), "{e:?}");
                }
            }
        }
    }

    #[test]
    fn two_host_dirs_of_one_triplet_bind_each_name_once_first_wins() {
        let mut d = driver();
        let mut second = d.lib_dirs[0].clone();
        second.path = "/usr/local/nvidia/lib".parse().unwrap();
        d.lib_dirs.push(second);
        let binds = driver_binds(&d).unwrap();
        let cuda: Vec<_> = binds
            .iter()
            .filter(|b| b.target.ends_with("/libcuda.so.580.82.07"))
            .map(|b| b.source.as_str())
            .collect();
        assert_eq!(cuda, ["/usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07"]);
    }

    #[test]
    fn a_file_name_no_bind_can_carry_is_refused_by_name() {
        let mut d = driver();
        d.lib_dirs[0].files.push(DriverFile {
            name: "libnvidia-x\n.so.580.82.07".into(),
            soname: None,
        });
        let e = format!("{:#}", driver_binds(&d).unwrap_err());
        assert!(
            e.contains("driver library") && e.contains("libnvidia-x\\n"),
            "{e}"
        );
    }
}
