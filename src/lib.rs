//! nspawn-lifecycle: keeps systemd-nspawn machines that hold Kubernetes GPU nodes in step with
//! their host, around every start. See README.md for the operator's view and DESIGN notes there.

pub mod atomic;
pub mod cdi;
pub mod cdi_hook;
pub mod cli;
pub mod config;
pub mod demo;
pub mod device_cgroup;
pub mod discovery;
pub mod driver_tree;
pub mod dropin;
pub mod error;
pub mod failpoint;
pub mod fixture;
pub mod gate;
pub mod host;
pub mod host_dir;
pub mod image;
pub mod install;
pub mod layout;
pub mod ldcache;
pub mod legacy;
pub mod lock;
pub mod logging;
pub mod machine_name;
pub mod machine_root;
pub mod manual;
pub mod nspawn;
pub mod paths;
pub mod poststart;
pub mod prestart;
pub mod reconcile;
pub mod rewire;
pub mod status;
pub mod systemd;
pub mod units;

use anyhow::Result;
use cli::{Cli, Command, Phase};
use config::Config;
use host::HostRoot;

/// What every command gets: the host tree and the loaded configuration.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub host: HostRoot,
    pub config: Config,
}

impl Ctx {
    /// The host tree `--host-root` names and the configuration loaded from it.
    fn load(cli: &Cli) -> Result<Ctx> {
        let host = HostRoot::new(&cli.host_root);
        // A mistyped --host-root must not become an empty host with verdict "none" and new files.
        if !host.root().is_dir() {
            return Err(error::bad_input(format!(
                "--host-root {}: not a directory",
                host.root().display()
            )));
        }
        let config = Config::load(&host, cli.config.as_deref())?;
        Ok(Ctx { host, config })
    }
}

/// Run one parsed command line and give the process exit code on success: 0, or for `status`
/// the machine state's code (5 drift, 6 broken, 7 not running).
pub fn run_with_code(cli: Cli) -> Result<u8> {
    let Command::Status {
        machine,
        all,
        json,
        machine_root,
    } = &cli.command
    else {
        return run(cli).map(|()| 0);
    };
    let ctx = Ctx::load(&cli)?;
    status::status(&ctx, machine.as_ref(), *all, *json, machine_root.as_deref())
}

/// Run one parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    if let Command::Demo {
        host: example,
        list,
    } = &cli.command
    {
        return demo::demo(example, *list);
    }
    // Generated from the command line alone: no host, no configuration, no root (packaging).
    match &cli.command {
        Command::Completions { shell } => {
            return manual::completions(*shell, &mut std::io::stdout().lock());
        }
        Command::Manpages { dir } => {
            for path in manual::write_pages(dir)? {
                println!("{}", path.display());
            }
            return Ok(());
        }
        _ => {}
    }
    // Run by a container runtime inside the machine: no host tree, no configuration there.
    if let Command::CdiHook(hook) = &cli.command {
        return cdi_hook::run(hook, std::io::stdin().lock());
    }
    // Needs no host and no configuration: a crash test lists the points before it arms one.
    #[cfg(feature = "failpoints")]
    if let Command::Failpoints = &cli.command {
        for p in failpoint::ALL {
            println!("{}", p.name());
        }
        return Ok(());
    }
    let ctx = Ctx::load(&cli)?;
    match cli.command {
        Command::NspawnLifecycle(Phase::PreStart { machine }) => {
            prestart::pre_start(&ctx, &machine)
        }
        Command::NspawnLifecycle(Phase::PostStart { machine }) => {
            poststart::post_start(&ctx, &machine)
        }
        Command::NspawnLifecycle(Phase::Reconcile { machine }) => {
            reconcile::reconcile(&ctx, &machine)
        }
        Command::Discover { json } => prestart::discover(&ctx, json),
        Command::Plan { machine } => prestart::plan(&ctx, &machine),
        Command::Install {
            machine,
            print_dropin: true,
            ..
        } => install::print_dropin(&ctx, &machine),
        Command::Install {
            machine, dry_run, ..
        } => install::install(&ctx, &machine, dry_run, &HOST_SYSTEMD),
        Command::Uninstall { machine, dry_run } => {
            install::uninstall(&ctx, &machine, dry_run, &HOST_SYSTEMD)
        }
        Command::Demo { .. }
        | Command::Completions { .. }
        | Command::Manpages { .. }
        | Command::CdiHook(_) => {
            unreachable!("handled above")
        }
        Command::Status { .. } => Err(anyhow::anyhow!(
            "status gives an exit code of its own: run it through run_with_code"
        )),
        #[cfg(feature = "failpoints")]
        Command::Failpoints => unreachable!("handled above"),
        #[cfg(feature = "failpoints")]
        Command::RewireRoot {
            machine,
            machine_root,
        } => poststart::rewire_root(&ctx, &machine, &machine_root),
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
    systemd::Systemd::host(deadline)?.needs_daemon_reload(unit, deadline)
}

/// `daemon-reload` of the host's systemd over D-Bus (what install and uninstall run after
/// changing a unit file).
fn host_daemon_reload() -> Result<()> {
    failpoint::hit(failpoint::Point::InstallBeforeDaemonReload);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let host = systemd::Systemd::host(deadline)?;
    systemd::daemon_reload(&host, deadline)
}

/// Set up logging to stderr without timestamps (journald adds them); natively to the journal,
/// with the same lines and structured fields, when stderr is the journal ([`logging`]).
pub fn init_logging(verbose: u8) {
    logging::init(verbose);
}
