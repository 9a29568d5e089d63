//! Generates the NRI API from the vendored api.proto. protox parses it in Rust, so building the
//! crate needs no protoc; prost-build turns the descriptors into the same code protoc's would.

fn main() {
    println!("cargo:rerun-if-changed=proto/api.proto");
    let descriptors = protox::compile(["proto/api.proto"], ["proto"])
        .unwrap_or_else(|e| panic!("cannot parse proto/api.proto: {e}"));
    if let Err(e) = prost_build::Config::new().compile_fds(descriptors) {
        panic!("cannot generate the NRI API from proto/api.proto: {e}");
    }
}
