//! The hook's wall time and peak memory as runc runs it: the bench binary, called as
//! `BENCH time-hook RECORD HOOK ARGS...`, is the hook runc runs; it spawns the real hook with
//! runc's stdin, waits for it with wait4, and appends `wall_us cpu_us max_rss_kib minor_faults`
//! to RECORD.
//! Its own start-up is outside the measured span; the hook's exec, dynamic linking, work and
//! exit are inside, as they are when runc spawns it. Linked as [`RUNC_NAME`], the same binary
//! times an engine's runc calls.

use crate::stats::Samples;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub const MODE: &str = "time-hook";

/// The file name under which the bench binary is the runtime an engine runs (`BinaryName`):
/// it runs the program named in [`RUNC_PROGRAM`] with the same arguments and appends a record
/// line naming the call (`wall_us cpu_us max_rss_kib minor_faults SUBCOMMAND ID`) to the file
/// named in [`RUNC_RECORD`]. The engine hands its environment to its shim and the shim to runc.
pub const RUNC_NAME: &str = "runc-timed";
pub const RUNC_RECORD: &str = "NVHOOK_BENCH_RUNC_RECORD";
pub const RUNC_PROGRAM: &str = "NVHOOK_BENCH_RUNC_PROGRAM";
const RUNC_CALLS: [&str; 6] = ["create", "start", "delete", "kill", "state", "features"];

/// Runs the wrapper when the process was started as one; returns otherwise.
pub fn run_if_wrapper() {
    let args: Vec<OsString> = std::env::args_os().collect();
    if Path::new(&args[0]).file_name() == Some(RUNC_NAME.as_ref()) {
        let record = std::env::var_os(RUNC_RECORD).expect("the runc record's path");
        let runc = std::env::var_os(RUNC_PROGRAM).expect("the runc to time");
        // `runc [global flags] SUBCOMMAND [flags] ID`: the record names the call.
        let subcommand = args[1..]
            .iter()
            .filter_map(|a| a.to_str())
            .find(|a| RUNC_CALLS.contains(a))
            .unwrap_or("other");
        let id = args.last().and_then(|a| a.to_str()).unwrap_or("-");
        time_child(
            Path::new(&record),
            Path::new(&runc),
            "runc",
            &args[1..],
            &format!(" {subcommand} {id}"),
        );
    }
    if args.get(1).is_none_or(|a| a != MODE) {
        return;
    }
    let [_, _, record, hook, rest @ ..] = &args[..] else {
        eprintln!("usage: BENCH {MODE} RECORD HOOK [ARGS...]");
        std::process::exit(2);
    };
    time_child(Path::new(record), Path::new(hook), "nvhook", rest, "");
}

/// Runs `program` as `arg0` with `args` and this process's stdin, waits for it with wait4,
/// appends `wall_us cpu_us max_rss_kib minor_faults` and `suffix` to `record`, and exits
/// with its status.
fn time_child(record: &Path, program: &Path, arg0: &str, args: &[OsString], suffix: &str) -> ! {
    let started = Instant::now();
    let child = Command::new(program)
        .arg0(arg0)
        .args(args)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {program:?}: {e}"));
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child; both out-pointers are valid.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall_us = started.elapsed().as_micros();
    assert_eq!(rc, pid, "wait4: {}", std::io::Error::last_os_error());
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(record)
        .expect("open the record");
    let cpu_us = (crate::cycle::tv(usage.ru_utime) + crate::cycle::tv(usage.ru_stime)).as_micros();
    writeln!(
        f,
        "{wall_us} {cpu_us} {} {}{suffix}",
        usage.ru_maxrss, usage.ru_minflt
    )
    .expect("write the record");
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        1
    };
    std::process::exit(code);
}

/// The hook entry's path and args for a timed nvhook hook reading `config`.
pub fn hook_args(record: &Path, nvhook: &Path, config: &Path) -> (PathBuf, Vec<String>) {
    let bench = std::env::current_exe().expect("locate the bench binary");
    let args = [
        bench.display().to_string(),
        MODE.into(),
        record.display().to_string(),
        nvhook.display().to_string(),
        "--config".into(),
        config.display().to_string(),
        "hook".into(),
        "prestart".into(),
    ];
    (bench, args.to_vec())
}

/// A script for a config's `hook-path`: nvhook-runtime writes that path into the hook
/// entry, and the script hands the hook's arguments to the timer.
pub fn write_wrapper_script(path: &Path, record: &Path, nvhook: &Path) {
    let bench = std::env::current_exe().expect("locate the bench binary");
    let text = format!(
        "#!/bin/sh\nexec '{}' {MODE} '{}' '{}' \"$@\"\n",
        bench.display(),
        record.display(),
        nvhook.display()
    );
    crate::support::write_script(path, &text);
}

/// The hook's costs over all its runs.
pub struct HookCost {
    /// Milliseconds.
    pub wall: Samples,
    /// Milliseconds of user + system time (the hook and its NVML child).
    pub cpu: Samples,
    /// KiB, the largest of any run.
    pub max_rss: u64,
    /// Minor page faults per run: on a VM each costs ~15 µs, a large part of a process's
    /// start-up.
    pub faults: Samples,
}

pub fn read_record(record: &Path) -> HookCost {
    let text = std::fs::read_to_string(record)
        .unwrap_or_else(|e| panic!("read {}: {e}", record.display()));
    let mut cost = HookCost {
        wall: Samples::default(),
        cpu: Samples::default(),
        max_rss: 0,
        faults: Samples::default(),
    };
    for line in text.lines() {
        let fields: Vec<f64> = line
            .split(' ')
            .map(|f| {
                f.parse()
                    .expect("record line: wall_us cpu_us max_rss faults")
            })
            .collect();
        let [wall_us, cpu_us, rss, faults] = fields[..] else {
            panic!("bad record line {line:?}");
        };
        cost.wall.push(wall_us / 1000.0);
        cost.cpu.push(cpu_us / 1000.0);
        cost.max_rss = cost.max_rss.max(rss as u64);
        cost.faults.push(faults);
    }
    cost
}
