//! Frames built by `RoceRepr::emit` decode in Wireshark's independent RoCE dissector
//! with the same field values, a good IPv4 checksum and nothing malformed. Needs
//! `tshark` (installed by scripts/setup); without it the test is skipped
//! (and fails in CI, see `inc-test-support`).

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use inc_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, EthAddrs,
    EthernetAddress, NakCode, Opcode, Psn, RethRepr, RoceRepr,
};
use pcap_file::pcap::{PcapPacket, PcapWriter};

/// xorshift64*: reproducible pseudo-random field values without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_frame(rng: &mut Rng, op: Opcode) -> RoceRepr {
    let bth = BthRepr {
        solicited: rng.below(2) == 1,
        mig_req: rng.below(2) == 1,
        pkey: rng.next() as u16,
        ack_req: rng.below(2) == 1,
        ..BthRepr::new(op, rng.below(1 << 24) as u32, Psn::new(rng.next() as u32))
    };
    let mut r = RoceRepr::new(
        EthAddrs {
            src: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst: EthernetAddress([2, 0, 0, 0, 0, 2]),
        },
        Ipv4Addr::new(10, 77, 0, 1),
        Ipv4Addr::new(10, 77, 0, 2),
        49152 + rng.below(1000) as u16,
        bth,
    );
    let e = &mut r.ext;
    if op.has_reth() {
        e.reth = Some(RethRepr {
            virtual_addr: rng.next(),
            rkey: rng.next() as u32,
            dma_len: rng.next() as u32,
        });
    }
    if op.has_aeth() {
        let v = rng.below(32) as u8;
        let syndrome = match rng.below(3) {
            0 => AethSyndrome::Ack { credits: v },
            1 => AethSyndrome::RnrNak { timer: v },
            _ => AethSyndrome::Nak(NakCode::from_code(rng.below(5) as u8)),
        };
        e.aeth = Some(AethRepr { syndrome, msn: rng.below(1 << 24) as u32 });
    }
    if op.has_deth() {
        e.deth = Some(DethRepr { qkey: rng.next() as u32, src_qp: rng.below(1 << 24) as u32 });
    }
    if op.has_immediate() {
        e.imm = Some(rng.next() as u32);
    }
    if op.has_ieth() {
        e.ieth = Some(rng.next() as u32);
    }
    if op.has_atomic_eth() {
        e.atomic = Some(AtomicEthRepr {
            virtual_addr: rng.next(),
            rkey: rng.next() as u32,
            swap_add: rng.next(),
            compare: rng.next(),
        });
    }
    if op.has_atomic_ack_eth() {
        e.atomic_ack = Some(AtomicAckEthRepr { orig_remote_data: rng.next() });
    }
    if op.has_payload() {
        r.payload_len = if op == Opcode::Cnp { 16 } else { rng.below(1100) as usize };
    }
    r
}

const FIELDS: &[&str] = &[
    "ip.checksum.status",
    "_ws.malformed",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
];

fn num(v: &str) -> Option<u64> {
    let v = v.split(',').next()?;
    match v {
        "" => None,
        "True" => Some(1),
        "False" => Some(0),
        _ => Some(match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap(),
            None => v.parse().unwrap(),
        }),
    }
}

#[test]
fn tshark_agrees_with_emitted_frames() {
    if Command::new("tshark").arg("--version").output().is_err() {
        inc_test_support::skip(
            "tshark_agrees_with_emitted_frames",
            "tshark not installed (scripts/setup installs it)",
        );
        return;
    }
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let ops: Vec<Opcode> = Opcode::ALL.iter().copied().filter(|&o| o != Opcode::Cnp).collect();
    let frames: Vec<RoceRepr> =
        (0..400).map(|i| random_frame(&mut rng, ops[i % ops.len()])).collect();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("emitted.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    for (i, r) in frames.iter().enumerate() {
        let mut buf = vec![0u8; r.frame_len()];
        r.emit(&mut buf, |p| p.fill(i as u8)).unwrap();
        w.write_packet(&PcapPacket::new(Duration::ZERO, buf.len() as u32, &buf)).unwrap();
    }
    drop(w);

    let out = tshark_fields(&path);
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), frames.len());
    for (i, (r, row)) in frames.iter().zip(&rows).enumerate() {
        let get = |name: &str| num(row[FIELDS.iter().position(|f| *f == name).unwrap()]);
        let ctx = format!("frame {} ({})", i + 1, r.bth.opcode);
        assert_eq!(get("ip.checksum.status"), Some(1), "{ctx}: IPv4 checksum not good");
        assert_eq!(row[1], "", "{ctx}: tshark reports a malformed packet");
        let b = &r.bth;
        assert_eq!(get("infiniband.bth.opcode"), Some(u64::from(u8::from(b.opcode))), "{ctx}");
        assert_eq!(get("infiniband.bth.se"), Some(u64::from(b.solicited)), "{ctx}");
        assert_eq!(get("infiniband.bth.m"), Some(u64::from(b.mig_req)), "{ctx}");
        assert_eq!(get("infiniband.bth.padcnt"), Some(r.pad_len() as u64), "{ctx}");
        assert_eq!(get("infiniband.bth.p_key"), Some(u64::from(b.pkey)), "{ctx}");
        assert_eq!(get("infiniband.bth.destqp"), Some(u64::from(b.dest_qp)), "{ctx}");
        assert_eq!(get("infiniband.bth.a"), Some(u64::from(b.ack_req)), "{ctx}");
        assert_eq!(get("infiniband.bth.psn"), Some(u64::from(b.psn.value())), "{ctx}");
        let e = &r.ext;
        assert_eq!(
            get("infiniband.aeth.syndrome"),
            e.aeth.map(|a| u64::from(a.syndrome.to_byte())),
            "{ctx}"
        );
        assert_eq!(get("infiniband.aeth.msn"), e.aeth.map(|a| u64::from(a.msn)), "{ctx}");
        assert_eq!(get("infiniband.deth.q_key"), e.deth.map(|d| u64::from(d.qkey)), "{ctx}");
        assert_eq!(get("infiniband.deth.srcqp"), e.deth.map(|d| u64::from(d.src_qp)), "{ctx}");
        // Wireshark shows the AtomicETH address and R_Key under the RETH names.
        let va = e.reth.map(|x| x.virtual_addr).or(e.atomic.map(|a| a.virtual_addr));
        let rkey = e.reth.map(|x| x.rkey).or(e.atomic.map(|a| a.rkey));
        assert_eq!(get("infiniband.reth.va"), va, "{ctx}");
        assert_eq!(get("infiniband.reth.r_key"), rkey.map(u64::from), "{ctx}");
        assert_eq!(get("infiniband.reth.dmalen"), e.reth.map(|x| u64::from(x.dma_len)), "{ctx}");
        assert_eq!(get("infiniband.atomiceth.swapdt"), e.atomic.map(|a| a.swap_add), "{ctx}");
        assert_eq!(get("infiniband.atomiceth.cmpdt"), e.atomic.map(|a| a.compare), "{ctx}");
        assert_eq!(
            get("infiniband.atomicacketh.origremdt"),
            e.atomic_ack.map(|a| a.orig_remote_data),
            "{ctx}"
        );
        let imm = row[FIELDS.len() - 1].split(',').next().filter(|s| !s.is_empty());
        let imm = imm.map(|h| u32::from_str_radix(h, 16).unwrap());
        assert_eq!(imm, e.imm, "{ctx}");
    }
}

fn tshark_fields(path: &Path) -> String {
    let mut cmd = Command::new("tshark");
    cmd.args(["-n", "-r"]).arg(path).args(["-o", "ip.check_checksum:TRUE", "-T", "fields"]);
    cmd.args(["-E", "separator=/t", "-E", "occurrence=f"]);
    // Payload bytes are arbitrary; keep heuristic upper-layer dissectors off them.
    cmd.args(["--disable-protocol", "rpcordma"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(out.status.success(), "tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}
