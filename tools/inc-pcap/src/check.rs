//! `inc-pcap check`: decode every frame, verify every RoCEv2 packet.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::Result;
use inc_wire::{
    rnr_timer_to_duration, AethRepr, AethSyndrome, Error as WireError, IncImm, NakCode, Opcode,
    Psn, RoceFrame, RoceRepr,
};

use crate::source::{for_each_frame, to_ethernet};

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub quiet: bool,
    pub inc_imm: bool,
    pub flows: bool,
}

/// Per-connection statistics for `--flows`: one entry per (source IP, destination IP,
/// destination QP, requests or responses), so each entry follows one PSN space.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flow {
    pub packets: u64,
    pub requests: u64,
    /// Requests whose PSN is not after the highest PSN seen before (go-back-N resends).
    pub resent: u64,
    pub acks: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub first_psn: Option<Psn>,
    pub highest_psn: Option<Psn>,
}

impl Flow {
    fn record(&mut self, r: &RoceRepr) {
        self.packets += 1;
        let psn = r.bth.psn;
        self.first_psn.get_or_insert(psn);
        if r.bth.opcode.is_request() {
            self.requests += 1;
            if self.highest_psn.is_some_and(|h| !psn.is_after(h)) {
                self.resent += 1;
            }
        }
        if self.highest_psn.is_none_or(|h| psn.is_after(h)) {
            self.highest_psn = Some(psn);
        }
        match r.ext.aeth.map(|a| a.syndrome) {
            Some(AethSyndrome::Ack { .. }) => self.acks += 1,
            Some(AethSyndrome::Nak(_)) => self.naks += 1,
            Some(AethSyndrome::RnrNak { .. }) => self.rnr_naks += 1,
            None => {}
        }
    }
}

/// (source, destination, destination QP, true for responses: ACKs, READ/atomic responses)
type FlowKey = (Ipv4Addr, Ipv4Addr, u32, bool);

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub frames: u64,
    pub roce: u64,
    pub icrc_ok: u64,
    pub icrc_bad: u64,
    pub malformed: u64,
    /// RoCEv2 frames cut short by the capture's snap length: not verifiable.
    pub snapped: u64,
    /// Frames that are not RoCEv2 (or whose link type is not supported).
    pub other: u64,
    pub opcodes: BTreeMap<u8, u64>,
    pub flows: BTreeMap<FlowKey, Flow>,
}

impl Summary {
    /// True if some RoCEv2 packet was malformed or had a bad ICRC.
    pub fn failed(&self) -> bool {
        self.icrc_bad > 0 || self.malformed > 0
    }
}

/// Checks one capture, writing per-packet lines and a summary to `out`.
pub fn check_file(path: &Path, opts: &Options, out: &mut impl Write) -> Result<Summary> {
    let mut s = Summary::default();
    let mut line = String::new();
    for_each_frame(path, |n, frame| {
        s.frames += 1;
        let Some(eth) = to_ethernet(frame.link, frame.data) else {
            s.other += 1;
            return Ok(());
        };
        let snapped = (frame.data.len() as u64) < u64::from(frame.orig_len);
        line.clear();
        match RoceRepr::parse(&eth) {
            Err(WireError::NotRoce { .. }) => {
                s.other += 1;
                return Ok(());
            }
            Err(e) if snapped => {
                s.roce += 1;
                s.snapped += 1;
                writeln!(
                    line,
                    "{n:>6}  not verifiable: captured {} of {} bytes ({e})",
                    frame.data.len(),
                    frame.orig_len
                )?;
            }
            Err(e) => {
                s.roce += 1;
                s.malformed += 1;
                writeln!(line, "{n:>6}  MALFORMED RoCEv2 frame: {e}")?;
            }
            Ok(f) => {
                s.roce += 1;
                *s.opcodes.entry(f.repr.bth.opcode.into()).or_default() += 1;
                if opts.flows {
                    let r = &f.repr;
                    let key = (r.ip_src, r.ip_dst, r.bth.dest_qp, r.bth.opcode.is_response());
                    s.flows.entry(key).or_default().record(&f.repr);
                }
                if f.icrc_ok {
                    s.icrc_ok += 1;
                } else {
                    s.icrc_bad += 1;
                }
                if !f.icrc_ok || !opts.quiet {
                    describe(&mut line, n, &f, opts)?;
                }
            }
        }
        out.write_all(line.as_bytes())?;
        Ok(())
    })?;
    write_summary(out, path, &s)?;
    Ok(s)
}

fn syndrome(a: &AethRepr) -> String {
    match a.syndrome {
        AethSyndrome::Ack { credits: 0x1f } => "ACK".to_string(),
        AethSyndrome::Ack { credits } => format!("ACK(credits {credits})"),
        AethSyndrome::RnrNak { timer } => {
            format!("RNR_NAK(timer {timer} = {:?})", rnr_timer_to_duration(timer))
        }
        AethSyndrome::Nak(code) => match code {
            NakCode::PsnSequenceError => "NAK(PSN sequence error)".to_string(),
            NakCode::InvalidRequest => "NAK(invalid request)".to_string(),
            NakCode::RemoteAccessError => "NAK(remote access error)".to_string(),
            NakCode::RemoteOperationalError => "NAK(remote operational error)".to_string(),
            NakCode::InvalidRdRequest => "NAK(invalid RD request)".to_string(),
            NakCode::Reserved(c) => format!("NAK(reserved code {c})"),
        },
    }
}

fn describe(line: &mut String, n: u64, f: &RoceFrame<'_>, opts: &Options) -> std::fmt::Result {
    let r = &f.repr;
    let op = match r.bth.opcode {
        Opcode::Unknown(c) => format!("UNKNOWN(0x{c:02x})"),
        op => op.name().to_string(),
    };
    write!(
        line,
        "{n:>6}  {op:<34} {}:{} > {}  qp 0x{:06x}  psn {:>8}  {}",
        r.ip_src,
        r.udp_src_port,
        r.ip_dst,
        r.bth.dest_qp,
        r.bth.psn,
        if r.bth.ack_req { "A" } else { "-" },
    )?;
    if let Some(a) = &r.ext.aeth {
        write!(line, "  aeth {} msn {}", syndrome(a), a.msn)?;
    }
    if let Some(imm) = r.ext.imm {
        write!(line, "  imm 0x{imm:08x}")?;
        if opts.inc_imm {
            match IncImm::decode(imm) {
                Ok(i) => write!(line, " [{i}]")?,
                Err(e) => write!(line, " [{e}]")?,
            }
        }
    }
    if let Some(d) = &r.ext.deth {
        write!(line, "  src_qp 0x{:06x}", d.src_qp)?;
    }
    if let Some(x) = &r.ext.reth {
        write!(line, "  dma_len {}", x.dma_len)?;
    }
    write!(line, "  len {}", r.payload_len)?;
    if f.icrc_ok {
        writeln!(line, "  icrc ok")
    } else {
        let expected = {
            let mut b = vec![0u8; r.frame_len()];
            r.emit(&mut b, |p| p.copy_from_slice(f.payload)).ok();
            u32::from_le_bytes(b[b.len() - 4..].try_into().unwrap_or([0; 4]))
        };
        writeln!(line, "  icrc BAD (stored {:08x}, computed {expected:08x})", f.icrc)
    }
}

fn write_summary(out: &mut impl Write, path: &Path, s: &Summary) -> std::io::Result<()> {
    writeln!(
        out,
        "{}: {} frames, {} RoCEv2 ({} ICRC ok, {} ICRC bad, {} malformed{}), {} other",
        path.display(),
        s.frames,
        s.roce,
        s.icrc_ok,
        s.icrc_bad,
        s.malformed,
        if s.snapped > 0 { format!(", {} cut by snap length", s.snapped) } else { String::new() },
        s.other
    )?;
    if !s.opcodes.is_empty() {
        let list: Vec<String> =
            s.opcodes.iter().map(|(&op, count)| format!("{} {count}", Opcode::from(op))).collect();
        writeln!(out, "  opcodes: {}", list.join(", "))?;
    }
    for ((src, dst, qp, response), f) in &s.flows {
        let psns = match (f.first_psn, f.highest_psn) {
            (Some(a), Some(b)) => format!("psn {a}..{b}"),
            _ => String::new(),
        };
        let what = if *response {
            format!(
                "{} responses ({} ACK, {} NAK, {} RNR NAK)",
                f.packets, f.acks, f.naks, f.rnr_naks
            )
        } else {
            format!("{} requests ({} resent)", f.requests, f.resent)
        };
        writeln!(out, "  flow {src} > {dst} qp 0x{qp:06x}: {what}, {psns}")?;
    }
    Ok(())
}
