//! What a run measures, as written to JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cli::Coll;
use crate::netns::IfCounters;
use crate::stats;

/// Counters of one logical switch over one measurement.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SwitchDelta {
    /// Switch name.
    pub name: String,
    /// Frames in.
    pub rx_frames: u64,
    /// Frames out.
    pub tx_frames: u64,
    /// Frames in per second of wall time.
    pub rx_fps: f64,
    /// Frames out per second of wall time.
    pub tx_fps: f64,
    /// Packets the switch retransmitted.
    pub retransmits: u64,
    /// RNR NAKs the switch sent.
    pub rnr_sent: u64,
    /// RNR NAKs the switch received.
    pub rnr_received: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Drops by reason (engine reasons and backend port drops); only non-zero ones.
    pub drops: BTreeMap<String, u64>,
}

/// The switch process over one measurement.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SwitchSample {
    /// Backend name the switch reported.
    pub backend: String,
    /// User + system CPU seconds of the switch process.
    pub cpu_s: f64,
    /// Resident set size at the end (bytes).
    pub rss_bytes: u64,
    /// Per logical switch.
    pub switches: Vec<SwitchDelta>,
}

impl SwitchSample {
    /// Frames in over all switches.
    pub fn rx_frames(&self) -> u64 {
        self.switches.iter().map(|s| s.rx_frames).sum()
    }
    /// Frames in per second over all switches.
    pub fn rx_fps(&self) -> f64 {
        self.switches.iter().map(|s| s.rx_fps).sum()
    }
    /// Frames out per second over all switches.
    pub fn tx_fps(&self) -> f64 {
        self.switches.iter().map(|s| s.tx_fps).sum()
    }
    /// Retransmissions over all switches.
    pub fn retransmits(&self) -> u64 {
        self.switches.iter().map(|s| s.retransmits).sum()
    }
    /// RNR NAKs sent and received over all switches.
    pub fn rnrs(&self) -> u64 {
        self.switches.iter().map(|s| s.rnr_sent + s.rnr_received).sum()
    }
    /// Drops by reason over all switches.
    pub fn drops(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for s in &self.switches {
            for (k, v) in &s.drops {
                *m.entry(k.clone()).or_default() += v;
            }
        }
        m
    }
    /// CPU nanoseconds per frame in.
    pub fn ns_per_frame(&self) -> f64 {
        let f = self.rx_frames();
        if f == 0 {
            0.0
        } else {
            self.cpu_s * 1e9 / f as f64
        }
    }
}

/// One system measured at one size in one round.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// Backend name (af_packet, pcap, ...) or reference (mpi, mpi-ring).
    pub system: String,
    /// Collective.
    pub collective: Coll,
    /// int32 / float32 ("-" for Barrier).
    pub dtype: String,
    /// Message size in bytes.
    pub bytes: u64,
    /// Elements.
    pub count: u64,
    /// Small-message latency test (many iterations) rather than the size sweep.
    pub small: bool,
    /// Round (0-based).
    pub round: u32,
    /// Warm-up iterations.
    pub warmup: u32,
    /// Timed iterations.
    pub iters: u32,
    /// Time of each timed iteration, slowest rank (microseconds).
    pub times_us: Vec<f64>,
    /// "ok", "FAIL: ..." or "not built: ...".
    pub status: String,
    /// Wall time of the whole measurement including set-up (seconds).
    pub wall_s: f64,
    /// Switch counters (INC only).
    pub switch: Option<SwitchSample>,
    /// Bytes and frames of every host's data interface over the measurement.
    pub host_if: Vec<IfCounters>,
    /// CPU seconds of all host processes.
    pub host_cpu_s: Option<f64>,
    /// Named parts of the overlap measurement: the slowest rank's time of each
    /// iteration (microseconds).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub parts: BTreeMap<String, Vec<f64>>,
}

impl Measurement {
    /// A row that did not run.
    pub fn skipped(system: &str, coll: Coll, dtype: &str, bytes: u64, why: &str) -> Self {
        Measurement {
            system: system.into(),
            collective: coll,
            dtype: dtype.into(),
            bytes,
            count: bytes / crate::cli::elem_size(dtype),
            small: false,
            round: 0,
            warmup: 0,
            iters: 0,
            times_us: vec![],
            status: why.into(),
            wall_s: 0.0,
            switch: None,
            host_if: vec![],
            host_cpu_s: None,
            parts: BTreeMap::new(),
        }
    }

    /// Passed every check.
    pub fn ok(&self) -> bool {
        self.status == "ok"
    }

    /// Median time (us).
    pub fn median_us(&self) -> f64 {
        stats::median(&self.times_us)
    }
}

/// A frame-rate reference (or the INC switches' peak) over the same path.
#[derive(Debug, Clone, Serialize)]
pub struct FrameRate {
    /// testpmd-io, kernel-forwarding, ...
    pub system: String,
    /// Round.
    pub round: u32,
    /// Frame length in bytes (without FCS).
    pub frame_len: u32,
    /// Forwarding hops on the path.
    pub hops: u32,
    /// Frames per second the generator sent.
    pub offered_fps: f64,
    /// Frames per second that arrived at the far host.
    pub delivered_fps: f64,
    /// Frames per second handled over all forwarders (delivered x hops).
    pub forwarded_fps: f64,
    /// CPU seconds of the forwarders per second of traffic (how many cores they used).
    pub forwarder_cores: f64,
    /// "ok" or why not.
    pub status: String,
}

/// Host traffic per iteration for one collective and size: counted on the interfaces.
#[derive(Debug, Clone, Serialize)]
pub struct HostBytes {
    /// System.
    pub system: String,
    /// Collective.
    pub collective: Coll,
    /// Message size (ReduceScatter, AllGather: S, the whole vector).
    pub bytes: u64,
    /// Per host: (sent, received) bytes per iteration.
    pub per_host: Vec<(f64, f64)>,
}

/// Everything one run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// The command line.
    pub command: String,
    /// Machine description.
    pub machine: String,
    /// What system calls, switches and wake-ups cost here (none if not measured).
    pub scheduling: Option<crate::machine::SchedulingCosts>,
    /// Topology file.
    pub topology: String,
    /// Ranks.
    pub world: usize,
    /// INC payload bytes per frame (topology mtu).
    pub mtu: u32,
    /// Started (UTC, RFC 3339).
    pub started: String,
    /// Seconds the run took.
    pub duration_s: f64,
    /// Backends the switch binary supports.
    pub supported_backends: Vec<String>,
    /// Every measurement.
    pub measurements: Vec<Measurement>,
    /// Frame-rate references.
    pub frame_rates: Vec<FrameRate>,
    /// Counted host bytes, INC vs ring.
    pub host_bytes: Vec<HostBytes>,
    /// Problems that did not stop the run.
    pub notes: Vec<String>,
    /// AllReduces per batch of the overlap measurement.
    pub overlap_requests: u32,
}
