//! The mock is installed as `libnvidia-ml.so.<version>` behind a `libnvidia-ml.so.1`
//! symlink, exactly like the real driver library, so it must carry the same SONAME:
//! tools that inspect the driver files (ldconfig, the hook's library discovery) key on it.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
