//! Fixture hosts (materialized with mknod: root) and machine trees wired by post-start's own
//! steps, with the host's binds stood in for by copies of their file names.
use super::judge::*;
use super::*;
use crate::config::Config;
use crate::fixture;
use crate::fs::host::HostRoot;
use crate::model::gate;
use crate::model::layout;
use crate::systemd::ExecRun;

const OLD: &str = "580.82.07";
const NEW: &str = "580.95.05";
const GPU1: &str = "GPU-a91e4b37-5c2d-4f08-b6e3-17c9d0f8a254";

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "privileged tests build host trees with mknod and must run as root"
    );
}

/// The two-GPU example host, edited by `edit`.
fn host_from(edit: impl Fn(&str) -> String) -> (tempfile::TempDir, HostRoot, Inventory) {
    require_root();
    let text = edit(fixture::example("two-gpus").unwrap());
    let dir = tempfile::tempdir().unwrap();
    fixture::materialize(&text, dir.path()).unwrap();
    let host = HostRoot::new(dir.path());
    let inv = discovery::discover(&host).unwrap();
    (dir, host, inv)
}

fn two_gpus() -> (tempfile::TempDir, HostRoot, Inventory) {
    host_from(str::to_owned)
}

fn old_driver() -> (tempfile::TempDir, HostRoot, Inventory) {
    host_from(|t| t.replace(NEW, OLD))
}

fn without_gpu1() -> (tempfile::TempDir, HostRoot, Inventory) {
    host_from(|t| {
        t.lines()
            .filter(|l| !l.contains(GPU1) && !l.starts_with("chr /dev/nvidia1 "))
            .map(|l| format!("{l}\n"))
            .collect()
    })
}

fn cpu_only() -> (tempfile::TempDir, HostRoot, Inventory) {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    fixture::materialize(fixture::example("cpu-only").unwrap(), dir.path()).unwrap();
    let host = HostRoot::new(dir.path());
    let inv = discovery::discover(&host).unwrap();
    (dir, host, inv)
}

fn mc(host: &HostRoot) -> MachineConfig {
    Config::default()
        .machine(host, &"kube1".parse().unwrap())
        .unwrap()
}

/// An empty Debian-like machine tree.
fn machine() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for d in ["usr/lib/x86_64-linux-gnu", "etc", "run", "dev", "var"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    std::os::unix::fs::symlink("../run", dir.path().join("var/run")).unwrap();
    dir
}

/// What the running machine sees of `host`: the `.nspawn` binds (file names copied, contents
/// empty) and the device nodes (as empty files: only their existence matters here).
fn bind_host(m: &Path, host: &HostRoot, inv: &Inventory) {
    fn copy_names(from: &Path, to: &Path) {
        if from.is_dir() {
            std::fs::create_dir_all(to).unwrap();
            for e in std::fs::read_dir(from).unwrap() {
                let e = e.unwrap();
                copy_names(&e.path(), &to.join(e.file_name()));
            }
        } else {
            std::fs::write(to, b"").unwrap();
        }
    }
    // The driver root is nothing but these binds (nspawn makes it at each start).
    let _ = std::fs::remove_dir_all(m.join(&layout::DRIVER_ROOT[1..]));
    if let Some(driver) = &inv.driver {
        for b in layout::driver_binds(driver).unwrap() {
            let to = m.join(&b.target.as_str()[1..]);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            copy_names(&host.path(b.source.as_str()), &to);
        }
    }
    // The machine's /dev keeps its /dev/char links; only the bound nodes come and go.
    std::fs::create_dir_all(m.join("dev")).unwrap();
    for e in std::fs::read_dir(m.join("dev")).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().starts_with("nvidia") {
            let p = e.path();
            if p.is_dir() {
                std::fs::remove_dir_all(p).unwrap();
            } else {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
    for d in &inv.devices {
        let p = m.join(&d.path.as_str()[1..]);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"").unwrap();
    }
}

/// Wire `m` for `inv` exactly as post-start's file steps do (ldconfig aside).
/// What post-start must leave in the machine (no start: these tests judge a running machine),
/// with no helper installed.
fn post_start_desired(host: &HostRoot, inv: &Inventory, mc: &MachineConfig) -> Desired {
    use crate::model::{Facts, Target};
    let facts = Facts::gather(Target::Machine, host, inv, "/nonexistent").unwrap();
    Desired::from_facts(Target::Machine, inv, mc, "/nonexistent", &facts).unwrap()
}

fn wire(m: &Path, host: &HostRoot, inv: &Inventory) {
    bind_host(m, host, inv);
    let root = MachineRoot::open(m).unwrap();
    let mc = mc(host);
    assert!(
        inv.complete_driver().is_some(),
        "wire() wants a complete driver"
    );
    let d = post_start_desired(host, inv, &mc);
    crate::apply::rewire::lib_links(&root, d.lib_links.as_ref().unwrap()).unwrap();
    crate::apply::rewire::dev_char(&root, &d.dev_char, true, None).unwrap();
    crate::apply::rewire::write_cdi(&root, &d.spec, |_, _| false).unwrap();
    // What the machine shows at MARKER_DIR (the host's directory, bound there).
    let dir = m.join(crate::model::gate::MARKER_DIR.trim_start_matches('/'));
    std::fs::create_dir_all(&dir).unwrap();
    for unit in [&mc.containerd_unit, &mc.kubelet_unit] {
        std::fs::write(dir.join(unit.as_str()), "released\n").unwrap();
    }
}

/// A running machine with `facts`, its unit and both services active.
fn running(facts: MachineFacts) -> Observed {
    Observed {
        unit: Some(running_unit()),
        machine: Some(facts),
        services: Some(services("active", "active")),
        ..Observed::default()
    }
}

fn running_unit() -> UnitFacts {
    UnitFacts {
        unit: "systemd-nspawn@kube1.service".into(),
        active_state: "active".into(),
        sub_state: "running".into(),
        result: "success".into(),
        invocation_id: "0123".into(),
        last_post_start: Some(PostStartRun {
            started_at: "2026-12-03T12:00:00Z".into(),
            exited_at: Some("2026-12-03T12:00:02Z".into()),
            exit_status: Some(0),
            signal: None,
            succeeded: true,
            started_usec: 1_796_385_600_000_000,
            exited_usec: 1_796_385_602_000_000,
        }),
    }
}

fn services(containerd: &str, kubelet: &str) -> Vec<ServiceFacts> {
    [
        ("containerd.service", containerd),
        ("kubelet.service", kubelet),
    ]
    .into_iter()
    .map(|(u, a)| ServiceFacts {
        unit: u.into(),
        load_state: "loaded".into(),
        active_state: a.into(),
        sub_state: if a == "active" { "running" } else { "dead" }.into(),
    })
    .collect()
}

/// What status reads of machine tree `m` for the host as it is now. The driver root here
/// is copies of the host's file names standing in for nspawn's read-only binds, which a unit
/// test cannot mount, `ldconfig` never ran and no helper is installed: the model's
/// driver-root, ld-cache and helper parts are left out (tests/wiring_model.rs judges them
/// with real binds, a real `ldconfig` and an installed helper).
fn facts_of(
    root: &MachineRoot,
    host: &HostRoot,
    inv: &Inventory,
    mc: &MachineConfig,
) -> MachineFacts {
    let desired = post_start_desired(host, inv, mc);
    let mut facts = inspect_machine(root, host, mc, &desired, true).unwrap();
    facts
        .pending_changes
        .retain(|c| !matches!(c.check, Check::DriverRoot | Check::LdCache | Check::Helper));
    facts.driver_root_mismatch = None;
    facts
}

/// Status of machine tree `m` against the host as it is now.
fn judge(m: &Path, host: &HostRoot, inv: &Inventory) -> Status {
    let mc = mc(host);
    let root = MachineRoot::open(m).unwrap();
    let facts = facts_of(&root, host, inv, &mc);
    evaluate(
        Subject::Machine(&"kube1".parse().unwrap()),
        &mc,
        inv,
        running(facts),
    )
}

/// A running machine with no NVIDIA state at all.
fn bare_facts() -> MachineFacts {
    MachineFacts::bare()
}

fn checks(s: &Status) -> Vec<(State, Check)> {
    s.findings.iter().map(|f| (f.state, f.check)).collect()
}

/// The installed helper: a working binary is fine; garbage, a file without the exec bit or
/// a missing one is broken (the next start would fail); a machine whose hooks run another
/// inode than the one installed now has not picked up an upgrade: drift.
#[test]
fn the_installed_helper_must_run_and_be_what_the_machine_runs() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let bin = dir.path().join("helper");
    let set = |bytes: &[u8], mode: u32| {
        let _ = std::fs::remove_file(&bin);
        std::fs::write(&bin, bytes).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let problem_of = |bytes: &[u8], mode: u32| {
        set(bytes, mode);
        helper_facts(&host, "/helper", Some(crate::model::helper::THIS_MACHINE))
    };
    // An ELF program for the machine the tests run on (x86_64, or aarch64 under qemu-user).
    let arch = crate::fixture::Arch::parse(std::env::consts::ARCH).unwrap();
    let elf = crate::fixture::elf_shared_object(arch, None);
    let good = problem_of(&elf, 0o755);
    assert_eq!(good.problem, None);
    let garbage = problem_of(b"garbage written over the helper", 0o755);
    for (facts, says) in [
        (&garbage, "is not a working binary"),
        (&problem_of(&elf, 0o644), "not an executable file"),
        (
            &helper_facts(&host, "/nope", Some(crate::model::helper::THIS_MACHINE)),
            "cannot be read",
        ),
    ] {
        let p = facts.problem.as_deref().unwrap_or_default();
        assert!(p.contains(says), "{facts:?}");
    }

    let mut found = Vec::new();
    let mut add = |st: State, check: Check, _m: String| found.push((st, check));
    judge_helper(Subject::Host, &garbage, None, &mut add);
    judge_helper(Subject::Host, &good, None, &mut add);
    assert_eq!(found, [(State::Broken, Check::Helper)]);
    let mut m = MachineFacts {
        hook_binary: good.identity,
        ..bare_facts()
    };
    let mut found = Vec::new();
    let mut add = |st: State, check: Check, _m: String| found.push((st, check));
    judge_helper(
        Subject::Machine(&"kube1".parse().unwrap()),
        &good,
        Some(&m),
        &mut add,
    );
    m.hook_binary = Some((0, 1));
    judge_helper(
        Subject::Machine(&"kube1".parse().unwrap()),
        &good,
        Some(&m),
        &mut add,
    );
    m.hook_binary = None;
    judge_helper(
        Subject::Machine(&"kube1".parse().unwrap()),
        &good,
        Some(&m),
        &mut add,
    );
    assert_eq!(found, [(State::Drift, Check::Helper)]);
}

#[test]
fn privileged_in_sync_after_post_start() {
    let (_h, host, inv) = two_gpus();
    let m = machine();
    wire(m.path(), &host, &inv);
    let s = judge(m.path(), &host, &inv);
    assert_eq!(s.state, State::InSync, "{s:#?}");
    assert_eq!(s.exit_code, 0);
    assert!(s.findings.is_empty());
    let f = s.machine_facts.as_ref().unwrap();
    assert!(f.cdi_spec.current);
    assert_eq!(f.cdi_spec.driver_versions, [NEW]);
    assert_eq!(f.driver_root_versions, [NEW]);
    assert_eq!(f.link_versions, [NEW]);
    assert!(f.dangling_links.is_empty(), "{:?}", f.dangling_links);
    assert!(
        s.summary
            .starts_with("kube1: in sync: NVIDIA 580.95.05, 2 GPU(s); "),
        "{}",
        s.summary
    );
}

/// The model's diff is pure: over one observation of a wired machine it finds no library link
/// change, and over the same observation with one link taken out in memory exactly that link's
/// creation, the machine on disk untouched (observing it again still finds none).
#[test]
fn privileged_the_diff_is_pure_over_an_observation() {
    let (_h, host, inv) = two_gpus();
    let m = machine();
    wire(m.path(), &host, &inv);
    let root = MachineRoot::open(m.path()).unwrap();
    let d = post_start_desired(&host, &inv, &mc(&host));
    let links = |changes: Vec<crate::model::Change>| -> Vec<String> {
        changes
            .into_iter()
            .filter(|c| c.check == Check::Links)
            .map(|c| c.to_string())
            .collect()
    };
    let at = crate::apply::parts::At {
        target: &root,
        host: &host,
        desired: &d,
    };
    let mut seen = crate::apply::parts::observe(&at);
    assert_eq!(links(seen.diff(&at)), Vec::<String>::new());
    let Some(Some(dirs)) = seen.get_mut::<crate::apply::parts::Links>() else {
        panic!("a machine's links part reads its directories")
    };
    let (dir, _) = dirs
        .iter_mut()
        .find(|(s, _)| s.links.contains_key("libcuda.so.1"))
        .expect("a wired machine has libcuda.so.1");
    dir.links.remove("libcuda.so.1");
    let path = format!("{}/libcuda.so.1", dir.path);
    assert_eq!(
        links(seen.diff(&at)),
        [format!("create {path} (-> libcuda.so.{NEW})")]
    );
    assert_eq!(
        links(crate::apply::parts::pending(&at)),
        Vec::<String>::new()
    );
}

#[test]
fn privileged_driver_upgraded_is_drift_naming_both_versions() {
    let (_o, old_host, old_inv) = old_driver();
    let (_h, host, inv) = two_gpus();
    let m = machine();
    wire(m.path(), &old_host, &old_inv);
    // The host's driver is upgraded under the running machine. Its driver root is made of
    // binds, which keep the old files until the next start: nothing dangles, every version
    // the machine holds is the old one.
    let s = judge(m.path(), &host, &inv);
    assert_eq!(s.state, State::Drift, "{s:#?}");
    assert_eq!(s.exit_code, 5);
    assert!(
        s.summary.contains(&format!(
            "NVIDIA driver changed: host kernel module {NEW}, machine's CDI spec, driver \
             root and library links {OLD} (run `nspawn-lifecycle-helper reconcile kube1`)"
        )),
        "{}",
        s.summary
    );
    let c = checks(&s);
    assert_eq!(c, [(State::Drift, Check::DriverVersion)], "{c:?}");
    // After the restart post-start wires the new driver: in sync again.
    wire(m.path(), &host, &inv);
    assert_eq!(judge(m.path(), &host, &inv).state, State::InSync);
}

/// A driver root whose files are no longer the host's (a C library or driver file replaced
/// on the host since the start, the version unchanged) is drift, named by post-start's own
/// check; with the version changed too, the version finding says it all.
#[test]
fn privileged_a_driver_root_that_is_not_the_hosts_files_is_drift() {
    let (_h, host, inv) = two_gpus();
    let m = machine();
    wire(m.path(), &host, &inv);
    let mc = mc(&host);
    let root = MachineRoot::open(m.path()).unwrap();
    let mut facts = facts_of(&root, &host, &inv, &mc);
    let why = "the driver root /run/nvidia/driver does not match the host's NVIDIA driver \
               (1 not the host's file: /run/nvidia/driver/usr/lib/x86_64-linux-gnu/libc.so.6)";
    facts.driver_root_mismatch = Some(why.to_owned());
    let s = evaluate(
        Subject::Machine(&"kube1".parse().unwrap()),
        &mc,
        &inv,
        running(facts.clone()),
    );
    assert_eq!((s.state, s.exit_code), (State::Drift, 5), "{s:#?}");
    assert_eq!(checks(&s), [(State::Drift, Check::DriverRoot)]);
    assert!(s.summary.contains("libc.so.6"), "{}", s.summary);
    facts.driver_root_versions = vec![OLD.to_owned()];
    let s = evaluate(
        Subject::Machine(&"kube1".parse().unwrap()),
        &mc,
        &inv,
        running(facts),
    );
    assert!(
        !checks(&s).iter().any(|(_, c)| *c == Check::DriverRoot),
        "{s:#?}"
    );
}

#[test]
fn privileged_gpu_removed_and_added_are_drift() {
    let (_h, host, inv) = two_gpus();
    let (_o, one_host, one_inv) = without_gpu1();
    // Removed: wired with two GPUs, the host now has one.
    let m = machine();
    wire(m.path(), &host, &inv);
    bind_host(m.path(), &one_host, &one_inv);
    let s = judge(m.path(), &one_host, &one_inv);
    assert_eq!(s.state, State::Drift, "{s:#?}");
    assert!(
        s.summary.contains(&format!(
            "GPU {GPU1} in the machine's CDI spec is gone from the host"
        )),
        "{}",
        s.summary
    );
    // Its /dev/char link dangles now, explained by the removal: still drift, not broken.
    assert!(checks(&s).contains(&(State::Drift, Check::DanglingLinks)));
    // Added: wired with one GPU, the host now has two.
    let m = machine();
    wire(m.path(), &one_host, &one_inv);
    bind_host(m.path(), &host, &inv);
    let s = judge(m.path(), &host, &inv);
    assert_eq!(s.state, State::Drift, "{s:#?}");
    assert!(
        s.summary.contains(&format!(
            "GPU {GPU1} (/dev/nvidia1) on the host is not in the machine's CDI spec"
        )),
        "{}",
        s.summary
    );
}

#[test]
fn privileged_dangling_links_without_a_host_change_are_broken() {
    let (_h, host, inv) = two_gpus();
    let m = machine();
    wire(m.path(), &host, &inv);
    // The bound library vanished from under the machine with the host unchanged.
    let lib = m.path().join(format!(
        "{}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
        &layout::DRIVER_ROOT[1..]
    ));
    std::fs::remove_file(&lib).unwrap();
    let s = judge(m.path(), &host, &inv);
    assert_eq!(s.state, State::Broken, "{s:#?}");
    assert_eq!(s.exit_code, 6);
    assert_eq!(checks(&s), [(State::Broken, Check::DanglingLinks)]);
    assert!(
        s.summary.contains("libnvidia-ml.so.580.95.05"),
        "{}",
        s.summary
    );
}

#[test]
fn privileged_spec_missing_or_invalid_is_broken() {
    let (_h, host, inv) = two_gpus();
    let m = machine();
    wire(m.path(), &host, &inv);
    let spec = m.path().join("run/cdi/nvidia.com-gpu.json");
    let good = std::fs::read(&spec).unwrap();
    std::fs::remove_file(&spec).unwrap();
    let s = judge(m.path(), &host, &inv);
    assert_eq!(s.state, State::Broken, "{s:#?}");
    assert!(
        s.summary
            .contains("CDI spec /var/run/cdi/nvidia.com-gpu.json is missing"),
        "{}",
        s.summary
    );
    for (bad, why) in [
        (&b"{\"cdiVersion\": \"0.5.0\""[..], "not JSON"),
        (
            br#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[]}"#,
            "no devices",
        ),
        (
            br#"{"cdiVersion":"0.5.0","kind":"other.com/gpu","devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}}]}"#,
            "kind is \"other.com/gpu\"",
        ),
        (
            br#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"-x","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}}]}"#,
            "not a valid CDI device name",
        ),
    ] {
        std::fs::write(&spec, bad).unwrap();
        let s = judge(m.path(), &host, &inv);
        assert_eq!(s.state, State::Broken, "{s:#?}");
        assert!(s.summary.contains("is invalid: "), "{}", s.summary);
        assert!(s.summary.contains(why), "{why}: {}", s.summary);
    }
    // A valid spec that is not what post-start writes now (hand-edited) is drift.
    let edited = String::from_utf8(good)
        .unwrap()
        .replace("NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=all");
    std::fs::write(&spec, edited).unwrap();
    let s = judge(m.path(), &host, &inv);
    assert_eq!(checks(&s), [(State::Drift, Check::CdiSpec)], "{s:#?}");
}

#[test]
fn privileged_gate_not_released_is_broken() {
    let (_h, host, inv) = two_gpus();
    let m = machine();
    wire(m.path(), &host, &inv);
    let d = m.path().join("run/systemd/system/kubelet.service.d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("50-nspawn-lifecycle-gate.conf"), gate::CONTENT).unwrap();
    assert_eq!(judge(m.path(), &host, &inv).state, State::InSync);
    std::fs::remove_file(
        m.path()
            .join("run/nspawn-lifecycle/released/kubelet.service"),
    )
    .unwrap();
    let s = judge(m.path(), &host, &inv);
    assert_eq!(checks(&s), [(State::Broken, Check::Gate)], "{s:#?}");
}

/// A `gpus: none` machine on a GPU host: its share is empty, and the summary says why rather
/// than claiming the host has no GPUs (it said "no NVIDIA GPUs on the host" before).
#[test]
fn privileged_a_gpus_none_machine_in_sync_says_none_not_a_gpu_less_host() {
    let (_c, cpu, cpu_inv) = cpu_only();
    let m = machine();
    let mut mc = mc(&cpu);
    mc.gpus = crate::config::Gpus::None;
    let root = MachineRoot::open(m.path()).unwrap();
    let facts = facts_of(&root, &cpu, &cpu_inv, &mc);
    let s = evaluate(
        Subject::Machine(&"kube1".parse().unwrap()),
        &mc,
        &cpu_inv,
        running(facts),
    );
    assert_eq!(s.state, State::InSync, "{s:#?}");
    assert!(
        s.summary
            .contains("no NVIDIA GPUs for this machine (gpus: none)"),
        "{}",
        s.summary
    );
}

#[test]
fn privileged_no_gpus_and_no_nvidia_state_is_in_sync_stale_state_is_drift() {
    let (_c, cpu, cpu_inv) = cpu_only();
    let m = machine();
    let s = judge(m.path(), &cpu, &cpu_inv);
    assert_eq!(s.state, State::InSync, "{s:#?}");
    assert!(
        s.summary
            .contains("no NVIDIA GPUs on the host, no NVIDIA state in the machine"),
        "{}",
        s.summary
    );
    // GPUs gone while the machine runs: its NVIDIA state is stale.
    let (_h, host, inv) = two_gpus();
    wire(m.path(), &host, &inv);
    bind_host(m.path(), &cpu, &cpu_inv);
    let s = judge(m.path(), &cpu, &cpu_inv);
    assert_eq!(s.state, State::Drift, "{s:#?}");
    assert!(checks(&s).contains(&(State::Drift, Check::StaleNvidiaState)));
    // GPUs appeared after the machine started without: drift, not broken.
    let fresh = machine();
    let s = judge(fresh.path(), &host, &inv);
    assert_eq!(checks(&s), [(State::Drift, Check::DriverVersion)], "{s:#?}");
    assert!(s.summary.contains("has no NVIDIA state"), "{}", s.summary);
}

#[test]
fn privileged_incomplete_host_driver_is_broken() {
    let (_h, host, inv) = two_gpus();
    let m = machine();
    wire(m.path(), &host, &inv);
    let (_x, bad, bad_inv) =
        host_from(|t| t.replace("nvidia-kernel 580.95.05", "nvidia-kernel 580.99.01"));
    let s = judge(m.path(), &bad, &bad_inv);
    assert_eq!(s.state, State::Broken, "{s:#?}");
    assert!(checks(&s).contains(&(State::Broken, Check::HostDriver)));
}

fn empty_inventory() -> Inventory {
    Inventory {
        devices: Vec::new(),
        kvm: None,
        host_devices: Vec::new(),
        disks: Vec::new(),
        gpus: Vec::new(),
        kernel_module: None,
        driver: None,
        verdict: Verdict::None,
    }
}

fn plain_mc() -> MachineConfig {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("var/lib/machines/kube1")).unwrap();
    Config::default()
        .machine(&HostRoot::new(dir.path()), &"kube1".parse().unwrap())
        .unwrap()
}

// Over 80 lines on purpose: one running machine's facts, then a table of unit, service and
// post-start cases judged against it, each a few lines; split, the cases lose their shared base.
#[test]
fn services_unit_and_post_start_are_judged() {
    let mc = plain_mc();
    let inv = empty_inventory();
    let kube1: MachineName = "kube1".parse().unwrap();
    let facts = bare_facts();
    let running = |containerd: &str, kubelet: &str| Observed {
        unit: Some(running_unit()),
        machine: Some(facts.clone()),
        services: Some(services(containerd, kubelet)),
        ..Observed::default()
    };
    assert_eq!(
        evaluate(
            Subject::Machine(&kube1),
            &mc,
            &inv,
            running("active", "active")
        )
        .state,
        State::InSync
    );
    let s = evaluate(
        Subject::Machine(&kube1),
        &mc,
        &inv,
        running("active", "inactive"),
    );
    assert_eq!(s.state, State::Broken);
    assert!(
        s.summary
            .contains("kubelet.service is inactive (dead) in the machine"),
        "{}",
        s.summary
    );
    let mut missing = running("active", "active");
    missing.services.as_mut().unwrap()[0].load_state = "not-found".into();
    let s = evaluate(Subject::Machine(&kube1), &mc, &inv, missing);
    assert!(
        s.summary
            .contains("containerd.service is not-found in the machine"),
        "{}",
        s.summary
    );

    // Stopped cleanly: not running (7), which is neither drift nor broken.
    let mut unit = running_unit();
    unit.active_state = "inactive".into();
    unit.sub_state = "dead".into();
    let stopped = Observed {
        unit: Some(unit.clone()),
        machine: None,
        services: None,
        ..Observed::default()
    };
    let s = evaluate(Subject::Machine(&kube1), &mc, &inv, stopped.clone());
    assert_eq!((s.state, s.exit_code), (State::NotRunning, 7));
    // A start pre-start would refuse is broken even while stopped: the next start fails.
    let refused = Observed {
        next_start: Some((2, "the drop-in is for other gpus".into())),
        ..stopped.clone()
    };
    let r = evaluate(Subject::Machine(&kube1), &mc, &inv, refused);
    assert_eq!((r.state, r.exit_code), (State::Broken, 6));
    assert_eq!(
        r.summary,
        "kube1: broken: pre-start would refuse the next start (exit 2): the drop-in is for \
         other gpus"
    );
    assert!(
        s.summary
            .starts_with("kube1: not running: systemd-nspawn@kube1.service is inactive (dead)"),
        "{}",
        s.summary
    );
    // Failed, or restarting after a failed post-start: broken.
    unit.active_state = "activating".into();
    unit.sub_state = "auto-restart".into();
    unit.result = "exit-code".into();
    let post = unit.last_post_start.as_mut().unwrap();
    post.exit_status = Some(3);
    post.succeeded = false;
    let s = evaluate(
        Subject::Machine(&kube1),
        &mc,
        &inv,
        Observed {
            unit: Some(unit),
            machine: None,
            services: None,
            ..Observed::default()
        },
    );
    assert_eq!(s.state, State::Broken, "{s:#?}");
    assert!(
        s.summary
            .contains("the last post-start (2026-12-03T12:00:00Z) exited with status 3"),
        "{}",
        s.summary
    );
}

#[test]
fn post_start_run_from_exec_start_post() {
    let run = |command: &str, start, exit, code, status| ExecRun {
        command: command.into(),
        started_usec: start,
        exited_usec: exit,
        pid: 42,
        code,
        status,
    };
    let hook =
        "/usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper nspawn-lifecycle post-start kube1";
    assert_eq!(
        last_post_start(
            &[run("/bin/true", 1, 2, 1, 0)],
            "nspawn-lifecycle post-start"
        ),
        None
    );
    assert_eq!(
        last_post_start(&[run(hook, 0, 0, 0, 0)], "nspawn-lifecycle post-start"),
        None
    );
    let ok = last_post_start(
        &[run(
            hook,
            1_764_763_200_000_000,
            1_764_763_202_500_000,
            1,
            0,
        )],
        "nspawn-lifecycle post-start",
    )
    .unwrap();
    assert!(ok.succeeded);
    assert_eq!(ok.started_at, "2025-12-03T12:00:00Z");
    assert_eq!(ok.exited_at.as_deref(), Some("2025-12-03T12:00:02Z"));
    let killed = last_post_start(
        &[run(hook, 1, 2_000_000, 2, 9)],
        "nspawn-lifecycle post-start",
    )
    .unwrap();
    assert_eq!(
        (killed.signal, killed.exit_status, killed.succeeded),
        (Some(9), None, false)
    );
    let running = last_post_start(&[run(hook, 1, 0, 0, 0)], "nspawn-lifecycle post-start").unwrap();
    assert_eq!((running.exited_at, running.succeeded), (None, false));
    assert_eq!(utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(utc(951_782_400_000_000), "2000-02-29T00:00:00Z");
}

#[test]
fn json_is_versioned() {
    let mc = plain_mc();
    let s = evaluate(
        Subject::Machine(&"kube1".parse().unwrap()),
        &mc,
        &empty_inventory(),
        Observed::default(),
    );
    let v: serde_json::Value = serde_json::to_value(&s).unwrap();
    assert_eq!(v["apiVersion"], "nspawn-lifecycle/v1");
    assert_eq!(v["kind"], "MachineStatus");
    assert_eq!(v["state"], "not-running");
    assert_eq!(v["exitCode"], 7);
    for key in [
        "machine",
        "summary",
        "host",
        "unit",
        "running",
        "machineState",
        "services",
        "findings",
    ] {
        assert!(v.get(key).is_some(), "{key} missing: {v}");
    }
}
