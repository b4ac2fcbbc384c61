//! `nspawn-lifecycle post-start`: rewire NVIDIA state inside the machine with its services stopped.
//!
//! It runs while the machine boots (the `.nspawn` file says `NotifyReady=no`, so systemd runs
//! `ExecStartPost=` as soon as the container is up), from the moment the machine's systemd
//! answers on its bus. Order (DESIGN §5): stop kubelet → stop containerd → check the
//! driver root (made by nspawn's binds at boot) → links → `ldconfig` → CDI spec → release
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
use crate::apply::gate;
use crate::apply::rewire;
use crate::config::MachineConfig;
use crate::discovery::check_complete;
use crate::discovery::{self, assign};
use crate::failpoint::{self, Point};
use crate::fs::host::HostRoot;
use crate::fs::lock;
use crate::fs::machine_root::{FileKind, MachineDir, MachineRoot};
use crate::model::cdi;
use crate::model::{self, Desired};
use crate::systemd::{self, MachineHandle, Systemd, TransientOutcome};
use crate::types::machine_name::MachineName;
use crate::types::paths::{MachinePath, UnitName};
use anyhow::{Context as _, Result};
use std::os::fd::{AsFd as _, BorrowedFd};
use std::time::{Duration, Instant};

/// Where tarballs that failed to import are moved, under the staged-images directory.
pub const FAILED_DIR: &str = "failed";

/// What post-start needs from the machine's systemd. A trait so the ordering and the
/// restart-on-failure rules are unit-tested with a recording fake; the real thing is proven
/// under a real systemd in `tests/e2e`.
pub trait Services {
    /// Stop `unit` and wait until the job is done.
    fn stop(&self, unit: &str) -> Result<()>;
    /// Start `unit` and wait until the job is done; an error unless the unit then runs (a gated
    /// unit's start is skipped by its condition, which is an error here).
    fn start(&self, unit: &str) -> Result<()>;
    /// Whether `unit` runs now (active, reloading or activating).
    fn is_active(&self, unit: &str) -> Result<bool>;
    /// Run `argv` in the machine as a transient unit, with `stdin` as its standard input when
    /// given, and wait for it.
    fn run(
        &self,
        prefix: &str,
        argv: &[&str],
        stdin: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<TransientOutcome>;
}

/// The machine's systemd over its own bus.
struct MachineServices<'a> {
    sd: &'a Systemd,
    job_timeout: Duration,
}

impl Services for MachineServices<'_> {
    fn stop(&self, unit: &str) -> Result<()> {
        self.sd.stop_unit(unit, Instant::now() + self.job_timeout)
    }
    fn start(&self, unit: &str) -> Result<()> {
        let deadline = Instant::now() + self.job_timeout;
        // Our stop/start pairs count against the unit's start limit (5 in 10 s by default): an
        // operator running post-start a few times in a row would otherwise be refused with
        // start-limit-hit. A deliberate start clears it; a unit that really fails still fails
        // its start job below. An unknown unit fails there too, with a clearer message.
        if let Err(e) = self.sd.reset_failed_unit(unit, deadline) {
            tracing::debug!(%unit, "ResetFailedUnit before the start: {e:#}");
        }
        self.sd.start_unit(unit, deadline)?;
        // A start job also finishes "done" when a condition skipped the unit: check it runs.
        let st = self.sd.unit_state(unit, deadline)?;
        match st.active_state.as_str() {
            "active" | "reloading" => Ok(()),
            other => anyhow::bail!(
                "{unit} is {other} ({}) after its start job finished; an unmet Condition…= \
                 skips a unit that way (see `systemctl status {unit}` in the machine)",
                st.sub_state
            ),
        }
    }
    fn is_active(&self, unit: &str) -> Result<bool> {
        let st = self
            .sd
            .unit_state(unit, Instant::now() + self.job_timeout)?;
        Ok(matches!(
            st.active_state.as_str(),
            "active" | "reloading" | "activating"
        ))
    }
    fn run(
        &self,
        prefix: &str,
        argv: &[&str],
        stdin: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<TransientOutcome> {
        self.sd.run_transient(prefix, argv, stdin, timeout)
    }
}

/// Where post-start works ([`crate::model::Target`]); everything but the file steps is the same
/// [`plan`], [`execute`] and [`Wiring`] for both. Units, CDI directory, staged images directory,
/// gate markers and timeouts come from the config (`machines.<name>`/`defaults`, or `host`) and
/// resolve in the target's root.
pub use crate::model::Target;

/// How host mode names itself in messages and log lines (the `machine` field).
pub const HOST_LABEL: &str = "the host";

impl Target {
    /// The file steps between the stops and `ldconfig`.
    fn file_steps(self) -> &'static [FileStep] {
        match self {
            Target::Machine => &[FileStep::DriverRoot, FileStep::Links],
            Target::Host => &[FileStep::DevChar],
        }
    }

    /// Whether `unit`'s gate drop-in is in place (the unit waits for its marker this boot).
    fn is_gated(self, root: &MachineRoot, unit: &UnitName) -> Result<bool> {
        match self {
            Target::Machine => gate::is_gated(root, unit),
            Target::Host => gate::is_gated_on_host(root, unit),
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

/// ExecStartPost=: see the module documentation.
pub fn post_start(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    if !ctx.host.is_real_root() {
        return Err(crate::error::bad_input(format!(
            "post-start of {machine} works on the running machine through the host's systemd; \
             --host-root {} is only for pre-start, plan, discover and install",
            ctx.host.root().display()
        )));
    }
    let total = Instant::now();
    let who = machine.as_str();
    let _lock = timed(who, "lock", || {
        lock::lock(&ctx.host, machine, mc.lock_timeout)
    })?;
    let host_inv = timed(who, "discover", || discovery::discover(&ctx.host))?;
    // The machine's share of the host (the config's `gpus`): all it is wired for.
    let inv = assign::for_machine(&ctx.config, machine, &mc, &host_inv)
        .with_context(|| format!("post-start of {machine}"))?
        .view;
    check_complete(&inv).with_context(|| format!("post-start of {machine}"))?;

    let deadline = Instant::now() + mc.job_timeout;
    let handle = timed(who, "find machine", || {
        MachineHandle::find(&Systemd::host(deadline)?, machine.as_str(), deadline)
    })?;
    let run = TargetRun {
        who,
        in_its_start: crate::types::units::runs_in_its_start(machine),
        target: Target::Machine,
        mc: &mc,
        host: &ctx.host,
        root: handle.root(),
        desired: &Desired::of(
            Target::Machine,
            &ctx.host,
            &inv,
            &mc,
            ctx.config.helper_path().as_str(),
        )?,
    };
    run.finish(
        total,
        // Without GPUs the start returns once the boot is done, as it did when post-start ran
        // after it (`NotifyReady=yes`): the boot starts this machine's services itself.
        || systemd::wait_running(&handle, Instant::now() + mc.boot_timeout),
        // With them, the boot goes on meanwhile: the unit gate holds both services until their
        // markers exist.
        || systemd::wait_bus(&handle, Instant::now() + mc.boot_timeout),
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
        desired: &Desired::of(Target::Host, &ctx.host, &inv, &hc, helper.as_str())?,
    };
    // No boot to wait for: this runs as a unit of the host's own boot.
    let bus = || Systemd::host(Instant::now() + hc.job_timeout);
    run.finish(total, bus, bus)
}

/// `host plan`: what `host post-start` would do on this host now, from the same
/// values it runs ([`plan`] of [`Target::Host`], the host settings, discovery). Writes nothing;
/// works under `--host-root`. Text, or with `json` one object (kind `HostPlan`). Exit 3, after
/// the report, while the NVIDIA state is incomplete.
pub fn host_plan(ctx: &Ctx, json: bool) -> Result<()> {
    let hc = ctx.config.host()?;
    let inv = discovery::discover(&ctx.host)?;
    let spec = cdi::spec_on_host(&inv, &hc.cdi_kind, ctx.config.helper_path().as_str())?;
    let root = MachineRoot::open(ctx.host.root())?;
    let mut units = Vec::new();
    for unit in [&hc.containerd_unit, &hc.kubelet_unit] {
        units.push(HostPlanUnit {
            unit: unit.to_string(),
            gate_dropin: gate::host_dropin(unit).to_string(),
            gate_installed: Target::Host.is_gated(&root, unit)?,
            marker: gate::marker(unit).to_string(),
            released: gate::Markers::of_host(&ctx.host).is_released(unit)?,
        });
    }
    let complete = check_complete(&inv).context("host plan");
    let (nvidia, steps) = match (inv.complete_driver(), &spec) {
        _ if complete.is_err() => ("incomplete", Vec::new()),
        (Some(_), Some(_)) => (
            "complete",
            plan(&hc, Target::Host, Order::Gated)
                .steps
                .iter()
                .map(ToString::to_string)
                .collect(),
        ),
        _ => ("none", Vec::new()),
    };
    let value = HostPlan {
        api_version: discovery::API_VERSION,
        kind: "HostPlan",
        host_root: ctx.host.root().display().to_string(),
        lock: format!("{}/{}", lock::LOCK_DIR, lock::HOST_LOCK_NAME),
        units,
        nvidia,
        driver_version: inv.complete_driver().map(|d| d.version.clone()),
        gpus: inv.gpus.len(),
        cdi_spec: format!("{}/{}", hc.cdi_dir, cdi::spec_file_name(&hc.cdi_kind)),
        hook: ctx.config.helper_path().to_string(),
        staged_images: hc.staged_images_dir.to_string(),
        steps,
    };
    let out = if json {
        format!("{}\n", serde_json::to_string_pretty(&value)?)
    } else {
        value.to_string()
    };
    crate::output::print_all(&out)?;
    complete
}

/// What `host plan` shows: one value, printed as text or as JSON (kind `HostPlan`).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct HostPlan {
    api_version: &'static str,
    kind: &'static str,
    host_root: String,
    lock: String,
    /// containerd's, then kubelet's.
    units: Vec<HostPlanUnit>,
    /// `complete` (host post-start wires the driver), `incomplete` (it refuses, exit 3) or
    /// `none` (it removes our state).
    nvidia: &'static str,
    driver_version: Option<String>,
    gpus: usize,
    cdi_spec: String,
    hook: String,
    staged_images: String,
    /// post-start's steps in order; empty unless `nvidia` is `complete`.
    steps: Vec<String>,
}

/// A host unit and its gate, as `host plan` shows it.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct HostPlanUnit {
    unit: String,
    gate_dropin: String,
    gate_installed: bool,
    marker: String,
    released: bool,
}

impl std::fmt::Display for HostPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "host mode on {} (the host's systemd)\nlock: {}",
            self.host_root, self.lock
        )?;
        for u in &self.units {
            writeln!(
                f,
                "{}: gate drop-in {} ({}), marker {}{}",
                u.unit,
                u.gate_dropin,
                if u.gate_installed {
                    "installed"
                } else {
                    "not installed"
                },
                u.marker,
                if u.released { " (exists)" } else { "" }
            )?;
        }
        match self.nvidia {
            "incomplete" => writeln!(
                f,
                "NVIDIA state incomplete: host post-start refuses (exit 3) and changes nothing"
            ),
            "complete" => writeln!(
                f,
                "NVIDIA driver {} (driver root /), {} GPU(s)\nCDI spec: {} (hooks run {})\n\
                 staged images: {}\nsteps: {}",
                self.driver_version.as_deref().unwrap_or_default(),
                self.gpus,
                self.cdi_spec,
                self.hook,
                self.staged_images,
                self.steps.join(" → ")
            ),
            _ => writeln!(
                f,
                "no NVIDIA GPUs: remove our /dev/char links and {}; if the gate drop-ins are \
                 installed, release both and start {}",
                self.cdi_spec,
                self.units
                    .iter()
                    .map(|u| u.unit.as_str())
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        }
    }
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

/// post-start of `machine` against a machine rootfs on disk, with `services` in place of its
/// systemd: the product's lock, discovery, [`Desired`], no-GPU cleanup and, with GPUs, [`plan`]
/// (the gated order) run by [`execute`] over [`Wiring`]. For the crash tests (`rewire-root`) and
/// the wiring model's property test.
#[cfg(any(feature = "failpoints", feature = "testkit"))]
pub fn run_on_disk(
    ctx: &Ctx,
    machine: &MachineName,
    root: &MachineRoot,
    services: &dyn Services,
) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    let _lock = lock::lock(&ctx.host, machine, mc.lock_timeout)?;
    let inv =
        assign::for_machine(&ctx.config, machine, &mc, &discovery::discover(&ctx.host)?)?.view;
    check_complete(&inv)?;
    on_disk(ctx, machine, &mc, &ctx.host, &inv, root, services)
}

/// [`run_on_disk`] once locked and discovered.
#[cfg(any(feature = "failpoints", feature = "testkit"))]
fn on_disk(
    ctx: &Ctx,
    machine: &MachineName,
    mc: &MachineConfig,
    host: &HostRoot,
    inv: &crate::discovery::Inventory,
    root: &MachineRoot,
    services: &dyn Services,
) -> Result<()> {
    let who = machine.as_str();
    let desired = Desired::of(
        Target::Machine,
        host,
        inv,
        mc,
        ctx.config.helper_path().as_str(),
    )?;
    let markers = gate::Markers::of_machine(host, who);
    if desired.driver.is_none() {
        clean(who, Target::Machine, mc, root, &markers)?;
        return Ok(());
    }
    let wiring = Wiring {
        machine: who,
        mc,
        host,
        markers: &markers,
        root,
        desired: &desired,
        services,
    };
    execute(
        &plan(mc, Target::Machine, Order::Gated),
        who,
        &wiring,
        services,
    )
}

/// `rewire-root` (failpoints builds only): post-start's plan and executor, exactly as the product
/// runs them ([`plan`], [`execute`] over [`Wiring`]), against a
/// machine rootfs directory on disk with no systemd in it ([`OnDisk`]), for the crash tests.
#[cfg(feature = "failpoints")]
pub fn rewire_root(ctx: &Ctx, machine: &MachineName, dir: &std::path::Path) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    let _lock = lock::lock(&ctx.host, machine, mc.lock_timeout)?;
    let inv =
        assign::for_machine(&ctx.config, machine, &mc, &discovery::discover(&ctx.host)?)?.view;
    check_complete(&inv)?;
    // Before the machine root and the host root are opened (again): a descriptor opened in the
    // old mount namespace would not see the mounts made in the new one, and a bind from it is
    // refused (EINVAL: its source is not in this namespace).
    private_mount_namespace()?;
    let host = HostRoot::open(ctx.host.root())?;
    let root = MachineRoot::open(dir)?;
    root.refuse_host_root(std::path::Path::new("/"))?;
    if let Some(driver) = inv.complete_driver() {
        bind_driver_root(&root, &host, driver)?;
    }
    let services = OnDisk { dir };
    if inv.complete_driver().is_some() {
        // Each run is a boot: it begins with the machine's markers emptied, as pre-start leaves
        // them.
        gate::prepare_boot(&host, machine.as_str(), None)?;
    }
    on_disk(ctx, machine, &mc, &host, &inv, &root, &services)
}

/// A mount namespace of this process only, for `rewire-root`'s driver binds: gone when it exits,
/// as the machine's `/run` goes with the machine.
#[cfg(feature = "failpoints")]
fn private_mount_namespace() -> Result<()> {
    use nix::mount::{MsFlags, mount};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .context("rewire-root: unshare(CLONE_NEWNS)")?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("rewire-root: making / private")
}

/// What systemd-nspawn does with the driver binds of the `.nspawn` file, for `rewire-root` (in
/// the namespace of [`private_mount_namespace`]): a tmpfs at the driver root with every bind of
/// [`crate::model::layout::driver_binds`] mounted read-only at its target.
#[cfg(feature = "failpoints")]
fn bind_driver_root(
    root: &MachineRoot,
    host: &HostRoot,
    driver: &discovery::UserspaceDriver,
) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let top = root.create_dir_all(crate::model::layout::DRIVER_ROOT, 0o755)?;
    // By descriptor: the directory was resolved inside the machine root once.
    let at = format!("/proc/self/fd/{}", top.as_fd().as_raw_fd());
    mount(
        Some("tmpfs"),
        at.as_str(),
        Some("tmpfs"),
        MsFlags::MS_NODEV,
        Some("mode=0755"),
    )
    .with_context(|| format!("rewire-root: tmpfs on {}", top.path()))?;
    // The tmpfs just mounted, looked up again by path: the old descriptor (and a reopen of its
    // /proc magic link) still names the directory underneath. Ours alone, so plain paths below
    // it are safe.
    let tmp = root
        .open_dir(crate::model::layout::DRIVER_ROOT)?
        .context("rewire-root: the driver root tmpfs vanished")?;
    let base = format!("/proc/self/fd/{}", tmp.as_fd().as_raw_fd());
    // Every node of pre-start's host tree (files bound rather than hard-linked), then the
    // directory binds, then the tree read-only, as nspawn binds it.
    use crate::model::layout::TreeNode;
    for (rel, node) in crate::model::layout::driver_tree(driver)? {
        let at = format!("{base}/{rel}");
        let shown = format!("{}/{rel}", crate::model::layout::DRIVER_ROOT);
        match node {
            TreeNode::Dir => std::fs::create_dir_all(&at),
            TreeNode::Hard(source) | TreeNode::Bound(source) => {
                std::fs::File::create(&at)
                    .with_context(|| format!("rewire-root: mount point {shown}"))?;
                bind_read_only(host, &source, &at, &shown)?;
                Ok(())
            }
            TreeNode::Link(to) => std::os::unix::fs::symlink(&to, &at),
            TreeNode::File(bytes) => std::fs::write(&at, bytes),
        }
        .with_context(|| format!("rewire-root: {shown}"))?;
    }
    for b in crate::model::layout::dir_binds(driver)? {
        let rel = b
            .target
            .strip_prefix(crate::model::layout::DRIVER_ROOT)
            .unwrap_or(b.target.as_str());
        let target = format!("{base}{rel}");
        bind_read_only(host, b.source.as_str(), &target, &b.target)?;
    }
    mount(
        None::<&str>,
        base.as_str(),
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .with_context(|| {
        format!(
            "rewire-root: read-only {}",
            crate::model::layout::DRIVER_ROOT
        )
    })?;
    Ok(())
}

/// Bind the host file `source` (resolved inside the host root, bound through its descriptor)
/// read-only at `target`; `shown` names the target in messages.
#[cfg(feature = "failpoints")]
fn bind_read_only(host: &HostRoot, source: &str, target: &str, shown: &str) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    use std::os::fd::AsRawFd as _;
    let display = host.path(source);
    let pinned = host
        .pin(source)
        .with_context(|| format!("rewire-root: opening {}", display.display()))?;
    mount(
        Some(format!("/proc/self/fd/{}", pinned.as_raw_fd()).as_str()),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .with_context(|| format!("rewire-root: binding {} at {shown}", display.display()))?;
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .with_context(|| format!("rewire-root: read-only {shown}"))
}

/// A machine rootfs on disk with no systemd in it. Nothing runs there, so no unit is active and
/// stops and starts are logged no-ops. `ldconfig` is the host's `ldconfig -r <rootfs>`, which
/// rebuilds the rootfs's own `/etc/ld.so.cache` from its own `ld.so.conf`, as the machine's
/// `ldconfig` would. `ctr` needs the machine's containerd, so an import fails as one whose `ctr`
/// could not run: the tarball is set aside like any failed import.
#[cfg(any(feature = "failpoints", feature = "testkit"))]
pub struct OnDisk<'a> {
    pub dir: &'a std::path::Path,
}

#[cfg(any(feature = "failpoints", feature = "testkit"))]
impl Services for OnDisk<'_> {
    fn stop(&self, unit: &str) -> Result<()> {
        tracing::info!(%unit, "no systemd in a rootfs on disk: nothing to stop");
        Ok(())
    }
    fn start(&self, unit: &str) -> Result<()> {
        tracing::info!(%unit, "no systemd in a rootfs on disk: nothing to start");
        Ok(())
    }
    fn is_active(&self, _: &str) -> Result<bool> {
        Ok(false)
    }
    fn run(
        &self,
        prefix: &str,
        argv: &[&str],
        _: Option<BorrowedFd<'_>>,
        _: Duration,
    ) -> Result<TransientOutcome> {
        let started = Instant::now();
        if argv != ["/sbin/ldconfig"] {
            anyhow::bail!(
                "no systemd in a rootfs on disk: cannot run {}",
                argv.join(" ")
            );
        }
        let out = std::process::Command::new("ldconfig")
            .arg("-r")
            .arg(self.dir)
            .output()
            .with_context(|| format!("running ldconfig -r {}", self.dir.display()))?;
        let code = out.status.code();
        Ok(TransientOutcome {
            unit: format!("{prefix} (host ldconfig -r)"),
            exit_status: code.map_or(systemd::ExitStatus::NotRun, systemd::ExitStatus::Exited),
            result: if out.status.success() {
                "success"
            } else {
                "exit-code"
            }
            .into(),
            output: String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned(),
            output_dropped: 0,
            elapsed: started.elapsed(),
        })
    }
}

/// Run `f` and log how long it took: one debug line per step (`step timing`, fields `step` and
/// `us`), which `tests/bench/e2e-bench.sh` reads to time the rewiring apart from the services.
fn timed<T>(machine: &str, step: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    tracing::debug!(%machine, step, us = micros(started.elapsed()), "step timing");
    out
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The file steps: what post-start writes or checks in the machine's rootfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileStep {
    DriverRoot,
    Links,
    /// Host mode's links ([`Target::Host`]): `/dev/char` only.
    DevChar,
    Cdi,
}

impl FileStep {
    fn name(self) -> &'static str {
        match self {
            FileStep::DriverRoot => "driver root",
            FileStep::Links => "library and /dev/char links",
            FileStep::DevChar => "/dev/char links",
            FileStep::Cdi => "CDI spec",
        }
    }

    /// The `step` field of the step's log line (`journalctl STEP=cdi`).
    fn key(self) -> &'static str {
        match self {
            FileStep::DriverRoot => "driver-root",
            FileStep::Links => "links",
            FileStep::DevChar => "dev-char",
            FileStep::Cdi => "cdi",
        }
    }
}

/// One step of post-start's rewire plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Stop the unit (noting first whether it ran: a failure puts back only that), then reach
    /// the failpoint.
    Stop(UnitName, Point),
    File(FileStep),
    /// The machine's own `ldconfig`, as a transient unit of its systemd; skipped when no library
    /// link changed and the machine's `ld.so.cache` already lists the driver (a transient unit
    /// and a full cache rebuild on every start otherwise, most of the rewiring's time when
    /// nothing changed).
    Ldconfig,
    /// Create the unit's gate marker (src/apply/gate.rs): from now on the unit may start. The point is
    /// the failpoint between the marker's temp file and its rename; `key` the log line's `step`.
    Release {
        unit: UnitName,
        point: Point,
        key: &'static str,
    },
    /// Start the unit and check it runs, with failpoints before and after.
    Start {
        unit: UnitName,
        before: Option<Point>,
        after: Option<Point>,
    },
    /// Import the staged images in this directory ([`import_images`]); a problem there is
    /// logged, never fatal.
    Import(MachinePath),
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Stop(unit, _) => write!(f, "stop {unit}"),
            Step::File(step) => write!(f, "{}", step.name()),
            Step::Ldconfig => f.write_str("ldconfig"),
            Step::Release { unit, .. } => write!(f, "release {unit}"),
            Step::Start { unit, .. } => write!(f, "start {unit}"),
            Step::Import(dir) => write!(f, "import staged images from {dir}"),
        }
    }
}

/// post-start's rewire plan: a plain value, computed from the configuration before anything is
/// touched, run by [`execute`] (the product and `rewire-root` alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let steps: Vec<String> = self.steps.iter().map(Step::to_string).collect();
        f.write_str(&steps.join(" → "))
    }
}

/// When containerd may start: what post-start finds when it begins ([`Order::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Both services wait for post-start: the order of DESIGN §5.
    Gated,
    /// post-start runs in the unit's start and containerd's marker was there before it began:
    /// pre-start released it for this boot, over the driver root it had just built and checked
    /// (`containerdAtBoot`), and the boot starts it. containerd is then neither
    /// stopped nor held: the CDI spec it reads is written atomically beside it, and kubelet,
    /// which alone hands GPUs to pods, still waits for all of post-start.
    ContainerdReleased,
}

impl Order {
    /// The order for this run, before any step: only a machine's containerd is ever released
    /// before post-start (host mode has no pre-start), and only a boot's: run by hand
    /// (`in_its_start` false), post-start stops and restarts both services as it always did.
    pub fn of(
        target: Target,
        markers: &gate::Markers,
        mc: &MachineConfig,
        in_its_start: bool,
    ) -> Result<Order> {
        Ok(
            if target == Target::Machine
                && in_its_start
                && markers.is_released(&mc.containerd_unit)?
            {
                Order::ContainerdReleased
            } else {
                Order::Gated
            },
        )
    }
}

/// The order of DESIGN §5: kubelet stopped, containerd too unless it was released
/// before post-start began ([`Order`]; a stop also cancels a start job the boot still has
/// queued), the driver wired, containerd released and started (or, already released, waited
/// for: the boot's own start job), the staged images imported, kubelet released and started.
/// The target ([`Target`]) changes only the file steps before `ldconfig`.
pub fn plan(mc: &MachineConfig, target: Target, order: Order) -> Plan {
    let (containerd, kubelet) = (&mc.containerd_unit, &mc.kubelet_unit);
    let gated = order == Order::Gated;
    let stops = std::iter::once(Step::Stop(kubelet.clone(), Point::AfterKubeletStop))
        .chain(gated.then(|| Step::Stop(containerd.clone(), Point::AfterContainerdStop)));
    let files = target.file_steps().iter().map(|f| Step::File(*f));
    let release_containerd = gated.then(|| Step::Release {
        unit: containerd.clone(),
        point: Point::PostStartMidGateRelease,
        key: "gate",
    });
    Plan {
        steps: stops
            .chain(files)
            .chain([Step::Ldconfig, Step::File(FileStep::Cdi)])
            .chain(release_containerd)
            .chain(vec![
                Step::Start {
                    unit: containerd.clone(),
                    before: None,
                    after: Some(Point::AfterContainerdStart),
                },
                Step::Import(mc.staged_images_dir.clone()),
                Step::Release {
                    unit: kubelet.clone(),
                    point: Point::PostStartMidKubeletGateRelease,
                    key: "gate-kubelet",
                },
                Step::Start {
                    unit: kubelet.clone(),
                    before: Some(Point::BeforeKubeletStart),
                    after: None,
                },
            ])
            .collect(),
    }
}

/// What a file step did.
pub struct FileDone {
    /// The step's log line.
    pub line: String,
    /// Whether a library link changed (the links step; decides whether `ldconfig` runs).
    pub library_links_changed: bool,
}

/// What [`execute`] does in the machine apart from its services: a trait so the ordering and
/// the restore-on-failure rules are unit-tested with a recording fake.
pub trait Work {
    fn file(&self, step: FileStep) -> Result<FileDone>;
    /// Run `ldconfig` unless nothing needs it (see [`Step::Ldconfig`]). Returns the log line.
    fn ldconfig(&self, library_links_changed: bool) -> Result<String>;
    /// Create `unit`'s gate marker. Returns the log line.
    fn release(&self, unit: &UnitName, point: Point) -> Result<String>;
    /// Import the staged images: (imported, set aside).
    fn import(&self) -> Result<(usize, usize)>;
}

/// The real machine: its rootfs, the inventory it is wired for and its systemd.
pub struct Wiring<'a> {
    pub machine: &'a str,
    pub mc: &'a MachineConfig,
    pub host: &'a HostRoot,
    pub markers: &'a gate::Markers<'a>,
    pub root: &'a MachineRoot,
    /// What the file steps make the target: the wiring model's [`Desired`].
    pub desired: &'a Desired,
    pub services: &'a dyn Services,
}

impl Wiring<'_> {
    fn driver(&self) -> Result<&discovery::UserspaceDriver> {
        self.desired.driver.as_ref().context(
            "file steps without a complete NVIDIA driver: post-start runs them only when \
             discovery found one (a bug)",
        )
    }
}

impl Work for Wiring<'_> {
    fn file(&self, step: FileStep) -> Result<FileDone> {
        let driver = self.driver()?;
        let d = self.desired;
        let (line, library_links_changed) = match step {
            FileStep::DriverRoot => {
                let want = d.driver_root.as_ref().context(
                    "the driver root step without a driver root to check (a bug: host mode has none)",
                )?;
                let seen = model::driver_root::observe(self.root, want)?;
                if let Some(why) = model::driver_root::diff(want, &seen).message(want) {
                    return Err(crate::apply::driver_tree::distrust(
                        self.host,
                        self.machine,
                        anyhow::anyhow!(why),
                    ));
                }
                (
                    format!(
                        "driver root: {} binds of driver {} checked against the host",
                        want.len(),
                        driver.version
                    ),
                    false,
                )
            }
            FileStep::Links => {
                let lib = d
                    .lib_links
                    .as_ref()
                    .context("the links step without library links (a bug: host mode has none)")?;
                let report = rewire::rebuild_links(self.root, lib, &d.dev_char)?;
                (report.to_string(), rewire::library_links_changed(&report))
            }
            // Only /dev/char links: no library link of ours changes ldconfig's verdict on the
            // host, whose cache alone decides (ld_cache_current).
            FileStep::DevChar => (
                rewire::rebuild_dev_char(self.root, &d.dev_char)?.to_string(),
                false,
            ),
            FileStep::Cdi => {
                let report = rewire::write_cdi(self.root, &d.spec, |n, b| d.spec.conflicts(n, b))?;
                (report.to_string(), false)
            }
        };
        Ok(FileDone {
            line,
            library_links_changed,
        })
    }

    fn ldconfig(&self, library_links_changed: bool) -> Result<String> {
        if !library_links_changed && ld_cache_current(self.root, self.driver()?) {
            return Ok(
                "ldconfig: not needed, no library link changed and /etc/ld.so.cache lists the \
                 driver"
                    .to_owned(),
            );
        }
        let out = self.services.run(
            "nspawn-lifecycle-ldconfig",
            &["/sbin/ldconfig"],
            None,
            self.mc.job_timeout,
        )?;
        out.check("ldconfig")?;
        Ok(format!(
            "ldconfig: done in {:.2}s",
            out.elapsed.as_secs_f64()
        ))
    }

    fn release(&self, unit: &UnitName, point: Point) -> Result<String> {
        Ok(if self.markers.release(unit, point)? {
            format!("unit gate: released {unit} ({})", self.markers.path(unit))
        } else {
            format!("unit gate: {unit} already released")
        })
    }

    fn import(&self) -> Result<(usize, usize)> {
        import_images(self.machine, self.root, self.mc, self.services)
    }
}

/// [`model::ld_cache::lists_driver`], where a cache that cannot be read means running `ldconfig`.
fn ld_cache_current(root: &MachineRoot, driver: &discovery::UserspaceDriver) -> bool {
    model::ld_cache::lists_driver(root, driver).unwrap_or_else(|e| {
        tracing::debug!("reading the machine's ld.so.cache: {e:#}; running ldconfig");
        false
    })
}

/// The one executor: run `plan`'s steps in order. On a failure, start again only the services
/// that were running before their stop (in the plan's start order; see the module
/// documentation) and return the error.
pub fn execute(plan: &Plan, machine: &str, work: &dyn Work, services: &dyn Services) -> Result<()> {
    let mut run = Run {
        machine,
        work,
        services,
        was_running: Vec::new(),
        library_links_changed: true,
    };
    for step in &plan.steps {
        if let Err(e) = run.step(step) {
            let restore: Vec<&UnitName> = plan
                .steps
                .iter()
                .filter_map(|s| match s {
                    Step::Start { unit, .. } if run.was_running.contains(unit) => Some(unit),
                    _ => None,
                })
                .collect();
            start_again(machine, plan, services, &restore);
            return Err(e);
        }
    }
    Ok(())
}

/// The state of one run of a plan.
struct Run<'a> {
    machine: &'a str,
    work: &'a dyn Work,
    services: &'a dyn Services,
    /// What ran before post-start stopped it: the only services a failure puts back.
    was_running: Vec<UnitName>,
    /// What the links step said (true until it ran: `ldconfig` then runs).
    library_links_changed: bool,
}

impl Run<'_> {
    fn step(&mut self, step: &Step) -> Result<()> {
        let machine = self.machine;
        let what = || format!("post-start of {machine}: step '{step}'");
        let started = Instant::now();
        let line = match step {
            Step::Stop(unit, point) => {
                self.stop(unit)?;
                failpoint::hit(*point);
                return Ok(());
            }
            Step::Start {
                unit,
                before,
                after,
            } => {
                before.map(failpoint::hit);
                timed(machine, &step.to_string(), || self.services.start(unit))
                    .with_context(|| format!("post-start of {machine}: starting {unit}"))?;
                tracing::info!(%machine, %unit, "started");
                after.map(failpoint::hit);
                return Ok(());
            }
            Step::Import(dir) => {
                self.import(dir);
                return Ok(());
            }
            Step::File(file) => {
                let done =
                    timed(machine, file.name(), || self.work.file(*file)).with_context(what)?;
                // Starts true (ldconfig runs unless a links step says nothing changed).
                if matches!(file, FileStep::Links | FileStep::DevChar) {
                    self.library_links_changed = done.library_links_changed;
                }
                (file.key(), done.line)
            }
            Step::Ldconfig => {
                let changed = self.library_links_changed;
                let line = timed(machine, "ldconfig", || self.work.ldconfig(changed))
                    .with_context(what)?;
                ("ldconfig", line)
            }
            Step::Release { unit, point, key } => {
                let line = timed(machine, &step.to_string(), || {
                    self.work.release(unit, *point)
                })
                .with_context(what)?;
                (*key, line)
            }
        };
        let (key, line) = line;
        tracing::info!(%machine, step = %key, us = micros(started.elapsed()), "{line}");
        Ok(())
    }

    fn stop(&mut self, unit: &UnitName) -> Result<()> {
        let machine = self.machine;
        let running = self.services.is_active(unit).unwrap_or_else(|e| {
            // Unknown: count it as running, so a failure tries to put it back rather than
            // leave a node down that was serving.
            tracing::warn!(%machine, %unit, "could not tell whether it runs: {e:#}");
            true
        });
        timed(machine, &format!("stop {unit}"), || {
            self.services.stop(unit)
        })
        .with_context(|| format!("post-start of {machine}: stopping {unit}"))?;
        tracing::info!(%machine, %unit, "stopped");
        if running {
            self.was_running.push(unit.clone());
        }
        Ok(())
    }

    /// Image imports never fail the start: a problem there is logged and kubelet starts anyway.
    fn import(&self, dir: &MachinePath) {
        let machine = self.machine;
        match timed(machine, "import", || self.work.import()) {
            Ok((0, 0)) => {}
            Ok((ok, 0)) => tracing::info!(%machine, "imported {ok} staged image(s)"),
            Ok((ok, bad)) => tracing::error!(
                %machine,
                "imported {ok} staged image(s); {bad} failed and were moved to {dir}/{FAILED_DIR}"
            ),
            Err(e) => tracing::error!(%machine, "staged images in {dir} were not imported: {e:#}"),
        }
    }
}

/// Best-effort starts after a failure of the services in `units`, which ran before post-start
/// stopped them; each result is logged, none changes the outcome. With none (a gated boot, or
/// an operator had stopped them), say why nothing is started.
fn start_again(machine: &str, plan: &Plan, services: &dyn Services, units: &[&UnitName]) {
    if units.is_empty() {
        let names: Vec<String> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Start { unit, .. } => Some(unit.to_string()),
                _ => None,
            })
            .collect();
        tracing::warn!(
            %machine,
            "post-start failed: neither {} was running before it, so neither is started \
             again: on a gated boot the unit gate holds them until a post-start succeeds, and \
             the failed start is retried from a fresh, gated boot by systemd's \
             Restart=on-failure",
            names.join(" nor ")
        );
    }
    for unit in units {
        match services.start(unit) {
            Ok(()) => {
                tracing::warn!(%machine, %unit, "started again after the failure (it was running before post-start)")
            }
            Err(e) => {
                tracing::error!(%machine, %unit, "could not start again after the failure: {e:#}")
            }
        }
    }
}

/// Shortest time left in the import budget worth starting another import with.
const MIN_IMPORT_TIME: Duration = Duration::from_secs(1);
/// Most tarball names one "left for the next start" line spells out.
const MAX_NAMES_LOGGED: usize = 50;
/// Longest file name the kernel takes (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// Import the staged `*.tar` files with `ctr images import`, each as a transient unit in the
/// machine, within the per-start bounds: at most `importMaxImages` imports and
/// `importBudgetSeconds` in all, each import's deadline the smaller of `importTimeoutSeconds` and
/// what is left of the budget. What is not reached stays in place for the next start and is
/// reported in one line (how many, which, why). A tarball that fails (or times out on its own
/// deadline) is moved to `failed/` beside it and reported with the command's output; it is never
/// deleted and never fails the start, so one bad image cannot crash-loop a node. An import cut
/// short by the budget is left in place instead: the tarball is not known to be bad.
///
/// Imported tarballs stay where they are and are imported again at every start (so the images
/// survive a containerd store that was wiped). The queue is least recently imported first: after
/// an import the tarball's mtime is set to now, so when there are more tarballs than one start
/// takes, successive starts work through all of them instead of importing the same first ones
/// every time, and a tarball staged since the last start waits at most a few starts.
/// Returns (imported, set aside).
pub fn import_images(
    machine: &str,
    root: &MachineRoot,
    mc: &MachineConfig,
    services: &dyn Services,
) -> Result<(usize, usize)> {
    let Some(dir) = root.open_dir(&mc.staged_images_dir)? else {
        tracing::debug!(%machine, dir = %mc.staged_images_dir, "no staged images directory");
        return Ok((0, 0));
    };
    let queue = staged_queue(machine, &dir)?;
    let mut imports = Imports {
        machine,
        mc,
        services,
        dir: &dir,
        budget_end: Instant::now() + mc.import_budget,
        imported: 0,
        failed: 0,
        tried: 0,
        left: Vec::new(),
        why_left: String::new(),
    };
    for name in queue {
        imports.take(name)?;
    }
    imports.report_left();
    Ok((imports.imported, imports.failed))
}

/// The staged `*.tar` regular files of `dir`, least recently imported (oldest mtime) first.
fn staged_queue(machine: &str, dir: &MachineDir) -> Result<Vec<String>> {
    let mut queue = Vec::new();
    for (name, _) in dir.entries()? {
        let name = match name.into_string() {
            Ok(n) => n,
            Err(raw) => {
                if raw.as_encoded_bytes().ends_with(b".tar") {
                    tracing::warn!(
                        %machine,
                        dir = %dir.path(),
                        image = %raw.to_string_lossy().escape_debug(),
                        "staged image name is not UTF-8; skipped"
                    );
                }
                continue;
            }
        };
        if !name.ends_with(".tar") || name.starts_with('.') {
            continue;
        }
        // Only regular files: a FIFO would hang ctr, a symlink could name anything. Checked
        // again on the descriptor ctr reads (below); this only sorts and skips early.
        match dir.stat(&name)? {
            Some(st) if FileKind::from_stat(&st) == FileKind::File => {
                queue.push(((st.st_mtime, st.st_mtime_nsec), name));
            }
            _ => tracing::warn!(
                %machine,
                image = %shown(&dir.child(&name)),
                "not a regular file; skipped"
            ),
        }
    }
    queue.sort();
    Ok(queue.into_iter().map(|(_, name)| name).collect())
}

/// One start's imports, within its bounds (see [`import_images`]).
struct Imports<'a> {
    machine: &'a str,
    mc: &'a MachineConfig,
    services: &'a dyn Services,
    dir: &'a MachineDir,
    budget_end: Instant,
    imported: usize,
    failed: usize,
    tried: usize,
    /// Tarballs left for the next start, and why.
    left: Vec<String>,
    why_left: String,
}

impl Imports<'_> {
    /// Import `name`, or leave it for the next start when a bound is reached.
    fn take(&mut self, name: String) -> Result<()> {
        if !self.left.is_empty() {
            self.left.push(name);
            return Ok(());
        }
        let remaining = self.budget_end.saturating_duration_since(Instant::now());
        if self.tried >= self.mc.import_max_images {
            self.why_left = format!(
                "importMaxImages = {} imports per start",
                self.mc.import_max_images
            );
            self.left.push(name);
            return Ok(());
        }
        if remaining < MIN_IMPORT_TIME {
            self.why_left = format!(
                "the import budget (importBudgetSeconds = {}) is spent",
                self.mc.import_budget.as_secs()
            );
            self.left.push(name);
            return Ok(());
        }
        self.import(name, self.mc.import_timeout.min(remaining))
    }

    /// Run `ctr images import` on `name` within `timeout` and act on its outcome.
    fn import(&mut self, name: String, timeout: Duration) -> Result<()> {
        let (machine, mc) = (self.machine, self.mc);
        let path = self.dir.child(&name);
        // The check and the use are one file: ctr reads the descriptor opened here (a regular
        // file, never a symlink, FIFO or device; see MachineDir::open_regular) as its stdin,
        // not a path it would resolve again. No name reaches its command line either, so a
        // name with a leading `-`, a newline or any other byte is only ever a directory entry.
        // Worst case left to the machine: it rewrites the file's bytes while ctr reads them, so
        // ctr (which runs in the machine, as a transient unit of the machine's systemd) imports
        // or rejects what the machine wrote; it cannot make the helper read or write anything
        // outside the machine. The only write below is a rename between two directory fds
        // inside the machine, which never follows a symlink.
        let Some((file, _)) = self.dir.open_regular(&name)? else {
            tracing::warn!(%machine, image = %shown(&path), "no longer a regular file; skipped");
            return Ok(());
        };
        self.tried += 1;
        let argv = [
            mc.ctr_path.as_str(),
            "-n",
            mc.ctr_namespace.as_str(),
            "images",
            "import",
            "-",
        ];
        let run = self.services.run(
            "nspawn-lifecycle-import",
            &argv,
            Some(file.as_fd()),
            timeout,
        );
        failpoint::hit(Point::MidImageImport);
        // Cut short: not the start's first import (which had the whole budget, or its own
        // full deadline) and given less than its own deadline because the budget ran low.
        let cut_short = self.tried > 1
            && timeout < mc.import_timeout
            && match &run {
                Ok(o) => o.result == "timeout",
                Err(_) => Instant::now() >= self.budget_end,
            };
        let outcome = run.and_then(|o| o.check(&format!("importing {}", shown(&path))).map(|()| o));
        match outcome {
            Ok(o) => {
                self.imported += 1;
                // Least recently imported first next time (see import_images).
                let now = nix::sys::time::TimeSpec::UTIME_NOW;
                let omit = nix::sys::time::TimeSpec::UTIME_OMIT;
                if let Err(e) = nix::sys::stat::futimens(&file, &omit, &now) {
                    tracing::debug!(%machine, image = %shown(&path), "setting its mtime: {e}");
                }
                tracing::info!(%machine, image = %shown(&path), "imported in {:.1}s", o.elapsed.as_secs_f64());
            }
            Err(e) if cut_short => {
                tracing::warn!(%machine, image = %shown(&path), "import stopped at the end of the import budget: {e:#}");
                self.why_left = format!(
                    "the import budget (importBudgetSeconds = {}) ran out during an import",
                    mc.import_budget.as_secs()
                );
                self.left.push(name);
            }
            Err(e) => self.set_aside(&name, &e)?,
        }
        Ok(())
    }

    /// Move a tarball whose import failed to `failed/`, under a name not taken there yet.
    fn set_aside(&mut self, name: &str, e: &anyhow::Error) -> Result<()> {
        self.failed += 1;
        let failed_dir = self.dir.create_subdir(FAILED_DIR, 0o755)?;
        let mut to = aside_name(name, 0);
        let mut n = 1;
        while failed_dir.kind(&to)?.is_some() {
            to = aside_name(name, n);
            n += 1;
        }
        self.dir.move_noreplace(name, &failed_dir, &to)?;
        failed_dir.sync()?;
        self.dir.sync()?;
        tracing::error!(
            machine = %self.machine,
            image = %shown(&self.dir.child(name)),
            moved_to = %shown(&failed_dir.child(&to)),
            "image import failed; tarball set aside: {e:#}"
        );
        Ok(())
    }

    /// One line for what is left for the next start: how many, which, why.
    fn report_left(&self) {
        if self.left.is_empty() {
            return;
        }
        let mut names: Vec<String> = self
            .left
            .iter()
            .take(MAX_NAMES_LOGGED)
            .map(|n| shown(n))
            .collect();
        if self.left.len() > MAX_NAMES_LOGGED {
            names.push(format!("… and {} more", self.left.len() - MAX_NAMES_LOGGED));
        }
        tracing::warn!(
            machine = %self.machine,
            "left {} staged image(s) in {} for the next start ({}): {}",
            self.left.len(),
            self.dir.path(),
            self.why_left,
            names.join(", ")
        );
    }
}

/// A name or path for a log line: control characters (a newline would forge a journal line),
/// quotes and backslashes escaped.
fn shown(s: &str) -> String {
    s.escape_debug().to_string()
}

/// The name a failed tarball gets in `failed/`: its own, then `<name>.<n>`; shortened (at a
/// character boundary) where the suffix would pass `NAME_MAX`.
fn aside_name(name: &str, n: usize) -> String {
    let suffix = if n == 0 {
        String::new()
    } else {
        format!(".{n}")
    };
    let mut keep = name.len().min(NAME_MAX - suffix.len());
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{suffix}", &name[..keep])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::fs::host::HostRoot;
    use crate::systemd::ExitStatus;
    use std::cell::RefCell;

    /// Records every call; fails the calls named in `fail`. Models what the tests rely on of
    /// the machine's systemd: which units run, and the unit gate (src/apply/gate.rs): while the boot
    /// is gated and the marker does not exist, a start of containerd or kubelet is skipped the
    /// way systemd skips a unit with an unmet `ConditionPathExists=`, so the start job ends
    /// "done", the unit stays inactive, and [`MachineServices::start`] reports it. Each unit has
    /// its own marker: containerd's exists once the gate file step ran, kubelet's once its own
    /// gate step ran.
    struct Fake {
        log: RefCell<Vec<String>>,
        fail: Vec<String>,
        running: RefCell<Vec<String>>,
        gated: bool,
        /// The units whose gate marker exists.
        released: RefCell<Vec<String>>,
        /// What each `run` is given as its deadline, and the identity of its stdin.
        runs: RefCell<Vec<Run>>,
        /// How long each `run` takes.
        run_takes: Duration,
        /// File steps report no library link changed (default: changed).
        links_unchanged: bool,
        /// What each `ldconfig` step was told about the links.
        ldconfig_told: RefCell<Vec<bool>>,
    }

    /// One `run`: its deadline and its stdin's `(st_dev, st_ino)`.
    type Run = (Duration, Option<(u64, u64)>);

    impl Default for Fake {
        /// A machine that is up: both services run, the gate was released at its boot.
        fn default() -> Fake {
            Fake {
                log: RefCell::default(),
                fail: Vec::new(),
                running: RefCell::new(vec!["kubelet.service".into(), "containerd.service".into()]),
                gated: false,
                released: RefCell::new(vec!["kubelet.service".into(), "containerd.service".into()]),
                runs: RefCell::default(),
                run_takes: Duration::ZERO,
                links_unchanged: false,
                ldconfig_told: RefCell::default(),
            }
        }
    }

    impl Fake {
        fn failing(calls: &[&str]) -> Fake {
            Fake {
                fail: calls.iter().map(|s| s.to_string()).collect(),
                ..Fake::default()
            }
        }
        /// A GPU machine's boot: the gate kept both services from starting.
        fn gated_boot() -> Fake {
            Fake {
                running: RefCell::default(),
                gated: true,
                released: RefCell::default(),
                ..Fake::default()
            }
        }
        /// A boot pre-start released containerd for: the boot started it, kubelet is gated.
        fn containerd_released_boot() -> Fake {
            Fake {
                running: RefCell::new(vec!["containerd.service".into()]),
                gated: true,
                released: RefCell::new(vec!["containerd.service".into()]),
                ..Fake::default()
            }
        }
        fn record(&self, call: String) -> Result<()> {
            self.log.borrow_mut().push(call.clone());
            if self.fail.contains(&call) {
                anyhow::bail!("{call} failed (test)");
            }
            Ok(())
        }
        fn log(&self) -> Vec<String> {
            self.log.borrow().clone()
        }
        fn running(&self) -> Vec<String> {
            self.running.borrow().clone()
        }
    }

    impl Services for Fake {
        fn stop(&self, unit: &str) -> Result<()> {
            self.record(format!("stop {unit}"))?;
            self.running.borrow_mut().retain(|u| u != unit);
            Ok(())
        }
        fn start(&self, unit: &str) -> Result<()> {
            self.record(format!("start {unit}"))?;
            if self.gated && !self.released.borrow().iter().any(|u| u == unit) {
                anyhow::bail!(
                    "{unit} is inactive (dead) after its start job finished; an unmet \
                     Condition…= skips a unit that way (test: gated, no marker)"
                );
            }
            let mut running = self.running.borrow_mut();
            if !running.iter().any(|u| u == unit) {
                running.push(unit.to_owned());
            }
            Ok(())
        }
        fn is_active(&self, unit: &str) -> Result<bool> {
            Ok(self.running.borrow().iter().any(|u| u == unit))
        }
        fn run(
            &self,
            prefix: &str,
            argv: &[&str],
            stdin: Option<BorrowedFd<'_>>,
            timeout: Duration,
        ) -> Result<TransientOutcome> {
            // What ctr would read: the stdin file's identity and its first bytes.
            let (id, head) = match stdin {
                Some(fd) => {
                    let st = nix::sys::stat::fstat(fd).unwrap();
                    let mut buf = [0u8; 64];
                    let n = nix::sys::uio::pread(fd, &mut buf, 0).unwrap();
                    (
                        Some((st.st_dev, st.st_ino)),
                        String::from_utf8_lossy(&buf[..n]).into_owned(),
                    )
                }
                None => (None, String::new()),
            };
            let call = format!("run {} <{head}", argv.join(" "));
            self.log.borrow_mut().push(call.clone());
            self.runs.borrow_mut().push((timeout, id));
            let takes = self.run_takes.min(timeout);
            std::thread::sleep(takes);
            let timed_out = takes < self.run_takes;
            let bad = timed_out || self.fail.iter().any(|f| call.contains(f.as_str()));
            Ok(TransientOutcome {
                unit: format!("{prefix}-1.service"),
                exit_status: if timed_out {
                    ExitStatus::Killed {
                        signal: 15,
                        core_dumped: false,
                    }
                } else {
                    ExitStatus::Exited(if bad { 1 } else { 0 })
                },
                result: if timed_out {
                    "timeout"
                } else if bad {
                    "exit-code"
                } else {
                    "success"
                }
                .into(),
                output: if bad {
                    "ctr: unexpected EOF".into()
                } else {
                    String::new()
                },
                output_dropped: 0,
                elapsed: takes,
            })
        }
    }

    fn cfg() -> MachineConfig {
        let dir = tempfile::tempdir().unwrap();
        Config::default()
            .machine(&HostRoot::new(dir.path()), &"kube1".parse().unwrap())
            .unwrap()
    }

    /// The machine side of a run, recorded in the fake's log: file steps as `file <name>`,
    /// `ldconfig` as `file ldconfig`, containerd's gate as `file unit gate`, kubelet's as
    /// `file kubelet's unit gate` (which also create the markers the fake's starts look for),
    /// the imports as `import`.
    struct FakeWork<'a> {
        fake: &'a Fake,
        fail: Option<FileStep>,
        import_fails: bool,
    }

    impl Work for FakeWork<'_> {
        fn file(&self, step: FileStep) -> Result<FileDone> {
            self.fake
                .log
                .borrow_mut()
                .push(format!("file {}", step.name()));
            if Some(step) == self.fail {
                anyhow::bail!("planted failure");
            }
            Ok(FileDone {
                line: String::new(),
                library_links_changed: !self.fake.links_unchanged,
            })
        }
        fn ldconfig(&self, links_changed: bool) -> Result<String> {
            self.fake.ldconfig_told.borrow_mut().push(links_changed);
            self.fake.log.borrow_mut().push("file ldconfig".into());
            Ok(String::new())
        }
        fn release(&self, unit: &UnitName, _: Point) -> Result<String> {
            let name = if unit.as_str() == "kubelet.service" {
                "file kubelet's unit gate"
            } else {
                "file unit gate"
            };
            self.fake.log.borrow_mut().push(name.into());
            self.fake.released.borrow_mut().push(unit.to_string());
            Ok(String::new())
        }
        fn import(&self) -> Result<(usize, usize)> {
            self.fake.log.borrow_mut().push("import".into());
            if self.import_fails {
                anyhow::bail!("staged images dir is a FIFO");
            }
            Ok((1, 0))
        }
    }

    fn sequence(fake: &Fake, fail: Option<FileStep>) -> (Result<()>, Vec<String>) {
        let m = "kube1";
        let work = FakeWork {
            fake,
            fail,
            import_fails: false,
        };
        let r = execute(&plan(&cfg(), Target::Machine, Order::Gated), m, &work, fake);
        (r, fake.log())
    }

    /// Host mode is the same plan with the host's file steps: no driver root to check
    /// (the host's is `/`), `/dev/char` links only; every other step is the machine's.
    #[test]
    fn the_host_plan_differs_only_in_its_file_steps() {
        let (machine, host) = (
            plan(&cfg(), Target::Machine, Order::Gated),
            plan(&cfg(), Target::Host, Order::Gated),
        );
        assert_eq!(
            host.to_string(),
            "stop kubelet.service → stop containerd.service → /dev/char links → ldconfig → CDI \
             spec → release containerd.service → start containerd.service → import staged images \
             from /var/lib/nspawn-lifecycle/images → release kubelet.service → start \
             kubelet.service"
        );
        let others = |p: &Plan| -> Vec<Step> {
            p.steps
                .iter()
                .filter(|s| !matches!(s, Step::File(f) if *f != FileStep::Cdi))
                .cloned()
                .collect()
        };
        assert_eq!(others(&machine), others(&host));
    }

    /// The one executor runs the host plan with the same rules: on a gated boot each
    /// service starts once after its own gate; a failed `/dev/char` step on a running host puts
    /// both services back and names the step.
    /// ldconfig hears from the links step of either target whether a library link changed
    /// (the host's is its `/dev/char` step): nothing changed, it may skip when the cache is
    /// current; no links step ran, it must assume a change.
    #[test]
    fn ldconfig_hears_from_each_targets_links_step() {
        for target in [Target::Machine, Target::Host] {
            let fake = Fake {
                links_unchanged: true,
                ..Fake::default()
            };
            let work = FakeWork {
                fake: &fake,
                fail: None,
                import_fails: false,
            };
            execute(&plan(&cfg(), target, Order::Gated), "kube1", &work, &fake).unwrap();
            assert_eq!(*fake.ldconfig_told.borrow(), [false], "{target:?}");
        }
    }

    #[test]
    fn the_host_plan_runs_through_the_same_executor() {
        let fake = Fake::gated_boot();
        let work = FakeWork {
            fake: &fake,
            fail: None,
            import_fails: false,
        };
        execute(
            &plan(&cfg(), Target::Host, Order::Gated),
            HOST_LABEL,
            &work,
            &fake,
        )
        .unwrap();
        assert_eq!(
            fake.log(),
            [
                "stop kubelet.service",
                "stop containerd.service",
                "file /dev/char links",
                "file ldconfig",
                "file CDI spec",
                "file unit gate",
                "start containerd.service",
                "import",
                "file kubelet's unit gate",
                "start kubelet.service",
            ]
        );
        let fake = Fake::default();
        let work = FakeWork {
            fake: &fake,
            fail: Some(FileStep::DevChar),
            import_fails: false,
        };
        let err = execute(
            &plan(&cfg(), Target::Host, Order::Gated),
            HOST_LABEL,
            &work,
            &fake,
        )
        .unwrap_err();
        assert_eq!(
            format!("{err}"),
            "post-start of the host: step '/dev/char links'"
        );
        assert_eq!(fake.running(), ["containerd.service", "kubelet.service"]);
    }

    /// The plan is a plain value, in the order of DESIGN §5.
    #[test]
    fn the_plan_is_a_value_in_the_order_of_the_design() {
        assert_eq!(
            plan(&cfg(), Target::Machine, Order::Gated).to_string(),
            "stop kubelet.service → stop containerd.service → driver root → library and /dev/char \
             links → ldconfig → CDI spec → release containerd.service → start containerd.service \
             → import staged images from /var/lib/nspawn-lifecycle/images → release \
             kubelet.service → start kubelet.service"
        );
    }

    /// Containerd released by pre-start for this boot is neither stopped nor released
    /// again; kubelet still waits for every step.
    #[test]
    fn with_containerd_released_before_post_start_only_kubelet_waits() {
        assert_eq!(
            plan(&cfg(), Target::Machine, Order::ContainerdReleased).to_string(),
            "stop kubelet.service → driver root → library and /dev/char links → ldconfig → CDI \
             spec → start containerd.service → import staged images from \
             /var/lib/nspawn-lifecycle/images → release kubelet.service → start kubelet.service"
        );
        // A boot where the gate let containerd through (its marker came from pre-start) and
        // kept kubelet: containerd is started by the boot and never stopped, kubelet starts once
        // after its own marker.
        let fake = Fake::containerd_released_boot();
        let work = FakeWork {
            fake: &fake,
            fail: None,
            import_fails: false,
        };
        let p = plan(&cfg(), Target::Machine, Order::ContainerdReleased);
        execute(&p, "kube1", &work, &fake).unwrap();
        let log = fake.log();
        assert!(
            !log.iter().any(|l| l == "stop containerd.service"),
            "{log:?}"
        );
        assert!(!log.iter().any(|l| l == "file unit gate"), "{log:?}");
        let at = |l: &str| log.iter().position(|x| x == l).unwrap();
        assert!(
            at("file CDI spec") < at("start containerd.service"),
            "{log:?}"
        );
        assert!(at("start containerd.service") < at("import"), "{log:?}");
        assert!(
            at("file kubelet's unit gate") < at("start kubelet.service"),
            "{log:?}"
        );
        assert_eq!(fake.running(), ["containerd.service", "kubelet.service"]);
        // A failed step leaves containerd running (it was never stopped) and starts nothing.
        let fake = Fake::containerd_released_boot();
        let work = FakeWork {
            fake: &fake,
            fail: Some(FileStep::DriverRoot),
            import_fails: false,
        };
        assert!(execute(&p, "kube1", &work, &fake).is_err());
        assert_eq!(fake.running(), ["containerd.service"]);
        assert!(
            !fake.log().iter().any(|l| l.starts_with("start ")),
            "{:?}",
            fake.log()
        );
    }

    /// Which order post-start takes comes from the machine's markers, in its unit's start only;
    /// host mode (no pre-start) always takes the gated one.
    #[test]
    fn the_order_is_read_from_containerds_marker() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let mc = cfg();
        let markers = Target::Machine.markers(&host, "kube1");
        let of = |t, m, start| Order::of(t, m, &mc, start).unwrap();
        assert_eq!(of(Target::Machine, &markers, true), Order::Gated);
        gate::prepare_boot(&host, "kube1", Some(&mc.containerd_unit)).unwrap();
        assert_eq!(
            of(Target::Machine, &markers, true),
            Order::ContainerdReleased
        );
        // By hand on a running machine: both services stopped and started, as always.
        assert_eq!(of(Target::Machine, &markers, false), Order::Gated);
        let on_host = Target::Host.markers(&host, HOST_LABEL);
        on_host
            .release(&mc.containerd_unit, Point::PostStartMidGateRelease)
            .unwrap();
        assert_eq!(of(Target::Host, &on_host, true), Order::Gated);
        gate::prepare_boot(&host, "kube1", None).unwrap();
        assert_eq!(of(Target::Machine, &markers, true), Order::Gated);
    }

    #[test]
    fn services_stop_and_start_in_dependency_order() {
        let fake = Fake::default();
        let (r, log) = sequence(&fake, None);
        r.unwrap();
        assert_eq!(
            log,
            [
                "stop kubelet.service",
                "stop containerd.service",
                "file driver root",
                "file library and /dev/char links",
                "file ldconfig",
                "file CDI spec",
                "file unit gate",
                "start containerd.service",
                "import",
                "file kubelet's unit gate",
                "start kubelet.service",
            ]
        );
    }

    #[test]
    fn a_failed_step_starts_both_services_again_and_names_the_step() {
        let fake = Fake::default();
        let (r, log) = sequence(&fake, Some(FileStep::Links));
        let msg = format!("{:#}", r.unwrap_err());
        assert!(msg.contains("step 'library and /dev/char links'"), "{msg}");
        assert!(msg.contains("planted failure"), "{msg}");
        assert_eq!(
            log[3..],
            [
                "file library and /dev/char links",
                "start containerd.service",
                "start kubelet.service"
            ]
        );
    }

    #[test]
    fn a_failed_containerd_start_still_tries_both_again() {
        let fake = Fake::failing(&["start containerd.service"]);
        let (r, log) = sequence(&fake, None);
        assert!(format!("{:#}", r.unwrap_err()).contains("starting containerd.service"));
        assert_eq!(
            log[7..],
            [
                "start containerd.service",
                "start containerd.service",
                "start kubelet.service"
            ]
        );
    }

    #[test]
    fn a_failed_stop_restarts_what_was_stopped_and_touches_no_file() {
        let fake = Fake::failing(&["stop containerd.service"]);
        let (r, log) = sequence(&fake, None);
        assert!(format!("{:#}", r.unwrap_err()).contains("stopping containerd.service"));
        assert_eq!(
            log,
            [
                "stop kubelet.service",
                "stop containerd.service",
                "start kubelet.service"
            ]
        );
    }

    #[test]
    fn import_problems_never_keep_kubelet_down() {
        let fake = Fake::default();
        let m = "kube1";
        let work = FakeWork {
            fake: &fake,
            fail: None,
            import_fails: true,
        };
        execute(
            &plan(&cfg(), Target::Machine, Order::Gated),
            m,
            &work,
            &fake,
        )
        .unwrap();
        assert_eq!(fake.log().last().unwrap(), "start kubelet.service");
    }

    const CTR: &str = "run /usr/bin/ctr -n k8s.io images import -";
    const STAGED: &str = "var/lib/nspawn-lifecycle/images";

    /// Write a staged tarball whose mtime is `age` seconds in the past.
    fn stage(dir: &std::path::Path, name: &str, bytes: &[u8], age: u64) {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        let t = std::time::SystemTime::now() - Duration::from_secs(age);
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    /// Run `f` with this thread's log lines captured; returns its result and the lines.
    fn logged<R>(f: impl FnOnce() -> R) -> (R, String) {
        use std::sync::{Arc, Mutex};
        let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
        let w = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(move || Writer(w.clone()))
            .finish();
        struct Writer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Writer {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let r = tracing::subscriber::with_default(sub, f);
        let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        (r, text)
    }

    #[test]
    fn bad_tarballs_are_set_aside_never_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join(STAGED);
        std::fs::create_dir_all(images.join("failed")).unwrap();
        stage(&images, "good.tar", b"good", 10);
        stage(&images, "bad.tar", b"bad", 20);
        std::fs::write(images.join("failed/bad.tar"), b"older bad").unwrap();
        std::fs::write(images.join("notes.txt"), b"x").unwrap();
        nix::unistd::mkfifo(&images.join("fifo.tar"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", images.join("link.tar")).unwrap();
        let root = MachineRoot::open(dir.path()).unwrap();
        let fake = Fake::failing(&["<bad"]);
        let m = "kube1";
        let (ok, bad) = import_images(m, &root, &cfg(), &fake).unwrap();
        assert_eq!((ok, bad), (1, 1));
        assert_eq!(fake.log(), [format!("{CTR} <bad"), format!("{CTR} <good")]);
        assert_eq!(std::fs::read(images.join("good.tar")).unwrap(), b"good");
        assert_eq!(
            std::fs::read(images.join("failed/bad.tar")).unwrap(),
            b"older bad"
        );
        assert_eq!(
            std::fs::read(images.join("failed/bad.tar.1")).unwrap(),
            b"bad"
        );
        assert!(!images.join("bad.tar").exists());
        assert!(images.join("fifo.tar").exists());
        assert!(images.join("link.tar").is_symlink());
        // Nothing left to import: a second run only retries nothing that failed.
        let fake = Fake::default();
        assert_eq!(import_images(m, &root, &cfg(), &fake).unwrap(), (1, 0));
    }

    /// At most `importMaxImages` imports per start; the rest stay in place and
    /// one line says how many, which and why.
    #[test]
    fn imports_stop_at_the_count_limit_and_report_what_was_left() {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join(STAGED);
        std::fs::create_dir_all(&images).unwrap();
        for (i, n) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            stage(&images, &format!("{n}.tar"), n.as_bytes(), 100 - i as u64);
        }
        let root = MachineRoot::open(dir.path()).unwrap();
        let mut mc = cfg();
        mc.import_max_images = 2;
        let fake = Fake::default();
        let m = "kube1";
        let (r, logs) = logged(|| import_images(m, &root, &mc, &fake));
        assert_eq!(r.unwrap(), (2, 0));
        assert_eq!(fake.log(), [format!("{CTR} <a"), format!("{CTR} <b")]);
        for n in ["a", "b", "c", "d", "e"] {
            assert!(images.join(format!("{n}.tar")).is_file(), "{n}.tar moved");
        }
        let left: Vec<&str> = logs.lines().filter(|l| l.contains("left ")).collect();
        assert_eq!(left.len(), 1, "{logs}");
        assert!(
            left[0].contains(
                "left 3 staged image(s) in /var/lib/nspawn-lifecycle/images for the next start \
                 (importMaxImages = 2 imports per start): c.tar, d.tar, e.tar"
            ),
            "{logs}"
        );
        // The next start takes the least recently imported first: the three left behind.
        let fake = Fake::default();
        mc.import_max_images = 3;
        assert_eq!(import_images(m, &root, &mc, &fake).unwrap(), (3, 0));
        assert_eq!(
            fake.log(),
            [
                format!("{CTR} <c"),
                format!("{CTR} <d"),
                format!("{CTR} <e")
            ]
        );
        // 0 imports nothing and says so.
        mc.import_max_images = 0;
        let fake = Fake::default();
        let (r, logs) = logged(|| import_images(m, &root, &mc, &fake));
        assert_eq!(r.unwrap(), (0, 0));
        assert!(fake.log().is_empty());
        assert!(logs.contains("left 5 staged image(s)"), "{logs}");
    }

    /// All imports of a start share `importBudgetSeconds`; each gets the
    /// smaller of `importTimeoutSeconds` and what is left; the rest wait for the next start.
    #[test]
    fn imports_share_one_time_budget() {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join(STAGED);
        std::fs::create_dir_all(&images).unwrap();
        for (i, n) in ["a", "b", "c", "d"].iter().enumerate() {
            stage(&images, &format!("{n}.tar"), n.as_bytes(), 100 - i as u64);
        }
        let root = MachineRoot::open(dir.path()).unwrap();
        let mut mc = cfg();
        mc.import_budget = Duration::from_secs(3);
        let fake = Fake {
            run_takes: Duration::from_millis(1200),
            ..Fake::default()
        };
        let m = "kube1";
        let started = Instant::now();
        let (r, logs) = logged(|| import_images(m, &root, &mc, &fake));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(r.unwrap(), (2, 0));
        let runs = fake.runs.borrow().clone();
        assert_eq!(runs.len(), 2, "{runs:?}");
        assert!(runs[0].0 <= Duration::from_secs(3) && runs[0].0 > Duration::from_millis(2900));
        assert!(runs[1].0 <= Duration::from_millis(1800), "{runs:?}");
        assert!(
            logs.contains("left 2 staged image(s)")
                && logs.contains(
                    "(the import budget (importBudgetSeconds = 3) is spent): c.tar, d.tar"
                ),
            "{logs}"
        );
        for n in ["a", "b", "c", "d"] {
            assert!(images.join(format!("{n}.tar")).is_file());
        }
    }

    /// An import the budget cuts short is not a bad tarball: it stays for the next start. One
    /// that times out on its own full deadline is set aside.
    #[test]
    fn an_import_cut_short_by_the_budget_stays_one_timing_out_on_its_own_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join(STAGED);
        std::fs::create_dir_all(&images).unwrap();
        stage(&images, "a.tar", b"a", 20);
        stage(&images, "b.tar", b"b", 10);
        let root = MachineRoot::open(dir.path()).unwrap();
        let m = "kube1";
        let mut mc = cfg();
        mc.import_budget = Duration::from_secs(3);
        let fake = Fake {
            run_takes: Duration::from_millis(1900),
            ..Fake::default()
        };
        let (r, logs) = logged(|| import_images(m, &root, &mc, &fake));
        assert_eq!(r.unwrap(), (1, 0));
        assert!(images.join("b.tar").is_file(), "{logs}");
        assert!(!images.join("failed").exists(), "{logs}");
        assert!(
            logs.contains("left 1 staged image(s)")
                && logs.contains("ran out during an import): b.tar"),
            "{logs}"
        );

        mc.import_timeout = Duration::from_secs(1);
        mc.import_budget = Duration::from_secs(600);
        let fake = Fake {
            run_takes: Duration::from_secs(2),
            ..Fake::default()
        };
        mc.import_max_images = 1;
        assert_eq!(import_images(m, &root, &mc, &fake).unwrap(), (0, 1));
        assert_eq!(std::fs::read(images.join("failed/b.tar")).unwrap(), b"b");
    }

    /// No tarball name reaches ctr's command line (a leading `-` would be an
    /// option), ctr reads the very file that was checked, and names with control characters
    /// or at NAME_MAX are imported, set aside and logged without harm.
    #[test]
    fn tarball_names_never_reach_the_command_line_and_ctr_reads_the_checked_file() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join(STAGED);
        std::fs::create_dir_all(images.join("failed")).unwrap();
        let long = format!("{}.tar", "x".repeat(NAME_MAX - 4));
        let names = [
            "--help.tar".to_owned(),
            "-n default.tar".to_owned(),
            "evil\n{\"level\":\"INFO\"} forged.tar".to_owned(),
            "esc\u{1b}[2J.tar".to_owned(),
            long.clone(),
        ];
        for (i, n) in names.iter().enumerate() {
            stage(&images, n, format!("bad{i}").as_bytes(), 100 - i as u64);
        }
        // An older failure of the long name already sits in failed/: the suffixed name must be
        // shortened to fit NAME_MAX.
        std::fs::write(images.join("failed").join(&long), b"older").unwrap();
        let ids: Vec<(u64, u64)> = names
            .iter()
            .map(|n| {
                let md = std::fs::metadata(images.join(n)).unwrap();
                (md.dev(), md.ino())
            })
            .collect();
        let root = MachineRoot::open(dir.path()).unwrap();
        let fake = Fake::failing(&["<bad"]);
        let m = "kube1";
        let (r, logs) = logged(|| import_images(m, &root, &cfg(), &fake));
        assert_eq!(r.unwrap(), (0, 5));
        for (i, call) in fake.log().iter().enumerate() {
            assert_eq!(call, &format!("{CTR} <bad{i}"));
        }
        let seen: Vec<Option<(u64, u64)>> = fake.runs.borrow().iter().map(|r| r.1).collect();
        assert_eq!(seen, ids.iter().copied().map(Some).collect::<Vec<_>>());
        for n in &names[..4] {
            assert!(images.join("failed").join(n).is_file(), "{n:?}");
        }
        let shortened = format!("{}.1", &long[..NAME_MAX - 2]);
        assert_eq!(
            std::fs::read(images.join("failed").join(&shortened)).unwrap(),
            b"bad4"
        );
        // Every line of the log is one event: the newline in a name did not forge one.
        assert!(!logs.lines().any(|l| l.starts_with('{')), "{logs}");
        assert!(logs.contains("evil\\n{\\\"level"), "{logs}");
        assert!(!logs.contains('\u{1b}'), "{logs}");
    }

    /// A `.tar` name that is not UTF-8 is skipped with a warning (escaped), not imported blind.
    #[test]
    fn non_utf8_tarball_names_are_skipped_and_reported() {
        use std::os::unix::ffi::OsStrExt as _;
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join(STAGED);
        std::fs::create_dir_all(&images).unwrap();
        let raw = std::ffi::OsStr::from_bytes(b"bad\xff\n.tar");
        std::fs::write(images.join(raw), b"x").unwrap();
        let root = MachineRoot::open(dir.path()).unwrap();
        let fake = Fake::default();
        let m = "kube1";
        let (r, logs) = logged(|| import_images(m, &root, &cfg(), &fake));
        assert_eq!(r.unwrap(), (0, 0));
        assert!(fake.log().is_empty());
        assert!(
            logs.contains("not UTF-8; skipped") && logs.contains("bad\u{fffd}\\n.tar"),
            "{logs}"
        );
        assert!(images.join(raw).is_file());
    }

    /// On a gated boot nothing ran before post-start, so a failed step starts
    /// nothing (the start would be skipped by the gate anyway and the unit left inactive).
    #[test]
    fn on_a_gated_boot_a_failed_step_starts_nothing() {
        let fake = Fake::gated_boot();
        let (r, logs) = logged(|| sequence(&fake, Some(FileStep::Links)));
        let (r, log) = r;
        assert!(format!("{:#}", r.unwrap_err()).contains("planted failure"));
        assert_eq!(
            log,
            [
                "stop kubelet.service",
                "stop containerd.service",
                "file driver root",
                "file library and /dev/char links",
            ]
        );
        assert!(fake.running().is_empty());
        assert!(
            logs.contains("neither containerd.service nor kubelet.service was running before it")
                && logs.contains("the unit gate holds them until a post-start succeeds")
                && logs.contains("Restart=on-failure"),
            "{logs}"
        );
    }

    /// A failure on a running machine puts back what ran, and only that.
    #[test]
    fn a_failure_on_a_running_machine_restores_only_what_was_running() {
        let fake = Fake::default();
        fake.running
            .borrow_mut()
            .retain(|u| u == "containerd.service");
        let (r, log) = sequence(&fake, Some(FileStep::Cdi));
        assert!(r.is_err());
        assert_eq!(log.last().unwrap(), "start containerd.service");
        assert!(
            !log.contains(&"start kubelet.service".to_owned()),
            "{log:?}"
        );
        assert_eq!(fake.running(), ["containerd.service"]);
    }

    /// The gated boot that succeeds: each service starts once, after its own gate step, and
    /// runs; kubelet's marker appears only after the imports (post-start overlaps the
    /// boot, so a boot that reaches kubelet once containerd's marker exists must still skip it).
    #[test]
    fn on_a_gated_boot_each_service_starts_once_after_its_own_gate() {
        let fake = Fake::gated_boot();
        let (r, log) = sequence(&fake, None);
        r.unwrap();
        let at = |l: &str| log.iter().position(|x| x == l).unwrap();
        let starts: Vec<usize> = (0..log.len())
            .filter(|&i| log[i].starts_with("start "))
            .collect();
        assert_eq!(starts.len(), 2, "{log:?}");
        assert!(
            at("file unit gate") < at("start containerd.service"),
            "{log:?}"
        );
        assert!(at("import") < at("file kubelet's unit gate"), "{log:?}");
        assert!(
            at("file kubelet's unit gate") < at("start kubelet.service"),
            "{log:?}"
        );
        assert_eq!(fake.running(), ["containerd.service", "kubelet.service"]);
        // And the fake really models the gate: without the marker a start is refused.
        let gated = Fake::gated_boot();
        let err = gated.start("kubelet.service").unwrap_err();
        assert!(format!("{err:#}").contains("is inactive (dead)"));
        assert!(gated.running().is_empty());
    }
}
