//! `demo`: build one of the example hosts (`assets/hosts/`, by [`crate::fixture`]) in a temporary
//! directory and show what discovery sees there, the `.nspawn` file pre-start would write and the
//! CDI spec post-start would write, writing nothing outside that directory.
//!
//! The product carries the example-host builder on purpose: it is how a newcomer sees the tool
//! work without a GPU (README "Quick start"), it writes only into the fresh directory it is given
//! and never through a symlink, and nothing in it is test-only (every function of
//! [`crate::fixture`] is reached from `materialize`). The fuzz entry points, which are test-only,
//! live in the fuzz crate (`tests/fuzz/src/lib.rs`), not here.

use crate::discovery::{self, check_complete};
use crate::fixture;
use crate::machine_name::MachineName;
use crate::nspawn::NspawnFile;
use crate::output::{discovery_text, print_all};
use crate::units::nspawn_path;
use anyhow::{Context as _, Result};
use std::fmt::Write as _;

/// `demo`: build an example host and show discovery, the `.nspawn` file and the CDI spec.
pub fn demo(example: &str, list: bool) -> Result<()> {
    if list {
        let mut out = String::new();
        for (name, text) in fixture::EXAMPLES {
            let _ = writeln!(out, "{name:<20} {}", fixture::description(text));
        }
        return print_all(&out);
    }
    let text = fixture::example(example).ok_or_else(|| {
        crate::error::bad_input(format!(
            "there is no example host {example:?}; `demo --list` shows them"
        ))
    })?;
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!(
            "demo builds the example host {example} with real character devices (mknod), which needs root; run it as root"
        );
    }
    // Ctrl-C, a hangup or a kill while the example host exists would leave it (and its device
    // nodes) behind: those signals wait until it is removed, then act as they would have.
    let held = nix::sys::signal::SigSet::from_iter([
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGHUP,
        nix::sys::signal::Signal::SIGQUIT,
    ]);
    let mut before = nix::sys::signal::SigSet::empty();
    nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        Some(&held),
        Some(&mut before),
    )
    .context("holding termination signals while the example host exists")?;
    let shown = show(example, text);
    nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&before),
        None,
    )
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
    let host = crate::host::HostRoot::open(dir.path())?;
    let machine: MachineName = "kube1".parse().map_err(anyhow::Error::msg)?;
    let mc = crate::config::Config::default().machine(&host, &machine)?;
    let inv = discovery::discover(&host)?;
    let mut out = format!(
        "# Example host {example}: {}\n# (built under {}, removed on exit)\n\n## What discovery sees (`discover`)\n{}\n",
        fixture::description(text),
        dir.path().display(),
        discovery_text(&inv)
    );
    let path = nspawn_path(&machine);
    match check_complete(&inv) {
        Ok(()) => {
            let has_lib_modules = host.is_dir("/lib/modules");
            let file = NspawnFile::render(
                &machine,
                &inv,
                &mc,
                has_lib_modules,
                crate::config::Config::default().helper_path(),
            )?;
            let _ = write!(
                out,
                "## {path} as `nspawn-lifecycle pre-start kube1` writes it\n{file}"
            );
        }
        Err(e) => {
            let _ = writeln!(
                out,
                "## {path}\n`nspawn-lifecycle pre-start kube1` refuses to start the machine (exit code {}) and leaves the file alone:\n  {e:#}",
                crate::error::exit_code(&e)
            );
        }
    }
    match crate::cdi::spec(&inv, &mc.cdi_kind) {
        Some(spec) => {
            let _ = write!(
                out,
                "\n## {}/{} as `nspawn-lifecycle post-start kube1` writes it inside the machine\n{}",
                mc.cdi_dir,
                crate::cdi::spec_file_name(&mc.cdi_kind),
                crate::cdi::render(&spec)
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
