//! Log set-up shared by the binaries. Synchronous writers only: the hook must stay
//! single-threaded until it has entered the container's mount namespace.

use crate::config::{Config, LogLevel};

/// Appends to the configured log file; without one, warnings and errors go to stderr.
pub fn init(config: &Config) {
    let level = match config.log_level {
        LogLevel::Error => tracing::Level::ERROR,
        LogLevel::Warn => tracing::Level::WARN,
        LogLevel::Info => tracing::Level::INFO,
        LogLevel::Debug => tracing::Level::DEBUG,
        LogLevel::Trace => tracing::Level::TRACE,
    };
    let file = config.log_file.as_ref().and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .inspect_err(|e| {
                eprintln!(
                    "nvhook: warning: cannot open log file {}: {e}",
                    path.display()
                )
            })
            .ok()
    });
    let builder = tracing_subscriber::fmt().with_ansi(false);
    match file {
        Some(f) => builder
            .with_writer(std::sync::Mutex::new(f))
            .with_max_level(level)
            .init(),
        None => builder
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::WARN)
            .without_time()
            .init(),
    }
}
