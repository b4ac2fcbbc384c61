//! The wiring model holds over every example host and a list of mutations:
//!
//! - `status` is out of sync exactly when post-start run now would change something (the model's
//!   pending changes are not empty), and what it would change is post-start's to make exactly
//!   when post-start alone mends it;
//! - the post-start of each mend writes exactly what `status` listed just before it (the machine
//!   tree snapshotted around it), and once in sync a post-start run again writes nothing;
//! - after the mend an operator makes (post-start; a restart; `install` and a restart),
//!   `status` is in sync and nothing is pending;
//! - every mutation applies to some example host, and the same run with `status` read without
//!   the model (its pending changes dropped: the negative control) fails, as does one without
//!   any one part of the list (that part's changes dropped): every part carries a check;
//! - what `plan` shows as the `.nspawn` file is byte for byte what pre-start then writes, and
//!   where pre-start refuses, `plan` refuses alike (same exit code and message).
//!
//! One process, single-threaded (`harness = false`): it unshares its mount namespace and boots
//! each machine as systemd-nspawn does from the `.nspawn` file pre-start wrote (the driver tree
//! and every bind of it read-only, the helper, the unit gate and its markers; device nodes made
//! with the host's numbers, device directories bound), then runs post-start's own run ([`post_start::run_on_disk`]: the
//! command's own path with its services replaced, `ldconfig -r` for the machine's) and
//! judges with `status`'s own function. Privileged: fails, not skips, without root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "lib/nspawn_binds.rs"]
mod nspawn_binds;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nspawn_lifecycle::Ctx;
use nspawn_lifecycle::apply::boot::Boot;
use nspawn_lifecycle::apply::executor::{boot_plan, pending_boot};
use nspawn_lifecycle::apply::parts;
use nspawn_lifecycle::commands::post_start;
use nspawn_lifecycle::commands::pre_start;
use nspawn_lifecycle::commands::status::{self, State, Status};
use nspawn_lifecycle::config::Config;
use nspawn_lifecycle::discovery::{self, Verdict};
use nspawn_lifecycle::fs::host::HostRoot;
use nspawn_lifecycle::fs::machine_root::MachineRoot;
use nspawn_lifecycle::model::{Action, Change, Check, Target};
use nspawn_lifecycle::model::{gate, render};
use nspawn_lifecycle::systemd::services::OnDisk;
use nspawn_lifecycle::types::machine_name::MachineName;
use nspawn_lifecycle::{error, fixture};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

const MACHINE: &str = "kube1";

/// What an operator does about a mutation, by what `status` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mend {
    /// post-start alone (`systemctl restart` of nothing: the next post-start).
    PostStart,
    /// A new start of the machine (`reconcile`): pre-start, the boot's binds, post-start.
    Restart,
    /// `install` (the helper, the drop-in for the config), then a new start.
    InstallAndRestart,
    /// A person removes what is in the way (the mutation's `fix`: post-start fails until
    /// then), then post-start.
    Person,
}

/// Which pending changes the test sees of `status`: the negative controls drop them, all or
/// one part's, and the checks must then fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blind {
    No,
    All,
    Part(Check),
}

/// One machine on one host: the host tree (installed), the machine tree, and the mounts its
/// last boot made (innermost last).
struct Node {
    example: &'static str,
    /// The negative controls: `status` read without the model, or without one of its parts.
    blind: Blind,
    host: tempfile::TempDir,
    /// Hosts replaced by a mutation, kept until the machine no longer binds from them.
    old_hosts: Vec<tempfile::TempDir>,
    machine: tempfile::TempDir,
    mounts: Vec<PathBuf>,
}

fn name() -> MachineName {
    MACHINE.parse().unwrap()
}

/// A host tree from host description `text`, with the machine installed by `install` (the
/// helper copied to its stable path, the drop-in and the `.nspawn` file written).
fn installed(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fixture::materialize(text, dir.path()).unwrap();
    std::fs::create_dir_all(dir.path().join("var/lib/machines").join(MACHINE)).unwrap();
    let out = common::install(dir.path(), &[MACHINE]);
    assert!(
        out.status.success(),
        "install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// A Debian-like machine tree: merged /usr, `/var/run -> ../run`, the loader's config.
fn machine_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    for d in [
        "usr/lib/x86_64-linux-gnu",
        "usr/bin",
        "etc/cdi",
        "run",
        "var/lib",
        "dev/char",
    ] {
        std::fs::create_dir_all(p.join(d)).unwrap();
    }
    symlink("usr/lib", p.join("lib")).unwrap();
    symlink("usr/bin", p.join("bin")).unwrap();
    symlink("../run", p.join("var/run")).unwrap();
    std::fs::write(p.join("etc/ld.so.conf"), "/usr/lib/x86_64-linux-gnu\n").unwrap();
    dir
}

impl Node {
    fn new(example: &'static str) -> Node {
        Node {
            example,
            blind: Blind::No,
            host: installed(fixture::example(example).unwrap()),
            old_hosts: Vec::new(),
            machine: machine_tree(),
            mounts: Vec::new(),
        }
    }

    fn h(&self) -> &Path {
        self.host.path()
    }

    fn m(&self) -> &Path {
        self.machine.path()
    }

    fn ctx(&self) -> Ctx {
        let host = HostRoot::open(self.h()).unwrap();
        let config = Config::load(&host, None).unwrap();
        Ctx { host, config }
    }

    /// pre-start, checked against `plan`, then the boot's binds. `Err`: pre-start refused
    /// (exit code, message), as `plan` did.
    fn start(&mut self, t: &mut Tally) -> Result<(), (u8, String)> {
        // A new start follows the machine's stop: its binds are gone before pre-start runs.
        self.shut_down();
        let ctx = self.ctx();
        let inv = discovery::discover(&ctx.host).unwrap();
        let planned = render::as_pre_start(&ctx, &name(), &inv).map(|(_, r)| r.text());
        let started = pre_start::pre_start(&ctx, &name());
        let what = format!("{}: plan and pre-start", self.example);
        match (planned, started) {
            (Ok(text), Ok(())) => {
                let written = std::fs::read_to_string(
                    self.h()
                        .join(format!("etc/systemd/nspawn/{MACHINE}.nspawn")),
                )
                .unwrap();
                t.check(text == written, &what, || {
                    format!("plan showed\n{text}\npre-start wrote\n{written}")
                });
                // Each of pre-start's parts is now as its diff wants it.
                let machine = name();
                let (mc, r) = render::as_pre_start(&ctx, &machine, &inv).unwrap();
                let boot = Boot::new(&ctx, &machine, &mc, r, true);
                let left = pending_boot(&boot_plan(&boot), &boot);
                t.check(left.is_empty(), &format!("{what}: nothing left"), || {
                    format!("pre-start's parts still list {left:#?}")
                });
            }
            (Err(p), Err(s)) => {
                let (pc, sc) = (error::exit_code(&p), error::exit_code(&s));
                t.check(
                    pc == sc && format!("{p:#}").ends_with(&format!("{:#}", s.root_cause())),
                    &what,
                    || format!("plan refused with {pc}: {p:#}\npre-start with {sc}: {s:#}"),
                );
                return Err((sc, format!("{s:#}")));
            }
            (p, s) => t.fail(
                &what,
                format!(
                    "plan: {}\npre-start: {}",
                    p.map_or_else(|e| format!("{e:#}"), |_| "ok".into()),
                    s.map_or_else(|e| format!("{e:#}"), |()| "ok".into())
                ),
            ),
        }
        self.boot();
        Ok(())
    }

    /// What systemd-nspawn does with the `.nspawn` file at boot, for what post-start and status
    /// read: every read-only bind into `/run` (the driver tree and the binds inside it, the
    /// helper, the unit gate, its markers) made read-only; each device bound is an empty file.
    fn boot(&mut self) {
        self.shut_down();
        let text = std::fs::read_to_string(
            self.h()
                .join(format!("etc/systemd/nspawn/{MACHINE}.nspawn")),
        )
        .unwrap();
        // The machine's /dev is a tmpfs of its own, as nspawn mounts it (post-start refuses to
        // write /dev/char links on the host's /dev filesystem), made at the first boot, and new
        // at every boot (post-start's /dev/char kept: it remakes it).
        let dev = self.m().join("dev");
        {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::create_dir_all(&dev).unwrap();
            let fs = |p: &Path| std::fs::metadata(p).unwrap().dev();
            if fs(&dev) == fs(self.m()) {
                nix::mount::mount(
                    Some("tmpfs"),
                    &dev,
                    Some("tmpfs"),
                    MsFlags::empty(),
                    Some("mode=0755"),
                )
                .unwrap();
                // nspawn makes /dev/char (its links of the basic nodes) in it.
                std::fs::create_dir(dev.join("char")).unwrap();
            }
        }
        for e in std::fs::read_dir(&dev).unwrap() {
            let p = e.unwrap().path();
            if p.file_name().is_some_and(|n| n == "char") {
                continue;
            }
            if p.is_dir() {
                std::fs::remove_dir_all(&p).unwrap();
            } else {
                std::fs::remove_file(&p).unwrap();
            }
        }
        let (h, m) = (self.h().to_owned(), self.m().to_owned());
        let dirs = nspawn_binds::device_binds(&text, &h, &m).unwrap_or_else(|e| panic!("{e:#}"));
        self.mounts = dirs;
        self.mounts.extend(
            nspawn_binds::bind_read_only(&text, &h, &m, |t| t.starts_with("/run/"))
                .unwrap_or_else(|e| panic!("{e:#}")),
        );
    }

    /// The machine stops: its binds go.
    fn shut_down(&mut self) {
        while let Some(at) = self.mounts.pop() {
            umount2(&at, MntFlags::MNT_DETACH).unwrap();
        }
    }

    /// post-start's own run against the machine tree.
    fn post_start(&self) -> anyhow::Result<()> {
        let root = MachineRoot::open(self.m())?;
        post_start::run_on_disk(&self.ctx(), &name(), &root, &OnDisk { dir: self.m() })
    }

    /// `status` of the machine (its own function, reading the machine tree) and what it says
    /// post-start would change.
    fn judge(&self) -> (Status, Vec<Change>) {
        let ctx = self.ctx();
        let inv = discovery::discover(&ctx.host).unwrap();
        let s = status::machine_status(&ctx, &inv, &name(), Some(self.m())).unwrap();
        let pending = s
            .machine_facts
            .as_ref()
            .filter(|_| self.blind != Blind::All)
            .map(|m| m.pending_changes.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| self.blind != Blind::Part(c.check))
            .collect();
        (s, pending)
    }

    /// Replace the host by one from `text` (the machine still binds the old one's tree until
    /// its next start).
    fn swap_host(&mut self, text: &str) {
        let new = installed(text);
        self.old_hosts.push(std::mem::replace(&mut self.host, new));
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Checks made and failed.
#[derive(Default)]
struct Tally {
    checks: usize,
    failures: Vec<String>,
}

impl Tally {
    fn check(&mut self, ok: bool, what: &str, why: impl FnOnce() -> String) {
        self.checks += 1;
        if !ok {
            self.failures.push(format!("{what}: {}", why()));
        }
    }

    fn fail(&mut self, what: &str, why: String) {
        self.checks += 1;
        self.failures.push(format!("{what}: {why}"));
    }
}

fn listed(changes: &[Change]) -> String {
    changes
        .iter()
        .map(|c| format!("  [{}] {c}", c.check))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `status` and the model agree: out of sync exactly when something is pending.
fn agree(t: &mut Tally, what: &str, s: &Status, pending: &[Change]) {
    t.check(
        (s.state == State::InSync) == pending.is_empty(),
        what,
        || {
            format!(
                "status says {} but pending is\n{}",
                s.summary,
                listed(pending)
            )
        },
    );
}

/// A mutation of a wired node, and the mend that brings it back.
struct Mutation {
    name: &'static str,
    mend: Mend,
    /// Apply it; `false` when it does not apply to this host.
    apply: fn(&mut Node) -> bool,
    /// What a person does first ([`Mend::Person`]).
    fix: Option<fn(&mut Node)>,
}

/// The first symlink in the machine directory `dir` whose target contains `needle`.
fn first_link(m: &Path, dir: &str, needle: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(m.join(dir))
        .ok()?
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::read_link(p).is_ok_and(|t| t.to_string_lossy().contains(needle)))
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Remove the first link in the machine directory `dir` whose target contains `needle`; `false`
/// when there is none (the mutation does not apply to this host).
fn remove_first_link(n: &mut Node, dir: &str, needle: &str) -> bool {
    first_link(n.m(), dir, needle)
        .map(|p| std::fs::remove_file(p).unwrap())
        .is_some()
}

/// The host's path of the first driver library discovery names.
fn a_driver_library(n: &Node) -> Option<PathBuf> {
    let inv = discovery::discover(&HostRoot::new(n.h())).unwrap();
    let d = inv.complete_driver()?;
    let dir = d.lib_dirs.first()?;
    let f = dir.files.first()?;
    Some(n.h().join(&dir.path.as_str()[1..]).join(&f.name))
}

fn gpu_mutations() -> Vec<Mutation> {
    vec![
        Mutation {
            name: "a library link removed",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| remove_first_link(n, "usr/lib/x86_64-linux-gnu", "/run/nvidia/driver"),
        },
        Mutation {
            name: "a library link pointing elsewhere",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                first_link(n.m(), "usr/lib/x86_64-linux-gnu", "/run/nvidia/driver")
                    .map(|p| {
                        std::fs::remove_file(&p).unwrap();
                        symlink("/run/nvidia/driver/usr/lib/libcuda.so.1.0", p).unwrap();
                    })
                    .is_some()
            },
        },
        Mutation {
            name: "a tool link removed",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| remove_first_link(n, "usr/bin", "/run/nvidia/driver"),
        },
        Mutation {
            name: "a /dev/char link removed",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| remove_first_link(n, "dev/char", "/dev/nvidia"),
        },
        Mutation {
            name: "the CDI spec edited",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                let p = n.m().join("run/cdi/nvidia.com-gpu.json");
                let mut text = std::fs::read_to_string(&p).unwrap();
                text.push('\n');
                std::fs::write(p, text).unwrap();
                true
            },
        },
        Mutation {
            name: "another spec of our kind in /etc/cdi",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                std::fs::write(
                    n.m().join("etc/cdi/nvidia-old.json"),
                    r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[]}"#,
                )
                .unwrap();
                true
            },
        },
        Mutation {
            name: "the loader cache gone",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                let p = n.m().join("etc/ld.so.cache");
                // Only where the cache has libraries of ours to list.
                first_link(n.m(), "usr/lib/x86_64-linux-gnu", "/run/nvidia/driver").is_some()
                    && std::fs::remove_file(p).is_ok()
            },
        },
        Mutation {
            name: "the loader cache unreadable (larger than is read)",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                let p = n.m().join("etc/ld.so.cache");
                first_link(n.m(), "usr/lib/x86_64-linux-gnu", "/run/nvidia/driver").is_some() && {
                    let f = std::fs::File::create(p).unwrap();
                    f.set_len(65 << 20).unwrap();
                    true
                }
            },
        },
        Mutation {
            name: "the CDI spec truncated",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                let p = n.m().join("run/cdi/nvidia.com-gpu.json");
                let bytes = std::fs::read(&p).unwrap();
                std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
                true
            },
        },
        Mutation {
            name: "the CDI spec not a spec",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                std::fs::write(n.m().join("run/cdi/nvidia.com-gpu.json"), "{not json\n").unwrap();
                true
            },
        },
        Mutation {
            name: "the /dev/char link directory a file",
            mend: Mend::Person,
            fix: Some(|n| std::fs::remove_file(n.m().join("dev/char")).unwrap()),
            apply: |n| {
                let p = n.m().join("dev/char");
                std::fs::remove_dir_all(&p).unwrap();
                std::fs::write(p, "not a directory\n").unwrap();
                true
            },
        },
        Mutation {
            name: "kubelet's gate marker removed",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                let p = n.h().join(format!(
                    "run/nspawn-lifecycle/machines/{MACHINE}/released/kubelet.service"
                ));
                std::fs::remove_file(p).is_ok()
            },
        },
        Mutation {
            name: "GPUs renumbered",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                let dir = n.h().join("proc/driver/nvidia/gpus");
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    return false;
                };
                let mut files: Vec<PathBuf> = entries
                    .map(|e| e.unwrap().path().join("information"))
                    .filter(|p| p.is_file())
                    .collect();
                files.sort();
                if files.len() < 2 {
                    return false;
                }
                let uuid = |t: &str| {
                    t.lines()
                        .find(|l| l.starts_with("GPU UUID:"))
                        .unwrap()
                        .to_owned()
                };
                let (a, b) = (files[0].clone(), files[files.len() - 1].clone());
                let (ta, tb) = (
                    std::fs::read_to_string(&a).unwrap(),
                    std::fs::read_to_string(&b).unwrap(),
                );
                let (ua, ub) = (uuid(&ta), uuid(&tb));
                std::fs::write(&a, ta.replace(&ua, &ub)).unwrap();
                std::fs::write(&b, tb.replace(&ub, &ua)).unwrap();
                true
            },
        },
        Mutation {
            name: "a host driver file replaced (another inode)",
            mend: Mend::Restart,
            fix: None,
            apply: |n| {
                let Some(p) = a_driver_library(n) else {
                    return false;
                };
                let tmp = p.with_extension("new");
                std::fs::copy(&p, &tmp).unwrap();
                std::fs::rename(&tmp, &p).unwrap();
                true
            },
        },
        Mutation {
            name: "the installed helper corrupted",
            mend: Mend::InstallAndRestart,
            fix: None,
            apply: corrupt_helper,
        },
        Mutation {
            name: "the machine's unit drop-in edited",
            mend: Mend::InstallAndRestart,
            fix: None,
            apply: edit_dropin,
        },
        Mutation {
            name: "the driver upgraded",
            mend: Mend::Restart,
            fix: None,
            apply: |n| {
                let text = fixture::example(n.example).unwrap();
                let inv = discovery::discover(&HostRoot::new(n.h())).unwrap();
                let Some(v) = inv.complete_driver().map(|d| d.version.clone()) else {
                    return false;
                };
                n.swap_host(&text.replace(&v, "590.10.01"));
                true
            },
        },
        Mutation {
            name: "the machine's gpus changed in the config",
            mend: Mend::InstallAndRestart,
            fix: None,
            apply: |n| {
                let inv = discovery::discover(&HostRoot::new(n.h())).unwrap();
                if inv.gpus.len() < 2 {
                    return false;
                }
                let dir = n.h().join("etc/nspawn-lifecycle");
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(
                    dir.join("config.json"),
                    format!(r#"{{"machines": {{"{MACHINE}": {{"gpus": [0]}}}}}}"#),
                )
                .unwrap();
                true
            },
        },
    ]
}

/// A line added to the machine's unit drop-in by hand.
fn edit_dropin(n: &mut Node) -> bool {
    let p = n.h().join(format!(
        "etc/systemd/system/systemd-nspawn@{MACHINE}.service.d/50-nspawn-lifecycle.conf"
    ));
    let mut text = std::fs::read_to_string(&p).unwrap();
    text.push_str("# edited by hand\n");
    std::fs::write(p, text).unwrap();
    true
}

/// Garbage written over the installed helper, in place.
fn corrupt_helper(n: &mut Node) -> bool {
    let p = n
        .h()
        .join(&nspawn_lifecycle::config::DEFAULT_HELPER_PATH[1..]);
    std::fs::write(p, b"garbage written over the helper").unwrap();
    true
}

/// Mutations of the host devices, on every host (with or without GPUs).
fn device_mutations() -> Vec<Mutation> {
    vec![
        Mutation {
            name: "a disk added on the host",
            mend: Mend::Restart,
            fix: None,
            apply: |n| {
                let h = n.h();
                add_partitions_line(h, "254 400 1048576 vdz");
                nix::sys::stat::mknod(
                    &h.join("dev/vdz"),
                    nix::sys::stat::SFlag::S_IFBLK,
                    nix::sys::stat::Mode::from_bits_truncate(0o660),
                    nix::sys::stat::makedev(254, 400),
                )
                .unwrap();
                true
            },
        },
        Mutation {
            name: "a bound disk renumbered on the host",
            mend: Mend::Restart,
            fix: None,
            apply: renumber_bound_disk,
        },
        Mutation {
            name: "a bound device node gone from the running machine",
            mend: Mend::Restart,
            fix: None,
            apply: |n| {
                let p = n.m().join("dev/kvm");
                p.exists() && std::fs::remove_file(p).is_ok()
            },
        },
    ]
}

/// A line of the host's `/proc/partitions` (made, with the kernel's header, when missing).
fn add_partitions_line(h: &Path, line: &str) {
    let p = h.join("proc/partitions");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let mut text =
        std::fs::read_to_string(&p).unwrap_or_else(|_| "major minor  #blocks  name\n\n".to_owned());
    text.push_str(line);
    text.push('\n');
    std::fs::write(p, text).unwrap();
}

/// A disk the running machine binds is replaced on the host by a node with other numbers (a
/// drive swapped, a device re-plugged): `/proc/partitions` and `/dev` say the new numbers, the
/// machine's bind still shows the old node.
fn renumber_bound_disk(n: &mut Node) -> bool {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let (h, m) = (n.h().to_owned(), n.m().to_owned());
    let Ok(table) = std::fs::read_to_string(h.join("proc/partitions")) else {
        return false;
    };
    for line in table.lines() {
        let Some(name) = line.split_whitespace().nth(3) else {
            continue;
        };
        if name == "name" {
            continue;
        }
        let (host_node, machine_node) = (h.join("dev").join(name), m.join("dev").join(name));
        let bound = std::fs::symlink_metadata(&machine_node)
            .is_ok_and(|md| md.file_type().is_block_device());
        let Ok(md) = std::fs::symlink_metadata(&host_node) else {
            continue;
        };
        if !bound || !md.file_type().is_block_device() {
            continue;
        }
        let (major, minor) = (
            nix::sys::stat::major(md.rdev()),
            nix::sys::stat::minor(md.rdev()) + 1000,
        );
        let renumbered: String = table
            .lines()
            .map(|l| {
                if l.split_whitespace().nth(3) == Some(name) {
                    format!("{major:4} {minor:7} 1048576 {name}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(h.join("proc/partitions"), renumbered).unwrap();
        std::fs::remove_file(&host_node).unwrap();
        nix::sys::stat::mknod(
            &host_node,
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o660),
            nix::sys::stat::makedev(major, minor),
        )
        .unwrap();
        return true;
    }
    false
}

fn no_gpu_mutations() -> Vec<Mutation> {
    vec![
        Mutation {
            name: "a stale library link of ours",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                symlink(
                    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                    n.m().join("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                )
                .unwrap();
                true
            },
        },
        Mutation {
            name: "a stale spec of ours",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                std::fs::create_dir_all(n.m().join("run/cdi")).unwrap();
                std::fs::write(
                    n.m().join("run/cdi/nvidia.com-gpu.json"),
                    r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[]}"#,
                )
                .unwrap();
                true
            },
        },
        Mutation {
            name: "a stale /dev/char link of ours",
            mend: Mend::PostStart,
            fix: None,
            apply: |n| {
                symlink("/dev/nvidia0", n.m().join("dev/char/195:0")).unwrap();
                true
            },
        },
        Mutation {
            name: "the installed helper corrupted",
            mend: Mend::InstallAndRestart,
            fix: None,
            apply: corrupt_helper,
        },
        Mutation {
            name: "the machine's unit drop-in edited",
            mend: Mend::InstallAndRestart,
            fix: None,
            apply: edit_dropin,
        },
    ]
}

type Tree = std::collections::BTreeMap<PathBuf, String>;

/// What post-start changed in the machine tree: every entry but a directory that appeared,
/// went or differs (a directory differs when its entries do, which its entries say).
fn changed(before: &Tree, after: &Tree) -> std::collections::BTreeSet<PathBuf> {
    let is_dir = |d: Option<&String>| d.is_some_and(|d| d.starts_with("mode=40"));
    before
        .keys()
        .chain(after.keys())
        .filter(|p| {
            let (b, a) = (before.get(*p), after.get(*p));
            b != a && !(is_dir(b) && is_dir(a))
        })
        .cloned()
        .collect()
}

/// A change's path as the machine tree names it: its parent resolved in the tree (the machine
/// names `/var/run/cdi/…`, the tree holds `run/cdi/…`).
fn tree_path(m: &Path, machine_path: &str) -> PathBuf {
    let rel = Path::new(machine_path.trim_start_matches('/'));
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return rel.to_owned();
    };
    match std::fs::canonicalize(m.join(parent)) {
        Ok(p) => p
            .strip_prefix(std::fs::canonicalize(m).unwrap())
            .map_or_else(|_| rel.to_owned(), |p| p.join(name)),
        Err(_) => rel.to_owned(),
    }
}

/// post-start run on a machine that `status` judged: what it wrote is exactly what was
/// pending. Every entry it changed is a pending change's path (or under one, or the loader
/// cache `ldconfig` rewrites), and every file a pending change creates, replaces, writes or
/// removes did change. `pending` empty: post-start changes nothing at all.
fn post_start_writes_what_was_listed(t: &mut Tally, n: &Node, pending: &[Change], what: &str) {
    let before = common::snapshot(n.m(), &[]);
    if let Err(e) = n.post_start() {
        t.fail(what, format!("post-start failed: {e:#}"));
        return;
    }
    let after = common::snapshot(n.m(), &[]);
    let did = changed(&before, &after);
    // A gate release names its unit; what it writes is the unit's marker.
    let named: Vec<(PathBuf, Action)> = pending
        .iter()
        .filter(|c| c.by_post_start() && !c.path.is_empty())
        .map(|c| match c.action {
            Action::Release => (
                tree_path(n.m(), &format!("{}/{}", gate::MARKER_DIR, c.path)),
                c.action,
            ),
            _ => (tree_path(n.m(), &c.path), c.action),
        })
        .collect();
    let runs_ldconfig = pending.iter().any(|c| c.action == Action::Run);
    // Explained: a listed path, something under one, a directory made on the way to one, or
    // the loader cache when ldconfig is listed.
    let unlisted: Vec<&PathBuf> =
        did.iter()
            .filter(|p| {
                !(named.iter().any(|(q, _)| {
                    p.starts_with(q) || (q.starts_with(p) && !before.contains_key(*p))
                }) || (runs_ldconfig && p.as_path() == Path::new("etc/ld.so.cache")))
            })
            .collect();
    t.check(unlisted.is_empty(), what, || {
        format!(
            "post-start changed what status did not list: {unlisted:?}
pending:
{}",
            listed(pending)
        )
    });
    let untouched: Vec<&PathBuf> = named
        .iter()
        .filter(|(q, a)| {
            matches!(
                a,
                Action::Create | Action::Replace | Action::Write | Action::Remove
            ) && !did.iter().any(|p| p.starts_with(q))
        })
        .map(|(q, _)| q)
        .collect();
    t.check(untouched.is_empty(), what, || {
        format!(
            "status listed what post-start did not change: {untouched:?}
pending:
{}",
            listed(pending)
        )
    });
}

/// The mend, then `status` in sync with nothing pending.
fn mend(t: &mut Tally, n: &mut Node, how: Mend, fix: Option<fn(&mut Node)>, what: &str) {
    if how == Mend::Person {
        // Until a person acts post-start fails, changing nothing it would not change anyway.
        let failed = n.post_start().is_err();
        t.check(failed, what, || {
            "post-start succeeded where status said it would fail".into()
        });
        (fix.expect("a mend by a person names the fix"))(n);
    }
    if how == Mend::InstallAndRestart {
        let out = common::install(n.h(), &[MACHINE]);
        t.check(out.status.success(), what, || {
            format!("install: {}", String::from_utf8_lossy(&out.stderr))
        });
    }
    if matches!(how, Mend::Restart | Mend::InstallAndRestart)
        && let Err((code, why)) = n.start(t)
    {
        t.fail(what, format!("the new start was refused ({code}): {why}"));
        return;
    }
    // After a restart, status judges the fresh boot first: post-start must then write exactly
    // what it lists (a PostStart mend was judged by `mutate` just before).
    let (_, pending) = n.judge();
    post_start_writes_what_was_listed(t, n, &pending, &format!("{what}: post-start ({how:?})"));
    let (s, pending) = n.judge();
    t.check(
        s.state == State::InSync && pending.is_empty(),
        &format!("{what}: after the mend ({how:?})"),
        || format!("status: {}\npending:\n{}", s.summary, listed(&pending)),
    );
    // In sync: post-start run again changes nothing.
    post_start_writes_what_was_listed(t, n, &pending, &format!("{what}: post-start once in sync"));
}

/// One mutation: detected by both, classed as the mend it needs, then mended.
fn mutate(t: &mut Tally, n: &mut Node, m: &Mutation) -> bool {
    if !(m.apply)(n) {
        return false;
    }
    let what = format!("{}: {}", n.example, m.name);
    let (s, pending) = n.judge();
    agree(t, &what, &s, &pending);
    t.check(!pending.is_empty(), &what, || {
        format!("nothing pending; status: {}", s.summary)
    });
    let by_post_start = pending.iter().all(Change::by_post_start);
    // A helper that fails is install's to mend (status says so); any other failing part a
    // person's.
    let install = pending.iter().any(|c| {
        c.action == Action::Install || (c.action == Action::Fails && c.check == Check::Helper)
    }) || s.findings.iter().any(|f| f.check == Check::NextStart);
    let person = pending
        .iter()
        .any(|c| c.action == Action::Fails && c.check != Check::Helper);
    let class = match (by_post_start, install, person) {
        (_, true, _) => Mend::InstallAndRestart,
        (_, false, true) => Mend::Person,
        (true, false, false) => Mend::PostStart,
        (false, false, false) => Mend::Restart,
    };
    t.check(class == m.mend, &what, || {
        format!(
            "expected a mend by {:?}, the changes ask for {class:?}:\n{}",
            m.mend,
            listed(&pending)
        )
    });
    mend(t, n, m.mend, m.fix, &what);
    true
}

/// Every mutation of the model on `example`; each one that applied to it is counted in
/// `applied`. `blind`: what the test sees of status's pending changes (the negative controls).
fn run_host(
    t: &mut Tally,
    example: &'static str,
    blind: Blind,
    applied: &mut std::collections::BTreeMap<&'static str, usize>,
) -> usize {
    let mut n = Node::new(example);
    n.blind = blind;
    let inv = discovery::discover(&HostRoot::new(n.h())).unwrap();
    if let Verdict::Incomplete { .. } = inv.verdict {
        // pre-start and plan refuse alike (exit 3); status is broken and nothing is pending:
        // post-start refuses too.
        let refused = n.start(t);
        t.check(
            matches!(&refused, Err((3, _))),
            &format!("{example}: an incomplete driver"),
            || format!("pre-start: {refused:?}"),
        );
        let (s, pending) = n.judge();
        t.check(
            s.state == State::Broken && pending.is_empty(),
            &format!("{example}: status of an incomplete driver"),
            || format!("status: {}\npending:\n{}", s.summary, listed(&pending)),
        );
        return 0;
    }
    let what = format!("{example}: first start");
    if let Err((code, why)) = n.start(t) {
        t.fail(&what, format!("pre-start refused ({code}): {why}"));
        return 0;
    }
    // Before post-start: the boot's binds are there, nothing of post-start's is.
    let (s, pending) = n.judge();
    agree(t, &format!("{what}, before post-start"), &s, &pending);
    mend(t, &mut n, Mend::PostStart, None, &what);
    let mut list = if inv.complete_driver().is_some() {
        gpu_mutations()
    } else {
        no_gpu_mutations()
    };
    list.extend(device_mutations());
    let mut count = 0;
    for m in &list {
        if mutate(t, &mut n, m) {
            *applied.entry(m.name).or_default() += 1;
            count += 1;
        }
    }
    count
}

fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the wiring model test mounts and builds host trees with mknod: run it as root"
    );
    // A mount namespace of our own: the binds go with this process.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .unwrap();
    let mut t = Tally::default();
    let mut mutations = 0;
    let mut applied = std::collections::BTreeMap::new();
    for (example, _) in fixture::EXAMPLES {
        mutations += run_host(&mut t, example, Blind::No, &mut applied);
    }
    // A mutation that applies to no example host checks nothing: each must apply somewhere.
    for m in gpu_mutations()
        .iter()
        .chain(&no_gpu_mutations())
        .chain(&device_mutations())
    {
        t.check(applied.contains_key(m.name), m.name, || {
            "applied to no example host: it checks nothing".into()
        });
    }
    // The negative control: the same run with status judging without the model must fail.
    let mut control = Tally::default();
    run_host(
        &mut control,
        "two-gpus",
        Blind::All,
        &mut Default::default(),
    );
    t.check(!control.failures.is_empty(), "negative control", || {
        "status without the model passed every check: the checks prove nothing".into()
    });
    // And without any one part of a machine's list: each part's changes carry a check (a
    // status that judged a part outside the list would pass that check without it).
    let mut parts_failed = Vec::new();
    for part in parts::running(Target::Machine) {
        let mut control = Tally::default();
        run_host(
            &mut control,
            "two-gpus",
            Blind::Part(part.check()),
            &mut Default::default(),
        );
        t.check(!control.failures.is_empty(), "negative control", || {
            format!(
                "status without the part {} passed every check: nothing proves that part",
                part.check()
            )
        });
        parts_failed.push(format!("{} {}", part.check(), control.failures.len()));
    }
    println!(
        "wiring model: {} example hosts, {mutations} mutations ({} kinds, each applied), {} checks, {} failed; \
         negative control (status without the model): {} of {} checks failed, as they must; \
         without one part (failed checks): {}",
        fixture::EXAMPLES.len(),
        applied.len(),
        t.checks,
        t.failures.len(),
        control.failures.len(),
        control.checks,
        parts_failed.join(", ")
    );
    if !t.failures.is_empty() {
        for f in &t.failures {
            eprintln!("FAIL {f}\n");
        }
        std::process::exit(1);
    }
}
