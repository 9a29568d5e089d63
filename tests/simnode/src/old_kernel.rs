//! `simnode old-kernel COMMAND...`: runs COMMAND as on a kernel older than Linux 6.15, which
//! lacks `open_tree_attr`: a seccomp filter makes that call fail with ENOSYS for COMMAND and
//! everything it starts (a runtime, and the hooks the runtime runs). The tests run nvhook's
//! hooks this way to prove the path every kernel before 6.15 takes.

use anyhow::{Context, Result, bail};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// `open_tree_attr`'s number, alike on x86_64 and arm64.
const OPEN_TREE_ATTR: u32 = 467;

pub fn run(command: &[OsString]) -> Result<()> {
    let Some((program, args)) = command.split_first() else {
        bail!("old-kernel needs a command to run");
    };
    deny_open_tree_attr()?;
    let err = Command::new(program).args(args).exec();
    Err(err).with_context(|| format!("run {}", program.to_string_lossy()))
}

fn deny_open_tree_attr() -> Result<()> {
    let statement = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    // seccomp_data's first field is the call's number.
    let mut filter = [
        statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        statement(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            0,
            1,
            OPEN_TREE_ATTR,
        ),
        statement(
            libc::BPF_RET | libc::BPF_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ),
        statement(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: prctl with these options takes plain integers; no pointers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error()).context("set no_new_privs");
    }
    // SAFETY: program points at `filter`, which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &program as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("install the seccomp filter");
    }
    Ok(())
}
