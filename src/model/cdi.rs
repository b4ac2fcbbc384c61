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
//! - Driver files are bound under [`CONTAINER_DRIVER_DIR`], a fresh tmpfs the spec mounts first,
//!   never at their standard paths: an image may hold anything at `/usr/lib/<triplet>/libcuda.so.1`
//!   (a stale link from an older driver makes crun refuse to start, an absolute link makes runc
//!   bind onto another file of the image), but nothing of the image can be inside a tmpfs mounted
//!   after it. The standard paths (`/usr/lib/<triplet>/libcuda.so.<ver>`, the SONAME links,
//!   `libcuda.so`, `/usr/bin/nvidia-smi`, firmware, sockets) are then made symlinks by our
//!   `create-symlinks` hook, replacing whatever the image had there without following it.
//! - Hooks, all `createContainer`, all this helper bound into the machine at
//!   [`layout::HOOK_BINARY`] (the machine has no `nvidia-cdi-hook`): `create-symlinks`,
//!   `update-ldcache` (the driver's SONAMEs into the container's `/etc/ld.so.cache`, so
//!   `ldconfig -p` lists them and `/usr/lib64` images load them) and
//!   `disable-device-node-modification`. See src/apply/cdi_hook.rs; no image code ever runs.
//! - Only fields that CDI 0.5.2 (Debian 12's podman 4.3) knows: its strict parser rejects
//!   `annotations`, `additionalGids`, `intelRdt` and `netDevices`. The types below cannot even
//!   hold them.

use crate::discovery::{DeviceNode as HostNode, DeviceRole, Inventory, UserspaceDriver};
use crate::model::layout::{self, EntryKind};
use crate::types::hook::CdiHook;
use serde::Serialize;
use std::collections::BTreeSet;

/// The kind written when the config does not say otherwise.
pub const DEFAULT_KIND: &str = "nvidia.com/gpu";
/// [`spec_file_name`] of [`DEFAULT_KIND`].
pub const DEFAULT_SPEC_FILE: &str = "nvidia.com-gpu.json";

/// The tmpfs in the container under which the driver files are bound (see the module doc).
pub const CONTAINER_DRIVER_DIR: &str = "/run/nspawn-lifecycle-driver";
/// Options for that tmpfs: it only holds mount points, so it is small and runs nothing itself
/// (each bind under it keeps its own flags, so libraries map and `nvidia-smi` runs).
const TMPFS_OPTIONS: [&str; 5] = ["nosuid", "nodev", "noexec", "mode=755", "size=1m"];
/// Every hook's `hookName`: after the runtime's mounts, before `pivot_root`, in the container's
/// mount namespace (CDI 0.3.0 already has hooks).
const HOOK_STAGE: &str = "createContainer";
/// SONAMEs that also get the unversioned development name (`libcuda.so`), as `nvidia-ctk` makes:
/// code that links `-lcuda` or dlopens `libcuda.so` at run time needs it.
const DEV_LINKS: [&str; 2] = ["libcuda.so.1", "libnvidia-opticalflow.so.1"];

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
    pub hooks: Vec<Hook>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
    }
}

/// An OCI hook the runtime runs for the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    pub args: Vec<String>,
    /// The hook's whole environment. Never empty: a runtime given no `env` (or an empty one,
    /// which a CDI library's round trip may drop) runs the hook with the container's, which is
    /// the pod's to choose. Our hooks read none of it anyway (`cdi_hook::isolate_process`).
    pub env: Vec<String>,
}

/// The environment every hook of ours is given (see [`Hook::env`]).
pub(crate) const HOOK_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";

impl Hook {
    /// `nspawn-lifecycle-helper cdi-hook <args>` at [`layout::HOOK_BINARY`].
    fn ours(args: Vec<String>) -> Hook {
        let argv0 = layout::HOOK_BINARY
            .rsplit('/')
            .next()
            .unwrap_or(layout::HOOK_BINARY);
        let mut all = vec![argv0.to_owned(), crate::types::hook::SUBCOMMAND.to_owned()];
        all.extend(args);
        Hook {
            hook_name: HOOK_STAGE.to_owned(),
            path: layout::HOOK_BINARY.to_owned(),
            args: all,
            env: vec![HOOK_ENV.to_owned()],
        }
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
    /// Only for the tmpfs (CDI 0.4.0); binds leave it out.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
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
    let devices = gpu_devices(inv)?;
    let files = driver_files(driver);
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: kind.to_owned(),
        devices,
        container_edits: ContainerEdits {
            env: driver_env(&files.libcuda_dirs),
            device_nodes: control_nodes(inv),
            hooks: driver_hooks(&files.links, &files.libs),
            mounts: files.mounts,
        },
    };
    spec.cdi_version = minimum_version(&spec).to_owned();
    Some(spec)
}

/// Host mode's spec: [`spec`] for a driver installed on the host itself, whose driver
/// root is `/` (NVIDIA's convention for a host driver): every driver file is bound from its real
/// host path (the source of its bind in [`layout::driver_binds`], where a machine has the
/// driver root `/run/nvidia/driver`), and the hooks run the helper at `hook` (its installed host
/// path) instead of [`layout::HOOK_BINARY`], which exists only in a machine. Devices, edits,
/// options and the CDI version are [`spec`]'s: one renderer for both. An error only if a driver
/// path has no bind (a bug).
pub fn spec_on_host(inv: &Inventory, kind: &str, hook: &str) -> anyhow::Result<Option<Spec>> {
    let (Some(mut spec), Some(driver)) = (spec(inv, kind), inv.complete_driver()) else {
        return Ok(None);
    };
    let binds = layout::driver_binds(driver)?;
    for m in &mut spec.container_edits.mounts {
        if m.kind.is_some() {
            continue;
        }
        let host = binds.iter().find_map(|b| {
            let rest = m.host_path.strip_prefix(b.target.as_str())?;
            (rest.is_empty() || rest.starts_with('/')).then(|| format!("{}{rest}", b.source))
        });
        m.host_path = host.ok_or_else(|| {
            anyhow::anyhow!(
                "CDI mount source {} is not in any driver bind (a bug)",
                m.host_path
            )
        })?;
    }
    for h in &mut spec.container_edits.hooks {
        hook.clone_into(&mut h.path);
    }
    Ok(Some(spec))
}

/// One device per GPU name (index and UUID, each once, in index order) with the GPU's node and
/// its DRI nodes, then `all` with every one of those nodes; `None` when no GPU has a node.
fn gpu_devices(inv: &Inventory) -> Option<Vec<Device>> {
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
                devices.push(device(name, nodes.clone()));
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
    devices.push(device("all".into(), all_nodes));
    Some(devices)
}

fn device(name: String, device_nodes: Vec<DeviceNode>) -> Device {
    Device {
        name,
        container_edits: ContainerEdits {
            device_nodes,
            ..ContainerEdits::default()
        },
    }
}

/// The nodes every GPU device needs: control, UVM, UVM tools, modeset.
fn control_nodes(inv: &Inventory) -> Vec<DeviceNode> {
    let control = [
        DeviceRole::Control,
        DeviceRole::Uvm,
        DeviceRole::UvmTools,
        DeviceRole::Modeset,
    ];
    inv.devices
        .iter()
        .filter(|d| control.contains(&d.role))
        .map(cdi_node)
        .collect()
}

/// The driver's files as the container gets them: mounts under [`CONTAINER_DRIVER_DIR`], the
/// links and cache entries that place them at their standard paths, and libcuda's directories.
struct DriverFiles {
    mounts: Vec<Mount>,
    /// `create-symlinks` pairs (target, link).
    links: Vec<(String, String)>,
    /// `update-ldcache` pairs (SONAME, path).
    libs: Vec<(String, String)>,
    libcuda_dirs: Vec<String>,
}

fn driver_files(driver: &UserspaceDriver) -> DriverFiles {
    let entries = layout::driver_entries(driver);
    let mut files = DriverFiles {
        mounts: vec![Mount {
            host_path: "tmpfs".to_owned(),
            container_path: CONTAINER_DRIVER_DIR.to_owned(),
            options: TMPFS_OPTIONS.iter().map(|o| (*o).to_owned()).collect(),
            kind: Some("tmpfs".to_owned()),
        }],
        links: Vec::new(),
        libs: Vec::new(),
        libcuda_dirs: Vec::new(),
    };
    for e in &entries {
        // Two library directories of one triplet would map to the same container path; the
        // first (discovery order) wins, as a second one would only hide it.
        if files.links.iter().any(|(_, l)| *l == e.path) {
            continue;
        }
        let options = match e.kind {
            EntryKind::Library => {
                let (dir, file) = split_last(&e.path);
                if file.starts_with("libcuda.so.") && !files.libcuda_dirs.iter().any(|d| d == dir) {
                    files.libcuda_dirs.push(dir.to_owned());
                }
                &FILE_OPTIONS
            }
            EntryKind::SonameLink => {
                soname_link(&mut files, &entries, e);
                continue;
            }
            EntryKind::Binary | EntryKind::Firmware => &FILE_OPTIONS,
            EntryKind::Socket => &SOCKET_OPTIONS,
        };
        let inside = format!("{CONTAINER_DRIVER_DIR}{}", e.path);
        files.mounts.push(Mount {
            host_path: e.source.clone(),
            container_path: inside.clone(),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
            kind: None,
        });
        files.links.push((inside, e.path.clone()));
    }
    files
}

/// A SONAME link: a relative link to the library next to it, which must be one of the
/// `entries`; its cache entry; and for a library with a development name, that link too.
fn soname_link(files: &mut DriverFiles, entries: &[layout::Entry], e: &layout::Entry) {
    let (dir, soname) = split_last(&e.path);
    let target = format!("{dir}/{}", e.source);
    if !entries
        .iter()
        .any(|l| l.kind == EntryKind::Library && l.path == target)
    {
        return;
    }
    files.links.push((e.source.clone(), e.path.clone()));
    files.libs.push((soname.to_owned(), e.path.clone()));
    if DEV_LINKS.contains(&soname) {
        let dev = soname.trim_end_matches(|c: char| c.is_ascii_digit());
        let dev = dev.trim_end_matches('.');
        files
            .links
            .push((soname.to_owned(), format!("{dir}/{dev}")));
        // In the cache too, as ldconfig lists a development link: a loader that never
        // searches `dir` (a `/usr/lib64` image) finds `libcuda.so` only there.
        files.libs.push((dev.to_owned(), format!("{dir}/{dev}")));
    }
}

/// Our hooks: `create-symlinks` and `update-ldcache` when they have work, then
/// `disable-device-node-modification`.
fn driver_hooks(links: &[(String, String)], libs: &[(String, String)]) -> Vec<Hook> {
    let pairs = |p: &[(String, String)]| -> Vec<String> {
        p.iter().map(|(a, b)| format!("{a}::{b}")).collect()
    };
    let mut hooks = Vec::new();
    if !links.is_empty() {
        hooks.push(CdiHook::CreateSymlinks {
            links: pairs(links),
        });
    }
    if !libs.is_empty() {
        hooks.push(CdiHook::UpdateLdcache { libs: pairs(libs) });
    }
    hooks.push(CdiHook::DisableDeviceNodeModification {
        testkit: Default::default(),
    });
    hooks.iter().map(|h| Hook::ours(h.argv())).collect()
}

fn driver_env(libcuda_dirs: &[String]) -> Vec<String> {
    let mut env = vec!["NVIDIA_VISIBLE_DEVICES=void".to_owned()];
    // What `nvidia-ctk` sets too: NVIDIA tools in the container (CUDA compat) find libcuda here.
    if !libcuda_dirs.is_empty() {
        env.push(format!("NVIDIA_CTK_LIBCUDA_DIR={}", libcuda_dirs.join(":")));
    }
    env
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
/// Of those rules three can fire on these types: a `.` in the class part of the kind (0.6.0),
/// a device name starting with a digit (0.5.0) and `type` on a mount (0.4.0, our tmpfs). Hooks
/// exist since 0.3.0. The others concern fields the types do not have: `hostPath` on a node
/// (0.5.0), annotations (0.6.0),
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
    let edits = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits));
    if edits
        .flat_map(|e| &e.mounts)
        .any(|m| m.kind.as_deref().is_some_and(|k| !k.is_empty()))
    {
        return "0.4.0";
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

/// CDI versions a spec may declare (those the CDI library knows).
const KNOWN_VERSIONS: [&str; 9] = [
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0", "1.1.1",
];
/// Keys of a spec, of container edits, of a device node and of a mount, as the CDI library's
/// strict loader knows them: anything else makes it reject the file.
const SPEC_KEYS: [&str; 5] = [
    "cdiVersion",
    "kind",
    "annotations",
    "devices",
    "containerEdits",
];
const EDIT_KEYS: [&str; 7] = [
    "env",
    "deviceNodes",
    "hooks",
    "mounts",
    "intelRdt",
    "additionalGids",
    "netDevices",
];

/// What [`check`] read from a valid spec file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    pub cdi_version: String,
    /// Each device's name and the paths of the device nodes it hands out, in file order.
    pub devices: Vec<(String, Vec<String>)>,
    /// Every mount's `containerPath`, spec-level then per device, in file order.
    pub container_paths: Vec<String>,
}

/// Check a spec file of `kind` the way a CDI consumer loads one, without changing anything: a
/// JSON object with a known `cdiVersion`, exactly `kind`, at least one device, device names by
/// the CDI rule and unique, no key the strict loader rejects, every device with non-empty
/// edits, every node and mount path absolute. The error names the first problem.
pub fn check(kind: &str, bytes: &[u8]) -> Result<Checked, String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let top = v.as_object().ok_or("not a JSON object")?;
    if let Some(k) = top.keys().find(|k| !SPEC_KEYS.contains(&k.as_str())) {
        return Err(format!("unknown key {k:?}"));
    }
    let version = top
        .get("cdiVersion")
        .and_then(|x| x.as_str())
        .ok_or("no cdiVersion string")?;
    if !KNOWN_VERSIONS.contains(&version) {
        return Err(format!("unknown cdiVersion {version:?}"));
    }
    match top.get("kind").and_then(|x| x.as_str()) {
        Some(k) if k == kind => {}
        Some(k) => return Err(format!("kind is {k:?}, expected {kind:?}")),
        None => return Err("no kind string".into()),
    }
    let mut out = Checked {
        cdi_version: version.to_owned(),
        ..Checked::default()
    };
    if let Some(edits) = top.get("containerEdits") {
        check_edits(edits, "containerEdits", &mut out.container_paths)?;
    }
    let devices = top
        .get("devices")
        .and_then(|x| x.as_array())
        .filter(|d| !d.is_empty())
        .ok_or("no devices")?;
    for (i, d) in devices.iter().enumerate() {
        let name = d
            .get("name")
            .and_then(|x| x.as_str())
            .ok_or_else(|| format!("devices[{i}] has no name"))?;
        if !valid_device_name(name) {
            return Err(format!(
                "device name {name:?} is not a valid CDI device name"
            ));
        }
        if out.devices.iter().any(|(n, _)| n == name) {
            return Err(format!("device {name:?} appears twice"));
        }
        let edits = d
            .get("containerEdits")
            .ok_or_else(|| format!("device {name:?} has no containerEdits"))?;
        let nodes = check_edits(edits, &format!("device {name:?}"), &mut out.container_paths)?;
        if nodes.is_empty() && edits.as_object().is_none_or(|o| o.is_empty()) {
            return Err(format!("device {name:?} has empty containerEdits"));
        }
        out.devices.push((name.to_owned(), nodes));
    }
    Ok(out)
}

/// Check one `containerEdits` object; returns its device node paths, adds its mounts' container
/// paths to `container_paths`.
fn check_edits(
    edits: &serde_json::Value,
    what: &str,
    container_paths: &mut Vec<String>,
) -> Result<Vec<String>, String> {
    let o = edits
        .as_object()
        .ok_or_else(|| format!("{what}: containerEdits is not an object"))?;
    if let Some(k) = o.keys().find(|k| !EDIT_KEYS.contains(&k.as_str())) {
        return Err(format!("{what}: unknown key {k:?} in containerEdits"));
    }
    let list = |key: &str| -> Result<&[serde_json::Value], String> {
        match o.get(key) {
            None => Ok(&[]),
            Some(x) => x
                .as_array()
                .map(Vec::as_slice)
                .ok_or_else(|| format!("{what}: {key} is not a list")),
        }
    };
    let abs = |x: Option<&serde_json::Value>, field: &str| -> Result<String, String> {
        match x.and_then(|x| x.as_str()) {
            Some(p) if p.starts_with('/') => Ok(p.to_owned()),
            _ => Err(format!(
                "{what}: a {field} is missing or not an absolute path"
            )),
        }
    };
    for e in list("env")? {
        if !e.as_str().is_some_and(|e| e.contains('=')) {
            return Err(format!("{what}: env entry {e} is not NAME=VALUE"));
        }
    }
    let mut nodes = Vec::new();
    for n in list("deviceNodes")? {
        nodes.push(abs(n.get("path"), "device node path")?);
    }
    for m in list("mounts")? {
        // Non-empty, as the official loader wants; not absolute: a tmpfs mount names its
        // source (`"tmpfs"`), as ours does.
        if m.get("hostPath")
            .and_then(|x| x.as_str())
            .is_none_or(str::is_empty)
        {
            return Err(format!("{what}: a mount hostPath is missing or empty"));
        }
        container_paths.push(abs(m.get("containerPath"), "mount containerPath")?);
    }
    for h in list("hooks")? {
        abs(h.get("path"), "hook path")?;
        if !h.get("hookName").is_some_and(|x| x.is_string()) {
            return Err(format!("{what}: a hook has no hookName"));
        }
    }
    Ok(nodes)
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
mod tests;
