//! `inccl-barrier <world_size> <master_addr> <rank> <count> [--iters N]` (count ignored)

fn main() -> std::process::ExitCode {
    inccl_hosts::main_for(inccl_hosts::Collective::Barrier)
}
