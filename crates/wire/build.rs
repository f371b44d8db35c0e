//! Compiles `proto/noetl.proto` with a pure-Rust protobuf compiler (protox),
//! so building needs no system `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir =
        std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let file = proto_dir.join("noetl.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&proto_dir])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
