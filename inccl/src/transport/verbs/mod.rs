//! ibverbs transport (feature `verbs`): an RC QP on a kernel RDMA device (Soft-RoCE or a
//! RoCE NIC) connected to the switch QPN, driven by the message-level
//! [`HostCollective`]. Control messages go as SEND_WITH_IMM, data chunks as SEND, each
//! one packet (the communicator MTU must not exceed the port's active MTU).
//! Receives are posted ahead (the engine's `recv_depth`) so the switch meets no RNR in
//! steady state; sends are posted in chains with one signalled completion per chain;
//! an idle wait sleeps on the CQ's completion channel instead of spinning.
//!
//! Device: `INCCL_IB_DEVICE` (default: the first device), `INCCL_IB_PORT` (default 1).

mod ib;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use inc_ctrl_proto::{HostEndpoint, RankEndpoint, ROCE_UDP_PORT};
use inc_protocol::coll;
use inccl_engine::{CollectiveConfig, CollectiveSpec, Delivery, HostCollective, OpBuffers};
use tracing::debug;

use self::ib::{Completion, Verbs, MAX_POST};
use super::{random_qpn_psn, Transport};
use crate::config::CommConfig;
use crate::error::{Error, Result};
use crate::iface::DataPlane;

/// Largest payload per message (IB MTU 4096).
const MAX_MTU: usize = 4096;
/// Send slots (messages in flight between posting and completion).
const SEND_SLOTS: usize = 512;
/// Receive slots posted ahead.
const RECV_SLOTS: usize = 1024;
/// Work requests per post / completions per poll.
const BATCH: usize = MAX_POST;

#[derive(Debug)]
pub(crate) struct VerbsTransport {
    ib: Verbs,
    rank: u16,
    ip: std::net::Ipv4Addr,
    mac: inc_ctrl_proto::EthernetAddress,
    start_psn: u32,
    op_timeout: Duration,
    coll: Option<HostCollective>,
    comm_id: u32,
    free_send: Vec<usize>,
    /// Posted sends in order; a signalled completion retires every earlier one.
    inflight: VecDeque<usize>,
    /// Messages that arrived before the collective expecting them started.
    early: Vec<(Option<u32>, Vec<u8>)>,
}

fn slot_off(slot: usize) -> usize {
    slot * MAX_MTU
}

impl VerbsTransport {
    pub(crate) fn open(dp: &DataPlane, rank: u16, cfg: &CommConfig) -> Result<Self> {
        let device = std::env::var("INCCL_IB_DEVICE").ok().filter(|d| !d.is_empty());
        let port = match std::env::var("INCCL_IB_PORT") {
            Ok(p) => {
                p.parse::<u8>().map_err(|e| Error::Config(format!("INCCL_IB_PORT=`{p}`: {e}")))?
            }
            Err(_) => 1,
        };
        let ib = Verbs::open(
            device.as_deref(),
            port,
            dp.ip,
            MAX_MTU,
            SEND_SLOTS + RECV_SLOTS,
            (SEND_SLOTS.max(RECV_SLOTS)) as u32,
        )?;
        let (_, start_psn) = random_qpn_psn();
        debug!(rank, qpn = ib.qpn(), active_mtu = ib.active_mtu(), "verbs QP created");
        Ok(VerbsTransport {
            ib,
            rank,
            ip: dp.ip,
            mac: dp.mac,
            start_psn,
            op_timeout: cfg.op_timeout,
            coll: None,
            comm_id: 0,
            free_send: (0..SEND_SLOTS).collect(),
            inflight: VecDeque::new(),
            early: Vec::new(),
        })
    }

    fn fail(&self, reason: String) -> Error {
        Error::Collective { rank: self.rank, comm_id: self.comm_id, reason }
    }

    /// Post every message the collective has ready (window and free slots permitting).
    fn post_ready(&mut self, bufs: &OpBuffers<'_>) -> Result<()> {
        let coll = self.coll.as_mut().expect("connected");
        let mut batch: Vec<(u64, usize, u32, Option<u32>)> = Vec::with_capacity(BATCH);
        while let Some(&slot) = self.free_send.last() {
            let off = slot_off(slot);
            let Some(msg) = coll.poll_send(bufs, &mut self.ib.buf_mut()[off..off + MAX_MTU]) else {
                break;
            };
            self.free_send.pop();
            self.inflight.push_back(slot);
            batch.push((slot as u64, off, msg.len as u32, msg.imm));
            if batch.len() == BATCH {
                self.ib.post_sends(&batch, false)?;
                batch.clear();
            }
        }
        self.ib.post_sends(&batch, false)
    }

    /// Handle completions; returns how many arrived.
    fn reap(&mut self, bufs: &mut OpBuffers<'_>, comps: &mut Vec<Completion>) -> Result<usize> {
        comps.clear();
        self.ib.poll(comps)?;
        let mut repost = Vec::new();
        for c in comps.iter() {
            if !c.recv {
                // In-order completion: every send posted up to this one is done.
                let slot = c.wr_id as usize;
                while let Some(s) = self.inflight.pop_front() {
                    self.free_send.push(s);
                    if s == slot {
                        break;
                    }
                }
                continue;
            }
            let slot = c.wr_id as usize;
            let off = slot_off(slot);
            let payload = &self.ib.buf_mut()[off..off + c.len as usize];
            let coll = self.coll.as_mut().expect("connected");
            if coll.handle_message(c.imm, payload, bufs) == Delivery::NotReady {
                // The NIC already acknowledged it: keep it for the next collective.
                self.early.push((c.imm, payload.to_vec()));
            }
            repost.push((slot as u64, off));
        }
        self.ib.post_recvs(&repost, MAX_MTU as u32)?;
        Ok(comps.len())
    }
}

impl Transport for VerbsTransport {
    fn local_endpoint(&self) -> RankEndpoint {
        RankEndpoint {
            rank: self.rank,
            ip: self.ip,
            mac: Some(self.mac),
            qpn: self.ib.qpn(),
            start_psn: self.start_psn,
            udp_port: ROCE_UDP_PORT,
        }
    }

    fn connect(&mut self, ep: &HostEndpoint, world_size: u16) -> Result<()> {
        let mtu = u32::from(ep.mtu);
        if mtu > self.ib.active_mtu() || usize::from(ep.mtu) > MAX_MTU {
            return Err(Error::Config(format!(
                "communicator MTU {mtu} exceeds the RDMA port's active MTU {} (set INCCL_MTU to at most that)",
                self.ib.active_mtu()
            )));
        }
        self.comm_id = ep.comm_id;
        let coll = HostCollective::new(CollectiveConfig {
            rank: self.rank,
            world_size,
            mtu: usize::from(ep.mtu),
            window: ep.window,
        });
        let depth = (coll.recv_depth() as usize).min(RECV_SLOTS);
        if usize::from(ep.mtu).max(coll::HEADER_LEN) > MAX_MTU {
            return Err(Error::Config(format!("communicator MTU {mtu} is larger than {MAX_MTU}")));
        }
        // Receives first, so nothing the switch sends after RTR meets an RNR.
        let recvs: Vec<(u64, usize)> =
            (SEND_SLOTS..SEND_SLOTS + depth).map(|s| (s as u64, slot_off(s))).collect();
        for chunk in recvs.chunks(BATCH) {
            self.ib.post_recvs(chunk, MAX_MTU as u32)?;
        }
        self.ib.connect(ep.switch_qpn, ep.switch_start_psn, self.start_psn, ep.gid, mtu)?;
        self.coll = Some(coll);
        Ok(())
    }

    fn run(&mut self, spec: CollectiveSpec, mut bufs: OpBuffers<'_>) -> Result<()> {
        let Some(coll) = self.coll.as_mut() else {
            return Err(Error::Unusable("communicator", "its QP is not connected".into()));
        };
        coll.start(spec).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        for (imm, payload) in std::mem::take(&mut self.early) {
            if coll.handle_message(imm, &payload, &mut bufs) == Delivery::NotReady {
                self.early.push((imm, payload));
            }
        }
        let mut comps = Vec::with_capacity(BATCH);
        let mut last_progress = Instant::now();
        let mut idle_polls = 0u32;
        loop {
            self.post_ready(&bufs)?;
            if let Some(done) = self.coll.as_mut().expect("connected").poll_completion() {
                return done.map_err(|e| self.fail(e.to_string()));
            }
            if self.reap(&mut bufs, &mut comps)? > 0 {
                last_progress = Instant::now();
                idle_polls = 0;
                continue;
            }
            if last_progress.elapsed() >= self.op_timeout {
                let progress = self.coll.as_ref().and_then(HostCollective::progress);
                return Err(self.fail(format!(
                    "{:?} of {} elements made no progress for {:?} (chunks done/total {progress:?}); \
                     a peer rank or switch may be down",
                    spec.kind, spec.count, self.op_timeout
                )));
            }
            // Poll a little for latency, then sleep on the completion channel.
            idle_polls += 1;
            if idle_polls > 16 {
                let left = self.op_timeout.saturating_sub(last_progress.elapsed());
                self.ib.wait(left.min(Duration::from_millis(100)))?;
            }
        }
    }
}
