//! Command line and the run configuration derived from it.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;

/// Benchmark the INC switch backends on a topology in network namespaces, with
/// dpdk-testpmd, kernel forwarding and OpenMPI MPI_Allreduce measured in the same run
/// on the same veths.
#[derive(Debug, Parser)]
#[command(name = "inc-bench", version)]
pub struct Args {
    /// Topology YAML.
    #[arg(long, default_value = "topologies/1-2-4.yaml")]
    pub topology: PathBuf,
    /// Switch backends to measure, in order (one "not built" row for each the switch
    /// binary does not support).
    #[arg(long, value_delimiter = ',', default_value = "af_packet,pcap,af_xdp,dpdk")]
    pub backends: Vec<String>,
    /// Collectives of the size sweep: allreduce, reduce, broadcast, reducescatter,
    /// allgather (for ReduceScatter and AllGather the size is S, the whole vector of
    /// world-size blocks: ReduceScatter's input, AllGather's output, rounded down to
    /// whole blocks of whole elements). `overlap` adds the overlap measurement (see
    /// --overlap-size) on every backend in every round.
    #[arg(long, value_delimiter = ',', default_value = "allreduce")]
    pub collectives: Vec<String>,
    /// Datatypes, any rows of INCCL's table: int8, uint8, int32, uint32, int64, uint64,
    /// float16, bfloat16, float32, float64. MPI reduces the matching MPI type; float16
    /// and bfloat16, which Open MPI lacks, as 16-bit words with a user-defined MPI_Op
    /// (widen, combine, round to nearest even). A size that is not a whole number of a
    /// type's elements is skipped for that type.
    #[arg(long, value_delimiter = ',', default_value = "int32")]
    pub dtypes: Vec<inc_wire::DataType>,
    /// Reduction operator of AllReduce and Reduce (and of MPI's reference): sum, max,
    /// min, prod, avg (MPI: SUM, then divided on the hosts), band, bor, bxor.
    #[arg(long, default_value = "sum")]
    pub op: inc_wire::Operator,
    /// Smallest message in bytes (K/M/G suffixes are powers of 1024).
    #[arg(long, default_value = "4")]
    pub min_size: String,
    /// Largest message in bytes.
    #[arg(long, default_value = "1G")]
    pub max_size: String,
    /// Size step factor.
    #[arg(long, default_value_t = 4)]
    pub factor: u64,
    /// Timed iterations per size (fewer for large sizes, see --cap).
    #[arg(long, default_value_t = 20)]
    pub iters: u32,
    /// Warm-up iterations per size (fewer for large sizes, see --cap).
    #[arg(long, default_value_t = 3)]
    pub warmup: u32,
    /// Bytes per rank moved per size and system: iterations = max(3, min(iters, cap/size)),
    /// warm-up = max(1, min(warmup, cap/size)).
    #[arg(long, default_value = "512M")]
    pub cap: String,
    /// Iterations of the small-message tests (1-element AllReduce, Barrier).
    #[arg(long, default_value_t = 2000)]
    pub small_iters: u32,
    /// Rounds: every system measured once per round, rounds interleaved (medians and
    /// spread over rounds).
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Seconds of traffic per frame-rate reference (testpmd, kernel forwarding).
    #[arg(long, default_value_t = 5.0)]
    pub ref_seconds: f64,
    /// Message size of the counted INC-vs-ring bytes comparison.
    #[arg(long, default_value = "16M")]
    pub ring_size: String,
    /// Extra Open MPI parameters for the MPI sweep and the counted ReduceScatter, e.g.
    /// `coll_tuned_use_dynamic_rules=1,coll_tuned_reduce_scatter_block_algorithm=4`
    /// (the counted ring AllReduce and AllGather keep their forced rings).
    #[arg(long, value_delimiter = ',', value_name = "KEY=VALUE")]
    pub mpi_mca: Vec<String>,
    /// Skip the references (MPI, testpmd, kernel forwarding).
    #[arg(long)]
    pub no_refs: bool,
    /// Short run for CI: 4 B .. 64 KiB, 5 iterations, 100 small-message iterations, 1 s
    /// references (explicit size/iteration options are ignored).
    #[arg(long)]
    pub quick: bool,
    /// Output directory (table, CSV, JSON, SVG, logs).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Directory of inc-switch, inc-controller and the inccl-* host programs (default:
    /// the directory of this executable).
    #[arg(long, env = "INC_BIN_DIR")]
    pub bin_dir: Option<PathBuf>,
    /// Namespace prefix (default: b<pid>).
    #[arg(long)]
    pub prefix: Option<String>,
    /// Extra arguments for every `inc-switch run` (whitespace separated).
    #[arg(long, env = "INC_SWITCH_ARGS", default_value = "")]
    pub switch_args: String,
    /// TX checksum offload on the hosts' veths while each system runs. With it, MPI's
    /// TCP segments and INCCL's UDP GSO sends towards an af_packet switch cross the
    /// veths whole; without, the hosts' kernels cut (and checksum) INCCL's GSO sends,
    /// which the other backends need, as their hosts otherwise send datagram by
    /// datagram. `auto`: each system at its best, i.e. on for af_packet and the
    /// references (MPI), off for pcap, af_xdp and dpdk; `on` / `off`: for all.
    #[arg(long, value_enum, default_value_t = HostTxOffload::Auto)]
    pub host_tx_offload: HostTxOffload,
    /// Overlap measurement (`--collectives ...,overlap`), int32 sum AllReduces of this
    /// size: --overlap-requests of them started back to back as non-blocking calls and
    /// waited for, against the same issued blocking one after another; and one of them
    /// running while the host computes for about as long (a busy loop calibrated to it),
    /// against the compute alone and the collective alone.
    #[arg(long, default_value = "8M")]
    pub overlap_size: String,
    /// AllReduces per batch of the overlap measurement.
    #[arg(long, default_value_t = 8)]
    pub overlap_requests: u32,
    /// Timed repetitions of the overlap measurement per backend and round (each one
    /// runs every part once; the order of the blocking and non-blocking batches
    /// alternates).
    #[arg(long, default_value_t = 5)]
    pub overlap_iters: u32,
    /// Record a `perf` profile of the switch process and of rank 0 during this message size
    /// (first backend, first round, first datatype of each collective), e.g. 64M.
    #[arg(long)]
    pub perf_size: Option<String>,
}

/// A collective the host programs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Coll {
    /// AllReduce.
    AllReduce,
    /// Reduce to rank 0.
    Reduce,
    /// Broadcast from rank 0.
    Broadcast,
    /// Barrier (latency only).
    Barrier,
    /// ReduceScatter (MPI's `Reduce_scatter_block`); size = S, the whole input vector.
    #[serde(rename = "reducescatter")]
    ReduceScatter,
    /// AllGather; size = S, the whole output vector.
    #[serde(rename = "allgather")]
    AllGather,
    /// The overlap measurement (non-blocking batches, compute during a collective).
    Overlap,
}

impl Coll {
    /// Name used in tables and program names.
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "allreduce",
            Coll::Reduce => "reduce",
            Coll::Broadcast => "broadcast",
            Coll::Barrier => "barrier",
            Coll::ReduceScatter => "reducescatter",
            Coll::AllGather => "allgather",
            Coll::Overlap => "overlap",
        }
    }

    /// nccl-tests bus bandwidth factor for `n` ranks (ReduceScatter and AllGather with
    /// algbw = S / time, S the whole vector).
    pub fn bus_factor(self, n: usize) -> f64 {
        match self {
            Coll::AllReduce => 2.0 * (n as f64 - 1.0) / n as f64,
            Coll::ReduceScatter | Coll::AllGather => (n as f64 - 1.0) / n as f64,
            _ => 1.0,
        }
    }

    /// Whether the message size is S, the whole vector of world-size blocks.
    pub fn blocked(self) -> bool {
        matches!(self, Coll::ReduceScatter | Coll::AllGather)
    }

    /// The host program (in --bin-dir) and the arguments that select the collective:
    /// the inccl-* programs of hosts/, or this crate's inc-bench-rank for the
    /// collectives those do not run.
    pub fn program(self) -> (String, Vec<String>) {
        match self {
            Coll::ReduceScatter | Coll::AllGather | Coll::Overlap => {
                ("inc-bench-rank".into(), vec!["--collective".into(), self.name().into()])
            }
            _ => (format!("inccl-{}", self.name()), vec![]),
        }
    }

    /// Elements per rank's call for a message of `bytes` of `dtype` on `world` ranks:
    /// the whole message, or for ReduceScatter and AllGather one block (S rounded down
    /// to world-size blocks of whole elements). None if not even one element fits.
    pub fn count(self, dtype: &str, bytes: u64, world: usize) -> Option<u64> {
        let unit = elem_size(dtype) * if self.blocked() { world as u64 } else { 1 };
        (bytes >= unit && (self.blocked() || bytes % unit == 0)).then_some(bytes / unit)
    }

    /// The message size of `count` elements of `dtype` per call (inverse of
    /// [`Coll::count`]).
    pub fn bytes(self, dtype: &str, count: u64, world: usize) -> u64 {
        count * elem_size(dtype) * if self.blocked() { world as u64 } else { 1 }
    }

    fn parse(s: &str) -> anyhow::Result<Coll> {
        Ok(match s {
            "allreduce" => Coll::AllReduce,
            "reduce" => Coll::Reduce,
            "broadcast" => Coll::Broadcast,
            "reducescatter" | "reduce_scatter" => Coll::ReduceScatter,
            "allgather" => Coll::AllGather,
            "overlap" => Coll::Overlap,
            _ => bail!(
                "unknown collective `{s}` in --collectives (allreduce, reduce, broadcast, \
                 reducescatter, allgather, overlap)"
            ),
        })
    }
}

/// Everything a run needs, resolved from [`Args`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Backends in order.
    pub backends: Vec<String>,
    /// Collectives of the size sweep.
    pub collectives: Vec<Coll>,
    /// Run the overlap measurement.
    pub overlap: bool,
    /// Bytes of each AllReduce of the overlap measurement.
    pub overlap_size: u64,
    /// AllReduces per batch.
    pub overlap_requests: u32,
    /// Timed repetitions of the overlap measurement.
    pub overlap_iters: u32,
    /// Datatypes (names of INCCL's table).
    pub dtypes: Vec<String>,
    /// Reduction operator.
    pub op: String,
    /// Message sizes in bytes.
    pub sizes: Vec<u64>,
    /// Timed iterations (upper bound).
    pub iters: u32,
    /// Warm-up iterations (upper bound).
    pub warmup: u32,
    /// Byte cap per size.
    pub cap: u64,
    /// Small-message iterations.
    pub small_iters: u32,
    /// Rounds.
    pub rounds: u32,
    /// Seconds per frame-rate reference.
    pub ref_seconds: f64,
    /// Size of the counted bytes comparison.
    pub ring_size: u64,
    /// Run the references.
    pub refs: bool,
    /// Extra Open MPI parameters (`--mpi-mca`).
    pub mpi_mca: Vec<(String, String)>,
    /// Size to profile.
    pub perf_size: Option<u64>,
    /// Hosts' TX checksum offload per system.
    pub host_tx_offload: HostTxOffload,
}

/// `--host-tx-offload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HostTxOffload {
    /// On for af_packet and the references, off for the other backends.
    Auto,
    /// On for every system.
    On,
    /// Off for every system.
    Off,
}

impl HostTxOffload {
    /// Whether the hosts' veths offload TX checksums while `system` (a backend, or
    /// `mpi` for the references) runs.
    pub fn wants(self, system: &str) -> bool {
        match self {
            HostTxOffload::On => true,
            HostTxOffload::Off => false,
            HostTxOffload::Auto => !matches!(system, "pcap" | "af_xdp" | "dpdk"),
        }
    }

    /// For the notes: which systems ran with the offload.
    pub fn describe(self, backends: &[String]) -> String {
        let (on, off): (Vec<&str>, Vec<&str>) = backends
            .iter()
            .map(String::as_str)
            .chain(["MPI"])
            .partition(|b| self.wants(&b.to_lowercase()));
        match (on.is_empty(), off.is_empty()) {
            (_, true) => "on for every system".into(),
            (true, _) => "off for every system".into(),
            _ => format!("on for {}, off for {}", on.join(", "), off.join(", ")),
        }
    }
}

impl std::fmt::Display for HostTxOffload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use clap::ValueEnum;
        let value = self.to_possible_value().expect("no variant is skipped");
        f.write_str(value.get_name())
    }
}

/// Parse `4`, `16K`, `64M`, `1G` (powers of 1024).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 =
        num.parse().with_context(|| format!("`{s}` is not a size (e.g. 4, 16K, 64M, 1G)"))?;
    n.checked_mul(mult).with_context(|| format!("size `{s}` is too large"))
}

/// Human size: 4 B, 16 KiB, 64 MiB, 1 GiB.
pub fn human_size(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Bytes per element of a datatype name (4 for "-", a Barrier's).
pub fn elem_size(dtype: &str) -> u64 {
    dtype.parse::<inc_wire::DataType>().map_or(4, |d| d.size() as u64)
}

/// Iterations and warm-up iterations for a message of `bytes`.
pub fn iterations(cfg: &Config, bytes: u64) -> (u32, u32) {
    let fit = cfg.cap / bytes.max(1);
    let clamp = |n: u32, lo: u32| (u64::from(n).min(fit) as u32).max(lo);
    (clamp(cfg.warmup, 1), clamp(cfg.iters, 3))
}

impl Config {
    /// Resolve and check the arguments.
    pub fn from_args(a: &Args) -> anyhow::Result<Config> {
        let mut collectives: Vec<Coll> =
            a.collectives.iter().map(|c| Coll::parse(c.trim())).collect::<anyhow::Result<_>>()?;
        let overlap = collectives.contains(&Coll::Overlap);
        collectives.retain(|c| *c != Coll::Overlap);
        collectives.dedup();
        if a.op == inc_wire::Operator::Barrier {
            bail!("--op barrier is not a reduction (sum, max, min, prod, avg, band, bor, bxor)");
        }
        for d in &a.dtypes {
            a.op.check(*d).map_err(|e| anyhow::anyhow!("--op with --dtypes: {e}"))?;
        }
        if a.factor < 2 {
            bail!("--factor must be at least 2");
        }
        let (min, max, iters, warmup, small_iters, ref_seconds, ring_size) = if a.quick {
            (4, 64 << 10, 5, 1, 100, 1.0, 256 << 10)
        } else {
            (
                parse_size(&a.min_size)?,
                parse_size(&a.max_size)?,
                a.iters,
                a.warmup,
                a.small_iters,
                a.ref_seconds,
                parse_size(&a.ring_size)?,
            )
        };
        if min < 4 || min % 4 != 0 || max < min {
            bail!("sizes must be multiples of 4 bytes with --min-size <= --max-size");
        }
        let mut sizes = Vec::new();
        let mut s = min;
        while s <= max {
            sizes.push(s);
            s = s.saturating_mul(a.factor);
        }
        let (overlap_size, overlap_iters) = if a.quick {
            (64 << 10, 3)
        } else {
            (parse_size(&a.overlap_size)?, a.overlap_iters.max(1))
        };
        if overlap && (overlap_size < 4 || overlap_size % 4 != 0 || a.overlap_requests == 0) {
            bail!("--overlap-size must be a multiple of 4 bytes and --overlap-requests at least 1");
        }
        Ok(Config {
            backends: a.backends.iter().map(|b| b.trim().replace('-', "_")).collect(),
            collectives,
            overlap,
            overlap_size,
            overlap_requests: a.overlap_requests,
            overlap_iters,
            dtypes: a.dtypes.iter().map(|d| d.to_string()).collect(),
            op: a.op.to_string(),
            sizes,
            iters: iters.max(1),
            warmup,
            cap: parse_size(&a.cap)?,
            host_tx_offload: a.host_tx_offload,
            small_iters: small_iters.max(1),
            rounds: a.rounds.max(1),
            ref_seconds,
            ring_size,
            refs: !a.no_refs,
            mpi_mca: a
                .mpi_mca
                .iter()
                .map(|kv| {
                    let (k, v) = kv.split_once('=').with_context(|| {
                        format!("--mpi-mca `{kv}`: want KEY=VALUE (an Open MPI MCA parameter)")
                    })?;
                    Ok((k.trim().to_string(), v.trim().to_string()))
                })
                .collect::<anyhow::Result<_>>()?,
            perf_size: a.perf_size.as_deref().map(parse_size).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &[&str]) -> Config {
        let mut v = vec!["inc-bench"];
        v.extend_from_slice(extra);
        Config::from_args(&Args::try_parse_from(v).unwrap()).unwrap()
    }

    #[test]
    fn host_tx_offload_auto_gives_each_system_its_best() {
        let all: Vec<String> =
            ["af_packet", "pcap", "af_xdp", "dpdk"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            HostTxOffload::Auto.describe(&all),
            "on for af_packet, MPI, off for pcap, af_xdp, dpdk"
        );
        assert!(HostTxOffload::Auto.wants("mpi"));
        assert_eq!(HostTxOffload::Auto.to_string(), "auto", "as --host-tx-offload takes it");
        assert_eq!(HostTxOffload::On.describe(&all), "on for every system");
        assert_eq!(HostTxOffload::Off.describe(&all[..1]), "off for every system");
    }

    #[test]
    fn sizes_and_suffixes() {
        assert_eq!(parse_size("4").unwrap(), 4);
        assert_eq!(parse_size("16K").unwrap(), 16384);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("1X").is_err());
        assert_eq!(human_size(64 << 20), "64 MiB");
        assert_eq!(human_size(12), "12 B");
        let c = cfg(&[]);
        assert_eq!(c.sizes.len(), 15);
        assert_eq!((c.sizes[0], *c.sizes.last().unwrap()), (4, 1 << 30));
        assert_eq!(cfg(&["--quick"]).sizes, vec![4, 16, 64, 256, 1024, 4096, 16384, 65536]);
    }

    #[test]
    fn reduce_scatter_and_allgather_sizes_are_whole_vectors() {
        let (rs, ag) = (Coll::ReduceScatter, Coll::AllGather);
        assert_eq!(rs.count("int32", 1 << 20, 4), Some(65536));
        assert_eq!(rs.bytes("int32", 65536, 4), 1 << 20);
        // 9 ranks: S rounded down to 9 blocks of whole elements.
        assert_eq!(ag.count("int32", 1 << 20, 9), Some(29127));
        assert_eq!(ag.bytes("int32", 29127, 9), 1048572);
        assert_eq!(rs.count("float64", 64, 9), None);
        assert_eq!(Coll::AllReduce.count("int64", 12, 4), None);
        assert!((rs.bus_factor(4) - 0.75).abs() < 1e-12);
        let c = cfg(&["--collectives", "allgather,overlap", "--overlap-size", "1M"]);
        assert_eq!(c.collectives, vec![Coll::AllGather]);
        assert!(c.overlap && c.overlap_size == 1 << 20 && c.overlap_requests == 8);
        assert_eq!(Coll::AllGather.program().0, "inc-bench-rank");
        assert_eq!(Coll::AllReduce.program(), ("inccl-allreduce".into(), vec![]));
    }

    #[test]
    fn large_sizes_get_fewer_iterations() {
        let c = cfg(&[]);
        assert_eq!(iterations(&c, 4), (3, 20));
        assert_eq!(iterations(&c, 64 << 20), (3, 8));
        assert_eq!(iterations(&c, 1 << 30), (1, 3));
    }

    #[test]
    fn mistakes_name_the_option() {
        let a = Args::try_parse_from(["x", "--collectives", "alltoall"]).unwrap();
        let e = Config::from_args(&a).unwrap_err().to_string();
        assert!(e.contains("alltoall") && e.contains("--collectives"), "{e}");
        let a = Args::try_parse_from(["x", "--min-size", "3"]).unwrap();
        assert!(Config::from_args(&a).is_err());
        let a = Args::try_parse_from(["x", "--mpi-mca", "btl_tcp_eager_limit"]).unwrap();
        assert!(Config::from_args(&a).unwrap_err().to_string().contains("--mpi-mca"));
        let c = cfg(&["--mpi-mca", "a=1,b = 2"]);
        assert_eq!(c.mpi_mca, vec![("a".into(), "1".into()), ("b".into(), "2".into())]);
    }
}
