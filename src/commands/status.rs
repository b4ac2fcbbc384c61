//! `status <MACHINE>` and `status --all`: is a machine's GPU wiring current? Compares the host now
//! with the machine now and never writes anything (no lock, no file, no unit job).
//!
//! Gather (host discovery, the host unit's properties, the running machine's tree through its
//! leader's root, the machine's services over its bus: reads only) → [`evaluate`] (pure) →
//! print. The machine's driver version is what its CDI spec mounts (`libcuda.so.<version>` at its
//! standard container path), what its driver root ([`layout::DRIVER_ROOT`]) holds and what its
//! library links name, never a guess from a host path.
//!
//! States and exit codes (README "Exit codes"), worst first: `broken` 6 (something needs a
//! person: spec invalid or gone while the machine is wired, containerd or kubelet not active,
//! the unit gate not released, the last post-start failed, the host's driver incomplete),
//! `drift` 5 (the host changed since the machine's last start: another driver version, a GPU
//! added or removed, links dangling after an upgrade; `reconcile` fixes it), `not-running` 7
//! (the unit is stopped: nothing is stale, the next start wires the host as it is then), 0 in
//! sync.

pub(crate) mod host;
mod inspect;
mod judge;
pub mod metrics;

use inspect::{inspect_dev_char, inspect_spec, judged_changes, last_post_start};
pub use inspect::{inspect_machine, utc};
use judge::host_facts;
pub use judge::{Subject, evaluate};

use crate::Ctx;
use crate::config::MachineConfig;
use crate::discovery::{self, Inventory, Verdict, assign};
use crate::fs::machine_root::MachineRoot;
use crate::model::cdi;
use crate::model::helper::HelperFacts;
#[cfg(test)]
use crate::model::helper::helper_facts;
use crate::model::{Change, Check, Desired};
use crate::systemd::{MachineHandle, ServiceRun, Systemd};
use crate::types::machine_name::MachineName;
use crate::types::units;
use anyhow::{Context as _, Result};
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

/// `status --json`'s objects carry the one versioning convention of every JSON output:
/// `apiVersion` ([`crate::discovery::API_VERSION`], bumped on any incompatible change) and
/// `kind`, each kind described by a JSON Schema in `assets/json-schema/`.
pub use crate::discovery::API_VERSION;
/// `kind` of one machine's status.
pub const KIND: &str = "MachineStatus";
/// How long all bus reads for one machine may take.
const BUS_TIMEOUT: Duration = Duration::from_secs(15);

/// A machine's overall state, ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// `status --all` with no installed machine: nothing to judge, which monitoring must be able
    /// to tell from "all in sync".
    NothingInstalled,
    InSync,
    NotRunning,
    Drift,
    Broken,
}

impl State {
    /// The documented exit code: 0 in sync, 5 drift, 6 broken, 7 not running, 8 nothing
    /// installed.
    pub fn exit_code(self) -> u8 {
        match self {
            State::NothingInstalled => 8,
            State::InSync => 0,
            State::Drift => 5,
            State::Broken => 6,
            State::NotRunning => 7,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::NothingInstalled => "nothing installed",
            State::InSync => "in sync",
            State::NotRunning => "not running",
            State::Drift => "drift",
            State::Broken => "broken",
        }
    }
}

/// One thing found out of line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// `drift` or `broken`.
    pub state: State,
    /// What was compared (named in JSON as [`Check::as_str`] says).
    pub check: Check,
    pub message: String,
}

/// The host as discovered now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostFacts {
    /// `none`, `complete` or `incomplete`.
    pub verdict: &'static str,
    pub kernel_module: Option<String>,
    pub gpus: Vec<GpuFacts>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuFacts {
    pub index: u32,
    pub uuid: String,
    pub minor: u32,
}

/// The CDI spec file in the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecFacts {
    /// Path in the machine.
    pub path: String,
    /// `missing`, `invalid` or `valid`.
    pub state: &'static str,
    /// Why it is invalid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub cdi_version: Option<String>,
    /// Versions of the `libcuda.so.<version>` files it mounts.
    pub driver_versions: Vec<String>,
    /// Device names (`0`, `GPU-…`, `all`).
    pub devices: Vec<String>,
    /// Whether its bytes are exactly what post-start would write for the host now.
    pub current: bool,
    #[serde(skip)]
    checked: Option<cdi::Checked>,
}

impl SpecFacts {
    /// No spec at `path` in the machine.
    fn missing(path: String) -> SpecFacts {
        SpecFacts {
            path,
            state: "missing",
            error: None,
            cdi_version: None,
            driver_versions: Vec::new(),
            devices: Vec::new(),
            current: false,
            checked: None,
        }
    }
}

/// What was read from the running machine's tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineFacts {
    pub cdi_spec: SpecFacts,
    /// Versions of `libcuda.so.<version>` in the driver root.
    pub driver_root_versions: Vec<String>,
    /// Versions of the `libcuda.so.<version>` links post-start keeps in the multiarch dirs.
    pub link_versions: Vec<String>,
    /// Our links (library, driver root, `/dev/char`) that do not resolve: `path -> target`.
    pub dangling_links: Vec<String>,
    /// Whether pre-start gated containerd/kubelet this boot, and whether post-start released it.
    pub gated: bool,
    pub gate_released: bool,
    /// Why the driver root is not the host's driver as it is now (post-start's own check of it,
    /// every file the host's inode: a driver or C library replaced on the host since the start),
    /// when it is not; only for a running machine reached through systemd.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_root_mismatch: Option<String>,
    /// Device and inode of the helper bound in the machine for its CDI hooks
    /// ([`crate::model::layout::HOOK_BINARY`]), when it is there: the installed helper as it was at the
    /// machine's start.
    #[serde(skip)]
    pub hook_binary: Option<(u64, u64)>,
    /// What post-start run now would change (the wiring model's diff, [`model::pending`]), in
    /// order: the machine is in sync with the host only when this is empty.
    pub pending_changes: Vec<Change>,
}

#[cfg(test)]
impl MachineFacts {
    /// A running target with no NVIDIA state at all and nothing pending (tests add to it).
    pub(crate) fn bare() -> MachineFacts {
        MachineFacts {
            cdi_spec: SpecFacts::missing("/var/run/cdi/nvidia.com-gpu.json".into()),
            driver_root_versions: Vec::new(),
            link_versions: Vec::new(),
            dangling_links: Vec::new(),
            gated: false,
            gate_released: false,
            driver_root_mismatch: None,
            hook_binary: None,
            pending_changes: Vec::new(),
        }
    }
}

/// A unit and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceFacts {
    pub unit: String,
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
}

/// The host's `systemd-nspawn@<m>.service` and the last run of our post-start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitFacts {
    pub unit: String,
    pub active_state: String,
    pub sub_state: String,
    /// The service's `Result` (`success`, `exit-code`, …).
    pub result: String,
    pub invocation_id: String,
    /// `None` when post-start has not run since the unit was loaded.
    pub last_post_start: Option<PostStartRun>,
}

/// One run of post-start, from the unit's `ExecStartPost` property.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PostStartRun {
    /// UTC, `2026-12-03T12:00:00Z`.
    pub started_at: String,
    /// `None` while it runs.
    pub exited_at: Option<String>,
    /// Exit status when it exited; `None` when killed or still running.
    pub exit_status: Option<i32>,
    /// Signal number when killed.
    pub signal: Option<i32>,
    pub succeeded: bool,
    /// µs since the epoch (0: not exited), for metrics.
    #[serde(skip)]
    pub started_usec: u64,
    #[serde(skip)]
    pub exited_usec: u64,
}

/// The whole answer for one machine (`status --json`, kind [`KIND`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub machine: String,
    pub state: State,
    pub exit_code: u8,
    pub summary: String,
    pub host: HostFacts,
    /// `None` when the host's systemd was not asked (`--machine-root`).
    pub unit: Option<UnitFacts>,
    pub running: bool,
    /// `None` when the machine is not running.
    #[serde(rename = "machineState")]
    pub machine_facts: Option<MachineFacts>,
    /// containerd and kubelet in the machine; `None` when not running or not asked.
    pub services: Option<Vec<ServiceFacts>>,
    pub findings: Vec<Finding>,
    /// The machine's GPUs when the config's `gpus` is not `all`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assignment: Option<crate::discovery::assign::AssignmentReport>,
    /// The helper binary that judged: which build runs where, across a fleet.
    pub judged_by: crate::build_info::Build,
}

/// `status --all --json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AllStatus {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub state: State,
    pub exit_code: u8,
    pub machines: Vec<Status>,
    /// The machines that could not be judged, each with why.
    pub errors: Vec<MachineError>,
}

/// What was observed besides the host: each `None` means "not asked" or "not running".
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub unit: Option<UnitFacts>,
    /// `None` when the machine is not running.
    pub machine: Option<MachineFacts>,
    pub services: Option<Vec<ServiceFacts>>,
    /// GPUs the config's `gpus` names that the host does not have now.
    pub missing_gpus: Vec<String>,
    /// The helper installed at its stable path, as the units and the next start run it.
    pub helper: Option<HelperFacts>,
    /// Why pre-start would refuse the machine's next start ([`crate::model::render::as_pre_start`]),
    /// with the exit code it would refuse it with.
    pub next_start: Option<(u8, String)>,
}

/// Everything [`evaluate`] needs about one machine, read from the host's and the machine's
/// systemd and the machine's tree. `machine_root` (tests, chroots) reads the tree from a
/// directory instead and asks no systemd.
fn observe(
    ctx: &Ctx,
    inv: &Inventory,
    machine: &MachineName,
    mc: &MachineConfig,
    desired: &Desired,
    machine_root: Option<&Path>,
) -> Result<Observed> {
    let judged = !matches!(inv.verdict, Verdict::Incomplete { .. });
    if let Some(dir) = machine_root {
        // `{machine}` in the path gives each machine a tree of its own (tests of `--all`).
        let dir = dir.to_string_lossy().replace("{machine}", machine.as_str());
        let root = MachineRoot::open(Path::new(&dir))?;
        return Ok(Observed {
            unit: None,
            machine: Some(inspect_machine(&root, &ctx.host, mc, desired, judged)?),
            services: None,
            ..Observed::default()
        });
    }
    if !ctx.host.is_real_root() {
        // The test kit's flag is named only by the builds that have it.
        let instead = if cfg!(feature = "testkit") {
            " (tests: --machine-root DIR reads a machine tree instead)"
        } else {
            ""
        };
        return Err(crate::error::bad_input(format!(
            "--host-root {}: the running machine {machine} is only reachable through the \
             host's own systemd, which a host tree does not have{instead}",
            ctx.host.root().display()
        )));
    }
    let deadline = Instant::now() + BUS_TIMEOUT;
    let host = Systemd::host(deadline)?;
    let unit_name = units::unit_name(machine);
    let run: ServiceRun = host.service_run(&unit_name, deadline)?;
    let unit = UnitFacts {
        unit: unit_name,
        active_state: run.unit.active_state.clone(),
        sub_state: run.unit.sub_state.clone(),
        result: run.result.clone(),
        invocation_id: run.unit.invocation_id.clone(),
        last_post_start: last_post_start(
            &run.exec_start_post,
            crate::model::dropin::POST_START_ARGS,
        ),
    };
    // Only an active unit has a machine to inspect; while it starts, post-start may be halfway.
    if run.unit.active_state != "active" || host.machine_leader(machine, deadline)?.is_none() {
        return Ok(Observed {
            unit: Some(unit),
            machine: None,
            services: None,
            ..Observed::default()
        });
    }
    let handle = MachineHandle::find(&host, machine, deadline)?;
    let facts = inspect_machine(handle.root(), &ctx.host, mc, desired, judged)?;
    // Reads only, so a machine in its own user namespace (which refuses state changes) is fine.
    let sd = Systemd::machine_in_any_userns(&handle, deadline)?;
    Ok(Observed {
        unit: Some(unit),
        machine: Some(facts),
        services: Some(services(&sd, mc, deadline)?),
        ..Observed::default()
    })
}

/// containerd and kubelet as `sd` (the machine's systemd, or the host's in host mode) has them.
fn services(sd: &Systemd, mc: &MachineConfig, deadline: Instant) -> Result<Vec<ServiceFacts>> {
    [&mc.containerd_unit, &mc.kubelet_unit]
        .into_iter()
        .map(|u| {
            let st = sd.unit_state(u.as_str(), deadline)?;
            Ok(ServiceFacts {
                unit: u.to_string(),
                load_state: st.load_state,
                active_state: st.active_state,
                sub_state: st.sub_state,
            })
        })
        .collect()
}

/// Whether `machine` is installed: our drop-in is on the host.
fn installed(ctx: &Ctx, machine: &MachineName) -> bool {
    ctx.host.is_file(units::dropin_path(machine))
}

/// Every installed machine (those with our drop-in), sorted by name.
pub(crate) fn installed_machines(ctx: &Ctx) -> Result<Vec<MachineName>> {
    crate::config::installed_machines(&ctx.host)
}

/// The status of one machine.
pub fn machine_status(
    ctx: &Ctx,
    inv: &Inventory,
    machine: &MachineName,
    machine_root: Option<&Path>,
) -> Result<Status> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    // The machine's share of the host: what it should have is judged against that alone.
    assign::check_overlap(inv, &ctx.config.gpu_assignments(machine)?)?;
    let host_inv = inv;
    let a = assign::assign(inv, &mc.gpus);
    let inv = &a.view;
    // The machine's desired state, made once: pre-start's when it would start the machine, else
    // for its share as it is, beside why pre-start would refuse the next start.
    let (next_start, desired) = match crate::model::render::as_pre_start(ctx, machine, host_inv) {
        Ok((_, r)) => (None, r.desired),
        Err(e) => (
            Some((crate::error::exit_code(&e), format!("{e:#}"))),
            Desired::machine(ctx, machine, &mc, host_inv, &a)
                .with_context(|| format!("status of {machine}"))?,
        ),
    };
    let mut observed = observe(ctx, inv, machine, &mc, &desired, machine_root)
        .with_context(|| format!("status of {machine}"))?;
    observed.missing_gpus = a.missing.iter().map(ToString::to_string).collect();
    observed.helper = Some(desired.helper.clone());
    observed.next_start = next_start;
    let mut status = evaluate(Subject::Machine(machine), &mc, inv, observed);
    if a.setting != crate::config::Gpus::All {
        status.assignment = Some(a.report(machine.as_str(), mc.require));
    }
    Ok(status)
}

/// `status`: gather (the host, each machine) → the verdict (a [`Status`] per machine, the worst
/// state) → print; return the exit code (0, 5, 6 or 7).
pub fn status(
    ctx: &Ctx,
    machine: Option<&MachineName>,
    all: bool,
    json: bool,
    machine_root: Option<&Path>,
) -> Result<u8> {
    let gathered = (|| {
        let machines = selected_machines(ctx, machine, all)?;
        let inv = discovery::discover(&ctx.host)?;
        Ok((machines, inv))
    })();
    let (machines, inv) = match gathered {
        Ok(g) => g,
        Err(e) if json => return Err(print_unjudged(machine.map(MachineName::as_str), e)),
        Err(e) => return Err(e),
    };
    // One machine that cannot be judged hides none of the others: with --all, each gets its
    // verdict or its error.
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for m in &machines {
        match machine_status(ctx, &inv, m, machine_root) {
            Ok(s) => out.push(s),
            Err(e) if all => errors.push(MachineError {
                machine: m.to_string(),
                exit_code: crate::error::exit_code(&e),
                error: format!("{e:#}"),
            }),
            Err(e) if json => return Err(print_unjudged(Some(m.as_str()), e)),
            Err(e) => return Err(e),
        }
    }
    let state = out
        .iter()
        .map(|s| s.state)
        .max()
        .unwrap_or(State::NothingInstalled);
    let code = if errors.is_empty() {
        state.exit_code()
    } else {
        UNJUDGED_EXIT
    };
    print_status(out, errors, state, code, all, json)?;
    Ok(code)
}

/// `status --all`'s exit code when a machine could not be judged (the others' verdicts are
/// printed all the same).
pub(crate) const UNJUDGED_EXIT: u8 = 1;

/// A machine `status --all` could not judge.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MachineError {
    pub machine: String,
    /// The exit code `status <machine>` exits with for it.
    pub exit_code: u8,
    pub error: String,
}

/// `status --json` when it could not judge (not installed, host discovery failed, the bus did
/// not answer): still one object for monitoring to parse (kind `StatusError`, state `unknown`,
/// [`crate::output::print_error_object`]); returns `e`.
pub(crate) fn print_unjudged(machine: Option<&str>, e: anyhow::Error) -> anyhow::Error {
    crate::output::print_error_object("StatusError", machine, Some("unknown"), e)
}

fn print_json(v: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(v).context("serializing the status")?;
    crate::output::print_all(&format!("{text}\n"))
}

/// Every selected machine judged, for monitoring (`--format prometheus`, `metrics`): what could
/// not be judged (the host's discovery, one machine) is an error in the report, and the rest is
/// still judged.
pub fn report(
    ctx: &Ctx,
    machine: Option<&MachineName>,
    all: bool,
    machine_root: Option<&Path>,
) -> metrics::Report {
    let mut r = metrics::Report {
        now: now_seconds(),
        ..Default::default()
    };
    let machines = match selected_machines(ctx, machine, all) {
        Ok(m) => m,
        Err(e) => {
            r.errors.push(format!("{e:#}"));
            return r;
        }
    };
    r.installed = machines.len();
    let inv = match discovery::discover(&ctx.host) {
        Ok(inv) => inv,
        Err(e) => {
            r.errors.push(format!("host discovery: {e:#}"));
            return r;
        }
    };
    r.host = Some(host_facts(&inv));
    for m in &machines {
        match machine_status(ctx, &inv, m, machine_root) {
            Ok(s) => r.machines.push(s),
            Err(e) => r.errors.push(format!("{m}: {e:#}")),
        }
    }
    if all {
        r.host_mode_installed = host::installed(ctx);
        if r.host_mode_installed {
            match host::judge(ctx, &inv) {
                Ok(s) => r.host_mode = Some(s),
                Err(e) => r.errors.push(format!("host mode: {e:#}")),
            }
        }
    }
    r
}

/// Now, seconds since the epoch.
pub(crate) fn now_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The machines `status` looks at: the one named (installed), or every installed one.
fn selected_machines(
    ctx: &Ctx,
    machine: Option<&MachineName>,
    all: bool,
) -> Result<Vec<MachineName>> {
    match (machine, all) {
        (Some(m), false) => {
            if !installed(ctx, m) {
                return Err(crate::error::bad_input(format!(
                    "machine {m} is not installed: no {} on the host (see `install`)",
                    units::dropin_path(m)
                )));
            }
            Ok(vec![m.clone()])
        }
        (None, true) => installed_machines(ctx),
        _ => Err(crate::error::bad_input(
            "status needs a MACHINE or --all, not both",
        )),
    }
}

/// Print the verdicts: one line per machine, or the JSON object (one machine's, or `--all`'s).
fn print_status(
    out: Vec<Status>,
    errors: Vec<MachineError>,
    state: State,
    exit_code: u8,
    all: bool,
    json: bool,
) -> Result<()> {
    for e in &errors {
        tracing::error!(machine = %e.machine, "status could not judge the machine: {}", e.error);
    }
    if json {
        if all {
            return print_json(&AllStatus {
                api_version: API_VERSION,
                kind: "MachineStatusList",
                state,
                exit_code,
                machines: out,
                errors,
            });
        }
        return print_json(&out[0]);
    }
    let mut text = String::new();
    if all && out.is_empty() && errors.is_empty() {
        text.push_str("no installed machines\n");
    }
    for s in &out {
        text.push_str(&format!("{}\n", crate::output::printable(&s.summary)));
    }
    for e in &errors {
        text.push_str(&format!(
            "{}: could not judge: {}\n",
            e.machine,
            crate::output::printable(&e.error)
        ));
    }
    crate::output::print_all(&text)
}

#[cfg(test)]
mod tests;
