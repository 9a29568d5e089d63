//! Generates the kubelet's plugin APIs from the vendored protos (proto/README.md). protox parses
//! them in Rust, so building the crate needs no protoc; tonic's generator writes the servers a
//! plugin implements and the clients the kubelet double uses.

const PROTOS: [&str; 4] = [
    "proto/pluginregistration/v1/api.proto",
    "proto/dra/v1/api.proto",
    "proto/dra/v1beta1/api.proto",
    "proto/dra-health/v1alpha1/api.proto",
];

fn main() {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])
        .unwrap_or_else(|e| panic!("cannot parse the kubelet's protos: {e}"));
    if let Err(e) = tonic_prost_build::configure().compile_fds(descriptors) {
        panic!("cannot generate the kubelet's plugin APIs: {e}");
    }
}
