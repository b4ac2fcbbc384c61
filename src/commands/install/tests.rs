use super::host::*;
use super::*;

/// Our drop-in for `m` under the host tree `root` (what makes a machine installed).
fn write_dropin(root: &Path, m: &MachineName) {
    let dropin = root.join(dropin_path(m).trim_start_matches('/'));
    std::fs::create_dir_all(dropin.parent().unwrap()).unwrap();
    std::fs::write(&dropin, format!("{DROPIN_HEADER} {m}\n")).unwrap();
}

fn host_with(files: &[&str]) -> (tempfile::TempDir, Ctx) {
    let dir = tempfile::tempdir().unwrap();
    for f in files {
        let path = dir.path().join(f.trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, format!("{DROPIN_HEADER} kube1\n")).unwrap();
    }
    let host = HostRoot::new(dir.path());
    let config = crate::config::Config::load(&host, None).unwrap();
    (dir, Ctx { host, config })
}

/// Install --host writes the helper, both gate drop-ins, the oneshot and its
/// enabling link; a second run changes nothing; uninstall --host takes away exactly those
/// (and empty drop-in directories); a file of the operator's at one of the paths is refused.
#[test]
fn install_host_writes_the_units_and_uninstall_host_removes_them() {
    let (d, ctx) = host_with(&[]);
    let plan = plan_install_host(&ctx, b"exe").unwrap();
    let lines: Vec<_> = plan.report(true, "-").lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        [
            "/usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper: would create (copy of the running helper, 3 bytes)",
            "/etc/systemd/system/containerd.service.d/50-nspawn-lifecycle-gate.conf: would create",
            "/etc/systemd/system/kubelet.service.d/50-nspawn-lifecycle-gate.conf: would create",
            "/etc/systemd/system/nspawn-lifecycle-host.service: would create",
            "/etc/systemd/system/multi-user.target.wants/nspawn-lifecycle-host.service: would create (enables nspawn-lifecycle-host.service in multi-user.target)",
            "systemd: -",
            "install --host: dry run, nothing written; 5 files would change",
        ]
    );
    assert!(plan.needs_reload());
    plan.apply(&ctx.host).unwrap();
    let unit = d
        .path()
        .join("etc/systemd/system/nspawn-lifecycle-host.service");
    assert_eq!(
        std::fs::read_to_string(&unit).unwrap(),
        crate::model::host_unit::unit(ctx.config.helper_path())
    );
    assert_eq!(
        std::fs::read_link(
            d.path()
                .join("etc/systemd/system/multi-user.target.wants/nspawn-lifecycle-host.service")
        )
        .unwrap(),
        Path::new("/etc/systemd/system/nspawn-lifecycle-host.service")
    );
    assert_eq!(plan_install_host(&ctx, b"exe").unwrap().changes(), 0);

    // A machine's uninstall keeps the helper host mode calls.
    let m: MachineName = "kube1".parse().unwrap();
    write_dropin(d.path(), &m);
    let keep = plan_uninstall(&ctx, &m).unwrap();
    let helper = keep.files.last().unwrap();
    assert_eq!(
        (helper.verb, helper.detail.as_str()),
        (Verb::Keep, "still used by nspawn-lifecycle-host.service")
    );

    // An operator's own drop-in in kubelet's directory stays, and so does the directory.
    let own = d
        .path()
        .join("etc/systemd/system/kubelet.service.d/10-own.conf");
    std::fs::write(&own, "[Service]\n").unwrap();
    let marker = d
        .path()
        .join("run/nspawn-lifecycle/released/kubelet.service");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(
        &marker,
        "nspawn-lifecycle post-start released kubelet.service this boot\n",
    )
    .unwrap();
    let plan = plan_uninstall_host(&ctx).unwrap();
    assert_eq!(plan.changes(), 8, "{}", plan.report(true, "-"));
    plan.apply(&ctx.host).unwrap();
    assert!(own.is_file());
    assert!(!marker.exists());
    assert!(!unit.exists());
    assert!(
        !d.path()
            .join("etc/systemd/system/containerd.service.d")
            .exists()
    );
    assert!(!d.path().join("usr/local/lib/nspawn-lifecycle").exists());
    assert_eq!(plan_uninstall_host(&ctx).unwrap().changes(), 0);

    std::fs::write(&unit, "[Unit]\n").unwrap();
    let err = plan_install_host(&ctx, b"exe").unwrap_err();
    assert_eq!(crate::error::exit_code(&err), 2);
    assert!(format!("{err:#}").contains("was not written by install --host"));
}

/// The plan is a value: what uninstall would do is read from it without running it.
#[test]
fn uninstall_plan_removes_directories_only_when_nothing_else_is_in_them() {
    let m: MachineName = "kube1".parse().unwrap();
    let helper = crate::config::DEFAULT_HELPER_PATH;
    let dropin = dropin_path(&m);
    let (_d, ctx) = host_with(&[&dropin, helper]);
    let plan = plan_uninstall(&ctx, &m).unwrap();
    let lines: Vec<_> = plan.report(true, "-").lines().map(str::to_owned).collect();
    let dir = dropin_dir(&m);
    let helper_dir = "/usr/local/lib/nspawn-lifecycle";
    assert_eq!(
        lines,
        [
            format!("{dropin}: would remove"),
            format!("{dir}: would remove (empty)"),
            format!(
                "{}: would create (settings without GPU binds, PrivateUsers=no: a start of the stock unit keeps the rootfs owned by root)",
                nspawn_path(&m)
            ),
            format!("{helper}: would remove (no machine uses it any more)"),
            format!("{helper_dir}: would remove (empty)"),
            "systemd: -".to_owned(),
            "uninstall kube1: dry run, nothing written; 5 files would change".to_owned(),
        ]
    );
    assert!(plan.needs_reload());

    // Anything else in either directory keeps it; another machine's hooks keep the helper.
    let other = format!(
        "{}/50-nspawn-lifecycle.conf",
        dropin_dir(&"kube2".parse().unwrap())
    );
    let (_d, ctx) = host_with(&[
        &dropin,
        &format!("{dir}/override.conf"),
        helper,
        &format!("{helper_dir}/notes"),
    ]);
    let shown: Vec<_> = plan_uninstall(&ctx, &m)
        .unwrap()
        .files
        .iter()
        .map(|f| f.shown.clone())
        .collect();
    assert_eq!(shown, [dropin.clone(), nspawn_path(&m), helper.to_owned()]);
    let (_d, ctx) = host_with(&[&dropin, helper, &other]);
    std::fs::write(
        ctx.host.path(&other),
        format!("ExecStartPre={helper} nspawn-lifecycle pre-start %i\n"),
    )
    .unwrap();
    let plan = plan_uninstall(&ctx, &m).unwrap();
    let keep = plan.files.last().unwrap();
    assert_eq!(
        (keep.shown.as_str(), keep.verb, keep.op.is_none()),
        (helper, Verb::Keep, true)
    );
    assert_eq!(keep.detail, "still used by systemd-nspawn@kube2.service");
}

/// Pre-start's driver tree holds hard links of the host's driver files (an old
/// driver's stay on disk while it exists): uninstall removes it, and the /run tree of
/// earlier versions, never following a link in it; the host's files stay.
#[test]
fn uninstall_removes_the_driver_tree_and_the_legacy_one() {
    let m: MachineName = "kube1".parse().unwrap();
    let dropin = dropin_path(&m);
    let (d, ctx) = host_with(&[&dropin]);
    let host_lib = d.path().join("usr/lib/libcuda.so.1.0");
    std::fs::create_dir_all(host_lib.parent().unwrap()).unwrap();
    std::fs::write(&host_lib, b"lib").unwrap();
    let tree = d
        .path()
        .join("var/lib/nspawn-lifecycle/driver-root/kube1/usr/lib");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::hard_link(&host_lib, tree.join("libcuda.so.1.0")).unwrap();
    std::os::unix::fs::symlink(d.path().join("usr"), tree.join("out")).unwrap();
    let legacy = d.path().join("run/nspawn-lifecycle/driver-root/kube1/usr");
    std::fs::create_dir_all(&legacy).unwrap();
    let plan = plan_uninstall(&ctx, &m).unwrap();
    let report = plan.report(true, "-");
    assert!(
        report.contains(
            "/var/lib/nspawn-lifecycle/driver-root/kube1: would remove (pre-start's driver tree)"
        ) && report.contains(
            "/run/nspawn-lifecycle/driver-root/kube1: would remove (pre-start's driver tree)"
        ),
        "{report}"
    );
    plan.apply(&ctx.host).unwrap();
    assert!(
        !d.path()
            .join("var/lib/nspawn-lifecycle/driver-root/kube1")
            .exists()
    );
    assert!(
        !d.path()
            .join("run/nspawn-lifecycle/driver-root/kube1")
            .exists()
    );
    assert_eq!(std::fs::read(&host_lib).unwrap(), b"lib");
    assert!(d.path().join("usr/lib").is_dir());
}
