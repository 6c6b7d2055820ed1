//! Compiles `proto/csi.proto` into Rust with tonic/prost.
//!
//! protoc comes from the `protoc-bin-vendored` crate, so a fresh machine needs no
//! system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/csi.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/csi.proto"], &["proto"])?;
    Ok(())
}
