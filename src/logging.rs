//! Log set-up shared by the binaries. Synchronous writers only: the hook must stay
//! single-threaded until it has entered the container's mount namespace.
//!
//! What a short-lived process logs to stderr is held back until it ends ([`release_held`]):
//! an engine that shows only the first line of a failing hook's stderr (Podman does) must
//! show the error, which the binary prints before it releases the rest.

use crate::config::{Config, LogLevel};
use crate::log_line::Lines;

/// Where the log went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    File,
    /// No log file configured, or one the process may not open (a rootless engine's
    /// hook runs as an unprivileged user): warnings and errors only.
    Stderr,
}

/// The file a long-running command logs to, if any; stderr otherwise.
static SERVICE_LOG: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

/// Stderr lines of a short-lived process, held back until [`release_held`].
static HELD: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

/// Appends to [`HELD`].
struct HeldStderr;

impl std::io::Write for HeldStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        held().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn held() -> std::sync::MutexGuard<'static, Vec<u8>> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes what was held back to stderr; call it once the process's own error, if any, is
/// printed, and before it execs another program.
pub fn release_held() {
    use std::io::Write;
    let lines = std::mem::take(&mut *held());
    // Nothing is left to report a failed write to.
    let _ = std::io::stderr().write_all(&lines);
}

/// Writes to [`SERVICE_LOG`], or to stderr while there is none.
struct ServiceWriter;

impl std::io::Write for ServiceWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match SERVICE_LOG
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            Some(file) => file.write(buf),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// For a long-running command (`nvhook nri`): the configured log file, else stderr (which
/// systemd's journal keeps), at the configured level. [`redirect_service`] moves it to
/// another config's log file later.
pub fn init_service(config: &Config) {
    redirect_service(config);
    Lines::new(level(config), true, ServiceWriter).install();
}

/// From now on, the log goes to `config`'s log file (if it names one that opens).
pub fn redirect_service(config: &Config) {
    let Some(path) = &config.log_file else {
        return;
    };
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        Ok(file) => *SERVICE_LOG.lock().unwrap_or_else(|e| e.into_inner()) = Some(file),
        Err(e) => eprintln!(
            "nvhook: warning: cannot open log file {}: {e} (logging to stderr)",
            path.display()
        ),
    }
}

fn level(config: &Config) -> tracing::Level {
    match config.log_level {
        LogLevel::Error => tracing::Level::ERROR,
        LogLevel::Warn => tracing::Level::WARN,
        LogLevel::Info => tracing::Level::INFO,
        LogLevel::Debug => tracing::Level::DEBUG,
        LogLevel::Trace => tracing::Level::TRACE,
    }
}

/// Appends to the configured log file; without one, warnings and errors go to stderr, held
/// back until [`release_held`].
pub fn init(config: &Config) -> Sink {
    let level = level(config);
    let file = config.log_file.as_ref().and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .inspect_err(|e| {
                held().extend_from_slice(
                    format!(
                        "nvhook: warning: cannot open log file {}: {e} (logging warnings to stderr)\n",
                        path.display()
                    )
                    .as_bytes(),
                );
            })
            .ok()
    });
    match file {
        Some(f) => {
            Lines::new(level, true, f).install();
            Sink::File
        }
        None => {
            Lines::new(tracing::Level::WARN, false, HeldStderr).install();
            Sink::Stderr
        }
    }
}
