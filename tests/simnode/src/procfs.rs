//! The node's proc root: the files the NVIDIA kernel module would publish
//! under /proc, in the module's own formats.

use crate::devices::{Capability, DRM_MAJOR, GPU_MAJOR, Majors};
use crate::fabric::Fabric;
use crate::machine::Arch;
use crate::spec::{Gpu, Params, gpu_major_name};
use anyhow::{Context, Result};
use std::fs;
use std::path::Path;

/// Writes the whole tree under `proc_root`.
pub fn write(
    proc_root: &Path,
    arch: Arch,
    params: &Params,
    gpus: &[Gpu],
    majors: Majors,
    caps: &[Capability],
    drm: bool,
) -> Result<()> {
    let driver_version = params.driver_version.as_str();
    let fabric = &params.fabric;
    let nv = proc_root.join("driver/nvidia");
    put(
        &proc_root.join("devices"),
        &devices(gpu_major_name(driver_version)?, majors, fabric, drm),
    )?;
    put(&nv.join("version"), &version(arch, driver_version))?;
    put(&nv.join("params"), PARAMS)?;
    put(&nv.join("registry"), "Binary: \"\"\n")?;
    for gpu in gpus {
        let info = information(gpu, driver_version);
        put(
            &nv.join("gpus")
                .join(gpu.kernel_bus_id())
                .join("information"),
            &info,
        )?;
    }
    for cap in caps {
        let text = simmig::capability_text(cap.minor, cap.mode);
        put(&nv.join("capabilities").join(&cap.proc_path), &text)?;
    }
    Ok(())
}

pub fn put(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().expect("proc files live in a directory");
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// /proc/devices with the driver's majors among a few the kernel always has,
/// sorted like the kernel prints them ("%3d %s").
fn devices(gpu_major_name: &str, majors: Majors, fabric: &Fabric, drm: bool) -> String {
    let mut chars = vec![
        (1, "mem"),
        (4, "tty"),
        (5, "/dev/tty"),
        (10, "misc"),
        (136, "pts"),
        (GPU_MAJOR, gpu_major_name),
        (majors.uvm, "nvidia-uvm"),
        (majors.caps, "nvidia-caps"),
    ];
    chars.extend(fabric.proc_devices(majors));
    if drm {
        chars.push((DRM_MAJOR, "drm"));
    }
    chars.sort();
    let mut text = String::from("Character devices:\n");
    for (major, name) in chars {
        text.push_str(&format!("{major:3} {name}\n"));
    }
    text.push_str("\nBlock devices:\n  7 loop\n259 blkext\n");
    text
}

fn version(arch: Arch, driver_version: &str) -> String {
    format!(
        "NVRM version: NVIDIA UNIX {} Kernel Module  {driver_version}  Tue Mar  5 22:23:56 UTC 2024\n\
         GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
        arch.uname()
    )
}

fn information(gpu: &Gpu, driver_version: &str) -> String {
    format!(
        "Model: \t\t {}\nIRQ:   \t\t {}\nGPU UUID: \t {}\nVideo BIOS: \t 92.00.45.00.03\n\
         Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n\
         Bus Location: \t {}\nDevice Minor: \t {}\nGPU Firmware: \t {driver_version}\n\
         GPU Excluded:\t No\n",
        gpu.name,
        150 + gpu.index,
        gpu.uuid,
        gpu.kernel_bus_id(),
        gpu.minor,
    )
}

/// nvidia.ko's parameters as a 550 driver prints them; ModifyDeviceFiles 1
/// is the host value that nvhook must turn to 0 in the container's copy.
const PARAMS: &str = "ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
InitializeSystemMemoryAllocations: 1
UsePageAttributeTable: 4294967295
EnableMSI: 1
EnablePCIeGen3: 0
MemoryPoolSize: 0
KMallocHeapMaxSize: 0
VMallocHeapMaxSize: 0
IgnoreMMIOCheck: 0
TCEBypassMode: 0
EnableStreamMemOPs: 0
EnableUserNUMAManagement: 1
NvLinkDisable: 0
RmProfilingAdminOnly: 1
PreserveVideoMemoryAllocations: 0
EnableS0ixPowerManagement: 0
S0ixPowerManagementVideoMemoryThreshold: 256
DynamicPowerManagement: 3
DynamicPowerManagementVideoMemoryThreshold: 200
RegisterPCIDriver: 1
EnablePCIERelaxedOrderingMode: 0
EnableResizableBar: 0
EnableGpuFirmware: 18
EnableGpuFirmwareLogs: 2
EnableDbgBreakpoint: 0
OpenRmEnableUnsupportedGpus: 1
DmaRemapPeerMmio: 1
RegistryDwords: \"\"
RegistryDwordsPerDevice: \"\"
RmMsg: \"\"
GpuBlacklist: \"\"
TemporaryFilePath: \"\"
ExcludedGpus: \"\"
";

#[cfg(test)]
mod tests {
    use super::*;

    const MAJORS: Majors = Majors {
        uvm: 511,
        caps: 510,
        imex: 509,
        nvswitch: 508,
        nvlink: 507,
        nvidia_fs: 506,
        gdrdrv: 505,
        infiniband: 504,
        rdma_cm_minor: 250,
    };

    #[test]
    fn devices_lists_the_driver_majors_in_kernel_format() {
        let text = devices("nvidia", MAJORS, &Fabric::default(), false);
        assert!(text.starts_with("Character devices:\n  1 mem\n"));
        assert!(text.contains(
            "\n195 nvidia\n509 nvidia-caps-imex-channels\n510 nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n"
        ));
    }

    #[test]
    fn devices_lists_the_fabric_modules_asked_for() {
        let fabric = Fabric {
            mofed: true,
            gdrcopy: true,
            ..Fabric::default()
        };
        let text = devices("nvidia", MAJORS, &fabric, false);
        assert!(
            text.contains("\n504 infiniband_mad\n504 infiniband_verbs\n505 gdrdrv\n"),
            "{text}"
        );
        assert!(!text.contains("nvidia-fs") && !text.contains("nvswitch"));
    }

    #[test]
    fn devices_lists_drm_when_nvidia_drm_is_loaded() {
        let text = devices("nvidia", MAJORS, &Fabric::default(), true);
        assert!(text.contains("\n195 nvidia\n226 drm\n"), "{text}");
    }
}
