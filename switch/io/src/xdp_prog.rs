//! The XDP program of the AF_XDP backend, assembled here (no object file, no clang):
//! it redirects ARP and IPv4/UDP frames to the listed destination ports into the XSK
//! of the receive queue and passes everything else to the kernel stack.
//!
//! Loading uses the `bpf()` system call directly (map create, program load, map update,
//! link create). The program is attached with a BPF link: the kernel detaches it when
//! the link's last fd closes, so a switch that crashes or is killed leaves nothing
//! behind. A program attached the old way (netlink, e.g. `ip link set dev X xdp ...`)
//! makes link creation fail with EBUSY; it is then removed through netlink, logged,
//! and the link created again.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tracing::{debug, warn};

/// `enum bpf_cmd` values used here.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type`: BPF_XDP.
const BPF_XDP: u32 = 37;
/// The program only reads the first frame fragment: allow multi-buffer frames so that
/// native mode attaches on veth with a jumbo MTU.
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_PASS: i32 = 2;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
/// Receive queues the map has room for (the socket is bound to queue 0).
const XSKMAP_ENTRIES: u32 = 64;

/// How the program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver (veth supports it): frames skip the socket buffer allocation.
    Native,
    /// Generic (SKB) mode: after the socket buffer exists; works on every device.
    Generic,
}

impl XdpMode {
    /// `native` or `generic`.
    pub fn as_str(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
        }
    }

    fn flags(self) -> u32 {
        match self {
            XdpMode::Native => XDP_FLAGS_DRV_MODE,
            XdpMode::Generic => XDP_FLAGS_SKB_MODE,
        }
    }
}

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// A jump target, resolved when the program is finished.
#[derive(Debug, Clone, Copy)]
enum Label {
    Redirect,
    Pass,
}

/// Tiny assembler: just the instructions the program needs.
#[derive(Debug, Default)]
struct Asm {
    insns: Vec<Insn>,
    fixups: Vec<(usize, Label)>,
}

// Opcodes (linux/bpf.h): class | op | source.
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const ADD64_X: u8 = 0x0f;
const AND64_K: u8 = 0x57;
const LSH64_K: u8 = 0x67;
const JA: u8 = 0x05;
const JEQ_K: u8 = 0x15;
const JNE_K: u8 = 0x55;
const JLT_K: u8 = 0xa5;
const JGT_X: u8 = 0x2d;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const LD_IMM64: u8 = 0x18;
const PSEUDO_MAP_FD: u8 = 1;

impl Asm {
    fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(Insn { code, regs: (src << 4) | dst, off, imm });
    }
    fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: Label) {
        self.fixups.push((self.insns.len(), to));
        self.op(code, dst, src, 0, imm);
    }
    fn finish(mut self, redirect: usize, pass: usize) -> Vec<Insn> {
        for (at, label) in self.fixups {
            let target = match label {
                Label::Redirect => redirect,
                Label::Pass => pass,
            };
            self.insns[at].off = (target as isize - at as isize - 1) as i16;
        }
        self.insns
    }
}

/// A 16-bit big-endian header field as a native-order `LDX_H` reads it.
fn wire16(v: u16) -> i32 {
    i32::from(u16::from_ne_bytes(v.to_be_bytes()))
}

/// The program: ARP or IPv4/UDP with a destination port in `udp_ports` →
/// `bpf_redirect_map(xsks, rx_queue_index, XDP_PASS)`; anything else → XDP_PASS.
fn program(map_fd: RawFd, udp_ports: &[u16]) -> Vec<Insn> {
    let mut a = Asm::default();
    // r6 = ctx; r2 = data; r3 = data_end (struct xdp_md).
    a.op(MOV64_X, 6, 1, 0, 0);
    a.op(LDX_W, 2, 6, 0, 0);
    a.op(LDX_W, 3, 6, 4, 0);
    // Ethernet header present?
    a.op(MOV64_X, 4, 2, 0, 0);
    a.op(ADD64_K, 4, 0, 0, 14);
    a.jump(JGT_X, 4, 3, 0, Label::Pass);
    a.op(LDX_H, 5, 2, 12, 0);
    a.jump(JEQ_K, 5, 0, wire16(0x0806), Label::Redirect);
    a.jump(JNE_K, 5, 0, wire16(0x0800), Label::Pass);
    // Fixed IPv4 header present and protocol UDP?
    a.op(MOV64_X, 4, 2, 0, 0);
    a.op(ADD64_K, 4, 0, 0, 34);
    a.jump(JGT_X, 4, 3, 0, Label::Pass);
    a.op(LDX_B, 5, 2, 23, 0);
    a.jump(JNE_K, 5, 0, 17, Label::Pass);
    // r5 = IHL * 4 (20..=60); r4 = data + r5; UDP header inside the frame?
    a.op(LDX_B, 5, 2, 14, 0);
    a.op(AND64_K, 5, 0, 0, 0x0f);
    a.op(LSH64_K, 5, 0, 0, 2);
    a.jump(JLT_K, 5, 0, 20, Label::Pass);
    a.op(MOV64_X, 4, 2, 0, 0);
    a.op(ADD64_X, 4, 5, 0, 0);
    a.op(MOV64_X, 7, 4, 0, 0);
    a.op(ADD64_K, 7, 0, 0, 14 + 8);
    a.jump(JGT_X, 7, 3, 0, Label::Pass);
    a.op(LDX_H, 5, 4, 14 + 2, 0);
    for &p in udp_ports {
        a.jump(JEQ_K, 5, 0, wire16(p), Label::Redirect);
    }
    a.jump(JA, 0, 0, 0, Label::Pass);
    let redirect = a.insns.len();
    a.op(LDX_W, 2, 6, 16, 0); // rx_queue_index
    a.op(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map_fd);
    a.op(0, 0, 0, 0, 0);
    a.op(MOV64_K, 3, 0, 0, XDP_PASS);
    a.op(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP);
    a.op(EXIT, 0, 0, 0, 0);
    let pass = a.insns.len();
    a.op(MOV64_K, 0, 0, 0, XDP_PASS);
    a.op(EXIT, 0, 0, 0, 0);
    a.finish(redirect, pass)
}

/// `bpf(cmd, attr, size)` returning a new fd or 0.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // Safety: `attr` is a live, properly laid out prefix of `union bpf_attr` for `cmd`
    // (the kernel zero-extends shorter attrs); its size is passed.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>() as u32)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // Safety: `fd` was just returned by bpf() as a new descriptor owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

fn name16(s: &str) -> [u8; 16] {
    let mut n = [0u8; 16];
    for (d, b) in n.iter_mut().zip(s.bytes().take(15)) {
        *d = b;
    }
    n
}

/// A loaded program with its XSK map; attach with [`XdpProgram::attach`].
#[derive(Debug)]
pub struct XdpProgram {
    map: OwnedFd,
    prog: OwnedFd,
}

impl XdpProgram {
    /// Create the map and load the program for `udp_ports`.
    pub fn load(udp_ports: &[u16]) -> io::Result<Self> {
        #[repr(C)]
        struct MapCreate {
            map_type: u32,
            key_size: u32,
            value_size: u32,
            max_entries: u32,
            map_flags: u32,
            inner_map_fd: u32,
            numa_node: u32,
            map_name: [u8; 16],
        }
        let mut mc = MapCreate {
            map_type: BPF_MAP_TYPE_XSKMAP,
            key_size: 4,
            value_size: 4,
            max_entries: XSKMAP_ENTRIES,
            map_flags: 0,
            inner_map_fd: 0,
            numa_node: 0,
            map_name: name16("inc_xsks"),
        };
        let map = owned(bpf(BPF_MAP_CREATE, &mut mc)?);
        let insns = program(map.as_raw_fd(), udp_ports);
        #[repr(C)]
        struct ProgLoad {
            prog_type: u32,
            insn_cnt: u32,
            insns: u64,
            license: u64,
            log_level: u32,
            log_size: u32,
            log_buf: u64,
            kern_version: u32,
            prog_flags: u32,
            prog_name: [u8; 16],
            prog_ifindex: u32,
            expected_attach_type: u32,
        }
        let license = c"GPL";
        let mut log = vec![0u8; 64 * 1024];
        let mut load = |log_level: u32| {
            let mut pl = ProgLoad {
                prog_type: BPF_PROG_TYPE_XDP,
                insn_cnt: insns.len() as u32,
                insns: insns.as_ptr() as u64,
                license: license.as_ptr() as u64,
                log_level,
                log_size: if log_level > 0 { log.len() as u32 } else { 0 },
                log_buf: if log_level > 0 { log.as_mut_ptr() as u64 } else { 0 },
                kern_version: 0,
                prog_flags: BPF_F_XDP_HAS_FRAGS,
                prog_name: name16("inc_xsk_redir"),
                prog_ifindex: 0,
                expected_attach_type: BPF_XDP,
            };
            bpf(BPF_PROG_LOAD, &mut pl)
        };
        let prog = match load(0) {
            Ok(fd) => owned(fd),
            Err(e) => {
                // Load again with the verifier log, for the error message.
                let _ = load(1);
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                return Err(io::Error::new(e.kind(), format!("{e}; verifier: {text}")));
            }
        };
        Ok(XdpProgram { map, prog })
    }

    /// The program's fd (to attach it by other means, as tests do).
    pub fn prog_fd(&self) -> RawFd {
        self.prog.as_raw_fd()
    }

    /// Point map entry `queue` at socket `xsk_fd`.
    pub fn set_socket(&self, queue: u32, xsk_fd: RawFd) -> io::Result<()> {
        #[repr(C)]
        struct MapElem {
            map_fd: u32,
            pad: u32,
            key: u64,
            value: u64,
            flags: u64,
        }
        let key = queue;
        let value = xsk_fd as u32;
        let mut me = MapElem {
            map_fd: self.map.as_raw_fd() as u32,
            pad: 0,
            key: &key as *const u32 as u64,
            value: &value as *const u32 as u64,
            flags: 0,
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut me).map(drop)
    }

    /// Attach to `ifindex` (in the calling thread's namespace): native mode first, then
    /// generic. Replaces a program a previous run attached through netlink (logged).
    /// The returned link keeps the program attached until it is dropped.
    pub fn attach(&self, ifindex: u32, label: &str) -> io::Result<(OwnedFd, XdpMode)> {
        self.attach_first(ifindex, label, &[XdpMode::Native, XdpMode::Generic])
    }

    /// Like [`XdpProgram::attach`], in `mode` only.
    pub fn attach_mode(
        &self,
        ifindex: u32,
        label: &str,
        mode: XdpMode,
    ) -> io::Result<(OwnedFd, XdpMode)> {
        self.attach_first(ifindex, label, &[mode])
    }

    fn attach_first(
        &self,
        ifindex: u32,
        label: &str,
        modes: &[XdpMode],
    ) -> io::Result<(OwnedFd, XdpMode)> {
        let mut replaced = false;
        let mut last = None;
        for &mode in modes {
            match self.link(ifindex, mode) {
                Ok(fd) => return Ok((fd, mode)),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && !replaced => {
                    warn!(iface = label, "replacing an XDP program left on the interface");
                    replaced = true;
                    for m in [XdpMode::Native, XdpMode::Generic] {
                        let _ = netlink_detach(ifindex, m);
                    }
                    match self.link(ifindex, mode) {
                        Ok(fd) => return Ok((fd, mode)),
                        Err(e) => last = Some(e),
                    }
                }
                Err(e) => {
                    debug!(iface = label, mode = mode.as_str(), error = %e, "XDP attach failed");
                    last = Some(e)
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no XDP mode tried")))
    }

    fn link(&self, ifindex: u32, mode: XdpMode) -> io::Result<OwnedFd> {
        #[repr(C)]
        struct LinkCreate {
            prog_fd: u32,
            target_ifindex: u32,
            attach_type: u32,
            flags: u32,
        }
        let mut lc = LinkCreate {
            prog_fd: self.prog.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: BPF_XDP,
            flags: mode.flags(),
        };
        bpf(BPF_LINK_CREATE, &mut lc).map(owned)
    }
}

/// Remove a netlink-attached XDP program of `mode` from `ifindex`
/// (RTM_SETLINK with IFLA_XDP { IFLA_XDP_FD = -1, IFLA_XDP_FLAGS = mode }).
pub fn netlink_detach(ifindex: u32, mode: XdpMode) -> io::Result<()> {
    netlink_set_xdp(ifindex, -1, mode)
}

/// Attach (`fd` >= 0) or detach (`fd` = -1) an XDP program the old way, through
/// netlink: what `ip link set dev X xdp...` does. The backend only detaches with it;
/// tests use it to leave a program behind like a crashed tool would.
pub fn netlink_set_xdp(ifindex: u32, fd: RawFd, mode: XdpMode) -> io::Result<()> {
    const IFLA_XDP: u16 = 43;
    const IFLA_XDP_FD: u16 = 1;
    const IFLA_XDP_FLAGS: u16 = 3;
    const NLA_F_NESTED: u16 = 1 << 15;
    // nlmsghdr (16) + ifinfomsg (16) + IFLA_XDP (4) + FD (8) + FLAGS (8).
    let mut msg = [0u8; 52];
    let put16 = |m: &mut [u8], at: usize, v: u16| m[at..at + 2].copy_from_slice(&v.to_ne_bytes());
    let put32 = |m: &mut [u8], at: usize, v: u32| m[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    put32(&mut msg, 0, 52);
    put16(&mut msg, 4, libc::RTM_SETLINK);
    put16(&mut msg, 6, (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16);
    put32(&mut msg, 8, 1);
    msg[16] = libc::AF_UNSPEC as u8;
    put32(&mut msg, 20, ifindex);
    put16(&mut msg, 32, 20);
    put16(&mut msg, 34, IFLA_XDP | NLA_F_NESTED);
    put16(&mut msg, 36, 8);
    put16(&mut msg, 38, IFLA_XDP_FD);
    put32(&mut msg, 40, fd as u32);
    put16(&mut msg, 44, 8);
    put16(&mut msg, 46, IFLA_XDP_FLAGS);
    put32(&mut msg, 48, mode.flags());

    // Safety: plain syscall; the fd is checked and owned below.
    let raw = unsafe {
        libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE)
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // Safety: `raw` is a fresh descriptor owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // Safety: `msg` is a complete netlink message of the length passed; no address
    // (the socket is unbound: the kernel is the default destination).
    let rc = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut reply = [0u8; 256];
    // Safety: `reply` is writable for its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), reply.as_mut_ptr().cast(), reply.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // NLMSG_ERROR: header, then the error code (0 = ACK).
    if n >= 20 && u16::from_ne_bytes([reply[4], reply[5]]) == libc::NLMSG_ERROR as u16 {
        let err = i32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
        if err != 0 {
            return Err(io::Error::from_raw_os_error(-err));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_on_the_redirect_and_pass_blocks() {
        let insns = program(3, &[4791, 5000]);
        let exits: Vec<usize> =
            insns.iter().enumerate().filter(|(_, i)| i.code == EXIT).map(|(n, _)| n).collect();
        assert_eq!(exits.len(), 2);
        let pass = exits[0] + 1;
        let redirect = insns.iter().position(|i| i.code == LDX_W && i.off == 16).unwrap();
        for (n, i) in insns.iter().enumerate() {
            if matches!(i.code, JA | JEQ_K | JNE_K | JLT_K | JGT_X) {
                let to = (n as isize + 1 + i.off as isize) as usize;
                assert!(to == pass || to == redirect, "insn {n} jumps to {to}");
            }
        }
        // Both ports compared in wire order.
        let ports: Vec<i32> =
            insns.iter().filter(|i| i.code == JEQ_K && i.regs == 5).map(|i| i.imm).collect();
        assert_eq!(ports, vec![wire16(0x0806), wire16(4791), wire16(5000)]);
    }
}
