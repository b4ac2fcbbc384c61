//! `install` and `uninstall` run as the built binary against host trees under `--host-root`.
//!
//! Each test builds a small host (a machine directory and the standard systemd directories) in a
//! tempdir, or copies one of the older-agent layouts from `tests/fixtures/legacy-*`. The drop-in
//! is pinned by `tests/golden/dropin-kube1.conf` (rewrite it with `UPDATE_GOLDEN=1`).
//!
//! Every test here except `dropin_matches_golden` and the bad-input one renders the `.nspawn`
//! file, so it needs host discovery (an empty host is verdict "none").

// Test helpers outside #[test] fns panic on setup failures by design.
#![allow(clippy::unwrap_used)]

mod common;
use common::{copy_tree, run_helper};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_nspawn-lifecycle-helper");
const DIR: &str = "etc/systemd/system/systemd-nspawn@kube1.service.d";
const DROPIN: &str = "etc/systemd/system/systemd-nspawn@kube1.service.d/50-nspawn-lifecycle.conf";
const OVERRIDE: &str = "etc/systemd/system/systemd-nspawn@kube1.service.d/override.conf";
const NSPAWN: &str = "etc/systemd/nspawn/kube1.nspawn";
const HELPER: &str = "usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper";

/// A host with machine `kube1` and the directories a systemd host has anyway.
fn host() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for d in [
        "var/lib/machines/kube1/etc",
        "etc/systemd/system",
        "etc/systemd/nspawn",
        "usr/local/lib",
    ] {
        std::fs::create_dir_all(t.path().join(d)).unwrap();
    }
    std::fs::write(
        t.path().join("var/lib/machines/kube1/etc/hostname"),
        "kube1\n",
    )
    .unwrap();
    t
}

/// A host with an older agent's layout copied from `tests/fixtures/<name>`.
fn legacy_host(name: &str) -> tempfile::TempDir {
    let t = host();
    copy_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
        t.path(),
    );
    t
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(root: &Path, args: &[&str]) -> Out {
    let out = run_helper(root, args);
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Run and require exit 0.
fn ok(root: &Path, args: &[&str]) -> String {
    let o = run(root, args);
    assert_eq!(
        o.code, 0,
        "{args:?} failed\nstdout:\n{}\nstderr:\n{}",
        o.stdout, o.stderr
    );
    o.stdout
}

/// Every entry under `root`: (inode, mtime, mode, size); `run/` is left out (the machine lock
/// lives there, runtime state on a tmpfs).
type Snapshot = BTreeMap<PathBuf, (u64, i64, i64, u32, u64)>;

fn snapshot(root: &Path) -> Snapshot {
    fn walk(root: &Path, dir: &Path, out: &mut Snapshot) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if rel.starts_with("run") {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let size = if m.is_dir() { 0 } else { m.size() };
            out.insert(rel, (m.ino(), m.mtime(), m.mtime_nsec(), m.mode(), size));
            if m.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Snapshot::new();
    walk(root, root, &mut out);
    out
}

/// Like [`snapshot`], without directory mtimes: removing what was added changes those.
fn contents(root: &Path) -> Snapshot {
    let mut s = snapshot(root);
    for (path, v) in s.iter_mut() {
        if root.join(path).is_dir() {
            (v.1, v.2) = (0, 0);
        }
    }
    s
}

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn golden_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/dropin-kube1.conf")
}

// ---------------------------------------------------------------------------------------------
// The unit's effective settings, merged the way systemd merges drop-ins: files in lexical order,
// list settings accumulate and an empty assignment resets them, other settings: the last wins.

const LISTS: [&str; 5] = [
    "ExecStartPre",
    "ExecStartPost",
    "DeviceAllow",
    "Environment",
    "After",
];

/// (section, key, value) in effect after merging every `*.conf` in `dir`.
fn effective(dir: &Path) -> Vec<(String, String, String)> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".conf"))
        .collect();
    names.sort();
    let mut eff: Vec<(String, String, String)> = Vec::new();
    for name in names {
        let text = std::fs::read_to_string(dir.join(&name)).unwrap();
        let mut section = String::new();
        let mut pending = String::new();
        for line in text.lines() {
            let t = line.trim();
            if pending.is_empty() && (t.is_empty() || t.starts_with('#') || t.starts_with(';')) {
                continue;
            }
            if let Some(cont) = t.strip_suffix('\\') {
                pending.push_str(cont);
                pending.push(' ');
                continue;
            }
            let logical = format!("{pending}{t}");
            pending.clear();
            if logical.starts_with('[') {
                section = logical.trim_matches(['[', ']']).to_owned();
                continue;
            }
            let (k, v) = logical.split_once('=').unwrap();
            let (k, v) = (k.trim().to_owned(), v.trim().to_owned());
            if LISTS.contains(&k.as_str()) {
                if v.is_empty() {
                    eff.retain(|(s, key, _)| !(*s == section && *key == k));
                } else if k == "Environment" {
                    for word in v.split_whitespace() {
                        let var = word.split('=').next().unwrap();
                        eff.retain(|(s, key, val)| {
                            !(*s == section && *key == k && val.split('=').next() == Some(var))
                        });
                        eff.push((section.clone(), k.clone(), word.to_owned()));
                    }
                } else {
                    eff.push((section.clone(), k, v));
                }
            } else {
                eff.retain(|(s, key, _)| !(*s == section && *key == k));
                eff.push((section.clone(), k, v));
            }
        }
    }
    eff
}

/// Our drop-in's settings, each exactly once in the effective settings, and nothing that
/// conflicts: single-valued keys hold our value, no per-device NVIDIA/DRM entries, no old hooks.
fn assert_ours_exactly_once(root: &Path) {
    let eff = effective(&root.join(DIR));
    let ours = effective_of_text(&read(root, DROPIN));
    assert!(!ours.is_empty());
    for o in &ours {
        let n = eff.iter().filter(|e| *e == o).count();
        assert_eq!(n, 1, "{o:?} is in effect {n} times: {eff:#?}");
        if !LISTS.contains(&o.1.as_str()) {
            assert!(
                eff.iter().filter(|e| e.1 == o.1).all(|e| e == o),
                "{o:?} is overridden: {eff:#?}"
            );
        }
    }
    for (_, k, v) in &eff {
        if k == "DeviceAllow" {
            assert!(
                !(v.starts_with("/dev/nvidia") || v.starts_with("/dev/dri")),
                "per-device entry left: {v}"
            );
        }
        if k.starts_with("ExecStart") {
            assert!(
                ours.iter().any(|o| o.1 == *k && o.2 == *v)
                    || !(v.contains("nspawn-lifecycle") || v.contains("machinectl")),
                "old hook left: {k}={v}"
            );
        }
    }
}

fn effective_of_text(text: &str) -> Vec<(String, String, String)> {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("x.conf"), text).unwrap();
    effective(d.path())
}

// ---------------------------------------------------------------------------------------------

#[test]
fn dropin_matches_golden() {
    let machine = "kube1".parse().unwrap();
    let text = nspawn_lifecycle::model::dropin::Dropin::new(
        &machine,
        &nspawn_lifecycle::config::DEFAULT_HELPER_PATH
            .parse()
            .unwrap(),
    )
    .to_string();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(golden_path(), &text).unwrap();
    }
    let golden = std::fs::read_to_string(golden_path()).unwrap();
    assert_eq!(
        text, golden,
        "drop-in differs from tests/golden/dropin-kube1.conf; rerun with UPDATE_GOLDEN=1 if intended"
    );
    assert_eq!(
        nspawn_lifecycle::types::units::dropin_path(&machine),
        format!("/{DROPIN}")
    );
    // The hooks, the clean-up and the device groups DESIGN §4 asks for, once each.
    for line in [
        "StartLimitIntervalSec=0",
        "Restart=on-failure",
        "Environment=SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1",
        "Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=network",
        "ExecStartPre=-/usr/bin/machinectl terminate kube1",
        "ExecStartPre=/usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper nspawn-lifecycle pre-start %i",
        "ExecStartPost=/usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper nspawn-lifecycle post-start %i",
        "DeviceAllow=char-nvidia* rwm",
        "DeviceAllow=char-drm rwm",
        "DeviceAllow=/dev/kvm rwm",
    ] {
        assert_eq!(text.lines().filter(|l| *l == line).count(), 1, "{line}");
    }
    let unit_section = text.split("[Service]").next().unwrap();
    assert!(unit_section.contains("[Unit]\n") && unit_section.contains("StartLimitIntervalSec=0"));
}

/// Issue 14: a machine whose config's `gpus` is not `all` gets a drop-in that allows no NVIDIA
/// or DRM group (pre-start sets its own nodes by number at every start); `install` writes it
/// from the config, and the `all` machine beside it keeps today's bytes.
#[test]
fn a_machine_without_every_gpu_gets_a_dropin_without_nvidia_groups() {
    let t = host();
    let root = t.path();
    std::fs::create_dir_all(root.join("var/lib/machines/kube2")).unwrap();
    std::fs::create_dir_all(root.join("etc/nspawn-lifecycle")).unwrap();
    std::fs::write(
        root.join("etc/nspawn-lifecycle/config.json"),
        r#"{"machines": {"kube1": {"gpus": "none"}, "kube2": {"gpus": "all"}}}"#,
    )
    .unwrap();
    ok(root, &["install", "kube1"]);
    ok(root, &["install", "kube2"]);
    let text = read(root, DROPIN);
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/dropin-kube1-not-all-gpus.conf");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    assert_eq!(
        text,
        std::fs::read_to_string(&path).unwrap(),
        "UPDATE_GOLDEN=1 rewrites it"
    );
    assert!(
        !text.contains("char-nvidia") && !text.contains("char-drm"),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| *l == "DeviceAllow=/dev/kvm rwm")
            .count(),
        1
    );
    let all = read(
        root,
        "etc/systemd/system/systemd-nspawn@kube2.service.d/50-nspawn-lifecycle.conf",
    );
    assert_eq!(
        all,
        std::fs::read_to_string(golden_path())
            .unwrap()
            .replace("kube1", "kube2")
    );
}

#[test]
fn fresh_install_writes_helper_dropin_and_nspawn() {
    let h = host();
    let root = h.path();
    let out = ok(root, &["install", "kube1"]);
    for (file, verb) in [
        (HELPER, "created"),
        (NSPAWN, "created"),
        (DROPIN, "created"),
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("/{file}: {verb}"))),
            "{file} {verb}: {out}"
        );
    }
    assert!(out.contains("systemd: not reloaded: --host-root"), "{out}");
    assert_eq!(
        read(root, DROPIN),
        std::fs::read_to_string(golden_path()).unwrap()
    );
    let helper = root.join(HELPER);
    assert_eq!(std::fs::read(&helper).unwrap(), std::fs::read(BIN).unwrap());
    assert_eq!(
        std::fs::metadata(&helper).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    assert!(read(root, NSPAWN).starts_with("# Written by nspawn-lifecycle-helper pre-start"));
    assert_eq!(read(root, "var/lib/machines/kube1/etc/hostname"), "kube1\n");
    assert_ours_exactly_once(root);
}

#[test]
fn second_install_changes_nothing() {
    let h = host();
    let root = h.path();
    ok(root, &["install", "kube1"]);
    let before = snapshot(root);
    let out = ok(root, &["install", "kube1"]);
    assert_eq!(snapshot(root), before, "second install wrote something");
    assert!(out.contains("install kube1: nothing changed"), "{out}");
    assert!(
        out.contains("systemd: not reloaded (no unit file changed)"),
        "{out}"
    );
    for file in [HELPER, NSPAWN, DROPIN] {
        assert!(out.contains(&format!("/{file}: unchanged")), "{out}");
    }
}

#[test]
fn dry_run_writes_nothing() {
    for h in [host(), legacy_host("legacy-agent-extra")] {
        let root = h.path();
        let before = snapshot(root);
        let out = ok(root, &["install", "kube1", "--dry-run"]);
        assert_eq!(snapshot(root), before, "dry run wrote something");
        assert!(!root.join("run").exists(), "dry run took the lock");
        assert!(out.contains(&format!("/{DROPIN}: would create")), "{out}");
        assert!(out.contains("dry run, nothing written"), "{out}");
        // The same report as the real run, in the conditional.
        let real = ok(root, &["install", "kube1"]);
        assert_eq!(
            out.replace("would create", "created")
                .replace("would rewrite", "rewritten")
                .replace("would remove", "removed")
                .replace("would update", "updated")
                .lines()
                .filter(|l| l.starts_with('/'))
                .collect::<Vec<_>>(),
            real.lines()
                .filter(|l| l.starts_with('/'))
                .collect::<Vec<_>>()
        );
    }
}

/// The harness (tests/e2e) takes the drop-in from `install --print-dropin` instead of keeping a
/// copy: it must be the bytes install writes, for the configured helper path, writing nothing.
#[test]
fn print_dropin_is_what_install_writes_and_writes_nothing() {
    let h = host();
    let root = h.path();
    let before = snapshot(root);
    let printed = ok(root, &["install", "kube1", "--print-dropin"]);
    assert_eq!(snapshot(root), before, "--print-dropin wrote something");
    assert!(!root.join("run").exists(), "--print-dropin took the lock");
    assert_eq!(
        printed,
        std::fs::read_to_string(golden_path()).unwrap(),
        "--print-dropin differs from tests/golden/dropin-kube1.conf"
    );
    ok(root, &["install", "kube1"]);
    assert_eq!(read(root, DROPIN), printed, "install wrote other bytes");

    // The configured helper path reaches the printed hooks, escaped as install writes them.
    let h = host();
    let root = h.path();
    let config = root.join("config.json");
    std::fs::write(&config, r#"{"helperPath": "/opt/odd%dir/helper"}"#).unwrap();
    let config = config.to_str().unwrap();
    let printed = ok(
        root,
        &["--config", config, "install", "kube1", "--print-dropin"],
    );
    assert!(
        printed.contains("ExecStartPre=/opt/odd%%dir/helper nspawn-lifecycle pre-start %i\n"),
        "{printed}"
    );
    ok(root, &["--config", config, "install", "kube1"]);
    assert_eq!(read(root, DROPIN), printed);

    // It is not a kind of dry run: both at once is bad usage.
    let o = run(root, &["install", "kube1", "--print-dropin", "--dry-run"]);
    assert_eq!(o.code, 2, "{}{}", o.stdout, o.stderr);
    assert!(o.stderr.contains("--dry-run"), "{}", o.stderr);
}

#[test]
fn legacy_layout_migrates() {
    let h = legacy_host("legacy-agent");
    let root = h.path();
    let out = ok(root, &["install", "kube1"]);
    // Everything in the old override.conf is now ours, so it is gone, and said so.
    assert!(!root.join(OVERRIDE).exists(), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("/{OVERRIDE}: removed")))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("DeviceAllow=/dev/nvidia0 rwm"), "{line}");
    assert!(
        line.contains("ExecStartPost=/usr/local/bin/nspawn-lifecycle-helper post %i"),
        "{line}"
    );
    assert_ours_exactly_once(root);
    // The old agent's .nspawn file is replaced by pre-start's rendering.
    let nspawn = read(root, NSPAWN);
    assert!(nspawn.starts_with("# Written by nspawn-lifecycle-helper pre-start"));
    assert!(!nspawn.contains(":/run/host-nvidia/0"), "{nspawn}");
    assert!(
        out.contains(&format!(
            "/{NSPAWN}: updated (replaces the file an older agent wrote"
        )),
        "{out}"
    );
    let before = snapshot(root);
    let again = ok(root, &["install", "kube1"]);
    assert_eq!(snapshot(root), before);
    assert!(again.contains("install kube1: nothing changed"), "{again}");
}

#[test]
fn legacy_layout_with_unrecognised_lines_keeps_and_reports_them() {
    let h = legacy_host("legacy-agent-extra");
    let root = h.path();
    let out = ok(root, &["install", "kube1"]);
    let kept = read(root, OVERRIDE);
    for line in [
        "After=network-online.target",
        "Environment=HTTP_PROXY=http://proxy:3128",
        "DeviceAllow=/dev/fuse rwm",
        "LimitNOFILE=1048576",
        "# Big nodes hold many files open.",
    ] {
        assert!(kept.lines().any(|l| l == line), "{line} not kept:\n{kept}");
    }
    for gone in [
        "SYSTEMD_NSPAWN",
        "machinectl",
        "/dev/nvidia",
        "Restart=",
        "StartLimit",
    ] {
        assert!(!kept.contains(gone), "{gone} left in:\n{kept}");
    }
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("/{OVERRIDE}: rewritten")))
        .unwrap_or_else(|| panic!("{out}"));
    for reported in [
        "Environment=HTTP_PROXY=http://proxy:3128",
        "LimitNOFILE=1048576",
        "DeviceAllow=/dev/fuse rwm",
        "After=network-online.target",
    ] {
        let kept_part = line
            .split("kept, not managed by nspawn-lifecycle:")
            .nth(1)
            .unwrap();
        assert!(
            kept_part.contains(reported),
            "{reported} not reported: {line}"
        );
    }
    assert_ours_exactly_once(root);
    let eff = effective(&root.join(DIR));
    for (k, v) in [
        ("LimitNOFILE", "1048576"),
        ("Environment", "HTTP_PROXY=http://proxy:3128"),
    ] {
        assert!(
            eff.iter().any(|e| e.1 == k && e.2 == v),
            "{k}={v}: {eff:#?}"
        );
    }
    let before = snapshot(root);
    let again = ok(root, &["install", "kube1"]);
    assert_eq!(snapshot(root), before);
    assert!(again.contains("install kube1: nothing changed"), "{again}");
}

/// What uninstall leaves in place of the rendered `.nspawn` file, pinned by a golden file.
fn assert_uninstalled_nspawn(root: &Path) {
    let text = read(root, NSPAWN);
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/uninstalled-kube1.nspawn");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &text).unwrap();
    }
    assert_eq!(text, std::fs::read_to_string(&golden).unwrap());
    // The point of the file: no -U at the next start of the stock unit, and nothing of the GPUs.
    assert!(text.contains("\nPrivateUsers=no\n"), "{text}");
    for gone in ["/dev/", "host-nvidia", "unit-gate", "nspawn-lifecycle-gate"] {
        assert!(!text.contains(gone), "{gone} left in:\n{text}");
    }
}

#[test]
fn uninstall_removes_exactly_what_install_added() {
    let h = host();
    let root = h.path();
    // An operator's own drop-in, and state inside the machine: neither is ours.
    std::fs::create_dir_all(root.join(DIR)).unwrap();
    std::fs::write(
        root.join(DIR).join("10-local.conf"),
        "[Service]\nCPUWeight=200\n",
    )
    .unwrap();
    let before = contents(root);
    ok(root, &["install", "kube1"]);
    let out = ok(root, &["uninstall", "kube1", "--dry-run"]);
    assert!(out.contains(&format!("/{DROPIN}: would remove")), "{out}");
    assert!(root.join(DROPIN).exists());
    let out = ok(root, &["uninstall", "kube1"]);
    // Everything as before install, but for the .nspawn file without GPU binds.
    assert!(
        out.contains(&format!(
            "/{NSPAWN}: updated (settings without GPU binds, PrivateUsers=no"
        )),
        "{out}"
    );
    assert_uninstalled_nspawn(root);
    let mut after = contents(root);
    after.remove(Path::new(NSPAWN));
    assert_eq!(after, before, "uninstall left or took something:\n{out}");
    let again = ok(root, &["uninstall", "kube1"]);
    assert!(
        again.contains("uninstall kube1: nothing changed"),
        "{again}"
    );

    // Without a foreign drop-in the .d directory goes too.
    let h = host();
    let root = h.path();
    let before = contents(root);
    ok(root, &["install", "kube1"]);
    ok(root, &["uninstall", "kube1"]);
    let mut after = contents(root);
    after.remove(Path::new(NSPAWN));
    assert_eq!(after, before);
}

/// `--json`: the same report as one object, the dry run writing nothing.
#[test]
fn json_report_says_what_would_change_and_what_did() {
    let h = host();
    let root = h.path();
    let json =
        |args: &[&str]| -> serde_json::Value { serde_json::from_str(&ok(root, args)).unwrap() };
    let before = snapshot(root);
    let v = json(&["install", "kube1", "--dry-run", "--json"]);
    assert_eq!(snapshot(root), before, "the dry run wrote");
    assert_eq!(
        (&v["kind"], &v["dryRun"]),
        (&"InstallReport".into(), &true.into()),
        "{v}"
    );
    let dropin = format!("/{DROPIN}");
    let action = |v: &serde_json::Value, path: &str| {
        v["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == path)
            .map(|f| f["action"].as_str().unwrap().to_owned())
    };
    assert_eq!(action(&v, &dropin).as_deref(), Some("create"), "{v}");
    assert!(v["changes"].as_u64().unwrap() > 0, "{v}");
    let v = json(&["install", "kube1", "--json"]);
    assert_eq!(
        (&v["dryRun"], action(&v, &dropin).as_deref()),
        (&false.into(), Some("create"))
    );
    let v = json(&["install", "kube1", "--json"]);
    assert_eq!(v["changes"], 0, "{v}");
    let v = json(&["uninstall", "kube1", "--json"]);
    assert_eq!(
        (&v["command"], action(&v, &dropin).as_deref()),
        (&"uninstall".into(), Some("remove"))
    );
}

/// The unit gate's markers pre-start keeps on the host for the machine go with uninstall.
#[test]
fn uninstall_removes_the_machines_gate_markers() {
    let h = tempfile::tempdir().unwrap();
    let example = nspawn_lifecycle::fixture::example("two-gpus").unwrap();
    nspawn_lifecycle::fixture::materialize(example, h.path()).unwrap();
    let root = h.path();
    ok(root, &["install", "kube1"]);
    ok(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    let markers = root.join("run/nspawn-lifecycle/machines/kube1/released");
    assert!(markers.join("containerd.service").is_file());
    let out = ok(root, &["uninstall", "kube1"]);
    assert!(
        out.contains("/run/nspawn-lifecycle/machines/kube1: removed (the unit gate's markers)"),
        "{out}"
    );
    assert!(!root.join("run/nspawn-lifecycle/machines/kube1").exists());
    // pre-start after uninstall would bind the unit gate again, which nothing releases without
    // the drop-in's post-start: refused by name, nothing written.
    let before = snapshot(root);
    let o = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains("kube1 is uninstalled") && o.stderr.contains("install kube1"),
        "{}",
        o.stderr
    );
    assert_eq!(snapshot(root), before);
    assert!(!root.join("run/nspawn-lifecycle/machines/kube1").exists());
    // Installed again, pre-start runs as before.
    ok(root, &["install", "kube1"]);
    ok(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
}

/// Issue 10 item 9: a start of the stock unit after uninstall must not run with `-U` (which
/// chowns the rootfs to a private UID range), so the `.nspawn` file stays, without GPU binds;
/// and install takes that file back as its own.
#[test]
fn uninstall_leaves_private_users_off_and_install_takes_the_file_back() {
    let h = host();
    let root = h.path();
    ok(root, &["install", "kube1"]);
    let installed = read(root, NSPAWN);
    ok(root, &["uninstall", "kube1"]);
    assert_uninstalled_nspawn(root);
    // Not written by pre-start, yet not foreign: install replaces it without an audit complaint.
    let out = ok(root, &["install", "kube1"]);
    assert!(out.contains(&format!("/{NSPAWN}: updated")), "{out}");
    assert_eq!(read(root, NSPAWN), installed);
    // uninstall of a machine whose .nspawn file pre-start never wrote (install skipped it) still
    // leaves one; a second uninstall changes nothing; one that was never installed (a typo of the
    // name) is exit 2, saying so, and gets none.
    std::fs::remove_file(root.join(NSPAWN)).unwrap();
    ok(root, &["uninstall", "kube1"]);
    assert_uninstalled_nspawn(root);
    ok(root, &["uninstall", "kube1"]);
    assert_uninstalled_nspawn(root);
    std::fs::remove_file(root.join(NSPAWN)).unwrap();
    let out = run_helper(root, &["uninstall", "kube1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("machine kube1 is not installed"),
        "{out:?}"
    );
    assert!(!root.join(NSPAWN).exists());
}

/// Issue 10 item 9: a rootfs an earlier `-U` start shifted is refused with the command that
/// shifts it back, before anything is written (needs root to chown).
#[test]
fn privileged_install_refuses_a_shifted_rootfs_naming_the_fix() {
    let h = host();
    let root = h.path();
    let machine = root.join("var/lib/machines/kube1");
    std::os::unix::fs::chown(&machine, Some(468_254_720), Some(468_254_720))
        .expect("chown needs root");
    let before = snapshot(root);
    for args in [
        &["install", "kube1"][..],
        &["nspawn-lifecycle", "pre-start", "kube1"],
        &["plan", "kube1"],
    ] {
        let o = run(root, args);
        assert_eq!(o.code, 2, "{args:?}: {}{}", o.stdout, o.stderr);
        assert!(
            o.stderr
                .contains("/var/lib/machines/kube1 is owned by UID 468254720 GID 468254720")
                && o.stderr.contains(
                    "`systemd-nspawn --directory=/var/lib/machines/kube1 --settings=no \
                     --private-users=0 --private-users-ownership=chown /bin/true`"
                ),
            "{args:?}: {}",
            o.stderr
        );
        assert_eq!(snapshot(root), before, "{args:?} changed files");
        assert!(!root.join("run").exists(), "{args:?} took the lock");
    }
    std::os::unix::fs::chown(&machine, Some(0), Some(0)).unwrap();
    ok(root, &["install", "kube1"]);
}

#[test]
fn operator_dropins_are_left_alone_and_overlaps_reported() {
    let h = host();
    let root = h.path();
    let template = root.join("etc/systemd/system/systemd-nspawn@.service.d");
    std::fs::create_dir_all(&template).unwrap();
    std::fs::create_dir_all(root.join(DIR)).unwrap();
    // What `systemctl edit` writes after a migration: deliberate overrides, no older agent marks.
    let edit = "[Service]\nTimeoutStartSec=2h\nCPUWeight=200\n";
    std::fs::write(root.join(OVERRIDE), edit).unwrap();
    // A template-level drop-in with a hook of an earlier helper (the rig's style).
    let rig = "[Service]\nExecStartPre=/usr/local/bin/nspawn-lifecycle-helper pre %i\n";
    std::fs::write(template.join("10-lifecycle-helper.conf"), rig).unwrap();
    let out = ok(root, &["install", "kube1"]);
    assert_eq!(read(root, OVERRIDE), edit);
    assert_eq!(
        read(
            root,
            "etc/systemd/system/systemd-nspawn@.service.d/10-lifecycle-helper.conf"
        ),
        rig
    );
    assert!(
        out.contains(&format!("/{OVERRIDE}: kept (not an older agent's layout")),
        "{out}"
    );
    let warnings: Vec<_> = out.lines().filter(|l| l.starts_with("warning: ")).collect();
    assert_eq!(warnings.len(), 2, "{out}");
    assert!(warnings[0].contains("TimeoutStartSec=2h"), "{out}");
    assert!(
        warnings[1].contains("10-lifecycle-helper.conf") && warnings[1].contains("pre %i"),
        "{out}"
    );
    // The operator's override wins over ours, as systemd applies it after ours.
    let eff = effective(&root.join(DIR));
    assert!(eff.iter().any(|e| e.1 == "TimeoutStartSec" && e.2 == "2h"));
    assert!(!eff.iter().any(|e| e.1 == "TimeoutStartSec" && e.2 != "2h"));
}

#[test]
fn two_machines_share_the_helper_copy() {
    let h = host();
    let root = h.path();
    std::fs::create_dir_all(root.join("var/lib/machines/kube2")).unwrap();
    ok(root, &["install", "kube1"]);
    let second = ok(root, &["install", "kube2"]);
    assert!(
        second.contains(&format!("/{HELPER}: unchanged")),
        "{second}"
    );
    let out = ok(root, &["uninstall", "kube1"]);
    assert!(root.join(HELPER).exists(), "{out}");
    assert!(
        out.contains(&format!(
            "/{HELPER}: kept (still used by systemd-nspawn@kube2.service)"
        )),
        "{out}"
    );
    assert!(!root.join(DROPIN).exists());
    let out = ok(root, &["uninstall", "kube2"]);
    assert!(!root.join(HELPER).exists(), "{out}");
    assert!(
        !root.join("usr/local/lib/nspawn-lifecycle").exists(),
        "{out}"
    );
    assert!(root.join("usr/local/lib").exists());
}

#[test]
fn bad_input_exits_2_naming_the_culprit_and_changes_nothing() {
    let h = legacy_host("legacy-agent-extra");
    let root = h.path();
    let config = root.join("bad-config.json");
    std::fs::write(&config, r#"{"helperPath": "relative/helper"}"#).unwrap();
    // A .nspawn file of another machine with a bind pre-start would drop.
    let foreign = h.path().join("etc/systemd/nspawn/kube3.nspawn");
    std::fs::write(
        &foreign,
        "[Files]\nBind=/dev/nvidia0\nBindReadOnly=/data/models\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("var/lib/machines/kube3")).unwrap();
    let config_arg = config.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["install", "../etc"], "../etc"),
        // A mistyped name: no image where nspawn looks (src/model/image.rs).
        (
            vec!["install", "kube9"],
            "no directory kube9 or image kube9.raw in /etc/machines, /run/machines, \
             /var/lib/machines, /usr/local/lib/machines, /usr/lib/machines",
        ),
        (
            vec!["plan", "kube9"],
            "no directory kube9 or image kube9.raw",
        ),
        (
            vec!["nspawn-lifecycle", "pre-start", "kube9"],
            "no directory kube9 or image kube9.raw",
        ),
        (
            vec!["--config", config_arg, "install", "kube1"],
            "helperPath",
        ),
        (
            vec!["--config", config_arg, "install", "kube1", "--print-dropin"],
            "helperPath",
        ),
        (vec!["install", "../etc", "--print-dropin"], "../etc"),
        (vec!["install", "kube3"], "BindReadOnly=/data/models"),
        (vec!["uninstall", "a/b"], "a/b"),
    ];
    let before = snapshot(root);
    for (args, culprit) in cases {
        let o = run(root, &args);
        assert_eq!(o.code, 2, "{args:?}\n{}{}", o.stdout, o.stderr);
        assert!(
            o.stderr.contains(culprit),
            "{args:?} should name {culprit}: {}",
            o.stderr
        );
        assert_eq!(snapshot(root), before, "{args:?} changed files");
        assert!(!root.join("run").exists(), "{args:?} took the lock");
    }
}

/// Needs root for mknod: GPU device nodes without a driver are "incomplete".
#[test]
fn privileged_incomplete_nvidia_state_installs_dropin_and_skips_nspawn() {
    let h = legacy_host("legacy-agent");
    let root = h.path();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    for (name, minor) in [("nvidia0", 0), ("nvidiactl", 255)] {
        let st = Command::new("mknod")
            .arg(root.join("dev").join(name))
            .args(["c", "195", &minor.to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "mknod needs root");
    }
    let old_nspawn = read(root, NSPAWN);
    let out = ok(root, &["install", "kube1"]);
    assert!(out.contains(&format!("/{DROPIN}: created")), "{out}");
    assert!(
        out.contains(&format!("/{NSPAWN}: skipped")) && out.contains("incomplete"),
        "{out}"
    );
    assert_eq!(
        read(root, NSPAWN),
        old_nspawn,
        "the .nspawn file must wait for pre-start"
    );
    assert_ours_exactly_once(root);
}

/// pre-start refuses a `.nspawn` file it did not write, as install does, naming it and where its
/// settings belong; the file stays byte for byte. Its own file (and uninstall's) it rewrites.
#[test]
fn pre_start_refuses_a_hand_written_nspawn_file() {
    let h = host();
    let root = h.path();
    let hand = "[Exec]\nBoot=yes\n\n[Network]\nPort=8080\n\n[Files]\nBind=/srv/data\n";
    std::fs::create_dir_all(root.join("etc/systemd/nspawn")).unwrap();
    std::fs::write(root.join(NSPAWN), hand).unwrap();
    let out = run_helper(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("kube1.nspawn was not written by nspawn-lifecycle-helper")
            && err.contains("`mounts`")
            && err.contains("systemd-nspawn@kube1.service"),
        "{err}"
    );
    assert_eq!(read(root, NSPAWN), hand);
    // What uninstall leaves is ours: pre-start takes it back.
    std::fs::remove_file(root.join(NSPAWN)).unwrap();
    ok(root, &["install", "kube1"]);
    ok(root, &["uninstall", "kube1"]);
    ok(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
}
