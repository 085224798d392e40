//! [`Group`] and [`Communicator`]: the Rust API.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use inc_ctrl_proto::HostEndpoint;
use inccl_engine::{CollectiveKind, CollectiveSpec, OpBuffers};
use tracing::{info, warn};

use crate::bootstrap::{Bootstrap, Phase};
use crate::config::{CommConfig, GroupConfig};
use crate::error::{Error, Result};
use crate::iface::{self, DataPlane};
use crate::transport::{self, Transport};
use crate::types::{DataType, Element, ReduceOp};

#[derive(Debug)]
struct GroupShared {
    rank: u16,
    world_size: u16,
    group_id: u64,
    data_plane: DataPlane,
    boot: Mutex<Bootstrap>,
    /// Communicators are numbered in creation order, which must be the same on every rank.
    next_tag: AtomicU32,
}

impl GroupShared {
    fn boot(&self) -> MutexGuard<'_, Bootstrap> {
        // A panic while holding the lock leaves the bootstrap in a consistent state
        // (every step is a complete message exchange), so poisoning is ignored.
        self.boot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A set of ranks that know each other (the seed's `inccl_group`).
///
/// Creation is collective: every rank calls [`Group::create`] with the same world size
/// and master address. Rank 0 listens on the master address and talks to the controller.
#[derive(Debug)]
pub struct Group {
    shared: Arc<GroupShared>,
}

impl Group {
    /// Create a group with the `INCCL_*` environment applied (see [`crate::config`]).
    pub fn new(world_size: u16, rank: u16, master_addr: &str) -> Result<Group> {
        Group::create(GroupConfig::from_env(world_size, rank, master_addr)?)
    }

    /// Create a group from an explicit configuration (no environment is read).
    pub fn create(cfg: GroupConfig) -> Result<Group> {
        cfg.validate()?;
        let data_plane = iface::resolve(&cfg)?;
        info!(rank = cfg.rank, ip = %data_plane.ip, iface = ?data_plane.iface, "data plane");
        let boot = Bootstrap::create(&cfg, data_plane.ip)?;
        Ok(Group {
            shared: Arc::new(GroupShared {
                rank: boot.rank(),
                world_size: boot.world_size(),
                group_id: boot.group_id(),
                data_plane,
                boot: Mutex::new(boot),
                next_tag: AtomicU32::new(0),
            }),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> u16 {
        self.shared.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u16 {
        self.shared.world_size
    }

    /// Controller-assigned group id.
    pub fn group_id(&self) -> u64 {
        self.shared.group_id
    }

    /// Data-plane address of this rank.
    pub fn data_plane(&self) -> &DataPlane {
        &self.shared.data_plane
    }

    /// Create a communicator (collective: every rank, same order). `INCCL_TRANSPORT`,
    /// if set, overrides `cfg.transport`; the other fields are as given (use
    /// [`CommConfig::from_env`] for the other environment overrides).
    pub fn communicator(&self, mut cfg: CommConfig) -> Result<Communicator> {
        if let Some(t) = crate::config::transport_override()? {
            cfg.transport = t;
        }
        let sh = &self.shared;
        let tag = sh.next_tag.fetch_add(1, Ordering::Relaxed);
        let mut transport = transport::open(&cfg, &sh.data_plane, sh.rank)?;
        let mut boot = sh.boot();
        let endpoint =
            boot.create_communicator(tag, transport.local_endpoint(), cfg.mtu, cfg.window)?;
        transport.connect(&endpoint, sh.world_size)?;
        boot.barrier(tag, Phase::QpUp)?;
        drop(boot);
        info!(
            rank = sh.rank,
            comm_id = endpoint.comm_id,
            switch = endpoint.switch_id,
            switch_ip = %endpoint.switch_ip,
            mtu = endpoint.mtu,
            window = endpoint.window,
            transport = ?cfg.transport,
            "communicator ready"
        );
        Ok(Communicator { group: sh.clone(), tag, endpoint, transport, failed: None })
    }

    /// Destroy the group (rank 0 removes it and its communicators from the controller).
    pub fn destroy(self) -> Result<()> {
        self.shared.boot().destroy()
    }
}

/// One communicator: a QP to the leaf switch and the collectives over it.
#[derive(Debug)]
pub struct Communicator {
    group: Arc<GroupShared>,
    tag: u32,
    endpoint: HostEndpoint,
    transport: Box<dyn Transport>,
    /// Set after a data-path failure: the QP state is unknown, so later calls fail fast.
    failed: Option<String>,
}

impl Communicator {
    /// This process's rank.
    pub fn rank(&self) -> u16 {
        self.group.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u16 {
        self.group.world_size
    }

    /// Controller-assigned communicator id.
    pub fn comm_id(&self) -> u32 {
        self.endpoint.comm_id
    }

    /// Connection parameters of this rank's QP (switch, QPNs, MTU, window).
    pub fn endpoint(&self) -> &HostEndpoint {
        &self.endpoint
    }

    /// AllReduce of `src` into `dst` (same length).
    pub fn allreduce<T: Element>(&mut self, src: &[T], dst: &mut [T], op: ReduceOp) -> Result<()> {
        self.allreduce_bytes(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst), T::DTYPE, op)
    }

    /// In-place AllReduce.
    pub fn allreduce_in_place<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.allreduce_bytes_in_place(bytemuck::cast_slice_mut(buf), T::DTYPE, op)
    }

    /// Reduce to `root`: `dst` is written on the root only (pass an empty slice elsewhere).
    pub fn reduce<T: Element>(
        &mut self,
        src: &[T],
        dst: &mut [T],
        op: ReduceOp,
        root: u16,
    ) -> Result<()> {
        self.reduce_bytes(
            bytemuck::cast_slice(src),
            bytemuck::cast_slice_mut(dst),
            T::DTYPE,
            op,
            root,
        )
    }

    /// Broadcast `buf` from `root` to every rank.
    pub fn broadcast<T: Element>(&mut self, buf: &mut [T], root: u16) -> Result<()> {
        self.broadcast_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, root)
    }

    /// Barrier through the switches.
    pub fn barrier(&mut self) -> Result<()> {
        let spec = CollectiveSpec {
            kind: CollectiveKind::Barrier,
            op: inc_wire::Operator::Barrier,
            dtype: inc_wire::DataType::Int32,
            count: 0,
        };
        self.run(spec, OpBuffers::None)
    }

    /// AllReduce on native-endian byte buffers of `dtype` elements.
    pub fn allreduce_bytes(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let count = elements(src, dtype, "source")?;
        if dst.len() != src.len() {
            return Err(Error::InvalidArgument(format!(
                "allreduce destination holds {} bytes, source {} bytes",
                dst.len(),
                src.len()
            )));
        }
        let spec = self.spec(CollectiveKind::AllReduce, op, dtype, count)?;
        self.run(spec, OpBuffers::Separate { src, dst: &mut *dst })?;
        self.finalize(op, dtype, dst);
        Ok(())
    }

    /// In-place AllReduce on a native-endian byte buffer.
    pub fn allreduce_bytes_in_place(
        &mut self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let count = elements(buf, dtype, "buffer")?;
        let spec = self.spec(CollectiveKind::AllReduce, op, dtype, count)?;
        self.run(spec, OpBuffers::InPlace(&mut *buf))?;
        self.finalize(op, dtype, buf);
        Ok(())
    }

    /// Reduce on byte buffers; `dst` is used on the root only.
    pub fn reduce_bytes(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: u16,
    ) -> Result<()> {
        self.check_root(root)?;
        let count = elements(src, dtype, "source")?;
        let spec = self.spec(CollectiveKind::Reduce { root }, op, dtype, count)?;
        if self.rank() == root {
            if dst.len() != src.len() {
                return Err(Error::InvalidArgument(format!(
                    "reduce destination on root {root} holds {} bytes, source {} bytes",
                    dst.len(),
                    src.len()
                )));
            }
            self.run(spec, OpBuffers::Separate { src, dst: &mut *dst })?;
            self.finalize(op, dtype, dst);
            Ok(())
        } else {
            self.run(spec, OpBuffers::SendOnly(src))
        }
    }

    /// In-place Reduce on the root (`buf` is both input and result there).
    pub fn reduce_bytes_in_place(
        &mut self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: u16,
    ) -> Result<()> {
        self.check_root(root)?;
        let count = elements(buf, dtype, "buffer")?;
        let spec = self.spec(CollectiveKind::Reduce { root }, op, dtype, count)?;
        if self.rank() == root {
            self.run(spec, OpBuffers::InPlace(&mut *buf))?;
            self.finalize(op, dtype, buf);
            Ok(())
        } else {
            self.run(spec, OpBuffers::SendOnly(buf))
        }
    }

    /// Broadcast on a byte buffer.
    pub fn broadcast_bytes(&mut self, buf: &mut [u8], dtype: DataType, root: u16) -> Result<()> {
        self.check_root(root)?;
        let count = elements(buf, dtype, "buffer")?;
        // The operator field of a Broadcast is not used for arithmetic.
        let spec = self.spec(CollectiveKind::Broadcast { root }, ReduceOp::Sum, dtype, count)?;
        if self.rank() == root {
            self.run(spec, OpBuffers::SendOnly(buf))
        } else {
            self.run(spec, OpBuffers::RecvOnly(buf))
        }
    }

    /// Destroy the communicator (collective; rank 0 removes its rules from the switches).
    pub fn destroy(self) -> Result<()> {
        let mut boot = self.group.boot();
        let barrier = boot.barrier(self.tag, Phase::Destroy);
        let removed = boot.destroy_communicator(self.endpoint.comm_id);
        barrier.and(removed)
    }

    /// The collective, or `InvalidArgument` naming the type and operator when `op`
    /// cannot reduce `dtype` (refused before anything is sent, the same way on every
    /// rank).
    fn spec(
        &self,
        kind: CollectiveKind,
        op: ReduceOp,
        dtype: DataType,
        count: u64,
    ) -> Result<CollectiveSpec> {
        if !matches!(kind, CollectiveKind::Broadcast { .. }) {
            if let Some(why) = crate::types::refuse(op, dtype) {
                return Err(Error::InvalidArgument(why));
            }
        }
        Ok(CollectiveSpec { kind, op, dtype, count })
    }

    /// AVG's last step on a result this rank received: divide by the world size.
    fn finalize(&self, op: ReduceOp, dtype: DataType, result: &mut [u8]) {
        inc_wire::reduce::finalize_native(op, dtype, result, self.world_size());
    }

    fn check_root(&self, root: u16) -> Result<()> {
        if root >= self.world_size() {
            return Err(Error::InvalidArgument(format!(
                "root rank {root} is out of range for world size {}",
                self.world_size()
            )));
        }
        Ok(())
    }

    fn run(&mut self, spec: CollectiveSpec, bufs: OpBuffers<'_>) -> Result<()> {
        if let Some(why) = &self.failed {
            return Err(Error::Unusable("communicator", why.clone()));
        }
        match self.transport.run(spec, bufs) {
            Ok(()) => Ok(()),
            Err(Error::Collective { rank, comm_id, mut reason }) => {
                let dead = self.group.boot().dead_peers();
                if !dead.is_empty() {
                    reason.push_str(&format!(
                        "; ranks {dead:?} lost their bootstrap connection (process dead?)"
                    ));
                }
                warn!(rank, comm_id, %reason, "collective failed");
                self.failed = Some(reason.clone());
                Err(Error::Collective { rank, comm_id, reason })
            }
            Err(e) => Err(e),
        }
    }
}

/// Element count of a native buffer; errors if the length is not a whole number of elements.
fn elements(buf: &[u8], dtype: DataType, what: &str) -> Result<u64> {
    if buf.len() % dtype.size() != 0 {
        return Err(Error::InvalidArgument(format!(
            "{what} length {} bytes is not a multiple of the {dtype} element size {}",
            buf.len(),
            dtype.size()
        )));
    }
    Ok((buf.len() / dtype.size()) as u64)
}
