//! The driver's executables: tiny static programs, so that they run in any
//! image (busybox or glibc) once nvhook has mounted them in.

use crate::compile::Job;
use crate::spec::Gpu;
use std::path::Path;

pub const BIN_DIR: &str = "usr/bin";

/// Utility and compute executables besides nvidia-smi.
const PLAIN_TOOLS: &[&str] = &[
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

pub fn names() -> impl Iterator<Item = &'static str> {
    std::iter::once("nvidia-smi").chain(PLAIN_TOOLS.iter().copied())
}

/// What the simulated nvidia-smi prints: its version, then `nvidia-smi -L`.
pub fn smi_output(driver_version: &str, cuda_version: &str, gpus: &[Gpu]) -> String {
    let mut out = format!(
        "NVIDIA-SMI simulated {driver_version}\nDriver Version: {driver_version}   CUDA Version: {cuda_version}\n"
    );
    for gpu in gpus {
        out.push_str(&format!(
            "GPU {}: {} (UUID: {})\n",
            gpu.index, gpu.name, gpu.uuid
        ));
        for (i, mig) in gpu.mig.iter().enumerate() {
            let profile = mig.name.rsplit(' ').next().unwrap_or_default();
            out.push_str(&format!(
                "  MIG {profile:<11} Device {i:>2}: (UUID: {})\n",
                mig.uuid
            ));
        }
    }
    out
}

pub fn jobs(driver_root: &Path, driver_version: &str, smi_text: &str) -> Vec<Job> {
    names()
        .map(|name| {
            let text = if name == "nvidia-smi" {
                smi_text.to_owned()
            } else {
                format!("{name} (simulated NVIDIA driver {driver_version})\n")
            };
            Job {
                source: format!(
                    "#include <stdio.h>\nint main(void) {{ fputs({}, stdout); return 0; }}\n",
                    c_string(&text)
                ),
                // -s: static glibc binaries are ~800 KiB; symbols are useless here.
                flags: vec!["-static".into(), "-s".into()],
                output: driver_root.join(BIN_DIR).join(name),
            }
        })
        .collect()
}

/// A C string literal for arbitrary text (octal escapes for anything odd).
fn c_string(text: &str) -> String {
    let mut lit = String::from("\"");
    for b in text.bytes() {
        match b {
            b'"' | b'\\' => {
                lit.push('\\');
                lit.push(b as char);
            }
            b'\n' => lit.push_str("\\n"),
            b' '..=b'~' => lit.push(b as char),
            _ => lit.push_str(&format!("\\{b:03o}")),
        }
    }
    lit.push('"');
    lit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_strings_escape_quotes_and_control_bytes() {
        assert_eq!(c_string("a\"b\\c\n\t"), "\"a\\\"b\\\\c\\n\\011\"");
    }

    #[test]
    fn smi_lists_gpus_and_mig_devices() {
        let params = crate::spec::Params {
            gpus: 2,
            mig: vec![(1, 2)],
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            nvml_init_error: 0,
            nvml_init_delay_ms: 0,
        };
        let gpus = params.gpu_list();
        let out = smi_output("550.54.15", "12.4", &gpus);
        assert!(out.starts_with("NVIDIA-SMI simulated 550.54.15\n"));
        assert!(out.contains(&format!(
            "GPU 1: NVIDIA A100-SXM4-80GB (UUID: {})",
            gpus[1].uuid
        )));
        assert!(out.contains(&format!(
            "MIG 3g.40gb     Device  1: (UUID: {})",
            gpus[1].mig[1].uuid
        )));
    }
}
