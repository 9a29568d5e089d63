//! `nvhook doctor`.

use crate::{Format, Usage};
use anyhow::Result;
use nvhook::config::Config;
use nvhook::configure::RUNTIME_BINARY;
use std::path::{Path, PathBuf};

/// doctor's own flags.
pub(crate) struct DoctorArgs {
    pub(crate) root: PathBuf,
    pub(crate) runtime_name: String,
    pub(crate) runtime_path: Option<String>,
    pub(crate) nri: bool,
}

pub(crate) fn doctor(
    config: &Config,
    config_file: Option<&Path>,
    format: Format,
    args: DoctorArgs,
) -> Result<()> {
    let DoctorArgs {
        root,
        runtime_name,
        runtime_path,
        nri,
    } = args;
    // Read under a root that is not there, every engine and hooks.d check would say "none".
    if !root.is_dir() {
        return Err(Usage(format!(
            "--root {}: no such directory (name the directory that holds the host's /etc, or leave --root out for /)",
            root.display()
        ))
        .into());
    }
    let runtime_path = match runtime_path {
        Some(path) => path,
        None => nvhook::binary_paths::beside_nvhook(RUNTIME_BINARY)
            .display()
            .to_string(),
    };
    let report = nvhook::doctor::run(
        config,
        &nvhook::doctor::Options {
            root,
            runtime_name,
            runtime_path,
            config_file: config_file.map(Path::to_path_buf),
            nri,
        },
    );
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Text => print!("{}", report.to_text()),
    }
    if !report.ready {
        // The report said why, line by line: nothing more for main to print.
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        std::process::exit(1);
    }
    Ok(())
}
