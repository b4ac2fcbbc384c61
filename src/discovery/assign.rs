//! Which of the host's GPUs one machine gets (the config's `gpus`): a filter over the
//! [`Inventory`] discovery made, never a part of the scan. What it returns is the machine's view
//! of the host; the `.nspawn` binds, the CDI spec, the `/dev/char` links, the device cgroup and
//! `status` are all computed from that view, so they cannot disagree about which GPUs it has.

use super::{DeviceRole, Gpu, Inventory, Verdict};
use crate::config::{GpuSelector, Gpus, check_lists_disjoint};
use crate::error::{Kind, classified};
use anyhow::Result;
use serde::Serialize;

/// One machine's share of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The setting it came from.
    pub setting: Gpus,
    /// The host as the machine sees it: only its GPUs (indexed 0.. in PCI bus order among
    /// them), their nodes, the shared control nodes and their MIG capabilities. For `none` (or a
    /// list none of whose GPUs is present) a host without NVIDIA GPUs.
    pub view: Inventory,
    /// The host GPUs given to the machine, in host PCI bus order.
    pub gpus: Vec<AssignedGpu>,
    /// List entries that name no GPU the host has now.
    pub missing: Vec<GpuSelector>,
    /// Index entries, which name another GPU once the host renumbers.
    pub unstable: Vec<u32>,
}

/// A host GPU given to a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignedGpu {
    pub uuid: String,
    pub bus_id: String,
    /// Index on the host (PCI bus order among all its GPUs).
    pub host_index: u32,
    /// Index in the machine's CDI spec (PCI bus order among the machine's GPUs).
    pub index: u32,
    pub minor: u32,
}

/// The host GPU a list entry names, if the host has it now.
pub fn resolve<'a>(inv: &'a Inventory, sel: &GpuSelector) -> Option<&'a Gpu> {
    inv.gpus.iter().find(|g| match sel {
        GpuSelector::Uuid(u) => g.uuid.eq_ignore_ascii_case(u),
        GpuSelector::BusId(b) => {
            super::parse::PciAddress::parse(&g.bus_id).map(|a| a.to_string()) == Some(b.clone())
        }
        GpuSelector::Index(i) => g.index == *i,
    })
}

/// Whether two machines' `gpus` could name one GPU: only lists can (`all` and `none` overlap
/// nothing), so with fewer than two lists [`check_overlap`] has nothing to check.
pub(crate) fn lists_can_overlap(machines: &[(String, Gpus)]) -> bool {
    machines
        .iter()
        .filter(|(_, g)| matches!(g, Gpus::List(_)))
        .count()
        > 1
}

/// Two machines' lists naming the same host GPU, whichever way each names it (UUID, bus id or
/// index), is bad input naming both machines (exit 2).
pub(crate) fn check_overlap(inv: &Inventory, machines: &[(String, Gpus)]) -> Result<()> {
    check_lists_disjoint(machines, |_, sel| resolve(inv, sel).map(|g| g.uuid.clone()))
}

/// The machine's view of `inv` under `gpus`.
pub fn assign(inv: &Inventory, gpus: &Gpus) -> Assignment {
    let mut a = Assignment {
        setting: gpus.clone(),
        view: inv.clone(),
        gpus: Vec::new(),
        missing: Vec::new(),
        unstable: Vec::new(),
    };
    let list = match gpus {
        Gpus::All => {
            a.gpus = inv.gpus.iter().map(|g| assigned(g, g.index)).collect();
            return a;
        }
        Gpus::None => {
            a.view = without_gpus(inv);
            return a;
        }
        Gpus::List(list) => list,
    };
    let mut chosen: Vec<&Gpu> = Vec::new();
    for sel in list {
        if let GpuSelector::Index(i) = sel {
            a.unstable.push(*i);
        }
        match resolve(inv, sel) {
            Some(g) if !chosen.iter().any(|c| c.uuid == g.uuid) => chosen.push(g),
            Some(_) => {}
            None => a.missing.push(sel.clone()),
        }
    }
    if chosen.is_empty() {
        a.view = without_gpus(inv);
        return a;
    }
    chosen.sort_by_key(|g| g.index);
    let mut view_gpus = Vec::new();
    for (i, g) in chosen.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        a.gpus.push(assigned(g, index));
        view_gpus.push(Gpu {
            index,
            ..(*g).clone()
        });
    }
    let keep = |d: &super::DeviceNode| match d.role {
        DeviceRole::Control
        | DeviceRole::Uvm
        | DeviceRole::UvmTools
        | DeviceRole::Modeset
        | DeviceRole::ImexChannel
        | DeviceRole::Kvm => true,
        DeviceRole::Gpu => chosen.iter().any(|g| g.device.as_deref() == Some(&*d.path)),
        DeviceRole::Dri => chosen.iter().any(|g| g.dri.iter().any(|p| *p == *d.path)),
        // Only the capabilities of the machine's own MIG instances: the global MIG config and
        // monitor capabilities span every GPU of the host.
        DeviceRole::Cap => chosen.iter().any(|g| g.mig_caps.contains(&d.minor)),
    };
    a.view.devices = inv.devices.iter().filter(|d| keep(d)).cloned().collect();
    a.view.gpus = view_gpus;
    a
}

fn assigned(g: &Gpu, index: u32) -> AssignedGpu {
    AssignedGpu {
        uuid: g.uuid.clone(),
        bus_id: g.bus_id.clone(),
        host_index: g.index,
        index,
        minor: g.minor,
    }
}

/// A host without NVIDIA GPUs, whatever its driver's state: no node, no GPU, no driver, so
/// nothing is bound, nothing is held back, and post-start removes what an earlier start left.
fn without_gpus(inv: &Inventory) -> Inventory {
    Inventory {
        devices: Vec::new(),
        kvm: inv.kvm.clone(),
        host_devices: inv.host_devices.clone(),
        disks: inv.disks.clone(),
        gpus: Vec::new(),
        kernel_module: None,
        driver: None,
        verdict: Verdict::None,
    }
}

impl Assignment {
    /// Log what an operator must know: entries that name no GPU now, index entries.
    pub fn log(&self, machine: &str) {
        if !self.unstable.is_empty() {
            tracing::warn!(
                %machine,
                "gpus names GPU(s) by index ({}): an index names another GPU once the host \
                 renumbers them; name them by UUID (`discover` lists them)",
                self.unstable
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if !self.missing.is_empty() {
            tracing::warn!(
                %machine,
                "configured GPU(s) not on the host: {}; starting with the {} that are",
                self.missing_text(),
                self.gpus.len()
            );
        }
    }

    fn missing_text(&self) -> String {
        self.missing
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// With `require`, a listed GPU the host does not have holds the start back (exit 3, as
    /// an incomplete driver does, so systemd retries until it appears).
    pub(crate) fn check_required(&self, require: bool) -> Result<()> {
        if require && !self.missing.is_empty() {
            return Err(classified(
                Kind::DriverIncomplete,
                format!(
                    "configured GPU(s) not on the host and \"require\" is true, refusing to start \
                     until they are: {}",
                    self.missing_text()
                ),
            ));
        }
        Ok(())
    }

    /// One line for `plan` and logs: `all`, `none`, or which GPUs of how many.
    pub fn summary(&self) -> String {
        match &self.setting {
            Gpus::All => "all".to_owned(),
            Gpus::None => "none".to_owned(),
            Gpus::List(_) => {
                let mut s = format!(
                    "{} of the host's GPUs: {}",
                    self.gpus.len(),
                    if self.gpus.is_empty() {
                        "none present".to_owned()
                    } else {
                        self.gpus
                            .iter()
                            .map(|g| {
                                format!("{} ({}, host index {})", g.uuid, g.bus_id, g.host_index)
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                );
                if !self.missing.is_empty() {
                    s.push_str(&format!("; not on the host: {}", self.missing_text()));
                }
                s
            }
        }
    }

    /// The machine-readable form (`discover --json`, `status --json`).
    pub fn report(&self, machine: &str, require: bool) -> AssignmentReport {
        AssignmentReport {
            machine: machine.to_owned(),
            gpus: match &self.setting {
                Gpus::All => serde_json::Value::from("all"),
                Gpus::None => serde_json::Value::from("none"),
                Gpus::List(l) => l
                    .iter()
                    .map(|s| match s {
                        GpuSelector::Index(i) => serde_json::Value::from(*i),
                        other => serde_json::Value::from(other.to_string()),
                    })
                    .collect(),
            },
            require,
            assigned: self.gpus.clone(),
            missing: self.missing.iter().map(ToString::to_string).collect(),
        }
    }
}

/// One machine's assignment as `discover --json` and `status --json` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignmentReport {
    pub machine: String,
    /// The setting as the config writes it (`"all"`, `"none"` or the list).
    pub gpus: serde_json::Value,
    pub require: bool,
    /// The host GPUs the machine gets now.
    pub assigned: Vec<AssignedGpu>,
    /// Configured GPUs the host does not have now.
    pub missing: Vec<String>,
}

/// `machine`'s view of `inv` as every command needs it: the config's lists checked for overlap
/// against the host (exit 2), index and missing entries logged, `require` enforced (exit 3).
pub(crate) fn for_machine(
    config: &crate::config::Config,
    machine: &crate::types::machine_name::MachineName,
    mc: &crate::config::MachineConfig,
    inv: &Inventory,
) -> Result<Assignment> {
    check_overlap(inv, &config.gpu_assignments(machine)?)?;
    let a = assign(inv, &mc.gpus);
    a.log(machine.as_str());
    a.check_required(mc.require)?;
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::DeviceNode;

    fn node(path: &str, major: u32, minor: u32, role: DeviceRole) -> DeviceNode {
        DeviceNode {
            path: path.parse().unwrap(),
            major,
            minor,
            role,
        }
    }

    /// Two GPUs (minor 1 at bus 06, minor 0 at bus 07), a MIG instance on minor 1, global MIG
    /// capabilities, control nodes; the driver incomplete.
    fn host() -> Inventory {
        let gpu = |index, minor, bus: &str, mig: Vec<u32>| Gpu {
            index,
            minor,
            uuid: format!("GPU-0000000{minor}-0000-4000-8000-000000000000"),
            bus_id: bus.into(),
            model: "m".into(),
            device: Some(format!("/dev/nvidia{minor}")),
            dri: vec![format!("/dev/dri/renderD{}", 128 + minor)],
            mig_caps: mig,
        };
        Inventory {
            devices: vec![
                node("/dev/dri/renderD128", 226, 128, DeviceRole::Dri),
                node("/dev/dri/renderD129", 226, 129, DeviceRole::Dri),
                node("/dev/nvidia-caps/nvidia-cap1", 509, 1, DeviceRole::Cap),
                node("/dev/nvidia-caps/nvidia-cap21", 509, 21, DeviceRole::Cap),
                node("/dev/nvidia0", 195, 0, DeviceRole::Gpu),
                node("/dev/nvidia1", 195, 1, DeviceRole::Gpu),
                node("/dev/nvidia-uvm", 508, 0, DeviceRole::Uvm),
                node("/dev/nvidiactl", 195, 255, DeviceRole::Control),
            ],
            kvm: None,
            host_devices: Vec::new(),
            disks: Vec::new(),
            gpus: vec![
                gpu(0, 1, "0000:06:00.0", vec![21]),
                gpu(1, 0, "0000:07:00.0", vec![]),
            ],
            kernel_module: Some("1.0".into()),
            driver: None,
            verdict: Verdict::Incomplete {
                reasons: vec!["no libcuda".into()],
            },
        }
    }

    fn paths(inv: &Inventory) -> Vec<&str> {
        inv.devices.iter().map(|d| d.path.as_str()).collect()
    }

    #[test]
    fn a_list_keeps_its_gpus_nodes_controls_and_own_mig_caps_reindexed() {
        let inv = host();
        // The second GPU by bus id and again by UUID: one GPU, index 0 in the machine.
        let a = assign(
            &inv,
            &Gpus::List(vec![
                GpuSelector::BusId("0000:07:00.0".into()),
                GpuSelector::Uuid("GPU-00000000-0000-4000-8000-000000000000".into()),
            ]),
        );
        assert!(a.missing.is_empty() && a.unstable.is_empty());
        assert_eq!(a.view.gpus.len(), 1);
        assert_eq!((a.view.gpus[0].index, a.view.gpus[0].minor), (0, 0));
        assert_eq!(a.gpus[0].host_index, 1);
        assert_eq!(
            paths(&a.view),
            [
                "/dev/dri/renderD128",
                "/dev/nvidia0",
                "/dev/nvidia-uvm",
                "/dev/nvidiactl"
            ]
        );
        // An incomplete driver still holds a share back.
        assert_eq!(a.view.verdict, inv.verdict);
        // The first GPU by index: its MIG instance's capability, never the global one.
        let a = assign(&inv, &Gpus::List(vec![GpuSelector::Index(0)]));
        assert_eq!(a.unstable, [0]);
        assert!(paths(&a.view).contains(&"/dev/nvidia-caps/nvidia-cap21"));
        assert!(!paths(&a.view).contains(&"/dev/nvidia-caps/nvidia-cap1"));
        assert!(!paths(&a.view).contains(&"/dev/nvidia0"));
    }

    #[test]
    fn none_and_absent_gpus_are_a_host_without_gpus_and_require_holds_back() {
        let inv = host();
        let none = assign(&inv, &Gpus::None);
        assert_eq!(none.view.verdict, Verdict::None);
        assert!(none.view.devices.is_empty() && none.view.gpus.is_empty());
        assert!(none.view.driver.is_none() && none.view.kernel_module.is_none());
        let absent = GpuSelector::Uuid("GPU-99999999-0000-4000-8000-000000000000".into());
        let a = assign(&inv, &Gpus::List(vec![absent.clone()]));
        assert_eq!(a.missing, [absent]);
        assert_eq!(a.view, none.view);
        assert!(a.check_required(false).is_ok());
        let err = a.check_required(true).unwrap_err();
        assert_eq!(crate::error::exit_code(&err), 3);
        let all = assign(&inv, &Gpus::All);
        assert_eq!(all.view, inv);
        assert_eq!(all.gpus.len(), 2);
    }

    #[test]
    fn overlap_is_found_however_each_machine_names_the_gpu() {
        let inv = host();
        let lists = [
            (
                "kube1".to_owned(),
                Gpus::List(vec![GpuSelector::BusId("0000:06:00.0".into())]),
            ),
            ("kube2".to_owned(), Gpus::List(vec![GpuSelector::Index(0)])),
            ("kube3".to_owned(), Gpus::All),
        ];
        let err = check_overlap(&inv, &lists).unwrap_err();
        assert_eq!(crate::error::exit_code(&err), 2);
        assert!(
            format!("{err:#}").contains("GPU GPU-00000001-0000-4000-8000-000000000000 is assigned to both machines kube1 and kube2 (kube1: 0000:06:00.0, kube2: index 0)"),
            "{err:#}"
        );
        assert!(check_overlap(&inv, &lists[1..]).is_ok());
    }

    #[test]
    fn only_two_lists_can_overlap() {
        let list = || Gpus::List(vec![GpuSelector::Index(0)]);
        let of = |gs: Vec<Gpus>| -> Vec<(String, Gpus)> {
            gs.into_iter()
                .enumerate()
                .map(|(i, g)| (format!("kube{i}"), g))
                .collect()
        };
        assert!(!lists_can_overlap(&of(vec![list()])));
        assert!(!lists_can_overlap(&of(vec![Gpus::All, list(), Gpus::None])));
        assert!(lists_can_overlap(&of(vec![list(), Gpus::All, list()])));
        // What the skip relies on: lists that do overlap are caught when there are two of them.
        assert!(check_overlap(&host(), &of(vec![list(), list()])).is_err());
    }
}
