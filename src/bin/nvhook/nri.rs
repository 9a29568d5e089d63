//! `nvhook nri`: the NRI plugin, run by hand, by its unit or by the engine.

use crate::Usage;
use anyhow::Result;
use std::path::{Path, PathBuf};

/// `nvhook nri`: serves the engine until stopped, connecting again whenever it restarts.
pub(crate) fn nri(config_path: Option<&Path>, socket: &Path, index: &str) -> Result<()> {
    // Stopped by its unit, the kubelet or by hand, the plugin unmounts the driver directories
    // it gathered and removes its registration record.
    crate::on_stop_signal(|signal| {
        tracing::info!(%signal, "NRI plugin stopping");
        nvhook::nri::driver_trees::detach_all();
        nvhook::nri::registration::ended();
    })?;
    let env_config = std::env::var(nvhook::config::ENV_VAR).ok();
    let named = config_path.map(Path::to_path_buf).or_else(|| {
        env_config
            .as_deref()
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let stub = nvhook_nri::Stub::from_env(nvhook::nri::PLUGIN_NAME, index, socket)
        .map_err(|e| Usage(e.to_string()))?;
    let config = nvhook::config::load(named.as_deref(), None)?;
    nvhook::logging::init_service(&config);
    tracing::info!(plugin = %stub.qualified_name(), endpoint = ?stub.endpoint(), "NRI plugin starting");
    let mut plugin = nvhook::nri::GpuPlugin::new(named);
    // Run by hand or by a unit, the plugin says on stderr (the journal) when it is attached
    // and when it cannot be; without a log file the log is stderr already.
    let to_stderr = config.log_file.is_some();
    let name = stub.qualified_name();
    let endpoint = match stub.endpoint() {
        nvhook_nri::Endpoint::Socket(path) => path.display().to_string(),
        nvhook_nri::Endpoint::Inherited(_) => "the socket the engine gave it".into(),
    };
    let registered_at = match stub.endpoint() {
        nvhook_nri::Endpoint::Socket(path) => path.display().to_string(),
        nvhook_nri::Endpoint::Inherited(_) => {
            nvhook::nri::registration::ENGINE_CONNECTION.to_string()
        }
    };
    // A record under this pid is an earlier plugin's that was killed before it could remove
    // it (pids are reused): this one is registered nowhere until the engine configures it.
    nvhook::nri::registration::ended();
    stub.run_reporting(&mut plugin, &mut |event| {
        // Doctor reads where this plugin is registered, while it is.
        match event {
            nvhook_nri::Event::Configured => nvhook::nri::registration::registered(&registered_at),
            _ => nvhook::nri::registration::ended(),
        }
        if !to_stderr {
            return;
        }
        match event {
            nvhook_nri::Event::Configured => {
                eprintln!("nvhook nri: registered with the engine at {endpoint} as {name}");
            }
            nvhook_nri::Event::Closed(_) => {
                eprintln!(
                    "nvhook nri: the engine at {endpoint} closed the connection; connecting again"
                );
            }
            nvhook_nri::Event::Failed(e) => {
                eprintln!("nvhook nri: {e}; trying again until it answers");
            }
        }
    })?;
    Ok(())
}
