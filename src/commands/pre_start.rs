//! `nspawn-lifecycle pre-start <MACHINE>` (ExecStartPre=): render and write the machine's `.nspawn`
//! file, its unit gate, driver tree and device cgroup, under the machine's lock.

use crate::Ctx;
use crate::apply::driver_tree;
use crate::apply::gate;
use crate::config::Gpus;
use crate::config::MachineConfig;
use crate::discovery::assign::Assignment;
use crate::failpoint::Point;
use crate::fs::host::HostRoot;
use crate::fs::lock;
use crate::model::device_cgroup;
use crate::model::gate as gates;
use crate::model::layout::{self, Tree};
use crate::model::nspawn::describe_change;
use crate::model::render::{Rendered, check_rendered, check_startable, render};
use crate::types::machine_name::MachineName;
use anyhow::{Context as _, Result};

/// ExecStartPre=: refuse what must not start before the lock, then under the machine's lock
/// render the plan (the `.nspawn` file and what it binds, [`Rendered`]) and carry it out.
pub fn pre_start(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = check_startable(ctx, machine, None)?;
    let _lock = lock::lock(&ctx.host, machine, mc.lock_timeout)?;
    let mut plan = render(ctx, machine, &mc).with_context(|| format!("pre-start of {machine}"))?;
    check_rendered(ctx, machine, &plan).with_context(|| format!("pre-start of {machine}"))?;
    execute(ctx, machine, &mc, &mut plan)
}

/// Carry out pre-start's plan: the device cgroup, then the unit gate and driver tree the file
/// binds (nspawn refuses to start when a bind's source is missing), then the file itself.
fn execute(ctx: &Ctx, machine: &MachineName, mc: &MachineConfig, r: &mut Rendered) -> Result<()> {
    set_device_cgroup(ctx, machine, &r.assignment)
        .with_context(|| format!("pre-start of {machine}: device cgroup"))?;
    if r.file.binds_gate() && gate::write_host_file(&ctx.host)? {
        tracing::info!(%machine, file = gates::HOST_FILE, "unit gate written");
    }
    build_tree(&ctx.host, machine.as_str(), r)?;
    if r.file.binds_gate() {
        release_for_the_boot(ctx, machine, mc)?;
    }
    let new = r.text();
    if ctx.host.write_if_changed(
        crate::types::units::nspawn_path(machine),
        new.as_bytes(),
        0o644,
        Point::PreStartMidNspawnWrite,
    )? {
        tracing::info!(
            %machine,
            file = %r.host_path.display(),
            "{}",
            describe_change(r.old.as_deref(), &new)
        );
    } else {
        tracing::info!(%machine, file = %r.host_path.display(), "unchanged");
    }
    Ok(())
}

/// pre-start's step: build (or check) the tree `r` binds; without a driver, remove the machine's
/// tree so it holds no old driver's files. The plan links every file the tree's filesystem can
/// hold ([`crate::model::tree::plan`]); when the kernel still refuses a link (an immutable file,
/// a link count at its limit, an overlayfs copy-up), the file is bound instead and its bind added
/// to the `.nspawn` file: the one way the file written differs from what `plan` showed, said in
/// a warning.
fn build_tree(host: &HostRoot, machine: &str, r: &mut Rendered) -> Result<()> {
    let dir = layout::tree_host_path(machine);
    let Some(plan) = &mut r.tree else {
        if driver_tree::remove(host, machine)? {
            tracing::info!(%machine, %dir, "driver tree removed: no NVIDIA driver for this machine");
        }
        return Ok(());
    };
    let built = driver_tree::ensure(host, machine, plan)?;
    if !built.unlinked.is_empty() {
        let named: Vec<String> = built
            .unlinked
            .iter()
            .map(|(p, e)| format!("{p} ({e})"))
            .collect();
        tracing::warn!(
            %machine, %dir,
            "{} driver files could not be hard-linked into the tree and are bound instead (the \
             .nspawn file written binds them, which `plan` could not foresee): {}",
            named.len(),
            named.join(", ")
        );
        let tree: Tree = built
            .unlinked
            .iter()
            .filter_map(|(p, _)| plan.tree.get_key_value(p))
            .map(|(p, n)| (p.clone(), n.clone()))
            .collect();
        r.file.bind_driver_files(layout::file_binds(&tree)?);
    }
    if built.changed {
        let bound = layout::file_binds(&plan.tree)?.len();
        tracing::info!(%machine, %dir, entries = plan.tree.len(), bound, "driver tree built");
    }
    Ok(())
}

/// The unit gate's markers for the boot ahead ([`gate::prepare_boot`]): the driver root the file
/// binds is built and checked, so containerd may start with the boot (unless the config keeps it
/// for post-start); kubelet waits for post-start. Only in the unit's own start: run by hand the
/// machine may be running, and its boot keeps its markers. Under `--host-root` no machine runs
/// from the tree.
fn release_for_the_boot(ctx: &Ctx, machine: &MachineName, mc: &MachineConfig) -> Result<()> {
    if ctx.host.is_real_root() && !crate::types::units::runs_in_its_start(machine) {
        tracing::info!(%machine, step = "gate",
            "unit gate: markers left alone (pre-start run outside {}'s start; a running boot \
             keeps its own)", crate::types::units::unit_name(machine));
        return Ok(());
    }
    let containerd = mc.containerd_at_boot.then_some(&mc.containerd_unit);
    let dir = gate::prepare_boot(&ctx.host, machine.as_str(), containerd)
        .with_context(|| format!("pre-start of {machine}: unit gate"))?;
    match containerd {
        Some(unit) => tracing::info!(%machine, step = "gate",
            "unit gate: released {unit} for the boot ahead ({dir}/{unit}): the driver tree it \
             binds is checked complete"),
        None => tracing::info!(%machine, step = "gate",
            "unit gate: {dir} emptied; containerd and kubelet wait for post-start"),
    }
    Ok(())
}

fn set_device_cgroup(ctx: &Ctx, machine: &MachineName, a: &Assignment) -> Result<()> {
    // `all`: the drop-in's device groups, as always.
    if a.setting == Gpus::All || !ctx.host.is_real_root() {
        return Ok(());
    }
    let unit = crate::types::units::unit_name(machine);
    let deadline = std::time::Instant::now() + DBUS_TIMEOUT;
    let sd = crate::systemd::Systemd::host(deadline)?;
    let current = sd.device_allow(&unit, deadline)?;
    let ours = device_cgroup::machine_entries(&a.view);
    let new = device_cgroup::merge(&current, &ours);
    if new == current {
        tracing::info!(%machine, %unit, "device cgroup unchanged: {} NVIDIA/DRM node(s)", ours.len());
        return Ok(());
    }
    sd.set_device_allow(&unit, &new, deadline)?;
    tracing::info!(
        %machine,
        %unit,
        "device cgroup set: {} NVIDIA/DRM node(s) of its own: {}",
        ours.len(),
        ours.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>().join(" ")
    );
    Ok(())
}

/// How long pre-start waits for the host's systemd to answer.
const DBUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
