//! The hook's wall time and peak memory as runc runs it: the bench binary, called as
//! `BENCH time-hook RECORD HOOK ARGS...`, is the hook runc runs; it spawns the real hook with
//! runc's stdin, waits for it with wait4, and appends `wall_us cpu_us max_rss_kib minor_faults`
//! to RECORD.
//! Its own start-up is outside the measured span; the hook's exec, dynamic linking, work and
//! exit are inside, as they are when runc spawns it.

use crate::stats::Samples;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub const MODE: &str = "time-hook";

/// Runs the wrapper when the process was started as one; returns otherwise.
pub fn run_if_wrapper() {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_none_or(|a| a != MODE) {
        return;
    }
    let [_, _, record, hook, rest @ ..] = &args[..] else {
        eprintln!("usage: BENCH {MODE} RECORD HOOK [ARGS...]");
        std::process::exit(2);
    };
    let started = Instant::now();
    let child = Command::new(hook)
        .arg0("nvhook")
        .args(rest)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {hook:?}: {e}"));
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
        .expect("open the hook record");
    let cpu_us = (crate::cycle::tv(usage.ru_utime) + crate::cycle::tv(usage.ru_stime)).as_micros();
    writeln!(
        f,
        "{wall_us} {cpu_us} {} {}",
        usage.ru_maxrss, usage.ru_minflt
    )
    .expect("write the hook record");
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
