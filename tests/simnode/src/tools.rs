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

/// The simulated nvidia-smi: its version, then `nvidia-smi -L` for the GPUs this process
/// can open (each through `node_of` its node), numbered from 0 as the real one numbers a
/// container's GPUs. On the simulated node an open that the cgroup allows fails with ENXIO
/// (no driver; ENODEV for WSL2's misc `/dev/dxg`), one it denies with EPERM, and a GPU whose
/// node the container was not given is absent.
pub fn smi_source(
    driver_version: &str,
    cuda_version: &str,
    gpus: &[Gpu],
    node_of: impl Fn(&Gpu) -> String,
) -> String {
    let header = format!(
        "NVIDIA-SMI simulated {driver_version}\nDriver Version: {driver_version}   CUDA Version: {cuda_version}\n"
    );
    let entries: String = gpus
        .iter()
        .map(|gpu| {
            let mig: String = gpu
                .mig
                .iter()
                .enumerate()
                .map(|(i, mig)| {
                    let profile = mig.name.rsplit(' ').next().unwrap_or_default();
                    format!("  MIG {profile:<11} Device {i:>2}: (UUID: {})\n", mig.uuid)
                })
                .collect();
            format!(
                "    {{{}, {}, {}, {}}},\n",
                c_string(&node_of(gpu)),
                c_string(&gpu.name),
                c_string(&gpu.uuid),
                c_string(&mig)
            )
        })
        .collect();
    format!(
        r#"#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
struct gpu {{ const char *node, *name, *uuid, *mig; }};
static const struct gpu GPUS[] = {{
{entries}    {{0, 0, 0, 0}},
}};
int main(void) {{
    fputs({header}, stdout);
    int shown = 0;
    for (const struct gpu *g = GPUS; g->node; g++) {{
        int fd = open(g->node, O_RDWR | O_CLOEXEC);
        if (fd < 0 && errno != ENXIO && errno != ENODEV) continue;
        if (fd >= 0) close(fd);
        printf("GPU %d: %s (UUID: %s)\n", shown++, g->name, g->uuid);
        fputs(g->mig, stdout);
    }}
    return 0;
}}
"#,
        header = c_string(&header)
    )
}

pub fn jobs(driver_root: &Path, driver_version: &str, smi_source: &str) -> Vec<Job> {
    names()
        .map(|name| {
            let output = driver_root.join(BIN_DIR).join(name);
            if name == "nvidia-smi" {
                return tool_job(&output, smi_source.to_owned());
            }
            let source = {
                let text = format!("{name} (simulated NVIDIA driver {driver_version})\n");
                format!(
                    "#include <stdio.h>\nint main(void) {{ fputs({}, stdout); return 0; }}\n",
                    c_string(&text)
                )
            };
            tool_job(&output, source)
        })
        .collect()
}

/// A tool built from `source` at `output`: static, so that it runs in any image.
pub fn tool_job(output: &Path, source: String) -> Job {
    Job {
        source,
        // -s: static glibc binaries are ~800 KiB; symbols are useless here.
        flags: vec!["-static".into(), "-s".into()],
        output: output.to_path_buf(),
    }
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
    fn smi_knows_every_gpu_and_mig_device_by_its_node() {
        let params = crate::spec::Params {
            gpus: 2,
            mig: vec![(1, 2)],
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            nvml_init_error: 0,
            nvml_init_delay_ms: 0,
            lost: vec![],
            fabric: crate::fabric::Fabric::default(),
            persistence_off: vec![],
            memory_limits_not_supported: false,
            wsl: false,
        };
        let gpus = params.gpu_list();
        let source = smi_source("550.54.15", "12.4", &gpus, |g| {
            format!("/dev/nvidia{}", g.minor)
        });
        assert!(
            source.contains("NVIDIA-SMI simulated 550.54.15\\n"),
            "{source}"
        );
        assert!(
            source.contains(&format!(
                "{{\"/dev/nvidia1\", \"NVIDIA A100-SXM4-80GB\", \"{}\", ",
                gpus[1].uuid
            )),
            "{source}"
        );
        assert!(
            source.contains(&format!(
                "MIG 3g.40gb     Device  1: (UUID: {})",
                gpus[1].mig[1].uuid
            )),
            "{source}"
        );
    }
}
