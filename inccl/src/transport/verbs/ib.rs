//! The libibverbs objects of one RC QP, behind a safe interface. All `unsafe` of the
//! verbs transport is in this file; every `ibv_*` return value is checked and errors
//! name the call and the device.

use std::ffi::CStr;
use std::io;
use std::net::Ipv4Addr;
use std::ptr;

use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::error::{Error, Result};

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_debug_implementations,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/verbs_bindings.rs"));
}

/// One work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completion {
    /// The `wr_id` the request was posted with.
    pub wr_id: u64,
    /// A receive (otherwise a send).
    pub recv: bool,
    /// Bytes received.
    pub len: u32,
    /// Immediate data (host order), if the message carried one.
    pub imm: Option<u32>,
}

/// Device, PD, CQ, registered buffer and RC QP.
pub(crate) struct Verbs {
    device: String,
    ctx: *mut sys::ibv_context,
    channel: *mut sys::ibv_comp_channel,
    pd: *mut sys::ibv_pd,
    cq: *mut sys::ibv_cq,
    qp: *mut sys::ibv_qp,
    mr: *mut sys::ibv_mr,
    /// Registered memory; its heap allocation never moves while `mr` exists.
    buf: Vec<u8>,
    port: u8,
    gid_index: u8,
    active_mtu: u32,
    qpn: u32,
    /// Completion buffer reused by every poll.
    wcs: Vec<sys::ibv_wc>,
    /// CQ events taken from the channel and not yet acknowledged.
    unacked_events: u32,
    /// Completions found while arming the CQ, handed out by the next `poll`.
    pending: Vec<Completion>,
}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verbs")
            .field("device", &self.device)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("active_mtu", &self.active_mtu)
            .field("qpn", &self.qpn)
            .finish_non_exhaustive()
    }
}

/// Work requests per post call.
pub(crate) const MAX_POST: usize = 32;

// Safety: libibverbs objects may be used from any thread (the library serialises
// internally); `Verbs` is used by one thread at a time through `&mut self`.
unsafe impl Send for Verbs {}

fn os_err(call: &str, device: &str) -> Error {
    Error::io(format!("{call} on RDMA device {device}"), io::Error::last_os_error())
}

fn rc_err(call: &str, device: &str, rc: i32) -> Error {
    // Verbs calls return a positive errno (or -1 with errno set).
    let e = if rc > 0 { io::Error::from_raw_os_error(rc) } else { io::Error::last_os_error() };
    Error::io(format!("{call} on RDMA device {device}"), e)
}

fn mtu_bytes(m: sys::ibv_mtu) -> u32 {
    match m {
        sys::ibv_mtu_IBV_MTU_256 => 256,
        sys::ibv_mtu_IBV_MTU_512 => 512,
        sys::ibv_mtu_IBV_MTU_1024 => 1024,
        sys::ibv_mtu_IBV_MTU_2048 => 2048,
        _ => 4096,
    }
}

/// The largest IB MTU not above `bytes` (256 at least).
fn mtu_enum(bytes: u32) -> sys::ibv_mtu {
    match bytes {
        0..=511 => sys::ibv_mtu_IBV_MTU_256,
        512..=1023 => sys::ibv_mtu_IBV_MTU_512,
        1024..=2047 => sys::ibv_mtu_IBV_MTU_1024,
        2048..=4095 => sys::ibv_mtu_IBV_MTU_2048,
        _ => sys::ibv_mtu_IBV_MTU_4096,
    }
}

impl Verbs {
    /// Open `device` (or the only/first device), find the RoCEv2 GID of `ip` on `port`,
    /// register `slot_len * slots` bytes and create an RC QP of `depth` entries in INIT.
    pub(crate) fn open(
        device: Option<&str>,
        port: u8,
        ip: Ipv4Addr,
        slot_len: usize,
        slots: usize,
        depth: u32,
    ) -> Result<Verbs> {
        let mut v = Verbs {
            device: device.unwrap_or("?").to_string(),
            ctx: ptr::null_mut(),
            channel: ptr::null_mut(),
            pd: ptr::null_mut(),
            cq: ptr::null_mut(),
            qp: ptr::null_mut(),
            mr: ptr::null_mut(),
            buf: vec![0u8; slot_len * slots],
            port,
            gid_index: 0,
            active_mtu: 0,
            qpn: 0,
            wcs: vec![sys::ibv_wc::default(); MAX_POST],
            unacked_events: 0,
            pending: Vec::new(),
        };
        v.open_device(device)?;
        v.query_port()?;
        v.gid_index = v.find_gid(ip)?;
        // Safety: `ctx` is an open device context.
        v.pd = unsafe { sys::ibv_alloc_pd(v.ctx) };
        if v.pd.is_null() {
            return Err(os_err("ibv_alloc_pd", &v.device));
        }
        let access = sys::ibv_access_flags_IBV_ACCESS_LOCAL_WRITE as i32;
        // Safety: `buf` is a live allocation of `buf.len()` bytes that outlives the MR
        // (deregistered in Drop before `buf` is freed).
        v.mr =
            unsafe { sys::inccl_shim_reg_mr(v.pd, v.buf.as_mut_ptr().cast(), v.buf.len(), access) };
        if v.mr.is_null() {
            return Err(os_err("ibv_reg_mr", &v.device));
        }
        // Safety: valid context.
        v.channel = unsafe { sys::ibv_create_comp_channel(v.ctx) };
        if v.channel.is_null() {
            return Err(os_err("ibv_create_comp_channel", &v.device));
        }
        // Safety: a channel just created; its fd stays open until the channel is destroyed.
        let fd = unsafe { (*v.channel).fd };
        let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(|e| {
            Error::io(format!("fcntl on the completion channel of {}", v.device), e.into())
        })?;
        fcntl(fd, FcntlArg::F_SETFL(OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK)).map_err(
            |e| Error::io(format!("fcntl on the completion channel of {}", v.device), e.into()),
        )?;
        let cqe = i32::try_from(depth * 2).unwrap_or(i32::MAX);
        // Safety: valid context and completion channel, vector 0.
        v.cq = unsafe { sys::ibv_create_cq(v.ctx, cqe, ptr::null_mut(), v.channel, 0) };
        if v.cq.is_null() {
            return Err(os_err("ibv_create_cq", &v.device));
        }
        let mut init = sys::ibv_qp_init_attr {
            send_cq: v.cq,
            recv_cq: v.cq,
            qp_type: sys::ibv_qp_type_IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        init.cap.max_send_wr = depth;
        init.cap.max_recv_wr = depth;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // Safety: valid PD and a fully initialised attribute struct.
        v.qp = unsafe { sys::ibv_create_qp(v.pd, &mut init) };
        if v.qp.is_null() {
            return Err(os_err("ibv_create_qp", &v.device));
        }
        // Safety: `qp` was just created and is valid.
        v.qpn = unsafe { (*v.qp).qp_num };
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state_IBV_QPS_INIT,
            pkey_index: 0,
            port_num: v.port,
            qp_access_flags: access as u32,
            ..Default::default()
        };
        let mask = sys::ibv_qp_attr_mask_IBV_QP_STATE
            | sys::ibv_qp_attr_mask_IBV_QP_PKEY_INDEX
            | sys::ibv_qp_attr_mask_IBV_QP_PORT
            | sys::ibv_qp_attr_mask_IBV_QP_ACCESS_FLAGS;
        v.modify(&mut attr, mask, "ibv_modify_qp(INIT)")?;
        Ok(v)
    }

    fn open_device(&mut self, want: Option<&str>) -> Result<()> {
        let mut n = 0i32;
        // Safety: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(os_err("ibv_get_device_list", "(any)"));
        }
        let mut names = Vec::new();
        let mut chosen = None;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // Safety: the list holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // Safety: a valid device has a NUL-terminated name owned by the list.
            let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if chosen.is_none() && want.is_none_or(|w| w == name) {
                chosen = Some((dev, name.clone()));
            }
            names.push(name);
        }
        let result = match chosen {
            Some((dev, name)) => {
                self.device = name;
                // Safety: `dev` belongs to the still-allocated list.
                self.ctx = unsafe { sys::ibv_open_device(dev) };
                if self.ctx.is_null() {
                    Err(os_err("ibv_open_device", &self.device))
                } else {
                    Ok(())
                }
            }
            None => Err(Error::TransportUnavailable(match want {
                Some(w) => format!("RDMA device `{w}` (INCCL_IB_DEVICE) not found; devices: [{}]", names.join(", ")),
                None => "no RDMA device found (load rdma_rxe and `rdma link add`, or use INCCL_TRANSPORT=udp)".into(),
            })),
        };
        // Safety: `list` came from ibv_get_device_list; opened contexts stay valid.
        unsafe { sys::ibv_free_device_list(list) };
        result
    }

    fn query_port(&mut self) -> Result<()> {
        let mut attr = sys::ibv_port_attr::default();
        // Safety: valid context and out-pointer.
        let rc = unsafe { sys::inccl_shim_query_port(self.ctx, self.port, &mut attr) };
        if rc != 0 {
            return Err(rc_err(&format!("ibv_query_port(port {})", self.port), &self.device, rc));
        }
        if attr.state != sys::ibv_port_state_IBV_PORT_ACTIVE {
            return Err(Error::TransportUnavailable(format!(
                "port {} of RDMA device {} is not active (state {})",
                self.port, self.device, attr.state
            )));
        }
        self.active_mtu = mtu_bytes(attr.active_mtu);
        Ok(())
    }

    /// Index of the RoCEv2 GID `::ffff:ip` on the port.
    fn find_gid(&self, ip: Ipv4Addr) -> Result<u8> {
        let want = ip.to_ipv6_mapped().octets();
        let mut matches = Vec::new();
        for idx in 0..=255u8 {
            let mut gid = sys::ibv_gid::default();
            // Safety: valid context and out-pointer; out-of-range indices fail cleanly.
            let rc = unsafe { sys::ibv_query_gid(self.ctx, self.port, i32::from(idx), &mut gid) };
            if rc != 0 {
                break;
            }
            // Safety: every bit pattern of the 16-byte union is a valid `raw` array.
            if unsafe { gid.raw } == want {
                matches.push(idx);
            }
        }
        let path = |i: u8| {
            format!("/sys/class/infiniband/{}/ports/{}/gid_attrs/types/{i}", self.device, self.port)
        };
        let v2 = matches.iter().copied().find(|i| {
            std::fs::read_to_string(path(*i))
                .is_ok_and(|t| t.trim().eq_ignore_ascii_case("RoCE v2"))
        });
        // Without sysfs, the RoCEv2 entry follows the v1 entry of the same address.
        v2.or(matches.last().copied()).ok_or_else(|| {
            Error::Config(format!(
                "RDMA device {} port {} has no GID for data-plane address {ip} (is the device on the data-plane interface?)",
                self.device, self.port
            ))
        })
    }

    fn modify(&mut self, attr: &mut sys::ibv_qp_attr, mask: u32, what: &str) -> Result<()> {
        // Safety: valid QP; `attr` is initialised for every field named in `mask`.
        let rc = unsafe { sys::ibv_modify_qp(self.qp, attr, mask as i32) };
        if rc != 0 {
            return Err(rc_err(what, &self.device, rc));
        }
        Ok(())
    }

    /// QP number.
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Active path MTU of the port in bytes.
    pub(crate) fn active_mtu(&self) -> u32 {
        self.active_mtu
    }

    /// INIT → RTR → RTS against the switch QP.
    pub(crate) fn connect(
        &mut self,
        dest_qpn: u32,
        rq_psn: u32,
        sq_psn: u32,
        dgid: [u8; 16],
        mtu: u32,
    ) -> Result<()> {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state_IBV_QPS_RTR,
            path_mtu: mtu_enum(mtu.min(self.active_mtu)),
            dest_qp_num: dest_qpn,
            rq_psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        attr.ah_attr.is_global = 1;
        attr.ah_attr.port_num = self.port;
        attr.ah_attr.grh.hop_limit = 64;
        attr.ah_attr.grh.sgid_index = self.gid_index;
        attr.ah_attr.grh.dgid = sys::ibv_gid { raw: dgid };
        let mask = sys::ibv_qp_attr_mask_IBV_QP_STATE
            | sys::ibv_qp_attr_mask_IBV_QP_AV
            | sys::ibv_qp_attr_mask_IBV_QP_PATH_MTU
            | sys::ibv_qp_attr_mask_IBV_QP_DEST_QPN
            | sys::ibv_qp_attr_mask_IBV_QP_RQ_PSN
            | sys::ibv_qp_attr_mask_IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::ibv_qp_attr_mask_IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, mask, "ibv_modify_qp(RTR)")?;
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state_IBV_QPS_RTS,
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = sys::ibv_qp_attr_mask_IBV_QP_STATE
            | sys::ibv_qp_attr_mask_IBV_QP_SQ_PSN
            | sys::ibv_qp_attr_mask_IBV_QP_TIMEOUT
            | sys::ibv_qp_attr_mask_IBV_QP_RETRY_CNT
            | sys::ibv_qp_attr_mask_IBV_QP_RNR_RETRY
            | sys::ibv_qp_attr_mask_IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, mask, "ibv_modify_qp(RTS)")
    }

    /// The registered buffer.
    pub(crate) fn buf_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Address and key of `len` bytes at `off` of the registered buffer.
    fn sge(&self, off: usize, len: u32) -> sys::ibv_sge {
        assert!(off + len as usize <= self.buf.len(), "slot inside the registered buffer");
        // Safety: `mr` is a valid registration for the lifetime of `self`.
        let lkey = unsafe { (*self.mr).lkey };
        sys::ibv_sge { addr: self.buf.as_ptr() as u64 + off as u64, length: len, lkey }
    }

    /// Post receives of `len` bytes at each `(wr_id, offset)` in one chained call
    /// (at most [`MAX_POST`]).
    pub(crate) fn post_recvs(&mut self, recvs: &[(u64, usize)], len: u32) -> Result<()> {
        assert!(recvs.len() <= MAX_POST, "at most MAX_POST receives per call");
        let n = recvs.len();
        if n == 0 {
            return Ok(());
        }
        let mut sges = [sys::ibv_sge::default(); MAX_POST];
        let mut wrs = [sys::ibv_recv_wr::default(); MAX_POST];
        for (i, &(_, off)) in recvs.iter().enumerate() {
            sges[i] = self.sge(off, len);
        }
        for i in 0..n {
            wrs[i].wr_id = recvs[i].0;
            wrs[i].sg_list = &mut sges[i];
            wrs[i].num_sge = 1;
            if i + 1 < n {
                let next: *mut sys::ibv_recv_wr = &mut wrs[i + 1];
                wrs[i].next = next;
            }
        }
        let mut bad = ptr::null_mut();
        // Safety: a well-formed chain of `n` WRs whose SGEs point into the registered
        // buffer; the arrays outlive the call (the driver copies the WRs).
        let rc = unsafe { sys::inccl_shim_post_recv(self.qp, wrs.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(rc_err("ibv_post_recv", &self.device, rc));
        }
        Ok(())
    }

    /// Post sends `(wr_id, offset, len, imm)` in one chained call (at most
    /// [`MAX_POST`]); only the last is signalled unless `signal_all` (RC completes in
    /// order, so its completion implies the earlier ones).
    pub(crate) fn post_sends(
        &mut self,
        sends: &[(u64, usize, u32, Option<u32>)],
        signal_all: bool,
    ) -> Result<()> {
        assert!(sends.len() <= MAX_POST, "at most MAX_POST sends per call");
        let n = sends.len();
        if n == 0 {
            return Ok(());
        }
        let mut sges = [sys::ibv_sge::default(); MAX_POST];
        let mut wrs = [sys::ibv_send_wr::default(); MAX_POST];
        for (i, &(_, off, len, _)) in sends.iter().enumerate() {
            sges[i] = self.sge(off, len);
        }
        for i in 0..n {
            let (wr_id, _, _, imm) = sends[i];
            let wr = &mut wrs[i];
            wr.wr_id = wr_id;
            wr.sg_list = &mut sges[i];
            wr.num_sge = 1;
            wr.opcode = if imm.is_some() {
                sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM
            } else {
                sys::ibv_wr_opcode_IBV_WR_SEND
            };
            if signal_all || i + 1 == n {
                wr.send_flags = sys::ibv_send_flags_IBV_SEND_SIGNALED;
            }
            wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
            if i + 1 < n {
                let next: *mut sys::ibv_send_wr = &mut wrs[i + 1];
                wrs[i].next = next;
            }
        }
        let mut bad = ptr::null_mut();
        // Safety: a well-formed chain of `n` WRs whose SGEs point into the registered
        // buffer; the arrays outlive the call (the driver copies the WRs).
        let rc = unsafe { sys::inccl_shim_post_send(self.qp, wrs.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(rc_err("ibv_post_send", &self.device, rc));
        }
        Ok(())
    }

    /// Sleep until the CQ has a completion or `timeout` passes, without spinning:
    /// arm the CQ, re-check it (a completion may have raced the arming), then wait on
    /// the completion channel's fd. Returns true if woken by an event.
    pub(crate) fn wait(&mut self, timeout: std::time::Duration) -> Result<bool> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        // Safety: valid CQ created on our channel.
        let rc = unsafe { sys::inccl_shim_req_notify_cq(self.cq, 0) };
        if rc != 0 {
            return Err(rc_err("ibv_req_notify_cq", &self.device, rc));
        }
        let mut probe = Vec::with_capacity(MAX_POST);
        self.poll_into(&mut probe)?;
        if !probe.is_empty() {
            self.pending.extend(probe);
            return Ok(true);
        }
        // Safety: the channel's fd is open while `self` lives.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw((*self.channel).fd) };
        let ms = timeout.as_nanos().div_ceil(1_000_000).min(u128::from(u16::MAX)) as u16;
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => return Ok(false),
            Ok(_) => {}
            Err(e) => {
                return Err(Error::io(
                    format!("poll on the completion channel of {}", self.device),
                    e.into(),
                ))
            }
        }
        let mut cq = ptr::null_mut();
        let mut ctx = ptr::null_mut();
        // Safety: valid channel; out-pointers live; non-blocking fd, so no hang.
        let rc = unsafe { sys::ibv_get_cq_event(self.channel, &mut cq, &mut ctx) };
        if rc == 0 {
            self.unacked_events += 1;
            // Acknowledging takes a lock in the library: do it in batches.
            if self.unacked_events >= 64 {
                // Safety: `cq` is ours and these events were taken from its channel.
                unsafe { sys::ibv_ack_cq_events(self.cq, self.unacked_events) };
                self.unacked_events = 0;
            }
        }
        Ok(true)
    }

    /// Poll up to [`MAX_POST`] completions into `out`; a failed completion is an error
    /// naming its status and request.
    pub(crate) fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        out.append(&mut self.pending);
        if out.is_empty() {
            self.poll_into(out)?;
        }
        Ok(())
    }

    fn poll_into(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        let wcs = &mut self.wcs;
        // Safety: valid CQ; `wcs` has room for `wcs.len()` entries.
        let n = unsafe { sys::inccl_shim_poll_cq(self.cq, wcs.len() as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(rc_err("ibv_poll_cq", &self.device, -n));
        }
        for wc in &self.wcs[..n as usize] {
            if wc.status != sys::ibv_wc_status_IBV_WC_SUCCESS {
                return Err(Error::Collective {
                    rank: 0,
                    comm_id: 0,
                    reason: format!(
                        "RDMA device {}: work request {} completed with status {} (vendor error {:#x})",
                        self.device, wc.wr_id, wc.status, wc.vendor_err
                    ),
                });
            }
            let recv = wc.opcode & sys::ibv_wc_opcode_IBV_WC_RECV != 0;
            let imm = (wc.wc_flags & sys::ibv_wc_flags_IBV_WC_WITH_IMM != 0)
                // Safety: with IBV_WC_WITH_IMM the union holds the immediate.
                .then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data }));
            out.push(Completion { wr_id: wc.wr_id, recv, len: wc.byte_len, imm });
        }
        Ok(())
    }
}

impl Drop for Verbs {
    fn drop(&mut self) {
        // Safety: each object is destroyed once, children before parents; null
        // pointers (partial construction) are skipped.
        unsafe {
            if !self.qp.is_null() {
                sys::ibv_destroy_qp(self.qp);
            }
            if !self.cq.is_null() {
                if self.unacked_events > 0 {
                    sys::ibv_ack_cq_events(self.cq, self.unacked_events);
                }
                sys::ibv_destroy_cq(self.cq);
            }
            if !self.channel.is_null() {
                sys::ibv_destroy_comp_channel(self.channel);
            }
            if !self.mr.is_null() {
                sys::ibv_dereg_mr(self.mr);
            }
            if !self.pd.is_null() {
                sys::ibv_dealloc_pd(self.pd);
            }
            if !self.ctx.is_null() {
                sys::ibv_close_device(self.ctx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_mapping_rounds_down_to_a_valid_ib_mtu() {
        assert_eq!(mtu_bytes(mtu_enum(1024)), 1024);
        assert_eq!(mtu_bytes(mtu_enum(1500)), 1024);
        assert_eq!(mtu_bytes(mtu_enum(4096)), 4096);
        assert_eq!(mtu_bytes(mtu_enum(100)), 256);
    }

    #[test]
    fn a_missing_device_is_a_clear_error() {
        let e = Verbs::open(Some("inccl-no-such-dev"), 1, Ipv4Addr::LOCALHOST, 4096, 4, 4)
            .unwrap_err()
            .to_string();
        // Either no verbs support at all here, or the device list lacks the name.
        assert!(e.contains("inccl-no-such-dev") || e.contains("ibv_get_device_list"), "{e}");
    }
}
