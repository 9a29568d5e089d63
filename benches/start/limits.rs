//! 11: GPU memory limits. A container on GPU 0 through runc and the prestart hook (cgroup v2:
//! cgroup2 mounted over /sys/fs/cgroup in a private mount namespace for each start, as the
//! tests run it), without limits and with `NVIDIA_GPU_MEMORY_REQUEST`/`_LIMIT`, taking turns
//! round by round (each round beginning at the next); plus a plain runc start through the same wrapper, and a second copy of the
//! no-limits variant, whose difference from the first is this run's noise on a whole start.
//! Each hook runs under the bench's timer, so the hook's own wall time is set beside the
//! start's. What the limits cost is one NVML helper round trip (`nvhook-nvml
//! set-memory-limits`), the hook's `memory-limits` step; a container without limits runs no
//! such step and starts no helper (the mock's record proves no call).

use crate::hook_timer;
use crate::stats::Samples;
use crate::support::hook_log::steps_of;
use crate::support::{Bundle, RuntimeEnv, SimNode, glibc_image, nvhook_bin, run_container};
use std::path::PathBuf;
use std::time::Instant;

const LIMITS: [&str; 2] = [
    "NVIDIA_GPU_MEMORY_REQUEST=512",
    "NVIDIA_GPU_MEMORY_LIMIT=1024",
];

struct Variant {
    label: &'static str,
    env: &'static [&'static str],
    /// The hook timer's record; none for the start without a GPU (it runs no hook).
    record: Option<PathBuf>,
    samples: Samples,
}

/// `rounds` starts per variant, after one warm-up start each.
pub fn run(rounds: usize) {
    let node = SimNode::create(8);
    let records = tempfile::tempdir().expect("a dir for the hook records");
    let variant = |label, gpu: bool, env, slot: usize| Variant {
        label,
        env,
        record: gpu.then(|| records.path().join(format!("{slot}.rec"))),
        samples: Samples::default(),
    };
    let mut variants = [
        variant("runc, no GPU", false, &[], 0),
        variant("GPU 0, no limits", true, &[], 1),
        variant("GPU 0, no limits (a second copy: the noise)", true, &[], 2),
        variant("GPU 0, request 512 MiB, limit 1024 MiB", true, &LIMITS, 3),
    ];
    let n = variants.len();
    // The variant of each hook run, in order, to read the shared log's steps back.
    let mut hook_runs = Vec::new();
    for round in 0..=rounds {
        // Each round starts at the next variant: a start runs slower right after a GPU start
        // (the last one's teardown), and a fixed order would charge that to the same variants.
        for i in 0..n {
            let v = &mut variants[(round + i) % n];
            let mut bundle = Bundle::new(glibc_image(), &["/gpucheck"]);
            if let Some(record) = &v.record {
                bundle.env("NVIDIA_VISIBLE_DEVICES=0");
                bundle.env("NVIDIA_DRIVER_CAPABILITIES=compute,utility");
                for var in v.env {
                    bundle.env(var);
                }
                let (path, args) = hook_timer::hook_args(record, nvhook_bin(), &node.config());
                bundle.prestart_command(&path, &args);
                hook_runs.push(((round + i) % n, round > 0));
            }
            let started = Instant::now();
            let output = run_container(&bundle, RuntimeEnv::CgroupV2);
            let ms = started.elapsed().as_secs_f64() * 1e3;
            output.assert_success();
            match round {
                // The warm-up's hook time is not one of the measured starts'.
                0 => v.record.iter().for_each(|r| {
                    std::fs::remove_file(r).expect("remove the warm-up's hook record")
                }),
                _ => v.samples.push(ms),
            }
        }
    }
    let calls = node.memory_limit_calls().len();
    assert_eq!(
        calls,
        rounds + 1,
        "one NVML call per limited start, none for the others"
    );
    let step = step_samples(&node.log(), "memory-limits");
    println!(
        "# GPU memory limits ({rounds} starts per variant, interleaved; runc run of gpucheck, cgroup v2)\n"
    );
    println!(
        "| variant | start p50 | start p95 | Δ start p50 | hook wall p50 | hook wall p95 | Δ hook p50 |"
    );
    println!("|---|---|---|---|---|---|---|");
    let base = variants[1].samples.p50();
    let base_hook = hook_wall(&variants[1]).p50();
    for v in &variants {
        let start = v.samples.delta_row(v.label, base);
        let hook = match v.record {
            Some(_) => {
                let wall = hook_wall(v);
                format!(
                    " {:.2} | {:.2} | {:+.2} |",
                    wall.p50(),
                    wall.p95(),
                    wall.p50() - base_hook
                )
            }
            None => " - | - | - |".to_string(),
        };
        println!("{start}{hook}");
    }
    print_steps(&node.log(), &hook_runs, &variants);
    println!(
        "\nThe hook's `memory-limits` step (the nvhook-nvml round trip): p50 {:.2} ms, p95 {:.2} ms over {} starts; NVML calls recorded: {calls} (one per limited start, none for the others).\n",
        step.p50(),
        step.p95(),
        rounds + 1
    );
}

/// The hook's wall times of `variant`'s measured starts.
fn hook_wall(variant: &Variant) -> Samples {
    hook_timer::read_record(variant.record.as_ref().expect("a variant with a hook")).wall
}
/// The p50 of each of the hook's steps, per variant with a hook: the log's runs, each
/// beginning at its `process` step, in the order of `hook_runs` (variant, measured).
fn print_steps(log: &str, hook_runs: &[(usize, bool)], variants: &[Variant]) {
    let mut steps: Vec<String> = Vec::new();
    let mut per_variant: Vec<Vec<Vec<f64>>> = vec![Vec::new(); variants.len()];
    let mut run = 0;
    for (step, us) in log.lines().flat_map(steps_of) {
        if step == "process" {
            run += 1;
        }
        let (variant, measured) = hook_runs[run - 1];
        if !measured {
            continue;
        }
        let column = match steps.iter().position(|s| *s == step) {
            Some(column) => column,
            None => {
                steps.push(step.to_string());
                steps.len() - 1
            }
        };
        let columns = &mut per_variant[variant];
        columns.resize(steps.len(), Vec::new());
        columns[column].push(us as f64 / 1e3);
    }
    assert_eq!(run, hook_runs.len(), "one run of steps per hook run");
    let with_hook: Vec<usize> = (0..variants.len())
        .filter(|&v| variants[v].record.is_some())
        .collect();
    let header: Vec<&str> = with_hook.iter().map(|&v| variants[v].label).collect();
    println!("\nThe hook's steps, p50 ms (its log):\n");
    println!("| step | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(header.len()));
    for (column, step) in steps.iter().enumerate() {
        let cells: Vec<String> = with_hook
            .iter()
            .map(|&v| match per_variant[v].get(column) {
                Some(values) if !values.is_empty() => {
                    format!("{:.2}", values.iter().copied().collect::<Samples>().p50())
                }
                _ => "-".to_string(),
            })
            .collect();
        println!("| {step} | {} |", cells.join(" | "));
    }
}

/// The hook log's `step` durations, ms.
fn step_samples(log: &str, step: &str) -> Samples {
    log.lines()
        .flat_map(steps_of)
        .filter(|(s, _)| *s == step)
        .map(|(_, us)| us as f64 / 1e3)
        .collect()
}
