//! The aarch64 binary (GB200/GB300 hosts: Grace CPUs) gives the x86_64 binary's answers, byte
//! for byte, on every example host and on hostile ones: `discover --json`, `plan`, `cdi-spec`,
//! and the trees `install` and `pre-start` write (the `.nspawn` file, the driver tree, the
//! drop-in and every other file, link and mode). Nothing in the product may follow the build's
//! own architecture: the host's tree decides, as `gb300` (an aarch64 host) and `eight-gpus` (an
//! x86_64 one) show from either binary.
//!
//! Needs the two release binaries and a user-mode emulator for the aarch64 one, so it is run by
//! `tests/aarch64/run.sh` (which builds them: the suite runs it, `tests/run-all.sh`), never by a
//! plain `cargo test`, where it shows as ignored:
//!
//! ```text
//! CROSS_X86=<x86_64 binary> CROSS_AARCH64=<aarch64 binary> CROSS_QEMU=<qemu-aarch64> \
//!     cargo test --test cross_arch -- --ignored
//! ```

// Helpers here are test code too (clippy's allow-unwrap-in-tests covers only #[test] fns).
#![allow(clippy::unwrap_used)]

mod common;

use common::snapshot;
use nspawn_lifecycle::fixture;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where `install` puts the helper: a copy of the binary that ran it.
const INSTALLED: &str = nspawn_lifecycle::config::DEFAULT_HELPER_PATH;

/// The driver tree's stamp of machine kube1.
const STAMP: &str = "var/lib/nspawn-lifecycle/driver-root/.kube1.stamp";

/// The two binaries and how to run each.
struct Binaries {
    x86: PathBuf,
    aarch64: PathBuf,
    qemu: PathBuf,
}

fn binaries() -> Binaries {
    let var = |k: &str| {
        PathBuf::from(std::env::var_os(k).unwrap_or_else(|| {
            panic!("{k} is not set: tests/aarch64/run.sh runs this test with both binaries")
        }))
    };
    Binaries {
        x86: var("CROSS_X86"),
        aarch64: var("CROSS_AARCH64"),
        qemu: var("CROSS_QEMU"),
    }
}

impl Binaries {
    fn run(&self, aarch64: bool, root: &Path, args: &[&str]) -> Output {
        let mut c = if aarch64 {
            let mut c = Command::new(&self.qemu);
            c.arg(&self.aarch64);
            c
        } else {
            Command::new(&self.x86)
        };
        c.arg("--host-root").arg(root).args(args);
        // The same environment for both: no colour, the default log filter, nothing inherited
        // that either could read.
        c.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        c.output().unwrap()
    }
}

/// What one command printed and how it ended, with the host root written as `<root>`, and what
/// differs between any two runs or binaries blanked: the size of the helper `install` copied
/// (each binary's own) and each step's duration (`us=`).
fn shown(out: &Output, root: &Path) -> String {
    let r = root.to_str().unwrap();
    let text = |b: &[u8]| {
        let mut t = String::from_utf8_lossy(b).replace(r, "<root>");
        for (mark, blank) in [("copy of the running helper, ", "<size>"), (" us=", "<us>")] {
            let mut out = String::new();
            let mut rest = t.as_str();
            while let Some((head, tail)) = rest.split_once(mark) {
                out.push_str(head);
                out.push_str(mark);
                out.push_str(blank);
                rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
            }
            out.push_str(rest);
            t = out;
        }
        t
    };
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// The hosts: every example, and hostile variants of the GB300-like one (junk a machine left in
/// the directories bound into every machine, a second machine beside it naming disks).
fn hosts() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = fixture::EXAMPLES
        .iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    let gb300 = fixture::example("gb300").unwrap();
    let mut junk = gb300.to_owned();
    junk.push_str(
        "file /dev/nvidia-caps/stray x\n\
         file /dev/infiniband/uverbs77\n\
         file /dev/nvidia-caps-imex-channels/channel\\nBind=x\n\
         link /dev/disk/by-id/nvme-data ../../nvme1n1\n\
         file /etc/nspawn-lifecycle/config.json {\"machines\": {\"kube1\": {\"devices\": {\"disks\": [\"/dev/disk/by-id/nvme-data\"]}}, \"kube2\": {\"gpus\": \"none\"}}}\n",
    );
    out.push(("gb300-hostile".to_owned(), junk));
    out
}

#[test]
#[ignore = "needs the aarch64 build and qemu: tests/aarch64/run.sh runs it"]
fn privileged_the_aarch64_binary_answers_as_the_x86_64_one_on_every_host() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "example hosts have device nodes (mknod): run as root"
    );
    let b = binaries();
    let mut compared = 0;
    for (name, text) in hosts() {
        let dirs: Vec<tempfile::TempDir> = (0..2)
            .map(|_| tempfile::Builder::new().prefix("cross.").tempdir().unwrap())
            .collect();
        for d in &dirs {
            fixture::materialize(&text, d.path()).unwrap();
            std::fs::create_dir_all(d.path().join("var/lib/machines/kube1")).unwrap();
        }
        for args in [
            &["discover", "--json"][..],
            &["discover"][..],
            &["plan", "kube1"][..],
            &["plan", "kube1", "--json"][..],
            &["cdi-spec", "kube1"][..],
            &["cdi-spec", "kube1", "--list"][..],
            &["install", "kube1"][..],
            &["nspawn-lifecycle", "pre-start", "kube1"][..],
            &["plan", "kube1"][..],
        ] {
            let [x, a] = [false, true].map(|aarch64| {
                let root = dirs[usize::from(aarch64)].path();
                shown(&b.run(aarch64, root, args), root)
            });
            assert_eq!(
                x, a,
                "{name}: {args:?}: the aarch64 binary answers otherwise"
            );
            compared += 1;
        }
        // One tree judged by both binaries: each tree holds the other's installed helper for
        // the other binary, as an aarch64 host's tree read by an x86_64 helper does.
        for d in &dirs {
            for args in [
                &["plan", "kube1", "--json"][..],
                &["discover", "--json"][..],
            ] {
                let [x, a] =
                    [false, true].map(|aarch64| shown(&b.run(aarch64, d.path(), args), d.path()));
                assert_eq!(
                    x, a,
                    "{name}: {args:?} on one tree: the binaries judge it otherwise"
                );
                compared += 1;
            }
        }
        // The one difference that must exist: `install` copies the running binary to the
        // helper's stable path, so each tree holds its own binary there.
        for (i, bin) in [&b.x86, &b.aarch64].into_iter().enumerate() {
            let installed = dirs[i].path().join(INSTALLED.trim_start_matches('/'));
            assert!(
                std::fs::read(&installed).unwrap() == std::fs::read(bin).unwrap(),
                "{name}: {} is not {}",
                installed.display(),
                bin.display()
            );
        }
        // The driver tree's stamp records the tree's own inode numbers and change times: the
        // same lines, numbers aside.
        let [xs, as_] = [0, 1].map(|i| {
            std::fs::read_to_string(dirs[i].path().join(STAMP))
                .map(|t| {
                    t.split(|c: char| c.is_ascii_digit())
                        .filter(|p| !p.is_empty())
                        .collect::<Vec<_>>()
                        .join("#")
                })
                .ok()
        });
        assert_eq!(xs, as_, "{name}: the driver tree stamps differ");
        // What install and pre-start wrote: every file, link and mode (times and inode
        // numbers are each tree's own).
        let [x, a] = [0, 1].map(|i| {
            let root = dirs[i].path();
            let r = root.to_str().unwrap().to_owned();
            snapshot(
                root,
                &[
                    "run/nspawn-lifecycle/locks",
                    INSTALLED.trim_start_matches('/'),
                    STAMP,
                ],
            )
            .into_iter()
            .map(|(p, meta)| {
                let kept: Vec<&str> = meta
                    .split(' ')
                    .filter(|f| {
                        !["mtime=", "ctime=", "ino="]
                            .iter()
                            .any(|s| f.starts_with(s))
                    })
                    .collect();
                (p, kept.join(" ").replace(&r, "<root>"))
            })
            .collect::<Vec<_>>()
        });
        let only = |l: &[(std::path::PathBuf, String)], r: &[(std::path::PathBuf, String)]| {
            l.iter()
                .filter(|e| !r.contains(e))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert!(
            x == a,
            "{name}: the trees written differ: x86_64 only {:#?}, aarch64 only {:#?}",
            only(&x, &a),
            only(&a, &x)
        );
        println!("{name}: same answers and trees ({} entries)", x.len());
    }
    println!("{compared} commands compared");
}
