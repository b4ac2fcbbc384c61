//! The CDI spec written inside the machine, so containerd or podman there can hand GPUs to pods.
//!
//! Pure functions: [`spec`] builds the spec from an [`Inventory`], [`render`] gives its bytes,
//! [`conflicts`] judges another spec file found in a CDI directory. Writing and removing files is
//! the post-start step's business.
//!
//! What the spec holds, and why:
//! - Devices `"<index>"` and `"<GPU UUID>"` per GPU (what the NVIDIA device plugin asks for) and
//!   `"all"`, each with `/dev/nvidia<minor>` and that GPU's `/dev/dri` nodes.
//! - Spec-level edits, applied once whenever any of our devices is injected: the control nodes
//!   (`nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset`, those present), the driver
//!   files at their standard paths, `NVIDIA_VISIBLE_DEVICES=void` and `NVIDIA_CTK_LIBCUDA_DIR`.
//! - MIG capability nodes (`/dev/nvidia-caps/*`) and IMEX channels are **not** in this kind.
//!   `nvidia-ctk cdi generate` (nvml mode) gives a full GPU only `/dev/nvidia<N>` and its DRM
//!   nodes; caps belong to MIG devices (which we do not enumerate: that needs NVML) or to its
//!   `mig-caps` devices, and IMEX channels to their own kind (`nvidia.com/imex-channel`, its
//!   `--mode=imex`). Only the management spec (`management.nvidia.com/gpu`) puts them in `all`.
//!   Handing every pod that asks for one GPU the MIG config/monitor capabilities and every IMEX
//!   channel would widen what a pod can reach, so we do the same as `nvidia-ctk`. The nodes are
//!   still bound into the machine, so a DRA driver there can publish its own spec for them.
//! - No hooks: the machine has no `nvidia-cdi-hook`. Instead each library is also mounted at its
//!   SONAME path (`libcuda.so.1`), so `dlopen("libcuda.so.1")` works without `ldconfig` in the
//!   container.
//! - Only fields that CDI 0.5.2 (Debian 12's podman 4.3) knows: its strict parser rejects
//!   `annotations`, `additionalGids`, `intelRdt` and `netDevices`. The types below cannot even
//!   hold them.

use crate::discovery::{DeviceNode as HostNode, DeviceRole, Inventory};
use crate::layout::{self, EntryKind};
use serde::Serialize;
use std::collections::BTreeSet;

/// The kind written when the config does not say otherwise.
pub const DEFAULT_KIND: &str = "nvidia.com/gpu";
/// [`spec_file_name`] of [`DEFAULT_KIND`].
pub const DEFAULT_SPEC_FILE: &str = "nvidia.com-gpu.json";

/// Options for driver files: read-only, and no setuid or device files through them.
const FILE_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];
/// Options for IPC sockets: no `ro`, as in libnvidia-container and `nvidia-ctk` since
/// NVIDIA/nvidia-container-toolkit#1593, because a nested runtime in the container (enroot) that
/// binds the socket again cannot do so from a read-only mount.
const SOCKET_OPTIONS: [&str; 5] = ["nosuid", "nodev", "rbind", "rprivate", "noexec"];

/// A CDI spec; field names and order as in the CDI `specs-go` package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The lowest version the content needs, see [`minimum_version`].
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
    #[serde(skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One device a runtime can be asked for as `<kind>=<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    /// Always written: CDI requires the key on a device, and non-empty edits.
    pub container_edits: ContainerEdits,
}

/// Changes a runtime makes to the container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty() && self.mounts.is_empty()
    }
}

/// A device node, fully described.
///
/// `path` is the real node (the machine binds each host node at its host path), never a symlink,
/// and `type`, `major` and `minor` are always given. With all three CDI injects the node as
/// written and never stats it: the Go library `lstat`s `hostPath` otherwise and calls a symlink
/// "not a device node", v0.5.2 asks runc to do the same, the Rust library `stat`s it, and a node
/// replaced between this start and a pod start would be read wrong. `type`/`major`/`minor` exist
/// since CDI 0.3.0, so they do not raise the version; `hostPath` (0.5.0) is left out because it
/// would only repeat `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceNode {
    pub path: String,
    /// Always `c`: every NVIDIA and DRM node is a character device.
    #[serde(rename = "type")]
    pub kind: String,
    pub major: i64,
    pub minor: i64,
}

/// A bind mount into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Path where containerd runs, i.e. inside the machine (in the driver root `/run/nvidia/driver`).
    pub host_path: String,
    pub container_path: String,
    pub options: Vec<String>,
}

/// `vendor-class.json`, the name `GenerateSpecName` of the CDI library gives a kind.
pub fn spec_file_name(kind: &str) -> String {
    format!("{}.json", kind.replacen('/', "-", 1))
}

/// The spec for this host under `kind` (as checked by the config), or `None` when there is
/// nothing to hand out: the driver is not complete, or no GPU has its `/dev/nvidia<minor>` node.
///
/// A GPU whose `/dev/nvidia<minor>` is not a known GPU node gets no device; a `/dev/dri` node
/// discovery did not record is left out (it would have no major/minor). A UUID that is not a
/// valid CDI device name is skipped; the index name still works.
pub fn spec(inv: &Inventory, kind: &str) -> Option<Spec> {
    let driver = inv.complete_driver()?;
    let node = |path: &str, role: DeviceRole| {
        inv.devices
            .iter()
            .find(|d| d.path == path && d.role == role)
            .map(cdi_node)
    };

    let mut gpus: Vec<_> = inv.gpus.iter().collect();
    gpus.sort_by_key(|g| g.index);
    let mut devices = Vec::new();
    let mut names = BTreeSet::from(["all".to_owned()]);
    let mut all_nodes: Vec<DeviceNode> = Vec::new();
    for gpu in gpus {
        let Some(main) = gpu.device.as_deref().and_then(|p| node(p, DeviceRole::Gpu)) else {
            continue;
        };
        let mut nodes = vec![main];
        nodes.extend(gpu.dri.iter().filter_map(|p| node(p, DeviceRole::Dri)));
        for name in [gpu.index.to_string(), gpu.uuid.clone()] {
            if valid_device_name(&name) && names.insert(name.clone()) {
                devices.push(Device {
                    name,
                    container_edits: ContainerEdits {
                        device_nodes: nodes.clone(),
                        ..ContainerEdits::default()
                    },
                });
            }
        }
        for n in nodes {
            if !all_nodes.contains(&n) {
                all_nodes.push(n);
            }
        }
    }
    if all_nodes.is_empty() {
        return None;
    }
    devices.push(Device {
        name: "all".into(),
        container_edits: ContainerEdits {
            device_nodes: all_nodes,
            ..ContainerEdits::default()
        },
    });

    let control = [
        DeviceRole::Control,
        DeviceRole::Uvm,
        DeviceRole::UvmTools,
        DeviceRole::Modeset,
    ];
    let device_nodes = inv
        .devices
        .iter()
        .filter(|d| control.contains(&d.role))
        .map(cdi_node)
        .collect();

    let entries = layout::driver_entries(driver);
    let mut mounts: Vec<Mount> = Vec::new();
    let mut libcuda_dirs: Vec<&str> = Vec::new();
    for e in &entries {
        let (host_path, options) = match e.kind {
            EntryKind::Library => {
                let (dir, file) = split_last(&e.path);
                if file.starts_with("libcuda.so.") && !libcuda_dirs.contains(&dir) {
                    libcuda_dirs.push(dir);
                }
                (e.source.as_str(), &FILE_OPTIONS)
            }
            // The link's target is the library next to it; mount that library's bind source at
            // the SONAME path. A link whose library is not among the entries is left out.
            EntryKind::SonameLink => {
                let target = format!("{}/{}", split_last(&e.path).0, e.source);
                let Some(lib) = entries
                    .iter()
                    .find(|l| l.kind == EntryKind::Library && l.path == target)
                else {
                    continue;
                };
                (lib.source.as_str(), &FILE_OPTIONS)
            }
            EntryKind::Binary | EntryKind::Firmware => (e.source.as_str(), &FILE_OPTIONS),
            EntryKind::Socket => (e.source.as_str(), &SOCKET_OPTIONS),
        };
        // Two library directories of one triplet would map to the same container path; the
        // first (discovery order) wins, as a second mount would only hide it.
        if mounts.iter().any(|m| m.container_path == e.path) {
            continue;
        }
        mounts.push(Mount {
            host_path: host_path.to_owned(),
            container_path: e.path.clone(),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
        });
    }

    let mut env = vec!["NVIDIA_VISIBLE_DEVICES=void".to_owned()];
    // What `nvidia-ctk` sets too: NVIDIA tools in the container (CUDA compat) find libcuda here.
    if !libcuda_dirs.is_empty() {
        env.push(format!("NVIDIA_CTK_LIBCUDA_DIR={}", libcuda_dirs.join(":")));
    }

    let mut spec = Spec {
        cdi_version: String::new(),
        kind: kind.to_owned(),
        devices,
        container_edits: ContainerEdits {
            env,
            device_nodes,
            mounts,
        },
    };
    spec.cdi_version = minimum_version(&spec).to_owned();
    Some(spec)
}

fn cdi_node(d: &HostNode) -> DeviceNode {
    DeviceNode {
        path: d.path.to_string(),
        kind: "c".into(),
        major: d.major.into(),
        minor: d.minor.into(),
    }
}

/// `/usr/lib/x/libcuda.so.1` → (`/usr/lib/x`, `libcuda.so.1`).
fn split_last(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// The CDI device-name rule (same in v0.5.2 and now): letters, digits, `_ . : -`, starting and
/// ending with a letter or digit.
fn valid_device_name(name: &str) -> bool {
    let b = name.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"_.:-".contains(c))
        }
        _ => false,
    }
}

/// The lowest CDI version that can carry `spec`, by the `requiresV…` rules of the CDI
/// library's `specs-go/version.go`, newest first.
///
/// Of those rules only two can fire on these types: a `.` in the class part of the kind (0.6.0)
/// and a device name starting with a digit (0.5.0). The others concern fields the types do not
/// have: `hostPath` on a node (0.5.0), `type` on a mount (0.4.0), annotations (0.6.0),
/// `intelRdt`/`additionalGids` (0.7.0), `netDevices` and newer `intelRdt` fields (1.1.0); adding
/// such a field means adding its rule here. 0.3.0 is the earliest the library ever returns.
pub fn minimum_version(spec: &Spec) -> &'static str {
    let class = spec.kind.split_once('/').map_or("", |(_, c)| c);
    if class.contains('.') {
        return "0.6.0";
    }
    if spec
        .devices
        .iter()
        .any(|d| d.name.as_bytes().first().is_some_and(u8::is_ascii_digit))
    {
        return "0.5.0";
    }
    "0.3.0"
}

/// The spec as pretty JSON with a trailing newline; the same spec always gives the same bytes.
pub fn render(spec: &Spec) -> String {
    let mut s = serde_json::to_string_pretty(spec)
        .expect("a Spec holds only strings, integers and lists, which always serialize");
    s.push('\n');
    s
}

/// Whether `file_name` with content `bytes`, found in `/etc/cdi` or `/var/run/cdi`, is another
/// spec of `kind`, which would conflict with ours (same device names at the same priority are
/// dropped by CDI) or shadow it, so post-start removes it.
///
/// True only when all of these hold; anything else is kept, so a file we cannot read with
/// certainty is never removed:
/// - the name ends in `.json` or `.yaml` (lower case: the only names the Go CDI library reads;
///   `.yml`, `.tmp` and the like are never loaded) and is not `spec_file_name(kind)`, which is
///   ours and gets overwritten;
/// - the content is UTF-8 and either JSON (an object whose `cdiVersion` is a string and whose
///   `kind` is exactly `kind`) or, since CDI reads JSON and YAML alike whatever the extension,
///   YAML as `nvidia-ctk` writes it (see `yaml_is_spec_of`).
///
/// A file named like ours in a directory we do not write to is ours from an earlier
/// configuration; that is the caller's call, as only it knows the directory.
pub fn conflicts(kind: &str, file_name: &str, bytes: &[u8]) -> bool {
    if !(file_name.ends_with(".json") || file_name.ends_with(".yaml"))
        || file_name.contains('/')
        || file_name == spec_file_name(kind)
    {
        return false;
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => {
            v.get("cdiVersion").is_some_and(|x| x.is_string())
                && v.get("kind").and_then(|k| k.as_str()) == Some(kind)
        }
        Err(_) => yaml_is_spec_of(kind, text),
    }
}

/// The YAML check, done without a YAML parser: one document whose top-level block mapping
/// (lines starting in column 0) has a `cdiVersion:` key and exactly one `kind:` key whose scalar
/// (plain, `'…'` or `"…"` without escapes, optional ` #` comment) is exactly `kind`.
///
/// A second document (`---` after content), a repeated `kind:`, a flow mapping on one line, a
/// block scalar or an escaped string all answer false: keeping a stale file only costs a logged
/// conflict, removing a foreign one costs someone else's devices.
fn yaml_is_spec_of(kind: &str, text: &str) -> bool {
    let mut seen_content = false;
    let mut has_version = false;
    let mut kinds = Vec::new();
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if line == "---" || line.starts_with("--- ") || line == "..." {
            if seen_content {
                return false;
            }
            continue;
        }
        seen_content = true;
        if line.starts_with([' ', '\t']) {
            continue;
        }
        if let Some(rest) = top_level_value(line, "cdiVersion") {
            has_version = !rest.is_empty();
        } else if let Some(rest) = top_level_value(line, "kind") {
            kinds.push(yaml_scalar(rest));
        }
    }
    has_version && kinds.len() == 1 && kinds[0] == Some(kind)
}

/// For `key: value` (key plain or quoted) the trimmed rest after the colon.
fn top_level_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let after = [
        format!("{key}:"),
        format!("\"{key}\":"),
        format!("'{key}':"),
    ]
    .iter()
    .find_map(|k| line.strip_prefix(k.as_str()))?;
    if !(after.is_empty() || after.starts_with([' ', '\t'])) {
        return None;
    }
    Some(after.trim())
}

/// A one-line YAML scalar: `'x'`, `"x"` (no escapes) or plain `x`, each with an optional comment.
fn yaml_scalar(rest: &str) -> Option<&str> {
    let comment_ok = |tail: &str| {
        let t = tail.trim_start();
        t.is_empty() || (t.starts_with('#') && tail.len() > t.len())
    };
    for q in ['\'', '"'] {
        if let Some(inner) = rest.strip_prefix(q) {
            let end = inner.find(q)?;
            let (value, tail) = (&inner[..end], &inner[end + 1..]);
            return (!value.contains('\\') && comment_ok(tail)).then_some(value);
        }
    }
    let value = match rest.find(" #").or_else(|| rest.find("\t#")) {
        Some(i) => rest[..i].trim_end(),
        None => rest,
    };
    let special = |c: char| "[]{}&*!|>%@`\"'".contains(c);
    (!value.is_empty() && !value.starts_with(special) && !value.contains(": ")).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVIDIA_CTK_YAML: &str = "\
---
cdiVersion: 0.5.0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: \"0\"
kind: nvidia.com/gpu
";

    #[test]
    fn file_name_is_vendor_dash_class() {
        assert_eq!(spec_file_name(DEFAULT_KIND), DEFAULT_SPEC_FILE);
        assert_eq!(spec_file_name("example.com/dev"), "example.com-dev.json");
    }

    #[test]
    fn nvidia_ctk_yaml_of_our_kind_conflicts() {
        assert!(conflicts(
            DEFAULT_KIND,
            "nvidia.yaml",
            NVIDIA_CTK_YAML.as_bytes()
        ));
        let crlf = NVIDIA_CTK_YAML.replace('\n', "\r\n");
        assert!(conflicts(DEFAULT_KIND, "nvidia.yaml", crlf.as_bytes()));
        for kind_line in [
            "kind: 'nvidia.com/gpu'",
            "kind: \"nvidia.com/gpu\"",
            "kind: nvidia.com/gpu   # generated",
            "\"kind\": nvidia.com/gpu",
        ] {
            let text = NVIDIA_CTK_YAML.replace("kind: nvidia.com/gpu", kind_line);
            assert!(
                conflicts(DEFAULT_KIND, "nvidia.yaml", text.as_bytes()),
                "{kind_line}"
            );
        }
        // YAML in a .json file is loaded by CDI too, and so is a hidden file.
        assert!(conflicts(
            DEFAULT_KIND,
            "x.json",
            NVIDIA_CTK_YAML.as_bytes()
        ));
        assert!(conflicts(
            DEFAULT_KIND,
            ".nvidia.yaml",
            NVIDIA_CTK_YAML.as_bytes()
        ));
    }

    #[test]
    fn json_of_our_kind_conflicts_unless_it_is_ours() {
        let json = br#"{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": []}"#;
        assert!(conflicts(DEFAULT_KIND, "nvidia.json", json));
        assert!(conflicts(
            DEFAULT_KIND,
            "management.nvidia.com-gpu.json",
            json
        ));
        assert!(!conflicts(DEFAULT_KIND, DEFAULT_SPEC_FILE, json));
        // With another kind configured, a file named for the default kind is not ours.
        let other = String::from_utf8_lossy(json).replace(DEFAULT_KIND, "example.com/dev");
        assert!(conflicts(
            "example.com/dev",
            DEFAULT_SPEC_FILE,
            other.as_bytes()
        ));
    }

    #[test]
    fn everything_uncertain_is_kept() {
        let other_kind =
            NVIDIA_CTK_YAML.replace("kind: nvidia.com/gpu", "kind: management.nvidia.com/gpu");
        let no_version = NVIDIA_CTK_YAML.replace("cdiVersion: 0.5.0\n", "");
        let two_docs = format!("{NVIDIA_CTK_YAML}---\ncdiVersion: 0.5.0\nkind: other.com/x\n");
        let two_kinds = format!("{NVIDIA_CTK_YAML}kind: nvidia.com/gpu\n");
        let longer = NVIDIA_CTK_YAML.replace("kind: nvidia.com/gpu", "kind: nvidia.com/gpu-x");
        let nested_only = NVIDIA_CTK_YAML.replace("kind: nvidia.com/gpu", "  kind: nvidia.com/gpu");
        let escaped = NVIDIA_CTK_YAML.replace("kind: nvidia.com/gpu", r#"kind: "nvidia.com\/gpu""#);
        let block = NVIDIA_CTK_YAML.replace("kind: nvidia.com/gpu", "kind: >\n  nvidia.com/gpu");
        let flow = "{cdiVersion: 0.5.0, kind: nvidia.com/gpu, devices: []}\n".to_owned();
        let cases: &[(&str, &[u8])] = &[
            ("nvidia.yaml", other_kind.as_bytes()),
            ("nvidia.yaml", no_version.as_bytes()),
            ("nvidia.yaml", two_docs.as_bytes()),
            ("nvidia.yaml", two_kinds.as_bytes()),
            ("nvidia.yaml", longer.as_bytes()),
            ("nvidia.yaml", nested_only.as_bytes()),
            ("nvidia.yaml", escaped.as_bytes()),
            ("nvidia.yaml", block.as_bytes()),
            ("nvidia.yaml", flow.as_bytes()),
            ("nvidia.yml", NVIDIA_CTK_YAML.as_bytes()),
            ("nvidia.YAML", NVIDIA_CTK_YAML.as_bytes()),
            ("nvidia.yaml.tmp", NVIDIA_CTK_YAML.as_bytes()),
            ("nvidia", NVIDIA_CTK_YAML.as_bytes()),
            ("nvidia.yaml", b"\xff\xfe garbage"),
            ("nvidia.json", b"{\"cdiVersion\": \"0.5.0\", \"kind\": "),
            (
                "nvidia.json",
                br#"{"cdiVersion": "0.5.0", "kind": ["nvidia.com/gpu"]}"#,
            ),
            ("nvidia.json", br#"{"kind": "nvidia.com/gpu"}"#),
            ("nvidia.json", br#"["nvidia.com/gpu"]"#),
            ("nvidia.json", b""),
        ];
        for (name, bytes) in cases {
            assert!(
                !conflicts(DEFAULT_KIND, name, bytes),
                "{name}: {}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn device_names_follow_cdi() {
        for ok in [
            "0",
            "12",
            "all",
            "GPU-edfee158-11c1-52b8-0517-92f30e7fac88",
            "0:1",
        ] {
            assert!(valid_device_name(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "GPU 1", "a/b", "é"] {
            assert!(!valid_device_name(bad), "{bad}");
        }
    }
}
