//! `nspawn-lifecycle pre-start <MACHINE>` (ExecStartPre=): render and write the machine's `.nspawn`
//! file, its unit gate, driver tree and device cgroup, under the machine's lock.

use crate::Ctx;
use crate::config::Gpus;
use crate::config::MachineConfig;
use crate::device_cgroup;
use crate::discovery;
use crate::discovery::assign::{self, Assignment};
use crate::failpoint::Point;
use crate::gate;
use crate::image;
use crate::lock;
use crate::machine_name::MachineName;
use crate::nspawn::describe_change;
use crate::render::{Rendered, render};
use anyhow::{Context as _, Result};

/// ExecStartPre=: refuse what must not start before the lock, then under the machine's lock
/// render the plan (the `.nspawn` file and what it binds, [`Rendered`]) and carry it out.
pub fn pre_start(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = check_startable(ctx, machine)?;
    let _lock = lock::lock(&ctx.host, machine, mc.lock_timeout)?;
    let mut plan = render(ctx, machine, &mc).with_context(|| format!("pre-start of {machine}"))?;
    refuse_foreign_file(machine, &plan)?;
    refuse_uninstalled(ctx, machine, &plan)?;
    execute(ctx, machine, &mc, &mut plan)
}

/// After `uninstall` (its `.nspawn` file in place, no drop-in) nothing runs post-start, which
/// alone releases the unit gate: a pre-start run by hand would bind the gate again and leave
/// containerd and kubelet waiting forever under the stock unit.
fn refuse_uninstalled(ctx: &Ctx, machine: &MachineName, r: &Rendered) -> Result<()> {
    let uninstalled = r
        .old
        .as_deref()
        .is_some_and(|old| old.starts_with(crate::nspawn::UNINSTALLED_HEADER));
    let dropin = crate::units::dropin_path(machine);
    if uninstalled && r.file.binds_gate() && !ctx.host.exists(&dropin) {
        return Err(crate::error::bad_input(format!(
            "pre-start of {machine}: {machine} is uninstalled ({} is uninstall's and there is no \
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
        Some(old) if !crate::legacy::is_ours_nspawn(old.as_bytes()) => {
            Err(crate::error::bad_input(format!(
                "pre-start of {machine}: {} was not written by nspawn-lifecycle-helper; replacing it would lose its settings. Put extra binds in the configuration's `mounts` and other settings in a drop-in of {}, then remove the file; nothing was written",
                r.host_path.display(),
                crate::units::unit_name(machine)
            )))
        }
        _ => Ok(()),
    }
}

/// The machine's configuration, once nothing refuses the start: checked before the lock, so a
/// mistyped name, a shifted rootfs, two machines given one GPU or a drop-in for other `gpus`
/// write nothing, not even the lock file.
fn check_startable(ctx: &Ctx, machine: &MachineName) -> Result<MachineConfig> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    image::require(&ctx.host, machine, &mc)?;
    // Render checks the GPU lists again under the lock, against the host as it is then.
    // Only lists can overlap: with fewer than two, the host is not scanned a second time.
    let lists = ctx.config.gpu_assignments(machine)?;
    if assign::lists_can_overlap(&lists) {
        assign::check_overlap(&discovery::discover(&ctx.host)?, &lists)?;
    }
    check_installed_dropin(ctx, machine, &mc.gpus)?;
    Ok(mc)
}

/// Carry out pre-start's plan: the device cgroup, then the unit gate and driver tree the file
/// binds (nspawn refuses to start when a bind's source is missing), then the file itself.
fn execute(ctx: &Ctx, machine: &MachineName, mc: &MachineConfig, r: &mut Rendered) -> Result<()> {
    set_device_cgroup(ctx, machine, &r.assignment)
        .with_context(|| format!("pre-start of {machine}: device cgroup"))?;
    if r.file.binds_gate() && gate::write_host_file(&ctx.host)? {
        tracing::info!(%machine, file = gate::HOST_FILE, "unit gate written");
    }
    crate::driver_tree::apply(&ctx.host, machine.as_str(), r)?;
    if r.file.binds_gate() {
        release_for_the_boot(ctx, machine, mc)?;
    }
    let new = r.text();
    if ctx.host.write_if_changed(
        crate::units::nspawn_path(machine),
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

/// The unit gate's markers for the boot ahead ([`gate::prepare_boot`]): the driver root the file
/// binds is built and checked, so containerd may start with the boot (unless the config keeps it
/// for post-start); kubelet waits for post-start. Only in the unit's own start: run by hand the
/// machine may be running, and its boot keeps its markers. Under `--host-root` no machine runs
/// from the tree.
fn release_for_the_boot(ctx: &Ctx, machine: &MachineName, mc: &MachineConfig) -> Result<()> {
    if ctx.host.is_real_root() && !crate::units::runs_in_its_start(machine) {
        tracing::info!(%machine, step = "gate",
            "unit gate: markers left alone (pre-start run outside {}'s start; a running boot \
             keeps its own)", crate::units::unit_name(machine));
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

/// The installed drop-in must be the one for the machine's `gpus` (exit 2 until `install`).
/// For a machine without every GPU, the unit's `DeviceAllow=`: its own nodes, by number,
/// at every start (src/device_cgroup.rs). Only on the real host: a `--host-root` tree has no
/// systemd of its own to ask.
fn check_installed_dropin(ctx: &Ctx, machine: &MachineName, gpus: &Gpus) -> Result<()> {
    let dropin = crate::units::dropin_path(machine);
    match ctx.host.read_to_string(&dropin) {
        Ok(text) => device_cgroup::check_dropin(machine.as_str(), &dropin, &text, gpus),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("reading {dropin}")),
    }
}

fn set_device_cgroup(ctx: &Ctx, machine: &MachineName, a: &Assignment) -> Result<()> {
    // `all`: the drop-in's device groups, as always.
    if a.setting == Gpus::All || !ctx.host.is_real_root() {
        return Ok(());
    }
    let unit = crate::units::unit_name(machine);
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
