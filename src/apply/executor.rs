//! The hooks' plans and their executors. pre-start's plan ([`pre_start`], run by
//! [`execute_boot`]) makes what the machine's next boot binds on the host, part by part, each
//! applied only where its diff says (src/apply/boot.rs);
//! post-start's ([`plan`], [`plan_without_gpus`], run by [`execute`]), in the order of a start
//! (docs/wiring.md), applies the parts of the wiring it owns (src/apply/parts/) and drives the
//! target's services: one log line and timing per step, the
//! crash points on its steps, and the restore-on-failure rule.

use crate::apply::boot::Boot;
use crate::apply::gate;
use crate::apply::images::FAILED_DIR;
use crate::apply::parts::{self, AnyPart, Applied, NextStart, Owner, Running, When};
use crate::config::MachineConfig;
use crate::failpoint::{self, Point};
use crate::model::{Change, Target};
use crate::systemd::services::Services;
use crate::types::machine_name::{MachineName, Subject};
use crate::types::paths::{MachinePath, UnitName};
use anyhow::{Context as _, Result};
use std::time::{Duration, Instant};

/// Run `f` and log how long it took: one debug line per step (`step timing`, fields `step` and
/// `us`), which `tests/bench/e2e-bench.sh` reads to time the rewiring apart from the services.
pub(crate) fn timed<T>(who: impl std::fmt::Display, step: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    tracing::debug!(machine = %who, step, us = micros(started.elapsed()), "step timing");
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

/// One step of pre-start's plan: one of its parts (src/apply/parts/, [`NextStart`]).
pub(crate) type BootStep = &'static dyn AnyPart<NextStart>;

/// One step of post-start's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Stop the unit (noting first whether it ran: a failure puts back only that), then reach
    /// the failpoint.
    Stop(UnitName, Point),
    /// Apply one part of the wiring (src/apply/parts/): re-read it, write what differs.
    Apply(&'static dyn AnyPart<Running>),
    /// Create the unit's gate marker (src/apply/gate.rs): from now on the unit may start. The
    /// point is the failpoint between the marker's temp file and its rename; `key` the log
    /// line's `step`.
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
            Step::Apply(part) => f.write_str(part.name()),
            Step::Release { unit, .. } => write!(f, "release {unit}"),
            Step::Start { unit, .. } => write!(f, "start {unit}"),
            Step::Import(dir) => write!(f, "import staged images from {dir}"),
        }
    }
}

/// A hook's plan: a plain value, computed before anything is touched, run by [`execute`]
/// (post-start's, of [`Step`]s) or [`execute_boot`] (pre-start's, of its parts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan<S> {
    pub hook: Hook,
    pub steps: Vec<S>,
}

impl<S: std::fmt::Display> std::fmt::Display for Plan<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let steps: Vec<String> = self.steps.iter().map(ToString::to_string).collect();
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

/// The parts post-start writes in `target` ([`Owner::PostStart`]), in [`parts::ALL`]'s order:
/// the file steps of [`plan`] and [`plan_without_gpus`].
fn written(target: Target) -> impl Iterator<Item = Step> {
    parts::running(target)
        .filter(|p| p.owner() == Owner::PostStart)
        .map(Step::Apply)
}

/// The order of a start (docs/wiring.md): kubelet stopped, containerd too unless it was released
/// before post-start began ([`Order`]; a stop also cancels a start job the boot still has
/// queued), the parts post-start writes ([`written`]: the driver root checked, the links,
/// `ldconfig`, the CDI spec), containerd released and started (or, already released, waited
/// for: the boot's own start job), the staged images imported, kubelet released and started.
pub fn plan(mc: &MachineConfig, target: Target, order: Order) -> Plan<Step> {
    let (containerd, kubelet) = (&mc.containerd_unit, &mc.kubelet_unit);
    let gated = order == Order::Gated;
    let stops = std::iter::once(Step::Stop(kubelet.clone(), Point::AfterKubeletStop))
        .chain(gated.then(|| Step::Stop(containerd.clone(), Point::AfterContainerdStop)));
    let release_containerd = gated.then(|| release_containerd(mc));
    Plan {
        hook: Hook::PostStart,
        steps: stops
            .chain(written(target))
            .chain(release_containerd)
            .chain(vec![
                Step::Start {
                    unit: containerd.clone(),
                    before: None,
                    after: Some(Point::AfterContainerdStart),
                },
                Step::Import(mc.staged_images_dir.clone()),
                release_kubelet(mc),
                Step::Start {
                    unit: kubelet.clone(),
                    before: Some(Point::BeforeKubeletStart),
                    after: None,
                },
            ])
            .collect(),
    }
}

/// The release of containerd's gate marker, with its crash point and log key.
fn release_containerd(mc: &MachineConfig) -> Step {
    Step::Release {
        unit: mc.containerd_unit.clone(),
        point: Point::PostStartMidGateRelease,
        key: "gate",
    }
}

/// The release of kubelet's gate marker, with its crash point and log key.
fn release_kubelet(mc: &MachineConfig) -> Step {
    Step::Release {
        unit: mc.kubelet_unit.clone(),
        point: Point::PostStartMidKubeletGateRelease,
        key: "gate-kubelet",
    }
}

/// post-start of a target without GPUs (its [`Desired`] holds nothing of ours): the same parts
/// written, which removes what is left of ours, and no service stopped. When the gate holds
/// the services (`gated`: the GPUs went since pre-start saw them, or the host's gate drop-ins
/// are installed), nothing else would start them this boot: both are released, then started.
pub(crate) fn plan_without_gpus(mc: &MachineConfig, target: Target, gated: bool) -> Plan<Step> {
    let (containerd, kubelet) = (&mc.containerd_unit, &mc.kubelet_unit);
    let gate = [
        release_containerd(mc),
        release_kubelet(mc),
        Step::Start {
            unit: containerd.clone(),
            before: None,
            after: None,
        },
        Step::Start {
            unit: kubelet.clone(),
            before: None,
            after: None,
        },
    ];
    Plan {
        hook: Hook::PostStart,
        steps: written(target)
            .chain(gate.into_iter().filter(|_| gated))
            .collect(),
    }
}

/// pre-start's plan, the parts of this machine's start in [`parts::ALL`]'s order: the host
/// nodes it binds, the machine's device cgroup (`real_root`: under the real root, where the unit
/// is), the unit gate's drop-in and the boot's markers (`gate`: when the `.nspawn` file binds
/// them), the driver tree, and last the `.nspawn` file: nspawn refuses to start when a bind's
/// source is missing, so what it binds is made first.
pub fn pre_start(real_root: bool, gate: bool) -> Plan<BootStep> {
    Plan {
        hook: Hook::PreStart,
        steps: parts::next_start()
            .filter(|p| match p.when() {
                When::Always => true,
                When::RealRoot => real_root,
                When::FileBindsGate => gate,
            })
            .collect(),
    }
}

/// pre-start's plan for `b`'s start ([`pre_start`]).
pub fn boot_plan(b: &Boot) -> Plan<BootStep> {
    pre_start(b.ctx.host.is_real_root(), b.binds_gate())
}

/// What [`execute`] does apart from the services: a trait so the ordering and the
/// restore-on-failure rules are unit-tested with a recording fake (the product's is
/// src/apply/part.rs's).
pub trait Work {
    /// Apply `part`; `library_links_changed`: whether the links part changed a link in this
    /// run (false before it ran).
    fn apply(
        &self,
        part: &'static dyn AnyPart<Running>,
        library_links_changed: bool,
    ) -> Result<Applied>;
    /// Create `unit`'s gate marker. Returns the log line.
    fn release(&self, unit: &UnitName, point: Point) -> Result<String>;
    /// Import the staged images: (imported, set aside).
    fn import(&self) -> Result<(usize, usize)>;
}

/// What [`execute_boot`] does: pre-start's parts on the host (the product's: a [`Boot`],
/// src/apply/part.rs); a trait so the order and the failure rule are unit-tested with a
/// recording fake.
pub trait BootWork {
    /// What making `part` would change now: its observe (reads only; an error there is the
    /// step's) and its diff.
    fn diff(&self, part: BootStep) -> Result<Vec<Change>>;
    /// The log line of a part found as it must be.
    fn unchanged(&self, part: BootStep) -> Result<String>;
    /// Make `part`, re-reading what it is about to write. Returns the log line.
    fn apply(&self, part: BootStep) -> Result<String>;
}

/// Run pre-start's `plan` in order: each part observed and diffed, and applied only when its
/// diff is not empty; one log line and timing per part; the first failure ends it (nothing to
/// put back: the machine has not started).
pub(crate) fn execute_boot(
    plan: &Plan<BootStep>,
    machine: &MachineName,
    work: &dyn BootWork,
) -> Result<()> {
    for part in &plan.steps {
        let started = Instant::now();
        let line = timed(machine, part.name(), || {
            if work.diff(*part)?.is_empty() {
                work.unchanged(*part)
            } else {
                work.apply(*part)
            }
        })
        .with_context(|| format!("{} of {machine}: step '{part}'", plan.hook))?;
        tracing::info!(%machine, step = %part.key(), us = micros(started.elapsed()), "{line}");
    }
    Ok(())
}

/// What pre-start's `plan` would change now, part by part in order: each part's diff, or one
/// change that fails with what could not be read. Reads only (`plan`).
pub fn pending_boot(plan: &Plan<BootStep>, work: &dyn BootWork) -> Vec<Change> {
    plan.steps
        .iter()
        .flat_map(|part| {
            work.diff(*part)
                .unwrap_or_else(|e| vec![Change::unreadable(part.check(), &e)])
        })
        .collect()
}

/// The one executor: run `plan`'s steps in order. On a failure, start again only the services
/// that were running before their stop (in the plan's start order; see the module
/// documentation) and return the error.
pub fn execute(
    plan: &Plan<Step>,
    who: Subject,
    work: &dyn Work,
    services: &dyn Services,
) -> Result<()> {
    let mut run = Run {
        hook: plan.hook,
        who,
        work,
        services,
        was_running: Vec::new(),
        library_links_changed: false,
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
            start_again(who, plan, services, &restore);
            return Err(e);
        }
    }
    Ok(())
}

/// The state of one run of a plan.
struct Run<'a> {
    hook: Hook,
    who: Subject<'a>,
    work: &'a dyn Work,
    services: &'a dyn Services,
    /// What ran before post-start stopped it: the only services a failure puts back.
    was_running: Vec<UnitName>,
    /// What the links part said (false before it ran, and in host mode, which has none: the
    /// cache alone decides, [`crate::model::ld_cache::ldconfig_needed`]).
    library_links_changed: bool,
}

impl Run<'_> {
    fn step(&mut self, step: &Step) -> Result<()> {
        let (hook, machine) = (self.hook, self.who);
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
            Step::Apply(part) => {
                let changed = self.library_links_changed;
                let done = timed(machine, part.name(), || self.work.apply(*part, changed))
                    .with_context(what)?;
                self.library_links_changed |= done.library_links_changed;
                (part.key(), done.line)
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
        let (hook, machine) = (self.hook, self.who);
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
        let machine = self.who;
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
fn start_again(machine: Subject, plan: &Plan<Step>, services: &dyn Services, units: &[&UnitName]) {
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
