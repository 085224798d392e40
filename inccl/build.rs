//! Build script: with feature `verbs`, generate bindings to the system libibverbs and
//! compile the C shim for its static-inline functions. Without it, nothing to do.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "verbs")]
    verbs::build();
}

#[cfg(feature = "verbs")]
mod verbs {
    use std::env;
    use std::path::PathBuf;

    pub fn build() {
        println!("cargo:rerun-if-changed=src/transport/verbs/shim.c");
        println!("cargo:rerun-if-changed=src/transport/verbs/shim.h");
        cc::Build::new()
            .file("src/transport/verbs/shim.c")
            .warnings(true)
            .extra_warnings(true)
            .compile("inccl_verbs_shim");
        println!("cargo:rustc-link-lib=ibverbs");
        let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
        bindgen::Builder::default()
            .header("src/transport/verbs/shim.h")
            .allowlist_function("ibv_(get_device_list|free_device_list|get_device_name|open_device|close_device|query_gid|alloc_pd|dealloc_pd|dereg_mr|create_cq|destroy_cq|create_comp_channel|destroy_comp_channel|get_cq_event|ack_cq_events|create_qp|destroy_qp|modify_qp)")
            .allowlist_function("inccl_shim_.*")
            .allowlist_type("ibv_(comp_channel|qp_attr|qp_init_attr|port_attr|wc|send_wr|recv_wr|sge|gid|qp_attr_mask|qp_state|mtu|wc_status|wc_opcode|wc_flags|wr_opcode|send_flags|access_flags|qp_type|port_state)")
            .allowlist_var("IBV_.*")
            .derive_default(true)
            .layout_tests(false)
            .generate()
            .expect("bindgen over infiniband/verbs.h (is libibverbs-dev installed?)")
            .write_to_file(out.join("verbs_bindings.rs"))
            .expect("writing verbs bindings");
    }
}
