//! The driver's user-space libraries: real ELF shared objects with the
//! SONAMEs NVIDIA ships, so that ldconfig, the loader and nvhook treat them
//! exactly like the real driver's files.

use crate::compile::Job;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    Utility,
    Compute,
    Video,
    Graphics,
    Ngx,
}

#[derive(Debug, Clone, Copy)]
enum Soname {
    /// A stable ABI suffix: `libcuda.so.1`.
    Abi(&'static str),
    /// Private libraries whose SONAME is the full file name (`.so.<version>`).
    Versioned,
    /// Released apart from the driver: ABI suffix, and a version of its own for the file.
    Own(&'static str, &'static str),
}

#[derive(Debug)]
pub struct Library {
    /// The name between `lib` and `.so`: `cuda`, `nvidia-ml`, `GLX_nvidia`.
    pub name: &'static str,
    soname: Soname,
    pub cap: Cap,
}

const fn lib(name: &'static str, soname: Soname, cap: Cap) -> Library {
    Library { name, soname, cap }
}

use Cap::{Compute, Graphics, Ngx, Utility, Video};
use Soname::{Abi, Own, Versioned};

/// Every library of every capability, SONAMEs as the 550 driver has them.
pub const LIBRARIES: &[Library] = &[
    lib("nvidia-ml", Abi("1"), Utility),
    lib("nvidia-cfg", Abi("1"), Utility),
    lib("nvidia-nscq", Abi("2"), Utility),
    lib("cuda", Abi("1"), Compute),
    lib("cudadebugger", Abi("1"), Compute),
    lib("nvidia-opencl", Abi("1"), Compute),
    lib("nvidia-gpucomp", Versioned, Compute),
    lib("nvidia-ptxjitcompiler", Abi("1"), Compute),
    lib("nvidia-fatbinaryloader", Versioned, Compute),
    lib("nvidia-allocator", Abi("1"), Compute),
    lib("nvidia-compiler", Versioned, Compute),
    lib("nvidia-pkcs11", Versioned, Compute),
    lib("nvidia-pkcs11-openssl3", Versioned, Compute),
    lib("nvidia-nvvm", Abi("4"), Compute),
    lib("vdpau_nvidia", Abi("1"), Video),
    lib("nvidia-encode", Abi("1"), Video),
    lib("nvidia-opticalflow", Abi("1"), Video),
    lib("nvcuvid", Abi("1"), Video),
    lib("nvidia-eglcore", Versioned, Graphics),
    lib("nvidia-glcore", Versioned, Graphics),
    lib("nvidia-tls", Versioned, Graphics),
    lib("nvidia-glsi", Versioned, Graphics),
    lib("nvidia-fbc", Abi("1"), Graphics),
    lib("nvidia-ifr", Abi("1"), Graphics),
    lib("nvidia-rtcore", Versioned, Graphics),
    lib("nvoptix", Abi("1"), Graphics),
    lib("GLX_nvidia", Abi("0"), Graphics),
    lib("EGL_nvidia", Abi("0"), Graphics),
    lib("GLESv2_nvidia", Abi("2"), Graphics),
    lib("GLESv1_CM_nvidia", Abi("1"), Graphics),
    lib("nvidia-glvkspirv", Versioned, Graphics),
    lib("nvidia-cbl", Versioned, Graphics),
    lib("nvidia-vulkan-producer", Versioned, Graphics),
    lib("nvidia-egl-gbm", Own("1", "1.1.2"), Graphics),
    lib("nvidia-egl-wayland", Own("1", "1.1.19"), Graphics),
    lib("nvidia-ngx", Abi("1"), Ngx),
];

/// The library the mock NVML stands in for (64-bit only: the mock is Rust).
pub const NVML: &str = "nvidia-ml";

impl Library {
    pub fn file_name(&self, driver_version: &str) -> String {
        match self.soname {
            Own(_, own) => format!("lib{}.so.{own}", self.name),
            Abi(_) | Versioned => format!("lib{}.so.{driver_version}", self.name),
        }
    }

    pub fn soname(&self, driver_version: &str) -> String {
        match self.soname {
            Abi(abi) | Own(abi, _) => format!("lib{}.so.{abi}", self.name),
            Versioned => self.file_name(driver_version),
        }
    }

    /// compat32 ships 32-bit copies of the utility and compute libraries.
    fn has_compat32(&self) -> bool {
        matches!(self.cap, Utility | Compute)
    }

    pub fn source(&self, driver_version: &str, cuda_version: u32) -> String {
        let mut c = marker_source(self.name, &self.file_name(driver_version), driver_version);
        if self.name == "cuda" {
            // CUDA_SUCCESS is 0, CUDA_ERROR_INVALID_VALUE is 1.
            c.push_str(&format!(
                "int cuInit(unsigned int flags) {{ (void)flags; return 0; }}\n\
                 int cuDriverGetVersion(int *v) {{ if (!v) return 1; *v = {cuda_version}; return 0; }}\n"
            ));
        }
        c
    }
}

/// The C source of a library that only names itself: `nvhook_sim_<name>()` returns its file
/// name and the driver version.
pub fn marker_source(name: &str, file_name: &str, driver_version: &str) -> String {
    format!(
        "const char *nvhook_sim_{}(void) {{ return \"{file_name} (simulated NVIDIA driver {driver_version})\"; }}\n",
        name.replace('-', "_")
    )
}

/// A 32-bit stand-in for libc.so.6 to link the compat32 libraries against.
/// No 32-bit libc is installed, yet the real libraries need libc.so.6 in
/// DT_NEEDED: ldconfig only then files them as "libc6" rather than bare "ELF".
pub fn libc32_stub_job(output: &Path) -> Job {
    Job {
        source: "void nvhook_sim_libc_stub(void) {}\n".into(),
        flags: [
            "-m32",
            "-shared",
            "-nostdlib",
            "-fPIC",
            "-Wl,-soname,libc.so.6",
        ]
        .map(String::from)
        .to_vec(),
        output: output.to_path_buf(),
    }
}

/// Xorg's driver and GLX server modules, where Debian's Xorg loads them from.
pub fn xorg_jobs(driver_root: &Path, driver_version: &str) -> Vec<Job> {
    [
        ("usr/lib/xorg/modules/drivers/nvidia_drv.so".to_string(), "nvidia_drv"),
        (
            format!("usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{driver_version}"),
            "glxserver_nvidia",
        ),
    ]
    .into_iter()
    .map(|(path, name)| Job {
        source: format!(
            "const char *nvhook_sim_{name}(void) {{ return \"{name} (simulated NVIDIA driver {driver_version})\"; }}\n"
        ),
        flags: vec!["-shared".into(), "-fPIC".into()],
        output: driver_root.join(path),
    })
    .collect()
}

/// Compile jobs for every library under `driver_root`, in its 64-bit directory `lib64` and
/// (compat32) `lib32`, except the 64-bit NVML, which is the mock copied in by the caller. The
/// compat32 libraries link against `libc32_stub` (see `libc32_stub_job`).
pub fn jobs(
    driver_root: &Path,
    driver_version: &str,
    cuda_version: u32,
    (lib64, lib32): (&str, Option<&str>),
    libc32_stub: &Path,
) -> Vec<Job> {
    let mut jobs = Vec::new();
    for lib in LIBRARIES {
        let soname_flag = format!("-Wl,-soname,{}", lib.soname(driver_version));
        let source = lib.source(driver_version, cuda_version);
        if lib.name != NVML {
            jobs.push(Job {
                source: source.clone(),
                flags: vec!["-shared".into(), "-fPIC".into(), soname_flag.clone()],
                output: driver_root.join(lib64).join(lib.file_name(driver_version)),
            });
        }
        let Some(lib_dir_32) = lib32 else {
            continue;
        };
        if lib.has_compat32() {
            // -nostdlib: no 32-bit libc is installed, and these need none.
            let mut flags: Vec<String> = ["-m32", "-shared", "-nostdlib", "-fPIC", &soname_flag]
                .map(String::from)
                .to_vec();
            flags.push("-Wl,--no-as-needed".into());
            flags.push(libc32_stub.display().to_string());
            jobs.push(Job {
                source,
                flags,
                output: driver_root
                    .join(lib_dir_32)
                    .join(lib.file_name(driver_version)),
            });
        }
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Arch;

    #[test]
    fn sonames_and_file_names() {
        let find = |n| LIBRARIES.iter().find(|l| l.name == n).unwrap();
        assert_eq!(find("cuda").soname("550.54.15"), "libcuda.so.1");
        assert_eq!(
            find("GLESv2_nvidia").soname("550.54.15"),
            "libGLESv2_nvidia.so.2"
        );
        assert_eq!(
            find("nvidia-glcore").soname("550.54.15"),
            "libnvidia-glcore.so.550.54.15"
        );
        assert_eq!(find("cuda").file_name("550.54.15"), "libcuda.so.550.54.15");
        assert!(
            find("nvidia-pkcs11-openssl3")
                .source("550.54.15", 12040)
                .starts_with("const char *nvhook_sim_nvidia_pkcs11_openssl3(void)")
        );
    }

    #[test]
    fn every_library_but_nvml_is_built_and_compat32_covers_utility_and_compute() {
        let jobs = jobs(
            Path::new("/d"),
            "550.54.15",
            12040,
            (Arch::X86_64.lib_dir(), Arch::X86_64.lib_dir_32()),
            Path::new("/s/libc.so.6"),
        );
        let built64 = jobs
            .iter()
            .filter(|j| j.output.starts_with("/d/usr/lib/x86_64-linux-gnu"))
            .count();
        let built32 = jobs
            .iter()
            .filter(|j| j.output.starts_with("/d/usr/lib/i386-linux-gnu"))
            .count();
        assert_eq!(built64, LIBRARIES.len() - 1);
        assert_eq!(built32, 14);
        let cuda = jobs
            .iter()
            .find(|j| j.output.ends_with("libcuda.so.550.54.15"))
            .unwrap();
        assert!(cuda.source.contains("*v = 12040"));
    }

    #[test]
    fn an_aarch64_driver_has_no_compat32_libraries() {
        let jobs = jobs(
            Path::new("/d"),
            "580.95.05",
            13000,
            (Arch::Aarch64.lib_dir(), Arch::Aarch64.lib_dir_32()),
            Path::new("/s/libc.so.6"),
        );
        assert_eq!(jobs.len(), LIBRARIES.len() - 1);
        assert!(
            jobs.iter()
                .all(|j| j.output.starts_with("/d/usr/lib/aarch64-linux-gnu")
                    && !j.flags.contains(&"-m32".to_string()))
        );
    }
}
