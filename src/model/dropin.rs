//! Our drop-in for `systemd-nspawn@<machine>.service` as a typed value (docs/wiring.md shows it
//! whole), and just enough unit-file syntax to read the drop-ins and `.nspawn` files other tools left beside it.
//!
//! `Display` renders the exact bytes, pinned by `tests/golden/dropin-kube1.conf`. install writes
//! it, uninstall removes it, and the legacy migration (`legacy.rs`) classifies other files'
//! lines against what it sets.

use crate::config::Gpus;
use crate::types::machine_name::MachineName;
use crate::types::paths::HostPath;
use crate::types::units::nspawn_path;
use std::fmt;

/// First line of our drop-in; `uninstall` only removes a drop-in that starts with it.
/// The words after the helper in the drop-in's `ExecStartPost=` (then the machine, `%i`):
/// `status` finds post-start's last run among the unit's commands by them.
pub(crate) const POST_START_ARGS: &str = "nspawn-lifecycle post-start";

pub(crate) const DROPIN_HEADER: &str = "# Written by nspawn-lifecycle-helper install for machine";

/// Seconds between a failed start and the next attempt. `StartLimitIntervalSec=0` already turns
/// the start rate limit off; 5 s also keeps a retry loop below systemd's default limit (5 starts
/// in 10 s) should a later drop-in turn it back on, while a node still comes up seconds after
/// its driver install finishes.
pub(crate) const RESTART_SEC: u32 = 5;
/// Upper bound on one start: each ExecStartPre=, the boot until READY=1, each ExecStartPost=.
/// post-start bounds every step itself (boot wait 60 s, four unit jobs of 90 s, 300 s per staged
/// image import, by default); systemd's default 90 s would kill it in the middle of an import and
/// restart the whole machine, forever. 30 min fits the defaults with about six slow imports and
/// still turns a hook that hangs into a retry.
/// (The configuration refuses a machine whose worst start does not fit: `config::START_TIMEOUT`.)
pub(crate) const TIMEOUT_START: &str = crate::config::START_TIMEOUT_TEXT;
/// NVIDIA host daemons whose sockets pre-start binds into the machine; ordering after them (a
/// no-op when they are not installed) keeps a boot-time start from missing their sockets.
pub(crate) const AFTER: &str = "nvidia-persistenced.service nvidia-fabricmanager.service";
/// The environment nspawn needs for a Kubernetes node inside.
pub const ENV: [(&str, &str); 2] = [
    ("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1"),
    ("SYSTEMD_NSPAWN_API_VFS_WRITABLE", "network"),
];

/// One setting of the drop-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub section: &'static str,
    pub key: &'static str,
    pub value: String,
    /// Comment written above the line: why it is there.
    pub why: Option<&'static str>,
}

/// Our drop-in for `systemd-nspawn@<machine>.service` (docs/wiring.md shows it whole); `Display`
/// renders the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropin {
    pub machine: MachineName,
    /// Absolute path of the installed helper, as the hooks call it (checked by the config for
    /// what an Exec line can carry; `%` and `$` are escaped when rendered).
    pub helper_path: HostPath,
    /// The config's `gpus` is `all`: the device cgroup allows every NVIDIA and DRM group.
    /// Otherwise pre-start sets the machine's own nodes at every start (src/model/device_cgroup.rs).
    pub all_gpus: bool,
}

impl Dropin {
    pub fn new(machine: &MachineName, helper_path: &HostPath) -> Dropin {
        Dropin {
            machine: machine.clone(),
            helper_path: helper_path.clone(),
            all_gpus: true,
        }
    }

    /// The machine's drop-in as `install` writes it now ([`Dropin::for_gpus`]), part of its
    /// desired state: the next start runs the hooks and device groups the file on disk names.
    /// A missing one is an uninstalled machine, judged apart.
    pub(crate) fn unit_file(
        machine: &MachineName,
        helper_path: &HostPath,
        gpus: &Gpus,
    ) -> crate::model::UnitFile {
        crate::model::UnitFile {
            path: crate::types::units::dropin_path(machine),
            text: Dropin::for_gpus(machine, helper_path, gpus).to_string(),
            required: false,
            by: "install",
        }
    }

    /// The drop-in for a machine with the config's `gpus`.
    pub(crate) fn for_gpus(machine: &MachineName, helper_path: &HostPath, gpus: &Gpus) -> Dropin {
        Dropin {
            all_gpus: *gpus == Gpus::All,
            ..Dropin::new(machine, helper_path)
        }
    }

    /// The settings in file order: how systemd retries and times the unit, our two hooks, and
    /// the device cgroup.
    pub fn settings(&self) -> Vec<Setting> {
        let mut out = Self::retry_and_timeout();
        if self.all_gpus {
            out.insert(
                2,
                setting(
                    "Unit",
                    "Wants",
                    "nspawn-lifecycle-devices@%i.path".into(),
                    Some(
                        "MIG capabilities and IMEX channels the host makes while the machine runs get\n\
                         their /dev/char links in it (refresh-devices).",
                    ),
                ),
            );
        }
        out.extend(self.hooks());
        out.extend(self.device_allow());
        out
    }

    /// `[Unit]` start limit and ordering, `[Service]` restart and start timeout, environment.
    fn retry_and_timeout() -> Vec<Setting> {
        let mut out = vec![
            setting(
                "Unit",
                "StartLimitIntervalSec",
                "0".into(),
                Some(
                    "Keep retrying a start that fails (pre-start refuses while the NVIDIA driver install\n\
                     is incomplete) instead of giving up after 5 starts in 10s.",
                ),
            ),
            setting(
                "Unit",
                "After",
                AFTER.into(),
                Some("So a start at boot finds the NVIDIA daemons' sockets; a no-op without them."),
            ),
            setting("Service", "Restart", "on-failure".into(), None),
            setting(
                "Service",
                "RestartSec",
                RESTART_SEC.to_string(),
                Some("Also below the default start limit if a later drop-in turns it back on."),
            ),
            setting(
                "Service",
                "TimeoutStartSec",
                TIMEOUT_START.into(),
                Some(
                    "post-start stops kubelet and containerd, rewires and imports staged images, each\n\
                     step with its own deadline; the default 90s would kill it mid-import.",
                ),
            ),
        ];
        for (name, value) in ENV {
            out.push(setting(
                "Service",
                "Environment",
                format!("{name}={value}"),
                None,
            ));
        }
        out
    }

    /// The stale-registration cleanup and our `ExecStartPre=`/`ExecStartPost=` hooks.
    fn hooks(&self) -> Vec<Setting> {
        let helper = exec_escape(&self.helper_path);
        vec![
            setting(
                "Service",
                "ExecStartPre",
                format!("-/usr/bin/machinectl terminate {}", self.machine),
                Some("Clear a registration left by a machine that died without unregistering."),
            ),
            setting(
                "Service",
                "ExecStartPre",
                format!("{helper} nspawn-lifecycle pre-start %i"),
                None,
            ),
            setting(
                "Service",
                "ExecStartPost",
                format!("{helper} {POST_START_ARGS} %i"),
                None,
            ),
        ]
    }

    /// `DeviceAllow=`: every NVIDIA and DRM node by device group for an `all` machine; for any
    /// other, only `/dev/kvm` (pre-start sets the machine's own nodes at runtime).
    fn device_allow(&self) -> Vec<Setting> {
        let kvm = |why| setting("Service", "DeviceAllow", "/dev/kvm rwm".into(), why);
        if !self.all_gpus {
            return vec![kvm(Some(
                "Not every GPU is this machine's (the config's gpus): pre-start sets its own NVIDIA\n\
                 and DRM nodes at every start as runtime DeviceAllow=/dev/char/<major>:<minor>\n\
                 entries, so no device group here may allow them all.",
            ))];
        }
        vec![
            setting(
                "Service",
                "DeviceAllow",
                ALL_GPUS_DEVICE_ALLOW.into(),
                Some(
                    "Device groups resolve from /proc/devices when the unit starts and cover every GPU,\n\
                     MIG capability and DRM node, whatever their numbers are today.",
                ),
            ),
            setting("Service", "DeviceAllow", "char-drm rwm".into(), None),
            kvm(None),
        ]
    }
}

fn setting(
    section: &'static str,
    key: &'static str,
    value: String,
    why: Option<&'static str>,
) -> Setting {
    Setting {
        section,
        key,
        value,
        why,
    }
}

impl fmt::Display for Dropin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{DROPIN_HEADER} {}; install rewrites it, uninstall removes it.",
            self.machine
        )?;
        writeln!(
            f,
            "# Local changes belong in a drop-in that sorts after this one (e.g. override.conf)."
        )?;
        writeln!(
            f,
            "# Per-start host state is not here: pre-start renders {} at every start.",
            nspawn_path(&self.machine)
        )?;
        let mut section = "";
        for s in self.settings() {
            if s.section != section {
                write!(f, "\n[{}]\n", s.section)?;
                section = s.section;
            }
            if let Some(why) = s.why {
                for line in why.lines() {
                    writeln!(f, "# {line}")?;
                }
            }
            writeln!(f, "{}={}", s.key, s.value)?;
        }
        Ok(())
    }
}

/// The `DeviceAllow=` value that allows every NVIDIA node: only an `all` machine's drop-in has it.
pub(crate) const ALL_GPUS_DEVICE_ALLOW: &str = "char-nvidia* rwm";

/// Whether the drop-in `text` allows every NVIDIA node, read with the unit-file reader as
/// systemd would (`[Service]`, continuations, comments), not by matching a line.
pub(crate) fn allows_all_gpus(text: &str) -> bool {
    section_settings(&parse_unit(text)).any(|s| {
        s.section == "Service" && s.key == "DeviceAllow" && s.value == ALL_GPUS_DEVICE_ALLOW
    })
}

/// A path as a word of an `Exec*=` line: `%` starts a specifier and `$` a variable there.
pub(crate) fn exec_escape(path: &str) -> String {
    path.replace('%', "%%").replace('$', "$$")
}

// ---------------------------------------------------------------------------------------------
// Unit-file syntax (also `.nspawn` files): just enough to classify and rewrite lines.

/// One logical line of a unit file; continuation lines are joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnitLine {
    /// The physical lines as written, without the final newline.
    pub raw: String,
    pub kind: LineKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LineKind {
    /// Blank, comment, or something systemd would ignore with a warning.
    Other,
    Section(String),
    Setting {
        key: String,
        value: String,
    },
}

pub(crate) fn parse_unit(text: &str) -> Vec<UnitLine> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(first) = lines.next() {
        let mut raw = first.to_owned();
        let trimmed = first.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            out.push(UnitLine {
                raw,
                kind: LineKind::Other,
            });
            continue;
        }
        if trimmed.starts_with('[') && trimmed.ends_with(']') {
            out.push(UnitLine {
                raw,
                kind: LineKind::Section(trimmed[1..trimmed.len() - 1].to_owned()),
            });
            continue;
        }
        // A trailing backslash continues the line; comment lines inside are skipped by systemd.
        let mut logical = trimmed.to_owned();
        while logical.ends_with('\\') {
            logical.pop();
            let Some(next) = lines.next() else { break };
            raw.push('\n');
            raw.push_str(next);
            let t = next.trim();
            if t.starts_with('#') || t.starts_with(';') {
                logical.push('\\');
                continue;
            }
            logical.push(' ');
            logical.push_str(t);
        }
        let kind = match logical.split_once('=') {
            Some((k, v)) => LineKind::Setting {
                key: k.trim().to_owned(),
                value: v.trim().to_owned(),
            },
            None => LineKind::Other,
        };
        out.push(UnitLine { raw, kind });
    }
    out
}

/// Each line with the section it is in (`""` before the first section header).
pub(crate) fn with_sections(lines: &[UnitLine]) -> impl Iterator<Item = (&str, &UnitLine)> {
    let mut section = "";
    lines.iter().map(move |l| {
        if let LineKind::Section(s) = &l.kind {
            section = s;
        }
        (section, l)
    })
}

/// One setting of a unit file, in its section, borrowed from the parsed lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SectionSetting<'a> {
    pub section: &'a str,
    pub key: &'a str,
    pub value: &'a str,
    /// The physical lines as written.
    pub raw: &'a str,
}

/// The settings among `lines`, each with its section.
pub(crate) fn section_settings(lines: &[UnitLine]) -> impl Iterator<Item = SectionSetting<'_>> {
    with_sections(lines).filter_map(|(section, l)| match &l.kind {
        LineKind::Setting { key, value } => Some(SectionSetting {
            section,
            key,
            value,
            raw: &l.raw,
        }),
        _ => None,
    })
}

/// The whitespace-separated words of an `Environment=` value, quotes kept.
pub(crate) fn env_words(value: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let mut start = None;
    let mut quote = None;
    let mut escaped = false;
    for (i, c) in value.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match (c, quote) {
            ('\\', _) => escaped = true,
            ('"' | '\'', None) => {
                quote = Some(c);
                start.get_or_insert(i);
            }
            (c, Some(q)) if c == q => quote = None,
            (c, None) if c.is_whitespace() => {
                if let Some(s) = start.take() {
                    words.push(&value[s..i]);
                }
            }
            _ => {
                start.get_or_insert(i);
            }
        }
    }
    if let Some(s) = start {
        words.push(&value[s..]);
    }
    words
}

/// The variable an `Environment=` word assigns.
pub(crate) fn env_name(word: &str) -> &str {
    let w = word.trim_start_matches(['"', '\'']);
    w.split_once('=').map_or(w, |(n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> MachineName {
        s.parse().unwrap()
    }

    #[test]
    fn helper_path_is_escaped_for_exec_lines() {
        let d = Dropin::new(&m("kube1"), &"/opt/50%/$x/helper".parse().unwrap());
        let text = d.to_string();
        assert!(
            text.contains("ExecStartPre=/opt/50%%/$$x/helper nspawn-lifecycle pre-start %i\n"),
            "{text}"
        );
    }

    #[test]
    fn dropin_sections_hold_their_keys() {
        let d = Dropin::new(
            &m("kube1"),
            &crate::config::DEFAULT_HELPER_PATH.parse().unwrap(),
        );
        for s in d.settings() {
            let want = if matches!(s.key, "StartLimitIntervalSec" | "After" | "Wants") {
                "Unit"
            } else {
                "Service"
            };
            assert_eq!(s.section, want, "{}", s.key);
        }
    }

    #[test]
    fn unit_lines_join_continuations_and_keep_what_was_written() {
        let text =
            "# c\n[Service]\n ExecStartPost = /bin/a\\\n; skipped\n  --b %i\nnot a setting\n";
        let lines = parse_unit(text);
        let kinds: Vec<_> = lines.iter().map(|l| l.kind.clone()).collect();
        assert_eq!(
            kinds,
            [
                LineKind::Other,
                LineKind::Section("Service".into()),
                LineKind::Setting {
                    key: "ExecStartPost".into(),
                    value: "/bin/a --b %i".into(),
                },
                LineKind::Other,
            ]
        );
        // Rewriting keeps the physical lines, comments inside a continuation included.
        assert_eq!(
            lines[2].raw,
            " ExecStartPost = /bin/a\\\n; skipped\n  --b %i"
        );
    }

    #[test]
    fn env_words_respect_quotes() {
        assert_eq!(
            env_words(r#"A=1 "B=two words" C='x y'  D=\"q"#),
            vec!["A=1", "\"B=two words\"", "C='x y'", "D=\\\"q"]
        );
        assert_eq!(env_name("\"B=two words\""), "B");
    }
}
