//! The wiring as a value: what the hooks must leave for a target (a machine, or the host itself
//! in host mode) for the host as discovered now ([`Desired`]), and what would change there to
//! make it so (part by part: the parts in src/apply/parts/ observe a target and diff it against
//! [`Desired`] with the pure functions here).
//!
//! [`Desired`] is computed once, purely ([`Desired::from_facts`], [`Start::from_facts`]), from
//! discovery (the machine's share of it), the host facts it names ([`Facts`]: the identity of
//! every driver file and whether the tree can link it, the installed helper), gathered by reads
//! alone, and the configuration. A machine's holds its next start ([`Start`]: the `.nspawn` file
//! and the driver tree it binds), which pre-start makes and `plan` prints
//! (src/model/render.rs), and what post-start makes in the running machine, one part at a
//! time: each part reads what the target holds of it (its `observe`) and compares it with
//! [`Desired`] by one pure function (its `diff`: [`links::diff_lib_dir`],
//! [`links::diff_dev_char`], [`driver_root::diff`], [`spec::diff`], …) into [`Change`]s.
//! `status` and `plan` list the changes of every part (`parts::pending`); post-start applies the
//! parts it writes in the same order, each re-read just before it is
//! changed. `status` is out of sync exactly when that list is not empty (tests/wiring_model.rs
//! holds it to that over every example host and a list of mutations).
//!
//! A change is post-start's to make, or only a new start's (the driver root and the helper bound
//! into a machine are made with it: [`Action::Restart`]), or `install`'s ([`Action::Install`]),
//! or nobody's until a person acts (post-start would fail there: [`Action::Fails`]).

pub mod cdi;
pub(crate) mod check;
pub(crate) mod device_cgroup;
pub mod driver_root;
pub mod dropin;
pub mod gate;
pub mod helper;
pub(crate) mod host_devices;
pub(crate) mod host_unit;
pub(crate) mod image;
pub mod layout;
pub mod ld_cache;
pub(crate) mod legacy;
pub mod links;
pub mod nspawn;
pub mod render;
pub mod spec;
pub mod tree;

use crate::Ctx;
use crate::config::{Gpus, MachineConfig};
use crate::discovery::assign::Assignment;
use crate::discovery::{Inventory, UserspaceDriver};
use crate::fs::host::HostRoot;
use crate::model::nspawn::NspawnFile;
use crate::types::machine_name::MachineName;
use crate::types::paths::{HostPath, UnitName};
use anyhow::Result;
pub use check::Check;
use links::DirLinks;
use serde::Serialize;
use std::collections::BTreeMap;

/// Where post-start works: a machine, or the host itself (host mode, for nodes whose kubelet
/// and containerd run directly on the host).
///
/// | | machine | host |
/// |---|---|---|
/// | root | the machine's, by its leader's descriptor | the host's `/` |
/// | driver root | `/run/nvidia/driver`, checked | `/`, the host's install |
/// | links | library, tool and `/dev/char` links | `/dev/char` links only |
/// | CDI spec | [`crate::model::cdi::spec`] | [`crate::model::cdi::spec_on_host`] (host paths, installed helper as hook) |
/// | gate drop-in | the machine's `/run/systemd/system` | the host's `/etc/systemd/system` |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Machine,
    Host,
}

/// Staging name beside the driver root of versions that built it in the machine; a leftover is
/// removed without GPUs.
pub(crate) const STAGING: &str = ".driver.new";

/// What the hooks must leave for a target: a machine's next start ([`Start`], pre-start's), and
/// what post-start must leave in the target.
#[derive(Debug, Clone)]
pub struct Desired {
    pub target: Target,
    /// A machine's next start, as pre-start makes it; `None` in host mode (no pre-start) and
    /// where pre-start refuses the start for incomplete NVIDIA state.
    pub start: Option<Start>,
    /// The driver the target is wired for; `None` when no NVIDIA state of ours belongs there (no
    /// GPU for it, no driver): every piece of ours is removed.
    pub driver: Option<UserspaceDriver>,
    /// A wired machine's driver root, as its start must have made it.
    pub driver_root: Option<driver_root::Expected>,
    /// A machine's library and tool links, dir → name → target (none of ours without a driver);
    /// `None` in host mode, where they are the driver installer's and `ldconfig`'s.
    pub lib_links: Option<BTreeMap<String, DirLinks>>,
    /// `/dev/char/<major>:<minor>` links (none of ours without a driver).
    pub dev_char: DirLinks,
    pub spec: spec::Want,
    /// The units whose gate post-start releases when the gate holds them.
    pub gate: Vec<UnitName>,
    /// The installed helper: the units run it, and a machine's CDI hooks must run that very
    /// file.
    pub helper: helper::HelperFacts,
    /// How many GPUs the target is wired for.
    pub gpus: usize,
    /// The unit files `install` writes for the target (the unit files part).
    pub unit_files: Vec<UnitFile>,
}

/// A unit file `install` writes, as it would write it now: only `install` mends a difference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitFile {
    pub path: String,
    pub text: String,
    /// Whether a missing file is a change: host mode's files are; a machine without its drop-in
    /// is not installed, which `status` judges before.
    pub required: bool,
    /// What writes it (`install`, `install --host`), named in the change.
    pub by: &'static str,
}

/// A machine's next start as pre-start makes it: the `.nspawn` file, and the driver tree it binds
/// (each entry, the host identity of each driver file, linked or bound), for the machine's share
/// of the host's GPUs.
#[derive(Debug, Clone)]
pub struct Start {
    /// The machine's share of the host's GPUs (the config's `gpus`).
    pub assignment: Assignment,
    /// The file pre-start writes.
    pub file: NspawnFile,
    /// The driver tree the file binds (src/apply/driver_tree.rs); `None` without a driver.
    pub tree: Option<tree::Plan>,
    /// The host devices the machine gets beside its GPUs (the config's `devices`).
    pub devices: Vec<crate::discovery::HostDevice>,
}

impl Start {
    /// `machine`'s next start for its share `a` of a host with `host_gpus` GPUs, from the facts
    /// gathered for `a.view`: pure. `None` where pre-start refuses the start (incomplete NVIDIA
    /// state, [`crate::discovery::check_complete`]).
    pub(crate) fn from_facts(
        machine: &MachineName,
        mc: &MachineConfig,
        a: &Assignment,
        host_gpus: usize,
        helper: &HostPath,
        facts: &Facts,
    ) -> Result<Option<Start>> {
        if crate::discovery::check_complete(&a.view).is_err() {
            return Ok(None);
        }
        let mut file = NspawnFile::render(machine, &a.view, mc, facts.has_lib_modules, helper)?;
        if a.setting != Gpus::All {
            file.summary = format!(
                "{} ({} of the host's {host_gpus} by the config's gpus)",
                file.summary,
                a.gpus.len(),
            );
        }
        if let Some(plan) = &facts.tree {
            file.bind_driver_files(layout::file_binds(&plan.tree)?);
        }
        Ok(Some(Start {
            assignment: a.clone(),
            file,
            tree: facts.tree.clone(),
            devices: crate::model::host_devices::of_machine(&a.view, mc),
        }))
    }
}

/// The host facts [`Desired`] names: the identity of every driver file and directory a wired
/// machine's driver root must be, and whether the tree can link each file (its plan), whether the
/// host has `/lib/modules`, and the installed helper. Gathered by reads only ([`Facts::gather`]);
/// everything else of the desired state follows from them purely.
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    /// A machine's driver tree as pre-start would build it now (a complete driver only).
    pub tree: Option<tree::Plan>,
    pub driver_ids: driver_root::HostIds,
    pub has_lib_modules: bool,
    pub helper: helper::HelperFacts,
}

impl Facts {
    /// Plan the driver tree, stating every host driver file once (a machine with a complete
    /// driver only: host mode's driver root is the host itself), and the directories the driver
    /// root binds; look at `/lib/modules` and at the helper installed at `helper`.
    pub(crate) fn gather(
        target: Target,
        host: &HostRoot,
        inv: &Inventory,
        helper: &str,
    ) -> Result<Facts> {
        let (tree, driver_ids) = match (target, inv.complete_driver()) {
            (Target::Machine, Some(d)) => {
                let plan = tree::plan(host, d)?;
                let ids = driver_root::host_ids(host, d, &plan)?;
                (Some(plan), ids)
            }
            _ => (None, driver_root::HostIds::new()),
        };
        Ok(Facts {
            tree,
            driver_ids,
            has_lib_modules: target == Target::Machine && host.is_dir("/lib/modules"),
            helper: helper::helper_facts(host, helper, helper::host_machine(host, inv)),
        })
    }
}

impl Desired {
    /// `machine`'s desired state for its share `a` of the host `host_inv` (the config's `gpus`;
    /// pre- and post-start check it with [`crate::discovery::assign::for_machine`], `status`
    /// takes it as it is) under its settings `mc`, with the host's files as [`Facts::gather`]
    /// finds them now.
    pub fn machine(
        ctx: &Ctx,
        machine: &MachineName,
        mc: &MachineConfig,
        host_inv: &Inventory,
        a: &Assignment,
    ) -> Result<Desired> {
        let helper = ctx.config.helper_path();
        let facts = Facts::gather(Target::Machine, &ctx.host, &a.view, helper.as_str())?;
        let mut d = Desired::from_facts(Target::Machine, &a.view, mc, helper.as_str(), &facts)?;
        d.start = Start::from_facts(machine, mc, a, host_inv.gpus.len(), helper, &facts)?;
        d.unit_files = host_devices::devices_unit_files(helper);
        d.unit_files
            .push(dropin::Dropin::unit_file(machine, helper, &mc.gpus));
        Ok(d)
    }

    /// `machine`'s desired state as the hooks take it: its share of `host_inv` checked
    /// ([`crate::discovery::assign::for_machine`]: lists that overlap, `require`), and refused
    /// while its NVIDIA state is incomplete (exit 3, which pre-start's retries wait out).
    pub(crate) fn for_hooks(
        ctx: &Ctx,
        machine: &MachineName,
        mc: &MachineConfig,
        host_inv: &Inventory,
    ) -> Result<Desired> {
        let a = crate::discovery::assign::for_machine(&ctx.config, machine, mc, host_inv)?;
        crate::discovery::check_complete(&a.view)?;
        Desired::machine(ctx, machine, mc, host_inv, &a)
    }

    /// Host mode's desired state for the host's discovery `inv` under the settings `hc`; `helper`
    /// is the installed helper's host path (host mode's CDI hooks and its unit run it).
    pub fn host(
        host: &HostRoot,
        inv: &Inventory,
        hc: &MachineConfig,
        helper: &HostPath,
    ) -> Result<Desired> {
        let facts = Facts::gather(Target::Host, host, inv, helper.as_str())?;
        let mut d = Desired::from_facts(Target::Host, inv, hc, helper.as_str(), &facts)?;
        d.unit_files = host_unit::unit_files([&hc.containerd_unit, &hc.kubelet_unit], helper);
        Ok(d)
    }

    /// What post-start must leave in `target` for `inv` (a machine's share of the host, or the
    /// host's whole discovery in host mode) under the settings `mc`, from facts already
    /// gathered: pure. Without its start ([`Desired::machine`] adds a machine's).
    pub(crate) fn from_facts(
        target: Target,
        inv: &Inventory,
        mc: &MachineConfig,
        helper: &str,
        facts: &Facts,
    ) -> Result<Desired> {
        let bytes = match target {
            Target::Machine => crate::model::cdi::spec(inv, &mc.cdi_kind),
            Target::Host => crate::model::cdi::spec_on_host(inv, &mc.cdi_kind, helper)?,
        }
        .map(|s| crate::model::cdi::render(&s).into_bytes());
        let driver = inv.complete_driver().filter(|_| bytes.is_some()).cloned();
        let driver_root = match (target, &driver, &facts.tree) {
            (Target::Machine, Some(d), Some(plan)) => Some(driver_root::Expected::from_ids(
                d,
                &plan.tree,
                &facts.driver_ids,
            )?),
            (Target::Machine, Some(_), None) => {
                anyhow::bail!("a machine's driver without its tree planned (a bug in the facts)")
            }
            _ => None,
        };
        Ok(Desired {
            target,
            start: None,
            lib_links: (target == Target::Machine).then(|| links::lib_links(driver.as_ref())),
            dev_char: if driver.is_some() {
                links::dev_char_links(inv)
            } else {
                DirLinks::new()
            },
            driver,
            driver_root,
            spec: spec::Want {
                dir: mc.cdi_dir.to_string(),
                file: crate::model::cdi::spec_file_name(&mc.cdi_kind),
                kind: mc.cdi_kind.to_string(),
                bytes,
            },
            gate: vec![mc.containerd_unit.clone(), mc.kubelet_unit.clone()],
            helper: facts.helper.clone(),
            gpus: inv.gpus.len(),
            unit_files: Vec::new(),
        })
    }
}

/// What a [`Change`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Create,
    Replace,
    Remove,
    Write,
    /// Run `ldconfig`.
    Run,
    /// Create a unit's gate marker.
    Release,
    /// Only a new start of the machine changes it (its pre-start, its binds).
    Restart,
    /// post-start would fail here: something a person must mend first.
    Fails,
    /// Only `install` rewrites it (the machine's unit drop-in).
    Install,
    /// post-start keeps it and cannot judge it: a person must look (a spec file too large, or
    /// not a file, where CDI consumers read specs).
    Keep,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Replace => "replace",
            Action::Remove => "remove",
            Action::Write => "write",
            Action::Run => "run",
            Action::Release => "release",
            Action::Restart => "restart",
            Action::Fails => "fails",
            Action::Install => "install",
            Action::Keep => "keep",
        }
    }
}

/// One difference between a target and its [`Desired`] state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// The part it belongs to (its `CHECK`), named as `status` names its checks.
    pub check: Check,
    pub action: Action,
    /// What it changes (a path in the target, a unit).
    pub path: String,
    /// The new link target, or why.
    pub detail: String,
}

impl Change {
    pub fn new(check: Check, action: Action, path: String, detail: impl Into<String>) -> Self {
        Change {
            check,
            action,
            path,
            detail: detail.into(),
        }
    }

    /// A part that could not be read, or judged: one change that fails, saying why (as the
    /// hook that writes the part would fail).
    pub fn unreadable(check: Check, e: &anyhow::Error) -> Self {
        Change::new(check, Action::Fails, String::new(), format!("{e:#}"))
    }

    /// Whether post-start run now makes it.
    pub fn by_post_start(&self) -> bool {
        !matches!(
            self.action,
            Action::Restart | Action::Fails | Action::Install | Action::Keep
        )
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.action.as_str(), self.path)?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}
