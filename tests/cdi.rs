//! Every generated CDI spec, for several hosts, against: (a) the official CDI JSON schema,
//! (b) the official CDI library's strict loader, (c) that library's injection into an OCI runtime
//! spec, (d) the CDI 0.5.x rules of Debian 12's podman 4.3 (CDI library v0.5.2), and (e) the
//! library's own reading of the file, re-serialized, and golden files (`UPDATE_GOLDEN=1 cargo
//! test --test cdi` rewrites them). Negative tests at the end show
//! that each check rejects what it should, so none can pass vacuously.

// clippy.toml allows unwrap in #[test] functions only; the helpers here are test code too, and a
// panic is how they report.
#![allow(clippy::unwrap_used)]

use container_device_interface as cdi_lib;
use jsonschema::{Draft, Registry, Validator};
use nspawn_lifecycle::discovery::{
    DeviceNode, DeviceRole, DriverFile, Gpu, Inventory, LibDir, UserspaceDriver, Verdict,
};
use nspawn_lifecycle::model::cdi;
use oci_spec::runtime as oci;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

const VER: &str = "580.82.07";
const KIND: &str = "nvidia.com/gpu";
const FILE_OPTS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];
const SOCKET_OPTS: [&str; 5] = ["nosuid", "nodev", "rbind", "rprivate", "noexec"];

// ---------------------------------------------------------------------------------------------
// Fixture inventories, written out as discovery would produce them.

fn node(path: &str, major: u32, minor: u32, role: DeviceRole) -> DeviceNode {
    DeviceNode {
        path: path.parse().unwrap(),
        major,
        minor,
        role,
    }
}

fn uuid(i: u32) -> String {
    format!("GPU-{i:08x}-11c1-52b8-0517-92f30e7fac{i:02x}")
}

/// Files of one library directory: (name, SONAME).
fn files(list: &[(&str, Option<&str>)]) -> Vec<DriverFile> {
    let mut v: Vec<_> = list
        .iter()
        .map(|(n, s)| DriverFile {
            name: n.replace("{v}", VER),
            soname: s.map(str::to_owned),
        })
        .collect();
    v.sort();
    v
}

fn native_files() -> Vec<DriverFile> {
    files(&[
        ("libcuda.so.{v}", Some("libcuda.so.1")),
        ("libnvidia-ml.so.{v}", Some("libnvidia-ml.so.1")),
        (
            "libnvidia-ptxjitcompiler.so.{v}",
            Some("libnvidia-ptxjitcompiler.so.1"),
        ),
        ("libEGL_nvidia.so.{v}", Some("libEGL_nvidia.so.0")),
        // Its SONAME is its own name, so discovery records none.
        ("libnvidia-glcore.so.{v}", None),
        ("vdpau/libvdpau_nvidia.so.{v}", Some("libvdpau_nvidia.so.1")),
    ])
}

struct Host {
    gpus: u32,
    drm: bool,
    caps_imex: bool,
    lib_dirs: Vec<LibDir>,
    binaries: &'static [&'static str],
    sockets: &'static [&'static str],
}

fn lib_dir(triplet: &str, files: Vec<DriverFile>) -> LibDir {
    LibDir {
        path: format!("/usr/lib/{triplet}").try_into().unwrap(),
        triplet: triplet.into(),
        files,
    }
}

fn inventory(h: Host) -> Inventory {
    let mut devices = vec![
        node("/dev/nvidiactl", 195, 255, DeviceRole::Control),
        node("/dev/nvidia-modeset", 195, 254, DeviceRole::Modeset),
        node("/dev/nvidia-uvm", 509, 0, DeviceRole::Uvm),
        node("/dev/nvidia-uvm-tools", 509, 1, DeviceRole::UvmTools),
    ];
    let mut gpus = Vec::new();
    for i in 0..h.gpus {
        let path = format!("/dev/nvidia{i}");
        devices.push(node(&path, 195, i, DeviceRole::Gpu));
        let mut dri = Vec::new();
        if h.drm {
            // card0 is the BMC's VGA device, not NVIDIA's.
            for (p, minor) in [
                (format!("/dev/dri/card{}", i + 1), i + 1),
                (format!("/dev/dri/renderD{}", 128 + i), 128 + i),
            ] {
                devices.push(node(&p, 226, minor, DeviceRole::Dri));
                dri.push(p);
            }
            dri.sort();
        }
        gpus.push(Gpu {
            index: i,
            minor: i,
            uuid: uuid(i),
            bus_id: format!("0000:{:02x}:00.0", 0x10 + i),
            model: "NVIDIA H100 80GB HBM3".into(),
            device: Some(path),
            dri,
            mig_caps: Vec::new(),
        });
    }
    if h.caps_imex {
        devices.push(node(
            "/dev/nvidia-caps/nvidia-cap1",
            508,
            1,
            DeviceRole::Cap,
        ));
        devices.push(node(
            "/dev/nvidia-caps/nvidia-cap2",
            508,
            2,
            DeviceRole::Cap,
        ));
        devices.push(node(
            "/dev/nvidia-caps-imex-channels/channel0",
            507,
            0,
            DeviceRole::ImexChannel,
        ));
    }
    devices.sort();
    Inventory {
        devices,
        kvm: Some(node("/dev/kvm", 10, 232, DeviceRole::Kvm)),
        host_devices: Vec::new(),
        disks: Vec::new(),
        gpus,
        kernel_module: Some(VER.into()),
        driver: Some(UserspaceDriver {
            version: VER.into(),
            lib_dirs: h.lib_dirs,
            binaries: h.binaries.iter().map(|b| b.parse().unwrap()).collect(),
            firmware: Some(format!("/lib/firmware/nvidia/{VER}").try_into().unwrap()),
            sockets: h.sockets.iter().map(|s| s.parse().unwrap()).collect(),
            runtime: Vec::new(),
        }),
        verdict: Verdict::Complete,
    }
}

fn cases() -> Vec<(&'static str, Inventory)> {
    let x86 = || lib_dir("x86_64-linux-gnu", native_files());
    vec![
        (
            "1gpu",
            inventory(Host {
                gpus: 1,
                drm: false,
                caps_imex: false,
                lib_dirs: vec![x86()],
                binaries: &["/usr/bin/nvidia-smi"],
                sockets: &["/run/nvidia-persistenced"],
            }),
        ),
        (
            "2gpu-drm",
            inventory(Host {
                gpus: 2,
                drm: true,
                caps_imex: false,
                lib_dirs: vec![x86()],
                binaries: &["/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-smi"],
                sockets: &["/run/nvidia-persistenced"],
            }),
        ),
        (
            "8gpu-caps-imex",
            inventory(Host {
                gpus: 8,
                drm: true,
                caps_imex: true,
                lib_dirs: vec![x86()],
                binaries: &[
                    "/usr/bin/nvidia-cuda-mps-control",
                    "/usr/bin/nvidia-cuda-mps-server",
                    "/usr/bin/nvidia-debugdump",
                    "/usr/bin/nvidia-persistenced",
                    "/usr/bin/nvidia-smi",
                ],
                sockets: &["/run/nvidia-fabricmanager", "/run/nvidia-persistenced"],
            }),
        ),
        (
            "aarch64",
            inventory(Host {
                gpus: 1,
                drm: true,
                caps_imex: false,
                lib_dirs: vec![lib_dir("aarch64-linux-gnu", native_files())],
                binaries: &["/usr/bin/nvidia-smi"],
                sockets: &[],
            }),
        ),
        (
            "multilib",
            inventory(Host {
                gpus: 1,
                drm: false,
                caps_imex: false,
                lib_dirs: vec![
                    x86(),
                    lib_dir(
                        "i386-linux-gnu",
                        files(&[
                            ("libcuda.so.{v}", Some("libcuda.so.1")),
                            ("libnvidia-ml.so.{v}", Some("libnvidia-ml.so.1")),
                            ("libGLX_nvidia.so.{v}", Some("libGLX_nvidia.so.0")),
                        ]),
                    ),
                ],
                binaries: &["/usr/bin/nvidia-smi"],
                sockets: &["/run/nvidia-persistenced"],
            }),
        ),
    ]
}

fn generated(inv: &Inventory) -> (cdi::Spec, String, Value) {
    let spec = cdi::spec(inv, KIND).expect("a complete driver with GPUs gives a spec");
    let text = cdi::render(&spec);
    let doc = serde_json::from_str(&text).unwrap();
    (spec, text, doc)
}

// ---------------------------------------------------------------------------------------------
// (a) The official JSON schema.

fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cdi-schema")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `schema.json` with `defs.json` registered next to it, so its relative
/// `"$ref": "defs.json#/…"` resolves as upstream's `file:///schema.json` does. `defs.json` has no
/// `$schema`, so both are pinned to draft-07. Offline: an unregistered reference fails the build
/// instead of being fetched.
/// Fetches nothing: a reference outside the registry is an error, never a download.
struct Offline;

impl jsonschema::Retrieve for Offline {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!("{} is not registered and nothing is fetched", uri.as_str()).into())
    }
}

fn schema(sub: &str) -> Validator {
    let dir = schema_dir().join(sub);
    let base = format!("file:///cdi-schema/{sub}");
    let registry = Registry::new()
        .draft(Draft::Draft7)
        .add(
            format!("{base}/defs.json"),
            Draft::Draft7.create_resource(read_json(&dir.join("defs.json"))),
        )
        .unwrap()
        .prepare()
        .unwrap();
    jsonschema::options()
        .with_draft(Draft::Draft7)
        .with_base_uri(format!("{base}/schema.json"))
        .with_registry(&registry)
        .with_retriever(Offline)
        .build(&read_json(&dir.join("schema.json")))
        .unwrap()
}

fn schema_errors(v: &Validator, doc: &Value) -> Vec<String> {
    v.iter_errors(doc).map(|e| e.to_string()).collect()
}

// ---------------------------------------------------------------------------------------------
// (b) and (c): the official CDI library (Rust port, `container-device-interface` crate).

/// Write `text` as our spec file in a fresh CDI directory.
fn spec_dir(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(cdi::DEFAULT_SPEC_FILE), text).unwrap();
    dir
}

/// The library's strict loader: strict parse (unknown fields are errors), the built-in schema,
/// version, name and edit rules.
fn strict_load(text: &str) -> Result<cdi_lib::spec::Spec, String> {
    let dir = spec_dir(text);
    let path = dir.path().join(cdi::DEFAULT_SPEC_FILE);
    cdi_lib::spec::read_spec(&path, 0).map_err(|e| format!("{e:#}"))
}

/// Load the directory through a CDI cache, as a runtime does, and inject `devices` into a
/// default OCI spec. Returns the OCI spec and the one it started from.
fn inject(text: &str, devices: &[String]) -> Result<(oci::Spec, oci::Spec), String> {
    let dir = spec_dir(text);
    let mut cache = cdi_lib::cache::Cache::new(
        vec![dir.path().display().to_string()],
        HashMap::new(),
        HashMap::new(),
    );
    cache.refresh().map_err(|e| e.to_string())?;
    let before = oci::Spec::default();
    let mut after = before.clone();
    cache
        .inject_devices(Some(&mut after), devices.to_vec())
        .map_err(|e| e.to_string())?;
    Ok((after, before))
}

type Node = (String, String, i64, i64);

fn oci_devices(s: &oci::Spec) -> Vec<Node> {
    s.linux()
        .as_ref()
        .and_then(|l| l.devices().clone())
        .unwrap_or_default()
        .iter()
        .map(|d| {
            (
                d.path().display().to_string(),
                d.typ().as_str().to_owned(),
                d.major(),
                d.minor(),
            )
        })
        .collect()
}

fn oci_cgroup_allows(s: &oci::Spec) -> BTreeSet<(String, i64, i64, String)> {
    s.linux()
        .as_ref()
        .and_then(|l| l.resources().clone())
        .and_then(|r| r.devices().clone())
        .unwrap_or_default()
        .iter()
        .filter(|r| r.allow())
        .map(|r| {
            (
                r.typ().map(|t| t.as_str().to_owned()).unwrap_or_default(),
                r.major().unwrap_or(-1),
                r.minor().unwrap_or(-1),
                r.access().clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn oci_mounts(s: &oci::Spec) -> Vec<(String, String, Vec<String>)> {
    s.mounts()
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            (
                m.destination().display().to_string(),
                m.source()
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                m.options().clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn oci_create_container_hooks(s: &oci::Spec) -> Vec<(String, Vec<String>)> {
    s.hooks()
        .as_ref()
        .and_then(|h| h.create_container().clone())
        .unwrap_or_default()
        .iter()
        .map(|h| {
            (
                h.path().display().to_string(),
                h.args().clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn oci_env(s: &oci::Spec) -> Vec<String> {
    s.process()
        .as_ref()
        .and_then(|p| p.env().clone())
        .unwrap_or_default()
}

/// What injecting a set of GPUs must add, worked out from the inventory alone (not from our
/// spec): the GPUs' nodes and their DRM nodes, the control nodes, never caps or IMEX channels.
fn expected_nodes(inv: &Inventory, gpus: &[u32]) -> BTreeSet<Node> {
    let mut want = BTreeSet::new();
    for d in &inv.devices {
        let of_gpu = |i: &u32| {
            let g = &inv.gpus[*i as usize];
            g.device.as_deref() == Some(d.path.as_str()) || g.dri.iter().any(|p| d.path == *p)
        };
        let control = matches!(
            d.role,
            DeviceRole::Control | DeviceRole::Uvm | DeviceRole::UvmTools | DeviceRole::Modeset
        );
        if control || gpus.iter().any(of_gpu) {
            want.insert((
                d.path.to_string(),
                "c".into(),
                d.major.into(),
                d.minor.into(),
            ));
        }
    }
    want
}

/// Check one injection result against the inventory.
fn check_injection(
    case: &str,
    inv: &Inventory,
    after: &oci::Spec,
    before: &oci::Spec,
    gpus: &[u32],
) {
    let mut added = oci_devices(after);
    added.retain(|d| !oci_devices(before).contains(d));
    let got: BTreeSet<_> = added.iter().cloned().collect();
    assert_eq!(got.len(), added.len(), "{case}: a node injected twice");
    assert_eq!(got, expected_nodes(inv, gpus), "{case}: device nodes");
    let allows = oci_cgroup_allows(after);
    for (path, typ, major, minor) in &got {
        assert!(
            allows.contains(&(typ.clone(), *major, *minor, "rwm".into())),
            "{case}: no cgroup rule for {path}"
        );
    }

    let driver = inv.driver.as_ref().unwrap();
    let mounts = oci_mounts(after);
    let added: Vec<_> = mounts
        .iter()
        .filter(|m| !oci_mounts(before).contains(m))
        .collect();
    let find = |dest: &str| {
        added
            .iter()
            .find(|m| m.0 == dest)
            .unwrap_or_else(|| panic!("{case}: no mount at {dest}: {added:#?}"))
    };
    // Every driver file is bound under the tmpfs, never at a path the image may hold; the
    // standard paths become symlinks made by our create-symlinks hook.
    let x = cdi::CONTAINER_DRIVER_DIR;
    let tmpfs = find(x);
    assert_eq!(tmpfs.1, "tmpfs", "{case}: the driver dir is a tmpfs");
    let mut want_count = 1;
    let mut want_links: Vec<String> = Vec::new();
    let mut want_libs: Vec<String> = Vec::new();
    for dir in &driver.lib_dirs {
        let std_dir = format!("/usr/lib/{}", dir.triplet);
        for f in &dir.files {
            // In the driver root, where nspawn binds the host file (src/model/layout.rs).
            let src = format!("/run/nvidia/driver{std_dir}/{}", f.name);
            let dest = format!("{std_dir}/{}", f.name);
            let m = find(&format!("{x}{dest}"));
            assert_eq!(
                (m.1.as_str(), &m.2[..]),
                (src.as_str(), &FILE_OPTS.map(String::from)[..])
            );
            assert!(
                !added.iter().any(|m| m.0 == dest),
                "{case}: a bind at the image path {dest}"
            );
            want_count += 1;
            want_links.push(format!("{x}{dest}::{dest}"));
            if let Some(soname) = &f.soname {
                let (sub, file) = f
                    .name
                    .rsplit_once('/')
                    .map_or(("", f.name.as_str()), |(s, f)| (s, f));
                let link = if sub.is_empty() {
                    format!("{std_dir}/{soname}")
                } else {
                    format!("{std_dir}/{sub}/{soname}")
                };
                want_links.push(format!("{file}::{link}"));
                want_libs.push(format!("{soname}::{link}"));
                if soname == "libcuda.so.1" {
                    want_links.push(format!("libcuda.so.1::{std_dir}/libcuda.so"));
                    // In the cache too: a `/usr/lib64` image's loader finds it only there.
                    want_libs.push(format!("libcuda.so::{std_dir}/libcuda.so"));
                }
            }
        }
    }
    for b in &driver.binaries {
        let name = b.rsplit('/').next().unwrap();
        assert_eq!(
            find(&format!("{x}/usr/bin/{name}")).1,
            format!("/run/nvidia/driver/usr/bin/{name}")
        );
        want_links.push(format!("{x}/usr/bin/{name}::/usr/bin/{name}"));
        want_count += 1;
    }
    let fw = find(&format!("{x}/lib/firmware/nvidia/{VER}"));
    assert_eq!(
        fw.1,
        format!("/run/nvidia/driver/lib/firmware/nvidia/{VER}")
    );
    want_count += 1;
    for s in &driver.sockets {
        let name = s.rsplit('/').next().unwrap();
        let m = find(&format!("{x}/run/{name}/socket"));
        assert_eq!(m.1, format!("/run/nvidia/driver/run/{name}/socket"));
        assert_eq!(m.2, SOCKET_OPTS.map(String::from), "{case}: socket options");
        want_count += 1;
    }
    assert_eq!(
        added.len(),
        want_count,
        "{case}: unexpected mounts {added:#?}"
    );
    // The tmpfs is mounted before anything under it (CDI orders mounts by depth).
    let pos = |dest: &str| mounts.iter().position(|m| m.0 == dest).unwrap();
    assert!(
        added.iter().all(|m| pos(x) <= pos(&m.0)),
        "{case}: tmpfs first"
    );

    // Hooks: ours, at the machine path of the helper, createContainer.
    let hooks = oci_create_container_hooks(after);
    assert_eq!(hooks.len(), 3, "{case}: {hooks:#?}");
    for (path, args) in &hooks {
        assert_eq!(path, nspawn_lifecycle::model::layout::HOOK_BINARY, "{case}");
        assert_eq!(args[..2], ["nspawn-lifecycle-helper", "cdi-hook"], "{case}");
    }
    let values = |args: &[String], flag: &str| -> Vec<String> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].clone())
            .collect()
    };
    assert_eq!(hooks[0].1[2], "create-symlinks", "{case}");
    let links = values(&hooks[0].1, "--link");
    for l in &want_links {
        assert!(links.contains(l), "{case}: no link {l} in {links:#?}");
    }
    assert_eq!(hooks[1].1[2], "update-ldcache", "{case}");
    assert_eq!(values(&hooks[1].1, "--lib"), want_libs, "{case}");
    assert_eq!(
        hooks[2].1[2..],
        ["disable-device-node-modification"],
        "{case}"
    );

    let env = oci_env(after);
    assert!(
        env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_owned()),
        "{case}: {env:?}"
    );
    let libcuda_dirs: Vec<_> = driver
        .lib_dirs
        .iter()
        .filter(|d| d.files.iter().any(|f| f.name.starts_with("libcuda.so.")))
        .map(|d| format!("/usr/lib/{}", d.triplet))
        .collect();
    assert!(
        env.contains(&format!(
            "NVIDIA_CTK_LIBCUDA_DIR={}",
            libcuda_dirs.join(":")
        )),
        "{case}: {env:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// (d) What CDI library v0.5.2 (podman 4.3.1 in Debian 12) accepts, from its source
// (`specs-go/config.go`, `pkg/cdi/spec.go`, `pkg/cdi/qualified-device.go`): strict decoding
// against these fields only, the exact version strings below, no dot in the class.

const V052_VERSIONS: [&str; 5] = ["0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0"];
/// Fields CDI 0.5.2 added later; named so a failure says which.
const LATER_FIELDS: [&str; 4] = ["annotations", "additionalGids", "intelRdt", "netDevices"];

fn check_cdi_05x(doc: &Value) -> Result<(), String> {
    fn keys(v: &Value, at: &str, allowed: &[&str]) -> Result<(), String> {
        let obj = v.as_object().ok_or(format!("{at}: not an object"))?;
        for k in obj.keys() {
            if LATER_FIELDS.contains(&k.as_str()) {
                return Err(format!("{at}.{k}: field unknown to CDI 0.5.2"));
            }
            if !allowed.contains(&k.as_str()) {
                return Err(format!("{at}.{k}: unknown field"));
            }
        }
        Ok(())
    }
    fn list<'a>(v: &'a Value, at: &str) -> Result<&'a [Value], String> {
        match v {
            Value::Array(a) => Ok(a),
            _ => Err(format!("{at}: not a list")),
        }
    }
    fn edits(v: &Value, at: &str) -> Result<usize, String> {
        keys(v, at, &["env", "deviceNodes", "hooks", "mounts"])?;
        let mut n = 0;
        for (field, allowed) in [
            (
                "deviceNodes",
                &[
                    "path",
                    "hostPath",
                    "type",
                    "major",
                    "minor",
                    "fileMode",
                    "permissions",
                    "uid",
                    "gid",
                ][..],
            ),
            (
                "mounts",
                &["hostPath", "containerPath", "options", "type"][..],
            ),
            ("hooks", &["hookName", "path", "args", "env", "timeout"][..]),
        ] {
            if let Some(items) = v.get(field) {
                for (i, item) in list(items, &format!("{at}.{field}"))?.iter().enumerate() {
                    keys(item, &format!("{at}.{field}[{i}]"), allowed)?;
                    n += 1;
                }
            }
        }
        if let Some(env) = v.get("env") {
            n += list(env, &format!("{at}.env"))?.len();
        }
        Ok(n)
    }
    fn name_ok(s: &str, first: fn(&u8) -> bool, inner: &[u8]) -> bool {
        let b = s.as_bytes();
        !b.is_empty()
            && first(&b[0])
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || inner.contains(c))
    }

    keys(
        doc,
        "spec",
        &["cdiVersion", "kind", "devices", "containerEdits"],
    )?;
    let kind = doc["kind"].as_str().ok_or("kind: not a string")?;
    let (vendor, class) = kind
        .split_once('/')
        .ok_or(format!("kind {kind:?}: no '/'"))?;
    if !name_ok(vendor, u8::is_ascii_alphabetic, b"_.-") {
        return Err(format!("kind {kind:?}: bad vendor"));
    }
    if !name_ok(class, u8::is_ascii_alphabetic, b"_-") {
        return Err(format!(
            "kind {kind:?}: bad class (CDI 0.5.2 allows no '.')"
        ));
    }
    if let Some(ce) = doc.get("containerEdits") {
        edits(ce, "containerEdits")?;
    }
    let devices = list(&doc["devices"], "devices")?;
    if devices.is_empty() {
        return Err("no devices".into());
    }
    let mut names = BTreeSet::new();
    for (i, d) in devices.iter().enumerate() {
        let at = format!("devices[{i}]");
        keys(d, &at, &["name", "containerEdits"])?;
        let name = d["name"]
            .as_str()
            .ok_or(format!("{at}.name: not a string"))?;
        if !name_ok(name, u8::is_ascii_alphanumeric, b"_.:-") || !names.insert(name) {
            return Err(format!("{at}.name {name:?}: invalid or repeated"));
        }
        if edits(&d["containerEdits"], &format!("{at}.containerEdits"))? == 0 {
            return Err(format!("{at}: empty device edits"));
        }
    }
    let version = doc["cdiVersion"]
        .as_str()
        .ok_or("cdiVersion: not a string")?;
    if !V052_VERSIONS.contains(&version) {
        return Err(format!(
            "cdiVersion {version:?}: CDI 0.5.2 knows only {V052_VERSIONS:?}"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// (e) Golden files.

fn check_golden(case: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/cdi-{case}.json"));
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run UPDATE_GOLDEN=1 cargo test --test cdi",
            path.display()
        )
    });
    assert!(
        want == text,
        "{case}: generated spec differs from {} (UPDATE_GOLDEN=1 rewrites it)\n{}",
        path.display(),
        similar::TextDiff::from_lines(&want, text).unified_diff()
    );
}

/// Parse `text` with the official library's raw spec types and serialize them back: equal to
/// `text` as JSON when the library read every field we wrote with the value we wrote (nothing
/// dropped as null or empty, renamed or retyped). The reference is the library's, not ours.
fn library_reads_what_was_written(text: &str) -> Result<(), String> {
    let written: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let dir = spec_dir(text);
    let raw = cdi_lib::spec::parse_spec(&dir.path().join(cdi::DEFAULT_SPEC_FILE))
        .map_err(|e| format!("{e:#}"))?;
    let read = serde_json::to_value(&raw).map_err(|e| e.to_string())?;
    if read == written {
        return Ok(());
    }
    Err(format!(
        "the official CDI library read a different spec than the one written:\n{}",
        similar::TextDiff::from_lines(
            serde_json::to_string_pretty(&written).unwrap(),
            serde_json::to_string_pretty(&read).unwrap()
        )
        .unified_diff()
        .header("written", "read by the library")
    ))
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[test]
fn every_case_passes_schema_loader_injection_05x_and_golden() {
    let head = schema(".");
    let v052 = schema("v0.5.2");
    for (case, inv) in cases() {
        let (spec, text, doc) = generated(&inv);

        // (a)
        assert_eq!(
            schema_errors(&head, &doc),
            Vec::<String>::new(),
            "{case}: schema"
        );

        // (b)
        let loaded = strict_load(&text).unwrap_or_else(|e| panic!("{case}: strict load: {e}"));
        assert_eq!(loaded.get_vendor(), "nvidia.com");
        assert_eq!(loaded.get_class(), "gpu");
        let n = inv.gpus.len();
        let mut want_names: BTreeSet<String> = (0..n).map(|i| i.to_string()).collect();
        want_names.extend(inv.gpus.iter().map(|g| g.uuid.clone()));
        want_names.insert("all".into());
        assert_eq!(
            loaded.devices.keys().cloned().collect::<BTreeSet<_>>(),
            want_names,
            "{case}: device names"
        );
        // Our minimum-version rule agrees with the library's.
        let raw = cdi_lib::spec::parse_spec(&spec_dir(&text).path().join(cdi::DEFAULT_SPEC_FILE))
            .unwrap();
        assert_eq!(
            cdi_lib::version::minimum_required_version(&raw)
                .unwrap()
                .to_string(),
            spec.cdi_version,
            "{case}"
        );

        // (c) by index, by UUID, and all.
        for (names, gpus) in [
            (vec![format!("{KIND}=0")], vec![0]),
            (vec![format!("{KIND}={}", uuid(0))], vec![0]),
            (vec![format!("{KIND}=all")], (0..n as u32).collect()),
        ] {
            let (after, before) =
                inject(&text, &names).unwrap_or_else(|e| panic!("{case} {names:?}: {e}"));
            check_injection(&format!("{case} {names:?}"), &inv, &after, &before, &gpus);
        }
        if n > 1 {
            let last = n as u32 - 1;
            let names = vec![format!("{KIND}={last}"), format!("{KIND}={}", uuid(0))];
            let (after, before) = inject(&text, &names).unwrap();
            check_injection(
                &format!("{case} {names:?}"),
                &inv,
                &after,
                &before,
                &[0, last],
            );
        }

        // (d)
        assert_eq!(
            spec.cdi_version, "0.5.0",
            "{case}: digit-first names need exactly 0.5.0"
        );
        check_cdi_05x(&doc).unwrap_or_else(|e| panic!("{case}: CDI 0.5.x: {e}"));
        assert_eq!(
            schema_errors(&v052, &doc),
            Vec::<String>::new(),
            "{case}: v0.5.2 schema"
        );

        // (e) Against references the renderer does not produce: the official library's own types
        // re-serialized (what it read, field for field: nothing dropped, renamed or retyped) equal
        // the document we wrote, and the bytes are the reviewed golden file's.
        library_reads_what_was_written(&text).unwrap_or_else(|e| panic!("{case}: {e}"));
        check_golden(case, &text);
    }
}

#[test]
fn caps_and_imex_channels_are_in_no_device() {
    let (_, inv) = cases()
        .into_iter()
        .find(|(c, _)| *c == "8gpu-caps-imex")
        .unwrap();
    let (_, text, _) = generated(&inv);
    assert!(!text.contains("nvidia-caps"), "{text}");
}

#[test]
fn gpu_order_in_the_inventory_does_not_change_the_bytes() {
    let (_, mut inv) = cases().into_iter().find(|(c, _)| *c == "2gpu-drm").unwrap();
    let (_, text, _) = generated(&inv);
    inv.gpus.reverse();
    assert_eq!(generated(&inv).1, text);
}

#[test]
fn no_spec_without_gpus_or_complete_driver() {
    let (_, one) = cases().remove(0);
    let mut no_gpus = one.clone();
    no_gpus.gpus.clear();
    no_gpus.devices.retain(|d| d.role != DeviceRole::Gpu);
    assert_eq!(cdi::spec(&no_gpus, KIND), None, "0 GPUs");

    let none = Inventory {
        devices: vec![],
        kvm: None,
        host_devices: Vec::new(),
        disks: Vec::new(),
        gpus: vec![],
        kernel_module: None,
        driver: None,
        verdict: Verdict::None,
    };
    assert_eq!(cdi::spec(&none, KIND), None, "no NVIDIA at all");

    let mut incomplete = one.clone();
    incomplete.verdict = Verdict::Incomplete {
        reasons: vec!["libnvidia-ml.so.580.82.07 missing".into()],
    };
    assert_eq!(cdi::spec(&incomplete, KIND), None, "incomplete driver");

    let mut no_node = one;
    no_node.gpus[0].device = None;
    assert_eq!(cdi::spec(&no_node, KIND), None, "GPU without /dev/nvidiaN");
}

#[test]
fn cdi_version_follows_the_content() {
    let (_, inv) = cases().remove(0);
    let (spec, _, _) = generated(&inv);
    let lib_version = |s: &cdi::Spec| {
        let text = cdi::render(s);
        let dir = spec_dir(&text);
        let raw = cdi_lib::spec::parse_spec(&dir.path().join(cdi::DEFAULT_SPEC_FILE)).unwrap();
        cdi_lib::version::minimum_required_version(&raw)
            .unwrap()
            .to_string()
    };

    // Only "all": no digit-first name; the tmpfs mount's `type` needs 0.4.0.
    let mut only_all = spec.clone();
    only_all.devices.retain(|d| d.name == "all");
    assert!(
        only_all
            .container_edits
            .device_nodes
            .iter()
            .all(|n| n.major > 0)
    );
    assert_eq!(cdi::minimum_version(&only_all), "0.4.0");
    assert_eq!(lib_version(&only_all), "0.4.0");
    // Without mounts, type/major/minor on nodes and hooks do not raise the version.
    only_all.container_edits.mounts.clear();
    assert!(!only_all.container_edits.hooks.is_empty());
    assert_eq!(cdi::minimum_version(&only_all), "0.3.0");
    assert_eq!(lib_version(&only_all), "0.3.0");

    // A dotted class needs 0.6.0 (and is why config refuses one).
    let mut dotted = spec.clone();
    dotted.kind = "nvidia.com/gpu.x".into();
    assert_eq!(cdi::minimum_version(&dotted), "0.6.0");
    assert_eq!(lib_version(&dotted), "0.6.0");

    // Another kind, same content: same version, and it loads.
    let other = cdi::spec(&inv, "example.com/device").unwrap();
    assert_eq!(other.cdi_version, "0.5.0");
    strict_load(&cdi::render(&other)).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Negative tests: each validator rejects what it must.

/// One edit of a spec document.
type Change = fn(&mut Value);

fn one_gpu_doc() -> Value {
    let (_, inv) = cases().remove(0);
    generated(&inv).2
}

#[test]
fn cdi_05x_check_rejects_what_podman_4_3_rejects() {
    let good = one_gpu_doc();
    check_cdi_05x(&good).unwrap();
    let variants: Vec<(&str, Change)> = vec![
        ("additionalGids", |d| {
            d["devices"][0]["containerEdits"]["additionalGids"] = json!([44])
        }),
        ("additionalGids", |d| {
            d["cdiVersion"] = json!("0.7.0");
            d["containerEdits"]["additionalGids"] = json!([44]);
        }),
        ("annotations", |d| d["annotations"] = json!({"a": "b"})),
        ("annotations", |d| {
            d["devices"][1]["annotations"] = json!({"a": "b"})
        }),
        ("intelRdt", |d| d["containerEdits"]["intelRdt"] = json!({})),
        ("netDevices", |d| {
            d["containerEdits"]["netDevices"] =
                json!([{"hostInterfaceName": "eth0", "name": "eth1"}])
        }),
        ("cdiVersion", |d| d["cdiVersion"] = json!("0.6.0")),
        ("cdiVersion", |d| d["cdiVersion"] = json!("v0.5.0")),
        ("bad class", |d| d["kind"] = json!("nvidia.com/gpu.x")),
        ("unknown field", |d| {
            d["containerEdits"]["mounts"][0]["bogus"] = json!(1)
        }),
        ("empty device edits", |d| {
            d["devices"][0]["containerEdits"] = json!({})
        }),
    ];
    for (want, change) in variants {
        let mut doc = good.clone();
        change(&mut doc);
        let err = check_cdi_05x(&doc).expect_err(want);
        assert!(err.contains(want), "{want}: {err}");
    }
}

#[test]
fn the_library_reread_check_tells_a_spec_read_differently() {
    let good = one_gpu_doc();
    library_reads_what_was_written(&good.to_string()).unwrap();
    // Each parses, but the library keeps something else than the document says.
    let changes: [(&str, Change); 2] = [
        ("null host path", |d| {
            d["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = json!(null)
        }),
        ("empty annotations", |d| d["annotations"] = json!({})),
    ];
    for (what, change) in changes {
        let mut doc = good.clone();
        change(&mut doc);
        let err = library_reads_what_was_written(&doc.to_string()).expect_err(what);
        assert!(err.contains("read a different spec"), "{what}: {err}");
    }
}

#[test]
fn strict_loader_rejects_unknown_fields_that_the_schema_lets_through() {
    let head = schema(".");
    let good = one_gpu_doc();
    strict_load(&good.to_string()).unwrap();
    let changes: [(&str, Change); 2] = [
        ("top level", |d| d["bogus"] = json!(true)),
        ("device node", |d| {
            d["devices"][0]["containerEdits"]["deviceNodes"][0]["bogus"] = json!(1)
        }),
    ];
    for (at, change) in changes {
        let mut doc = good.clone();
        change(&mut doc);
        // The schema has no additionalProperties: false, so it alone would let this pass.
        assert!(head.is_valid(&doc), "{at}");
        let err = strict_load(&doc.to_string()).expect_err(at);
        assert!(err.contains("bogus"), "{at}: {err}");
    }
    // The loader also enforces the minimum version.
    let mut doc = good.clone();
    doc["devices"][0]["containerEdits"]["additionalGids"] = json!([44]);
    let err = strict_load(&doc.to_string()).unwrap_err();
    assert!(err.contains("must be at least"), "{err}");
}

#[test]
fn schema_is_really_loaded_with_its_definitions() {
    for sub in [".", "v0.5.2"] {
        let v = schema(sub);
        let dir = schema_dir().join("testdata");
        for good in ["good/minimal.json", "good/spec-example.json"] {
            let doc = read_json(&dir.join(good));
            assert_eq!(
                schema_errors(&v, &doc),
                Vec::<String>::new(),
                "{sub} {good}"
            );
        }
        assert!(
            !v.is_valid(&read_json(&dir.join("bad/explicit-empty.json"))),
            "{sub}"
        );
        // Rules that live in defs.json: they fire only if the "$ref"s resolved.
        let mut doc = one_gpu_doc();
        doc["devices"][0]["containerEdits"]["deviceNodes"][0]
            .as_object_mut()
            .unwrap()
            .remove("path");
        assert!(!v.is_valid(&doc), "{sub}: deviceNode without path");
        let mut doc = one_gpu_doc();
        doc["devices"][0]["containerEdits"]["deviceNodes"][0]["major"] = json!("195");
        assert!(!v.is_valid(&doc), "{sub}: major as a string");
        let mut doc = one_gpu_doc();
        doc["devices"][0]
            .as_object_mut()
            .unwrap()
            .remove("containerEdits");
        assert!(!v.is_valid(&doc), "{sub}: device without containerEdits");
    }
    // HEAD also checks the spec-level edits, which v0.5.2's schema did not describe.
    let mut doc = one_gpu_doc();
    doc["containerEdits"]["mounts"][0]
        .as_object_mut()
        .unwrap()
        .remove("hostPath");
    assert!(!schema(".").is_valid(&doc));
}

#[test]
fn injection_rejects_unknown_devices() {
    let (_, inv) = cases().remove(0);
    let (_, text, _) = generated(&inv);
    let err = inject(&text, &[format!("{KIND}=1")]).unwrap_err();
    assert!(err.contains("unresolvable CDI devices"), "{err}");
}

#[test]
fn fully_described_nodes_are_never_stated() {
    // A node path that is a regular file: with type/major/minor CDI injects it as written,
    // without them it stats the path and refuses it. Our nodes always carry all three.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-node");
    std::fs::write(&file, "").unwrap();
    let mut doc = one_gpu_doc();
    doc["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] = json!(file.to_str().unwrap());
    let names = [format!("{KIND}=0")];
    let (after, _) = inject(&doc.to_string(), &names).unwrap();
    assert!(
        oci_devices(&after).contains(&(file.display().to_string(), "c".into(), 195, 0)),
        "{:?}",
        oci_devices(&after)
    );
    for field in ["type", "major", "minor"] {
        doc["devices"][0]["containerEdits"]["deviceNodes"][0]
            .as_object_mut()
            .unwrap()
            .remove(field);
    }
    // The cache keeps only the outer context; the cause, from the node itself:
    let mut bare = cdi_lib::container_edits::DeviceNode {
        node: serde_json::from_value(json!({"path": file.to_str().unwrap()})).unwrap(),
    };
    let cause = format!("{:#}", bare.fill_missing_info().unwrap_err());
    assert!(cause.contains("not a device node"), "{cause}");
    let err = inject(&doc.to_string(), &names).unwrap_err();
    assert!(err.contains("filling missing info failed"), "{err}");
}

#[test]
fn our_own_spec_is_recognised_as_a_conflict_only_under_another_name() {
    let (_, inv) = cases().remove(0);
    let (_, text, _) = generated(&inv);
    assert!(!cdi::conflicts(
        KIND,
        &cdi::spec_file_name(KIND),
        text.as_bytes()
    ));
    assert!(cdi::conflicts(KIND, "nvidia.json", text.as_bytes()));
    assert!(!cdi::conflicts(
        "example.com/device",
        "nvidia.json",
        text.as_bytes()
    ));
}

/// `status` judges a machine's spec with `cdi::check`: it accepts every spec we generate, reading
/// the same device names the official loader does, and rejects what the loader rejects.
#[test]
fn status_check_accepts_what_we_write_and_rejects_what_the_loader_rejects() {
    for (case, inv) in cases() {
        let (_, text, _) = generated(&inv);
        let checked = cdi::check(KIND, text.as_bytes()).unwrap_or_else(|e| panic!("{case}: {e}"));
        let loaded = strict_load(&text).unwrap();
        assert_eq!(
            checked
                .devices
                .iter()
                .map(|(n, _)| n.clone())
                .collect::<BTreeSet<_>>(),
            loaded.devices.keys().cloned().collect::<BTreeSet<_>>(),
            "{case}"
        );
    }
    let (_, text, doc) = generated(&cases()[0].1);
    let mutate = |f: &dyn Fn(&mut Value)| {
        let mut d = doc.clone();
        f(&mut d);
        serde_json::to_string(&d).unwrap()
    };
    for (what, bad) in [
        ("unknown key", mutate(&|d| d["bogus"] = Value::from(1))),
        (
            "bad device name",
            mutate(&|d| d["devices"][0]["name"] = Value::from("-0")),
        ),
        (
            "duplicate device",
            mutate(&|d| {
                let first = d["devices"][0].clone();
                d["devices"].as_array_mut().unwrap().push(first);
            }),
        ),
        (
            "unknown edit key",
            mutate(&|d| d["containerEdits"]["bogus"] = Value::from(1)),
        ),
        ("not JSON", text[..text.len() / 2].to_owned()),
    ] {
        assert!(strict_load(&bad).is_err(), "{what}: the loader accepts it");
        assert!(
            cdi::check(KIND, bad.as_bytes()).is_err(),
            "{what}: check accepts it"
        );
    }
}

/// Issue 14: a machine given four of the host's eight GPUs by UUID gets a spec of exactly them
/// (indices 0-3 as the machine sees them, in PCI bus order; their UUIDs; `all` = exactly their
/// nodes, plus the shared control nodes); after the host renumbers them (same UUIDs, other
/// minors), the same UUIDs with their new nodes. Both pass the schema and the strict loader,
/// and the bytes are pinned.
#[test]
fn a_share_of_the_gpus_lists_exactly_them_and_follows_renumbering() {
    use nspawn_lifecycle::config::{GpuSelector, Gpus};
    use nspawn_lifecycle::discovery::assign::assign;
    let host = || {
        inventory(Host {
            gpus: 8,
            drm: true,
            caps_imex: true,
            lib_dirs: vec![lib_dir("x86_64-linux-gnu", native_files())],
            binaries: &["/usr/bin/nvidia-smi"],
            sockets: &["/run/nvidia-persistenced"],
        })
    };
    let mine: Vec<u32> = vec![4, 5, 6, 7];
    let gpus = Gpus::List(mine.iter().map(|i| GpuSelector::Uuid(uuid(*i))).collect());
    let head = schema(".");
    // As discovered, then renumbered: the GPU with UUID k now has minor 7-k and its nodes.
    let mut renumbered = host();
    for g in &mut renumbered.gpus {
        let k = u32::from_str_radix(&g.uuid[4..12], 16).unwrap();
        let other = host().gpus[7 - k as usize].clone();
        g.minor = other.minor;
        g.device = other.device;
        g.dri = other.dri;
        g.bus_id = other.bus_id;
    }
    renumbered.gpus.sort_by_key(|g| g.bus_id.clone());
    for (i, g) in renumbered.gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
    for (case, inv, minors) in [
        ("8gpu-share-4-7", host(), [4u32, 5, 6, 7]),
        ("8gpu-share-4-7-renumbered", renumbered, [3, 2, 1, 0]),
    ] {
        let a = assign(&inv, &gpus);
        assert!(a.missing.is_empty(), "{case}");
        let (_, text, doc) = generated(&a.view);
        assert_eq!(schema_errors(&head, &doc), Vec::<String>::new(), "{case}");
        let loaded = strict_load(&text).unwrap_or_else(|e| panic!("{case}: {e}"));
        let mut want: BTreeSet<String> = (0..4).map(|i: u32| i.to_string()).collect();
        want.extend(mine.iter().map(|i| uuid(*i)));
        want.insert("all".into());
        assert_eq!(
            loaded.devices.keys().cloned().collect::<BTreeSet<_>>(),
            want,
            "{case}"
        );
        // Each UUID's device is its GPU's node now; nothing of the other four GPUs anywhere.
        for (k, minor) in mine.iter().zip(minors) {
            let dev = doc["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["name"] == uuid(*k))
                .unwrap();
            assert_eq!(
                dev["containerEdits"]["deviceNodes"][0]["path"],
                format!("/dev/nvidia{minor}"),
                "{case}"
            );
        }
        let all = doc["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == "all")
            .unwrap();
        let gpu_nodes: BTreeSet<String> = all["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap().to_owned())
            .filter(|p| p.starts_with("/dev/nvidia"))
            .collect();
        let want_nodes: BTreeSet<String> =
            minors.iter().map(|m| format!("/dev/nvidia{m}")).collect();
        assert_eq!(gpu_nodes, want_nodes, "{case}: all");
        let (after, before) = inject(&text, &[format!("{KIND}=all")]).unwrap();
        check_injection(case, &a.view, &after, &before, &[0, 1, 2, 3]);
        check_golden(case, &text);
    }
}

/// Issue 15: host mode's spec (driver root `/`) is the machine's with every driver file bound
/// from its real host path and the hooks run by the installed helper: it passes the same
/// schema, strict loader, injection, 0.5.x rules and library reading, names no path of a
/// machine's driver root, and is pinned by a golden file.
#[test]
fn host_mode_specs_pass_the_same_checks_with_host_paths() {
    let head = schema(".");
    let v052 = schema("v0.5.2");
    let helper = "/usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper";
    for (case, inv) in cases() {
        let spec = cdi::spec_on_host(&inv, KIND, helper).unwrap().unwrap();
        let text = cdi::render(&spec);
        let doc: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(schema_errors(&head, &doc), Vec::<String>::new(), "{case}");
        assert_eq!(schema_errors(&v052, &doc), Vec::<String>::new(), "{case}");
        check_cdi_05x(&doc).unwrap_or_else(|e| panic!("{case}: CDI 0.5.x: {e}"));
        strict_load(&text).unwrap_or_else(|e| panic!("{case}: strict load: {e}"));
        library_reads_what_was_written(&text).unwrap_or_else(|e| panic!("{case}: {e}"));
        inject(&text, &[format!("{KIND}=all")]).unwrap_or_else(|e| panic!("{case}: {e}"));

        let machine = cdi::spec(&inv, KIND).unwrap();
        assert_eq!(spec.devices, machine.devices, "{case}: the same devices");
        assert_eq!(spec.cdi_version, machine.cdi_version, "{case}");
        let driver = inv.driver.as_ref().unwrap();
        let mut host_files: BTreeSet<String> = BTreeSet::new();
        for d in &driver.lib_dirs {
            host_files.extend(d.files.iter().map(|f| format!("{}/{}", d.path, f.name)));
        }
        host_files.extend(driver.binaries.iter().map(|b| b.to_string()));
        let dirs: Vec<String> = driver.sockets.iter().map(|s| s.to_string()).collect();
        let mounts = &spec.container_edits.mounts;
        assert_eq!(mounts.len(), machine.container_edits.mounts.len(), "{case}");
        for (m, mm) in mounts.iter().zip(&machine.container_edits.mounts) {
            assert_eq!(
                (&m.container_path, &m.options, &m.kind),
                (&mm.container_path, &mm.options, &mm.kind),
                "{case}"
            );
            if m.kind.is_some() {
                continue;
            }
            assert!(
                !m.host_path.starts_with("/run/nvidia/driver"),
                "{case}: {m:?}"
            );
            let known = host_files.contains(&m.host_path)
                || dirs
                    .iter()
                    .any(|d| m.host_path.starts_with(&format!("{d}/")))
                || driver.firmware.as_ref().is_some_and(|f| *f == m.host_path);
            assert!(known, "{case}: {} is no host driver file", m.host_path);
        }
        for h in &spec.container_edits.hooks {
            assert_eq!(h.path, helper, "{case}");
        }
        if case == "2gpu-drm" {
            check_golden("host-2gpu-drm", &text);
        }
    }
}
