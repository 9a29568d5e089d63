//! 11: GPU memory limits. A container on GPU 0 through runc and the prestart hook (cgroup v2:
//! cgroup2 mounted over /sys/fs/cgroup in a private mount namespace for each start, as the
//! tests run it), without limits and with `NVIDIA_GPU_MEMORY_REQUEST`/`_LIMIT`, taking turns
//! round by round; plus a plain runc start through the same wrapper. What the limits cost is
//! one NVML helper round trip (`nvhook-nvml set-memory-limits`), the hook's `memory limits`
//! step; a container without limits runs no such step and starts no helper (the mock's record
//! proves no call).

use crate::stats::Samples;
use crate::support::{Bundle, RuntimeEnv, SimNode, glibc_image, run_container};
use std::time::Instant;

const LIMITS: [&str; 2] = [
    "NVIDIA_GPU_MEMORY_REQUEST=512",
    "NVIDIA_GPU_MEMORY_LIMIT=1024",
];

struct Variant {
    label: &'static str,
    gpu: bool,
    env: &'static [&'static str],
    samples: Samples,
}

/// `rounds` starts per variant, after one warm-up start each.
pub fn run(rounds: usize) {
    let node = SimNode::create(8);
    let variant = |label, gpu, env| Variant {
        label,
        gpu,
        env,
        samples: Samples::default(),
    };
    let mut variants = [
        variant("runc, no GPU", false, &[]),
        variant("GPU 0, no limits", true, &[]),
        variant("GPU 0, request 512 MiB, limit 1024 MiB", true, &LIMITS),
    ];
    for round in 0..=rounds {
        for v in variants.iter_mut() {
            let mut bundle = Bundle::new(glibc_image(), &["/gpucheck"]);
            if v.gpu {
                bundle.env("NVIDIA_VISIBLE_DEVICES=0");
                bundle.env("NVIDIA_DRIVER_CAPABILITIES=compute,utility");
                for var in v.env {
                    bundle.env(var);
                }
                bundle.prestart_hook(&node);
            }
            let started = Instant::now();
            let output = run_container(&bundle, RuntimeEnv::CgroupV2);
            let ms = started.elapsed().as_secs_f64() * 1e3;
            output.assert_success();
            if round > 0 {
                v.samples.push(ms);
            }
        }
    }
    let calls = node.memory_limit_calls().len();
    assert_eq!(
        calls,
        rounds + 1,
        "one NVML call per limited start, none for the others"
    );
    let step = step_samples(&node.log(), "memory limits");
    println!(
        "# GPU memory limits ({rounds} starts per variant, interleaved; runc run of gpucheck, cgroup v2)\n"
    );
    println!("| variant | p50 | p95 | Δ p50 against GPU 0 without limits |");
    println!("|---|---|---|---|");
    let base = variants[1].samples.p50();
    for v in &variants {
        println!("{}", v.samples.delta_row(v.label, base));
    }
    println!(
        "\nThe hook's `memory limits` step (the nvhook-nvml round trip): p50 {:.2} ms, p95 {:.2} ms over {} starts; NVML calls recorded: {calls} (one per limited start, none for the others).\n",
        step.p50(),
        step.p95(),
        rounds + 1
    );
}

/// The hook log's `step` durations, ms.
fn step_samples(log: &str, step: &str) -> Samples {
    let mut samples = Samples::default();
    let needle = format!("step=\"{step}\"");
    for line in log.lines().filter(|l| l.contains(&needle)) {
        if let Some(us) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("us="))
            .and_then(|us| us.parse::<f64>().ok())
        {
            samples.push(us / 1e3);
        }
    }
    samples
}
