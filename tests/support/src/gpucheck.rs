//! Building gpucheck command lines and reading its verdicts.
//!
//! On a simulated node no driver sits behind the device nodes, so opening a node the cgroup
//! allows gives ENXIO, one it refuses gives EPERM, and one never created is absent.

use super::bundle::Bundle;
use super::image::glibc_image;
use super::runc::Output;

/// What nvhook writes in a Debian-layout image, checked from inside the container (the
/// engine's rootfs may be gone with it): the loader cache, nvhook's ld.so.conf.d file and the
/// directory made for it, the SONAME links and the development link. Their mount points
/// cannot be seen from inside, under the host's files bound on them.
pub const WRITTEN_SEEN_INSIDE: [&str; 6] = [
    "/etc/ld.so.cache",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.conf.d/000-nvhook.conf",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib/x86_64-linux-gnu/libcuda.so",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
];

/// gpucheck's `--owner` for each of `paths`.
pub fn owner_args<'a>(paths: &[&'a str]) -> Vec<&'a str> {
    paths.iter().flat_map(|path| ["--owner", path]).collect()
}

/// The nodes every GPU container with compute gets, whichever GPUs it asked for.
pub const CONTROL_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

pub fn gpu_node(index: u32) -> String {
    format!("/dev/nvidia{index}")
}

/// `/gpucheck` probing every GPU node of a `gpus`-GPU node and the control nodes, then `extra`.
/// A bundle of the glibc image running gpucheck over a node's `gpus` GPUs with `extra`
/// arguments, asking for GPUs `visible` with compute and utility.
pub fn compute_bundle(gpus: u32, visible: &str, extra: &[&str]) -> Bundle {
    compute_bundle_running(&gpucheck_args(gpus, extra), visible)
}

/// A bundle of the glibc image running `args`, asking for GPUs `visible` with compute and
/// utility.
pub fn compute_bundle_running(args: &[String], visible: &str) -> Bundle {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &args);
    bundle
        .env(&format!("NVIDIA_VISIBLE_DEVICES={visible}"))
        .env("NVIDIA_DRIVER_CAPABILITIES=compute,utility");
    bundle
}

pub fn gpucheck_args(gpus: u32, extra: &[&str]) -> Vec<String> {
    let nodes = (0..gpus)
        .map(gpu_node)
        .chain(CONTROL_NODES.map(String::from));
    std::iter::once("/gpucheck".to_owned())
        .chain(nodes.flat_map(|node| ["--dev".to_owned(), node]))
        .chain(extra.iter().map(|a| a.to_string()))
        .collect()
}

impl Output {
    /// `owner PATH 0:0` for each of `paths`: the container's root as the container sees it,
    /// which its user namespace maps to a host id (a file of the host's root shows as 65534,
    /// the overflow id, and one of another mapped id as that id).
    #[track_caller]
    pub fn assert_owned_by_root_inside(&self, paths: &[&str]) {
        let lines: Vec<String> = paths.iter().map(|p| format!("owner {p} 0:0")).collect();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        self.assert_lines(&lines);
    }

    /// GPUs in `visible` are usable (ENXIO); the other GPUs of the node are not there at all.
    #[track_caller]
    pub fn assert_gpus(&self, gpus: u32, visible: &[u32]) {
        for index in 0..gpus {
            let verdict = if visible.contains(&index) {
                "ENXIO"
            } else {
                "absent"
            };
            self.assert_lines(&[&format!("dev {} {verdict}", gpu_node(index))]);
        }
    }

    /// A container given GPU `allocated` of a `gpus`-GPU node and nothing else (gpucheck run
    /// with `--dev` for each GPU node and `--ls /dev`): that node usable, the others absent,
    /// only it in `/dev`, and libcuda loadable.
    #[track_caller]
    pub fn assert_allocated_gpu_only(&self, what: &str, gpus: u32, allocated: u32) {
        self.assert_success();
        for gpu in 0..gpus {
            let expected = if gpu == allocated { "ENXIO" } else { "absent" };
            let line = format!("dev {} {expected}", gpu_node(gpu));
            assert!(self.has_line(&line), "{what}: missing {line:?}\n{self}");
        }
        assert_eq!(
            self.gpu_nodes_in_dev(),
            [format!("nvidia{allocated}")],
            "{what}\n{self}"
        );
        assert!(
            self.has_line("dlopen libcuda.so.1 ok"),
            "{what}: libcuda not loadable\n{self}"
        );
    }

    /// A container given no GPU: no GPU node in `/dev`, and no driver library to load.
    #[track_caller]
    pub fn assert_no_gpu_given(&self, what: &str) {
        self.assert_success();
        assert!(self.gpu_nodes_in_dev().is_empty(), "{what}\n{self}");
        assert!(
            !self.has_line("dlopen libcuda.so.1 ok"),
            "{what}: driver library injected into a pod that was allocated no GPU\n{self}"
        );
    }

    /// GPU `gpu` alone of `gpus` with the control nodes, the host's libcuda loaded (cuInit 0),
    /// and the driver's `libcuda` (a gpucheck `--write` of it) not writable: refused by the
    /// read-only mount, or before it is looked at where the file is not the container's
    /// root's to write (a user namespace; which comes first depends on the runtime).
    #[track_caller]
    pub fn assert_only_gpu_with_read_only_driver(&self, gpus: u32, gpu: u32, libcuda: &str) {
        self.assert_success();
        self.assert_gpus(gpus, &[gpu]);
        self.assert_control_nodes_allowed();
        self.assert_lines(&["dlopen libcuda.so.1 ok", "cuInit 0"]);
        assert!(
            ["EROFS", "EACCES"]
                .iter()
                .any(|e| self.has_line(&format!("write {libcuda} {e}"))),
            "the driver's libcuda is writable\n{self}"
        );
    }

    #[track_caller]
    pub fn assert_control_nodes_allowed(&self) {
        for node in CONTROL_NODES {
            self.assert_lines(&[&format!("dev {node} ENXIO")]);
        }
    }

    /// The GPU nodes (`nvidiaN`) gpucheck's `--ls /dev` listed, e.g. `["nvidia1"]`.
    pub fn gpu_nodes_in_dev(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix("ls /dev "))
            .filter(|name| {
                name.strip_prefix("nvidia")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .collect()
    }
}
