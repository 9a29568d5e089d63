//! Load: 16 GPU containers started at once through runc and the nvhook prestart hook on a
//! simulated 16-GPU node, each asking for a different GPU. Every one must start, reach its
//! own GPU (ENXIO: the cgroup lets it through to a node with no driver) and see no other
//! GPU node; the mount table of the namespace the runtimes ran in must be the same after as
//! before. Run as root after `cargo build --workspace`: `cargo test --test load_e2e`.

use nvhook_test_support as support;

use std::sync::Barrier;
use std::time::Instant;

use support::{
    Bundle, MountNs, Output, RuntimeEnv, SimNode, glibc_image, host_mounts_referencing,
    require_program, require_root, run_in_ns, table_diff,
};

const GPUS: u32 = 16;

#[test]
fn sixteen_parallel_containers_each_see_exactly_their_own_gpu() {
    require_root();
    let node = SimNode::create(GPUS);
    let runc = require_program("runc");
    let ns = MountNs::new(RuntimeEnv::CgroupV1);
    let mut args = vec!["/gpucheck".to_owned()];
    for k in 0..GPUS {
        args.extend(["--dev".to_owned(), format!("/dev/nvidia{k}")]);
    }
    args.extend(["--ls".to_owned(), "/dev".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let bundles: Vec<Bundle> = (0..GPUS)
        .map(|gpu| {
            let mut bundle = Bundle::new(glibc_image(), &args);
            bundle
                .env(&format!("NVIDIA_VISIBLE_DEVICES={gpu}"))
                .prestart_hook(&node);
            bundle
        })
        .collect();

    let table_before = ns.table();
    let started = Instant::now();
    let all_ready = Barrier::new(bundles.len());
    let outputs: Vec<Output> = std::thread::scope(|s| {
        let runs: Vec<_> = bundles
            .iter()
            .map(|bundle| {
                let (ns, runc, all_ready) = (&ns, &runc, &all_ready);
                s.spawn(move || {
                    all_ready.wait();
                    run_in_ns(bundle, ns, runc, &[])
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("container thread"))
            .collect()
    });
    let elapsed = started.elapsed();
    let table_after = ns.table();
    eprintln!(
        "{GPUS} GPU containers in parallel: {:.2} s",
        elapsed.as_secs_f64()
    );

    let mut broken = Vec::new();
    for (gpu, mut out) in (0..GPUS).zip(outputs) {
        out.hook_log = Some(node.log());
        broken.extend(
            own_gpu_only(gpu, &out)
                .into_iter()
                .map(|e| format!("GPU {gpu}: {e}\n{out}")),
        );
    }
    broken.extend(
        table_diff(&table_before, &table_after)
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
    assert!(broken.is_empty(), "{}", broken.join("\n"));
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
