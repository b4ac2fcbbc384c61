//! The commands, one module each, and the dispatch from a parsed command line to them.

pub(crate) mod discover;
pub(crate) mod install;
pub(crate) mod manual;
pub(crate) mod plan;
pub mod post_start;
pub mod pre_start;
pub(crate) mod reconcile;
pub mod status;

use crate::Ctx;
use crate::cli::{Cli, Command, HostCommand, Phase, StatusFormat};
use anyhow::Result;

/// Run one parsed command line and give the process exit code on success: 0, or for `status`
/// the machine state's code (5 drift, 6 broken, 7 not running, 8 nothing installed), for
/// `discover --exit-code` 3 on an incomplete verdict, for `plan --exit-code` 9 when pre-start
/// would change the file.
pub fn run_with_code(cli: Cli) -> Result<u8> {
    let json_error = json_error_kind(&cli.command);
    run_with_code_inner(cli).map_err(|e| print_json_error(json_error, e))
}

/// `e`, a failure of `command` before it ran (a bad `NSPAWN_LIFECYCLE_LOG`), printed as the one
/// JSON object a `--json` command prints when it fails; returned as it was.
pub fn json_failure(command: &Command, e: anyhow::Error) -> anyhow::Error {
    let json_error = json_error_kind(command).or_else(|| match command {
        Command::Status {
            machine,
            json: true,
            ..
        } => Some(("StatusError", machine.as_ref().map(ToString::to_string))),
        Command::Host(HostCommand::Status { json: true }) => {
            Some(("StatusError", Some("host".to_owned())))
        }
        _ => None,
    });
    print_json_error(json_error, e)
}

fn print_json_error(
    json_error: Option<(&'static str, Option<String>)>,
    e: anyhow::Error,
) -> anyhow::Error {
    match json_error {
        // A report printed before the error (host plan's, install's before a failed reload) is
        // the one JSON document.
        Some((kind, subject)) if !crate::output::printed() => {
            let state = (kind == "StatusError").then_some("unknown");
            crate::output::print_error_object(kind, subject.as_deref(), state, e)
        }
        _ => e,
    }
}

/// With `--json`, a command that fails still prints one JSON object for a script to parse
/// (`assets/json-schema/command-error.schema.json`): its kind (`PlanError`, …), the machine (or
/// `host`), the exit code the command exits with, and the error, which also goes to stderr.
/// `status` has its own (`StatusError`, with its state).
fn json_error_kind(command: &Command) -> Option<(&'static str, Option<String>)> {
    let subject = |machine: &Option<crate::types::machine_name::MachineName>, host: bool| {
        if host {
            Some("host".to_owned())
        } else {
            machine.as_ref().map(ToString::to_string)
        }
    };
    match command {
        Command::Discover { json: true, .. } => Some(("DiscoverError", None)),
        Command::Plan {
            machine,
            json: true,
            ..
        } => Some(("PlanError", Some(machine.to_string()))),
        Command::Host(HostCommand::Plan { json: true }) => {
            Some(("PlanError", Some("host".to_owned())))
        }
        Command::Install {
            machine,
            host,
            json: true,
            ..
        } => Some(("InstallError", subject(machine, *host))),
        Command::Uninstall {
            machine,
            host,
            json: true,
            ..
        } => Some(("UninstallError", subject(machine, *host))),
        _ => None,
    }
}

fn run_with_code_inner(cli: Cli) -> Result<u8> {
    match &cli.command {
        Command::Status {
            machine,
            all,
            json,
            format,
            testkit,
        } => {
            let machine_root = testkit.machine_root();
            let format = match format {
                Some(f) => *f,
                None if *json => StatusFormat::Json,
                None => StatusFormat::Text,
            };
            if format == StatusFormat::Prometheus {
                let (report, code) = monitor(&cli, machine.as_ref(), *all, machine_root);
                crate::output::print_all(&status::metrics::render(&report))?;
                return Ok(code);
            }
            let json = format == StatusFormat::Json;
            let ctx = match load(&cli) {
                Ok(ctx) => ctx,
                Err(e) if json => {
                    return Err(status::print_unjudged(
                        machine
                            .as_ref()
                            .map(crate::types::machine_name::MachineName::as_str),
                        e,
                    ));
                }
                Err(e) => return Err(e),
            };
            status::status(&ctx, machine.as_ref(), *all, json, machine_root)
        }
        Command::Host(HostCommand::Status { json }) => {
            let ctx = match load(&cli) {
                Ok(ctx) => ctx,
                Err(e) if *json => return Err(status::print_unjudged(Some("host"), e)),
                Err(e) => return Err(e),
            };
            status::host::host_status(&ctx, *json)
        }
        Command::Metrics { textfile_dir } => {
            let host = crate::fs::host::HostRoot::open(&cli.host_root)?;
            let (report, _) = monitor(&cli, None, true, None);
            status::metrics::write_textfile(
                &host,
                textfile_dir,
                &status::metrics::render(&report),
            )?;
            Ok(0)
        }
        Command::Discover { json, exit_code } => {
            let ctx = load(&cli)?;
            let complete = discover::discover(&ctx, *json)?;
            Ok(if *exit_code && !complete { 3 } else { 0 })
        }
        Command::Plan {
            machine,
            exit_code,
            json,
        } => {
            let ctx = load(&cli)?;
            let current = plan::plan(&ctx, machine, *json)?;
            Ok(if *exit_code && !current { 9 } else { 0 })
        }
        _ => run(cli).map(|()| 0),
    }
}

/// The host tree and configuration the command line names.
fn load(cli: &Cli) -> Result<Ctx> {
    Ctx::load(&cli.host_root, cli.config.as_deref())
}

/// `status` for monitoring: the report, never an error (a configuration that does not load is
/// one of its errors), and the exit code: the worst state's, or 1 when something could not be
/// judged.
fn monitor(
    cli: &Cli,
    machine: Option<&crate::types::machine_name::MachineName>,
    all: bool,
    machine_root: Option<&std::path::Path>,
) -> (status::metrics::Report, u8) {
    let report = match load(cli) {
        Ok(ctx) => status::report(&ctx, machine, all, machine_root),
        Err(e) => status::metrics::Report {
            errors: vec![format!("{e:#}")],
            now: status::now_seconds(),
            ..Default::default()
        },
    };
    let code = if report.errors.is_empty() {
        report
            .machines
            .iter()
            .map(|s| s.state)
            .max()
            .unwrap_or(status::State::NothingInstalled)
            .exit_code()
    } else {
        1
    };
    (report, code)
}

/// Run one parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    // Generated from the command line alone: no host, no configuration, no root (packaging).
    match &cli.command {
        Command::Completions { shell } => {
            let mut script = Vec::new();
            manual::completions(*shell, &mut script)?;
            return crate::output::print_all(&String::from_utf8_lossy(&script));
        }
        Command::Manpages { dir } => {
            let mut text = String::new();
            for path in manual::write_pages(dir)? {
                text.push_str(&format!("{}\n", path.display()));
            }
            return crate::output::print_all(&text);
        }
        _ => {}
    }
    // Run by a container runtime inside the machine: no host tree, no configuration there.
    if let Command::CdiHook(hook) = &cli.command {
        return crate::apply::cdi_hook::run(hook, std::io::stdin().lock());
    }
    // Needs no host and no configuration: a crash test lists the points before it arms one.
    #[cfg(feature = "failpoints")]
    if let Command::Failpoints = &cli.command {
        let names: String = crate::failpoint::ALL
            .iter()
            .map(|p| format!("{}\n", p.name()))
            .collect();
        return crate::output::print_all(&names);
    }
    if let Command::NspawnLifecycle(Phase::PreStart { machine }) = &cli.command {
        let result = load(&cli).and_then(|ctx| pre_start::pre_start(&ctx, machine));
        let real_root = cli.host_root == std::path::Path::new("/");
        return pre_start::ending_retries_it_cannot_mend(real_root, machine, result);
    }
    let ctx = load(&cli)?;
    match cli.command {
        Command::NspawnLifecycle(Phase::PreStart { machine }) => {
            pre_start::pre_start(&ctx, &machine)
        }
        Command::NspawnLifecycle(Phase::PostStart { machine }) => {
            post_start::post_start(&ctx, &machine)
        }
        Command::NspawnLifecycle(Phase::RefreshDevices { machine }) => {
            post_start::refresh_devices(&ctx, &machine)
        }
        Command::NspawnLifecycle(Phase::Reconcile { machine }) | Command::Reconcile { machine } => {
            reconcile::reconcile(&ctx, &machine)
        }
        Command::Discover { json, .. } => discover::discover(&ctx, json).map(drop),
        Command::Plan { machine, json, .. } => plan::plan(&ctx, &machine, json).map(drop),
        Command::CdiSpec { machine, list } => plan::cdi_spec(&ctx, &machine, list),
        Command::Host(HostCommand::PostStart) => post_start::host_post_start(&ctx),
        Command::Host(HostCommand::Plan { json }) => post_start::host_plan(&ctx, json),
        command @ (Command::Install { .. } | Command::Uninstall { .. }) => {
            install_or_uninstall(&ctx, command)
        }
        Command::Completions { .. } | Command::Manpages { .. } | Command::CdiHook(_) => {
            unreachable!("handled above")
        }
        Command::Status { .. }
        | Command::Metrics { .. }
        | Command::Host(HostCommand::Status { .. }) => Err(anyhow::anyhow!(
            "status and metrics give an exit code of their own: run them through run_with_code"
        )),
        #[cfg(feature = "failpoints")]
        Command::Failpoints => unreachable!("handled above"),
        #[cfg(feature = "failpoints")]
        Command::RewireRoot {
            machine,
            machine_root,
        } => post_start::rewire_root(&ctx, &machine, &machine_root),
    }
}

/// `install` and `uninstall`, of a machine or (`--host`) of host mode.
fn install_or_uninstall(ctx: &Ctx, command: Command) -> Result<()> {
    match command {
        Command::Install {
            host: true,
            dry_run,
            json,
            ..
        } => install::install_host(ctx, install::How { dry_run, json }, &HOST_SYSTEMD),
        Command::Install {
            machine: Some(machine),
            print_dropin: true,
            ..
        } => install::print_dropin(ctx, &machine),
        Command::Install {
            machine: Some(machine),
            dry_run,
            json,
            ..
        } => install::install(ctx, &machine, install::How { dry_run, json }, &HOST_SYSTEMD),
        Command::Uninstall {
            host: true,
            dry_run,
            json,
            ..
        } => install::uninstall_host(ctx, install::How { dry_run, json }, &HOST_SYSTEMD),
        Command::Uninstall {
            machine: Some(machine),
            dry_run,
            json,
            ..
        } => install::uninstall(ctx, &machine, install::How { dry_run, json }, &HOST_SYSTEMD),
        _ => unreachable!("the command line requires a machine without --host"),
    }
}

/// The host's systemd as install and uninstall use it.
const HOST_SYSTEMD: install::HostSystemd<'static> = install::HostSystemd {
    reload: &host_daemon_reload,
    pending: &host_reload_pending,
};

/// Whether the host's systemd runs `unit` from older unit files than those on disk.
fn host_reload_pending(unit: &str) -> Result<bool> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    crate::systemd::Systemd::host(deadline)?.needs_daemon_reload(unit, deadline)
}

/// `daemon-reload` of the host's systemd over D-Bus (what install and uninstall run after
/// changing a unit file).
fn host_daemon_reload() -> Result<()> {
    crate::failpoint::hit(crate::failpoint::Point::InstallBeforeDaemonReload);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let host = crate::systemd::Systemd::host(deadline)?;
    crate::systemd::daemon_reload(&host, deadline)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The `.rs` files under `dir`, with their text, recursively.
    fn sources(dir: &Path) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(sources(&path));
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path.display().to_string(), text));
            }
        }
        out
    }

    /// What two commands share lives in a module of its own, so no command module
    /// reaches into a sibling, and nothing below the commands reaches up into them.
    #[test]
    fn no_command_module_imports_another_and_the_core_imports_none() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let commands = src.join("commands");
        let mut offenders = Vec::new();
        for (path, text) in sources(&commands) {
            if path.ends_with("/commands/mod.rs") {
                continue;
            }
            for (n, line) in text.lines().enumerate() {
                if line.contains("commands::") || line.contains("super::super") {
                    offenders.push(format!("{path}:{}: {line}", n + 1));
                }
            }
        }
        for (path, text) in sources(&src) {
            if path.contains("/commands/") || path.ends_with("/main.rs") {
                continue;
            }
            for (n, line) in text.lines().enumerate() {
                if line.contains("crate::commands") {
                    offenders.push(format!("{path}:{}: {line}", n + 1));
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "command modules import a sibling (or the core imports a command); move what they \
             share into a module of its own:\n{}",
            offenders.join("\n")
        );
    }
}
