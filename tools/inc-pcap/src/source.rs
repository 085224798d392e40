//! Reading frames from pcap/pcapng files and normalising link types to Ethernet.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::DataLink;

/// One captured frame.
pub struct Frame<'a> {
    pub link: DataLink,
    pub data: &'a [u8],
    /// Length on the wire; larger than `data` if the capture's snap length cut it.
    pub orig_len: u32,
}

const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// Calls `f` for every frame of the pcap or pcapng file at `path`, numbered from 1.
pub fn for_each_frame(path: &Path, mut f: impl FnMut(u64, Frame<'_>) -> Result<()>) -> Result<()> {
    let mut file = BufReader::new(File::open(path).context("cannot open")?);
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic).context("cannot read the file header (empty file?)")?;
    let file = BufReader::new(File::open(path).context("cannot reopen")?);
    let mut n = 0u64;
    if magic == PCAPNG_MAGIC {
        let mut reader = PcapNgReader::new(file).context("not a valid pcapng file")?;
        // Link types of the current section's interfaces, by interface id. (The reader
        // tracks them too, but its blocks borrow it, so it cannot be asked here.)
        let mut links: Vec<DataLink> = Vec::new();
        while let Some(block) = reader.next_block() {
            let block = block.with_context(|| format!("pcapng block after frame {n}"))?;
            match block {
                Block::SectionHeader(_) => links.clear(),
                Block::InterfaceDescription(idb) => links.push(idb.linktype),
                Block::EnhancedPacket(epb) => {
                    n += 1;
                    let Some(&link) = links.get(epb.interface_id as usize) else {
                        bail!("frame {n}: unknown pcapng interface {}", epb.interface_id);
                    };
                    f(n, Frame { link, data: &epb.data, orig_len: epb.original_len })?;
                }
                Block::SimplePacket(spb) => {
                    n += 1;
                    let Some(&link) = links.first() else {
                        bail!("frame {n}: simple packet block before any interface");
                    };
                    f(n, Frame { link, data: &spb.data, orig_len: spb.original_len })?;
                }
                _ => {}
            }
        }
    } else {
        let mut reader = PcapReader::new(file).context("not a pcap or pcapng file")?;
        let link = reader.header().datalink;
        while let Some(pkt) = reader.next_packet() {
            let pkt = pkt.with_context(|| format!("pcap record after frame {n}"))?;
            n += 1;
            f(n, Frame { link, data: &pkt.data, orig_len: pkt.orig_len })?;
        }
    }
    Ok(())
}

/// The frame as an Ethernet frame, synthesising an Ethernet header for Linux cooked
/// (SLL, SLL2) and raw-IP captures; `None` for other link types or too-short headers.
pub fn to_ethernet<'a>(link: DataLink, data: &'a [u8]) -> Option<Cow<'a, [u8]>> {
    fn synth(src: &[u8], ethertype: [u8; 2], rest: &[u8]) -> Cow<'static, [u8]> {
        let mut v = Vec::with_capacity(14 + rest.len());
        v.extend_from_slice(&[0; 6]);
        let mut mac = [0u8; 6];
        if src.len() == 6 {
            mac.copy_from_slice(src);
        }
        v.extend_from_slice(&mac);
        v.extend_from_slice(&ethertype);
        v.extend_from_slice(rest);
        Cow::Owned(v)
    }
    match link {
        DataLink::ETHERNET => Some(Cow::Borrowed(data)),
        DataLink::LINUX_SLL => {
            // packet type(2) ARPHRD(2) addr len(2) addr(8) protocol(2)
            let h = data.get(..16)?;
            let alen = usize::from(u16::from_be_bytes([h[4], h[5]])).min(8);
            Some(synth(&h[6..6 + alen], [h[14], h[15]], &data[16..]))
        }
        DataLink::LINUX_SLL2 => {
            // protocol(2) reserved(2) ifindex(4) ARPHRD(2) packet type(1) addr len(1) addr(8)
            let h = data.get(..20)?;
            let alen = usize::from(h[11]).min(8);
            Some(synth(&h[12..12 + alen], [h[0], h[1]], &data[20..]))
        }
        DataLink::RAW | DataLink::IPV4 => {
            if data.first()? >> 4 == 4 {
                Some(synth(&[], [0x08, 0x00], data))
            } else {
                None
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooked_headers_become_ethernet() {
        let ip = [0x45u8, 0, 0, 20];
        let mut sll = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 9, 0, 0, 0x08, 0x00];
        sll.extend_from_slice(&ip);
        let e = to_ethernet(DataLink::LINUX_SLL, &sll).unwrap();
        assert_eq!(&e[6..12], &[2, 0, 0, 0, 0, 9]);
        assert_eq!(&e[12..], &[0x08, 0x00, 0x45, 0, 0, 20]);
        let mut sll2 = vec![0x08, 0x00, 0, 0, 0, 0, 0, 3, 0, 1, 0, 6, 2, 0, 0, 0, 0, 7, 0, 0];
        sll2.extend_from_slice(&ip);
        let e = to_ethernet(DataLink::LINUX_SLL2, &sll2).unwrap();
        assert_eq!(&e[6..12], &[2, 0, 0, 0, 0, 7]);
        assert_eq!(&e[12..], &[0x08, 0x00, 0x45, 0, 0, 20]);
        let e = to_ethernet(DataLink::RAW, &ip).unwrap();
        assert_eq!(&e[12..], &[0x08, 0x00, 0x45, 0, 0, 20]);
        assert!(to_ethernet(DataLink::LINUX_SLL, &sll[..10]).is_none());
        assert!(to_ethernet(DataLink::IEEE802_11, &ip).is_none());
    }
}
