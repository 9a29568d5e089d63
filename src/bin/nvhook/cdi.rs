//! `nvhook cdi` (generate, refresh, list) and `nvhook dev-char-links`.

use crate::CdiCommand;
use anyhow::Result;
use nvhook::config::Config;
use nvhook::inventory::Inventory;
use std::path::Path;

pub(crate) fn cdi(config: &Config, config_path: Option<&Path>, command: CdiCommand) -> Result<()> {
    match command {
        CdiCommand::Generate {
            output,
            format,
            device_name_strategy,
        } => {
            let inventory = nvhook::inventory::load(config)?;
            let spec =
                nvhook::cdi::generate(config, config_path, &inventory, &device_name_strategy)?;
            let format = format.unwrap_or(nvhook::cdi::Format::for_path(output.as_deref()));
            match output {
                Some(path) => {
                    let devices = spec.devices.len();
                    nvhook::cdi::write_gpu_spec(&path, spec, format, false)?;
                    println!("wrote {} ({devices} devices)", path.display());
                    let extra = nvhook::cdi::generate_imex_and_families(&inventory)?;
                    report_specs(nvhook::cdi::write_imex_and_family_specs(
                        &path, &extra, format,
                    )?);
                    link_dev_char(config, &inventory);
                }
                None => print!("{}", spec.to_text(format)),
            }
        }
        CdiCommand::Refresh {
            output,
            format,
            device_name_strategy,
        } => {
            // NVML's cached answer serves while the host is as it was: a refresh on an
            // unchanged node asks NVML nothing.
            let (inventory, _) =
                nvhook::inventory::isolated::load(config, nvhook::inventory::Scope::ALL)?;
            let spec =
                nvhook::cdi::generate(config, config_path, &inventory, &device_name_strategy)?;
            let format = format.unwrap_or(nvhook::cdi::Format::for_path(Some(&output)));
            link_dev_char(config, &inventory);
            let devices = spec.devices.len();
            match nvhook::cdi::write_gpu_spec(&output, spec, format, true)? {
                true => println!("refreshed {} ({devices} devices)", output.display()),
                false => println!("unchanged: {}", output.display()),
            }
            let extra = nvhook::cdi::generate_imex_and_families(&inventory)?;
            report_specs(nvhook::cdi::write_imex_and_family_specs(
                &output, &extra, format,
            )?);
        }
        CdiCommand::List { files } => nvhook::cdi::list(
            &files,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr(),
        )?,
    }
    Ok(())
}

/// Says which IMEX channel and device family specs were written or retired.
pub(crate) fn report_specs(outcomes: Vec<nvhook::cdi::SpecOutcome>) {
    use nvhook::cdi::SpecOutcome;
    for outcome in outcomes {
        match outcome {
            SpecOutcome::Written(path) => println!("wrote {}", path.display()),
            SpecOutcome::Unchanged(_) => {}
            SpecOutcome::Removed(path) => {
                println!("removed {} (no such devices now)", path.display())
            }
        }
    }
}

/// An engine hands a CDI spec's nodes to the runtime as they are: the links must be there.
pub(crate) fn link_dev_char(config: &Config, inventory: &Inventory) {
    let dev = config.dev_path("/dev");
    nvhook::dev_char::ensure_logged(
        &dev,
        &nvhook::dev_char::for_host_nodes(&dev, &inventory.nodes),
    );
}

pub(crate) fn dev_char_links(config: &Config) -> Result<()> {
    use nvhook::dev_char::{self, LinkOutcome};
    let dev = config.dev_path("/dev");
    let nodes = nvhook::inventory::devices::scan_nodes(config)?;
    let links = dev_char::for_host_nodes(&dev, &nodes);
    if links.is_empty() {
        // Not even an empty /dev/char: a host without the driver is left as it was.
        println!(
            "no NVIDIA device nodes in {}: nothing to link (load the driver, nvidia-modprobe, or check dev-root in the nvhook config)",
            dev.display()
        );
        return Ok(());
    }
    let mut failed = 0;
    for (link, result) in links.iter().zip(dev_char::ensure(&dev, &links)?) {
        let path = dev.join("char").join(&link.name);
        match result {
            Ok(LinkOutcome::Present) => {}
            Ok(LinkOutcome::Created) => println!("created {} -> {}", path.display(), link.target),
            Ok(LinkOutcome::Replaced) => println!("replaced {} -> {}", path.display(), link.target),
            Err(e) => {
                eprintln!("nvhook: {e}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        anyhow::bail!(
            "{failed} of {} links in {} could not be made: systemd cannot keep those devices' \
             rules (move the entries named above out of the way and run this again)",
            links.len(),
            dev.join("char").display()
        );
    }
    println!(
        "{} NVIDIA device nodes linked in {}",
        links.len(),
        dev.join("char").display()
    );
    Ok(())
}
