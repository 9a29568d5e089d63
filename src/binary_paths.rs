//! Where nvhook's binaries are: side by side (nvhook, nvhook-runtime, nvhook-nvml), wherever
//! they were installed. Every default that names one of them (configure's runtime path,
//! doctor's expectation, the hook path nvhook-runtime writes into a container) comes from
//! here, so that they always agree.

use std::path::PathBuf;

/// Where the packages install nvhook: stands in only where `/proc/self/exe` cannot say.
pub const PACKAGED_NVHOOK: &str = "/usr/bin/nvhook";

/// The running nvhook's own path.
pub fn this_nvhook() -> PathBuf {
    std::env::current_exe().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read /proc/self/exe: assuming {PACKAGED_NVHOOK}");
        PathBuf::from(PACKAGED_NVHOOK)
    })
}

/// The binary `name` beside the running nvhook: in `/usr/bin` for the packages, in the build
/// directory after `cargo build`, in `/usr/local/nvhook/bin` for the Kubernetes installer.
pub fn beside_nvhook(name: &str) -> PathBuf {
    this_nvhook().with_file_name(name)
}
