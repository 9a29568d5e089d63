//! 8: a pod's container start over CRI on containerd 2.1.9 (Debian sid), by the way it gets
//! its GPU: none (plain runc), the RuntimeClass path (nvhook-runtime as the handler's runtime)
//! and the NRI plugin (`nvhook nri`, runc as the default runtime) in both of its modes. What is
//! timed is what the kubelet waits for: CreateContainer + StartContainer. Three containerds run
//! side by side, one without the plugin and two with it (one per mode), and the variants take
//! turns round by round, so that the machine's drift hits them alike. Needs `scripts/sid-engines.sh`.

use crate::stats::Samples;
use crate::support::containerd2::{Containerd2Cri, DEFAULT_HANDLER, NriPlugin};
use crate::support::cri::{ContainerRequest, Cri};
use crate::support::engines::{CgroupParent, Containerd, EngineDir, unique_name};
use crate::support::{SimNode, workspace_bin};
use std::path::PathBuf;

const GPUS: u32 = 8;
const HANDLER: &str = "nvidia";
const DEVICE_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";

/// One way of starting the pod, and its samples (ms).
struct Variant {
    label: &'static str,
    engine: usize,
    handler: &'static str,
    gpu: bool,
    samples: Samples,
}

/// One containerd and its CRI client.
struct Engine {
    containerd: Containerd,
    cri: Cri,
    image: String,
}

/// `rounds` pods per variant, after one warm-up pod each.
pub fn run(rounds: usize) {
    let node = SimNode::create(GPUS);
    // The hardened Kubernetes policy: the device plugin's mounts select the GPU.
    node.configure("accept-env-when-unprivileged = false");
    let uuid = node.gpu_uuid(3);
    let mount_point = format!("{DEVICE_MOUNT_ROOT}/{uuid}");
    let allocation = [(mount_point.as_str(), "/dev/null")];

    // The same node's config with the other NRI mode, for a third engine's plugin.
    let cdi_config = node.root().join("nri-cdi.toml");
    let text = std::fs::read_to_string(node.config()).expect("read the node's config");
    std::fs::write(&cdi_config, format!("{text}\nnri-mode = \"cdi\"\n"))
        .expect("write the cdi-mode config");
    // Engine 0: no plugin, nvhook-runtime as a handler; 1 and 2: the plugin, in each mode.
    let plugins = [None, Some(node.config()), Some(cdi_config)];
    let runtime: PathBuf = workspace_bin("nvhook-runtime");
    let dirs: Vec<EngineDir> = plugins
        .iter()
        .map(|_| EngineDir::new("cri-bench"))
        .collect();
    let mut engines = Vec::new();
    let mut running = Vec::new();
    for (dir, plugin) in dirs.iter().zip(&plugins) {
        let mut setup = Containerd2Cri::under(dir.path());
        if plugin.is_none() {
            setup.handlers.push((HANDLER.into(), runtime.clone()));
        }
        let containerd = setup.start(dir.path(), &[("NVHOOK_CONFIG", &node.config())]);
        let image = containerd.import_gpucheck_image(dir.path());
        if let Some(config) = plugin {
            let p = NriPlugin::start(config, &setup.nri.socket, dir.path());
            p.wait_registered(&node.log_file(), running.len() + 1, &containerd);
            running.push(p);
        }
        let cri = Cri::connect(containerd.socket());
        engines.push(Engine {
            containerd,
            cri,
            image,
        });
    }
    let variant = |label, engine, handler, gpu| Variant {
        label,
        engine,
        handler,
        gpu,
        samples: Samples::default(),
    };
    let mut variants = [
        variant("plain runc, no GPU", 0, DEFAULT_HANDLER, false),
        variant("RuntimeClass (nvhook-runtime), 1 GPU", 0, HANDLER, true),
        variant(
            "NRI plugin, nri-mode = hook, 1 GPU",
            1,
            DEFAULT_HANDLER,
            true,
        ),
        variant(
            "NRI plugin, nri-mode = cdi, 1 GPU",
            2,
            DEFAULT_HANDLER,
            true,
        ),
        variant("NRI plugin connected, no GPU", 1, DEFAULT_HANDLER, false),
    ];
    let cgroups = CgroupParent::new("nvhook-cri-bench");
    let logs = dirs[0].path().join("pods");
    let args = ["/gpucheck", "--dev", "/dev/nvidia3"];
    // One warm-up pod each, not counted.
    for round in 0..=rounds {
        for v in variants.iter_mut() {
            let engine = &mut engines[v.engine];
            let request = ContainerRequest {
                image: &engine.image,
                args: &args,
                mounts: if v.gpu { &allocation } else { &[] },
                ..Default::default()
            };
            let run = engine.cri.run_pod(
                &unique_name("bench"),
                v.handler,
                &cgroups.path(),
                &logs,
                &request,
            );
            let expected = if v.gpu { "ENXIO" } else { "absent" };
            assert!(
                run.output.has_line(&format!("dev /dev/nvidia3 {expected}")),
                "{}: the pod did not get what it asked for\n{}\n(node log)\n{}\n(containerd log)\n{}",
                v.label,
                run.output,
                node.log(),
                engine.containerd.log()
            );
            if round > 0 {
                v.samples.push(run.container_start.as_secs_f64() * 1e3);
            }
        }
    }
    drop(running);
    report(&variants, rounds);
    for mut engine in engines {
        drop(engine.cri);
        engine.containerd.shutdown();
    }
}

fn report(variants: &[Variant], rounds: usize) {
    println!(
        "# CRI container start on containerd 2.1.9 ({rounds} pods per variant, interleaved)\n"
    );
    println!("CreateContainer + StartContainer, ms; Δ p50 against plain runc without a GPU.\n");
    println!("| variant | p50 | p95 | Δ p50 |");
    println!("|---|---|---|---|");
    let base = variants[0].samples.p50();
    for v in variants {
        let p50 = v.samples.p50();
        println!(
            "| {} | {:.2} | {:.2} | {:+.2} |",
            v.label,
            p50,
            v.samples.p95(),
            p50 - base
        );
    }
    println!();
}
