//! [`Backend`] for [`AfPacketBackend`]: receive rounds over the ports, staging and
//! flushing transmits, waiting on the one epoll, and the kernel's drop counts.

use std::os::fd::AsRawFd;
use std::time::Duration;

use inc_protocol::QueuedFrame;
use tracing::warn;

use super::AfPacketBackend;
use crate::backend::{Backend, IoError, PortCounters, PortDesc, Waker};
use crate::sys;

impl Backend for AfPacketBackend {
    fn name(&self) -> &'static str {
        "af_packet"
    }

    fn ports(&self) -> &[PortDesc] {
        &self.ports
    }

    fn recv_batch(
        &mut self,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, IoError> {
        let n_ports = self.socks.len();
        // Taken out for the call: `recv_port` needs all of `self`.
        let mut rotation = std::mem::take(&mut self.rx_rotation);
        let total = rotation.poll(n_ports, budget, |p, left| self.recv_port(p, left, sink));
        self.rx_rotation = rotation;
        Ok(total)
    }

    fn tx_buffer(&mut self) -> Option<&mut [u8]> {
        self.tx.buffer()
    }

    fn commit_tx(&mut self, port: usize, len: usize) {
        if self.tx.commit(port, len, self.socks.len()) {
            self.counters[port].tx_batch_full += 1;
        }
    }

    fn commit_frame(&mut self, port: usize, frame: QueuedFrame) {
        if self.tx.commit_queued(port, frame, self.socks.len()) {
            self.counters[port].tx_batch_full += 1;
        }
    }

    fn flush(&mut self) -> Result<usize, IoError> {
        if self.tx.is_empty() {
            return Ok(0);
        }
        // Frames keep their order within a port; ports are flushed one after another.
        let sent = (0..self.socks.len()).map(|port| self.send_port(port)).sum();
        self.tx.clear();
        Ok(sent)
    }

    fn max_frame_len(&self) -> usize {
        self.config.max_frame
    }

    fn rx_ready(&self) -> Option<bool> {
        Some(self.socks.iter().any(|s| s.ring.ready()))
    }

    fn set_host_port(&mut self, port: usize) {
        if let Some(s) = self.socks.get_mut(port) {
            s.host_port = true;
        }
    }

    fn takes_gso_frames(&self, port: usize) -> bool {
        self.socks.get(port).is_some_and(|s| s.takes_gso_frames)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), IoError> {
        if self.socks.iter().any(|s| s.ring.ready()) {
            return Ok(());
        }
        let mut events = sys::events::<16>();
        let n = self
            .epoll
            .wait(timeout, &mut events)
            .map_err(|source| IoError::Sys { op: "epoll wait", source })?;
        for ev in &events[..n] {
            let token = sys::token(ev);
            if token == u64::MAX {
                self.wake.drain();
            } else if sys::is_error(ev) {
                // A pending socket error (interface down or gone) keeps the fd ready;
                // take it so the loop does not spin, and report it once.
                let p = token as usize;
                if let Some(e) = sys::take_socket_error(self.socks[p].fd.as_raw_fd()) {
                    self.counters[p].link_errors += 1;
                    warn!(iface = %self.socks[p].label, error = %e, "port error");
                }
            }
        }
        Ok(())
    }

    fn waker(&self) -> Waker {
        Waker::new(self.wake.clone())
    }

    fn port_counters(&mut self, port: usize) -> PortCounters {
        let s = &mut self.socks[port];
        // Safety: tpacket_stats_v3 is plain old data; all-zero is valid.
        let mut st: libc::tpacket_stats_v3 = unsafe { std::mem::zeroed() };
        if sys::getsockopt(s.fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_STATISTICS, &mut st)
            .is_ok()
        {
            s.kernel_drops += u64::from(st.tp_drops);
        }
        let mut c = self.counters[port];
        c.rx_dropped = s.kernel_drops;
        c
    }
}
