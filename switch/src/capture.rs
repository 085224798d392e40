//! `--capture FILE.pcap`: every frame received and sent, in one classic pcap file
//! (Ethernet link type) readable by `inc-pcap check` and tshark.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::time::SystemTime;

use anyhow::Context;
use pcap_file::pcap::{PcapPacket, PcapWriter};

/// Pcap writer; write errors disable the capture (logged once) instead of stopping the switch.
pub struct Capture {
    writer: Option<PcapWriter<BufWriter<File>>>,
    path: String,
    frames: u64,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture").field("path", &self.path).field("frames", &self.frames).finish()
    }
}

impl Capture {
    /// Create (truncate) `path`.
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let file = File::create(path)
            .with_context(|| format!("cannot create capture file {}", path.display()))?;
        let writer = PcapWriter::new(BufWriter::with_capacity(1 << 20, file))
            .with_context(|| format!("cannot write pcap header to {}", path.display()))?;
        Ok(Capture { writer: Some(writer), path: path.display().to_string(), frames: 0 })
    }

    /// Record one frame (received or sent).
    pub fn frame(&mut self, frame: &[u8]) {
        let Some(w) = self.writer.as_mut() else { return };
        let ts = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        if let Err(e) = w.write_packet(&PcapPacket::new(ts, frame.len() as u32, frame)) {
            tracing::error!(path = %self.path, error = %e, "capture write failed; capture stopped");
            self.writer = None;
            return;
        }
        self.frames += 1;
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Flush buffered frames to the file.
    pub fn finish(&mut self) {
        if let Some(w) = self.writer.take() {
            let mut inner = w.into_writer();
            if let Err(e) = std::io::Write::flush(&mut inner) {
                tracing::error!(path = %self.path, error = %e, "capture flush failed");
            }
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.finish();
    }
}
