//! 13: every way in as the runtime sees it, against its floors, without containerd. Each
//! start is what one way in hands runc (or nvhook-runtime) for the same container, a GPU of
//! an 8-GPU node and then all eight with every capability, started as an engine's shim starts
//! it (create, start, wait, delete), with bundles on tmpfs. The ways in: the prestart hook alone (hooks.d, Docker's `--gpus`),
//! nvhook-runtime (the RuntimeClass), NRI's `hook`, `cdi` and `mounts` modes (`mounts` also for
//! a CUDA image's environment, whose driver directories the plugin gathers; the plugin's
//! planning runs in this process, as in its daemon, and is inside the start's time), and a
//! kubelet CDI request for
//! nvhook's spec (its nodes and createRuntime hook, as an engine injects them; and the same
//! spec as an earlier nvhook wrote it, its hook at createContainer). The floors:
//! the GPU's device nodes alone, and the same with a prestart hook that is /bin/true. At the
//! CRI the same pods' totals move by milliseconds from run to run (docs/performance.md,
//! twenty-third round); here a start is a handful of processes, whose CPU time and paired
//! differences resolve far less.

use crate::cdi_parts;
use crate::cycle::{self, Runtime};
use crate::setup::{image, tmpfs_work_dir};
use crate::stats::Samples;
use crate::support::hook_log::hook_runs;
use crate::support::{Bundle, SimNode};
use nvhook::nri::GpuPlugin;
use nvhook_nri::api::{Container, ContainerAdjustment, Hook, PodSandbox};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Plain,
    Floor,
    FloorWithHook,
    /// The floor with a hook whose hook, still /bin/true, has the arguments of the hook of
    /// nvhook's CDI spec: what runc pays for carrying them.
    FloorWithCdiHookArguments,
    HookAlone,
    RuntimeClass,
    /// nvhook-runtime with a container that names the variable but asks for no GPU: what
    /// handing a create to nvhook's own process costs before any of its work.
    RuntimeClassHop,
    NriHook,
    NriCdi,
    NriMounts,
    /// NRI `mounts` for an image whose environment searches NVIDIA's driver directories (a
    /// CUDA image's): each gathered on the host, one bind mount.
    NriMountsCudaImage,
    CdiRequest,
    /// The same spec with its hook's arguments one entry each, as nvhook wrote them before
    /// they named a directory's files in one group.
    CdiRequestOneEntryEach,
    /// The same spec with its hook at createContainer, as nvhook wrote it before.
    CdiRequestAtCreateContainer,
}

const WAYS: [(Way, &str); 14] = [
    (Way::Plain, "runc, no GPU"),
    (Way::Floor, "floor: the GPUs' device nodes"),
    (
        Way::FloorWithHook,
        "floor with a hook: the nodes and a prestart hook that is /bin/true",
    ),
    (
        Way::FloorWithCdiHookArguments,
        "the same hook at createRuntime with the arguments of nvhook's CDI hook",
    ),
    (
        Way::HookAlone,
        "the prestart hook alone (hooks.d, `--gpus`)",
    ),
    (Way::RuntimeClass, "RuntimeClass (nvhook-runtime)"),
    (
        Way::RuntimeClassHop,
        "RuntimeClass, no GPU asked (`NVIDIA_VISIBLE_DEVICES=void`): nvhook's process, no work",
    ),
    (
        Way::NriHook,
        "NRI `hook` (the plugin's planning in the start)",
    ),
    (
        Way::NriCdi,
        "NRI `cdi` (the CDI edits and the createRuntime hook)",
    ),
    (
        Way::NriMounts,
        "NRI `mounts` (every driver file a bind mount, no hook)",
    ),
    (
        Way::NriMountsCudaImage,
        "NRI `mounts`, a CUDA image's environment (its driver directories gathered, one bind mount each)",
    ),
    (
        Way::CdiRequest,
        "kubelet CDI request for nvhook's spec (DRA, `cdi-cri`)",
    ),
    (
        Way::CdiRequestOneEntryEach,
        "the same, its hook's arguments one entry each (a spec of an earlier nvhook)",
    ),
    (
        Way::CdiRequestAtCreateContainer,
        "the same, a spec of an earlier nvhook (its hook at createContainer)",
    ),
];

struct Variant {
    way: Way,
    label: &'static str,
    /// Whole starts (create, start, wait, delete), ms.
    samples: Samples,
    /// Their `create`, where the hooks run (and, for NRI, the plugin's planning before it).
    create: Samples,
    /// The CPU time of every process of the start, and of the plugin's planning, ms.
    cpu: Samples,
    /// The NRI plugin's planning, inside the start's time.
    planning: Samples,
    /// The mounts the NRI plugin's adjustment handed the runtime.
    mounts: usize,
    /// The bundle of each start, to find its lines in the log.
    bundles: Vec<String>,
    ids: Vec<String>,
}

/// `rounds` starts per way in, for one GPU and for eight.
pub fn run(rounds: usize) {
    let node = SimNode::create(8);
    // The packaged config's level: the simulated node's is debug.
    node.set("log-level", "\"info\"");
    let work = tmpfs_work_dir();
    let spec_path = work.path().join("nvidia.json");
    node.generate_cdi_spec(&spec_path);
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).expect("read the spec"))
            .expect("the spec is JSON");
    // One plugin per mode, each with its own copy of the node's config.
    let plugins: Vec<(Way, GpuPlugin)> = [
        (Way::NriHook, "hook"),
        (Way::NriCdi, "cdi"),
        (Way::NriMounts, "mounts"),
    ]
    .into_iter()
    .map(|(way, mode)| {
        let config = work.path().join(format!("nri-{mode}.toml"));
        let text = std::fs::read_to_string(node.config()).expect("read the node's config");
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| l.split('=').next().map(str::trim) != Some("nri-mode"))
            .collect();
        let text = format!("{}\nnri-mode = \"{mode}\"\n", kept.join("\n"));
        std::fs::write(&config, text).expect("write the plugin's config");
        let plugin = GpuPlugin::new(Some(config));
        // The engine is this process: it sees the mounts the plugin makes.
        plugin.engine_connected(i32::try_from(std::process::id()).ok());
        (way, plugin)
    })
    .collect();
    let hook = one_entry_each(spec["containerEdits"]["hooks"][0].clone());
    let size = |args: &Value| {
        let args = args.as_array().expect("a hook's arguments");
        let bytes: usize = args
            .iter()
            .map(|a| a.as_str().map_or(0, str::len) + 1)
            .sum();
        format!("{} arguments, {bytes} bytes", args.len())
    };
    println!(
        "nvhook's CDI hook: {} (one entry each: {}); the spec {} bytes\n",
        size(&spec["containerEdits"]["hooks"][0]["args"]),
        size(&hook["args"]),
        std::fs::metadata(&spec_path).expect("the spec").len()
    );
    println!(
        "# Every way in as the runtime sees it, against its floors ({rounds} starts per variant, turns; create, start, wait and delete of /usr/bin/true, cgroup v1, bundles on tmpfs, every capability)\n"
    );
    for (gpus, device) in [("1 GPU", "3"), ("8 GPUs", "all")] {
        let ways = Ways {
            node: &node,
            work: work.path(),
            device,
            spec: &spec,
            plugins: &plugins,
        };
        let logged = node.log().len();
        let variants = ways.rounds(rounds);
        report(gpus, &variants, &node.log()[logged..]);
    }
    engine_visits(rounds * 10);
}

/// What a plugin with a mount namespace of its own (a DaemonSet's) adds to each container it
/// gathers driver directories for: one visit to the engine's namespace, here a namespace held
/// by a process of the bench's, against doing the same work in its own.
fn engine_visits(visits: usize) {
    use nvhook::nri::engine_view::EngineView;
    let mut holder = std::process::Command::new("unshare")
        .args(["--mount", "sleep", "600"])
        .spawn()
        .expect("run unshare (util-linux)");
    let pid = i32::try_from(holder.id()).ok();
    let start = Instant::now();
    let mut view = EngineView::of(pid);
    // unshare enters its namespace before it execs sleep.
    while !matches!(view, EngineView::Entered(_)) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
        view = EngineView::of(pid);
    }
    assert!(matches!(view, EngineView::Entered(_)), "{view:?}");
    let timed = |view: &EngineView| {
        let mut samples = Samples::default();
        for _ in 0..visits {
            let at = Instant::now();
            view.run(|| ()).expect("enter the namespace");
            samples.push(at.elapsed().as_secs_f64() * 1e3);
        }
        samples
    };
    let (entered, shared) = (timed(&view), timed(&EngineView::Shared));
    let _ = holder.kill();
    let _ = holder.wait();
    println!(
        "- NRI `mounts` from a plugin in a mount namespace of its own: one visit to the engine's per container, {visits} visits, p50 {:.1} µs, p95 {:.1} µs (in the plugin's own namespace: p50 {:.2} µs)\n",
        entered.p50() * 1e3,
        entered.p95() * 1e3,
        shared.p50() * 1e3
    );
}

struct Ways<'a> {
    node: &'a SimNode,
    work: &'a Path,
    /// The device of nvhook's CDI spec, and NVIDIA_VISIBLE_DEVICES: a GPU, or `all`.
    device: &'a str,
    spec: &'a Value,
    /// The NRI plugin of each NRI way.
    plugins: &'a [(Way, GpuPlugin)],
}

impl Ways<'_> {
    fn rounds(&self, rounds: usize) -> Vec<Variant> {
        let mut variants: Vec<Variant> = WAYS
            .iter()
            .map(|&(way, label)| Variant {
                way,
                label,
                samples: Samples::default(),
                create: Samples::default(),
                cpu: Samples::default(),
                planning: Samples::default(),
                mounts: 0,
                bundles: Vec::new(),
                ids: Vec::new(),
            })
            .collect();
        let n = variants.len();
        // Round 0 warms each way up (the plugin's first answer, the kept search) and is not
        // counted.
        for round in 0..=rounds {
            for i in 0..n {
                let v = &mut variants[(round + i) % n];
                let mut bundle = Bundle::new_in(self.work, image(), &["/usr/bin/true"]);
                let (cost, planning) = self.start(v.way, &mut bundle);
                if round > 0 {
                    let ms = |d: Duration| d.as_secs_f64() * 1e3;
                    let (plan_wall, plan_cpu) =
                        planning.map_or((0.0, 0.0), |p| (ms(p.wall), ms(p.cpu)));
                    v.samples.push(ms(cost.wall) + plan_wall);
                    v.create.push(ms(cost.phases[0]) + plan_wall);
                    v.cpu.push(ms(cost.cpu) + plan_cpu);
                    if let Some(planning) = planning {
                        v.planning.push(plan_wall);
                        v.mounts = planning.mounts;
                    }
                    v.bundles.push(bundle.dir().display().to_string());
                    v.ids.push(bundle.id().to_string());
                }
            }
        }
        variants
    }

    /// One start of `way` as an engine's shim makes it, and for NRI the plugin's planning,
    /// which containerd waits for before it creates the container.
    fn start(&self, way: Way, bundle: &mut Bundle) -> (cycle::Cost, Option<Planning>) {
        let mut request = vec![
            format!("NVIDIA_VISIBLE_DEVICES={}", self.device),
            "NVIDIA_DRIVER_CAPABILITIES=all".to_string(),
        ];
        if way == Way::NriMountsCudaImage {
            request.extend(CUDA_IMAGE_ENV.map(String::from));
            for var in CUDA_IMAGE_ENV {
                bundle.env(var);
            }
        }
        if matches!(way, Way::HookAlone | Way::RuntimeClass | Way::NriHook) {
            for var in &request {
                bundle.env(var);
            }
        }
        if way == Way::RuntimeClassHop {
            bundle.env("NVIDIA_VISIBLE_DEVICES=void");
        }
        match way {
            Way::Plain
            | Way::NriHook
            | Way::NriCdi
            | Way::NriMounts
            | Way::NriMountsCudaImage
            | Way::RuntimeClass
            | Way::RuntimeClassHop => {}
            Way::Floor
            | Way::FloorWithHook
            | Way::FloorWithCdiHookArguments
            | Way::CdiRequest
            | Way::CdiRequestOneEntryEach
            | Way::CdiRequestAtCreateContainer => {
                for edits in self.cdi_edits() {
                    for node in edits["deviceNodes"].as_array().into_iter().flatten() {
                        let number = |key: &str| node[key].as_u64().expect("a number") as u32;
                        let path = node["path"].as_str().expect("a device path");
                        bundle.extra_device(path, number("major"), number("minor"));
                        bundle.allow_device(number("major"), number("minor"));
                    }
                    let requested = matches!(
                        way,
                        Way::CdiRequest
                            | Way::CdiRequestOneEntryEach
                            | Way::CdiRequestAtCreateContainer
                    );
                    if requested {
                        for var in edits["env"].as_array().into_iter().flatten() {
                            bundle.env(var.as_str().expect("an env entry"));
                        }
                    }
                    for hook in edits["hooks"].as_array().into_iter().flatten() {
                        let entry = cdi_parts::hook_entry(hook);
                        match way {
                            Way::CdiRequest => bundle.raw_hook(cdi_parts::stage(hook), entry),
                            Way::CdiRequestOneEntryEach => {
                                bundle.raw_hook(cdi_parts::stage(hook), one_entry_each(entry))
                            }
                            Way::CdiRequestAtCreateContainer => {
                                bundle.raw_hook("createContainer", at_create_container(entry))
                            }
                            Way::FloorWithCdiHookArguments => {
                                let mut entry = entry;
                                entry["path"] = json!("/bin/true");
                                bundle.raw_hook(cdi_parts::stage(hook), entry)
                            }
                            _ => bundle,
                        };
                    }
                }
                if way == Way::FloorWithHook {
                    bundle.prestart_command(Path::new("/bin/true"), &["true".to_string()]);
                }
            }
            Way::HookAlone => {
                bundle.prestart_hook(self.node);
            }
        }
        // A CUDA image's container goes to the same `mounts` plugin.
        let plugin_way = match way {
            Way::NriMountsCudaImage => Way::NriMounts,
            other => other,
        };
        let plugin = self
            .plugins
            .iter()
            .find(|(w, _)| *w == plugin_way)
            .map(|(_, p)| p);
        let planning = plugin.map(|plugin| {
            let (started, cpu) = (Instant::now(), thread_cpu());
            let adjustment = plan_through(plugin, bundle.id(), &request);
            let planning = Planning {
                wall: started.elapsed(),
                cpu: thread_cpu() - cpu,
                mounts: adjustment.mounts.len(),
            };
            apply(bundle, &adjustment);
            planning
        });
        bundle.write_config();
        let runtime = match way {
            Way::RuntimeClass | Way::RuntimeClassHop => Runtime::NvhookRuntime(self.node.config()),
            _ => Runtime::Runc,
        };
        (cycle::run(&runtime, bundle), planning)
    }

    /// The spec's common edits and the device's.
    fn cdi_edits(&self) -> [&Value; 2] {
        let device = self.spec["devices"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["name"] == self.device))
            .expect("the spec has the device");
        [&self.spec["containerEdits"], &device["containerEdits"]]
    }
}

/// A hook entry of nvhook's spec with its arguments one entry each.
fn one_entry_each(mut entry: Value) -> Value {
    entry["args"] = json!(crate::support::hook_mounts::one_entry_each(&entry["args"]));
    entry
}

/// What NVIDIA's CUDA images set: their loader and shell search the driver's directories.
const CUDA_IMAGE_ENV: [&str; 2] = [
    "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    "PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
];

/// What `plugin` answers containerd for container `id` with `env`.
fn plan_through(plugin: &GpuPlugin, id: &str, env: &[String]) -> ContainerAdjustment {
    let pod = PodSandbox {
        namespace: "default".into(),
        ..PodSandbox::default()
    };
    let container = Container {
        id: id.into(),
        env: env.to_vec(),
        ..Container::default()
    };
    plugin
        .adjust(&pod, &container)
        .expect("the plugin plans the container")
        .expect("a GPU container gets an adjustment")
}

/// `adjustment`'s environment, mounts, devices, their rules and its hooks, in `bundle`'s
/// config.json, as containerd applies them.
fn apply(bundle: &mut Bundle, adjustment: &ContainerAdjustment) {
    for kv in &adjustment.env {
        bundle.env(&format!("{}={}", kv.key, kv.value));
    }
    for mount in &adjustment.mounts {
        bundle.raw_mount(json!({
            "destination": mount.destination,
            "type": mount.r#type,
            "source": mount.source,
            "options": mount.options,
        }));
    }
    if let Some(linux) = &adjustment.linux {
        for device in &linux.devices {
            let number = |n: i64| u32::try_from(n).expect("a device number");
            bundle.extra_device(&device.path, number(device.major), number(device.minor));
            bundle.allow_device(number(device.major), number(device.minor));
        }
    }
    let Some(hooks) = &adjustment.hooks else {
        return;
    };
    let entry = |hook: &Hook| json!({ "path": hook.path, "args": hook.args, "env": hook.env });
    for (stage, list) in [
        ("prestart", &hooks.prestart),
        ("createRuntime", &hooks.create_runtime),
        ("createContainer", &hooks.create_container),
        ("startContainer", &hooks.start_container),
    ] {
        for hook in list {
            bundle.raw_hook(stage, entry(hook));
        }
    }
}

/// The NRI plugin's planning of one container: its wall time, this thread's CPU time, and
/// the mounts its adjustment hands the runtime.
#[derive(Clone, Copy)]
struct Planning {
    wall: Duration,
    cpu: Duration,
    mounts: usize,
}

/// A createRuntime hook entry of nvhook's spec as an earlier nvhook wrote it, for the
/// createContainer stage.
fn at_create_container(mut entry: Value) -> Value {
    let args = entry["args"].as_array_mut().expect("hook args");
    let stage = args
        .iter()
        .position(|a| a == "createRuntime")
        .expect("the hook's stage among its arguments");
    args[stage] = json!("createContainer");
    entry
}

/// User + system time of this thread.
fn thread_cpu() -> Duration {
    // SAFETY: a zeroed rusage is a valid out-value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    cycle::tv(u.ru_utime) + cycle::tv(u.ru_stime)
}

fn report(gpus: &str, variants: &[Variant], log: &str) {
    let by = |way: Way| variants.iter().find(|v| v.way == way).expect("every way");
    let (floor, floor_hook) = (by(Way::Floor), by(Way::FloorWithHook));
    println!("## {gpus}\n");
    println!(
        "| way in | start p50 ms | p95 | its create p50 | CPU p50 | over the floor, paired: start / create / CPU | over the floor with a hook, paired: create / CPU | nvhook's own (its log, p50) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let runs = hook_runs(log);
    for v in variants {
        let paired = |metric: fn(&Variant) -> &Samples, base: &Variant| {
            metric(v).paired_minus(metric(base)).p50()
        };
        let start: fn(&Variant) -> &Samples = |v| &v.samples;
        let create: fn(&Variant) -> &Samples = |v| &v.create;
        let cpu: fn(&Variant) -> &Samples = |v| &v.cpu;
        // nvhook's processes' own time in this way's starts: the hooks' totals, and
        // nvhook-runtime's create until it execs runc.
        let own: Samples = v
            .ids
            .iter()
            .zip(&v.bundles)
            .map(|(id, bundle)| {
                let hooks: u64 = runs
                    .iter()
                    .filter(|r| &r.id == id)
                    .map(|r| r.total_us)
                    .sum();
                let create: f64 = log
                    .lines()
                    .filter(|l| {
                        l.contains("GPU container prepared")
                            && l.contains(&format!("bundle={bundle} "))
                    })
                    .flat_map(|l| crate::log_values(l, "total_us"))
                    .sum();
                (hooks as f64 + create) / 1e3
            })
            .collect();
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:+.2} / {:+.2} / {:+.2} | {:+.2} / {:+.2} | {:.2} |",
            v.label,
            v.samples.p50(),
            v.samples.p95(),
            v.create.p50(),
            v.cpu.p50(),
            paired(start, floor),
            paired(create, floor),
            paired(cpu, floor),
            paired(create, floor_hook),
            paired(cpu, floor_hook),
            own.p50(),
        );
    }
    let planning: Vec<String> = [
        (Way::NriHook, "hook"),
        (Way::NriCdi, "cdi"),
        (Way::NriMounts, "mounts"),
        (Way::NriMountsCudaImage, "mounts, a CUDA image"),
    ]
    .iter()
    .map(|&(way, mode)| {
        let v = by(way);
        let p = &v.planning;
        format!(
            "`{mode}` p50 {:.2} ms, p95 {:.2} ms, {} mounts for the runtime",
            p.p50(),
            p.p95(),
            v.mounts
        )
    })
    .collect();
    println!(
        "\nThe NRI plugin's planning (`GpuPlugin::adjust` in this process, inside the NRI rows' starts): {}.",
        planning.join("; ")
    );
    // The RuntimeClass's goal (issue 41): no slower than NRI `hook`. What it pays that NRI
    // does not is nvhook's process between the shim and runc, which the plugin's daemon saves.
    let pairs = [
        (
            "RuntimeClass against NRI `hook`",
            Way::RuntimeClass,
            Way::NriHook,
        ),
        (
            "nvhook's process between the shim and runc, no work (the `void` row against runc, no GPU)",
            Way::RuntimeClassHop,
            Way::Plain,
        ),
        (
            "runc carrying the arguments of nvhook's CDI hook (a /bin/true hook at createRuntime with them, against the floor's at prestart without)",
            Way::FloorWithCdiHookArguments,
            Way::FloorWithHook,
        ),
        (
            "the CDI request's hook arguments grouped by directory against one entry each",
            Way::CdiRequest,
            Way::CdiRequestOneEntryEach,
        ),
        (
            "the CDI request's hook at createRuntime against createContainer",
            Way::CdiRequest,
            Way::CdiRequestAtCreateContainer,
        ),
        (
            "NRI `mounts`, a CUDA image's gathered driver directories against every file a bind mount",
            Way::NriMountsCudaImage,
            Way::NriMounts,
        ),
    ];
    for (label, a, b) in pairs {
        let (a, b) = (by(a), by(b));
        println!(
            "- {label}, paired p50: start {:+.2} ms, create {:+.2} ms, CPU {:+.2} ms",
            a.samples.paired_minus(&b.samples).p50(),
            a.create.paired_minus(&b.create).p50(),
            a.cpu.paired_minus(&b.cpu).p50()
        );
    }
    println!();
}
