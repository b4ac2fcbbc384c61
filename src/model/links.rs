//! Library, tool and `/dev/char` links: which links a target must have, which links are ours,
//! and the difference between the two in one directory.
//!
//! Link targets:
//! - In the machine's multiarch dir, versioned names point into the driver root at the same
//!   name (`libcuda.so.<ver> → /run/nvidia/driver/usr/lib/<triplet>/libcuda.so.<ver>`); the
//!   tree's shape does not depend on how discovery found the host's library dirs. SONAME names
//!   point at the versioned name beside them (`libcuda.so.1 → libcuda.so.<ver>`): exactly what
//!   `ldconfig` writes, so the `ldconfig` run that follows leaves them alone and the next start
//!   finds nothing to change. Links into `/run/host-nvidia` (the legacy layout's binds of the
//!   host's directories) are stale and removed.
//! - The driver's tools get `/usr/bin/<tool> → /run/nvidia/driver/usr/bin/<tool>`, so
//!   `nvidia-smi` is on the machine's PATH; removed like the library links when GPUs go. A real
//!   file the image has at that name is left alone (and reported).
//! - `/dev/char/<major>:<minor>` links use absolute targets (`/dev/nvidia0`). udev writes
//!   relative ones (`../nvidia0`), so an absolute `/dev/dri/*` target is how cleanup knows a DRM
//!   link is ours once the GPU, and with it the major/minor we could match, is gone.
//!
//! The walk over the directories ([`each_lib_dir`]) is the applier's and the reader's alike, so
//! `status` looks exactly where post-start writes.

use crate::discovery::{Inventory, UserspaceDriver};
use crate::fs::machine_root::{FileKind, Lookup, MachineDir, MachineRoot};
use crate::model::layout::{DRIVER_ROOT, EntryKind, LEGACY_HOST_NVIDIA, driver_entries};
use crate::types::paths::normalize;
use anyhow::{Result, bail};
use std::collections::{BTreeMap, BTreeSet};

/// Where the links to the driver's tools live in the machine (on the PATH of every shell).
pub(crate) const TOOL_DIR: &str = "/usr/bin";
/// Where `/dev/char` links live.
pub(crate) const DEV_CHAR: &str = "/dev/char";

/// Links wanted in one directory: name → target.
pub(crate) type DirLinks = BTreeMap<String, String>;

/// Links wanted in the machine's library dirs (`/usr/lib/<triplet>[/sub]`) and its tool dir
/// (`/usr/bin`): dir → name → target. Empty without a driver: every link of ours goes.
pub fn lib_links(driver: Option<&UserspaceDriver>) -> BTreeMap<String, DirLinks> {
    let mut out: BTreeMap<String, DirLinks> = BTreeMap::new();
    for entry in driver.map(driver_entries).unwrap_or_default() {
        if !matches!(
            entry.kind,
            EntryKind::Library | EntryKind::Binary | EntryKind::SonameLink
        ) {
            continue;
        }
        let Some((dir, name)) = entry.path.rsplit_once('/') else {
            continue;
        };
        out.entry(dir.to_owned())
            .or_default()
            .entry(name.to_owned())
            .or_insert_with(|| entry.source.clone());
    }
    out
}

/// `/dev/char/<major>:<minor>` → node, for every NVIDIA node of `inv` under `/dev`.
pub fn dev_char_links(inv: &Inventory) -> DirLinks {
    let mut wanted = DirLinks::new();
    for d in &inv.devices {
        if d.path.starts_with("/dev/") {
            wanted
                .entry(format!("{}:{}", d.major, d.minor))
                .or_insert_with(|| d.path.to_string());
        }
    }
    wanted
}

/// What one directory holds that links care about: every symlink (name → target, `None` when the
/// target is not UTF-8, which no link of ours has) and the kind of any other entry at a wanted
/// name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirSeen {
    /// The directory, as a machine path.
    pub path: String,
    pub links: BTreeMap<String, Option<String>>,
    pub others: BTreeMap<String, FileKind>,
}

/// Read `dir` for [`DirSeen`]. Reads only.
pub(crate) fn observe_dir(dir: &MachineDir, wanted: &DirLinks) -> Result<DirSeen> {
    let mut seen = DirSeen {
        path: dir.path().to_owned(),
        links: BTreeMap::new(),
        others: BTreeMap::new(),
    };
    for (name, kind) in dir.entries()? {
        // Non-UTF-8 names are never ours, nor wanted.
        let Some(name) = name.to_str() else { continue };
        let kind = match kind {
            Some(k) => Some(k),
            None => dir.kind(name)?,
        };
        match kind {
            Some(FileKind::Symlink) => {
                if let Some(t) = dir.read_link(name)? {
                    seen.links
                        .insert(name.to_owned(), t.to_str().map(str::to_owned));
                }
            }
            Some(k) if wanted.contains_key(name) => {
                seen.others.insert(name.to_owned(), k);
            }
            _ => {}
        }
    }
    Ok(seen)
}

/// One change to a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkOp {
    Create {
        target: String,
    },
    /// Another symlink is atomically replaced (`from` is `None` for a target that is not UTF-8).
    Replace {
        from: Option<String>,
        to: String,
    },
    Remove {
        target: String,
    },
}

/// What one directory needs: its link changes in the order they are made (removals first), and
/// the wanted names held by something that is not a symlink, left alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DirDiff {
    pub path: String,
    pub ops: Vec<(String, LinkOp)>,
    pub kept: Vec<(String, FileKind)>,
}

impl DirDiff {
    /// Create or replace every wanted link that is not already right.
    fn wanted(&mut self, seen: &DirSeen, wanted: &DirLinks) {
        for (name, target) in wanted {
            match seen.links.get(name) {
                Some(Some(t)) if t == target => {}
                Some(from) => self.ops.push((
                    name.clone(),
                    LinkOp::Replace {
                        from: from.clone(),
                        to: target.clone(),
                    },
                )),
                None => match seen.others.get(name) {
                    Some(kind) => self.kept.push((name.clone(), *kind)),
                    None => self.ops.push((
                        name.clone(),
                        LinkOp::Create {
                            target: target.clone(),
                        },
                    )),
                },
            }
        }
    }

    /// The machine path of `name` in this directory.
    pub fn child(&self, name: &str) -> String {
        if self.path == "/" {
            format!("/{name}")
        } else {
            format!("{}/{name}", self.path)
        }
    }
}

/// The links of ours in a library or tool directory: those pointing into the driver root (or
/// `/run/host-nvidia`), and same-directory links to those (a SONAME link to a versioned one).
/// The one rule of what post-start may remove there; `status` reads versions off the same set.
pub fn ours(seen: &DirSeen) -> Vec<(&str, &str)> {
    let direct: BTreeSet<&str> = seen
        .links
        .iter()
        .filter(|(_, t)| {
            t.as_deref()
                .is_some_and(|t| points_into_driver(&seen.path, t))
        })
        .map(|(n, _)| n.as_str())
        .collect();
    seen.links
        .iter()
        .filter_map(|(n, t)| Some((n.as_str(), t.as_deref()?)))
        .filter(|(n, t)| direct.contains(n) || (!t.contains('/') && direct.contains(t)))
        .collect()
}

/// A directory's difference: `ours` that are not wanted go, then every wanted link is made.
/// Anything that is not a symlink is never removed or replaced.
fn diff_dir(seen: &DirSeen, ours: Vec<(&str, &str)>, wanted: &DirLinks) -> DirDiff {
    let mut out = DirDiff {
        path: seen.path.clone(),
        ..DirDiff::default()
    };
    for (name, target) in ours {
        if !wanted.contains_key(name) {
            out.ops.push((
                name.to_owned(),
                LinkOp::Remove {
                    target: target.to_owned(),
                },
            ));
        }
    }
    out.wanted(seen, wanted);
    out
}

/// A library or tool directory: our links ([`ours`]) that are not wanted go, then every wanted
/// link is made.
pub(crate) fn diff_lib_dir(seen: &DirSeen, wanted: &DirLinks) -> DirDiff {
    diff_dir(seen, ours(seen), wanted)
}

/// Our NVIDIA links in `/dev/char` ([`is_nvidia_dev_char`] at a `<major>:<minor>` name, or at
/// the temp name `.M:m.tmp` of a replace a killed run left).
pub(crate) fn ours_dev_char(seen: &DirSeen) -> Vec<(&str, &str)> {
    seen.links
        .iter()
        .filter_map(|(n, t)| Some((n.as_str(), t.as_deref()?)))
        .filter(|(name, target)| {
            let numbers = name
                .strip_prefix('.')
                .and_then(|n| n.strip_suffix(".tmp"))
                .unwrap_or(name);
            is_dev_numbers(numbers) && is_nvidia_dev_char(&seen.path, target)
        })
        .collect()
}

/// `/dev/char`: our NVIDIA links ([`ours_dev_char`]) that are not wanted go, then every wanted
/// link is made.
pub(crate) fn diff_dev_char(seen: &DirSeen, wanted: &DirLinks) -> DirDiff {
    diff_dir(seen, ours_dev_char(seen), wanted)
}

/// Visit every library and tool directory post-start keeps links in, in the order it changes
/// them: each directory of `wanted` the machine has (never created, so no foreign architecture's
/// dir appears), then every other multiarch dir and the tool dir with nothing wanted, so links
/// of a library, tool, version or architecture that went away are removed too; no directory
/// twice. Returns the wanted directories the machine does not have, with why. A wanted
/// directory that is not one is an error (post-start fails there).
pub(crate) fn each_lib_dir(
    root: &MachineRoot,
    wanted: &BTreeMap<String, DirLinks>,
    mut each: impl FnMut(&MachineDir, &DirLinks) -> Result<()>,
) -> Result<Vec<(String, String)>> {
    let mut seen = BTreeSet::new();
    let mut skipped = Vec::new();
    for (dir_path, links) in wanted {
        match root.lookup_dir(dir_path)? {
            Lookup::Dir(dir) => {
                seen.insert(dir.identity()?);
                each(&dir, links)?;
            }
            Lookup::Missing => skipped.push((dir_path.clone(), "not in the machine".into())),
            Lookup::NotDir => {
                bail!("{dir_path} in the machine is not a directory (or one of its parents is not)")
            }
        }
    }
    let none = DirLinks::new();
    for dir_path in machine_lib_dirs(root)?
        .into_iter()
        .chain([TOOL_DIR.to_owned()])
    {
        if let Some(dir) = open_dir_if_dir(root, &dir_path)?
            && seen.insert(dir.identity()?)
        {
            each(&dir, &none)?;
        }
    }
    Ok(skipped)
}

/// Most distinct multiarch library directories judged in a machine (a real one has a few).
pub const MAX_LIB_DIRS: usize = 64;

/// The machine's multiarch library dirs (`/usr/lib/*-linux-*` and their `vdpau/`), as machine
/// paths; resolved in the machine, so one reached through a symlink is still inside it. Each
/// directory once, by identity, under the first name that reaches it (real directories before
/// symlinks): the machine may alias one directory under any number of names. More than
/// [`MAX_LIB_DIRS`] distinct directories is an error: the work of judging them is bounded.
pub fn machine_lib_dirs(root: &MachineRoot) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let Some(usr_lib) = open_dir_if_dir(root, "/usr/lib")? else {
        return Ok(out);
    };
    let mut entries: Vec<(String, bool)> = usr_lib
        .entries()?
        .into_iter()
        .filter_map(|(e, kind)| {
            let e = e.to_str()?.to_owned();
            e.contains("-linux-")
                .then_some((e, kind != Some(FileKind::Dir)))
        })
        .collect();
    entries.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    let mut seen = BTreeSet::new();
    let mut triplets = Vec::new();
    for (entry, _) in entries {
        let dir = format!("/usr/lib/{entry}");
        // A file that merely has a triplet's name is none of our business.
        let Some(d) = open_dir_if_dir(root, &dir)? else {
            continue;
        };
        if !seen.insert(d.identity()?) {
            continue;
        }
        if triplets.len() == MAX_LIB_DIRS {
            bail!(
                "/usr/lib in the machine has more than {MAX_LIB_DIRS} multiarch library \
                 directories (*-linux-*)"
            );
        }
        triplets.push((dir, d));
    }
    // Each triplet's `vdpau/` after it, once too: it may be a triplet directory itself, or
    // another `vdpau/`, under a link.
    for (dir, d) in triplets {
        out.push(dir.clone());
        if matches!(d.kind("vdpau")?, Some(FileKind::Dir | FileKind::Symlink)) {
            let vdpau = format!("{dir}/vdpau");
            if let Some(v) = open_dir_if_dir(root, &vdpau)?
                && seen.insert(v.identity()?)
            {
                out.push(vdpau);
            }
        }
    }
    Ok(out)
}

/// [`MachineRoot::lookup_dir`] for places where a non-directory simply holds nothing of ours.
pub(crate) fn open_dir_if_dir(root: &MachineRoot, path: &str) -> Result<Option<MachineDir>> {
    Ok(match root.lookup_dir(path)? {
        Lookup::Dir(d) => Some(d),
        Lookup::Missing | Lookup::NotDir => None,
    })
}

/// Whether `path` is `dir` or below it.
pub(crate) fn is_under(path: &str, dir: &str) -> bool {
    path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// Whether a link target (as found in `dir`) points into the driver root or the host binds.
pub(crate) fn points_into_driver(dir: &str, target: &str) -> bool {
    let t = normalize(dir, target);
    is_under(&t, LEGACY_HOST_NVIDIA) || is_under(&t, DRIVER_ROOT)
}

/// Whether a `/dev/char` link is an NVIDIA one we may remove: it points at `/dev/nvidia*`
/// (absolute or relative — the name alone says NVIDIA), or it is a `/dev/dri/*` link with an
/// absolute target, the form only we write (udev writes `../dri/card1`).
pub(crate) fn is_nvidia_dev_char(dir: &str, target: &str) -> bool {
    let t = normalize(dir, target);
    t.strip_prefix("/dev/")
        .is_some_and(|rest| rest.starts_with("nvidia"))
        || (target.starts_with("/dev/dri/") && t.starts_with("/dev/dri/"))
}

/// `<major>:<minor>`, both decimal.
pub(crate) fn is_dev_numbers(name: &str) -> bool {
    name.split_once(':').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(path: &str, links: &[(&str, &str)], others: &[(&str, FileKind)]) -> DirSeen {
        DirSeen {
            path: path.into(),
            links: links
                .iter()
                .map(|(n, t)| ((*n).to_owned(), Some((*t).to_owned())))
                .collect(),
            others: others.iter().map(|(n, k)| ((*n).to_owned(), *k)).collect(),
        }
    }

    fn want(links: &[(&str, &str)]) -> DirLinks {
        links
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    }

    #[test]
    fn normalize_resolves_lexically() {
        assert_eq!(
            normalize("/usr/lib/x", "../../../run/host-nvidia/lib/0/a"),
            "/run/host-nvidia/lib/0/a"
        );
        assert_eq!(normalize("/dev/char", "../nvidia0"), "/dev/nvidia0");
        assert_eq!(normalize("/dev/char", "/dev/dri/card1"), "/dev/dri/card1");
        assert_eq!(normalize("/a", "../../../../b"), "/b");
    }

    #[test]
    fn ours_means_under_the_driver_root_or_host_binds() {
        assert!(points_into_driver(
            "/usr/lib/x",
            "/run/host-nvidia/lib/0/libcuda.so.1"
        ));
        assert!(points_into_driver(
            "/usr/lib/x",
            "/run/nvidia/driver/usr/lib/x/a"
        ));
        assert!(!points_into_driver("/usr/lib/x", "/run/nvidia/drivers/a"));
        assert!(!points_into_driver("/usr/lib/x", "libfoo.so.1.2"));
    }

    #[test]
    fn lib_dir_diff_removes_ours_then_makes_the_wanted() {
        let d = "/usr/lib/x86_64-linux-gnu";
        let s = seen(
            d,
            &[
                ("libcuda.so.1", "libcuda.so.1.0"),
                (
                    "libcuda.so.1.0",
                    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1.0",
                ),
                ("libfoo.so.1", "libfoo.so.1.2"),
                ("libnvidia-ml.so.1", "libnvidia-ml.so.2.0"),
            ],
            &[("libnvidia-ml.so.2.0", FileKind::File)],
        );
        let w = want(&[
            ("libcuda.so.1", "libcuda.so.2.0"),
            (
                "libcuda.so.2.0",
                "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.2.0",
            ),
            ("libnvidia-ml.so.2.0", "/run/nvidia/driver/x"),
        ]);
        let diff = diff_lib_dir(&s, &w);
        let names: Vec<(&str, &LinkOp)> = diff.ops.iter().map(|(n, o)| (n.as_str(), o)).collect();
        assert!(matches!(
            names[0],
            ("libcuda.so.1.0", LinkOp::Remove { .. })
        ));
        assert!(matches!(names[1], ("libcuda.so.1", LinkOp::Replace { .. })));
        assert!(matches!(
            names[2],
            ("libcuda.so.2.0", LinkOp::Create { .. })
        ));
        assert_eq!(names.len(), 3, "{names:?}");
        assert_eq!(
            diff.kept,
            vec![("libnvidia-ml.so.2.0".to_owned(), FileKind::File)]
        );
        // Nothing to do once the directory is what is wanted.
        let done = seen(
            d,
            &w.iter()
                .map(|(n, t)| (n.as_str(), t.as_str()))
                .filter(|(n, _)| *n != "libnvidia-ml.so.2.0")
                .collect::<Vec<_>>(),
            &[("libnvidia-ml.so.2.0", FileKind::File)],
        );
        assert!(diff_lib_dir(&done, &w).ops.is_empty());
    }

    #[test]
    fn nvidia_dev_char_links() {
        assert!(is_nvidia_dev_char("/dev/char", "/dev/nvidia0"));
        assert!(is_nvidia_dev_char(
            "/dev/char",
            "../nvidia-caps/nvidia-cap1"
        ));
        assert!(is_nvidia_dev_char("/dev/char", "/dev/dri/card1"));
        // udev's relative DRM links may belong to another GPU: not ours to judge.
        assert!(!is_nvidia_dev_char("/dev/char", "../dri/card0"));
        assert!(!is_nvidia_dev_char("/dev/char", "../null"));
        assert!(is_dev_numbers("195:255"));
        assert!(!is_dev_numbers("195:"));
        assert!(!is_dev_numbers("a:1"));
        let s = seen(
            "/dev/char",
            &[
                ("195:1", "/dev/nvidia1"),
                (".195:0.tmp", "/dev/nvidia0"),
                ("226:0", "../dri/card0"),
            ],
            &[],
        );
        let diff = diff_dev_char(&s, &want(&[("195:0", "/dev/nvidia0")]));
        let names: Vec<&str> = diff.ops.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [".195:0.tmp", "195:1", "195:0"]);
    }
}
