//! 12: what a GPU from nvhook's CDI spec costs runc, layer by layer. The spec's edits for
//! `nvidia.com/gpu=3` are put into a bundle as an engine's CDI injection puts them (the
//! device's and the spec's device nodes with their cgroup rules, the spec's bind mounts, its
//! createContainer hook), one layer more in each variant, and `runc run` starts it on the
//! host's cgroup v1, with bundles on tmpfs; beside them the same GPU, with every capability,
//! from nvhook's prestart hook, which makes the nodes and mounts itself. The variants take
//! turns, each round starting at the next. The hook's own time comes from its log
//! (`hook finished ... total_us`), so that what is left of a layer is runc's work for it and
//! the hook process's exec and exit. Then the same starts on a busy node, with a thousand
//! more mounts in the host's mount namespace, in rounds of their own.

use crate::hook_timer;
use crate::setup::tmpfs_work_dir;
use crate::stats::Samples;
use crate::support::hook_log::{HookRun, hook_runs};
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
    let start = Start {
        node: &node,
        work: work.path(),
        nodes: &nodes,
        mounts: &mounts,
        hook: &hooks[0],
        mounting_hook: &mounting_hook,
        record: &record,
    };
    start.rounds(&mut variants, rounds);
    let log = node.log();
    let runs = hook_runs(&log);
    let hook_total = |stage: &str| -> Samples {
        runs.iter()
            .filter(|r| r.stage == stage)
            .map(|r| r.total_us as f64 / 1e3)
            .collect()
    };
    println!(
        "# nvhook's CDI device through runc, layer by layer ({rounds} starts per variant, turns; runc run of gpucheck, cgroup v1, bundles on tmpfs)\n"
    );
    print_table(&variants, true);
    let timed = hook_timer::read_record(&record);
    println!(
        "\nnvhook's createContainer hook as runc runs it (the timer: exec to exit): wall p50 {:.2} ms, p95 {:.2} ms, CPU p50 {:.2} ms, page faults p50 {:.0}, over {} runs.",
        timed.wall.p50(),
        timed.wall.p95(),
        timed.cpu.p50(),
        timed.faults.p50(),
        timed.wall.len()
    );
    let create = hook_total("CreateRuntime");
    let prestart = hook_total("Prestart");
    println!(
        "\nnvhook's own time (its log's total, from its start to its end): createContainer hook p50 {:.2} ms over {} runs; prestart hook p50 {:.2} ms over {} runs.\n",
        create.p50(),
        create.len(),
        prestart.p50(),
        prestart.len()
    );
    print_steps(&runs);
    println!();
    with_host_mounts(&start, rounds);
}

/// How many mounts the busy node's phase adds to the host's mount namespace: a Kubernetes node
/// running its hundred pods has about as many (each pod's rootfs, its pause container's, its
/// `/dev/shm`, its secrets' and service account token's tmpfs).
const HOST_MOUNTS: usize = 1000;

/// The same starts on a busy node: `HOST_MOUNTS` more mounts in the host's mount namespace,
/// which runc copies into each container's and whose table nvhook reads where it must. Its own
/// rounds, after the others: the mounts slow every start on the host alike.
fn with_host_mounts(start: &Start, rounds: usize) {
    let variant = |label: &str, layer| Variant {
        label: label.to_string(),
        layer,
        samples: Samples::default(),
    };
    let mut variants = [
        variant("runc, no GPU", Layer::Plain),
        variant("the whole CDI device, runc's mounts", Layer::NvhookHook),
        variant(
            "the GPU's nodes, nvhook's createContainer hook making the mounts",
            Layer::HookMakesMounts,
        ),
        variant("nvhook's prestart hook instead", Layer::PrestartHook),
    ];
    let logged = start.node.log().len();
    {
        let _mounts = HostMounts::add(HOST_MOUNTS);
        start.rounds(&mut variants, rounds);
    }
    println!(
        "## The same on a busy node: {HOST_MOUNTS} more mounts in the host's mount namespace ({rounds} starts per variant, turns)\n"
    );
    print_table(&variants, false);
    print_steps(&hook_runs(&start.node.log()[logged..]));
    println!();
}

/// The variants' starts, p50 and p95 in ms, with their difference from the first (plain
/// runc) and, for layers, from the row above.
fn print_table(variants: &[Variant], layers: bool) {
    let above_column = if layers {
        " Δ p50 against the row above |"
    } else {
        ""
    };
    println!("| variant | p50 | p95 |{above_column} Δ p50 against plain |");
    println!("|---|---|---|{}---|", if layers { "---|" } else { "" });
    let plain = variants[0].samples.p50();
    let mut above = plain;
    for v in variants {
        let p50 = v.samples.p50();
        let above_cell = if layers {
            format!(" {:+.2} |", p50 - above)
        } else {
            String::new()
        };
        println!(
            "| {} | {p50:.2} | {:.2} |{above_cell} {:+.2} |",
            v.label,
            v.samples.p95(),
            p50 - plain
        );
        above = p50;
    }
}

/// The step of nvhook's hooks that reads the host's mount table where it must, and their
/// total, from `runs`.
fn print_steps(runs: &[HookRun]) {
    for (stage, step) in [("CreateRuntime", "mounts"), ("Prestart", "cgroup")] {
        // The runs of the variant with that step (the CDI device's runtime-mounted hook has
        // no `mounts` step).
        let with_step: Vec<(&HookRun, u64)> = runs
            .iter()
            .filter(|r| r.stage == stage)
            .filter_map(|r| Some((r, r.steps.iter().find(|(s, _)| s == step)?.1)))
            .collect();
        let step_ms: Samples = with_step.iter().map(|(_, us)| *us as f64 / 1e3).collect();
        let total: Samples = with_step
            .iter()
            .map(|(r, _)| r.total_us as f64 / 1e3)
            .collect();
        if !with_step.is_empty() {
            println!(
                "\nnvhook's {stage} hook: its `{step}` step p50 {:.2} ms, its total p50 {:.2} ms, over {} runs.",
                step_ms.p50(),
                total.p50(),
                with_step.len()
            );
        }
    }
}

/// `count` tmpfs mounts in the host's mount namespace, under a private tmpfs of their own, all
/// lazily unmounted when dropped.
struct HostMounts {
    dir: tempfile::TempDir,
}

impl HostMounts {
    fn add(count: usize) -> HostMounts {
        let dir = tempfile::Builder::new()
            .prefix("nvhook-bench-mounts-")
            .tempdir()
            .expect("a directory for the mounts");
        let mounted = HostMounts { dir };
        let top = c_path(mounted.dir.path());
        mount_tmpfs(&top);
        // SAFETY: the target is a NUL-terminated string that outlives the call; the other
        // pointers may be null for a propagation change.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                top.as_ptr(),
                std::ptr::null(),
                libc::MS_PRIVATE,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "make private: {}", std::io::Error::last_os_error());
        for i in 0..count {
            let target = mounted.dir.path().join(i.to_string());
            std::fs::create_dir(&target).expect("a mount point");
            mount_tmpfs(&c_path(&target));
        }
        mounted
    }
}

fn c_path(path: &Path) -> std::ffi::CString {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a path without NUL")
}

/// A small tmpfs at `target`.
fn mount_tmpfs(target: &std::ffi::CStr) {
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"nvhook-bench".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            c"size=4k".as_ptr().cast(),
        )
    };
    assert_eq!(rc, 0, "mount a tmpfs: {}", std::io::Error::last_os_error());
}

impl Drop for HostMounts {
    fn drop(&mut self) {
        let path = c_path(self.dir.path());
        // SAFETY: the path is a NUL-terminated string that outlives the call.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// What every start of this part takes: the node, where bundles go, the spec's edits, and the
/// timed hook's record.
struct Start<'a> {
    node: &'a SimNode,
    work: &'a Path,
    nodes: &'a [Value],
    mounts: &'a [Value],
    hook: &'a Value,
    mounting_hook: &'a Value,
    record: &'a Path,
}

impl Start<'_> {
    /// `rounds` starts of each variant, taking turns, after a warm-up round not counted.
    fn rounds(&self, variants: &mut [Variant], rounds: usize) {
        let n = variants.len();
        for round in 0..=rounds {
            for i in 0..n {
                let v = &mut variants[(round + i) % n];
                let mut bundle = Bundle::new_in(self.work, glibc_image(), &["/gpucheck"]);
                match v.layer {
                    Layer::PrestartHook => {
                        bundle.env(&format!("NVIDIA_VISIBLE_DEVICES={GPU}"));
                        bundle.env("NVIDIA_DRIVER_CAPABILITIES=all");
                        bundle.prestart_hook(self.node);
                    }
                    Layer::HookMakesMounts => {
                        inject(
                            &mut bundle,
                            Layer::Nodes,
                            self.nodes,
                            &[],
                            self.mounting_hook,
                            self.record,
                        );
                        bundle.raw_hook(stage(self.mounting_hook), hook_entry(self.mounting_hook));
                    }
                    layer => inject(
                        &mut bundle,
                        layer,
                        self.nodes,
                        self.mounts,
                        self.hook,
                        self.record,
                    ),
                }
                let started = std::time::Instant::now();
                let output = run_container(&bundle, RuntimeEnv::CgroupV1);
                let ms = started.elapsed().as_secs_f64() * 1e3;
                output.assert_success();
                match round {
                    // The warm-up's hook time is not one of the measured starts'.
                    0 => {
                        let _ = std::fs::remove_file(self.record);
                    }
                    _ => v.samples.push(ms),
                }
            }
        }
    }
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
                stage(hook),
                json!({ "path": "/bin/true", "args": ["true"] }),
            );
        }
        Layer::NvhookHook => {
            bundle.raw_hook(stage(hook), hook_entry(hook));
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
                stage(hook),
                json!({ "path": bench, "args": args, "env": hook["env"] }),
            );
        }
        _ => {}
    }
}

/// The OCI stage a CDI hook names.
pub fn stage(hook: &Value) -> &str {
    hook["hookName"].as_str().expect("a hook's stage")
}

/// A CDI hook as an OCI hook entry.
pub fn hook_entry(hook: &Value) -> Value {
    let mut entry = hook.clone();
    entry.as_object_mut().expect("a hook").remove("hookName");
    entry
}
