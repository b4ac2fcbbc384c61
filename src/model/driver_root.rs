//! The driver root `/run/nvidia/driver` a machine must have been started with, read and compared.
//!
//! It is not built in the machine: it is pre-start's host tree of hard links of the driver files,
//! which systemd-nspawn binds read-only at boot (src/model/layout.rs, src/apply/driver_tree.rs), so it exists
//! whole before any service of the machine starts and changes only with the machine. What it
//! must be is known from the tree pre-start plans for the host ([`Expected::from_ids`]: every
//! driver file and directory discovery names, as the host inode it must be); what it is, from a walk through the machine's root
//! ([`observe`]); the difference ([`diff`]) is pure. Only a new start can mend a difference.

use crate::discovery::UserspaceDriver;
use crate::fs::host::HostRoot;
use crate::fs::machine_root::{FileKind, Lookup, MachineDir, MachineRoot, Subdir};
use crate::model::layout::{DRIVER_ROOT, Tree, TreeNode, driver_binds};
use crate::model::tree::Plan;
use anyhow::{Context as _, Result, bail};
use std::collections::{BTreeMap, BTreeSet};

/// Most paths of each kind one mismatch spells out.
const MAX_NAMED: usize = 10;

/// What a driver-root path must be: the host file or directory with this identity (a hard link
/// of the file in pre-start's tree, or a bind: both show the host's device and inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wanted {
    dev: u64,
    ino: u64,
    dir: bool,
}

/// The driver root as it must be, relative to [`DRIVER_ROOT`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    version: String,
    /// Driver files and directories: the host identity each must have.
    files: BTreeMap<String, Wanted>,
    /// SONAME names: links in the tree to the library file beside them (src/model/layout.rs).
    links: BTreeMap<String, String>,
    /// Files pre-start writes (the tree's loader cache): their bytes.
    contents: BTreeMap<String, Vec<u8>>,
    /// Directories that only hold the above.
    parents: BTreeSet<String>,
}

/// The device and inode of each host file or directory a driver root is made of, by host path.
pub(crate) type HostIds = BTreeMap<String, (u64, u64)>;

/// What a driver root holds for `driver` built as `tree` (its plan, [`crate::model::tree`]), by
/// path in the tree: its SONAME links, the files pre-start writes (their bytes), and the host
/// sources it binds or links (path, host path, whether a directory).
type Parts = (
    BTreeMap<String, String>,
    BTreeMap<String, Vec<u8>>,
    Vec<(String, String, bool)>,
);

fn parts(driver: &UserspaceDriver, tree: &Tree) -> Result<Parts> {
    let (mut links, mut contents, mut sources) = (BTreeMap::new(), BTreeMap::new(), Vec::new());
    for (p, n) in tree {
        match n {
            TreeNode::Link(t) => {
                links.insert(p.clone(), t.clone());
            }
            TreeNode::File(bytes) => {
                contents.insert(p.clone(), bytes.clone());
            }
            TreeNode::Hard(source) | TreeNode::Bound(source) => {
                sources.push((p.clone(), source.clone(), false));
            }
            TreeNode::Dir => {}
        }
    }
    for b in driver_binds(driver)?.into_iter().filter(|b| b.dir) {
        let rel = b
            .target
            .strip_prefix(DRIVER_ROOT)
            .and_then(|r| r.strip_prefix('/'))
            .with_context(|| format!("bind target {} is outside {DRIVER_ROOT}", b.target))?
            .to_owned();
        sources.push((rel, b.source.to_string(), true));
    }
    Ok((links, contents, sources))
}

/// The facts a driver root is checked against: the identity of every host source of `driver`,
/// the files' as the tree's plan stat'ed them, the directories it binds stat'ed now.
pub(crate) fn host_ids(host: &HostRoot, driver: &UserspaceDriver, plan: &Plan) -> Result<HostIds> {
    let mut ids = HostIds::new();
    for (_, source, _) in parts(driver, &plan.tree)?.2 {
        if let Some(id) = plan.ids.get(&source) {
            ids.insert(source, *id);
            continue;
        }
        let st = host.metadata(source.as_str()).with_context(|| {
            format!(
                "host driver file {source} (stat {})",
                host.path(source.as_str()).display()
            )
        })?;
        ids.insert(
            source,
            (
                std::os::unix::fs::MetadataExt::dev(&st),
                std::os::unix::fs::MetadataExt::ino(&st),
            ),
        );
    }
    Ok(ids)
}

impl Expected {
    /// The driver root as it must be for `driver` built as `tree` with the host's files `ids`
    /// ([`host_ids`]). Pure; a source `ids` does not name is an error (the facts are of another
    /// driver).
    pub(crate) fn from_ids(
        driver: &UserspaceDriver,
        tree: &Tree,
        ids: &HostIds,
    ) -> Result<Expected> {
        let (links, contents, sources) = parts(driver, tree)?;
        let mut files = BTreeMap::new();
        for (rel, source, dir) in sources {
            let (dev, ino) = *ids
                .get(&source)
                .with_context(|| format!("no identity of host driver file {source} (a bug)"))?;
            files.insert(rel, Wanted { dev, ino, dir });
        }
        let mut parents = BTreeSet::new();
        for p in links.keys().chain(files.keys()).chain(contents.keys()) {
            let comps: Vec<&str> = p.split('/').collect();
            for i in 1..comps.len() {
                parents.insert(comps[..i].join("/"));
            }
        }
        Ok(Expected {
            version: driver.version.clone(),
            files,
            links,
            contents,
            parents,
        })
    }

    /// [`Expected::from_ids`] for the tree planned for the host now.
    pub fn of(host: &HostRoot, driver: &UserspaceDriver) -> Result<Expected> {
        let plan = crate::model::tree::plan(host, driver)?;
        Expected::from_ids(driver, &plan.tree, &host_ids(host, driver, &plan)?)
    }

    /// How many entries the check compares.
    pub fn len(&self) -> usize {
        self.files.len() + self.links.len() + self.contents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One entry of the driver root as found (never following a link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    kind: FileKind,
    dev: u64,
    ino: u64,
    /// A link's target.
    target: Option<std::ffi::OsString>,
    /// A file's bytes, read only where [`Expected`] names contents and the size matches.
    bytes: Option<Vec<u8>>,
}

/// The driver root in the machine, as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Not there (or a parent is missing).
    Missing,
    /// Something else than a directory holds its name (or its parent's): why it is unusable.
    NotDir(String),
    /// A directory: whether it is read-only, every entry below it the walk went into (by
    /// relative path; `None` for a name that is not UTF-8), and what changed under the walk.
    Dir {
        read_only: bool,
        entries: BTreeMap<String, Entry>,
        foreign: Vec<String>,
    },
}

/// Read the driver root: every entry, descending only into the directories `want` expects, and
/// the bytes of the files it expects bytes of. Reads only.
pub fn observe(root: &MachineRoot, want: &Expected) -> Result<Seen> {
    let (parent, name) = DRIVER_ROOT.rsplit_once('/').unwrap_or(("/", DRIVER_ROOT));
    let top = match root.lookup_dir(parent)? {
        Lookup::Dir(d) => match d.open_subdir(name)? {
            Subdir::Dir(d) => d,
            Subdir::Missing => return Ok(Seen::Missing),
            Subdir::Other(k) => {
                return Ok(Seen::NotDir(format!(
                    "{DRIVER_ROOT} in the machine is a {}, not the driver root",
                    k.as_str()
                )));
            }
        },
        Lookup::Missing => return Ok(Seen::Missing),
        Lookup::NotDir => {
            return Ok(Seen::NotDir(format!(
                "{parent} in the machine is not a directory"
            )));
        }
    };
    let read_only = top.read_only()?;
    let (mut entries, mut foreign) = (BTreeMap::new(), Vec::new());
    let mut stack: Vec<(String, MachineDir)> = vec![(String::new(), top)];
    while let Some((prefix, dir)) = stack.pop() {
        walk_dir(&prefix, &dir, want, &mut entries, &mut foreign, &mut stack)?;
    }
    Ok(Seen::Dir {
        read_only,
        entries,
        foreign,
    })
}

/// One directory of [`observe`]'s walk.
fn walk_dir(
    prefix: &str,
    dir: &MachineDir,
    want: &Expected,
    entries: &mut BTreeMap<String, Entry>,
    foreign: &mut Vec<String>,
    stack: &mut Vec<(String, MachineDir)>,
) -> Result<()> {
    for (entry, _) in dir.entries()? {
        let Some(entry) = entry.to_str() else {
            foreign.push(format!("{}/{}", dir.path(), entry.to_string_lossy()));
            continue;
        };
        let rel = if prefix.is_empty() {
            entry.to_owned()
        } else {
            format!("{prefix}/{entry}")
        };
        let Some(st) = dir.stat(entry)? else {
            continue;
        };
        let kind = FileKind::from_stat(&st);
        let target = match kind {
            FileKind::Symlink => dir.read_link(entry)?,
            _ => None,
        };
        let bytes = match want.contents.get(&rel) {
            Some(b) if kind == FileKind::File && st.st_size == b.len() as i64 => {
                dir.read_regular(entry, b.len())?
            }
            _ => None,
        };
        let expected_dir = want.parents.contains(&rel) && !want.files.contains_key(&rel);
        if kind == FileKind::Dir && expected_dir {
            match dir.open_subdir(entry)? {
                Subdir::Dir(sub) => stack.push((rel.clone(), sub)),
                _ => bail!(
                    "{} in the machine changed while it was read",
                    dir.child(entry)
                ),
            }
        }
        entries.insert(
            rel,
            Entry {
                kind,
                dev: st.st_dev,
                ino: st.st_ino,
                target,
                bytes,
            },
        );
    }
    Ok(())
}

/// What the driver root lacks or holds wrong, as machine paths; empty when it is right.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mismatch {
    /// Why it cannot be the driver root at all (missing, not a directory, writable).
    pub unusable: Option<String>,
    pub missing: Vec<String>,
    pub different: Vec<String>,
    pub extra: Vec<String>,
}

impl Mismatch {
    pub fn is_empty(&self) -> bool {
        self.unusable.is_none()
            && self.missing.is_empty()
            && self.different.is_empty()
            && self.extra.is_empty()
    }
}

/// Compare the driver root as found with what it must be: read-only, every driver file and
/// directory at its path and the very host file or directory discovery names (same device and
/// inode: a hard link is the host's inode, a bind mount shows its source's), every SONAME the
/// link to the file beside it, the tree's own files their bytes, and nothing else.
pub fn diff(want: &Expected, seen: &Seen) -> Mismatch {
    let restart = "so this machine was started without it (by another tool, or with a .nspawn \
                   file from before the GPUs or driver appeared); restart it through its \
                   systemd-nspawn@.service unit";
    let (entries, foreign) = match seen {
        Seen::Missing => {
            return Mismatch {
                unusable: Some(format!(
                    "the driver root {DRIVER_ROOT} is not in the machine: it is pre-start's host \
                     tree, bound read-only by the .nspawn file pre-start renders, {restart}"
                )),
                ..Mismatch::default()
            };
        }
        Seen::NotDir(why) => {
            return Mismatch {
                unusable: Some(why.clone()),
                ..Mismatch::default()
            };
        }
        Seen::Dir {
            read_only: false, ..
        } => {
            return Mismatch {
                unusable: Some(format!(
                    "the driver root {DRIVER_ROOT} in the machine is writable: it must be \
                     pre-start's host tree bound read-only by the .nspawn file, {restart}"
                )),
                ..Mismatch::default()
            };
        }
        Seen::Dir {
            entries, foreign, ..
        } => (entries, foreign),
    };
    let mut out = Mismatch {
        extra: foreign.clone(),
        ..Mismatch::default()
    };
    for (rel, e) in entries {
        let path = format!("{DRIVER_ROOT}/{rel}");
        let right = if let Some(target) = want.links.get(rel) {
            // The link's name resolves to its library only through a link to it; that the
            // library is the host's is checked at the library's own name.
            e.kind == FileKind::Symlink && e.target.as_deref() == Some(std::ffi::OsStr::new(target))
        } else if let Some(bytes) = want.contents.get(rel) {
            e.kind == FileKind::File && e.bytes.as_deref() == Some(bytes.as_slice())
        } else if let Some(w) = want.files.get(rel) {
            let want_kind = if w.dir { FileKind::Dir } else { FileKind::File };
            e.kind == want_kind && (e.dev, e.ino) == (w.dev, w.ino)
        } else if want.parents.contains(rel) && e.kind == FileKind::Dir {
            true
        } else {
            out.extra.push(path);
            continue;
        };
        if !right {
            out.different.push(path);
        }
    }
    out.missing = want
        .files
        .keys()
        .chain(want.links.keys())
        .chain(want.contents.keys())
        .filter(|k| !entries.contains_key(*k))
        .map(|k| format!("{DRIVER_ROOT}/{k}"))
        .collect();
    out
}

impl Mismatch {
    /// One message naming every kind of mismatch (at most [`MAX_NAMED`] paths each); `None`
    /// when there is none.
    pub fn message(&self, want: &Expected) -> Option<String> {
        if let Some(why) = &self.unusable {
            return Some(why.clone());
        }
        let mut why = Vec::new();
        for (label, list) in [
            ("missing", &self.missing),
            ("not the host's file", &self.different),
            ("not the host's driver", &self.extra),
        ] {
            if list.is_empty() {
                continue;
            }
            let shown: Vec<&str> = list.iter().take(MAX_NAMED).map(String::as_str).collect();
            let more = list.len().saturating_sub(MAX_NAMED);
            why.push(format!(
                "{} {label}: {}{}",
                list.len(),
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        (!why.is_empty()).then(|| {
            format!(
                "the driver root {DRIVER_ROOT} does not match the host's NVIDIA driver {} ({}); \
                 the machine was started with a driver tree built for another host state (the \
                 driver changed after pre-start?): restart it so pre-start builds it again",
                want.version,
                why.join("; ")
            )
        })
    }
}

/// Check the driver root that systemd-nspawn made at this boot against the host's driver as
/// discovered now ([`Expected::of`], [`observe`], [`diff`]). Reads only. An error names what is
/// missing, different or extra: the machine then runs with a tree built for another host state
/// (the driver changed after pre-start, or the machine was started without our pre-start), and
/// only a new start (whose pre-start rebuilds the tree) can fix that. Returns the number of
/// entries checked.
pub fn verify(root: &MachineRoot, host: &HostRoot, driver: &UserspaceDriver) -> Result<usize> {
    let want = Expected::of(host, driver)?;
    match diff(&want, &observe(root, &want)?).message(&want) {
        Some(why) => Err(anyhow::anyhow!(why)),
        None => Ok(want.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{DriverFile, LibDir};

    fn driver() -> UserspaceDriver {
        UserspaceDriver {
            version: "1.2".into(),
            lib_dirs: vec![LibDir {
                path: "/usr/lib/x86_64-linux-gnu".parse().unwrap(),
                triplet: "x86_64-linux-gnu".into(),
                files: vec![DriverFile {
                    name: "libcuda.so.1.2".into(),
                    soname: Some("libcuda.so.1".into()),
                }],
            }],
            binaries: Vec::new(),
            firmware: None,
            sockets: Vec::new(),
            runtime: Vec::new(),
        }
    }

    /// The driver root's desired state follows from the driver and the host facts alone: the
    /// same facts give the same value, each file is the identity the facts name, and facts of
    /// another driver (a source without an identity) are refused.
    #[test]
    fn the_expected_root_follows_from_the_facts_alone() {
        let d = driver();
        let tree = crate::model::layout::driver_tree(&d).unwrap();
        assert!(Expected::from_ids(&d, &tree, &HostIds::new()).is_err());
        let ids: HostIds = parts(&d, &tree)
            .unwrap()
            .2
            .into_iter()
            .map(|(_, source, _)| (source, (7, 42)))
            .collect();
        let a = Expected::from_ids(&d, &tree, &ids).unwrap();
        assert_eq!(a, Expected::from_ids(&d, &tree, &ids).unwrap());
        assert!(!a.files.is_empty());
        assert!(a.files.values().all(|w| (w.dev, w.ino) == (7, 42)));
        assert_eq!(
            a.links.get("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            Some(&"libcuda.so.1.2".to_owned())
        );
    }
}
