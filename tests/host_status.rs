//! `host status` as the built binary over an example host (`--host-root`, so no systemd is
//! asked and the files alone are judged): not installed (exit 2, and a StatusError object with
//! `--json`), installed but never wired (drift), wired by host mode's own file steps (in sync),
//! then one mutation at a time: the CDI spec edited, a `/dev/char` link dangling, a gate marker
//! gone, the host unit edited by hand, the host's `ld.so.cache` without the driver. Each time the state, the check and the
//! fix, and that status wrote nothing. Also `host plan --json`'s facts against its text.
//!
//! Privileged (mknod): fails, not skips, when not run as root.

#![allow(clippy::unwrap_used)]

mod common;
use common::{run_helper, snapshot, with_host_wiring};
use nspawn_lifecycle::apply::executor::Work as _;
use nspawn_lifecycle::apply::parts;
use nspawn_lifecycle::failpoint;
use std::path::Path;

fn two_gpus() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    nspawn_lifecycle::fixture::materialize(
        nspawn_lifecycle::fixture::example("two-gpus").unwrap(),
        dir.path(),
    )
    .unwrap();
    dir
}

/// `host status --json` on `root`: (exit code, the object), checking it wrote nothing.
fn status(root: &Path) -> (i32, serde_json::Value) {
    let before = snapshot(root, &[]);
    let out = run_helper(root, &["host", "status", "--json"]);
    assert_eq!(before, snapshot(root, &[]), "host status wrote");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), v)
}

fn checks(v: &serde_json::Value) -> Vec<(String, String)> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["state"].as_str().unwrap().to_owned(),
                f["check"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// What `host post-start` does to the files, by its own file steps (no systemd here).
fn wire(root: &Path) {
    with_host_wiring(root, |wiring, hc, _, _| {
        wiring.apply(&parts::DevChar, false).unwrap();
        wiring.apply(&parts::CdiSpec, false).unwrap();
        for unit in [&hc.containerd_unit, &hc.kubelet_unit] {
            wiring
                .release(unit, failpoint::Point::PostStartMidGateRelease)
                .unwrap();
        }
    });
}

#[test]
fn privileged_host_status_judges_host_mode_like_a_machine() {
    let dir = two_gpus();
    let root = dir.path();

    // Not installed: exit 2, and still one object with --json.
    let (code, v) = status(root);
    assert_eq!(code, 2, "{v:#}");
    assert_eq!(v["kind"], "StatusError");
    assert_eq!(v["machine"], "host");
    assert!(
        v["error"].as_str().unwrap().contains(
            "host mode is not installed: no /etc/systemd/system/nspawn-lifecycle-host.service"
        ),
        "{v:#}"
    );

    // Installed, never run: the host has a driver and GPUs, host mode has no NVIDIA state, and
    // its gate holds containerd and kubelet: broken, until host post-start runs.
    let out = common::install(root, &["--host"]);
    assert!(out.status.success(), "{out:?}");
    let (code, v) = status(root);
    assert_eq!((code, v["kind"].as_str()), (6, Some("HostStatus")), "{v:#}");
    assert_eq!(v["machine"], "host");
    assert_eq!(
        checks(&v),
        [
            ("drift".into(), "driver-version".into()),
            ("broken".into(), "gate".into())
        ],
        "{v:#}"
    );
    let summary = v["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("host: broken: containerd and kubelet are gated")
            && summary.contains("host post-start (nspawn-lifecycle-host.service) has not released")
            && summary.contains("missing on the host")
            && summary.contains("but host mode has no NVIDIA state"),
        "{summary}"
    );

    // Wired by host mode's own steps: in sync.
    wire(root);
    let (code, v) = status(root);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(
        v["summary"], "host: in sync: NVIDIA 580.95.05, 2 GPU(s)",
        "{v:#}"
    );
    let text = run_helper(root, &["host", "status"]);
    assert_eq!(
        String::from_utf8_lossy(&text.stdout),
        "host: in sync: NVIDIA 580.95.05, 2 GPU(s)\n"
    );

    // One mutation at a time, each undone by wiring again.
    let spec = root.join("var/run/cdi/nvidia.com-gpu.json");
    let dev_char = root.join("dev/char");
    let link = std::fs::read_dir(&dev_char)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read_link(p).is_ok_and(|t| t.to_string_lossy().contains("nvidia0")))
        .expect("a /dev/char link to nvidia0");
    let marker = root.join("run/nspawn-lifecycle/released/kubelet.service");
    assert!(marker.exists(), "{}", marker.display());
    let cache = root.join("etc/ld.so.cache");
    let cache_bytes = std::fs::read(&cache).unwrap();
    let unit = root.join("etc/systemd/system/nspawn-lifecycle-host.service");
    let unit_bytes = std::fs::read(&unit).unwrap();
    type Mutation<'a> = (
        &'static str,
        Box<dyn Fn() + 'a>,
        i32,
        &'static str,
        &'static str,
    );
    let mutations: Vec<Mutation> = vec![
        (
            "spec edited",
            Box::new(|| {
                let t = std::fs::read_to_string(&spec).unwrap();
                std::fs::write(&spec, t.replace("\"all\"", "\"every\"")).unwrap();
            }),
            5,
            "drift",
            "cdi-spec",
        ),
        (
            "spec not JSON",
            Box::new(|| std::fs::write(&spec, "{").unwrap()),
            6,
            "broken",
            "cdi-spec",
        ),
        (
            "/dev/char link dangling",
            Box::new(|| {
                std::fs::remove_file(&link).unwrap();
                std::os::unix::fs::symlink("../nvidia9", &link).unwrap();
            }),
            6,
            "broken",
            "dangling-links",
        ),
        (
            "kubelet's gate marker gone",
            Box::new(|| std::fs::remove_file(&marker).unwrap()),
            6,
            "broken",
            "gate",
        ),
        (
            "the host unit edited by hand",
            Box::new(|| {
                let mut t = std::fs::read(&unit).unwrap();
                t.extend_from_slice(b"# edited by hand\n");
                std::fs::write(&unit, t).unwrap();
            }),
            6,
            "broken",
            "dropin",
        ),
        (
            "ld.so.cache without the driver",
            Box::new(|| std::fs::write(&cache, b"").unwrap()),
            5,
            "drift",
            "ld-cache",
        ),
    ];
    for (what, mutate, want_code, want_state, want_check) in mutations {
        mutate();
        let (code, v) = status(root);
        assert_eq!(code, want_code, "{what}: {v:#}");
        assert!(
            checks(&v).contains(&(want_state.into(), want_check.into())),
            "{what}: {v:#}"
        );
        std::fs::write(&cache, &cache_bytes).unwrap();
        std::fs::write(&unit, &unit_bytes).unwrap();
        wire(root);
        let (code, v) = status(root);
        assert_eq!(code, 0, "{what}, wired again: {v:#}");
    }
}

/// `host plan --json` states the facts its text shows.
#[test]
fn privileged_host_plan_json_is_the_text_as_one_object() {
    let dir = two_gpus();
    let out = run_helper(dir.path(), &["host", "plan", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["apiVersion"], "nspawn-lifecycle/v1");
    assert_eq!(v["kind"], "HostPlan");
    assert_eq!(v["nvidia"], "complete");
    assert_eq!(v["driverVersion"], "580.95.05");
    assert_eq!(v["gpus"], 2);
    assert_eq!(v["cdiSpec"], "/var/run/cdi/nvidia.com-gpu.json");
    let text = String::from_utf8(run_helper(dir.path(), &["host", "plan"]).stdout).unwrap();
    let steps: Vec<&str> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert!(
        text.contains(&format!("steps: {}\n", steps.join(" → "))),
        "{text}\n{v:#}"
    );
    assert_eq!(v["units"][1]["unit"], "kubelet.service");
    assert_eq!(v["units"][1]["gateInstalled"], false);
}
