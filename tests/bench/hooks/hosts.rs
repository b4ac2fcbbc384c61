//! The hosts measured, as fixture text (see `src/fixture.rs` for the format): the shipped
//! examples where one fits, bigger ones derived from the eight-GPU example so that a series
//! differs in one dimension only, and the real-driver hosts of `tests/realdriver.rs` (NVIDIA's
//! real userspace laid over their fixture text by `tests/realdriver/fetch.sh`).

use crate::realdriver;
use anyhow::{Context as _, Result, bail};
use nspawn_lifecycle::fixture;
use std::fmt::Write as _;
use std::process::Command;

/// Driver version of the eight-GPU example; the synthetic libraries carry it too.
const VERSION: &str = "580.95.05";
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
/// Driver files the example's `nvidia-libs` line makes (23 in the dir, the EGL platform library
/// among them, 1 in `vdpau/`).
pub const EXAMPLE_DRIVER_FILES: usize = 24;
/// Driver files discovery finds in either layout of the real driver (tests/golden/realdriver-*.discover.json).
const REAL_DRIVER_FILES: usize = 30;
/// MIG: GPU instances per GPU (an H100 splits into at most 7), each with one compute instance.
const MIG_INSTANCES: u32 = 7;

/// One host to measure.
pub struct BenchHost {
    /// Short name used in tables, the results file and the plot.
    pub name: String,
    pub about: String,
    pub text: String,
    /// Driver files this host should have, checked against discovery (`None`: no driver).
    pub driver_files: Option<usize>,
    /// Whether it belongs to the 8-GPU series plotted against the number of library files.
    pub file_series: bool,
    /// The layout (`run`, `deb`) in which fetch.sh lays the real driver over `text`, if any.
    pub realdriver: Option<&'static str>,
}

/// Every host, in the order they are measured and reported, each with `system_libs` unrelated
/// libraries beside the driver (see [`system_lib_lines`]), in its ld.so.cache too: the fixture's
/// `ldcache` line writes it, or fetch.sh's `ldconfig -r` for the real-driver hosts.
pub fn all(system_libs: usize) -> Result<Vec<BenchHost>> {
    let example = |name: &str| -> Result<String> {
        fixture::example(name)
            .map(str::to_owned)
            .with_context(|| format!("no example host {name}"))
    };
    let eight = example("eight-gpus")?;
    let mut hosts = vec![
        BenchHost {
            name: "cpu-only".into(),
            about: "example cpu-only: no NVIDIA devices".into(),
            text: example("cpu-only")?,
            driver_files: None,
            file_series: false,
            realdriver: None,
        },
        BenchHost {
            name: "1gpu".into(),
            about: "example one-gpu: one L4 with /dev/dri nodes".into(),
            text: example("one-gpu")?,
            driver_files: Some(EXAMPLE_DRIVER_FILES),
            file_series: false,
            realdriver: None,
        },
        BenchHost {
            name: "8gpu".into(),
            about: "example eight-gpus: 8 H100, 2 MIG caps, IMEX, NVSwitch, persistenced + fabricmanager"
                .into(),
            text: eight.clone(),
            driver_files: Some(EXAMPLE_DRIVER_FILES),
            file_series: true,
            realdriver: None,
        },
        BenchHost {
            name: "16gpu-mig".into(),
            about: format!(
                "eight-gpus + 8 more GPUs, {} MIG cap nodes ({MIG_INSTANCES} GI + CI per GPU)",
                2 + 16 * MIG_INSTANCES * 2
            ),
            text: with_more_gpus_and_mig(&eight, 16)?,
            driver_files: Some(EXAMPLE_DRIVER_FILES),
            file_series: false,
            realdriver: None,
        },
    ];
    hosts.push(BenchHost {
        name: "gb300".into(),
        about: "example gb300: 4 GPUs (aarch64), MIG, IMEX, 2 HCAs, NVMe, dm, md, tun, vhost-net, GPUDirect"
            .into(),
        // As after its first pre-start, which made the missing rdma_cm node: the steady state.
        text: example("gb300")? + "chr /dev/infiniband/rdma_cm 10:58\n",
        driver_files: Some(EXAMPLE_DRIVER_FILES),
        file_series: false,
        realdriver: None,
    });
    hosts.push(BenchHost {
        name: "8gpu-512blk".into(),
        about: "eight-gpus + 512 block devices (16 NVMe drives of 31 partitions each)".into(),
        text: with_block_devices(&eight, 16, 31),
        driver_files: Some(EXAMPLE_DRIVER_FILES),
        file_series: false,
        realdriver: None,
    });
    for files in [50, 200, 800] {
        hosts.push(BenchHost {
            name: format!("8gpu-{files}f"),
            about: format!(
                "eight-gpus + {} synthetic driver libraries (each with a SONAME link), {files} driver files",
                files - EXAMPLE_DRIVER_FILES
            ),
            text: with_extra_libs(&eight, files - EXAMPLE_DRIVER_FILES)?,
            driver_files: Some(files),
            file_series: true,
            realdriver: None,
        });
    }
    for layout in ["run", "deb"] {
        hosts.push(BenchHost {
            name: format!("realdriver-{layout}"),
            about: format!(
                "tests/realdriver.rs's host: 2 L4, NVIDIA's real 550.163.01 userspace (Debian trixie's packages) in fetch.sh's {layout} layout"
            ),
            text: realdriver::BASE.to_owned(),
            driver_files: Some(REAL_DRIVER_FILES),
            file_series: false,
            realdriver: Some(layout),
        });
    }
    for h in &mut hosts {
        h.text = if h.realdriver.is_some() {
            // fetch.sh's `ldconfig -r` puts them in the cache with the driver.
            h.text.clone() + &system_lib_lines(system_libs)
        } else {
            insert_before_ldcache(&h.text, &system_lib_lines(system_libs))?
        };
    }
    Ok(hosts)
}

/// Fails, naming fetch.sh and what to run, unless the real driver's packages are cached: a
/// benchmark downloads nothing, and a host it cannot build is an error, never a skipped row.
pub fn require_realdriver_cache() -> Result<()> {
    let out = Command::new(realdriver::fetch_sh())
        .arg("cached")
        .output()
        .with_context(|| format!("running {}", realdriver::fetch_sh().display()))?;
    if !out.status.success() {
        bail!(
            "the realdriver-* hosts need NVIDIA's packages cached by tests/realdriver/fetch.sh \
             (run `tests/realdriver/fetch.sh fetch` once, or leave those hosts out with --hosts): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `n` unrelated libraries for the multiarch dir, each with its SONAME link, as fixture lines. A
/// host's library dir is not just the driver: discovery lists all of it, and `ldconfig -p` prints
/// the whole cache (a Debian 12 host has ~500 entries, a desktop-ish GPU host more), so the
/// default of 500 keeps both comparisons honest.
fn system_lib_lines(n: usize) -> String {
    let mut extra = String::new();
    for k in 0..n {
        let stem = format!("libsystem{k:04}");
        let _ = writeln!(
            extra,
            "elf {LIB_DIR}/{stem}.so.{major}.2.3 x86_64 {stem}.so.{major}\nlink {LIB_DIR}/{stem}.so.{major} {stem}.so.{major}.2.3",
            major = k % 7
        );
    }
    extra
}

/// Insert `lines` before the `ldcache` line, which lists the ELF objects made before it.
fn insert_before_ldcache(base: &str, lines: &str) -> Result<String> {
    let mut out = String::new();
    let mut inserted = false;
    for line in base.lines() {
        if !inserted && line.starts_with("ldcache ") {
            out.push_str(lines);
            inserted = true;
        }
        out.push_str(line);
        out.push('\n');
    }
    if !inserted {
        bail!("the base host has no ldcache line to insert libraries before");
    }
    Ok(out)
}

/// `base` with `n` more `libnvidia-bench<k>.so.<version>` ELF stand-ins in the driver's library
/// directory, each with its SONAME link, all listed in the ld.so.cache.
pub fn with_extra_libs(base: &str, n: usize) -> Result<String> {
    let mut extra = String::new();
    for k in 0..n {
        let stem = format!("libnvidia-bench{k:04}");
        let _ = writeln!(
            extra,
            "elf {LIB_DIR}/{stem}.so.{VERSION} x86_64 {stem}.so.1\nlink {LIB_DIR}/{stem}.so.1 {stem}.so.{VERSION}"
        );
    }
    insert_before_ldcache(base, &extra)
}

/// `base` (eight GPUs, minors 0–7) grown to `total` GPUs, with MIG capability nodes for every GPU
/// as `nvidia-modprobe` makes them once instances exist: one GPU-instance and one
/// compute-instance access node per instance, under `/dev/nvidia-caps` (major 509).
pub fn with_more_gpus_and_mig(base: &str, total: u32) -> Result<String> {
    if !(8..=64).contains(&total) {
        bail!("total GPUs must be 8..=64");
    }
    let mut out = base.to_owned();
    out.push_str("\n# Added by the benchmark.\n");
    for i in 8..total {
        // Bus numbers the example does not use: 0x1c, 0x2c, …
        let bus = format!("0000:{:02x}:00.0", 0x1c + (i - 8) * 0x10);
        let _ = writeln!(
            out,
            "nvidia-gpu {bus} {i} GPU-{i:08x}-b1c5-4e2a-9f00-{i:012x} NVIDIA H100 80GB HBM3\nchr /dev/nvidia{i} 195:{i}"
        );
    }
    // nvidia-cap1 and nvidia-cap2 (config, monitor) are in the example already.
    let mut minor = 3;
    for _gpu in 0..total {
        for _gi in 0..MIG_INSTANCES {
            for _node in ["gi access", "ci access"] {
                let _ = writeln!(
                    out,
                    "chr /dev/nvidia-caps/nvidia-cap{minor} 509:{minor} 0444"
                );
                minor += 1;
            }
        }
    }
    Ok(out)
}

/// `text` plus `drives` NVMe drives of `parts` partitions each (`drives * (parts + 1)` block
/// devices, in sysfs and /dev, each partition in its drive's sysfs directory).
fn with_block_devices(text: &str, drives: u32, parts: u32) -> String {
    let mut out = text.to_owned();
    for d in 0..drives {
        let base = d * (parts + 1);
        out.push_str(&format!("blockdev nvme{d}n1 259:{base}\n"));
        for p in 1..=parts {
            out.push_str(&format!(
                "blockdev nvme{d}n1p{p} 259:{} nvme{d}n1\n",
                base + p
            ));
        }
    }
    out
}
