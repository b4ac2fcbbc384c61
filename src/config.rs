//! The optional JSON configuration file (default `/etc/nspawn-lifecycle/config.json`).
//!
//! Everything has a default, so no file is needed. Unknown keys are errors (exit 2), so a typo
//! never silently falls back to a default.

use crate::error::bad_input;
use crate::fs::host::HostRoot;
use crate::types::gpus::PciAddress;
use crate::types::machine_name::MachineName;
use crate::types::paths::{HostPath, MachinePath, UnitName};
use anyhow::{Context as _, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

/// Where the config file is read from when `--config` is not given (under the host root).
pub(crate) const DEFAULT_PATH: &str = "/etc/nspawn-lifecycle/config.json";
/// Where `install` puts the helper so the hooks survive the installer going away.
pub const DEFAULT_HELPER_PATH: &str = "/usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper";

/// The file as written: `defaults` apply to every machine, `machines.<name>` override them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    #[serde(default)]
    helper_path: Option<String>,
    #[serde(default)]
    defaults: Settings,
    #[serde(default)]
    machines: BTreeMap<String, Settings>,
    /// Host mode: its settings alone, `defaults` are the machines'.
    #[serde(default)]
    host: Settings,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Settings {
    directory: Option<String>,
    mounts: Option<Vec<Mount>>,
    kubelet_unit: Option<String>,
    containerd_unit: Option<String>,
    staged_images_dir: Option<String>,
    ctr_path: Option<String>,
    ctr_namespace: Option<String>,
    cdi_dir: Option<String>,
    cdi_kind: Option<String>,
    lock_timeout_seconds: Option<u64>,
    boot_timeout_seconds: Option<u64>,
    job_timeout_seconds: Option<u64>,
    import_timeout_seconds: Option<u64>,
    import_max_images: Option<u64>,
    import_budget_seconds: Option<u64>,
    drop_capabilities: Option<Vec<String>>,
    /// Checked by hand, so that a wrong type is named by its key (serde's untagged enums say
    /// only "did not match any variant").
    gpus: Option<serde_json::Value>,
    require: Option<bool>,
    containerd_at_boot: Option<bool>,
    devices: Option<devices::DevicesSetting>,
}

pub use crate::types::gpus::{GpuSelector, Gpus};
pub use devices::{Devices, ExtraNode, installed_machines};
pub use mounts::DRIVER_ROOT;

/// `GPU-` and a UUID `8-4-4-4-12` hex digits, as `/proc/driver/nvidia/gpus/*/information` and
/// `nvidia-smi -L` print it; returned in lower case.
fn gpu_uuid(s: &str) -> Option<String> {
    let rest = s.strip_prefix("GPU-").or_else(|| s.strip_prefix("gpu-"))?;
    let groups: Vec<&str> = rest.split('-').collect();
    let ok = groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then(|| format!("GPU-{}", rest.to_ascii_lowercase()))
}

fn check_gpus(key: &str, setting: Option<&serde_json::Value>) -> Result<Gpus> {
    use serde_json::Value;
    let list = match setting {
        None => return Ok(Gpus::All),
        Some(Value::String(w)) if w == "all" => return Ok(Gpus::All),
        Some(Value::String(w)) if w == "none" => return Ok(Gpus::None),
        Some(Value::String(w)) => {
            return Err(bad_input(format!(
                "{key}.gpus: \"{}\" is neither \"all\", \"none\" nor a list of GPUs",
                w.escape_debug()
            )));
        }
        Some(Value::Array(l)) => l,
        Some(other) => {
            return Err(bad_input(format!(
                "{key}.gpus: {other} is neither \"all\", \"none\" nor a list of GPUs"
            )));
        }
    };
    if list.is_empty() {
        return Err(bad_input(format!(
            "{key}.gpus: an empty list; a machine without GPUs says \"none\""
        )));
    }
    let mut out: Vec<GpuSelector> = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let sel = match e {
            Value::Number(n) => GpuSelector::Index(
                n.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad_input(format!("{key}.gpus[{i}]: {n} is not a GPU index")))?,
            ),
            Value::String(s) => {
                if let Some(u) = gpu_uuid(s) {
                    GpuSelector::Uuid(u)
                } else if let Some(a) =
                    // lspci leaves the domain out: `06:00.0` is domain 0.
                    PciAddress::parse(s)
                        .or_else(|| PciAddress::parse(&format!("0:{s}")))
                {
                    GpuSelector::BusId(a.to_string())
                } else {
                    return Err(bad_input(format!(
                        "{key}.gpus[{i}]: \"{}\" is neither a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) \
                         nor a PCI bus id (0000:06:00.0); an index is a number",
                        s.escape_debug()
                    )));
                }
            }
            other => {
                return Err(bad_input(format!(
                    "{key}.gpus[{i}]: {other} is neither a GPU UUID, a PCI bus id nor an index"
                )));
            }
        };
        if out.contains(&sel) {
            return Err(bad_input(format!("{key}.gpus[{i}]: {sel} is listed twice")));
        }
        out.push(sel);
    }
    Ok(Gpus::List(out))
}

/// Two machines' `gpus` lists must not name the same GPU (exit 2, naming both machines and the
/// GPU). `key` maps a machine's entry to what identifies the GPU (the entry itself here; the
/// host GPU's UUID once resolved against discovery), `None` when it names no GPU. `all` and
/// `none` overlap nothing: `all` is the config saying, explicitly, that the machine shares.
pub(crate) fn check_lists_disjoint<K: Ord + Clone + fmt::Display>(
    machines: &[(String, Gpus)],
    key: impl Fn(&str, &GpuSelector) -> Option<K>,
) -> Result<()> {
    let mut seen: BTreeMap<K, (&str, &GpuSelector)> = BTreeMap::new();
    for (machine, gpus) in machines {
        let Gpus::List(list) = gpus else { continue };
        for sel in list {
            let Some(k) = key(machine, sel) else { continue };
            if let Some((other, other_sel)) = seen.get(&k)
                && *other != machine.as_str()
            {
                let same = if *other_sel == sel && k.to_string() == sel.to_string() {
                    String::new()
                } else {
                    format!(" ({other}: {other_sel}, {machine}: {sel})")
                };
                return Err(bad_input(format!(
                    "GPU {k} is assigned to both machines {other} and {machine}{same}: two machines \
                     never share a GPU; give it to one of them in \"gpus\" (or give a machine \"all\")"
                )));
            }
            seen.entry(k).or_insert((machine.as_str(), sel));
        }
    }
    Ok(())
}

/// Every place of the file that is a set of keys must be a JSON object: serde would read an array
/// there by position (`["/opt/evil/helper"]` as `helperPath`), skipping the unknown-key check.
fn check_objects(v: &serde_json::Value) -> Result<()> {
    use serde_json::Value;
    fn object<'a>(v: &'a Value, path: &str) -> Result<&'a serde_json::Map<String, Value>> {
        v.as_object().ok_or_else(|| {
            let found = match v {
                Value::Array(_) => "an array",
                Value::String(_) => "a string",
                Value::Number(_) => "a number",
                Value::Bool(_) => "a boolean",
                Value::Null => "null",
                Value::Object(_) => "an object",
            };
            bad_input(format!("{path}: want a JSON object, found {found}"))
        })
    }
    let settings = |v: &Value, path: &str| -> Result<()> {
        let s = object(v, path)?;
        if let Some(Value::Array(mounts)) = s.get("mounts") {
            for (i, m) in mounts.iter().enumerate() {
                object(m, &format!("{path}.mounts[{i}]"))?;
            }
        }
        Ok(())
    };
    let top = object(v, "the top level")?;
    for key in ["defaults", "host"] {
        if let Some(s) = top.get(key) {
            settings(s, key)?;
        }
    }
    if let Some(machines) = top.get("machines") {
        for (name, s) in object(machines, "machines")? {
            settings(s, &format!("machines.{name}"))?;
        }
    }
    Ok(())
}

/// An extra host directory or file bound into the machine.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Mount {
    /// Absolute host path; must exist.
    pub source: String,
    /// Absolute path inside the machine; defaults to `source`.
    #[serde(default)]
    pub target: Option<String>,
    /// Bind read-only (the default: a node's host mounts are data it consumes).
    #[serde(default = "yes")]
    pub read_only: bool,
}

fn yes() -> bool {
    true
}

/// A checked extra mount: what the `.nspawn` renderer is handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraMount {
    pub source: HostPath,
    /// `source` when the config gives no target.
    pub target: MachinePath,
    pub read_only: bool,
}

/// The settings for one machine, every default filled in and every value checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineConfig {
    /// The configuration file it came from ([`Config::source`]), for messages.
    pub config_file: String,
    /// The machine's rootfs directory on the host.
    pub directory: HostPath,
    /// Extra binds, `target` filled in.
    pub mounts: Vec<ExtraMount>,
    pub kubelet_unit: UnitName,
    pub containerd_unit: UnitName,
    /// Staged image tarballs, a path inside the machine.
    pub staged_images_dir: MachinePath,
    /// `ctr` inside the machine.
    pub ctr_path: MachinePath,
    pub ctr_namespace: CtrNamespace,
    /// Where the CDI spec is written, a path inside the machine.
    pub cdi_dir: MachinePath,
    /// CDI `kind` (`vendor/class`).
    pub cdi_kind: CdiKind,
    pub lock_timeout: Duration,
    /// How long post-start waits for the machine's manager to reach `running`/`degraded`.
    pub boot_timeout: Duration,
    /// How long each systemd job (stop/start of a unit, a transient unit) may take.
    pub job_timeout: Duration,
    /// How long one image import may take.
    pub import_timeout: Duration,
    /// Most staged tarballs one post-start imports; the rest wait for the next start.
    pub import_max_images: usize,
    /// How long all of one post-start's imports may take together.
    pub import_budget: Duration,
    /// Capabilities the machine's bounding set loses (`.nspawn` `DropCapability=`), in the
    /// config's order; empty by default (`Capability=all`).
    pub drop_capabilities: Vec<String>,
    /// Which GPUs the machine gets (`gpus`, default all).
    pub gpus: Gpus,
    /// `require`: a listed GPU missing on the host holds the start back (exit 3) instead of a
    /// start with the GPUs that are there.
    pub require: bool,
    /// `containerdAtBoot` (default true): pre-start releases containerd's gate for the boot
    /// ahead, so the machine's own boot starts containerd as a bare boot would, against the
    /// driver root pre-start has just built or checked. false: containerd waits for
    /// post-start's wiring too, as kubelet always does (the earlier order).
    pub containerd_at_boot: bool,
    /// `devices`: the host devices it gets beside its GPUs.
    pub devices: Devices,
}

/// The whole loaded configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, as the operator names it (`--config FILE`, or the default path).
    source: String,
    helper_path: HostPath,
    defaults: Settings,
    machines: BTreeMap<String, Settings>,
    host: Settings,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source: DEFAULT_PATH.to_owned(),
            helper_path: fixed(DEFAULT_HELPER_PATH),
            defaults: Settings::default(),
            machines: BTreeMap::new(),
            host: Settings::default(),
        }
    }
}

impl Config {
    /// Load `explicit` (must exist) or the default file under the host root (may be missing).
    pub fn load(host: &HostRoot, explicit: Option<&Path>) -> Result<Config> {
        // `--config` names a file of the operator's, as given; the default one is the host's.
        let (opened, path, required) = match explicit {
            Some(p) => (open_nonblocking(p), p.to_path_buf(), true),
            None => (host.open_read(DEFAULT_PATH), host.path(DEFAULT_PATH), false),
        };
        let text = match opened.and_then(read_small) {
            Ok(t) => t,
            // Only a file that is not there at all means "no configuration": a link to nothing
            // is a configuration that went missing, and a machine set to `gpus: "none"` must
            // never get every GPU because of it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                if let Ok(target) = host.read_link(DEFAULT_PATH) {
                    return Err(bad_input(format!(
                        "config file {} is a symbolic link to {}, which does not exist (remove the link to run with the defaults)",
                        path.display(),
                        target.display()
                    )));
                }
                return Ok(Config::default());
            }
            Err(e) => {
                return Err(bad_input(format!("config file {}: {e}", path.display())));
            }
        };
        let mut cfg =
            Config::parse(&text).with_context(|| format!("config file {}", path.display()))?;
        if let Some(p) = explicit {
            cfg.source = p.display().to_string();
        }
        Ok(cfg)
    }

    /// The file the configuration came from, for messages that tell where to change a setting.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Parse and check a config file's bytes (host-independent checks only).
    pub fn parse(bytes: &[u8]) -> Result<Config> {
        let value = strict_json::parse(bytes).map_err(bad_input)?;
        check_objects(&value)?;
        let file: File = serde_path_to_error::deserialize(value).map_err(|e| {
            let at = e.path().to_string();
            let why = strict_json::in_json_terms(&e.into_inner().to_string());
            bad_input(if at == "." {
                why
            } else {
                format!("{at}: {why}")
            })
        })?;
        for name in file.machines.keys() {
            name.parse::<MachineName>()
                .map_err(|e| bad_input(format!("machines.{name}: {e}")))?;
        }
        let helper_path = check_exec_path(
            "helperPath",
            file.helper_path.as_deref().unwrap_or(DEFAULT_HELPER_PATH),
        )?;
        let cfg = Config {
            source: DEFAULT_PATH.to_owned(),
            helper_path,
            defaults: file.defaults,
            machines: file.machines,
            host: file.host,
        };
        // Resolve every machine once so errors surface at load time, naming the key.
        cfg.settings_checked("defaults", &cfg.defaults)?;
        cfg.host()?;
        let mut lists = Vec::new();
        for (name, s) in &cfg.machines {
            let merged = cfg.defaults.clone().overlay(s.clone());
            let mc = cfg.settings_checked(&format!("machines.{name}"), &merged)?;
            lists.push((name.clone(), mc.gpus));
        }
        check_lists_disjoint(&lists, |_, sel| Some(sel.clone()))?;
        Ok(cfg)
    }

    /// `gpus` and `require` of every machine the config names, in name order.
    pub(crate) fn gpu_settings(&self) -> Result<Vec<(String, Gpus, bool)>> {
        let mut out = Vec::new();
        for (name, s) in &self.machines {
            let merged = self.defaults.clone().overlay(s.clone());
            let mc = self.settings_checked(&format!("machines.{name}"), &merged)?;
            out.push((name.clone(), mc.gpus, mc.require));
        }
        Ok(out)
    }

    /// The `gpus` of every machine the config names, and of `machine` (from `defaults`) when it
    /// names it not: what overlap checks compare `machine` against.
    pub(crate) fn gpu_assignments(&self, machine: &MachineName) -> Result<Vec<(String, Gpus)>> {
        let mut out = Vec::new();
        for (name, s) in &self.machines {
            let merged = self.defaults.clone().overlay(s.clone());
            let mc = self.settings_checked(&format!("machines.{name}"), &merged)?;
            out.push((name.clone(), mc.gpus));
        }
        if !self.machines.contains_key(machine.as_str()) {
            out.push((
                machine.to_string(),
                self.settings_checked("defaults", &self.defaults)?.gpus,
            ));
        }
        Ok(out)
    }

    /// Stable path of the installed helper.
    pub fn helper_path(&self) -> &HostPath {
        &self.helper_path
    }

    /// Settings for host mode: the `host` section over the built-in defaults (the
    /// config's `defaults` are the machines'). Keys that only mean something for a machine
    /// (its rootfs, binds, capabilities, share of the GPUs) are refused, naming the key: the
    /// host has every GPU and is its own root.
    pub fn host(&self) -> Result<MachineConfig> {
        let h = &self.host;
        for (set, key) in [
            (h.directory.is_some(), "directory"),
            (h.mounts.is_some(), "mounts"),
            (h.drop_capabilities.is_some(), "dropCapabilities"),
            (h.gpus.is_some(), "gpus"),
            (h.require.is_some(), "require"),
            (h.containerd_at_boot.is_some(), "containerdAtBoot"),
            (h.devices.is_some(), "devices"),
            (h.boot_timeout_seconds.is_some(), "bootTimeoutSeconds"),
        ] {
            if set {
                return Err(bad_input(format!(
                    "host.{key}: a machine setting; host mode works on the host itself, with \
                     every GPU it has"
                )));
            }
        }
        self.settings_checked("host", h)
    }

    /// Settings for `machine`, checking that extra mount sources exist on the host.
    pub fn machine(&self, host: &HostRoot, machine: &MachineName) -> Result<MachineConfig> {
        let (key, settings) = match self.machines.get(machine.as_str()) {
            Some(s) => (
                format!("machines.{machine}"),
                self.defaults.clone().overlay(s.clone()),
            ),
            None => ("defaults".to_owned(), self.defaults.clone()),
        };
        let in_file = |e: anyhow::Error| e.context(format!("config file {}", self.source));
        let mut mc = self.settings_checked(&key, &settings).map_err(in_file)?;
        if settings.directory.is_none() {
            mc.directory = format!("/var/lib/machines/{machine}")
                .try_into()
                .map_err(|e| in_file(bad_input(format!("{key}.directory: {e}"))))?;
        }
        devices::check_on_host(&mut mc.devices, host).map_err(in_file)?;
        self.check_disks_disjoint(host, machine, &mc)
            .map_err(in_file)?;
        let others = installed_machines(host)?
            .into_iter()
            .map(|m| m.to_string())
            .chain(self.machines.keys().cloned())
            .any(|m| m != machine.as_str());
        mc.devices.sole_machine = !others;
        for (i, m) in mc.mounts.iter().enumerate() {
            if host.symlink_metadata(&m.source).is_err() {
                return Err(in_file(bad_input(format!(
                    "{key}.mounts[{i}].source: \"{}\" does not exist on the host",
                    m.source
                ))));
            }
        }
        Ok(mc)
    }

    fn settings_checked(&self, key: &str, s: &Settings) -> Result<MachineConfig> {
        let field = |name: &str| format!("{key}.{name}");
        let mc = MachineConfig {
            config_file: self.source.clone(),
            // Without a directory key, `machine` fills in /var/lib/machines/<machine>.
            directory: checked_or(&field("directory"), &s.directory, "/var/lib/machines")?,
            mounts: mounts::checked_mounts(key, s.mounts.as_deref().unwrap_or_default())?,
            kubelet_unit: checked_or(&field("kubeletUnit"), &s.kubelet_unit, "kubelet.service")?,
            containerd_unit: checked_or(
                &field("containerdUnit"),
                &s.containerd_unit,
                "containerd.service",
            )?,
            staged_images_dir: checked_or(
                &field("stagedImagesDir"),
                &s.staged_images_dir,
                "/var/lib/nspawn-lifecycle/images",
            )?,
            ctr_path: checked_or(&field("ctrPath"), &s.ctr_path, "/usr/bin/ctr")?,
            ctr_namespace: checked_or(&field("ctrNamespace"), &s.ctr_namespace, "k8s.io")?,
            cdi_dir: checked_or(&field("cdiDir"), &s.cdi_dir, "/var/run/cdi")?,
            cdi_kind: checked_or(&field("cdiKind"), &s.cdi_kind, "nvidia.com/gpu")?,
            lock_timeout: seconds(&field("lockTimeoutSeconds"), s.lock_timeout_seconds, 120)?,
            boot_timeout: seconds(&field("bootTimeoutSeconds"), s.boot_timeout_seconds, 60)?,
            job_timeout: seconds(&field("jobTimeoutSeconds"), s.job_timeout_seconds, 90)?,
            import_timeout: seconds(
                &field("importTimeoutSeconds"),
                s.import_timeout_seconds,
                300,
            )?,
            // 0 is allowed: staged tarballs are then left alone (and reported) at every start.
            import_max_images: usize::try_from(s.import_max_images.unwrap_or(20))
                .unwrap_or(usize::MAX),
            import_budget: seconds(&field("importBudgetSeconds"), s.import_budget_seconds, 600)?,
            drop_capabilities: check_capabilities(key, s.drop_capabilities.as_deref())?,
            gpus: check_gpus(key, s.gpus.as_ref())?,
            require: s.require.unwrap_or(false),
            containerd_at_boot: s.containerd_at_boot.unwrap_or(true),
            devices: devices::check(key, s.devices.as_ref())?,
        };
        check_start_fits(key, &mc)?;
        mounts::check_mount_targets(key, &mc)?;
        Ok(mc)
    }
}

/// The setting `key` as a checked value of its type (`value`, or `default` when unset), or a
/// bad-input error naming the key and the value.
fn checked_or<T: std::str::FromStr<Err = String>>(
    key: &str,
    value: &Option<String>,
    default: &str,
) -> Result<T> {
    checked_path(key, value.as_deref().unwrap_or(default))
}

/// A timeout in whole seconds (`value`, or `default` when unset); 0 is refused, naming `key`.
fn seconds(key: &str, value: Option<u64>, default: u64) -> Result<Duration> {
    match value.unwrap_or(default) {
        0 => Err(bad_input(format!("{key}: must be at least 1"))),
        n => Ok(Duration::from_secs(n)),
    }
}

/// A checked string setting: the type, its `as_str`, and what lets it stand where a `&str` did.
macro_rules! checked_string {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

checked_string!(
    /// A containerd namespace (`ctrNamespace`): ASCII letters, digits and `._-`, not empty.
    CtrNamespace
);

impl std::str::FromStr for CtrNamespace {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            Ok(CtrNamespace(s.to_owned()))
        } else {
            Err(format!(
                "\"{}\" is not a containerd namespace",
                s.escape_debug()
            ))
        }
    }
}

checked_string!(
    /// A CDI `vendor/class` (`cdiKind`), restricted to what every CDI parser accepts (no dot in
    /// the class, which CDI 0.5.x rejects).
    CdiKind
);

impl std::str::FromStr for CdiKind {
    type Err = String;

    fn from_str(kind: &str) -> std::result::Result<Self, String> {
        let ok = |s: &str, inner: &str| {
            let b = s.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphabetic()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || inner.contains(c))
        };
        match kind.split_once('/') {
            Some((vendor, class)) if ok(vendor, "_.-") && ok(class, "_-") => {
                Ok(CdiKind(kind.to_owned()))
            }
            _ => Err(format!(
                "\"{}\" is not a CDI kind like \"nvidia.com/gpu\"",
                kind.escape_debug()
            )),
        }
    }
}

/// Largest config file read: a real one is a few hundred bytes per machine.
pub(crate) const MAX_CONFIG_FILE: u64 = 1 << 20;

/// Open `path` for reading, non-blocking, so a FIFO in its place is refused by [`read_small`]
/// instead of waiting for a writer forever.
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// The bytes of a regular file of at most [`MAX_CONFIG_FILE`] bytes, opened non-blocking.
fn read_small(f: std::fs::File) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read as _};
    if !f.metadata()?.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut buf = Vec::new();
    f.take(MAX_CONFIG_FILE + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_CONFIG_FILE {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("larger than {MAX_CONFIG_FILE} bytes"),
        ));
    }
    Ok(buf)
}

impl Settings {
    /// `self` with every field `other` sets replaced.
    fn overlay(self, other: Settings) -> Settings {
        Settings {
            directory: other.directory.or(self.directory),
            mounts: other.mounts.or(self.mounts),
            kubelet_unit: other.kubelet_unit.or(self.kubelet_unit),
            containerd_unit: other.containerd_unit.or(self.containerd_unit),
            staged_images_dir: other.staged_images_dir.or(self.staged_images_dir),
            ctr_path: other.ctr_path.or(self.ctr_path),
            ctr_namespace: other.ctr_namespace.or(self.ctr_namespace),
            cdi_dir: other.cdi_dir.or(self.cdi_dir),
            cdi_kind: other.cdi_kind.or(self.cdi_kind),
            lock_timeout_seconds: other.lock_timeout_seconds.or(self.lock_timeout_seconds),
            boot_timeout_seconds: other.boot_timeout_seconds.or(self.boot_timeout_seconds),
            job_timeout_seconds: other.job_timeout_seconds.or(self.job_timeout_seconds),
            import_timeout_seconds: other.import_timeout_seconds.or(self.import_timeout_seconds),
            import_max_images: other.import_max_images.or(self.import_max_images),
            import_budget_seconds: other.import_budget_seconds.or(self.import_budget_seconds),
            drop_capabilities: other.drop_capabilities.or(self.drop_capabilities),
            gpus: other.gpus.or(self.gpus),
            require: other.require.or(self.require),
            containerd_at_boot: other.containerd_at_boot.or(self.containerd_at_boot),
            devices: match (self.devices, other.devices) {
                (Some(a), Some(b)) => Some(a.overlay(b)),
                (a, b) => b.or(a),
            },
        }
    }
}

/// `p` as a checked [`HostPath`] or [`MachinePath`] (see [`crate::types::paths`] for what a rendered
/// file can carry), or a bad-input error naming `key` and the value.
pub(crate) fn checked_path<P: std::str::FromStr<Err = String>>(key: &str, p: &str) -> Result<P> {
    p.parse().map_err(|e| bad_input(format!("{key}: {e}")))
}

/// A path the drop-in's `ExecStartPre=`/`ExecStartPost=` lines carry as their first word: on top
/// of [`checked_path`], none of the whitespace, quotes or backslashes that systemd's command-line
/// parser would split at or unescape.
fn check_exec_path(key: &str, p: &str) -> Result<HostPath> {
    let path: HostPath = checked_path(key, p)?;
    if let Some(c) = p
        .chars()
        .find(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '\\'))
    {
        return Err(bad_input(format!(
            "{key}: \"{}\" contains {c:?}, which an Exec line of the drop-in cannot carry",
            p.escape_debug()
        )));
    }
    Ok(path)
}

/// A compile-time path, valid by construction.
fn fixed(p: &'static str) -> HostPath {
    p.parse()
        .unwrap_or_else(|e| unreachable!("constant path {p}: {e}"))
}

/// `dropCapabilities`: Linux capability names as `CAP_…` in upper case, each once.
fn check_capabilities(key: &str, caps: Option<&[String]>) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for (i, c) in caps.unwrap_or_default().iter().enumerate() {
        if !crate::types::capabilities::CAPABILITIES.contains(&c.as_str()) {
            return Err(bad_input(format!(
                "{key}.dropCapabilities[{i}]: \"{}\" is not a Linux capability name \
                 (CAP_CHOWN … CAP_CHECKPOINT_RESTORE, upper case, as in capabilities(7))",
                c.escape_debug()
            )));
        }
        if out.contains(c) {
            return Err(bad_input(format!(
                "{key}.dropCapabilities[{i}]: \"{c}\" is listed twice"
            )));
        }
        out.push(c.clone());
    }
    Ok(out)
}

mod devices;
mod mounts;
mod settings;
mod start;
mod strict_json;
use start::check_start_fits;
pub use start::{START_TIMEOUT, START_TIMEOUT_TEXT};

pub use settings::{SETTINGS, SettingDoc};

#[cfg(test)]
mod tests;
