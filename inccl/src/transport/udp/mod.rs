//! Userspace RoCEv2 over an unconnected UDP socket on the RoCEv2 port.
//!
//! One socket per process, network namespace and data-plane IP, bound to `ip:4791` and
//! shared by every QP of the process in that namespace (demultiplexed by destination
//! QPN, see [`port`]), with `IP_PMTUDISC_DO`: the kernel then writes IPv4 ID 0, DF,
//! TTL 64, TOS 0, exactly the bytes the engine's ICRC covers. The rank registers port
//! 4791, so switches send to it as to any RoCE device.
//! Sending strips the 42-byte Ethernet/IPv4/UDP headers of an engine frame and sends
//! BTH..ICRC to the switch; receiving lands the datagram at offset 42 of a slot and
//! rebuilds the headers in front of it (ID 0, DF, TTL 64, addresses and ports from the
//! datagram) so the engine verifies the ICRC over what was on the wire.
//!
//! Inside a collective the caller's thread drives the engine; between collectives a
//! progress thread does (ACKs, RNR NAKs, RC timers), as an RDMA NIC would, so the
//! switch's RC connection never times out while the application computes. The thread
//! sleeps in `ppoll` on the engine's next timer, and on the socket too once no
//! collective has run for [`qp::CALLER_GRACE`]: while collectives follow each other,
//! their callers read every datagram, and a second thread woken by each of them would
//! only cost a wake-up per datagram on a busy machine.
//!
//! Files: [`socket`] (the batched I/O of one QP and the socket's setup), [`send`] and
//! [`recv`] (its send and receive paths), [`pace`] (sending at the host link's rate),
//! [`port`] (the socket shared by a process's QPs and the demultiplexing by QPN), [`qp`]
//! (a connected QP's state and its progress thread), [`sys`] (the system calls); this
//! file is the [`Transport`] of a communicator.

mod pace;
mod port;
mod qp;
mod recv;
mod send;
mod socket;
mod sys;

use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inc_ctrl_proto::{HostEndpoint, RankEndpoint};
use inc_wire::EthernetAddress;
use inccl_engine::{CollectiveSpec, HostEngine, HostOptions, HostQpConfig, OpBuffers};
use tracing::{debug, trace};

pub use self::recv::IdentRule;
pub use self::socket::{RoceSocket, UdpStats};

use self::pace::NicPacer;
use self::port::{Attachment, SharedPort};
use self::qp::{lock, progress_loop, Core, Progress};
use self::send::GsoPath;
use self::socket::bind_socket;
use super::{random_qpn_psn, Feed, Transport};
use crate::config::CommConfig;
use crate::error::{Error, Result};
use crate::iface::DataPlane;

/// Ethernet (14) + IPv4 (20) + UDP (8).
pub(crate) const HEADERS: usize = 42;

/// One communicator's QP on the userspace transport, from its place on the shared
/// socket to its progress thread.
#[derive(Debug)]
pub(crate) struct UdpTransport {
    /// Before `connect`: the QP's place on the shared socket.
    qp: Option<Attachment>,
    core: Option<Arc<Mutex<Core>>>,
    progress: Option<Progress>,
    local: SocketAddrV4,
    mac: EthernetAddress,
    rank: u16,
    qpn: u32,
    start_psn: u32,
    op_timeout: Duration,
    comm_id: u32,
    switch_id: u32,
    /// Where UDP GSO sends would be cut (found at open, used at connect).
    gso: GsoPath,
    /// [`CommConfig::busy_poll`].
    busy_poll: Duration,
    /// [`CommConfig::nic_pacing`].
    nic_pacing: bool,
}

impl UdpTransport {
    pub(crate) fn open(dp: &DataPlane, rank: u16, cfg: &CommConfig) -> Result<Self> {
        let ctx = || format!("rank {rank}: data-plane UDP socket on {}", dp.ip);
        let port =
            SharedPort::get(dp.ip, |p| bind_socket(dp.ip, p)).map_err(|e| Error::io(ctx(), e))?;
        let qp = port.attach(|| random_qpn_psn().0).map_err(|e| Error::io(ctx(), e))?;
        let (qpn, start_psn) = (qp.qpn(), random_qpn_psn().1);
        let local = port.local_addr();
        let gso = if cfg.udp_gso { GsoPath::of(dp, port.socket()) } else { GsoPath::None };
        debug!(rank, %local, qpn, start_psn, "userspace RoCEv2 QP created");
        Ok(UdpTransport {
            qp: Some(qp),
            core: None,
            progress: None,
            local,
            mac: dp.mac,
            rank,
            qpn,
            start_psn,
            op_timeout: cfg.op_timeout,
            comm_id: 0,
            switch_id: 0,
            gso,
            busy_poll: cfg.busy_poll,
            nic_pacing: cfg.nic_pacing,
        })
    }

    fn fail(&self, reason: String) -> Error {
        Error::Collective { rank: self.rank, comm_id: self.comm_id, reason }
    }
}

impl Transport for UdpTransport {
    fn local_endpoint(&self) -> RankEndpoint {
        RankEndpoint {
            rank: self.rank,
            ip: *self.local.ip(),
            mac: Some(self.mac),
            qpn: self.qpn,
            start_psn: self.start_psn,
            udp_port: self.local.port(),
        }
    }

    fn connect(&mut self, ep: &HostEndpoint, world_size: u16) -> Result<()> {
        if ep.host_qpn != self.qpn || ep.host_udp_port != self.local.port() || ep.rank != self.rank
        {
            return Err(Error::Peer {
                rank: self.rank,
                reason: format!(
                    "controller endpoint for rank {} (QPN {:#x}, port {}) does not match this QP \
                     (rank {}, QPN {:#x}, port {})",
                    ep.rank,
                    ep.host_qpn,
                    ep.host_udp_port,
                    self.rank,
                    self.qpn,
                    self.local.port()
                ),
            });
        }
        let Some(qp) = self.qp.take() else {
            return Err(Error::Unusable("communicator", "its QP is already connected".into()));
        };
        let config = HostQpConfig::from_endpoint(
            ep,
            world_size,
            EthernetAddress(self.mac.0),
            *self.local.ip(),
        );
        let opts = HostOptions { progress_timeout: self.op_timeout, ..HostOptions::default() };
        let sock = qp.port().socket().clone();
        let inbox = qp.inbox_handle();
        let mut io = RoceSocket::on(sock.clone(), self.local, self.mac);
        let gso = self.gso.usable(ep.switch_takes_gso);
        debug!(rank = self.rank, path = ?self.gso, switch_takes_gso = ep.switch_takes_gso, gso, "UDP GSO sends");
        io.set_gso(gso);
        let pacer = ep.link_rate_bps.filter(|&r| self.nic_pacing && r > 0).map(NicPacer::new);
        debug!(rank = self.rank, link_rate_bps = ?ep.link_rate_bps, paced = pacer.is_some(), "NIC pacing");
        let core = Arc::new(Mutex::new(Core {
            io,
            qp,
            epoch: Instant::now(),
            engine: HostEngine::with_options(config, opts),
            switch: SocketAddrV4::new(ep.switch_ip, inc_wire::ROCEV2_PORT),
            switch_mac: ep.switch_mac,
            last_collective: Instant::now(),
            pacer,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (core, inbox, stop) = (core.clone(), inbox.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("inccl-progress-{}", ep.comm_id))
                .spawn(move || progress_loop(core, sock, inbox, stop))
                .map_err(|e| {
                    Error::io(format!("rank {}: starting the progress thread", self.rank), e)
                })?
        };
        self.core = Some(core);
        self.progress = Some(Progress { stop, inbox, thread: Some(thread) });
        self.comm_id = ep.comm_id;
        self.switch_id = ep.switch_id;
        Ok(())
    }

    fn run(&mut self, spec: CollectiveSpec, bufs: OpBuffers<'_>) -> Result<()> {
        let mut one = OneShot { call: Some((spec, bufs)), outcome: None };
        self.run_pipelined(&mut one);
        one.outcome.unwrap_or_else(|| Err(Error::Unusable("collective", "it never ran".into())))
    }

    fn run_pipelined<'a>(&mut self, feed: &mut dyn Feed<'a>) {
        let Some(core) = self.core.clone() else {
            while let Some((id, ..)) = feed.next() {
                let why = "its QP is not connected".to_string();
                feed.done(id, Err(Error::Unusable("communicator", why)));
            }
            return;
        };
        // Held for the whole run: the progress thread only runs between runs.
        let mut c = lock(&core);
        let mut held = Held::default();
        if let Err(e) = self.drive(&mut c, feed, &mut held) {
            // The QP's state is unknown: everything still on it fails with the reason.
            for (id, _) in held.calls.drain(..) {
                feed.done(id, Err(self.fail(e.clone())));
            }
            held.bufs.clear();
        }
        c.last_collective = Instant::now();
    }
}

/// The calls a pipelined run holds on the engine, oldest first, with their buffers.
#[derive(Default)]
struct Held<'a> {
    calls: VecDeque<(u64, CollectiveSpec)>,
    bufs: VecDeque<OpBuffers<'a>>,
}

/// A feed of one collective, for the blocking [`Transport::run`].
struct OneShot<'a> {
    call: Option<(CollectiveSpec, OpBuffers<'a>)>,
    outcome: Option<Result<()>>,
}

impl<'a> Feed<'a> for OneShot<'a> {
    fn next(&mut self) -> Option<(u64, CollectiveSpec, OpBuffers<'a>)> {
        self.call.take().map(|(spec, bufs)| (0, spec, bufs))
    }
    fn done(&mut self, _: u64, r: Result<()>) {
        self.outcome = Some(r);
    }
}

impl UdpTransport {
    /// Runs what `feed` hands out on the locked QP, up to the engine's limit at once,
    /// until the feed is empty and every call finished. An `Err` is a failure of the
    /// QP (the calls still in `held` have no outcome yet).
    fn drive<'a>(
        &self,
        c: &mut Core,
        feed: &mut dyn Feed<'a>,
        held: &mut Held<'a>,
    ) -> std::result::Result<(), String> {
        // Backstop for the engine's own progress timeout (which names the stalled PSN
        // and fires first): give up if nothing at all arrives for longer.
        let stall_limit = self.op_timeout + Duration::from_secs(1);
        let mut last_rx = Instant::now();
        loop {
            while c.engine.collective().has_room() {
                let Some((id, spec, bufs)) = feed.next() else { break };
                let now = c.now();
                match c.engine.enqueue(now, spec) {
                    Ok(()) => {
                        if held.calls.is_empty() {
                            last_rx = Instant::now();
                        }
                        held.calls.push_back((id, spec));
                        held.bufs.push_back(bufs);
                    }
                    Err(e) => feed.done(id, Err(Error::InvalidArgument(e.to_string()))),
                }
            }
            // Done, unless an ACK is owed now: a Reduce's root or a Broadcast's receiver
            // whose senders complete on it, which the progress thread would send only
            // after CALLER_GRACE.
            if held.calls.is_empty() && !c.engine.owes_ack() {
                return Ok(());
            }
            c.flush(&held.bufs)
                .map_err(|e| format!("sending to switch {} from {}: {e}", c.switch, self.local))?;
            if held.calls.is_empty() {
                return Ok(());
            }
            self.collect(c, feed, held);
            if held.calls.is_empty() {
                continue;
            }
            let stall_left = stall_limit.saturating_sub(last_rx.elapsed());
            // A due timer makes this zero: the wait returns at once and `fire_timers`
            // below handles it.
            let wait_for = c.next_timer().map_or(stall_left, |t| t.min(stall_left));
            let readable = c
                .busy_poll(self.busy_poll.min(wait_for))
                .and_then(|ready| if ready { Ok(true) } else { c.wait_readable(wait_for) })
                .map_err(|e| format!("poll on {}: {e}", self.local))?;
            if readable {
                let n = c
                    .receive(&mut held.bufs)
                    .map_err(|e| format!("receiving on {}: {e}", self.local))?;
                if n > 0 {
                    last_rx = Instant::now();
                }
            }
            c.fire_timers();
            // Finished by what just arrived: hand it back now. The ACK it owes the
            // switch goes out from the progress thread, or with the next collective's
            // first frames, instead of delaying the caller by a send and a switch
            // wake-up.
            self.collect(c, feed, held);
            if !held.calls.is_empty() && last_rx.elapsed() >= stall_limit {
                let (_, spec) = held.calls[0];
                return Err(format!(
                    "{:?} of {} elements made no progress for {stall_limit:?}: nothing received \
                     from switch {} at {} (a peer rank or switch may be down); engine {:?}; \
                     socket {:?}; {} datagrams for no QP of this process, {} dropped from a full \
                     inbox",
                    spec.kind,
                    spec.count,
                    self.switch_id,
                    c.switch,
                    c.engine.counters(),
                    c.io.stats(),
                    c.qp.port().stray(),
                    c.qp.inbox().dropped(),
                ));
            }
        }
    }

    /// Hands the outcomes the engine has, in call order, to the feed.
    fn collect<'a>(&self, c: &mut Core, feed: &mut dyn Feed<'a>, held: &mut Held<'a>) {
        while let Some(done) = c.engine.poll_completion() {
            let (id, _) = held.calls.pop_front().expect("an outcome for a held call");
            held.bufs.pop_front();
            trace!(stats = ?c.io.stats(), "collective finished");
            feed.done(id, done.map_err(|e| self.fail(e.to_string())));
        }
    }
}
