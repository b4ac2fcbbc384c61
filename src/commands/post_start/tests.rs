use super::*;
use crate::apply::executor::*;
use crate::apply::images::*;
use crate::apply::parts::{self, AnyPart, Applied};
use crate::config::Config;
use crate::fs::host::HostRoot;
use crate::systemd::ExitStatus;
use crate::systemd::TransientOutcome;
use crate::systemd::services::Services;
use crate::types::machine_name::Subject;
use crate::types::paths::UnitName;
use std::cell::RefCell;
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// Records every call; fails the calls named in `fail`. Models what the tests rely on of
/// the machine's systemd: which units run, and the unit gate (src/apply/gate.rs): while the boot
/// is gated and the marker does not exist, a start of containerd or kubelet is skipped the
/// way systemd skips a unit with an unmet `ConditionPathExists=`, so the start job ends
/// "done", the unit stays inactive, and [`MachineServices::start`] reports it. Each unit has
/// its own marker: containerd's exists once the gate file step ran, kubelet's once its own
/// gate step ran.
struct Fake {
    log: RefCell<Vec<String>>,
    fail: Vec<String>,
    running: RefCell<Vec<String>>,
    gated: bool,
    /// The units whose gate marker exists.
    released: RefCell<Vec<String>>,
    /// What each `run` is given as its deadline, and the identity of its stdin.
    runs: RefCell<Vec<Run>>,
    /// How long each `run` takes.
    run_takes: Duration,
    /// File steps report no library link changed (default: changed).
    links_unchanged: bool,
    /// What each `ldconfig` step was told about the links.
    ldconfig_told: RefCell<Vec<bool>>,
}

/// One `run`: its deadline and its stdin's `(st_dev, st_ino)`.
type Run = (Duration, Option<(u64, u64)>);

impl Default for Fake {
    /// A machine that is up: both services run, the gate was released at its boot.
    fn default() -> Fake {
        Fake {
            log: RefCell::default(),
            fail: Vec::new(),
            running: RefCell::new(vec!["kubelet.service".into(), "containerd.service".into()]),
            gated: false,
            released: RefCell::new(vec!["kubelet.service".into(), "containerd.service".into()]),
            runs: RefCell::default(),
            run_takes: Duration::ZERO,
            links_unchanged: false,
            ldconfig_told: RefCell::default(),
        }
    }
}

impl Fake {
    fn failing(calls: &[&str]) -> Fake {
        Fake {
            fail: calls.iter().map(|s| s.to_string()).collect(),
            ..Fake::default()
        }
    }
    /// A GPU machine's boot: the gate kept both services from starting.
    fn gated_boot() -> Fake {
        Fake {
            running: RefCell::default(),
            gated: true,
            released: RefCell::default(),
            ..Fake::default()
        }
    }
    /// A boot pre-start released containerd for: the boot started it, kubelet is gated.
    fn containerd_released_boot() -> Fake {
        Fake {
            running: RefCell::new(vec!["containerd.service".into()]),
            gated: true,
            released: RefCell::new(vec!["containerd.service".into()]),
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
    fn running(&self) -> Vec<String> {
        self.running.borrow().clone()
    }
}

impl Services for Fake {
    fn stop(&self, unit: &str) -> Result<()> {
        self.record(format!("stop {unit}"))?;
        self.running.borrow_mut().retain(|u| u != unit);
        Ok(())
    }
    fn start(&self, unit: &str) -> Result<()> {
        self.record(format!("start {unit}"))?;
        if self.gated && !self.released.borrow().iter().any(|u| u == unit) {
            anyhow::bail!(
                "{unit} is inactive (dead) after its start job finished; an unmet \
                 Condition…= skips a unit that way (test: gated, no marker)"
            );
        }
        let mut running = self.running.borrow_mut();
        if !running.iter().any(|u| u == unit) {
            running.push(unit.to_owned());
        }
        Ok(())
    }
    fn is_active(&self, unit: &str) -> Result<bool> {
        Ok(self.running.borrow().iter().any(|u| u == unit))
    }
    fn run(
        &self,
        prefix: &str,
        argv: &[&str],
        stdin: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<TransientOutcome> {
        // What ctr would read: the stdin file's identity and its first bytes.
        let (id, head) = match stdin {
            Some(fd) => {
                let st = nix::sys::stat::fstat(fd).unwrap();
                let mut buf = [0u8; 64];
                let n = nix::sys::uio::pread(fd, &mut buf, 0).unwrap();
                (
                    Some((st.st_dev, st.st_ino)),
                    String::from_utf8_lossy(&buf[..n]).into_owned(),
                )
            }
            None => (None, String::new()),
        };
        let call = format!("run {} <{head}", argv.join(" "));
        self.log.borrow_mut().push(call.clone());
        self.runs.borrow_mut().push((timeout, id));
        let takes = self.run_takes.min(timeout);
        std::thread::sleep(takes);
        let timed_out = takes < self.run_takes;
        let bad = timed_out || self.fail.iter().any(|f| call.contains(f.as_str()));
        Ok(TransientOutcome {
            unit: format!("{prefix}-1.service"),
            exit_status: if timed_out {
                ExitStatus::Killed {
                    signal: 15,
                    core_dumped: false,
                }
            } else {
                ExitStatus::Exited(if bad { 1 } else { 0 })
            },
            result: if timed_out {
                "timeout"
            } else if bad {
                "exit-code"
            } else {
                "success"
            }
            .into(),
            output: if bad {
                "ctr: unexpected EOF".into()
            } else {
                String::new()
            },
            output_dropped: 0,
            elapsed: takes,
        })
    }
}

fn cfg() -> MachineConfig {
    let dir = tempfile::tempdir().unwrap();
    Config::default()
        .machine(&HostRoot::new(dir.path()), &"kube1".parse().unwrap())
        .unwrap()
}

/// The machine side of a run, recorded in the fake's log: each part as `file <step>`
/// (`file ldconfig` for the loader cache), containerd's gate as `file unit gate`, kubelet's as
/// `file kubelet's unit gate` (which also create the markers the fake's starts look for), the
/// imports as `import`.
struct FakeWork<'a> {
    fake: &'a Fake,
    fail: Option<&'static dyn AnyPart<parts::Running>>,
    import_fails: bool,
}

impl Work for FakeWork<'_> {
    fn apply(
        &self,
        part: &'static dyn AnyPart<parts::Running>,
        links_changed: bool,
    ) -> Result<Applied> {
        if part.is::<parts::LdCache>() {
            self.fake.ldconfig_told.borrow_mut().push(links_changed);
        }
        self.fake
            .log
            .borrow_mut()
            .push(format!("file {}", Step::Apply(part)));
        if self.fail.is_some_and(|f| *f == *part) {
            anyhow::bail!("planted failure");
        }
        Ok(Applied {
            line: String::new(),
            library_links_changed: !self.fake.links_unchanged,
        })
    }
    fn release(&self, unit: &UnitName, _: Point) -> Result<String> {
        let name = if unit.as_str() == "kubelet.service" {
            "file kubelet's unit gate"
        } else {
            "file unit gate"
        };
        self.fake.log.borrow_mut().push(name.into());
        self.fake.released.borrow_mut().push(unit.to_string());
        Ok(String::new())
    }
    fn import(&self) -> Result<(usize, usize)> {
        self.fake.log.borrow_mut().push("import".into());
        if self.import_fails {
            anyhow::bail!("staged images dir is a FIFO");
        }
        Ok((1, 0))
    }
}

/// pre-start's side: each part diffed (`diff <part>`), then applied (`apply <part>`) or found
/// as it must be (`unchanged <part>`, the parts in `current`).
struct FakeBoot<'a> {
    fake: &'a Fake,
    fail: Option<BootStep>,
    current: &'a [BootStep],
}

impl BootWork for FakeBoot<'_> {
    fn diff(&self, part: BootStep) -> Result<Vec<crate::model::Change>> {
        self.fake.log.borrow_mut().push(format!("diff {part}"));
        Ok(if self.current.contains(&part) {
            Vec::new()
        } else {
            vec![crate::model::Change::new(
                part.check(),
                crate::model::Action::Write,
                format!("/{part}"),
                "",
            )]
        })
    }

    fn unchanged(&self, part: BootStep) -> Result<String> {
        self.fake.log.borrow_mut().push(format!("unchanged {part}"));
        Ok(String::new())
    }

    fn apply(&self, part: BootStep) -> Result<String> {
        self.fake.log.borrow_mut().push(format!("apply {part}"));
        if self.fail == Some(part) {
            anyhow::bail!("planted failure");
        }
        Ok(String::new())
    }
}

fn sequence(
    fake: &Fake,
    fail: Option<&'static dyn AnyPart<parts::Running>>,
) -> (Result<()>, Vec<String>) {
    let kube1: MachineName = "kube1".parse().unwrap();
    let m = Subject::Machine(&kube1);
    let work = FakeWork {
        fake,
        fail,
        import_fails: false,
    };
    let r = execute(&plan(&cfg(), Target::Machine, Order::Gated), m, &work, fake);
    (r, fake.log())
}

/// Host mode is the same plan with the host's parts: no driver root to check (the host's is
/// `/`), no library links (its installer's); every other step is the machine's.
#[test]
fn the_host_plan_differs_only_in_its_file_steps() {
    let (machine, host) = (
        plan(&cfg(), Target::Machine, Order::Gated),
        plan(&cfg(), Target::Host, Order::Gated),
    );
    assert_eq!(
        host.to_string(),
        "stop kubelet.service → stop containerd.service → /dev/char links → ldconfig → CDI \
         spec → release containerd.service → start containerd.service → import staged images \
         from /var/lib/nspawn-lifecycle/images → release kubelet.service → start \
         kubelet.service"
    );
    let others = |p: &Plan<Step>| -> Vec<Step> {
        p.steps
            .iter()
            .filter(|s| {
                !matches!(s, Step::Apply(p) if p.is::<parts::DriverRoot>() || p.is::<parts::Links>())
            })
            .cloned()
            .collect()
    };
    assert_eq!(others(&machine), others(&host));
}

/// pre-start's plan: what the boot binds first, the `.nspawn` file last; each part is
/// applied only when its diff is not empty; a failed part names pre-start and the part and ends
/// the run there (its parts are its own type: it has no service to reach). `plan`'s list is
/// the same parts' diffs, in order, a part that cannot be read one change that fails.
#[test]
fn the_pre_start_plan_runs_through_the_same_executor() {
    use crate::apply::executor::pre_start;
    assert_eq!(
        pre_start(true, true).to_string(),
        "host device nodes → device cgroup → unit gate file → driver tree → unit gate for the boot → .nspawn file"
    );
    assert_eq!(
        pre_start(false, false).to_string(),
        "host device nodes → driver tree → .nspawn file"
    );
    let fake = Fake::default();
    let work = FakeBoot {
        fake: &fake,
        fail: Some(&parts::DriverTree),
        current: &[&parts::DeviceCgroup],
    };
    let e = execute_boot(&pre_start(true, true), &kube1(), &work).unwrap_err();
    assert_eq!(
        format!("{e:#}"),
        "pre-start of kube1: step 'driver tree': planted failure"
    );
    assert_eq!(
        fake.log(),
        [
            "diff host device nodes",
            "apply host device nodes",
            "diff device cgroup",
            "unchanged device cgroup",
            "diff unit gate file",
            "apply unit gate file",
            "diff driver tree",
            "apply driver tree"
        ]
    );
    let fake = Fake::default();
    let work = FakeBoot {
        fake: &fake,
        fail: None,
        current: &[&parts::HostNodes, &parts::NspawnFile],
    };
    execute_boot(&pre_start(false, true), &kube1(), &work).unwrap();
    assert_eq!(
        fake.log(),
        [
            "diff host device nodes",
            "unchanged host device nodes",
            "diff unit gate file",
            "apply unit gate file",
            "diff driver tree",
            "apply driver tree",
            "diff unit gate for the boot",
            "apply unit gate for the boot",
            "diff .nspawn file",
            "unchanged .nspawn file"
        ]
    );
    let fake = Fake::default();
    let work = FakeBoot {
        fake: &fake,
        fail: None,
        current: &[&parts::HostNodes],
    };
    let listed: Vec<String> = pending_boot(&pre_start(false, false), &work)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(listed, ["write /driver tree", "write /.nspawn file"]);
    assert!(
        !fake.log().iter().any(|l| l.starts_with("apply")),
        "plan's list applies nothing: {:?}",
        fake.log()
    );
}

/// The one executor runs the host plan with the same rules: on a gated boot each
/// service starts once after its own gate; a failed `/dev/char` step on a running host puts
/// both services back and names the step.
/// ldconfig hears from the links part whether a library link changed: nothing changed, it may
/// skip when the cache is current. Host mode has no links part of ours: its cache alone
/// decides.
#[test]
fn ldconfig_hears_from_each_targets_links_step() {
    for target in [Target::Machine, Target::Host] {
        let fake = Fake {
            links_unchanged: true,
            ..Fake::default()
        };
        let work = FakeWork {
            fake: &fake,
            fail: None,
            import_fails: false,
        };
        execute(
            &plan(&cfg(), target, Order::Gated),
            Subject::Machine(&kube1()),
            &work,
            &fake,
        )
        .unwrap();
        assert_eq!(*fake.ldconfig_told.borrow(), [false], "{target:?}");
    }
}

#[test]
fn the_host_plan_runs_through_the_same_executor() {
    let fake = Fake::gated_boot();
    let work = FakeWork {
        fake: &fake,
        fail: None,
        import_fails: false,
    };
    execute(
        &plan(&cfg(), Target::Host, Order::Gated),
        Subject::Host,
        &work,
        &fake,
    )
    .unwrap();
    assert_eq!(
        fake.log(),
        [
            "stop kubelet.service",
            "stop containerd.service",
            "file /dev/char links",
            "file ldconfig",
            "file CDI spec",
            "file unit gate",
            "start containerd.service",
            "import",
            "file kubelet's unit gate",
            "start kubelet.service",
        ]
    );
    let fake = Fake::default();
    let work = FakeWork {
        fake: &fake,
        fail: Some(&parts::DevChar),
        import_fails: false,
    };
    let err = execute(
        &plan(&cfg(), Target::Host, Order::Gated),
        Subject::Host,
        &work,
        &fake,
    )
    .unwrap_err();
    assert_eq!(
        format!("{err}"),
        "post-start of the host: step '/dev/char links'"
    );
    assert_eq!(fake.running(), ["containerd.service", "kubelet.service"]);
}

/// The plan is a plain value, in the order of a start (docs/wiring.md).
#[test]
fn the_plan_is_a_value_in_the_order_of_the_design() {
    assert_eq!(
        plan(&cfg(), Target::Machine, Order::Gated).to_string(),
        "stop kubelet.service → stop containerd.service → driver root → library links → \
         /dev/char links → ldconfig → CDI spec → release containerd.service → start containerd.service \
         → import staged images from /var/lib/nspawn-lifecycle/images → release \
         kubelet.service → start kubelet.service"
    );
}

/// Containerd released by pre-start for this boot is neither stopped nor released
/// again; kubelet still waits for every step.
#[test]
fn with_containerd_released_before_post_start_only_kubelet_waits() {
    assert_eq!(
        plan(&cfg(), Target::Machine, Order::ContainerdReleased).to_string(),
        "stop kubelet.service → driver root → library links → /dev/char links → ldconfig → \
         CDI spec → start containerd.service → import staged images from \
         /var/lib/nspawn-lifecycle/images → release kubelet.service → start kubelet.service"
    );
    // A boot where the gate let containerd through (its marker came from pre-start) and
    // kept kubelet: containerd is started by the boot and never stopped, kubelet starts once
    // after its own marker.
    let fake = Fake::containerd_released_boot();
    let work = FakeWork {
        fake: &fake,
        fail: None,
        import_fails: false,
    };
    let p = plan(&cfg(), Target::Machine, Order::ContainerdReleased);
    execute(&p, Subject::Machine(&kube1()), &work, &fake).unwrap();
    let log = fake.log();
    assert!(
        !log.iter().any(|l| l == "stop containerd.service"),
        "{log:?}"
    );
    assert!(!log.iter().any(|l| l == "file unit gate"), "{log:?}");
    let at = |l: &str| log.iter().position(|x| x == l).unwrap();
    assert!(
        at("file CDI spec") < at("start containerd.service"),
        "{log:?}"
    );
    assert!(at("start containerd.service") < at("import"), "{log:?}");
    assert!(
        at("file kubelet's unit gate") < at("start kubelet.service"),
        "{log:?}"
    );
    assert_eq!(fake.running(), ["containerd.service", "kubelet.service"]);
    // A failed step leaves containerd running (it was never stopped) and starts nothing.
    let fake = Fake::containerd_released_boot();
    let work = FakeWork {
        fake: &fake,
        fail: Some(&parts::DriverRoot),
        import_fails: false,
    };
    assert!(execute(&p, Subject::Machine(&kube1()), &work, &fake).is_err());
    assert_eq!(fake.running(), ["containerd.service"]);
    assert!(
        !fake.log().iter().any(|l| l.starts_with("start ")),
        "{:?}",
        fake.log()
    );
}

/// Which order post-start takes comes from the machine's markers, in its unit's start only;
/// host mode (no pre-start) always takes the gated one.
#[test]
fn the_order_is_read_from_containerds_marker() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let mc = cfg();
    let on_machine = markers(&host, Subject::Machine(&kube1()));
    let of = |t, m, start| Order::of(t, m, &mc, start).unwrap();
    assert_eq!(of(Target::Machine, &on_machine, true), Order::Gated);
    gate::prepare_boot(&host, &kube1(), Some(&mc.containerd_unit)).unwrap();
    assert_eq!(
        of(Target::Machine, &on_machine, true),
        Order::ContainerdReleased
    );
    // By hand on a running machine: both services stopped and started, as always.
    assert_eq!(of(Target::Machine, &on_machine, false), Order::Gated);
    let on_host = markers(&host, Subject::Host);
    on_host
        .release(&mc.containerd_unit, Point::PostStartMidGateRelease)
        .unwrap();
    assert_eq!(of(Target::Host, &on_host, true), Order::Gated);
    gate::prepare_boot(&host, &kube1(), None).unwrap();
    assert_eq!(of(Target::Machine, &on_machine, true), Order::Gated);
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
            "file library links",
            "file /dev/char links",
            "file ldconfig",
            "file CDI spec",
            "file unit gate",
            "start containerd.service",
            "import",
            "file kubelet's unit gate",
            "start kubelet.service",
        ]
    );
}

#[test]
fn a_failed_step_starts_both_services_again_and_names_the_step() {
    let fake = Fake::default();
    let (r, log) = sequence(&fake, Some(&parts::Links));
    let msg = format!("{:#}", r.unwrap_err());
    assert!(msg.contains("step 'library links'"), "{msg}");
    assert!(msg.contains("planted failure"), "{msg}");
    assert_eq!(
        log[3..],
        [
            "file library links",
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
        log[8..],
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
    let kube1: MachineName = "kube1".parse().unwrap();
    let m = Subject::Machine(&kube1);
    let work = FakeWork {
        fake: &fake,
        fail: None,
        import_fails: true,
    };
    execute(
        &plan(&cfg(), Target::Machine, Order::Gated),
        m,
        &work,
        &fake,
    )
    .unwrap();
    assert_eq!(fake.log().last().unwrap(), "start kubelet.service");
}

const CTR: &str = "run /usr/bin/ctr -n k8s.io images import -";
const STAGED: &str = "var/lib/nspawn-lifecycle/images";

/// Write a staged tarball whose mtime is `age` seconds in the past.
fn stage(dir: &std::path::Path, name: &str, bytes: &[u8], age: u64) {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    let t = std::time::SystemTime::now() - Duration::from_secs(age);
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// Run `f` with this thread's log lines captured; returns its result and the lines.
fn logged<R>(f: impl FnOnce() -> R) -> (R, String) {
    use std::sync::{Arc, Mutex};
    let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
    let w = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_ansi(false)
        .without_time()
        .with_writer(move || Writer(w.clone()))
        .finish();
    struct Writer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Writer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let r = tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
    (r, text)
}

#[test]
fn bad_tarballs_are_set_aside_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join(STAGED);
    std::fs::create_dir_all(images.join("failed")).unwrap();
    stage(&images, "good.tar", b"good", 10);
    stage(&images, "bad.tar", b"bad", 20);
    std::fs::write(images.join("failed/bad.tar"), b"older bad").unwrap();
    std::fs::write(images.join("notes.txt"), b"x").unwrap();
    nix::unistd::mkfifo(&images.join("fifo.tar"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", images.join("link.tar")).unwrap();
    let root = MachineRoot::open(dir.path()).unwrap();
    let fake = Fake::failing(&["<bad"]);
    let kube1: MachineName = "kube1".parse().unwrap();
    let m = Subject::Machine(&kube1);
    let (ok, bad) = import_images(m, &root, &cfg(), &fake).unwrap();
    assert_eq!((ok, bad), (1, 1));
    assert_eq!(fake.log(), [format!("{CTR} <bad"), format!("{CTR} <good")]);
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
    assert!(images.join("link.tar").is_symlink());
    // Nothing left to import: a second run only retries nothing that failed.
    let fake = Fake::default();
    assert_eq!(import_images(m, &root, &cfg(), &fake).unwrap(), (1, 0));
}

/// At most `importMaxImages` imports per start; the rest stay in place and
/// one line says how many, which and why.
#[test]
fn imports_stop_at_the_count_limit_and_report_what_was_left() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join(STAGED);
    std::fs::create_dir_all(&images).unwrap();
    for (i, n) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        stage(&images, &format!("{n}.tar"), n.as_bytes(), 100 - i as u64);
    }
    let root = MachineRoot::open(dir.path()).unwrap();
    let mut mc = cfg();
    mc.import_max_images = 2;
    let fake = Fake::default();
    let kube1: MachineName = "kube1".parse().unwrap();
    let m = Subject::Machine(&kube1);
    let (r, logs) = logged(|| import_images(m, &root, &mc, &fake));
    assert_eq!(r.unwrap(), (2, 0));
    assert_eq!(fake.log(), [format!("{CTR} <a"), format!("{CTR} <b")]);
    for n in ["a", "b", "c", "d", "e"] {
        assert!(images.join(format!("{n}.tar")).is_file(), "{n}.tar moved");
    }
    let left: Vec<&str> = logs.lines().filter(|l| l.contains("left ")).collect();
    assert_eq!(left.len(), 1, "{logs}");
    assert!(
        left[0].contains(
            "left 3 staged image(s) in /var/lib/nspawn-lifecycle/images for the next start \
             (importMaxImages = 2 imports per start): c.tar, d.tar, e.tar"
        ),
        "{logs}"
    );
    // The next start takes the least recently imported first: the three left behind.
    let fake = Fake::default();
    mc.import_max_images = 3;
    assert_eq!(import_images(m, &root, &mc, &fake).unwrap(), (3, 0));
    assert_eq!(
        fake.log(),
        [
            format!("{CTR} <c"),
            format!("{CTR} <d"),
            format!("{CTR} <e")
        ]
    );
    // 0 imports nothing and says so.
    mc.import_max_images = 0;
    let fake = Fake::default();
    let (r, logs) = logged(|| import_images(m, &root, &mc, &fake));
    assert_eq!(r.unwrap(), (0, 0));
    assert!(fake.log().is_empty());
    assert!(logs.contains("left 5 staged image(s)"), "{logs}");
}

/// All imports of a start share `importBudgetSeconds`; each gets the
/// smaller of `importTimeoutSeconds` and what is left; the rest wait for the next start.
#[test]
fn imports_share_one_time_budget() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join(STAGED);
    std::fs::create_dir_all(&images).unwrap();
    for (i, n) in ["a", "b", "c", "d"].iter().enumerate() {
        stage(&images, &format!("{n}.tar"), n.as_bytes(), 100 - i as u64);
    }
    let root = MachineRoot::open(dir.path()).unwrap();
    let mut mc = cfg();
    mc.import_budget = Duration::from_secs(3);
    let fake = Fake {
        run_takes: Duration::from_millis(1200),
        ..Fake::default()
    };
    let kube1: MachineName = "kube1".parse().unwrap();
    let m = Subject::Machine(&kube1);
    let started = Instant::now();
    let (r, logs) = logged(|| import_images(m, &root, &mc, &fake));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.unwrap(), (2, 0));
    let runs = fake.runs.borrow().clone();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[0].0 <= Duration::from_secs(3) && runs[0].0 > Duration::from_millis(2900));
    assert!(runs[1].0 <= Duration::from_millis(1800), "{runs:?}");
    assert!(
        logs.contains("left 2 staged image(s)")
            && logs
                .contains("(the import budget (importBudgetSeconds = 3) is spent): c.tar, d.tar"),
        "{logs}"
    );
    for n in ["a", "b", "c", "d"] {
        assert!(images.join(format!("{n}.tar")).is_file());
    }
}

/// An import the budget cuts short is not a bad tarball: it stays for the next start. One
/// that times out on its own full deadline is set aside.
#[test]
fn an_import_cut_short_by_the_budget_stays_one_timing_out_on_its_own_is_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join(STAGED);
    std::fs::create_dir_all(&images).unwrap();
    stage(&images, "a.tar", b"a", 20);
    stage(&images, "b.tar", b"b", 10);
    let root = MachineRoot::open(dir.path()).unwrap();
    let kube1: MachineName = "kube1".parse().unwrap();
    let m = Subject::Machine(&kube1);
    let mut mc = cfg();
    mc.import_budget = Duration::from_secs(3);
    let fake = Fake {
        run_takes: Duration::from_millis(1900),
        ..Fake::default()
    };
    let (r, logs) = logged(|| import_images(m, &root, &mc, &fake));
    assert_eq!(r.unwrap(), (1, 0));
    assert!(images.join("b.tar").is_file(), "{logs}");
    assert!(!images.join("failed").exists(), "{logs}");
    assert!(
        logs.contains("left 1 staged image(s)")
            && logs.contains("ran out during an import): b.tar"),
        "{logs}"
    );

    mc.import_timeout = Duration::from_secs(1);
    mc.import_budget = Duration::from_secs(600);
    let fake = Fake {
        run_takes: Duration::from_secs(2),
        ..Fake::default()
    };
    mc.import_max_images = 1;
    assert_eq!(import_images(m, &root, &mc, &fake).unwrap(), (0, 1));
    assert_eq!(std::fs::read(images.join("failed/b.tar")).unwrap(), b"b");
}

/// No tarball name reaches ctr's command line (a leading `-` would be an
/// option), ctr reads the very file that was checked, and names with control characters
/// or at NAME_MAX are imported, set aside and logged without harm.
#[test]
fn tarball_names_never_reach_the_command_line_and_ctr_reads_the_checked_file() {
    use std::os::unix::fs::MetadataExt as _;
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join(STAGED);
    std::fs::create_dir_all(images.join("failed")).unwrap();
    let long = format!("{}.tar", "x".repeat(NAME_MAX - 4));
    let names = [
        "--help.tar".to_owned(),
        "-n default.tar".to_owned(),
        "evil\n{\"level\":\"INFO\"} forged.tar".to_owned(),
        "esc\u{1b}[2J.tar".to_owned(),
        long.clone(),
    ];
    for (i, n) in names.iter().enumerate() {
        stage(&images, n, format!("bad{i}").as_bytes(), 100 - i as u64);
    }
    // An older failure of the long name already sits in failed/: the suffixed name must be
    // shortened to fit NAME_MAX.
    std::fs::write(images.join("failed").join(&long), b"older").unwrap();
    let ids: Vec<(u64, u64)> = names
        .iter()
        .map(|n| {
            let md = std::fs::metadata(images.join(n)).unwrap();
            (md.dev(), md.ino())
        })
        .collect();
    let root = MachineRoot::open(dir.path()).unwrap();
    let fake = Fake::failing(&["<bad"]);
    let kube1: MachineName = "kube1".parse().unwrap();
    let m = Subject::Machine(&kube1);
    let (r, logs) = logged(|| import_images(m, &root, &cfg(), &fake));
    assert_eq!(r.unwrap(), (0, 5));
    for (i, call) in fake.log().iter().enumerate() {
        assert_eq!(call, &format!("{CTR} <bad{i}"));
    }
    let seen: Vec<Option<(u64, u64)>> = fake.runs.borrow().iter().map(|r| r.1).collect();
    assert_eq!(seen, ids.iter().copied().map(Some).collect::<Vec<_>>());
    for n in &names[..4] {
        assert!(images.join("failed").join(n).is_file(), "{n:?}");
    }
    let shortened = format!("{}.1", &long[..NAME_MAX - 2]);
    assert_eq!(
        std::fs::read(images.join("failed").join(&shortened)).unwrap(),
        b"bad4"
    );
    // Every line of the log is one event: the newline in a name did not forge one.
    assert!(!logs.lines().any(|l| l.starts_with('{')), "{logs}");
    assert!(logs.contains("evil\\n{\\\"level"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "{logs}");
}

/// A `.tar` name that is not UTF-8 is skipped with a warning (escaped), not imported blind.
#[test]
fn non_utf8_tarball_names_are_skipped_and_reported() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join(STAGED);
    std::fs::create_dir_all(&images).unwrap();
    let raw = std::ffi::OsStr::from_bytes(b"bad\xff\n.tar");
    std::fs::write(images.join(raw), b"x").unwrap();
    let root = MachineRoot::open(dir.path()).unwrap();
    let fake = Fake::default();
    let kube1: MachineName = "kube1".parse().unwrap();
    let m = Subject::Machine(&kube1);
    let (r, logs) = logged(|| import_images(m, &root, &cfg(), &fake));
    assert_eq!(r.unwrap(), (0, 0));
    assert!(fake.log().is_empty());
    assert!(
        logs.contains("not UTF-8; skipped") && logs.contains("bad\u{fffd}\\n.tar"),
        "{logs}"
    );
    assert!(images.join(raw).is_file());
}

/// On a gated boot nothing ran before post-start, so a failed step starts
/// nothing (the start would be skipped by the gate anyway and the unit left inactive).
#[test]
fn on_a_gated_boot_a_failed_step_starts_nothing() {
    let fake = Fake::gated_boot();
    let (r, logs) = logged(|| sequence(&fake, Some(&parts::Links)));
    let (r, log) = r;
    assert!(format!("{:#}", r.unwrap_err()).contains("planted failure"));
    assert_eq!(
        log,
        [
            "stop kubelet.service",
            "stop containerd.service",
            "file driver root",
            "file library links",
        ]
    );
    assert!(fake.running().is_empty());
    assert!(
        logs.contains("neither containerd.service nor kubelet.service was running before it")
            && logs.contains("the unit gate holds them until a post-start succeeds")
            && logs.contains("Restart=on-failure"),
        "{logs}"
    );
}

/// A failure on a running machine puts back what ran, and only that.
#[test]
fn a_failure_on_a_running_machine_restores_only_what_was_running() {
    let fake = Fake::default();
    fake.running
        .borrow_mut()
        .retain(|u| u == "containerd.service");
    let (r, log) = sequence(&fake, Some(&parts::CdiSpec));
    assert!(r.is_err());
    assert_eq!(log.last().unwrap(), "start containerd.service");
    assert!(
        !log.contains(&"start kubelet.service".to_owned()),
        "{log:?}"
    );
    assert_eq!(fake.running(), ["containerd.service"]);
}

/// The gated boot that succeeds: each service starts once, after its own gate step, and
/// runs; kubelet's marker appears only after the imports (post-start overlaps the
/// boot, so a boot that reaches kubelet once containerd's marker exists must still skip it).
#[test]
fn on_a_gated_boot_each_service_starts_once_after_its_own_gate() {
    let fake = Fake::gated_boot();
    let (r, log) = sequence(&fake, None);
    r.unwrap();
    let at = |l: &str| log.iter().position(|x| x == l).unwrap();
    let starts: Vec<usize> = (0..log.len())
        .filter(|&i| log[i].starts_with("start "))
        .collect();
    assert_eq!(starts.len(), 2, "{log:?}");
    assert!(
        at("file unit gate") < at("start containerd.service"),
        "{log:?}"
    );
    assert!(at("import") < at("file kubelet's unit gate"), "{log:?}");
    assert!(
        at("file kubelet's unit gate") < at("start kubelet.service"),
        "{log:?}"
    );
    assert_eq!(fake.running(), ["containerd.service", "kubelet.service"]);
    // And the fake really models the gate: without the marker a start is refused.
    let gated = Fake::gated_boot();
    let err = gated.start("kubelet.service").unwrap_err();
    assert!(format!("{err:#}").contains("is inactive (dead)"));
    assert!(gated.running().is_empty());
}

/// The machine most tests run for.
fn kube1() -> MachineName {
    "kube1".parse().unwrap()
}
