//! `inc-pcap`: the project's packet debugging tool.

mod check;
mod source;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "inc-pcap",
    version,
    about = "Decode and verify RoCEv2 packet captures",
    long_about = "Decode and verify RoCEv2 packet captures (pcap or pcapng; Ethernet, \
                  Linux cooked SLL/SLL2 and raw-IP link types).\n\n\
                  Exit status: 0 if every RoCEv2 packet is well formed with a valid ICRC, \
                  1 if any is not, 2 if a file cannot be read."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Decode every frame, print one line per RoCEv2 packet and a summary; fail if any
    /// RoCEv2 packet has a bad ICRC or is malformed.
    ///
    /// Per packet: frame number, opcode, source IP:port > destination IP, destination
    /// QPN, PSN, AckReq (A or -), AETH syndrome and MSN or ImmDt, payload length,
    /// ICRC ok/BAD. Frames that are not RoCEv2 (UDP port 4791 over IPv4) are counted
    /// and skipped.
    Check {
        /// Capture files to check.
        #[arg(required = true, value_name = "FILE.pcap")]
        files: Vec<PathBuf>,
        /// Print only bad packets and the summary.
        #[arg(short, long)]
        quiet: bool,
        /// Also decode ImmDt as the INC immediate (dest rank/primitive/operator/type).
        #[arg(long)]
        inc_imm: bool,
        /// Also print per-connection statistics: one line per (source IP, destination
        /// IP, destination QP) with packets, requests, resent requests (PSN not after
        /// the highest seen), ACKs, NAKs, RNR NAKs and the PSN range.
        #[arg(long)]
        flows: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { files, quiet, inc_imm, flows } => {
            let opts = check::Options { quiet, inc_imm, flows };
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let mut failed = false;
            for file in &files {
                match check::check_file(file, &opts, &mut out) {
                    Ok(summary) => failed |= summary.failed(),
                    Err(e) => {
                        // A closed pipe (`inc-pcap check x | head`) is not an error.
                        if is_broken_pipe(&e) {
                            return ExitCode::SUCCESS;
                        }
                        let _ = out.flush();
                        eprintln!("inc-pcap: {}: {e:#}", file.display());
                        return ExitCode::from(2);
                    }
                }
            }
            if out.flush().is_err() {
                return ExitCode::SUCCESS;
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
