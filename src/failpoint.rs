//! Named crash and pause points for the crash and concurrency tests.
//!
//! Production code calls [`hit`] at each point; without the `failpoints` cargo feature that is an
//! empty inline function. A build with the feature reads two variables once:
//! - `NSPAWN_LIFECYCLE_FAILPOINT=<name>[:<n>]`: at the `n`th hit of that point (default the first)
//!   the process sends itself SIGKILL: no destructor, no unwinding, no flush, like a power cut of
//!   the process or the OOM killer.
//! - `NSPAWN_LIFECYCLE_PAUSE=<name>:<ms>`: every hit of that point sleeps that long, so a test can
//!   hold the machine lock or slow one step down and watch what a second caller does.
//!
//! Names are stable (tests and `tests/e2e` iterate [`ALL`]); a point that runs once per entry
//! (a link, an image) counts its hits.

/// One named point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Any command, right after it took the machine lock.
    AfterLock,
    /// post-start: the machine's bus answered (its boot may still be running), nothing stopped.
    AfterBus,
    /// post-start: kubelet was stopped, containerd still runs.
    AfterKubeletStop,
    /// post-start: both services were stopped.
    AfterContainerdStop,
    /// post-start: after each library or `/dev/char` link is brought in line (changed or not).
    MidLinks,
    /// post-start: the CDI spec's temp file is written and synced, not yet renamed.
    MidCdiWrite,
    /// post-start: containerd's unit-gate marker's temp file is written, not yet renamed (file
    /// steps done, containerd not yet started).
    PostStartMidGateRelease,
    /// post-start: containerd was started again, images not yet imported.
    AfterContainerdStart,
    /// post-start: after each `ctr images import` finished, before its outcome is acted on
    /// (counted, or the tarball moved to `failed/`): the one moment a kill could lose track of
    /// a tarball. (Killed while `ctr` runs, the helper leaves the import to its transient unit
    /// in the machine, which finishes or goes down with the machine; the tarball stays put.)
    MidImageImport,
    /// post-start: images imported; kubelet's unit-gate marker's temp file is written, not yet
    /// renamed.
    PostStartMidKubeletGateRelease,
    /// post-start: images imported, kubelet's marker created, kubelet not yet started.
    BeforeKubeletStart,
    /// pre-start: the unit-gate drop-in's temp file is written, not yet renamed.
    PreStartMidGateWrite,
    /// pre-start: the `.nspawn` file's temp file is written and synced, not yet renamed.
    PreStartMidNspawnWrite,
    /// pre-start: containerd's marker for the next boot, between its temp file and the rename.
    PreStartMidGateRelease,
    /// install: the helper copy's temp file is written, not yet renamed.
    InstallMidHelperCopy,
    /// install: the `.nspawn` file's temp file is written, not yet renamed.
    InstallMidNspawnWrite,
    /// install: the drop-in's temp file is written, not yet renamed.
    InstallMidDropinWrite,
    /// install: a migrated `override.conf`'s temp file is written, not yet renamed.
    InstallMidOverrideWrite,
    /// install: unit files changed on disk, `daemon-reload` not yet asked for.
    InstallBeforeDaemonReload,
}

/// Every point, in the order a run meets them.
pub const ALL: [Point; 19] = [
    Point::AfterLock,
    Point::AfterBus,
    Point::AfterKubeletStop,
    Point::AfterContainerdStop,
    Point::MidLinks,
    Point::MidCdiWrite,
    Point::PostStartMidGateRelease,
    Point::AfterContainerdStart,
    Point::MidImageImport,
    Point::PostStartMidKubeletGateRelease,
    Point::BeforeKubeletStart,
    Point::PreStartMidGateWrite,
    Point::PreStartMidNspawnWrite,
    Point::PreStartMidGateRelease,
    Point::InstallMidHelperCopy,
    Point::InstallMidNspawnWrite,
    Point::InstallMidDropinWrite,
    Point::InstallMidOverrideWrite,
    Point::InstallBeforeDaemonReload,
];

impl Point {
    /// The stable name used in `NSPAWN_LIFECYCLE_FAILPOINT` and `NSPAWN_LIFECYCLE_PAUSE`.
    pub fn name(self) -> &'static str {
        match self {
            Point::AfterLock => "after-lock",
            Point::AfterBus => "post-start-after-bus",
            Point::AfterKubeletStop => "post-start-after-kubelet-stop",
            Point::AfterContainerdStop => "post-start-after-containerd-stop",
            Point::MidLinks => "post-start-mid-links",
            Point::MidCdiWrite => "post-start-mid-cdi-write",
            Point::PostStartMidGateRelease => "post-start-mid-gate-release",
            Point::AfterContainerdStart => "post-start-after-containerd-start",
            Point::MidImageImport => "post-start-mid-image-import",
            Point::PostStartMidKubeletGateRelease => "post-start-mid-kubelet-gate-release",
            Point::BeforeKubeletStart => "post-start-before-kubelet-start",
            Point::PreStartMidGateWrite => "pre-start-mid-gate-write",
            Point::PreStartMidNspawnWrite => "pre-start-mid-nspawn-write",
            Point::PreStartMidGateRelease => "pre-start-mid-gate-release",
            Point::InstallMidHelperCopy => "install-mid-helper-copy",
            Point::InstallMidNspawnWrite => "install-mid-nspawn-write",
            Point::InstallMidDropinWrite => "install-mid-dropin-write",
            Point::InstallMidOverrideWrite => "install-mid-override-write",
            Point::InstallBeforeDaemonReload => "install-before-daemon-reload",
        }
    }

    /// The point with this name.
    pub fn from_name(name: &str) -> Option<Point> {
        ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Reached `point`: in a `failpoints` build, die or pause there when the environment says so.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_point: Point) {}

/// Reached `point`: in a `failpoints` build, die or pause there when the environment says so.
#[cfg(feature = "failpoints")]
pub fn hit(point: Point) {
    armed::hit(point);
}

#[cfg(feature = "failpoints")]
mod armed {
    use super::{ALL, Point};
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    pub(crate) const FAILPOINT_VAR: &str = "NSPAWN_LIFECYCLE_FAILPOINT";
    pub(crate) const PAUSE_VAR: &str = "NSPAWN_LIFECYCLE_PAUSE";

    struct Armed {
        kill: Option<(Point, u32)>,
        pause: Option<(Point, Duration)>,
    }

    static HITS: [AtomicU32; ALL.len()] = [const { AtomicU32::new(0) }; ALL.len()];

    fn parse_point(var: &str, name: &str) -> Point {
        Point::from_name(name).unwrap_or_else(|| {
            // A typo would make a crash test pass without crashing: refuse loudly.
            let names: Vec<&str> = ALL.iter().map(|p| p.name()).collect();
            eprintln!("{var}: unknown point {name:?}; known: {}", names.join(" "));
            std::process::exit(2)
        })
    }

    fn armed() -> &'static Armed {
        static ARMED: OnceLock<Armed> = OnceLock::new();
        ARMED.get_or_init(|| {
            let kill = std::env::var(FAILPOINT_VAR)
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| {
                    let (name, nth) = v.split_once(':').unwrap_or((&v, "1"));
                    let nth = nth
                        .parse::<u32>()
                        .ok()
                        .filter(|n| *n > 0)
                        .unwrap_or_else(|| {
                            eprintln!(
                                "{FAILPOINT_VAR}: {v:?}: the hit count must be a positive integer"
                            );
                            std::process::exit(2)
                        });
                    (parse_point(FAILPOINT_VAR, name), nth)
                });
            let pause = std::env::var(PAUSE_VAR)
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| {
                    let Some((name, ms)) = v.split_once(':') else {
                        eprintln!("{PAUSE_VAR}: {v:?} is not <point>:<milliseconds>");
                        std::process::exit(2)
                    };
                    let ms = ms.parse::<u64>().unwrap_or_else(|_| {
                        eprintln!("{PAUSE_VAR}: {v:?}: milliseconds must be an integer");
                        std::process::exit(2)
                    });
                    (parse_point(PAUSE_VAR, name), Duration::from_millis(ms))
                });
            Armed { kill, pause }
        })
    }

    pub fn hit(point: Point) {
        let armed = armed();
        if let Some((p, d)) = armed.pause
            && p == point
        {
            eprintln!("failpoint {}: pausing {} ms", point.name(), d.as_millis());
            std::thread::sleep(d);
        }
        if let Some((p, nth)) = armed.kill
            && p == point
        {
            let n = HITS[point as usize].fetch_add(1, Ordering::SeqCst) + 1;
            if n == nth {
                eprintln!("failpoint {}: SIGKILL at hit {n}", point.name());
                // journald reads a service's stderr stream on its own schedule and attributes a
                // line by the writer's /proc entry (systemd#2913): a line read after the
                // process is gone can lose its unit. A short pause keeps the writer alive while
                // journald reads; nothing else runs in it, so the kill is still at this point.
                std::thread::sleep(Duration::from_millis(100));
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
                // SIGKILL cannot be blocked or handled; this is never reached.
                std::process::abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        let mut seen = std::collections::BTreeSet::new();
        for (i, p) in ALL.into_iter().enumerate() {
            assert_eq!(p as usize, i, "ALL must list points in declaration order");
            assert!(seen.insert(p.name()), "duplicate name {}", p.name());
            assert_eq!(Point::from_name(p.name()), Some(p));
        }
        assert_eq!(Point::from_name("no-such-point"), None);
    }
}
