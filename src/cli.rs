//! The command line. The hook entry points keep the exact shape
//! `nspawn-lifecycle {pre-start|post-start|reconcile} <MACHINE>`.

use crate::types::machine_name::MachineName;
use clap::{ArgAction, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Keeps a systemd-nspawn machine that holds a Kubernetes GPU node in step with its host.
///
/// systemd runs `nspawn-lifecycle pre-start` and `post-start` around every start of
/// systemd-nspawn@<MACHINE>.service: the first renders the machine's .nspawn file from the host as
/// it is now (GPU device nodes, driver files, KVM, InfiniBand and the other host devices, the
/// disks the host does not use, extra mounts), the second rewires the NVIDIA
/// driver root, library links and CDI spec inside the machine with kubelet and containerd stopped.
#[derive(Debug, Parser)]
#[command(
    name = "nspawn-lifecycle-helper",
    version,
    long_version = crate::build_info::LONG_VERSION,
    max_term_width = 100
)]
pub struct Cli {
    /// Read and write the host tree under DIR instead of / (for tests and chroots).
    #[arg(long, global = true, value_name = "DIR", default_value = "/")]
    pub host_root: PathBuf,

    /// Configuration file [default: /etc/nspawn-lifecycle/config.json under the host root, if present].
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// More log output (-v debug, -vv trace). NSPAWN_LIFECYCLE_LOG overrides it.
    #[arg(short, long, global = true, action = ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,

    /// Only warnings and errors on stderr. NSPAWN_LIFECYCLE_LOG overrides it.
    #[arg(short, long, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// What a command line clap refused asked for with `--json` (before any `--`), so that it still
/// prints one error object: the kind its command's failures carry (`discover` `DiscoverError`,
/// `plan` and `host plan` `PlanError`, `install` `InstallError`, `uninstall` `UninstallError`,
/// `status` and `host status` `StatusError` with the state `unknown`), or `UsageError` where the
/// line names no command that has `--json`; the subject is `host` in host mode, else none (a line
/// that did not parse names no machine for sure). `None` without `--json`.
pub fn json_usage(args: &[std::ffi::OsString]) -> Option<JsonUsage> {
    let words: Vec<&str> = args
        .iter()
        .skip(1)
        .map(|a| a.to_str().unwrap_or(""))
        .take_while(|a| *a != "--")
        .collect();
    if !words
        .iter()
        .any(|a| *a == "--json" || a.starts_with("--json="))
    {
        return None;
    }
    // The words that are not options, nor the values of the global options that take one.
    let mut commands = Vec::new();
    let mut it = words.iter();
    while let Some(w) = it.next() {
        if matches!(*w, "--host-root" | "--config") {
            it.next();
        } else if !w.starts_with('-') {
            commands.push(*w);
        }
    }
    let (kind, machine, state) = match commands.as_slice() {
        ["discover", ..] => ("DiscoverError", None, None),
        ["plan", ..] => ("PlanError", None, None),
        ["install", ..] => ("InstallError", None, None),
        ["uninstall", ..] => ("UninstallError", None, None),
        ["status", ..] => ("StatusError", None, Some("unknown")),
        ["host", "plan", ..] => ("PlanError", Some("host"), None),
        ["host", "status", ..] => ("StatusError", Some("host"), Some("unknown")),
        _ => ("UsageError", None, None),
    };
    Some(JsonUsage {
        kind,
        machine,
        state,
    })
}

/// See [`json_usage`].
#[derive(Debug, PartialEq, Eq)]
pub struct JsonUsage {
    pub kind: &'static str,
    pub machine: Option<&'static str>,
    pub state: Option<&'static str>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The hooks systemd runs for systemd-nspawn@<MACHINE>.service, and a manual restart.
    #[command(subcommand)]
    NspawnLifecycle(Phase),

    /// Host mode: the same NVIDIA rewiring for a kubelet and containerd that run on the host
    /// itself, not in a machine (see `install --host`).
    #[command(subcommand)]
    Host(HostCommand),

    /// Show what this host has right now: NVIDIA device nodes, GPUs, driver versions and files,
    /// /dev/kvm, the host devices a machine gets (InfiniBand, TUN and vhost, GPUDirect, the
    /// config's extras), every disk (free, or the host's and why: mounted, swap, an LVM, RAID or
    /// btrfs member, ...), and the verdict (none, complete, incomplete) that decides what the
    /// hooks do.
    /// Exit 0 whatever the verdict (it is in the output); 3 only with `--exit-code` and an
    /// incomplete verdict, as pre-start would exit.
    Discover {
        /// Exit 3 when the verdict is incomplete (pre-start would refuse to start the machine).
        #[arg(long)]
        exit_code: bool,
        /// Print a versioned JSON object instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Restart systemd-nspawn@<MACHINE>.service and wait, so both hooks run again (a "mini
    /// repave"): the operator's spelling of `nspawn-lifecycle reconcile`, which does the same.
    /// Refused (exit 2, nothing restarted) when pre-start would refuse the start for a reason a
    /// person must fix, such as a drop-in installed for other `gpus`: run `install` first.
    Reconcile {
        /// The machine: systemd-nspawn@MACHINE.service, its image in /var/lib/machines/MACHINE.
        machine: MachineName,
    },

    /// Show the .nspawn file pre-start would write for MACHINE and a diff against the one on disk
    /// and, while MACHINE runs, what post-start run now would change in it (the changes `status`
    /// judges). Writes nothing. With `--exit-code`, exit 9 when pre-start would change the file.
    /// Where pre-start would refuse the start, says so with its message and exit code.
    Plan {
        /// The machine: systemd-nspawn@MACHINE.service, its image in /var/lib/machines/MACHINE.
        machine: MachineName,
        /// Exit 9 when the file on disk differs from what pre-start would write (or is missing),
        /// 0 when it is up to date, as `git diff --exit-code` does for scripts.
        #[arg(long)]
        exit_code: bool,
        /// Print one JSON object (kind MachinePlan: the file, the diff, the driver root, and
        /// `postStart`, post-start's changes for a running machine).
        #[arg(long)]
        json: bool,
    },

    /// Print the CDI spec MACHINE gets from the host as it is now: the file post-start writes in
    /// it (/var/run/cdi/nvidia.com-gpu.json by default), byte for byte, from the same model; or,
    /// with --list, the device names it defines (kind=name, one a line, as `nvidia-ctk cdi list`
    /// names them). Writes nothing. Prints nothing for a machine that gets no spec (no GPU for
    /// it); exit 3 while the NVIDIA state is incomplete, as pre-start.
    CdiSpec {
        /// The machine: systemd-nspawn@MACHINE.service, its image in /var/lib/machines/MACHINE.
        machine: MachineName,
        /// List the device names instead of printing the spec.
        #[arg(long)]
        list: bool,
    },

    /// Is MACHINE's GPU wiring current? Compares the host now (driver version, GPUs) with the
    /// running machine (CDI spec, driver root, links, unit gate, containerd and kubelet) and the
    /// last post-start. Writes nothing. Exit 0 in sync, 5 drift (`reconcile` fixes it), 6 broken,
    /// 7 not running, 8 nothing installed (`--all`); a one-line summary, or `--json` (one
    /// object, kind MachineStatus, MachineStatusList or, when it cannot judge, StatusError).
    Status {
        /// The machine; or `--all`.
        #[arg(required_unless_present = "all")]
        machine: Option<MachineName>,
        /// Every installed machine (those with our drop-in); exits with the worst state.
        #[arg(long, conflicts_with = "machine")]
        all: bool,
        /// Print one JSON object (`apiVersion`, `kind`) instead of the summary line.
        #[arg(long)]
        json: bool,
        /// Output format: `text` (the summary line), `json` (as --json), `prometheus` (the text
        /// exposition format, for monitoring: always printed, with
        /// nspawn_lifecycle_status_errors 1 and exit 1 when status could not judge).
        #[arg(long, value_enum, value_name = "FORMAT", conflicts_with = "json")]
        format: Option<StatusFormat>,
        #[command(flatten)]
        testkit: StatusTestkit,
    },

    /// Write `status --all` as Prometheus metrics into the node exporter's textfile collector
    /// directory (nspawn_lifecycle.prom, replaced atomically; nothing else is written). Run every
    /// minute by nspawn-lifecycle-metrics.timer. Exit 0 once the file is written, whatever the
    /// machines' states; 1 when it cannot be written.
    ///
    /// Gauges, per machine (label machine): nspawn_lifecycle_state{state} (1 for in_sync, drift,
    /// broken or not_running), nspawn_lifecycle_check_failed{check} (1 per status finding),
    /// nspawn_lifecycle_gpus, nspawn_lifecycle_driver_info{host_version,machine_version},
    /// nspawn_lifecycle_last_post_start_timestamp_seconds, _duration_seconds, _exit_status and
    /// _success. Per host: nspawn_lifecycle_host_gpus, nspawn_lifecycle_machines_installed,
    /// nspawn_lifecycle_status_errors (what status could not judge),
    /// nspawn_lifecycle_status_timestamp_seconds, nspawn_lifecycle_build_info{version,commit}
    /// (the helper that wrote them). Alert rules:
    /// /usr/share/nspawn-lifecycle/prometheus/nspawn-lifecycle.rules.yml.
    Metrics {
        /// The textfile collector's directory (must exist).
        #[arg(long, value_name = "DIR", default_value = DEFAULT_TEXTFILE_DIR)]
        textfile_dir: PathBuf,
    },

    /// Install or upgrade this helper for MACHINE in place: copy it to its stable path, write the
    /// unit drop-in and .nspawn file, migrate older layouts, reload systemd if a unit file changed.
    /// Never touches the machine's rootfs or running services.
    ///
    /// With --host instead of MACHINE: host mode's oneshot nspawn-lifecycle-host.service (runs
    /// `host post-start` at every boot) and the unit gate drop-ins of the host's containerd and
    /// kubelet.
    Install {
        /// The machine: systemd-nspawn@MACHINE.service, its image in /var/lib/machines/MACHINE.
        #[arg(required_unless_present = "host")]
        machine: Option<MachineName>,
        /// Install host mode instead of a machine's hooks.
        #[arg(long, conflicts_with_all = ["machine", "print_dropin"])]
        host: bool,
        /// Report what would change without writing anything.
        #[arg(long)]
        dry_run: bool,
        /// Print the unit drop-in install writes for MACHINE on stdout and exit: reads the
        /// configuration (for the helper's path), writes and checks nothing else.
        #[arg(long, conflicts_with_all = ["dry_run", "json"])]
        print_dropin: bool,
        /// Print the report as one JSON object (kind InstallReport) instead of lines.
        #[arg(long)]
        json: bool,
    },

    /// Remove what install added for MACHINE (the drop-in, and the helper copy once no machine uses
    /// it), rewrite its .nspawn file without GPU binds (kept, with PrivateUsers=no, so the stock
    /// unit does not shift the rootfs), then reload systemd. Leaves the rootfs and a running
    /// machine alone.
    ///
    /// With --host instead of MACHINE: remove host mode's unit and gate drop-ins.
    Uninstall {
        /// The machine: systemd-nspawn@MACHINE.service, its image in /var/lib/machines/MACHINE.
        #[arg(required_unless_present = "host")]
        machine: Option<MachineName>,
        /// Uninstall host mode instead of a machine's hooks.
        #[arg(long, conflicts_with = "machine")]
        host: bool,
        /// Report what would be removed without removing anything.
        #[arg(long)]
        dry_run: bool,
        /// Print the report as one JSON object (kind InstallReport) instead of lines.
        #[arg(long)]
        json: bool,
    },

    /// Print the completion script for SHELL, generated from this command line. For bash:
    /// `nspawn-lifecycle-helper completions bash > /etc/bash_completion.d/nspawn-lifecycle-helper`.
    Completions { shell: Shell },

    /// Write one man page per (sub)command into the man tree DIR (for packaging), generated from
    /// this command line: man1/nspawn-lifecycle-helper.1, man1/nspawn-lifecycle-helper-install.1,
    /// ..., and the configuration's man5/nspawn-lifecycle.json.5.
    #[command(hide = true)]
    Manpages {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },

    /// OCI hooks the CDI spec names: the container runtime runs them inside the machine as
    /// createContainer hooks, with the OCI state on stdin.
    #[command(subcommand, hide = true)]
    CdiHook(crate::types::hook::CdiHook),

    /// (failpoints builds only) List the crash points, one `<name>` per line.
    #[cfg(feature = "failpoints")]
    #[command(hide = true)]
    Failpoints,

    /// (failpoints builds only) Run post-start's executor for MACHINE against the machine rootfs
    /// directory DIR (no systemd there: service stops and starts are no-ops, ldconfig is the
    /// host's `ldconfig -r DIR`, imports fail), under the machine lock, with the host as
    /// discovered under --host-root: what the crash tests kill mid-way without a running machine.
    #[cfg(feature = "failpoints")]
    #[command(hide = true)]
    RewireRoot {
        machine: MachineName,
        #[arg(long, value_name = "DIR")]
        machine_root: PathBuf,
    },
}

/// Host mode: post-start's sequence against the host's own root and systemd.
#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// With NVIDIA GPUs: stop kubelet and containerd on the host, rebuild the /dev/char links,
    /// run ldconfig if the host's cache lacks the driver, write the CDI spec into /var/run/cdi,
    /// release containerd's gate and start it, import staged images, release kubelet's gate and
    /// start it. Without GPUs: remove our /dev/char links and CDI spec. Exit 3 while NVIDIA
    /// state is incomplete, 4 when host mode's lock is held too long.
    PostStart,

    /// Print what `host post-start` would do on this host now (paths, units, steps). Writes
    /// nothing. Exit 3, after the report, while the NVIDIA state is incomplete.
    Plan {
        /// Print one JSON object (kind HostPlan) instead of the text.
        #[arg(long)]
        json: bool,
    },

    /// Is host mode's GPU wiring current? Compares the host's discovery now with what `host
    /// post-start` left (CDI spec, /dev/char links, ld.so.cache, the unit gate), its last run,
    /// and the host's containerd and kubelet. Writes nothing. Exit 0 in sync, 5 drift (restart
    /// nspawn-lifecycle-host.service), 6 broken, 7 not run yet; 2 when host mode is not
    /// installed. A one-line summary, or `--json` (kind HostStatus, or StatusError).
    Status {
        /// Print one JSON object instead of the summary line.
        #[arg(long)]
        json: bool,
    },
}

/// `status`'s flags for tests: only in builds with the test kit (feature `testkit`, on for every
/// test, bench and example build), never in the release binary.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StatusTestkit {
    /// (tests) Read the machine's tree from DIR and ask no systemd; `{machine}` in DIR stands
    /// for the machine's name.
    #[cfg(feature = "testkit")]
    #[arg(long, value_name = "DIR", hide = true)]
    machine_root: Option<PathBuf>,
}

impl StatusTestkit {
    /// The machine tree to read instead of asking systemd (tests only).
    pub fn machine_root(&self) -> Option<&std::path::Path> {
        #[cfg(feature = "testkit")]
        return self.machine_root.as_deref();
        #[cfg(not(feature = "testkit"))]
        None
    }
}

/// The node exporter's textfile directory on Debian (`prometheus-node-exporter`'s default), where
/// `metrics` writes.
pub(crate) const DEFAULT_TEXTFILE_DIR: &str = "/var/lib/prometheus/node-exporter";

/// How `status` prints its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    Text,
    Json,
    Prometheus,
}

/// The shells `completions` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Subcommand)]
pub enum Phase {
    /// ExecStartPre=: render /etc/systemd/nspawn/<MACHINE>.nspawn from the host as it is now.
    /// Fails with exit code 3 while NVIDIA state is incomplete (for example the driver's kernel
    /// module and libraries disagree), so systemd retries the start until the install finishes.
    PreStart {
        /// The machine: systemd-nspawn@MACHINE.service, its image in /var/lib/machines/MACHINE.
        machine: MachineName,
    },

    /// ExecStartPost=: with NVIDIA GPUs present, stop kubelet and containerd in the machine,
    /// rebuild /run/nvidia/driver, the library links and the CDI spec, start containerd, import
    /// staged images, start kubelet. Without GPUs, remove NVIDIA state an earlier start left.
    PostStart {
        /// The machine: systemd-nspawn@MACHINE.service, its image in /var/lib/machines/MACHINE.
        machine: MachineName,
    },

    /// Make the running machine's /dev/char links for the host's NVIDIA nodes as they are now:
    /// the MIG capabilities and IMEX channels the host made while the machine runs, which its
    /// bound directories already show. Run by nspawn-lifecycle-devices@MACHINE.path (install
    /// writes it) when those directories change; stops no service.
    RefreshDevices {
        /// The machine: systemd-nspawn@MACHINE.service, its image in /var/lib/machines/MACHINE.
        machine: MachineName,
    },

    /// Restart systemd-nspawn@<MACHINE>.service through the host's systemd and wait, so both hooks
    /// run again (a "mini repave"). Prints the old and new leader PID and how long it took.
    /// Refused (exit 2, nothing restarted) when pre-start would refuse the start for a reason a
    /// person must fix; an incomplete driver still restarts (systemd retries the start).
    Reconcile {
        /// The machine: systemd-nspawn@MACHINE.service, its image in /var/lib/machines/MACHINE.
        machine: MachineName,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    /// Which refused command lines still print an error object, and of which kind: `--json`
    /// counts before a `--` only, and a global option's value is not a command.
    #[test]
    fn json_usage_names_the_command_of_a_refused_line() {
        let of = |line: &str| {
            let args: Vec<std::ffi::OsString> = std::iter::once("nspawn-lifecycle-helper")
                .chain(line.split(' '))
                .map(Into::into)
                .collect();
            json_usage(&args).map(|u| (u.kind, u.machine, u.state))
        };
        assert_eq!(of("plan --json a..b"), Some(("PlanError", None, None)));
        assert_eq!(
            of("--host-root /status --config plan -v discover --json=x"),
            Some(("DiscoverError", None, None))
        );
        assert_eq!(
            of("host status --json x"),
            Some(("StatusError", Some("host"), Some("unknown")))
        );
        assert_eq!(
            of("status --json --bogus"),
            Some(("StatusError", None, Some("unknown")))
        );
        assert_eq!(
            of("host plan --json -q"),
            Some(("PlanError", Some("host"), None))
        );
        assert_eq!(of("pre-start --json"), Some(("UsageError", None, None)));
        assert_eq!(of("--json"), Some(("UsageError", None, None)));
        assert_eq!(of("install --dry-run -- --json"), None);
        assert_eq!(of("plan a..b"), None);
        assert_eq!(of("plan --jsonx"), None);
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn hook_shape_is_pinned() {
        let cli = Cli::try_parse_from([
            "nspawn-lifecycle-helper",
            "nspawn-lifecycle",
            "pre-start",
            "kube1",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::NspawnLifecycle(Phase::PreStart { ref machine }) if machine.as_str() == "kube1"
        ));
        assert_eq!(cli.host_root, PathBuf::from("/"));
        let cli = Cli::try_parse_from([
            "x",
            "--host-root",
            "/tmp/h",
            "nspawn-lifecycle",
            "post-start",
            "kube1",
            "-vv",
        ])
        .unwrap();
        assert_eq!(cli.host_root, PathBuf::from("/tmp/h"));
        assert_eq!(cli.verbose, 2);
        for phase in ["pre-start", "post-start", "reconcile"] {
            Cli::try_parse_from(["x", "nspawn-lifecycle", phase, "m"]).unwrap();
        }
    }

    #[test]
    fn completions_and_manpages_parse() {
        for (word, shell) in [
            ("bash", Shell::Bash),
            ("zsh", Shell::Zsh),
            ("fish", Shell::Fish),
        ] {
            let cli = Cli::try_parse_from(["x", "completions", word]).unwrap();
            assert!(matches!(cli.command, Command::Completions { shell: s } if s == shell));
        }
        let err = Cli::try_parse_from(["x", "completions", "tcsh"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(Cli::try_parse_from(["x", "completions"]).is_err());
        let cli = Cli::try_parse_from(["x", "manpages", "/tmp/man"]).unwrap();
        assert!(
            matches!(cli.command, Command::Manpages { ref dir } if dir.as_os_str() == "/tmp/man")
        );
        // Hidden: a packaging tool, not something an operator needs in --help.
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("completions"), "{help}");
        assert!(!help.contains("manpages"), "{help}");
    }

    #[test]
    fn install_and_uninstall_take_a_machine_or_host() {
        let cli = Cli::try_parse_from(["x", "install", "--host", "--dry-run"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Install {
                machine: None,
                host: true,
                dry_run: true,
                ..
            }
        ));
        let cli = Cli::try_parse_from(["x", "uninstall", "kube1"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Uninstall { machine: Some(ref m), host: false, .. } if m.as_str() == "kube1"
        ));
        for bad in [
            &["x", "install"][..],
            &["x", "install", "kube1", "--host"],
            &["x", "install", "--host", "--print-dropin"],
            &["x", "uninstall"],
            &["x", "uninstall", "kube1", "--host"],
        ] {
            assert_eq!(
                Cli::try_parse_from(bad).unwrap_err().exit_code(),
                2,
                "{bad:?}"
            );
        }
        for (word, post) in [("post-start", true), ("plan", false)] {
            let cli = Cli::try_parse_from(["x", "host", word]).unwrap();
            assert_eq!(
                matches!(cli.command, Command::Host(HostCommand::PostStart)),
                post
            );
        }
    }

    #[test]
    fn status_takes_a_machine_or_all() {
        let cli = Cli::try_parse_from(["x", "status", "kube1", "--json"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Status { machine: Some(ref m), all: false, json: true, .. } if m.as_str() == "kube1"
        ));
        let cli = Cli::try_parse_from(["x", "status", "--all"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Status {
                machine: None,
                all: true,
                json: false,
                ..
            }
        ));
        for bad in [&["x", "status"][..], &["x", "status", "kube1", "--all"]] {
            assert_eq!(
                Cli::try_parse_from(bad).unwrap_err().exit_code(),
                2,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bad_machine_names_are_usage_errors() {
        for bad in ["../etc", "a/b", "", &"x".repeat(65), "ümlaut"] {
            let err = Cli::try_parse_from(["x", "nspawn-lifecycle", "pre-start", bad]).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad}");
            if !bad.is_empty() {
                assert!(err.to_string().contains(bad), "{err} should name {bad}");
            }
        }
        let err = Cli::try_parse_from(["x", "plan", "a/b"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }
}
