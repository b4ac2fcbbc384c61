//! The CDI spec post-start keeps in a target: its file, written only when its bytes (or mode)
//! differ, and every other spec of our kind in the directories CDI consumers scan, which would
//! name the same devices twice and is removed.

use super::links::open_dir_if_dir;
use super::{Action, Change};
use crate::fs::machine_root::{FileKind, ImageFile, Lookup, MachineDir, MachineRoot, check_name};
use anyhow::{Context as _, Result, bail};
use std::collections::BTreeSet;

/// CDI spec directories every CDI consumer scans.
pub(crate) const CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
/// Largest CDI spec read.
pub const MAX_SPEC_BYTES: usize = 16 << 20;
/// The spec file's mode.
pub(crate) const SPEC_MODE: u32 = 0o644;

/// The spec a target must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The configuration's CDI directory (a machine path; `/var/run` usually is a link to `/run`).
    pub dir: String,
    pub file: String,
    /// The CDI kind (`nvidia.com/gpu`): another spec of it conflicts with ours.
    pub kind: String,
    /// Its bytes; `None` without GPUs: no spec of ours belongs there.
    pub bytes: Option<Vec<u8>>,
}

impl Want {
    /// Whether the spec file `name` holding `bytes` names devices of our kind: it goes.
    pub fn conflicts(&self, name: &str, bytes: &[u8]) -> bool {
        crate::model::cdi::conflicts(&self.kind, name, bytes)
    }

    /// The spec's machine path.
    pub fn path(&self) -> String {
        format!("{}/{}", self.dir.trim_end_matches('/'), self.file)
    }
}

/// The temp name `write_file` uses for `file` (a killed run's leftover).
pub(crate) fn tmp_name(file: &str) -> String {
    format!(".{file}.tmp")
}

/// The spec file name must be one name ending in `.json` or `.yaml`.
pub(crate) fn check_spec_name(file_name: &str) -> Result<()> {
    check_name(file_name).context("CDI spec file name")?;
    if file_name.starts_with('.') || !is_spec_name(file_name.as_bytes()) {
        bail!(
            "CDI spec file name {file_name:?} must end in .json or .yaml and not start with a dot"
        );
    }
    Ok(())
}

/// Whether a CDI consumer reads `name` as a spec: the Go library every engine uses
/// (`container-device-interface`, `scanSpecDirs`) reads every entry of a spec directory that is
/// not a directory and whose extension is `.json` or `.yaml`: dot-files and symlinks included,
/// the latter followed.
pub(crate) fn is_spec_name(name: &[u8]) -> bool {
    name.ends_with(b".json") || name.ends_with(b".yaml")
}

/// Most bytes read from all the spec directories in one run (each file at most
/// [`MAX_SPEC_BYTES`]): the machine writes them, so the work of judging them is bounded. Real
/// specs are kilobytes; what lies past the bound is reported, not read.
pub const MAX_SPEC_DIRS_BYTES: usize = 64 << 20;
/// Most entries of one spec directory judged.
pub const MAX_SPEC_DIR_ENTRIES: usize = 4096;

/// What [`each_conflict`] found in one spec directory: the names of the specs of our kind
/// (regular files, or symlinks a consumer follows to one: the name itself goes, never what it
/// points to), and the spec files it could not judge, with why (their machine paths).
#[derive(Debug, Default)]
pub(crate) struct DirJudged {
    pub conflicts: Vec<String>,
    pub unjudged: Vec<(String, String)>,
}

/// Every other spec file that conflicts with ours, per directory (each directory once, by
/// identity): the files of `/etc/cdi`, `/var/run/cdi` and `want.dir` that a CDI consumer loads
/// ([`is_spec_name`]; read as it reads them, through symlinks, inside the machine) and for
/// which `conflicts(name, bytes)` holds ([`Want::conflicts`] in the product), never ours
/// (`ours`: our directory's identity). A file that cannot be judged within the bounds (larger
/// than [`MAX_SPEC_BYTES`], past [`MAX_SPEC_DIRS_BYTES`] in all, a FIFO or device, a kernel
/// pseudo-file, a name that is not UTF-8) is reported, never read. Reads only; `each` gets each
/// directory with what was found there.
pub(crate) fn each_conflict(
    root: &MachineRoot,
    want: &Want,
    ours: Option<(u64, u64)>,
    conflicts: impl Fn(&str, &[u8]) -> bool,
    mut each: impl FnMut(&MachineDir, DirJudged) -> Result<()>,
) -> Result<()> {
    let mut seen = BTreeSet::new();
    let mut budget = MAX_SPEC_DIRS_BYTES;
    for spec_dir in CDI_SPEC_DIRS.iter().copied().chain([want.dir.as_str()]) {
        // Something that is not a directory holds no specs.
        let Some(d) = open_dir_if_dir(root, spec_dir)? else {
            continue;
        };
        let id = d.identity()?;
        if !seen.insert(id) {
            continue;
        }
        let mut found = DirJudged::default();
        let entries = d.entries()?;
        let judged = entries.len().min(MAX_SPEC_DIR_ENTRIES);
        for (name, kind) in &entries[..judged] {
            let raw = name.as_encoded_bytes();
            if !is_spec_name(raw) {
                continue;
            }
            let Some(name) = name.to_str() else {
                found.unjudged.push((
                    d.child(&name.to_string_lossy()),
                    "its name is not UTF-8".into(),
                ));
                continue;
            };
            if Some(id) == ours && name == want.file {
                continue;
            }
            let kind = match kind {
                Some(k) => Some(*k),
                None => d.kind(name)?,
            };
            if kind.is_none_or(FileKind::is_dir) {
                continue;
            }
            let max = MAX_SPEC_BYTES.min(budget);
            match root.read_followed(&d.child(name), max)? {
                ImageFile::Absent => {}
                ImageFile::Bytes(bytes) => {
                    budget -= bytes.len();
                    if conflicts(name, &bytes) {
                        found.conflicts.push(name.to_owned());
                    }
                }
                ImageFile::Unusable(why) if max < MAX_SPEC_BYTES => found.unjudged.push((
                    d.child(name),
                    format!(
                        "{why} (what was left of the {MAX_SPEC_DIRS_BYTES} bytes judged in the \
                         spec directories in one run)"
                    ),
                )),
                ImageFile::Unusable(why) => found.unjudged.push((d.child(name), why)),
            }
        }
        if entries.len() > judged {
            found.unjudged.push((
                d.path().to_owned(),
                format!(
                    "{} entries past the {MAX_SPEC_DIR_ENTRIES} judged in one directory",
                    entries.len() - judged
                ),
            ));
        }
        each(&d, found)?;
    }
    Ok(())
}

/// The spec file as found: its kind, mode and size, and its bytes when it is a regular file of
/// the size of ours (nothing else can be ours).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSeen {
    /// Its path as resolved in the machine.
    pub path: String,
    pub kind: FileKind,
    pub mode: u32,
    pub size: u64,
    pub bytes: Option<Vec<u8>>,
}

/// The spec part of a target as read ([`observe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// A killed run's temp file beside the spec (its path).
    pub leftover: Option<String>,
    /// The spec file; `None` when missing.
    pub file: Option<FileSeen>,
    /// Other specs of our kind (their paths), looked for only where a spec of ours belongs.
    pub conflicts: Vec<String>,
    /// Spec files a CDI consumer loads that could not be judged (their paths, and why).
    pub unjudged: Vec<(String, String)>,
}

/// Read the spec part through `root`: the configured directory's spec file and temp leftover,
/// and, where a spec of ours belongs, every other spec of our kind ([`each_conflict`]). An error
/// where post-start would fail before writing (a bad name, the directory not a directory).
/// Reads only.
pub fn observe(root: &MachineRoot, want: &Want) -> Result<Seen> {
    check_spec_name(&want.file)?;
    let dir = match root.lookup_dir(&want.dir)? {
        Lookup::Dir(d) => Some(d),
        Lookup::Missing => None,
        Lookup::NotDir => bail!(
            "{} in the machine is not a directory (or one of its parents is not)",
            want.dir
        ),
    };
    let mut seen = Seen {
        leftover: None,
        file: None,
        conflicts: Vec::new(),
        unjudged: Vec::new(),
    };
    if let Some(d) = &dir {
        let tmp = tmp_name(&want.file);
        if d.kind(&tmp)?.is_some() {
            seen.leftover = Some(d.child(&tmp));
        }
        if let Some(st) = d.stat(&want.file)? {
            let kind = FileKind::from_stat(&st);
            let size = u64::try_from(st.st_size).unwrap_or(0);
            let bytes = match &want.bytes {
                Some(b) if kind == FileKind::File && size == b.len() as u64 => {
                    d.read_regular(&want.file, b.len())?
                }
                _ => None,
            };
            seen.file = Some(FileSeen {
                path: d.child(&want.file),
                kind,
                mode: st.st_mode & 0o7777,
                size,
                bytes,
            });
        }
    }
    if want.bytes.is_some() {
        let ours = dir.as_ref().map(MachineDir::identity).transpose()?;
        each_conflict(
            root,
            want,
            ours,
            |n, b| want.conflicts(n, b),
            |d, found| {
                seen.conflicts
                    .extend(found.conflicts.iter().map(|n| d.child(n)));
                seen.unjudged.extend(found.unjudged);
                Ok(())
            },
        )?;
    }
    Ok(seen)
}

/// What post-start would change of the spec `seen` to make it `want`: writes of ours, removals
/// of a leftover or of others of our kind. An error where post-start would fail. Pure.
pub fn diff(want: &Want, seen: &Seen) -> Result<Vec<Change>> {
    let change = |path: String, action: Action, why: &str| Change {
        check: super::Check::CdiSpec,
        action,
        path,
        detail: why.to_owned(),
    };
    let path = want.path();
    let mut out: Vec<Change> = seen
        .leftover
        .iter()
        .map(|p| change(p.clone(), Action::Remove, "left by a killed run"))
        .collect();
    let Some(bytes) = &want.bytes else {
        if seen.file.as_ref().is_some_and(|f| f.kind != FileKind::Dir) {
            out.push(change(path, Action::Remove, "no GPUs: no spec of ours"));
        }
        return Ok(out);
    };
    match &seen.file {
        None => out.push(change(path, Action::Write, "missing")),
        Some(f) if f.kind == FileKind::Dir => bail!(
            "{} in the machine is a directory where a file is expected",
            f.path
        ),
        Some(f) => {
            let ours = f.kind == FileKind::File
                && f.mode == SPEC_MODE
                && f.size == bytes.len() as u64
                && f.bytes.as_deref() == Some(bytes.as_slice());
            if !ours {
                out.push(change(
                    path,
                    Action::Write,
                    "differs from what post-start writes for the host now",
                ));
            }
        }
    }
    for c in &seen.conflicts {
        out.push(change(
            c.clone(),
            Action::Remove,
            &format!("another spec of kind {}", want.kind),
        ));
    }
    for (p, why) in &seen.unjudged {
        out.push(change(
            p.clone(),
            Action::Keep,
            &format!(
                "a spec file CDI consumers load that was not judged ({why}): should it name \
                 devices of kind {}, containerd drops every one of them",
                want.kind
            ),
        ));
    }
    Ok(out)
}
