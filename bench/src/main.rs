//! `inc-bench`: one command that brings a topology up in network namespaces and measures
//! the INC switch backends side by side with their references, in the same run on the
//! same veths: dpdk-testpmd io-forwarding and kernel forwarding (frames/s), OpenMPI
//! MPI_Allreduce over TCP (time per size), and the bytes each host moves with INC vs a
//! ring AllReduce. Writes an nccl-tests style table, ratios, CSV, JSON and SVG plots.
//!
//! ```text
//! sudo target/release/inc-bench --out bench-out            # 4 B .. 1 GiB, every backend
//! sudo target/release/inc-bench --quick --out /tmp/quick   # CI size
//! ```

mod cli;
mod inc;
mod kernel;
mod machine;
mod model;
mod mpi;
mod netns;
mod perf;
mod plot;
mod procs;
mod refs;
mod report;
mod run;
mod stats;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    match run::run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("inc-bench: some measurements FAILED (see the status column)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("inc-bench: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
