//! Crash at any step, without systemd: the failpoints build of the binary is killed with SIGKILL
//! at each named point of pre-start, install and post-start, then run again without the
//! failpoint, as systemd's `Restart=on-failure` would. post-start runs through `rewire-root`,
//! which is post-start's own plan and executor (`poststart::plan` run by `poststart::execute`,
//! the product's one executor) against a machine rootfs on disk with no systemd in it: service stops and
//! starts are logged no-ops, `ldconfig` is the host's `ldconfig -r <rootfs>`, and an import fails
//! as one whose `ctr` could not run (the tarball is set aside).
//!
//! After the kill every file is the old or the new bytes, never a mix, and every staged tarball
//! is in exactly one place; after the rerun everything is exactly what a run that was never
//! killed leaves, with no temp file or staging tree left.
//!
//! Which points exist comes from the binary (`failpoints`); each must be killed, by its exact
//! name, by a case that ran here. The one point that needs the host's systemd (install before
//! `daemon-reload`) is killed under a real systemd in `tests/e2e/scenarios/08-crash-points.sh`,
//! which also kills every post-start point under systemd.
//!
//! Run with `cargo test --features failpoints` (tests/run-all.sh does); without the feature this
//! file is empty. `privileged_*` tests build fixture hosts with device nodes and need root.
#![cfg(feature = "failpoints")]
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

mod rewire_support;

mod common;
use common::copy_tree;
use nspawn_lifecycle::failpoint::{self, Point};
use nspawn_lifecycle::fixture;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_nspawn-lifecycle-helper");
const NSPAWN: &str = "etc/systemd/nspawn/kube1.nspawn";
const DROPIN: &str = "etc/systemd/system/systemd-nspawn@kube1.service.d/50-nspawn-lifecycle.conf";
const OVERRIDE: &str = "etc/systemd/system/systemd-nspawn@kube1.service.d/override.conf";
const HELPER: &str = "usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper";
const OLD: &str = "580.82.07";
const NEW: &str = "580.95.05";

/// Points only a host with systemd reaches (`install` reloads only with the real `/` as host
/// root); scenario 8 of tests/e2e kills them by these exact names.
const NEEDS_HOST_SYSTEMD: &[Point] = &[
    Point::InstallBeforeDaemonReload,
    // Right after the machine's systemd answered on its bus: `rewire-root` has no bus to wait for.
    Point::AfterBus,
];

/// Every point a case killed (and saw die there), by name: filled by [`killed`].
static KILLED: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn helper(host: &Path, args: &[&str], failpoint: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("--host-root")
        .arg(host)
        .args(args)
        .env_remove("NSPAWN_LIFECYCLE_LOG")
        .env_remove("NSPAWN_LIFECYCLE_PAUSE")
        .env_remove("NSPAWN_LIFECYCLE_FAILPOINT");
    if let Some(fp) = failpoint {
        cmd.env("NSPAWN_LIFECYCLE_FAILPOINT", fp);
    }
    cmd.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(host: &Path, args: &[&str]) -> Output {
    let o = helper(host, args, None);
    assert!(o.status.success(), "{args:?}: {}", text(&o));
    o
}

/// Run with the failpoint armed and require that the process died of SIGKILL there.
fn killed(host: &Path, args: &[&str], failpoint: &str) -> Output {
    let o = helper(host, args, Some(failpoint));
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGKILL),
        "{args:?} with failpoint {failpoint} was not killed: {}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains(&format!("failpoint {}", failpoint_name(failpoint))),
        "{}",
        text(&o)
    );
    KILLED
        .lock()
        .unwrap()
        .insert(failpoint_name(failpoint).to_owned());
    o
}

fn failpoint_name(spec: &str) -> &str {
    spec.split_once(':').map_or(spec, |(n, _)| n)
}

/// Every file under `root` whose name looks like a temp file or staging tree of ours.
fn leftovers(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let p = e.path();
            if name.ends_with(".tmp") {
                out.push(p.clone());
            }
            if e.file_type().unwrap().is_dir() {
                walk(&p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, &mut out);
    out
}

fn read_opt(p: &Path) -> Option<Vec<u8>> {
    std::fs::read(p).ok()
}

/// The point names the binary lists (`failpoints`).
fn points_of_the_binary() -> Vec<String> {
    let o = ok(Path::new("/"), &["failpoints"]);
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Runs every kill-and-rerun case of this file (in parallel), then requires that each point the
/// binary lists was killed, by its exact name, by a case that ran, except the points that need
/// the host's systemd, which scenario 8 names exactly.
#[test]
fn privileged_every_point_is_killed_by_a_case_that_ran() {
    std::thread::scope(|s| {
        let cases = [
            s.spawn(pre_start_killed_mid_write_keeps_the_old_file_and_the_rerun_heals),
            s.spawn(install_killed_at_each_write_leaves_old_or_new_bytes_and_the_rerun_heals),
            s.spawn(|| post_start_killed_anywhere_heals_on_the_next_run(false)),
            s.spawn(|| post_start_killed_anywhere_heals_on_the_next_run(true)),
        ];
        for c in cases {
            if let Err(panic) = c.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    let killed = KILLED.lock().unwrap().clone();
    let scenario = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/scenarios/08-crash-points.sh"),
    )
    .unwrap();
    let mut missing = Vec::new();
    for name in points_of_the_binary() {
        let point = Point::from_name(&name).unwrap();
        if NEEDS_HOST_SYSTEMD.contains(&point) {
            assert!(
                scenario.contains(&name),
                "{name} needs the host's systemd but scenario 8 does not kill it"
            );
            assert!(
                !killed.contains(&name),
                "{name} was killed here: drop it from NEEDS_HOST_SYSTEMD"
            );
        } else if !killed.contains(&name) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "killed by no case that ran: {missing:?}"
    );
}

#[test]
fn the_failpoints_command_lists_every_point() {
    let names = points_of_the_binary();
    let want: Vec<&str> = failpoint::ALL.iter().map(|p| p.name()).collect();
    assert_eq!(names, want);
}

#[test]
fn an_unknown_failpoint_name_is_refused_not_ignored() {
    let dir = tempfile::tempdir().unwrap();
    // pre-start refuses a machine without an image before any point could be hit.
    std::fs::create_dir_all(dir.path().join("var/lib/machines/kube1")).unwrap();
    let o = helper(
        dir.path(),
        &["nspawn-lifecycle", "pre-start", "kube1"],
        Some("pre-start-typo"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("pre-start-typo"));
}

// ---- pre-start --------------------------------------------------------------------------------

/// A materialized example host; `old_driver` swaps the driver version for the older one.
fn fixture_host(example: &str, old_driver: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut text = fixture::example(example).unwrap().to_owned();
    if old_driver {
        text = text.replace(NEW, OLD);
    }
    fixture::materialize(&text, dir.path()).unwrap();
    dir
}

fn pre_start_killed_mid_write_keeps_the_old_file_and_the_rerun_heals() {
    let args = ["nspawn-lifecycle", "pre-start", "kube1"];
    // What pre-start writes on the host as it is now, from a run that was never killed.
    let reference = fixture_host("two-gpus", false);
    ok(reference.path(), &args);
    let new = std::fs::read(reference.path().join(NSPAWN)).unwrap();
    // The file a start with one GPU left behind.
    let one = fixture_host("one-gpu", false);
    ok(one.path(), &args);
    let old = std::fs::read(one.path().join(NSPAWN)).unwrap();
    assert_ne!(old, new);

    for had_file in [true, false] {
        let host = fixture_host("two-gpus", false);
        let path = host.path().join(NSPAWN);
        if had_file {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &old).unwrap();
        }
        killed(host.path(), &args, Point::PreStartMidNspawnWrite.name());
        assert_eq!(
            read_opt(&path),
            had_file.then(|| old.clone()),
            "the kill changed the file"
        );
        // The kill came after the temp file was complete: the point really is mid-write.
        let temps = leftovers(host.path());
        assert_eq!(temps.len(), 1, "{temps:?}");
        assert_eq!(std::fs::read(&temps[0]).unwrap(), new);

        let o = ok(host.path(), &args);
        assert_eq!(std::fs::read(&path).unwrap(), new);
        assert_eq!(leftovers(host.path()), Vec::<PathBuf>::new());
        assert!(
            String::from_utf8_lossy(&o.stderr)
                .contains("removed a temporary file a killed run left"),
            "{}",
            text(&o)
        );
        // Healthy: a third run finds nothing to do.
        let o = ok(host.path(), &args);
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("unchanged"),
            "{}",
            text(&o)
        );
    }

    // Killed mid-write of the unit gate (written before the .nspawn file that binds it): no
    // gate and no .nspawn file, one temp file; the rerun writes both and leaves no temp file.
    let host = fixture_host("two-gpus", false);
    let gate = host.path().join("run/nspawn-lifecycle/unit-gate.conf");
    killed(host.path(), &args, Point::PreStartMidGateWrite.name());
    assert!(!gate.exists() && !host.path().join(NSPAWN).exists());
    assert_eq!(leftovers(host.path()).len(), 1);
    ok(host.path(), &args);
    assert_eq!(std::fs::read(host.path().join(NSPAWN)).unwrap(), new);
    assert_eq!(
        std::fs::read_to_string(&gate).unwrap(),
        nspawn_lifecycle::model::gate::CONTENT
    );
    assert_eq!(leftovers(host.path()), Vec::<PathBuf>::new());

    // Killed mid-write of containerd's marker for the boot ahead (after the driver tree, before
    // the .nspawn file): no marker and no .nspawn file, so no boot can start on it; one temp
    // file; the rerun writes both, the marker holding pre-start's words.
    let host = fixture_host("two-gpus", false);
    let released = host
        .path()
        .join("run/nspawn-lifecycle/machines/kube1/released");
    killed(host.path(), &args, Point::PreStartMidGateRelease.name());
    assert!(!released.join("containerd.service").exists());
    assert!(!host.path().join(NSPAWN).exists());
    assert_eq!(leftovers(host.path()).len(), 1);
    ok(host.path(), &args);
    assert_eq!(std::fs::read(host.path().join(NSPAWN)).unwrap(), new);
    assert!(
        std::fs::read_to_string(released.join("containerd.service"))
            .unwrap()
            .starts_with("nspawn-lifecycle pre-start released containerd.service")
    );
    assert!(!released.join("kubelet.service").exists());
    assert_eq!(leftovers(host.path()), Vec::<PathBuf>::new());

    // Killed right after taking the lock: nothing written, the lock free again.
    let host = fixture_host("two-gpus", false);
    killed(host.path(), &args, Point::AfterLock.name());
    assert!(!host.path().join(NSPAWN).exists());
    ok(host.path(), &args);
    assert_eq!(std::fs::read(host.path().join(NSPAWN)).unwrap(), new);
}

// ---- install ----------------------------------------------------------------------------------

/// A host with an older agent's layout (an `override.conf` install rewrites, a `.nspawn` it
/// replaces) and an older helper and drop-in of ours: every file install writes has old bytes.
fn old_install_host() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    for d in [
        "var/lib/machines/kube1/etc",
        "etc/systemd/system",
        "etc/systemd/nspawn",
        "usr/local/lib/nspawn-lifecycle",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    copy_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/legacy-agent-extra"),
        root,
    );
    std::fs::write(root.join(HELPER), b"#!/bin/sh\necho older helper\n").unwrap();
    std::fs::write(
        root.join(DROPIN),
        "# Written by nspawn-lifecycle-helper install for machine kube1; an older release.\n\
         [Service]\nRestart=on-failure\n",
    )
    .unwrap();
    t
}

const INSTALL_FILES: [&str; 4] = [HELPER, NSPAWN, DROPIN, OVERRIDE];

fn install_files(root: &Path) -> BTreeMap<&'static str, Option<Vec<u8>>> {
    INSTALL_FILES
        .iter()
        .map(|f| (*f, read_opt(&root.join(f))))
        .collect()
}

fn install_killed_at_each_write_leaves_old_or_new_bytes_and_the_rerun_heals() {
    let args = ["install", "kube1"];
    let reference = old_install_host();
    let old = install_files(reference.path());
    ok(reference.path(), &args);
    let new = install_files(reference.path());
    for f in INSTALL_FILES {
        assert_ne!(
            old[f], new[f],
            "{f}: the test needs old bytes that install changes"
        );
    }

    // In plan order: the file at the point keeps its old bytes, those before it are new.
    let points = [
        (Point::InstallMidHelperCopy, HELPER),
        (Point::InstallMidNspawnWrite, NSPAWN),
        (Point::InstallMidDropinWrite, DROPIN),
        (Point::InstallMidOverrideWrite, OVERRIDE),
    ];
    for (i, (point, file)) in points.iter().enumerate() {
        let host = old_install_host();
        killed(host.path(), &args, point.name());
        let after = install_files(host.path());
        for (j, f) in INSTALL_FILES.iter().enumerate() {
            let want = if j < i { &new[f] } else { &old[f] };
            assert_eq!(&after[f], want, "{}: {f} after the kill", point.name());
        }
        let temps = leftovers(host.path());
        assert_eq!(temps.len(), 1, "{}: {temps:?}", point.name());
        assert!(
            temps[0].parent() == host.path().join(file).parent(),
            "{}: temp {} is not beside {file}",
            point.name(),
            temps[0].display()
        );
        assert_eq!(
            Some(std::fs::read(&temps[0]).unwrap()),
            new[file],
            "{}: the temp file is not complete",
            point.name()
        );

        ok(host.path(), &args);
        assert_eq!(
            install_files(host.path()),
            new,
            "{}: after the rerun",
            point.name()
        );
        assert_eq!(
            leftovers(host.path()),
            Vec::<PathBuf>::new(),
            "{}",
            point.name()
        );
        let o = ok(host.path(), &args);
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("install kube1: nothing changed"),
            "{}: {}",
            point.name(),
            text(&o)
        );
    }
}

// ---- post-start ---------------------------------------------------------------------------------

/// The machine after a start with the older driver: driver root, links and CDI spec of OLD.
fn machine_after_old_start(old_host: &Path) -> tempfile::TempDir {
    let m = tempfile::tempdir().unwrap();
    rewire_support::debian_machine(m.path());
    rewire(old_host, m.path(), None);
    m
}

const STAGED: &str = "var/lib/nspawn-lifecycle/images";
const TARBALL: &[u8] = b"a tarball staged for this start\n";

/// Stage one tarball in the machine (post-start without a machine sets it aside in `failed/`).
fn stage_tarball(machine: &Path) {
    let d = machine.join(STAGED);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("app.tar"), TARBALL).unwrap();
}

/// Where the staged tarball is now: it must be in exactly one place, whole.
fn tarball_places(machine: &Path) -> Vec<PathBuf> {
    let d = machine.join(STAGED);
    [d.join("app.tar"), d.join("failed/app.tar")]
        .into_iter()
        .filter(|p| read_opt(p).as_deref() == Some(TARBALL))
        .collect()
}

/// post-start's executor (`rewire-root`) against the machine rootfs `machine`.
fn rewire(host: &Path, machine: &Path, failpoint: Option<&str>) -> Output {
    let args = [
        "rewire-root",
        "kube1",
        "--machine-root",
        machine.to_str().unwrap(),
    ];
    match failpoint {
        Some(fp) => killed(host, &args, fp),
        None => ok(host, &args),
    }
}

/// Every CDI spec file of kind nvidia.com/gpu the machine has, with its bytes.
fn nvidia_specs(machine: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for d in ["etc/cdi", "run/cdi"] {
        let Ok(entries) = std::fs::read_dir(machine.join(d)) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with('.') || !(name.ends_with(".json") || name.ends_with(".yaml")) {
                continue;
            }
            let bytes = std::fs::read(&p).unwrap();
            if String::from_utf8_lossy(&bytes).contains("nvidia.com/gpu") {
                out.push((p, bytes));
            }
        }
    }
    out
}

/// post-start killed at each of its points (the file steps on a driver upgrade and on a fresh
/// machine, the service stops and starts, the image import): each artifact is old or new, the
/// staged tarball is in exactly one place, and the rerun leaves exactly the tree of a start that
/// was never killed.
fn post_start_killed_anywhere_heals_on_the_next_run(fresh: bool) {
    let old_host = fixture_host("two-gpus", true);
    let new_host = fixture_host("two-gpus", false);

    // What a start with the new driver leaves when it is never killed.
    let reference = machine_after_old_start(old_host.path());
    let old_spec = std::fs::read(reference.path().join("run/cdi/nvidia.com-gpu.json")).unwrap();
    stage_tarball(reference.path());
    rewire(new_host.path(), reference.path(), None);
    let want = rewire_support::listing(reference.path());
    let new_spec = std::fs::read(reference.path().join("run/cdi/nvidia.com-gpu.json")).unwrap();
    assert_ne!(old_spec, new_spec);
    serde_json::from_slice::<serde_json::Value>(&new_spec).unwrap();
    assert_eq!(
        tarball_places(reference.path()),
        [reference.path().join(STAGED).join("failed/app.tar")]
    );
    let fresh_reference = tempfile::tempdir().unwrap();
    rewire_support::debian_machine(fresh_reference.path());
    stage_tarball(fresh_reference.path());
    rewire(new_host.path(), fresh_reference.path(), None);
    let want_fresh = rewire_support::listing(fresh_reference.path());

    let cases = [
        Point::AfterLock.name().to_owned(),
        Point::AfterKubeletStop.name().to_owned(),
        Point::AfterContainerdStop.name().to_owned(),
        format!("{}:1", Point::MidLinks.name()),
        format!("{}:6", Point::MidLinks.name()),
        Point::MidCdiWrite.name().to_owned(),
        Point::PostStartMidGateRelease.name().to_owned(),
        Point::AfterContainerdStart.name().to_owned(),
        Point::MidImageImport.name().to_owned(),
        Point::PostStartMidKubeletGateRelease.name().to_owned(),
        Point::BeforeKubeletStart.name().to_owned(),
    ];
    for case in &cases {
        let marker_write = [
            Point::PostStartMidGateRelease.name(),
            Point::PostStartMidKubeletGateRelease.name(),
        ];
        if !fresh && marker_write.contains(&case.as_str()) {
            continue; // the marker is there from the last start: nothing is written
        }
        let what = format!(
            "{case} ({})",
            if fresh {
                "fresh machine"
            } else {
                "driver upgrade"
            }
        );
        let machine = if fresh {
            let m = tempfile::tempdir().unwrap();
            rewire_support::debian_machine(m.path());
            m
        } else {
            machine_after_old_start(old_host.path())
        };
        let m = machine.path();
        stage_tarball(m);
        rewire(new_host.path(), m, Some(case));

        // Killed: each artifact is whole, old or new; the tarball is in one place. (The driver
        // root is nspawn's binds, made with the machine: nothing post-start writes.)
        let spec = read_opt(&m.join("run/cdi/nvidia.com-gpu.json"));
        let old_sp = (!fresh).then(|| old_spec.clone());
        assert!(
            spec == old_sp || spec.as_ref() == Some(&new_spec),
            "{what}: CDI spec is neither old nor new"
        );
        assert_eq!(tarball_places(m).len(), 1, "{what}: staged tarball");

        // The next start heals: exactly the tree of a start that was never killed.
        rewire(new_host.path(), m, None);
        let want = if fresh { &want_fresh } else { &want };
        assert_eq!(
            &rewire_support::listing(m),
            want,
            "{what}: tree after the rerun"
        );
        assert_eq!(leftovers(m), Vec::<PathBuf>::new(), "{what}");
        let specs = nvidia_specs(m);
        assert_eq!(specs.len(), 1, "{what}: {specs:?}");
        assert_eq!(specs[0].1, new_spec, "{what}");
        assert_eq!(tarball_places(m).len(), 1, "{what}: staged tarball");
    }
}
