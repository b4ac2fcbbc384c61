//! Narrow D-Bus proxies: exactly the systemd and machined calls the helper makes, nothing more.
//!
//! Signatures follow org.freedesktop.systemd1(5) and org.freedesktop.machine1(5) of systemd 252.
//! Properties are read fresh on every access (the proxies are built without a property cache),
//! because the helper polls states that change under it.

use zbus::{OwnedObjectPath, Variant, proxy};

#[proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
pub trait Manager {
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Variant<'_>)],
        aux: &[(&str, Vec<(&str, Variant<'_>)>)],
    ) -> zbus::Result<OwnedObjectPath>;
    fn reload(&self) -> zbus::Result<()>;
    fn subscribe(&self) -> zbus::Result<()>;
    fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, Variant<'_>)],
    ) -> zbus::Result<()>;

    #[zbus(property)]
    fn system_state(&self) -> zbus::Result<String>;

    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: OwnedObjectPath,
        unit: String,
        result: String,
    ) -> zbus::Result<()>;
}

#[proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Unit {
    /// Drop the reference `AddRef=yes` took when the transient unit was made.
    fn unref(&self) -> zbus::Result<()>;

    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn sub_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn load_state(&self) -> zbus::Result<String>;
    #[zbus(property, name = "InvocationID")]
    fn invocation_id(&self) -> zbus::Result<Vec<u8>>;
    #[zbus(property)]
    fn need_daemon_reload(&self) -> zbus::Result<bool>;
}

#[proxy(
    interface = "org.freedesktop.systemd1.Service",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Service {
    #[zbus(property)]
    fn result(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn exec_main_status(&self) -> zbus::Result<i32>;
    #[zbus(property)]
    fn exec_main_code(&self) -> zbus::Result<i32>;
    #[zbus(property, name = "NRestarts")]
    fn n_restarts(&self) -> zbus::Result<u32>;
    #[zbus(property, name = "TimeoutStartUSec")]
    fn timeout_start_usec(&self) -> zbus::Result<u64>;
    #[zbus(property, name = "TimeoutStopUSec")]
    fn timeout_stop_usec(&self) -> zbus::Result<u64>;
    /// The device cgroup's allow list: (path or `char-<group>`, access `rwm`).
    #[zbus(property)]
    fn device_allow(&self) -> zbus::Result<Vec<(String, String)>>;
    /// Each `ExecStart=` command with its last run ([`super::ExecProperty`]).
    #[zbus(property)]
    fn exec_start(&self) -> zbus::Result<Vec<super::ExecProperty>>;
    /// Each `ExecStartPost=` command with its last run ([`super::ExecProperty`]), as systemd
    /// 252 keeps it until the unit starts again.
    #[zbus(property)]
    fn exec_start_post(&self) -> zbus::Result<Vec<super::ExecProperty>>;
}

#[proxy(
    interface = "org.freedesktop.machine1.Manager",
    default_service = "org.freedesktop.machine1",
    default_path = "/org/freedesktop/machine1"
)]
pub trait MachineManager {
    fn get_machine(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
}

#[proxy(
    interface = "org.freedesktop.machine1.Machine",
    default_service = "org.freedesktop.machine1"
)]
pub trait Machine {
    #[zbus(property)]
    fn leader(&self) -> zbus::Result<u32>;
}
