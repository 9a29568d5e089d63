//! Log set-up shared by the binaries. Synchronous writers only: the hook must stay
//! single-threaded until it has entered the container's mount namespace.

use crate::config::{Config, LogLevel};

/// Where the log went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    File,
    /// No log file configured, or one the process may not open (a rootless engine's
    /// hook runs as an unprivileged user): warnings and errors only.
    Stderr,
}

/// For a long-running command (`nvhook nri`): the configured log file, else stderr at the
/// configured level, which systemd's journal or the engine keeps.
pub fn init_service(config: &Config) -> Sink {
    if config.log_file.is_some() {
        return init(config);
    }
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .with_max_level(level(config))
        .init();
    Sink::Stderr
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

/// Appends to the configured log file; without one, warnings and errors go to stderr.
pub fn init(config: &Config) -> Sink {
    let level = level(config);
    let file = config.log_file.as_ref().and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .inspect_err(|e| {
                eprintln!(
                    "nvhook: warning: cannot open log file {}: {e} (logging warnings to stderr)",
                    path.display()
                )
            })
            .ok()
    });
    let builder = tracing_subscriber::fmt().with_ansi(false);
    match file {
        Some(f) => {
            builder
                .with_writer(std::sync::Mutex::new(f))
                .with_max_level(level)
                .init();
            Sink::File
        }
        None => {
            builder
                .with_writer(std::io::stderr)
                .with_max_level(tracing::Level::WARN)
                .without_time()
                .init();
            Sink::Stderr
        }
    }
}
