//! The machine's `.nspawn` file as a typed value; `Display` renders the exact bytes.
//!
//! Rendering is pure and deterministic: the same inventory and config give the same bytes.

use crate::config::MachineConfig;
use crate::discovery::Inventory;
use crate::model::gate;
use crate::model::host_devices;
use crate::model::layout;
use crate::types::machine_name::MachineName;
use crate::types::paths::{HostPath, MachinePath, bind_escape};
use std::collections::BTreeSet;
use std::fmt;

/// First line of the file `uninstall` leaves in place of pre-start's (see [`NspawnFile::uninstalled`]).
pub(crate) const UNINSTALLED_HEADER: &str = "# Written by nspawn-lifecycle-helper uninstall";

pub use crate::types::capabilities::CAPABILITIES;

/// One `Bind=`/`BindReadOnly=` line. Both paths are checked types; `Display` escapes the `:` and
/// `\` they may hold, so systemd-nspawn reads back exactly these two paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindLine {
    pub source: HostPath,
    /// Omitted from the line when equal to `source`.
    pub target: MachinePath,
    pub read_only: bool,
}

impl fmt::Display for BindLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = if self.read_only {
            "BindReadOnly"
        } else {
            "Bind"
        };
        if self.source.as_str() == self.target.as_str() {
            write!(f, "{key}={}", bind_escape(&self.source))
        } else {
            write!(
                f,
                "{key}={}:{}",
                bind_escape(&self.source),
                bind_escape(&self.target)
            )
        }
    }
}

/// A rendered `.nspawn` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NspawnFile {
    pub machine: String,
    /// Summary for the header comment: driver version and GPU count, or "no NVIDIA GPUs".
    pub summary: String,
    pub binds: Vec<BindLine>,
    /// `DropCapability=` (the config's `dropCapabilities`), taken from `Capability=all`.
    pub drop_capabilities: Vec<String>,
    /// Written by `uninstall`: no hooks run, so the header says so.
    pub uninstalled: bool,
}

impl NspawnFile {
    /// Whether the file binds the unit gate into the machine (so [`gate::HOST_FILE`] must exist).
    pub(crate) fn binds_gate(&self) -> bool {
        self.binds.iter().any(|b| b.source == gate::HOST_FILE)
    }

    /// Render for `inv` (whose verdict must not be incomplete; callers check first).
    /// `has_lib_modules`: whether the host has `/lib/modules` (nspawn fails on a missing source).
    /// `helper`: this helper's stable host path, bound in for the CDI hooks when there are GPUs.
    /// An error when a discovered driver file has a name no bind line can carry.
    pub fn render(
        machine: &MachineName,
        inv: &Inventory,
        cfg: &MachineConfig,
        has_lib_modules: bool,
        helper: &HostPath,
    ) -> anyhow::Result<NspawnFile> {
        let mut binds = Vec::new();
        if has_lib_modules {
            binds.push(lib_modules());
        }
        binds.extend(device_binds(inv, cfg));
        binds.push(BindLine {
            source: host_devices::bpffs_dir(machine)
                .parse()
                .map_err(anyhow::Error::msg)?,
            target: host_devices::BPFFS_TARGET
                .parse()
                .expect("a valid machine path"),
            read_only: false,
        });
        let summary = match inv.complete_driver() {
            Some(driver) => {
                // The driver root: pre-start's host tree of hard links, read-only, with the
                // directory binds on its mount points (src/model/layout.rs, src/apply/driver_tree.rs); a
                // file the tree cannot link is bound by `bind_driver_files`.
                for b in
                    std::iter::once(layout::tree_bind(machine)?).chain(layout::dir_binds(driver)?)
                {
                    binds.push(BindLine {
                        source: b.source,
                        target: b.target,
                        read_only: b.read_only,
                    });
                }
                // The CDI spec's hooks run this binary inside the machine (src/apply/cdi_hook.rs).
                let hook = layout::hook_bind(helper);
                binds.push(BindLine {
                    source: hook.source,
                    target: hook.target,
                    read_only: hook.read_only,
                });
                // containerd and kubelet wait at boot for their markers (src/apply/gate.rs), which
                // the host keeps: pre-start empties them before the boot and may release
                // containerd, post-start releases the rest.
                for unit in [&cfg.containerd_unit, &cfg.kubelet_unit] {
                    binds.push(BindLine {
                        source: gate::host_file(),
                        target: gate::dropin(unit),
                        read_only: true,
                    });
                }
                binds.push(BindLine {
                    source: gate::machine_marker_source(machine),
                    target: gate::marker_target(),
                    read_only: true,
                });
                format!(
                    "NVIDIA driver {}, {} GPU{}",
                    driver.version,
                    inv.gpus.len(),
                    if inv.gpus.len() == 1 { "" } else { "s" }
                )
            }
            None => "no NVIDIA GPUs".to_owned(),
        };
        binds.extend(mount_binds(cfg));
        Ok(NspawnFile {
            machine: machine.to_string(),
            summary,
            binds,
            drop_capabilities: cfg.drop_capabilities.clone(),
            uninstalled: false,
        })
    }

    /// Bind these driver files (the [`layout::file_binds`] of the tree pre-start builds: files it
    /// could not hard-link) on their mount points, right after the driver tree's own bind.
    pub(crate) fn bind_driver_files(&mut self, binds: Vec<layout::Bind>) {
        let Some(at) = self
            .binds
            .iter()
            .position(|b| b.target.as_str() == layout::DRIVER_ROOT)
        else {
            return;
        };
        let lines = binds.into_iter().map(|b| BindLine {
            source: b.source,
            target: b.target,
            read_only: b.read_only,
        });
        self.binds.splice(at + 1..at + 1, lines);
    }

    /// What `uninstall` leaves: pre-start's settings for a host without GPUs and without KVM
    /// (`PrivateUsers=no` above all, so a start of the stock unit does not chown the rootfs to
    /// a private UID range), `/lib/modules` and the configured mounts; no NVIDIA binds, no unit
    /// gate, no `/dev/kvm` (whose `DeviceAllow=` leaves with the drop-in).
    pub fn uninstalled(machine: &MachineName, cfg: &MachineConfig, has_lib_modules: bool) -> Self {
        let mut binds = Vec::new();
        if has_lib_modules {
            binds.push(lib_modules());
        }
        binds.extend(mount_binds(cfg));
        NspawnFile {
            machine: machine.to_string(),
            summary: "not managed (nspawn-lifecycle uninstalled); no GPU binds".to_owned(),
            binds,
            drop_capabilities: cfg.drop_capabilities.clone(),
            uninstalled: true,
        }
    }
}

impl fmt::Display for NspawnFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.uninstalled {
            writeln!(
                f,
                "{UNINSTALLED_HEADER} for machine {}: the node's settings without GPUs;",
                self.machine
            )?;
            writeln!(
                f,
                "# PrivateUsers=no keeps a start of the stock unit from shifting the rootfs to a private UID range."
            )?;
        } else {
            writeln!(
                f,
                "# Written by nspawn-lifecycle-helper pre-start for machine {} at every start; edits are lost.",
                self.machine
            )?;
            writeln!(
                f,
                "# Extra mounts belong in /etc/nspawn-lifecycle/config.json."
            )?;
        }
        writeln!(f, "# Host: {}", self.summary)?;
        f.write_str("\n[Exec]\nCapability=all\n")?;
        if !self.drop_capabilities.is_empty() {
            writeln!(f, "DropCapability={}", self.drop_capabilities.join(" "))?;
        }
        // NotifyReady=no: the unit's ExecStartPost= (post-start) runs as soon as the container is
        // up, overlapping the boot; the unit gate holds containerd and kubelet. With
        // no hooks left (uninstalled), the start waits for the boot as it always did.
        let notify_ready = if self.uninstalled { "yes" } else { "no" };
        write!(
            f,
            "PrivateUsers=no\nSystemCallFilter={}\nNotifyReady={notify_ready}\n",
            syscall_filter(&self.drop_capabilities)
        )?;
        f.write_str("\n[Network]\nVirtualEthernet=no\n")?;
        f.write_str("\n[Files]\n")?;
        for b in &self.binds {
            writeln!(f, "{b}")?;
        }
        Ok(())
    }
}

/// The system calls allowed beyond nspawn's default allow-list: runc's session keyrings
/// (`@keyring`), eBPF device programs and datapaths (`bpf`), and the perf ring buffers eBPF
/// agents read their events from and profilers sample with (`perf_event_open`: Cilium, Hubble,
/// DCGM's profiling). A call goes when `dropCapabilities` removes every capability the kernel
/// lets use it (`bpf`: `CAP_BPF` and `CAP_SYS_ADMIN`; `perf_event_open`: `CAP_PERFMON` and
/// `CAP_SYS_ADMIN`), so the filter never allows what the drop meant to take away.
fn syscall_filter(dropped: &[String]) -> String {
    let gone = |caps: &[&str]| caps.iter().all(|c| dropped.iter().any(|d| d == c));
    let mut calls = vec!["@keyring"];
    if !gone(&["CAP_BPF", "CAP_SYS_ADMIN"]) {
        calls.push("bpf");
    }
    if !gone(&["CAP_PERFMON", "CAP_SYS_ADMIN"]) {
        calls.push("perf_event_open");
    }
    calls.join(" ")
}

/// A host path bound at the same path in the machine.
/// `BindReadOnly=/lib/modules` (the machine's kernel modules are the host's).
fn lib_modules() -> BindLine {
    same(
        &"/lib/modules"
            .parse()
            .expect("/lib/modules is a valid host path"),
        true,
    )
}

/// The device nodes bound: `/dev/kvm` and the host devices of the config's `devices`, then with
/// a complete driver the NVIDIA nodes: a machine with every GPU gets the directories of the
/// nodes the host makes while it runs ([`host_devices::NVIDIA_NODE_DIRS`]), a share its own
/// nodes one by one.
fn device_binds(inv: &Inventory, cfg: &MachineConfig) -> Vec<BindLine> {
    let mut binds = Vec::new();
    if let Some(kvm) = inv.kvm.as_ref().filter(|_| cfg.devices.kvm) {
        binds.push(same(&kvm.path, false));
    }
    for (p, read_only) in host_devices::bind_paths(&host_devices::of_machine(inv, cfg)) {
        binds.push(same(&p, read_only));
    }
    if inv.complete_driver().is_none() {
        return binds;
    }
    for (dir, role) in host_devices::NVIDIA_NODE_DIRS {
        if host_devices::nvidia_dir_bound(&cfg.gpus, role) {
            binds.push(same(&dir.parse().expect("a valid host path"), false));
        }
    }
    for dev in &inv.devices {
        if !host_devices::nvidia_dir_bound(&cfg.gpus, dev.role) {
            binds.push(same(&dev.path, false));
        }
    }
    binds
}

/// The configured extra mounts, in config order.
fn mount_binds(cfg: &MachineConfig) -> impl Iterator<Item = BindLine> + '_ {
    cfg.mounts.iter().map(|m| BindLine {
        source: m.source.clone(),
        target: m.target.clone(),
        read_only: m.read_only,
    })
}

fn same(path: &HostPath, read_only: bool) -> BindLine {
    BindLine {
        source: path.clone(),
        target: MachinePath::same_as(path),
        read_only,
    }
}

/// One operator-facing line saying what changed between two renderings of a `.nspawn` file
/// (`old` is `None` for a first write).
pub(crate) fn describe_change(old: Option<&str>, new: &str) -> String {
    let Some(old) = old else {
        return format!("created ({})", header(new));
    };
    let binds = |text: &str| -> BTreeSet<String> {
        text.lines()
            .filter(|l| l.starts_with("Bind=") || l.starts_with("BindReadOnly="))
            .map(|l| l.split_once('=').map_or(l, |(_, v)| v).to_owned())
            .collect()
    };
    let (o, n) = (binds(old), binds(new));
    let mut parts = Vec::new();
    let group = |pred: &dyn Fn(&str) -> bool, label: &str, parts: &mut Vec<String>| {
        let added: Vec<_> = n.difference(&o).filter(|b| pred(b)).cloned().collect();
        let removed: Vec<_> = o.difference(&n).filter(|b| pred(b)).cloned().collect();
        if !added.is_empty() || !removed.is_empty() {
            let mut s = format!("{label}:");
            for a in &added {
                s.push_str(&format!(" +{a}"));
            }
            for r in &removed {
                s.push_str(&format!(" -{r}"));
            }
            parts.push(s);
        }
    };
    let is_dev = |b: &str| b.starts_with("/dev/");
    let is_lib = |b: &str| {
        b.contains(&format!(":{}/usr/lib/", layout::DRIVER_ROOT))
            || b.contains(&format!(":{}/lib/", layout::LEGACY_HOST_NVIDIA))
    };
    group(&is_dev, "devices", &mut parts);
    group(&is_lib, "driver libraries", &mut parts);
    group(
        &|b: &str| !is_dev(b) && !is_lib(b),
        "other binds",
        &mut parts,
    );
    let (oh, nh) = (header(old), header(new));
    if oh != nh {
        parts.push(format!("host: {oh} -> {nh}"));
    }
    if parts.is_empty() {
        "rewritten (layout only)".to_owned()
    } else {
        parts.join("; ")
    }
}

fn header(text: &str) -> &str {
    text.lines()
        .find_map(|l| l.strip_prefix("# Host: "))
        .unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_syscall_filter_follows_the_dropped_capabilities() {
        let f = |caps: &[&str]| {
            super::syscall_filter(&caps.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>())
        };
        assert_eq!(f(&[]), "@keyring bpf perf_event_open");
        assert_eq!(f(&["CAP_BPF"]), "@keyring bpf perf_event_open");
        assert_eq!(f(&["CAP_BPF", "CAP_SYS_ADMIN"]), "@keyring perf_event_open");
        assert_eq!(f(&["CAP_PERFMON", "CAP_SYS_ADMIN"]), "@keyring bpf");
        assert_eq!(f(&["CAP_SYS_ADMIN", "CAP_BPF", "CAP_PERFMON"]), "@keyring");
    }

    use super::*;

    #[test]
    fn change_lines_name_devices_libs_and_driver() {
        let old = "# Host: NVIDIA driver 1.0, 1 GPU\n[Files]\nBind=/dev/nvidia0\nBindReadOnly=/usr/lib/a/libcuda.so.1.0:/run/nvidia/driver/usr/lib/a/libcuda.so.1.0\n";
        let new = "# Host: NVIDIA driver 2.0, 1 GPU\n[Files]\nBind=/dev/nvidia1\nBindReadOnly=/usr/lib/a/libcuda.so.2.0:/run/nvidia/driver/usr/lib/a/libcuda.so.2.0\nBind=/data\n";
        let line = describe_change(Some(old), new);
        assert_eq!(
            line,
            "devices: +/dev/nvidia1 -/dev/nvidia0; driver libraries: +/usr/lib/a/libcuda.so.2.0:/run/nvidia/driver/usr/lib/a/libcuda.so.2.0 -/usr/lib/a/libcuda.so.1.0:/run/nvidia/driver/usr/lib/a/libcuda.so.1.0; other binds: +/data; host: NVIDIA driver 1.0, 1 GPU -> NVIDIA driver 2.0, 1 GPU"
        );
        assert_eq!(
            describe_change(None, new),
            "created (NVIDIA driver 2.0, 1 GPU)"
        );
    }

    fn bind(source: &str, target: &str, read_only: bool) -> BindLine {
        BindLine {
            source: source.parse().unwrap(),
            target: target.parse().unwrap(),
            read_only,
        }
    }

    #[test]
    fn uninstalled_file_keeps_private_users_off_mounts_and_drops_but_no_gpu() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        let host = crate::fs::host::HostRoot::new(dir.path());
        let m: MachineName = "kube1".parse().unwrap();
        let mc = crate::config::Config::parse(
            br#"{"defaults": {"mounts": [{"source": "/data"}],
                              "dropCapabilities": ["CAP_SYS_MODULE"]}}"#,
        )
        .unwrap()
        .machine(&host, &m)
        .unwrap();
        let text = NspawnFile::uninstalled(&m, &mc, true).to_string();
        assert!(text.starts_with(UNINSTALLED_HEADER), "{text}");
        assert!(
            text.contains(
                "\n[Exec]\nCapability=all\nDropCapability=CAP_SYS_MODULE\nPrivateUsers=no\n"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("\n[Files]\nBindReadOnly=/lib/modules\nBindReadOnly=/data\n"),
            "{text}"
        );
    }

    #[test]
    fn bind_lines_omit_equal_targets() {
        assert_eq!(bind("/a", "/a", true).to_string(), "BindReadOnly=/a");
        assert_eq!(bind("/a", "/b", false).to_string(), "Bind=/a:/b");
    }

    /// Unescaped, `:` split the gate's target, so the gate was silently off.
    #[test]
    fn bind_lines_escape_colons_and_backslashes_and_read_back() {
        let gate = "/run/systemd/system/kube:let.service.d/50-nspawn-lifecycle-gate.conf";
        let b = bind(gate::HOST_FILE, gate, true);
        assert_eq!(
            b.to_string(),
            "BindReadOnly=/run/nspawn-lifecycle/unit-gate.conf:\
             /run/systemd/system/kube\\:let.service.d/50-nspawn-lifecycle-gate.conf"
        );
        for (s, t) in [
            (gate::HOST_FILE, gate),
            ("/a b:c\\d ü", "/a b:c\\d ü"),
            ("/x\\", "/y:"),
            ("/\"q\" #;=", "/日本"),
        ] {
            for ro in [true, false] {
                let line = bind(s, t, ro).to_string();
                assert_eq!(
                    crate::types::paths::parse_bind_line(&line),
                    Some((s.to_owned(), t.to_owned())),
                    "{line}"
                );
            }
        }
    }
}
