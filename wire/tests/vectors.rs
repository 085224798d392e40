//! Real RoCEv2 packets captured from Linux rdma_rxe (see tests/fixtures/README.md):
//! every frame decodes, every ICRC is reproduced bit-exactly, re-emitting the parsed
//! representation gives the captured bytes, and the decoded fields agree with the
//! independent tshark dumps.

use std::collections::BTreeSet;
use std::path::PathBuf;

use inc_wire::{AethSyndrome, NakCode, Opcode, RoceFrame, RoceRepr};
use pcap_file::pcap::PcapReader;

const CAPTURES: [&str; 3] = ["ci-br", "ci-udpsw", "ci-fault"];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn frames(capture: &str) -> Vec<Vec<u8>> {
    let path = fixture(&format!("{capture}-roce.pcap"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = PcapReader::new(file).unwrap();
    let mut out = Vec::new();
    while let Some(p) = reader.next_packet() {
        let p = p.unwrap();
        assert_eq!(
            p.data.len() as u32,
            p.orig_len,
            "{capture}: frame {} was truncated",
            out.len() + 1
        );
        out.push(p.data.into_owned());
    }
    out
}

fn parse<'a>(capture: &str, n: usize, data: &'a [u8]) -> RoceFrame<'a> {
    RoceRepr::parse(data).unwrap_or_else(|e| panic!("{capture} frame {n}: {e}"))
}

#[test]
fn every_frame_decodes_with_valid_icrc_and_reemits_identically() {
    for capture in CAPTURES {
        let frames = frames(capture);
        assert!(!frames.is_empty());
        for (i, data) in frames.iter().enumerate() {
            let n = i + 1;
            let f = parse(capture, n, data);
            assert!(f.icrc_ok, "{capture} frame {n}: ICRC {:08x} does not verify", f.icrc);
            assert_eq!(f.repr.frame_len(), data.len(), "{capture} frame {n}: length");
            let mut buf = vec![0u8; f.repr.frame_len()];
            let len = f.repr.emit(&mut buf, |p| p.copy_from_slice(f.payload)).unwrap();
            assert_eq!(&buf[..len], &data[..], "{capture} frame {n}: re-emitted bytes differ");
        }
    }
}

#[test]
fn captures_cover_the_opcodes_and_syndromes_we_rely_on() {
    let mut ops = BTreeSet::new();
    let mut syndromes = BTreeSet::new();
    for capture in CAPTURES {
        for (i, data) in frames(capture).iter().enumerate() {
            let f = parse(capture, i + 1, data);
            ops.insert(u8::from(f.repr.bth.opcode));
            if let Some(a) = f.repr.ext.aeth {
                syndromes.insert(a.syndrome.to_byte());
            }
        }
    }
    use Opcode::*;
    for op in [
        RcSendFirst,
        RcSendMiddle,
        RcSendLast,
        RcSendLastWithImmediate,
        RcSendOnly,
        RcSendOnlyWithImmediate,
        RcRdmaWriteFirst,
        RcRdmaWriteMiddle,
        RcRdmaWriteLast,
        RcRdmaWriteOnly,
        RcRdmaWriteOnlyWithImmediate,
        RcRdmaReadRequest,
        RcRdmaReadResponseFirst,
        RcRdmaReadResponseMiddle,
        RcRdmaReadResponseLast,
        RcRdmaReadResponseOnly,
        RcAcknowledge,
        RcAtomicAcknowledge,
        RcCompareSwap,
        RcFetchAdd,
        UcSendFirst,
        UcSendLast,
        UdSendOnly,
    ] {
        assert!(ops.contains(&u8::from(op)), "no {op} in the captures");
    }
    assert!(syndromes.contains(&AethSyndrome::ACK.to_byte()));
    assert!(syndromes.contains(&AethSyndrome::Nak(NakCode::PsnSequenceError).to_byte()));
    assert!(syndromes.iter().any(|s| s >> 5 == 1), "no RNR NAK in the captures");
}

/// One row of a `*-decode.txt` tshark dump, by column name.
struct Dump {
    columns: Vec<(String, usize)>,
    rows: Vec<String>,
}

impl Dump {
    fn load(capture: &str) -> Dump {
        let text = std::fs::read_to_string(fixture(&format!("{capture}-decode.txt"))).unwrap();
        let mut lines = text.lines().skip_while(|l| !l.starts_with("--- packets")).skip(1);
        let header = lines.next().unwrap();
        // Columns are fixed-width: a column starts where its name starts in the header.
        let mut columns = Vec::new();
        let mut at = 0;
        for name in header.split_whitespace() {
            let start = header[at..].find(name).unwrap() + at;
            columns.push((name.to_string(), start));
            at = start + name.len();
        }
        let rows = lines.take_while(|l| !l.starts_with("---")).map(str::to_string).collect();
        Dump { columns, rows }
    }

    fn field<'a>(&self, row: &'a str, name: &str) -> Option<&'a str> {
        let i = self.columns.iter().position(|(n, _)| n == name).unwrap();
        let start = self.columns[i].1;
        let end = self.columns.get(i + 1).map_or(row.len(), |c| c.1).min(row.len());
        let v = row.get(start..end)?.trim();
        (!v.is_empty()).then_some(v)
    }
}

fn num(v: &str) -> u64 {
    // tshark repeats a field that occurs twice ("a,a"); take the first.
    let v = v.split(',').next().unwrap();
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => v.parse().unwrap(),
    }
}

#[test]
fn decoded_fields_match_tshark() {
    for capture in CAPTURES {
        let frames = frames(capture);
        let dump = Dump::load(capture);
        assert_eq!(dump.rows.len(), frames.len(), "{capture}: rows vs frames");
        for row in &dump.rows {
            let n = num(dump.field(row, "frame.number").unwrap()) as usize;
            let f = parse(capture, n, &frames[n - 1]);
            let r = &f.repr;
            let get = |name: &str| dump.field(row, name).map(num);
            let ctx = format!("{capture} frame {n}");
            assert_eq!(dump.field(row, "ip.src").unwrap(), r.ip_src.to_string(), "{ctx}");
            assert_eq!(dump.field(row, "ip.dst").unwrap(), r.ip_dst.to_string(), "{ctx}");
            assert_eq!(get("udp.srcport"), Some(u64::from(r.udp_src_port)), "{ctx}");
            assert_eq!(get("frame.len"), Some(r.frame_len() as u64), "{ctx}");
            assert_eq!(
                get("infiniband.bth.opcode"),
                Some(u64::from(u8::from(r.bth.opcode))),
                "{ctx}"
            );
            assert_eq!(get("infiniband.bth.se"), Some(u64::from(r.bth.solicited)), "{ctx}");
            assert_eq!(get("infiniband.bth.padcnt"), Some(u64::from(r.bth.pad_count)), "{ctx}");
            assert_eq!(get("infiniband.bth.destqp"), Some(u64::from(r.bth.dest_qp)), "{ctx}");
            assert_eq!(get("infiniband.bth.a"), Some(u64::from(r.bth.ack_req)), "{ctx}");
            assert_eq!(get("infiniband.bth.psn"), Some(u64::from(r.bth.psn.value())), "{ctx}");
            let aeth = r.ext.aeth;
            assert_eq!(
                get("infiniband.aeth.syndrome"),
                aeth.map(|a| u64::from(a.syndrome.to_byte())),
                "{ctx}"
            );
            assert_eq!(get("infiniband.aeth.msn"), aeth.map(|a| u64::from(a.msn)), "{ctx}");
            let deth = r.ext.deth;
            assert_eq!(get("infiniband.deth.q_key"), deth.map(|d| u64::from(d.qkey)), "{ctx}");
            assert_eq!(get("infiniband.deth.srcqp"), deth.map(|d| u64::from(d.src_qp)), "{ctx}");
            let reth = r.ext.reth;
            // tshark reports the AtomicETH address and R_Key under the RETH field names.
            let va = reth.map(|x| x.virtual_addr).or(r.ext.atomic.map(|a| a.virtual_addr));
            let rkey = reth.map(|x| x.rkey).or(r.ext.atomic.map(|a| a.rkey));
            assert_eq!(get("infiniband.reth.va"), va, "{ctx}");
            assert_eq!(get("infiniband.reth.r_key"), rkey.map(u64::from), "{ctx}");
            assert_eq!(get("infiniband.reth.dmalen"), reth.map(|x| u64::from(x.dma_len)), "{ctx}");
            let imm = dump
                .field(row, "infiniband.immdt")
                .map(|v| u64::from_str_radix(v.split(',').next().unwrap(), 16).unwrap());
            assert_eq!(imm, r.ext.imm.map(u64::from), "{ctx}");
            // tshark shows the ICRC bytes as a big-endian number; rxe stores the CRC
            // little-endian.
            assert_eq!(
                get("infiniband.invariant.crc"),
                Some(u64::from(f.icrc.swap_bytes())),
                "{ctx}"
            );
        }
    }
}
