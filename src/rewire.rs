//! Rebuilding NVIDIA state inside the machine (DESIGN §5): the driver root, the library and
//! `/dev/char` links, the CDI spec, and their removal on a host without GPUs.
//!
//! Everything goes through a [`MachineRoot`], so a hostile rootfs cannot redirect a write, a
//! replace or a delete to the host. Each step returns a [`Report`] the caller logs as one line.
//!
//! Link targets:
//! - Driver-root leaves are absolute links into [`HOST_NVIDIA`] (where the `.nspawn` binds the
//!   host's files); its SONAME links are relative (`libcuda.so.1 → libcuda.so.<ver>`), as in a
//!   host install.
//! - In the machine's multiarch dir, versioned names point into the driver root at the same
//!   name (`libcuda.so.<ver> → /run/nvidia/driver/usr/lib/<triplet>/libcuda.so.<ver>`), never at
//!   `/run/host-nvidia/lib/<n>`: the driver root is swapped as one unit, and its shape does not
//!   depend on how discovery numbered the host's library dirs. SONAME names point at the
//!   versioned name beside them (`libcuda.so.1 → libcuda.so.<ver>`): exactly what `ldconfig`
//!   writes, so the `ldconfig` run that follows leaves them alone and the next start finds
//!   nothing to change.
//! - `/dev/char/<major>:<minor>` links use absolute targets (`/dev/nvidia0`). udev writes
//!   relative ones (`../nvidia0`), so an absolute `/dev/dri/*` target is how cleanup knows a DRM
//!   link is ours once the GPU, and with it the major/minor we could match, is gone.

use crate::discovery::{Inventory, UserspaceDriver};
use crate::failpoint::{self, Point};
use crate::layout::{DRIVER_ROOT, EntryKind, HOST_NVIDIA, driver_entries};
use crate::machine_root::{
    FileKind, LinkOutcome, Lookup, MachineDir, MachineRoot, Subdir, check_name, components,
};
use anyhow::{Context as _, Result, bail};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

/// Staging name beside the driver root; a crashed run's leftover is removed by the next run.
const STAGING: &str = ".driver.new";
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
/// How the cache formats glibc reads begin (the new one, and the old one the new follows).
const LD_CACHE_MAGICS: [&[u8]; 2] = [b"glibc-ld.so.cache1.1", b"ld.so-1.7.0"];
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

/// One node of the driver-root tree, by path relative to the driver root.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir,
    Link(String),
}

/// The driver root as it should be: every entry of [`driver_entries`] at its standard path, a
/// symlink to where the machine sees the host file, with every parent directory.
fn desired_driver_tree(driver: &UserspaceDriver) -> Result<BTreeMap<String, Node>> {
    let mut tree = BTreeMap::new();
    for entry in driver_entries(driver) {
        let comps = components(&entry.path)
            .with_context(|| format!("driver file {} from host discovery", entry.path))?;
        let Some((_, parents)) = comps.split_last() else {
            bail!(
                "driver file {:?} from host discovery has no name",
                entry.path
            );
        };
        let rel = comps.join("/");
        // Two host dirs of one triplet: the first (native, per discovery order) wins.
        if tree.contains_key(&rel) {
            continue;
        }
        for i in 1..=parents.len() {
            let dir = parents[..i].join("/");
            match tree.get(&dir) {
                Some(Node::Link(_)) => {
                    bail!(
                        "driver file {} from host discovery is under a file",
                        entry.path
                    )
                }
                Some(Node::Dir) => {}
                None => {
                    tree.insert(dir, Node::Dir);
                }
            }
        }
        tree.insert(rel, Node::Link(entry.source.clone()));
    }
    Ok(tree)
}

/// The parent of the driver root and its name: (`/run/nvidia`, `driver`).
fn driver_root_parent() -> (&'static str, &'static str) {
    DRIVER_ROOT.rsplit_once('/').unwrap_or(("/", DRIVER_ROOT))
}

/// Open `/run/nvidia` (creating it): resolved in the machine up to `/run`, and the last
/// component, which the helper owns, never followed when it is a symlink.
fn driver_root_parent_dir(root: &MachineRoot) -> Result<MachineDir> {
    let (parent, _) = driver_root_parent();
    let (grand, name) = parent.rsplit_once('/').unwrap_or(("/", parent));
    let grand = if grand.is_empty() { "/" } else { grand };
    let g = if grand == "/" {
        root.root_dir()?
    } else {
        root.create_dir_all(grand, DIR_MODE)?
    };
    g.create_subdir(name, DIR_MODE)
}

/// Build the driver root `/run/nvidia/driver` for `driver`: staged beside the old tree, swapped
/// in with one `renameat2(RENAME_EXCHANGE)`, the old tree removed afterwards. Leftover staging
/// trees are removed first; an identical tree is left untouched.
pub fn build_driver_root(root: &MachineRoot, driver: &UserspaceDriver) -> Result<Report> {
    let mut report = Report::new("driver root");
    let desired = desired_driver_tree(driver)?;
    let (_, name) = driver_root_parent();
    let parent = driver_root_parent_dir(root)?;

    if parent.remove_tree(STAGING)? {
        report.removed.push(parent.child(STAGING));
    }
    if let Subdir::Dir(current) = parent.open_subdir(name)?
        && tree_matches(&current, &desired)?
    {
        return Ok(report);
    }

    let staging = parent.create_subdir(STAGING, DIR_MODE)?;
    let mut dirs: BTreeMap<&str, MachineDir> = BTreeMap::new();
    for (rel, node) in &desired {
        let (dir_rel, leaf) = rel.rsplit_once('/').unwrap_or(("", rel.as_str()));
        let dir = if dir_rel.is_empty() {
            &staging
        } else {
            dirs.get(dir_rel)
                .with_context(|| format!("driver root: {dir_rel} was not created"))?
        };
        match node {
            Node::Dir => {
                let d = dir.create_subdir(leaf, DIR_MODE)?;
                dirs.insert(rel, d);
            }
            Node::Link(target) => {
                if dir.symlink(leaf, target)? != LinkOutcome::Created {
                    bail!(
                        "{} in the machine changed while it was being built",
                        dir.child(leaf)
                    );
                }
            }
        }
        failpoint::hit(Point::MidDriverRoot);
    }
    drop(dirs);
    staging.sync()?;

    let path = parent.child(name);
    match parent.kind(name)? {
        None => {
            parent.rename_noreplace(STAGING, name)?;
            report.created.push(path);
        }
        Some(_) => {
            parent.exchange(STAGING, name)?;
            report.replaced.push(path);
            // The old tree now sits at the staging name. A crash right here leaves it for the
            // next run's leftover removal; readers already see the new tree.
            failpoint::hit(Point::AfterDriverRootSwap);
            parent.remove_tree(STAGING)?;
        }
    }
    parent.sync()?;
    Ok(report)
}

/// Whether the directory holds exactly `desired` (types, modes, link targets), nothing more.
fn tree_matches(dir: &MachineDir, desired: &BTreeMap<String, Node>) -> Result<bool> {
    let Some(found) = dir.walk(desired.len())? else {
        return Ok(false);
    };
    if found.len() != desired.len() {
        return Ok(false);
    }
    Ok(found.iter().all(|e| match desired.get(&e.path) {
        Some(Node::Dir) => e.kind == FileKind::Dir && e.mode == DIR_MODE,
        Some(Node::Link(t)) => e.kind == FileKind::Symlink && e.target.as_deref() == Some(t),
        None => false,
    }))
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
    is_under(&t, HOST_NVIDIA) || is_under(&t, DRIVER_ROOT)
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

/// Links wanted in the machine's library dirs: `/usr/lib/<triplet>[/sub]` → name → target.
fn desired_lib_links(driver: &UserspaceDriver) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for entry in driver_entries(driver) {
        let target = match entry.kind {
            EntryKind::Library => format!("{DRIVER_ROOT}{}", entry.path),
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

/// Bring every library dir in line: the dirs in `desired` that the machine has (never created:
/// no foreign architecture's dir appears), then every other multiarch dir with nothing desired,
/// so links of a library, version or architecture that went away are removed too.
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
    for dir_path in machine_lib_dirs(root)? {
        if let Some(dir) = open_dir_if_dir(root, &dir_path)?
            && seen.insert(dir.identity()?)
        {
            sync_lib_links(&dir, &none, report)?;
        }
    }
    Ok(())
}

/// Rebuild the links in the machine: SONAME and versioned library links in each multiarch dir
/// the machine has (stale ones removed first), and `/dev/char/<major>:<minor>` for every NVIDIA
/// node (stale NVIDIA ones removed). `ldconfig` in the machine is the caller's next step.
pub fn rebuild_links(root: &MachineRoot, inv: &Inventory) -> Result<Report> {
    let mut report = Report::new("links");
    let desired = inv
        .driver
        .as_ref()
        .map(desired_lib_links)
        .unwrap_or_default();
    sync_all_lib_links(root, &desired, &mut report)?;

    let dev_char = root.create_dir_all(DEV_CHAR, DIR_MODE)?;
    let mut wanted = BTreeMap::new();
    for d in &inv.devices {
        if d.path.starts_with("/dev/") {
            wanted
                .entry(format!("{}:{}", d.major, d.minor))
                .or_insert_with(|| d.path.to_string());
        }
    }
    sync_dev_char(&dev_char, &wanted, &mut report)?;
    Ok(report)
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

/// Whether `cache` (the bytes of an `ld.so.cache`) holds every path in `wanted`
/// (`/lib/<triplet>/<name>`), written `/lib/…` or `/usr/lib/…` (one dir under usrmerge), as a
/// whole NUL-terminated string: entries' paths in its string table. A path stored only as the
/// tail of a longer string is not found, which costs an `ldconfig` run, never a stale cache.
fn ld_cache_lists(cache: &[u8], wanted: &[String]) -> bool {
    if wanted.is_empty() || !LD_CACHE_MAGICS.iter().any(|m| cache.starts_with(m)) {
        return false;
    }
    let have: HashSet<&[u8]> = cache
        .split(|&b| b == 0)
        .map(|s| match s.strip_prefix(b"/usr") {
            Some(rest) if rest.starts_with(b"/lib/") => rest,
            _ => s,
        })
        .collect();
    wanted.iter().all(|w| have.contains(w.as_bytes()))
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
                    if parent.remove_tree(n)? {
                        report.removed.push(parent.child(n));
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

    if let Some(dev_char) = open_dir_if_dir(root, DEV_CHAR)? {
        sync_dev_char(&dev_char, &BTreeMap::new(), &mut report)?;
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
    Ok(report)
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
        let mut cache = b"glibc-ld.so.cache1.1\x03\x00\x00\x00".to_vec();
        for s in [
            "libcuda.so.1",
            "libGLX_nvidia.so.0",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            "/usr/local/lib/x86_64-linux-gnu/libEGL_nvidia.so.0",
        ] {
            cache.extend_from_slice(s.as_bytes());
            cache.push(0);
        }
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
