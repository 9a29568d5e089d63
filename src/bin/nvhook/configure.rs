//! `nvhook configure`: the engine's config (and, with --kubernetes, nvhook's policy).

use crate::{ConfigureArgs, Usage};
use anyhow::Result;
use nvhook::configure::{Engine, RUNTIME_BINARY};
use std::path::{Path, PathBuf};

pub(crate) fn configure(config: Option<&Path>, args: ConfigureArgs) -> Result<()> {
    // The global --config is nvhook's own file, as everywhere ($NVHOOK_CONFIG, then
    // /etc/nvhook/config.toml): only --kubernetes writes it, and taking it for the engine's
    // would be a guess.
    if let (Some(file), false) = (config, args.kubernetes) {
        return Err(Usage(format!(
            "drop --config {}: configure reads no nvhook config (the engine's file is \
             --engine-config; only --kubernetes writes nvhook's)",
            file.display()
        ))
        .into());
    }
    let nvhook_config = config.map(Path::to_path_buf).unwrap_or_else(|| {
        std::env::var_os(nvhook::config::ENV_VAR)
            .filter(|v| !v.is_empty())
            .map_or_else(
                || PathBuf::from(nvhook::config::DEFAULT_PATH),
                PathBuf::from,
            )
    });
    let outcome = nvhook::configure::run(&nvhook::configure::Options {
        engine: args.engine,
        file: args.engine_config,
        runtime_name: args.runtime_name,
        runtime_path: args.runtime_path.unwrap_or_else(|| {
            nvhook::binary_paths::beside_nvhook(RUNTIME_BINARY)
                .display()
                .to_string()
        }),
        allow_missing: args.allow_missing,
        set_as_default: args.set_as_default,
        remove: args.remove,
        dry_run: args.dry_run,
        kubernetes_policy: args.kubernetes.then_some(nvhook_config),
        nri: args.nri,
        // Whether this containerd has NRI at all: its program says (1.6 has none).
        engine_version: (args.nri && args.engine == Engine::Containerd)
            .then(|| nvhook::doctor::program_version("containerd"))
            .flatten(),
    })?;
    println!("{outcome}");
    Ok(())
}
