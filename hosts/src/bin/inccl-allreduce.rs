//! `inccl-allreduce <world_size> <master_addr> <rank> <count> [--root R] [--dtype int32|float32] [--op sum|max|min] [--iters N]`

fn main() -> std::process::ExitCode {
    inccl_hosts::main_for(inccl_hosts::Collective::AllReduce)
}
