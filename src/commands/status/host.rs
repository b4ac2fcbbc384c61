//! `host status`: host mode's wiring judged the way a machine's is ([`super::evaluate`] with
//! [`Subject::Host`]). The host's discovery now against what `host post-start` left on the host:
//! the CDI spec in the host's CDI directory (what it would write now), our `/dev/char` links,
//! the host's `ld.so.cache` (it must list the driver, or containers of the host's runtime that
//! use its loader miss it), the host's unit gate for containerd and kubelet, the last run of
//! `nspawn-lifecycle-host.service`, both services, and the installed helper the spec's hooks
//! run. Reads only, like `status`; the same states and exit codes. Under `--host-root` no systemd
//! is asked: the files alone are judged.

#[cfg(test)]
use super::MachineFacts;
use super::{
    Observed, ServiceFacts, State, Status, Subject, UnitFacts, evaluate, inspect_dev_char,
    inspect_spec, judged_changes, last_post_start, print_status, print_unjudged,
};
use crate::Ctx;
use crate::apply::parts;
use crate::config::MachineConfig;
use crate::discovery::{self, Inventory};
use crate::fs::machine_root::MachineRoot;
use crate::model::Desired;
use crate::model::host_unit;
use crate::systemd::Systemd;
use anyhow::{Context as _, Result};
use std::time::Instant;

/// `kind` of `host status --json`: a [`Status`] whose `machine` is `host`.
pub const KIND: &str = "HostStatus";

/// `host status`: judge host mode, print the summary line (or the JSON object), return the exit
/// code (0, 5, 6 or 7).
pub fn host_status(ctx: &Ctx, json: bool) -> Result<u8> {
    let judged = require_installed(ctx)
        .and_then(|()| discovery::discover(&ctx.host))
        .and_then(|inv| judge(ctx, &inv));
    let status = match judged {
        Ok(s) => s,
        Err(e) if json => return Err(print_unjudged(Some("host"), e)),
        Err(e) => return Err(e),
    };
    let state: State = status.state;
    print_status(
        vec![status],
        Vec::new(),
        state,
        state.exit_code(),
        false,
        json,
    )?;
    Ok(state.exit_code())
}

/// Whether host mode is installed: its unit is on the host.
pub fn installed(ctx: &Ctx) -> bool {
    ctx.host.is_file(host_unit::unit_path())
}

/// Exit 2 unless host mode is installed.
fn require_installed(ctx: &Ctx) -> Result<()> {
    if installed(ctx) {
        return Ok(());
    }
    Err(crate::error::bad_input(format!(
        "host mode is not installed: no {} on the host (see `install --host`)",
        host_unit::unit_path()
    )))
}

/// Gather and judge an installed host mode against the host as `inv` found it (also for the
/// metrics, [`super::report`], which has discovered the host already).
pub fn judge(ctx: &Ctx, inv: &Inventory) -> Result<Status> {
    let hc = ctx.config.host()?;
    let observed = observe(ctx, &hc, inv).context("host status")?;
    let mut status = evaluate(Subject::Host, &hc, inv, observed);
    status.kind = KIND;
    Ok(status)
}

/// What `host post-start` left on the host, and (on the real host) its unit and both services.
fn observe(ctx: &Ctx, hc: &MachineConfig, inv: &Inventory) -> Result<Observed> {
    let desired = Desired::host(&ctx.host, inv, hc, ctx.config.helper_path())?;
    let root = MachineRoot::open(ctx.host.root())?;
    let judged = !matches!(inv.verdict, crate::discovery::Verdict::Incomplete { .. });
    // Read once: the changes are judged from it, the gate quoted from it.
    let at = parts::At {
        target: &root,
        host: &ctx.host,
        desired: &desired,
    };
    let seen = parts::observe(&at);
    let (gated, gate_released) = parts::gate::summary_of(&seen)?;
    let mut facts = super::MachineFacts {
        cdi_spec: inspect_spec(&root, hc, desired.spec.bytes.as_deref())?,
        driver_root_versions: Vec::new(),
        link_versions: Vec::new(),
        dangling_links: Vec::new(),
        gated,
        gate_released,
        driver_root_mismatch: None,
        hook_binary: None,
        pending_changes: judged_changes(&seen, &at, judged),
    };
    inspect_dev_char(&root, &mut facts.dangling_links)?;
    let (unit, services) = if ctx.host.is_real_root() {
        let (u, s) = ask_systemd(hc)?;
        (Some(u), Some(s))
    } else {
        (None, None)
    };
    Ok(Observed {
        unit,
        machine: Some(facts),
        services,
        // Read once, for the model: the same facts its helper part judged.
        helper: Some(desired.helper),
        ..Observed::default()
    })
}

/// Host mode's unit and its last `host post-start`, and the host's containerd and kubelet.
fn ask_systemd(hc: &MachineConfig) -> Result<(UnitFacts, Vec<ServiceFacts>)> {
    let deadline = Instant::now() + super::BUS_TIMEOUT;
    let sd = Systemd::host(deadline)?;
    let run = sd.service_run(host_unit::UNIT, deadline)?;
    let unit = UnitFacts {
        unit: host_unit::UNIT.to_owned(),
        active_state: run.unit.active_state.clone(),
        sub_state: run.unit.sub_state.clone(),
        result: run.result.clone(),
        invocation_id: run.unit.invocation_id.clone(),
        last_post_start: last_post_start(&run.exec_start, host_unit::HOST_POST_START_ARGS),
    };
    Ok((unit, super::services(&sd, hc, deadline)?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The host's cache lacking the driver is drift, fixed by the host unit's restart.
    #[test]
    fn a_host_cache_without_the_driver_is_drift_naming_the_host_unit() {
        let hc = crate::config::Config::default().host().unwrap();
        let inv = Inventory {
            devices: Vec::new(),
            kvm: None,
            host_devices: Vec::new(),
            disks: Vec::new(),
            gpus: Vec::new(),
            kernel_module: None,
            driver: None,
            verdict: crate::discovery::Verdict::None,
        };
        let s = evaluate(
            Subject::Host,
            &hc,
            &inv,
            Observed {
                machine: Some(MachineFacts {
                    pending_changes: vec![crate::model::Change {
                        check: crate::model::Check::LdCache,
                        action: crate::model::Action::Run,
                        path: "ldconfig".into(),
                        detail: "/etc/ld.so.cache does not list the driver's libraries".into(),
                    }],
                    ..MachineFacts::bare()
                }),
                ..Observed::default()
            },
        );
        assert_eq!(s.state, State::Drift, "{s:#?}");
        assert!(
            s.summary
                .starts_with("host: drift: the host's /etc/ld.so.cache")
                && s.summary
                    .ends_with("(run `systemctl restart nspawn-lifecycle-host.service`)"),
            "{}",
            s.summary
        );
    }
}
