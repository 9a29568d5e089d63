//! Where a pod's CreateContainer + StartContainer goes (issue 41), for the CRI parts of the
//! bench: CreateContainer (the engine's spec, its CDI injection and NRI, the snapshot),
//! `runc create` as the shim runs it (runc init, the rootfs, the devices, the mounts, the
//! hooks), nvhook's hooks in it (their own log's totals), `runc start`, and the rest of
//! StartContainer (containerd and its shim). runc is timed through the bench binary linked as
//! [`hook_timer::RUNC_NAME`], which every variant of a run pays alike.
//!
//! `NVHOOK_BENCH_RUNC` names another runc for the engines (sid's newer runc, or a wrapper that
//! runs runc under `strace -D -f -T`); `NVHOOK_BENCH_ENGINE_DIR` another parent for their
//! state and snapshots than /tmp (the VM's disk), a tmpfs such as /dev/shm to take the disk's
//! share out.

use crate::hook_timer;
use crate::stats::Samples;
use crate::support::cri::PodRun;
use crate::support::engines::EngineDir;
use crate::support::hook_log::{hook_runs, prepared_steps};
use crate::support::require_program;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// An engine's state directory under `NVHOOK_BENCH_ENGINE_DIR` (default /tmp).
pub fn engine_dir(prefix: &str) -> EngineDir {
    let parent = std::env::var_os("NVHOOK_BENCH_ENGINE_DIR").unwrap_or_else(|| "/tmp".into());
    EngineDir::new_in(Path::new(&parent), prefix)
}

/// The runc an engine runs, timed call by call.
pub struct TimedRunc {
    link: PathBuf,
    record: PathBuf,
    runc: PathBuf,
}

impl TimedRunc {
    /// The bench binary linked into `dir`, timing `NVHOOK_BENCH_RUNC` or the host's runc.
    pub fn new(dir: &Path) -> TimedRunc {
        let runc = std::env::var_os("NVHOOK_BENCH_RUNC")
            .map(PathBuf::from)
            .unwrap_or_else(|| require_program("runc"));
        let link = dir.join(hook_timer::RUNC_NAME);
        let bench = std::env::current_exe().expect("locate the bench binary");
        std::os::unix::fs::symlink(bench, &link).expect("link the runc timer");
        TimedRunc {
            link,
            record: dir.join("runc-calls"),
            runc,
        }
    }

    /// The program for the engine's `BinaryName`.
    pub fn program(&self) -> PathBuf {
        self.link.clone()
    }

    /// The runc being timed, for the report.
    pub fn timed(&self) -> &Path {
        &self.runc
    }

    /// What the engine's environment must carry for the timer.
    pub fn env(&self) -> [(&'static str, &Path); 2] {
        [
            (hook_timer::RUNC_RECORD, &self.record),
            (hook_timer::RUNC_PROGRAM, &self.runc),
        ]
    }

    /// Each container's `create` and `start` wall times, ms, by id.
    fn calls(&self) -> HashMap<String, RuncCalls> {
        let text = std::fs::read_to_string(&self.record)
            .unwrap_or_else(|e| panic!("read {}: {e}", self.record.display()));
        let mut calls: HashMap<String, RuncCalls> = HashMap::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let [wall_us, _, _, _, call, id] = fields[..] else {
                panic!("bad runc record line {line:?}");
            };
            let ms = wall_us.parse::<f64>().expect("wall_us is a number") / 1e3;
            let entry = calls.entry(id.to_string()).or_default();
            match call {
                "create" => entry.create = Some(ms),
                "start" => entry.start = Some(ms),
                _ => {}
            }
        }
        calls
    }
}

#[derive(Default)]
struct RuncCalls {
    create: Option<f64>,
    start: Option<f64>,
}

/// Leaves the node alone for a moment after a pod. A GPU pod leaves work behind for the kernel
/// (its cgroup and its mount namespace, with the hook's mounts, taken down after the CRI calls
/// return), which on a 2-core VM the next pod's start pays; variants that take turns in a fixed
/// order would each pay for the one before them. Without it, the dra part's claim pod, which
/// followed another GPU pod three rounds in four, was slower than the device plugin's with the
/// same OCI spec by more than nvhook's hook takes (docs/performance.md, fortieth round).
pub fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(150));
}

/// The pods of a run: each measured pod's variant and its times.
#[derive(Default)]
pub struct Pods(Vec<(usize, PodRun)>);

impl Pods {
    pub fn push(&mut self, variant: usize, run: PodRun) {
        self.0.push((variant, run));
    }

    /// Each of `variants` variants' `value` of its pods, in the order of their rounds.
    fn per_variant(&self, variants: usize, value: impl Fn(&PodRun) -> f64) -> Vec<Samples> {
        (0..variants)
            .map(|v| {
                (self.0.iter())
                    .filter(|(variant, _)| *variant == v)
                    .map(|(_, run)| value(run))
                    .collect()
            })
            .collect()
    }

    /// Each of `variants` variants' whole starts, ms, in the order of their rounds.
    pub fn totals(&self, variants: usize) -> Vec<Samples> {
        self.per_variant(variants, |run| run.container_start.as_secs_f64() * 1e3)
    }

    /// Each of `variants` variants' pods' work for the container's view ([`VIEW_STEPS`]) by
    /// their hooks' log (`log`), ms, in the order of their rounds; 0 for a pod without them.
    pub fn views(&self, variants: usize, log: &str) -> Vec<Samples> {
        let hooks = hook_logs(log);
        self.per_variant(variants, |run| {
            let id = run.container_id.as_deref().expect("a started container");
            hooks.get(id).map_or(0.0, |h| {
                (h.steps.iter())
                    .filter(|(step, _)| VIEW_STEPS.contains(&step.as_str()))
                    .map(|(_, ms)| ms)
                    .sum()
            })
        })
    }

    /// Prints, per variant (`labels`), the whole start's p50, p95 and Δ p50 against the first
    /// variant.
    pub fn print_totals(&self, labels: &[&str]) {
        println!("| variant | p50 | p95 | Δ p50 |");
        println!("|---|---|---|---|");
        let totals = self.totals(labels.len());
        for (label, samples) in labels.iter().zip(&totals) {
            println!("{}", samples.delta_row(label, totals[0].p50()));
        }
        println!();
    }

    /// Prints, per variant (`labels`), its parts' p50 and their Δ against the first variant's,
    /// from runc's record and nvhook's log (`log`: its `hook finished` lines).
    pub fn print_parts(&self, labels: &[&str], runc: &TimedRunc, log: &str) {
        let calls = runc.calls();
        let hooks = hook_logs(log);
        let mut hook_steps = StepTable::new(labels.len());
        let mut create_steps = StepTable::new(labels.len());
        let mut parts: Vec<[Samples; PARTS.len()]> =
            labels.iter().map(|_| Default::default()).collect();
        for (variant, run) in &self.0 {
            let id = run.container_id.as_deref().expect("a started container");
            let call = calls
                .get(id)
                .unwrap_or_else(|| panic!("no runc call recorded for {id}"));
            let (Some(create), Some(start)) = (call.create, call.start) else {
                panic!("runc create and start of {id} were not both recorded");
            };
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            let start_container = ms(run.container_start) - ms(run.container_create);
            let prepared = hooks.get(id).map_or(0.0, |h| h.prepared);
            let values = [
                ms(run.container_start),
                ms(run.container_create),
                start_container,
                prepared,
                create,
                hooks.get(id).map_or(0.0, |h| h.total),
                start,
                start_container - prepared - create - start,
            ];
            for (samples, value) in parts[*variant].iter_mut().zip(values) {
                samples.push(value);
            }
            if let Some(log) = hooks.get(id) {
                hook_steps.push(*variant, &log.steps);
                create_steps.push(*variant, &log.prepared_steps);
            }
        }
        println!(
            "Where the time goes, p50 ms (Δ against the first row); runc is {}:\n",
            runc.timed().display()
        );
        println!("| variant | {} |", PARTS.join(" | "));
        println!("|---|{}", "---|".repeat(PARTS.len()));
        for (label, samples) in labels.iter().zip(&parts) {
            let cells: Vec<String> = samples
                .iter()
                .zip(&parts[0])
                .map(|(s, base)| format!("{:.2} ({:+.2})", s.p50(), s.p50() - base.p50()))
                .collect();
            println!("| {label} | {} |", cells.join(" | "));
        }
        println!();
        hook_steps.print("nvhook's hooks step by step, p50 ms (their log)", labels);
        create_steps.print(
            "nvhook-runtime's create step by step, p50 ms (its log)",
            labels,
        );
    }
}

/// nvhook-runtime's create steps in log line `line`, ms; none for any other line.
pub fn create_steps_ms(line: &str) -> Vec<(String, f64)> {
    (prepared_steps(line).into_iter())
        .map(|(step, us)| (step.to_string(), us as f64 / 1e3))
        .collect()
}

/// Steps' times per variant, in the order the steps were first seen.
pub struct StepTable {
    steps: Vec<String>,
    samples: Vec<HashMap<String, Samples>>,
}

impl StepTable {
    pub fn new(variants: usize) -> StepTable {
        StepTable {
            steps: Vec::new(),
            samples: (0..variants).map(|_| HashMap::new()).collect(),
        }
    }

    /// One container's steps, ms, of variant `variant`.
    pub fn push(&mut self, variant: usize, steps: &[(String, f64)]) {
        for (step, ms) in steps {
            if !self.steps.contains(step) {
                self.steps.push(step.clone());
            }
            (self.samples[variant].entry(step.clone()))
                .or_default()
                .push(*ms);
        }
    }

    /// The p50 of each step, a row per variant (`labels`) that has them; nothing without any.
    pub fn print(&self, title: &str, labels: &[&str]) {
        if self.steps.is_empty() {
            return;
        }
        println!("{title}:\n");
        println!("| variant | {} |", self.steps.join(" | "));
        println!("|---|{}", "---|".repeat(self.steps.len()));
        for (label, by_step) in labels.iter().zip(&self.samples) {
            if by_step.is_empty() {
                continue;
            }
            let cells: Vec<String> = (self.steps.iter())
                .map(|step| {
                    by_step
                        .get(step)
                        .map_or("-".into(), |s| format!("{:.2}", s.p50()))
                })
                .collect();
            println!("| {label} | {} |", cells.join(" | "));
        }
        println!();
    }
}

const PARTS: [&str; 8] = [
    "CreateContainer + StartContainer",
    "CreateContainer",
    "StartContainer",
    "of which nvhook-runtime's create (its log)",
    "of which runc create",
    "of which nvhook's hooks (their log)",
    "runc start",
    "StartContainer's rest (containerd, shim)",
];

/// The steps of nvhook's hooks that make the container's view of the driver: the device
/// rules and nodes, the files' sources and mounts, their links and the loader cache, the procfs
/// view, the trees and their copies. Any way in pays the kernel for the same view; the other
/// steps (the process, the state, the request, the image, the inventory, the plan, entering
/// the container, the folders and CUDA compat) are nvhook's reading and deciding.
const VIEW_STEPS: [&str; 8] = [
    "cgroup",
    "sources",
    "devices",
    "mounts",
    "links+ldcache",
    "proc",
    "trees",
    "visit",
];

/// What nvhook's log says of one container: its hooks' total and their steps, and
/// nvhook-runtime's create (before it execs runc), ms.
#[derive(Default)]
struct HookLog {
    total: f64,
    steps: Vec<(String, f64)>,
    prepared: f64,
    prepared_steps: Vec<(String, f64)>,
}

/// nvhook's log by container id: a container may run a prestart and a createContainer hook,
/// whose totals and steps add up, after nvhook-runtime's create.
fn hook_logs(log: &str) -> HashMap<String, HookLog> {
    let mut by_id: HashMap<String, HookLog> = HashMap::new();
    for run in hook_runs(log) {
        let entry = by_id.entry(run.id).or_default();
        entry.total += run.total_us as f64 / 1e3;
        for (step, us) in run.steps {
            let ms = us as f64 / 1e3;
            match entry.steps.iter_mut().find(|(s, _)| *s == step) {
                Some((_, sum)) => *sum += ms,
                None => entry.steps.push((step, ms)),
            }
        }
    }
    // nvhook-runtime's line names the bundle, whose directory the engine names by the id.
    for line in log.lines().filter(|l| l.contains("GPU container prepared")) {
        let field = |name: &str| line.split_whitespace().find_map(|w| w.strip_prefix(name));
        let (Some(bundle), Some(us)) = (field("bundle="), field("total_us=")) else {
            panic!("nvhook-runtime's line without its bundle or time: {line:?}");
        };
        let id = Path::new(bundle).file_name().expect("a bundle directory");
        let entry = by_id.entry(id.to_string_lossy().into_owned()).or_default();
        entry.prepared += us.parse::<f64>().expect("total_us is a number") / 1e3;
        entry.prepared_steps.extend(create_steps_ms(line));
    }
    by_id
}
