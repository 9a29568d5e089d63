//! Where a running `nvhook nri` says which engine it is registered with: one file per plugin
//! process, `/run/nvhook/nri/<pid>`, holding the socket it registered through. Written when
//! the engine has configured the plugin, removed when the connection ends; doctor reads the
//! files of the plugins it finds running, so that "running" means attached to that socket,
//! not merely alive.

use std::path::{Path, PathBuf};

pub const DIR: &str = "/run/nvhook/nri";

/// What a plugin the engine started itself (a pre-registered one, on the engine's own
/// connection) writes for its socket.
pub const ENGINE_CONNECTION: &str = "(the engine's own connection)";

fn record(dir: &Path, pid: u32) -> PathBuf {
    dir.join(pid.to_string())
}

/// This process is registered through `socket`.
pub fn registered(socket: &str) {
    let dir = Path::new(DIR);
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        crate::atomic_file::write_atomic(
            &record(dir, std::process::id()),
            socket.as_bytes(),
            crate::atomic_file::NewFile {
                mode: 0o644,
                owner: None,
                durable: false,
            },
        )
    });
    if let Err(e) = written {
        tracing::warn!(dir = DIR, "cannot note the registration for doctor: {e}");
    }
}

/// This process is registered nowhere (its connection ended).
pub fn ended() {
    let _ = std::fs::remove_file(record(Path::new(DIR), std::process::id()));
}

/// The socket the plugin `pid` says it is registered through, in `dir`.
pub fn registered_at(dir: &Path, pid: u32) -> Option<String> {
    std::fs::read_to_string(record(dir, pid)).ok()
}
