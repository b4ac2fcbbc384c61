//! Discovery of the userspace driver: the NVIDIA libraries (in the standard directories, those
//! `ld.so.cache` names, the companions of `libcuda`), the version the kernel module asks for,
//! its tools and daemon sockets.

use super::*;

impl Scan<'_> {
    /// Find the userspace driver. Several versions may be installed side by side (a package
    /// upgrade in progress, a .run install beside packages): the one matching the kernel module
    /// wins; without a match, the newest is reported and the mismatch is a reason.
    pub(super) fn userspace(&mut self, kernel: Option<&str>) -> Result<Option<UserspaceDriver>> {
        let (dirs, cache_problem) = self.candidate_lib_dirs()?;
        let found = self.find_libcudas(&dirs)?;
        let Some(chosen) = self.choose_version(kernel, &found, cache_problem) else {
            return Ok(None);
        };
        let mut lib_dirs = self.chosen_lib_dirs(&found, &chosen)?;
        for l in &lib_dirs {
            if l.triplet != "i386-linux-gnu" {
                let ml = format!("libnvidia-ml.so.{chosen}");
                if !l.files.iter().any(|f| f.name == ml) {
                    self.reason(format!("{ml} missing from {}", l.path));
                }
            }
        }
        self.companion_dirs(&dirs, &found, &chosen, &mut lib_dirs)?;
        if !lib_dirs.is_empty() && lib_dirs.iter().all(|l| l.triplet == "i386-linux-gnu") {
            self.reason(format!(
                "only 32-bit libcuda.so.{chosen} found; the 64-bit driver libraries are missing"
            ));
        }
        // 64-bit first, libcuda's directory before its companions (the first of one triplet
        // wins a name), then by path: the numbering under /run/host-nvidia/lib stays stable.
        let cuda = format!("libcuda.so.{chosen}");
        let key = |l: &LibDir| {
            (
                l.triplet == "i386-linux-gnu",
                !l.files.iter().any(|f| f.name == cuda),
                l.path.clone(),
            )
        };
        lib_dirs.sort_by_key(key);
        let binaries = self.driver_binaries()?;
        let fw = format!("/lib/firmware/nvidia/{chosen}");
        let firmware = match self.resolve(&fw)? {
            Some((_, m)) if m.is_dir() => Some(checked("firmware directory", fw)?),
            _ => None,
        };
        let sockets = self.daemon_sockets()?;
        let mut driver = UserspaceDriver {
            version: chosen,
            lib_dirs,
            binaries,
            firmware,
            sockets,
            runtime: Vec::new(),
        };
        driver.runtime = crate::discovery::runtime::c_runtime(self, &driver)?;
        Ok(Some(driver))
    }

    /// (canonical dir, version) of every regular file `libcuda.so.<version>` in `dirs`, in
    /// search order; each listing is kept for the driver-file scan.
    pub(super) fn find_libcudas(&mut self, dirs: &[String]) -> Result<Vec<(String, String)>> {
        let mut found: Vec<(String, String)> = Vec::new();
        for dir in dirs {
            let Some(listing) = self.list_typed(dir)? else {
                continue;
            };
            // A library dir holds hundreds of entries: pick libcuda's before sorting.
            let mut cudas: Vec<(&str, FileKind)> = listing
                .iter()
                .filter(|(n, _)| n.strip_prefix("libcuda.so.").is_some_and(parse::is_version))
                .map(|(n, k)| (n.as_str(), *k))
                .collect();
            cudas.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (name, kind) in cudas {
                let v = name.strip_prefix("libcuda.so.").unwrap_or_default();
                if kind.is_file() {
                    found.push((dir.clone(), v.to_owned()));
                } else {
                    tracing::debug!("{dir}/{name} is not a regular file; skipping");
                }
            }
            self.listings.insert(dir.clone(), listing);
        }
        Ok(found)
    }

    /// The driver version in use: the kernel module's when its libcuda is there, else the
    /// newest found (a mismatch is a reason); `None`, with the reason, when there is none.
    pub(super) fn choose_version(
        &mut self,
        kernel: Option<&str>,
        found: &[(String, String)],
        cache_problem: Option<String>,
    ) -> Option<String> {
        let versions: BTreeSet<&str> = found.iter().map(|(_, v)| v.as_str()).collect();
        let chosen = match kernel {
            Some(k) if versions.contains(k) => k.to_owned(),
            _ => match versions.iter().max_by(|a, b| parse::cmp_versions(a, b)) {
                Some(v) => (*v).to_owned(),
                None => {
                    let what = kernel.map_or("libcuda.so.<version>".to_owned(), |k| {
                        format!("libcuda.so.{k}")
                    });
                    let note = cache_problem.map_or(String::new(), |p| format!(" ({p})"));
                    self.reason(format!(
                        "{what} not found through {LD_CACHE} or in the standard library directories{note}"
                    ));
                    return None;
                }
            },
        };
        if let Some(k) = kernel
            && k != chosen
        {
            let listed: Vec<String> = found
                .iter()
                .map(|(d, v)| format!("libcuda.so.{v} (in {d})"))
                .collect();
            self.reason(format!("kernel module {k} but {}", listed.join(", ")));
        }
        for (dir, v) in found {
            if *v != chosen {
                tracing::info!("ignoring {dir}/libcuda.so.{v}: driver {chosen} is the one in use");
            }
        }
        Some(chosen)
    }

    /// One library directory per architecture holding `libcuda.so.<chosen>`, the first in search
    /// order; a libcuda that is no ELF object of ours is a reason.
    pub(super) fn chosen_lib_dirs(
        &mut self,
        found: &[(String, String)],
        chosen: &str,
    ) -> Result<Vec<LibDir>> {
        let mut lib_dirs: Vec<LibDir> = Vec::new();
        for (dir, _) in found.iter().filter(|(_, v)| *v == chosen) {
            let cuda = format!("{dir}/libcuda.so.{chosen}");
            let triplet = match self.elf(&cuda)? {
                Ok(info) => match info.triplet() {
                    Some(t) => t,
                    None => {
                        self.reason(format!(
                            "{cuda} is a {}-bit ELF object for machine {}, not x86_64, aarch64 or i386",
                            info.bits, info.machine
                        ));
                        continue;
                    }
                },
                Err(e) => {
                    self.reason(format!("{cuda}: {e}"));
                    continue;
                }
            };
            if let Some(first) = lib_dirs.iter().find(|l| l.triplet == triplet) {
                // Two copies for one architecture would fight over the same names in the
                // machine; the first in the dynamic linker's search order is the one in use.
                tracing::warn!(
                    "ignoring {cuda}: {} holds the same driver for {triplet} and comes first",
                    first.path
                );
                continue;
            }
            let files = self.driver_files(dir, chosen)?;
            lib_dirs.push(LibDir {
                path: checked("library directory", dir.clone())?,
                triplet: triplet.to_owned(),
                files,
            });
        }
        Ok(lib_dirs)
    }

    /// The driver's tools ([`BINARIES`]), each the first regular file found in [`BIN_DIRS`].
    pub(super) fn driver_binaries(&mut self) -> Result<Vec<HostPath>> {
        let mut binaries = Vec::new();
        for name in BINARIES {
            for dir in BIN_DIRS {
                let p = format!("{dir}/{name}");
                if let Some((_, m)) = self.resolve(&p)?
                    && m.is_file()
                {
                    binaries.push(checked("driver binary", p)?);
                    break;
                }
            }
        }
        binaries.sort();
        Ok(binaries)
    }

    /// The NVIDIA daemons' socket directories ([`SOCKET_DIRS`]) that hold a listening socket.
    pub(super) fn daemon_sockets(&mut self) -> Result<Vec<HostPath>> {
        let mut sockets = Vec::new();
        for dir in SOCKET_DIRS {
            if let Some(m) = self.lstat(&format!("{dir}/socket"))?
                && m.file_type().is_socket()
            {
                sockets.push(checked("socket directory", (*dir).to_owned())?);
            }
        }
        Ok(sockets)
    }

    /// Driver files of `version` in the other candidate directories of an architecture that has
    /// libcuda, appended to `lib_dirs` as directories of their own. Debian's packages put libcuda
    /// and most libraries in `/usr/lib/<triplet>/nvidia/current` (reached through
    /// `/etc/alternatives` links) but `libnvidia-eglcore`, `-glcore`, `-glsi`, `-tls`,
    /// `-glvkspirv`, `-gpucomp`, `-rtcore`, `-pkcs11-openssl3` and the EGL platform libraries
    /// straight into `/usr/lib/<triplet>`; `nvidia-ctk` mounts them all. A directory holding a
    /// `libcuda.so.<version>` of its own is another install (a second copy, or an older driver
    /// left beside this one), never a companion: its files are not this driver's.
    pub(super) fn companion_dirs(
        &mut self,
        dirs: &[String],
        found: &[(String, String)],
        version: &str,
        lib_dirs: &mut Vec<LibDir>,
    ) -> Result<()> {
        let suffix = format!(".so.{version}");
        for dir in dirs {
            if found.iter().any(|(d, _)| d == dir) {
                continue;
            }
            // Only a directory with a file of this exact version is a companion: unversioned
            // names alone (an EGL platform library installed for Mesa) do not make one.
            let probe = match self.listings.get(dir) {
                Some(listing) => listing
                    .iter()
                    .filter(|(n, k)| k.is_file() && n.len() > suffix.len() && n.ends_with(&suffix))
                    .map(|(n, _)| n.clone())
                    .min(),
                None => None,
            };
            let Some(probe) = probe else {
                continue;
            };
            let probe_path = format!("{dir}/{probe}");
            let triplet = match self.elf(&probe_path)? {
                Ok(info) => info.triplet(),
                Err(e) => {
                    tracing::debug!("{probe_path}: {e}; not a companion library directory");
                    continue;
                }
            };
            let Some(triplet) = triplet.filter(|t| lib_dirs.iter().any(|l| l.triplet == *t)) else {
                tracing::debug!(
                    "{dir}: driver files for an architecture without libcuda; skipping"
                );
                continue;
            };
            let files = self.driver_files(dir, version)?;
            if files.is_empty() {
                continue;
            }
            lib_dirs.push(LibDir {
                path: checked("library directory", dir.clone())?,
                triplet: triplet.to_owned(),
                files,
            });
        }
        Ok(())
    }

    /// Canonical directories that may hold libcuda: those of the `libcuda.so*` entries in the
    /// host's ld.so.cache (what the dynamic linker would load, so first), then the standard
    /// directories. Also says why the cache could not be used, if it could not.
    pub(super) fn candidate_lib_dirs(&mut self) -> Result<(Vec<String>, Option<String>)> {
        let mut dirs: Vec<String> = Vec::new();
        let mut problem = None;
        let bytes = self.read(LD_CACHE, MAX_LD_CACHE)?.unwrap_or_default();
        // Distinct libcuda paths in cache order; each costs a walk of the tree to resolve.
        let mut cached: Vec<&str> = Vec::new();
        let mut too_many = false;
        if !bytes.is_empty() {
            let parsed = parse::ld_so_cache_each(&bytes, |e| {
                if e.key.starts_with("libcuda.so") && !cached.contains(&e.path) {
                    if cached.len() < MAX_CACHED_LIBCUDA {
                        cached.push(e.path);
                    } else {
                        too_many = true;
                    }
                }
            });
            let why = match parsed {
                Err(e) => Some(e.to_string()),
                Ok(()) if too_many => Some(format!(
                    "more than {MAX_CACHED_LIBCUDA} different libcuda paths, which no ldconfig writes"
                )),
                Ok(()) => None,
            };
            if let Some(why) = why {
                tracing::warn!("{LD_CACHE}: {why}; searching the standard directories only");
                problem = Some(format!("{LD_CACHE}: {why}"));
                cached.clear();
            }
        }
        for path in cached {
            if let Some((canon, m)) = self.resolve(path)?
                && m.is_file()
                && let Some((dir, _)) = canon.rsplit_once('/')
            {
                let dir = if dir.is_empty() { "/" } else { dir };
                if !dirs.iter().any(|d| d == dir) {
                    dirs.push(dir.to_owned());
                }
            }
        }
        for d in STANDARD_LIB_DIRS {
            if let Some((canon, m)) = self.resolve(d)?
                && m.is_dir()
                && !dirs.contains(&canon)
            {
                dirs.push(canon);
            }
        }
        Ok((dirs, problem))
    }

    /// Every regular `*.so.<version>` file in `dir` and `dir/vdpau`, and the driver libraries
    /// whose names do not carry the version ([`unversioned_driver_lib`]), with their SONAMEs.
    ///
    /// A library directory holds hundreds or thousands of entries, so file types come from the
    /// listing (`d_type`), not one `lstat` each, and symlinks are read only for a library whose
    /// ELF has no SONAME: per driver file this costs an open, a few `pread`s and a close.
    pub(super) fn driver_files(&mut self, dir: &str, version: &str) -> Result<Vec<DriverFile>> {
        let suffix = format!(".so.{version}");
        let mut out = Vec::new();
        for (sub, at) in [("", dir.to_owned()), ("vdpau/", format!("{dir}/vdpau"))] {
            if !sub.is_empty() && !self.lstat(&at)?.is_some_and(|m| m.is_dir()) {
                continue;
            }
            let entries = match self.listings.remove(&at) {
                Some(listed) => listed,
                None => self.list_typed(&at)?.unwrap_or_default(),
            };
            let mut candidates: Vec<(&str, &str)> = entries
                .iter()
                .filter(|(_, kind)| kind.is_file())
                .filter_map(|(name, _)| {
                    let stem = match name.strip_suffix(&suffix) {
                        Some(stem) => stem,
                        None => unversioned_driver_lib(name)?,
                    };
                    (!stem.is_empty()).then_some((name.as_str(), stem))
                })
                .collect();
            candidates.sort_unstable();
            // SONAME fallback: symlinks in this directory, by the name they point at.
            let mut links: Option<BTreeMap<String, Vec<String>>> = None;
            for (name, stem) in candidates {
                let p = format!("{at}/{name}");
                let soname = match self.elf(&p)? {
                    Ok(info) => info.soname,
                    Err(e) => {
                        tracing::debug!("{p}: {e}; looking for a SONAME link instead");
                        None
                    }
                };
                let soname = soname.or_else(|| {
                    let links = links.get_or_insert_with(|| self.links_by_target(&at, &entries));
                    let prefix = format!("{stem}.so.");
                    let mut c: Vec<&String> = links
                        .get(name)
                        .into_iter()
                        .flatten()
                        .filter(|l| l.starts_with(&prefix))
                        .collect();
                    c.sort_by_key(|l| (l.len(), l.as_str()));
                    c.first().map(|s| (*s).clone())
                });
                out.push(DriverFile {
                    name: format!("{sub}{name}"),
                    soname: soname.filter(|s| s.as_str() != name),
                });
            }
        }
        out.sort();
        Ok(out)
    }

    /// The symlinks among `entries` of directory `at`, by their (UTF-8) target. A link that
    /// cannot be read is left out, as it can name no SONAME.
    pub(super) fn links_by_target(
        &self,
        at: &str,
        entries: &[(String, FileKind)],
    ) -> BTreeMap<String, Vec<String>> {
        let mut links: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, kind) in entries {
            if kind.is_symlink()
                && let Ok(target) = self.host.read_link(format!("{at}/{name}"))
                && let Some(t) = target.to_str()
            {
                links.entry(t.to_owned()).or_default().push(name.clone());
            }
        }
        links
    }
}
