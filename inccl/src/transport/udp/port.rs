//! One RoCEv2 UDP socket per process and data-plane IP, bound to the RoCEv2 port 4791
//! and shared by every QP of the process; received datagrams are demultiplexed by the
//! BTH destination QPN, as a RoCE NIC does. Switches therefore always send to 4791, to
//! userspace hosts exactly as to kernel RoCE (rxe) and hardware NICs.
//!
//! Whichever thread reads the socket (a collective's caller or a progress thread)
//! handles the datagrams of its own QP in place and copies those of the process's other
//! QPs into their [`Inbox`], waking their owner. A second process on the same IP finds
//! 4791 taken and falls back to a port of its own (registered with the controller, so
//! it still works, but frames to it are not on the RoCEv2 port); see the crate README.
//!
//! "Per data-plane IP" means per network namespace and IP: threads of one process can
//! sit in different namespaces (`unshare`/`setns` act on the calling thread), and the
//! same address can exist in several of them, as when one process emulates several
//! hosts of one topology. A socket is bound in the namespace of the thread that creates
//! it, so a QP opened in another namespace with the same IP gets a socket of its own
//! (see [`NetNs`]). Found by IP alone, the other namespace's socket would send to that
//! namespace's switch and never receive what its own switch sends to it: issue \[12\],
//! where tests running in parallel threads, each with the 1-2-4 topology in a namespace
//! of its own, lost their RC connections ("retransmission retries exhausted").

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use inc_wire::ROCEV2_PORT;
use tracing::{trace, warn};

use super::HEADERS;

/// Datagrams an inbox holds before it drops (the RC retransmission recovers them).
const INBOX_LIMIT: usize = 8192;

/// The shared socket of one data-plane IP in this process.
#[derive(Debug)]
pub(crate) struct SharedPort {
    sock: Arc<UdpSocket>,
    local: SocketAddrV4,
    inboxes: Mutex<HashMap<u32, Arc<Inbox>>>,
    /// Datagrams for a QPN no QP of this process has (e.g. retransmissions to a QP
    /// already destroyed).
    stray: AtomicU64,
}

/// Live shared ports of this process.
static PORTS: Mutex<Vec<(PortKey, Weak<SharedPort>)>> = Mutex::new(Vec::new());

/// What a [`SharedPort`] is shared by: the network namespace it was bound in and its IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PortKey {
    netns: Option<NetNs>,
    ip: Ipv4Addr,
}

/// A network namespace, named as the kernel names it: the device and inode of a
/// thread's `/proc/thread-self/ns/net` (what `ip netns identify` compares).
///
/// A live [`SharedPort`]'s socket holds a reference to its namespace, so the namespace
/// and with it its inode number cannot be freed and reused while [`PORTS`] can still
/// hand that port out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NetNs {
    dev: u64,
    ino: u64,
}

impl NetNs {
    /// The calling thread's network namespace (`/proc/self` would be the main
    /// thread's). `None` where `/proc` does not say (not mounted): every such thread
    /// then counts as one namespace, which is right for a process whose threads all
    /// share one, the usual case.
    fn current() -> Option<NetNs> {
        let m = std::fs::metadata("/proc/thread-self/ns/net").ok()?;
        Some(NetNs { dev: m.dev(), ino: m.ino() })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent; a panic elsewhere does not
    // poison it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SharedPort {
    /// The process's socket on `ip` in the calling thread's network namespace: bound
    /// to `ip:4791` on first use, then shared. If another process holds 4791 on `ip`, a
    /// port of its own (with a warning).
    pub(crate) fn get(
        ip: Ipv4Addr,
        bind: impl Fn(u16) -> io::Result<UdpSocket>,
    ) -> io::Result<Arc<Self>> {
        let key = PortKey { netns: NetNs::current(), ip };
        let mut ports = lock(&PORTS);
        ports.retain(|(_, w)| w.strong_count() > 0);
        if let Some(p) = ports.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade()) {
            return Ok(p);
        }
        let sock = match bind(ROCEV2_PORT) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                let s = bind(0)?;
                warn!(
                    %ip,
                    port = s.local_addr().map(|a| a.port()).unwrap_or(0),
                    "UDP {ip}:{ROCEV2_PORT} is taken by another process; this process receives \
                     RoCEv2 on a port of its own (not decoded as RoCE by packet analysers)"
                );
                s
            }
            Err(e) => return Err(e),
        };
        let local = match sock.local_addr()? {
            std::net::SocketAddr::V4(a) => a,
            std::net::SocketAddr::V6(a) => {
                return Err(io::Error::other(format!("socket bound to non-IPv4 {a}")))
            }
        };
        let port = Arc::new(SharedPort {
            sock: Arc::new(sock),
            local,
            inboxes: Mutex::new(HashMap::new()),
            stray: AtomicU64::new(0),
        });
        ports.push((key, Arc::downgrade(&port)));
        Ok(port)
    }

    /// The socket (shared by every QP on this port).
    pub(crate) fn socket(&self) -> &Arc<UdpSocket> {
        &self.sock
    }

    /// Bound address.
    pub(crate) fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }

    /// Attach a QP with a QPN drawn by `draw` until it is unused on this port.
    pub(crate) fn attach(
        self: &Arc<Self>,
        mut draw: impl FnMut() -> u32,
    ) -> io::Result<Attachment> {
        let inbox = Arc::new(Inbox::new()?);
        let mut map = lock(&self.inboxes);
        let qpn = loop {
            let q = draw();
            if !map.contains_key(&q) {
                break q;
            }
        };
        map.insert(qpn, inbox.clone());
        Ok(Attachment { port: self.clone(), qpn, inbox })
    }

    /// Hand a datagram (`datagram` = BTH..ICRC, sent with IPv4 ID `ident`) for another
    /// QP of this process to it.
    fn forward(&self, from: SocketAddrV4, ident: u16, datagram: &[u8]) {
        let inbox = dest_qpn(datagram).and_then(|q| lock(&self.inboxes).get(&q).cloned());
        match inbox {
            Some(inbox) => inbox.push(from, ident, datagram),
            None => {
                self.stray.fetch_add(1, Ordering::Relaxed);
                trace!(%from, qpn = ?dest_qpn(datagram), "datagram for no QP of this process");
            }
        }
    }

    /// Datagrams that arrived for no QP of this process.
    pub(crate) fn stray(&self) -> u64 {
        self.stray.load(Ordering::Relaxed)
    }
}

/// Destination QPN of a RoCEv2 datagram (BTH bytes 5..8).
pub(crate) fn dest_qpn(datagram: &[u8]) -> Option<u32> {
    datagram.get(5..8).map(|b| u32::from_be_bytes([0, b[0], b[1], b[2]]))
}

/// A datagram another thread received for a QP.
#[derive(Debug)]
pub(crate) struct Forwarded {
    /// Sender.
    pub from: SocketAddrV4,
    /// IPv4 ID it had on the wire (segments of a UDP GRO datagram count up from 0).
    pub ident: u16,
    /// [`HEADERS`] bytes of headroom, then the datagram.
    pub frame: Vec<u8>,
}

/// Datagrams another thread received for one QP, and the wake-up of its owner.
#[derive(Debug)]
pub(crate) struct Inbox {
    /// Each frame has [`HEADERS`] bytes of headroom before the datagram, for the
    /// rebuilt Ethernet/IPv4/UDP headers.
    queue: Mutex<VecDeque<Forwarded>>,
    dropped: AtomicU64,
    wake_tx: UnixDatagram,
    wake_rx: UnixDatagram,
}

impl Inbox {
    fn new() -> io::Result<Inbox> {
        let (wake_tx, wake_rx) = UnixDatagram::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        Ok(Inbox {
            queue: Mutex::new(VecDeque::new()),
            dropped: AtomicU64::new(0),
            wake_tx,
            wake_rx,
        })
    }

    fn push(&self, from: SocketAddrV4, ident: u16, datagram: &[u8]) {
        let mut q = lock(&self.queue);
        if q.len() >= INBOX_LIMIT {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut frame = vec![0; HEADERS + datagram.len()];
        frame[HEADERS..].copy_from_slice(datagram);
        let was_empty = q.is_empty();
        q.push_back(Forwarded { from, ident, frame });
        drop(q);
        if was_empty {
            self.wake();
        }
    }

    /// Make the owner's next wait return.
    pub(crate) fn wake(&self) {
        // A full wake-up socket already wakes the owner.
        self.wake_tx.send(&[1]).ok();
    }

    /// Readable when there is something to drain (or a stop request).
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake_rx.as_fd()
    }

    /// Take every queued frame.
    fn take(&self) -> VecDeque<Forwarded> {
        let mut b = [0u8; 64];
        while matches!(self.wake_rx.recv(&mut b), Ok(n) if n > 0) {}
        std::mem::take(&mut *lock(&self.queue))
    }

    /// Frames dropped because the inbox was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// One QP's place on a [`SharedPort`]; detaches on drop.
#[derive(Debug)]
pub(crate) struct Attachment {
    port: Arc<SharedPort>,
    qpn: u32,
    inbox: Arc<Inbox>,
}

impl Attachment {
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    pub(crate) fn port(&self) -> &SharedPort {
        &self.port
    }

    pub(crate) fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    pub(crate) fn inbox_handle(&self) -> Arc<Inbox> {
        self.inbox.clone()
    }

    /// Sort one received frame (`frame[HEADERS..]` is the datagram, sent with IPv4 ID
    /// `ident`): true if it is this QP's, otherwise it is handed to its QP (or counted
    /// as stray).
    pub(crate) fn is_mine(&self, from: SocketAddrV4, ident: u16, frame: &[u8]) -> bool {
        let datagram = &frame[HEADERS..];
        if dest_qpn(datagram) == Some(self.qpn) {
            return true;
        }
        self.port.forward(from, ident, datagram);
        false
    }

    /// Frames other threads received for this QP.
    pub(crate) fn take_forwarded(&self) -> VecDeque<Forwarded> {
        self.inbox.take()
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        lock(&self.port.inboxes).remove(&self.qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(qpn: u32) -> Vec<u8> {
        let mut d = vec![0u8; 16];
        d[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        d
    }

    #[test]
    fn frames_go_to_the_qp_they_name() {
        let ip = Ipv4Addr::LOCALHOST;
        let port =
            SharedPort::get(ip, |p| UdpSocket::bind(SocketAddrV4::new(ip, p))).expect("bind");
        let again =
            SharedPort::get(ip, |p| UdpSocket::bind(SocketAddrV4::new(ip, p))).expect("bind");
        assert!(Arc::ptr_eq(&port, &again), "one socket per IP and process");
        let mut qpns = [0x10u32, 0x10, 0x20].into_iter();
        let a = port.attach(|| qpns.next().unwrap()).unwrap();
        let b = port.attach(|| qpns.next().unwrap()).unwrap();
        assert_eq!((a.qpn(), b.qpn()), (0x10, 0x20), "a QPN in use is drawn again");
        let from = SocketAddrV4::new(ip, 0xC001);
        let mut frame = vec![0u8; HEADERS];
        frame.extend(datagram(0x20));
        assert!(!a.is_mine(from, 3, &frame));
        assert!(b.is_mine(from, 3, &frame));
        let got = b.take_forwarded();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].from, got[0].ident), (from, 3));
        assert_eq!(&got[0].frame[HEADERS..], &datagram(0x20)[..]);
        assert!(b.take_forwarded().is_empty());
        frame.truncate(HEADERS);
        frame.extend(datagram(0x30));
        assert!(!a.is_mine(from, 0, &frame));
        assert_eq!(port.stray(), 1);
        drop(b);
        frame.truncate(HEADERS);
        frame.extend(datagram(0x20));
        assert!(!a.is_mine(from, 0, &frame));
        assert_eq!(port.stray(), 2, "a detached QP receives nothing");
    }

    #[test]
    fn each_network_namespace_has_a_socket_of_its_own() {
        // The IP is only the key here: bind wherever any namespace can.
        let ip = Ipv4Addr::new(192, 0, 2, 1);
        let bind = |_| UdpSocket::bind("0.0.0.0:0");
        let here = SharedPort::get(ip, bind).expect("bind");
        let there = std::thread::spawn(move || {
            // The new namespace is this thread's only, and goes with its socket.
            if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
                inc_test_support::skip(
                    "udp::port namespaces",
                    &format!("cannot create a network namespace ({e}); run the tests as root"),
                );
                return None;
            }
            let there = SharedPort::get(ip, bind).expect("bind");
            let again = SharedPort::get(ip, bind).expect("bind");
            assert!(Arc::ptr_eq(&there, &again), "one socket per IP in a namespace");
            Some(there)
        })
        .join()
        .expect("namespace thread");
        let Some(there) = there else { return };
        assert!(!Arc::ptr_eq(&here, &there), "the same IP in two namespaces: two sockets");
        assert!(Arc::ptr_eq(&here, &SharedPort::get(ip, bind).expect("bind")));
    }
}
