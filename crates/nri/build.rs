//! Generates the NRI API from the vendored api.proto (protoc from the system's protobuf-compiler).

fn main() {
    println!("cargo:rerun-if-changed=proto/api.proto");
    if let Err(e) = prost_build::Config::new().compile_protos(&["proto/api.proto"], &["proto"]) {
        // The only thing a build machine usually lacks here is protoc.
        panic!(
            "cannot generate the NRI API from proto/api.proto: {e} (install protoc: apt-get install protobuf-compiler)"
        );
    }
}
