//! `nspawn-lifecycle pre-start <MACHINE>` (ExecStartPre=): render the machine's `.nspawn` file
//! and make pre-start's parts (the host nodes, the device cgroup, the unit gate, the driver
//! tree, the file) with the one executor, each only where its diff says, under the machine's
//! lock.

use crate::Ctx;
use crate::apply::boot::Boot;
use crate::apply::executor::{boot_plan, execute_boot};
use crate::fs::lock;
use crate::model::render::{check_rendered, check_startable, render};
use crate::types::machine_name::MachineName;
use anyhow::{Context as _, Result};

/// ExecStartPre=: refuse what must not start before the lock, then under the machine's lock
/// render the file and what it binds ([`crate::model::render::Rendered`]) and make them.
pub fn pre_start(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = check_startable(ctx, machine, None)?;
    let _lock = lock::lock(&ctx.host, machine, mc.lock_timeout)?;
    let rendered = render(ctx, machine, &mc).with_context(|| format!("pre-start of {machine}"))?;
    check_rendered(ctx, machine, &rendered).with_context(|| format!("pre-start of {machine}"))?;
    let left_out =
        crate::model::host_devices::disks_left_out(&rendered.start().assignment.view, &mc);
    if left_out > 0 {
        tracing::warn!(
            %machine,
            "{left_out} free disks not bound: several machines share this host, so a machine \
             gets only the disks its devices.disks names (`discover` lists them)"
        );
    }
    let boot = Boot::new(
        ctx,
        machine,
        &mc,
        rendered,
        Boot::in_its_start(ctx, machine),
    );
    execute_boot(&boot_plan(&boot), machine, &boot)
}

/// pre-start's `result` (the configuration's load included), after ending the unit's retries
/// when no retry can mend it. A refusal for bad input (exit 2: the configuration, a named disk
/// the host uses) stays until a person changes something, but systemd ignores
/// `RestartPreventExitStatus=` for `ExecStartPre=`, so `Restart=on-failure` would start the
/// unit again every few seconds forever. Run as its unit's hook on the real host, pre-start
/// queues a stop of its own unit instead: it stays `failed`, with the message in its journal,
/// until someone starts it again.
pub(crate) fn ending_retries_it_cannot_mend(
    real_root: bool,
    machine: &MachineName,
    result: Result<()>,
) -> Result<()> {
    if let Err(err) = &result
        && crate::error::kind(err) == Some(crate::error::Kind::BadInput)
        && real_root
        && crate::types::units::runs_in_its_start(machine)
    {
        stop_retries(machine, err);
    }
    result
}

/// Log `err` (the stop may end this process before `main` prints it), then queue the stop.
fn stop_retries(machine: &MachineName, err: &anyhow::Error) {
    let unit = crate::types::units::unit_name(machine);
    tracing::error!(
        %machine,
        "{}; no retry can mend this: stopping {unit}, which stays failed until it is started again",
        crate::output::printable_lines(&format!("{err:#}"))
    );
    ignore_sigterm();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let stop =
        crate::systemd::Systemd::host(deadline).and_then(|sd| sd.queue_stop(&unit, deadline));
    if let Err(e) = stop {
        tracing::warn!(%machine, "stopping {unit}: {e:#}; systemd will retry the start");
    }
}

/// The stop job signals this process (the unit's control process) with SIGTERM; it exits with
/// its own code right after, so the unit's result is that exit status, not a signal.
#[allow(unsafe_code)]
fn ignore_sigterm() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: SIG_IGN installs no handler code; the process exits right after.
    if let Err(e) = unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) } {
        tracing::debug!("ignoring SIGTERM: {e}");
    }
}
