//! The machine unit's runtime `DeviceAllow=` (systemd keeps it in a runtime drop-in): its own
//! NVIDIA and DRM nodes (its GPUs, or the drop-in's groups for `all`) and host devices merged in,
//! set over D-Bus. Under the real root only: a host tree has no unit.

use super::{Applied, NextStart, Owner, Part, When};
use crate::apply::boot::{Boot, DBUS_TIMEOUT};
use crate::model::{Action, Change, Check, device_cgroup};
use crate::types::units::unit_name;
use anyhow::Result;

pub struct DeviceCgroup;

impl Part for DeviceCgroup {
    type Hook = NextStart;
    /// The unit's `DeviceAllow=` now.
    type Seen = Vec<(String, String)>;
    const NAME: &'static str = "device cgroup";
    const KEY: &'static str = "device-cgroup";
    const CHECK: Check = Check::HostDevices;
    const OWNER: Owner = Owner::PreStart;
    const WHEN: When = When::RealRoot;

    fn observe(&self, b: &Boot) -> Result<Self::Seen> {
        device_allow(b)
    }

    /// The unit's `DeviceAllow=` against the machine's own entries merged in.
    fn diff(&self, b: &Boot, current: &Self::Seen, _: &[Change]) -> Result<Vec<Change>> {
        let new = device_cgroup::merge(current, &entries(b));
        if device_cgroup::allows_same(&new, current) {
            return Ok(Vec::new());
        }
        let named = |from: &[(String, String)], not_in: &[(String, String)]| {
            from.iter()
                .filter(|e| !not_in.contains(e))
                .map(|(p, how)| format!("{p} {how}"))
                .collect::<Vec<_>>()
        };
        let (gains, drops) = (named(&new, current), named(current, &new));
        let mut said = Vec::new();
        if !gains.is_empty() {
            said.push(format!("gains {}", gains.join(", ")));
        }
        if !drops.is_empty() {
            said.push(format!("drops {}", drops.join(", ")));
        }
        Ok(vec![Change::new(
            Self::CHECK,
            Action::Write,
            unit_name(b.machine),
            format!("DeviceAllow= {}", said.join("; ")),
        )])
    }

    fn apply(&self, b: &Boot, _: bool) -> Result<Applied> {
        let unit = unit_name(b.machine);
        let current = device_allow(b)?;
        let ours = entries(b);
        let new = device_cgroup::merge(&current, &ours);
        if device_cgroup::allows_same(&new, &current) {
            return Ok(Applied::line(self.unchanged(b)?));
        }
        let deadline = std::time::Instant::now() + DBUS_TIMEOUT;
        b.bus()?.set_device_allow(&unit, &new, deadline)?;
        Ok(Applied::line(format!(
            "device cgroup of {unit} set: {} NVIDIA/DRM node(s) of its own: {}",
            ours.len(),
            ours.iter()
                .map(|(p, _)| p.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        )))
    }

    fn unchanged(&self, b: &Boot) -> Result<String> {
        Ok(format!(
            "device cgroup of {} unchanged: {} NVIDIA/DRM node(s)",
            unit_name(b.machine),
            entries(b).len()
        ))
    }
}

/// The machine's own `DeviceAllow=` entries: its GPUs (a share) or the drop-in's NVIDIA groups
/// (`all`), and its host devices.
fn entries(b: &Boot) -> Vec<(String, String)> {
    let rendered = b.rendered.borrow();
    let start = rendered.start();
    device_cgroup::machine_entries(
        &start.assignment.view,
        &start.assignment.setting,
        &start.devices,
    )
}

/// The unit's `DeviceAllow=` as systemd holds it now.
fn device_allow(b: &Boot) -> Result<Vec<(String, String)>> {
    let deadline = std::time::Instant::now() + DBUS_TIMEOUT;
    b.bus()?.device_allow(&unit_name(b.machine), deadline)
}
