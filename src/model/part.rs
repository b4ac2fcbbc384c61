//! The wiring's parts, each one unit: [`Part::observe`] reads what a target holds of it (reads
//! only, bounded, through the target's root), [`Part::diff`] says what post-start run now, a new
//! start or `install` would change there to make it [`Desired`] (pure), and src/apply/part.rs
//! applies it (re-reading what it is about to write with the same `observe`). One ordered list
//! per target ([`Part::list`]): `status` and `plan` walk it ([`pending`]), post-start applies
//! the parts it writes in that order (src/apply/executor.rs), and a target without a driver
//! walks the same list against a [`Desired`] holding nothing of ours.

use super::links::{self, DirLinks, DirSeen};
use super::{Action, Change, Check, Desired, STAGING, Target, driver_root, gate, ld_cache, spec};
use crate::fs::host::HostRoot;
use crate::fs::machine_root::{FileKind, Lookup, MachineRoot, Subdir};
use crate::model::layout::{DRIVER_ROOT, HOOK_BINARY};
use crate::types::paths::UnitName;
use anyhow::Result;
use std::collections::BTreeMap;

/// One part of the wiring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// A machine's driver root: nspawn's binds, checked against the host's driver (only a new
    /// start mends it); without a driver, what is left of one, removed.
    DriverRoot,
    /// The installed helper the units run, and the one a machine's CDI hooks run (bound at its
    /// start).
    Helper,
    /// A machine's library and tool links.
    Links,
    /// `/dev/char/<major>:<minor>` links to the NVIDIA nodes.
    DevChar,
    /// The target's `/etc/ld.so.cache` lists the driver's libraries (`ldconfig`).
    LdCache,
    /// Our CDI spec, and no other spec of our kind.
    CdiSpec,
    /// The unit gate's markers: containerd and kubelet released.
    Gate,
    /// A machine's host device binds of its next start, present in the running machine.
    HostDevices,
    /// The unit files `install` writes for the target.
    UnitFiles,
}

impl Part {
    /// The parts of `target`, in the order post-start makes them (docs/wiring.md, "The order of
    /// a start"); the gate's releases are post-start's, in the start's order of the services.
    pub fn list(target: Target) -> &'static [Part] {
        match target {
            Target::Machine => &[
                Part::DriverRoot,
                Part::Helper,
                Part::Links,
                Part::DevChar,
                Part::LdCache,
                Part::CdiSpec,
                Part::Gate,
                Part::HostDevices,
                Part::UnitFiles,
            ],
            // The host's libraries are its driver installer's and ldconfig's, its driver root is
            // `/`, and it has no start of ours to bind devices.
            Target::Host => &[
                Part::Helper,
                Part::DevChar,
                Part::LdCache,
                Part::CdiSpec,
                Part::Gate,
                Part::UnitFiles,
            ],
        }
    }

    /// The check its changes name (a driver root without a driver: `stale-nvidia-state`).
    pub fn check(self) -> Check {
        match self {
            Part::DriverRoot => Check::DriverRoot,
            Part::Helper => Check::Helper,
            Part::Links => Check::Links,
            Part::DevChar => Check::DevChar,
            Part::LdCache => Check::LdCache,
            Part::CdiSpec => Check::CdiSpec,
            Part::Gate => Check::Gate,
            Part::HostDevices => Check::HostDevices,
            Part::UnitFiles => Check::Dropin,
        }
    }

    /// The part as post-start writes it in its file steps (in [`Part::list`]'s order, its
    /// services stopped), if it does; the gate's markers it writes as the services start, and
    /// the helper, the host devices and the unit files are a new start's or `install`'s.
    pub fn written(self) -> Option<Written> {
        match self {
            Part::DriverRoot => Some(Written::DriverRoot),
            Part::Links => Some(Written::Links),
            Part::DevChar => Some(Written::DevChar),
            Part::LdCache => Some(Written::LdCache),
            Part::CdiSpec => Some(Written::CdiSpec),
            Part::Helper | Part::Gate | Part::HostDevices | Part::UnitFiles => None,
        }
    }

    /// Read the part in the target: reads only, through `at`.
    pub fn observe(self, at: &Roots, d: &Desired) -> Result<Seen> {
        let root = at.target;
        Ok(match self {
            Part::DriverRoot => match d.target {
                Target::Machine => Seen::DriverRoot(observe_driver_root(root, d)?),
                Target::Host => Seen::Nothing,
            },
            Part::Helper => Seen::Helper(match d.target {
                Target::Machine => observe_hook_binary(root)?,
                Target::Host => None,
            }),
            Part::Links => match &d.lib_links {
                Some(wanted) => Seen::Links(observe_lib_dirs(root, wanted)?),
                None => Seen::Nothing,
            },
            Part::DevChar => Seen::DevChar(match root.lookup_dir(links::DEV_CHAR)? {
                Lookup::Dir(dir) => DevCharSeen::Dir(links::observe_dir(&dir, &d.dev_char)?),
                Lookup::Missing => DevCharSeen::Missing,
                Lookup::NotDir => DevCharSeen::NotDir,
            }),
            // An unreadable cache is what the part holds, not a failure to read it.
            Part::LdCache => match &d.driver {
                Some(driver) => Seen::LdCache(ld_cache::lists_driver(root, driver)),
                None => Seen::Nothing,
            },
            Part::CdiSpec => Seen::CdiSpec(spec::observe(root, &d.spec)?),
            Part::Gate => Seen::Gate(observe_gate(root, d)?),
            Part::HostDevices => match &d.start {
                Some(start) => Seen::HostDevices(device_drift(root, start)?),
                None => Seen::Nothing,
            },
            Part::UnitFiles => Seen::UnitFiles(observe_unit_files(at.host, d)?),
        })
    }

    /// What would change to make the part as `seen` holds it `d`'s, in order; `earlier`: the
    /// changes of the parts before it in the list (the loader cache follows the library
    /// links). A part that could not be read is one change that fails ([`Action::Fails`]), as
    /// post-start would. Pure.
    pub fn diff(self, d: &Desired, seen: &Result<Seen>, earlier: &[Change]) -> Vec<Change> {
        let out = match seen {
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
            Ok(seen) => match (self, seen) {
                (_, Seen::Nothing) => Ok(Vec::new()),
                (Part::DriverRoot, Seen::DriverRoot(s)) => Ok(driver_root_changes(d, s)),
                (Part::Helper, Seen::Helper(bound)) => Ok(helper_changes(d, *bound)),
                (Part::Links, Seen::Links(dirs)) => Ok(lib_link_changes(dirs)),
                (Part::DevChar, Seen::DevChar(s)) => dev_char_changes(d, s),
                (Part::LdCache, Seen::LdCache(lists)) => {
                    let links_change = earlier.iter().any(|c| c.check == Check::Links);
                    Ok(ld_cache::ldconfig_needed(links_change, lists)
                        .map(|why| Change::new(Check::LdCache, Action::Run, "ldconfig".into(), why))
                        .into_iter()
                        .collect())
                }
                (Part::CdiSpec, Seen::CdiSpec(s)) => spec::diff(&d.spec, s),
                (Part::Gate, Seen::Gate(units)) => Ok(gate_changes(units)),
                (Part::HostDevices, Seen::HostDevices(drift)) => Ok(device_changes(drift)),
                (Part::UnitFiles, Seen::UnitFiles(files)) => Ok(unit_file_changes(d, files)),
                (part, seen) => Err(anyhow::anyhow!(
                    "{part:?} judged on what another part read ({seen:?}): a bug"
                )),
            },
        };
        out.unwrap_or_else(|e| vec![Change::unreadable(self.check(), &e)])
    }
}

/// A part post-start writes in its file steps ([`Part::written`]): the only parts its plan can
/// name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    DriverRoot,
    Links,
    DevChar,
    LdCache,
    CdiSpec,
}

impl Written {
    pub fn part(self) -> Part {
        match self {
            Written::DriverRoot => Part::DriverRoot,
            Written::Links => Part::Links,
            Written::DevChar => Part::DevChar,
            Written::LdCache => Part::LdCache,
            Written::CdiSpec => Part::CdiSpec,
        }
    }
}

/// Where the parts are: the target's root (the machine's, by its leader; the host's `/` in host
/// mode) and the host's (its unit files).
pub struct Roots<'a> {
    pub target: &'a MachineRoot,
    pub host: &'a HostRoot,
}

/// A part as [`Part::observe`] read it.
#[derive(Debug)]
pub enum Seen {
    /// Nothing of the part belongs to this target (host mode's driver root, a machine's
    /// loader cache without a driver, the host devices of a start pre-start refuses).
    Nothing,
    DriverRoot(DriverRootSeen),
    /// The helper bound into a machine at its start (device and inode), when there.
    Helper(Option<(u64, u64)>),
    /// Each library and tool directory, with the links wanted there.
    Links(Vec<(DirSeen, DirLinks)>),
    DevChar(DevCharSeen),
    /// Whether the loader cache lists the driver's libraries, or why it cannot be read.
    LdCache(Result<bool>),
    CdiSpec(spec::Seen),
    Gate(Vec<GateSeen>),
    /// The device binds of the next start the running machine does not show as the host has
    /// them.
    HostDevices(Vec<(String, DeviceDrift)>),
    /// Each unit file `install` writes, as found.
    UnitFiles(Vec<UnitFileSeen>),
}

/// The driver root as found: against the expected tree (a wired machine), or what is left of
/// one without a driver (each name, and whether it is a read-only directory: this boot's binds).
#[derive(Debug)]
pub enum DriverRootSeen {
    Expected(driver_root::Seen),
    Leftovers(Vec<(String, bool)>),
}

/// How a device bind of the next start differs in the running machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceDrift {
    /// No node (nor directory) at its path.
    Missing,
    /// A node with other numbers than the host's now (a drive swapped, a device re-plugged: the
    /// machine's bind still holds the node it was started with).
    Numbers {
        machine: (u32, u32),
        host: (u32, u32),
    },
    /// A disk the running machine holds that the host uses now (mounted, swap, …: why):
    /// both may write to it, which no restart undoes.
    HostUses(String),
}

/// `/dev/char` as found.
#[derive(Debug)]
pub enum DevCharSeen {
    Dir(DirSeen),
    Missing,
    NotDir,
}

/// One gated unit: whether the gate holds it this boot, and whether its marker is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateSeen {
    pub unit: UnitName,
    pub gated: bool,
    pub released: bool,
}

/// A unit file as found, against what `install` writes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitFileSeen {
    Same,
    Differs,
    Missing,
}

/// Every part of a target as read at once ([`observe`]), in [`Part::list`]'s order.
#[derive(Debug)]
pub struct Observation(Vec<(Part, Result<Seen>)>);

impl Observation {
    /// The part as read, if the list has it.
    pub fn get(&self, part: Part) -> Option<&Result<Seen>> {
        self.0.iter().find(|(p, _)| *p == part).map(|(_, s)| s)
    }

    /// The part as read, to change in a test of the pure diff.
    #[cfg(test)]
    pub(crate) fn get_mut(&mut self, part: Part) -> Option<&mut Result<Seen>> {
        self.0.iter_mut().find(|(p, _)| *p == part).map(|(_, s)| s)
    }

    /// The gate as read: whether it holds any unit, and whether every unit's marker is there.
    pub fn gate(&self) -> Result<(bool, bool)> {
        match self.get(Part::Gate) {
            Some(Ok(Seen::Gate(units))) => Ok((
                units.iter().any(|u| u.gated),
                units.iter().all(|u| u.released),
            )),
            Some(Err(e)) => Err(anyhow::anyhow!("{e:#}")),
            _ => Ok((false, true)),
        }
    }

    /// The helper bound into the machine at its start, when there.
    pub fn hook_binary(&self) -> Result<Option<(u64, u64)>> {
        match self.get(Part::Helper) {
            Some(Ok(Seen::Helper(b))) => Ok(*b),
            Some(Err(e)) => Err(anyhow::anyhow!("{e:#}")),
            _ => Ok(None),
        }
    }

    /// What would change, part by part in order ([`Part::diff`]). Pure.
    pub fn diff(&self, d: &Desired) -> Vec<Change> {
        let mut out = Vec::new();
        for (part, seen) in &self.0 {
            let changes = part.diff(d, seen, &out);
            out.extend(changes);
        }
        out
    }

    /// [`Observation::diff`] of `part` alone (`status` of a host whose driver is incomplete
    /// judges only the unit files: post-start would refuse, changing nothing). Pure.
    pub fn diff_of(&self, d: &Desired, part: Part) -> Vec<Change> {
        self.get(part)
            .map(|seen| part.diff(d, seen, &[]))
            .unwrap_or_default()
    }
}

/// Read every part of `d`'s target ([`Part::list`]). Reads only.
pub fn observe(at: &Roots, d: &Desired) -> Observation {
    Observation(
        Part::list(d.target)
            .iter()
            .map(|p| (*p, p.observe(at, d)))
            .collect(),
    )
}

/// Everything that would change in the target to make it `d`: the diff of what [`observe`]
/// reads. Reads only.
pub fn pending(at: &Roots, d: &Desired) -> Vec<Change> {
    observe(at, d).diff(d)
}

/// The device binds of the next start (`start`'s file: `Bind=/dev/…`, the node or directory at
/// the same path) that the running machine at `root` lacks (nothing, or something else than a
/// device node or directory, at that path), and the host devices it binds (`start.devices`)
/// whose node there has other numbers than the host's now. Reads only, through the machine's
/// root: one `lstat` per bind, no device opened.
fn device_drift(root: &MachineRoot, start: &super::Start) -> Result<Vec<(String, DeviceDrift)>> {
    let mut out = Vec::new();
    for b in &start.file.binds {
        let path = b.target.as_str();
        if !path.starts_with("/dev/") || b.source.as_str() != path {
            continue;
        }
        let Some(st) = root.stat(path)? else {
            out.push((path.to_owned(), DeviceDrift::Missing));
            continue;
        };
        match FileKind::from_stat(&st) {
            FileKind::Dir => {}
            FileKind::CharDevice | FileKind::BlockDevice => {
                let Some(want) = start.devices.iter().find(|d| d.path.as_str() == path) else {
                    continue;
                };
                let host = (want.major, want.minor);
                let machine = (
                    u32::try_from(nix::sys::stat::major(st.st_rdev)).unwrap_or(u32::MAX),
                    u32::try_from(nix::sys::stat::minor(st.st_rdev)).unwrap_or(u32::MAX),
                );
                if machine != host {
                    out.push((path.to_owned(), DeviceDrift::Numbers { machine, host }));
                }
            }
            _ => out.push((path.to_owned(), DeviceDrift::Missing)),
        }
    }
    for d in &start.assignment.view.disks {
        let Some(why) = &d.used else { continue };
        let Some(st) = root.stat(d.path.as_str())? else {
            continue;
        };
        let numbers = (
            u32::try_from(nix::sys::stat::major(st.st_rdev)).unwrap_or(u32::MAX),
            u32::try_from(nix::sys::stat::minor(st.st_rdev)).unwrap_or(u32::MAX),
        );
        if FileKind::from_stat(&st) == FileKind::BlockDevice && numbers == (d.major, d.minor) {
            out.push((d.path.to_string(), DeviceDrift::HostUses(why.clone())));
        }
    }
    Ok(out)
}

fn device_changes(drift: &[(String, DeviceDrift)]) -> Vec<Change> {
    drift
        .iter()
        .map(|(p, d)| {
            let why = match d {
                DeviceDrift::Missing => "the host has this device now and the running machine \
                                         lacks it: the next start binds it"
                    .to_owned(),
                DeviceDrift::Numbers { machine, host } => format!(
                    "the host's node is {}:{} now, the running machine's bind still holds {}:{}: \
                     the next start binds the host's",
                    host.0, host.1, machine.0, machine.1
                ),
                DeviceDrift::HostUses(why) => format!(
                    "the running machine has this disk and the host uses it now ({why}): both \
                     may write to it; stop what uses it on one side, then restart the machine, \
                     whose next start does not bind it"
                ),
            };
            let action = match d {
                DeviceDrift::HostUses(_) => Action::Fails,
                _ => Action::Restart,
            };
            Change::new(Check::HostDevices, action, p.clone(), why)
        })
        .collect()
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
            .map(|why| Change::new(Check::DriverRoot, Action::Restart, DRIVER_ROOT.into(), why))
            .into_iter()
            .collect(),
        (DriverRootSeen::Leftovers(left), _) => left
            .iter()
            .map(|(path, bound)| {
                if *bound {
                    Change::new(
                        Check::StaleNvidiaState,
                        Action::Restart,
                        path.clone(),
                        "this boot's driver binds, gone at the next start",
                    )
                } else {
                    Change::new(
                        Check::StaleNvidiaState,
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
fn helper_changes(d: &Desired, bound: Option<(u64, u64)>) -> Vec<Change> {
    let h = &d.helper;
    if let Some(problem) = &h.problem {
        return vec![Change::new(
            Check::Helper,
            Action::Fails,
            h.path.clone(),
            problem.clone(),
        )];
    }
    match bound {
        Some(b) if Some(b) != h.identity => vec![Change::new(
            Check::Helper,
            Action::Restart,
            HOOK_BINARY.into(),
            format!(
                "the CDI hooks run the helper as it was at the machine's start, not the one \
                 installed now at {}",
                h.path
            ),
        )],
        _ => Vec::new(),
    }
}

/// A link change as a [`Change`].
fn link_change(check: Check, diff: &links::DirDiff) -> impl Iterator<Item = Change> + '_ {
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
            link_change(Check::Links, &diff).collect::<Vec<_>>()
        })
        .collect()
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
    Ok(link_change(Check::DevChar, &diff).collect())
}

fn observe_gate(root: &MachineRoot, d: &Desired) -> Result<Vec<GateSeen>> {
    d.gate
        .iter()
        .map(|unit| {
            let gated = match d.target {
                Target::Machine => gate::is_gated(root, unit)?,
                // The host's own markers are at their path in the host's root.
                Target::Host => gate::is_gated_on_host(root, unit)?,
            };
            Ok(GateSeen {
                unit: unit.clone(),
                gated,
                released: gate::is_released(root, unit)?,
            })
        })
        .collect()
}

/// A gated unit whose marker is missing waits until post-start releases it.
fn gate_changes(units: &[GateSeen]) -> Vec<Change> {
    units
        .iter()
        .filter(|u| u.gated && !u.released)
        .map(|u| {
            Change::new(
                Check::Gate,
                Action::Release,
                u.unit.to_string(),
                format!("its marker in {} is missing", gate::MARKER_DIR),
            )
        })
        .collect()
}

/// Each unit file of `d` on `host` against what `install` writes now. Reads only.
fn observe_unit_files(host: &HostRoot, d: &Desired) -> Result<Vec<UnitFileSeen>> {
    d.unit_files
        .iter()
        .map(|f| match host.read(&f.path) {
            Ok(have) if have == f.text.as_bytes() => Ok(UnitFileSeen::Same),
            Ok(_) => Ok(UnitFileSeen::Differs),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(UnitFileSeen::Missing),
            Err(e) => Err(anyhow::Error::new(e).context(format!("reading {}", f.path))),
        })
        .collect()
}

/// An [`Action::Install`] change for each unit file that differs, or is missing where that is a
/// change ([`super::UnitFile::required`]).
fn unit_file_changes(d: &Desired, seen: &[UnitFileSeen]) -> Vec<Change> {
    d.unit_files
        .iter()
        .zip(seen)
        .filter_map(|(f, s)| {
            let why = match s {
                UnitFileSeen::Same => return None,
                UnitFileSeen::Missing if !f.required => return None,
                UnitFileSeen::Missing => "missing".to_owned(),
                UnitFileSeen::Differs => format!("differs from what {} writes now", f.by),
            };
            Some(Change::new(
                Check::Dropin,
                Action::Install,
                f.path.clone(),
                why,
            ))
        })
        .collect()
}
