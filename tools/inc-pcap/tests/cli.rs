//! Runs the `inc-pcap` binary on the rxe captures and on damaged copies of them.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wire/tests/fixtures").join(name)
}

fn run(args: &[&Path]) -> (i32, String) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_inc-pcap"))
        .arg("check")
        .args(args)
        .output()
        .expect("run inc-pcap");
    let text = String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap();
    (out.status.code().expect("exit code"), text)
}

fn read_frames(path: &Path) -> Vec<Vec<u8>> {
    let mut r = PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut v = Vec::new();
    while let Some(p) = r.next_packet() {
        v.push(p.unwrap().data.into_owned());
    }
    v
}

fn write_pcap(path: &Path, link: DataLink, frames: &[Vec<u8>]) {
    let header = PcapHeader { datalink: link, ..PcapHeader::default() };
    let mut w = PcapWriter::with_header(std::fs::File::create(path).unwrap(), header).unwrap();
    for f in frames {
        w.write_packet(&PcapPacket::new(Duration::ZERO, f.len() as u32, f)).unwrap();
    }
}

#[test]
fn shared_vectors_pass_with_expected_counts() {
    for (name, n) in
        [("ci-br-roce.pcap", 117), ("ci-udpsw-roce.pcap", 115), ("ci-fault-roce.pcap", 60)]
    {
        let (code, out) = run(&[&fixture(name)]);
        assert_eq!(code, 0, "{name}:\n{out}");
        let want =
            format!("{n} frames, {n} RoCEv2 ({n} ICRC ok, 0 ICRC bad, 0 malformed), 0 other");
        assert!(out.contains(&want), "{name}: expected `{want}` in\n{out}");
        assert_eq!(out.lines().filter(|l| l.ends_with("icrc ok")).count(), n, "{name}");
    }
    let (_, out) = run(&[&fixture("ci-fault-roce.pcap")]);
    assert!(out.contains("aeth NAK(PSN sequence error) msn 0"), "{out}");
    let (_, out) = run(&[&fixture("ci-br-roce.pcap")]);
    assert!(out.contains("aeth RNR_NAK(timer 18"), "{out}");
    assert!(out.contains("imm 0x11223344"), "{out}");
}

#[test]
fn flipped_payload_bit_fails_and_names_the_frame() {
    let dir = tempfile::tempdir().unwrap();
    let mut frames = read_frames(&fixture("ci-br-roce.pcap"));
    // Frame 13 is an RC_SEND_FIRST with 1024 payload bytes.
    frames[12][600] ^= 0x04;
    let path = dir.path().join("flipped.pcap");
    write_pcap(&path, DataLink::ETHERNET, &frames);
    let (code, out) = run(&[&path]);
    assert_eq!(code, 1, "{out}");
    let bad: Vec<&str> = out.lines().filter(|l| l.contains("icrc BAD")).collect();
    assert_eq!(bad.len(), 1, "{out}");
    assert!(bad[0].trim_start().starts_with("13  RC_SEND_FIRST"), "{}", bad[0]);
    assert!(out.contains("117 frames, 117 RoCEv2 (116 ICRC ok, 1 ICRC bad, 0 malformed)"), "{out}");
    // --quiet prints only the bad packet and the summary.
    let out = Command::new(env!("CARGO_BIN_EXE_inc-pcap"))
        .args(["check", "--quiet"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 3);
}

#[test]
fn malformed_frame_fails_and_names_the_frame() {
    let dir = tempfile::tempdir().unwrap();
    let mut frames = read_frames(&fixture("ci-br-roce.pcap"));
    // Frame 2 is an ACK: a pad count of 3 with no payload is malformed.
    frames[1][14 + 20 + 8 + 1] |= 0x30;
    let path = dir.path().join("malformed.pcap");
    write_pcap(&path, DataLink::ETHERNET, &frames);
    let (code, out) = run(&[&path]);
    assert_eq!(code, 1, "{out}");
    let line = out.lines().find(|l| l.contains("MALFORMED")).expect(&out);
    assert!(line.trim_start().starts_with("2  MALFORMED"), "{line}");
    assert!(line.contains("pad_count"), "{line}");
}

#[test]
fn cooked_and_pcapng_captures() {
    let dir = tempfile::tempdir().unwrap();
    let frames = read_frames(&fixture("ci-fault-roce.pcap"));
    // Linux cooked (SLL): replace the Ethernet header by the 16-byte SLL header.
    let sll: Vec<Vec<u8>> = frames
        .iter()
        .map(|f| {
            let mut v = vec![0, 0, 0, 1, 0, 6];
            v.extend_from_slice(&f[6..12]);
            v.extend_from_slice(&[0, 0]);
            v.extend_from_slice(&f[12..]);
            v
        })
        .collect();
    let sll_path = dir.path().join("sll.pcap");
    write_pcap(&sll_path, DataLink::LINUX_SLL, &sll);
    let (code, out) = run(&[&sll_path]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("60 frames, 60 RoCEv2 (60 ICRC ok"), "{out}");

    let ng_path = dir.path().join("eth.pcapng");
    let mut w = PcapNgWriter::new(std::fs::File::create(&ng_path).unwrap()).unwrap();
    w.write_pcapng_block(InterfaceDescriptionBlock {
        linktype: DataLink::ETHERNET,
        snaplen: 0,
        options: vec![],
    })
    .unwrap();
    for f in &frames {
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::ZERO,
            original_len: f.len() as u32,
            data: Cow::Borrowed(f),
            options: vec![],
        })
        .unwrap();
    }
    drop(w);
    let (code, out) = run(&[&ng_path]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("60 frames, 60 RoCEv2 (60 ICRC ok"), "{out}");
}

#[test]
fn unreadable_file_exits_2_and_names_it() {
    let (code, out) = run(&[Path::new("/nonexistent/x.pcap")]);
    assert_eq!(code, 2);
    assert!(out.contains("/nonexistent/x.pcap"), "{out}");
}

#[test]
fn flows_count_go_back_n_resends_naks_and_rnr_naks() {
    let out = Command::new(env!("CARGO_BIN_EXE_inc-pcap"))
        .args(["check", "--quiet", "--flows"])
        .arg(fixture("ci-fault-roce.pcap"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = String::from_utf8(out.stdout).unwrap();
    // The dropped SEND_MIDDLE: a sequence NAK, then PSNs 10902782..84 resent.
    assert!(out.contains("10.77.0.2 > 10.77.0.1 qp 0x000011: 11 requests (3 resent)"), "{out}");
    assert!(out.contains("10.77.0.1 > 10.77.0.2 qp 0x000011: 3 responses (2 ACK, 1 NAK"), "{out}");
    // A READ retried after a lost response and a SEND retried after 3 RNR NAKs.
    assert!(out.contains("10.77.0.2 > 10.77.0.1 qp 0x000012: 18 requests (4 resent)"), "{out}");
    assert!(out.contains("(13 ACK, 0 NAK, 3 RNR NAK)"), "{out}");
}
