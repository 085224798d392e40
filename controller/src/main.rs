//! `inc-controller`: check topologies, print rules and netns plans, run the service.

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use inc_controller::{
    compile, demo_ranks, Allocator, Auth, CommunicatorSpec, Controller, Credentials, Role,
    ServiceConfig, Topology,
};
use inc_ctrl_proto::{ControllerClient, TOKEN_ENV};

#[derive(Parser, Debug)]
#[command(name = "inc-controller", version, about = "INC emulator control plane")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Validate a topology file; prints its fingerprint (what switches register with:
    /// a controller serving another topology refuses them).
    Check {
        /// Topology YAML.
        file: PathBuf,
    },
    /// Print the rules every involved switch gets for a communicator, as YAML.
    Rules {
        /// Topology YAML.
        #[arg(long)]
        topology: PathBuf,
        /// Host IPs by rank, comma-separated (default: every host in file order).
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<Ipv4Addr>,
        /// Payload bytes per packet (default: topology default).
        #[arg(long)]
        mtu: Option<u16>,
        /// Window in chunks (default: topology default).
        #[arg(long)]
        window: Option<u32>,
        /// Seed for start PSNs.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Also print host endpoints.
        #[arg(long)]
        endpoints: bool,
        /// Also print Reduce/Broadcast routes for every root rank.
        #[arg(long)]
        routes: bool,
    },
    /// Print the network-namespace plan of a topology (read by scripts/netns-up).
    Plan {
        /// Topology YAML.
        #[arg(long)]
        topology: PathBuf,
        /// Namespace prefix: namespaces are named PREFIX-ELEMENT.
        #[arg(long, default_value = inc_controller::plan::DEFAULT_PREFIX)]
        prefix: String,
    },
    /// Run the controller service.
    Serve {
        /// Topology YAML.
        #[arg(long)]
        topology: PathBuf,
        /// Listen address (default: 0.0.0.0 and the topology's controller port).
        #[arg(long)]
        listen: Option<String>,
        /// Token file with the switch and host credentials; created (mode 0600) with
        /// fresh random credentials if missing. Default: $XDG_RUNTIME_DIR or $HOME,
        /// file `inc-controller.token`.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Serve without authentication: anyone who reaches the port may register
        /// switches and create groups.
        #[arg(long, conflicts_with = "token_file")]
        insecure: bool,
        /// Seconds to wait for switch acknowledgements.
        #[arg(long, default_value_t = 5.0)]
        ack_timeout: f64,
        /// Fixed seed for start PSNs (default: random).
        #[arg(long)]
        seed: Option<u64>,
        /// Seconds one frame may take to arrive once its first byte did.
        #[arg(long, default_value_t = 10.0)]
        frame_timeout: f64,
    },
    /// Print one credential of a token file (for scripts that start switches and hosts).
    Token {
        /// Token file written by `serve`.
        #[arg(long)]
        token_file: PathBuf,
        /// Which credential.
        #[arg(long, value_parser = ["switch", "host"])]
        role: String,
    },
    /// Write a topology YAML for a regular shape (topologies/README.md, "Generated
    /// trees"); the output passes `check`.
    Gen {
        #[command(subcommand)]
        shape: GenShape,
    },
    /// Write a container deployment of a topology (docker/README.md).
    Export {
        #[command(subcommand)]
        target: ExportTarget,
    },
    /// Show connected switches, groups and communicators of a running controller.
    Status {
        /// Controller address.
        #[arg(long, default_value = "127.0.0.1:7000")]
        controller: String,
        /// Host credential.
        #[arg(long, env = TOKEN_ENV)]
        token: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum GenShape {
    /// A tree: a root switch, FANOUT children per switch level by level, hosts on the
    /// leaves (and optionally on every inner switch). Example, 256 hosts on 16 leaves:
    /// `inc-controller gen tree --fanout 4,4 --hosts-per-leaf 16 -o t.yaml`.
    Tree {
        /// Child switches per switch, level by level from the root (empty: one switch).
        #[arg(long, value_delimiter = ',', default_value = "2")]
        fanout: Vec<u32>,
        /// Hosts on every leaf switch.
        #[arg(long, default_value_t = 2)]
        hosts_per_leaf: u32,
        /// Hosts on every inner switch, the root included.
        #[arg(long, default_value_t = 0)]
        hosts_per_inner: u32,
        /// Payload bytes per packet (defaults.mtu).
        #[arg(long, default_value_t = 4096)]
        mtu: u16,
        /// Window in chunks (defaults.window).
        #[arg(long, default_value_t = 64)]
        window: u32,
        /// Link emulation per level, repeatable: `hosts:SPEC` for every host link,
        /// `L:SPEC` for the links into switch level L (1: the root's links); SPEC as
        /// `inc-switch --link-emu`, e.g. `--emulate hosts:rate=100gbit,delay=1us`.
        #[arg(long, value_name = "LEVEL:SPEC")]
        emulate: Vec<String>,
        /// `name:` of the topology (default: tree-<fanout>-<hosts per leaf>).
        #[arg(long)]
        name: Option<String>,
        /// Output file (default: standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum ExportTarget {
    /// Docker Compose file: one network per link, a management network, one container
    /// per element.
    Compose {
        #[command(flatten)]
        common: ExportArgs,
        /// Carrier pool for the Docker networks (Docker never sees the topology's own
        /// addresses); concurrent deployments need disjoint pools.
        #[arg(long, default_value = "198.18.0.0/24")]
        carrier: String,
    },
    /// containerlab topology file (nodes of kind linux, one link per topology link).
    Containerlab {
        #[command(flatten)]
        common: ExportArgs,
    },
    /// Docker Swarm stack (`docker stack deploy`): one internal overlay network per link,
    /// services placed by the node label inc-node. --output is a directory: the stack
    /// file is DIR/stack.yaml, the credentials DIR/secrets.
    Swarm {
        #[command(flatten)]
        common: ExportArgs,
        /// Carrier pool for the overlay networks' subnets.
        #[arg(long, default_value = "198.19.0.0/22")]
        carrier: String,
        /// Run element NAME (switch, host or ctrl) on the nodes labelled inc-node=NODE;
        /// repeatable. A host not placed itself runs on its edge switch's node.
        #[arg(long, value_name = "NAME=NODE")]
        place: Vec<String>,
        /// File of NAME=NODE lines (# comments), as --place.
        #[arg(long)]
        place_file: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
struct ExportArgs {
    /// Topology YAML.
    topology: PathBuf,
    /// Write here instead of standard output.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Path of the topology file where the containers run (default: its absolute path).
    #[arg(long)]
    topology_path: Option<String>,
    /// Image repository prefix: PREFIX/controller, PREFIX/switch, PREFIX/host.
    #[arg(long, default_value = inc_controller::export::DEFAULT_IMAGE_PREFIX)]
    image_prefix: String,
    /// Image tag (compose: overridden by $INC_IMAGE_TAG when the file is used).
    #[arg(long, default_value = "latest")]
    image_tag: String,
    /// Switch packet I/O backend.
    #[arg(long, default_value = "af_packet")]
    backend: String,
    /// Host transport: udp (userspace RoCEv2) or verbs (Soft-RoCE rxe0 on the data link).
    #[arg(long, default_value = "udp")]
    transport: inc_controller::export::HostTransport,
    /// Directory of the deployment's credentials, created (mode 0700) with a token file
    /// for the controller and one credential file per role (mode 0600), kept if there;
    /// each container gets only its role's file. Default: `secrets` next to --output
    /// (or in the current directory).
    #[arg(long)]
    secrets_dir: Option<PathBuf>,
}

fn export(target: ExportTarget) -> Result<()> {
    use inc_controller::export::{compose, containerlab, swarm, ExportOptions, Images};
    let (ExportTarget::Compose { common: a, .. }
    | ExportTarget::Containerlab { common: a }
    | ExportTarget::Swarm { common: a, .. }) = &target;
    let t = Topology::load(&a.topology).map_err(|e| anyhow::anyhow!("{e}"))?;
    let topology_path = match &a.topology_path {
        Some(p) => p.clone(),
        None => std::fs::canonicalize(&a.topology)
            .with_context(|| format!("resolving {}", a.topology.display()))?
            .display()
            .to_string(),
    };
    // swarm: --output is a directory holding the stack file and the secrets.
    let output = match (&target, &a.output) {
        (ExportTarget::Swarm { .. }, Some(dir)) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            Some(dir.join("stack.yaml"))
        }
        (_, out) => out.clone(),
    };
    let secrets_dir = match (&a.secrets_dir, &output) {
        (Some(d), _) => d.clone(),
        (None, Some(out)) => out.parent().unwrap_or(Path::new("")).join("secrets"),
        (None, None) => PathBuf::from("secrets"),
    };
    inc_controller::auth::write_deployment_files(&secrets_dir)?;
    let secrets_dir = std::fs::canonicalize(&secrets_dir)
        .with_context(|| format!("resolving {}", secrets_dir.display()))?
        .display()
        .to_string();
    let opts = ExportOptions {
        images: Images::tagged(&a.image_prefix, &a.image_tag),
        topology_path,
        backend: a.backend.clone(),
        transport: a.transport,
        secrets_dir,
    };
    let text = match &target {
        ExportTarget::Compose { carrier, .. } => {
            let pool = parse_cidr(carrier).with_context(|| format!("--carrier {carrier}"))?;
            compose::render(&t, &opts, pool)?
        }
        ExportTarget::Containerlab { .. } => containerlab::render(&t, &opts)?,
        ExportTarget::Swarm { carrier, place, place_file, .. } => {
            let pool = parse_cidr(carrier).with_context(|| format!("--carrier {carrier}"))?;
            let mut placement = swarm::Placement::new();
            if let Some(f) = place_file {
                let text = std::fs::read_to_string(f)
                    .with_context(|| format!("reading {}", f.display()))?;
                placement.add_file(&t, &text, &f.display().to_string())?;
            }
            for p in place {
                placement.add(&t, p, "--place")?;
            }
            swarm::render(&t, &opts, pool, &placement)?
        }
    };
    match &output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{text}"),
    }
    Ok(())
}

fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8)> {
    let (ip, prefix) = s.split_once('/').context("expected ADDRESS/PREFIX")?;
    let prefix: u8 = prefix.parse().context("prefix length")?;
    if !(8..=30).contains(&prefix) {
        bail!("prefix length {prefix} is outside 8..=30");
    }
    Ok((ip.parse().context("IPv4 address")?, prefix))
}

fn main() -> std::process::ExitCode {
    // Errors are printed plainly: topology errors already carry file:line:column.
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inc-controller: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn generate(shape: GenShape) -> Result<()> {
    use inc_controller::topology::generate::{tree_yaml, TreeSpec};
    let GenShape::Tree {
        fanout,
        hosts_per_leaf,
        hosts_per_inner,
        mtu,
        window,
        emulate,
        name,
        output,
    } = shape;
    let shape_name = || {
        let f: Vec<String> = fanout.iter().map(u32::to_string).collect();
        format!("tree-{}-{hosts_per_leaf}", f.join("x"))
    };
    let mut spec = TreeSpec {
        name: name.unwrap_or_else(shape_name),
        fanout,
        hosts_per_leaf,
        hosts_per_inner,
        mtu,
        window,
        ..TreeSpec::default()
    };
    for e in &emulate {
        let Some((level, link_spec)) = e.split_once(':') else {
            bail!("--emulate {e}: expected LEVEL:SPEC (LEVEL `hosts` or a switch level 1..)");
        };
        if level == "hosts" {
            spec.host_link_emulation = Some(link_spec.to_string());
            continue;
        }
        let l: usize = level.parse().ok().filter(|l| *l >= 1).with_context(|| {
            format!("--emulate {e}: level `{level}` is neither `hosts` nor a switch level 1..")
        })?;
        if spec.switch_link_emulation.len() < l {
            spec.switch_link_emulation.resize(l, None);
        }
        spec.switch_link_emulation[l - 1] = Some(link_spec.to_string());
    }
    let yaml = tree_yaml(&spec)?;
    // What `check` would say, before anything is written.
    let t = Topology::parse("generated", &yaml).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (switches, links, hosts) = spec.counts();
    eprintln!(
        "inc-controller gen: topology `{}`: {switches} switches, {links} links, {hosts} hosts, root `{}`",
        t.name, t.switches[t.root].name
    );
    match output {
        Some(path) => {
            std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{yaml}"),
    }
    Ok(())
}

/// Make glibc return freed buffers of 128 KiB and more to the system at once. Peers
/// make the service allocate and free frames of up to 1 MiB from one thread per
/// connection; with glibc's adaptive threshold those land in per-thread arenas that
/// keep them (64 connections sending 1 MiB frames: 147 MiB peak RSS, 59 MiB with
/// this).
fn return_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::ffi::c_int;
        // glibc's <malloc.h>; declared here rather than through the libc crate, which
        // the controller does not otherwise need.
        extern "C" {
            fn mallopt(param: c_int, value: c_int) -> c_int;
        }
        const M_MMAP_THRESHOLD: c_int = -3;
        // SAFETY: mallopt only changes allocator tuning; called before the service
        // starts its threads.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 128 << 10);
        }
    }
}

fn run() -> Result<()> {
    inc_log::init("RUST_LOG", "info");
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Check { file } => {
            let t = Topology::load(&file).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!(
                "{}: ok: topology `{}`: {} switches, {} links, {} hosts, root `{}`, fingerprint {}",
                file.display(),
                t.name,
                t.switches.len(),
                t.links.len(),
                t.hosts.len(),
                t.switches[t.root].name,
                t.fingerprint()
            );
        }
        Cmd::Rules { topology, hosts, mtu, window, seed, endpoints, routes } => {
            let t = Topology::load(&topology).map_err(|e| anyhow::anyhow!("{e}"))?;
            let ips: Vec<Ipv4Addr> =
                if hosts.is_empty() { t.hosts.iter().map(|h| h.addr.ip).collect() } else { hosts };
            if ips.is_empty() {
                bail!("no hosts");
            }
            let spec = CommunicatorSpec { comm_id: 1, ranks: demo_ranks(&ips), mtu, window };
            let c = compile(&t, &spec, &mut Allocator::new(), seed).context("compiling rules")?;
            println!(
                "# communicator {} over {} ranks; spanning-tree root switch {}",
                c.comm_id,
                ips.len(),
                c.root_switch
            );
            println!("# host QPNs/PSNs are placeholders; real ones come from the hosts");
            for r in &c.rules {
                let name = &t.switches[t.switch_by_id(r.switch_id).expect("known switch")].name;
                println!("---\n# switch {name} (id {}), fan-in {}", r.switch_id, r.fan_in());
                print!("{}", inc_controller::yaml::to_yaml(r)?);
            }
            if endpoints {
                println!("---\n# host endpoints by rank");
                print!("{}", inc_controller::yaml::to_yaml(&c.endpoints)?);
            }
            if routes {
                for r in 0..ips.len() as u16 {
                    println!("# Reduce to / Broadcast from rank {r}");
                    for line in inc_controller::compiler::describe_routes(&c, r).lines() {
                        println!("#   {line}");
                    }
                }
            }
        }
        Cmd::Plan { topology, prefix } => {
            let t = Topology::load(&topology).map_err(|e| anyhow::anyhow!("{e}"))?;
            print!("{}", inc_controller::plan::render(&t, &prefix)?);
        }
        Cmd::Serve { topology, listen, token_file, insecure, ack_timeout, seed, frame_timeout } => {
            return_large_buffers();
            let t = Topology::load(&topology).map_err(|e| anyhow::anyhow!("{e}"))?;
            let listen = listen.unwrap_or_else(|| format!("0.0.0.0:{}", t.controller.port()));
            let auth = if insecure {
                tracing::warn!("--insecure: no authentication, anyone reaching {listen} may register switches and create groups");
                Auth::Insecure
            } else {
                let path = match token_file {
                    Some(p) => p,
                    None => default_token_file()?,
                };
                let (creds, created) = Credentials::load_or_create(&path)?;
                if created {
                    tracing::info!(file = %path.display(), "created a token file with fresh credentials");
                } else {
                    tracing::info!(file = %path.display(), "using credentials from token file");
                }
                Auth::required(&creds)
            };
            let mut cfg = ServiceConfig::new(t, auth);
            cfg.ack_timeout = Duration::from_secs_f64(ack_timeout);
            cfg.frame_timeout = Duration::from_secs_f64(frame_timeout);
            if let Some(s) = seed {
                cfg.seed = s;
            }
            let ctrl = Controller::start(cfg, &listen)?;
            // Scripts and tests read the bound address (port 0 picks a free one).
            println!("listening on {}", ctrl.local_addr());
            std::io::stdout().flush()?;
            ctrl.wait();
        }
        Cmd::Gen { shape } => generate(shape)?,
        Cmd::Export { target } => export(target)?,
        Cmd::Token { token_file, role } => {
            let creds = Credentials::load(&token_file)?;
            let role = if role == "switch" { Role::Switch } else { Role::Host };
            println!("{}", creds.token(role));
        }
        Cmd::Status { controller, token, json } => {
            let timeout = Duration::from_secs(5);
            let mut c = ControllerClient::connect(controller.as_str(), timeout)?;
            if token.is_some() {
                c.hello(token, timeout)?;
            }
            let r = c.status(timeout)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
                return Ok(());
            }
            println!("topology {}", r.topology);
            println!("switches:");
            for s in &r.switches {
                let state = if s.connected {
                    format!("connected from {}", s.peer.as_deref().unwrap_or("?"))
                } else {
                    "NOT CONNECTED".into()
                };
                println!(
                    "  {:>4} {:<12} {state}; communicators {:?}",
                    s.switch_id, s.name, s.communicators
                );
            }
            println!("groups:");
            for g in &r.groups {
                println!(
                    "  {:>4} world {} hosts {:?} communicators {:?}",
                    g.group_id, g.world_size, g.hosts, g.communicators
                );
            }
            println!("communicators:");
            for c in &r.communicators {
                println!(
                    "  {:>4} group {} root switch {} switches {:?} mtu {} window {}",
                    c.comm_id, c.group_id, c.root_switch, c.switches, c.mtu, c.window
                );
            }
        }
    }
    Ok(())
}

/// `$XDG_RUNTIME_DIR/inc-controller.token`, else `$HOME/.inc-controller.token`.
fn default_token_file() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("inc-controller.token"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".inc-controller.token")),
        None => bail!(
            "no $XDG_RUNTIME_DIR or $HOME for the token file: pass --token-file or --insecure"
        ),
    }
}
