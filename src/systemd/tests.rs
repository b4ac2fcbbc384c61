use super::*;

#[test]
fn no_bus_names_its_cause_once() {
    let deadline = Instant::now() + Duration::from_secs(5);
    let Err(e) = Systemd::at_address("unix:path=/nonexistent/bus", "test", deadline) else {
        panic!("connected to a bus that does not exist");
    };
    let line = format!("{e:#}");
    let segments: Vec<&str> = line.split(": ").collect();
    for (i, s) in segments.iter().enumerate() {
        assert!(!segments[..i].contains(s), "{s:?} repeated in {line:?}");
    }
    assert!(line.contains("No such file or directory"), "{line}");
}

#[test]
fn job_results_round_trip_and_explain_themselves() {
    for s in [
        "done",
        "canceled",
        "timeout",
        "failed",
        "dependency",
        "skipped",
        "weird",
    ] {
        assert_eq!(JobResult::parse(s).as_str(), s);
    }
    let e = SystemdError::Job {
        bus: "machine kube1".into(),
        verb: "stop",
        unit: "kubelet.service".into(),
        result: JobResult::Dependency,
    };
    let msg = e.to_string();
    assert!(msg.contains("machine kube1"), "{msg}");
    assert!(msg.contains("kubelet.service"), "{msg}");
    assert!(msg.contains("'dependency'"), "{msg}");
}

#[test]
fn foreign_userns_error_says_what_to_change() {
    let msg = SystemdError::ForeignUserNamespace {
        machine: "kube1".into(),
        leader: 42,
    }
    .to_string();
    assert!(msg.contains("PrivateUsers=no"), "{msg}");
    assert!(msg.contains("/etc/systemd/nspawn/kube1.nspawn"), "{msg}");
    assert!(msg.contains("Access denied"), "{msg}");
}

#[test]
fn invocation_ids_print_as_hex() {
    assert_eq!(hex(&[0x0a, 0xff, 0x00]), "0aff00");
    assert_eq!(hex(&[]), "");
}
