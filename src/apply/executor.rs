//! The hooks' plans and their one executor. pre-start's plan ([`pre_start`]) makes what the
//! machine's next boot binds on the host (src/apply/boot.rs); post-start's ([`plan`]), in the
//! order of a start (docs/wiring.md), makes a target's files ([`Wiring`]: the wiring model's
//! changes made by src/apply/rewire.rs) and drives its services. [`execute`] runs either, step by step: one log
//! line and timing per step, the crash points on its steps, and the restore-on-failure rule.

use crate::apply::gate;
use crate::apply::images::{FAILED_DIR, import_images};
use crate::apply::rewire;
use crate::config::MachineConfig;
use crate::discovery;
use crate::failpoint::{self, Point};
use crate::fs::host::HostRoot;
use crate::fs::machine_root::MachineRoot;
use crate::model::{self, Desired, Target};
use crate::systemd::services::Services;
use crate::types::paths::{MachinePath, UnitName};
use anyhow::{Context as _, Result};
use std::time::{Duration, Instant};

/// Run `f` and log how long it took: one debug line per step (`step timing`, fields `step` and
/// `us`), which `tests/bench/e2e-bench.sh` reads to time the rewiring apart from the services.
pub(crate) fn timed<T>(machine: &str, step: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    tracing::debug!(%machine, step, us = micros(started.elapsed()), "step timing");
    out
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Which hook a plan is of: named in every error and log line of its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    PreStart,
    PostStart,
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Hook::PreStart => "pre-start",
            Hook::PostStart => "post-start",
        })
    }
}

/// The file steps: what a hook writes or checks. pre-start's are the host's, for the machine's
/// next boot; post-start's are in the target's rootfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileStep {
    /// pre-start: host nodes the `.nspawn` file binds that the kernel registered without a node
    /// (`rdma_cm`), and the empty NVIDIA node directories a machine with every GPU binds.
    HostNodes,
    /// pre-start: the unit's own GPUs in its runtime `DeviceAllow=` (which systemd keeps in a
    /// runtime drop-in), when the config's `gpus` is not `all`.
    DeviceCgroup,
    /// pre-start: the host's unit gate drop-in, which the `.nspawn` file binds.
    GateFile,
    /// pre-start: the machine's driver tree on the host (removed without a driver).
    DriverTree,
    /// pre-start: the gate markers for the boot ahead.
    BootGate,
    /// pre-start: the `.nspawn` file itself, last: it binds what the steps before made.
    NspawnFile,
    DriverRoot,
    Links,
    /// Host mode's links ([`Target::Host`]): `/dev/char` only.
    DevChar,
    Cdi,
}

impl FileStep {
    pub(crate) fn name(self) -> &'static str {
        match self {
            FileStep::HostNodes => "host device nodes",
            FileStep::DeviceCgroup => "device cgroup",
            FileStep::GateFile => "unit gate file",
            FileStep::DriverTree => "driver tree",
            FileStep::BootGate => "unit gate for the boot",
            FileStep::NspawnFile => ".nspawn file",
            FileStep::DriverRoot => "driver root",
            FileStep::Links => "library and /dev/char links",
            FileStep::DevChar => "/dev/char links",
            FileStep::Cdi => "CDI spec",
        }
    }

    /// The `step` field of the step's log line (`journalctl STEP=cdi`).
    fn key(self) -> &'static str {
        match self {
            FileStep::HostNodes => "host-nodes",
            FileStep::DeviceCgroup => "device-cgroup",
            FileStep::GateFile => "gate-file",
            FileStep::DriverTree => "driver-tree",
            FileStep::BootGate => "gate",
            FileStep::NspawnFile => "nspawn",
            FileStep::DriverRoot => "driver-root",
            FileStep::Links => "links",
            FileStep::DevChar => "dev-char",
            FileStep::Cdi => "cdi",
        }
    }
}

/// One step of a hook's plan.
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

/// A hook's plan: a plain value, computed before anything is touched, run by [`execute`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub hook: Hook,
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
    /// Both services wait for post-start: the order of a start (docs/wiring.md).
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

/// The file steps between the stops and `ldconfig`.
fn file_steps(target: Target) -> &'static [FileStep] {
    match target {
        Target::Machine => &[FileStep::DriverRoot, FileStep::Links],
        Target::Host => &[FileStep::DevChar],
    }
}

/// The order of a start (docs/wiring.md): kubelet stopped, containerd too unless it was released
/// before post-start began ([`Order`]; a stop also cancels a start job the boot still has
/// queued), the driver wired, containerd released and started (or, already released, waited
/// for: the boot's own start job), the staged images imported, kubelet released and started.
/// The target ([`Target`]) changes only the file steps before `ldconfig`.
pub fn plan(mc: &MachineConfig, target: Target, order: Order) -> Plan {
    let (containerd, kubelet) = (&mc.containerd_unit, &mc.kubelet_unit);
    let gated = order == Order::Gated;
    let stops = std::iter::once(Step::Stop(kubelet.clone(), Point::AfterKubeletStop))
        .chain(gated.then(|| Step::Stop(containerd.clone(), Point::AfterContainerdStop)));
    let files = file_steps(target).iter().map(|f| Step::File(*f));
    let release_containerd = gated.then(|| Step::Release {
        unit: containerd.clone(),
        point: Point::PostStartMidGateRelease,
        key: "gate",
    });
    Plan {
        hook: Hook::PostStart,
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

/// pre-start's plan: the host nodes it binds that are missing (`host_nodes`), the machine's
/// device cgroup (`device_cgroup`: under the real root, where the unit is), the unit gate's drop-in and the boot's markers (`gate`: when the
/// `.nspawn` file binds them), the driver tree, and last the `.nspawn` file: nspawn refuses to
/// start when a bind's source is missing, so what it binds is made first.
pub fn pre_start(host_nodes: bool, device_cgroup: bool, gate: bool) -> Plan {
    let steps = [
        host_nodes.then_some(FileStep::HostNodes),
        device_cgroup.then_some(FileStep::DeviceCgroup),
        gate.then_some(FileStep::GateFile),
        Some(FileStep::DriverTree),
        gate.then_some(FileStep::BootGate),
        Some(FileStep::NspawnFile),
    ];
    Plan {
        hook: Hook::PreStart,
        steps: steps.into_iter().flatten().map(Step::File).collect(),
    }
}

/// What a file step did.
pub struct FileDone {
    /// The step's log line.
    pub line: String,
    /// Whether a library link changed (the links step; decides whether `ldconfig` runs).
    pub library_links_changed: bool,
}

/// What [`execute`] does apart from the services: a trait so the ordering and the
/// restore-on-failure rules are unit-tested with a recording fake. pre-start's work
/// (src/apply/boot.rs) has file steps only; the others are post-start's.
pub trait Work {
    fn file(&self, step: FileStep) -> Result<FileDone>;
    /// Run `ldconfig` unless nothing needs it (see [`Step::Ldconfig`]). Returns the log line.
    fn ldconfig(&self, _library_links_changed: bool) -> Result<String> {
        not_a_step("ldconfig")
    }
    /// Create `unit`'s gate marker. Returns the log line.
    fn release(&self, unit: &UnitName, _point: Point) -> Result<String> {
        not_a_step(&format!("release {unit}"))
    }
    /// Import the staged images: (imported, set aside).
    fn import(&self) -> Result<(usize, usize)> {
        not_a_step("import")
    }
}

/// A step a plan holds that its work does not make.
pub(crate) fn not_a_step<T>(step: &str) -> Result<T> {
    anyhow::bail!("step '{step}' is not this hook's (a bug in its plan)")
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
    pub(crate) fn driver(&self) -> Result<&discovery::UserspaceDriver> {
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
            FileStep::HostNodes
            | FileStep::DeviceCgroup
            | FileStep::GateFile
            | FileStep::DriverTree
            | FileStep::BootGate
            | FileStep::NspawnFile => return not_a_step(step.name()),
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
        hook: plan.hook,
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
    hook: Hook,
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
        let (hook, machine) = (self.hook, self.machine);
        let what = || format!("{hook} of {machine}: step '{step}'");
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
                    .with_context(|| format!("{hook} of {machine}: starting {unit}"))?;
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
        let (hook, machine) = (self.hook, self.machine);
        let running = self.services.is_active(unit).unwrap_or_else(|e| {
            // Unknown: count it as running, so a failure tries to put it back rather than
            // leave a node down that was serving.
            tracing::warn!(%machine, %unit, "could not tell whether it runs: {e:#}");
            true
        });
        timed(machine, &format!("stop {unit}"), || {
            self.services.stop(unit)
        })
        .with_context(|| format!("{hook} of {machine}: stopping {unit}"))?;
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
/// an operator had stopped them), say why nothing is started; a plan that starts no service
/// (pre-start's) has nothing to say.
fn start_again(machine: &str, plan: &Plan, services: &dyn Services, units: &[&UnitName]) {
    let names: Vec<String> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Start { unit, .. } => Some(unit.to_string()),
            _ => None,
        })
        .collect();
    if units.is_empty() && !names.is_empty() {
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
