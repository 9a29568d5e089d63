//! The cost of a GPU container start on a simulated node, side by side with plain runc.
//!
//! `sudo cargo bench --bench start` (after `cargo build --release --workspace`: simnode and
//! the mock NVML come from the same profile directory) prints markdown tables: the hook's
//! wall time as runc runs it, whole starts (create, start, wait for exit, delete) through
//! nvhook-runtime against runc, nvhook-runtime's cost for a non-GPU container, what a GPU
//! create's second program image costs outside nvhook's log, peak memory,
//! growth per GPU and per mounted file, and the slow-NVML case. Targets are printed beside
//! the numbers. `NVHOOK_BENCH_ROUNDS` sets the starts per variant (default 60);
//! `NVHOOK_BENCH_ONLY=hooks`, `=starts`, `=burst`, `=cri`, `=gpus`, `=dra`, `=limits`, `=cdi`,
//! `=ways` or `=programs` runs one part (limits: a GPU start with and without GPU memory
//! limits; cdi: nvhook's CDI device through runc, layer by layer; ways: every way in at the
//! runtime against its floors; programs: the cgroup v2 step with device programs kept; cri:
//! pods over containerd 2.1.9's CRI, RuntimeClass against NRI; gpus: `docker run --gpus` and
//! `ctr run --gpus` against the same client's plain start; dra: nvhook-dra's prepare, and pods
//! through a DRA claim against the device plugin's CDI name; all three need
//! `scripts/sid-engines.sh`; the cri and dra parts split each pod's start into its parts,
//! and take `NVHOOK_BENCH_RUNC` (another runc for the engines) and `NVHOOK_BENCH_ENGINE_DIR`
//! (another parent than /tmp for the engines' state and snapshots, e.g. a tmpfs); the cri part
//! takes `NVHOOK_BENCH_CRI=TEXT;...` for only the variants whose label holds a text).
//! Run by `cargo test` (no `--bench` flag) it makes 2 rounds, as a smoke test of itself.

use nvhook_test_support as support;

mod burst;
mod cdi_parts;
mod cri;
mod cycle;
mod dra;
mod gpus;
mod hook_timer;
mod kept_programs;
mod limits;
mod pod_parts;
mod process;
mod setup;
mod stats;
mod ways;

use setup::{Ask, Node, Variant, VariantSpec, Via, run_rounds};
use stats::{Samples, fit_line};
use std::path::Path;
use support::NodeOptions;
use support::hook_log::{HookRun, hook_runs, steps_of};

const ALL: &str = "all";
const NVML_DELAY_MS: u64 = 500;
/// Libraries other than the driver's in a node's loader cache, for the variant that has them:
/// this many is a GPU node with CUDA and a desktop's libraries installed.
const OTHER_LIBRARIES: usize = 1000;

struct Plan {
    rounds: usize,
    slow_rounds: usize,
    exec_rounds: usize,
    /// Starts at once in each burst, and bursts of each size.
    burst_sizes: Vec<usize>,
    burst_rounds: usize,
    /// Pods per variant over CRI.
    cri_rounds: usize,
    /// Starts per variant through the engines' GPU flags.
    gpus_rounds: usize,
}

fn main() {
    hook_timer::run_if_wrapper();
    let full = std::env::args().any(|a| a == "--bench");
    // `NVHOOK_BENCH_ONLY=hooks|starts|burst|cri|gpus|dra|limits|cdi|ways|programs`: one part, for iterating on a
    // profile.
    let only = std::env::var("NVHOOK_BENCH_ONLY").ok();
    let only = only.as_deref();
    let plan = if full {
        let rounds = std::env::var("NVHOOK_BENCH_ROUNDS")
            .ok()
            .map(|r| r.parse().expect("NVHOOK_BENCH_ROUNDS is a number"))
            .unwrap_or(60);
        Plan {
            rounds,
            slow_rounds: (rounds / 6).max(3),
            exec_rounds: rounds * 4,
            burst_sizes: vec![8, 32],
            burst_rounds: (rounds / 20).max(3),
            cri_rounds: (rounds * 2 / 3).max(3),
            gpus_rounds: (rounds / 2).max(3),
        }
    } else {
        Plan {
            rounds: 2,
            slow_rounds: 1,
            exec_rounds: 2,
            burst_sizes: vec![4],
            burst_rounds: 1,
            cri_rounds: 2,
            gpus_rounds: 2,
        }
    };
    support::require_root();
    cycle::become_subreaper();
    let work = setup::tmpfs_work_dir();
    let w = work.path();
    let node = |label: &str, options: NodeOptions| {
        Node::build(
            label,
            NodeOptions {
                parent: Some(w.to_path_buf()),
                ..options
            },
        )
    };
    let n1 = node("1 GPU", NodeOptions::gpus(1));
    let n8 = node("8 GPUs", NodeOptions::gpus(8));
    let n64 = node("64 GPUs", NodeOptions::gpus(64));
    let mig = node(
        "8 GPUs x 7 MIG",
        NodeOptions {
            mig: (0..8).map(|g| (g, 7)).collect(),
            ..NodeOptions::gpus(8)
        },
    );
    let libraries = node(
        "8 GPUs",
        NodeOptions {
            flags: vec!["--other-libraries".into(), OTHER_LIBRARIES.to_string()],
            ..NodeOptions::gpus(8)
        },
    );
    let packaged = node("8 GPUs", NodeOptions::gpus(8)).with_packaged_config();
    let slow = node(
        "8 GPUs, slow NVML",
        NodeOptions {
            nvml_init_delay_ms: NVML_DELAY_MS,
            ..NodeOptions::gpus(8)
        },
    );
    let variant =
        |label: String, node: &Node, ask: Ask, via: Via, timed_hook: bool, nvml_cache: bool| {
            Variant::new(
                VariantSpec {
                    label,
                    node,
                    ask,
                    via,
                    timed_hook,
                    parent: w,
                    nvml_cache,
                },
                w,
            )
        };
    // The default config: NVML's answer is kept between starts.
    let spec = |label, node, ask, via, timed_hook| variant(label, node, ask, via, timed_hook, true);
    // `nvml-cache-file = ""`: NVML is queried on every start.
    let uncached =
        |label, node, ask, via, timed_hook| variant(label, node, ask, via, timed_hook, false);

    println!("# nvhook start-cost bench ({} rounds)\n", plan.rounds);
    println!("{}\n", machine());

    if only.is_none_or(|o| o == "hooks") {
        // 1, 4, 5: the hook's own wall time and memory, by node size and capabilities.
        let gpu_nodes = [&n1, &n8, &n64, &mig];
        let mut hooks: Vec<Variant> = Vec::new();
        for node in gpu_nodes {
            for (via, how) in [
                (Via::Hook, "alone"),
                (Via::NvhookRuntime, "after nvhook-runtime"),
            ] {
                let label = format!("{}, all caps, hook {how}", node.label);
                hooks.push(spec(label, node, Ask::Gpus(ALL), via, true));
            }
        }
        let caps = [
            "utility",
            "compute,utility",
            "compute,utility,video,graphics",
        ];
        for c in caps {
            let label = format!("8 GPUs, {c}, hook alone");
            hooks.push(spec(label, &n8, Ask::Gpus(c), Via::Hook, true));
        }
        // The RuntimeClass route's hook for a compute container: nvhook-runtime planned it.
        let label = "8 GPUs, compute,utility, hook after nvhook-runtime".to_string();
        hooks.push(spec(
            label,
            &n8,
            Ask::Gpus("compute,utility"),
            Via::NvhookRuntime,
            true,
        ));
        let label = format!(
            "8 GPUs, compute,utility, hook alone, {OTHER_LIBRARIES} other libraries in the loader cache"
        );
        hooks.push(spec(
            label,
            &libraries,
            Ask::Gpus("compute,utility"),
            Via::Hook,
            true,
        ));
        let label = "8 GPUs, compute,utility, hook alone, the packaged config".to_string();
        hooks.push(spec(
            label,
            &packaged,
            Ask::Gpus("compute,utility"),
            Via::Hook,
            true,
        ));
        let label = "8 GPUs, all caps, hook alone, NVML every start".to_string();
        hooks.push(uncached(label, &n8, Ask::Gpus(ALL), Via::Hook, true));
        run_rounds(&mut hooks, plan.rounds);
        report_hooks(&hooks);
    }

    if only.is_none_or(|o| o == "starts") {
        // 2, 3: whole starts against runc, measured in the same interleaved rounds.
        let mut starts = vec![
            spec("runc, no GPU".into(), &n8, Ask::NoGpu, Via::Runc, false),
            spec(
                "nvhook-runtime, no GPU".into(),
                &n8,
                Ask::NoGpu,
                Via::NvhookRuntime,
                false,
            ),
            spec(
                "nvhook-runtime, 8 GPUs".into(),
                &n8,
                Ask::Gpus(ALL),
                Via::NvhookRuntime,
                false,
            ),
            spec(
                "nvhook-runtime, 1 GPU".into(),
                &n1,
                Ask::Gpus(ALL),
                Via::NvhookRuntime,
                false,
            ),
            spec(
                "runc + nvhook hook, 8 GPUs".into(),
                &n8,
                Ask::Gpus(ALL),
                Via::Hook,
                false,
            ),
            spec(
                "runc + /bin/true as the hook, no GPU".into(),
                &n8,
                Ask::NoGpu,
                Via::NoopHook,
                false,
            ),
            uncached(
                "nvhook-runtime, 8 GPUs, NVML every start".into(),
                &n8,
                Ask::Gpus(ALL),
                Via::NvhookRuntime,
                false,
            ),
            spec(
                "nvhook-runtime, runtime-mode = cdi, 8 GPUs".into(),
                &n8,
                Ask::Gpus(ALL),
                Via::ShimCdi,
                false,
            ),
        ];
        run_rounds(&mut starts, plan.rounds);
        let exec = nvhook_runtime_overhead(&starts[1], w, plan.exec_rounds);
        report_starts(&starts, &exec);
        let outside = process::measure(&starts[1], &starts[2], w, plan.exec_rounds);
        process::report(
            &outside,
            "nvhook-runtime, a GPU create, 8 GPUs (execs nvhook, which execs the runtime)",
        );

        // 6: a 500 ms NVML init, paid by whichever process queries NVML.
        let mut slow_starts = vec![
            spec(
                "nvhook-runtime, 8 GPUs, slow NVML".into(),
                &slow,
                Ask::Gpus(ALL),
                Via::NvhookRuntime,
                false,
            ),
            spec(
                "runc + nvhook hook, 8 GPUs, slow NVML".into(),
                &slow,
                Ask::Gpus(ALL),
                Via::Hook,
                false,
            ),
            uncached(
                "nvhook-runtime, 8 GPUs, slow NVML, NVML every start".into(),
                &slow,
                Ask::Gpus(ALL),
                Via::NvhookRuntime,
                false,
            ),
            uncached(
                "runc + nvhook hook, 8 GPUs, slow NVML, NVML every start".into(),
                &slow,
                Ask::Gpus(ALL),
                Via::Hook,
                false,
            ),
        ];
        run_rounds(&mut slow_starts, plan.slow_rounds);
        report_slow_nvml(&slow_starts, &starts);

        // Context: the same hook with the bundle on this VM's disk.
        let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a dir on disk");
        let mut ext4 = vec![Variant::new(
            VariantSpec {
                label: "8 GPUs, all caps, hook alone, rootfs on disk".into(),
                node: &n8,
                ask: Ask::Gpus(ALL),
                via: Via::Hook,
                timed_hook: true,
                parent: disk.path(),
                nvml_cache: true,
            },
            w,
        )];
        run_rounds(&mut ext4, plan.slow_rounds);
        let cost = ext4[0].hook();
        println!(
            "Context: {} ({}): hook wall p50 {:.2} ms, CPU p50 {:.2} ms over {} starts.\n",
            ext4[0].label,
            fs_type(disk.path()),
            cost.wall.p50(),
            cost.cpu.p50(),
            cost.wall.len()
        );
    }

    if only.is_none_or(|o| o == "burst") {
        // 7: many starts at once on a cold cache share one NVML query.
        burst::run(&slow, w, &plan.burst_sizes, plan.burst_rounds);
    }

    if only.is_none_or(|o| o == "cri") {
        cri::run(plan.cri_rounds);
    }

    if only.is_none_or(|o| o == "gpus") {
        gpus::run(plan.gpus_rounds);
    }

    if only.is_none_or(|o| o == "dra") {
        dra::run(plan.cri_rounds);
    }

    if only.is_none_or(|o| o == "limits") {
        limits::run(plan.gpus_rounds);
    }

    if only.is_none_or(|o| o == "cdi") {
        // 12: nvhook's CDI device through runc, layer by layer.
        cdi_parts::run(plan.gpus_rounds);
    }

    if only.is_none_or(|o| o == "ways") {
        // 13: every way in at the runtime, against its floors.
        ways::run(plan.gpus_rounds);
    }

    if only.is_none_or(|o| o == "programs") {
        // 14: the cgroup v2 step with device programs kept between containers.
        kept_programs::run(plan.gpus_rounds);
    }
}

fn report_hooks(hooks: &[Variant]) {
    println!("## Hook wall time as runc runs it (exec to exit), CPU time, peak RSS\n");
    println!(
        "| variant | devices | mounts | wall p50 ms | wall p95 ms | CPU p50 ms | n | max RSS KiB | page faults p50 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut max_rss = 0;
    for v in hooks {
        let cost = v.hook();
        let (devices, mounts) = outcome(&v.log_text());
        max_rss = max_rss.max(cost.max_rss);
        println!(
            "| {} | {devices} | {mounts} | {:.2} | {:.2} | {:.2} | {} | {} | {:.0} |",
            v.label,
            cost.wall.p50(),
            cost.wall.p95(),
            cost.cpu.p50(),
            cost.wall.len(),
            cost.max_rss,
            cost.faults.p50()
        );
    }
    println!();
    let eight = || {
        hooks
            .iter()
            .filter(|v| v.label.starts_with("8 GPUs, all caps"))
    };
    for v in eight() {
        let p50 = v.hook().wall.p50();
        println!(
            "{}",
            target(&format!("hook p50, {}", v.label), p50, "ms", 3.0)
        );
    }
    println!(
        "{}\n",
        target("hook peak RSS", max_rss as f64 / 1024.0, "MiB", 10.0)
    );

    let compute = hooks
        .iter()
        .filter(|v| v.label.starts_with("8 GPUs, compute,utility, hook"));
    for v in eight().chain(compute) {
        println!("Steps of {} (p50 of the hook's own log, µs):", v.label);
        let runs = hook_runs(&v.log_text());
        let steps: Vec<String> = step_medians(&runs)
            .iter()
            .map(|(s, us)| format!("{s} {us:.0}"))
            .collect();
        let total: Samples = runs.iter().map(|r| r.total_us as f64).collect();
        println!(
            "{}; in-process total {:.0}\n",
            steps.join(", "),
            total.p50()
        );
        // Issue 41: the hook's own time for a compute container. The container's work (its
        // files mounted, its nodes made, its rules set) is the kernel's whatever the hook; what
        // nvhook reads and decides around it is held to 0.5 ms.
        if v.label.contains("compute,utility") {
            let runs: Vec<(f64, f64)> = runs
                .iter()
                .map(|run| {
                    let work: u64 = run
                        .steps
                        .iter()
                        .filter(|(step, _)| CONTAINER_WORK.contains(&step.as_str()))
                        .map(|(_, us)| us)
                        .sum();
                    let rest = run.total_us.saturating_sub(work);
                    (work as f64 / 1e3, rest as f64 / 1e3)
                })
                .collect();
            let work: Samples = runs.iter().map(|(work, _)| *work).collect();
            let rest: Samples = runs.iter().map(|(_, rest)| *rest).collect();
            println!(
                "- {}: the container's work ({}) p50 {:.3} ms",
                v.label,
                CONTAINER_WORK.join(", "),
                work.p50()
            );
            let label = format!("what the hook reads and decides, {}", v.label);
            println!("{}\n", target(&label, rest.p50(), "ms", 0.5));
        }
    }

    println!("## Growth (from hook CPU time p50, which load from elsewhere disturbs least)\n");
    let by = |label: &str| hooks.iter().find(|v| v.label == label).expect("variant");
    for how in ["alone", "after nvhook-runtime"] {
        let pts: Vec<(f64, f64)> = [("1 GPU", 1.0), ("8 GPUs", 8.0), ("64 GPUs", 64.0)]
            .iter()
            .map(|(n, g)| {
                (
                    *g,
                    by(&format!("{n}, all caps, hook {how}")).hook().cpu.p50(),
                )
            })
            .collect();
        let (slope, base) = fit_line(&pts);
        let low = (pts[1].1 - pts[0].1) / 7.0 * 1000.0;
        let high = (pts[2].1 - pts[1].1) / 56.0 * 1000.0;
        println!(
            "- hook {how}: {base:.2} ms + {:.1} µs per GPU (fit over 1/8/64); per added GPU 1→8: {low:.1} µs, 8→64: {high:.1} µs",
            slope * 1000.0
        );
    }
    let mut pts: Vec<(f64, f64)> = Vec::new();
    for c in [
        "utility",
        "compute,utility",
        "compute,utility,video,graphics",
        "all caps",
    ] {
        let label = if c == "all caps" {
            "8 GPUs, all caps, hook alone".to_string()
        } else {
            format!("8 GPUs, {c}, hook alone")
        };
        let v = by(&label);
        pts.push((outcome(&v.log_text()).1 as f64, v.hook().cpu.p50()));
    }
    let (slope, base) = fit_line(&pts);
    println!(
        "- by capabilities at 8 GPUs (mounts {:?}): {base:.2} ms + {:.1} µs per mounted file\n",
        pts.iter().map(|p| p.0 as u32).collect::<Vec<_>>(),
        slope * 1000.0
    );
}

fn report_starts(starts: &[Variant], exec: &(Samples, Samples)) {
    println!("## Container start: create, start, wait for exit, delete of /bin/true\n");
    println!(
        "| variant | wall p50 ms | wall p95 ms | ratio of wall p50 to runc | CPU p50 ms | ratio of CPU p50 | n |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (base, base_cpu) = (starts[0].starts.p50(), starts[0].cpu.p50());
    for v in starts {
        println!(
            "| {} | {:.2} | {:.2} | {:.3} | {:.2} | {:.3} | {} |",
            v.label,
            v.starts.p50(),
            v.starts.p95(),
            v.starts.p50() / base,
            v.cpu.p50(),
            v.cpu.p50() / base_cpu,
            v.starts.len(),
        );
    }
    println!();
    println!("Phases of a start (wall p50 ms, and the difference from runc's):\n");
    println!("| variant | {} |", cycle::PHASES.join(" | "));
    println!("|---|---|---|---|---|");
    for v in starts {
        let cells: Vec<String> = v
            .phases
            .iter()
            .zip(&starts[0].phases)
            .map(|(p, b)| format!("{:.2} ({:+.2})", p.p50(), p.p50() - b.p50()))
            .collect();
        println!("| {} | {} |", v.label, cells.join(" | "));
    }
    println!();
    for (i, v) in starts.iter().enumerate() {
        let prepared: Samples = v
            .log_text()
            .lines()
            .filter(|l| l.contains("GPU container prepared"))
            .flat_map(|l| log_values(l, "total_us"))
            .map(|us| us / 1e3)
            .collect();
        // starts[2], nvhook-runtime with 8 GPUs, prepares every one of its containers.
        assert!(
            i != 2 || prepared.len() == v.starts.len(),
            "{}: {} of {} creates logged their time",
            v.label,
            prepared.len(),
            v.starts.len()
        );
        if prepared.len() > 0 {
            println!(
                "- {}: nvhook-runtime's create until it execs runc (its log): p50 {:.2} ms, p95 {:.2} ms",
                v.label,
                prepared.p50(),
                prepared.p95()
            );
        }
    }
    println!();
    let mut create_steps = pod_parts::StepTable::new(starts.len());
    for (i, v) in starts.iter().enumerate() {
        for line in v.log_text().lines() {
            create_steps.push(i, &pod_parts::create_steps_ms(line));
        }
    }
    let labels: Vec<&str> = starts.iter().map(|v| v.label.as_str()).collect();
    create_steps.print(
        "nvhook-runtime's create step by step, p50 ms (its log)",
        &labels,
    );
    let gpu8 = starts[2].starts.p50();
    println!(
        "{}",
        target(
            "start ratio, nvhook-runtime 8 GPUs / runc",
            gpu8 / base,
            "",
            1.05
        )
    );
    let (direct, via_nvhook_runtime) = exec;
    println!(
        "{}",
        target(
            "nvhook-runtime overhead, no-GPU start (create + start + delete through nvhook-runtime, runtime /bin/true)",
            via_nvhook_runtime.p50() - direct.p50(),
            "ms",
            1.0
        )
    );
    println!(
        "  {} alternating rounds: /bin/true directly p50 {:.3} ms, through nvhook-runtime {:.3} ms per start; whole starts above: {:+.2} ms (within their noise)\n",
        direct.len(),
        direct.p50(),
        via_nvhook_runtime.p50(),
        starts[1].starts.p50() - base,
    );
}

fn report_slow_nvml(slow: &[Variant], fast: &[Variant]) {
    println!("## NVML init of {NVML_DELAY_MS} ms (mock delay)\n");
    println!("| variant | p50 ms | n | slower than with instant NVML, ms | NVML inits paid |");
    println!("|---|---|---|---|---|");
    // Each against the same path with instant NVML (and the cache).
    for (v, fast) in slow.iter().zip([&fast[2], &fast[4], &fast[2], &fast[4]]) {
        let extra = v.starts.p50() - fast.starts.p50();
        println!(
            "| {} | {:.1} | {} | {extra:.1} | {:.2} |",
            v.label,
            v.starts.p50(),
            v.starts.len(),
            extra / NVML_DELAY_MS as f64
        );
    }
    let hook_inventories = slow[0]
        .log_text()
        .lines()
        .flat_map(steps_of)
        .filter(|(step, _)| *step == "inventory")
        .count();
    println!(
        "\nThe hook after nvhook-runtime ran its own NVML inventory {hook_inventories} times in {} starts (it reads nvhook-runtime's plan from the bundle).\n",
        slow[0].starts.len()
    );
}

/// `runc --version` against the same through nvhook-runtime: nvhook-runtime's own exec cost.
/// What nvhook-runtime adds to a start that asks for no GPU, without runc's noise: the three
/// commands an engine runs (create of the variant's bundle, start, delete), each through
/// nvhook-runtime and directly, alternating, with `/bin/true` as the runtime. Returns the
/// per-start sums, direct and through nvhook-runtime, in ms.
fn nvhook_runtime_overhead(no_gpu: &Variant, work: &Path, rounds: usize) -> (Samples, Samples) {
    let true_config =
        process::true_runtime_config(no_gpu, work, "nvhook-runtime-overhead.toml", None, None);
    let bundle = no_gpu.bundle.dir().display().to_string();
    let commands: [&[&str]; 3] = [
        &["create", "--bundle", &bundle, "id"],
        &["start", "id"],
        &["delete", "id"],
    ];
    let front = support::engines::nvhook_runtime_bin();
    let env = [("NVHOOK_CONFIG", true_config.as_path())];
    let (mut direct, mut via) = (Samples::default(), Samples::default());
    for _ in 0..rounds {
        let (mut d, mut v) = (0.0, 0.0);
        for args in commands {
            d += cycle::time_command(Path::new("/bin/true"), args, &[]).as_secs_f64();
            v += cycle::time_command(front, args, &env).as_secs_f64();
        }
        direct.push(d * 1000.0);
        via.push(v * 1000.0);
    }
    (direct, via)
}

/// The hook's steps that give the container its files, nodes and rules: one or two system
/// calls per file or node, the floor of any hook that does this work.
const CONTAINER_WORK: [&str; 5] = ["cgroup", "sources", "devices", "mounts", "links+ldcache"];

fn target(what: &str, value: f64, unit: &str, limit: f64) -> String {
    let verdict = if value <= limit { "met" } else { "MISSED" };
    format!("- {what}: {value:.3} {unit} (target ≤ {limit} {unit}): {verdict}")
}

/// Every `key=N` value in the log (N an integer).
fn log_values(log: &str, key: &str) -> Vec<f64> {
    let pat = format!(" {key}=");
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find(&pat)? + pat.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// p50 of each of the hook's steps over `runs`, in the order the steps first appear.
fn step_medians(runs: &[HookRun]) -> Vec<(String, f64)> {
    let mut steps: Vec<(String, Samples)> = Vec::new();
    for (name, us) in runs.iter().flat_map(|r| &r.steps) {
        let us = *us as f64;
        match steps.iter_mut().find(|(n, _)| n == name) {
            Some((_, s)) => s.push(us),
            None => steps.push((name.clone(), Samples::from_iter([us]))),
        }
    }
    steps.into_iter().map(|(n, s)| (n, s.p50())).collect()
}

/// Devices and mounts of the last applied outcome in the log.
fn outcome(log: &str) -> (u64, u64) {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("Applied {"))
        .unwrap_or_else(|| panic!("no applied outcome in the hook log:\n{log}"));
    let num = |key: &str| -> u64 {
        let rest = &line[line.find(key).expect("outcome field") + key.len()..];
        rest.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .expect("a number")
    };
    (num("devices: "), num("mounts: "))
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "Machine: {cpu}, {cores} cores, kernel {}, load average at start {}, memory cgroups {}",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        memory_cgroups()
    )
}

/// The kernel's count of memory cgroups, dying ones included (`/proc/cgroups`). On a cgroup
/// v1 host each finished container's memory cgroup lingers while page cache charged to it
/// lives, and the hook's mount and file steps slow as they pile up (docs/performance.md,
/// eighteenth round): a figure to read beside each run's.
fn memory_cgroups() -> String {
    std::fs::read_to_string("/proc/cgroups")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.first() == Some(&"memory")).then(|| fields.get(2).map(|n| n.to_string()))
        })
        .flatten()
        .unwrap_or_else(|| "unknown".to_string())
}

fn fs_type(path: &Path) -> &'static str {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a zeroed statfs is a valid out-value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and `st` is writable.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unknown";
    }
    match st.f_type {
        libc::TMPFS_MAGIC => "tmpfs",
        libc::EXT4_SUPER_MAGIC => "ext4",
        _ => "other",
    }
}
