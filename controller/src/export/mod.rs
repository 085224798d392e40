//! Container deployments generated from a topology: a Docker Compose file
//! ([`compose`]), a Docker Swarm stack file ([`swarm`]) and a containerlab topology
//! ([`containerlab`]).
//!
//! Both describe the same containers, built from the images in `docker/`: the
//! controller, one container per switch and one per host. Every container starts with
//! `inc-entrypoint` (docker/entrypoint.sh), which gives its interfaces the names, MACs
//! and addresses of the topology, read from `INC_IFACES` (see [`iface_entry`]), and then
//! runs the element's program. The addresses are the topology's, exactly as
//! `inc-controller plan` gives them to network namespaces: switch ports get no kernel
//! address (the switch process answers ARP itself), hosts get their data-plane address
//! on `eth0`, every element gets its management address.
//!
//! Only the public topology model is used here ([`Topology`] and its parts), so the
//! module moves with it.

pub mod compose;
pub mod containerlab;
pub mod swarm;

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use crate::topology::{Topology, CONTROLLER_NAME};

/// Where the topology file appears inside the controller and switch containers.
pub const TOPOLOGY_IN_CONTAINER: &str = "/etc/inc/topology.yaml";
/// TCP address every switch container serves its counters on (inside its own
/// network namespace; read with `docker exec SWITCH inc-switch stats 127.0.0.1:7100`).
pub const SWITCH_STATS_ADDR: &str = "127.0.0.1:7100";
/// Name of the management interface in compose containers.
pub const MGMT_IF: &str = "mgmt0";
/// Directory where a container finds its credential: the controller its token file,
/// a switch the switch credential, a host the host credential (file names:
/// [`Secret::name`]). Compose mounts them as secrets, containerlab as read-only binds.
pub const SECRETS_IN_CONTAINER: &str = "/run/secrets";
/// Default image repository prefix: images are `PREFIX/controller`, `PREFIX/switch`,
/// `PREFIX/host` (built by `docker/build-images`).
pub const DEFAULT_IMAGE_PREFIX: &str = "inc-emu";

/// How host containers reach the switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostTransport {
    /// INCCL's userspace RoCEv2 over UDP sockets: runs in any container.
    #[default]
    Udp,
    /// ibverbs on a Soft-RoCE device the entrypoint creates on the data interface
    /// (`rdma link add rxe0 type rxe netdev eth0`); needs `rdma_rxe` in the Docker
    /// host's kernel and the uverbs devices in the container.
    Verbs,
}

impl std::str::FromStr for HostTransport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "udp" | "userspace" => Ok(HostTransport::Udp),
            "verbs" | "rxe" => Ok(HostTransport::Verbs),
            _ => Err(format!("unknown host transport `{s}` (udp or verbs)")),
        }
    }
}

/// What the exported files refer to outside the topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportOptions {
    /// Image reference of the controller, switch and host images.
    pub images: Images,
    /// Path of the topology file on the machine that runs the containers; it is
    /// bind-mounted read-only at [`TOPOLOGY_IN_CONTAINER`].
    pub topology_path: String,
    /// Switch packet I/O backend (`inc-switch run --backend`).
    pub backend: String,
    /// Host transport.
    pub transport: HostTransport,
    /// Directory on the machine that runs the containers holding the deployment's
    /// credentials ([`crate::auth::write_deployment_files`]).
    pub secrets_dir: String,
}

/// The one credential file a container gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Secret {
    /// Name of the secret, and of the file in [`SECRETS_IN_CONTAINER`].
    pub name: &'static str,
    /// File in [`ExportOptions::secrets_dir`].
    pub file: &'static str,
}

impl Secret {
    /// Path inside the container.
    pub fn in_container(&self) -> String {
        format!("{SECRETS_IN_CONTAINER}/{}", self.name)
    }

    /// Path on the machine that runs the containers.
    pub fn on_host(&self, opts: &ExportOptions) -> String {
        format!("{}/{}", opts.secrets_dir.trim_end_matches('/'), self.file)
    }
}

/// The credential of a role: the controller's token file (both credentials), the
/// switch credential alone, the host credential alone.
pub fn secret(r: Role) -> Secret {
    use crate::auth::DEPLOYMENT_FILES as F;
    match r {
        Role::Controller => Secret { name: "inc-controller-token", file: F.controller },
        Role::Switch(_) => Secret { name: "inc-switch-token", file: F.switch },
        Role::Host(_) => Secret { name: "inc-host-token", file: F.host },
    }
}

/// Every secret of a deployment, once, in role order.
pub fn secrets() -> [Secret; 3] {
    [secret(Role::Controller), secret(Role::Switch(0)), secret(Role::Host(0))]
}

/// Image references by role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// Controller image.
    pub controller: String,
    /// Switch image.
    pub switch: String,
    /// Host image.
    pub host: String,
}

impl Images {
    /// `PREFIX/ROLE:TAG` for every role.
    pub fn tagged(prefix: &str, tag: &str) -> Self {
        Images {
            controller: format!("{prefix}/controller:{tag}"),
            switch: format!("{prefix}/switch:{tag}"),
            host: format!("{prefix}/host:{tag}"),
        }
    }
}

/// An export that cannot be produced; names what is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// The carrier pool is too small for this topology.
    #[error(
        "carrier pool {pool} has {have} addresses, topology `{topology}` needs {need} \
         (management /{mgmt_prefix} plus {links} links of {link_block}): give a larger --carrier"
    )]
    CarrierTooSmall {
        /// The pool.
        pool: String,
        /// Its size.
        have: u64,
        /// Addresses needed.
        need: u64,
        /// Topology name.
        topology: String,
        /// Prefix length of the management carrier subnet.
        mgmt_prefix: u8,
        /// Data links (switch-switch and host-switch).
        links: usize,
        /// Addresses per link subnet.
        link_block: u32,
    },
    /// The carrier pool is not a network address (host bits set).
    #[error("carrier pool {0} is not a network address (host bits are set)")]
    CarrierNotNetwork(String),
    /// A switch backend this export does not know the container needs of.
    #[error("unknown switch backend `{0}` (af_packet, pcap, af_xdp or dpdk)")]
    UnknownBackend(String),
    /// A placement (`--place NAME=NODE`, or a line of a placement file) that cannot be
    /// used.
    #[error("{origin}: placement `{spec}`: {reason}")]
    BadPlacement {
        /// Where it came from: `--place` or `FILE:LINE`.
        origin: String,
        /// The placement as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Something the target cannot express.
    #[error("export {target}: {what} is not supported")]
    Unsupported {
        /// The export target.
        target: &'static str,
        /// What it cannot do.
        what: String,
    },
}

/// Linux capabilities a switch container needs for `backend`, beyond Docker's default.
/// NET_ADMIN also lets the entrypoint rename and re-address the ports.
pub fn switch_capabilities(backend: &str) -> Result<&'static [&'static str], ExportError> {
    match backend {
        // Raw sockets (and promiscuous mode through packet membership).
        "af_packet" | "pcap" => Ok(&["NET_ADMIN", "NET_RAW"]),
        // Loading the XDP program and locking UMEM pages.
        "af_xdp" => Ok(&["NET_ADMIN", "NET_RAW", "SYS_ADMIN", "BPF", "IPC_LOCK"]),
        // DPDK's af_packet/af_xdp vdevs on the container's veths; hugepages locked.
        "dpdk" => Ok(&["NET_ADMIN", "NET_RAW", "SYS_ADMIN", "IPC_LOCK"]),
        other => Err(ExportError::UnknownBackend(other.to_string())),
    }
}

/// One interface a container's entrypoint configures: `LOCATOR=NAME,MAC,ADDR`.
///
/// `locator` is how the entrypoint finds the interface: the IPv4 address Docker gave
/// it (compose) or its name (containerlab creates interfaces with their final names).
/// `mac` is `-` to keep Docker's MAC; `addr` is `-` to configure no address, or
/// [`KEEP_DOCKER_ADDR`] to keep the address Docker gave the interface.
pub fn iface_entry(locator: &str, name: &str, mac: Option<String>, addr: Option<String>) -> String {
    format!(
        "{locator}={name},{},{}",
        mac.unwrap_or_else(|| "-".into()),
        addr.unwrap_or_else(|| "-".into())
    )
}

/// `ADDR` of an [`iface_entry`] that keeps the interface's Docker address.
pub const KEEP_DOCKER_ADDR: &str = "docker";

/// How containers find each other on the management network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MgmtNaming {
    /// By the topology's management addresses, which the entrypoints configure (compose,
    /// containerlab: fixed addresses on one bridge).
    TopologyAddresses,
    /// By service name through Docker's DNS, on the addresses Docker gave (Swarm: its
    /// overlays carry ARP between nodes only for Docker's own addresses).
    ServiceNames,
}

impl MgmtNaming {
    /// Where switches and rank 0 reach the controller (`host:port`).
    pub fn controller(self, t: &Topology) -> String {
        match self {
            MgmtNaming::TopologyAddresses => t.controller.to_string(),
            MgmtNaming::ServiceNames => format!("{CONTROLLER_NAME}:{}", t.controller.port()),
        }
    }

    /// What the controller listens on.
    pub fn listen(self, t: &Topology) -> String {
        match self {
            MgmtNaming::TopologyAddresses => t.controller.to_string(),
            // Its only interface is the internal management network.
            MgmtNaming::ServiceNames => format!("0.0.0.0:{}", t.controller.port()),
        }
    }

    /// Where the other ranks reach rank 0 (the host programs add the default port).
    pub fn master(self, t: &Topology) -> String {
        match self {
            MgmtNaming::TopologyAddresses => t.hosts[0].mgmt.to_string(),
            MgmtNaming::ServiceNames => t.hosts[0].name.clone(),
        }
    }

    /// The management address an entrypoint gives `role`'s `mgmt0`.
    pub fn mgmt_addr(self, t: &Topology, role: Role) -> String {
        match self {
            MgmtNaming::TopologyAddresses => format!("{}/{}", mgmt_ip(t, role), t.mgmt_prefix),
            MgmtNaming::ServiceNames => KEEP_DOCKER_ADDR.to_string(),
        }
    }
}

/// Role of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The controller.
    Controller,
    /// A switch (index into [`Topology::switches`]).
    Switch(usize),
    /// A host (index into [`Topology::hosts`], also its rank).
    Host(usize),
}

/// Every container of a topology, in a stable order: controller, switches, hosts.
pub fn roles(t: &Topology) -> Vec<Role> {
    std::iter::once(Role::Controller)
        .chain((0..t.switches.len()).map(Role::Switch))
        .chain((0..t.hosts.len()).map(Role::Host))
        .collect()
}

/// The image a role's container runs, and what the role is (a comment in the file).
pub(crate) fn role_image<'a>(t: &Topology, r: Role, opts: &'a ExportOptions) -> (&'a str, String) {
    match r {
        Role::Controller => (&opts.images.controller, "controller".to_string()),
        Role::Switch(i) => (&opts.images.switch, format!("switch id {}", t.switches[i].id)),
        Role::Host(i) => (&opts.images.host, format!("host, rank {i}")),
    }
}

/// Container (service / node) name of a role: the element's topology name.
pub fn role_name(t: &Topology, r: Role) -> &str {
    match r {
        Role::Controller => CONTROLLER_NAME,
        Role::Switch(i) => &t.switches[i].name,
        Role::Host(i) => &t.hosts[i].name,
    }
}

/// Management address of a role.
pub fn mgmt_ip(t: &Topology, r: Role) -> Ipv4Addr {
    match r {
        Role::Controller => *t.controller.ip(),
        Role::Switch(i) => t.switches[i].mgmt,
        Role::Host(i) => t.hosts[i].mgmt,
    }
}

/// A data link as containers see it: two ends, each a container and an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataLink {
    /// Name for the link (network name): `SWITCH-PORT` of its first switch end.
    pub name: String,
    /// Human description, e.g. `root:d1 <-> leaf1:up`.
    pub describe: String,
    /// Both ends.
    pub ends: [LinkEnd; 2],
}

/// One end of a data link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkEnd {
    /// Container.
    pub role: Role,
    /// Interface name inside the container (switch port name, or the host's data interface).
    pub ifname: String,
    /// MAC from the topology.
    pub mac: String,
    /// Kernel address (`ip/prefix`), none for switch ports.
    pub addr: Option<String>,
}

/// Every data link: switch-switch links in file order, then one per host.
/// `host_if` is the name of a host's data interface in the target.
pub fn data_links(t: &Topology, host_if: &str) -> Vec<DataLink> {
    let port_end = |sw: usize, port: usize| {
        let p = &t.switches[sw].ports[port];
        LinkEnd {
            role: Role::Switch(sw),
            ifname: p.name.clone(),
            mac: p.mac.to_string(),
            addr: None,
        }
    };
    let mut out = Vec::new();
    for l in &t.links {
        let (sa, sb) = (&t.switches[l.a.switch], &t.switches[l.b.switch]);
        let (pa, pb) = (&sa.ports[l.a.port], &sb.ports[l.b.port]);
        out.push(DataLink {
            name: format!("{}-{}", sa.name, pa.name),
            describe: format!("{}:{} <-> {}:{}", sa.name, pa.name, sb.name, pb.name),
            ends: [port_end(l.a.switch, l.a.port), port_end(l.b.switch, l.b.port)],
        });
    }
    for (i, h) in t.hosts.iter().enumerate() {
        let s = &t.switches[h.attach.switch];
        let p = &s.ports[h.attach.port];
        out.push(DataLink {
            name: format!("{}-{}", s.name, p.name),
            describe: format!("{}:{} <-> {}:{host_if}", s.name, p.name, h.name),
            ends: [
                port_end(h.attach.switch, h.attach.port),
                LinkEnd {
                    role: Role::Host(i),
                    ifname: host_if.to_string(),
                    mac: h.if_mac.to_string(),
                    addr: Some(h.addr.to_string()),
                },
            ],
        });
    }
    out
}

/// The ends of data links that are `role`'s interfaces, in link order, with the
/// index of their link and which end of it they are.
pub fn ends_of(links: &[DataLink], role: Role) -> impl Iterator<Item = (usize, usize, &LinkEnd)> {
    links.iter().enumerate().flat_map(move |(k, l)| {
        l.ends.iter().enumerate().filter(move |(_, e)| e.role == role).map(move |(i, e)| (k, i, e))
    })
}

/// Command line of a controller or switch container (hosts run `inc-collective`).
pub fn command(t: &Topology, r: Role, opts: &ExportOptions, naming: MgmtNaming) -> Vec<String> {
    let ctrl = naming.controller(t);
    let listen = naming.listen(t);
    let token_file;
    let v: Vec<&str> = match r {
        Role::Controller => {
            // Switches and hosts read their credential from their secret file
            // (inc-entrypoint, inc-collective), never from the container's environment.
            token_file = secret(r).in_container();
            vec![
                "inc-controller",
                "serve",
                "--topology",
                TOPOLOGY_IN_CONTAINER,
                "--listen",
                &listen,
                "--token-file",
                &token_file,
            ]
        }
        Role::Switch(i) => vec![
            "inc-switch",
            "run",
            "--backend",
            &opts.backend,
            "--topology",
            TOPOLOGY_IN_CONTAINER,
            "--switch",
            &t.switches[i].name,
            "--controller",
            &ctrl,
            "--stats-listen",
            SWITCH_STATS_ADDR,
        ],
        Role::Host(_) => vec!["inc-collective"],
    };
    v.into_iter().map(str::to_string).collect()
}

/// Environment of a host container that the topology fixes: rank, world, rank 0's
/// bootstrap address, controller, data interface (`host_if`).
pub fn host_env(
    t: &Topology,
    rank: usize,
    host_if: &str,
    transport: HostTransport,
    naming: MgmtNaming,
) -> Vec<String> {
    let mut env = vec![
        format!("INC_RANK={rank}"),
        format!("INC_WORLD={}", t.hosts.len()),
        format!("INC_MASTER={}", naming.master(t)),
        format!("INCCL_CONTROLLER={}", naming.controller(t)),
        format!("INCCL_IFACE={host_if}"),
    ];
    if transport == HostTransport::Verbs {
        env.push("INCCL_TRANSPORT=verbs".into());
    }
    env
}

/// Header comment shared by the generated files.
pub(crate) fn header(o: &mut String, t: &Topology, what: &str, how: &str) {
    let _ = writeln!(o, "# {what} for topology `{}`, generated by", t.name);
    let _ = writeln!(o, "#   {how}");
    let _ = writeln!(o, "# Do not edit: change the topology and export again (docker/README.md).");
    let _ = writeln!(
        o,
        "# {} switches, {} switch links, {} hosts (rank = position in the topology's host list).",
        t.switches.len(),
        t.links.len(),
        t.hosts.len()
    );
}

/// A YAML double-quoted scalar (JSON string escaping is valid YAML).
pub(crate) fn q(s: &str) -> String {
    serde_json::to_string(s).expect("strings always serialise")
}

/// A YAML flow sequence of double-quoted strings.
pub(crate) fn flow_list<S: AsRef<str>>(items: &[S]) -> String {
    let inner: Vec<String> = items.iter().map(|s| q(s.as_ref())).collect();
    format!("[{}]", inner.join(", "))
}

#[cfg(test)]
pub(crate) mod testutil {
    use crate::topology::Topology;

    use super::{ExportOptions, HostTransport, Images};

    /// The options the golden files are made with.
    pub fn opts() -> ExportOptions {
        ExportOptions {
            images: Images::tagged("inc-emu", "latest"),
            topology_path: "/srv/inc/1-2-4.yaml".into(),
            backend: "af_packet".into(),
            transport: HostTransport::Udp,
            secrets_dir: "/srv/inc/secrets".into(),
        }
    }

    /// A topology from `topologies/`.
    pub fn topology(name: &str) -> Topology {
        let path = format!("{}/../topologies/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
        Topology::load(path).expect("bundled topology loads")
    }

    /// Compare `actual` with the golden file `testdata/NAME`; with `INC_UPDATE_GOLDEN=1`
    /// rewrite the file instead.
    pub fn golden(name: &str, actual: &str) {
        let path = format!("{}/src/export/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
        if std::env::var_os("INC_UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, actual).expect("write golden file");
            return;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e} (run with INC_UPDATE_GOLDEN=1 to create)"));
        if want != actual {
            let line = want
                .lines()
                .zip(actual.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(want.lines().count().min(actual.lines().count()));
            panic!(
                "{path} differs from the export at line {}:\n  golden: {:?}\n  actual: {:?}\n\
                 (INC_UPDATE_GOLDEN=1 rewrites it after a deliberate change)",
                line + 1,
                want.lines().nth(line),
                actual.lines().nth(line)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_of_1_2_4() {
        let t = testutil::topology("1-2-4");
        let links = data_links(&t, "eth0");
        assert_eq!(links.len(), 6);
        assert_eq!(links[0].describe, "root:d1 <-> leaf1:up");
        assert_eq!(links[0].name, "root-d1");
        assert_eq!(links[2].describe, "leaf1:h0 <-> h0:eth0");
        assert_eq!(links[2].ends[1].addr.as_deref(), Some("10.1.1.21/24"));
        assert_eq!(links[2].ends[1].mac, "02:00:0a:01:01:15");
        assert_eq!(links[2].ends[0].addr, None);
        // leaf1: its uplink (second end of root-d1), then its two host links (first ends).
        let leaf1: Vec<(usize, usize, &str)> =
            ends_of(&links, Role::Switch(1)).map(|(k, i, e)| (k, i, e.ifname.as_str())).collect();
        assert_eq!(leaf1, [(0, 1, "up"), (2, 0, "h0"), (3, 0, "h1")]);
        // Every link name is unique: it names a Docker network.
        let mut names: Vec<&str> = links.iter().map(|l| l.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), links.len());
    }

    #[test]
    fn capabilities_per_backend() {
        assert_eq!(switch_capabilities("af_packet").unwrap(), &["NET_ADMIN", "NET_RAW"]);
        assert!(switch_capabilities("af_xdp").unwrap().contains(&"BPF"));
        let e = switch_capabilities("netmap").unwrap_err();
        assert!(e.to_string().contains("netmap"), "{e}");
    }

    #[test]
    fn host_env_names_rank_master_and_interface() {
        let t = testutil::topology("1-2-4");
        let env = host_env(&t, 2, "eth0", HostTransport::Udp, MgmtNaming::TopologyAddresses);
        assert!(env.contains(&"INC_RANK=2".to_string()));
        assert!(env.contains(&"INC_WORLD=4".to_string()));
        assert!(env.contains(&"INC_MASTER=10.0.0.5".to_string()), "{env:?}");
        assert!(env.contains(&"INCCL_CONTROLLER=10.0.0.1:7000".to_string()));
        assert!(!env.iter().any(|e| e.starts_with("INCCL_TRANSPORT")));
        let env = host_env(&t, 0, "eth1", HostTransport::Verbs, MgmtNaming::TopologyAddresses);
        assert!(env.contains(&"INCCL_TRANSPORT=verbs".to_string()));
        assert!(env.contains(&"INCCL_IFACE=eth1".to_string()));
        let env = host_env(&t, 3, "eth0", HostTransport::Udp, MgmtNaming::ServiceNames);
        assert!(env.contains(&"INC_MASTER=h0".to_string()), "{env:?}");
        assert!(env.contains(&"INCCL_CONTROLLER=ctrl:7000".to_string()), "{env:?}");
    }
}

/// Checks that a carrier pool is a network that holds a management subnet of
/// `mgmt_size` addresses followed by one block of `link_block` addresses per data
/// link; returns the management subnet's prefix length.
pub(crate) fn check_carrier(
    t: &Topology,
    pool: (Ipv4Addr, u8),
    links: usize,
    mgmt_size: u64,
    link_block: u32,
) -> Result<u8, ExportError> {
    let (base, prefix) = pool;
    let pool_str = format!("{base}/{prefix}");
    let size: u64 = 1u64 << (32 - u32::from(prefix.min(32)));
    if u64::from(u32::from(base)) % size != 0 {
        return Err(ExportError::CarrierNotNetwork(pool_str));
    }
    let mgmt_prefix = 32 - mgmt_size.trailing_zeros() as u8;
    let need = mgmt_size + u64::from(link_block) * links as u64;
    if need > size {
        return Err(ExportError::CarrierTooSmall {
            pool: pool_str,
            have: size,
            need,
            topology: t.name.clone(),
            mgmt_prefix,
            links,
            link_block,
        });
    }
    Ok(mgmt_prefix)
}
