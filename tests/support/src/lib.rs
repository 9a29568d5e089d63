//! Shared harness for end-to-end tests that start real containers with runc.
//!
//! A test file uses it as `use nvhook_test_support as support;`. It builds container images
//! from the host's own files, prepares OCI bundles (optionally with nvhook as a
//! prestart hook), creates simulated GPU nodes and runs containers under
//! cgroup v1 or v2. Everything panics with a clear message when a prerequisite
//! (root, runc, cc, busybox, simnode) is missing: these tests never skip.

pub mod apiserver;
pub mod arm64;
mod bundle;
mod cmd;
pub mod containerd2;
pub mod cri;
pub mod dra;
pub mod engines;
pub mod gpu_kit;
mod gpucheck;
pub mod hook_log;
pub mod hook_mounts;
mod image;
mod mountns;
mod mounts;
mod node;
pub mod podman;
pub mod rootless;
mod run;
mod runc;
mod snapshot;
mod watch;

pub use bundle::{Bundle, link_to_nvhook, nvhook_bin, run_nvhook};
pub use cmd::{
    containerd_1_7_in, ld_cache_entries_of_hex, output_of_copied_binary, readelf, require_program,
    require_root, run_checked, stdout_of, write_script,
};
pub use gpucheck::{
    CONTROL_NODES, WRITTEN_SEEN_INSIDE, compute_bundle, compute_bundle_running, gpu_node,
    gpucheck_args, owner_args,
};
pub use image::{
    CUDA_COMPAT_DIR, GlibcImageOptions, Image, LoaderCache, OLD_DRIVER_VERSION,
    build_busybox_image, build_glibc_image, build_musl_image, busybox_image, compile, glibc_image,
    glibc_image_with_fake_libcuda, source,
};
pub use mountns::{MountNs, table_diff};
pub use mounts::{Bpffs, host_mounts_referencing, kept_by_the_node, tree_listing};
pub use node::{NodeOptions, SimNode, profile_dir, simnode_bin, target_tmp_dir, workspace_bin};
pub use run::run_clean;
pub use runc::{
    Output, RuntimeEnv, run_container, run_container_with, run_detached_with, run_in_ns,
};
pub use snapshot::{Snapshot, host_snapshot};
pub use watch::OpenWatch;
