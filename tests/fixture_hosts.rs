//! Every example host through the built binary: `discover --json`, `pre-start`, `plan`, bad
//! machine names, bad configs and malformed /proc and /sys files.
//!
//! Privileged (mknod): these tests fail, not skip, when not run as root. Golden files live in
//! tests/golden/ and are rewritten only with UPDATE_GOLDEN=1.

// Helpers here are test code too (clippy's allow-unwrap-in-tests covers only #[test] fns).
#![allow(clippy::unwrap_used)]

mod common;
use common::{run_helper as run, snapshot};
use nspawn_lifecycle::fixture;
use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const NSPAWN: &str = "etc/systemd/nspawn/kube1.nspawn";
/// The machine locks' directory (`lock::LOCK_DIR`) under a host root.
const LOCKS: &str = "run/nspawn-lifecycle/locks";

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "privileged tests build host trees with mknod and must run as root"
    );
}

/// Build example `name` in a fresh tempdir.
fn host(name: &str) -> tempfile::TempDir {
    require_root();
    let text = fixture::example(name).unwrap_or_else(|| panic!("no example {name}"));
    let dir = tempfile::Builder::new()
        .prefix("fixture-host.")
        .tempdir()
        .unwrap();
    fixture::materialize(text, dir.path()).unwrap();
    // As on a host that started a machine before: the lock directory exists, so a run that only
    // takes the lock changes nothing outside it (creating it would change run/'s mtime).
    let locks = dir.path().join(LOCKS);
    std::fs::create_dir_all(locks.parent().unwrap()).unwrap();
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&locks)
        .unwrap();
    dir
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited, not killed")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Compare with tests/golden/<name>; UPDATE_GOLDEN=1 rewrites it instead.
fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let diff = similar::TextDiff::from_lines(&expected, actual)
            .unified_diff()
            .header(&format!("{name} (golden)"), &format!("{name} (now)"))
            .to_string();
        panic!("{name} differs from its golden file (UPDATE_GOLDEN=1 accepts the change):\n{diff}");
    }
}

/// Like [`assert_same_tree`], ignoring paths under `skip` on both sides (the machine lock under
/// [`LOCKS`] is created by the first run and records its holder's PID on every run).
fn assert_same_tree_except(
    before: &BTreeMap<PathBuf, String>,
    root: &Path,
    skip: &[&str],
    what: &str,
) {
    let mut before = before.clone();
    before.retain(|p, _| !skip.iter().any(|s| p.starts_with(s)));
    assert_same_tree(&before, &snapshot(root, skip), what);
}

fn assert_same_tree(
    before: &BTreeMap<PathBuf, String>,
    after: &BTreeMap<PathBuf, String>,
    what: &str,
) {
    if before == after {
        return;
    }
    let mut msg = format!("{what} changed the host tree:\n");
    for (p, d) in after {
        match before.get(p) {
            None => msg += &format!("  added   {}\n", p.display()),
            Some(b) if b != d => msg += &format!("  changed {}\n", p.display()),
            _ => {}
        }
    }
    for p in before.keys().filter(|p| !after.contains_key(*p)) {
        msg += &format!("  removed {}\n", p.display());
    }
    panic!("{msg}");
}

/// `discover --json` as printed, with the tempdir replaced so the golden file is the same on
/// every run (only the hostRoot value is touched; key order and layout are the binary's own).
fn discover_json(root: &Path) -> (serde_json::Value, String) {
    let out = run(root, &["discover", "--json"]);
    assert_eq!(code(&out), 0, "discover --json: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["apiVersion"], "nspawn-lifecycle/v1");
    assert_eq!(v["kind"], "HostDiscovery");
    assert_eq!(v["hostRoot"], root.display().to_string());
    let field = format!(
        "\"hostRoot\": {}",
        serde_json::to_string(&root.display().to_string()).unwrap()
    );
    let raw = text(&out.stdout);
    assert_eq!(raw.matches(&field).count(), 1, "{raw}");
    let shown = raw.replace(&field, "\"hostRoot\": \"<host-root>\"");
    assert!(
        !shown.contains(&root.display().to_string()),
        "the JSON names the host root outside hostRoot:\n{shown}"
    );
    (v, shown)
}

/// The `error:` line of a failed run.
fn error_line(out: &Output) -> String {
    text(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("error:"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn check_example(name: &str) {
    let dir = host(name);
    let root = dir.path();
    let before = snapshot(root, &[]);

    let (json, shown) = discover_json(root);
    golden(&format!("{name}.discover.json"), &shown);
    let out = run(root, &["discover"]);
    assert_eq!(code(&out), 0, "discover: {}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("verdict: "));
    // The text names each node's role as the JSON does.
    for d in json["devices"].as_array().unwrap() {
        let line = format!(
            "  {} {}:{} {}\n",
            d["path"].as_str().unwrap(),
            d["major"],
            d["minor"],
            d["role"].as_str().unwrap()
        );
        assert!(
            text(&out.stdout).contains(&line),
            "{name}: no {line:?} in\n{}",
            text(&out.stdout)
        );
    }
    assert_same_tree(&before, &snapshot(root, &[]), "discover");

    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    let nspawn = root.join(NSPAWN);
    match json["verdict"]["state"].as_str().unwrap() {
        "incomplete" => {
            assert_eq!(code(&out), 3, "pre-start of {name}: {}", text(&out.stderr));
            let err = error_line(&out);
            for reason in json["verdict"]["reasons"].as_array().unwrap() {
                assert!(
                    err.contains(reason.as_str().unwrap()),
                    "{err} should say {reason}"
                );
            }
            assert!(!err.contains(&root.display().to_string()), "{err}");
            golden(&format!("{name}.pre-start.txt"), &(err + "\n"));
            assert!(
                !nspawn.exists(),
                "pre-start of incomplete {name} wrote {NSPAWN}"
            );
            assert_same_tree_except(&before, root, &[LOCKS], "failed pre-start");
        }
        state => {
            assert!(state == "complete" || state == "none", "{state}");
            assert_eq!(code(&out), 0, "pre-start of {name}: {}", text(&out.stderr));
            let file = std::fs::read_to_string(&nspawn).unwrap();
            assert!(!file.contains(&root.display().to_string()), "{file}");
            golden(&format!("{name}.nspawn"), &file);
            let mode = std::fs::metadata(&nspawn).unwrap().mode();
            assert_eq!(mode & 0o7777, 0o644);
            // A GPU machine's containerd and kubelet are gated (src/apply/gate.rs): the drop-in both
            // binds name must exist on the host, or nspawn refuses to start.
            let gate = root.join("run/nspawn-lifecycle/unit-gate.conf");
            let binds = file
                .matches("BindReadOnly=/run/nspawn-lifecycle/unit-gate.conf:")
                .count();
            if state == "complete" {
                assert_eq!(binds, 2, "{file}");
                let dropin = std::fs::read_to_string(&gate).unwrap();
                assert!(
                    dropin.contains("\nConditionPathExists=/run/nspawn-lifecycle/released/%n\n")
                );
            } else {
                assert_eq!(binds, 0, "{file}");
                assert!(!gate.exists(), "a machine without GPUs is not gated");
            }
        }
    }
}

macro_rules! example_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                check_example($name);
            }
        )*
        const TESTED: &[&str] = &[$($name),*];
    };
}

example_tests! {
    privileged_example_cpu_only => "cpu-only",
    privileged_example_kvm_only => "kvm-only",
    privileged_example_one_gpu => "one-gpu",
    privileged_example_two_gpus => "two-gpus",
    privileged_example_eight_gpus => "eight-gpus",
    privileged_example_foreign_drm => "foreign-drm",
    privileged_example_libs_without_module => "libs-without-module",
    privileged_example_version_mismatch => "version-mismatch",
    privileged_example_nodes_without_libs => "nodes-without-libs",
    privileged_example_aarch64 => "aarch64",
    privileged_example_gb300 => "gb300",
    privileged_example_ldcache_only => "ldcache-only",
}

#[test]
fn every_example_host_has_a_test() {
    let shipped: Vec<&str> = fixture::EXAMPLES.iter().map(|(n, _)| *n).collect();
    assert_eq!(shipped, TESTED);
}

#[test]
fn privileged_verdicts_are_the_ones_each_example_is_for() {
    let expect = [
        ("cpu-only", "none"),
        ("kvm-only", "none"),
        ("one-gpu", "complete"),
        ("two-gpus", "complete"),
        ("eight-gpus", "complete"),
        ("foreign-drm", "complete"),
        ("libs-without-module", "incomplete"),
        ("version-mismatch", "incomplete"),
        ("nodes-without-libs", "incomplete"),
        ("aarch64", "complete"),
        ("ldcache-only", "complete"),
    ];
    for (name, verdict) in expect {
        let dir = host(name);
        let (json, _) = discover_json(dir.path());
        assert_eq!(json["verdict"]["state"], verdict, "{name}");
    }
}

#[test]
fn privileged_incomplete_hosts_name_each_piece_and_leave_the_old_file() {
    let cases = [
        (
            "version-mismatch",
            "kernel module 580.95.05 but libcuda.so.580.82.07",
        ),
        (
            "libs-without-module",
            "device nodes present but the nvidia kernel module is not loaded (/proc/driver/nvidia/version missing)",
        ),
        (
            "nodes-without-libs",
            "libcuda.so.580.95.05 not found through /etc/ld.so.cache",
        ),
    ];
    for (name, needle) in cases {
        let dir = host(name);
        let root = dir.path();
        let old = root.join(NSPAWN);
        std::fs::create_dir_all(old.parent().unwrap()).unwrap();
        std::fs::write(&old, "# rendered by an earlier start\n").unwrap();
        let before = snapshot(root, &[]);
        let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
        assert_eq!(code(&out), 3, "{name}: {}", text(&out.stderr));
        let err = error_line(&out);
        assert!(err.contains(needle), "{name}: {err}");
        assert_same_tree_except(&before, root, &[LOCKS], name);
    }
    // One missing library names the library and the directory.
    let dir = tempfile::tempdir().unwrap();
    let text = fixture::example("one-gpu").unwrap().replace(
        "nvidia-libs /usr/lib/x86_64-linux-gnu 580.95.05 x86_64",
        "nvidia-libs /usr/lib/x86_64-linux-gnu 580.95.05 x86_64 -libnvidia-ml",
    );
    fixture::materialize(&text, dir.path()).unwrap();
    let out = run(dir.path(), &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 3);
    assert!(
        error_line(&out)
            .contains("libnvidia-ml.so.580.95.05 missing from /usr/lib/x86_64-linux-gnu"),
        "{}",
        error_line(&out)
    );
}

#[test]
fn privileged_second_pre_start_writes_nothing() {
    let dir = host("two-gpus");
    let root = dir.path();
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("created"),
        "{}",
        text(&out.stderr)
    );
    let file = root.join(NSPAWN);
    let m1 = std::fs::metadata(&file).unwrap();
    let before = snapshot(root, &[]);
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("unchanged"),
        "{}",
        text(&out.stderr)
    );
    let m2 = std::fs::metadata(&file).unwrap();
    assert_eq!(
        (m1.ino(), m1.mtime(), m1.mtime_nsec()),
        (m2.ino(), m2.mtime(), m2.mtime_nsec())
    );
    // The lock file (under LOCKS) records its holder's PID on every run; nothing else may change.
    assert_same_tree_except(&before, root, &[LOCKS], "second pre-start");
}

#[test]
fn privileged_a_changed_host_rewrites_the_file_and_says_what_changed() {
    let dir = host("two-gpus");
    let root = dir.path();
    assert_eq!(
        code(&run(root, &["nspawn-lifecycle", "pre-start", "kube1"])),
        0
    );
    std::fs::remove_file(root.join("dev/kvm")).unwrap();
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("-/dev/kvm"),
        "{}",
        text(&out.stderr)
    );
    let file = std::fs::read_to_string(root.join(NSPAWN)).unwrap();
    assert!(!file.contains("/dev/kvm"));
}

#[test]
fn privileged_bad_machine_names_exit_2_and_write_nothing() {
    let dir = host("two-gpus");
    let root = dir.path();
    let before = snapshot(root, &[]);
    let long = "x".repeat(65);
    for bad in [
        "../etc",
        "a/b",
        "",
        long.as_str(),
        "ümlaut",
        ".hidden",
        "..",
    ] {
        for args in [
            &["nspawn-lifecycle", "pre-start", bad][..],
            &["nspawn-lifecycle", "post-start", bad][..],
            &["plan", bad][..],
        ] {
            let out = run(root, args);
            assert_eq!(code(&out), 2, "{args:?}: {}", text(&out.stderr));
            if !bad.is_empty() {
                assert!(
                    text(&out.stderr).contains(bad),
                    "{args:?} should name {bad:?}: {}",
                    text(&out.stderr)
                );
            }
        }
    }
    assert_same_tree(&before, &snapshot(root, &[]), "bad machine names");
}

/// Issue 10 item 8: `pre-start kbue1` (a typo) on a GPU host must not write kbue1.nspawn with GPU
/// binds; it fails naming where it looked. An image elsewhere (a configured directory, a `.raw`
/// file in another search directory) is found.
#[test]
fn privileged_a_machine_without_an_image_exits_2_naming_where_it_looked() {
    let dir = host("two-gpus");
    let root = dir.path();
    let before = snapshot(root, &[]);
    for args in [
        &["nspawn-lifecycle", "pre-start", "kbue1"][..],
        &["plan", "kbue1"][..],
    ] {
        let out = run(root, args);
        let err = text(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?}: {err}");
        assert!(
            err.contains(
                "machine kbue1: no machine image found: no directory kbue1 or image kbue1.raw in \
                 /etc/machines, /run/machines, /var/lib/machines, /usr/local/lib/machines, \
                 /usr/lib/machines"
            ),
            "{args:?}: {err}"
        );
    }
    assert!(!root.join("etc/systemd/nspawn/kbue1.nspawn").exists());
    assert_same_tree(
        &before,
        &snapshot(root, &[]),
        "pre-start of a mistyped machine",
    );

    // The configured directory is named too, and an image there is used.
    let cfg = root.join("etc/nspawn-lifecycle/config.json");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(
        &cfg,
        r#"{"machines": {"kbue1": {"directory": "/srv/kbue1"}}}"#,
    )
    .unwrap();
    let out = run(root, &["plan", "kbue1"]);
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("(nor /srv/kbue1, the configured directory)"),
        "{}",
        text(&out.stderr)
    );
    std::fs::create_dir_all(root.join("srv/kbue1")).unwrap();
    assert_eq!(code(&run(root, &["plan", "kbue1"])), 0);
    std::fs::remove_file(&cfg).unwrap();
    // A disk image in another place nspawn searches.
    std::fs::create_dir_all(root.join("usr/local/lib/machines")).unwrap();
    std::fs::write(root.join("usr/local/lib/machines/kbue1.raw"), "").unwrap();
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kbue1"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(root.join("etc/systemd/nspawn/kbue1.nspawn").exists());
}

#[test]
fn privileged_plan_prints_the_file_and_a_diff_and_writes_nothing() {
    let dir = host("two-gpus");
    let root = dir.path();
    let before = snapshot(root, &[]);
    let out = run(root, &["plan", "kube1"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("[Files]\n"), "{shown}");
    assert!(shown.contains("(missing)"), "{shown}");
    assert!(shown.contains("\n+Bind=/dev/nvidia0\n"), "{shown}");
    assert_same_tree(&before, &snapshot(root, &[]), "plan");

    assert_eq!(
        code(&run(root, &["nspawn-lifecycle", "pre-start", "kube1"])),
        0
    );
    let out = run(root, &["plan", "kube1"]);
    assert!(
        text(&out.stdout).contains("is up to date"),
        "{}",
        text(&out.stdout)
    );

    let file = root.join(NSPAWN);
    let edited = std::fs::read_to_string(&file)
        .unwrap()
        .replace("Bind=/dev/nvidia1\n", "");
    std::fs::write(&file, edited).unwrap();
    let before = snapshot(root, &[]);
    let out = run(root, &["plan", "kube1"]);
    assert_eq!(code(&out), 0);
    assert!(
        text(&out.stdout).contains("\n+Bind=/dev/nvidia1\n"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stdout).contains("(on disk)"),
        "{}",
        text(&out.stdout)
    );
    assert_same_tree(&before, &snapshot(root, &[]), "plan against an edited file");

    // An incomplete host: plan says why, exits 3, writes nothing.
    let dir = host("version-mismatch");
    let before = snapshot(dir.path(), &[]);
    let out = run(dir.path(), &["plan", "kube1"]);
    assert_eq!(code(&out), 3);
    assert_same_tree(
        &before,
        &snapshot(dir.path(), &[]),
        "plan of an incomplete host",
    );
}

#[test]
fn privileged_config_extra_mounts_are_rendered() {
    let dir = host("one-gpu");
    let root = dir.path();
    std::fs::create_dir_all(root.join("data/models")).unwrap();
    std::fs::create_dir_all(root.join("srv/cache")).unwrap();
    // The default location under the host root.
    let cfg = root.join("etc/nspawn-lifecycle/config.json");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(
        &cfg,
        r#"{"machines": {"kube1": {"mounts": [
            {"source": "/data/models", "target": "/models"},
            {"source": "/srv/cache", "readOnly": false}]}}}"#,
    )
    .unwrap();
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let file = std::fs::read_to_string(root.join(NSPAWN)).unwrap();
    assert!(
        file.contains("\nBindReadOnly=/data/models:/models\n"),
        "{file}"
    );
    assert!(file.contains("\nBind=/srv/cache\n"), "{file}");
    golden("one-gpu.extra-mounts.nspawn", &file);

    // Issue 10 item 10: dropped capabilities go into [Exec], after Capability=all.
    std::fs::write(
        &cfg,
        r#"{"defaults": {"dropCapabilities": ["CAP_SYS_MODULE", "CAP_SYS_RAWIO"]}}"#,
    )
    .unwrap();
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let file = std::fs::read_to_string(root.join(NSPAWN)).unwrap();
    assert!(
        file.contains("\n[Exec]\nCapability=all\nDropCapability=CAP_SYS_MODULE CAP_SYS_RAWIO\nPrivateUsers=no\n"),
        "{file}"
    );
    std::fs::write(
        &cfg,
        r#"{"defaults": {"dropCapabilities": ["sys_module"]}}"#,
    )
    .unwrap();
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(
            "defaults.dropCapabilities[0]: \"sys_module\" is not a Linux capability name"
        ),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_file(&cfg).unwrap();

    // An explicit --config outside the host root.
    let elsewhere = tempfile::tempdir().unwrap();
    let explicit = elsewhere.path().join("c.json");
    std::fs::write(
        &explicit,
        r#"{"defaults": {"mounts": [{"source": "/data/models"}]}}"#,
    )
    .unwrap();
    let out = run(
        root,
        &["--config", explicit.to_str().unwrap(), "plan", "kube1"],
    );
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("\n+BindReadOnly=/data/models\n"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn privileged_bad_config_exits_2_and_writes_nothing() {
    let dir = host("one-gpu");
    let root = dir.path();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cases = [
        (r#"{"machine": {}}"#, "machine"),
        (
            r#"{"machines": {"kube1": {"mounts": [{"source": "data"}]}}}"#,
            "machines.kube1.mounts[0].source",
        ),
        (
            r#"{"machines": {"kube1": {"mounts": [{"source": "/nope"}]}}}"#,
            "\"/nope\" does not exist",
        ),
        (
            r#"{"machines": {"kube1": {"mounts": [{"source": "/etc", "target": "/../x"}]}}}"#,
            "machines.kube1.mounts[0].target",
        ),
        (r#"{"machines": "#, "EOF"),
        ("\u{ff}", "config file"),
    ];
    for (i, (body, needle)) in cases.iter().enumerate() {
        let cfg = cfg_dir.path().join(format!("{i}.json"));
        std::fs::write(&cfg, body).unwrap();
        let before = snapshot(root, &[]);
        for args in [
            &["nspawn-lifecycle", "pre-start", "kube1"][..],
            &["plan", "kube1"][..],
        ] {
            let mut full = vec!["--config", cfg.to_str().unwrap()];
            full.extend_from_slice(args);
            let out = run(root, &full);
            assert_eq!(code(&out), 2, "{body}: {}", text(&out.stderr));
            assert!(
                text(&out.stderr).contains(needle),
                "{body}: {}",
                text(&out.stderr)
            );
        }
        assert_same_tree(&before, &snapshot(root, &[]), body);
    }
    let missing = cfg_dir.path().join("missing.json");
    let out = run(
        root,
        &[
            "--config",
            missing.to_str().unwrap(),
            "nspawn-lifecycle",
            "pre-start",
            "kube1",
        ],
    );
    assert_eq!(code(&out), 2);
    assert!(text(&out.stderr).contains("missing.json"));
    assert!(!root.join(NSPAWN).exists());
}

/// How one malformed file must be answered.
enum Expect {
    /// Verdict incomplete (pre-start exit 3), the message naming this text.
    Incomplete(&'static str),
    /// A hard error (exit 1 everywhere) naming this text.
    Error(&'static str),
}

#[test]
fn privileged_malformed_proc_and_sys_files_are_named_never_panicked_on() {
    use Expect::*;
    const VERSION: &str = "proc/driver/nvidia/version";
    const INFO: &str = "proc/driver/nvidia/gpus/0000:06:00.0/information";
    const VENDOR: &str = "sys/bus/pci/devices/0000:06:00.0/vendor";
    const DEVICES: &str = "proc/devices";
    let big = vec![b'A'; (1 << 20) + 1];
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        (
            VERSION,
            b"".to_vec(),
            Incomplete("/proc/driver/nvidia/version: empty first line"),
        ),
        (
            VERSION,
            b"NVRM version: NVIDIA UNIX x86_64 Kernel Mo".to_vec(),
            Incomplete("/proc/driver/nvidia/version: first line"),
        ),
        (
            VERSION,
            b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  ".to_vec(),
            Incomplete("no driver version"),
        ),
        (
            VERSION,
            b"\x00\x01garbage\xff\n".to_vec(),
            Incomplete("/proc/driver/nvidia/version: first line is not UTF-8"),
        ),
        (
            VERSION,
            b"Linux version 6.1.0 (gcc)\n".to_vec(),
            Incomplete("is not \"NVRM version: …\""),
        ),
        (
            VERSION,
            big.clone(),
            Error("proc/driver/nvidia/version: larger than 1048576 bytes"),
        ),
        (
            INFO,
            b"Model: \t\t NVIDIA L4\nIRQ: 100\nGPU UUID: \t GPU-8c3f".to_vec(),
            Incomplete(
                "/proc/driver/nvidia/gpus/0000:06:00.0/information: no \"Bus Location:\" line",
            ),
        ),
        (
            INFO,
            b"\xff\xfe\xfd".to_vec(),
            Incomplete("/proc/driver/nvidia/gpus/0000:06:00.0/information: not UTF-8"),
        ),
        (
            INFO,
            b"random garbage without keys\n".to_vec(),
            Incomplete("information: no \"Model:\" line"),
        ),
        (
            INFO,
            big.clone(),
            Error("information: larger than 1048576 bytes"),
        ),
        (
            VENDOR,
            b"0x8086\n".to_vec(),
            Incomplete("/sys/bus/pci/devices/0000:06:00.0/vendor is 0x8086, not NVIDIA's 0x10de"),
        ),
        (
            VENDOR,
            b"".to_vec(),
            Incomplete("/sys/bus/pci/devices/0000:06:00.0/vendor: \"\" is not a 16-bit id"),
        ),
        (
            VENDOR,
            b"\xff\xff".to_vec(),
            Incomplete("/sys/bus/pci/devices/0000:06:00.0/vendor: not UTF-8"),
        ),
        (
            DEVICES,
            b"Character devices:\n  1 mem\n195 nv".to_vec(),
            Incomplete(
                "/dev/nvidia0 is 195:0 but /proc/devices has no nvidia* driver with major 195",
            ),
        ),
        (
            DEVICES,
            b"garbage".to_vec(),
            Incomplete("/proc/devices: no \"Character devices:\" section"),
        ),
        (
            DEVICES,
            b"Character devices:\n\xff\xfe nvidia\n".to_vec(),
            Incomplete("/proc/devices: not UTF-8"),
        ),
    ];
    for (rel, bytes, expect) in cases {
        let dir = host("one-gpu");
        let root = dir.path();
        std::fs::write(root.join(rel), &bytes).unwrap();
        let before = snapshot(root, &[]);
        let what = format!(
            "{rel} = {:?}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(40)])
        );
        let disc = run(root, &["discover", "--json"]);
        let pre = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
        match expect {
            Incomplete(needle) => {
                assert_eq!(code(&disc), 0, "{what}: {}", text(&disc.stderr));
                let v: serde_json::Value = serde_json::from_slice(&disc.stdout).unwrap();
                assert_eq!(v["verdict"]["state"], "incomplete", "{what}");
                assert_eq!(code(&pre), 3, "{what}: {}", text(&pre.stderr));
                assert!(
                    error_line(&pre).contains(needle),
                    "{what}: {}",
                    error_line(&pre)
                );
            }
            Error(needle) => {
                assert_eq!(code(&disc), 1, "{what}: {}", text(&disc.stderr));
                assert!(
                    error_line(&disc).contains(needle),
                    "{what}: {}",
                    error_line(&disc)
                );
                assert_eq!(code(&pre), 1, "{what}");
                assert!(
                    error_line(&pre).contains(needle),
                    "{what}: {}",
                    error_line(&pre)
                );
            }
        }
        assert!(!root.join(NSPAWN).exists(), "{what}");
        assert_same_tree_except(&before, root, &[LOCKS], &what);
    }

    // A directory where a file belongs is an error naming it.
    let dir = host("one-gpu");
    let root = dir.path();
    std::fs::remove_file(root.join(VERSION)).unwrap();
    std::fs::create_dir(root.join(VERSION)).unwrap();
    let out = run(root, &["discover"]);
    assert_eq!(code(&out), 1);
    assert!(
        error_line(&out).contains("proc/driver/nvidia/version"),
        "{}",
        error_line(&out)
    );

    // A node where a character device belongs makes the host incomplete, naming it.
    let dir = host("one-gpu");
    let root = dir.path();
    std::fs::remove_file(root.join("dev/nvidia0")).unwrap();
    std::fs::write(root.join("dev/nvidia0"), "").unwrap();
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 3);
    let err = error_line(&out);
    assert!(
        err.contains("/dev/nvidia0 is something else, not a character device"),
        "{err}"
    );
    assert!(
        err.contains("/dev/nvidia0 missing for GPU 0 (0000:06:00.0)"),
        "{err}"
    );
}

#[test]
fn privileged_unusable_ld_so_cache_falls_back_to_the_standard_dirs() {
    for bytes in [&b"garbage"[..], b"glibc-ld.so.cache1.1\xff\xff\xff\xff"] {
        let dir = host("one-gpu");
        std::fs::write(dir.path().join("etc/ld.so.cache"), bytes).unwrap();
        let (json, _) = discover_json(dir.path());
        assert_eq!(json["verdict"]["state"], "complete");
        // Without the cache the /opt install cannot be found, and the reason says why.
        let dir = host("ldcache-only");
        std::fs::write(dir.path().join("etc/ld.so.cache"), bytes).unwrap();
        let (json, _) = discover_json(dir.path());
        let reasons = json["verdict"]["reasons"].to_string();
        assert!(reasons.contains("/etc/ld.so.cache: "), "{reasons}");
    }
}

#[test]
fn privileged_demo_shows_discovery_and_the_nspawn_file() {
    require_root();
    let demo = env!("CARGO_BIN_EXE_nspawn-lifecycle-demo");
    let out = Command::new(demo).output().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("verdict: complete"), "{shown}");
    assert!(shown.contains("Bind=/dev/nvidia1\n"), "{shown}");
    let out = Command::new(demo)
        .args(["--host", "version-mismatch"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0);
    assert!(text(&out.stdout).contains("refuses to start"));
    let out = Command::new(demo).args(["--list"]).output().unwrap();
    assert_eq!(text(&out.stdout).lines().count(), fixture::EXAMPLES.len());
    let out = Command::new(demo)
        .args(["--host", "nope"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    assert!(text(&out.stderr).contains("\"nope\""));
}

/// Ctrl-C while `demo` holds its example host (here: blocked writing its report into a full
/// pipe) removes the host, then ends the process by SIGINT as before. The pipe is shrunk to one
/// page before the helper starts, so the write blocks while the host exists.
#[test]
fn privileged_demo_interrupted_leaves_no_example_host() {
    use std::io::Read as _;
    use std::os::unix::process::ExitStatusExt as _;
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let (r, w) = nix::unistd::pipe().unwrap();
    nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(4096)).unwrap();
    // Ctrl-C's SIGINT as a terminal delivers it: with its default action, whatever this test
    // inherited (a suite started in the background runs with SIGINT ignored, and an ignored
    // signal stays ignored across exec).
    let mut child = Command::new("env")
        .arg("--default-signal=INT")
        .arg(env!("CARGO_BIN_EXE_nspawn-lifecycle-demo"))
        .args(["--host", "eight-gpus"])
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::from(w))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let listing = || std::fs::read_dir(tmp.path()).unwrap().count();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while listing() == 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(listing(), 1, "demo built no example host under TMPDIR");
    // Until it blocks writing into the full pipe: its current system call is write(2)
    // (/proc/PID/syscall names it while it sleeps in it); no fixed pause.
    let syscall = format!("/proc/{}/syscall", child.id());
    let blocked_in_write = || {
        std::fs::read_to_string(&syscall)
            .is_ok_and(|s| s.split_whitespace().next() == Some(&libc::SYS_write.to_string()))
    };
    while !blocked_in_write() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(blocked_in_write(), "demo never blocked writing its report");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let mut report = Vec::new();
    std::fs::File::from(r).read_to_end(&mut report).unwrap();
    let status = child.wait().unwrap();
    assert!(
        report.len() > 4096,
        "the report fits the pipe: {} bytes",
        report.len()
    );
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
    assert_eq!(listing(), 0, "the example host was left behind");
}

/// For scripts: `discover --exit-code` exits 3 on an incomplete verdict (as pre-start would),
/// plain `discover` 0 whatever the verdict; `plan --exit-code` exits 9 while pre-start would
/// change the `.nspawn` file (missing, or another text) and 0 once it is what pre-start writes.
#[test]
fn privileged_exit_codes_for_scripts() {
    let bad = host("version-mismatch");
    assert_eq!(code(&run(bad.path(), &["discover"])), 0);
    assert_eq!(
        code(&run(bad.path(), &["discover", "--json", "--exit-code"])),
        3
    );
    let dir = host("two-gpus");
    assert_eq!(code(&run(dir.path(), &["discover", "--exit-code"])), 0);
    assert_eq!(code(&run(dir.path(), &["plan", "kube1"])), 0);
    assert_eq!(code(&run(dir.path(), &["plan", "kube1", "--exit-code"])), 9);
    assert_eq!(
        code(&run(
            dir.path(),
            &["nspawn-lifecycle", "pre-start", "kube1"]
        )),
        0
    );
    assert_eq!(code(&run(dir.path(), &["plan", "kube1", "--exit-code"])), 0);
}

#[test]
fn privileged_foreign_and_host_only_nodes_are_never_bound() {
    let dir = host("foreign-drm");
    assert_eq!(
        code(&run(
            dir.path(),
            &["nspawn-lifecycle", "pre-start", "kube1"]
        )),
        0
    );
    let file = std::fs::read_to_string(dir.path().join(NSPAWN)).unwrap();
    assert!(
        file.contains("\nBind=/dev/dri/card1\n") && file.contains("\nBind=/dev/dri/renderD129\n")
    );
    for intel in ["/dev/dri/card0", "/dev/dri/renderD128", "by-path"] {
        assert!(
            !file.contains(intel),
            "the Intel GPU's {intel} is bound:\n{file}"
        );
    }
    let dir = host("eight-gpus");
    assert_eq!(
        code(&run(
            dir.path(),
            &["nspawn-lifecycle", "pre-start", "kube1"]
        )),
        0
    );
    let file = std::fs::read_to_string(dir.path().join(NSPAWN)).unwrap();
    assert!(!file.contains("nvswitch"), "{file}");
    // Every GPU: the directories whole, so nodes the host makes later appear in the machine.
    assert!(file.contains("\nBind=/dev/nvidia-caps\n"), "{file}");
    assert!(
        file.contains("\nBind=/dev/nvidia-caps-imex-channels\n"),
        "{file}"
    );
    // The daemon's socket directory is bound read-only (a socket connects through it).
    assert!(
        file.contains(
            "\nBindReadOnly=/run/nvidia-fabricmanager:/run/nvidia/driver/run/nvidia-fabricmanager\n"
        ),
        "{file}"
    );
}

#[test]
fn a_missing_host_root_is_bad_input_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nspawn-lifecycle-helper"))
        .arg("--host-root")
        .arg(&missing)
        .args(["nspawn-lifecycle", "pre-start", "kube1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("typo"));
    assert!(!missing.exists());
}

/// Issue 10 item 3: a `Bind=` line is read by systemd-nspawn, which splits it at unescaped
/// colons. Every bind line of the file must read back (as systemd 252 reads it) to the paths
/// meant: odd config paths, and the gate drop-in of a unit whose name holds ':' or '\'.
#[test]
fn privileged_odd_paths_and_unit_names_render_escaped_and_read_back() {
    use nspawn_lifecycle::types::paths::parse_bind_line;
    let dir = host("one-gpu");
    let root = dir.path();
    let source = "/data/odd dir:with\\back ümlaut";
    let target = "/mnt/odd target:x\\y 日本";
    std::fs::create_dir_all(root.join(&source[1..])).unwrap();
    let cfg = root.join("etc/nspawn-lifecycle/config.json");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    let json = serde_json::json!({"machines": {"kube1": {
    "kubeletUnit": "kube:let.service",
    "containerdUnit": "contain\\x2derd.service",
    "mounts": [
        {"source": source, "target": target},
        {"source": source, "readOnly": false},
    ]}}});
    std::fs::write(&cfg, json.to_string()).unwrap();
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let file = std::fs::read_to_string(root.join(NSPAWN)).unwrap();
    golden("one-gpu.odd-paths.nspawn", &file);
    let binds: Vec<(String, String)> = file
        .lines()
        .filter(|l| l.starts_with("Bind"))
        .map(|l| parse_bind_line(l).unwrap_or_else(|| panic!("systemd would not read {l:?}")))
        .collect();
    let gate = "/run/nspawn-lifecycle/unit-gate.conf";
    for want in [
        (
            gate,
            "/run/systemd/system/kube:let.service.d/50-nspawn-lifecycle-gate.conf",
        ),
        (
            gate,
            "/run/systemd/system/contain\\x2derd.service.d/50-nspawn-lifecycle-gate.conf",
        ),
        (source, target),
        (source, source),
    ] {
        assert!(
            binds.contains(&(want.0.to_owned(), want.1.to_owned())),
            "{want:?} missing from {binds:#?}\n{file}"
        );
    }
}

/// A newline in a discovered device name would inject a line of its own into the `.nspawn`
/// file. `/dev/nvidia-caps` is bound writable into every machine with all GPUs, so such a name
/// is what a machine can leave there: skipped with one warning (never a refusal that would stop
/// every machine's start), never bound, and its raw bytes reach neither the file nor the log.
#[test]
fn privileged_a_control_character_in_a_device_name_is_skipped_never_bound() {
    for name in [
        "nvidia-cap9\nPrivateUsers=pick",
        "nvidia-cap9\tx",
        "nvidia-cap9\u{7f}",
    ] {
        let dir = host("eight-gpus");
        let root = dir.path();
        let node = root.join("dev/nvidia-caps").join(name);
        nix::sys::stat::mknod(
            &node,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o444),
            nix::sys::stat::makedev(509, 9),
        )
        .unwrap();
        for args in [
            &["nspawn-lifecycle", "pre-start", "kube1"][..],
            &["plan", "kube1"][..],
            &["discover"][..],
        ] {
            let out = run(root, args);
            let err = text(&out.stderr);
            assert_eq!(code(&out), 0, "{name:?} {args:?}: {err}");
            assert!(
                err.contains("/dev/nvidia-caps: skipping 1 entries"),
                "{args:?}: {err} must say what it skipped"
            );
            for shown in [text(&out.stdout), err] {
                assert!(
                    !shown.contains(name),
                    "{args:?}: the raw name was printed: {shown}"
                );
            }
        }
        let file = std::fs::read_to_string(root.join("etc/systemd/nspawn/kube1.nspawn")).unwrap();
        assert!(
            !file.contains("nvidia-cap9") && !file.contains("pick"),
            "{file}"
        );
    }
}

/// Issue 14: the eight-GPU host with MIG instances on GPUs of minor 0 and 4, and a second image.
const MIG: &str = "
dir /var/lib/machines/kube2
file /proc/driver/nvidia/capabilities/gpu0/mig/gi1/access DeviceFileMinor: 21\\nDeviceFileMode: 256\\n
file /proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access DeviceFileMinor: 22\\nDeviceFileMode: 256\\n
file /proc/driver/nvidia/capabilities/gpu4/mig/gi1/access DeviceFileMinor: 57\\nDeviceFileMode: 256\\n
chr /dev/nvidia-caps/nvidia-cap21 509:21 0400
chr /dev/nvidia-caps/nvidia-cap22 509:22 0400
chr /dev/nvidia-caps/nvidia-cap57 509:57 0400
";

/// The eight-GPU host's text with MIG, optionally renumbered: the same UUIDs in the other
/// slots (the `nvidia-gpu` lines keep their bus id and minor, their UUIDs are reversed).
fn eight_gpus_text(renumbered: bool) -> String {
    let base = fixture::example("eight-gpus").unwrap();
    let mut text = String::new();
    let uuids: Vec<&str> = base
        .lines()
        .filter(|l| l.starts_with("nvidia-gpu "))
        .map(|l| l.split_whitespace().nth(3).unwrap())
        .collect();
    let mut n = 0;
    for line in base.lines() {
        if renumbered && line.starts_with("nvidia-gpu ") {
            let own = line.split_whitespace().nth(3).unwrap();
            text.push_str(&line.replace(own, uuids[uuids.len() - 1 - n]));
            n += 1;
        } else {
            text.push_str(line);
        }
        text.push('\n');
    }
    text + MIG
}

fn eight_gpus_host(renumbered: bool) -> tempfile::TempDir {
    require_root();
    let dir = tempfile::Builder::new()
        .prefix("fixture-host.")
        .tempdir()
        .unwrap();
    fixture::materialize(&eight_gpus_text(renumbered), dir.path()).unwrap();
    dir
}

fn write_config(root: &Path, json: &str) {
    let cfg = root.join("etc/nspawn-lifecycle/config.json");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(cfg, json).unwrap();
}

/// Issue 14: 8 GPUs split 4/4 by UUID. Each machine's `.nspawn` binds its GPUs' nodes, the
/// shared control nodes and its own MIG capabilities; `plan` shows its share and the device
/// cgroup pre-start sets; `discover --json` shows both assignments. Renumbered (same UUIDs,
/// other minors and bus ids), each machine follows its UUIDs. The files are pinned.
#[test]
fn privileged_gpus_split_by_uuid_follow_their_uuids_across_renumbering() {
    let kube1 = r#"["GPU-0d1c5e2a-7b41-4c6f-9e83-5a2f1b7c9d01", "GPU-1e2d6f3b-8c52-4d70-af94-6b3a2c8d0e12",
                   "GPU-2f3e7a4c-9d63-4e81-b0a5-7c4b3d9e1f23", "GPU-3a4f8b5d-ae74-4f92-81b6-8d5c4eaf2a34"]"#;
    let kube2 = r#"["GPU-4b5a9c6e-bf85-4aa3-92c7-9e6d5fb03b45", "GPU-5c6bad7f-c096-4bb4-a3d8-af7e6ac14c56",
                   "GPU-6d7cbe80-d1a7-4cc5-b4e9-b08f7bd25d67", "GPU-7e8dcf91-e2b8-4dd6-85fa-c19a8ce36e78"]"#;
    let config = format!(
        r#"{{"machines": {{"kube1": {{"gpus": {kube1}}}, "kube2": {{"gpus": {kube2}}}}}}}"#
    );
    for (renumbered, suffix) in [(false, ""), (true, "-renumbered")] {
        let dir = eight_gpus_host(renumbered);
        let root = dir.path();
        write_config(root, &config);
        for m in ["kube1", "kube2"] {
            let out = run(root, &["nspawn-lifecycle", "pre-start", m]);
            assert_eq!(code(&out), 0, "{m}: {}", text(&out.stderr));
            let file = std::fs::read_to_string(root.join(format!("etc/systemd/nspawn/{m}.nspawn")))
                .unwrap();
            golden(&format!("eight-gpus.split-{m}{suffix}.nspawn"), &file);
            let gpu_binds: Vec<&str> = file
                .lines()
                .filter(|l| {
                    l.starts_with("Bind=/dev/nvidia")
                        && l[16..].starts_with(|c: char| c.is_ascii_digit())
                })
                .collect();
            // kube1's UUIDs sit at minors 0-3, renumbered at 7-4 (the eight-gpus host's minor
            // order is not its bus order: index 2 is minor 3).
            let want: Vec<String> = match (m, renumbered) {
                ("kube1", false) | ("kube2", true) => 0..4,
                _ => 4..8,
            }
            .map(|i| format!("Bind=/dev/nvidia{i}"))
            .collect();
            assert_eq!(gpu_binds, want, "{m}{suffix}");
            assert!(file.contains("\nBind=/dev/nvidiactl\n"), "{file}");
            assert!(file.contains("\nBind=/dev/nvidia-uvm\n"), "{file}");
            // The global MIG config/monitor capabilities span every GPU: a share gets neither.
            assert!(
                !file.contains("nvidia-cap1\n") && !file.contains("nvidia-cap2\n"),
                "{file}"
            );
            let plan = text(&run(root, &["plan", m]).stdout);
            assert!(
                plan.contains("# GPUs (the config's gpus): 4 of the host's GPUs: "),
                "{plan}"
            );
            assert!(
                plan.contains(
                    "# Device cgroup (runtime DeviceAllow=, set by pre-start): /dev/char/195:"
                ),
                "{plan}"
            );
            assert!(plan.contains("/dev/char/195:255 rwm"), "{plan}");
        }
        let (json, _) = discover_json(root);
        let a = json["assignments"].as_array().unwrap();
        assert_eq!(a.len(), 2, "{json}");
        assert_eq!(a[0]["machine"], "kube1");
        assert_eq!(a[0]["assigned"].as_array().unwrap().len(), 4);
        let got: std::collections::BTreeSet<String> = a[0]["assigned"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["uuid"].as_str().unwrap().to_owned())
            .collect();
        let want: std::collections::BTreeSet<String> = serde_json::from_str(kube1).unwrap();
        assert_eq!(got, want, "{json}");
        assert_eq!(a[1]["machine"], "kube2");
    }
    // The MIG instances of minor 0 (kube1's before renumbering) and 4 (kube2's).
    let dir = eight_gpus_host(false);
    write_config(dir.path(), &config);
    let plan1 = text(&run(dir.path(), &["plan", "kube1"]).stdout);
    let plan2 = text(&run(dir.path(), &["plan", "kube2"]).stdout);
    assert!(
        plan1.contains("Bind=/dev/nvidia-caps/nvidia-cap21\n")
            && plan1.contains("Bind=/dev/nvidia-caps/nvidia-cap22\n"),
        "{plan1}"
    );
    assert!(!plan1.contains("nvidia-cap57"), "{plan1}");
    assert!(
        plan2.contains("Bind=/dev/nvidia-caps/nvidia-cap57\n") && !plan2.contains("nvidia-cap21"),
        "{plan2}"
    );
    assert!(
        plan2.contains("/dev/char/509:57 rwm") && !plan2.contains("/dev/char/509:21 "),
        "{plan2}"
    );
}

/// Issue 14: lists that name one GPU twice, by UUID in one machine and by bus id in another,
/// are exit 2 naming both machines for install, plan and pre-start, and nothing is written.
#[test]
fn privileged_overlapping_gpu_lists_are_refused_naming_both_machines() {
    let dir = eight_gpus_host(false);
    let root = dir.path();
    write_config(
        root,
        r#"{"machines": {"kube1": {"gpus": ["GPU-0d1c5e2a-7b41-4c6f-9e83-5a2f1b7c9d01"]},
                         "kube2": {"gpus": ["0000:18:00.0"]}}}"#,
    );
    let before = snapshot(root, &[]);
    for args in [
        &["plan", "kube2"][..],
        &["nspawn-lifecycle", "pre-start", "kube2"],
        &["install", "--dry-run", "kube2"],
    ] {
        let out = run(root, args);
        assert_eq!(code(&out), 2, "{args:?}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(
                "GPU GPU-0d1c5e2a-7b41-4c6f-9e83-5a2f1b7c9d01 is assigned to both machines kube1 and kube2 (kube1: GPU-0d1c5e2a-7b41-4c6f-9e83-5a2f1b7c9d01, kube2: 0000:18:00.0)"
            ),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    assert_same_tree(&before, &snapshot(root, &[]), "refused overlap");
}

/// Issue 14: `none` on a host whose driver is incomplete renders the file of a host without
/// GPUs and exits 0; a machine with every GPU is held back (3). A listed GPU that is absent
/// holds the start back only with `require`; without it the machine starts with the others
/// and the missing one is logged.
#[test]
fn privileged_none_is_never_held_back_and_require_decides_for_absent_gpus() {
    let dir = host("version-mismatch");
    let root = dir.path();
    std::fs::create_dir_all(root.join("var/lib/machines/kube2")).unwrap();
    write_config(root, r#"{"machines": {"kube2": {"gpus": "none"}}}"#);
    assert_eq!(
        code(&run(root, &["nspawn-lifecycle", "pre-start", "kube1"])),
        3
    );
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube2"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let file = std::fs::read_to_string(root.join("etc/systemd/nspawn/kube2.nspawn")).unwrap();
    golden("version-mismatch.none-kube2.nspawn", &file);
    assert!(!file.contains("nvidia"), "{file}");

    let dir = eight_gpus_host(false);
    let root = dir.path();
    let absent = "GPU-99999999-0000-4000-8000-000000000000";
    write_config(
        root,
        &format!(
            r#"{{"machines": {{"kube1": {{"gpus": ["GPU-0d1c5e2a-7b41-4c6f-9e83-5a2f1b7c9d01", "{absent}"]}}}}}}"#
        ),
    );
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("configured GPU(s) not on the host: {absent}")),
        "{}",
        text(&out.stderr)
    );
    let plan = text(&run(root, &["plan", "kube1"]).stdout);
    assert!(
        plan.contains(&format!("not on the host: {absent}")),
        "{plan}"
    );
    write_config(
        root,
        &format!(r#"{{"machines": {{"kube1": {{"require": true, "gpus": [1, "{absent}"]}}}}}}"#),
    );
    let before = snapshot(root, &[LOCKS]);
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(code(&out), 3, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!(
            "\"require\" is true, refusing to start until they are: {absent}"
        )),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("an index names another GPU once the host renumbers them"),
        "{}",
        text(&out.stderr)
    );
    assert_same_tree_except(&before, root, &[LOCKS], "a held-back start");
}

/// Issue 14: a drop-in installed for another `gpus` than the config's now is exit 2 naming the
/// fix, and nothing is written: an `all` drop-in would let a share open every GPU, a share's
/// drop-in would leave an `all` machine without any.
#[test]
fn privileged_a_dropin_installed_for_other_gpus_is_refused_until_install() {
    let dir = eight_gpus_host(false);
    let root = dir.path();
    let dropin =
        root.join("etc/systemd/system/systemd-nspawn@kube1.service.d/50-nspawn-lifecycle.conf");
    std::fs::create_dir_all(dropin.parent().unwrap()).unwrap();
    for (config, installed, says) in [
        (
            r#"{"machines": {"kube1": {"gpus": [0]}}}"#,
            "[Service]\nDeviceAllow=char-nvidia* rwm\nDeviceAllow=/dev/kvm rwm\n",
            "was installed for gpus \"all\" but the config's gpus for kube1 is [index 0]",
        ),
        (
            r#"{"machines": {"kube1": {"gpus": "all"}}}"#,
            "[Service]\nDeviceAllow=/dev/kvm rwm\n",
            "was installed for a machine without every GPU but the config's gpus for kube1 is all",
        ),
    ] {
        write_config(root, config);
        std::fs::write(&dropin, installed).unwrap();
        let before = snapshot(root, &[LOCKS]);
        let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
        assert_eq!(code(&out), 2, "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("run `nspawn-lifecycle-helper install kube1`"),
            "{}",
            text(&out.stderr)
        );
        assert_same_tree_except(&before, root, &[LOCKS], "a refused pre-start");
    }
}

/// Issue 15: `host plan` reads the same discovery, host settings and plan `host post-start`
/// runs, and writes nothing: with GPUs the host steps (no driver root, `/dev/char` links only),
/// the host's own lock and paths; without GPUs the cleanup; while the driver is incomplete the
/// report and then exit 3. `host post-start` refuses a `--host-root` (exit 2).
#[test]
fn host_plan_reports_the_host_steps_and_writes_nothing() {
    for (name, exit) in [("two-gpus", 0), ("cpu-only", 0), ("version-mismatch", 3)] {
        let dir = host(name);
        let before = snapshot(dir.path(), &[]);
        let out = run(dir.path(), &["host", "plan"]);
        assert_eq!(code(&out), exit, "{name}: {}", text(&out.stderr));
        let shown = text(&out.stdout).replace(&dir.path().display().to_string(), "<host>");
        golden(&format!("host-plan-{name}.txt"), &shown);
        assert_same_tree(&before, &snapshot(dir.path(), &[]), "host plan");
    }
    let dir = host("two-gpus");
    let out = run(dir.path(), &["host", "post-start"]);
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--host-root"));
}

/// Issue 15: host mode's real file steps on a host tree (the example two-gpus host as `/`):
/// `/dev/char` links to the host's NVIDIA nodes, the host spec in `/var/run/cdi` with host
/// paths, containerd's gate marker in the host's `/run`; the host's driver files and library
/// links untouched; then the no-GPU cleanup removes exactly the links and the spec.
#[test]
fn host_file_steps_wire_and_clean_a_host_tree() {
    use nspawn_lifecycle::apply::executor::Work as _;
    use nspawn_lifecycle::apply::parts;
    use nspawn_lifecycle::apply::rewire;
    use nspawn_lifecycle::failpoint;
    use nspawn_lifecycle::fs::machine_root;
    use nspawn_lifecycle::model::cdi;
    let dir = host("two-gpus");
    let libs = dir.path().join("usr/lib/x86_64-linux-gnu");
    let libs_before = snapshot(&libs, &[]);
    let (hc, written) = common::with_host_wiring(dir.path(), |wiring, hc, inv, json| {
        let links = wiring.apply(&parts::DevChar, false).unwrap();
        assert!(!links.library_links_changed, "{}", links.line);
        for d in inv
            .devices
            .iter()
            .filter(|d| d.path.starts_with("/dev/nvidia"))
        {
            let link = dir.path().join(format!("dev/char/{}:{}", d.major, d.minor));
            assert_eq!(
                std::fs::read_link(&link).unwrap(),
                Path::new(d.path.as_str())
            );
        }
        // The host's ld.so.cache lists the driver already: no ldconfig (NoSystemd would panic).
        let ld = wiring
            .apply(&parts::LdCache, links.library_links_changed)
            .unwrap()
            .line;
        assert!(ld.starts_with("ldconfig: not needed"), "{ld}");
        wiring.apply(&parts::CdiSpec, false).unwrap();
        let written = dir
            .path()
            .join("var/run/cdi")
            .join(cdi::spec_file_name(&hc.cdi_kind));
        assert_eq!(std::fs::read_to_string(&written).unwrap(), json);
        assert!(!json.contains("/run/nvidia/driver"));
        wiring
            .release(
                &hc.containerd_unit,
                failpoint::Point::PostStartMidGateRelease,
            )
            .unwrap();
        assert!(
            dir.path()
                .join("run/nspawn-lifecycle/released/containerd.service")
                .is_file()
        );
        (hc.clone(), written)
    });
    assert_same_tree(&libs_before, &snapshot(&libs, &[]), "host library dir");

    let root = machine_root::MachineRoot::open(dir.path()).unwrap();
    let spec_file = cdi::spec_file_name(&hc.cdi_kind);
    // The parts of host mode post-start writes without a driver: /dev/char and the spec.
    let report = format!(
        "{}; {}",
        rewire::dev_char(&root, &Default::default(), false, None).unwrap(),
        rewire::remove_spec(&root, &hc.cdi_dir, &spec_file).unwrap()
    );
    assert!(!written.exists(), "{report}");
    let left: Vec<_> = std::fs::read_dir(dir.path().join("dev/char"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{report}");
    assert_same_tree(&libs_before, &snapshot(&libs, &[]), "host library dir");
}

/// Root only: a driver file the kernel would refuse to hard-link into the machine's driver tree
/// (immutable) is foreseen by the plan: `plan` shows it bound, and pre-start writes byte for byte
/// the `.nspawn` file `plan` showed, without binding anything behind the plan's back.
#[test]
fn privileged_plan_foresees_a_driver_file_the_kernel_refuses_to_link() {
    let h = common::installed_host("two-gpus", &["kube1"]);
    let lib = h
        .path()
        .join("usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05");
    let chattr = |flag: &str| {
        assert!(
            Command::new("chattr")
                .arg(flag)
                .arg(&lib)
                .status()
                .unwrap()
                .success(),
            "chattr {flag}"
        );
    };
    chattr("+i");
    let planned = run(h.path(), &["plan", "kube1"]);
    let started = run(h.path(), &["nspawn-lifecycle", "pre-start", "kube1"]);
    chattr("-i");
    assert_eq!(code(&planned), 0, "{}", text(&planned.stderr));
    assert_eq!(code(&started), 0, "{}", text(&started.stderr));
    let written = std::fs::read_to_string(h.path().join(NSPAWN)).unwrap();
    let bind = "BindReadOnly=/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05:/run/nvidia/driver/";
    assert!(written.contains(bind), "{written}");
    let shown = text(&planned.stdout);
    for line in written.lines() {
        assert!(shown.contains(line), "plan did not show {line:?}:\n{shown}");
    }
    assert!(
        !text(&started.stderr).contains("could not be hard-linked"),
        "{}",
        text(&started.stderr)
    );
}

/// The README's "Try it on your host" commands, verbatim: on every example host (with kube1's
/// image there, nothing installed) each one exits 0, or 3 where the host's driver is incomplete,
/// prints something, and writes nothing at all.
#[test]
fn privileged_the_readme_tour_writes_nothing_on_any_example_host() {
    let readme = include_str!("../README.md");
    let block = readme
        .split("<!-- tour:begin")
        .nth(1)
        .and_then(|rest| rest.split("<!-- tour:end").next())
        .expect("the README's tour block");
    let lines: Vec<Vec<&str>> = block
        .lines()
        .filter_map(|l| l.strip_prefix("nspawn-lifecycle-helper "))
        .map(|l| {
            l.split('#')
                .next()
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(lines.len(), 4, "{block}");
    for (name, _) in fixture::EXAMPLES {
        let dir = host(name);
        let root = dir.path();
        std::fs::create_dir_all(root.join("var/lib/machines/kube1")).unwrap();
        let before = snapshot(root, &[]);
        let incomplete = {
            let out = run(root, &["discover", "--exit-code"]);
            code(&out) == 3
        };
        for args in &lines {
            let out = run(root, args);
            let ok = code(&out) == 0 || (incomplete && code(&out) == 3);
            assert!(
                ok,
                "{name}: {args:?} exited {}: {}",
                code(&out),
                text(&out.stderr)
            );
            assert!(
                !out.stdout.is_empty() || args[0] == "cdi-spec" || code(&out) == 3,
                "{name}: {args:?} printed nothing"
            );
        }
        assert_same_tree(&before, &snapshot(root, &[]), &format!("{name}: the tour"));
    }
}
