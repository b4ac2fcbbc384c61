use super::*;

#[test]
fn versions() {
    for v in ["580.95.05", "550.54", "1.0.0.1"] {
        assert!(is_version(v), "{v}");
    }
    for v in [
        "",
        "580",
        "580.",
        ".95",
        "580.95.05a",
        "5 8.1",
        "../1.2",
        &"1.".repeat(20),
    ] {
        assert!(!is_version(v), "{v}");
    }
    use std::cmp::Ordering::*;
    assert_eq!(cmp_versions("580.95.05", "580.9.99"), Greater);
    assert_eq!(cmp_versions("580.82.07", "580.95.05"), Less);
    assert_eq!(cmp_versions("1000.1", "999.99"), Greater);
}

#[test]
fn kernel_module_version_in_both_wordings() {
    let prop = b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n";
    assert_eq!(
        nvidia_version(prop).unwrap(),
        KernelModule {
            version: "535.129.03".into(),
            open: false
        }
    );
    let open = b"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  555.42.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Jun  4 01:49:23 UTC 2024\n";
    assert_eq!(
        nvidia_version(open).unwrap(),
        KernelModule {
            version: "555.42.06".into(),
            open: true
        }
    );
    let arm =
        b"NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.54.15  Tue Mar  5 19:55:14 UTC 2024";
    assert_eq!(nvidia_version(arm).unwrap().version, "550.54.15");
    for (bad, needle) in [
        (&b""[..], "empty"),
        (b"\n", "empty"),
        (
            b"NVRM version: NVIDIA UNIX x86_64 Kernel Mod",
            "no \"Kernel Module\"",
        ),
        (
            b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  ",
            "no driver version",
        ),
        (
            b"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64",
            "no driver version",
        ),
        (
            b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05/../x",
            "no driver version",
        ),
        (b"garbage", "is not \"NVRM version"),
        (b"NVRM version: \xff\xfe Kernel Module 1.2", "not UTF-8"),
    ] {
        let err = nvidia_version(bad).unwrap_err().to_string();
        assert!(err.contains(needle), "{bad:?}: {err}");
    }
}

#[test]
fn gpu_information_file() {
    let text = "Model: \t\t Tesla V100-SXM2-16GB\nIRQ:             408\nGPU UUID:        GPU-edfee158-11c1-52b8-0517-92f30e7fac88\nVideo BIOS:      88.00.41.00.01\nBus Type:        PCIe\nDMA Size:        47 bits\nDMA Mask:        0x7fffffffffff\nBus Location:    0000:06:00.0\nDevice Minor:    0\nGPU Excluded:    No\n";
    let g = gpu_information(text.as_bytes()).unwrap();
    assert_eq!(g.model, "Tesla V100-SXM2-16GB");
    assert_eq!(g.uuid, "GPU-edfee158-11c1-52b8-0517-92f30e7fac88");
    assert_eq!(g.bus_location, "0000:06:00.0");
    assert_eq!(g.device_minor, 0);
    let truncated = &text[..text.find("Bus Location").unwrap()];
    assert!(
        gpu_information(truncated.as_bytes())
            .unwrap_err()
            .to_string()
            .contains("Bus Location")
    );
    let bad_minor = text.replace("Device Minor:    0", "Device Minor:    -1");
    assert!(gpu_information(bad_minor.as_bytes()).is_err());
    let bad_uuid = text.replace("GPU-edfee158", "GPU-../../x");
    assert!(gpu_information(bad_uuid.as_bytes()).is_err());
    assert!(gpu_information(b"\xff\xfe").is_err());
    // Found by the gpu_information fuzz target: a `\r` (and NULs) inside a line passed.
    let cr = text.replace("Tesla V100", "Tesla V1\r\0\0\x1b[2J");
    let err = gpu_information(cr.as_bytes()).unwrap_err().to_string();
    assert!(err.contains("Model \"Tesla V1\\r"), "{err}");
    assert!(err.contains("contains control characters"), "{err}");
}

#[test]
fn pci_addresses_sort_in_bus_order() {
    let mut a: Vec<_> = [
        "0000:86:00.0",
        "0000:3b:00.0",
        "0009:01:00.0",
        "0000:3B:00.1",
    ]
    .iter()
    .map(|s| PciAddress::parse(s).unwrap())
    .collect();
    a.sort();
    let shown: Vec<_> = a.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "0000:3b:00.0",
            "0000:3b:00.1",
            "0000:86:00.0",
            "0009:01:00.0"
        ]
    );
    for bad in [
        "",
        "0000:06:00",
        "0000:06:00.8",
        "0000:06:20.0",
        "x:06:00.0",
        "0000:106:00.0",
        "0000:06:00.0/..",
    ] {
        assert_eq!(PciAddress::parse(bad), None, "{bad}");
    }
}

#[test]
fn proc_devices_character_section() {
    let text = "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n195 nvidia\n226 drm\n508 nvidia-uvm\n\nBlock devices:\n  8 sd\n";
    let got = proc_devices(text.as_bytes()).unwrap();
    assert_eq!(got.len(), 6);
    assert_eq!(got[3], (195, "nvidia".to_owned()));
    assert_eq!(got[5], (508, "nvidia-uvm".to_owned()));
    assert!(!got.iter().any(|(_, n)| n == "sd"));
    assert!(proc_devices(b"Block devices:\n 8 sd\n").is_err());
    assert!(proc_devices(b"Character devices:\nnvidia 195\n").is_err());
    assert!(proc_devices(b"Character devices:\n195\n").is_err());
    assert!(proc_devices(b"\xff").is_err());
    // Truncated after the header is just an empty table.
    assert_eq!(proc_devices(b"Character devices:\n").unwrap(), vec![]);
}

#[test]
fn pci_ids() {
    assert_eq!(pci_id(b"0x10de\n").unwrap(), NVIDIA_VENDOR);
    assert_eq!(pci_id(b"0x8086").unwrap(), 0x8086);
    for bad in [&b""[..], b"10de\n", b"0x10de0\n", b"0xzzzz\n", b"\xff"] {
        assert!(pci_id(bad).is_err(), "{bad:?}");
    }
    // Found by the pci_id fuzz target: a sign slipped through u16::from_str_radix.
    assert!(pci_id(b"0x+0de\n").is_err());
}

/// `ldconfig -p` lines: `\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1`.
fn ldconfig_p(args: &[&str]) -> Vec<(String, String)> {
    let out = std::process::Command::new("ldconfig")
        .arg("-p")
        .args(args)
        .output()
        .expect("ldconfig -p runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with('\t'))
        .map(|l| {
            let (name, rest) = l.trim().split_once(" (").unwrap();
            let (_, path) = rest.rsplit_once(" => ").unwrap();
            (name.to_owned(), path.to_owned())
        })
        .collect()
}

#[test]
fn real_ld_so_cache_matches_ldconfig() {
    let bytes = std::fs::read("/etc/ld.so.cache").unwrap();
    let ours: Vec<_> = ld_so_cache(&bytes)
        .unwrap()
        .into_iter()
        .map(|e| (e.key.to_owned(), e.path.to_owned()))
        .collect();
    let theirs = ldconfig_p(&[]);
    assert!(theirs.len() > 10, "suspiciously small cache");
    assert_eq!(ours, theirs);
}

/// ldconfig itself writes the three cache layouts from a tree of our ELF stand-ins (which also
/// proves ldconfig accepts the stand-ins as shared objects); each must read back the same.
#[test]
fn ldconfig_written_caches_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let lib = root.join("opt/nv/lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/ld.so.conf"), "/opt/nv/lib\n").unwrap();
    for (file, soname) in [
        ("libcuda.so.580.95.05", "libcuda.so.1"),
        ("libnvidia-ml.so.580.95.05", "libnvidia-ml.so.1"),
        (
            "libnvidia-glcore.so.580.95.05",
            "libnvidia-glcore.so.580.95.05",
        ),
    ] {
        let elf = crate::fixture::elf_shared_object(crate::fixture::Arch::X86_64, Some(soname));
        std::fs::write(lib.join(file), elf).unwrap();
    }
    let root_s = root.to_str().unwrap();
    for format in ["new", "compat", "old"] {
        let cache = format!("/etc/ld.so.cache.{format}");
        let st = std::process::Command::new("ldconfig")
            .args(["-r", root_s, "-c", format, "-C", &cache])
            .status()
            .unwrap();
        assert!(st.success(), "ldconfig -c {format}");
        let bytes = std::fs::read(root.join(cache.trim_start_matches('/'))).unwrap();
        let magic = if format == "new" {
            b"glibc-ld.so.cache1.1".as_slice()
        } else {
            b"ld.so-1.7.0".as_slice()
        };
        assert!(bytes.starts_with(magic), "{format}");
        let ours = ld_so_cache(&bytes).unwrap();
        let keys: Vec<_> = ours.iter().map(|e| (e.key, e.path)).collect();
        assert!(
            keys.contains(&("libcuda.so.1", "/opt/nv/lib/libcuda.so.1")),
            "{format}: {keys:?}"
        );
        assert!(
            keys.contains(&(
                "libnvidia-glcore.so.580.95.05",
                "/opt/nv/lib/libnvidia-glcore.so.580.95.05"
            )),
            "{format}: {keys:?}"
        );
        let cuda = ours.iter().find(|e| e.key == "libcuda.so.1").unwrap();
        assert_eq!(cuda.flags, 0x0303, "{format}");
        let theirs = ldconfig_p(&[
            "-C",
            root.join(cache.trim_start_matches('/')).to_str().unwrap(),
        ]);
        let ours: Vec<_> = ours
            .into_iter()
            .map(|e| (e.key.to_owned(), e.path.to_owned()))
            .collect();
        assert_eq!(ours, theirs, "{format}");
    }
}

#[test]
fn cache_garbage_is_an_error_not_a_panic() {
    let good = crate::fixture::ld_so_cache(&[("libcuda.so.1", "/x/libcuda.so.1", 0x0303)]);
    for len in 0..good.len() {
        let _ = ld_so_cache(&good[..len]);
    }
    assert!(
        ld_so_cache(&good[..good.len() - 1]).is_err(),
        "unterminated string"
    );
    assert!(ld_so_cache(b"garbage").is_err());
    let mut huge = good.clone();
    huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(ld_so_cache(&huge).is_err());
    let mut old = b"ld.so-1.7.0\0".to_vec();
    old.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(ld_so_cache(&old).is_err());
}

/// Found by tests/oversized.rs: 700 000 entries naming one 4 KiB path within the 16 MiB
/// limit were gigabytes as owned strings. Entries point into the cache instead.
#[test]
fn cache_entries_borrow_from_the_cache() {
    let long = format!("/{}/libcuda.so.1", "x".repeat(4000));
    let bytes = crate::fixture::ld_so_cache(&[("libcuda.so.1", &long, 0x303)]);
    let e = ld_so_cache(&bytes).unwrap();
    assert_eq!(e[0].path, long);
    assert!(bytes.as_ptr_range().contains(&e[0].path.as_ptr()));
    let mut seen = 0;
    ld_so_cache_each(&bytes, |_| seen += 1).unwrap();
    assert_eq!(seen, 1);
    // And there are at most 65536 of them, whatever the header says.
    let mut many = crate::fixture::ld_so_cache(&[("libcuda.so.1", &long, 0x303)]);
    many.resize(48 + 24 * (MAX_CACHE_ENTRIES as usize + 1), 0);
    many[20..24].copy_from_slice(&(MAX_CACHE_ENTRIES + 1).to_le_bytes());
    let err = ld_so_cache(&many).unwrap_err().to_string();
    assert!(err.contains("65537 entries; more than 65536"), "{err}");
}

#[test]
fn head_reads_answer_like_the_file() {
    let file: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let head = |len: usize, whole| Head {
        head: file[..len].to_vec(),
        whole,
        rest: file.as_slice(),
    };
    let read = |r: &Head<'_, [u8]>, off: u64, len: usize| {
        let mut buf = vec![0u8; len];
        let n = r.read_at(off, &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let r = head(1024, false);
    // Inside the head, straddling its end, past it, and past the end of the file.
    for (off, len) in [
        (0, 64),
        (64, 960),
        (1000, 100),
        (2000, 500),
        (2990, 100),
        (5000, 8),
    ] {
        let end = (off + len).min(file.len());
        let want = file.get(off..end).unwrap_or_default();
        assert_eq!(read(&r, off as u64, len), want, "{off}+{len}");
    }
    // A file that ended within the head: nothing beyond it, and no read of the rest.
    let r = Head {
        head: file[..300].to_vec(),
        whole: true,
        rest: &[][..],
    };
    assert_eq!(read(&r, 250, 100), &file[250..300]);
    assert!(read(&r, 400, 10).is_empty());
}

#[test]
fn elf_of_real_system_libraries() {
    let libc = std::fs::File::open("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let info = elf_info(&libc).unwrap();
    // Its dynamic segment lies far past the head: both paths of the head reader agree.
    assert_eq!(
        elf_info_bytes(&std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap()).unwrap(),
        info
    );
    assert_eq!(info.triplet(), Some("x86_64-linux-gnu"));
    assert_eq!(info.soname.as_deref(), Some("libc.so.6"));
    let exe = std::fs::File::open("/bin/sh").unwrap();
    assert_eq!(elf_info(&exe).unwrap().soname, None);
}

/// A poor man's fuzz run until the real fuzzers exist: random bytes, and random splices of
/// valid inputs, through every parser. Any result is fine; a panic fails the test.
#[test]
fn random_input_never_panics() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let seeds: Vec<Vec<u8>> = vec![
        b"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  555.42.06  Release Build\n"
            .to_vec(),
        b"Model: L4\nGPU UUID: GPU-1\nBus Location: 0000:06:00.0\nDevice Minor: 0\n".to_vec(),
        b"Character devices:\n195 nvidia\n\nBlock devices:\n".to_vec(),
        crate::fixture::ld_so_cache(&[("libcuda.so.1", "/l/libcuda.so.1", 0x303)]),
        crate::fixture::elf_shared_object(crate::fixture::Arch::X86_64, Some("libcuda.so.1")),
    ];
    for round in 0..20_000 {
        let mut input = seeds[round % seeds.len()].clone();
        match next() % 3 {
            0 => {
                let len = (next() % 200) as usize;
                input = (0..len).map(|_| next() as u8).collect();
            }
            1 if !input.is_empty() => {
                for _ in 0..(next() % 8) {
                    let at = (next() as usize) % input.len();
                    input[at] = next() as u8;
                }
            }
            _ => {
                let keep = (next() as usize) % (input.len() + 1);
                input.truncate(keep);
            }
        }
        let _ = nvidia_version(&input);
        let _ = gpu_information(&input);
        let _ = proc_devices(&input);
        let _ = pci_id(&input);
        let _ = ld_so_cache(&input);
        let _ = elf_info_bytes(&input);
        if let Ok(s) = std::str::from_utf8(&input) {
            let _ = PciAddress::parse(s);
            let _ = is_version(s) && cmp_versions(s, "1.2").is_eq();
        }
    }
}

#[test]
fn elf_garbage_is_an_error_not_a_panic() {
    use crate::fixture::{Arch, elf_shared_object};
    for arch in [Arch::X86_64, Arch::Aarch64, Arch::I386] {
        let good = elf_shared_object(arch, Some("libx.so.1"));
        for len in 0..good.len() {
            let _ = elf_info_bytes(&good[..len]);
        }
        // Flip every byte in turn: any result is fine, a panic is not.
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0xff;
            let _ = elf_info_bytes(&bad);
        }
    }
    assert!(elf_info_bytes(b"#!/bin/sh\n").is_err());
    assert!(elf_info_bytes(b"").is_err());
}

/// A real program of the machine the tests run on, its `PT_INTERP` rewritten to `interp`
/// (same length, NUL-padded).
fn program_with_interp(interp: &[u8]) -> Vec<u8> {
    let mut bytes = std::fs::read("/usr/bin/true").unwrap();
    let at = bytes
        .windows(28)
        .position(|w| w == b"/lib64/ld-linux-x86-64.so.2\0")
        .expect("/usr/bin/true names the x86-64 loader");
    let mut repl = interp.to_vec();
    repl.resize(28, 0);
    bytes[at..at + 28].copy_from_slice(&repl);
    bytes
}

#[test]
fn a_programs_loader_and_libraries_are_read_as_the_loader_reads_them() {
    let d = elf_deps(std::fs::read("/usr/bin/true").unwrap().as_slice()).unwrap();
    assert_eq!(d.interp.as_deref(), Some("/lib64/ld-linux-x86-64.so.2"));
    assert_eq!(d.needed, ["libc.so.6"]);
    assert_eq!(d.info.triplet(), Some("x86_64-linux-gnu"));
    let libc = elf_deps(
        std::fs::read("/lib/x86_64-linux-gnu/libc.so.6")
            .unwrap()
            .as_slice(),
    )
    .unwrap();
    assert_eq!(libc.info.soname.as_deref(), Some("libc.so.6"));
    assert_eq!(libc.needed, ["ld-linux-x86-64.so.2"]);
    assert_eq!(libc.interp.as_deref(), Some("/lib64/ld-linux-x86-64.so.2"));
    // What elf_info reads is unchanged.
    assert_eq!(
        elf_info_bytes(&std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap()).unwrap(),
        libc.info
    );
}

#[test]
fn a_loader_path_that_leaves_its_root_or_is_relative_is_refused() {
    for bad in [
        &b"/lib64/../../../etc/shadow"[..],
        b"lib64/ld-linux-x86-64.so.2",
        b"/lib64//ld.so",
        b"/lib64/./ld.so",
        b"",
    ] {
        let e = elf_deps(program_with_interp(bad).as_slice()).unwrap_err();
        assert!(e.to_string().contains("PT_INTERP"), "{bad:?}: {e}");
    }
    let ok = elf_deps(program_with_interp(b"/opt/x/ld.so").as_slice()).unwrap();
    assert_eq!(ok.interp.as_deref(), Some("/opt/x/ld.so"));
}

#[test]
fn a_needed_name_with_a_slash_is_refused() {
    let mut bytes = std::fs::read("/usr/bin/true").unwrap();
    let at = bytes.windows(10).position(|w| w == b"libc.so.6\0").unwrap();
    bytes[at..at + 9].copy_from_slice(b"../lib.so");
    let e = elf_deps(bytes.as_slice()).unwrap_err();
    assert!(e.to_string().contains("DT_NEEDED"), "{e}");
}

#[test]
fn mountinfo_lines_with_optional_fields_escapes_and_junk() {
    let text = b"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
        23 22 0:21 / /proc rw,nosuid - proc proc rw\n\
        24 22 0:35 / /mnt/my\\040disk rw master:2 propagate_from:1 - btrfs /dev/nvme0n1p2 rw\n\
        garbage line\n\
        25 22 x:y / /broken rw - ext4 /dev/sdz rw\n\
        26 22 8:17 / /short rw -\n";
    let m = mountinfo(text);
    assert_eq!(m.len(), 3, "{m:#?}");
    assert_eq!((m[0].major, m[0].minor), (8, 1));
    assert_eq!(m[0].mount_point, "/");
    assert_eq!(m[0].source, "/dev/sda1");
    assert_eq!(m[2].mount_point, "/mnt/my disk");
    assert_eq!(m[2].source, "/dev/nvme0n1p2");
}

#[test]
fn swaps_lists_file_names_after_the_header() {
    let text = b"Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
        /dev/sda2                               partition\t8388604\t\t0\t\t-2\n\
        /swap\\040file                            file\t\t1048572\t\t0\t\t-3\n";
    assert_eq!(swaps(text), ["/dev/sda2", "/swap file"]);
}

#[test]
fn proc_partitions_lines_and_junk() {
    let text = b"major minor  #blocks  name\n\n 259        0  937692504 nvme0n1\n 259        1     524288 nvme0n1p1\n 104        0    1000 cciss/c0d0\n   8   16 x sdb\n garbage\n";
    assert_eq!(
        proc_partitions(text),
        [
            (259, 0, "nvme0n1".to_owned()),
            (259, 1, "nvme0n1p1".to_owned()),
            (104, 0, "cciss/c0d0".to_owned())
        ]
    );
}
