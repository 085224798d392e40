//! `inccl-reducescatter <world_size> <master_addr> <rank> <count per block> [--dtype T,...|all] [--op OP,...|all] [--iters N] [--in-place] [--nonblocking K]` (see `--help`)

fn main() -> std::process::ExitCode {
    inccl_hosts::main_for(inccl_hosts::Collective::ReduceScatter)
}
