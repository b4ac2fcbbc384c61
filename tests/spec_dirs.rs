//! The CDI spec directories as CDI consumers load them. containerd, CRI-O and podman read specs
//! through the Go library (`container-device-interface`, `scanSpecDirs`): every entry of
//! `/etc/cdi` and `/var/run/cdi` that is not a directory and ends in `.json` or `.yaml`,
//! dot-files and symlinks included. A second spec of our kind in the same directory makes the
//! library drop every device of the kind ("conflicting device"), so each one it would load,
//! status must see and post-start must remove; what cannot be judged within the bounds is
//! reported, never fatal to the start. NVIDIA's `nvidia-ctk cdi list` (the same library) is the
//! oracle for what a consumer finds.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

mod common;
mod rewire_support;

use nspawn_lifecycle::fs::machine_root::MachineRoot;
use nspawn_lifecycle::model::{Action, cdi, spec};
use rewire_support::*;
use std::os::unix::fs::symlink;
use std::path::Path;

const KIND: &str = "nvidia.com/gpu";
/// The fixture GPU by UUID, as a consumer names it.
const GPU_UUID: &str = "nvidia.com/gpu=GPU-edfee158-11c1-52b8-0517-92f30e7fac88";

fn want(bytes: Vec<u8>) -> spec::Want {
    spec::Want {
        dir: CDI_DIR.into(),
        file: CDI_FILE.into(),
        kind: KIND.into(),
        bytes: Some(bytes),
    }
}

/// Our real spec for the one-GPU host of the fixtures, as post-start writes it.
fn our_spec() -> Vec<u8> {
    let inv = inventory(NEW);
    cdi::render(&cdi::spec(&inv, KIND).unwrap()).into_bytes()
}

/// A machine holding our spec, written by post-start's CDI step with the product's predicate.
fn wired() -> (tempfile::TempDir, MachineRoot, spec::Want) {
    let dir = tempfile::tempdir().unwrap();
    debian_machine(dir.path());
    let root = MachineRoot::open(dir.path()).unwrap();
    let want = want(our_spec());
    nspawn_lifecycle::apply::rewire::write_cdi(&root, &want, |n, b| want.conflicts(n, b)).unwrap();
    (dir, root, want)
}

/// The devices `nvidia-ctk cdi list` finds in the machine's `/var/run/cdi`, and what it logged.
fn ctk_devices(machine: &Path) -> (Vec<String>, String) {
    let out = std::process::Command::new(common::nvidia_tool("nvidia-ctk"))
        .args(["cdi", "list", "--spec-dir"])
        .arg(machine.join("var/run/cdi"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let devices = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect();
    (devices, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn changes(root: &MachineRoot, want: &spec::Want) -> Vec<(Action, String)> {
    let seen = spec::observe(root, want).unwrap();
    spec::diff(want, &seen)
        .unwrap()
        .into_iter()
        .map(|c| (c.action, c.path))
        .collect()
}

#[test]
fn hidden_and_linked_copies_of_our_spec_are_seen_and_removed() {
    let (dir, root, want) = wired();
    let m = dir.path();
    let (devices, _) = ctk_devices(m);
    assert_eq!(
        devices,
        ["nvidia.com/gpu=0", GPU_UUID, "nvidia.com/gpu=all"]
    );
    assert_eq!(changes(&root, &want), [], "in sync once written");

    // The attack: a dot-file copy, and a link to a copy elsewhere in the machine.
    let ours = std::fs::read(m.join("run/cdi").join(CDI_FILE)).unwrap();
    std::fs::write(m.join("run/cdi/.nvidia-hidden.json"), &ours).unwrap();
    std::fs::write(m.join("etc/x"), &ours).unwrap();
    symlink("../../etc/x", m.join("run/cdi/nvidia-linked.json")).unwrap();
    let (devices, log) = ctk_devices(m);
    assert_eq!(
        devices,
        Vec::<String>::new(),
        "the Go library drops every device it sees three times: {log}"
    );

    assert_eq!(
        changes(&root, &want),
        [
            (Action::Remove, "/var/run/cdi/.nvidia-hidden.json".into()),
            (Action::Remove, "/var/run/cdi/nvidia-linked.json".into()),
        ],
        "status names both"
    );
    let r = nspawn_lifecycle::apply::rewire::write_cdi(&root, &want, |n, b| want.conflicts(n, b))
        .unwrap();
    assert_eq!(
        r.removed,
        [
            "/var/run/cdi/.nvidia-hidden.json",
            "/var/run/cdi/nvidia-linked.json"
        ]
    );
    // The link went, never what it pointed to.
    assert_eq!(std::fs::read(m.join("etc/x")).unwrap(), ours);
    let (devices, _) = ctk_devices(m);
    assert_eq!(
        devices,
        ["nvidia.com/gpu=0", GPU_UUID, "nvidia.com/gpu=all"]
    );
    assert_eq!(changes(&root, &want), []);
}

#[test]
fn a_link_out_of_the_machine_is_read_inside_it() {
    let (dir, root, want) = wired();
    let m = dir.path();
    // An absolute link resolves against the machine's root, as the machine's containerd reads
    // it: the host's file of that name is never read (there is none at this path on the host).
    let ours = std::fs::read(m.join("run/cdi").join(CDI_FILE)).unwrap();
    std::fs::create_dir_all(m.join("srv")).unwrap();
    std::fs::write(m.join("srv/copy.json"), &ours).unwrap();
    symlink("/srv/copy.json", m.join("etc/cdi/abs.json")).unwrap();
    // A dangling link and a link to a directory load nothing: they are left alone.
    symlink("/nowhere.json", m.join("etc/cdi/dangling.json")).unwrap();
    symlink("/srv", m.join("etc/cdi/dir.json")).unwrap();
    assert_eq!(
        changes(&root, &want),
        [(Action::Remove, "/etc/cdi/abs.json".into())]
    );
}

#[test]
fn what_cannot_be_judged_is_reported_and_kept_not_fatal() {
    let (dir, root, want) = wired();
    let m = dir.path();
    // One byte past the bound, sparse: costs nothing on disk, must not be read.
    let big = std::fs::File::create(m.join("etc/cdi/big.json")).unwrap();
    big.set_len(spec::MAX_SPEC_BYTES as u64 + 1).unwrap();
    // A FIFO would block a reader that opens it.
    nix::unistd::mkfifo(
        &m.join("run/cdi/.fifo.yaml"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let found = changes(&root, &want);
    assert_eq!(
        found,
        [
            (Action::Keep, "/etc/cdi/big.json".into()),
            (Action::Keep, "/var/run/cdi/.fifo.yaml".into()),
        ]
    );
    let seen = spec::observe(&root, &want).unwrap();
    assert!(
        seen.unjudged[0].1.contains("more than the 16777216 read"),
        "{:?}",
        seen.unjudged
    );
    assert!(seen.unjudged[1].1.contains("FIFO"), "{:?}", seen.unjudged);
    // post-start writes our spec and keeps both, saying so.
    let r = nspawn_lifecycle::apply::rewire::write_cdi(&root, &want, |n, b| want.conflicts(n, b))
        .unwrap();
    assert_eq!(r.removed, Vec::<String>::new());
    let kept: Vec<&str> = r.kept.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(kept, ["/etc/cdi/big.json", "/var/run/cdi/.fifo.yaml"]);
    assert!(m.join("etc/cdi/big.json").exists());
}

/// 200 sparse files of the largest size read: the work is bounded in bytes (64 MiB: four of
/// them), the rest reported as not judged. No clock: the count of files read is the bound.
#[test]
fn a_flood_of_large_specs_is_read_only_up_to_the_bound() {
    let (dir, root, want) = wired();
    let m = dir.path();
    for i in 0..200 {
        let f = std::fs::File::create(m.join(format!("etc/cdi/flood-{i:03}.json"))).unwrap();
        f.set_len(spec::MAX_SPEC_BYTES as u64).unwrap();
    }
    let seen = spec::observe(&root, &want).unwrap();
    // The machine's own small specs take a little of the bound too.
    let read = 200 - seen.unjudged.len();
    assert!(
        (1..=spec::MAX_SPEC_DIRS_BYTES / spec::MAX_SPEC_BYTES).contains(&read),
        "{read} files read in full"
    );
    assert!(
        seen.unjudged[0].1.contains("what was left of the"),
        "{:?}",
        seen.unjudged[0]
    );
    assert_eq!(seen.conflicts, Vec::<String>::new());
}

/// Past the entries judged in one directory, the rest is one report, not a read.
#[test]
fn a_directory_of_too_many_entries_is_reported() {
    let (dir, root, want) = wired();
    let m = dir.path();
    for i in 0..spec::MAX_SPEC_DIR_ENTRIES + 5 {
        std::fs::write(m.join(format!("etc/cdi/n{i:05}.txt")), b"").unwrap();
    }
    let found = changes(&root, &want);
    assert_eq!(found, [(Action::Keep, "/etc/cdi".into())]);
}

/// `/proc/kmsg` bound over a spec file (and over ours): a regular file to `stat`, but reading it
/// takes the kernel's messages from the journal and blocks when there are none. Never opened:
/// reported, and ours judged as not there. Privileged (a bind mount): fails, never skips, as
/// another user.
#[test]
fn privileged_a_kernel_file_bound_over_a_spec_is_never_read() {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    assert!(nix::unistd::geteuid().is_root(), "privileged: bind mounts");
    let (dir, root, want) = wired();
    let m = dir.path();
    let foreign = m.join("etc/cdi/kmsg.json");
    let ours = m.join("run/cdi").join(CDI_FILE);
    std::fs::write(&foreign, b"").unwrap();
    let bind = |at: &Path| {
        mount(
            Some("/proc/kmsg"),
            at,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
    };
    bind(&foreign);
    bind(&ours);
    let seen = spec::observe(&root, &want);
    let judged = seen
        .as_ref()
        .map(|s| spec::diff(&want, s).map_err(|e| format!("{e:#}")))
        .map_err(|e| format!("{e:#}"));
    for at in [&foreign, &ours] {
        umount2(at.as_path(), MntFlags::MNT_DETACH).unwrap();
    }
    let seen = seen.unwrap();
    assert_eq!(
        seen.unjudged,
        [(
            "/etc/cdi/kmsg.json".to_owned(),
            "it is a file of a kernel pseudo-filesystem".to_owned()
        )]
    );
    let actions: Vec<(Action, String)> = judged
        .unwrap()
        .unwrap()
        .into_iter()
        .map(|c| (c.action, c.path))
        .collect();
    assert_eq!(
        actions,
        [
            (Action::Write, "/var/run/cdi/nvidia.com-gpu.json".into()),
            (Action::Keep, "/etc/cdi/kmsg.json".into()),
        ]
    );
}
