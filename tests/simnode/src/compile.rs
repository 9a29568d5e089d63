//! Runs the system C compiler: one invocation per output file, source on
//! stdin, spread over the machine's cores because ~50 gcc runs one after
//! another would make `create` take seconds.

use crate::machine::{self, Toolchain, Written};
use anyhow::{Context, Result, anyhow, bail};
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::thread;

/// One file for gcc to produce.
#[derive(Debug)]
pub struct Job {
    pub source: String,
    /// Flags besides the source and output (e.g. -shared, -m32, -static).
    pub flags: Vec<String>,
    pub output: PathBuf,
}

/// Compiles every job; returns the first failure after all workers stop.
pub fn run_all(toolchain: &Toolchain, jobs: Vec<Job>) -> Result<()> {
    let workers = thread::available_parallelism().map_or(2, |n| n.get());
    let queue = Mutex::new(jobs);
    let next = || queue.lock().expect("compile queue poisoned").pop();
    thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    while let Some(job) = next() {
                        compile(toolchain, &job)?;
                    }
                    Ok(())
                })
            })
            .collect();
        // Joining every handle (not stopping at the first error) lets the
        // other workers drain the queue before the error is reported.
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow!("a compiler thread panicked"))?
            })
            .fold(Ok(()), Result::and)
    })
}

fn compile(toolchain: &Toolchain, job: &Job) -> Result<()> {
    if let Some(dir) = job.output.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // `-x none` (in the command) ends the C source language before inputs in `flags` (e.g. a
    // shared object to link against).
    let (mut cc, written) = toolchain.cc(&job.flags, &job.output);
    let mut child = cc
        .stdin(Stdio::piped())
        .stdout(match written {
            Written::InPlace => Stdio::null(),
            Written::OnStdout => Stdio::piped(),
        })
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run cc: install gcc and libc6-dev (apt-get install gcc libc6-dev)")?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(job.source.as_bytes())
        .context("cannot feed source to cc")?;
    let out = child.wait_with_output().context("cc did not finish")?;
    if !out.status.success() {
        bail!(
            "cc {} failed building {}: {}",
            job.flags.join(" "),
            job.output.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    match written {
        Written::InPlace => Ok(()),
        Written::OnStdout => machine::write_output(&job.output, &out.stdout),
    }
}
