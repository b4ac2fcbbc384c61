//! A running machine as the host sees it: its leader PID and its root directory, opened once.
//!
//! The machine's rootfs is untrusted: root inside it can replace `/run/dbus/system_bus_socket`
//! with a symlink to a host path. The socket is therefore resolved inside the machine's root
//! (`openat2` with `RESOLVE_IN_ROOT`, no magic links) to an `O_PATH` descriptor, checked to be a
//! socket, and connected through `/proc/self/fd/<n>`, which names exactly that inode.

use super::{Systemd, SystemdError};
use crate::fs::machine_root::MachineRoot;
use crate::types::machine_name::MachineName;
use anyhow::{Context as _, Result, anyhow, bail};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, open, openat2};
use nix::sys::stat::{Mode, SFlag, fstat, fstatat};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// Where a systemd machine's system bus listens, relative to its root.
const BUS_SOCKET: &str = "run/dbus/system_bus_socket";

/// A machine's leader and root directory (an `O_PATH` directory descriptor).
#[derive(Debug)]
pub struct MachineHandle {
    name: String,
    leader: u32,
    /// `/proc/<leader>`, which stays tied to that very process even if its PID is reused.
    pid_dir: Option<OwnedFd>,
    root: MachineRoot,
    own_user_namespace: bool,
}

impl MachineHandle {
    /// Look `machine` up in machined on the host bus and open its root through the leader.
    pub fn find(host: &Systemd, machine: &MachineName, deadline: Instant) -> Result<MachineHandle> {
        let leader = host.machine_leader(machine, deadline)?.ok_or_else(|| {
            anyhow!(
                "machine {machine} is not registered with systemd-machined (is \
                 systemd-nspawn@{machine}.service running?)"
            )
        })?;
        let handle = MachineHandle::from_leader(machine, leader)?;
        // The leader may have exited and its PID been reused between the lookup and the open;
        // the /proc entry is pinned now, so asking again settles which process we opened.
        match host.machine_leader(machine, deadline)? {
            Some(again) if again == leader => Ok(handle),
            again => bail!(
                "machine {machine} changed while its root was being opened (leader {leader}, \
                 now {again:?}); try again"
            ),
        }
    }

    /// Open the root of the machine whose leader is `leader`.
    pub fn from_leader(machine: &MachineName, leader: u32) -> Result<MachineHandle> {
        let proc_dir = format!("/proc/{leader}");
        let pid_dir = open(
            proc_dir.as_str(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("machine {machine}: opening {proc_dir}"))?;
        // The root every write into the machine and the bus socket resolve under, opened once,
        // through the same pinned entry as the user namespace and uid map below.
        let root = MachineRoot::for_leader_dir(&pid_dir, leader)
            .with_context(|| format!("machine {machine}: opening its root"))?;
        let theirs = fstatat(&pid_dir, "ns/user", AtFlags::empty())
            .with_context(|| format!("machine {machine}: reading {proc_dir}/ns/user"))?;
        let ours =
            nix::sys::stat::stat("/proc/self/ns/user").context("reading /proc/self/ns/user")?;
        Ok(MachineHandle {
            name: machine.to_string(),
            leader,
            pid_dir: Some(pid_dir),
            root,
            own_user_namespace: (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino),
        })
    }

    /// A stand-in machine whose root is a directory (tests of socket resolution).
    #[cfg(test)]
    pub(crate) fn from_root_dir(
        machine: &MachineName,
        dir: &std::path::Path,
    ) -> Result<MachineHandle> {
        let root = MachineRoot::open(dir)?;
        Ok(MachineHandle {
            name: machine.to_string(),
            leader: 0,
            pid_dir: None,
            root,
            own_user_namespace: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn leader(&self) -> u32 {
        self.leader
    }

    /// The machine's root directory; every path under it resolves with `RESOLVE_IN_ROOT`.
    pub fn root(&self) -> &MachineRoot {
        &self.root
    }

    /// Whether the leader is still running (false once it has exited and been reaped; a new
    /// process that reuses its PID does not count).
    pub fn leader_alive(&self) -> bool {
        self.pid_dir
            .as_ref()
            .is_none_or(|d| fstatat(d, "stat", AtFlags::empty()).is_ok())
    }

    /// Whether the machine has a user namespace of its own (`PrivateUsers=` other than `no`).
    pub fn has_own_user_namespace(&self) -> bool {
        self.own_user_namespace
    }

    /// The user ID the machine's bus sees this process as: our effective UID mapped through the
    /// leader's `uid_map`, or the kernel's overflow UID when it is unmapped (host root under -U).
    /// D-Bus `EXTERNAL` authentication must claim exactly this ID or the bus rejects it.
    pub(crate) fn uid_seen_inside(&self) -> Result<u32> {
        let euid = nix::unistd::geteuid().as_raw();
        if !self.own_user_namespace {
            return Ok(euid);
        }
        let map = self.read_pinned("uid_map")?;
        if let Some(uid) = map_uid(&map, euid) {
            return Ok(uid);
        }
        let overflow = std::fs::read_to_string("/proc/sys/kernel/overflowuid")
            .context("reading /proc/sys/kernel/overflowuid")?;
        overflow
            .trim()
            .parse()
            .with_context(|| format!("parsing overflowuid {overflow:?}"))
    }

    /// Read `name` in the leader's pinned `/proc/<leader>` directory, never `/proc/<n>` by number:
    /// should the leader exit and its PID be reused, the number names another process, while the
    /// pinned directory still names the leader (and fails once it is gone).
    fn read_pinned(&self, name: &str) -> Result<String> {
        let what = format!(
            "machine {}: reading /proc/{}/{name}",
            self.name, self.leader
        );
        let dir = self
            .pid_dir
            .as_ref()
            .with_context(|| format!("{what}: the leader's /proc entry is not pinned"))?;
        let fd = nix::fcntl::openat(
            dir,
            name,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .with_context(|| what.clone())?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text).context(what)?;
        Ok(text)
    }

    pub(crate) fn check_user_namespace(&self) -> Result<()> {
        if self.own_user_namespace {
            return Err(SystemdError::ForeignUserNamespace {
                machine: self.name.clone(),
                leader: self.leader,
            }
            .into());
        }
        Ok(())
    }

    /// Connect to the machine's system bus socket, resolved inside its root.
    pub(crate) fn connect_bus_socket(&self) -> Result<UnixStream> {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = match openat2(&self.root, BUS_SOCKET, how) {
            Ok(fd) => fd,
            // Not there (yet): the machine's dbus may still be starting. Callers retry.
            Err(e @ Errno::ENOENT) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "machine {}: resolving /{BUS_SOCKET} inside the machine",
                    self.name
                )));
            }
            // A magic link, a path escaping the root, …: never a state dbus passes through.
            Err(e) => {
                return Err(SystemdError::UnsafeBusSocket {
                    machine: self.name.clone(),
                    detail: format!("resolving it inside the machine failed: {e}"),
                }
                .into());
            }
        };
        let st =
            fstat(&fd).with_context(|| format!("machine {}: fstat /{BUS_SOCKET}", self.name))?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if kind != SFlag::S_IFSOCK {
            return Err(SystemdError::UnsafeBusSocket {
                machine: self.name.clone(),
                detail: format!("it is not a socket (mode {:o})", st.st_mode),
            }
            .into());
        }
        let via = format!("/proc/self/fd/{}", fd.as_raw_fd());
        UnixStream::connect(&via).with_context(|| {
            format!(
                "machine {}: connecting to /{BUS_SOCKET} (leader {})",
                self.name, self.leader
            )
        })
    }
}

/// `uid` (outside) mapped through a `uid_map` text (`inside outside count` per line).
fn map_uid(uid_map: &str, uid: u32) -> Option<u32> {
    uid_map.lines().find_map(|line| {
        let mut f = line.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(inside)), Some(Ok(outside)), Some(Ok(count))) = (f.next(), f.next(), f.next())
        else {
            return None;
        };
        let uid = u64::from(uid);
        (uid >= outside && uid - outside < count)
            .then(|| u32::try_from(inside + (uid - outside)).ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn connects_to_a_socket_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("run/dbus")).unwrap();
        let listener = UnixListener::bind(dir.path().join(BUS_SOCKET)).unwrap();
        let m = MachineHandle::from_root_dir(&"m".parse().unwrap(), dir.path()).unwrap();
        let _client = m.connect_bus_socket().unwrap();
        let (_server, _) = listener.accept().unwrap();
    }

    #[test]
    fn an_absolute_symlink_out_of_the_machine_stays_inside_it() {
        // The "host" socket lives outside the machine root; the machine points its bus socket
        // at that absolute host path.
        let host = tempfile::tempdir().unwrap();
        let host_sock = host.path().join("host.sock");
        let _host_listener = UnixListener::bind(&host_sock).unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("run/dbus")).unwrap();
        std::os::unix::fs::symlink(&host_sock, root.path().join(BUS_SOCKET)).unwrap();
        let m = MachineHandle::from_root_dir(&"m".parse().unwrap(), root.path()).unwrap();
        let err = format!("{:#}", m.connect_bus_socket().unwrap_err());
        assert!(
            err.contains("resolving /run/dbus/system_bus_socket"),
            "{err}"
        );
        assert!(err.contains("No such file"), "{err}");

        // A relative escape (`../../..`) is clamped at the machine root the same way.
        std::fs::remove_file(root.path().join(BUS_SOCKET)).unwrap();
        let up = "../".repeat(host.path().components().count() + 4);
        std::os::unix::fs::symlink(
            format!("{up}{}", host_sock.display()),
            root.path().join(BUS_SOCKET),
        )
        .unwrap();
        assert!(m.connect_bus_socket().is_err());
    }

    #[test]
    fn a_symlink_inside_the_machine_is_followed_within_it() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("run/dbus")).unwrap();
        std::fs::create_dir_all(root.path().join("elsewhere")).unwrap();
        let listener = UnixListener::bind(root.path().join("elsewhere/bus")).unwrap();
        std::os::unix::fs::symlink("/elsewhere/bus", root.path().join(BUS_SOCKET)).unwrap();
        let m = MachineHandle::from_root_dir(&"m".parse().unwrap(), root.path()).unwrap();
        let _client = m.connect_bus_socket().unwrap();
        let (_server, _) = listener.accept().unwrap();
    }

    #[test]
    fn a_file_that_is_not_a_socket_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("run/dbus")).unwrap();
        std::fs::write(root.path().join(BUS_SOCKET), b"").unwrap();
        let m = MachineHandle::from_root_dir(&"m".parse().unwrap(), root.path()).unwrap();
        let err = format!("{:#}", m.connect_bus_socket().unwrap_err());
        assert!(err.contains("it is not a socket"), "{err}");
        assert!(err.contains("refusing"), "{err}");
    }

    #[test]
    fn uid_maps_translate_or_leave_unmapped() {
        // Stock -U: host root is not mapped, machine root is host 1273692160.
        let stock = "         0 1273692160      65536\n";
        assert_eq!(map_uid(stock, 0), None);
        assert_eq!(map_uid(stock, 1_273_692_160), Some(0));
        assert_eq!(map_uid(stock, 1_273_692_160 + 65_535), Some(65_535));
        assert_eq!(map_uid(stock, 1_273_692_160 + 65_536), None);
        // PrivateUsers=no / initial namespace.
        assert_eq!(map_uid("0 0 4294967295\n", 0), Some(0));
        assert_eq!(map_uid("garbage\n", 0), None);
    }

    #[test]
    fn a_leader_that_exits_is_noticed() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        // A leader sharing our root is refused (see below), so pin the child's /proc entry on a
        // stand-in machine rooted in a temp dir.
        let dir = tempfile::tempdir().unwrap();
        let mut m = MachineHandle::from_root_dir(&"m".parse().unwrap(), dir.path()).unwrap();
        m.leader = child.id();
        m.pid_dir = Some(
            open(
                format!("/proc/{}", child.id()).as_str(),
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .unwrap(),
        );
        assert!(m.leader_alive());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!m.leader_alive());
    }

    fn pin(pid: u32) -> OwnedFd {
        open(
            format!("/proc/{pid}").as_str(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn the_uid_map_is_read_through_the_pinned_proc_entry_not_the_pid_number() {
        // The real leader: a process in a user namespace of its own that maps our euid to 1000.
        let mut leader = std::process::Command::new("unshare")
            .args([
                "--user",
                "--map-user=1000",
                "--map-group=1000",
                "sleep",
                "30",
            ])
            .spawn()
            .unwrap();
        // Until unshare has made the namespace and written its map, the process shows ours
        // (`0 0 4294967295`), then an empty one.
        let map = format!("/proc/{}/uid_map", leader.id());
        let until = Instant::now() + std::time::Duration::from_secs(10);
        while !std::fs::read_to_string(&map)
            .unwrap_or_default()
            .trim_start()
            .starts_with("1000 ")
        {
            assert!(Instant::now() < until, "unshare never wrote {map}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // What PID reuse looks like: the number the handle carries now names another process
        // (a child of ours, in our own namespace), while the pinned entry is the leader's.
        let mut reused = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut m = MachineHandle::from_root_dir(&"m".parse().unwrap(), dir.path()).unwrap();
        m.own_user_namespace = true;
        m.pid_dir = Some(pin(leader.id()));
        m.leader = reused.id();
        let seen = m.uid_seen_inside();
        // Once the leader is gone, its pinned entry reads nothing, whatever the number names now.
        leader.kill().unwrap();
        leader.wait().unwrap();
        let gone = m.uid_seen_inside();
        reused.kill().unwrap();
        reused.wait().unwrap();
        assert_eq!(seen.unwrap(), 1000, "read another process's uid_map");
        let err = format!("{:#}", gone.unwrap_err());
        assert!(err.contains("machine m: reading /proc/"), "{err}");
        assert!(err.contains("/uid_map"), "{err}");
    }

    #[test]
    fn a_leader_whose_root_is_the_hosts_is_refused() {
        // Every write through such a "machine" would land on the host.
        let err =
            MachineHandle::from_leader(&"self".parse().unwrap(), std::process::id()).unwrap_err();
        assert!(
            format!("{err:#}").contains("is the host's root directory"),
            "{err:#}"
        );
        let dir = tempfile::tempdir().unwrap();
        let me = MachineHandle::from_root_dir(&"stand-in".parse().unwrap(), dir.path()).unwrap();
        assert!(!me.has_own_user_namespace());
        me.check_user_namespace().unwrap();
        let err = MachineHandle::from_leader(&"gone".parse().unwrap(), u32::MAX).unwrap_err();
        assert!(format!("{err:#}").contains("/proc/4294967295"), "{err:#}");
    }
}
