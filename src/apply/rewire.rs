//! The writes of post-start's parts in a target (src/apply/parts/ says which part makes which):
//! links, `/dev/char`, the CDI spec, and what is left of ours where a target has no driver.
//!
//! Every directory is read, compared with what it must be by the model's own function
//! (src/model/links.rs, src/model/spec.rs), and changed, one directory at a time, so `status`
//! and `plan`, which read and compare with the same functions, see exactly what post-start
//! would change. Everything goes through a [`MachineRoot`], so a hostile rootfs cannot
//! redirect a write, a replace or a delete to the host. Each returns a [`Report`] logged as
//! one line.

use crate::failpoint::{self, Point};
use crate::fs::machine_root::{FileKind, LinkOutcome, MachineDir, MachineRoot, Subdir};
use crate::model::layout::DRIVER_ROOT;
use crate::model::links::{self, DEV_CHAR, LinkOp, open_dir_if_dir};
use crate::model::{STAGING, spec};
use anyhow::{Context as _, Result};
use std::collections::BTreeMap;
use std::fmt;

const DIR_MODE: u32 = 0o755;

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

/// Make one directory's link changes ([`links::DirDiff`]), reporting each, and name what was
/// left alone.
fn apply_dir(dir: &MachineDir, diff: &links::DirDiff, report: &mut Report) -> Result<()> {
    for (name, op) in &diff.ops {
        match op {
            LinkOp::Remove { .. } => {
                if dir.remove_file(name)? {
                    report.removed.push(dir.child(name));
                }
            }
            LinkOp::Create { target } | LinkOp::Replace { to: target, .. } => {
                let outcome = dir.symlink(name, target)?;
                report.link(dir.child(name), outcome);
                failpoint::hit(Point::MidLinks);
            }
        }
    }
    for (name, kind) in &diff.kept {
        report
            .kept
            .push((dir.child(name), format!("a {}", kind.as_str())));
    }
    Ok(())
}

/// Bring every library dir and the tool dir in line with `wanted` ([`links::each_lib_dir`]),
/// each directory read just before it is changed.
fn sync_lib_dirs(
    root: &MachineRoot,
    wanted: &BTreeMap<String, links::DirLinks>,
    report: &mut Report,
) -> Result<()> {
    let skipped = links::each_lib_dir(root, wanted, |dir, want| {
        let diff = links::diff_lib_dir(&links::observe_dir(dir, want)?, want);
        apply_dir(dir, &diff, report)
    })?;
    report.skipped.extend(skipped);
    Ok(())
}

/// `/dev/char` in line with `wanted`: ours that are not wanted removed, the wanted made.
fn sync_dev_char(dir: &MachineDir, wanted: &links::DirLinks, report: &mut Report) -> Result<()> {
    let diff = links::diff_dev_char(&links::observe_dir(dir, wanted)?, wanted);
    apply_dir(dir, &diff, report)
}

/// A machine's library links in line with `lib` (dir → name → target): SONAME and versioned
/// library links in each multiarch dir the machine has and the tool links in `/usr/bin`, stale
/// ones of ours removed (all of ours, with `lib` empty). `ldconfig` in the machine follows.
pub fn lib_links(root: &MachineRoot, lib: &BTreeMap<String, links::DirLinks>) -> Result<Report> {
    let mut report = Report::new("links");
    sync_lib_dirs(root, lib, &mut report)?;
    Ok(report)
}

/// `/dev/char/<major>:<minor>` for every NVIDIA node in `wanted`, stale NVIDIA ones removed.
/// `make`: the directory is made when missing (a wired target); otherwise a `/dev/char` that is
/// not a directory holds nothing of ours and is left alone.
pub fn dev_char(
    root: &MachineRoot,
    wanted: &links::DirLinks,
    make: bool,
    host_dev: Option<u64>,
) -> Result<Report> {
    let mut report = Report::new("/dev/char links");
    if let Some(dir) = dev_char_dir(root, make, host_dev)? {
        sync_dev_char(&dir, wanted, &mut report)?;
    }
    Ok(report)
}

/// The machine's `/dev/char`, opened so that no link is ever written into a directory of the
/// host's bound into the machine (`/dev/nvidia-caps` is one, writable): the machine's `/dev` is
/// not on the host's `/dev` filesystem (`host_dev`, its device number; `None` in host mode,
/// whose `/dev` is the host's), and `char` is a directory on that same filesystem, reached
/// without a link. Root in the machine can plant a link or bind a host directory there; either
/// is refused, naming it.
fn dev_char_dir(
    root: &MachineRoot,
    make: bool,
    host_dev: Option<u64>,
) -> Result<Option<MachineDir>> {
    let dev = if make {
        root.create_dir_all("/dev", 0o755)?
    } else {
        match open_dir_if_dir(root, "/dev")? {
            Some(d) => d,
            None => return Ok(None),
        }
    };
    let (fs, _) = dev.identity()?;
    if host_dev == Some(fs) {
        anyhow::bail!(
            "/dev in the machine is on the host's /dev filesystem (a host directory bound \
             there?); refusing to write {DEV_CHAR} links into it"
        );
    }
    let name = DEV_CHAR.trim_start_matches("/dev/");
    let dir = if make {
        dev.create_subdir(name, DIR_MODE)?
    } else {
        match dev.open_subdir(name)? {
            Subdir::Dir(d) => d,
            Subdir::Missing | Subdir::Other(_) => return Ok(None),
        }
    };
    if dir.identity()?.0 != fs {
        anyhow::bail!(
            "{DEV_CHAR} in the machine is another filesystem than its /dev (a host directory \
             bound there?); refusing to write links into it"
        );
    }
    Ok(Some(dir))
}

/// Write the CDI spec `dir/file_name` atomically (only when its bytes change), then remove every
/// other spec file a CDI consumer loads from `/etc/cdi`, `/var/run/cdi` and `dir` for which
/// `conflicts(name, bytes)` holds ([`spec::each_conflict`]; [`spec::Want::conflicts`] in the
/// product): dot-files too, and symlinks (read through, the link itself removed). `dir`
/// resolves in the machine (`/var/run` is usually a symlink to `/run` there). A spec file that
/// cannot be judged is kept and reported.
pub fn write_cdi(
    root: &MachineRoot,
    want: &spec::Want,
    conflicts: impl Fn(&str, &[u8]) -> bool,
) -> Result<Report> {
    let mut report = Report::new("CDI spec");
    spec::check_spec_name(&want.file)?;
    let bytes = want
        .bytes
        .as_deref()
        .context("writing a CDI spec without GPUs (a bug)")?;
    let out = root.create_dir_all(&want.dir, DIR_MODE)?;
    let existed = out.kind(&want.file)?.is_some();
    if out.write_file(&want.file, bytes, spec::SPEC_MODE, Point::MidCdiWrite)? {
        let p = out.child(&want.file);
        if existed {
            report.replaced.push(p);
        } else {
            report.created.push(p);
        }
    }
    spec::each_conflict(root, want, Some(out.identity()?), conflicts, |d, found| {
        for name in found.conflicts {
            if d.remove_file(&name)? {
                report.removed.push(d.child(&name));
            }
        }
        for (path, why) in found.unjudged {
            report.kept.push((
                path,
                format!("a spec file CDI consumers load, not judged: {why}"),
            ));
        }
        d.sync()
    })?;
    Ok(report)
}

/// A machine without a driver: its driver root and any staging leftover removed. A path on the
/// way that is not a directory holds nothing of ours (and must not keep the machine from
/// starting); this boot's binds cannot be removed and are reported kept (the next start renders
/// none). Idempotent.
pub fn remove_driver_root(root: &MachineRoot) -> Result<Report> {
    let mut report = Report::new("driver root");
    let (parent_path, name) = DRIVER_ROOT.rsplit_once('/').unwrap_or(("/", DRIVER_ROOT));
    let (grand, pname) = parent_path.rsplit_once('/').unwrap_or(("/", parent_path));
    let grand = if grand.is_empty() { "/" } else { grand };
    let Some(g) = open_dir_if_dir(root, grand)? else {
        return Ok(report);
    };
    match g.open_subdir(pname)? {
        Subdir::Dir(parent) => {
            for n in [STAGING, name] {
                match parent.remove_tree(n) {
                    Ok(true) => report.removed.push(parent.child(n)),
                    Ok(false) => {}
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
    Ok(report)
}

/// A target without GPUs: our spec file `dir/file_name` and its temp leftover removed (a
/// directory by that name is not ours and is kept). Nothing else: another spec of our kind is
/// not ours to judge without a spec of ours. Idempotent.
pub fn remove_spec(root: &MachineRoot, dir: &str, file_name: &str) -> Result<Report> {
    let mut report = Report::new("CDI spec");
    spec::check_spec_name(file_name)?;
    let Some(d) = open_dir_if_dir(root, dir)? else {
        return Ok(report);
    };
    match d.kind(file_name)? {
        None => {}
        Some(FileKind::Dir) => report
            .kept
            .push((d.child(file_name), "a directory, not a spec of ours".into())),
        Some(_) if d.remove_file(file_name)? => report.removed.push(d.child(file_name)),
        Some(_) => {}
    }
    // The temp name is ours whatever it holds (the same name `write_file` clears).
    let tmp = spec::tmp_name(file_name);
    if d.remove_tree(&tmp)? {
        report.removed.push(d.child(&tmp));
    }
    d.sync()?;
    Ok(report)
}
