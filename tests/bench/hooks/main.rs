//! What every machine start pays for our hooks, on fixture hosts of growing size.
//!
//! `cargo bench --bench hooks -- [OPTIONS]` (as root: fixture hosts hold real device nodes).
//! `tests/bench/run.sh` builds the binary, runs this and draws the plot; see its header for
//! what is measured and how. Never part of `cargo test`: run without cargo bench's `--bench`
//! flag (as `cargo test --benches` does) this prints a hint and exits.
//!
//! Per host, in one run:
//! - as whole processes (spawn to reaped exit, stdio on /dev/null, `wait4` for the child's peak
//!   RSS), interleaved round-robin so drift hits every series alike:
//!   `floor` = `helper --version`;
//!   `prestart` = `helper --host-root H nspawn-lifecycle pre-start kube1` with the `.nspawn`
//!   file already up to date (every start after the first);
//!   `prestart_first` = the same right after deleting that file, so it is written (temp file,
//!   fsync, rename, fsync dir);
//!   `ldconfig_p` = `ldconfig -p -C H/etc/ld.so.cache`, what the older Go agent runs (and then
//!   parses) at every start;
//!   `status` = `helper --host-root H status kube1 --machine-root M` on the host installed and a
//!   machine root rewired by `rewire_steady`'s pass (in sync), what the metrics timer runs for
//!   each machine every minute;
//! - in this process, through the library: `discover` (host discovery alone), `rewire_cold`
//!   (post-start's file steps on a fresh machine root) and `rewire_steady` (the same on a machine
//!   root where nothing changes).
//!
//! Hosts (`hosts.rs`) are the shipped examples, ones derived from eight-gpus, and the two hosts of
//! `tests/realdriver.rs` with NVIDIA's real 550.163.01 userspace (`realdriver-run`,
//! `realdriver-deb`: the packages must be cached by `tests/realdriver/fetch.sh fetch`, else the
//! run fails), each with 500 unrelated libraries in its multiarch dir and ld.so.cache
//! (`--system-libs`); the cache is the one the fixture writes in glibc's format, which
//! `ldconfig -p` reads as it reads its own, or on the real-driver hosts `ldconfig -r`'s own.
//! Machine roots (`machine.rs`) are Debian-like with 150 unrelated libraries.

mod hosts;
mod machine;
mod measure;
#[path = "../../lib/nspawn_binds.rs"]
mod nspawn_binds;
#[path = "../../realdriver/host.rs"]
mod realdriver;

use anyhow::{Context as _, Result, bail};
use measure::{ProcRun, Summary, micros, run_process, summarize};
use nspawn_lifecycle::config::Config;
use nspawn_lifecycle::discovery::{self, Inventory, Verdict};
use nspawn_lifecycle::fs::host::HostRoot;
use nspawn_lifecycle::fs::machine_root::MachineRoot;
use nspawn_lifecycle::types::machine_name::MachineName;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const MACHINE: &str = "kube1";
/// The series measured in this process, in the order they run.
const IN_PROCESS: [&str; 3] = ["discover", "rewire_cold", "rewire_steady"];
const RESULTS_SCHEMA: &str = "nspawn-lifecycle-bench/v1";

struct Opts {
    runs: usize,
    warmup: usize,
    out: PathBuf,
    helper: PathBuf,
    /// Another helper build whose pre-start runs interleaved with ours (before/after).
    compare: Option<PathBuf>,
    hosts: Option<Vec<String>>,
    work_dir: PathBuf,
    machine_dir: PathBuf,
    keep: bool,
    /// Skip the process series (to profile the in-process ones alone).
    processes: bool,
    /// In-process series to run (all by default; none compares helper binaries alone).
    in_process: Vec<String>,
    system_libs: usize,
    /// Free text recorded in the results, e.g. which helper build this is.
    label: String,
    /// The helper `status` is measured with: a release build with the test kit, whose `status`
    /// takes `--machine-root` (the product's does not).
    status_helper: PathBuf,
}

const USAGE: &str = "cargo bench --bench hooks -- [--runs N] [--warmup N] [--out FILE] [--helper PATH] [--compare PATH] \
[--hosts a,b] [--work-dir DIR] [--machine-dir DIR] [--keep] [--no-processes] [--no-in-process | --in-process a,b] [--system-libs N] [--label TEXT] \
[--status-helper PATH]";

fn opts() -> Result<Option<Opts>> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut args = std::env::args().skip(1);
    let mut bench = false;
    let mut o = Opts {
        runs: 200,
        warmup: 5,
        out: manifest.join("tests/bench/results/hooks.json"),
        helper: manifest.join(format!(
            "target/{}-unknown-linux-gnu/release/nspawn-lifecycle-helper",
            std::env::consts::ARCH
        )),
        compare: None,
        hosts: None,
        work_dir: std::env::temp_dir(),
        machine_dir: PathBuf::from("/dev/shm"),
        keep: false,
        processes: true,
        in_process: IN_PROCESS.iter().map(|s| (*s).to_owned()).collect(),
        label: String::new(),
        status_helper: manifest.join(format!(
            "target/testkit/{}-unknown-linux-gnu/release/nspawn-lifecycle-helper",
            std::env::consts::ARCH
        )),
        system_libs: 500,
    };
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--bench" => bench = true,
            "--runs" => o.runs = value()?.parse().context("--runs")?,
            "--warmup" => o.warmup = value()?.parse().context("--warmup")?,
            "--out" => o.out = value()?.into(),
            "--helper" => o.helper = value()?.into(),
            "--status-helper" => o.status_helper = value()?.into(),
            "--compare" => o.compare = Some(value()?.into()),
            "--hosts" => o.hosts = Some(value()?.split(',').map(str::to_owned).collect()),
            "--work-dir" => o.work_dir = value()?.into(),
            "--machine-dir" => o.machine_dir = value()?.into(),
            "--keep" => o.keep = true,
            "--no-processes" => o.processes = false,
            "--no-in-process" => o.in_process.clear(),
            "--in-process" => {
                o.in_process = value()?.split(',').map(str::to_owned).collect();
                if let Some(bad) = o
                    .in_process
                    .iter()
                    .find(|s| !IN_PROCESS.contains(&s.as_str()))
                {
                    bail!(
                        "--in-process: no series {bad:?} ({})",
                        IN_PROCESS.join(", ")
                    );
                }
            }
            "--label" => o.label = value()?,
            "--system-libs" => o.system_libs = value()?.parse().context("--system-libs")?,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if !bench {
        eprintln!(
            "hooks benchmark: not run (no --bench flag); use `cargo bench --bench hooks` or tests/bench/run.sh"
        );
        return Ok(None);
    }
    if o.runs < 1 {
        bail!("--runs must be at least 1");
    }
    Ok(Some(o))
}

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One measured series: samples in microseconds, and peak RSS per run for processes.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Series {
    summary: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_rss_kib: Option<RssSummary>,
    samples_us: Vec<f64>,
    #[serde(skip)]
    rss: Vec<u64>,
}

#[derive(Debug, Serialize)]
struct RssSummary {
    median: u64,
    max: u64,
}

impl Series {
    fn push_run(&mut self, r: ProcRun) {
        self.samples_us.push(micros(r.wall));
        self.rss.push(r.max_rss_kib);
    }

    fn finish(&mut self) {
        self.summary = Some(summarize(&self.samples_us));
        for s in &mut self.samples_us {
            *s = (*s * 10.0).round() / 10.0;
        }
        if !self.rss.is_empty() {
            let mut r = self.rss.clone();
            r.sort_unstable();
            self.max_rss_kib = Some(RssSummary {
                median: r[r.len() / 2],
                max: r[r.len() - 1],
            });
        }
    }

    fn median(&self) -> f64 {
        self.summary.as_ref().map_or(f64::NAN, |s| s.median)
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct HostResult {
    name: String,
    about: String,
    file_series: bool,
    gpus: usize,
    device_nodes: usize,
    driver_files: usize,
    verdict: String,
    ld_cache_entries: usize,
    series: BTreeMap<&'static str, Series>,
    /// What the first rewiring pass on a fresh machine did, and what a steady pass did.
    rewire_reports: BTreeMap<&'static str, Vec<String>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Results {
    schema: &'static str,
    facts: BTreeMap<&'static str, String>,
    hosts: Vec<HostResult>,
}

fn real_main() -> Result<()> {
    let Some(o) = opts()? else { return Ok(()) };
    if !nix::unistd::geteuid().is_root() {
        bail!("the benchmark builds fixture hosts with real device nodes (mknod): run it as root");
    }
    if o.processes && !o.status_helper.is_file() {
        bail!(
            "{} missing: `status` is measured with a release build with the test kit (its \
             --machine-root): cargo build --release --features testkit --target-dir \
             target/testkit (tests/bench/run.sh does), or pass --status-helper",
            o.status_helper.display()
        );
    }
    // The machine's driver root is bound read-only as systemd-nspawn binds it, in a mount
    // namespace of this process alone (still single-threaded here).
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).context("unshare(CLONE_NEWNS)")?;
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("making / private")?;
    if !o.helper.is_file() {
        bail!(
            "{} missing: build it first (tests/bench/run.sh does: RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target {}-unknown-linux-gnu), or pass --helper",
            o.helper.display(),
            std::env::consts::ARCH
        );
    }
    let mut hosts = hosts::all(o.system_libs)?;
    if let Some(only) = &o.hosts {
        for n in only {
            if !hosts.iter().any(|h| &h.name == n) {
                bail!("no host {n:?}");
            }
        }
        hosts.retain(|h| only.contains(&h.name));
    }
    if hosts.iter().any(|h| h.realdriver.is_some()) {
        hosts::require_realdriver_cache()?;
    }
    let work = tempfile::Builder::new()
        .prefix("nspawn-bench-hosts.")
        .tempdir_in(&o.work_dir)
        .with_context(|| format!("temp dir in {}", o.work_dir.display()))?;
    let machines = tempfile::Builder::new()
        .prefix("nspawn-bench-machines.")
        .tempdir_in(&o.machine_dir)
        .with_context(|| format!("temp dir in {}", o.machine_dir.display()))?;

    let mut facts = machine_facts(&o)?;
    facts.insert("hostRootsOn", fs_type(work.path()));
    facts.insert("machineRootsOn", fs_type(machines.path()));
    eprintln!(
        "hooks benchmark: {} hosts, {} runs each (+{} warm-up), helper {}",
        hosts.len(),
        o.runs,
        o.warmup,
        o.helper.display()
    );
    let started = Instant::now();
    let mut results = Vec::new();
    for h in &hosts {
        let t = Instant::now();
        let r = bench_host(&o, h, work.path(), machines.path())
            .with_context(|| format!("host {}", h.name))?;
        eprintln!(
            "  {:<14} prestart {:>7.0} µs  rewire cold {:>7.0} µs  ({:.0} s)",
            h.name,
            r.series.get("prestart").map_or(f64::NAN, Series::median),
            r.series.get("rewire_cold").map_or(f64::NAN, Series::median),
            t.elapsed().as_secs_f64()
        );
        results.push(r);
    }
    facts.insert("loadAvgAfter", read_trim("/proc/loadavg"));
    facts.insert(
        "elapsedSeconds",
        format!("{:.0}", started.elapsed().as_secs_f64()),
    );
    let results = Results {
        schema: RESULTS_SCHEMA,
        facts,
        hosts: results,
    };
    print!("{}", tables(&results));
    if let Some(dir) = o.out.parent() {
        fs_err::create_dir_all(dir)?;
    }
    fs_err::write(&o.out, serde_json::to_string_pretty(&results)? + "\n")?;
    eprintln!("raw results: {}", o.out.display());
    if o.keep {
        eprintln!(
            "kept {} and {}",
            work.keep().display(),
            machines.keep().display()
        );
    }
    Ok(())
}

fn bench_host(o: &Opts, h: &hosts::BenchHost, work: &Path, machines: &Path) -> Result<HostResult> {
    let root = work.join(&h.name);
    nspawn_lifecycle::fixture::materialize(&h.text, &root)?;
    if let Some(layout) = h.realdriver {
        realdriver::install(layout, &root)?;
    }
    let host = HostRoot::new(&root);
    let inv = discovery::discover(&host)?;
    let files: usize = inv
        .driver
        .as_ref()
        .map_or(0, |d| d.lib_dirs.iter().map(|l| l.files.len()).sum());
    if h.driver_files.is_some_and(|want| want != files) {
        bail!(
            "discovery found {files} driver files, expected {:?}",
            h.driver_files
        );
    }
    if matches!(inv.verdict, Verdict::Incomplete { .. }) {
        bail!("verdict is incomplete: {:?}", inv.verdict);
    }
    let cache = root.join("etc/ld.so.cache");
    let ld_cache_entries = ldconfig_p(&cache)
        .output()
        .context("ldconfig -p")?
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| l.starts_with(b"\t"))
        .count();

    // Processes, interleaved.
    let nspawn = root
        .join("etc/systemd/nspawn")
        .join(format!("{MACHINE}.nspawn"));
    let prestart = || {
        let mut c = Command::new(&o.helper);
        c.arg("--host-root")
            .arg(&root)
            .args(["nspawn-lifecycle", "pre-start", MACHINE]);
        c
    };
    let compare = |helper: &Path| {
        let mut c = Command::new(helper);
        c.arg("--host-root")
            .arg(&root)
            .args(["nspawn-lifecycle", "pre-start", MACHINE]);
        c
    };
    let floor = || {
        let mut c = Command::new(&o.helper);
        c.arg("--version");
        c
    };
    let check = |name: &str, r: ProcRun| -> Result<ProcRun> {
        if r.exit_code != 0 {
            bail!("{name} exited with {}", r.exit_code);
        }
        Ok(r)
    };
    let mut series: BTreeMap<&'static str, Series> = BTreeMap::new();
    for i in 0..(o.warmup + o.runs) * usize::from(o.processes) {
        let measured = i >= o.warmup;
        remove_if_exists(&nspawn)?;
        let first = check("pre-start (first write)", run_process(&mut prestart())?)?;
        if !nspawn.is_file() {
            bail!("pre-start did not write {}", nspawn.display());
        }
        let steady = check("pre-start", run_process(&mut prestart())?)?;
        let other = match &o.compare {
            Some(h) => Some(check(
                "pre-start (--compare)",
                run_process(&mut compare(h))?,
            )?),
            None => None,
        };
        let fl = check("--version", run_process(&mut floor())?)?;
        let ld = check("ldconfig -p", run_process(&mut ldconfig_p(&cache))?)?;
        if measured {
            series.entry("prestart_first").or_default().push_run(first);
            series.entry("prestart").or_default().push_run(steady);
            if let Some(r) = other {
                series.entry("prestart_compare").or_default().push_run(r);
            }
            series.entry("floor").or_default().push_run(fl);
            series.entry("ldconfig_p").or_default().push_run(ld);
        }
    }

    // In-process: discovery alone.
    let runs_of =
        |series: &str| (o.warmup + o.runs) * usize::from(o.in_process.iter().any(|s| s == series));
    let mut disc = Series::default();
    for i in 0..runs_of("discover") {
        let t = Instant::now();
        let again = discovery::discover(&host)?;
        let d = t.elapsed();
        if again != inv {
            bail!("discovery gave a different inventory on run {i}");
        }
        if i >= o.warmup {
            disc.samples_us.push(micros(d));
        }
    }
    if runs_of("discover") > 0 {
        series.insert("discover", disc);
    }

    // In-process: rewiring, cold and steady.
    let machine: MachineName = MACHINE.parse().map_err(anyhow::Error::msg)?;
    let mc = Config::default().machine(&host, &machine)?;
    let base = machines.join(&h.name);
    fs_err::create_dir_all(&base)?;
    let mut reports = BTreeMap::new();
    let mut cold = Series::default();
    for i in 0..runs_of("rewire_cold") {
        let dir = base.join(format!("cold{i}"));
        fs_err::create_dir(&dir)?;
        machine::skeleton(&dir)?;
        let mroot = MachineRoot::open(&dir)?;
        let t = Instant::now();
        let r = machine::rewire_pass(&mroot, &inv, &mc)?;
        let d = t.elapsed();
        drop(mroot);
        if i == 0 {
            reports.insert("cold", r.iter().map(ToString::to_string).collect());
        }
        if i >= o.warmup {
            cold.samples_us.push(micros(d));
        }
        fs_err::remove_dir_all(&dir)?;
    }
    if runs_of("rewire_cold") > 0 {
        series.insert("rewire_cold", cold);
    }

    let dir = base.join("steady");
    fs_err::create_dir(&dir)?;
    machine::skeleton(&dir)?;
    let mroot = MachineRoot::open(&dir)?;
    machine::rewire_pass(&mroot, &inv, &mc)?;
    let mut steady = Series::default();
    for i in 0..runs_of("rewire_steady") {
        let t = Instant::now();
        let r = machine::rewire_pass(&mroot, &inv, &mc)?;
        let d = t.elapsed();
        if let Some(changed) = r.iter().find(|r| r.changed()) {
            bail!("a steady rewiring pass changed something: {changed}");
        }
        if i == 0 {
            reports.insert("steady", r.iter().map(ToString::to_string).collect());
        }
        if i >= o.warmup {
            steady.samples_us.push(micros(d));
        }
    }
    if runs_of("rewire_steady") > 0 {
        series.insert("rewire_steady", steady);
    }

    // Processes on the wired machine: `status` as the metrics timer runs it for every machine
    // every minute (the host installed, the machine root in sync, so every check runs).
    if o.processes {
        let install = Command::new(&o.helper)
            .arg("--host-root")
            .arg(&root)
            .args(["install", MACHINE])
            .output()
            .context("install")?;
        if !install.status.success() {
            bail!("install: {}", String::from_utf8_lossy(&install.stderr));
        }
        // The driver root as nspawn binds it: pre-start's tree and the binds inside it, from the
        // `.nspawn` file install wrote, read-only; and the device binds (nodes made, directories
        // bound).
        let mounted = bind_driver_root(&root, &dir)?;
        // The machine's own loader cache, as post-start's `ldconfig` leaves it.
        let ld = Command::new("ldconfig")
            .arg("-r")
            .arg(&dir)
            .status()
            .context("ldconfig -r")?;
        if !ld.success() {
            bail!("ldconfig -r {}", dir.display());
        }
        let status = || {
            let mut c = Command::new(&o.status_helper);
            c.arg("--host-root")
                .arg(&root)
                .args(["status", MACHINE, "--machine-root"])
                .arg(&dir);
            c
        };
        let said = status().output().context("status")?;
        if !said.status.success() {
            bail!(
                "status of the wired machine is not in sync: {}{}",
                String::from_utf8_lossy(&said.stdout),
                String::from_utf8_lossy(&said.stderr)
            );
        }
        let mut st = Series::default();
        for i in 0..o.warmup + o.runs {
            let r = check("status", run_process(&mut status())?)?;
            if i >= o.warmup {
                st.push_run(r);
            }
        }
        series.insert("status", st);
        for at in mounted.iter().rev() {
            nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH)
                .with_context(|| format!("unmounting {}", at.display()))?;
        }
    }

    for s in series.values_mut() {
        s.finish();
    }
    Ok(HostResult {
        name: h.name.clone(),
        about: h.about.clone(),
        file_series: h.file_series,
        gpus: inv.gpus.len(),
        device_nodes: inv.devices.len(),
        driver_files: files,
        verdict: verdict_name(&inv).into(),
        ld_cache_entries,
        series,
        rewire_reports: reports,
    })
}

fn verdict_name(inv: &Inventory) -> &'static str {
    match inv.verdict {
        Verdict::None => "none",
        Verdict::Complete => "complete",
        Verdict::Incomplete { .. } => "incomplete",
    }
}

fn ldconfig_p(cache: &Path) -> Command {
    let mut c = Command::new("ldconfig");
    c.arg("-p").arg("-C").arg(cache);
    c
}

fn remove_if_exists(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", p.display()))
        }
        _ => Ok(()),
    }
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p).map_or_else(|e| format!("({e})"), |s| s.trim().to_owned())
}

/// Output of a command's first line, or what went wrong.
fn first_line(cmd: &mut Command) -> String {
    match cmd.output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_owned(),
        Err(e) => format!("({e})"),
    }
}

/// The filesystem type of the mount holding `p` (`stat -f` would call ext4 "ext2/ext3").
fn fs_type(p: &Path) -> String {
    first_line(
        Command::new("findmnt")
            .args(["-n", "-o", "FSTYPE", "--target"])
            .arg(p),
    )
}

fn machine_facts(o: &Opts) -> Result<BTreeMap<&'static str, String>> {
    let manifest = env!("CARGO_MANIFEST_DIR");
    let cpuinfo = read_trim("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown".to_owned(), |(_, m)| m.trim().to_owned());
    let mut f = BTreeMap::new();
    f.insert(
        "date",
        first_line(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])),
    );
    f.insert("cpuModel", model);
    f.insert(
        "cpus",
        std::thread::available_parallelism().map_or("?".into(), |n| n.to_string()),
    );
    f.insert("kernel", read_trim("/proc/sys/kernel/osrelease"));
    f.insert(
        "memTotal",
        read_trim("/proc/meminfo")
            .lines()
            .next()
            .unwrap_or("")
            .to_owned(),
    );
    f.insert("loadAvgBefore", read_trim("/proc/loadavg"));
    f.insert(
        "gitCommit",
        first_line(Command::new("git").args(["-C", manifest, "rev-parse", "HEAD"])),
    );
    f.insert(
        "gitDirty",
        first_line(Command::new("sh").args([
            "-c",
            &format!("git -C '{manifest}' status --porcelain -- src Cargo.toml Cargo.lock | wc -l"),
        ])),
    );
    f.insert("helper", o.helper.display().to_string());
    if let Some(c) = &o.compare {
        f.insert("compareHelper", c.display().to_string());
    }
    f.insert(
        "helperVersion",
        first_line(Command::new(&o.helper).arg("--version")),
    );
    f.insert(
        "helperFile",
        first_line(Command::new("file").arg("-b").arg(&o.helper)),
    );
    f.insert(
        "ldconfig",
        first_line(Command::new("ldconfig").arg("--version")),
    );
    f.insert("runs", o.runs.to_string());
    f.insert("warmup", o.warmup.to_string());
    f.insert(
        "command",
        std::env::args().skip(1).collect::<Vec<_>>().join(" "),
    );
    f.insert("otherLibsInMachine", machine::OTHER_LIBS.to_string());
    f.insert("systemLibsOnHost", o.system_libs.to_string());
    f.insert("label", o.label.clone());
    Ok(f)
}

fn ms(us: f64) -> String {
    format!("{:.2}", us / 1000.0)
}

/// The results as Markdown tables (milliseconds; RSS in MiB).
fn tables(r: &Results) -> String {
    let mut s = String::new();
    let f = &r.facts;
    let fact = |k: &str| f.get(k).map_or("?", String::as_str);
    let _ = writeln!(
        s,
        "\n{} · {} CPUs · Linux {} · {} · load before/after: {} / {} · {} runs per cell · \
         {} unrelated libraries on each host, {} in each machine root\n",
        fact("cpuModel"),
        fact("cpus"),
        fact("kernel"),
        fact("date"),
        fact("loadAvgBefore"),
        fact("loadAvgAfter"),
        fact("runs"),
        fact("systemLibsOnHost"),
        fact("otherLibsInMachine"),
    );
    let _ = writeln!(
        s,
        "Whole processes, wall ms: median [p10–p90] (min–max); peak RSS is the largest of all runs\n"
    );
    let _ = writeln!(
        s,
        "| host | GPUs | nodes | driver files | floor `--version` | pre-start, steady | pre-start, first write | pre-start peak RSS | `ldconfig -p` (cache entries) |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let cell = |se: Option<&Series>| -> String {
        se.and_then(|se| se.summary.as_ref())
            .map_or("-".into(), |x| {
                format!(
                    "{} [{}–{}] ({}–{})",
                    ms(x.median),
                    ms(x.p10),
                    ms(x.p90),
                    ms(x.min),
                    ms(x.max)
                )
            })
    };
    let rss = |a: Option<&Series>, b: Option<&Series>| -> String {
        let peak = [a, b]
            .iter()
            .flatten()
            .filter_map(|se| se.max_rss_kib.as_ref().map(|x| x.max))
            .max();
        peak.map_or("-".into(), |kib| format!("{:.1} MiB", kib as f64 / 1024.0))
    };
    for h in &r.hosts {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) |",
            h.name,
            h.gpus,
            h.device_nodes,
            h.driver_files,
            cell(h.series.get("floor")),
            cell(h.series.get("prestart")),
            cell(h.series.get("prestart_first")),
            rss(h.series.get("prestart"), h.series.get("prestart_first")),
            cell(h.series.get("ldconfig_p")),
            h.ld_cache_entries,
        );
    }
    if r.hosts.iter().any(|h| h.series.contains_key("status")) {
        let _ = writeln!(
            s,
            "\n`status kube1` of a wired machine (in sync: every check runs, pre-start's refusals \
             included), whole process, wall ms and peak RSS\n"
        );
        let _ = writeln!(s, "| host | driver files | status | peak RSS |");
        let _ = writeln!(s, "|---|---:|---:|---:|");
        for h in &r.hosts {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                h.name,
                h.driver_files,
                cell(h.series.get("status")),
                rss(h.series.get("status"), None),
            );
        }
    }
    if r.hosts
        .iter()
        .any(|h| h.series.contains_key("prestart_compare"))
    {
        let _ = writeln!(
            s,
            "\npre-start, steady, this helper and `--compare` {} in the same interleaved runs, wall ms\n",
            fact("compareHelper")
        );
        let _ = writeln!(
            s,
            "| host | driver files | this helper | --compare helper |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|");
        for h in &r.hosts {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                h.name,
                h.driver_files,
                cell(h.series.get("prestart")),
                cell(h.series.get("prestart_compare")),
            );
        }
    }
    let _ = writeln!(
        s,
        "\nIn-process, wall ms: median [p10–p90] (min–max); machine roots on {}\n",
        fact("machineRootsOn")
    );
    let _ = writeln!(
        s,
        "| host | driver files | discovery | rewiring, fresh machine | rewiring, nothing changes |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|");
    for h in &r.hosts {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            h.name,
            h.driver_files,
            cell(h.series.get("discover")),
            cell(h.series.get("rewire_cold")),
            cell(h.series.get("rewire_steady")),
        );
    }
    s
}

/// What systemd-nspawn makes of the `.nspawn` file install wrote under `root` for the driver
/// root and the devices: every `BindReadOnly=` into `/run/nvidia/driver`, made in `machine` and
/// read-only, and the device binds.
fn bind_driver_root(root: &Path, machine: &Path) -> Result<Vec<PathBuf>> {
    let text = fs_err::read_to_string(root.join(format!("etc/systemd/nspawn/{MACHINE}.nspawn")))?;
    let mut mounted = nspawn_binds::device_binds(&text, root, machine)?;
    mounted.extend(nspawn_binds::bind_read_only(&text, root, machine, |t| {
        t.starts_with("/run/nvidia/driver")
    })?);
    Ok(mounted)
}
