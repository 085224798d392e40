//! The YAML schema as written (see `topologies/README.md`), with spans kept for errors.

use marked_yaml::Spanned;
use serde::Deserialize;

pub(crate) type S<T> = Spanned<T>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTopology {
    pub(crate) name: S<String>,
    pub(crate) controller: RawController,
    #[serde(default)]
    pub(crate) defaults: Option<RawDefaults>,
    #[serde(default)]
    pub(crate) root: Option<S<String>>,
    pub(crate) switches: Vec<RawSwitch>,
    #[serde(default)]
    pub(crate) links: Vec<RawLink>,
    #[serde(default)]
    pub(crate) hosts: Vec<RawHost>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawController {
    pub(crate) address: S<String>,
    #[serde(default)]
    pub(crate) mgmt_prefix: Option<S<u8>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDefaults {
    #[serde(default)]
    pub(crate) mtu: Option<S<u16>>,
    #[serde(default)]
    pub(crate) window: Option<S<u32>>,
    #[serde(default)]
    pub(crate) link_mtu: Option<S<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSwitch {
    pub(crate) id: S<u32>,
    pub(crate) name: S<String>,
    #[serde(default)]
    pub(crate) mgmt: Option<S<String>>,
    #[serde(default)]
    pub(crate) max_slots: Option<S<u32>>,
    #[serde(default)]
    pub(crate) max_window: Option<S<u32>>,
    #[serde(default)]
    pub(crate) max_mtu: Option<S<u16>>,
    #[serde(default)]
    pub(crate) max_slot_memory: Option<S<u64>>,
    #[serde(default)]
    pub(crate) max_host_memory: Option<S<u64>>,
    pub(crate) ports: Vec<RawPort>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPort {
    pub(crate) name: S<String>,
    pub(crate) ip: S<String>,
    #[serde(default)]
    pub(crate) mac: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLink {
    pub(crate) a: S<String>,
    pub(crate) b: S<String>,
    /// Link emulation of both directions (`loss=1%,delay=2ms`).
    #[serde(default)]
    pub(crate) emulate: Option<S<String>>,
    /// Refines `emulate` for frames from `a` to `b`.
    #[serde(default)]
    pub(crate) a_to_b: Option<S<String>>,
    /// Refines `emulate` for frames from `b` to `a`.
    #[serde(default)]
    pub(crate) b_to_a: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHost {
    pub(crate) name: S<String>,
    pub(crate) ip: S<String>,
    #[serde(default)]
    pub(crate) mac: Option<S<String>>,
    pub(crate) attach: S<String>,
    #[serde(default)]
    pub(crate) mgmt: Option<S<String>>,
    /// Link emulation of both directions of the host's link.
    #[serde(default)]
    pub(crate) emulate: Option<S<String>>,
    /// Refines `emulate` for frames the switch sends to the host.
    #[serde(default)]
    pub(crate) to_host: Option<S<String>>,
    /// Refines `emulate` for frames the host sends to the switch.
    #[serde(default)]
    pub(crate) from_host: Option<S<String>>,
}
