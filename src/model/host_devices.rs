//! The host devices a machine gets beside its GPUs (the config's `devices`), how its `.nspawn`
//! file binds them and how its device cgroup allows them.
//!
//! Nodes the host makes while the machine runs are bound by their directory and allowed by
//! their device group, so they open in the running machine with no restart: InfiniBand ports
//! (`/dev/infiniband`, groups `infiniband_verbs`, `infiniband_mad`), taps (`macvtap`,
//! `ipvtap`: no node to bind, the node agent makes them) and, for a machine with every GPU,
//! MIG capabilities and IMEX channels (`/dev/nvidia-caps`, `/dev/nvidia-caps-imex-channels`,
//! allowed by the drop-in's `char-nvidia*`). Everything else is bound and allowed by node, as
//! found at the start: a disk added later is drift that `status` names and a restart binds.

use crate::config::{Devices, Gpus, MachineConfig};
use crate::discovery::{
    DeviceCategory, DeviceRole, HostDevice, INFINIBAND_DIR, Inventory, NodeKind,
};
use crate::types::machine_name::MachineName;
use crate::types::paths::HostPath;

/// NVIDIA directories whose nodes the host makes while a machine with every GPU runs: MIG
/// capabilities (`nvidia-smi mig`, mig-manager) and IMEX channels (the DRA driver's
/// ComputeDomains). Bound whole, made empty on the host when missing.
pub const NVIDIA_NODE_DIRS: [(&str, DeviceRole); 2] = [
    ("/dev/nvidia-caps", DeviceRole::Cap),
    ("/dev/nvidia-caps-imex-channels", DeviceRole::ImexChannel),
];

/// The host directory of a machine's own bpf filesystem, bound at `/sys/fs/bpf` in it: eBPF
/// datapaths (Cilium) pin their maps there, so pins neither leak between machines nor vanish with
/// a machine's restart. pre-start mounts it (it lives until the host reboots, as a host's
/// `/sys/fs/bpf` does).
pub fn bpffs_dir(machine: &MachineName) -> String {
    format!("/run/nspawn-lifecycle/bpffs/{machine}")
}

/// Where a machine's bpf filesystem is bound in it.
pub const BPFFS_TARGET: &str = "/sys/fs/bpf";

/// Device groups allowed for a category whose nodes come and go while the machine runs.
const GROUPS: &[(DeviceCategory, &str)] = &[
    (DeviceCategory::Network, "char-macvtap"),
    (DeviceCategory::Network, "char-ipvtap"),
    (DeviceCategory::Infiniband, "char-infiniband_verbs"),
    (DeviceCategory::Infiniband, "char-infiniband_mad"),
];

/// Whether the config switches `category` on.
pub fn enabled(d: &Devices, category: DeviceCategory) -> bool {
    match category {
        DeviceCategory::Network => d.network,
        DeviceCategory::Infiniband => d.infiniband,
        DeviceCategory::Block => d.block,
        DeviceCategory::Gpudirect => d.gpudirect,
        DeviceCategory::Extra => true,
    }
}

/// The host devices `cfg` gives the machine from `inv`, then its `extra` nodes, in that order,
/// each node once. Disks only where the host does not use them: those the config names for
/// the machine (and the partitions of a named disk), or, when it names none, every free one
/// if this is the host's only machine.
pub fn of_machine(inv: &Inventory, cfg: &MachineConfig) -> Vec<HostDevice> {
    let d = &cfg.devices;
    let named = |h: &HostDevice| {
        let disk_of = inv
            .disks
            .iter()
            .find(|k| k.path == h.path)
            .and_then(|k| k.disk.as_ref());
        d.disks.iter().flatten().any(|n| {
            (n.major, n.minor) == (h.major, h.minor) || disk_of.is_some_and(|p| *p == n.path)
        })
    };
    let mut out: Vec<HostDevice> = inv
        .host_devices
        .iter()
        .filter(|h| enabled(d, h.category))
        .filter(|h| {
            h.category != DeviceCategory::Block
                || if d.disks.is_some() {
                    named(h)
                } else {
                    d.sole_machine
                }
        })
        .cloned()
        .collect();
    let kvm = inv.kvm.as_ref().filter(|_| d.kvm);
    for e in &d.extra {
        let same = |kind: NodeKind, major: u32, minor: u32| {
            kind == if e.block {
                NodeKind::Block
            } else {
                NodeKind::Char
            } && (major, minor) == (e.major, e.minor)
        };
        if out
            .iter()
            .any(|h| h.path == e.path || same(h.kind, h.major, h.minor))
            || kvm.is_some_and(|k| same(NodeKind::Char, k.major, k.minor))
        {
            continue;
        }
        out.push(HostDevice {
            category: DeviceCategory::Extra,
            path: e.path.clone(),
            kind: if e.block {
                NodeKind::Block
            } else {
                NodeKind::Char
            },
            major: e.major,
            minor: e.minor,
            create: false,
        });
    }
    out
}

/// The nodes the config names for the machine, checked against the host: no `extra` character
/// node is an NVIDIA or DRM node by its number; every disk (`disks`, and block nodes of `extra`)
/// is one the host does not use (exit 2 naming the key, the disk and the use); a `disks` entry
/// is a disk or partition at all (not a loop, RAM or optical device).
pub fn check_named_nodes(inv: &Inventory, cfg: &MachineConfig) -> anyhow::Result<()> {
    let d = &cfg.devices;
    // Another name for an NVIDIA or DRM node (an alias `mknod` made) is one by its number: the
    // machine gets those by its `gpus` alone.
    for e in d.extra.iter().filter(|e| !e.block) {
        if let Some(n) = inv.devices.iter().find(|n| n.major == e.major) {
            return Err(crate::error::bad_input(format!(
                "{}: \"{}\" is an NVIDIA or DRM node ({}:{}, the major of {}), which the machine \
                 gets by its gpus",
                e.at, e.written, e.major, e.minor, n.path
            )));
        }
    }
    let disks = d
        .disks
        .iter()
        .flatten()
        .filter(|_| d.block)
        .map(|n| (n, true));
    let extra = d.extra.iter().filter(|e| e.block).map(|n| (n, false));
    for (n, listed) in disks.chain(extra) {
        let shown = if n.path == n.written {
            format!("\"{}\"", n.written)
        } else {
            format!("\"{}\" ({})", n.written, n.path)
        };
        match inv
            .disks
            .iter()
            .find(|k| (k.major, k.minor) == (n.major, n.minor))
        {
            Some(k) => {
                if let Some(why) = &k.used {
                    return Err(crate::error::bad_input(format!(
                        "{}: {shown} is the host's: {why}; a machine never gets a disk the host uses",
                        n.at
                    )));
                }
            }
            None if listed => {
                return Err(crate::error::bad_input(format!(
                    "{}: {shown} is not a disk or partition of the host (loop, RAM, compressed \
                     swap, floppy and optical devices never are); `discover` lists them",
                    n.at
                )));
            }
            None => {}
        }
    }
    Ok(())
}

/// The free disks the machine does not get because several machines share the host and the
/// config names none for it: pre-start says so, as `discover` lists them.
pub fn disks_left_out(inv: &Inventory, cfg: &MachineConfig) -> usize {
    let d = &cfg.devices;
    if !d.block || d.disks.is_some() || d.sole_machine {
        return 0;
    }
    inv.host_devices
        .iter()
        .filter(|h| h.category == DeviceCategory::Block)
        .count()
}

/// What the `.nspawn` file binds for `devices`, each with whether read-only: InfiniBand as its
/// directory (once, read-only: the host makes its nodes, and a machine must not leave files
/// there that every other machine's start would read), every other node at its path.
pub fn bind_paths(devices: &[HostDevice]) -> Vec<(HostPath, bool)> {
    let mut out: Vec<(HostPath, bool)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for h in devices {
        let p = if h.category == DeviceCategory::Infiniband {
            (INFINIBAND_DIR.parse().expect("a valid host path"), true)
        } else {
            (h.path.clone(), false)
        };
        if seen.insert(p.0.to_string()) {
            out.push(p);
        }
    }
    out
}

/// Whether the machine's NVIDIA nodes of `role` are bound by their directory (a machine with
/// every GPU) rather than one by one (a share gets only its own: the device cgroup allows no
/// other, and a node made later for a GPU outside the share must not even appear).
pub fn nvidia_dir_bound(gpus: &Gpus, role: DeviceRole) -> bool {
    *gpus == Gpus::All && NVIDIA_NODE_DIRS.iter().any(|(_, r)| *r == role)
}

/// The unit's `DeviceAllow=` entries for `devices`: the groups of the categories present, and
/// one `/dev/{char,block}/M:m` entry per node the groups do not cover; sorted, each once.
pub fn cgroup_entries(devices: &[HostDevice]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for h in devices {
        let groups: Vec<&str> = GROUPS
            .iter()
            .filter(|(c, _)| *c == h.category)
            .map(|(_, g)| *g)
            .collect();
        out.extend(groups.iter().map(|g| (*g).to_owned()));
        let covered = h.category == DeviceCategory::Infiniband && !h.path.ends_with("/rdma_cm");
        if !covered {
            out.push(format!("/dev/{}/{}:{}", h.kind.as_str(), h.major, h.minor));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Whether a `DeviceAllow=` entry is one [`cgroup_entries`] can make (so pre-start replaces it
/// at every start), or the NVIDIA groups of an `all` machine's drop-in.
pub fn owns_entry(path: &str) -> bool {
    path.starts_with("/dev/char/")
        || path.starts_with("/dev/block/")
        || path.starts_with("char-nvidia")
        || path == "char-drm"
        || GROUPS.iter().any(|(_, g)| *g == path)
}

/// The NVIDIA groups an `all` machine's drop-in allows ([`crate::model::dropin`]), which its
/// runtime list carries too: a runtime list replaces the unit's whole list.
pub const ALL_GPU_GROUPS: [&str; 2] = ["char-nvidia*", "char-drm"];

/// The unit template that watches [`NVIDIA_NODE_DIRS`] while a machine with every GPU runs
/// (its drop-in wants it), and the service it starts: `refresh-devices` makes the machine's
/// `/dev/char` links for the nodes the host made (the machine has no udev).
pub const DEVICES_PATH_UNIT: &str = "nspawn-lifecycle-devices@.path";
pub const DEVICES_SERVICE_UNIT: &str = "nspawn-lifecycle-devices@.service";
/// First line of both units.
pub const DEVICES_UNIT_HEADER: &str =
    "# Written by nspawn-lifecycle-helper install; install rewrites it, for every machine.";

/// The path unit template's text.
pub fn devices_path_unit() -> String {
    let mut s = format!(
        "{DEVICES_UNIT_HEADER}\n\
         [Unit]\n\
         Description=NVIDIA node directories bound into machine %i\n\
         BindsTo=systemd-nspawn@%i.service\n\
         After=systemd-nspawn@%i.service\n\n\
         [Path]\n"
    );
    for (dir, _) in NVIDIA_NODE_DIRS {
        s.push_str(&format!("PathChanged={dir}\n"));
    }
    s.push_str("Unit=nspawn-lifecycle-devices@%i.service\n");
    s
}

/// The service template's text; `helper` as the drop-in's hooks call it.
pub fn devices_service_unit(helper: &HostPath) -> String {
    format!(
        "{DEVICES_UNIT_HEADER}\n\
         [Unit]\n\
         Description=/dev/char links in machine %i for NVIDIA nodes made while it runs\n\
         BindsTo=systemd-nspawn@%i.service\n\
         After=systemd-nspawn@%i.service\n\n\
         [Service]\n\
         Type=oneshot\n\
         ExecStart={} nspawn-lifecycle refresh-devices %i\n",
        crate::model::dropin::exec_escape(helper)
    )
}

/// Both templates as `install` writes them (under `/etc/systemd/system`), part of every machine's
/// desired state: a missing or different one is a change `install` mends.
pub fn devices_unit_files(helper: &HostPath) -> Vec<crate::model::UnitFile> {
    let file = |name: &str, text: String| crate::model::UnitFile {
        path: format!("{}/{name}", crate::types::units::UNIT_DIR),
        text,
        required: true,
        by: "install",
    };
    vec![
        file(DEVICES_PATH_UNIT, devices_path_unit()),
        file(DEVICES_SERVICE_UNIT, devices_service_unit(helper)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runtime list replaces the unit's whole list: it must carry exactly the NVIDIA groups
    /// the drop-in of an `all` machine allows.
    #[test]
    fn the_all_gpu_groups_are_the_dropins() {
        let (m, helper) = ("kube1".parse().unwrap(), "/usr/bin/h".parse().unwrap());
        let text = crate::model::dropin::Dropin::for_gpus(&m, &helper, &Gpus::All).to_string();
        let groups: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("DeviceAllow=char-"))
            .map(|l| l.trim_end_matches(" rwm"))
            .collect();
        let ours: Vec<&str> = ALL_GPU_GROUPS
            .iter()
            .map(|g| g.trim_start_matches("char-"))
            .collect();
        assert_eq!(groups, ours, "{text}");
    }
}
