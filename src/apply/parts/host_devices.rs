//! A machine's host device binds of its next start, present in the running machine as the host
//! has them now: only a new start binds them.

use super::{At, Owner, Part, Running};
use crate::fs::machine_root::{FileKind, MachineRoot};
use crate::model::{Action, Change, Check, Start, Target};
use anyhow::Result;

pub struct HostDevices;

/// How a device bind of the next start differs in the running machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
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

impl Part for HostDevices {
    type Hook = Running;
    /// The device binds of the next start the running machine does not show as the host has
    /// them; none of a start pre-start refuses.
    type Seen = Vec<(String, Drift)>;
    const NAME: &'static str = "host devices";
    const KEY: &'static str = "host-devices";
    const CHECK: Check = Check::HostDevices;
    const OWNER: Owner = Owner::NewStart;

    /// The host has no start of ours to bind devices.
    fn on(&self, target: Target) -> bool {
        target == Target::Machine
    }

    fn observe(&self, at: &At) -> Result<Self::Seen> {
        let d = at.desired;
        match &d.start {
            Some(start) => drift(at.target, start),
            None => Ok(Vec::new()),
        }
    }

    fn diff(&self, _: &At, drift: &Self::Seen, _: &[Change]) -> Result<Vec<Change>> {
        Ok(drift.iter().map(|(p, d)| change(p, d)).collect())
    }
}

fn change(path: &str, d: &Drift) -> Change {
    let why = match d {
        Drift::Missing => "the host has this device now and the running machine lacks it: the \
                           next start binds it"
            .to_owned(),
        Drift::Numbers { machine, host } => format!(
            "the host's node is {}:{} now, the running machine's bind still holds {}:{}: the next \
             start binds the host's",
            host.0, host.1, machine.0, machine.1
        ),
        Drift::HostUses(why) => format!(
            "the running machine has this disk and the host uses it now ({why}): both may write \
             to it; stop what uses it on one side, then restart the machine, whose next start \
             does not bind it"
        ),
    };
    let action = match d {
        Drift::HostUses(_) => Action::Fails,
        _ => Action::Restart,
    };
    Change::new(Check::HostDevices, action, path.to_owned(), why)
}

/// The device binds of the next start (`start`'s file: `Bind=/dev/…`, the node or directory at
/// the same path) that the running machine at `root` lacks (nothing, or something else than a
/// device node or directory, at that path), and the host devices it binds (`start.devices`)
/// whose node there has other numbers than the host's now. Reads only, through the machine's
/// root: one `lstat` per bind, no device opened.
fn drift(root: &MachineRoot, start: &Start) -> Result<Vec<(String, Drift)>> {
    let mut out = Vec::new();
    for b in &start.file.binds {
        let path = b.target.as_str();
        if !path.starts_with("/dev/") || b.source.as_str() != path {
            continue;
        }
        let Some(st) = root.stat(path)? else {
            out.push((path.to_owned(), Drift::Missing));
            continue;
        };
        match FileKind::from_stat(&st) {
            FileKind::Dir => {}
            FileKind::CharDevice | FileKind::BlockDevice => {
                let Some(want) = start.devices.iter().find(|d| d.path.as_str() == path) else {
                    continue;
                };
                let host = (want.major, want.minor);
                let machine = numbers(&st);
                if machine != host {
                    out.push((path.to_owned(), Drift::Numbers { machine, host }));
                }
            }
            _ => out.push((path.to_owned(), Drift::Missing)),
        }
    }
    for d in &start.assignment.view.disks {
        let Some(why) = &d.used else { continue };
        let Some(st) = root.stat(d.path.as_str())? else {
            continue;
        };
        if FileKind::from_stat(&st) == FileKind::BlockDevice && numbers(&st) == (d.major, d.minor) {
            out.push((d.path.to_string(), Drift::HostUses(why.clone())));
        }
    }
    Ok(out)
}

/// A node's device numbers.
fn numbers(st: &nix::sys::stat::FileStat) -> (u32, u32) {
    (
        u32::try_from(nix::sys::stat::major(st.st_rdev)).unwrap_or(u32::MAX),
        u32::try_from(nix::sys::stat::minor(st.st_rdev)).unwrap_or(u32::MAX),
    )
}
