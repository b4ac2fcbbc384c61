//! `cargo demo [--host NAME | --list]`: build one of the example hosts
//! (`assets/hosts/`) in a temporary directory and show what discovery sees there, the `.nspawn`
//! file pre-start would write and the CDI spec post-start would write, through the product's own
//! functions, writing nothing outside that directory. Root: the example host has real character
//! devices (mknod).
//!
//! The example-host builder ([`nspawn_lifecycle::fixture`]) is the test kit's (feature
//! `testkit`, which this binary requires and `cargo demo` turns on): the product binary does not
//! carry it.

use anyhow::{Context as _, Result};
use clap::Parser;
use nspawn_lifecycle::config::Config;
use nspawn_lifecycle::discovery;
use nspawn_lifecycle::discovery::assign;
use nspawn_lifecycle::fs::host::HostRoot;
use nspawn_lifecycle::model::Desired;
use nspawn_lifecycle::model::render;
use nspawn_lifecycle::output::{discovery_text, print_all};
use nspawn_lifecycle::types::machine_name::MachineName;
use nspawn_lifecycle::types::units;
use nspawn_lifecycle::{Ctx, error, fixture};
use std::fmt::Write as _;
use std::process::ExitCode;

/// Build an example GPU host in a temporary directory (needs root for mknod) and show what
/// discovery sees, the .nspawn file and the CDI spec nspawn-lifecycle renders for it.
#[derive(Debug, Parser)]
struct Args {
    /// Example host to build; `--list` shows them.
    #[arg(long, default_value = "two-gpus")]
    host: String,
    /// List the example hosts and exit.
    #[arg(long)]
    list: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match demo(&args.host, args.list) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(error::exit_code(&e))
        }
    }
}

/// Build an example host and show discovery, the `.nspawn` file and the CDI spec.
fn demo(example: &str, list: bool) -> Result<()> {
    if list {
        let mut out = String::new();
        for (name, text) in fixture::EXAMPLES {
            let _ = writeln!(out, "{name:<20} {}", fixture::description(text));
        }
        return print_all(&out);
    }
    let text = fixture::example(example).ok_or_else(|| {
        error::bad_input(format!(
            "there is no example host {example:?}; `--list` shows them"
        ))
    })?;
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!(
            "the demo builds the example host {example} with real character devices (mknod), \
             which needs root; run it as root"
        );
    }
    // Ctrl-C, a hangup or a kill while the example host exists would leave it (and its device
    // nodes) behind: those signals wait until it is removed, then act as they would have.
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
    let held = SigSet::from_iter([
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ]);
    let mut before = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&held), Some(&mut before))
        .context("holding termination signals while the example host exists")?;
    let shown = show(example, text);
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&before), None)
        .context("restoring the signal mask")?;
    shown
}

/// Build `example` (its host text) in a temporary directory, print what the hooks would do
/// there, and remove it.
fn show(example: &str, text: &str) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("nspawn-lifecycle-demo.")
        .tempdir()
        .context("creating a temporary directory for the example host")?;
    fixture::materialize(text, dir.path())
        .with_context(|| format!("building example host {example}"))?;
    let ctx = Ctx {
        host: HostRoot::open(dir.path())?,
        config: Config::default(),
    };
    let machine: MachineName = "kube1".parse().map_err(anyhow::Error::msg)?;
    let mc = ctx.config.machine(&ctx.host, &machine)?;
    let inv = discovery::discover(&ctx.host)?;
    let mut out = format!(
        "# Example host {example}: {}\n# (built under {}, removed on exit)\n\n## What discovery sees (`discover`)\n{}\n",
        fixture::description(text),
        dir.path().display(),
        discovery_text(&inv)
    );
    let path = units::nspawn_path(&machine);
    let rendered = render::render_from(&ctx, &machine, &mc, &inv);
    match &rendered {
        Ok(r) => {
            let _ = write!(
                out,
                "## {path} as `nspawn-lifecycle pre-start kube1` writes it\n{}",
                r.text()
            );
        }
        Err(e) => {
            let _ = writeln!(
                out,
                "## {path}\n`nspawn-lifecycle pre-start kube1` refuses to start the machine (exit code {}) and leaves the file alone:\n  {e:#}",
                error::exit_code(e)
            );
        }
    }
    // The desired state pre-start rendered; where it refuses, the same for the machine's share.
    let desired = match rendered {
        Ok(r) => r.desired,
        Err(_) => Desired::machine(&ctx, &machine, &mc, &inv, &assign::assign(&inv, &mc.gpus))?,
    };
    match &desired.spec.bytes {
        Some(spec) => {
            let _ = write!(
                out,
                "\n## {} as `nspawn-lifecycle post-start kube1` writes it inside the machine\n{}",
                desired.spec.path(),
                String::from_utf8_lossy(spec)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "\n## CDI\nNo GPUs to hand out: post-start removes any NVIDIA CDI spec an earlier start left."
            );
        }
    }
    print_all(&out)
}
