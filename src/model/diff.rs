//! What a target holds of its [`Desired`] state ([`observe`]: reads only, through its root) and
//! what post-start would change there to make it so ([`diff`]: pure). [`pending`] is the two in
//! a row, which `status` and `plan` show; post-start applies the same per-part differences
//! (src/apply/rewire.rs).

use super::links::{self, DirLinks, DirSeen};
use super::{Action, Change, Desired, STAGING, Target, driver_root, gate, ld_cache, spec};
use crate::fs::machine_root::{FileKind, Lookup, MachineRoot, Subdir};
use crate::model::layout::{DRIVER_ROOT, HOOK_BINARY};
use crate::types::paths::UnitName;
use anyhow::Result;
use std::collections::BTreeMap;

/// A target's parts as read by [`observe`]. A part that could not be read keeps its error, which
/// [`diff`] turns into a change that fails ([`Action::Fails`]), as post-start would.
#[derive(Debug)]
pub struct Observed {
    /// A machine's driver root (host mode has none).
    pub driver_root: Option<Result<DriverRootSeen>>,
    /// The helper binary bound into a machine at its start (device and inode), when there.
    pub hook_binary: Result<Option<(u64, u64)>>,
    /// A machine's library and tool directories, each with the links wanted there (host mode
    /// has none).
    pub lib_dirs: Option<Result<Vec<(DirSeen, DirLinks)>>>,
    pub dev_char: Result<DevCharSeen>,
    /// Whether the loader cache lists the driver's libraries (with a driver only).
    pub ld_cache_lists: Option<Result<bool>>,
    pub spec: Result<spec::Seen>,
    /// Each gated unit: whether the gate holds it, and whether its marker is there.
    pub gate: Result<Vec<(UnitName, bool, bool)>>,
    /// A machine's device binds of its next start that it lacks now ([`missing_devices`]).
    pub host_devices: Option<Result<Vec<String>>>,
}

/// The driver root as found: against the expected tree (a wired machine), or what is left of
/// one without a driver (each name, and whether it is a read-only directory: this boot's binds).
#[derive(Debug)]
pub enum DriverRootSeen {
    Expected(driver_root::Seen),
    Leftovers(Vec<(String, bool)>),
}

/// `/dev/char` as found.
#[derive(Debug)]
pub enum DevCharSeen {
    Dir(DirSeen),
    Missing,
    NotDir,
}

/// Read every part of `d` in the target at `root`. Reads only.
pub fn observe(root: &MachineRoot, d: &Desired) -> Observed {
    Observed {
        driver_root: (d.target == Target::Machine).then(|| observe_driver_root(root, d)),
        hook_binary: match d.target {
            Target::Machine => observe_hook_binary(root),
            Target::Host => Ok(None),
        },
        lib_dirs: d.lib_links.as_ref().map(|w| observe_lib_dirs(root, w)),
        dev_char: observe_dev_char(root, d),
        ld_cache_lists: d
            .driver
            .as_ref()
            .map(|driver| ld_cache::lists_driver(root, driver)),
        spec: spec::observe(root, &d.spec),
        gate: observe_gate(root, d),
        host_devices: d
            .start
            .as_ref()
            .map(|start| missing_devices(root, &start.file)),
    }
}

/// Everything post-start run now would change in a target that holds `seen` to make it `d`, in
/// the order it would. Pure.
pub fn diff(d: &Desired, seen: &Observed) -> Vec<Change> {
    let mut out = Vec::new();
    let mut part = |check: &'static str, r: Result<Vec<Change>>| match r {
        Ok(changes) => out.extend(changes),
        Err(e) => out.push(Change::new(
            check,
            Action::Fails,
            String::new(),
            format!("{e:#}"),
        )),
    };
    if let Some(r) = &seen.driver_root {
        part("driver-root", read(r).map(|s| driver_root_changes(d, s)));
    }
    part("helper", helper_changes(d, seen));
    let lib = seen
        .lib_dirs
        .as_ref()
        .map(|r| read(r).map(|dirs| lib_link_changes(dirs)));
    let links_changed = matches!(&lib, Some(Ok(c)) if !c.is_empty());
    if let Some(r) = lib {
        part("links", r);
    }
    part(
        "dev-char",
        read(&seen.dev_char).and_then(|s| dev_char_changes(d, s)),
    );
    if let Some(r) = &seen.ld_cache_lists {
        part(
            "ld-cache",
            read(r).map(|lists| {
                let why = match (links_changed, *lists) {
                    (true, _) => "library links change",
                    (false, false) => "/etc/ld.so.cache does not list the driver's libraries",
                    (false, true) => return Vec::new(),
                };
                vec![Change::new("ld-cache", Action::Run, "ldconfig".into(), why)]
            }),
        );
    }
    part(
        "cdi-spec",
        read(&seen.spec).and_then(|s| spec::diff(&d.spec, s)),
    );
    part("gate", read(&seen.gate).map(|g| gate_changes(g)));
    if let Some(r) = &seen.host_devices {
        part(
            "host-devices",
            read(r).map(|missing| {
                missing
                    .iter()
                    .map(|p| {
                        Change::new(
                            "host-devices",
                            Action::Restart,
                            p.clone(),
                            "the host has this device now and the running machine lacks it: \
                             the next start binds it",
                        )
                    })
                    .collect()
            }),
        );
    }
    out
}

/// Everything post-start run now would change in the target at `root` to make it `d`:
/// [`diff`] of what [`observe`] reads. Reads only.
pub fn pending(root: &MachineRoot, d: &Desired) -> Vec<Change> {
    diff(d, &observe(root, d))
}

/// The device binds of `file` (`Bind=/dev/…`, the node or directory at the same path) that the
/// machine at `root` lacks: nothing, or something else than a device node or directory, at that
/// path. Reads only, through the machine's root.
fn missing_devices(root: &MachineRoot, file: &super::nspawn::NspawnFile) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for b in &file.binds {
        let path = b.target.as_str();
        if !path.starts_with("/dev/") || b.source.as_str() != path {
            continue;
        }
        let present = matches!(
            root.kind_of(path)?,
            Some(FileKind::CharDevice | FileKind::BlockDevice | FileKind::Dir)
        );
        if !present {
            out.push(path.to_owned());
        }
    }
    Ok(out)
}

/// A part as read, or why it could not be read (the error, as its message).
fn read<T>(r: &Result<T>) -> Result<&T> {
    r.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))
}

fn observe_driver_root(root: &MachineRoot, d: &Desired) -> Result<DriverRootSeen> {
    if let Some(want) = &d.driver_root {
        return Ok(DriverRootSeen::Expected(driver_root::observe(root, want)?));
    }
    let (parent, name) = DRIVER_ROOT.rsplit_once('/').unwrap_or(("/", DRIVER_ROOT));
    let mut left = Vec::new();
    if let Lookup::Dir(dir) = root.lookup_dir(parent)? {
        for n in [STAGING, name] {
            let Some(kind) = dir.kind(n)? else { continue };
            let bound = kind == FileKind::Dir
                && matches!(dir.open_subdir(n)?, Subdir::Dir(sub) if sub.read_only()?);
            left.push((dir.child(n), bound));
        }
    }
    Ok(DriverRootSeen::Leftovers(left))
}

/// The driver root: wired, it must be the host's driver as [`driver_root::Expected`] says (only
/// a new start mends it); without a driver, it and a staging leftover go (a bind made at this
/// boot only with the next start).
fn driver_root_changes(d: &Desired, seen: &DriverRootSeen) -> Vec<Change> {
    match (seen, &d.driver_root) {
        (DriverRootSeen::Expected(s), Some(want)) => driver_root::diff(want, s)
            .message(want)
            .map(|why| Change::new("driver-root", Action::Restart, DRIVER_ROOT.into(), why))
            .into_iter()
            .collect(),
        (DriverRootSeen::Leftovers(left), _) => left
            .iter()
            .map(|(path, bound)| {
                if *bound {
                    Change::new(
                        "stale-nvidia-state",
                        Action::Restart,
                        path.clone(),
                        "this boot's driver binds, gone at the next start",
                    )
                } else {
                    Change::new(
                        "stale-nvidia-state",
                        Action::Remove,
                        path.clone(),
                        "no NVIDIA driver for this machine",
                    )
                }
            })
            .collect(),
        (DriverRootSeen::Expected(_), None) => Vec::new(),
    }
}

fn observe_hook_binary(root: &MachineRoot) -> Result<Option<(u64, u64)>> {
    Ok(root
        .pin_no_symlinks(HOOK_BINARY)?
        .and_then(|fd| nix::sys::stat::fstat(&fd).ok())
        .map(|st| (st.st_dev, st.st_ino)))
}

/// The installed helper must be a working binary (the units run it: the next post-start, the
/// next start). A machine's CDI hooks run the helper bound at its start: another than the
/// installed one (upgraded since) is picked up only by a new start.
fn helper_changes(d: &Desired, seen: &Observed) -> Result<Vec<Change>> {
    let h = &d.helper;
    if let Some(problem) = &h.problem {
        return Ok(vec![Change::new(
            "helper",
            Action::Fails,
            h.path.clone(),
            problem.clone(),
        )]);
    }
    Ok(match read(&seen.hook_binary)? {
        Some(b) if Some(*b) != h.identity => vec![Change::new(
            "helper",
            Action::Restart,
            HOOK_BINARY.into(),
            format!(
                "the CDI hooks run the helper as it was at the machine's start, not the one \
                 installed now at {}",
                h.path
            ),
        )],
        _ => Vec::new(),
    })
}

/// A link change as a [`Change`].
fn link_change<'a>(
    check: &'static str,
    diff: &'a links::DirDiff,
) -> impl Iterator<Item = Change> + 'a {
    diff.ops.iter().map(move |(name, op)| {
        let path = diff.child(name);
        match op {
            links::LinkOp::Create { target } => {
                Change::new(check, Action::Create, path, format!("-> {target}"))
            }
            links::LinkOp::Replace { from, to } => Change::new(
                check,
                Action::Replace,
                path,
                format!(
                    "-> {to}, was -> {}",
                    from.as_deref().unwrap_or("(not UTF-8)")
                ),
            ),
            links::LinkOp::Remove { target } => {
                Change::new(check, Action::Remove, path, format!("-> {target}"))
            }
        }
    })
}

fn observe_lib_dirs(
    root: &MachineRoot,
    wanted: &BTreeMap<String, DirLinks>,
) -> Result<Vec<(DirSeen, DirLinks)>> {
    let mut out = Vec::new();
    links::each_lib_dir(root, wanted, |dir, want| {
        out.push((links::observe_dir(dir, want)?, want.clone()));
        Ok(())
    })?;
    Ok(out)
}

fn lib_link_changes(dirs: &[(DirSeen, DirLinks)]) -> Vec<Change> {
    dirs.iter()
        .flat_map(|(seen, want)| {
            let diff = links::diff_lib_dir(seen, want);
            link_change("links", &diff).collect::<Vec<_>>()
        })
        .collect()
}

fn observe_dev_char(root: &MachineRoot, d: &Desired) -> Result<DevCharSeen> {
    Ok(match root.lookup_dir(links::DEV_CHAR)? {
        Lookup::Dir(dir) => DevCharSeen::Dir(links::observe_dir(&dir, &d.dev_char)?),
        Lookup::Missing => DevCharSeen::Missing,
        Lookup::NotDir => DevCharSeen::NotDir,
    })
}

/// `/dev/char`: wired, made if missing; without a driver, only ours removed where it is.
fn dev_char_changes(d: &Desired, seen: &DevCharSeen) -> Result<Vec<Change>> {
    let empty;
    let seen = match seen {
        DevCharSeen::Dir(s) => s,
        DevCharSeen::Missing => {
            empty = DirSeen {
                path: links::DEV_CHAR.into(),
                links: BTreeMap::new(),
                others: BTreeMap::new(),
            };
            &empty
        }
        DevCharSeen::NotDir if d.driver.is_none() => return Ok(Vec::new()),
        DevCharSeen::NotDir => anyhow::bail!(
            "{} is not a directory (or one of its parents is not)",
            links::DEV_CHAR
        ),
    };
    let diff = links::diff_dev_char(seen, &d.dev_char);
    Ok(link_change("dev-char", &diff).collect())
}

fn observe_gate(root: &MachineRoot, d: &Desired) -> Result<Vec<(UnitName, bool, bool)>> {
    d.gate
        .iter()
        .map(|unit| {
            let gated = match d.target {
                Target::Machine => gate::is_gated(root, unit)?,
                // The host's own markers are at their path in the host's root.
                Target::Host => gate::is_gated_on_host(root, unit)?,
            };
            Ok((unit.clone(), gated, gate::is_released(root, unit)?))
        })
        .collect()
}

/// A gated unit whose marker is missing waits until post-start releases it.
fn gate_changes(units: &[(UnitName, bool, bool)]) -> Vec<Change> {
    units
        .iter()
        .filter(|(_, gated, released)| *gated && !released)
        .map(|(unit, _, _)| {
            Change::new(
                "gate",
                Action::Release,
                unit.to_string(),
                format!("its marker in {} is missing", gate::MARKER_DIR),
            )
        })
        .collect()
}
