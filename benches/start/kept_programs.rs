//! 14: the prestart hook's cgroup v2 step with device programs kept between containers, and
//! with each container loading its own. A container on GPU 0 through runc and the prestart
//! hook under cgroup v2 (cgroup2 mounted over /sys/fs/cgroup in a private mount namespace for
//! each start, as the tests run it), on two nodes alike but for `device-program-pins`: a bpffs
//! directory on one, `""` on the other; plus plain runc through the same wrapper. The variants
//! take turns, each round beginning at the next. Printed: the starts, and the hook's `cgroup`
//! step and total from each node's log. Nodes and bundles are on the tmpfs, as in the other
//! parts that time a hook's steps.

use crate::stats::Samples;
use crate::support::hook_log::hook_runs;
use crate::support::{Bpffs, Bundle, NodeOptions, RuntimeEnv, SimNode, glibc_image, run_container};
use std::time::Instant;

struct Variant {
    label: &'static str,
    node: Option<SimNode>,
    starts: Samples,
}

/// `rounds` starts per variant, after one warm-up start each.
pub fn run(rounds: usize) {
    let work = crate::setup::tmpfs_work_dir();
    let bpffs = Bpffs::mount();
    let node = |pins: String| {
        let node = SimNode::build(&NodeOptions {
            parent: Some(work.path().to_owned()),
            ..NodeOptions::gpus(8)
        });
        node.set("device-program-pins", &pins);
        Some(node)
    };
    let mut variants = [
        Variant {
            label: "runc, no GPU",
            node: None,
            starts: Samples::default(),
        },
        Variant {
            label: "GPU 0, each container loads its program",
            node: node("\"\"".into()),
            starts: Samples::default(),
        },
        Variant {
            label: "GPU 0, programs kept",
            node: node(format!("{:?}", bpffs.path().join("nvhook"))),
            starts: Samples::default(),
        },
    ];
    let n = variants.len();
    for round in 0..=rounds {
        for i in 0..n {
            let v = &mut variants[(round + i) % n];
            let mut bundle = Bundle::new_in(work.path(), glibc_image(), &["/gpucheck"]);
            if let Some(node) = &v.node {
                bundle.env("NVIDIA_VISIBLE_DEVICES=0");
                bundle.env("NVIDIA_DRIVER_CAPABILITIES=compute,utility");
                bundle.prestart_hook(node);
            }
            let started = Instant::now();
            let output = run_container(&bundle, RuntimeEnv::CgroupV2);
            let ms = started.elapsed().as_secs_f64() * 1e3;
            output.assert_success();
            if round > 0 {
                v.starts.push(ms);
            }
        }
    }
    println!(
        "# Device programs kept under cgroup v2 ({rounds} starts per variant, interleaved; runc run of gpucheck, GPU 0, compute,utility)\n"
    );
    println!(
        "| variant | start p50 | start p95 | Δ start p50 | `cgroup` step p50 | p95 | hook total p50 | programs reused |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let base = variants[1].starts.p50();
    let mut steps_p50 = Vec::new();
    for v in &variants {
        let start = v.starts.delta_row(v.label, base);
        let Some(node) = &v.node else {
            println!("{start} - | - | - | - |");
            continue;
        };
        // The warm-up's run is the first.
        let runs = &hook_runs(&node.log())[1..];
        assert_eq!(runs.len(), rounds, "one hook run per measured start");
        let step: Samples = runs
            .iter()
            .flat_map(|r| &r.steps)
            .filter(|(s, _)| s == "cgroup")
            .map(|&(_, us)| us as f64 / 1e3)
            .collect();
        let total: Samples = runs.iter().map(|r| r.total_us as f64 / 1e3).collect();
        let steps: Vec<String> = crate::step_medians(runs)
            .into_iter()
            .map(|(name, us)| format!("{name} {:.3}", us / 1e3))
            .collect();
        steps_p50.push((v.label, steps.join(", ")));
        let reused = node.log().matches("reused=true").count();
        println!(
            "{start} {:.3} | {:.3} | {:.3} | {reused} |",
            step.p50(),
            step.p95(),
            total.p50()
        );
    }
    println!();
    for (label, steps) in steps_p50 {
        println!("- {label}, the hook's steps, p50 ms: {steps}");
    }
    let kept = variants[2].starts.paired_minus(&variants[1].starts);
    println!(
        "\nKept against loaded, paired by round: start p50 {:+.2} ms, p95 {:+.2} ms; programs in the bpffs: {}.\n",
        kept.p50(),
        kept.p95(),
        bpffs.entries("nvhook").len()
    );
}
