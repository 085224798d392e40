//! A connected QP's state ([`Core`]), which the collective's caller drives inside a
//! collective and the progress thread between collectives, and that thread.

use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use inc_protocol::{earliest, Time};
use inc_wire::EthernetAddress;
use inccl_engine::{CallBuffers, HostEngine, OpBuffers};
use nix::poll::PollFlags;
use tracing::debug;

use super::pace::NicPacer;
use super::port::{Attachment, Inbox};
use super::recv::{accept_frame, IdentRule};
use super::socket::RoceSocket;
use super::sys::wait;

/// How long after a collective the progress thread leaves the socket to the next
/// collective's caller (it still runs the RC timers, e.g. a deferred ACK). Well under
/// the switch's RTO floor (1 ms), so a request that does arrive in between is ACKed
/// before the switch resends it.
pub(super) const CALLER_GRACE: Duration = Duration::from_micros(500);

/// The QP state shared by the caller's thread (inside collectives) and the progress
/// thread (between them).
#[derive(Debug)]
pub(super) struct Core {
    pub(super) io: RoceSocket,
    pub(super) qp: Attachment,
    pub(super) epoch: Instant,
    pub(super) engine: HostEngine,
    pub(super) switch: SocketAddrV4,
    pub(super) switch_mac: EthernetAddress,
    /// When the last collective returned (the QP's creation before the first).
    pub(super) last_collective: Instant,
    /// Sends at the host link's rate where the switch's link emulation limits it.
    pub(super) pacer: Option<NicPacer>,
}

impl Core {
    pub(super) fn now(&self) -> Time {
        Time::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Send everything the engine has ready, or what the link takes now if paced.
    /// Returns packets sent.
    pub(super) fn flush<'a, B: CallBuffers<'a> + ?Sized>(&mut self, bufs: &B) -> io::Result<usize> {
        let Core { io, epoch, engine, switch, pacer, .. } = self;
        io.send_frames(*switch, |slot| {
            let now = Time::from_nanos(epoch.elapsed().as_nanos() as u64);
            let Some(p) = pacer else { return engine.poll_transmit(now, slot, bufs) };
            if !p.has_room(now) {
                return None;
            }
            let len = engine.poll_transmit(now, slot, bufs)?;
            p.sent(now, len);
            Some(len)
        })
    }

    /// Feed every datagram for this QP to the engine: those other threads received for
    /// it, then those queued on the socket (handing other QPs theirs). Returns packets
    /// handled.
    pub(super) fn receive<'a, B: CallBuffers<'a> + ?Sized>(
        &mut self,
        bufs: &mut B,
    ) -> io::Result<usize> {
        let now = self.now();
        let Core { io, qp, engine, switch, switch_mac, .. } = self;
        let (local, mac, switch_ip) = (io.local, io.mac, *switch.ip());
        let mut handled = 0;
        for mut f in qp.take_forwarded() {
            let rule = IdentRule::Psn;
            if accept_frame(&mut f.frame, f.from, f.ident, rule, local, switch_ip, *switch_mac, mac)
            {
                engine.handle_frame(now, &f.frame, bufs);
                handled += 1;
            }
        }
        io.recv_datagrams(|from, ident, frame| {
            if !qp.is_mine(from, ident, frame) {
                return true;
            }
            if !accept_frame(frame, from, ident, IdentRule::Psn, local, switch_ip, *switch_mac, mac)
            {
                return false;
            }
            engine.handle_frame(now, frame, bufs);
            handled += 1;
            true
        })?;
        Ok(handled)
    }

    /// Wait up to `timeout` for a datagram on the socket or in this QP's inbox.
    pub(super) fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        wait(&[self.io.sock.as_fd(), self.qp.inbox().wake_fd()], PollFlags::POLLIN, Some(timeout))
    }

    /// Polls for a datagram for up to `limit`, yielding the CPU between polls (see
    /// [`CommConfig::busy_poll`]); true if one is queued.
    ///
    /// [`CommConfig::busy_poll`]: crate::config::CommConfig::busy_poll
    pub(super) fn busy_poll(&self, limit: Duration) -> io::Result<bool> {
        if limit.is_zero() {
            return Ok(false);
        }
        let t0 = Instant::now();
        loop {
            if self.wait_readable(Duration::ZERO)? {
                return Ok(true);
            }
            if t0.elapsed() >= limit {
                return Ok(false);
            }
            std::thread::yield_now();
        }
    }

    pub(super) fn fire_timers(&mut self) {
        let now = self.now();
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
        }
    }

    /// Time until the engine's next timer, or until the link takes more frames.
    pub(super) fn next_timer(&self) -> Option<Duration> {
        let now = self.now();
        let link = self.pacer.as_ref().and_then(NicPacer::release);
        earliest(self.engine.poll_timeout(), link).map(|t| t.saturating_sub(now))
    }

    /// Between collectives: ACK (or RNR-NAK) what arrives and run the RC timers, as an
    /// RDMA NIC does without the application, so the switch's connection never
    /// exhausts its retries while the application computes. Returns how long the
    /// progress thread may sleep and whether it must watch the socket meanwhile.
    fn service_idle(&mut self) -> (Option<Duration>, bool) {
        let mut none = OpBuffers::None;
        let serviced = self.receive(&mut none).and_then(|_| {
            self.fire_timers();
            self.flush(&none)
        });
        if let Err(e) = serviced {
            debug!(error = %e, "progress thread: socket error");
        }
        let timer = self.next_timer();
        match CALLER_GRACE.checked_sub(self.last_collective.elapsed()) {
            Some(left) if !left.is_zero() => (Some(timer.map_or(left, |t| t.min(left))), false),
            _ => (timer, true),
        }
    }
}

pub(super) fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    // Every step leaves the engine consistent; a panic elsewhere does not poison it.
    core.lock().unwrap_or_else(|p| p.into_inner())
}

/// The progress thread of a connected QP.
#[derive(Debug)]
pub(super) struct Progress {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) inbox: Arc<Inbox>,
    pub(super) thread: Option<JoinHandle<()>>,
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.inbox.wake();
        if let Some(t) = self.thread.take() {
            t.join().ok();
        }
    }
}

pub(super) fn progress_loop(
    core: Arc<Mutex<Core>>,
    sock: Arc<UdpSocket>,
    inbox: Arc<Inbox>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let (timer, watch_socket) = match core.try_lock() {
            Ok(mut c) => c.service_idle(),
            // Every step leaves the engine consistent; a panic elsewhere does not poison it.
            Err(TryLockError::Poisoned(p)) => p.into_inner().service_idle(),
            // A collective runs: its caller reads the socket and runs the timers.
            Err(TryLockError::WouldBlock) => (Some(CALLER_GRACE), false),
        };
        // Receiving drained the inbox's wake-up socket, which also carries the stop
        // request: look again before sleeping on it.
        if stop.load(Ordering::Relaxed) {
            break;
        }
        // A timer already due makes this return at once; `service_idle` fires it next.
        if watch_socket {
            wait(&[sock.as_fd(), inbox.wake_fd()], PollFlags::POLLIN, timer).ok();
        } else {
            wait(&[inbox.wake_fd()], PollFlags::POLLIN, timer).ok();
        }
    }
}
