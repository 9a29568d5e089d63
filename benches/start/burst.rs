//! A burst of GPU starts on a node whose NVML answer is not cached (right after a boot or a
//! driver upgrade), all at once through nvhook-runtime: with NVML's cache they share one
//! query; with `nvml-cache-file = ""` each asks NVML itself, as every cold start did before
//! they shared one. The mock NVML's init is a sleep, so the wall times show what waiting
//! for a shared query costs; on a real node, concurrent inits also contend in the driver,
//! which the count of inits stands for.

use crate::cycle;
use crate::setup::{Ask, Node, Variant, VariantSpec, Via, image};
use crate::stats::Samples;
use std::path::Path;
use std::time::{Duration, Instant};

/// One burst's result: when the last container was running, and NVML's inits.
struct Burst {
    last_running: Duration,
    inits: usize,
}

fn inits(node: &Node) -> usize {
    std::fs::read_to_string(node.sim.root().join("nvml-inits"))
        .unwrap_or_default()
        .lines()
        .count()
}

fn burst(node: &Node, variants: &mut [Variant]) -> Burst {
    // Cold, as after a boot: nothing cached for any of them.
    let _ = std::fs::remove_file(node.sim.root().join("run/nvml-inventory.json"));
    for v in variants.iter_mut() {
        v.bundle.renew_rootfs(image());
        v.bundle.write_config();
    }
    let before = inits(node);
    let barrier = std::sync::Barrier::new(variants.len());
    let t0 = Instant::now();
    let last_running = std::thread::scope(|scope| {
        let runs: Vec<_> = variants
            .iter()
            .map(|v| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let started = Instant::now();
                    let cost = cycle::run(&v.runtime, &v.bundle);
                    started + cost.phases[0] + cost.phases[1]
                })
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a start of the burst"))
            .max()
            .expect("a burst of at least one start")
    });
    Burst {
        last_running: last_running - t0,
        inits: inits(node) - before,
    }
}

/// `sizes` starts at once, `rounds` times each, with and without NVML's cache.
pub fn run(node: &Node, work: &Path, sizes: &[usize], rounds: usize) {
    println!(
        "## A burst of cold starts through nvhook-runtime ({})\n",
        node.label
    );
    println!(
        "| starts at once | NVML answer | last container running, p50 ms | max ms | NVML inits per burst |"
    );
    println!("|---|---|---|---|---|");
    for &n in sizes {
        for cached in [false, true] {
            let how = match cached {
                true => "shared (cache, cold)",
                false => "each start asks (no cache)",
            };
            let mut variants: Vec<Variant> = (0..n)
                .map(|i| {
                    let spec = VariantSpec {
                        label: format!("burst {n} {how} {i}"),
                        node,
                        ask: Ask::Gpus("all"),
                        via: Via::NvhookRuntime,
                        timed_hook: false,
                        parent: work,
                        nvml_cache: cached,
                    };
                    Variant::new(spec, work)
                })
                .collect();
            let mut times = Samples::default();
            let mut init_counts = Vec::new();
            for _ in 0..rounds {
                let b = burst(node, &mut variants);
                times.push(b.last_running.as_secs_f64() * 1000.0);
                init_counts.push(b.inits);
            }
            println!(
                "| {n} | {how} | {:.0} | {:.0} | {:?} |",
                times.p50(),
                times.percentile(100.0),
                init_counts
            );
        }
    }
    println!();
}
