//! pre-start's parts through the binary: `plan --json` lists what each part would change on the
//! host (`preStart.changes`), pre-start applies exactly those, and afterwards the list is empty
//! and a second start only finds each part as it must be; a part changed by hand is listed alone
//! and mended alone; and a part whose directory another user made is refused by its read, before
//! anything is written, as its write would refuse it. Device nodes need root (mknod), as does
//! handing a directory to another user.

// Helpers here are test code too (clippy's allow-unwrap-in-tests covers only #[test] fns).
#![allow(clippy::unwrap_used)]

mod common;

use common::{run_helper as run, snapshot, stdout_of_exit};
use nspawn_lifecycle::fixture;
use std::path::Path;

const NSPAWN: &str = "etc/systemd/nspawn/kube1.nspawn";
const GATE_FILE: &str = "run/nspawn-lifecycle/unit-gate.conf";
const TREE: &str = "var/lib/nspawn-lifecycle/driver-root/kube1";
const MARKERS: &str = "run/nspawn-lifecycle/machines/kube1/released";
const NOBODY: u32 = 65534;

fn gb300() -> tempfile::TempDir {
    assert!(
        nix::unistd::geteuid().is_root(),
        "pre-start tests make device nodes and hand directories to uid {NOBODY}: run them as root \
         (CI does)"
    );
    let dir = tempfile::Builder::new()
        .prefix("pre-start.")
        .tempdir()
        .unwrap();
    fixture::materialize(fixture::example("gb300").unwrap(), dir.path()).unwrap();
    dir
}

/// [`gb300`] after its first pre-start.
fn started() -> tempfile::TempDir {
    let dir = gb300();
    let (code, err) = pre_start(dir.path());
    assert_eq!(code, 0, "{err}");
    dir
}

fn pre_start(root: &Path) -> (i32, String) {
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `plan --json`'s pre-start list, each change as `check action path`.
fn listed(root: &Path) -> Vec<String> {
    let out = stdout_of_exit(root, &["plan", "kube1", "--json"], 0);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    v["preStart"]["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("no preStart.changes: {v:#}"))
        .iter()
        .map(|c| {
            format!(
                "{} {} {}",
                c["check"].as_str().unwrap(),
                c["action"].as_str().unwrap(),
                c["path"].as_str().unwrap()
            )
        })
        .collect()
}

/// pre-start's log line of each part (its `step=` key), in order.
fn steps(err: &str) -> Vec<String> {
    err.lines()
        .filter(|l| l.contains(" step="))
        .filter(|l| !l.contains("step timing"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn privileged_plan_lists_what_pre_start_makes_and_nothing_once_it_has() {
    let dir = gb300();
    let root = dir.path();
    let before = listed(root);
    for want in [
        "host-devices create /dev/infiniband/rdma_cm",
        "host-devices create /run/nspawn-lifecycle/bpffs/kube1",
        "gate write /run/nspawn-lifecycle/unit-gate.conf",
        "driver-root create /var/lib/nspawn-lifecycle/driver-root/kube1",
        "gate create /run/nspawn-lifecycle/machines/kube1/released",
        "next-start write /etc/systemd/nspawn/kube1.nspawn",
    ] {
        assert!(
            before.iter().any(|c| c == want),
            "no {want:?} in {before:#?}"
        );
    }
    let text = String::from_utf8(stdout_of_exit(root, &["plan", "kube1"], 0)).unwrap();
    assert!(
        text.contains(&format!(
            "\n# pre-start at the next start (on the host): {} change(s):\n",
            before.len()
        )) && text.contains("\n#   create /dev/infiniband/rdma_cm (character device 10:58)\n"),
        "{text}"
    );
    // Listing wrote nothing.
    assert!(!root.join(NSPAWN).exists() && !root.join(TREE).exists());
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    assert!(
        listed(root).is_empty(),
        "pre-start left changes: {:#?}",
        listed(root)
    );
    let text = String::from_utf8(stdout_of_exit(root, &["plan", "kube1"], 0)).unwrap();
    assert!(
        text.contains("\n# pre-start at the next start (on the host): nothing to change.\n"),
        "{text}"
    );
    // A second start: every part read, none written.
    let snap = snapshot(root, &["run/nspawn-lifecycle/locks"]);
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    assert_eq!(snap, snapshot(root, &["run/nspawn-lifecycle/locks"]));
    let lines = steps(&err);
    for want in [
        "host device nodes: none missing",
        "unit gate: /run/nspawn-lifecycle/unit-gate.conf as it must be",
        "as planned:",
        "kube1.nspawn: unchanged",
    ] {
        assert!(
            lines.iter().any(|l| l.contains(want)),
            "no {want:?} in {lines:#?}"
        );
    }
}

/// A part changed by hand: what, how, and the one change `plan` must list for it.
type Case<'a> = (&'a str, &'a dyn Fn(&Path), &'a str);

/// One part changed by hand: the list names it alone, pre-start mends it alone.
#[test]
fn privileged_a_part_changed_by_hand_is_listed_and_mended_alone() {
    let dir = started();
    let root = dir.path();
    let cases: [Case; 4] = [
        (
            "the gate drop-in edited",
            &|r| std::fs::write(r.join(GATE_FILE), "[Unit]\n").unwrap(),
            "gate write /run/nspawn-lifecycle/unit-gate.conf",
        ),
        (
            "a driver file removed from the tree",
            &|r| std::fs::remove_file(r.join(TREE).join("usr/bin/nvidia-imex")).unwrap(),
            "driver-root replace /var/lib/nspawn-lifecycle/driver-root/kube1",
        ),
        (
            "a stray marker",
            &|r| std::fs::write(r.join(MARKERS).join("kubelet.service"), "x\n").unwrap(),
            "gate remove /run/nspawn-lifecycle/machines/kube1/released/kubelet.service",
        ),
        (
            "the .nspawn file edited",
            &|r| {
                let text = std::fs::read_to_string(r.join(NSPAWN)).unwrap();
                std::fs::write(r.join(NSPAWN), format!("{text}# edited\n")).unwrap();
            },
            "next-start write /etc/systemd/nspawn/kube1.nspawn",
        ),
    ];
    for (what, change, want) in cases {
        change(root);
        assert_eq!(listed(root), [want], "{what}");
        let (code, err) = pre_start(root);
        assert_eq!(code, 0, "{what}: {err}");
        assert!(listed(root).is_empty(), "{what}: {:#?}", listed(root));
    }
}

/// A directory of a part that another user made is refused by the part's read (as by its
/// write): exit 1 naming it, and nothing after it written. The part's file being right does not
/// let it pass.
#[test]
fn privileged_another_users_directory_is_refused_before_anything_is_written() {
    let dir = started();
    let root = dir.path();
    for culprit in [MARKERS, "var/lib/nspawn-lifecycle/driver-root"] {
        let at = root.join(culprit);
        nix::unistd::chown(&at, Some(nix::unistd::Uid::from_raw(NOBODY)), None).unwrap();
        std::fs::remove_file(root.join(NSPAWN)).unwrap();
        let (code, err) = pre_start(root);
        assert_eq!(code, 1, "{culprit}: {err}");
        assert!(
            err.contains(&format!("{} is owned by uid {NOBODY}", at.display())),
            "{culprit}: {err}"
        );
        assert!(!root.join(NSPAWN).exists(), "{culprit}: pre-start went on");
        // plan reads the same refusal as the part's change that fails.
        let out = stdout_of_exit(root, &["plan", "kube1", "--json"], 0);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let fails: Vec<&serde_json::Value> = v["preStart"]["changes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["action"] == "fails")
            .collect();
        assert_eq!(fails.len(), 1, "{culprit}: {v:#}");
        assert!(
            fails[0]["detail"]
                .as_str()
                .unwrap()
                .contains("is owned by uid"),
            "{culprit}: {v:#}"
        );
        nix::unistd::chown(&at, Some(nix::unistd::Uid::from_raw(0)), None).unwrap();
        let (code, err) = pre_start(root);
        assert_eq!(code, 0, "{culprit}: {err}");
    }
}
