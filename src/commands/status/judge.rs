//! `status`'s verdict: what was read, judged purely ([`evaluate`]), so every case is a unit
//! test.

use super::{
    API_VERSION, Finding, GpuFacts, HostFacts, KIND, MachineFacts, Observed, ServiceFacts, State,
    Status,
};
use crate::config::MachineConfig;
use crate::discovery::{Inventory, Verdict};
use crate::model::cdi;
use crate::model::gate;
use crate::model::helper::HelperFacts;
use crate::model::layout::DRIVER_ROOT;
use crate::model::{Action, Change, Check};

/// Whose GPU wiring is judged: a machine, or the host itself (host mode, `host status`): how
/// status names it.
pub use crate::types::machine_name::Subject;

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
                format!("nspawn-lifecycle-helper reconcile {m}")
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
    let mut add = |state: State, check: Check, message: String| {
        findings.push(Finding {
            state,
            check,
            message,
        });
    };
    if let Verdict::Incomplete { reasons } = &inv.verdict {
        add(
            State::Broken,
            Check::HostDriver,
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
            Check::NextStart,
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
    Status {
        api_version: API_VERSION,
        kind: KIND,
        machine: subject.name(),
        state,
        exit_code: state.exit_code(),
        summary,
        host: host_facts(inv),
        unit: observed.unit,
        running: observed.machine.is_some(),
        machine_facts: observed.machine,
        services: observed.services,
        findings,
        assignment: None,
        judged_by: crate::build_info::this(),
    }
}

/// What `status` shows of the host: the verdict, the kernel module, the GPUs.
pub(super) fn host_facts(inv: &Inventory) -> HostFacts {
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
pub(super) fn judge_unit(
    subject: Subject<'_>,
    observed: &Observed,
    add: &mut impl FnMut(State, Check, String),
) -> Option<String> {
    let mut not_running = None;
    if let Some(u) = &observed.unit {
        if let Some(run) = &u.last_post_start
            && !run.succeeded
            && run.exited_at.is_some()
        {
            add(
                State::Broken,
                Check::PostStart,
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
                Check::Unit,
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
pub(super) fn judge_gate(
    subject: Subject<'_>,
    m: &MachineFacts,
    add: &mut impl FnMut(State, Check, String),
) {
    if m.gated && !m.gate_released {
        add(
            State::Broken,
            Check::Gate,
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
pub(super) fn judge_helper(
    subject: Subject<'_>,
    h: &HelperFacts,
    m: Option<&MachineFacts>,
    add: &mut impl FnMut(State, Check, String),
) {
    if let Some(problem) = &h.problem {
        add(
            State::Broken,
            Check::Helper,
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
            Check::Helper,
            format!(
                "the machine's CDI hooks run the helper as it was at its start, not the one \
                 installed now at {} (upgraded since)",
                h.path
            ),
        );
    }
}

/// GPUs the config's `gpus` names that the host does not have: broken.
pub(super) fn judge_missing_gpus(
    missing: &[String],
    require: bool,
    add: &mut impl FnMut(State, Check, String),
) {
    if !missing.is_empty() {
        add(
            State::Broken,
            Check::Gpus,
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
pub(super) fn judge_services(
    subject: Subject<'_>,
    services: &[ServiceFacts],
    add: &mut impl FnMut(State, Check, String),
) {
    for s in services {
        if s.load_state != "loaded" {
            add(
                State::Broken,
                Check::Services,
                format!("{} is {} {}", s.unit, s.load_state, subject.inside()),
            );
        } else if s.active_state != "active" {
            add(
                State::Broken,
                Check::Services,
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
pub(super) fn judge_pending(
    subject: Subject<'_>,
    inv: &Inventory,
    m: &MachineFacts,
    findings: &mut Vec<Finding>,
) {
    const EXPLAINING: [Check; 5] = [
        Check::DriverVersion,
        Check::Gpus,
        Check::CdiSpec,
        Check::StaleNvidiaState,
        Check::DriverRoot,
    ];
    let explained = findings.iter().any(|f| EXPLAINING.contains(&f.check));
    let changes = &m.pending_changes;
    let mut checks: Vec<Check> = Vec::new();
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
        let failing = part
            .iter()
            .find(|c| matches!(c.action, Action::Fails | Action::Install | Action::Keep));
        let links_change = changes.iter().any(|c| c.check == Check::Links);
        if findings.iter().any(|f| f.check == check)
            || (failing.is_none() && (explained || (check == Check::LdCache && links_change)))
        {
            continue;
        }
        let (state, message) = match failing {
            Some(c) if c.action == Action::Install => (
                State::Broken,
                format!(
                    "{} {}: the next start runs what it names; run \
                     `nspawn-lifecycle-helper install {}`",
                    c.path,
                    c.detail,
                    match subject {
                        Subject::Machine(m) => m.to_string(),
                        Subject::Host => "--host".to_owned(),
                    }
                ),
            ),
            Some(c) if c.action == Action::Keep => (
                State::Broken,
                format!(
                    "{} {}: {}; {post_start} keeps it: remove it or make it a spec CDI consumers \
                     can read",
                    c.path,
                    subject.inside(),
                    c.detail
                ),
            ),
            Some(c) if c.check == Check::HostDevices => (
                State::Broken,
                format!("{} {}: {}", c.path, subject.inside(), c.detail),
            ),
            Some(c) => (
                State::Broken,
                format!("{post_start} would fail {}: {}", subject.inside(), c.detail),
            ),
            None if check == Check::LdCache => (
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
pub(super) fn in_sync_summary(
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
pub(super) fn findings_summary(subject: Subject<'_>, state: State, findings: &[Finding]) -> String {
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
pub(super) fn judge_nvidia(
    subject: Subject<'_>,
    inv: &Inventory,
    m: &MachineFacts,
    add: &mut impl FnMut(State, Check, String),
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
            Check::DriverVersion,
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
        add(State::Drift, Check::DriverRoot, why.clone());
    }
    judge_spec_state(subject, m, add);
    let mut gpu_drift = false;
    if let Some(c) = &spec.checked {
        gpu_drift = judge_spec_gpus(subject, inv, c, add);
        if !version_drift && !gpu_drift && !spec.current {
            add(
                State::Drift,
                Check::CdiSpec,
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
        add(state, Check::DanglingLinks, dangling_message(subject, m));
    }
}

/// The machine's dangling NVIDIA links, the first three named.
pub(super) fn dangling_message(subject: Subject<'_>, m: &MachineFacts) -> String {
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
pub(super) fn judge_no_host_gpus(
    subject: Subject<'_>,
    m: &MachineFacts,
    has_state: bool,
    add: &mut impl FnMut(State, Check, String),
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
            Check::StaleNvidiaState,
            format!(
                "the host has no NVIDIA GPUs but {} still has NVIDIA state ({})",
                subject.the(),
                what.join(", ")
            ),
        );
    }
    if !m.dangling_links.is_empty() {
        add(
            State::Drift,
            Check::DanglingLinks,
            dangling_message(subject, m),
        );
    }
}

/// One finding per driver version the machine holds other than the host's, naming where it
/// holds it; whether there was any.
pub(super) fn judge_driver_version(
    subject: Subject<'_>,
    host_version: &str,
    m: &MachineFacts,
    add: &mut impl FnMut(State, Check, String),
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
            Check::DriverVersion,
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
pub(super) fn judge_spec_state(
    subject: Subject<'_>,
    m: &MachineFacts,
    add: &mut impl FnMut(State, Check, String),
) {
    let spec = &m.cdi_spec;
    match spec.state {
        "missing" => add(
            State::Broken,
            Check::CdiSpec,
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
            Check::CdiSpec,
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
pub(super) fn judge_spec_gpus(
    subject: Subject<'_>,
    inv: &Inventory,
    c: &cdi::Checked,
    add: &mut impl FnMut(State, Check, String),
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
                    Check::Gpus,
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
                    Check::Gpus,
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
                Check::Gpus,
                format!(
                    "GPU {name} in {}'s CDI spec is gone from the host",
                    subject.the()
                ),
            );
        }
    }
    gpu_drift
}
