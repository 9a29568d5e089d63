//! The plan on a WSL2 host: `/dev/dxg` for all GPUs, the driver's files at their host paths,
//! `nvidia-smi` linked into `/usr/bin`, and the loader pointed at the store and at dxcore.
//! No `/dev/nvidia*`, no `/proc/driver/nvidia` view: WSL2 has neither.

use super::{
    CacheEntry, Choice, CompatDir, DeviceNode, Files, Gathered, Layout, Mount, MountKind, Plan,
    PlanError, Skipped, Symlink, assemble, check_requirements, imex_and_families, origin,
    required_library,
};
use crate::inventory::Inventory;
use crate::inventory::wsl::{SMI, SMI_LINK, WslDriver, soname_of};
use crate::request::{DeviceSelection, Request};
use nvhook_ldcache::ElfClass;

pub(super) fn build(
    request: &Request,
    inventory: &Inventory,
    driver: &WslDriver,
    layout: Layout,
) -> Result<Plan, PlanError> {
    let choices: Vec<Choice> = match &request.devices {
        DeviceSelection::NoDevices => Vec::new(),
        DeviceSelection::All => inventory.gpus.iter().map(Choice::Gpu).collect(),
        DeviceSelection::List(ids) => {
            let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
            return Err(PlanError::WslNeedsAll {
                origin: origin(request.source, &ids.join(",")),
                all: origin(request.source, "all"),
            });
        }
    };
    check_requirements(request, inventory, &choices)?;
    let mut devices = Vec::new();
    if !choices.is_empty() {
        devices.push(DeviceNode::from(&driver.dxg));
    }
    let (extra, skipped) = imex_and_families::nodes(request, inventory)?;
    devices.extend(extra);
    let files = files(driver);
    for &cap in &request.capabilities {
        if let Some(soname) = required_library(cap)
            && !files.ldcache.iter().any(|e| e.soname == soname)
        {
            return Err(PlanError::MissingLibrary {
                capability: cap,
                soname,
            });
        }
    }
    let gathered = Gathered {
        devices,
        files,
        proc_overlay: None,
        skipped,
    };
    Ok(assemble(request, inventory, &choices, layout, gathered))
}

/// Every file of the driver at its host path, whatever the capabilities: the store is one
/// driver for every use, as NVIDIA's WSL spec gives it whole. A library whose file name is
/// not the name the loader looks for (`libcuda.so.1.1`) gets that name as a link beside it;
/// `libcuda.so` too, for programs that open the development name.
fn files(driver: &WslDriver) -> Files {
    let mut out = Files {
        mounts: Vec::new(),
        symlinks: Vec::new(),
        ldcache: Vec::new(),
    };
    for file in &driver.files {
        out.mounts.push(Mount {
            source: file.host_path.clone(),
            destination: file.container_path.clone(),
            kind: MountKind::File,
        });
        let (dir, name) = file.dir_and_name();
        if name == SMI {
            out.symlinks.push(Symlink {
                path: SMI_LINK.into(),
                target: file.container_path.clone(),
            });
        }
        let Some(soname) = soname_of(name) else {
            continue;
        };
        if soname != name {
            out.symlinks.push(Symlink {
                path: format!("{dir}/{soname}"),
                target: name.into(),
            });
        }
        if soname == "libcuda.so.1" {
            out.symlinks.push(Symlink {
                path: format!("{dir}/libcuda.so"),
                target: soname.into(),
            });
        }
        out.ldcache.push(CacheEntry {
            soname: soname.into(),
            path: format!("{dir}/{soname}"),
            class: ElfClass::Lib64,
        });
    }
    out
}

/// The image's CUDA forward-compatibility libraries are left alone on WSL2: they speak to a
/// Linux kernel module, and the GPU here is behind Windows' driver.
pub(super) fn compat_skipped(found: &CompatDir) -> Skipped {
    let skipped = Skipped {
        what: format!("CUDA forward compatibility ({})", found.dir),
        why: "WSL2's driver is Windows': the image's compat libraries are not used".into(),
    };
    tracing::info!(what = %skipped.what, why = %skipped.why, "skipped");
    skipped
}

#[cfg(test)]
mod tests {
    use super::super::{ImageInfo, build as plan};
    use super::*;
    use crate::capability::Capability;
    use crate::device_rule::DeviceRule;
    use crate::inventory::{HostNode, WslFile};
    use crate::plan::fixtures::standard;
    use crate::request::{DeviceId, SelectionSource};

    const STORE: &str = "/usr/lib/wsl/drivers/nv_dispi.inf_amd64_0123";

    /// The standard node's GPUs, seen from a WSL2 guest: no minors, no NVIDIA major, no
    /// Linux driver files, one /dev/dxg.
    fn wsl_inventory() -> Inventory {
        let mut inv = standard();
        for gpu in &mut inv.gpus {
            gpu.minor = None;
            gpu.mig_devices.clear();
            gpu.mig_enabled = false;
        }
        inv.files = Default::default();
        inv.majors = Default::default();
        inv.nodes.clear();
        inv.proc_driver = None;
        inv.mig_config_minor = None;
        inv.mig_monitor_minor = None;
        let file = |path: String| WslFile {
            host_path: format!("/node/driver{path}").into(),
            container_path: path,
        };
        let mut files = vec![file("/usr/lib/wsl/lib/libdxcore.so".into())];
        for name in [
            "libcuda.so.1.1",
            "libnvidia-ml.so.1",
            "nvcubins.bin",
            "nvidia-smi",
        ] {
            files.push(file(format!("{STORE}/{name}")));
        }
        inv.wsl = Some(WslDriver {
            dxg: HostNode {
                path: "/dev/dxg".into(),
                host_path: "/node/dev/dxg".into(),
                major: 10,
                minor: 63,
                mode: 0o666,
            },
            store: STORE.into(),
            files,
        });
        inv
    }

    fn request(devices: DeviceSelection) -> Request {
        Request {
            devices,
            capabilities: [Capability::Compute, Capability::Utility].into(),
            requirements: Default::default(),
            mig_config: None,
            mig_monitor: None,
            privileged: false,
            source: SelectionSource::Env,
            cuda_version: None,
            imex_channels: None,
            families: Default::default(),
            memory_limits: None,
        }
    }

    fn image() -> ImageInfo {
        ImageInfo {
            debian: true,
            has_ldcache: true,
            ..ImageInfo::default()
        }
    }

    #[test]
    fn all_gpus_get_dxg_and_the_driver_at_its_host_paths() {
        let p = plan(
            &request(DeviceSelection::All),
            &wsl_inventory(),
            "/node",
            image(),
        )
        .unwrap();
        assert_eq!(p.selected.len(), 4);
        let nodes: Vec<_> = p
            .devices
            .iter()
            .map(|d| (d.path.as_str(), d.major, d.minor))
            .collect();
        assert_eq!(nodes, [("/dev/dxg", 10, 63)]);
        assert_eq!(p.cgroup_rules, [DeviceRule::char_rw(10, 63)]);
        let mounts: Vec<_> = p.mounts.iter().map(|m| m.destination.as_str()).collect();
        assert_eq!(
            mounts,
            [
                "/usr/lib/wsl/lib/libdxcore.so".to_string(),
                format!("{STORE}/libcuda.so.1.1"),
                format!("{STORE}/libnvidia-ml.so.1"),
                format!("{STORE}/nvcubins.bin"),
                format!("{STORE}/nvidia-smi"),
            ]
        );
        assert!(
            p.mounts
                .iter()
                .all(|m| m.source.ends_with(m.destination.trim_start_matches('/')))
        );
        let links: Vec<_> = p
            .symlinks
            .iter()
            .map(|l| (l.path.as_str(), l.target.as_str()))
            .collect();
        assert_eq!(
            links,
            [
                (format!("{STORE}/libcuda.so.1").as_str(), "libcuda.so.1.1"),
                (format!("{STORE}/libcuda.so").as_str(), "libcuda.so.1"),
                (SMI_LINK, format!("{STORE}/nvidia-smi").as_str()),
            ]
        );
        let cache: Vec<_> = p
            .ldcache
            .iter()
            .map(|e| (e.soname.as_str(), e.path.as_str()))
            .collect();
        assert_eq!(
            cache,
            [
                (
                    "libdxcore.so",
                    "/usr/lib/wsl/lib/libdxcore.so".to_string().as_str()
                ),
                ("libcuda.so.1", format!("{STORE}/libcuda.so.1").as_str()),
                (
                    "libnvidia-ml.so.1",
                    format!("{STORE}/libnvidia-ml.so.1").as_str()
                ),
            ]
        );
        assert_eq!(p.ld_so_confs[0].dirs, ["/usr/lib/wsl/lib", STORE]);
        assert_eq!(p.proc_overlay, None);
    }

    #[test]
    fn no_gpu_gets_the_files_without_dxg() {
        let p = plan(
            &request(DeviceSelection::NoDevices),
            &wsl_inventory(),
            "/node",
            image(),
        )
        .unwrap();
        assert!(p.devices.is_empty() && p.cgroup_rules.is_empty());
        assert_eq!(p.mounts.len(), 5);
    }

    #[test]
    fn some_gpus_cannot_be_given_on_wsl() {
        for (source, origin, all) in [
            (
                SelectionSource::Env,
                "NVIDIA_VISIBLE_DEVICES=0,GPU-x",
                "NVIDIA_VISIBLE_DEVICES=all",
            ),
            (SelectionSource::CliFlag, "--device=0,GPU-x", "--device=all"),
        ] {
            let mut r = request(DeviceSelection::List(vec![
                DeviceId::Index(0),
                DeviceId::GpuUuid("GPU-x".into()),
            ]));
            r.source = source;
            let err = plan(&r, &wsl_inventory(), "/node", image()).unwrap_err();
            let want = PlanError::WslNeedsAll {
                origin: origin.into(),
                all: all.into(),
            };
            assert_eq!(err, want);
            assert!(
                err.to_string().ends_with(&format!("(ask for all: {all})")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_store_without_libcuda_fails_a_compute_container() {
        let mut inv = wsl_inventory();
        let driver = inv.wsl.as_mut().unwrap();
        driver
            .files
            .retain(|f| !f.container_path.ends_with("libcuda.so.1.1"));
        let err = plan(&request(DeviceSelection::All), &inv, "/node", image()).unwrap_err();
        assert_eq!(
            err,
            PlanError::MissingLibrary {
                capability: Capability::Compute,
                soname: "libcuda.so.1"
            }
        );
    }

    #[test]
    fn compat_libraries_are_skipped() {
        let image = ImageInfo {
            cuda_compat: Some(CompatDir {
                dir: "/usr/local/cuda/compat".into(),
                files: vec!["libcuda.so.580.1".into()],
            }),
            ..image()
        };
        let p = plan(
            &request(DeviceSelection::All),
            &wsl_inventory(),
            "/node",
            image,
        )
        .unwrap();
        assert_eq!(p.cuda_compat, None);
        assert_eq!(
            p.skipped[0].what,
            "CUDA forward compatibility (/usr/local/cuda/compat)"
        );
    }

    #[test]
    fn a_linux_node_without_minors_names_the_gpu() {
        let mut inv = standard();
        inv.gpus[1].minor = None;
        let r = request(DeviceSelection::List(vec![DeviceId::Index(1)]));
        let err = plan(&r, &inv, "/node", image()).unwrap_err();
        assert_eq!(err, PlanError::NoMinor { index: 1 });
    }
}
