//! The CDI spec post-start keeps in a target: its file, written only when its bytes (or mode)
//! differ, and every other spec of our kind in the directories CDI consumers scan, which would
//! name the same devices twice and is removed.

use super::links::open_dir_if_dir;
use super::{Action, Change};
use crate::fs::machine_root::{FileKind, Lookup, MachineDir, MachineRoot, check_name};
use anyhow::{Context as _, Result, bail};
use std::collections::BTreeSet;

/// CDI spec directories every CDI consumer scans.
pub const CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
/// Largest CDI spec read.
pub const MAX_SPEC_BYTES: usize = 16 << 20;
/// The spec file's mode.
pub const SPEC_MODE: u32 = 0o644;

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
pub fn tmp_name(file: &str) -> String {
    format!(".{file}.tmp")
}

/// The spec file name must be one name ending in `.json` or `.yaml`.
pub fn check_spec_name(file_name: &str) -> Result<()> {
    check_name(file_name).context("CDI spec file name")?;
    if !is_spec_name(file_name) {
        bail!("CDI spec file name {file_name:?} must end in .json or .yaml");
    }
    Ok(())
}

/// Whether a CDI consumer reads `name` as a spec.
pub fn is_spec_name(name: &str) -> bool {
    !name.starts_with('.') && (name.ends_with(".json") || name.ends_with(".yaml"))
}

/// Every other spec file that conflicts with ours, per directory (each directory once, by
/// identity): the regular spec files of `/etc/cdi`, `/var/run/cdi` and `want.dir` for which
/// `conflicts(name, bytes)` holds ([`Want::conflicts`] in the product), never ours (`ours`: our
/// directory's identity). Specs that are symlinks are not read. Reads only; `each` gets each
/// directory with its conflicting names.
pub fn each_conflict(
    root: &MachineRoot,
    want: &Want,
    ours: Option<(u64, u64)>,
    conflicts: impl Fn(&str, &[u8]) -> bool,
    mut each: impl FnMut(&MachineDir, Vec<String>) -> Result<()>,
) -> Result<()> {
    let mut seen = BTreeSet::new();
    for spec_dir in CDI_SPEC_DIRS.iter().copied().chain([want.dir.as_str()]) {
        // Something that is not a directory holds no specs.
        let Some(d) = open_dir_if_dir(root, spec_dir)? else {
            continue;
        };
        let id = d.identity()?;
        if !seen.insert(id) {
            continue;
        }
        let mut names = Vec::new();
        for (name, kind) in d.entries()? {
            let Some(name) = name.to_str() else { continue };
            if !is_spec_name(name) || (Some(id) == ours && name == want.file) {
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
            if conflicts(name, &bytes) {
                names.push(name.to_owned());
            }
        }
        each(&d, names)?;
    }
    Ok(())
}

/// Whether `name` in `d` is exactly the spec post-start writes (bytes and mode); `None` when
/// there is no such file. A directory there is an error: post-start would fail on it.
fn holds(d: &MachineDir, name: &str, bytes: &[u8]) -> Result<Option<bool>> {
    Ok(match d.stat(name)? {
        None => None,
        Some(st) if FileKind::from_stat(&st) == FileKind::Dir => bail!(
            "{} in the machine is a directory where a file is expected",
            d.child(name)
        ),
        Some(st) => Some(
            FileKind::from_stat(&st) == FileKind::File
                && st.st_mode & 0o7777 == SPEC_MODE
                && u64::try_from(st.st_size).ok() == Some(bytes.len() as u64)
                && d.read_regular(name, bytes.len())?.as_deref() == Some(bytes),
        ),
    })
}

/// What post-start would change of the spec, read through `root`: writes of ours, removals of a
/// leftover or of others of our kind. An error where post-start would fail. Reads only.
pub fn pending(root: &MachineRoot, want: &Want) -> Result<Vec<Change>> {
    let change = |path: String, action: Action, why: &str| Change {
        check: "cdi-spec",
        action,
        path,
        detail: why.to_owned(),
    };
    check_spec_name(&want.file)?;
    let path = want.path();
    let mut out = Vec::new();
    let dir = match root.lookup_dir(&want.dir)? {
        Lookup::Dir(d) => Some(d),
        Lookup::Missing => None,
        Lookup::NotDir => bail!(
            "{} in the machine is not a directory (or one of its parents is not)",
            want.dir
        ),
    };
    if let Some(d) = &dir
        && d.kind(&tmp_name(&want.file))?.is_some()
    {
        out.push(change(
            d.child(&tmp_name(&want.file)),
            Action::Remove,
            "left by a killed run",
        ));
    }
    let Some(bytes) = &want.bytes else {
        match dir
            .as_ref()
            .map(|d| d.kind(&want.file))
            .transpose()?
            .flatten()
        {
            None | Some(FileKind::Dir) => {}
            Some(_) => out.push(change(path, Action::Remove, "no GPUs: no spec of ours")),
        }
        return Ok(out);
    };
    let current = match &dir {
        None => None,
        Some(d) => holds(d, &want.file, bytes)?,
    };
    match current {
        None => out.push(change(path, Action::Write, "missing")),
        Some(false) => out.push(change(
            path,
            Action::Write,
            "differs from what post-start writes for the host now",
        )),
        Some(true) => {}
    }
    let ours = dir.as_ref().map(MachineDir::identity).transpose()?;
    each_conflict(
        root,
        want,
        ours,
        |n, b| want.conflicts(n, b),
        |d, names| {
            for n in names {
                out.push(change(
                    d.child(&n),
                    Action::Remove,
                    &format!("another spec of kind {}", want.kind),
                ));
            }
            Ok(())
        },
    )?;
    Ok(out)
}
