//! `nspawn-lifecycle post-start`: rewire NVIDIA state inside the machine with its services stopped.
//!
//! Order (DESIGN §5): stop kubelet → stop containerd → driver root → links → `ldconfig` → CDI spec
//! → release the unit gate → start containerd → import staged images → start kubelet. In a GPU
//! machine the gate (src/gate.rs) kept both services from starting at boot, so on a fresh start
//! the two stops find nothing running and each service starts once, after the driver is wired.
//! When a step after the stops fails, containerd and kubelet are started again (best effort, each
//! result logged) before the error is returned, so a failed start never leaves a node with its
//! services down and nobody to restart them except systemd's `Restart=on-failure`, which retries
//! the whole start anyway.

use crate::Ctx;
use crate::cdi;
use crate::config::MachineConfig;
use crate::discovery::{self, Inventory};
use crate::failpoint::{self, Point};
use crate::gate;
use crate::lock;
use crate::machine_name::MachineName;
use crate::machine_root::{FileKind, MachineRoot};
use crate::prestart::check_complete;
use crate::rewire;
use crate::systemd::{self, MachineHandle, Systemd, TransientOutcome};
use anyhow::{Context as _, Result};
use std::time::{Duration, Instant};

/// Where tarballs that failed to import are moved, under the staged-images directory.
pub const FAILED_DIR: &str = "failed";

/// What post-start needs from the machine's systemd. A trait so the ordering and the
/// restart-on-failure rules are unit-tested with a recording fake; the real thing is proven
/// under a real systemd in `tests/e2e`.
pub trait Services {
    /// Stop `unit` and wait until the job is done.
    fn stop(&self, unit: &str) -> Result<()>;
    /// Start `unit` and wait until the job is done.
    fn start(&self, unit: &str) -> Result<()>;
    /// Run `argv` in the machine as a transient unit and wait for it.
    fn run(&self, prefix: &str, argv: &[&str], timeout: Duration) -> Result<TransientOutcome>;
}

/// The machine's systemd over its own bus.
struct MachineServices<'a> {
    sd: &'a Systemd,
    job_timeout: Duration,
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
    fn run(&self, prefix: &str, argv: &[&str], timeout: Duration) -> Result<TransientOutcome> {
        self.sd.run_transient(prefix, argv, timeout)
    }
}

/// ExecStartPost=: see the module documentation.
pub fn post_start(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    if !ctx.host.is_real_root() {
        return Err(crate::error::bad_input(format!(
            "post-start of {machine} works on the running machine through the host's systemd; \
             --host-root {} is only for pre-start, plan, discover and install",
            ctx.host.root().display()
        )));
    }
    let total = Instant::now();
    let _lock = timed(machine, "lock", || {
        lock::lock(&ctx.host, machine, mc.lock_timeout)
    })?;
    let inv = timed(machine, "discover", || discovery::discover(&ctx.host))?;
    check_complete(&inv).with_context(|| format!("post-start of {machine}"))?;

    let deadline = Instant::now() + mc.job_timeout;
    let handle = timed(machine, "find machine", || {
        MachineHandle::find(&Systemd::host(deadline)?, machine.as_str(), deadline)
    })?;
    let root = handle.root();
    let spec_file = cdi::spec_file_name(&mc.cdi_kind);

    let spec = cdi::spec(&inv, &mc.cdi_kind);
    let (Some(driver), Some(spec)) = (inv.complete_driver(), spec) else {
        // No NVIDIA devices: services are left alone; only stale NVIDIA state is removed so pods
        // cannot be handed GPUs that are gone.
        let report = rewire::cleanup(root, &mc.cdi_dir, &spec_file)
            .with_context(|| format!("post-start of {machine}: removing stale NVIDIA state"))?;
        tracing::info!(%machine, "no NVIDIA GPUs on the host; {report}");
        // Unless pre-start still saw GPUs and gated the services (they went in between): then
        // nothing else would ever start them this boot.
        if gate::is_gated(root, &mc.kubelet_unit)? || gate::is_gated(root, &mc.containerd_unit)? {
            gate::release(root)?;
            let sd = systemd::wait_running(&handle, Instant::now() + mc.boot_timeout)?;
            let services = MachineServices {
                sd: &sd,
                job_timeout: mc.job_timeout,
            };
            for unit in [&mc.containerd_unit, &mc.kubelet_unit] {
                services
                    .start(unit)
                    .with_context(|| format!("post-start of {machine}: starting {unit}"))?;
                tracing::info!(%machine, %unit, "started (gated at boot while the host had GPUs)");
            }
        }
        return Ok(());
    };
    let sd = timed(machine, "wait running", || {
        systemd::wait_running(&handle, Instant::now() + mc.boot_timeout)
    })?;
    let services = MachineServices {
        sd: &sd,
        job_timeout: mc.job_timeout,
    };
    let json = cdi::render(&spec);
    let driver_version = driver.version.clone();
    let started = Instant::now();
    let mut library_links_changed = true;
    rewire_with_services_stopped(
        machine,
        &mc,
        &services,
        &mut |step| {
            run_file_step(
                step,
                root,
                &inv,
                &mc,
                &spec_file,
                json.as_bytes(),
                &services,
                &mut library_links_changed,
            )
        },
        &mut || import_images(machine, root, &mc, &services),
    )?;
    tracing::debug!(%machine, step = "post-start", us = micros(total.elapsed()), "step timing");
    tracing::info!(
        %machine,
        "post-start done in {:.2}s: NVIDIA driver {driver_version}, {} GPU(s)",
        started.elapsed().as_secs_f64(),
        inv.gpus.len()
    );
    Ok(())
}

/// `rewire-root` (failpoints builds only): post-start's file steps against a rootfs directory,
/// without services (so without `ldconfig`), for the crash tests.
#[cfg(feature = "failpoints")]
pub fn rewire_root(ctx: &Ctx, machine: &MachineName, dir: &std::path::Path) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    let _lock = lock::lock(&ctx.host, machine, mc.lock_timeout)?;
    let inv = discovery::discover(&ctx.host)?;
    check_complete(&inv)?;
    let root = MachineRoot::open(dir)?;
    root.refuse_host_root(std::path::Path::new("/"))?;
    let spec_file = cdi::spec_file_name(&mc.cdi_kind);
    let Some(spec) = cdi::spec(&inv, &mc.cdi_kind) else {
        let report = rewire::cleanup(&root, &mc.cdi_dir, &spec_file)?;
        tracing::info!(%machine, "{report}");
        return Ok(());
    };
    let json = cdi::render(&spec);
    let mut library_links_changed = false;
    for step in FileStep::ALL {
        if step == FileStep::Ldconfig {
            continue;
        }
        let line = run_file_step(
            step,
            &root,
            &inv,
            &mc,
            &spec_file,
            json.as_bytes(),
            &NoServices,
            &mut library_links_changed,
        )
        .with_context(|| format!("rewire-root of {machine}: step '{}'", step.name()))?;
        tracing::info!(%machine, "{line}");
    }
    Ok(())
}

/// The services of a machine that is not running: every call fails.
#[cfg(feature = "failpoints")]
struct NoServices;

#[cfg(feature = "failpoints")]
impl Services for NoServices {
    fn stop(&self, unit: &str) -> Result<()> {
        anyhow::bail!("no machine is running: cannot stop {unit}")
    }
    fn start(&self, unit: &str) -> Result<()> {
        anyhow::bail!("no machine is running: cannot start {unit}")
    }
    fn run(&self, _: &str, argv: &[&str], _: Duration) -> Result<TransientOutcome> {
        anyhow::bail!("no machine is running: cannot run {}", argv.join(" "))
    }
}

/// Run `f` and log how long it took: one debug line per step (`step timing`, fields `step` and
/// `us`), which `tests/bench/e2e-bench.sh` reads to time the rewiring apart from the services.
fn timed<T>(machine: &MachineName, step: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    tracing::debug!(%machine, step, us = micros(started.elapsed()), "step timing");
    out
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The file steps, in order, between stopping and starting the services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileStep {
    DriverRoot,
    Links,
    Ldconfig,
    Cdi,
    /// Create the unit gate's marker (src/gate.rs): containerd and kubelet may start now.
    Gate,
}

impl FileStep {
    const ALL: [FileStep; 5] = [
        FileStep::DriverRoot,
        FileStep::Links,
        FileStep::Ldconfig,
        FileStep::Cdi,
        FileStep::Gate,
    ];

    fn name(self) -> &'static str {
        match self {
            FileStep::DriverRoot => "driver root",
            FileStep::Links => "library and /dev/char links",
            FileStep::Ldconfig => "ldconfig",
            FileStep::Cdi => "CDI spec",
            FileStep::Gate => "unit gate",
        }
    }
}

/// One file step. `library_links_changed` carries what the links step did to the ldconfig step:
/// `ldconfig` is skipped when no library link changed and the machine's `ld.so.cache` already
/// lists the driver's libraries (a transient unit and a full cache rebuild on every start
/// otherwise, most of the rewiring's time when nothing changed).
#[allow(clippy::too_many_arguments)]
fn run_file_step(
    step: FileStep,
    root: &MachineRoot,
    inv: &Inventory,
    mc: &MachineConfig,
    spec_file: &str,
    json: &[u8],
    services: &dyn Services,
    library_links_changed: &mut bool,
) -> Result<String> {
    let driver = inv
        .complete_driver()
        .context("the host's NVIDIA state changed under the lock")?;
    Ok(match step {
        FileStep::DriverRoot => rewire::build_driver_root(root, driver)?.to_string(),
        FileStep::Links => {
            let report = rewire::rebuild_links(root, inv)?;
            *library_links_changed = rewire::library_links_changed(&report);
            report.to_string()
        }
        FileStep::Ldconfig if !*library_links_changed && ld_cache_current(root, driver) => {
            "ldconfig: not needed, no library link changed and /etc/ld.so.cache lists the driver"
                .to_owned()
        }
        FileStep::Ldconfig => {
            let out = services.run(
                "nspawn-lifecycle-ldconfig",
                &["/sbin/ldconfig"],
                mc.job_timeout,
            )?;
            out.check("ldconfig")?;
            format!("ldconfig: done in {:.2}s", out.elapsed.as_secs_f64())
        }
        FileStep::Cdi => {
            let kind = mc.cdi_kind.clone();
            rewire::write_cdi(root, &mc.cdi_dir, spec_file, json, |name, bytes| {
                cdi::conflicts(&kind, name, bytes)
            })?
            .to_string()
        }
        FileStep::Gate if gate::release(root)? => format!("unit gate: released ({})", gate::WIRED),
        FileStep::Gate => "unit gate: already released".to_owned(),
    })
}

/// [`rewire::ld_cache_lists_driver`], where a cache that cannot be read means running `ldconfig`.
fn ld_cache_current(root: &MachineRoot, driver: &discovery::UserspaceDriver) -> bool {
    rewire::ld_cache_lists_driver(root, driver).unwrap_or_else(|e| {
        tracing::debug!("reading the machine's ld.so.cache: {e:#}; running ldconfig");
        false
    })
}

/// Stop kubelet then containerd, run the file steps, start containerd, import staged images,
/// start kubelet. On a failure after the stops, start both again before returning the error.
/// Image imports never fail the start: a problem there is logged and kubelet starts anyway.
pub fn rewire_with_services_stopped(
    machine: &MachineName,
    mc: &MachineConfig,
    services: &dyn Services,
    file_step: &mut dyn FnMut(FileStep) -> Result<String>,
    import: &mut dyn FnMut() -> Result<(usize, usize)>,
) -> Result<()> {
    let mut stopped = Vec::new();
    for (unit, point) in [
        (&mc.kubelet_unit, Point::AfterKubeletStop),
        (&mc.containerd_unit, Point::AfterContainerdStop),
    ] {
        if let Err(e) = timed(machine, &format!("stop {unit}"), || services.stop(unit)) {
            // Put back what was already stopped (kubelet) before giving up.
            start_again(machine, services, stopped.iter().rev().copied());
            return Err(e.context(format!("post-start of {machine}: stopping {unit}")));
        }
        tracing::info!(%machine, %unit, "stopped");
        stopped.push(unit);
        failpoint::hit(point);
    }
    let result = (|| -> Result<()> {
        for step in FileStep::ALL {
            let line = timed(machine, step.name(), || file_step(step))
                .with_context(|| format!("post-start of {machine}: step '{}'", step.name()))?;
            tracing::info!(%machine, "{line}");
        }
        let unit = &mc.containerd_unit;
        timed(machine, &format!("start {unit}"), || services.start(unit))
            .with_context(|| format!("post-start of {machine}: starting {unit}"))?;
        tracing::info!(%machine, %unit, "started");
        failpoint::hit(Point::AfterContainerdStart);
        match timed(machine, "import", &mut *import) {
            Ok((0, 0)) => {}
            Ok((ok, 0)) => tracing::info!(%machine, "imported {ok} staged image(s)"),
            Ok((ok, bad)) => tracing::error!(
                %machine,
                "imported {ok} staged image(s); {bad} failed and were moved to {}/{FAILED_DIR}",
                mc.staged_images_dir
            ),
            Err(e) => tracing::error!(
                %machine,
                "staged images in {} were not imported: {e:#}",
                mc.staged_images_dir
            ),
        }
        let unit = &mc.kubelet_unit;
        failpoint::hit(Point::BeforeKubeletStart);
        timed(machine, &format!("start {unit}"), || services.start(unit))
            .with_context(|| format!("post-start of {machine}: starting {unit}"))?;
        tracing::info!(%machine, %unit, "started");
        Ok(())
    })();
    if let Err(e) = result {
        start_again(machine, services, [&mc.containerd_unit, &mc.kubelet_unit]);
        return Err(e);
    }
    Ok(())
}

/// Best-effort starts after a failure; each result is logged, none changes the outcome.
fn start_again<'a>(
    machine: &MachineName,
    services: &dyn Services,
    units: impl IntoIterator<Item = &'a crate::paths::UnitName>,
) {
    for unit in units {
        match services.start(unit) {
            Ok(()) => tracing::warn!(%machine, %unit, "started again after the failure"),
            Err(e) => {
                tracing::error!(%machine, %unit, "could not start again after the failure: {e:#}")
            }
        }
    }
}

/// Import every `*.tar` in the staged-images directory with `ctr images import`, each as a
/// transient unit in the machine. A tarball that fails (or times out) is moved to `failed/`
/// beside it and reported with the command's output; it is never deleted and never fails the
/// start, so one bad image cannot crash-loop a node. Imported tarballs stay where they are.
/// Returns (imported, set aside).
pub fn import_images(
    machine: &MachineName,
    root: &MachineRoot,
    mc: &MachineConfig,
    services: &dyn Services,
) -> Result<(usize, usize)> {
    let Some(dir) = root.open_dir(&mc.staged_images_dir)? else {
        tracing::debug!(%machine, dir = %mc.staged_images_dir, "no staged images directory");
        return Ok((0, 0));
    };
    let mut tars: Vec<String> = dir
        .entries()?
        .into_iter()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|n| n.ends_with(".tar") && !n.starts_with('.'))
        .collect();
    tars.sort();
    let (mut imported, mut failed) = (0, 0);
    for name in tars {
        // Only regular files: a FIFO would hang ctr, a symlink could name anything.
        if dir.kind(&name)? != Some(FileKind::File) {
            tracing::warn!(%machine, image = %dir.child(&name), "not a regular file; skipped");
            continue;
        }
        let path = dir.child(&name);
        let argv = [
            mc.ctr_path.as_str(),
            "-n",
            mc.ctr_namespace.as_str(),
            "images",
            "import",
            path.as_str(),
        ];
        let outcome = services
            .run("nspawn-lifecycle-import", &argv, mc.import_timeout)
            .and_then(|o| o.check(&format!("importing {path}")).map(|()| o));
        failpoint::hit(Point::MidImageImport);
        match outcome {
            Ok(o) => {
                imported += 1;
                tracing::info!(%machine, image = %path, "imported in {:.1}s", o.elapsed.as_secs_f64());
            }
            Err(e) => {
                failed += 1;
                let failed_dir = dir.create_subdir(FAILED_DIR, 0o755)?;
                let mut to = name.clone();
                let mut n = 1;
                while failed_dir.kind(&to)?.is_some() {
                    to = format!("{name}.{n}");
                    n += 1;
                }
                dir.move_noreplace(&name, &failed_dir, &to)?;
                failed_dir.sync()?;
                dir.sync()?;
                tracing::error!(
                    %machine,
                    image = %path,
                    moved_to = %failed_dir.child(&to),
                    "image import failed; tarball set aside: {e:#}"
                );
            }
        }
    }
    Ok((imported, failed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::host::HostRoot;
    use crate::systemd::ExitStatus;
    use std::cell::RefCell;

    /// Records every call; fails the calls named in `fail`.
    #[derive(Default)]
    struct Fake {
        log: RefCell<Vec<String>>,
        fail: Vec<String>,
    }

    impl Fake {
        fn failing(calls: &[&str]) -> Fake {
            Fake {
                fail: calls.iter().map(|s| s.to_string()).collect(),
                ..Fake::default()
            }
        }
        fn record(&self, call: String) -> Result<()> {
            self.log.borrow_mut().push(call.clone());
            if self.fail.contains(&call) {
                anyhow::bail!("{call} failed (test)");
            }
            Ok(())
        }
        fn log(&self) -> Vec<String> {
            self.log.borrow().clone()
        }
    }

    impl Services for Fake {
        fn stop(&self, unit: &str) -> Result<()> {
            self.record(format!("stop {unit}"))
        }
        fn start(&self, unit: &str) -> Result<()> {
            self.record(format!("start {unit}"))
        }
        fn run(&self, prefix: &str, argv: &[&str], _: Duration) -> Result<TransientOutcome> {
            let call = format!("run {}", argv.join(" "));
            self.log.borrow_mut().push(call.clone());
            let bad = self.fail.iter().any(|f| call.contains(f.as_str()));
            Ok(TransientOutcome {
                unit: format!("{prefix}-1.service"),
                exit_status: ExitStatus::Exited(if bad { 1 } else { 0 }),
                result: if bad { "exit-code" } else { "success" }.into(),
                output: if bad {
                    "ctr: unexpected EOF".into()
                } else {
                    String::new()
                },
                output_dropped: 0,
                elapsed: Duration::from_millis(5),
            })
        }
    }

    fn cfg() -> MachineConfig {
        let dir = tempfile::tempdir().unwrap();
        Config::default()
            .machine(&HostRoot::new(dir.path()), &"kube1".parse().unwrap())
            .unwrap()
    }

    fn sequence(fake: &Fake, fail_step: Option<FileStep>) -> (Result<()>, Vec<String>) {
        let m: MachineName = "kube1".parse().unwrap();
        let log = RefCell::new(Vec::new());
        let r = rewire_with_services_stopped(
            &m,
            &cfg(),
            fake,
            &mut |step| {
                fake.log.borrow_mut().push(format!("file {}", step.name()));
                log.borrow_mut().push(step);
                if Some(step) == fail_step {
                    anyhow::bail!("planted failure");
                }
                Ok(String::new())
            },
            &mut || {
                fake.log.borrow_mut().push("import".into());
                Ok((1, 0))
            },
        );
        (r, fake.log())
    }

    #[test]
    fn services_stop_and_start_in_dependency_order() {
        let fake = Fake::default();
        let (r, log) = sequence(&fake, None);
        r.unwrap();
        assert_eq!(
            log,
            [
                "stop kubelet.service",
                "stop containerd.service",
                "file driver root",
                "file library and /dev/char links",
                "file ldconfig",
                "file CDI spec",
                "file unit gate",
                "start containerd.service",
                "import",
                "start kubelet.service",
            ]
        );
    }

    #[test]
    fn a_failed_step_starts_both_services_again_and_names_the_step() {
        let fake = Fake::default();
        let (r, log) = sequence(&fake, Some(FileStep::Links));
        let msg = format!("{:#}", r.unwrap_err());
        assert!(msg.contains("step 'library and /dev/char links'"), "{msg}");
        assert!(msg.contains("planted failure"), "{msg}");
        assert_eq!(
            log[3..],
            [
                "file library and /dev/char links",
                "start containerd.service",
                "start kubelet.service"
            ]
        );
    }

    #[test]
    fn a_failed_containerd_start_still_tries_both_again() {
        let fake = Fake::failing(&["start containerd.service"]);
        let (r, log) = sequence(&fake, None);
        assert!(format!("{:#}", r.unwrap_err()).contains("starting containerd.service"));
        assert_eq!(
            log[7..],
            [
                "start containerd.service",
                "start containerd.service",
                "start kubelet.service"
            ]
        );
    }

    #[test]
    fn a_failed_stop_restarts_what_was_stopped_and_touches_no_file() {
        let fake = Fake::failing(&["stop containerd.service"]);
        let (r, log) = sequence(&fake, None);
        assert!(format!("{:#}", r.unwrap_err()).contains("stopping containerd.service"));
        assert_eq!(
            log,
            [
                "stop kubelet.service",
                "stop containerd.service",
                "start kubelet.service"
            ]
        );
    }

    #[test]
    fn import_problems_never_keep_kubelet_down() {
        let fake = Fake::default();
        let m: MachineName = "kube1".parse().unwrap();
        rewire_with_services_stopped(&m, &cfg(), &fake, &mut |_| Ok(String::new()), &mut || {
            anyhow::bail!("staged images dir is a FIFO")
        })
        .unwrap();
        assert_eq!(fake.log().last().unwrap(), "start kubelet.service");
    }

    #[test]
    fn bad_tarballs_are_set_aside_never_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join("var/lib/nspawn-lifecycle/images");
        std::fs::create_dir_all(images.join("failed")).unwrap();
        std::fs::write(images.join("good.tar"), b"good").unwrap();
        std::fs::write(images.join("bad.tar"), b"bad").unwrap();
        std::fs::write(images.join("failed/bad.tar"), b"older bad").unwrap();
        std::fs::write(images.join("notes.txt"), b"x").unwrap();
        nix::unistd::mkfifo(&images.join("fifo.tar"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let root = MachineRoot::open(dir.path()).unwrap();
        let fake = Fake::failing(&["bad.tar"]);
        let m: MachineName = "kube1".parse().unwrap();
        let (ok, bad) = import_images(&m, &root, &cfg(), &fake).unwrap();
        assert_eq!((ok, bad), (1, 1));
        assert_eq!(
            fake.log(),
            [
                "run /usr/bin/ctr -n k8s.io images import /var/lib/nspawn-lifecycle/images/bad.tar",
                "run /usr/bin/ctr -n k8s.io images import /var/lib/nspawn-lifecycle/images/good.tar",
            ]
        );
        assert_eq!(std::fs::read(images.join("good.tar")).unwrap(), b"good");
        assert_eq!(
            std::fs::read(images.join("failed/bad.tar")).unwrap(),
            b"older bad"
        );
        assert_eq!(
            std::fs::read(images.join("failed/bad.tar.1")).unwrap(),
            b"bad"
        );
        assert!(!images.join("bad.tar").exists());
        assert!(images.join("fifo.tar").exists());
        // Nothing left to import: a second run only retries nothing that failed.
        let fake = Fake::default();
        assert_eq!(import_images(&m, &root, &cfg(), &fake).unwrap(), (1, 0));
    }
}
