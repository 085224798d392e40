//! `inc-controller`: check topologies, print rules and netns plans, run the service.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use inc_controller::{compile, demo_ranks, Allocator, CommunicatorSpec, Topology};

#[derive(Parser, Debug)]
#[command(name = "inc-controller", version, about = "INC emulator control plane")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Validate a topology file.
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
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Check { file } => {
            let t = Topology::load(&file).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!(
                "{}: ok: topology `{}`: {} switches, {} links, {} hosts, root `{}`",
                file.display(),
                t.name,
                t.switches.len(),
                t.links.len(),
                t.hosts.len(),
                t.switches[t.root].name
            );
        }
        Cmd::Rules { topology, hosts, mtu, window, seed, endpoints } => {
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
        }
    }
    Ok(())
}
