//! The machine's desired state ([`Desired`], whose [`Start`] holds the `.nspawn` file pre-start
//! writes) beside the file on disk, as `plan` prints it, and what makes pre-start refuse a
//! start: shared by `pre-start`, `plan`, `install`, `status` and `reconcile`, so none of them
//! tells an operator something pre-start would not do.

use crate::Ctx;
use crate::config::Gpus;
use crate::config::MachineConfig;
use crate::discovery::assign;
use crate::discovery::{self, Inventory};
use crate::model::device_cgroup;
use crate::model::{Desired, Start};
use crate::types::machine_name::MachineName;
use crate::types::units::nspawn_path;
use anyhow::{Context as _, Result};
use std::fmt::Write as _;

/// The machine's desired state, whose next start pre-start makes, beside the `.nspawn` file on
/// disk.
#[derive(Debug)]
pub struct Rendered {
    pub host_path: std::path::PathBuf,
    pub old: Option<String>,
    /// With its [`Start`] ([`render_from`] makes a `Rendered` only then).
    pub desired: Desired,
}

impl Rendered {
    /// The machine's next start: the file, the tree it binds, the machine's GPUs.
    pub fn start(&self) -> &Start {
        self.desired
            .start
            .as_ref()
            .expect("render_from makes a Rendered only of a desired state with its start")
    }

    /// The start, for pre-start's driver tree step: a file the kernel refuses to link after all
    /// is bound instead, and the file binds it.
    pub(crate) fn start_mut(&mut self) -> &mut Start {
        self.desired
            .start
            .as_mut()
            .expect("render_from makes a Rendered only of a desired state with its start")
    }

    /// The `.nspawn` file's bytes as pre-start writes them.
    pub fn text(&self) -> String {
        self.start().file.to_string()
    }
}

/// Discover the host and render `machine`'s `.nspawn` file; incomplete NVIDIA state is an error
/// with exit code 3 that names every missing or mismatched piece.
pub fn render(ctx: &Ctx, machine: &MachineName, mc: &MachineConfig) -> Result<Rendered> {
    render_from(ctx, machine, mc, &discovery::discover(&ctx.host)?)
}

/// [`render`] from a discovery of the host already made: the machine's [`Desired`] state.
pub fn render_from(
    ctx: &Ctx,
    machine: &MachineName,
    mc: &MachineConfig,
    inv: &Inventory,
) -> Result<Rendered> {
    let desired = Desired::for_hooks(ctx, machine, mc, inv)?;
    anyhow::ensure!(
        desired.start.is_some(),
        "no start rendered for {machine}, whose NVIDIA state is complete (a bug)"
    );
    let host_path = ctx.host.path(nspawn_path(machine));
    let old = match ctx.host.read(nspawn_path(machine)) {
        Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", host_path.display())),
    };
    Ok(Rendered {
        host_path,
        old,
        desired,
    })
}

/// What `plan` prints: the machine's GPUs when not all, the file as pre-start would write it, and
/// a unified diff against the file on disk.
impl std::fmt::Display for Rendered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&plan_text(self))
    }
}

fn plan_text(r: &Rendered) -> String {
    let shown = r.host_path.display().to_string();
    let start = r.start();
    // `all` (the default) shows nothing more: every GPU.
    let mut out = match start.assignment.setting {
        Gpus::All => String::new(),
        _ => format!(
            "# GPUs (the config's gpus): {}\n",
            start.assignment.summary()
        ),
    };
    let _ = writeln!(
        out,
        "# Device cgroup (runtime DeviceAllow=, set by pre-start): {}",
        match device_cgroup::machine_entries(
            &start.assignment.view,
            &start.assignment.setting,
            &start.devices,
        ) {
            e if e.is_empty() => "no NVIDIA, DRM or host device node".to_owned(),
            e => e
                .iter()
                .map(|(p, a)| format!("{p} {a}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    );
    if let (Some(plan), Some(d)) = (&start.tree, start.assignment.view.complete_driver()) {
        let _ = writeln!(
            out,
            "# Driver root {} (pre-start's host tree): {} entries; the C runtime of the driver's \
             tools in it: {}",
            crate::model::layout::DRIVER_ROOT,
            plan.tree.len(),
            if d.runtime.is_empty() {
                "none found (chroot into the driver root cannot run them)".to_owned()
            } else {
                d.runtime
                    .iter()
                    .map(|f| format!("{} <- {}", f.path, f.source))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    let new = r.text();
    let _ = write!(out, "# {shown} as pre-start would write it:\n{new}\n");
    match r.diff() {
        None => out.push_str(&format!("# {shown} is up to date.\n")),
        Some(diff) => out.push_str(&diff),
    }
    out
}

impl Rendered {
    /// Whether the file on disk is already what pre-start writes.
    pub(crate) fn up_to_date(&self) -> bool {
        self.old.as_deref() == Some(self.text().as_str())
    }

    /// The unified diff from the file on disk (or nothing, when missing) to what pre-start
    /// writes; `None` when they are the same.
    pub fn diff(&self) -> Option<String> {
        if self.up_to_date() {
            return None;
        }
        let new = self.text();
        let shown = self.host_path.display();
        let from = if self.old.is_some() {
            format!("{shown} (on disk)")
        } else {
            format!("{shown} (missing)")
        };
        let old_text = self.old.as_deref().unwrap_or("");
        let diff = similar::TextDiff::from_lines(old_text, &new);
        Some(
            diff.unified_diff()
                .header(&from, &format!("{shown} (pre-start)"))
                .to_string(),
        )
    }

    /// `plan --json`: what pre-start would do, as one object (kind `MachinePlan`).
    pub(crate) fn to_json(&self, machine: &MachineName) -> serde_json::Value {
        let start = self.start();
        let driver = start.assignment.view.complete_driver();
        let diff = self.diff();
        serde_json::json!({
            "apiVersion": crate::discovery::API_VERSION,
            "kind": "MachinePlan",
            "machine": machine.as_str(),
            "path": self.host_path.display().to_string(),
            "upToDate": diff.is_none(),
            "nspawn": self.text(),
            "diff": diff,
            "gpus": start.assignment.summary(),
            "driverRoot": start.tree.as_ref().map(|plan| serde_json::json!({
                "path": crate::model::layout::DRIVER_ROOT,
                "entries": plan.tree.len(),
                "cRuntime": driver.map(|d| d.runtime.clone()).unwrap_or_default(),
            })),
        })
    }
}

/// What pre-start does for `machine` on the host as `inv` found it: its configuration and the
/// file it would write, or the error it would refuse the start with (same message, same exit
/// code). Reads only; pre-start itself runs the same checks around its lock.
pub fn as_pre_start(
    ctx: &Ctx,
    machine: &MachineName,
    inv: &Inventory,
) -> Result<(MachineConfig, Rendered)> {
    let mc = check_startable(ctx, machine, Some(inv))?;
    let r = render_from(ctx, machine, &mc, inv)?;
    check_rendered(ctx, machine, &r)?;
    Ok((mc, r))
}

/// The machine's configuration, once nothing refuses the start: checked before the lock, so a
/// mistyped name, a shifted rootfs, two machines given one GPU or one disk, a named disk the
/// host uses or a drop-in for other `gpus` write nothing, not even the lock file. Two machines' GPU lists are checked against `inv`, or
/// a discovery made here when there is none.
pub(crate) fn check_startable(
    ctx: &Ctx,
    machine: &MachineName,
    inv: Option<&Inventory>,
) -> Result<MachineConfig> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    crate::model::image::require(&ctx.host, machine, &mc)?;
    // Render checks the GPU lists again under the lock, against the host as it is then.
    // Only lists can overlap: with fewer than two, the host is not scanned a second time.
    let lists = ctx.config.gpu_assignments(machine)?;
    let overlap = assign::lists_can_overlap(&lists);
    let named = !mc.devices.extra.is_empty() || mc.devices.named_disks().next().is_some();
    if overlap || named {
        let found;
        let inv = match inv {
            Some(inv) => inv,
            None => {
                found = discovery::discover(&ctx.host)?;
                &found
            }
        };
        let in_file = || format!("config file {}", mc.config_file);
        if overlap {
            assign::check_overlap(inv, &lists).with_context(in_file)?;
        }
        crate::model::host_devices::check_named_nodes(inv, &mc).with_context(in_file)?;
    }
    check_installed_dropin(ctx, machine, &mc.gpus)?;
    Ok(mc)
}

/// What pre-start refuses once the file is rendered: a `.nspawn` file that is not ours, and the
/// unit gate of an uninstalled machine.
pub(crate) fn check_rendered(ctx: &Ctx, machine: &MachineName, r: &Rendered) -> Result<()> {
    refuse_foreign_file(machine, r)?;
    refuse_uninstalled(ctx, machine, r)
}

/// After `uninstall` (its `.nspawn` file in place, no drop-in) nothing runs post-start, which
/// alone releases the unit gate: a pre-start run by hand would bind the gate again and leave
/// containerd and kubelet waiting forever under the stock unit.
fn refuse_uninstalled(ctx: &Ctx, machine: &MachineName, r: &Rendered) -> Result<()> {
    let uninstalled = r
        .old
        .as_deref()
        .is_some_and(|old| old.starts_with(crate::model::nspawn::UNINSTALLED_HEADER));
    let dropin = crate::types::units::dropin_path(machine);
    if uninstalled && r.start().file.binds_gate() && !ctx.host.exists(&dropin) {
        return Err(crate::error::bad_input(format!(
            "{machine} is uninstalled ({} is uninstall's and there is no \
             {dropin}): its .nspawn file would bind the unit gate, which only post-start \
             releases, so containerd and kubelet would wait forever under the stock unit; run \
             `nspawn-lifecycle-helper install {machine}` first; nothing was written",
            r.host_path.display()
        )));
    }
    Ok(())
}

/// A `.nspawn` file neither pre-start nor uninstall wrote is the operator's: replacing it would
/// lose its `Port=`, `Boot=`, `Bind=` lines without a word (install refuses it the same way).
fn refuse_foreign_file(machine: &MachineName, r: &Rendered) -> Result<()> {
    match &r.old {
        Some(old) if !crate::model::legacy::is_ours_nspawn(old.as_bytes()) => {
            Err(crate::error::bad_input(format!(
                "{} was not written by nspawn-lifecycle-helper; replacing it would lose its settings. Put extra binds in the configuration's `mounts` and other settings in a drop-in of {}, then remove the file; nothing was written",
                r.host_path.display(),
                crate::types::units::unit_name(machine)
            )))
        }
        _ => Ok(()),
    }
}

/// The installed drop-in must be the one for the machine's `gpus` (exit 2 until `install`): an
/// `all` drop-in would let a share open every GPU, a share's would leave an `all` machine none.
fn check_installed_dropin(ctx: &Ctx, machine: &MachineName, gpus: &Gpus) -> Result<()> {
    let dropin = crate::types::units::dropin_path(machine);
    match ctx.host.read_to_string(&dropin) {
        Ok(text) => device_cgroup::check_dropin(machine, &dropin, &text, gpus),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("reading {dropin}")),
    }
}
