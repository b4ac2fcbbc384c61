//! What `--version` says besides the version: the git commit the binary was built from, whether
//! the tree had uncommitted changes, the build profile and the target. Without git (a source
//! tarball) the commit is "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    // Rebuild when HEAD or the index moves (a commit, a checkout, a staged change).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        for f in ["HEAD", "index"] {
            println!("cargo:rerun-if-changed={dir}/{f}");
        }
        if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
            println!("cargo:rerun-if-changed={common}/packed-refs");
            if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
                println!("cargo:rerun-if-changed={common}/{head}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // Only files git tracks count: a build writes target/ and nothing else.
    let dirty = match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if s.is_empty() => "",
        Some(_) => ", uncommitted changes",
        None => "",
    };
    let profile = std::env::var("PROFILE").unwrap_or_default();
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=NSPAWN_LIFECYCLE_COMMIT={commit}{dirty}");
    println!("cargo:rustc-env=NSPAWN_LIFECYCLE_PROFILE={profile}");
    println!("cargo:rustc-env=NSPAWN_LIFECYCLE_TARGET={target}");
}
