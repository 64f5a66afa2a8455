//! Compiles Ichor's own Talos proto subset with tonic and prost, through protox: no
//! `protoc` is needed on the build machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/talos/common.proto",
        "proto/talos/machine.proto",
        "proto/talos/image.proto",
        "proto/talos/lifecycle.proto",
        "proto/talos/resource.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
