//! The binaries' entry point, in place of std's runtime start-up.
//!
//! A container start runs nvhook-runtime three times and the hook once, so what a process
//! costs before `main` is paid four times per start. std's start-up finds the main thread's
//! stack guard with `pthread_getattr_np`, which makes glibc parse /proc/self/maps: a quarter
//! of nvhook-runtime's user-space instructions. The binaries are `#![no_main]` and come here
//! instead, keeping the two parts of std's start-up that matter to them.

/// Runs `main` and exits with its status; call it from the binaries' C `main`. What the log
/// held back for stderr is written after `main` returns.
///
/// - Standard descriptors closed by the caller are reopened on /dev/null, as std does, so
///   that no file the process opens later becomes its stdout or stderr.
/// - SIGPIPE is set to its default, deliberately unlike std (which ignores it): a reader that
///   goes away ends the process quietly, as with any Unix tool, where std's `println!` would
///   panic and abort; the runtime nvhook-runtime execs gets the default too, as before.
///
/// std's stack-overflow message is not installed: an overflow is a plain SIGSEGV.
pub fn run(main: fn() -> i32) -> ! {
    reopen_closed_std_fds();
    // SAFETY: setting a signal's disposition to its default has no memory-safety preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let status = main();
    // After main's own error line: see crate::logging.
    crate::logging::release_held();
    // exit flushes std's stdout, as returning from a std main would.
    std::process::exit(status)
}

fn reopen_closed_std_fds() {
    for fd in 0..=2 {
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let closed = unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF);
        // open returns the lowest free descriptor: the closed one.
        // SAFETY: the path is a NUL-terminated literal.
        if closed && unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } != fd {
            // Without /dev/null there is no safe descriptor to run with.
            std::process::abort();
        }
    }
}
