//! What a GPU create through the RuntimeClass costs outside nvhook's own log, and what any
//! program's start costs on this machine.
//!
//! nvhook-runtime passes a create without a GPU straight to the runtime, but hands a GPU
//! create to nvhook, a second program image, which execs the runtime when it is done. Its log
//! times its steps from its own start, so the image's load, glibc's start-up before nvhook's
//! code runs, and the image's teardown when it execs the runtime are in no step. The other ways
//! in run nvhook's code in a hook, whose floor runs a hook program too, or in a long-running
//! plugin: only the RuntimeClass pays for that second image. Measured here with `/bin/true` as
//! the runtime, in alternating rounds, without runc's noise.
//!
//! The same GPU create prepared by `nvhook runtime-server` (nvhook-runtime asks it on a socket
//! and execs the runtime itself) is timed in the same rounds: what the RuntimeClass pays with
//! the server running, against the passed-on create and the create nvhook prepares.
//!
//! For scale: a static program that does nothing, built against musl and against glibc (glibc
//! asks the CPU for its features and caches with CPUID before `main`), and one CPUID
//! instruction, which a hypervisor traps.

use crate::cycle;
use crate::pod_parts::{StepTable, create_steps_ms};
use crate::setup::Variant;
use crate::stats::Samples;
use std::path::{Path, PathBuf};

/// What the rounds measured, ms per round.
pub struct OutsideLog {
    /// nvhook-runtime creating the container without a GPU: it execs the runtime at once.
    passed_on: Samples,
    /// nvhook-runtime creating the GPU container: it execs nvhook, which execs the runtime.
    gpu: Samples,
    /// nvhook's own time for each of those GPU creates (`total_us` in its log).
    logged: Samples,
    /// The same GPU create prepared by `nvhook runtime-server`.
    served: Samples,
    /// The server's own time for each of those (`total_us` in its log).
    served_logged: Samples,
    /// Both logs' create steps: nvhook's first, then the server's.
    steps: StepTable,
    /// A static program that does nothing, built against musl and against glibc.
    musl: Samples,
    glibc: Samples,
    /// One CPUID instruction, µs (x86_64 only).
    cpuid_us: Option<f64>,
}

/// nvhook's config of `variant` with `/bin/true` as the runtime, logging to `log` (when given),
/// asking the runtime server at `server` (none when not given).
pub fn true_runtime_config(
    variant: &Variant,
    work: &Path,
    name: &str,
    log: Option<&Path>,
    server: Option<&Path>,
) -> PathBuf {
    let cycle::Runtime::NvhookRuntime(config) = &variant.runtime else {
        panic!("{}: not an nvhook-runtime variant", variant.label)
    };
    let text = std::fs::read_to_string(config).expect("read the variant's nvhook config");
    let replaced = |l: &str| {
        let key = l.trim_start();
        key.starts_with("runtimes")
            || key.starts_with("runtime-server")
            || (log.is_some() && key.starts_with("log-file"))
    };
    let mut text: String = text
        .lines()
        .filter(|l| !replaced(l))
        .map(|l| format!("{l}\n"))
        .collect();
    text.push_str("runtimes = [\"/bin/true\"]\n");
    let server = server.map(|s| s.display().to_string()).unwrap_or_default();
    text.push_str(&format!("runtime-server = {server:?}\n"));
    if let Some(log) = log {
        text.push_str(&format!("log-file = {:?}\n", log.display().to_string()));
    }
    let path = work.join(name);
    std::fs::write(&path, text).expect("write the /bin/true config");
    path
}

/// `rounds` alternating creates of `no_gpu`'s and `gpu`'s bundles through nvhook-runtime with
/// `/bin/true` as the runtime, then as many alternating runs of the two static programs.
pub fn measure(no_gpu: &Variant, gpu: &Variant, work: &Path, rounds: usize) -> OutsideLog {
    let log = work.join("outside-log.log");
    let served_log = work.join("outside-log-served.log");
    let socket = work.join("runtime.sock");
    let passed_config = true_runtime_config(no_gpu, work, "outside-log-no-gpu.toml", None, None);
    let gpu_config = true_runtime_config(gpu, work, "outside-log-gpu.toml", Some(&log), None);
    let served_config = true_runtime_config(
        gpu,
        work,
        "outside-log-served.toml",
        Some(&served_log),
        Some(&socket),
    );
    let _server = RuntimeServer::start(&served_config, &socket);
    let front = crate::support::engines::nvhook_runtime_bin();
    let create = |variant: &Variant, config: &Path| {
        let bundle = variant.bundle.dir().display().to_string();
        let args = ["create", "--bundle", &bundle, "outside-log"];
        ms(cycle::time_command(
            front,
            &args,
            &[("NVHOOK_CONFIG", config)],
        ))
    };
    let (mut passed_on, mut on_gpu, mut served) =
        (Samples::default(), Samples::default(), Samples::default());
    for _ in 0..rounds {
        no_gpu.bundle.write_config();
        passed_on.push(create(no_gpu, &passed_config));
        // nvhook-runtime edits config.json in place: each create from the variant's own.
        gpu.bundle.write_config();
        on_gpu.push(create(gpu, &gpu_config));
        gpu.bundle.write_config();
        served.push(create(gpu, &served_config));
    }
    let logged = logged_ms(&log, rounds, "nvhook");
    let served_logged = logged_ms(&served_log, rounds, "runtime-server");
    let mut steps = StepTable::new(2);
    for (variant, log) in [&log, &served_log].into_iter().enumerate() {
        let text = std::fs::read_to_string(log).expect("read the GPU creates' log");
        for line in text.lines() {
            steps.push(variant, &create_steps_ms(line));
        }
    }
    let (musl, glibc) = static_programs(work);
    let (mut on_musl, mut on_glibc) = (Samples::default(), Samples::default());
    for _ in 0..rounds {
        on_musl.push(ms(cycle::time_command(&musl, &[], &[])));
        on_glibc.push(ms(cycle::time_command(&glibc, &[], &[])));
    }
    OutsideLog {
        passed_on,
        gpu: on_gpu,
        logged,
        served,
        served_logged,
        steps,
        musl: on_musl,
        glibc: on_glibc,
        cpuid_us: cpuid_us(),
    }
}

/// The `total_us` of the `rounds` GPU creates that `by` prepared, in ms, from `log`.
fn logged_ms(log: &Path, rounds: usize, by: &str) -> Samples {
    let text = std::fs::read_to_string(log).expect("read the GPU creates' log");
    let by_line = format!(" by={by} ");
    let lines: String = text
        .lines()
        .filter(|l| l.contains(&by_line))
        .map(|l| format!("{l}\n"))
        .collect();
    let logged: Samples = crate::log_values(&lines, "total_us")
        .into_iter()
        .map(|us| us / 1e3)
        .collect();
    assert_eq!(
        logged.len(),
        rounds,
        "every GPU create logs its time once, prepared by {by}:\n{text}"
    );
    logged
}

/// `nvhook runtime-server` reading `config`, listening at `socket` until dropped.
struct RuntimeServer(std::process::Child);

impl RuntimeServer {
    fn start(config: &Path, socket: &Path) -> RuntimeServer {
        let _ = std::fs::remove_file(socket);
        let mut child = std::process::Command::new(crate::support::nvhook_bin())
            .arg("runtime-server")
            .env("NVHOOK_CONFIG", config)
            .spawn()
            .expect("start nvhook runtime-server");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !socket.exists() {
            assert!(
                child.try_wait().expect("wait for the server").is_none(),
                "nvhook runtime-server ended"
            );
            assert!(
                std::time::Instant::now() < until,
                "no runtime-server socket"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        RuntimeServer(child)
    }
}

impl Drop for RuntimeServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn report(m: &OutsideLog, gpu_label: &str) {
    println!("## The RuntimeClass's GPU create outside nvhook's log, and a program's start\n");
    println!("| what (runtime /bin/true) | p50 ms | p95 ms | n |");
    println!("|---|---|---|---|");
    let rows = [
        (
            "nvhook-runtime, a create without a GPU (execs the runtime)",
            &m.passed_on,
        ),
        (gpu_label, &m.gpu),
        (
            "nvhook's own time in that create (its log's total_us)",
            &m.logged,
        ),
        (
            "the same GPU create prepared by nvhook runtime-server",
            &m.served,
        ),
        (
            "the server's own time in that create (its log's total_us)",
            &m.served_logged,
        ),
        ("a static program that does nothing, musl", &m.musl),
        ("the same, glibc", &m.glibc),
    ];
    for (label, samples) in rows {
        println!(
            "| {label} | {:.3} | {:.3} | {} |",
            samples.p50(),
            samples.p95(),
            samples.len()
        );
    }
    let paired = |d: Samples| {
        let (low, high) = d.median_interval();
        format!(
            "{:+.3} ms (paired median, 95% {low:+.3} to {high:+.3})",
            d.p50()
        )
    };
    let outside = m.gpu.paired_minus(&m.passed_on).paired_minus(&m.logged);
    println!(
        "\n- The GPU create over the create passed on, less nvhook's logged time: {}. That is nvhook's image loaded, started and torn down: what the RuntimeClass alone pays beyond its steps.",
        paired(outside)
    );
    println!(
        "- The GPU create prepared by the runtime server, over the create passed on: {}; over the one nvhook prepares: {}. The server's logged time, over nvhook's: {}.",
        paired(m.served.paired_minus(&m.passed_on)),
        paired(m.served.paired_minus(&m.gpu)),
        paired(m.served_logged.paired_minus(&m.logged))
    );
    println!();
    m.steps.print(
        "The GPU create step by step, p50 ms (the logs)",
        &["prepared by nvhook", "prepared by nvhook runtime-server"],
    );
    println!();
    println!(
        "- glibc's start-up over musl's, in a program that does nothing: {}.",
        paired(m.glibc.paired_minus(&m.musl))
    );
    match m.cpuid_us {
        Some(us) => println!("- One CPUID instruction: {us:.2} µs (p50 of batches of 100).\n"),
        None => println!("- CPUID: not on this architecture.\n"),
    }
}

/// `int main(void) { return 0; }` built static with musl-gcc and with gcc (glibc) in `work`.
fn static_programs(work: &Path) -> (PathBuf, PathBuf) {
    let source = work.join("noop.c");
    std::fs::write(&source, "int main(void) { return 0; }\n").expect("write noop.c");
    let build = |compiler: &str, name: &str| {
        let out = work.join(name);
        crate::support::run_checked(
            std::process::Command::new(crate::support::require_program(compiler))
                .args(["-static", "-O2", "-o"])
                .arg(&out)
                .arg(&source),
        );
        out
    };
    (build("musl-gcc", "noop-musl"), build("gcc", "noop-glibc"))
}

#[cfg(target_arch = "x86_64")]
fn cpuid_us() -> Option<f64> {
    const BATCH: u32 = 100;
    let mut batches = Samples::default();
    for _ in 0..50 {
        let started = std::time::Instant::now();
        for _ in 0..BATCH {
            std::hint::black_box(core::arch::x86_64::__cpuid(0));
        }
        batches.push(started.elapsed().as_secs_f64() * 1e6 / f64::from(BATCH));
    }
    Some(batches.p50())
}

#[cfg(not(target_arch = "x86_64"))]
fn cpuid_us() -> Option<f64> {
    None
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
