//! Host mode's systemd shape: what `install --host` writes and `uninstall --host`
//! removes, for a node whose kubelet and containerd run on the host itself.
//!
//! - [`UNIT`], a oneshot that runs `host post-start` at every boot (enabled in
//!   `multi-user.target`), ordered after the NVIDIA daemons, retried while the driver install is
//!   incomplete (exit 3), `RemainAfterExit=yes` so `systemctl restart` runs it again after a
//!   driver change.
//! - The unit gate for the host's containerd and kubelet ([`gate_dropin`], at
//!   [`crate::model::gate::host_dropin`]): `ConditionPathExists=` on the marker `host post-start`
//!   creates for each unit in the host's `/run` ([`crate::model::gate::marker`]). `/run` is a tmpfs, so
//!   after a reboot (say, after a driver upgrade) neither service starts before host post-start
//!   wrote the new CDI spec and released it: a boot that reaches them first skips them ("unmet
//!   condition") and host post-start starts them. `Wants=` the oneshot, so a start of either
//!   pulls it in even when it is not enabled.
//!
//! Not `Before=containerd.service kubelet.service`: the oneshot starts both itself, and a start
//! job of a unit ordered after a unit whose start job is still running waits for that job: the
//! oneshot would wait for its own end (until its job timeout). The gate orders them instead, as
//! it does in a machine.

use crate::model::dropin::{AFTER, RESTART_SEC, TIMEOUT_START, exec_escape};
use crate::types::paths::{HostPath, UnitName};
use crate::types::units::UNIT_DIR;

/// The words after the helper in [`UNIT`]'s `ExecStart=`: `host status` finds its last run by
/// them.
pub const HOST_POST_START_ARGS: &str = "host post-start";

/// Host mode's unit.
pub const UNIT: &str = "nspawn-lifecycle-host.service";

/// First line of every file `install --host` writes; `uninstall --host` removes only files that
/// start with it.
pub const HEADER: &str = "# Written by nspawn-lifecycle-helper install --host";

/// The target the unit is enabled in.
pub const WANTED_BY: &str = "multi-user.target";

/// Host path of [`UNIT`].
pub fn unit_path() -> String {
    format!("{UNIT_DIR}/{UNIT}")
}

/// Host path of the symlink that enables [`UNIT`] (what `systemctl enable` makes).
pub fn wants_link() -> String {
    format!("{UNIT_DIR}/{WANTED_BY}.wants/{UNIT}")
}

/// The bytes of [`UNIT`], calling the helper at `helper` (its installed path).
pub fn unit(helper: &HostPath) -> String {
    format!(
        "{HEADER}
# Host mode: NVIDIA /dev/char links, CDI spec (/var/run/cdi) and staged images for this host's
# own containerd and kubelet, which wait for it at every boot (their gate drop-ins).
[Unit]
Description=nspawn-lifecycle host mode: NVIDIA wiring for the host's containerd and kubelet
# So the start at boot finds the NVIDIA daemons and their sockets; a no-op without them.
After={AFTER}
# Keep retrying while the NVIDIA driver install is incomplete (exit 3) instead of giving up
# after 5 starts in 10s.
StartLimitIntervalSec=0
# No Before=containerd.service kubelet.service: this unit starts both itself, and their start
# jobs would wait for this one to finish. Their gate drop-ins hold them instead.

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={} {HOST_POST_START_ARGS}
Restart=on-failure
RestartSec={RESTART_SEC}
# host post-start stops kubelet and containerd, rewires and imports staged images, each step
# with its own deadline; the default 90s would kill it mid-import.
TimeoutStartSec={TIMEOUT_START}

[Install]
WantedBy={WANTED_BY}
",
        exec_escape(helper.as_str())
    )
}

/// The bytes of the gate drop-in for the host's `unit`.
pub fn gate_dropin(unit: &UnitName) -> String {
    format!(
        "{HEADER}
# {unit} does not start before nspawn-lifecycle host post-start ({UNIT}) says its
# precondition holds, by creating this unit's own marker (%n is the unit's name):
# containerd's once the NVIDIA CDI spec and /dev/char links are current, kubelet's once the
# staged images are imported as well. The marker lives in this boot's /run, so every boot
# (after a driver upgrade too) is gated afresh.
[Unit]
ConditionPathExists={}/%n
Wants={UNIT}
",
        crate::model::gate::MARKER_DIR
    )
}

/// Host mode's unit files as `install --host` writes them now (the gate drop-ins of `units`,
/// then the oneshot unit), part of the host's desired state: each missing or different one is a
/// change only `install --host` mends.
pub fn unit_files(units: [&UnitName; 2], helper: &HostPath) -> Vec<crate::model::UnitFile> {
    let file = |path: String, text: String| crate::model::UnitFile {
        path,
        text,
        required: true,
        by: "install --host",
    };
    let mut out: Vec<_> = units
        .iter()
        .map(|u| {
            file(
                crate::model::gate::host_dropin(u).to_string(),
                gate_dropin(u),
            )
        })
        .collect();
    out.push(file(unit_path(), unit(helper)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_conditions_on_the_machines_marker_path() {
        let unit: UnitName = "kubelet.service".parse().unwrap();
        let text = gate_dropin(&unit);
        assert!(text.starts_with(HEADER));
        // The same condition as the machine's gate: gate::marker names the file it waits for.
        let condition = crate::model::gate::CONTENT
            .lines()
            .find(|l| l.starts_with("ConditionPathExists="))
            .unwrap();
        assert!(text.contains(&format!("\n{condition}\n")), "{text}");
        assert_eq!(
            crate::model::gate::host_dropin(&unit),
            "/etc/systemd/system/kubelet.service.d/50-nspawn-lifecycle-gate.conf"
        );
    }

    /// The rendered units, pinned: tests/golden/host-*.{service,conf} (UPDATE_GOLDEN=1 rewrites).
    #[test]
    fn units_match_golden() {
        let helper: HostPath = crate::config::DEFAULT_HELPER_PATH.parse().unwrap();
        for (name, text) in [
            ("host-nspawn-lifecycle-host.service", unit(&helper)),
            (
                "host-gate-kubelet.service.conf",
                gate_dropin(&"kubelet.service".parse().unwrap()),
            ),
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/golden")
                .join(name);
            if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
                std::fs::write(&path, &text).unwrap();
                continue;
            }
            let want = std::fs::read_to_string(&path).unwrap();
            assert_eq!(text, want, "{} differs (UPDATE_GOLDEN=1)", path.display());
        }
    }

    #[test]
    fn exec_start_escapes_the_helper_path() {
        let text = unit(&"/opt/a%b$c/helper".parse().unwrap());
        assert!(
            text.contains("\nExecStart=/opt/a%%b$$c/helper host post-start\n"),
            "{text}"
        );
        assert!(!text.contains("\nBefore="), "{text}");
    }
}
