//! `nspawn-lifecycle post-start`: rewire NVIDIA state inside the machine with its services stopped.
//!
//! It runs while the machine boots (the `.nspawn` file says `NotifyReady=no`, so systemd runs
//! `ExecStartPost=` as soon as the container is up), from the moment the machine's systemd
//! answers on its bus. Order (docs/wiring.md, "The order of a start"): stop kubelet → stop
//! containerd → check the driver root (made by nspawn's binds at boot) → links → `ldconfig` → CDI spec → release
//! containerd's unit gate → start containerd → import staged images → release kubelet's unit gate
//! → start kubelet. When pre-start released containerd for this boot (`containerdAtBoot`, the
//! default; [`Order::ContainerdReleased`]) the boot starts containerd itself: post-start neither
//! stops nor releases it, and its start of containerd waits for the boot's start job.
//! In a GPU machine the gate (src/apply/gate.rs) holds each service until its own
//! marker exists, so a boot that reaches a service first skips it, and one that reaches it later
//! finds its precondition met; the stops cancel a start job the boot still has queued for either
//! (waiting on its `After=` units) and find nothing running, so each service starts once, from
//! post-start, after its precondition. A start of a unit whose `After=` units are still starting
//! waits for them (the job waits in the machine's queue), within `jobTimeoutSeconds`. The unit
//! reports started (and `systemctl start` returns) when post-start exits: GPUs wired,
//! containerd active, staged images imported, kubelet active, or the start failed.
//! When a step after the stops fails, the services that were running before post-start stopped
//! them are started again (best effort, each result logged) before the error is returned: a
//! failed post-start on a running machine puts back what ran before it. On a gated boot nothing
//! was running, so nothing is started: the gate keeps both services off a driver root that was
//! not wired this boot until a post-start succeeds, and systemd's `Restart=on-failure` retries
//! the whole start.

use crate::Ctx;
use crate::apply::executor::{Order, Wiring, execute, micros, plan, timed};
use crate::apply::gate;
use crate::apply::rewire;
use crate::config::MachineConfig;
use crate::discovery;
use crate::discovery::check_complete;
use crate::failpoint::{self, Point};
use crate::fs::host::HostRoot;
use crate::fs::lock;
use crate::fs::machine_root::MachineRoot;
use crate::model::Desired;
use crate::model::cdi;
use crate::model::gate as gates;
use crate::systemd::services::{MachineServices, Services as _};
use crate::systemd::{self, MachineHandle, Systemd};
use crate::types::machine_name::MachineName;
use crate::types::paths::UnitName;
use anyhow::{Context as _, Result};
use std::time::Instant;

/// Where post-start works ([`crate::model::Target`]); everything but the file steps is the same
/// [`plan`], [`execute`] and [`Wiring`] for both. Units, CDI directory, staged images directory,
/// gate markers and timeouts come from the config (`machines.<name>`/`defaults`, or `host`) and
/// resolve in the target's root.
pub use crate::model::Target;

/// How host mode names itself in messages and log lines (the `machine` field).
pub const HOST_LABEL: &str = "the host";

impl Target {
    /// Whether `unit`'s gate drop-in is in place (the unit waits for its marker this boot).
    fn is_gated(self, root: &MachineRoot, unit: &UnitName) -> Result<bool> {
        match self {
            Target::Machine => gates::is_gated(root, unit),
            Target::Host => gates::is_gated_on_host(root, unit),
        }
    }

    /// Where the target's gate markers live (host paths, see [`gate::Markers`]).
    fn markers<'a>(self, host: &'a HostRoot, who: &str) -> gate::Markers<'a> {
        match self {
            Target::Machine => gate::Markers::of_machine(host, who),
            Target::Host => gate::Markers::of_host(host),
        }
    }

    /// Remove our NVIDIA state from a root without GPUs.
    fn cleanup(
        self,
        root: &MachineRoot,
        mc: &MachineConfig,
        spec_file: &str,
    ) -> Result<rewire::Report> {
        match self {
            Target::Machine => rewire::cleanup(root, &mc.cdi_dir, spec_file),
            Target::Host => rewire::cleanup_host(root, &mc.cdi_dir, spec_file),
        }
    }
}

/// What post-start and `refresh-devices` start from: the machine's settings, its lock held, its
/// desired state for the host now (the machine's share of it, exit 3 while incomplete) and the
/// running machine. `what` names the command in messages.
struct Running {
    mc: MachineConfig,
    _lock: lock::MachineLock,
    desired: Desired,
    handle: MachineHandle,
}

impl Running {
    fn open(ctx: &Ctx, machine: &MachineName, what: &str) -> Result<Running> {
        let mc = ctx.config.machine(&ctx.host, machine)?;
        if !ctx.host.is_real_root() {
            return Err(crate::error::bad_input(format!(
                "{what} of {machine} works on the running machine through the host's systemd; \
                 --host-root {} is only for pre-start, plan, discover and install",
                ctx.host.root().display()
            )));
        }
        let who = machine.as_str();
        let lock = timed(who, "lock", || {
            lock::lock(&ctx.host, machine, mc.lock_timeout)
        })?;
        let host_inv = timed(who, "discover", || discovery::discover(&ctx.host))?;
        let desired = Desired::for_hooks(ctx, machine, &mc, &host_inv)
            .with_context(|| format!("{what} of {machine}"))?;
        let deadline = Instant::now() + mc.job_timeout;
        let handle = timed(who, "find machine", || {
            MachineHandle::find(&Systemd::host(deadline)?, machine.as_str(), deadline)
        })?;
        Ok(Running {
            mc,
            _lock: lock,
            desired,
            handle,
        })
    }
}

/// `refresh-devices`: the running machine's `/dev/char` links made for the host's nodes now
/// (those its bound NVIDIA node directories show: a MIG capability or IMEX channel the host made
/// while it runs), under the machine's lock, as post-start's links step makes them; nothing
/// else is touched and no service stopped. A machine not running is an error (its path unit is
/// bound to its unit, so only a hand-run meets it).
pub fn refresh_devices(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let r = Running::open(ctx, machine, "refresh-devices")?;
    let who = machine.as_str();
    let report = timed(who, "dev-char", || {
        rewire::rebuild_dev_char(r.handle.root(), &r.desired.dev_char)
    })?;
    tracing::info!(machine = %who, step = "dev-char", "{report}");
    Ok(())
}

/// ExecStartPost=: see the module documentation.
pub fn post_start(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let total = Instant::now();
    let r = Running::open(ctx, machine, "post-start")?;
    let (mc, handle) = (&r.mc, &r.handle);
    let run = TargetRun {
        who: machine.as_str(),
        in_its_start: crate::types::units::runs_in_its_start(machine),
        target: Target::Machine,
        mc,
        host: &ctx.host,
        root: handle.root(),
        desired: &r.desired,
    };
    run.finish(
        total,
        // Without GPUs the start returns once the boot is done, as it did when post-start ran
        // after it (`NotifyReady=yes`): the boot starts this machine's services itself.
        || systemd::wait_running(handle, Instant::now() + mc.boot_timeout),
        // With them, the boot goes on meanwhile: the unit gate holds both services until their
        // markers exist.
        || systemd::wait_bus(handle, Instant::now() + mc.boot_timeout),
    )
}

/// `host post-start`: post-start of the host itself, [`Target::Host`]. Run by
/// `nspawn-lifecycle-host.service` at boot (see `install --host`) and by hand after a driver
/// change. The same discovery, incomplete verdict (exit 3), lock discipline (a lock of its
/// own), plan, executor, failure points, restore-on-failure and no-GPU cleanup as a machine's.
pub fn host_post_start(ctx: &Ctx) -> Result<()> {
    let hc = ctx.config.host()?;
    if !ctx.host.is_real_root() {
        return Err(crate::error::bad_input(format!(
            "host post-start works on the running host through its systemd; --host-root {} is \
             only for host plan",
            ctx.host.root().display()
        )));
    }
    let total = Instant::now();
    let who = HOST_LABEL;
    let _lock = timed(who, "lock", || lock::lock_host(&ctx.host, hc.lock_timeout))?;
    let inv = timed(who, "discover", || discovery::discover(&ctx.host))?;
    check_complete(&inv).context("host post-start")?;
    let root = MachineRoot::open(ctx.host.root())?;
    let helper = ctx.config.helper_path();
    let run = TargetRun {
        who,
        in_its_start: false,
        target: Target::Host,
        mc: &hc,
        host: &ctx.host,
        root: &root,
        desired: &Desired::host(&ctx.host, &inv, &hc, helper)?,
    };
    // No boot to wait for: this runs as a unit of the host's own boot.
    let bus = || Systemd::host(Instant::now() + hc.job_timeout);
    run.finish(total, bus, bus)
}

/// One post-start run: whom it is for and what it works on, a machine or the host.
struct TargetRun<'a> {
    who: &'a str,
    /// Whether this is the `ExecStartPost=` of the machine unit's start ([`Order::of`]).
    in_its_start: bool,
    target: Target,
    mc: &'a MachineConfig,
    host: &'a HostRoot,
    root: &'a MachineRoot,
    desired: &'a Desired,
}

impl TargetRun<'_> {
    /// The part both targets share once they have discovered and locked: without a complete
    /// driver (or nothing to put in a spec) [`TargetRun::without_gpus`] on the systemd
    /// `running` gives; otherwise [`TargetRun::wire`] on the one `bus` gives.
    fn finish(
        &self,
        total: Instant,
        running: impl FnOnce() -> Result<Systemd>,
        bus: impl FnOnce() -> Result<Systemd>,
    ) -> Result<()> {
        if self.desired.driver.is_none() {
            return self.without_gpus(running);
        }
        let sd = timed(self.who, "wait bus", bus)?;
        failpoint::hit(Point::AfterBus);
        self.wire(&sd)?;
        tracing::debug!(
            machine = self.who,
            step = "post-start",
            us = micros(total.elapsed()),
            "step timing"
        );
        Ok(())
    }

    /// Run the target's plan over its root and systemd, and log what was wired.
    fn wire(&self, sd: &Systemd) -> Result<()> {
        let (who, mc) = (self.who, self.mc);
        let services = MachineServices {
            sd,
            job_timeout: mc.job_timeout,
        };
        let markers = self.target.markers(self.host, who);
        let order = Order::of(self.target, &markers, mc, self.in_its_start)?;
        if order == Order::ContainerdReleased {
            tracing::info!(machine = who, unit = %mc.containerd_unit,
                "released before post-start began ({}): not stopped, started with the boot",
                markers.path(&mc.containerd_unit));
        }
        let wiring = Wiring {
            machine: who,
            mc,
            host: self.host,
            markers: &markers,
            root: self.root,
            desired: self.desired,
            services: &services,
        };
        let started = Instant::now();
        execute(&plan(mc, self.target, order), who, &wiring, &services)?;
        tracing::info!(
            machine = who,
            "post-start done in {:.2}s: NVIDIA driver {}, {} GPU(s)",
            started.elapsed().as_secs_f64(),
            wiring.driver()?.version,
            self.desired.gpus
        );
        Ok(())
    }

    /// post-start without NVIDIA devices: services are left alone; only stale NVIDIA state is
    /// removed so pods cannot be handed GPUs that are gone. Unless the services are gated and
    /// the GPUs went since (pre-start still saw them, or the host's gate drop-ins are
    /// installed): then nothing else would ever start them this boot, so both gates are
    /// released and both services started, on the systemd `running` gives once it may.
    fn without_gpus(&self, running: impl FnOnce() -> Result<Systemd>) -> Result<()> {
        let (who, target, mc, root) = (self.who, self.target, self.mc, self.root);
        let markers = target.markers(self.host, who);
        let gated = clean(who, target, mc, root, &markers)?;
        let sd = running()?;
        if gated {
            let services = MachineServices {
                sd: &sd,
                job_timeout: mc.job_timeout,
            };
            for unit in [&mc.containerd_unit, &mc.kubelet_unit] {
                services
                    .start(unit)
                    .with_context(|| format!("post-start of {who}: starting {unit}"))?;
                tracing::info!(machine = who, %unit, "started (gated at boot while the host had GPUs)");
            }
        }
        Ok(())
    }
}

/// post-start without NVIDIA devices, in the target's files: our stale NVIDIA state removed
/// and, when the unit gate holds the services, both released. Returns whether it did (the
/// caller then starts both).
fn clean(
    who: &str,
    target: Target,
    mc: &MachineConfig,
    root: &MachineRoot,
    markers: &gate::Markers,
) -> Result<bool> {
    let spec_file = cdi::spec_file_name(&mc.cdi_kind);
    let report = target
        .cleanup(root, mc, &spec_file)
        .with_context(|| format!("post-start of {who}: removing stale NVIDIA state"))?;
    let why = if mc.gpus == crate::config::Gpus::None {
        "no NVIDIA GPUs for this machine (gpus: none)"
    } else {
        "no NVIDIA GPUs on the host"
    };
    tracing::info!(machine = who, "{why}; {report}");
    let gated =
        target.is_gated(root, &mc.kubelet_unit)? || target.is_gated(root, &mc.containerd_unit)?;
    if gated {
        markers.release(&mc.containerd_unit, Point::PostStartMidGateRelease)?;
        markers.release(&mc.kubelet_unit, Point::PostStartMidKubeletGateRelease)?;
    }
    Ok(gated)
}

mod host_plan;
#[cfg(any(feature = "failpoints", feature = "testkit"))]
mod on_disk;

pub use host_plan::host_plan;
#[cfg(feature = "failpoints")]
pub use on_disk::rewire_root;
#[cfg(any(feature = "failpoints", feature = "testkit"))]
pub use on_disk::run_on_disk;

#[cfg(test)]
mod tests;
