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

pub mod host;
pub mod metrics;

use crate::Ctx;
use crate::config::MachineConfig;
use crate::discovery::{self, Inventory, Verdict, assign, parse::is_version};
use crate::fs::machine_root::{FileKind, Lookup, MachineRoot};
use crate::model::cdi;
use crate::model::gate;
use crate::model::helper::{HelperFacts, helper_facts};
use crate::model::layout::DRIVER_ROOT;
use crate::model::{self, Action, Change, Desired, Target, links};
use crate::systemd::{ExecRun, MachineHandle, ServiceRun, Systemd};
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
/// Largest CDI spec read.
const MAX_SPEC_BYTES: usize = 16 << 20;
/// Most entries read from the driver root.
const MAX_DRIVER_ROOT_ENTRIES: usize = 100_000;
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
    /// What was compared: `driver-version`, `gpus`, `cdi-spec`, `dangling-links`, `gate`,
    /// `services`, `post-start`, `unit`, `host-driver`, `stale-nvidia-state`, `driver-root`,
    /// `helper`, `next-start`, `ld-cache`.
    pub check: &'static str,
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
}

/// `status --all --json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AllStatus {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub state: State,
    pub exit_code: u8,
    pub machines: Vec<Status>,
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

/// The version in a driver library file name `libcuda.so.<version>`.
fn libcuda_version(file_name: &str) -> Option<&str> {
    file_name
        .strip_prefix("libcuda.so.")
        .filter(|v| is_version(v))
}

fn push_unique(v: &mut Vec<String>, s: &str) {
    if !v.iter().any(|x| x == s) {
        v.push(s.to_owned());
    }
}

/// Read the machine's NVIDIA state through its root (the CDI spec, the driver root, our links)
/// and what post-start would change there to make it `desired` ([`model::pending`]). `judged`
/// false (the host's driver is incomplete: post-start refuses, changing nothing) lists no
/// change. Reads only.
pub fn inspect_machine(
    root: &MachineRoot,
    mc: &MachineConfig,
    desired: &Desired,
    judged: bool,
) -> Result<MachineFacts> {
    let cdi_spec = inspect_spec(root, mc, desired.spec.bytes.as_deref())?;
    let mut dangling = Vec::new();
    let driver_root_versions = inspect_driver_root(root, &mut dangling)?;
    let link_versions = inspect_lib_links(root, &mut dangling)?;
    inspect_dev_char(root, &mut dangling)?;
    let gated =
        gate::is_gated(root, &mc.kubelet_unit)? || gate::is_gated(root, &mc.containerd_unit)?;
    let gate_released =
        gate::is_released(root, &mc.containerd_unit)? && gate::is_released(root, &mc.kubelet_unit)?;
    let pending_changes = if judged {
        model::pending(root, desired)
    } else {
        Vec::new()
    };
    Ok(MachineFacts {
        cdi_spec,
        driver_root_versions,
        link_versions,
        dangling_links: dangling,
        gated,
        gate_released,
        driver_root_mismatch: pending_changes
            .iter()
            .find(|c| c.check == "driver-root")
            .map(|c| c.detail.clone()),
        hook_binary: root
            .pin_no_symlinks(crate::model::layout::HOOK_BINARY)?
            .and_then(|fd| nix::sys::stat::fstat(&fd).ok())
            .map(|st| (st.st_dev, st.st_ino)),
        pending_changes,
    })
}

/// The machine's CDI spec: missing, invalid or valid, and whether it is what post-start would
/// write now (`expected_spec`).
fn inspect_spec(
    root: &MachineRoot,
    mc: &MachineConfig,
    expected_spec: Option<&[u8]>,
) -> Result<SpecFacts> {
    let path = format!(
        "{}/{}",
        mc.cdi_dir.as_str().trim_end_matches('/'),
        cdi::spec_file_name(&mc.cdi_kind)
    );
    let bytes = root
        .read_file(&path, MAX_SPEC_BYTES)
        .with_context(|| format!("reading the CDI spec {path} in the machine"))?;
    Ok(match bytes {
        None => SpecFacts::missing(path),
        Some(bytes) => {
            let current = expected_spec.is_some_and(|e| e == bytes.as_slice());
            match cdi::check(&mc.cdi_kind, &bytes) {
                Err(e) => SpecFacts {
                    state: "invalid",
                    error: Some(e),
                    current,
                    ..SpecFacts::missing(path)
                },
                Ok(c) => {
                    let mut versions = Vec::new();
                    for p in &c.container_paths {
                        let name = p.rsplit('/').next().unwrap_or(p);
                        if let Some(v) = libcuda_version(name) {
                            push_unique(&mut versions, v);
                        }
                    }
                    SpecFacts {
                        path,
                        state: "valid",
                        error: None,
                        cdi_version: Some(c.cdi_version.clone()),
                        driver_versions: versions,
                        devices: c.devices.iter().map(|(n, _)| n.clone()).collect(),
                        current,
                        checked: Some(c),
                    }
                }
            }
        }
    })
}

/// The driver versions the machine's driver root holds; its dangling links into `dangling`.
fn inspect_driver_root(root: &MachineRoot, dangling: &mut Vec<String>) -> Result<Vec<String>> {
    let mut versions = Vec::new();
    if let Lookup::Dir(dr) = root.lookup_dir(DRIVER_ROOT)? {
        let entries = dr.walk(MAX_DRIVER_ROOT_ENTRIES)?.with_context(|| {
            format!("{DRIVER_ROOT} in the machine has more than {MAX_DRIVER_ROOT_ENTRIES} entries")
        })?;
        for e in entries {
            let name = e.path.rsplit('/').next().unwrap_or(&e.path);
            if let Some(v) = libcuda_version(name) {
                push_unique(&mut versions, v);
            }
            if e.kind == FileKind::Symlink {
                let p = format!("{DRIVER_ROOT}/{}", e.path);
                if !root.resolves(&p)? {
                    dangling.push(format!("{p} -> {}", e.target.unwrap_or_default()));
                }
            }
        }
    }
    Ok(versions)
}

/// The driver versions our library links name ([`links::ours`]); the dangling ones into
/// `dangling`.
fn inspect_lib_links(root: &MachineRoot, dangling: &mut Vec<String>) -> Result<Vec<String>> {
    let mut versions = Vec::new();
    for dir_path in links::machine_lib_dirs(root)? {
        let Lookup::Dir(dir) = root.lookup_dir(&dir_path)? else {
            continue;
        };
        let seen = links::observe_dir(&dir, &links::DirLinks::new())?;
        for (name, target) in links::ours(&seen) {
            if let Some(v) = libcuda_version(name) {
                push_unique(&mut versions, v);
            }
            let p = dir.child(name);
            if !root.resolves(&p)? {
                dangling.push(format!("{p} -> {target}"));
            }
        }
    }
    Ok(versions)
}

/// Our `/dev/char` links to NVIDIA nodes that dangle, into `dangling`.
fn inspect_dev_char(root: &MachineRoot, dangling: &mut Vec<String>) -> Result<()> {
    if let Lookup::Dir(dev_char) = root.lookup_dir(links::DEV_CHAR)? {
        let seen = links::observe_dir(&dev_char, &links::DirLinks::new())?;
        for (name, target) in links::ours_dev_char(&seen) {
            let p = dev_char.child(name);
            if !root.resolves(&p)? {
                dangling.push(format!("{p} -> {target}"));
            }
        }
    }
    Ok(())
}

/// Whose GPU wiring is judged: a machine, or the host itself (host mode, `host status`).
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    Machine(&'a MachineName),
    Host,
}

impl Subject<'_> {
    /// How the subject starts its summary line, and its `machine` field in JSON.
    pub fn name(self) -> String {
        match self {
            Subject::Machine(m) => m.to_string(),
            Subject::Host => "host".to_owned(),
        }
    }
    /// "the machine" or "the host".
    fn the(self) -> &'static str {
        match self {
            Subject::Machine(_) => "the machine",
            Subject::Host => "the host",
        }
    }
    /// "in the machine" or "on the host".
    fn inside(self) -> &'static str {
        match self {
            Subject::Machine(_) => "in the machine",
            Subject::Host => "on the host",
        }
    }
    /// The command that wires the subject again from the host as it is now.
    fn rewire_command(self) -> String {
        match self {
            Subject::Machine(m) => {
                format!("nspawn-lifecycle-helper nspawn-lifecycle reconcile {m}")
            }
            Subject::Host => format!("systemctl restart {}", crate::model::host_unit::UNIT),
        }
    }
}

/// Judge what was observed: pure, so every case is a unit test.
pub fn evaluate(
    subject: Subject<'_>,
    mc: &MachineConfig,
    inv: &Inventory,
    observed: Observed,
) -> Status {
    let mut findings: Vec<Finding> = Vec::new();
    let mut add = |state: State, check: &'static str, message: String| {
        findings.push(Finding {
            state,
            check,
            message,
        });
    };
    if let Verdict::Incomplete { reasons } = &inv.verdict {
        add(
            State::Broken,
            "host-driver",
            format!(
                "the host's NVIDIA state is incomplete ({}); the next start would fail until the \
                 driver install finishes",
                reasons.join("; ")
            ),
        );
    }
    let not_running = judge_unit(subject, &observed, &mut add);
    if let Some(m) = &observed.machine {
        judge_nvidia(subject, inv, m, &mut add);
        judge_gate(subject, m, &mut add);
    }
    if let Some(services) = &observed.services {
        judge_services(subject, services, &mut add);
    }
    judge_missing_gpus(&observed.missing_gpus, mc.require, &mut add);
    if let Some(h) = &observed.helper {
        judge_helper(subject, h, observed.machine.as_ref(), &mut add);
    }
    if let Some((code, why)) = &observed.next_start {
        add(
            State::Broken,
            "next-start",
            format!("pre-start would refuse the next start (exit {code}): {why}"),
        );
    }
    if let Some(m) = &observed.machine {
        judge_pending(subject, inv, m, &mut findings);
    }

    let worst = findings.iter().map(|f| f.state).max();
    let state = match (worst, &not_running) {
        (Some(w), _) if w >= State::Drift => w,
        (_, Some(_)) => State::NotRunning,
        _ => State::InSync,
    };
    let summary = match state {
        State::InSync | State::NothingInstalled => in_sync_summary(subject, mc, inv, &observed),
        State::NotRunning => format!(
            "{}: not running: {}; the next start wires the host as it is then",
            subject.name(),
            not_running.as_deref().unwrap_or("stopped")
        ),
        State::Drift | State::Broken => findings_summary(subject, state, &findings),
    };
    let running = observed.machine.is_some();
    Status {
        api_version: API_VERSION,
        kind: KIND,
        machine: subject.name(),
        state,
        exit_code: state.exit_code(),
        summary,
        host: host_facts(inv),
        unit: observed.unit,
        running,
        machine_facts: observed.machine,
        services: observed.services,
        findings,
        assignment: None,
    }
}

/// What `status` shows of the host: the verdict, the kernel module, the GPUs.
fn host_facts(inv: &Inventory) -> HostFacts {
    HostFacts {
        verdict: match inv.verdict {
            Verdict::None => "none",
            Verdict::Complete => "complete",
            Verdict::Incomplete { .. } => "incomplete",
        },
        kernel_module: inv.kernel_module.clone(),
        gpus: inv
            .gpus
            .iter()
            .map(|g| GpuFacts {
                index: g.index,
                uuid: g.uuid.clone(),
                minor: g.minor,
            })
            .collect(),
    }
}

/// The host unit: a failed post-start or a failed or restarting unit is broken; a stopped unit
/// (or no machine registered) is not running, and the returned text says why.
fn judge_unit(
    subject: Subject<'_>,
    observed: &Observed,
    add: &mut impl FnMut(State, &'static str, String),
) -> Option<String> {
    let mut not_running = None;
    if let Some(u) = &observed.unit {
        if let Some(run) = &u.last_post_start
            && !run.succeeded
            && run.exited_at.is_some()
        {
            add(
                State::Broken,
                "post-start",
                format!(
                    "the last post-start ({}) {}",
                    run.started_at,
                    match (run.exit_status, run.signal) {
                        (Some(s), _) => format!("exited with status {s}"),
                        (_, Some(sig)) => format!("was killed by signal {sig}"),
                        _ => "failed".to_owned(),
                    }
                ),
            );
        }
        let failing = u.active_state == "failed"
            || u.sub_state == "auto-restart"
            || (u.active_state != "active" && u.result != "success");
        if failing {
            add(
                State::Broken,
                "unit",
                format!(
                    "{} is {} ({}), result {}",
                    u.unit, u.active_state, u.sub_state, u.result
                ),
            );
        } else if u.active_state != "active" {
            not_running = Some(format!(
                "{} is {} ({})",
                u.unit, u.active_state, u.sub_state
            ));
        }
    }
    if let (None, None, Subject::Machine(machine)) = (&observed.machine, &not_running, subject) {
        not_running = Some(format!("machine {machine} is not registered with machined"));
    }
    not_running
}

/// containerd and kubelet gated this boot and not released by post-start is broken.
fn judge_gate(
    subject: Subject<'_>,
    m: &MachineFacts,
    add: &mut impl FnMut(State, &'static str, String),
) {
    if m.gated && !m.gate_released {
        add(
            State::Broken,
            "gate",
            format!(
                "containerd and kubelet are gated this boot and {} has not released them (a \
                 marker in {} missing {})",
                match subject {
                    Subject::Machine(_) => "post-start".to_owned(),
                    Subject::Host => format!("host post-start ({})", crate::model::host_unit::UNIT),
                },
                gate::MARKER_DIR,
                subject.inside()
            ),
        );
    }
}

/// The installed helper must be a working binary (the next start runs it); a running machine
/// whose CDI hooks run another one (the helper was upgraded since its start) has not picked the
/// upgrade up.
fn judge_helper(
    subject: Subject<'_>,
    h: &HelperFacts,
    m: Option<&MachineFacts>,
    add: &mut impl FnMut(State, &'static str, String),
) {
    if let Some(problem) = &h.problem {
        add(
            State::Broken,
            "helper",
            format!(
                "{problem}: {} next start would fail; reinstall the package (or `install`)",
                match subject {
                    Subject::Machine(_) => "the machine's",
                    Subject::Host => "host mode's",
                }
            ),
        );
        return;
    }
    if let Some(bound) = m.and_then(|m| m.hook_binary)
        && Some(bound) != h.identity
    {
        add(
            State::Drift,
            "helper",
            format!(
                "the machine's CDI hooks run the helper as it was at its start, not the one \
                 installed now at {} (upgraded since)",
                h.path
            ),
        );
    }
}

/// GPUs the config's `gpus` names that the host does not have: broken.
fn judge_missing_gpus(
    missing: &[String],
    require: bool,
    add: &mut impl FnMut(State, &'static str, String),
) {
    if !missing.is_empty() {
        add(
            State::Broken,
            "gpus",
            format!(
                "the config's gpus names GPU(s) the host does not have: {}{}",
                missing.join(", "),
                if require {
                    "; with \"require\" the next start is held back until they appear"
                } else {
                    "; the machine runs with the others"
                }
            ),
        );
    }
}

/// containerd and kubelet in the machine: not loaded or not active is broken.
fn judge_services(
    subject: Subject<'_>,
    services: &[ServiceFacts],
    add: &mut impl FnMut(State, &'static str, String),
) {
    for s in services {
        if s.load_state != "loaded" {
            add(
                State::Broken,
                "services",
                format!("{} is {} {}", s.unit, s.load_state, subject.inside()),
            );
        } else if s.active_state != "active" {
            add(
                State::Broken,
                "services",
                format!(
                    "{} is {} ({}) {}",
                    s.unit,
                    s.active_state,
                    s.sub_state,
                    subject.inside()
                ),
            );
        }
    }
}

/// What post-start run now would change that no finding names yet ([`MachineFacts::pending_changes`]):
/// one finding per part, drift when post-start (or, for the driver root and the helper, a new
/// start) makes it, broken when post-start would fail there. A part a finding already names is
/// not named again, nor is drift that a finding of the host's change explains (another driver
/// version, GPUs, the spec, stale state, the driver root): `reconcile` mends it all at once. So
/// the subject is in sync only when post-start would change nothing.
fn judge_pending(
    subject: Subject<'_>,
    inv: &Inventory,
    m: &MachineFacts,
    findings: &mut Vec<Finding>,
) {
    const EXPLAINING: [&str; 5] = [
        "driver-version",
        "gpus",
        "cdi-spec",
        "stale-nvidia-state",
        "driver-root",
    ];
    let explained = findings.iter().any(|f| EXPLAINING.contains(&f.check));
    let changes = &m.pending_changes;
    let mut checks: Vec<&'static str> = Vec::new();
    for c in changes {
        if !checks.contains(&c.check) {
            checks.push(c.check);
        }
    }
    let post_start = match subject {
        Subject::Machine(_) => "post-start",
        Subject::Host => "host post-start",
    };
    for check in checks {
        let part: Vec<&Change> = changes.iter().filter(|c| c.check == check).collect();
        let failing = part.iter().find(|c| c.action == Action::Fails);
        let links_change = changes.iter().any(|c| c.check == "links");
        if findings.iter().any(|f| f.check == check)
            || (failing.is_none() && (explained || (check == "ld-cache" && links_change)))
        {
            continue;
        }
        let (state, message) = match failing {
            Some(c) => (
                State::Broken,
                format!("{post_start} would fail {}: {}", subject.inside(), c.detail),
            ),
            None if check == "ld-cache" => (
                State::Drift,
                format!(
                    "{}'s /etc/ld.so.cache does not list NVIDIA {}'s libraries ({post_start} runs \
                     ldconfig)",
                    subject.the(),
                    inv.complete_driver().map_or("?", |d| d.version.as_str())
                ),
            ),
            None => {
                let shown: Vec<String> = part.iter().take(3).map(ToString::to_string).collect();
                (
                    State::Drift,
                    format!(
                        "{post_start} would make {} change(s) {}: {}{}",
                        part.len(),
                        subject.inside(),
                        shown.join("; "),
                        if part.len() > 3 { "; …" } else { "" }
                    ),
                )
            }
        };
        findings.push(Finding {
            state,
            check,
            message,
        });
    }
}

/// The one line of a machine in sync: the driver and GPUs, the services, the last post-start.
fn in_sync_summary(
    subject: Subject<'_>,
    mc: &MachineConfig,
    inv: &Inventory,
    observed: &Observed,
) -> String {
    let mut s = format!("{}: in sync: ", subject.name());
    match (&inv.verdict, &inv.kernel_module) {
        (Verdict::Complete, Some(v)) => {
            s.push_str(&format!("NVIDIA {v}, {} GPU(s)", inv.gpus.len()));
        }
        _ if mc.gpus == crate::config::Gpus::None => s.push_str(
            "no NVIDIA GPUs for this machine (gpus: none), no NVIDIA state in the machine",
        ),
        _ => s.push_str(&format!(
            "no NVIDIA GPUs on the host, no NVIDIA state {}",
            subject.inside()
        )),
    }
    if observed.services.is_some() {
        s.push_str(&format!(
            "; {} and {} active",
            mc.containerd_unit, mc.kubelet_unit
        ));
    }
    if let Some(run) = observed
        .unit
        .as_ref()
        .and_then(|u| u.last_post_start.as_ref())
    {
        let at = run.exited_at.as_deref().unwrap_or(&run.started_at);
        s.push_str(&format!("; last post-start succeeded {at}"));
    }
    s
}

/// The one line of a drifted or broken machine: the findings of its state first, then the rest.
fn findings_summary(subject: Subject<'_>, state: State, findings: &[Finding]) -> String {
    let mut msgs: Vec<&str> = findings
        .iter()
        .filter(|f| f.state == state)
        .map(|f| f.message.as_str())
        .collect();
    msgs.extend(
        findings
            .iter()
            .filter(|f| f.state != state)
            .map(|f| f.message.as_str()),
    );
    let hint = if state == State::Drift {
        format!(" (run `{}`)", subject.rewire_command())
    } else {
        String::new()
    };
    format!(
        "{}: {}: {}{hint}",
        subject.name(),
        state.as_str(),
        msgs.join("; ")
    )
}

/// The NVIDIA part of [`evaluate`]: host GPUs and driver against the running machine's spec,
/// driver root and links.
fn judge_nvidia(
    subject: Subject<'_>,
    inv: &Inventory,
    m: &MachineFacts,
    add: &mut impl FnMut(State, &'static str, String),
) {
    let spec = &m.cdi_spec;
    let has_state = spec.state != "missing"
        || !m.driver_root_versions.is_empty()
        || !m.link_versions.is_empty();
    let host_version = match (&inv.verdict, &inv.kernel_module) {
        (Verdict::Complete, Some(v)) => v.as_str(),
        (Verdict::Incomplete { .. }, _) => return,
        _ => return judge_no_host_gpus(subject, m, has_state, add),
    };
    if !has_state {
        add(
            State::Drift,
            "driver-version",
            format!(
                "the host has NVIDIA {host_version} with {} GPU(s) but {} has no NVIDIA state \
                 (it was wired before they appeared)",
                inv.gpus.len(),
                match subject {
                    Subject::Machine(_) => "the machine",
                    Subject::Host => "host mode",
                }
            ),
        );
        return;
    }
    let version_drift = judge_driver_version(subject, host_version, m, add);
    if let Some(why) = m.driver_root_mismatch.as_ref().filter(|_| !version_drift) {
        add(State::Drift, "driver-root", why.clone());
    }
    judge_spec_state(subject, m, add);
    let mut gpu_drift = false;
    if let Some(c) = &spec.checked {
        gpu_drift = judge_spec_gpus(subject, inv, c, add);
        if !version_drift && !gpu_drift && !spec.current {
            add(
                State::Drift,
                "cdi-spec",
                format!(
                    "CDI spec {} differs from what post-start would write for the host now",
                    spec.path
                ),
            );
        }
    }
    if !m.dangling_links.is_empty() {
        // After a driver upgrade, a GPU removal or a host daemon gone (its socket with it) the
        // old links dangle: the host changed, and that is the drift itself. With the host as
        // the machine was wired for, a dangling link is damage.
        let host_changed = version_drift || gpu_drift || (spec.checked.is_some() && !spec.current);
        let state = if host_changed {
            State::Drift
        } else {
            State::Broken
        };
        add(state, "dangling-links", dangling_message(subject, m));
    }
}

/// The machine's dangling NVIDIA links, the first three named.
fn dangling_message(subject: Subject<'_>, m: &MachineFacts) -> String {
    let n = m.dangling_links.len();
    let shown: Vec<&str> = m
        .dangling_links
        .iter()
        .take(3)
        .map(String::as_str)
        .collect();
    format!(
        "{n} NVIDIA link(s) {} dangle: {}{}",
        subject.inside(),
        shown.join(", "),
        if n > 3 { ", …" } else { "" }
    )
}

/// No NVIDIA GPUs on the host: any NVIDIA state left in the machine is stale.
fn judge_no_host_gpus(
    subject: Subject<'_>,
    m: &MachineFacts,
    has_state: bool,
    add: &mut impl FnMut(State, &'static str, String),
) {
    let spec = &m.cdi_spec;
    if has_state {
        let mut what = Vec::new();
        if spec.state != "missing" {
            what.push(format!("CDI spec {}", spec.path));
        }
        if !m.driver_root_versions.is_empty() {
            what.push(format!("driver root {DRIVER_ROOT}"));
        }
        if !m.link_versions.is_empty() {
            what.push("library links".to_owned());
        }
        add(
            State::Drift,
            "stale-nvidia-state",
            format!(
                "the host has no NVIDIA GPUs but {} still has NVIDIA state ({})",
                subject.the(),
                what.join(", ")
            ),
        );
    }
    if !m.dangling_links.is_empty() {
        add(State::Drift, "dangling-links", dangling_message(subject, m));
    }
}

/// One finding per driver version the machine holds other than the host's, naming where it
/// holds it; whether there was any.
fn judge_driver_version(
    subject: Subject<'_>,
    host_version: &str,
    m: &MachineFacts,
    add: &mut impl FnMut(State, &'static str, String),
) -> bool {
    let mut by_version: Vec<(String, Vec<&str>)> = Vec::new();
    for (what, versions) in [
        ("CDI spec", &m.cdi_spec.driver_versions),
        ("driver root", &m.driver_root_versions),
        ("library links", &m.link_versions),
    ] {
        for v in versions.iter().filter(|v| v.as_str() != host_version) {
            match by_version.iter_mut().find(|(x, _)| x == v) {
                Some((_, whats)) => whats.push(what),
                None => by_version.push((v.clone(), vec![what])),
            }
        }
    }
    let version_drift = !by_version.is_empty();
    for (v, whats) in by_version {
        let whats = match whats.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => whats.join(""),
        };
        add(
            State::Drift,
            "driver-version",
            format!(
                "NVIDIA driver changed: host kernel module {host_version}, {}'s {whats} {v}",
                match subject {
                    Subject::Machine(_) => "machine",
                    Subject::Host => "host mode",
                }
            ),
        );
    }
    version_drift
}

/// A CDI spec missing or invalid while the machine is wired for NVIDIA.
fn judge_spec_state(
    subject: Subject<'_>,
    m: &MachineFacts,
    add: &mut impl FnMut(State, &'static str, String),
) {
    let spec = &m.cdi_spec;
    match spec.state {
        "missing" => add(
            State::Broken,
            "cdi-spec",
            format!(
                "CDI spec {} is missing while {} is wired for NVIDIA {}",
                spec.path,
                subject.the(),
                m.driver_root_versions
                    .first()
                    .or(m.link_versions.first())
                    .map_or("?", String::as_str)
            ),
        ),
        "invalid" => add(
            State::Broken,
            "cdi-spec",
            format!(
                "CDI spec {} is invalid: {}",
                spec.path,
                spec.error.as_deref().unwrap_or("?")
            ),
        ),
        _ => {}
    }
}

/// The host's GPUs against the devices of the machine's valid CDI spec; whether they differ.
fn judge_spec_gpus(
    subject: Subject<'_>,
    inv: &Inventory,
    c: &cdi::Checked,
    add: &mut impl FnMut(State, &'static str, String),
) -> bool {
    let mut gpu_drift = false;
    let minor_of = |name: &str| -> Option<Vec<&str>> {
        c.devices
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, nodes)| nodes.iter().map(String::as_str).collect())
    };
    for g in &inv.gpus {
        let node = format!("/dev/nvidia{}", g.minor);
        match minor_of(&g.uuid) {
            None => {
                gpu_drift = true;
                add(
                    State::Drift,
                    "gpus",
                    format!(
                        "GPU {} ({node}) on the host is not in {}'s CDI spec",
                        g.uuid,
                        subject.the()
                    ),
                );
            }
            Some(nodes) if !nodes.contains(&node.as_str()) => {
                gpu_drift = true;
                add(
                    State::Drift,
                    "gpus",
                    format!(
                        "GPU {} is {node} on the host but {} in {}'s CDI spec",
                        g.uuid,
                        nodes.join(", "),
                        subject.the()
                    ),
                );
            }
            Some(_) => {}
        }
    }
    for (name, _) in &c.devices {
        if name.starts_with("GPU-") && !inv.gpus.iter().any(|g| &g.uuid == name) {
            gpu_drift = true;
            add(
                State::Drift,
                "gpus",
                format!(
                    "GPU {name} in {}'s CDI spec is gone from the host",
                    subject.the()
                ),
            );
        }
    }
    gpu_drift
}

/// The last run of `command` (our post-start) among the unit's `ExecStartPost=` (or, for host
/// mode's oneshot, `ExecStart=`) commands.
fn last_post_start(runs: &[ExecRun], command: &str) -> Option<PostStartRun> {
    let run = runs.iter().find(|r| r.command.contains(command))?;
    if run.started_usec == 0 {
        return None;
    }
    // si_code: 1 CLD_EXITED, 2 CLD_KILLED, 3 CLD_DUMPED; 0 while it runs.
    let exited = run.exited_usec != 0 && run.code != 0;
    Some(PostStartRun {
        started_at: utc(run.started_usec),
        exited_at: exited.then(|| utc(run.exited_usec)),
        exit_status: (exited && run.code == 1).then_some(run.status),
        signal: (exited && run.code != 1).then_some(run.status),
        succeeded: exited && run.code == 1 && run.status == 0,
        started_usec: run.started_usec,
        exited_usec: if exited { run.exited_usec } else { 0 },
    })
}

/// µs since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc(usec: u64) -> String {
    let secs = usec / 1_000_000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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
        let root = MachineRoot::open(dir)?;
        return Ok(Observed {
            unit: None,
            machine: Some(inspect_machine(&root, mc, desired, judged)?),
            services: None,
            ..Observed::default()
        });
    }
    if !ctx.host.is_real_root() {
        return Err(crate::error::bad_input(format!(
            "status of {machine} with --host-root {} needs --machine-root DIR: the running \
             machine is only reachable through the host's systemd",
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
    if run.unit.active_state != "active"
        || host.machine_leader(machine.as_str(), deadline)?.is_none()
    {
        return Ok(Observed {
            unit: Some(unit),
            machine: None,
            services: None,
            ..Observed::default()
        });
    }
    let handle = MachineHandle::find(&host, machine.as_str(), deadline)?;
    let facts = inspect_machine(handle.root(), mc, desired, judged)?;
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
pub fn installed_machines(ctx: &Ctx) -> Result<Vec<MachineName>> {
    let mut out = Vec::new();
    let entries = match ctx.host.read_dir(units::UNIT_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("listing {}", ctx.host.path(units::UNIT_DIR).display()));
        }
    };
    for (name, _) in entries {
        let Some(m) = name.to_str().and_then(units::dropin_dir_machine) else {
            continue;
        };
        if let Ok(m) = m.parse::<MachineName>()
            && installed(ctx, &m)
        {
            out.push(m);
        }
    }
    out.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    Ok(out)
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
    let desired = Desired::of(
        Target::Machine,
        &ctx.host,
        inv,
        &mc,
        ctx.config.helper_path().as_str(),
    )
    .with_context(|| format!("status of {machine}"))?;
    let mut observed = observe(ctx, inv, machine, &mc, &desired, machine_root)
        .with_context(|| format!("status of {machine}"))?;
    observed.missing_gpus = a.missing.iter().map(ToString::to_string).collect();
    observed.helper = Some(desired.helper.clone());
    observed.next_start = crate::model::render::as_pre_start(ctx, machine, host_inv)
        .err()
        .map(|e| (crate::error::exit_code(&e), format!("{e:#}")));
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
    let judged = (|| {
        let machines = selected_machines(ctx, machine, all)?;
        let inv = discovery::discover(&ctx.host)?;
        machines
            .iter()
            .map(|m| machine_status(ctx, &inv, m, machine_root))
            .collect::<Result<Vec<Status>>>()
    })();
    let out = match judged {
        Ok(out) => out,
        Err(e) if json => return Err(print_unjudged(machine.map(MachineName::as_str), e)),
        Err(e) => return Err(e),
    };
    let state = out
        .iter()
        .map(|s| s.state)
        .max()
        .unwrap_or(State::NothingInstalled);
    print_status(out, state, all, json)?;
    Ok(state.exit_code())
}

/// `status --json` when it could not judge (not installed, host discovery failed, the bus did
/// not answer): still one object, for monitoring to parse, with the exit code the command exits
/// with and the error it also prints on stderr.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Unjudged {
    api_version: &'static str,
    kind: &'static str,
    machine: Option<String>,
    state: &'static str,
    exit_code: u8,
    error: String,
}

/// Print `status --json`'s object for an error `e` (see [`Unjudged`]) and return `e`.
pub fn print_unjudged(machine: Option<&str>, e: anyhow::Error) -> anyhow::Error {
    let printed = print_json(&Unjudged {
        api_version: API_VERSION,
        kind: "StatusError",
        machine: machine.map(ToString::to_string),
        state: "unknown",
        exit_code: crate::error::exit_code(&e),
        error: format!("{e:#}"),
    });
    match printed {
        Ok(()) => e,
        Err(p) => e.context(format!("{p:#}")),
    }
}

fn print_json(v: &impl Serialize) -> Result<()> {
    use std::io::Write as _;
    let text = serde_json::to_string_pretty(v).context("serializing the status")?;
    writeln!(std::io::stdout().lock(), "{text}").context("writing to stdout")
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
pub fn now_seconds() -> f64 {
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
fn print_status(out: Vec<Status>, state: State, all: bool, json: bool) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    use std::io::Write as _;
    if json {
        drop(stdout);
        if all {
            print_json(&AllStatus {
                api_version: API_VERSION,
                kind: "MachineStatusList",
                state,
                exit_code: state.exit_code(),
                machines: out,
            })?;
        } else {
            print_json(&out[0])?;
        }
    } else {
        if all && out.is_empty() {
            writeln!(stdout, "no installed machines").context("writing to stdout")?;
        }
        for s in &out {
            writeln!(stdout, "{}", s.summary).context("writing to stdout")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
