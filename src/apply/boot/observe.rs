//! What pre-start's parts hold on the host ([`Boot::observe`], reads only), what making them
//! would change ([`Boot::diff_of`], pure), and the line of a part found as it must be
//! ([`Boot::unchanged`]).

use super::{Boot, NO_TREE, UNCHANGED, tree_line};
use crate::apply::driver_tree::{self, TreeSeen, TreeState};
use crate::apply::executor::BootPart;
use crate::apply::gate;
use crate::model::gate as gates;
use crate::model::layout;
use crate::model::nspawn::describe_change;
use crate::model::{Action, Change, device_cgroup, host_devices};
use crate::types::units::{nspawn_path, unit_name};
use anyhow::Result;

/// A part of pre-start as [`Boot::observe`] read it on the host.
#[derive(Debug)]
pub enum BootSeen {
    /// What the file binds that is missing on the host: nodes and directories (path, and the
    /// device numbers of a node), and whether the machine's bpf filesystem is.
    HostNodes {
        missing: Vec<(String, Option<(u32, u32)>)>,
        bpffs_missing: bool,
    },
    /// The unit's `DeviceAllow=` now.
    DeviceCgroup(Vec<(String, String)>),
    /// Whether the host's unit gate drop-in holds exactly what it must.
    GateFile(bool),
    /// The driver tree against its plan.
    DriverTree(TreeSeen),
    /// No driver: what is left of a tree (host paths).
    NoDriverTree(Vec<String>),
    /// The boot's markers; none read outside the unit's own start.
    BootGate(Option<gate::BootMarkers>),
    /// Whether the `.nspawn` file on disk is exactly the one rendered.
    NspawnFile(bool),
}

impl Boot<'_> {
    /// Read `part` on the host. Reads only; an error is what the part's apply would meet.
    pub fn observe(&self, part: BootPart) -> Result<BootSeen> {
        let host = &self.ctx.host;
        Ok(match part {
            BootPart::HostNodes => BootSeen::HostNodes {
                missing: self
                    .host_nodes()
                    .into_iter()
                    // A directory not there as one is missing (its apply fails on what is
                    // there instead); a node, when nothing is at its path (one made meanwhile
                    // is left as it is).
                    .filter(|(path, numbers)| {
                        numbers.is_none() || host.symlink_metadata(path).is_err()
                    })
                    .collect(),
                bpffs_missing: self.bpffs_missing(),
            },
            BootPart::DeviceCgroup => BootSeen::DeviceCgroup(self.device_allow()?),
            BootPart::GateFile => BootSeen::GateFile(gate::host_file_current(host)?),
            BootPart::DriverTree => match &self.rendered.borrow().start().tree {
                Some(plan) => BootSeen::DriverTree(driver_tree::observe(host, self.machine, plan)?),
                None => BootSeen::NoDriverTree(driver_tree::remains(host, self.machine)?),
            },
            BootPart::BootGate if !self.in_its_start => BootSeen::BootGate(None),
            BootPart::BootGate => BootSeen::BootGate(Some(gate::observe_boot(
                host,
                self.machine,
                self.boot_containerd(),
            )?)),
            BootPart::NspawnFile => BootSeen::NspawnFile(host.holds(
                nspawn_path(self.machine),
                self.rendered.borrow().text().as_bytes(),
                0o644,
            )?),
        })
    }

    /// What making `part`, as `seen` holds it, would change, in order. Pure.
    pub fn diff_of(&self, part: BootPart, seen: &BootSeen) -> Vec<Change> {
        let change = |action, path: &str, detail: String| {
            Change::new(part.check(), action, path.to_owned(), detail)
        };
        let machine = self.machine;
        match seen {
            BootSeen::HostNodes {
                missing,
                bpffs_missing,
            } => {
                let mut out: Vec<Change> = missing
                    .iter()
                    .map(|(path, numbers)| {
                        let what = match numbers {
                            Some((major, minor)) => format!("character device {major}:{minor}"),
                            None => "a directory the file binds".to_owned(),
                        };
                        change(Action::Create, path, what)
                    })
                    .collect();
                if *bpffs_missing {
                    let dir = host_devices::bpffs_dir(machine);
                    out.push(change(
                        Action::Create,
                        &dir,
                        "the machine's bpf filesystem".into(),
                    ));
                }
                out
            }
            BootSeen::DeviceCgroup(current) => self.cgroup_changes(part, current),
            BootSeen::GateFile(true) | BootSeen::NspawnFile(true) => Vec::new(),
            BootSeen::GateFile(false) => vec![change(
                Action::Write,
                gates::HOST_FILE,
                "the unit gate's drop-in".into(),
            )],
            BootSeen::DriverTree(seen) => self.tree_changes(part, seen),
            BootSeen::NoDriverTree(left) => left
                .iter()
                .map(|p| {
                    change(
                        Action::Remove,
                        p,
                        "no NVIDIA driver for this machine".into(),
                    )
                })
                .collect(),
            BootSeen::BootGate(None) => Vec::new(),
            BootSeen::BootGate(Some(m)) => m.changes(self.boot_containerd()),
            BootSeen::NspawnFile(false) => {
                let r = self.rendered.borrow();
                vec![change(
                    Action::Write,
                    &nspawn_path(self.machine),
                    describe_change(r.old.as_deref(), &r.text()),
                )]
            }
        }
    }

    /// The unit's `DeviceAllow=` against the machine's own entries merged in.
    fn cgroup_changes(&self, part: BootPart, current: &[(String, String)]) -> Vec<Change> {
        let new = device_cgroup::merge(current, &self.device_entries());
        if device_cgroup::allows_same(&new, current) {
            return Vec::new();
        }
        let named = |from: &[(String, String)], not_in: &[(String, String)]| {
            from.iter()
                .filter(|e| !not_in.contains(e))
                .map(|(p, how)| format!("{p} {how}"))
                .collect::<Vec<_>>()
        };
        let (gains, drops) = (named(&new, current), named(current, &new));
        let mut said = Vec::new();
        if !gains.is_empty() {
            said.push(format!("gains {}", gains.join(", ")));
        }
        if !drops.is_empty() {
            said.push(format!("drops {}", drops.join(", ")));
        }
        let detail = format!("DeviceAllow= {}", said.join("; "));
        vec![Change::new(
            part.check(),
            Action::Write,
            unit_name(self.machine),
            detail,
        )]
    }

    fn tree_changes(&self, part: BootPart, seen: &TreeSeen) -> Vec<Change> {
        let dir = layout::tree_host_path(self.machine);
        let mut out: Vec<Change> = seen
            .leftovers
            .iter()
            .map(|p| {
                Change::new(
                    part.check(),
                    Action::Remove,
                    p.clone(),
                    "left by a pre-start that was killed",
                )
            })
            .collect();
        let entries = self
            .rendered
            .borrow()
            .start()
            .tree
            .as_ref()
            .map_or(0, |p| p.tree.len());
        let (action, detail) = match seen.state {
            TreeState::Stamped => return out,
            TreeState::Unstamped => (
                Action::Write,
                "found exactly as planned, without a stamp saying so: stamped".to_owned(),
            ),
            TreeState::Differs => (
                Action::Replace,
                format!("differs from the host's driver: built afresh ({entries} entries)"),
            ),
            TreeState::Missing => (Action::Create, format!("built ({entries} entries)")),
        };
        out.push(Change::new(part.check(), action, dir, detail));
        out
    }

    /// The log line of `part` found as it must be.
    pub fn unchanged(&self, part: BootPart) -> Result<String> {
        let machine = self.machine;
        Ok(match part {
            BootPart::HostNodes => "host device nodes: none missing".to_owned(),
            BootPart::DeviceCgroup => format!(
                "device cgroup of {} unchanged: {} NVIDIA/DRM node(s)",
                unit_name(self.machine),
                self.device_entries().len()
            ),
            BootPart::GateFile => format!("unit gate: {} as it must be", gates::HOST_FILE),
            BootPart::DriverTree => match &self.rendered.borrow().start().tree {
                Some(plan) => tree_line(&layout::tree_host_path(machine), "as planned", plan)?,
                None => NO_TREE.to_owned(),
            },
            BootPart::BootGate if !self.in_its_start => format!(
                "unit gate: markers left alone (pre-start run outside {}'s start; a running \
                 boot keeps its own)",
                unit_name(self.machine)
            ),
            BootPart::BootGate => self.boot_gate_line(),
            BootPart::NspawnFile => {
                format!(
                    "{}: {UNCHANGED}",
                    self.rendered.borrow().host_path.display()
                )
            }
        })
    }
}
