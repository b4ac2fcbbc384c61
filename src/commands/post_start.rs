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
use crate::apply::executor::{Order, execute, micros, plan, plan_without_gpus, timed};
use crate::apply::gate;
use crate::apply::parts::Wiring;
use crate::apply::parts::{self, At, Part as _};
use crate::config::MachineConfig;
use crate::discovery;
use crate::discovery::check_complete;
use crate::failpoint::{self, Point};
use crate::fs::host::HostRoot;
use crate::fs::lock;
use crate::fs::machine_root::MachineRoot;
use crate::model::Desired;
use crate::systemd::services::{Deferred, MachineServices, Services};
use crate::systemd::{self, MachineHandle, Systemd};
use crate::types::machine_name::{MachineName, Subject};
use anyhow::{Context as _, Result};
use std::time::Instant;

/// Where post-start works ([`crate::model::Target`]); everything but the parts' list is the same
/// [`plan`], [`execute`] and [`Wiring`] for both. Units, CDI directory, staged images directory,
/// gate markers and timeouts come from the config (`machines.<name>`/`defaults`, or `host`) and
/// resolve in the target's root.
pub use crate::model::Target;

/// Where `who`'s gate markers live (host paths, see [`gate::Markers`]).
fn markers<'a>(host: &'a HostRoot, who: Subject) -> gate::Markers<'a> {
    match who {
        Subject::Machine(m) => gate::Markers::of_machine(host, m),
        Subject::Host => gate::Markers::of_host(host),
    }
}

/// The kind of target `who` is.
fn target_of(who: Subject) -> Target {
    match who {
        Subject::Machine(_) => Target::Machine,
        Subject::Host => Target::Host,
    }
}

/// What post-start starts from, wherever its target is: the machine's settings, its lock held,
/// its desired state for the host now (the machine's share of it, exit 3 while incomplete).
/// `what` names the command in messages.
struct Prepared {
    mc: MachineConfig,
    _lock: lock::MachineLock,
    desired: Desired,
}

impl Prepared {
    fn open(ctx: &Ctx, machine: &MachineName, what: &str) -> Result<Prepared> {
        let mc = ctx.config.machine(&ctx.host, machine)?;
        let who = machine.as_str();
        let lock = timed(who, "lock", || {
            lock::lock(&ctx.host, machine, mc.lock_timeout)
        })?;
        let host_inv = timed(who, "discover", || discovery::discover(&ctx.host))?;
        let desired = Desired::for_hooks(ctx, machine, &mc, &host_inv)
            .with_context(|| format!("{what} of {machine}"))?;
        Ok(Prepared {
            mc,
            _lock: lock,
            desired,
        })
    }
}

/// [`Prepared`] for the running machine, reached through the host's systemd.
struct Running {
    prepared: Prepared,
    handle: MachineHandle,
}

impl Running {
    fn open(ctx: &Ctx, machine: &MachineName, what: &str) -> Result<Running> {
        if !ctx.host.is_real_root() {
            return Err(crate::error::bad_input(format!(
                "{what} of {machine} works on the running machine through the host's systemd; \
                 --host-root {} is only for pre-start, plan, discover and install",
                ctx.host.root().display()
            )));
        }
        let prepared = Prepared::open(ctx, machine, what)?;
        let deadline = Instant::now() + prepared.mc.job_timeout;
        let handle = timed(machine.as_str(), "find machine", || {
            MachineHandle::find(&Systemd::host(deadline)?, machine, deadline)
        })?;
        Ok(Running { prepared, handle })
    }
}

/// `refresh-devices`: the running machine's `/dev/char` links made for the host's nodes now
/// (those its bound NVIDIA node directories show: a MIG capability or IMEX channel the host made
/// while it runs), under the machine's lock: post-start's `/dev/char` part
/// ([`parts::dev_char::write`]) alone; nothing else is touched and no service stopped. A machine not
/// running is an error (its path unit is bound to its unit, so only a hand-run meets it).
pub(crate) fn refresh_devices(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let r = Running::open(ctx, machine, "refresh-devices")?;
    let who = machine.as_str();
    let line = timed(who, "dev-char", || {
        parts::dev_char::write(r.handle.root(), &r.prepared.desired, &ctx.host)
    })?;
    tracing::info!(machine = %who, step = "dev-char", "{line}");
    Ok(())
}

/// ExecStartPost=: see the module documentation.
pub fn post_start(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let total = Instant::now();
    let r = Running::open(ctx, machine, "post-start")?;
    let (mc, handle) = (&r.prepared.mc, &r.handle);
    let run = TargetRun {
        who: Subject::Machine(machine),
        in_its_start: crate::types::units::runs_in_its_start(machine),
        mc,
        host: &ctx.host,
        root: handle.root(),
        desired: &r.prepared.desired,
    };
    let job_timeout = mc.job_timeout;
    run.finish(
        total,
        // Without GPUs the start returns once the boot is done, as it did when post-start ran
        // after it (`NotifyReady=yes`): the boot starts this machine's services itself.
        || {
            Ok(MachineServices {
                sd: systemd::wait_running(handle, Instant::now() + mc.boot_timeout)?,
                job_timeout,
            })
        },
        // With them, the boot goes on meanwhile: the unit gate holds both services until their
        // markers exist.
        || {
            Ok(MachineServices {
                sd: systemd::wait_bus(handle, Instant::now() + mc.boot_timeout)?,
                job_timeout,
            })
        },
    )
}

/// `host post-start`: post-start of the host itself, [`Target::Host`]. Run by
/// `nspawn-lifecycle-host.service` at boot (see `install --host`) and by hand after a driver
/// change. The same discovery, incomplete verdict (exit 3), lock discipline (a lock of its
/// own), parts, executor, failure points and restore-on-failure as a machine's.
pub(crate) fn host_post_start(ctx: &Ctx) -> Result<()> {
    let hc = ctx.config.host()?;
    if !ctx.host.is_real_root() {
        return Err(crate::error::bad_input(format!(
            "host post-start works on the running host through its systemd; --host-root {} is \
             only for host plan",
            ctx.host.root().display()
        )));
    }
    let total = Instant::now();
    let who = Subject::Host;
    let _lock = timed(who, "lock", || lock::lock_host(&ctx.host, hc.lock_timeout))?;
    let inv = timed(who, "discover", || discovery::discover(&ctx.host))?;
    check_complete(&inv).context("host post-start")?;
    let root = MachineRoot::open(ctx.host.root())?;
    let helper = ctx.config.helper_path();
    let run = TargetRun {
        who,
        in_its_start: false,
        mc: &hc,
        host: &ctx.host,
        root: &root,
        desired: &Desired::host(&ctx.host, &inv, &hc, helper)?,
    };
    // No boot to wait for: this runs as a unit of the host's own boot.
    let bus = || {
        Ok(MachineServices {
            sd: Systemd::host(Instant::now() + hc.job_timeout)?,
            job_timeout: hc.job_timeout,
        })
    };
    run.finish(total, bus, bus)
}

/// One post-start run: whom it is for and what it works on, a machine or the host.
struct TargetRun<'a> {
    who: Subject<'a>,
    /// Whether this is the `ExecStartPost=` of the machine unit's start ([`Order::of`]).
    in_its_start: bool,
    mc: &'a MachineConfig,
    host: &'a HostRoot,
    root: &'a MachineRoot,
    desired: &'a Desired,
}

impl TargetRun<'_> {
    /// The part both targets share once they have discovered and locked: without a complete
    /// driver (or nothing to put in a spec) [`TargetRun::without_gpus`], reaching the services
    /// `running` gives only if it starts one; otherwise [`TargetRun::wire`] on the services
    /// `bus` gives.
    fn finish<S: Services>(
        &self,
        total: Instant,
        running: impl FnOnce() -> Result<S>,
        bus: impl FnOnce() -> Result<S>,
    ) -> Result<()> {
        if self.desired.driver.is_none() {
            return self.without_gpus(running);
        }
        let services = timed(self.who, "wait bus", bus)?;
        failpoint::hit(Point::AfterBus);
        self.wire(&services)?;
        tracing::debug!(
            machine = %self.who,
            step = "post-start",
            us = micros(total.elapsed()),
            "step timing"
        );
        Ok(())
    }

    fn wiring<'a>(
        &'a self,
        markers: &'a gate::Markers<'a>,
        services: &'a dyn Services,
    ) -> Wiring<'a> {
        Wiring {
            who: self.who,
            mc: self.mc,
            host: self.host,
            markers,
            root: self.root,
            desired: self.desired,
            services,
        }
    }

    /// Run the target's plan over its root and services, and log what was wired.
    fn wire(&self, services: &dyn Services) -> Result<()> {
        let (who, mc) = (self.who, self.mc);
        let markers = markers(self.host, who);
        let order = Order::of(target_of(who), &markers, mc, self.in_its_start)?;
        if order == Order::ContainerdReleased {
            tracing::info!(machine = %who, unit = %mc.containerd_unit,
                "released before post-start began ({}): not stopped, started with the boot",
                markers.path(&mc.containerd_unit));
        }
        let started = Instant::now();
        let wiring = self.wiring(&markers, services);
        execute(&plan(mc, target_of(who), order), who, &wiring, services)?;
        tracing::info!(
            machine = %who,
            "post-start done in {:.2}s: NVIDIA driver {}, {} GPU(s)",
            started.elapsed().as_secs_f64(),
            self.desired
                .driver
                .as_ref()
                .map_or("?", |d| d.version.as_str()),
            self.desired.gpus
        );
        Ok(())
    }

    /// post-start without NVIDIA devices ([`plan_without_gpus`]): the same parts against a
    /// desired state with nothing of ours, so what is left of ours goes and pods cannot be
    /// handed GPUs that are gone; no service stopped. When the gate holds the services (the
    /// gate part as read now), both are released and started, once `running` gives the
    /// target's systemd; it returns once `running` has given it either way.
    fn without_gpus<S: Services>(&self, running: impl FnOnce() -> Result<S>) -> Result<()> {
        let (who, mc) = (self.who, self.mc);
        tracing::info!(
            machine = %who,
            "{}; removing what is left of ours",
            if mc.gpus == crate::config::Gpus::None {
                "no NVIDIA GPUs for this machine (gpus: none)"
            } else {
                "no NVIDIA GPUs on the host"
            }
        );
        let at = At {
            target: self.root,
            host: self.host,
            desired: self.desired,
        };
        let gated = match parts::Gate.observe(&at) {
            Ok(units) => parts::gate::summary(&units).0,
            Err(e) => return Err(e.context(format!("post-start of {who}: reading the gate"))),
        };
        let markers = markers(self.host, who);
        let services = Deferred::new(running);
        let wiring = self.wiring(&markers, &services);
        execute(
            &plan_without_gpus(mc, target_of(who), gated),
            who,
            &wiring,
            &services,
        )?;
        // Nothing gated: the boot starts the services itself, and the start returns once the
        // boot is done, as it did when post-start ran after it (`NotifyReady=yes`).
        timed(who, "wait running", || services.reach())
    }
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
