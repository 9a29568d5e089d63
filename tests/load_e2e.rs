//! Load: 100 GPU containers started at the same moment (a barrier) on a simulated 50-GPU
//! node, through runc with the nvhook prestart hook and through nvhook-runtime, on cgroup v1
//! and v2; container `i` asks for GPU `i % 50`. Every one must start, reach its own GPU (ENXIO:
//! the cgroup lets it through to a node with no driver) and see no other GPU node. Once all
//! have stopped, nothing may be left: the mount table of the runtimes' namespace is the same
//! as before, no host mount names a bundle or the node, no container cgroup remains, and the
//! host's files and the node's (but for nvhook's log, its NVML cache and the /dev/char links)
//! are as they were. Each test prints the wall time to the last exit and the slowest start.
//! Run as root after `cargo build --workspace`: `cargo test --test load_e2e`.

use nvhook_test_support as support;

use std::path::Path;
use std::process::Command;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use support::engines::nvhook_runtime_bin;
use support::{
    Bundle, MountNs, Output, RuntimeEnv, SimNode, Snapshot, glibc_image, host_mounts_referencing,
    host_snapshot, require_program, require_root, run_in_ns, table_diff,
};

const GPUS: u32 = 50;
const CONTAINERS: u32 = 100;

/// One burst at a time: the figures are each burst's own, not two bursts' sharing two cores.
static ONE_BURST: Mutex<()> = Mutex::new(());

#[derive(Clone, Copy, Debug)]
enum Via {
    /// runc, with nvhook as the spec's prestart hook.
    Hook,
    /// nvhook-runtime in runc's place: it writes the devices into config.json and adds the hook.
    NvhookRuntime,
}

#[test]
fn hundred_parallel_starts_through_the_hook_cgroup_v1() {
    parallel_starts(Via::Hook, RuntimeEnv::CgroupV1);
}

#[test]
fn hundred_parallel_starts_through_the_hook_cgroup_v2() {
    parallel_starts(Via::Hook, RuntimeEnv::CgroupV2);
}

#[test]
fn hundred_parallel_starts_through_nvhook_runtime_cgroup_v1() {
    parallel_starts(Via::NvhookRuntime, RuntimeEnv::CgroupV1);
}

#[test]
fn hundred_parallel_starts_through_nvhook_runtime_cgroup_v2() {
    parallel_starts(Via::NvhookRuntime, RuntimeEnv::CgroupV2);
}

fn parallel_starts(via: Via, env: RuntimeEnv) {
    require_root();
    let _one = ONE_BURST.lock().unwrap_or_else(|e| e.into_inner());
    let node = SimNode::create(GPUS);
    let ns = MountNs::new(env);
    let runtime = match via {
        Via::Hook => require_program("runc"),
        Via::NvhookRuntime => nvhook_runtime_bin().to_owned(),
    };
    let config = node.config().display().to_string();
    let vars: Vec<(&str, &str)> = match via {
        Via::Hook => vec![],
        Via::NvhookRuntime => vec![("NVHOOK_CONFIG", config.as_str())],
    };
    let mut args = vec!["/gpucheck".to_owned()];
    for k in 0..GPUS {
        args.extend(["--dev".to_owned(), format!("/dev/nvidia{k}")]);
    }
    args.extend(["--ls".to_owned(), "/dev".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let bundles: Vec<Bundle> = (0..CONTAINERS)
        .map(|i| {
            let mut bundle = Bundle::new(glibc_image(), &args);
            bundle.env(&format!("NVIDIA_VISIBLE_DEVICES={}", i % GPUS));
            if let Via::Hook = via {
                bundle.prestart_hook(&node);
            }
            bundle
        })
        .collect();

    let table_before = ns.table();
    let host_before = host_snapshot();
    let node_before = node_files(&node);
    let started = Instant::now();
    let all_ready = Barrier::new(bundles.len());
    let outputs: Vec<(Output, Duration)> = std::thread::scope(|s| {
        let runs: Vec<_> = bundles
            .iter()
            .map(|bundle| {
                let (ns, runtime, vars, all_ready) = (&ns, &runtime, &vars, &all_ready);
                s.spawn(move || {
                    all_ready.wait();
                    let own = Instant::now();
                    let out = run_in_ns(bundle, ns, runtime, vars);
                    (out, own.elapsed())
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("container thread"))
            .collect()
    });
    let elapsed = started.elapsed();
    let slowest = outputs.iter().map(|(_, d)| *d).max().unwrap_or_default();
    eprintln!(
        "{CONTAINERS} GPU containers in parallel via {via:?} on {env:?}: {:.2} s to the last exit, slowest start-to-exit {:.2} s",
        elapsed.as_secs_f64(),
        slowest.as_secs_f64()
    );

    let mut broken = Vec::new();
    for (i, (mut out, _)) in (0..CONTAINERS).zip(outputs) {
        out.hook_log = Some(node.log());
        let gpu = i % GPUS;
        broken.extend(
            own_gpu_only(gpu, &out)
                .into_iter()
                .map(|e| format!("container {i} (GPU {gpu}): {e}\n{out}")),
        );
    }
    broken.extend(
        table_diff(&table_before, &ns.table())
            .into_iter()
            .map(|l| format!("mount table changed: {l}")),
    );
    let mut watched: Vec<_> = bundles.iter().map(Bundle::dir).collect();
    watched.push(node.root());
    broken.extend(
        host_mounts_referencing(&watched)
            .into_iter()
            .map(|l| format!("mount left on the host: {l}")),
    );
    let ids: Vec<&str> = bundles.iter().map(Bundle::id).collect();
    broken.extend(
        cgroups_left(&ns, &ids)
            .into_iter()
            .map(|c| format!("cgroup left: {c}")),
    );
    broken.extend(
        host_before
            .diff(&host_snapshot())
            .into_iter()
            .map(|l| format!("host file changed: {l}")),
    );
    broken.extend(
        node_before
            .diff(&node_files(&node))
            .into_iter()
            .map(|l| format!("node file changed: {l}")),
    );
    // One failure is enough to see; a hundred copies of it are not.
    broken.truncate(5);
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The node's files that no start may change: all but what nvhook keeps there on purpose
/// (and the times of the directories those are in).
fn node_files(node: &SimNode) -> Snapshot {
    let kept = ["nvhook.log", "nvml-inits", "run", "dev/char"];
    let mut snapshot = Snapshot::tree(node.root());
    snapshot.retain(|path| {
        let rel = Path::new(path)
            .strip_prefix(node.root())
            .unwrap_or(Path::new(path));
        let holds_kept = rel == Path::new("") || rel == Path::new("dev");
        !holds_kept && !kept.iter().any(|k| rel.starts_with(k))
    });
    snapshot
}

/// Cgroup directories, in the runtimes' namespace, named after one of the containers.
fn cgroups_left(ns: &MountNs, ids: &[&str]) -> Vec<String> {
    let out = Command::new(require_program("nsenter"))
        .args(ns.nsenter().into_iter().skip(1))
        .args(["find", "/sys/fs/cgroup", "-maxdepth", "3", "-type", "d"])
        .output()
        .expect("list cgroups in the namespace");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|dir| ids.iter().any(|id| dir.ends_with(&format!("/{id}"))))
        .map(String::from)
        .collect()
}

/// What is wrong with container `gpu`'s view, if anything.
fn own_gpu_only(gpu: u32, out: &Output) -> Vec<String> {
    let mut wrong = Vec::new();
    if !out.status.success() {
        wrong.push("the container failed".to_owned());
    }
    for k in 0..GPUS {
        let verdict = if k == gpu { "ENXIO" } else { "absent" };
        let line = format!("dev /dev/nvidia{k} {verdict}");
        if !out.has_line(&line) {
            wrong.push(format!("missing {line:?}"));
        }
    }
    let gpu_nodes = out.gpu_nodes_in_dev();
    if gpu_nodes != [format!("nvidia{gpu}")] {
        wrong.push(format!("GPU nodes in /dev: {gpu_nodes:?}"));
    }
    if !out.has_line("cuInit 0") {
        wrong.push("cuInit did not return 0".to_owned());
    }
    wrong
}
