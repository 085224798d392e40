//! pcap backend: one libpcap live handle per port (through the `pcap` crate), opened
//! inside the port's network namespace, in immediate mode with a BPF filter that keeps
//! only what the switch handles (ARP and UDP to the RoCEv2 port), non-blocking, its
//! selectable fd in one epoll with the other ports and the waker. Transmit is
//! `pcap_sendpacket`, one call per frame (libpcap has no batched send); frames are still
//! queued and flushed per batch like every backend.
//!
//! This is the portable baseline the issue compares against: libpcap on Linux is itself
//! a TPACKET ring underneath, plus a per-frame copy-free callback and per-frame sends.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use pcap::{Active, Capture, Direction};
use tracing::{debug, warn};

use crate::backend::{
    Backend, IoError, PortCounters, PortDesc, PortSpec, RxRotation, TxStaging, Waker,
};
use crate::sys::{self, Epoll, EventFd};

/// UDP destination port of RoCEv2: the only port the switch engine accepts.
pub const ROCE_UDP_PORT: u16 = 4791;

/// Handle geometry and filter.
#[derive(Debug, Clone)]
pub struct PcapConfig {
    /// Kernel buffer per handle in bytes (`pcap_set_buffer_size`).
    pub buffer_size: i32,
    /// Bytes captured per frame (`pcap_set_snaplen`); longer frames are counted as
    /// truncated and dropped, never handed on cut.
    pub snaplen: i32,
    /// UDP destination ports let through besides ARP (4791 is always included).
    pub udp_ports: Vec<u16>,
    /// Frames per transmit batch.
    pub tx_batch: usize,
    /// Largest frame transmitted (bytes).
    pub max_frame: usize,
    /// Promiscuous mode.
    pub promiscuous: bool,
}

impl Default for PcapConfig {
    fn default() -> Self {
        PcapConfig {
            buffer_size: 4 << 20,
            snaplen: 9216,
            udp_ports: Vec::new(),
            tx_batch: 64,
            max_frame: 9216,
            promiscuous: true,
        }
    }
}

impl PcapConfig {
    /// The BPF filter expression: ARP, or UDP to one of the ports.
    pub fn filter(&self) -> String {
        let mut ports = vec![ROCE_UDP_PORT];
        ports.extend(self.udp_ports.iter().copied().filter(|p| *p != ROCE_UDP_PORT));
        let udp: Vec<String> = ports.iter().map(|p| format!("udp dst port {p}")).collect();
        format!("arp or ({})", udp.join(" or "))
    }
}

struct PcapPort {
    cap: Capture<Active>,
    label: String,
    /// Kernel drops reported by `pcap_stats` at the last query.
    drops: u64,
}

impl std::fmt::Debug for PcapPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapPort").field("label", &self.label).finish()
    }
}

/// The pcap backend.
#[derive(Debug)]
pub struct PcapBackend {
    config: PcapConfig,
    ports: Vec<PortDesc>,
    handles: Vec<PcapPort>,
    counters: Vec<PortCounters>,
    epoll: Epoll,
    wake: Arc<EventFd>,
    /// Frames written and committed since the last flush.
    tx: TxStaging,
    rx_rotation: RxRotation,
    /// Ports that returned a full budget last round (worth reading without waiting).
    maybe_ready: bool,
}

fn pcap_err(op: &'static str, spec: &PortSpec) -> impl FnOnce(pcap::Error) -> IoError {
    let iface = spec.label();
    move |e| IoError::Interface { op, iface, source: std::io::Error::other(e.to_string()) }
}

/// Open and configure one handle. Runs inside the port's namespace.
fn open_port(spec: &PortSpec, cfg: &PcapConfig) -> Result<(PcapPort, PortDesc), IoError> {
    let cap = Capture::from_device(spec.ifname.as_str())
        .map_err(pcap_err("pcap_create", spec))?
        .immediate_mode(true)
        .promisc(cfg.promiscuous)
        .snaplen(cfg.snaplen)
        .buffer_size(cfg.buffer_size)
        .open()
        .map_err(pcap_err("pcap_activate", spec))?;
    let mut cap = cap.setnonblock().map_err(pcap_err("pcap_setnonblock", spec))?;
    // Frames the switch sent itself must not come back as input.
    cap.direction(Direction::In).map_err(pcap_err("pcap_setdirection", spec))?;
    cap.filter(&cfg.filter(), true).map_err(pcap_err("pcap_setfilter", spec))?;
    let fd = cap.as_raw_fd();
    let mac = sys::if_mac(fd, &spec.ifname).map_err(|source| IoError::Interface {
        op: "read MAC",
        iface: spec.label(),
        source,
    })?;
    let mtu = sys::if_mtu(fd, &spec.ifname).ok();
    let desc = PortDesc { spec: spec.clone(), mac, mtu };
    Ok((PcapPort { cap, label: spec.label(), drops: 0 }, desc))
}

impl PcapBackend {
    /// Open every port (entering namespaces as needed). Port index = position in `ports`.
    pub fn open(ports: &[PortSpec], config: PcapConfig) -> Result<Self, IoError> {
        if config.tx_batch == 0 || config.max_frame < 64 || config.snaplen < 64 {
            return Err(IoError::Config(format!(
                "bad pcap geometry: tx batch {} must be positive, max frame {} and snaplen {} \
                 at least 64 bytes",
                config.tx_batch, config.max_frame, config.snaplen
            )));
        }
        let epoll = Epoll::new()?;
        let wake = Arc::new(EventFd::new()?);
        epoll
            .add(wake.fd(), u64::MAX)
            .map_err(|source| IoError::Sys { op: "epoll add", source })?;
        let mut handles = Vec::with_capacity(ports.len());
        let mut descs = Vec::with_capacity(ports.len());
        for (i, spec) in ports.iter().enumerate() {
            let (s, c) = (spec.clone(), config.clone());
            let (h, d) = sys::in_netns(spec.netns.as_deref(), move || open_port(&s, &c))?;
            epoll.add(&h.cap, i as u64).map_err(|source| IoError::Interface {
                op: "epoll add",
                iface: spec.label(),
                source,
            })?;
            debug!(port = i, iface = %spec, filter = %config.filter(), "pcap port open");
            handles.push(h);
            descs.push(d);
        }
        Ok(PcapBackend {
            tx: TxStaging::new(config.tx_batch, config.max_frame),
            counters: vec![PortCounters::default(); ports.len()],
            ports: descs,
            handles,
            epoll,
            wake,
            rx_rotation: RxRotation::default(),
            maybe_ready: true,
            config,
        })
    }

    fn recv_port(&mut self, p: usize, budget: usize, sink: &mut dyn FnMut(usize, &[u8])) -> usize {
        let h = &mut self.handles[p];
        let c = &mut self.counters[p];
        let mut n = 0;
        while n < budget {
            match h.cap.next_packet() {
                Ok(pkt) => {
                    if pkt.header.caplen < pkt.header.len {
                        c.rx_truncated += 1;
                        continue;
                    }
                    c.rx_packets += 1;
                    c.rx_bytes += u64::from(pkt.header.caplen);
                    sink(p, pkt.data);
                    n += 1;
                }
                Err(pcap::Error::TimeoutExpired) | Err(pcap::Error::NoMorePackets) => break,
                Err(e) => {
                    c.link_errors += 1;
                    warn!(iface = %h.label, error = %e, "pcap read failed");
                    break;
                }
            }
        }
        if n > 0 {
            c.rx_batches += 1;
        }
        n
    }
}

impl Backend for PcapBackend {
    fn name(&self) -> &'static str {
        "pcap"
    }

    fn ports(&self) -> &[PortDesc] {
        &self.ports
    }

    fn recv_batch(
        &mut self,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, IoError> {
        let n_ports = self.handles.len();
        // Taken out for the call: `recv_port` needs all of `self`.
        let mut rotation = std::mem::take(&mut self.rx_rotation);
        let total = rotation.poll(n_ports, budget, |p, left| self.recv_port(p, left, sink));
        self.rx_rotation = rotation;
        // libpcap may hold frames already read from the ring: the fd is then not
        // readable, so a full round means "look again before sleeping".
        self.maybe_ready = total >= budget;
        Ok(total)
    }

    fn tx_buffer(&mut self) -> Option<&mut [u8]> {
        self.tx.buffer()
    }

    fn commit_tx(&mut self, port: usize, len: usize) {
        if self.tx.commit(port, len, self.handles.len()) {
            self.counters[port].tx_batch_full += 1;
        }
    }

    fn flush(&mut self) -> Result<usize, IoError> {
        let mut sent = 0;
        let mut touched = 0u64;
        for (_, port, frame) in self.tx.frames() {
            let h = &mut self.handles[port];
            let c = &mut self.counters[port];
            match h.cap.sendpacket(frame) {
                Ok(()) => {
                    c.tx_packets += 1;
                    c.tx_bytes += frame.len() as u64;
                    sent += 1;
                }
                Err(e) => {
                    c.tx_dropped += 1;
                    debug!(iface = %h.label, error = %e, "pcap_sendpacket failed");
                }
            }
            if port < 64 && touched & (1 << port) == 0 {
                touched |= 1 << port;
                c.tx_batches += 1;
            }
        }
        self.tx.clear();
        Ok(sent)
    }

    fn max_frame_len(&self) -> usize {
        self.config.max_frame
    }

    fn rx_ready(&self) -> Option<bool> {
        if self.maybe_ready {
            return Some(true);
        }
        // libpcap keeps its ring to itself: ask the epoll set `wait` sleeps on, without
        // waiting. The waker and port errors are left to `wait`, which drains and
        // reports them.
        let mut events = sys::events::<16>();
        let n = self.epoll.ready_now(&mut events);
        Some(events[..n].iter().any(|ev| sys::token(ev) != u64::MAX && !sys::is_error(ev)))
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), IoError> {
        if self.maybe_ready {
            return Ok(());
        }
        let mut events = sys::events::<16>();
        let n = self
            .epoll
            .wait(timeout, &mut events)
            .map_err(|source| IoError::Sys { op: "epoll wait", source })?;
        for ev in &events[..n] {
            if sys::token(ev) == u64::MAX {
                self.wake.drain();
            } else if sys::is_error(ev) {
                let p = sys::token(ev) as usize;
                if let Some(e) = sys::take_socket_error(self.handles[p].cap.as_raw_fd()) {
                    self.counters[p].link_errors += 1;
                    warn!(iface = %self.handles[p].label, error = %e, "port error");
                }
            }
        }
        Ok(())
    }

    fn waker(&self) -> Waker {
        Waker::new(self.wake.clone())
    }

    fn port_counters(&mut self, port: usize) -> PortCounters {
        let h = &mut self.handles[port];
        if let Ok(st) = h.cap.stats() {
            // pcap_stats counts since activation.
            h.drops = u64::from(st.dropped) + u64::from(st.if_dropped);
        }
        let mut c = self.counters[port];
        c.rx_dropped = h.drops;
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_always_has_roce_and_arp_and_no_duplicates() {
        let c = PcapConfig::default();
        assert_eq!(c.filter(), "arp or (udp dst port 4791)");
        let c = PcapConfig { udp_ports: vec![4791, 5000], ..PcapConfig::default() };
        assert_eq!(c.filter(), "arp or (udp dst port 4791 or udp dst port 5000)");
    }
}
