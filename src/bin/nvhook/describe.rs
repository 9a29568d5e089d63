//! The read-only reports: `nvhook labels`, `nvhook info` and `nvhook plan`.

use crate::{Format, LabelFormat};
use anyhow::{Context, Result};
use nvhook::config::Config;
use nvhook::inventory::Inventory;
use nvhook::request::{Decision, Request};
use std::path::Path;

pub(crate) fn labels(
    config: &Config,
    format: LabelFormat,
    prefix: &str,
    mig_strategy: nvhook::labels::MigStrategy,
    output: Option<&Path>,
) -> Result<()> {
    // A wrong flag is a usage error whatever the host has.
    nvhook::labels::check_prefix(prefix)?;
    // NVML's cached answer serves while the host is as it was: labelling on a timer asks
    // NVML nothing on an unchanged node.
    let (inventory, _) = nvhook::inventory::isolated::load(config, nvhook::inventory::Scope::ALL)?;
    let machine_type =
        std::fs::read_to_string(config.sys_path(nvhook::labels::MACHINE_TYPE_FILE)).ok();
    let limits = nvhook::hook::memory_limits::OnThisNode::of(
        config,
        inventory.memory_limits,
        nvhook_cgroup::host_is_unified(),
    );
    let labels = nvhook::labels::Labels::for_system(
        &inventory.system(),
        machine_type.as_deref(),
        prefix,
        mig_strategy,
    )?
    .with_memory_limits(
        prefix,
        limits == nvhook::hook::memory_limits::OnThisNode::Enforced,
    );
    let text = match format {
        LabelFormat::Text => labels.to_text(),
        LabelFormat::Json => serde_json::to_string_pretty(&labels)? + "\n",
        LabelFormat::Nfd => labels.to_nfd(),
    };
    let Some(path) = output else {
        print!("{text}");
        return Ok(());
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    nvhook::atomic_file::write_atomic(
        path,
        text.as_bytes(),
        nvhook::atomic_file::NewFile::mode(0o644),
    )
    .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

pub(crate) fn info(config: &Config, format: Format) -> Result<()> {
    let inventory = nvhook::inventory::load(config)?;
    // The architecture the driver's libraries are built for: on a mixed fleet, the first
    // thing to know about a node's driver.
    let driver_arch = nvhook::elf_machine::driver_arch(&inventory);
    match format {
        Format::Json => {
            #[derive(serde::Serialize)]
            struct Info<'a> {
                #[serde(flatten)]
                inventory: &'a Inventory,
                driver_arch: Option<nvhook::elf_machine::DriverArch>,
            }
            let info = Info {
                inventory: &inventory,
                driver_arch,
            };
            println!("{}", serde_json::to_string_pretty(&info)?)
        }
        Format::Text => print!(
            "{}",
            nvhook::inventory::text::inventory_text(&inventory, driver_arch.as_ref())
        ),
    }
    // GPUs without their nodes can be given to no container: a wrong dev-root, or no driver.
    // WSL2's GPUs have one node for all, found with the driver store or not at all.
    if !inventory.gpus.is_empty() && inventory.nodes.is_empty() && inventory.wsl.is_none() {
        anyhow::bail!(
            "{} GPUs but no NVIDIA device node in {}: check dev-root in the nvhook config, or load the driver (nvidia-modprobe)",
            inventory.gpus.len(),
            config.dev_path("/dev").display()
        );
    }
    Ok(())
}

pub(crate) fn plan(config: &Config, bundle: &Path, format: Format) -> Result<()> {
    let spec = nvhook::oci::load_spec(bundle)?;
    let decision = Request::decide(&spec, config)?;
    let planned = match &decision {
        Decision::Gpu(request) => {
            let rootfs_path = spec
                .rootfs(bundle)
                .context("the bundle's config.json has no root.path")?;
            let rootfs = nvhook::rootfs::Rootfs::open(&rootfs_path)?;
            let inventory = nvhook::inventory::load(config)?;
            let image = nvhook::host_plan::probe(request, config, &rootfs);
            let plan = nvhook::host_plan::plan_for(
                request,
                &inventory,
                config,
                nvhook::host_plan::Target::Image(&image),
            )?;
            let shadow = nvhook::plan::shadow::shadowing_libcuda(
                &plan,
                spec.env("LD_LIBRARY_PATH"),
                |path| rootfs.resolve(path).is_some(),
            );
            Some((plan, shadow))
        }
        Decision::NotRequested | Decision::EnvIgnored => None,
    };
    match format {
        Format::Json => {
            let (plan, shadow) = planned.unzip();
            let mut out = serde_json::json!({ "gpu_requested": plan.is_some(), "plan": plan });
            // Only when there is one: the document stays as it was for every other image.
            if let Some(shadow) = shadow.flatten() {
                out["shadowing_libcuda"] = serde_json::to_value(shadow)?;
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Format::Text => match &planned {
            Some((plan, shadow)) => {
                print!("{}", nvhook::plan::text::plan_text(plan));
                if let Some(shadow) = shadow {
                    println!("Warning: {shadow}");
                }
            }
            None => println!("{}", nvhook::plan::text::no_gpu_text(&decision)),
        },
    }
    Ok(())
}
