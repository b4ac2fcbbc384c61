//! Files, through handles that cannot be redirected: the host root ([`host::HostRoot`]) and a
//! machine's or container's root ([`machine_root::MachineRoot`]), the one atomic writer, the
//! verified host directories, mounts by descriptor, and the machine locks.

pub(crate) mod atomic;
pub mod fd_mount;
pub mod host;
pub(crate) mod host_dir;
pub(crate) mod lock;
pub mod machine_root;
