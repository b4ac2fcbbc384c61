//! Every JSON output against its JSON Schema in `assets/json-schema/` (one per `kind`), as a
//! consumer would validate it: `discover --json` on every example host and the pinned real-driver
//! goldens, `plan --json`, `install`/`uninstall --json` (dry run and real), `status --json` in each of its shapes (one machine, `--all`,
//! nothing installed, and the error object when it cannot judge), `host plan --json` and `host
//! status --json`. The validator is Python's
//! `jsonschema` (Debian's python3-jsonschema, installed by tests/run-all.sh); without it the test
//! FAILS, naming the package. A mutated document must be rejected, so the check cannot pass
//! vacuously.
//!
//! Privileged (the example hosts hold device nodes made with mknod).

#![allow(clippy::unwrap_used)]

mod common;
use common::{installed_host, machine_tree, stdout_of_exit as stdout_of};
use std::path::{Path, PathBuf};
use std::process::Command;

fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/json-schema")
}

/// Validates each `SCHEMA=FILE` argument; prints one line per invalid document, exits 1 if any.
/// The shipped schemas let consumers see fields added later (no `additionalProperties: false`);
/// with `STRICT=1` every object that lists its properties allows no other, so the tests catch an
/// output field the schema does not document.
const VALIDATE: &str = r#"
import json, os, sys
try:
    import jsonschema
except ImportError:
    print("python3 has no jsonschema module: install Debian's python3-jsonschema"); sys.exit(2)
def strict(s):
    if isinstance(s, dict):
        if "properties" in s and "additionalProperties" not in s:
            s["additionalProperties"] = False
        for v in s.values():
            strict(v)
    elif isinstance(s, list):
        for v in s:
            strict(v)
bad = 0
for arg in sys.argv[2:]:
    name, path = arg.split("=", 1)
    schema = json.load(open(os.path.join(sys.argv[1], name)))
    if os.environ.get("STRICT") == "1":
        strict(schema)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    doc = json.load(open(path))
    for e in sorted(cls(schema).iter_errors(doc), key=str)[:5]:
        bad += 1
        print("%s: %s at %s: %s" % (name, os.path.basename(path), "/".join(map(str, e.absolute_path)), e.message[:300]))
sys.exit(1 if bad else 0)
"#;

/// Collects documents, then validates them all in one run of the validator.
struct Docs {
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl Docs {
    fn new() -> Docs {
        Docs {
            dir: tempfile::tempdir().unwrap(),
            args: Vec::new(),
        }
    }

    fn add(&mut self, schema: &str, what: &str, json: &[u8]) {
        let v: serde_json::Value = serde_json::from_slice(json).unwrap_or_else(|e| {
            panic!("{what}: not JSON ({e}): {}", String::from_utf8_lossy(json))
        });
        let path = self
            .dir
            .path()
            .join(format!("{}-{what}.json", self.args.len()));
        std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        self.args.push(format!("{schema}={}", path.display()));
    }

    /// The validator's verdict, strict (no undocumented field): `Ok` when every document is
    /// valid, else its lines.
    fn check(&self) -> Result<(), String> {
        self.check_as(true)
    }

    /// The verdict under the schemas as shipped (`strict` false: fields added later pass).
    fn check_as(&self, strict: bool) -> Result<(), String> {
        let out = Command::new("python3")
            .env("STRICT", if strict { "1" } else { "0" })
            .arg("-c")
            .arg(VALIDATE)
            .arg(schema_dir())
            .args(&self.args)
            .output()
            .expect("python3 runs the JSON Schema validator");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_ne!(out.status.code(), Some(2), "{said}");
        if out.status.success() {
            Ok(())
        } else {
            Err(said)
        }
    }
}

#[test]
fn privileged_every_json_output_matches_its_schema() {
    let mut docs = Docs::new();
    for (name, _) in nspawn_lifecycle::fixture::EXAMPLES {
        let host = installed_host(name, &[]);
        docs.add(
            "host-discovery.schema.json",
            &format!("discover-{name}"),
            &stdout_of(host.path(), &["discover", "--json"], 0),
        );
    }
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    for e in std::fs::read_dir(&golden).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".discover.json") {
            docs.add(
                "host-discovery.schema.json",
                &name,
                &std::fs::read(&p).unwrap(),
            );
        }
    }
    for name in ["two-gpus", "cpu-only"] {
        let host = installed_host(name, &[]);
        std::fs::create_dir_all(host.path().join("var/lib/machines/kube1")).unwrap();
        let plan = |docs: &mut Docs, what: &str, code| {
            let out = stdout_of(
                host.path(),
                &["plan", "kube1", "--json", "--exit-code"],
                code,
            );
            docs.add(
                "machine-plan.schema.json",
                &format!("plan-{name}-{what}"),
                &out,
            );
        };
        plan(&mut docs, "missing", 9);
        stdout_of(host.path(), &["nspawn-lifecycle", "pre-start", "kube1"], 0);
        plan(&mut docs, "up-to-date", 0);
    }
    // install and uninstall, as a dry run and for real (under --host-root: no daemon-reload).
    let node = installed_host("two-gpus", &[]);
    std::fs::create_dir_all(node.path().join("var/lib/machines/kube1")).unwrap();
    for (what, args) in [
        (
            "install-dry-run",
            &["install", "kube1", "--dry-run", "--json"][..],
        ),
        ("install", &["install", "kube1", "--json"]),
        ("install-again", &["install", "kube1", "--json"]),
        (
            "uninstall-dry-run",
            &["uninstall", "kube1", "--dry-run", "--json"],
        ),
        ("uninstall", &["uninstall", "kube1", "--json"]),
    ] {
        docs.add(
            "install-report.schema.json",
            what,
            &stdout_of(node.path(), args, 0),
        );
    }
    let gpus = installed_host("two-gpus", &["kube1", "kube2"]);
    let m = machine_tree();
    let mr = m.path().to_str().unwrap();
    docs.add(
        "machine-status.schema.json",
        "status-kube1",
        &stdout_of(
            gpus.path(),
            &["status", "kube1", "--json", "--machine-root", mr],
            5,
        ),
    );
    docs.add(
        "machine-status-list.schema.json",
        "status-all",
        &stdout_of(
            gpus.path(),
            &["status", "--all", "--json", "--machine-root", mr],
            5,
        ),
    );
    docs.add(
        "status-error.schema.json",
        "status-not-installed",
        &stdout_of(gpus.path(), &["status", "kube9", "--json"], 2),
    );
    let none = installed_host("two-gpus", &[]);
    docs.add(
        "machine-status-list.schema.json",
        "status-nothing-installed",
        &stdout_of(none.path(), &["status", "--all", "--json"], 8),
    );
    // Host mode: plan on hosts with a driver, without GPUs and incomplete; status not
    // installed, then installed (under --host-root the files alone are judged).
    for (name, code) in [("two-gpus", 0), ("cpu-only", 0), ("version-mismatch", 3)] {
        let host = installed_host(name, &[]);
        docs.add(
            "host-plan.schema.json",
            &format!("host-plan-{name}"),
            &stdout_of(host.path(), &["host", "plan", "--json"], code),
        );
    }
    let h = installed_host("two-gpus", &[]);
    docs.add(
        "status-error.schema.json",
        "host-status-not-installed",
        &stdout_of(h.path(), &["host", "status", "--json"], 2),
    );
    // A --json command that fails before its report still prints one object: plan of a
    // machine while the driver is incomplete (3), install of a machine with no image (2).
    let incomplete = installed_host("version-mismatch", &["kube1"]);
    docs.add(
        "command-error.schema.json",
        "plan-incomplete",
        &stdout_of(incomplete.path(), &["plan", "kube1", "--json"], 3),
    );
    docs.add(
        "command-error.schema.json",
        "install-no-image",
        &stdout_of(h.path(), &["install", "kube9", "--json"], 2),
    );
    // A command line that does not parse, with --json: one object all the same (exit 2), of the
    // kind its command's failures carry, UsageError where it names none with --json; a bad
    // NSPAWN_LIFECYCLE_LOG likewise.
    for (schema, args) in [
        ("command-error.schema.json", &["plan", "--json", "a..b"][..]),
        ("command-error.schema.json", &["install", "--json"]),
        (
            "command-error.schema.json",
            &["discover", "--json", "--bogus"],
        ),
        (
            "command-error.schema.json",
            &["uninstall", "--json", "--bogus"],
        ),
        (
            "command-error.schema.json",
            &["host", "plan", "--json", "--x"],
        ),
        (
            "command-error.schema.json",
            &["nspawn-lifecycle", "pre-start", "--json", "kube1"],
        ),
        ("status-error.schema.json", &["status", "--json", "--bogus"]),
        (
            "status-error.schema.json",
            &["host", "status", "--json", "x"],
        ),
    ] {
        docs.add(
            schema,
            &format!("usage {args:?}"),
            &stdout_of(h.path(), args, 2),
        );
    }
    for (schema, args) in [
        ("command-error.schema.json", &["discover", "--json"][..]),
        ("status-error.schema.json", &["status", "kube1", "--json"]),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nspawn-lifecycle-helper"))
            .arg("--host-root")
            .arg(h.path())
            .args(args)
            .env("NSPAWN_LIFECYCLE_LOG", "not=a=filter[")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        docs.add(schema, &format!("log filter {args:?}"), &out.stdout);
    }
    stdout_of(h.path(), &["install", "--host"], 0);
    docs.add(
        "host-status.schema.json",
        "host-status",
        &stdout_of(h.path(), &["host", "status", "--json"], 6),
    );
    docs.check().unwrap();

    // The schemas bite: a wrong kind, an unknown field, a missing field are each refused.
    let status = stdout_of(
        gpus.path(),
        &["status", "kube1", "--json", "--machine-root", mr],
        5,
    );
    let v: serde_json::Value = serde_json::from_slice(&status).unwrap();
    for (what, edit) in [
        (
            "kind",
            &(|v: &mut serde_json::Value| v["kind"] = "HostDiscovery".into())
                as &dyn Fn(&mut serde_json::Value),
        ),
        ("extra", &|v: &mut serde_json::Value| {
            v["surprise"] = 1.into()
        }),
        ("missing", &|v: &mut serde_json::Value| {
            v.as_object_mut().unwrap().remove("findings");
        }),
    ] {
        let mut bad = v.clone();
        edit(&mut bad);
        let mut docs = Docs::new();
        docs.add(
            "machine-status.schema.json",
            what,
            &serde_json::to_vec(&bad).unwrap(),
        );
        assert!(
            docs.check().is_err(),
            "a status with its {what} edited passed"
        );
        // As shipped, a consumer's validator lets a field added later through, nothing else.
        assert_eq!(
            docs.check_as(false).is_ok(),
            what == "extra",
            "{what} under the shipped schema"
        );
    }
}

/// The schemas a consumer validates against (installed with the package under
/// /usr/share/nspawn-lifecycle/json-schema/) allow fields added later, as docs/monitoring.md
/// promises ("new fields may be added"): none closes an object.
#[test]
fn the_shipped_schemas_allow_fields_added_later() {
    for e in std::fs::read_dir(schema_dir()).unwrap() {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            !text.contains("\"additionalProperties\": false"),
            "{} closes an object",
            p.display()
        );
    }
}

/// The status schemas are one schema written three times, so each file stands alone for a
/// consumer's validator (no cross-file `$ref` to resolve): `host-status` is `machine-status`
/// with its own `kind` and `machine`, and `machine-status-list` embeds `machine-status` whole.
/// An edit to one that the others do not get fails here.
#[test]
fn the_status_schemas_are_one_schema() {
    let load = |name: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(schema_dir().join(name)).unwrap()).unwrap()
    };
    let machine = load("machine-status.schema.json");
    let mut host = load("host-status.schema.json");
    assert_eq!(
        host["properties"]["kind"],
        serde_json::json!({"const": "HostStatus"})
    );
    assert_eq!(
        host["properties"]["machine"],
        serde_json::json!({"const": "host"})
    );
    for key in ["$id", "title", "description"] {
        host[key] = machine[key].clone();
    }
    for key in ["kind", "machine"] {
        host["properties"][key] = machine["properties"][key].clone();
    }
    assert_eq!(
        host, machine,
        "host-status is machine-status but for kind and machine"
    );

    let list = load("machine-status-list.schema.json");
    let mut body = machine.clone();
    let body_map = body.as_object_mut().unwrap();
    for key in ["$schema", "$id", "title", "description", "$defs"] {
        body_map.remove(key);
    }
    assert_eq!(
        list["$defs"]["machineStatus"], body,
        "the list's machineStatus"
    );
    assert_eq!(list["$defs"]["assignment"], machine["$defs"]["assignment"]);
}
