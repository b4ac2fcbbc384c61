//! `status` as the built binary over fixture hosts (`--host-root`) and machine trees
//! (`--machine-root`): exit codes 0/5/6 and 2, and that it never writes: the host tree and the
//! machine tree are identical (every entry's type, mode, owner, size, mtime, inode and bytes)
//! before and after, and no lock file or directory appears.
//!
//! Privileged (mknod): fails, not skips, when not run as root.

#![allow(clippy::unwrap_used)]

mod common;
use common::{run_helper, snapshot};
use std::path::Path;
use std::process::Output;

const SPEC: &str = "run/cdi/nvidia.com-gpu.json";

use common::{installed_host as host, machine_tree as machine};

/// Run `status ARGS` and check it changed nothing under `host` and `machine`.
fn status(host: &Path, machine: &Path, args: &[&str]) -> Output {
    let (h, m) = (snapshot(host, &[]), snapshot(machine, &[]));
    let run_dir = host.join("run/nspawn-lifecycle").exists();
    let machine_arg = machine.to_str().unwrap();
    let full: Vec<&str> = ["status", "--machine-root", machine_arg]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let out = run_helper(host, &full);
    assert_eq!(
        h,
        snapshot(host, &[]),
        "status {args:?} changed the host tree"
    );
    assert_eq!(
        m,
        snapshot(machine, &[]),
        "status {args:?} changed the machine tree"
    );
    assert_eq!(
        run_dir,
        host.join("run/nspawn-lifecycle").exists(),
        "status {args:?} created or removed our run directory (a lock?)"
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn privileged_status_exit_codes_and_nothing_written() {
    // No GPUs, no NVIDIA state: in sync.
    let cpu = host("cpu-only", &["kube1"]);
    let m = machine();
    let out = status(cpu.path(), m.path(), &["kube1"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        stdout(&out),
        "kube1: in sync: no NVIDIA GPUs on the host, no NVIDIA state in the machine\n"
    );

    // GPUs on the host, a machine that never saw them: drift.
    let gpus = host("two-gpus", &["kube1"]);
    let out = status(gpus.path(), m.path(), &["kube1"]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        stdout(&out).starts_with(
            "kube1: drift: the host has NVIDIA 580.95.05 with 2 GPU(s) but the machine has no \
             NVIDIA state"
        ),
        "{}",
        stdout(&out)
    );

    // A CDI spec that does not load: broken, named.
    std::fs::create_dir_all(m.path().join("run/cdi")).unwrap();
    std::fs::write(m.path().join(SPEC), "{\"cdiVersion\": 5}").unwrap();
    let out = status(gpus.path(), m.path(), &["kube1", "--json"]);
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["apiVersion"], "nspawn-lifecycle/v1");
    assert_eq!(v["state"], "broken");
    assert_eq!(v["exitCode"], 6);
    assert_eq!(v["machineState"]["cdiSpec"]["state"], "invalid");
    assert_eq!(
        v["machineState"]["cdiSpec"]["error"],
        "no cdiVersion string"
    );
    assert_eq!(v["host"]["kernelModule"], "580.95.05");
    assert_eq!(v["host"]["gpus"].as_array().unwrap().len(), 2);
}

#[test]
fn privileged_status_all_and_bad_input() {
    let gpus = host("two-gpus", &["kube1", "kube2"]);
    let m = machine();
    // Every installed machine, worst state wins.
    let out = status(gpus.path(), m.path(), &["--all"]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.starts_with("kube1: drift: "), "{text}");
    assert!(text.contains("\nkube2: drift: "), "{text}");
    let out = status(gpus.path(), m.path(), &["--all", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["apiVersion"], "nspawn-lifecycle/v1");
    assert_eq!(v["exitCode"], 5);
    assert_eq!(v["machines"].as_array().unwrap().len(), 2);
    assert_eq!(v["machines"][1]["machine"], "kube2");

    // Not installed: exit 2 naming the drop-in.
    let out = status(gpus.path(), m.path(), &["kube9"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("machine kube9 is not installed")
            && err.contains("systemd-nspawn@kube9.service.d/50-nspawn-lifecycle.conf"),
        "{err}"
    );
    // With --json, what could not be judged is still one object on stdout, with the exit code.
    let out = status(gpus.path(), m.path(), &["kube9", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&v["kind"], &v["machine"], &v["state"], &v["exitCode"]),
        (
            &"StatusError".into(),
            &"kube9".into(),
            &"unknown".into(),
            &2.into()
        ),
        "{v}"
    );
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("machine kube9 is not installed"),
        "{v}"
    );
    let out = run_helper(gpus.path(), &["status", "kube1", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("tests: --machine-root DIR"),
        "{v}"
    );
    // Nothing installed is its own outcome (8), not "all in sync".
    let none = host("two-gpus", &[]);
    let out = status(none.path(), m.path(), &["--all"]);
    assert_eq!(out.status.code(), Some(8), "{out:?}");
    assert_eq!(stdout(&out), "no installed machines\n");
    let out = status(none.path(), m.path(), &["--all", "--json"]);
    assert_eq!(out.status.code(), Some(8), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&v["state"], &v["exitCode"]),
        (&"nothing-installed".into(), &8.into()),
        "{v}"
    );
    let out = run_helper(none.path(), &["status", "--all", "--format", "prometheus"]);
    assert_eq!(out.status.code(), Some(8), "{out:?}");
    // A fixture host without --machine-root has no running machine to ask: exit 2.
    let h = snapshot(gpus.path(), &[]);
    let out = run_helper(gpus.path(), &["status", "kube1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("tests: --machine-root DIR"));
    assert_eq!(h, snapshot(gpus.path(), &[]));
}

/// After a change of `gpus` since `install`, or with a `.nspawn` file that is not ours, pre-start
/// refuses the start (exit 2, naming the fix): `plan` says so with pre-start's message and exit
/// code, and `status` is broken (`next-start`), never "drift, run reconcile" (which would fail).
/// After `install`, both agree with pre-start again.
#[test]
fn privileged_plan_and_status_say_what_pre_start_will_do() {
    let h = host("two-gpus", &["kube1"]);
    let m = machine();
    let root = h.path();
    let config = root.join("etc/nspawn-lifecycle/config.json");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, r#"{"machines": {"kube1": {"gpus": [0]}}}"#).unwrap();
    let says = "was installed for gpus \"all\" but the config's gpus for kube1 is [index 0]: run \
                `nspawn-lifecycle-helper install kube1`";

    let pre_start = run_helper(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(pre_start.status.code(), Some(2), "{pre_start:?}");
    assert!(String::from_utf8_lossy(&pre_start.stderr).contains(says));

    let plan = run_helper(root, &["plan", "kube1"]);
    assert_eq!(plan.status.code(), Some(2), "{plan:?}");
    let err = String::from_utf8_lossy(&plan.stderr);
    assert!(
        err.contains("pre-start would refuse to start kube1") && err.contains(says),
        "{err}"
    );
    assert!(plan.stdout.is_empty(), "{}", stdout(&plan));

    let out = status(root, m.path(), &["kube1", "--json"]);
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let next: Vec<&serde_json::Value> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "next-start")
        .collect();
    assert_eq!(next.len(), 1, "{v:#}");
    assert_eq!(next[0]["state"], "broken");
    let msg = next[0]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("pre-start would refuse the next start (exit 2): "),
        "{msg}"
    );
    assert!(msg.contains(says), "{msg}");
    let summary = v["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("kube1: broken: pre-start would refuse"),
        "{summary}"
    );
    assert!(!summary.contains("reconcile"), "{summary}");

    // The fix status names: afterwards plan and status agree with pre-start.
    let out = common::install(root, &["kube1"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(run_helper(root, &["plan", "kube1"]).status.code(), Some(0));
    let out = status(root, m.path(), &["kube1", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!v["findings"].to_string().contains("next-start"), "{v:#}");

    // A hand-written .nspawn file: pre-start refuses to replace it, and so says everyone.
    std::fs::write(
        root.join("etc/systemd/nspawn/kube1.nspawn"),
        "[Exec]\nBoot=yes\n[Network]\nPort=8080\n",
    )
    .unwrap();
    let plan = run_helper(root, &["plan", "kube1", "--json"]);
    assert_eq!(plan.status.code(), Some(2), "{plan:?}");
    assert!(
        String::from_utf8_lossy(&plan.stderr)
            .contains("was not written by nspawn-lifecycle-helper"),
        "{plan:?}"
    );
    let out = status(root, m.path(), &["kube1"]);
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    assert!(
        stdout(&out).contains("pre-start would refuse the next start (exit 2): ")
            && stdout(&out).contains("kube1.nspawn was not written by nspawn-lifecycle-helper"),
        "{}",
        stdout(&out)
    );
}

/// One machine that cannot be judged (more multiarch library directories than status judges)
/// hides none of the others: `--all` prints each machine's verdict or error, in text and JSON,
/// and exits 1. What a machine names (a file name with a carriage return and an erase-line
/// sequence) reaches the terminal escaped, so it cannot paint "in sync" over the verdict.
#[test]
fn privileged_one_unjudgeable_machine_hides_no_other_and_escapes_reach_no_terminal() {
    let gpus = host("two-gpus", &["kube1", "kube2"]);
    let trees = tempfile::tempdir().unwrap();
    for m in ["kube1", "kube2"] {
        let t = machine();
        std::fs::rename(t.path(), trees.path().join(m)).unwrap();
        std::mem::forget(t);
    }
    let lib = trees.path().join("kube2/usr/lib");
    for i in 0..=nspawn_lifecycle::model::links::MAX_LIB_DIRS {
        std::fs::create_dir(lib.join(format!("arch{i:02}-linux-gnu"))).unwrap();
    }
    let hostile = "x\r\u{1b}[2Kkube1: in sync.json";
    let cdi = trees.path().join("kube1/etc/cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    nix::unistd::mkfifo(
        &cdi.join(hostile),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let each = format!("{}/{{machine}}", trees.path().display());
    let before = snapshot(trees.path(), &[]);
    let run = |args: &[&str]| {
        let full: Vec<&str> = ["status", "--machine-root", &each]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        run_helper(gpus.path(), &full)
    };
    let out = run(&["--all"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("kube1: broken: "), "{text}");
    assert!(
        lines[0].contains("x\\u{d}\\u{1b}[2Kkube1: in sync.json") && !text.contains('\r'),
        "{text:?}"
    );
    assert!(
        lines[1].starts_with("kube2: could not judge: ")
            && lines[1].contains("more than 64 multiarch library directories"),
        "{text}"
    );
    let out = run(&["--all", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exitCode"], 1, "{v}");
    assert_eq!(v["state"], "broken", "{v}");
    assert_eq!(v["machines"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["machines"][0]["machine"], "kube1");
    assert_eq!(v["errors"][0]["machine"], "kube2", "{v}");
    assert!(
        v["errors"][0]["error"]
            .as_str()
            .unwrap()
            .contains("more than 64 multiarch"),
        "{v}"
    );
    assert_eq!(before, snapshot(trees.path(), &[]), "status wrote");
    for m in ["kube1", "kube2"] {
        std::fs::remove_dir_all(trees.path().join(m)).unwrap();
    }
}

/// A machine may alias one library directory under any number of names (`/usr/lib/aNNN-linux-gnu
/// -> x86_64-linux-gnu`): each directory is judged once, by identity, under its real name, so
/// the work does not grow with the aliases; more distinct directories than judged is an error.
#[test]
fn aliases_of_a_library_directory_are_judged_once() {
    use nspawn_lifecycle::fs::machine_root::MachineRoot;
    use nspawn_lifecycle::model::links;
    let m = machine();
    let lib = m.path().join("usr/lib");
    std::fs::write(lib.join("x86_64-linux-gnu/libfoo.so.1"), b"").unwrap();
    for i in 0..1000 {
        std::os::unix::fs::symlink("x86_64-linux-gnu", lib.join(format!("a{i:03}-linux-gnu")))
            .unwrap();
    }
    let root = MachineRoot::open(m.path()).unwrap();
    assert_eq!(
        links::machine_lib_dirs(&root).unwrap(),
        ["/usr/lib/x86_64-linux-gnu"]
    );
    for i in 0..links::MAX_LIB_DIRS {
        std::fs::create_dir(lib.join(format!("d{i:02}-linux-gnu"))).unwrap();
    }
    let e = links::machine_lib_dirs(&root).unwrap_err();
    assert!(
        format!("{e:#}").contains("more than 64 multiarch library directories"),
        "{e:#}"
    );
}
