//! Transports: how a communicator's QP moves packets.
//!
//! - [`udp`]: RoCEv2 spoken from user space over an unconnected UDP socket per QP
//!   (default; works in any network namespace).
//! - `verbs` (feature `verbs`): kernel RDMA through libibverbs.

use inc_ctrl_proto::{HostEndpoint, RankEndpoint};
use inccl_engine::{CollectiveSpec, OpBuffers};

use crate::config::{CommConfig, TransportKind};
use crate::error::Result;
use crate::iface::DataPlane;

pub(crate) mod udp;
#[cfg(feature = "verbs")]
pub(crate) mod verbs;

/// One QP of one communicator, from creation to destruction.
pub(crate) trait Transport: Send + std::fmt::Debug {
    /// Parameters this rank registers with the controller.
    fn local_endpoint(&self) -> RankEndpoint;
    /// Bring the QP up against the leaf switch.
    fn connect(&mut self, ep: &HostEndpoint, world_size: u16) -> Result<()>;
    /// Run one collective to completion (bounded: no progress for `op_timeout` fails).
    fn run(&mut self, spec: CollectiveSpec, bufs: OpBuffers<'_>) -> Result<()>;
    /// Run the collectives `feed` hands out, in its order, until it has no more and each
    /// has its outcome; where the transport can, several are on the wire at once.
    fn run_pipelined<'a>(&mut self, feed: &mut dyn Feed<'a>) {
        while let Some((id, spec, bufs)) = feed.next() {
            let r = self.run(spec, bufs);
            feed.done(id, r);
        }
    }
}

/// What a pipelined run takes its collectives from and gives their outcomes to.
pub(crate) trait Feed<'a> {
    /// The next collective (an id for `done`, the spec, the caller's buffers), if one
    /// is waiting.
    fn next(&mut self) -> Option<(u64, CollectiveSpec, OpBuffers<'a>)>;
    /// Collective `id` finished (in the order they were handed out).
    fn done(&mut self, id: u64, r: Result<()>);
}

/// Create the transport chosen in `cfg` for `rank`.
pub(crate) fn open(cfg: &CommConfig, dp: &DataPlane, rank: u16) -> Result<Box<dyn Transport>> {
    match cfg.transport {
        TransportKind::Udp => Ok(Box::new(udp::UdpTransport::open(dp, rank, cfg)?)),
        #[cfg(feature = "verbs")]
        TransportKind::Verbs => Ok(Box::new(verbs::VerbsTransport::open(dp, rank, cfg)?)),
        #[cfg(not(feature = "verbs"))]
        TransportKind::Verbs => Err(crate::error::Error::TransportUnavailable(
            "INCCL_TRANSPORT=verbs, but this build of INCCL has no ibverbs support \
             (rebuild with `--features verbs`)"
                .into(),
        )),
    }
}

/// Random 24-bit QPN (never 0 or 1) and start PSN for a new QP.
pub(crate) fn random_qpn_psn() -> (u32, u32) {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    (rng.gen_range(2..=0x00ff_ffff), rng.gen_range(0..=0x00ff_ffff))
}
