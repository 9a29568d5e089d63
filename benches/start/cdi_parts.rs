//! 12: what a GPU from nvhook's CDI spec costs runc, layer by layer. The spec's edits for
//! `nvidia.com/gpu=3` are put into a bundle as an engine's CDI injection puts them (the
//! device's and the spec's device nodes with their cgroup rules, the spec's bind mounts, its
//! createContainer hook), one layer more in each variant, and `runc run` starts it on the
//! host's cgroup v1, with bundles on tmpfs; beside them the same GPU, with every capability,
//! from nvhook's prestart hook, which makes the nodes and mounts itself. The variants take
//! turns, each round starting at the next. The hook's own time comes from its log
//! (`hook finished ... total_us`), so that what is left of a layer is runc's work for it and
//! the hook process's exec and exit.

use crate::hook_timer;
use crate::setup::tmpfs_work_dir;
use crate::stats::Samples;
use crate::support::{Bundle, RuntimeEnv, SimNode, glibc_image, run_container};
use serde_json::{Value, json};
use std::path::Path;

const GPU: &str = "3";

#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Layer {
    Plain,
    Nodes,
    Mounts,
    TrueHook,
    NvhookHook,
    /// The same hook run through the bench's timer, for its wall time as runc runs it.
    TimedNvhookHook,
    /// The nodes and nvhook's hook of a spec written with `cdi-mounts = "hook"`: no mount for
    /// runc, the hook makes them.
    HookMakesMounts,
    PrestartHook,
}

struct Variant {
    label: String,
    layer: Layer,
    samples: Samples,
}

/// `rounds` starts per variant, after one warm-up start each.
pub fn run(rounds: usize) {
    let node = SimNode::create(8);
    let work = tmpfs_work_dir();
    let spec_path = work.path().join("nvidia.json");
    // The layers are those of a spec whose runtime makes the driver files' mounts.
    node.set("cdi-mounts", "\"runtime\"");
    node.generate_cdi_spec(&spec_path);
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).expect("read the spec"))
            .expect("the spec is JSON");
    let device = spec["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == GPU))
        .expect("the spec has GPU 3");
    let edits = [&spec["containerEdits"], &device["containerEdits"]];
    let list = |key: &str| -> Vec<Value> {
        edits
            .iter()
            .flat_map(|e| e[key].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let (nodes, mounts, hooks) = (list("deviceNodes"), list("mounts"), list("hooks"));
    assert_eq!(hooks.len(), 1, "nvhook's spec has one hook: {hooks:?}");
    // The same device from a spec whose hook makes the mounts.
    node.set("cdi-mounts", "\"hook\"");
    let hook_spec_path = work.path().join("nvidia-hook-mounts.json");
    node.generate_cdi_spec(&hook_spec_path);
    let hook_spec: Value =
        serde_json::from_str(&std::fs::read_to_string(&hook_spec_path).expect("read the spec"))
            .expect("the spec is JSON");
    assert!(hook_spec["containerEdits"]["mounts"].is_null());
    let mounting_hook = hook_spec["containerEdits"]["hooks"][0].clone();
    let variant = |label: String, layer| Variant {
        label,
        layer,
        samples: Samples::default(),
    };
    let mut variants = [
        variant("runc, no GPU".into(), Layer::Plain),
        variant(
            format!("+ the GPU's {} device nodes (the floor)", nodes.len()),
            Layer::Nodes,
        ),
        variant(
            format!("+ the spec's {} bind mounts", mounts.len()),
            Layer::Mounts,
        ),
        variant(
            "+ a createContainer hook that is /bin/true".into(),
            Layer::TrueHook,
        ),
        variant(
            "+ nvhook's createContainer hook in its place: the whole CDI device".into(),
            Layer::NvhookHook,
        ),
        variant(
            "the same, nvhook's hook run through the bench's timer".into(),
            Layer::TimedNvhookHook,
        ),
        variant(
            format!(
                "the GPU's nodes and nvhook's createContainer hook making the {} mounts itself (`cdi-mounts = \"hook\"`)",
                mounts.len()
            ),
            Layer::HookMakesMounts,
        ),
        variant(
            "nvhook's prestart hook instead, every capability (nodes and mounts by nvhook)".into(),
            Layer::PrestartHook,
        ),
    ];
    let record = work.path().join("create-container.rec");
    let n = variants.len();
    for round in 0..=rounds {
        for i in 0..n {
            let v = &mut variants[(round + i) % n];
            let mut bundle = Bundle::new_in(work.path(), glibc_image(), &["/gpucheck"]);
            match v.layer {
                Layer::PrestartHook => {
                    bundle.env(&format!("NVIDIA_VISIBLE_DEVICES={GPU}"));
                    bundle.env("NVIDIA_DRIVER_CAPABILITIES=all");
                    bundle.prestart_hook(&node);
                }
                Layer::HookMakesMounts => {
                    inject(
                        &mut bundle,
                        Layer::Nodes,
                        &nodes,
                        &[],
                        &mounting_hook,
                        &record,
                    );
                    bundle.raw_hook("createContainer", hook_entry(&mounting_hook));
                }
                layer => inject(&mut bundle, layer, &nodes, &mounts, &hooks[0], &record),
            }
            let started = std::time::Instant::now();
            let output = run_container(&bundle, RuntimeEnv::CgroupV1);
            let ms = started.elapsed().as_secs_f64() * 1e3;
            output.assert_success();
            match round {
                // The warm-up's hook time is not one of the measured starts'.
                0 => {
                    let _ = std::fs::remove_file(&record);
                }
                _ => v.samples.push(ms),
            }
        }
    }
    let log = node.log();
    let hook_total = |stage: &str| -> Samples {
        log.lines()
            .filter(|l| l.contains("hook finished") && l.contains(&format!("stage={stage}")))
            .filter_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("total_us="))
            })
            .filter_map(|us| us.parse::<f64>().ok())
            .map(|us| us / 1e3)
            .collect()
    };
    println!(
        "# nvhook's CDI device through runc, layer by layer ({rounds} starts per variant, turns; runc run of gpucheck, cgroup v1, bundles on tmpfs)\n"
    );
    println!("| variant | p50 | p95 | Δ p50 against the row above | Δ p50 against plain |");
    println!("|---|---|---|---|---|");
    let plain = variants[0].samples.p50();
    let mut above = plain;
    for v in &variants {
        let p50 = v.samples.p50();
        println!(
            "| {} | {p50:.2} | {:.2} | {:+.2} | {:+.2} |",
            v.label,
            v.samples.p95(),
            p50 - above,
            p50 - plain
        );
        above = p50;
    }
    let timed = hook_timer::read_record(&record);
    println!(
        "\nnvhook's createContainer hook as runc runs it (the timer: exec to exit): wall p50 {:.2} ms, p95 {:.2} ms, CPU p50 {:.2} ms, page faults p50 {:.0}, over {} runs.",
        timed.wall.p50(),
        timed.wall.p95(),
        timed.cpu.p50(),
        timed.faults.p50(),
        timed.wall.len()
    );
    let create = hook_total("CreateContainer");
    let prestart = hook_total("Prestart");
    println!(
        "\nnvhook's own time (its log's total, from its start to its end): createContainer hook p50 {:.2} ms over {} runs; prestart hook p50 {:.2} ms over {} runs.\n",
        create.p50(),
        create.len(),
        prestart.p50(),
        prestart.len()
    );
}

/// The spec's edits up to `layer`, as an engine's CDI injection writes them into config.json;
/// a timed hook appends to `record`.
fn inject(
    bundle: &mut Bundle,
    layer: Layer,
    nodes: &[Value],
    mounts: &[Value],
    hook: &Value,
    record: &Path,
) {
    if layer >= Layer::Nodes {
        for node in nodes {
            let number = |key: &str| node[key].as_u64().expect("a device number") as u32;
            let path = node["path"].as_str().expect("a device path");
            bundle.extra_device(path, number("major"), number("minor"));
            bundle.allow_device(number("major"), number("minor"));
        }
    }
    if layer >= Layer::Mounts {
        for mount in mounts {
            bundle.raw_mount(json!({
                "destination": mount["containerPath"],
                "source": mount["hostPath"],
                "type": "bind",
                "options": mount["options"],
            }));
        }
    }
    match layer {
        Layer::TrueHook => {
            bundle.raw_hook(
                "createContainer",
                json!({ "path": "/bin/true", "args": ["true"] }),
            );
        }
        Layer::NvhookHook => {
            bundle.raw_hook("createContainer", hook_entry(hook));
        }
        Layer::TimedNvhookHook => {
            let bench = std::env::current_exe().expect("locate the bench binary");
            let mut args = vec![json!(bench), json!(hook_timer::MODE), json!(record)];
            args.push(hook["path"].clone());
            args.extend(
                hook["args"].as_array().expect("hook args")[1..]
                    .iter()
                    .cloned(),
            );
            bundle.raw_hook(
                "createContainer",
                json!({ "path": bench, "args": args, "env": hook["env"] }),
            );
        }
        _ => {}
    }
}

/// A CDI hook as an OCI hook entry.
fn hook_entry(hook: &Value) -> Value {
    let mut entry = hook.clone();
    entry.as_object_mut().expect("a hook").remove("hookName");
    entry
}
