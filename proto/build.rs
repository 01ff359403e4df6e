//! Compiles `proto/dpcap/v1/*.proto` with protox (a pure-Rust protobuf compiler, so no system
//! `protoc` is needed) and generates tonic clients and servers from the descriptor set.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/dpcap/v1/errors.proto", "proto/dpcap/v1/accountant.proto", "proto/dpcap/v1/coordinator.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let descriptor_path = out.join("dpcap_v1_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        .bytes(".")
        .file_descriptor_set_path(&descriptor_path)
        .skip_protoc_run()
        .compile_fds(fds)?;
    Ok(())
}
