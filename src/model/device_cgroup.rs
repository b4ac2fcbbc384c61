//! The device cgroup of a machine whose config's `gpus` is not `all`: exactly its own NVIDIA
//! and DRM nodes, by number, set at every start.
//!
//! `DeviceAllow=char-nvidia*` (the drop-in of an `all` machine) allows every minor of every
//! NVIDIA major, so root in the machine with `CAP_MKNOD` could open any GPU of the host after a
//! `mknod`. For a machine with a share of the GPUs the drop-in allows no NVIDIA or DRM group;
//! pre-start, run as `ExecStartPre=` of the very unit, sets the unit's `DeviceAllow=` over D-Bus
//! (`SetUnitProperties`, runtime) to what the unit allows without NVIDIA plus one
//! `/dev/char/<major>:<minor>` entry per node of the machine's view. systemd parses
//! `/dev/char/M:m` without a node there (no `stat()` at apply time), applies the list to the
//! unit's cgroup before it forks `ExecStart=` (nspawn, whose payload's cgroup is below the
//! unit's, and BPF device programs of a parent cgroup apply to all below it), and keeps it in
//! `/run/systemd/system.control/<unit>.d/50-DeviceAllow.conf`. That file sorts before our
//! `50-nspawn-lifecycle.conf`, so a `daemon-reload` re-applies it after the unit file (its
//! leading empty `DeviceAllow=` resets the stock entries, which the file carries again) and
//! before our drop-in, which must therefore never name an NVIDIA group for such a machine
//! (pre-start refuses a drop-in that does: [`check_dropin`]).

use crate::config::Gpus;
use crate::discovery::{DeviceRole, HostDevice, Inventory};
use crate::error::bad_input;
use crate::model::host_devices;
use crate::types::machine_name::MachineName;
use anyhow::Result;

/// Access for every entry we add (read, write, mknod), as the `all` drop-in grants.
pub const ACCESS: &str = "rwm";

/// The machine's entries, sorted, each once: for a share, one `/dev/char/M:m` entry per NVIDIA
/// or DRM node of its view; for `all`, the drop-in's NVIDIA groups (the runtime list replaces
/// the unit's whole list); then its host devices' ([`host_devices::cgroup_entries`]).
pub fn machine_entries(
    view: &Inventory,
    gpus: &Gpus,
    devices: &[HostDevice],
) -> Vec<(String, String)> {
    let mut out: Vec<String> = if *gpus == Gpus::All {
        host_devices::ALL_GPU_GROUPS
            .iter()
            .map(|g| (*g).to_owned())
            .collect()
    } else {
        view.devices
            .iter()
            .filter(|d| d.role != DeviceRole::Kvm)
            .map(|d| format!("/dev/char/{}:{}", d.major, d.minor))
            .collect()
    };
    out.extend(host_devices::cgroup_entries(devices));
    out.sort();
    out.dedup();
    out.into_iter().map(|p| (p, ACCESS.to_owned())).collect()
}

/// Whether an entry of the unit's list is one pre-start owns (and so replaces at every start):
/// every `/dev/char/…` and `/dev/block/…` entry, any NVIDIA or DRM group, and the host device
/// groups. Entries by path (`/dev/net/tun`) and other groups (`char-pts`, `block-loop`) are
/// kept.
fn owned(path: &str) -> bool {
    host_devices::owns_entry(path)
}

/// The unit's new list: what it allows now minus what pre-start owns, then `ours`.
pub fn merge(current: &[(String, String)], ours: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for e in current.iter().filter(|(p, _)| !owned(p)).chain(ours) {
        if !out.contains(e) {
            out.push(e.clone());
        }
    }
    out
}

/// Whether two `DeviceAllow=` lists allow the same: the same entries, whatever their order or
/// repeats (the cgroup's device program allows each; systemd reports the unit file's, the
/// drop-ins' and the runtime setting's together, in an order of its own).
pub fn allows_same(a: &[(String, String)], b: &[(String, String)]) -> bool {
    use std::collections::BTreeSet;
    a.iter().collect::<BTreeSet<_>>() == b.iter().collect::<BTreeSet<_>>()
}

/// The installed drop-in (`text`) must match the machine's `gpus`: an `all` machine's allows
/// every NVIDIA group, any other's none (a `daemon-reload` would add it back after the
/// runtime list). A mismatch is bad input until `install` is run again.
pub fn check_dropin(
    machine: &MachineName,
    dropin_path: &str,
    text: &str,
    gpus: &Gpus,
) -> Result<()> {
    let has_all = crate::model::dropin::allows_all_gpus(text);
    let want_all = *gpus == Gpus::All;
    if has_all == want_all {
        return Ok(());
    }
    Err(bad_input(format!(
        "{dropin_path} was installed for {} but the config's gpus for {machine} is {gpus}: run \
         `nspawn-lifecycle-helper install {machine}` so its device cgroup {}",
        if has_all {
            "gpus \"all\""
        } else {
            "a machine without every GPU"
        },
        if want_all {
            "allows every GPU"
        } else {
            "allows only its own GPUs"
        }
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(p: &str, a: &str) -> (String, String) {
        (p.to_owned(), a.to_owned())
    }

    #[test]
    fn merge_keeps_the_stock_entries_and_replaces_ours() {
        let current = [
            e("/dev/net/tun", "rwm"),
            e("char-pts", "rw"),
            e("block-loop", "rw"),
            e("/dev/kvm", "rwm"),
            e("char-nvidia*", "rwm"),
            e("char-drm", "rwm"),
            e("/dev/char/195:3", "rwm"),
            e("/dev/char/509:0", "rwm"),
        ];
        let ours = [e("/dev/char/195:0", "rwm"), e("/dev/char/195:255", "rwm")];
        assert_eq!(
            merge(&current, &ours),
            [
                e("/dev/net/tun", "rwm"),
                e("char-pts", "rw"),
                e("block-loop", "rw"),
                e("/dev/kvm", "rwm"),
                e("/dev/char/195:0", "rwm"),
                e("/dev/char/195:255", "rwm"),
            ]
        );
        // Idempotent: merging again changes nothing.
        assert_eq!(
            merge(&merge(&current, &ours), &ours),
            merge(&current, &ours)
        );
        // `none`: nothing of NVIDIA stays.
        assert_eq!(merge(&current, &[]).len(), 4);
        // The list systemd reports back, ours first and one repeated, allows the same.
        let mut back = merge(&current, &ours);
        back.rotate_right(2);
        back.push(e("char-pts", "rw"));
        assert!(allows_same(&back, &merge(&current, &ours)));
        assert!(!allows_same(&back, &current));
        assert!(!allows_same(
            &[e("/dev/kvm", "rw")],
            &[e("/dev/kvm", "rwm")]
        ));
    }

    #[test]
    fn the_dropin_must_match_the_setting() {
        use crate::model::dropin::Dropin;
        let (m, helper) = ("kube1".parse().unwrap(), "/usr/bin/h".parse().unwrap());
        // The drop-ins install renders, so the check and the renderer cannot drift apart.
        let all = Dropin::for_gpus(&m, &helper, &Gpus::All).to_string();
        let some = &Dropin::for_gpus(&m, &helper, &Gpus::None).to_string();
        assert!(check_dropin(&"kube1".parse().unwrap(), "/d", &all, &Gpus::All).is_ok());
        assert!(check_dropin(&"kube1".parse().unwrap(), "/d", some, &Gpus::None).is_ok());
        let err = check_dropin(&"kube1".parse().unwrap(), "/d", &all, &Gpus::None).unwrap_err();
        assert_eq!(crate::error::exit_code(&err), 2);
        assert!(format!("{err:#}").contains("install kube1"), "{err:#}");
        assert!(check_dropin(&"kube1".parse().unwrap(), "/d", some, &Gpus::All).is_err());
    }
}
