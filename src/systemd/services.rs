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
pub(crate) struct MachineServices {
    pub sd: Systemd,
    pub job_timeout: Duration,
}

impl Services for MachineServices {
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

/// Services reached only when first asked ([`Deferred::reach`] at the latest): post-start of a
/// target without GPUs removes what is left of ours first, and only then waits for the boot to
/// finish (`connect`).
pub(crate) struct Deferred<S, F> {
    connect: std::cell::Cell<Option<F>>,
    services: std::cell::OnceCell<S>,
}

impl<S: Services, F: FnOnce() -> Result<S>> Deferred<S, F> {
    pub fn new(connect: F) -> Self {
        Deferred {
            connect: std::cell::Cell::new(Some(connect)),
            services: std::cell::OnceCell::new(),
        }
    }

    /// Reach the services now, if nothing has yet.
    pub fn reach(&self) -> Result<()> {
        self.get().map(drop)
    }

    fn get(&self) -> Result<&S> {
        if let Some(s) = self.services.get() {
            return Ok(s);
        }
        let connect = self
            .connect
            .take()
            .ok_or_else(|| anyhow::anyhow!("the target's systemd could not be reached"))?;
        let services = connect()?;
        Ok(self.services.get_or_init(|| services))
    }
}

impl<S: Services, F: FnOnce() -> Result<S>> Services for Deferred<S, F> {
    fn stop(&self, unit: &str) -> Result<()> {
        self.get()?.stop(unit)
    }
    fn start(&self, unit: &str) -> Result<()> {
        self.get()?.start(unit)
    }
    fn is_active(&self, unit: &str) -> Result<bool> {
        self.get()?.is_active(unit)
    }
    fn run(
        &self,
        prefix: &str,
        argv: &[&str],
        stdin: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<TransientOutcome> {
        self.get()?.run(prefix, argv, stdin, timeout)
    }
}

impl<T: Services + ?Sized> Services for &T {
    fn stop(&self, unit: &str) -> Result<()> {
        (**self).stop(unit)
    }
    fn start(&self, unit: &str) -> Result<()> {
        (**self).start(unit)
    }
    fn is_active(&self, unit: &str) -> Result<bool> {
        (**self).is_active(unit)
    }
    fn run(
        &self,
        prefix: &str,
        argv: &[&str],
        stdin: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<TransientOutcome> {
        (**self).run(prefix, argv, stdin, timeout)
    }
}

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::cell::Cell;

    /// Services that only count the units started.
    struct Count<'a>(&'a Cell<usize>);

    impl Services for Count<'_> {
        fn stop(&self, _: &str) -> Result<()> {
            Ok(())
        }
        fn start(&self, _: &str) -> Result<()> {
            self.0.set(self.0.get() + 1);
            Ok(())
        }
        fn is_active(&self, _: &str) -> Result<bool> {
            Ok(false)
        }
        fn run(
            &self,
            _: &str,
            _: &[&str],
            _: Option<BorrowedFd<'_>>,
            _: Duration,
        ) -> Result<TransientOutcome> {
            anyhow::bail!("not here")
        }
    }

    /// Reached once, when first asked or at `reach` (post-start without GPUs waits for the
    /// boot there); a connection that failed stays failed.
    #[test]
    fn deferred_services_are_reached_once_when_first_asked() {
        let (connects, starts) = (Cell::new(0), Cell::new(0));
        let d = Deferred::new(|| {
            connects.set(connects.get() + 1);
            Ok(Count(&starts))
        });
        assert_eq!(connects.get(), 0);
        d.start("containerd.service").unwrap();
        d.reach().unwrap();
        d.start("kubelet.service").unwrap();
        assert_eq!((connects.get(), starts.get()), (1, 2));

        let d = Deferred::new(|| {
            connects.set(connects.get() + 1);
            Ok(Count(&starts))
        });
        d.reach().unwrap();
        assert_eq!(connects.get(), 2);

        let failed: Deferred<Count, _> = Deferred::new(|| anyhow::bail!("no bus"));
        assert_eq!(format!("{:#}", failed.reach().unwrap_err()), "no bus");
        assert!(failed.start("kubelet.service").is_err());
    }
}
