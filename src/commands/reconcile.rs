//! `nspawn-lifecycle reconcile <MACHINE>`: restart `systemd-nspawn@<MACHINE>.service` through the
//! host's systemd and wait, so pre-start and post-start run again (a "mini repave").
//!
//! It never takes the machine lock: the restart it asks for runs pre-start and post-start, which
//! take that lock themselves, so holding it here would deadlock the very restart we wait for.

use crate::Ctx;
use crate::config::MachineConfig;
use crate::error::{Kind, bad_input};
use crate::systemd::{Systemd, UnitState};
use crate::types::machine_name::MachineName;
use crate::types::units::{dropin_path, unit_name};
use anyhow::{Result, anyhow};
use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant, SystemTime};

/// Margin on top of the unit's own stop and start timeouts before reconcile gives up.
const MARGIN: Duration = Duration::from_secs(15);

/// The command that shows the unit's log from `since` on.
pub fn journal_command(machine: &MachineName, since: SystemTime) -> String {
    let secs = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "journalctl -u {} --since @{secs} --no-pager",
        unit_name(machine)
    )
}

/// What reconcile does to the unit as it found it: a plain value, decided before anything runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartPlan {
    pub unit: String,
    /// The unit is failed: reset it before the restart.
    pub reset_failed: bool,
    /// The machine's leader before the restart, if it was running.
    pub old_leader: Option<u32>,
    /// The unit's InvocationID before the restart; a restart changes it.
    pub old_invocation: String,
    /// How long the restart may take ([`restart_budget`]).
    pub budget: Duration,
}

impl std::fmt::Display for RestartPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "restarting (giving up after {}s)", self.budget.as_secs())
    }
}

/// Restart the machine's unit, wait, and report old and new leader: check it can be restarted,
/// read the unit ([`plan_restart`]), then restart and verify ([`execute`]).
pub fn reconcile(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = check_restartable(ctx, machine)?;
    let started = Instant::now();
    let journal = journal_command(machine, SystemTime::now());
    let host = Systemd::host(Instant::now() + mc.job_timeout)?;
    let plan = plan_restart(&host, machine, &mc)?;
    execute(&host, machine, &mc, &plan, &journal, started)
}

/// The machine's configuration, once it is installed, this is the real host (exit 2 if not) and
/// pre-start would start it again. A restart pre-start refuses for a reason only a person can
/// fix (configuration, install, a foreign `.nspawn` file) would only take the machine down, so
/// it is refused with pre-start's message and exit code and nothing restarts. NVIDIA state that
/// is incomplete is the one refusal that passes by itself: the restart goes ahead, pre-start
/// refuses it with exit 3 and systemd retries until the driver install finishes.
fn check_restartable(ctx: &Ctx, machine: &MachineName) -> Result<MachineConfig> {
    if !ctx.host.is_file(dropin_path(machine)) {
        return Err(bad_input(format!(
            "machine {machine} is not installed: {} does not exist; run \
             `nspawn-lifecycle-helper install {machine}` first",
            ctx.host.path(dropin_path(machine)).display()
        )));
    }
    if !ctx.host.is_real_root() {
        return Err(bad_input(format!(
            "reconcile restarts {} through the host's systemd; it cannot run with --host-root {}",
            unit_name(machine),
            ctx.host.root().display()
        )));
    }
    match crate::discovery::discover(&ctx.host)
        .and_then(|inv| crate::model::render::as_pre_start(ctx, machine, &inv))
    {
        Ok((mc, _)) => Ok(mc),
        Err(e) if crate::error::kind(&e) == Some(Kind::DriverIncomplete) => {
            tracing::warn!(%machine, "pre-start will refuse the start until the NVIDIA driver \
                install finishes (systemd retries it): {e:#}");
            ctx.config.machine(&ctx.host, machine)
        }
        Err(e) => Err(e.context(format!(
            "reconcile would stop {machine} and pre-start would refuse to start it again; \
             nothing was restarted"
        ))),
    }
}

/// Read the unit as it is now and decide the restart: refused when the unit cannot load.
fn plan_restart(host: &Systemd, machine: &MachineName, mc: &MachineConfig) -> Result<RestartPlan> {
    let unit = unit_name(machine);
    let step = || Instant::now() + mc.job_timeout;
    let before = host.unit_state(&unit, step())?;
    if before.load_state != "loaded" {
        return Err(anyhow!(
            "{unit} is not loadable (LoadState {}); is systemd-container installed on this host?",
            before.load_state
        ));
    }
    let old_leader = host.machine_leader(machine, step())?;
    let service = host.service_state(&unit, step())?;
    Ok(RestartPlan {
        unit,
        reset_failed: before.active_state == "failed",
        old_leader,
        old_invocation: before.invocation_id,
        budget: restart_budget(service.timeout_stop, service.timeout_start, mc),
    })
}

/// Carry out `plan`: reset, restart with progress on a terminal, then check the unit really
/// restarted (active, a new InvocationID, a machine registered) and print the change.
fn execute(
    host: &Systemd,
    machine: &MachineName,
    mc: &MachineConfig,
    plan: &RestartPlan,
    journal: &str,
    started: Instant,
) -> Result<()> {
    let unit = &plan.unit;
    let step = || Instant::now() + mc.job_timeout;
    if plan.reset_failed {
        tracing::info!(%unit, "unit is failed; resetting it before the restart");
        host.reset_failed_unit(unit, step())?;
    }
    tracing::info!(%unit, old_leader = ?plan.old_leader, "{plan}");
    let mut progress = Progress::new(unit);
    let restarted = host.restart_unit(
        unit,
        Instant::now() + plan.budget,
        progress
            .enabled()
            .then_some(&mut |st: &UnitState, waited: Duration| {
                progress.show(st, waited);
            }),
    );
    progress.clear();
    let failed = |why: anyhow::Error| failure(host, unit, journal, why, mc);
    if let Err(e) = restarted {
        return Err(failed(e));
    }
    let after = host.unit_state(unit, step())?;
    if after.active_state != "active" {
        return Err(failed(anyhow!(
            "the restart job finished but the unit is {}/{}",
            after.active_state,
            after.sub_state
        )));
    }
    if after.invocation_id.is_empty() || after.invocation_id == plan.old_invocation {
        return Err(failed(anyhow!(
            "the unit is active but its InvocationID did not change ({}), so it was not restarted",
            short(&after.invocation_id)
        )));
    }
    let Some(new_leader) = host.machine_leader(machine, step())? else {
        return Err(failed(anyhow!(
            "the unit is active but machine {machine} is not registered with systemd-machined"
        )));
    };
    let old = plan
        .old_leader
        .map_or_else(|| "none (was not running)".to_owned(), |p| p.to_string());
    crate::output::print_all(&format!(
        "{unit} restarted in {:.1}s: leader PID {old} -> {new_leader}, invocation {} -> {}\n",
        started.elapsed().as_secs_f64(),
        short(&plan.old_invocation),
        short(&after.invocation_id),
    ))
}

/// How long the restart may take: systemd's own stop and start timeouts for the unit (which
/// include pre-start and post-start), plus a margin. Where a timeout is infinite, what the
/// hooks may take by our own configuration stands in for it.
pub fn restart_budget(
    stop: Option<Duration>,
    start: Option<Duration>,
    mc: &MachineConfig,
) -> Duration {
    let hooks = 2 * mc.lock_timeout + mc.boot_timeout + 6 * mc.job_timeout + mc.import_budget;
    stop.unwrap_or(mc.job_timeout) + start.unwrap_or(hooks) + MARGIN
}

/// Turn a failed restart into the operator's error: the unit's Result and where to look.
fn failure(
    host: &Systemd,
    unit: &str,
    journal: &str,
    why: anyhow::Error,
    mc: &MachineConfig,
) -> anyhow::Error {
    let by = Instant::now() + mc.job_timeout.min(Duration::from_secs(10));
    let detail = match (host.unit_state(unit, by), host.service_state(unit, by)) {
        (Ok(u), Ok(s)) => {
            let retry = if u.sub_state == "auto-restart" || u.active_state == "activating" {
                format!(
                    "; systemd is retrying on its own (Restart=, NRestarts={})",
                    s.n_restarts
                )
            } else {
                String::new()
            };
            format!(
                "unit Result '{}', now {}/{}{retry}",
                s.result, u.active_state, u.sub_state
            )
        }
        (Err(e), _) | (_, Err(e)) => format!("its state could not be read ({e:#})"),
    };
    why.context(format!(
        "reconcile of {unit} failed: {detail}; see `{journal}`"
    ))
}

fn short(id: &str) -> String {
    if id.is_empty() {
        "none".into()
    } else {
        id.chars().take(12).collect()
    }
}

/// One self-rewriting status line on stderr while the restart runs, only on a terminal.
struct Progress {
    unit: String,
    tty: bool,
    shown: bool,
}

impl Progress {
    fn new(unit: &str) -> Progress {
        Progress {
            unit: unit.to_owned(),
            tty: std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    fn enabled(&self) -> bool {
        self.tty
    }

    fn show(&mut self, st: &UnitState, waited: Duration) {
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[K{}: {} ({}) {:.1}s",
            self.unit,
            st.active_state,
            phase(&st.sub_state),
            waited.as_secs_f64()
        );
        let _ = err.flush();
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
            self.shown = false;
        }
    }
}

/// The sub-state in the hook vocabulary an operator knows.
fn phase(sub_state: &str) -> &str {
    match sub_state {
        "start-pre" => "start-pre: pre-start hook",
        "start" => "start: machine booting",
        "start-post" => "start-post: post-start hook",
        "stop-sigterm" | "stop" | "stop-post" | "final-sigterm" | "final-sigkill" => {
            "stopping the old machine"
        }
        "auto-restart" => "auto-restart: waiting to retry",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::error::exit_code;
    use crate::fs::host::HostRoot;

    fn m(s: &str) -> MachineName {
        s.parse().unwrap()
    }

    fn ctx(root: &std::path::Path) -> Ctx {
        let host = HostRoot::new(root);
        Ctx {
            config: Config::load(&host, None).unwrap(),
            host,
        }
    }

    #[test]
    fn paths_and_journal_command_are_exact() {
        assert_eq!(unit_name(&m("kube1")), "systemd-nspawn@kube1.service");
        assert_eq!(
            dropin_path(&m("kube1")),
            "/etc/systemd/system/systemd-nspawn@kube1.service.d/50-nspawn-lifecycle.conf"
        );
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_680_000);
        assert_eq!(
            journal_command(&m("kube1"), t),
            "journalctl -u systemd-nspawn@kube1.service --since @1764680000 --no-pager"
        );
    }

    #[test]
    fn a_machine_without_our_dropin_is_refused_with_exit_2() {
        let dir = tempfile::tempdir().unwrap();
        let err = reconcile(&ctx(dir.path()), &m("kube1")).unwrap_err();
        assert_eq!(exit_code(&err), 2);
        let msg = format!("{err:#}");
        assert!(msg.contains("not installed"), "{msg}");
        assert!(msg.contains("50-nspawn-lifecycle.conf"), "{msg}");
        assert!(
            msg.contains("nspawn-lifecycle-helper install kube1"),
            "{msg}"
        );
    }

    #[test]
    fn an_installed_machine_under_a_fake_root_is_not_restarted() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir
            .path()
            .join("etc/systemd/system/systemd-nspawn@kube1.service.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(crate::types::units::DROPIN_NAME), "[Service]\n").unwrap();
        let err = reconcile(&ctx(dir.path()), &m("kube1")).unwrap_err();
        assert_eq!(exit_code(&err), 2);
        assert!(format!("{err:#}").contains("--host-root"), "{err:#}");
    }

    #[test]
    fn budget_uses_unit_timeouts_and_falls_back_to_config() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        let mc = c.config.machine(&c.host, &m("kube1")).unwrap();
        let s = Duration::from_secs;
        assert_eq!(restart_budget(Some(s(90)), Some(s(90)), &mc), s(195));
        // Infinite start timeout: 2 locks (240) + boot (60) + 6 jobs (540) + the import budget
        // (600).
        assert_eq!(restart_budget(Some(s(90)), None, &mc), s(90 + 1440 + 15));
    }

    #[test]
    fn the_plan_reads_as_its_log_line() {
        let plan = RestartPlan {
            unit: unit_name(&m("kube1")),
            reset_failed: true,
            old_leader: Some(42),
            old_invocation: "0123456789abcdef".into(),
            budget: Duration::from_secs(195),
        };
        assert_eq!(plan.to_string(), "restarting (giving up after 195s)");
    }

    #[test]
    fn phases_read_in_hook_terms() {
        assert_eq!(phase("start-pre"), "start-pre: pre-start hook");
        assert_eq!(phase("start-post"), "start-post: post-start hook");
        assert_eq!(phase("running"), "running");
    }
}
