//! NVIDIA state inside the machine (DESIGN §5): the check of the driver root, the library, tool
//! and `/dev/char` links, the CDI spec, and their removal on a host without GPUs.
//!
//! Everything goes through a [`MachineRoot`], so a hostile rootfs cannot redirect a write, a
//! replace or a delete to the host. Each step returns a [`Report`] the caller logs as one line.
//!
//! The driver root `/run/nvidia/driver` is not built here: it is pre-start's host tree of hard
//! links of the driver files, which systemd-nspawn binds read-only at boot (src/layout.rs,
//! src/driver_tree.rs), so it exists whole before any service of the machine starts and changes
//! only with the machine. Post-start checks it against the
//! host ([`verify_driver_root`]) before anything points into it.
//!
//! Link targets:
//! - In the machine's multiarch dir, versioned names point into the driver root at the same
//!   name (`libcuda.so.<ver> → /run/nvidia/driver/usr/lib/<triplet>/libcuda.so.<ver>`); the
//!   tree's shape does not depend on how discovery found the host's library dirs. SONAME names
//!   point at the versioned name beside them (`libcuda.so.1 → libcuda.so.<ver>`): exactly what
//!   `ldconfig` writes, so the `ldconfig` run that follows leaves them alone and the next start
//!   finds nothing to change. Links into `/run/host-nvidia`, where older versions bound the
//!   host's directories, are stale and removed.
//! - The driver's tools get `/usr/bin/<tool> → /run/nvidia/driver/usr/bin/<tool>`, so
//!   `nvidia-smi` is on the machine's PATH; removed like the library links when GPUs go. A real
//!   file the image has at that name is left alone (and reported).
//! - `/dev/char/<major>:<minor>` links use absolute targets (`/dev/nvidia0`). udev writes
//!   relative ones (`../nvidia0`), so an absolute `/dev/dri/*` target is how cleanup knows a DRM
//!   link is ours once the GPU, and with it the major/minor we could match, is gone.

use crate::discovery::{Inventory, UserspaceDriver};
use crate::failpoint::{self, Point};
use crate::host::HostRoot;
use crate::layout::{DRIVER_ROOT, EntryKind, LEGACY_HOST_NVIDIA, driver_binds, driver_entries};
use crate::machine_root::{
    FileKind, LinkOutcome, Lookup, MachineDir, MachineRoot, Subdir, check_name,
};
use anyhow::{Context as _, Result, bail};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

/// Staging name beside the driver root of versions that built it in the machine; a leftover is
/// removed by cleanup.
const STAGING: &str = ".driver.new";
/// Where the links to the driver's tools live in the machine (on the PATH of every shell).
const TOOL_DIR: &str = "/usr/bin";
/// Where `/dev/char` links live in the machine.
pub(crate) const DEV_CHAR: &str = "/dev/char";
/// CDI spec directories every CDI consumer scans.
const CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
/// Largest CDI spec we read when looking for conflicts.
const MAX_SPEC_BYTES: usize = 16 << 20;
/// The machine's dynamic linker cache, which `ldconfig` writes.
const LD_CACHE: (&str, &str) = ("/etc", "ld.so.cache");
/// Largest `ld.so.cache` we read.
const MAX_LD_CACHE_BYTES: usize = 64 << 20;
const DIR_MODE: u32 = 0o755;
const SPEC_MODE: u32 = 0o644;

/// What one step did, as machine paths; logged as one line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub step: &'static str,
    pub created: Vec<String>,
    /// Existing entries atomically replaced with new content.
    pub replaced: Vec<String>,
    pub removed: Vec<String>,
    /// Entries in the way that are not ours, left alone: (path, why).
    pub kept: Vec<(String, String)>,
    /// Places skipped, e.g. a multiarch dir the machine does not have: (path, why).
    pub skipped: Vec<(String, String)>,
}

impl Report {
    fn new(step: &'static str) -> Report {
        Report {
            step,
            ..Report::default()
        }
    }

    /// Whether anything in the machine changed.
    pub fn changed(&self) -> bool {
        !(self.created.is_empty() && self.replaced.is_empty() && self.removed.is_empty())
    }

    fn link(&mut self, path: String, outcome: LinkOutcome) {
        match outcome {
            LinkOutcome::Unchanged => {}
            LinkOutcome::Created => self.created.push(path),
            LinkOutcome::Replaced => self.replaced.push(path),
            LinkOutcome::Blocked(k) => self.kept.push((path, format!("a {}", k.as_str()))),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} created, {} replaced, {} removed",
            self.step,
            self.created.len(),
            self.replaced.len(),
            self.removed.len()
        )?;
        for (p, why) in &self.kept {
            write!(f, "; left {p} alone ({why})")?;
        }
        for (p, why) in &self.skipped {
            write!(f, "; skipped {p} ({why})")?;
        }
        Ok(())
    }
}

/// The parent of the driver root and its name: (`/run/nvidia`, `driver`).
fn driver_root_parent() -> (&'static str, &'static str) {
    DRIVER_ROOT.rsplit_once('/').unwrap_or(("/", DRIVER_ROOT))
}

/// What a driver-root path must be: the host file or directory with this identity (a hard link
/// of the file in pre-start's tree, or a bind: both show the host's device and inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wanted {
    dev: u64,
    ino: u64,
    dir: bool,
}

/// Most paths of each kind one verification error spells out.
const MAX_NAMED: usize = 10;

/// Check the driver root that systemd-nspawn made at this boot from the `.nspawn` file (pre-start's
/// host tree bound read-only, src/layout.rs, src/driver_tree.rs) against the host's driver as
/// discovered now: it is read-only, every driver file and directory is at its path and is the
/// very host file or directory discovery names (same device and inode: a hard link is the host's
/// inode, a bind mount shows its source's), every SONAME is the link to the file beside it, and
/// the tree holds nothing else. Reads only. An error names what is missing, different or extra:
/// the machine then runs with a tree built for another host state (the driver changed after
/// pre-start, or the machine was started without our pre-start), and only a new start (whose
/// pre-start rebuilds the tree) can fix that. Returns the number of entries checked.
pub fn verify_driver_root(
    root: &MachineRoot,
    host: &HostRoot,
    driver: &UserspaceDriver,
) -> Result<usize> {
    let want = Expected::of(host, driver)?;
    let top = open_driver_root(root)?;
    let found = compare_driver_root(top, &want)?;
    found.into_result(driver)?;
    Ok(want.files.len() + want.links.len() + want.contents.len())
}

/// The driver root as it must be, relative to [`DRIVER_ROOT`].
struct Expected {
    /// Driver files and directories: the host identity each must have.
    files: BTreeMap<String, Wanted>,
    /// SONAME names: links in the tree to the library file beside them (src/layout.rs).
    links: BTreeMap<String, String>,
    /// Files pre-start writes (the tree's loader cache): their bytes.
    contents: BTreeMap<String, Vec<u8>>,
    /// Directories that only hold the above.
    parents: BTreeSet<String>,
}

impl Expected {
    /// Stat every host source discovery names now.
    fn of(host: &HostRoot, driver: &UserspaceDriver) -> Result<Expected> {
        use crate::layout::TreeNode;
        let (mut links, mut contents, mut sources) = (BTreeMap::new(), BTreeMap::new(), Vec::new());
        for (p, n) in crate::layout::driver_tree(driver)? {
            match n {
                TreeNode::Link(t) => {
                    links.insert(p, t);
                }
                TreeNode::File(bytes) => {
                    contents.insert(p, bytes);
                }
                TreeNode::Hard(source) | TreeNode::Bound(source) => {
                    sources.push((p, source, false))
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
        let mut files = BTreeMap::new();
        for (rel, source, dir) in sources {
            let st = host.metadata(source.as_str()).with_context(|| {
                format!(
                    "host driver file {source} (stat {})",
                    host.path(source.as_str()).display()
                )
            })?;
            let (dev, ino) = (
                std::os::unix::fs::MetadataExt::dev(&st),
                std::os::unix::fs::MetadataExt::ino(&st),
            );
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
            files,
            links,
            contents,
            parents,
        })
    }
}

/// The driver root in the machine, which must exist and be read-only.
fn open_driver_root(root: &MachineRoot) -> Result<MachineDir> {
    let (parent, name) = driver_root_parent();
    let missing_root = || {
        anyhow::anyhow!(
            "the driver root {DRIVER_ROOT} is not in the machine: it is pre-start's host tree, \
             bound read-only by the .nspawn file pre-start renders, so this machine was started \
             without it (by another tool, or with a .nspawn file from before the GPUs or driver \
             appeared); restart it through its systemd-nspawn@.service unit"
        )
    };
    let top = match root.lookup_dir(parent)? {
        Lookup::Dir(d) => match d.open_subdir(name)? {
            Subdir::Dir(d) => d,
            Subdir::Missing => return Err(missing_root()),
            Subdir::Other(k) => bail!(
                "{DRIVER_ROOT} in the machine is a {}, not the driver root",
                k.as_str()
            ),
        },
        Lookup::Missing => return Err(missing_root()),
        Lookup::NotDir => bail!("{parent} in the machine is not a directory"),
    };
    if !top.read_only()? {
        bail!(
            "the driver root {DRIVER_ROOT} in the machine is writable: it must be pre-start's \
             host tree bound read-only by the .nspawn file, so this machine was started without \
             it; restart it through its systemd-nspawn@.service unit"
        );
    }
    Ok(top)
}

/// What the walk of the driver root found wrong, as machine paths.
#[derive(Default)]
struct Mismatch {
    missing: Vec<String>,
    different: Vec<String>,
    extra: Vec<String>,
}

/// Walk the driver root `top` (never following a link) and compare each entry with `want`.
fn compare_driver_root(top: MachineDir, want: &Expected) -> Result<Mismatch> {
    let mut found = Mismatch::default();
    let mut seen = BTreeSet::new();
    let mut stack = vec![(String::new(), top)];
    while let Some((prefix, dir)) = stack.pop() {
        for (entry, _) in dir.entries()? {
            let Some(entry) = entry.to_str() else {
                found
                    .extra
                    .push(format!("{}/{}", dir.path(), entry.to_string_lossy()));
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
            let right = if let Some(target) = want.links.get(&rel) {
                // The link's name resolves to its library only through a link to it; that the
                // library is the host's is checked at the library's own name.
                kind == FileKind::Symlink
                    && dir.read_link(entry)?.as_deref() == Some(std::ffi::OsStr::new(target))
            } else if let Some(bytes) = want.contents.get(&rel) {
                kind == FileKind::File
                    && st.st_size == bytes.len() as i64
                    && dir.read_regular(entry, bytes.len())?.as_deref() == Some(bytes.as_slice())
            } else if let Some(w) = want.files.get(&rel) {
                let want_kind = if w.dir { FileKind::Dir } else { FileKind::File };
                kind == want_kind && (st.st_dev, st.st_ino) == (w.dev, w.ino)
            } else if want.parents.contains(&rel) && kind == FileKind::Dir {
                match dir.open_subdir(entry)? {
                    Subdir::Dir(sub) => stack.push((rel.clone(), sub)),
                    _ => bail!(
                        "{} in the machine changed while it was checked",
                        dir.child(entry)
                    ),
                }
                continue;
            } else {
                found.extra.push(dir.child(entry));
                continue;
            };
            seen.insert(rel);
            if !right {
                found.different.push(dir.child(entry));
            }
        }
    }
    found.missing = want
        .files
        .keys()
        .chain(want.links.keys())
        .chain(want.contents.keys())
        .filter(|k| !seen.contains(*k))
        .map(|k| format!("{DRIVER_ROOT}/{k}"))
        .collect();
    Ok(found)
}

impl Mismatch {
    /// An error naming every kind of mismatch (at most [`MAX_NAMED`] paths each), if any.
    fn into_result(self, driver: &UserspaceDriver) -> Result<()> {
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
        if why.is_empty() {
            return Ok(());
        }
        bail!(
            "the driver root {DRIVER_ROOT} does not match the host's NVIDIA driver {} ({}); the \
             machine was started with a driver tree built for another host state (the driver \
             changed after pre-start?): restart it so pre-start builds it again",
            driver.version,
            why.join("; ")
        )
    }
}

/// Lexically resolve a symlink `target` found in directory `dir` (both machine paths).
fn normalize(dir: &str, target: &str) -> String {
    let mut parts: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        dir.split('/').filter(|c| !c.is_empty()).collect()
    };
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

fn is_under(path: &str, dir: &str) -> bool {
    path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// Whether a link target (as found in `dir`) points into the driver root or the host binds.
pub(crate) fn points_into_driver(dir: &str, target: &str) -> bool {
    let t = normalize(dir, target);
    is_under(&t, LEGACY_HOST_NVIDIA) || is_under(&t, DRIVER_ROOT)
}

/// Every symlink in `dir` with its target (non-UTF-8 names and targets cannot be ours).
pub(crate) fn symlinks(dir: &MachineDir) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (name, kind) in dir.entries()? {
        let Some(name) = name.to_str() else { continue };
        let kind = match kind {
            Some(k) => Some(k),
            None => dir.kind(name)?,
        };
        if kind != Some(FileKind::Symlink) {
            continue;
        }
        if let Some(t) = dir.read_link(name)?
            && let Some(t) = t.to_str()
        {
            out.insert(name.to_owned(), t.to_owned());
        }
    }
    Ok(out)
}

/// In one library directory: remove our links that are not in `desired` (links into the driver
/// root or `/run/host-nvidia`, and same-directory links to those, like a SONAME link to a
/// removed version), then create or atomically replace every link in `desired`. Anything that
/// is not a symlink is never removed or replaced.
fn sync_lib_links(
    dir: &MachineDir,
    desired: &BTreeMap<String, String>,
    report: &mut Report,
) -> Result<()> {
    let links = symlinks(dir)?;
    let direct: BTreeSet<&str> = links
        .iter()
        .filter(|(_, t)| points_into_driver(dir.path(), t))
        .map(|(n, _)| n.as_str())
        .collect();
    for (name, target) in &links {
        let ours = direct.contains(name.as_str())
            || (!target.contains('/') && direct.contains(target.as_str()));
        if ours && !desired.contains_key(name) && dir.remove_file(name)? {
            report.removed.push(dir.child(name));
        }
    }
    for (name, target) in desired {
        let outcome = dir.symlink(name, target)?;
        report.link(dir.child(name), outcome);
        failpoint::hit(Point::MidLinks);
    }
    Ok(())
}

/// Links wanted in the machine's library dirs (`/usr/lib/<triplet>[/sub]`) and its tool dir
/// (`/usr/bin`): dir → name → target.
fn desired_lib_links(driver: &UserspaceDriver) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for entry in driver_entries(driver) {
        let target = match entry.kind {
            EntryKind::Library | EntryKind::Binary => entry.source.clone(),
            EntryKind::SonameLink => entry.source.clone(),
            _ => continue,
        };
        let Some((dir, name)) = entry.path.rsplit_once('/') else {
            continue;
        };
        out.entry(dir.to_owned())
            .or_default()
            .entry(name.to_owned())
            .or_insert(target);
    }
    out
}

/// The machine's multiarch library dirs (`/usr/lib/*-linux-*` and their `vdpau/`), as machine
/// paths; resolved in the machine, so one reached through a symlink is still inside it.
pub(crate) fn machine_lib_dirs(root: &MachineRoot) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let Some(usr_lib) = open_dir_if_dir(root, "/usr/lib")? else {
        return Ok(out);
    };
    for (entry, _) in usr_lib.entries()? {
        let Some(entry) = entry.to_str() else {
            continue;
        };
        if !entry.contains("-linux-") {
            continue;
        }
        let dir = format!("/usr/lib/{entry}");
        // A file that merely has a triplet's name is none of our business.
        let Some(d) = open_dir_if_dir(root, &dir)? else {
            continue;
        };
        out.push(dir.clone());
        if matches!(d.kind("vdpau")?, Some(FileKind::Dir | FileKind::Symlink)) {
            out.push(format!("{dir}/vdpau"));
        }
    }
    Ok(out)
}

/// [`MachineRoot::open_dir`] for places where a non-directory simply holds nothing of ours.
fn open_dir_if_dir(root: &MachineRoot, path: &str) -> Result<Option<MachineDir>> {
    Ok(match root.lookup_dir(path)? {
        Lookup::Dir(d) => Some(d),
        Lookup::Missing | Lookup::NotDir => None,
    })
}

/// Bring every library dir and the tool dir in line: the dirs in `desired` that the machine has
/// (never created: no foreign architecture's dir appears), then every other multiarch dir and
/// the tool dir with nothing desired, so links of a library, tool, version or architecture that
/// went away are removed too.
fn sync_all_lib_links(
    root: &MachineRoot,
    desired: &BTreeMap<String, BTreeMap<String, String>>,
    report: &mut Report,
) -> Result<()> {
    let mut seen = BTreeSet::new();
    for (dir_path, links) in desired {
        match root.lookup_dir(dir_path)? {
            Lookup::Dir(dir) => {
                seen.insert(dir.identity()?);
                sync_lib_links(&dir, links, report)?;
            }
            Lookup::Missing => report
                .skipped
                .push((dir_path.clone(), "not in the machine".into())),
            Lookup::NotDir => {
                bail!("{dir_path} in the machine is not a directory (or one of its parents is not)")
            }
        }
    }
    let none = BTreeMap::new();
    for dir_path in machine_lib_dirs(root)?
        .into_iter()
        .chain([TOOL_DIR.to_owned()])
    {
        if let Some(dir) = open_dir_if_dir(root, &dir_path)?
            && seen.insert(dir.identity()?)
        {
            sync_lib_links(&dir, &none, report)?;
        }
    }
    Ok(())
}

/// Rebuild the links in the machine: SONAME and versioned library links in each multiarch dir
/// the machine has and the tool links in `/usr/bin` (stale ones removed first), and `/dev/char/<major>:<minor>` for every NVIDIA
/// node (stale NVIDIA ones removed). `ldconfig` in the machine is the caller's next step.
pub fn rebuild_links(root: &MachineRoot, inv: &Inventory) -> Result<Report> {
    let mut report = Report::new("links");
    let desired = inv
        .driver
        .as_ref()
        .map(desired_lib_links)
        .unwrap_or_default();
    sync_all_lib_links(root, &desired, &mut report)?;
    dev_char_links(root, inv, &mut report)?;
    Ok(report)
}

/// Host mode: the host's driver is installed at its standard paths (driver root `/`),
/// so its library links are the driver installer's and `ldconfig`'s, never ours; only the
/// `/dev/char/<major>:<minor>` links are made (stale NVIDIA ones removed), as in a machine.
pub fn rebuild_dev_char(root: &MachineRoot, inv: &Inventory) -> Result<Report> {
    let mut report = Report::new("/dev/char links");
    dev_char_links(root, inv, &mut report)?;
    Ok(report)
}

/// `/dev/char/<major>:<minor>` for every NVIDIA node of `inv`; stale NVIDIA ones removed.
fn dev_char_links(root: &MachineRoot, inv: &Inventory, report: &mut Report) -> Result<()> {
    let dev_char = root.create_dir_all(DEV_CHAR, DIR_MODE)?;
    let mut wanted = BTreeMap::new();
    for d in &inv.devices {
        if d.path.starts_with("/dev/") {
            wanted
                .entry(format!("{}:{}", d.major, d.minor))
                .or_insert_with(|| d.path.to_string());
        }
    }
    sync_dev_char(&dev_char, &wanted, report)
}

/// Whether the report of [`rebuild_links`] changed a library link (anything outside
/// `/dev/char`, which is a fresh tmpfs on every boot and says nothing about `ld.so.cache`).
pub fn library_links_changed(report: &Report) -> bool {
    report
        .created
        .iter()
        .chain(&report.replaced)
        .chain(&report.removed)
        .any(|p| !is_under(p, DEV_CHAR))
}

/// Whether the machine's `/etc/ld.so.cache` already lists every driver library of each multiarch
/// dir the machine has, under the name `ldconfig` gives it (its SONAME, else its file name), at
/// that dir. After a links step that changed no library link this makes `ldconfig` redundant.
/// A cache written while the links dangled (say an `ldconfig` at boot, before the driver root
/// existed) lacks those entries, so `ldconfig` runs. `vdpau/` is not in the cache (`ldconfig`
/// does not scan it) and not checked. Any doubt (no cache, unknown format, no dir) is `false`.
pub fn ld_cache_lists_driver(root: &MachineRoot, driver: &UserspaceDriver) -> Result<bool> {
    let Some(etc) = open_dir_if_dir(root, LD_CACHE.0)? else {
        return Ok(false);
    };
    let Some(cache) = etc.read_regular(LD_CACHE.1, MAX_LD_CACHE_BYTES)? else {
        return Ok(false);
    };
    let mut wanted = Vec::new();
    for dir in &driver.lib_dirs {
        // The links go to /usr/lib/<triplet> only when the machine has it (see sync_all_lib_links).
        if open_dir_if_dir(root, &format!("/usr/lib/{}", dir.triplet))?.is_none() {
            continue;
        }
        for f in dir.files.iter().filter(|f| !f.name.contains('/')) {
            let name = f.soname.as_deref().unwrap_or(&f.name);
            wanted.push(format!("/lib/{}/{name}", dir.triplet));
        }
    }
    Ok(ld_cache_lists(&cache, &wanted))
}

/// Whether `cache` (the bytes of an `ld.so.cache`) has an entry for every path in `wanted`
/// (`/lib/<triplet>/<name>`), written `/lib/…` or `/usr/lib/…` (one dir under usrmerge). Read
/// with the one reader of the format ([`crate::ldcache::each`]); a cache it cannot read lists
/// nothing, which costs an `ldconfig` run, never a stale cache.
fn ld_cache_lists(cache: &[u8], wanted: &[String]) -> bool {
    let mut have: HashSet<&str> = HashSet::new();
    let read = crate::ldcache::each(cache, |e| {
        have.insert(match e.path.strip_prefix("/usr") {
            Some(rest) if rest.starts_with("/lib/") => rest,
            _ => e.path,
        });
    });
    !wanted.is_empty() && read.is_ok() && wanted.iter().all(|w| have.contains(w.as_str()))
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

fn sync_dev_char(
    dir: &MachineDir,
    wanted: &BTreeMap<String, String>,
    report: &mut Report,
) -> Result<()> {
    for (name, target) in symlinks(dir)? {
        // `.M:m.tmp` is the temp name of a replace a crashed run left behind.
        let numbers = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".tmp"))
            .unwrap_or(&name);
        if is_dev_numbers(numbers)
            && is_nvidia_dev_char(dir.path(), &target)
            && !wanted.contains_key(&name)
            && dir.remove_file(&name)?
        {
            report.removed.push(dir.child(&name));
        }
    }
    for (name, target) in wanted {
        let outcome = dir.symlink(name, target)?;
        report.link(dir.child(name), outcome);
        failpoint::hit(Point::MidLinks);
    }
    Ok(())
}

pub(crate) fn is_dev_numbers(name: &str) -> bool {
    name.split_once(':').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit())
    })
}

fn check_spec_name(file_name: &str) -> Result<()> {
    check_name(file_name).context("CDI spec file name")?;
    if !is_spec_name(file_name) {
        bail!("CDI spec file name {file_name:?} must end in .json or .yaml");
    }
    Ok(())
}

fn is_spec_name(name: &str) -> bool {
    !name.starts_with('.') && (name.ends_with(".json") || name.ends_with(".yaml"))
}

/// Write the CDI spec `dir/file_name` atomically (only when its bytes change), then remove every
/// other regular spec file in `/etc/cdi`, `/var/run/cdi` and `dir` for which
/// `conflicts(name, bytes)` is true. `dir` resolves in the machine (`/var/run` is usually a
/// symlink to `/run` there). Specs that are symlinks are not read or removed.
pub fn write_cdi(
    root: &MachineRoot,
    dir: &str,
    file_name: &str,
    json: &[u8],
    conflicts: impl Fn(&str, &[u8]) -> bool,
) -> Result<Report> {
    let mut report = Report::new("CDI spec");
    check_spec_name(file_name)?;
    let out = root.create_dir_all(dir, DIR_MODE)?;
    let existed = out.kind(file_name)?.is_some();
    if out.write_file(file_name, json, SPEC_MODE, Point::MidCdiWrite)? {
        let p = out.child(file_name);
        if existed {
            report.replaced.push(p);
        } else {
            report.created.push(p);
        }
    }
    let ours = (out.identity()?, file_name);

    let mut seen = BTreeSet::new();
    for spec_dir in CDI_SPEC_DIRS.iter().copied().chain([dir]) {
        // Something that is not a directory holds no specs.
        let Some(d) = open_dir_if_dir(root, spec_dir)? else {
            continue;
        };
        let id = d.identity()?;
        if !seen.insert(id) {
            continue;
        }
        for (name, kind) in d.entries()? {
            let Some(name) = name.to_str() else { continue };
            if !is_spec_name(name) || (id, name) == ours {
                continue;
            }
            let kind = match kind {
                Some(k) => Some(k),
                None => d.kind(name)?,
            };
            if kind != Some(FileKind::File) {
                continue;
            }
            let Some(bytes) = d.read_regular(name, MAX_SPEC_BYTES)? else {
                continue;
            };
            if conflicts(name, &bytes) && d.remove_file(name)? {
                report.removed.push(d.child(name));
            }
        }
        d.sync()?;
    }
    Ok(report)
}

/// For a host without NVIDIA devices: remove the driver root (and any staging leftover), our
/// links in every multiarch dir, our NVIDIA `/dev/char` links, and our CDI spec. Nothing else;
/// idempotent.
pub fn cleanup(root: &MachineRoot, cdi_dir: &str, cdi_file_name: &str) -> Result<Report> {
    let mut report = Report::new("cleanup");
    check_spec_name(cdi_file_name)?;

    let (parent_path, name) = driver_root_parent();
    let (grand, pname) = parent_path.rsplit_once('/').unwrap_or(("/", parent_path));
    let grand = if grand.is_empty() { "/" } else { grand };
    // Cleanup runs on hosts without GPUs: a path that is not a directory holds nothing of
    // ours, and must not keep the machine from starting.
    if let Some(g) = open_dir_if_dir(root, grand)? {
        match g.open_subdir(pname)? {
            Subdir::Dir(parent) => {
                for n in [STAGING, name] {
                    match parent.remove_tree(n) {
                        Ok(true) => report.removed.push(parent.child(n)),
                        Ok(false) => {}
                        // The binds nspawn made at this boot (a post-start run by hand after
                        // the GPUs went): nothing points into them any more, and the next start
                        // renders none.
                        Err(e) => report.kept.push((
                            parent.child(n),
                            format!("this boot's driver binds, gone at the next start: {e:#}"),
                        )),
                    }
                }
                parent.sync()?;
            }
            Subdir::Missing => {}
            Subdir::Other(k) => report
                .kept
                .push((g.child(pname), format!("a {}, not ours", k.as_str()))),
        }
    }

    sync_all_lib_links(root, &BTreeMap::new(), &mut report)?;
    cleanup_dev_char_and_cdi(root, cdi_dir, cdi_file_name, &mut report)?;
    Ok(report)
}

/// Host mode's [`cleanup`]: our NVIDIA `/dev/char` links and our CDI spec. Nothing of
/// the driver: the host's is its installer's, and a `/run/nvidia/driver` on the host is someone
/// else's (the GPU operator's driver container), never ours.
pub fn cleanup_host(root: &MachineRoot, cdi_dir: &str, cdi_file_name: &str) -> Result<Report> {
    let mut report = Report::new("cleanup");
    check_spec_name(cdi_file_name)?;
    cleanup_dev_char_and_cdi(root, cdi_dir, cdi_file_name, &mut report)?;
    Ok(report)
}

fn cleanup_dev_char_and_cdi(
    root: &MachineRoot,
    cdi_dir: &str,
    cdi_file_name: &str,
    report: &mut Report,
) -> Result<()> {
    if let Some(dev_char) = open_dir_if_dir(root, DEV_CHAR)? {
        sync_dev_char(&dev_char, &BTreeMap::new(), report)?;
    }

    if let Some(d) = open_dir_if_dir(root, cdi_dir)? {
        match d.kind(cdi_file_name)? {
            None => {}
            Some(FileKind::Dir) => report.kept.push((
                d.child(cdi_file_name),
                "a directory, not a spec of ours".into(),
            )),
            Some(_) if d.remove_file(cdi_file_name)? => report.removed.push(d.child(cdi_file_name)),
            Some(_) => {}
        }
        // The temp name is ours whatever it holds (the same name `write_file` clears).
        let tmp = format!(".{cdi_file_name}.tmp");
        if d.remove_tree(&tmp)? {
            report.removed.push(d.child(&tmp));
        }
        d.sync()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn ld_cache_must_list_every_path_whole() {
        use crate::ldcache::{Entry, render};
        let cache = render(&[
            Entry::new(
                0x303,
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            ),
            Entry::new(
                0x303,
                "libnvidia-ml.so.1",
                "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            ),
            Entry::new(
                0x303,
                "libEGL_nvidia.so.0",
                "/usr/local/lib/x86_64-linux-gnu/libEGL_nvidia.so.0",
            ),
            // A key whose path is in another directory is no entry of the wanted one.
            Entry::new(0x303, "libGLX_nvidia.so.0", "/opt/libGLX_nvidia.so.0"),
        ]);
        let want = |names: &[&str]| -> Vec<String> {
            names
                .iter()
                .map(|n| format!("/lib/x86_64-linux-gnu/{n}"))
                .collect()
        };
        assert!(ld_cache_lists(
            &cache,
            &want(&["libcuda.so.1", "libnvidia-ml.so.1"])
        ));
        // Another dir's entry is not ours; a key without its path is no entry of that dir;
        // nothing wanted is no proof; neither is an unknown format.
        assert!(!ld_cache_lists(&cache, &want(&["libEGL_nvidia.so.0"])));
        assert!(!ld_cache_lists(&cache, &want(&["libGLX_nvidia.so.0"])));
        assert!(!ld_cache_lists(&cache, &[]));
        assert!(!ld_cache_lists(&cache[1..], &want(&["libcuda.so.1"])));
    }

    #[test]
    fn only_library_link_changes_count_for_ldconfig() {
        let mut r = Report::new("links");
        r.created.push("/dev/char/195:0".into());
        assert!(!library_links_changed(&r));
        r.removed
            .push("/usr/lib/x86_64-linux-gnu/libcuda.so.1".into());
        assert!(library_links_changed(&r));
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
    }
}
