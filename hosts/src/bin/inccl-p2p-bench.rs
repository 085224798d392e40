//! Point-to-point throughput of the userspace RoCEv2 transport's data path.
//!
//! `inccl-p2p-bench recv --bind IP:PORT --peer IP [--seconds S]`
//! `inccl-p2p-bench send --bind IP --to IP:PORT [--mtu 1024] [--seconds S]`
//!
//! The sender builds RC SEND_ONLY frames with a fresh PSN and ICRC each (what the host
//! engine does per packet) and sends their UDP payloads with `sendmmsg`; the receiver
//! takes them with `recvmmsg`, rebuilds the Ethernet/IPv4/UDP headers and verifies the
//! ICRC of every frame. Both print packets/s and Gbps (RoCE payload and UDP payload);
//! the receiver also counts frames with a bad ICRC. `hosts/scripts/bench-veth.sh` runs
//! the pair across a veth pair between two network namespaces.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use inc_wire::{BthRepr, EthAddrs, EthernetAddress, Opcode, Psn, RoceRepr};
use inccl::bench::{IdentRule, RoceSocket};

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Receive and verify.
    Recv {
        /// Address to receive on.
        #[arg(long)]
        bind: SocketAddrV4,
        /// Only datagrams from this address count.
        #[arg(long)]
        peer: Ipv4Addr,
        /// Stop this long after the first packet.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// Send as fast as possible.
    Send {
        /// Local address.
        #[arg(long)]
        bind: Ipv4Addr,
        /// Receiver.
        #[arg(long)]
        to: SocketAddrV4,
        /// RoCE payload bytes per packet.
        #[arg(long, default_value_t = 1024)]
        mtu: usize,
        /// How long to send.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
}

fn rate(label: &str, packets: u64, payload: u64, udp: u64, t: Duration) {
    let s = t.as_secs_f64().max(1e-9);
    println!(
        "{label}: {packets} packets in {s:.3} s = {:.0} packets/s, {:.3} Gbps RoCE payload, {:.3} Gbps UDP payload",
        packets as f64 / s,
        payload as f64 * 8.0 / s / 1e9,
        udp as f64 * 8.0 / s / 1e9
    );
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Recv { bind, peer, seconds } => {
            let mut io =
                RoceSocket::bind(*bind.ip(), bind.port(), EthernetAddress::from_ipv4(*bind.ip()))
                    .with_context(|| format!("binding {bind}"))?;
            let (mut good, mut bad, mut payload) = (0u64, 0u64, 0u64);
            let mut start: Option<Instant> = None;
            let idle_limit = Duration::from_secs(10);
            let mut last = Instant::now();
            loop {
                if let Some(s) = start {
                    if s.elapsed().as_secs_f64() >= seconds {
                        break;
                    }
                }
                if last.elapsed() > idle_limit {
                    break;
                }
                if !io.wait_readable(Duration::from_millis(100))? {
                    continue;
                }
                last = Instant::now();
                start.get_or_insert_with(Instant::now);
                io.recv_frames(
                    peer,
                    EthernetAddress::from_ipv4(peer),
                    IdentRule::Kernel,
                    |frame| match RoceRepr::parse(frame) {
                        Ok(f) if f.icrc_ok => {
                            good += 1;
                            payload += f.payload.len() as u64;
                        }
                        _ => bad += 1,
                    },
                )?;
            }
            let Some(start) = start else {
                bail!("nothing received from {peer} within {idle_limit:?}")
            };
            let st = io.stats();
            rate(
                "recv",
                good,
                payload,
                st.rx_bytes,
                start.elapsed().min(Duration::from_secs_f64(seconds)),
            );
            println!("recv: {bad} frames with a bad ICRC, {} dropped datagrams", st.rx_dropped);
            if bad > 0 {
                bail!("{bad} frames failed ICRC verification");
            }
        }
        Cmd::Send { bind, to, mtu, seconds } => {
            if !(1..=4096).contains(&mtu) {
                bail!("--mtu {mtu} must be 1..=4096");
            }
            let mut io = RoceSocket::bind(bind, 0, EthernetAddress::from_ipv4(bind))
                .with_context(|| format!("binding {bind}"))?;
            let local = io.local_addr();
            let eth = EthAddrs {
                src: EthernetAddress::from_ipv4(bind),
                dst: EthernetAddress::from_ipv4(*to.ip()),
            };
            let mut repr = RoceRepr::new(
                eth,
                bind,
                *to.ip(),
                local.port(),
                BthRepr::new(Opcode::RcSendOnly, 0x12, Psn::new(0)),
            );
            repr.udp_dst_port = to.port();
            repr.payload_len = mtu;
            let mut psn = Psn::new(0);
            let (mut packets, mut payload) = (0u64, 0u64);
            let start = Instant::now();
            while start.elapsed().as_secs_f64() < seconds {
                let mut left = 256;
                let n = io.send_frames(to, |buf| {
                    if left == 0 {
                        return None;
                    }
                    left -= 1;
                    repr.bth.psn = psn;
                    psn += 1;
                    repr.emit(buf, |p| p.fill(0x5a)).ok()
                })?;
                packets += n as u64;
                payload += (n * mtu) as u64;
            }
            rate("send", packets, payload, io.stats().tx_bytes, start.elapsed());
        }
    }
    Ok(())
}
