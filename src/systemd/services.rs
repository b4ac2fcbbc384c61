//! What post-start needs from a target's systemd ([`Services`]): the one way to reach it, the
//! real one over its bus, and a stand-in for a rootfs on disk with no systemd in it ([`OnDisk`],
//! for the crash tests and the wiring model's property test).

use super::{Systemd, TransientOutcome};
#[cfg(any(feature = "failpoints", feature = "testkit"))]
use anyhow::Context as _;
use anyhow::Result;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// What post-start needs from the machine's systemd. A trait so the ordering and the
/// restart-on-failure rules are unit-tested with a recording fake; the real thing is proven
/// under a real systemd in `tests/e2e`.
pub trait Services {
    /// Stop `unit` and wait until the job is done.
    fn stop(&self, unit: &str) -> Result<()>;
    /// Start `unit` and wait until the job is done; an error unless the unit then runs (a gated
    /// unit's start is skipped by its condition, which is an error here).
    fn start(&self, unit: &str) -> Result<()>;
    /// Whether `unit` runs now (active, reloading or activating).
    fn is_active(&self, unit: &str) -> Result<bool>;
    /// Run `argv` in the machine as a transient unit, with `stdin` as its standard input when
    /// given, and wait for it.
    fn run(
        &self,
        prefix: &str,
        argv: &[&str],
        stdin: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<TransientOutcome>;
}

/// The machine's systemd over its own bus.
pub struct MachineServices<'a> {
    pub sd: &'a Systemd,
    pub job_timeout: Duration,
}

impl Services for MachineServices<'_> {
    fn stop(&self, unit: &str) -> Result<()> {
        self.sd.stop_unit(unit, Instant::now() + self.job_timeout)
    }
    fn start(&self, unit: &str) -> Result<()> {
        let deadline = Instant::now() + self.job_timeout;
        // Our stop/start pairs count against the unit's start limit (5 in 10 s by default): an
        // operator running post-start a few times in a row would otherwise be refused with
        // start-limit-hit. A deliberate start clears it; a unit that really fails still fails
        // its start job below. An unknown unit fails there too, with a clearer message.
        if let Err(e) = self.sd.reset_failed_unit(unit, deadline) {
            tracing::debug!(%unit, "ResetFailedUnit before the start: {e:#}");
        }
        self.sd.start_unit(unit, deadline)?;
        // A start job also finishes "done" when a condition skipped the unit: check it runs.
        let st = self.sd.unit_state(unit, deadline)?;
        match st.active_state.as_str() {
            "active" | "reloading" => Ok(()),
            other => anyhow::bail!(
                "{unit} is {other} ({}) after its start job finished; an unmet Condition…= \
                 skips a unit that way (see `systemctl status {unit}` in the machine)",
                st.sub_state
            ),
        }
    }
    fn is_active(&self, unit: &str) -> Result<bool> {
        let st = self
            .sd
            .unit_state(unit, Instant::now() + self.job_timeout)?;
        Ok(matches!(
            st.active_state.as_str(),
            "active" | "reloading" | "activating"
        ))
    }
    fn run(
        &self,
        prefix: &str,
        argv: &[&str],
        stdin: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<TransientOutcome> {
        self.sd.run_transient(prefix, argv, stdin, timeout)
    }
}

/// What pre-start reaches: no service. Its plan has no service step; one there is a bug.
pub struct NoServices;

impl NoServices {
    fn refuse<T>(what: &str) -> Result<T> {
        anyhow::bail!("{what}: pre-start reaches no service (a bug in its plan)")
    }
}

impl Services for NoServices {
    fn stop(&self, unit: &str) -> Result<()> {
        Self::refuse(&format!("stop {unit}"))
    }
    fn start(&self, unit: &str) -> Result<()> {
        Self::refuse(&format!("start {unit}"))
    }
    fn is_active(&self, unit: &str) -> Result<bool> {
        Self::refuse(&format!("is {unit} active"))
    }
    fn run(
        &self,
        _: &str,
        argv: &[&str],
        _: Option<BorrowedFd<'_>>,
        _: Duration,
    ) -> Result<TransientOutcome> {
        Self::refuse(&format!("run {}", argv.join(" ")))
    }
}

/// A machine rootfs on disk with no systemd in it. Nothing runs there, so no unit is active and
/// stops and starts are logged no-ops. `ldconfig` is the host's `ldconfig -r <rootfs>`, which
/// rebuilds the rootfs's own `/etc/ld.so.cache` from its own `ld.so.conf`, as the machine's
/// `ldconfig` would. `ctr` needs the machine's containerd, so an import fails as one whose `ctr`
/// could not run: the tarball is set aside like any failed import.
#[cfg(any(feature = "failpoints", feature = "testkit"))]
pub struct OnDisk<'a> {
    pub dir: &'a std::path::Path,
}

#[cfg(any(feature = "failpoints", feature = "testkit"))]
impl Services for OnDisk<'_> {
    fn stop(&self, unit: &str) -> Result<()> {
        tracing::info!(%unit, "no systemd in a rootfs on disk: nothing to stop");
        Ok(())
    }
    fn start(&self, unit: &str) -> Result<()> {
        tracing::info!(%unit, "no systemd in a rootfs on disk: nothing to start");
        Ok(())
    }
    fn is_active(&self, _: &str) -> Result<bool> {
        Ok(false)
    }
    fn run(
        &self,
        prefix: &str,
        argv: &[&str],
        _: Option<BorrowedFd<'_>>,
        _: Duration,
    ) -> Result<TransientOutcome> {
        let started = Instant::now();
        if argv != ["/sbin/ldconfig"] {
            anyhow::bail!(
                "no systemd in a rootfs on disk: cannot run {}",
                argv.join(" ")
            );
        }
        let out = std::process::Command::new("ldconfig")
            .arg("-r")
            .arg(self.dir)
            .output()
            .with_context(|| format!("running ldconfig -r {}", self.dir.display()))?;
        let code = out.status.code();
        Ok(TransientOutcome {
            unit: format!("{prefix} (host ldconfig -r)"),
            exit_status: code.map_or(super::ExitStatus::NotRun, super::ExitStatus::Exited),
            result: if out.status.success() {
                "success"
            } else {
                "exit-code"
            }
            .into(),
            output: String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned(),
            output_dropped: 0,
            elapsed: started.elapsed(),
        })
    }
}
