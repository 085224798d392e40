//! Structured input for fuzzing the switch engine: random bytes never pass the ICRC,
//! so they never reach the communicator state machine. This turns arbitrary bytes
//! (from proptest or libFuzzer) into a run of *valid* RoCEv2 frames (correct ICRC,
//! QPNs of installed connections, PSNs near the expected ones, plausible INC
//! immediates), mixed with hostile ones (unknown QPN, spoofed source, wrong port),
//! timer expiries and time steps, and checks the engine's invariants after each step.
//! Used by `tests/tests/engine_structured.rs` and `fuzz/fuzz_targets/engine_structured.rs`
//! (which includes this file by path), so both explore the same input space.

use std::net::Ipv4Addr;
use std::time::Duration;

use inc_ctrl_proto::{ConnectionRule, Peer, SwitchRules};
use inc_protocol::Time;
use inc_switch_engine::{PortConfig, SwitchEngine, SwitchEngineConfig};
use inc_wire::{AethRepr, AethSyndrome, BthRepr, EthAddrs, EthernetAddress, Opcode, Psn, RoceRepr};

const MTU: u16 = 256;
const WINDOW: u32 = 4;
const PORTS: usize = 3;

/// Reads the fuzz input; zeros once it runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) << 8 | u16::from(self.u8())
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) << 16 | u32::from(self.u16())
    }
}

fn port_ip(p: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, p as u8, 1)
}

fn peer_ip(p: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, p as u8, 2)
}

fn mac(ip: Ipv4Addr) -> EthernetAddress {
    let o = ip.octets();
    EthernetAddress([2, 0, o[0], o[1], o[2], o[3]])
}

/// The switch under test: id 1, ports p0 (parent switch, if `with_parent`, ranks 2 and
/// 3 beyond it), p1, p2 (ranks 0 and 1), one communicator.
fn rules(with_parent: bool) -> SwitchRules {
    let conn = |p: usize, peer: Peer, ranks: Vec<u16>| ConnectionRule {
        port: format!("p{p}"),
        local_ip: port_ip(p),
        local_mac: mac(port_ip(p)),
        local_qpn: 0x100 + p as u32,
        local_udp_port: 49152 + p as u16,
        local_start_psn: 1000 * p as u32,
        peer,
        peer_ip: peer_ip(p),
        peer_mac: Some(mac(peer_ip(p))),
        peer_qpn: 0x200 + p as u32,
        peer_udp_port: if matches!(peer, Peer::Switch { .. }) { 4791 } else { 50000 + p as u16 },
        peer_start_psn: 0xFF_FFF0 - p as u32, // wraps soon
        ranks,
    };
    let mut connections =
        vec![conn(1, Peer::Host { rank: 0 }, vec![0]), conn(2, Peer::Host { rank: 1 }, vec![1])];
    let mut parent = None;
    if with_parent {
        connections.insert(0, conn(0, Peer::Switch { switch_id: 0 }, vec![2, 3]));
        parent = Some(0);
    }
    SwitchRules {
        comm_id: 7,
        switch_id: 1,
        world_size: if with_parent { 4 } else { 2 },
        mtu: MTU,
        window: WINDOW,
        slots: 2 * WINDOW,
        parent,
        connections,
    }
}

/// What a run did, for the caller's report.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    /// Frames handed to the engine.
    pub frames_in: u64,
    /// Of these, with a valid ICRC for an installed QPN from its peer.
    pub valid: u64,
    /// Frames the engine sent.
    pub frames_out: u64,
    /// Highest memory the communicator held.
    pub max_memory: u64,
}

/// Drive one engine with the frames `input` describes; panics if an invariant breaks.
pub fn run(input: &[u8]) -> RunSummary {
    let mut inp = Bytes(input);
    let rules = rules(inp.u8() & 1 == 1);
    let ports = (0..PORTS)
        .map(|p| PortConfig { name: format!("p{p}"), ip: port_ip(p), mac: mac(port_ip(p)) })
        .collect();
    let mut e = SwitchEngine::new(SwitchEngineConfig { switch_id: 1, ports, ..Default::default() });
    let mut now = Time::ZERO;
    e.install(&rules, now).expect("rules install");
    let mut next_psn: Vec<u32> = rules.connections.iter().map(|c| c.peer_start_psn).collect();
    let (mut unknown, mut spoofed, mut sum) = (0u64, 0u64, RunSummary::default());
    // Slot pool and send queues are O(window): a bound independent of the input length.
    let memory_bound = u64::from(rules.slots + 4 * WINDOW) * u64::from(MTU + 128) * 8;
    let mut buf = vec![0u8; 4096];
    let mut out = vec![0u8; 4096];
    for _ in 0..256 {
        if inp.0.is_empty() {
            break;
        }
        let op = inp.u8();
        match op % 8 {
            0 => now += Duration::from_micros(u64::from(inp.u16())),
            1 => {
                if e.poll_timeout().is_some_and(|t| t <= now) {
                    e.handle_timeout(now);
                }
            }
            _ => {
                let ci = usize::from(inp.u8()) % rules.connections.len();
                let c = &rules.connections[ci];
                let port = usize::from(c.port[1..].parse::<u8>().unwrap_or(0));
                let kind = inp.u8();
                let (opcode, payload, imm, aeth) = match kind % 6 {
                    0 => (Opcode::RcAcknowledge, 0, None, true),
                    1 | 2 => (Opcode::RcSendOnlyWithImmediate, usize::from(MTU), Some(()), false),
                    3 => (
                        Opcode::RcSendOnly,
                        usize::from(inp.u8()) % (usize::from(MTU) + 1),
                        None,
                        false,
                    ),
                    4 => (
                        Opcode::RcSendOnlyWithImmediate,
                        usize::from(inp.u8()) % 64,
                        Some(()),
                        false,
                    ),
                    _ => (Opcode::RcRdmaWriteOnly, 0, None, false),
                };
                // PSN: mostly the expected one, sometimes a little behind or ahead.
                let jitter = i32::from(inp.u8() as i8) / 16;
                let psn = if aeth {
                    c.local_start_psn.wrapping_add(u32::from(inp.u8()))
                } else {
                    next_psn[ci].wrapping_add(jitter as u32)
                } & 0xFF_FFFF;
                let hostile = inp.u8();
                let (mut qpn, mut src, mut in_port) = (c.local_qpn, c.peer_ip, port);
                match hostile % 16 {
                    0 => qpn = 0x9000 + u32::from(hostile),
                    1 => src = Ipv4Addr::new(10, 9, 9, hostile),
                    2 => in_port = (port + 1) % PORTS,
                    _ => {}
                }
                let mut r = RoceRepr::new(
                    EthAddrs { src: mac(src), dst: mac(port_ip(in_port)) },
                    src,
                    port_ip(in_port),
                    c.peer_udp_port,
                    BthRepr {
                        ack_req: inp.u8() & 1 == 1,
                        ..BthRepr::new(opcode, qpn, Psn::new(psn))
                    },
                );
                if aeth {
                    let syndrome = match inp.u8() % 4 {
                        0 => AethSyndrome::Ack { credits: 31 },
                        1 => AethSyndrome::RnrNak { timer: inp.u8() & 31 },
                        2 => AethSyndrome::Nak(inc_wire::NakCode::PsnSequenceError),
                        _ => AethSyndrome::Ack { credits: inp.u8() & 31 },
                    };
                    r.ext.aeth = Some(AethRepr { syndrome, msn: u32::from(inp.u16()) });
                }
                if imm.is_some() {
                    let dest: u32 = match inp.u8() % 3 {
                        0 => 0xFFFF,
                        1 => 0,
                        _ => 1,
                    };
                    let fields = u32::from(inp.u8() % 3) << 14
                        | u32::from(inp.u8() % 4) << 12
                        | u32::from(inp.u8() % 2) << 8;
                    r.ext.imm =
                        Some(if inp.u8() % 8 == 0 { inp.u32() } else { dest << 16 | fields });
                }
                r.payload_len = payload;
                let seed = inp.u8();
                let Ok(len) = r.emit(&mut buf, |p| {
                    for (i, b) in p.iter_mut().enumerate() {
                        *b = seed.wrapping_mul(i as u8 | 1);
                    }
                }) else {
                    continue;
                };
                match hostile % 16 {
                    0 => unknown += 1,
                    1 | 2 => spoofed += 1,
                    _ => {}
                }
                if !aeth && hostile % 16 > 2 && jitter == 0 {
                    next_psn[ci] = (next_psn[ci] + 1) & 0xFF_FFFF;
                }
                if hostile % 16 > 2 && opcode != Opcode::RcRdmaWriteOnly {
                    sum.valid += 1;
                }
                e.handle_frame(now, in_port, &buf[..len]);
                sum.frames_in += 1;
            }
        }
        while let Some(t) = e.poll_transmit(now, &mut out) {
            sum.frames_out += 1;
            check_output(&rules, t.port, &out[..t.len]);
        }
        let c = e.counters();
        assert_eq!(c.rx_frames, sum.frames_in, "every frame handed in is counted");
        assert_eq!(c.tx_frames, sum.frames_out, "every frame sent is counted");
        assert_eq!(c.drops.unknown_qpn, unknown, "unknown QPNs are dropped and counted");
        assert!(c.drops.wrong_peer <= spoofed, "only spoofed frames are from a wrong peer");
        assert_eq!(c.drops.bad_icrc + c.drops.malformed + c.drops.not_roce, 0, "frames are valid");
        let mem = c.memory_bytes();
        sum.max_memory = sum.max_memory.max(mem);
        assert!(mem <= memory_bound, "memory {mem} exceeds O(window) bound {memory_bound}");
    }
    e.remove(rules.comm_id).expect("remove");
    assert_eq!(e.counters().memory_bytes(), 0, "a removed communicator holds nothing");
    sum
}

/// Every frame the engine sends is valid RoCEv2 to a peer of a connection on that port.
fn check_output(rules: &SwitchRules, port: usize, frame: &[u8]) {
    let f = RoceRepr::parse_any_port(frame).expect("the engine sends valid RoCEv2");
    assert!(f.icrc_ok, "the engine sends a correct ICRC");
    let r = f.repr;
    let ok = rules.connections.iter().any(|c| {
        c.port == format!("p{port}")
            && c.peer_ip == r.ip_dst
            && c.peer_qpn == r.bth.dest_qp
            && c.local_ip == r.ip_src
    });
    assert!(
        ok,
        "frame to {} QPN {:#x} on port {port} matches no connection",
        r.ip_dst, r.bth.dest_qp
    );
}
