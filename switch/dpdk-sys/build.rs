//! Generates bindings to the system DPDK and compiles the C shim for its static-inline
//! fast-path functions. Needs `pkg-config` and the DPDK development files
//! (Debian: `libdpdk-dev`, installed by `scripts/setup dpdk`).

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// `pkg-config ARGS libdpdk`, split into flags; panics with what to install.
fn pkg_config(args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("libdpdk")
        .output()
        .unwrap_or_else(|e| panic!("cannot run pkg-config ({e}); install pkg-config"));
    if !out.status.success() {
        panic!(
            "pkg-config finds no libdpdk: {}install the DPDK development files \
             (sudo scripts/setup dpdk: its group of the project's package list)",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout)
        .expect("pkg-config output is UTF-8")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-changed=src/shim.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let version = pkg_config(&["--modversion"]).join("");
    let cflags = pkg_config(&["--cflags"]);

    let mut shim = cc::Build::new();
    shim.file("src/shim.c").warnings(true);
    for f in &cflags {
        shim.flag(f);
    }
    shim.compile("inc_dpdk_shim");

    for f in pkg_config(&["--libs"]) {
        if let Some(dir) = f.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = f.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={lib}");
        }
    }

    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    bindgen::Builder::default()
        // DPDK's C comments are not Rust: rustdoc would run their examples as doctests.
        .generate_comments(false)
        .header("src/shim.h")
        .clang_args(&cflags)
        .allowlist_function("inc_rte_.*")
        .allowlist_function(
            "rte_(eal_init|eal_cleanup|strerror|dev_probe|eal_hotplug_remove|socket_id|\
             thread_register|thread_unregister|pktmbuf_pool_create|mempool_free|\
             mempool_avail_count|mempool_in_use_count)",
        )
        .allowlist_function(
            "rte_eth_(dev_get_port_by_name|dev_get_name_by_port|dev_info_get|dev_configure|\
             rx_queue_setup|tx_queue_setup|dev_start|dev_stop|dev_close|promiscuous_enable|\
             promiscuous_disable|macaddr_get|dev_get_mtu|stats_get|dev_socket_id|\
             dev_adjust_nb_rx_tx_desc|dev_count_avail|dev_is_valid_port)",
        )
        .allowlist_var("RTE_ETH_(DEV_NO_OWNER|MQ_RX_NONE|MQ_TX_NONE)")
        .opaque_type("rte_mbuf")
        .opaque_type("rte_mempool")
        .derive_default(true)
        .layout_tests(false)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen over the DPDK {version} headers failed: {e}"))
        .write_to_file(out.join("bindings.rs"))
        .expect("writing DPDK bindings");
    println!("cargo:rustc-env=INC_DPDK_VERSION={version}");
}
