//! What older layouts left on a host, and whether install may take it over: an older agent's
//! `override.conf` beside our drop-in (migrated line by line: what ours sets goes, the rest is
//! kept and reported) and a `.nspawn` file pre-start did not write (audited for settings
//! pre-start's rendering would silently drop).
//!
//! The `.nspawn` audit lives here rather than in `nspawn.rs` because it answers the same
//! question as the migration, about the same kind of file an older agent wrote, with the same
//! unit-file reader; `nspawn.rs` only renders. Everything here is pure: text in, verdict out;
//! install turns the verdicts into plan lines.

use crate::model::dropin::{
    ENV, LineKind, SectionSetting, UnitLine, env_name, env_words, parse_unit, section_settings,
    with_sections,
};
use crate::model::nspawn::UNINSTALLED_HEADER;
use crate::types::machine_name::MachineName;
use crate::types::units::DROPIN_NAME;

/// The drop-in an older agent (and `systemctl edit`) wrote; migrated by `install`.
pub const LEGACY_OVERRIDE: &str = "override.conf";
/// First line of a `.nspawn` file pre-start rendered (see `nspawn.rs`).
const NSPAWN_HEADER: &str = "# Written by nspawn-lifecycle-helper pre-start";
/// Added at the top of an `override.conf` that install rewrote.
const OVERRIDE_NOTE: &str =
    "# nspawn-lifecycle-helper install moved the settings it manages from this file into";

/// A `.nspawn` file pre-start or uninstall wrote.
pub fn is_ours_nspawn(bytes: &[u8]) -> bool {
    bytes.starts_with(NSPAWN_HEADER.as_bytes()) || bytes.starts_with(UNINSTALLED_HEADER.as_bytes())
}

/// What happens to one setting of an older layout.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    /// Not ours: kept as written.
    Keep,
    /// Covered by, or in conflict with, our drop-in: removed.
    Remove,
    /// Partly ours: rewritten to this line.
    Replace(String),
}

fn is_ours_device(spec: &str) -> bool {
    spec.starts_with("char-nvidia")
        || spec == "char-drm"
        || spec.starts_with("/dev/nvidia")
        || spec == "/dev/dri"
        || spec.starts_with("/dev/dri/")
        || spec == "/dev/kvm"
}

/// A hook or clean-up command ours replaces: `machinectl terminate <machine>` (any prefix, any
/// path) or any helper of ours, whatever its name or path (`nspawn-lifecycle*`).
fn is_ours_command(value: &str, machine: &MachineName) -> bool {
    let cmd = value.trim_start_matches(['-', '@', ':', '+', '!']);
    let mut words = cmd.split_whitespace();
    let Some(exe) = words.next() else {
        return false;
    };
    let base = exe.rsplit('/').next().unwrap_or(exe);
    if base.starts_with("nspawn-lifecycle") {
        return true;
    }
    let args: Vec<_> = words.collect();
    base == "machinectl"
        && matches!(args.as_slice(), ["terminate", m] if *m == machine.as_str() || *m == "%i" || *m == "%I")
}

/// Decide the fate of one setting found in a drop-in other than ours. Everything our drop-in
/// sets once (a later file would override ours) goes, and so do list entries ours covers and
/// list resets (a reset after ours would clear ours).
fn classify(section: &str, key: &str, value: &str, machine: &MachineName) -> Fate {
    match (section, key) {
        ("Unit" | "Service", "StartLimitIntervalSec" | "StartLimitInterval") => Fate::Remove,
        ("Service", "Restart" | "RestartSec" | "TimeoutStartSec") => Fate::Remove,
        // TimeoutSec= sets both timeouts; keep the stop half.
        ("Service", "TimeoutSec") => Fate::Replace(format!("TimeoutStopSec={value}")),
        ("Service", "ExecStartPre" | "ExecStartPost") => {
            if value.is_empty() || is_ours_command(value, machine) {
                Fate::Remove
            } else {
                Fate::Keep
            }
        }
        ("Service", "DeviceAllow") => {
            let spec = value.split_whitespace().next().unwrap_or("");
            if value.is_empty() || is_ours_device(spec) {
                Fate::Remove
            } else {
                Fate::Keep
            }
        }
        ("Service", "Environment") => {
            if value.is_empty() {
                return Fate::Remove;
            }
            let words = env_words(value);
            let rest: Vec<&str> = words
                .iter()
                .copied()
                .filter(|w| !ENV.iter().any(|(n, _)| env_name(w) == *n))
                .collect();
            if rest.len() == words.len() {
                Fate::Keep
            } else if rest.is_empty() {
                Fate::Remove
            } else {
                Fate::Replace(format!("Environment={}", rest.join(" ")))
            }
        }
        _ => Fate::Keep,
    }
}

/// A line only an older agent's layout has: a hook or clean-up ours replaces, a per-device
/// NVIDIA/DRM/KVM entry, or the environment nspawn needs. Single values (`Restart=`,
/// `TimeoutStartSec=`…) are not marks: an operator may set those on purpose.
fn is_legacy_mark(section: &str, key: &str, value: &str, machine: &MachineName) -> bool {
    !value.is_empty() && is_list(key) && classify(section, key, value, machine) != Fate::Keep
}

/// A setting that may be given many times, each adding to the list (an empty value resets it).
fn is_list(key: &str) -> bool {
    matches!(
        key,
        "ExecStartPre" | "ExecStartPost" | "DeviceAllow" | "Environment"
    )
}

/// The outcome of migrating one older drop-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// `None`: not an older agent's file (see `is_legacy_mark`), leave it as it is.
    /// `Some(None)`: everything in it is ours, remove it. `Some(Some(text))`: rewrite it.
    pub rewrite: Option<Option<String>>,
    /// Lines taken out (or rewritten), as written.
    pub removed: Vec<String>,
    /// Settings kept because they are not ours, as written.
    pub kept: Vec<String>,
}

/// Migrate an older agent's `override.conf`: drop what our drop-in now does or would be
/// overridden by, keep the rest. A file without the older agent's marks is the operator's own
/// (`systemctl edit`, or what an earlier migration left) and is not touched.
pub fn migrate_override(text: &str, machine: &MachineName) -> Migration {
    let lines = parse_unit(text);
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    if !section_settings(&lines).any(|s| is_legacy_mark(s.section, s.key, s.value, machine)) {
        return Migration {
            rewrite: None,
            removed,
            kept,
        };
    }
    // Per line: what to emit (None = drop).
    let mut emit: Vec<Option<String>> = Vec::new();
    for (section, l) in with_sections(&lines) {
        let LineKind::Setting { key, value } = &l.kind else {
            emit.push(Some(l.raw.clone()));
            continue;
        };
        match classify(section, key, value, machine) {
            Fate::Keep => {
                kept.push(l.raw.trim().to_owned());
                emit.push(Some(l.raw.clone()));
            }
            Fate::Remove => {
                removed.push(l.raw.trim().to_owned());
                emit.push(None);
            }
            Fate::Replace(new) => {
                removed.push(l.raw.trim().to_owned());
                kept.push(new.clone());
                emit.push(Some(new));
            }
        }
    }
    let rewrite = match (removed.is_empty(), kept.is_empty()) {
        (true, _) => None,
        (false, true) => Some(None),
        (false, false) => Some(Some(rewritten(&lines, &emit))),
    };
    Migration {
        rewrite,
        removed,
        kept,
    }
}

/// The text of a migrated `override.conf` from what each line emits: a section (header,
/// comments, settings) only when a setting in it survives, our note on top once, runs of blank
/// lines folded.
fn rewritten(lines: &[UnitLine], emit: &[Option<String>]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut block: Vec<String> = Vec::new();
    let mut block_has_setting = false;
    let mut in_preamble = true;
    let flush = |out: &mut Vec<String>, block: &mut Vec<String>, keep: bool| {
        if keep {
            out.append(block);
        }
        block.clear();
    };
    for (l, e) in lines.iter().zip(emit) {
        if let LineKind::Section(_) = l.kind {
            let keep = in_preamble || block_has_setting;
            flush(&mut out, &mut block, keep);
            in_preamble = false;
            block_has_setting = false;
        }
        if let Some(text) = e {
            if matches!(l.kind, LineKind::Setting { .. }) {
                block_has_setting = true;
            }
            block.push(text.clone());
        }
    }
    let keep = in_preamble || block_has_setting;
    flush(&mut out, &mut block, keep);
    let mut text = String::new();
    if !out.iter().any(|l| l.starts_with(OVERRIDE_NOTE)) {
        text.push_str(&format!(
            "{OVERRIDE_NOTE} {DROPIN_NAME};\n# what is left here is not managed by it.\n\n"
        ));
    }
    let mut blank = text.is_empty() || text.ends_with("\n\n");
    for l in out {
        let is_blank = l.trim().is_empty();
        if is_blank && blank {
            continue;
        }
        blank = is_blank;
        text.push_str(&l);
        text.push('\n');
    }
    while text.ends_with("\n\n") {
        text.pop();
    }
    text
}

/// Lines of another drop-in that overlap ours (install leaves such files alone but says so).
/// Single-valued settings and list resets only matter in a file applied after ours.
pub fn overlaps(text: &str, machine: &MachineName, after_ours: bool) -> Vec<String> {
    let lines = parse_unit(text);
    section_settings(&lines)
        .filter(|s| after_ours || (is_list(s.key) && !s.value.is_empty()))
        .filter(|s| classify(s.section, s.key, s.value, machine) != Fate::Keep)
        .map(|s| s.raw.trim().to_owned())
        .collect()
}

/// Lines of a `.nspawn` file pre-start did not write that pre-start's rendering would lose: not
/// GPU, KVM or driver binds (which pre-start renders from the host), not the `[Exec]` settings it
/// sets, and not a bind the configuration already carries.
pub fn foreign_nspawn_losses(text: &str, config_binds: &[String]) -> Vec<String> {
    let lines = parse_unit(text);
    section_settings(&lines)
        .filter(|s| !rendered_by_pre_start(s, config_binds))
        .map(|s| s.raw.trim().to_owned())
        .collect()
}

/// Whether pre-start renders this `.nspawn` setting from the host or the configuration.
fn rendered_by_pre_start(s: &SectionSetting<'_>, config_binds: &[String]) -> bool {
    match (s.section, s.key) {
        (
            "Exec",
            "Boot" | "Capability" | "DropCapability" | "PrivateUsers" | "SystemCallFilter"
            | "NotifyReady",
        ) => true,
        ("Network", "VirtualEthernet") => true,
        ("Files", "Bind" | "BindReadOnly") => {
            let mut parts = s.value.splitn(3, ':');
            let src = parts.next().unwrap_or("");
            let dst = parts.next().unwrap_or(src);
            let gpu = |p: &str| {
                p.starts_with("/dev/nvidia")
                    || p == "/dev/dri"
                    || p.starts_with("/dev/dri/")
                    || p == "/dev/kvm"
                    || p == "/lib/modules"
                    || p.starts_with("/run/host-nvidia")
                    || p.starts_with("/run/nvidia/driver")
            };
            gpu(src)
                || gpu(dst)
                || config_binds
                    .iter()
                    .any(|b| *b == format!("{}={}", s.key, s.value))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::dropin::Dropin;

    fn m(s: &str) -> MachineName {
        s.parse().unwrap()
    }

    /// The header is matched as text, apart from the renderer that writes it: a change to one
    /// without the other would make install treat its own file as an older agent's.
    #[test]
    fn files_pre_start_and_uninstall_render_are_ours_and_others_are_not() {
        for uninstalled in [false, true] {
            let file = crate::model::nspawn::NspawnFile {
                machine: "kube1".into(),
                summary: "no NVIDIA GPUs".into(),
                binds: Vec::new(),
                drop_capabilities: Vec::new(),
                uninstalled,
            };
            let text = file.to_string();
            assert!(is_ours_nspawn(text.as_bytes()), "{text}");
            assert!(foreign_nspawn_losses(&text, &[]).is_empty(), "{text}");
        }
        assert!(!is_ours_nspawn(b"[Exec]\nBoot=yes\n"));
        assert!(!is_ours_nspawn(b"# Written by gpu-agent\n[Exec]\n"));
    }

    #[test]
    fn our_own_dropin_is_ours_line_by_line() {
        let d = Dropin::new(
            &m("kube1"),
            &crate::config::DEFAULT_HELPER_PATH.parse().unwrap(),
        );
        // A copy of it elsewhere would be flagged.
        let text = d.to_string();
        let o = overlaps(&text, &m("kube1"), true);
        assert_eq!(
            o.len(),
            d.settings().len() - 2,
            "all but After= and Wants=: {o:?}"
        );
        let o = overlaps(&text, &m("kube1"), false);
        assert_eq!(o.len(), 8, "only list entries count before ours: {o:?}");
    }

    #[test]
    fn commands_of_older_agents_are_recognised() {
        let k = m("kube1");
        for ours in [
            "-/usr/bin/machinectl terminate kube1",
            "-machinectl terminate %i",
            "/usr/local/bin/nspawn-lifecycle-helper pre %i",
            "+/opt/x/nspawn-lifecycle post-start kube1",
        ] {
            assert!(is_ours_command(ours, &k), "{ours}");
        }
        for theirs in [
            "-/usr/bin/machinectl terminate kube2",
            "/usr/bin/machinectl poweroff kube1",
            "/opt/agent/bin/prepare-gpu %i",
        ] {
            assert!(!is_ours_command(theirs, &k), "{theirs}");
        }
    }

    #[test]
    fn override_migration_keeps_what_is_not_ours() {
        let text = "\
# set up by gpu-agent 1.4
[Unit]
StartLimitIntervalSec=0
After=network-online.target

[Service]
Environment=SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 HTTP_PROXY=http://proxy:3128
Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=network
ExecStartPre=
ExecStartPre=-/usr/bin/machinectl terminate kube1
ExecStartPost=/opt/agent/bin/warmup \\
  --fast %i
DeviceAllow=/dev/nvidia0 rwm
DeviceAllow=/dev/fuse rwm
Restart=on-failure
TimeoutSec=10min
LimitNOFILE=1048576
";
        let mig = migrate_override(text, &m("kube1"));
        assert_eq!(
            mig.rewrite,
            Some(Some(
                "\
# nspawn-lifecycle-helper install moved the settings it manages from this file into 50-nspawn-lifecycle.conf;
# what is left here is not managed by it.

# set up by gpu-agent 1.4
[Unit]
After=network-online.target

[Service]
Environment=HTTP_PROXY=http://proxy:3128
ExecStartPost=/opt/agent/bin/warmup \\
  --fast %i
DeviceAllow=/dev/fuse rwm
TimeoutStopSec=10min
LimitNOFILE=1048576
"
                .to_owned()
            ))
        );
        assert_eq!(
            mig.removed,
            [
                "StartLimitIntervalSec=0",
                "Environment=SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 HTTP_PROXY=http://proxy:3128",
                "Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=network",
                "ExecStartPre=",
                "ExecStartPre=-/usr/bin/machinectl terminate kube1",
                "DeviceAllow=/dev/nvidia0 rwm",
                "Restart=on-failure",
                "TimeoutSec=10min",
            ]
        );
        // A second pass over the rewritten file finds nothing of ours.
        let again = migrate_override(mig.rewrite.as_ref().unwrap().as_ref().unwrap(), &m("kube1"));
        assert_eq!(again.rewrite, None);
    }

    #[test]
    fn override_with_only_our_settings_is_removed_and_foreign_one_left() {
        let ours = "[Service]\nRestart=on-failure\nDeviceAllow=char-nvidia-frontend rwm\n";
        assert_eq!(migrate_override(ours, &m("k")).rewrite, Some(None));
        // An operator's deliberate override (what `systemctl edit` writes) is theirs to keep.
        let edit = "[Service]\nTimeoutStartSec=2h\nRestart=always\n";
        assert_eq!(migrate_override(edit, &m("k")).rewrite, None);
        let theirs = "[Service]\nLimitNOFILE=1048576\n";
        let mig = migrate_override(theirs, &m("k"));
        assert_eq!(mig.rewrite, None);
    }

    #[test]
    fn foreign_nspawn_files_are_checked_for_settings_pre_start_would_lose() {
        let text = "\
[Exec]
Boot=yes
PrivateUsers=no
[Files]
Bind=/dev/nvidia0
BindReadOnly=/usr/lib/x86_64-linux-gnu:/run/host-nvidia/0
BindReadOnly=/data/models:/models
Bind=/srv/cache
[Network]
Port=tcp:8080
";
        assert_eq!(
            foreign_nspawn_losses(text, &["Bind=/srv/cache".to_owned()]),
            ["BindReadOnly=/data/models:/models", "Port=tcp:8080"]
        );
    }
}
