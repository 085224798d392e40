//! Group and communicator configuration, with the `INCCL_*` environment overrides.
//!
//! | variable | meaning |
//! |---|---|
//! | `INCCL_CONTROLLER` | controller address `host:port` (rank 0 only) |
//! | `INC_CONTROLLER_TOKEN` | host credential presented to the controller (rank 0; the controller's one token variable) |
//! | `INCCL_MASTER_PORT` | bootstrap port of rank 0 when the master address has none (default 52223) |
//! | `INCCL_TIMEOUT_MS` | bound of every bootstrap wait (default 30000) |
//! | `INCCL_OP_TIMEOUT_MS` | a collective that makes no progress for this long fails (default 10000) |
//! | `INCCL_IFACE` | data-plane interface (its IPv4 and MAC are used) |
//! | `INCCL_LOCAL_IP` | data-plane IPv4 address (overrides the interface's; for hosts with several addresses) |
//! | `INCCL_TRANSPORT` | `udp` (userspace RoCEv2, default) or `verbs` |
//! | `INCCL_MTU`, `INCCL_WINDOW` | payload bytes per packet and window, passed to the controller |
//! | `INCCL_BUSY_POLL_US` | userspace transport: inside a collective, poll the socket this many microseconds (yielding the CPU between polls) before sleeping until a datagram comes (default 200; 0: always sleep) |
//! | `INCCL_UDP_GSO` | `auto` (default): the userspace transport sends runs of frames as UDP GSO sends when the kernel cuts them into datagrams itself (no transmit checksum offload on the interface); `off`: one datagram per send |

use std::env;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::Duration;

use inc_ctrl_proto::EthernetAddress;

use crate::error::{Error, Result};

/// Default bootstrap port of rank 0 (the seed's).
pub const DEFAULT_MASTER_PORT: u16 = 52223;
/// Default bound of bootstrap waits.
pub const DEFAULT_BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default stall bound of a collective.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Default busy-poll bound of the userspace transport (`INCCL_BUSY_POLL_US`).
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(200);

/// How a communicator moves packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// RoCEv2 spoken from user space over UDP sockets (no kernel RDMA needed).
    Udp,
    /// Kernel RDMA through libibverbs (feature `verbs`).
    Verbs,
}

impl FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "udp" | "userspace" | "user" => Ok(TransportKind::Udp),
            "verbs" | "ibverbs" | "rdma" => Ok(TransportKind::Verbs),
            _ => Err(format!("unknown transport `{s}` (expected udp or verbs)")),
        }
    }
}

/// Parameters of [`crate::Group::create`].
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// Number of ranks.
    pub world_size: u16,
    /// This process's rank, `0..world_size`.
    pub rank: u16,
    /// Rank 0's bootstrap address: `host` or `host:port` on the management network.
    pub master_addr: String,
    /// Port used when `master_addr` has none.
    pub master_port: u16,
    /// Controller address `host:port`; needed on rank 0 only.
    pub controller: Option<String>,
    /// Token presented to the controller.
    pub token: Option<String>,
    /// Bound of every bootstrap wait.
    pub timeout: Duration,
    /// Data-plane interface name.
    pub iface: Option<String>,
    /// Data-plane IPv4 address; overrides the interface's address.
    pub local_ip: Option<Ipv4Addr>,
    /// Data-plane MAC; overrides the interface's MAC.
    pub local_mac: Option<EthernetAddress>,
}

impl GroupConfig {
    /// Configuration with defaults and no environment applied.
    pub fn new(world_size: u16, rank: u16, master_addr: impl Into<String>) -> Self {
        GroupConfig {
            world_size,
            rank,
            master_addr: master_addr.into(),
            master_port: DEFAULT_MASTER_PORT,
            controller: None,
            token: None,
            timeout: DEFAULT_BOOTSTRAP_TIMEOUT,
            iface: None,
            local_ip: None,
            local_mac: None,
        }
    }

    /// Configuration with the `INCCL_*` environment variables applied.
    pub fn from_env(world_size: u16, rank: u16, master_addr: impl Into<String>) -> Result<Self> {
        let mut c = Self::new(world_size, rank, master_addr);
        c.apply_env()?;
        Ok(c)
    }

    /// Apply the `INCCL_*` environment variables over the current values.
    pub fn apply_env(&mut self) -> Result<()> {
        if let Some(v) = env_str("INCCL_CONTROLLER") {
            self.controller = Some(v);
        }
        if let Some(v) = env_str(inc_ctrl_proto::TOKEN_ENV) {
            self.token = Some(v);
        }
        if let Some(p) = env_parse::<u16>("INCCL_MASTER_PORT")? {
            self.master_port = p;
        }
        if let Some(ms) = env_parse::<u64>("INCCL_TIMEOUT_MS")? {
            self.timeout = Duration::from_millis(ms);
        }
        if let Some(v) = env_str("INCCL_IFACE") {
            self.iface = Some(v);
        }
        if let Some(ip) = env_parse::<Ipv4Addr>("INCCL_LOCAL_IP")? {
            self.local_ip = Some(ip);
        }
        Ok(())
    }

    /// Check ranges; errors name the offending value.
    pub fn validate(&self) -> Result<()> {
        if self.world_size == 0 {
            return Err(Error::InvalidArgument("world size must be at least 1".into()));
        }
        if self.world_size == u16::MAX {
            return Err(Error::InvalidArgument(format!(
                "world size {} is too large (max {})",
                self.world_size,
                u16::MAX - 1
            )));
        }
        if self.rank >= self.world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {} is out of range for world size {} (ranks are 0..{})",
                self.rank,
                self.world_size,
                self.world_size - 1
            )));
        }
        if self.master_addr.trim().is_empty() {
            return Err(Error::InvalidArgument("master address is empty".into()));
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidArgument("bootstrap timeout must be positive".into()));
        }
        Ok(())
    }

    /// `host:port` of rank 0's bootstrap listener.
    pub fn master_endpoint(&self) -> String {
        let a = self.master_addr.trim();
        // A bare host, or an IPv6 literal without brackets, gets the default port.
        if a.parse::<std::net::IpAddr>().is_ok() || !a.contains(':') {
            if a.contains(':') {
                format!("[{a}]:{}", self.master_port)
            } else {
                format!("{a}:{}", self.master_port)
            }
        } else {
            a.to_string()
        }
    }
}

/// Parameters of [`crate::Group::communicator`].
#[derive(Debug, Clone)]
pub struct CommConfig {
    /// Expected largest message in bytes: sizes staging buffers, never limits calls.
    pub size_hint: u64,
    /// Transport.
    pub transport: TransportKind,
    /// Payload bytes per packet requested from the controller.
    pub mtu: Option<u16>,
    /// Window requested from the controller.
    pub window: Option<u32>,
    /// A collective with no progress for this long fails.
    pub op_timeout: Duration,
    /// Userspace transport: batch frames into UDP GSO sends where that is safe
    /// (`INCCL_UDP_GSO`, see the module table).
    pub udp_gso: bool,
    /// Userspace transport: how long a caller waiting inside a collective polls its
    /// socket, yielding the CPU between polls, before it sleeps (`INCCL_BUSY_POLL_US`).
    /// A sleeping rank costs the sender (the switch) a wake-up per datagram; where
    /// ranks and switch share cores that is most of a small collective's time.
    pub busy_poll: Duration,
    /// Userspace transport: where the switch's link emulation limits the rate of what
    /// this host sends it, send no faster, a few frames ahead of the link, as a NIC does
    /// (`INCCL_NIC_PACING`: `auto`; `off` hands the link every frame at once).
    pub nic_pacing: bool,
}

impl CommConfig {
    /// Defaults: userspace transport, controller-chosen MTU and window.
    pub fn new(size_hint: u64) -> Self {
        CommConfig {
            size_hint,
            transport: TransportKind::Udp,
            mtu: None,
            window: None,
            op_timeout: DEFAULT_OP_TIMEOUT,
            udp_gso: true,
            busy_poll: DEFAULT_BUSY_POLL,
            nic_pacing: true,
        }
    }

    /// Defaults with the `INCCL_*` environment variables applied.
    pub fn from_env(size_hint: u64) -> Result<Self> {
        let mut c = Self::new(size_hint);
        c.apply_env()?;
        Ok(c)
    }

    /// Apply the `INCCL_*` environment variables over the current values.
    pub fn apply_env(&mut self) -> Result<()> {
        if let Some(t) = transport_override()? {
            self.transport = t;
        }
        if let Some(m) = env_parse::<u16>("INCCL_MTU")? {
            self.mtu = Some(m);
        }
        if let Some(w) = env_parse::<u32>("INCCL_WINDOW")? {
            self.window = Some(w);
        }
        if let Some(ms) = env_parse::<u64>("INCCL_OP_TIMEOUT_MS")? {
            self.op_timeout = Duration::from_millis(ms);
        }
        if let Some(us) = env_parse::<u64>("INCCL_BUSY_POLL_US")? {
            self.busy_poll = Duration::from_micros(us);
        }
        if let Some(on) = env_auto_or_off("INCCL_UDP_GSO")? {
            self.udp_gso = on;
        }
        if let Some(on) = env_auto_or_off("INCCL_NIC_PACING")? {
            self.nic_pacing = on;
        }
        Ok(())
    }
}

/// `INCCL_TRANSPORT`, which overrides the transport chosen in code.
pub(crate) fn transport_override() -> Result<Option<TransportKind>> {
    env_parse::<TransportKind>("INCCL_TRANSPORT")
}

fn env_str(name: &str) -> Option<String> {
    env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// An `auto` (true) or `off` (false) setting; `None` if unset.
fn env_auto_or_off(name: &str) -> Result<Option<bool>> {
    match env_str(name).as_deref() {
        None => Ok(None),
        Some("auto") => Ok(Some(true)),
        Some("off") => Ok(Some(false)),
        Some(v) => {
            Err(Error::Config(format!("environment variable {name}=`{v}`: want auto or off")))
        }
    }
}

fn env_parse<T: FromStr>(name: &str) -> Result<Option<T>>
where
    T::Err: std::fmt::Display,
{
    match env_str(name) {
        None => Ok(None),
        Some(v) => v
            .parse::<T>()
            .map(Some)
            .map_err(|e| Error::Config(format!("environment variable {name}=`{v}`: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_endpoint_adds_default_port() {
        let c = GroupConfig::new(2, 0, "10.0.0.1");
        assert_eq!(c.master_endpoint(), "10.0.0.1:52223");
        let c = GroupConfig::new(2, 0, "10.0.0.1:6000");
        assert_eq!(c.master_endpoint(), "10.0.0.1:6000");
        let c = GroupConfig::new(2, 0, "localhost");
        assert_eq!(c.master_endpoint(), "localhost:52223");
        let c = GroupConfig::new(2, 0, "::1");
        assert_eq!(c.master_endpoint(), "[::1]:52223");
    }

    #[test]
    fn validate_names_the_bad_rank() {
        let err = GroupConfig::new(4, 4, "h").validate().unwrap_err().to_string();
        assert!(err.contains("rank 4") && err.contains("world size 4"), "{err}");
        assert!(GroupConfig::new(0, 0, "h").validate().is_err());
        assert!(GroupConfig::new(4, 3, "").validate().is_err());
        GroupConfig::new(4, 3, "h").validate().unwrap();
    }

    #[test]
    fn transport_names_parse() {
        assert_eq!("UDP".parse::<TransportKind>(), Ok(TransportKind::Udp));
        assert_eq!("ibverbs".parse::<TransportKind>(), Ok(TransportKind::Verbs));
        assert!("tcp".parse::<TransportKind>().unwrap_err().contains("tcp"));
    }
}
