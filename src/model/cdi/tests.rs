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
