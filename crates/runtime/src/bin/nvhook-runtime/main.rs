//! `nvhook-runtime`: what engines run in runc's place, for every command of every container.
//!
//! A static program with no libc (see this crate's src/lib.rs for why): it execs the runtime
//! straight away unless the command is `create`/`run` of a bundle whose config.json may ask
//! for a GPU, or its config is one it cannot read with certainty; those it hands to
//! `nvhook runtime` (the full create path, beside this binary), which prepares the bundle, reports
//! errors in its own words, and execs the runtime itself.
// `cargo clippy --all-targets` also builds this binary as a test, with std and a harness of
// its own: the program is then left out.
#![cfg_attr(not(test), no_std)]
#![cfg_attr(not(test), no_main)]

// The entry point and system-call layer of each architecture; the rest is shared.
#[cfg(not(test))]
#[cfg_attr(target_arch = "x86_64", path = "arch/x86_64.rs")]
#[cfg_attr(target_arch = "aarch64", path = "arch/aarch64.rs")]
mod arch;
#[cfg(all(not(test), not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
compile_error!("nvhook-runtime has an entry point and system calls for x86_64 and aarch64 only");
#[cfg(not(test))]
mod mem;
#[cfg(not(test))]
mod run;
#[cfg(not(test))]
mod start;
#[cfg(not(test))]
mod sys;
