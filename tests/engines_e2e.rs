//! End-to-end tests of nvhook behind real container engines on a simulated
//! 4-GPU node: a private containerd driven by `ctr`, a private dockerd driven
//! by `docker`, both configured by `nvhook configure`, and the durability of
//! nvhook-runtime's device rules across `runc update`. Run as root after
//! `cargo build --workspace` (for simnode): `cargo test --test engines_e2e`.
//!
//! On the simulated node no driver sits behind the device nodes, so opening a
//! node the cgroup allows gives ENXIO and one it refuses gives EPERM.

use nvhook_test_support as support;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use support::engines::{
    Containerd, DetachedContainer, Dockerd, EngineDir, assert_containerd_handler,
    containerd_config, nvhook_configure, nvhook_runtime_bin, unique_name,
};
use support::{Bundle, Output, RuntimeEnv, SimNode, glibc_image, require_program, require_root};

const GPUS: u32 = 4;
const NVIDIA_MAJOR: u32 = 195;
const NVHOOK_CONFIG: &str = "NVHOOK_CONFIG";

/// gpucheck asking for GPU 1 (requested) and GPU 0 (not requested).
const GPUCHECK: &[&str] = &[
    "/gpucheck",
    "--dev",
    "/dev/nvidia1",
    "--dev",
    "/dev/nvidia0",
];
/// gpucheck for a container that asks for no GPU: lists /dev as well.
const GPUCHECK_NO_GPU: &[&str] = &[
    "/gpucheck",
    "--dev",
    "/dev/nvidia0",
    "--dev",
    "/dev/nvidia1",
    "--ls",
    "/dev",
];

/// Prints a test's wall time when it ends, passed or failed.
struct Timer(&'static str, Instant);

impl Timer {
    fn start(name: &'static str) -> Timer {
        Timer(name, Instant::now())
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        eprintln!("timing: {} took {:.2?}", self.0, self.1.elapsed());
    }
}

fn runtime_path() -> &'static str {
    nvhook_runtime_bin()
        .to_str()
        .expect("nvhook-runtime path is UTF-8")
}

#[track_caller]
fn assert_gpu_1_only(output: &Output) {
    output.assert_success();
    output.assert_lines(&[
        "dev /dev/nvidia1 ENXIO",
        "dev /dev/nvidia0 absent",
        "dlopen libcuda.so.1 ok",
    ]);
}

#[track_caller]
fn assert_no_gpu(output: &Output) {
    output.assert_success();
    output.assert_lines(&["dev /dev/nvidia0 absent", "dev /dev/nvidia1 absent"]);
    let nvidia: Vec<&str> = output
        .stdout
        .lines()
        .filter(|l| l.starts_with("ls /dev nvidia"))
        .collect();
    assert!(
        nvidia.is_empty(),
        "nvidia nodes in /dev: {nvidia:?}\n{output}"
    );
    assert!(
        !output.has_line("dlopen libcuda.so.1 ok"),
        "driver library injected into a container that asked for no GPU\n{output}"
    );
}

/// Nothing of the engine or the node may stay mounted once the daemon stopped.
#[track_caller]
fn assert_no_mounts_left(dir: &Path, node: &SimNode) {
    support::engines::assert_no_mounts_left(dir, node.root());
}

// ---- containerd + ctr ----

/// A private containerd configured by `nvhook configure`, serving `node`, with the glibc
/// image imported; returns it and the image's name.
fn containerd_for(node: &SimNode, dir: &EngineDir) -> (Containerd, String) {
    let config = dir.path().join("containerd.toml");
    fs::write(&config, containerd_config(dir.path())).expect("write containerd config");
    nvhook_configure("containerd", &config);
    assert_containerd_handler(&config, "nvidia", runtime_path());

    // The runc-v2 shim inherits containerd's environment and passes it to
    // the runtime binary: that is how nvhook-runtime finds the node's config.
    let containerd = Containerd::start(dir.path(), &config, &[(NVHOOK_CONFIG, &node.config())]);
    let image = containerd.import_gpucheck_image(dir.path());
    (containerd, image)
}

/// `ctr run` through nvhook-runtime with `env` added, running `args`.
fn ctr_run(containerd: &Containerd, image: &str, env: &[&str], args: &[&str]) -> Output {
    let mut flags = vec!["--runc-binary", runtime_path()];
    for var in env {
        flags.extend(["--env", var]);
    }
    containerd.run(&flags, image, &unique_name("ctr"), args)
}

#[test]
fn containerd_ctr_run_gives_the_requested_gpu_through_nvhook_runtime() {
    let _timer = Timer::start("containerd_ctr_run");
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("ctrd");
    let (mut containerd, image) = containerd_for(&node, &dir);

    let gpu = ctr_run(&containerd, &image, &["NVIDIA_VISIBLE_DEVICES=1"], GPUCHECK);
    assert_gpu_1_only(&gpu);
    let plain = ctr_run(&containerd, &image, &[], GPUCHECK_NO_GPU);
    assert_no_gpu(&plain);

    assert!(
        containerd.shutdown(),
        "containerd ignored SIGTERM:\n{}",
        containerd.log()
    );
    assert_no_mounts_left(dir.path(), &node);
}

// ---- dockerd + docker ----

/// A private dockerd whose daemon.json `nvhook configure` wrote, serving `node`, with the
/// glibc image imported; returns it and the image's name.
fn dockerd_for(node: &SimNode, dir: &EngineDir) -> (Dockerd, String) {
    // No daemon.json yet, as on most hosts: configure creates it.
    let daemon_json = dir.path().join("daemon.json");
    nvhook_configure("docker", &daemon_json);
    let text = fs::read_to_string(&daemon_json).expect("configure wrote daemon.json");
    let written: serde_json::Value = serde_json::from_str(&text).expect("daemon.json is JSON");
    assert_eq!(
        written["runtimes"]["nvidia"]["path"],
        runtime_path(),
        "daemon.json:\n{text}"
    );

    let dockerd = Dockerd::start(dir.path(), &daemon_json, &[(NVHOOK_CONFIG, &node.config())]);
    let runtimes = dockerd.docker_checked(&["info", "--format", "{{json .Runtimes}}"]);
    assert!(
        runtimes.contains("\"nvidia\""),
        "dockerd runtimes: {runtimes}"
    );

    let image = dockerd.import_gpucheck_image(dir.path());
    (dockerd, image)
}

/// `docker run --runtime=nvidia` with `env` added, running `args`.
fn docker_run(dockerd: &Dockerd, image: &str, env: &[&str], args: &[&str]) -> Output {
    let mut all = vec!["--rm", "--runtime=nvidia", "--network", "none"];
    for var in env {
        all.extend(["-e", var]);
    }
    all.push(image);
    all.extend(args);
    dockerd.run(&all)
}

#[test]
fn docker_run_runtime_nvidia_gives_the_requested_gpu() {
    let _timer = Timer::start("docker_run_runtime_nvidia");
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("dockerd");
    let (mut dockerd, image) = dockerd_for(&node, &dir);

    assert_gpu_1_only(&docker_run(
        &dockerd,
        &image,
        &["NVIDIA_VISIBLE_DEVICES=1"],
        GPUCHECK,
    ));
    assert_no_gpu(&docker_run(&dockerd, &image, &[], GPUCHECK_NO_GPU));

    assert!(
        dockerd.shutdown(),
        "dockerd ignored SIGTERM:\n{}",
        dockerd.log()
    );
    assert_no_mounts_left(dir.path(), &node);
}

// ---- two engines on one node ----

/// containerd and dockerd start GPU containers at the same moment on the same node, whose
/// NVML answer is not cached yet and takes a while: each container gets exactly its GPU,
/// NVML is asked once for both, and nothing stays mounted.
#[test]
fn containerd_and_dockerd_start_gpu_containers_at_the_same_moment() {
    let _timer = Timer::start("containerd_and_dockerd_together");
    require_root();
    let node = SimNode::create_with(GPUS, &["--nvml-init-delay-ms", "500"]);
    let (ctr_dir, docker_dir) = (EngineDir::new("ctrd2"), EngineDir::new("dockerd2"));
    let (mut containerd, ctr_image) = containerd_for(&node, &ctr_dir);
    let (mut dockerd, docker_image) = dockerd_for(&node, &docker_dir);

    let gpucheck = |gpu: u32| {
        let node = format!("/dev/nvidia{gpu}");
        let other = format!("/dev/nvidia{}", 3 - gpu);
        ["/gpucheck", "--dev", &node, "--dev", &other].map(String::from)
    };
    let barrier = std::sync::Barrier::new(2);
    let (by_ctr, by_docker) = std::thread::scope(|scope| {
        let ctr = scope.spawn(|| {
            let args = gpucheck(1);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            barrier.wait();
            ctr_run(
                &containerd,
                &ctr_image,
                &["NVIDIA_VISIBLE_DEVICES=1"],
                &args,
            )
        });
        let docker = scope.spawn(|| {
            let args = gpucheck(2);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            barrier.wait();
            docker_run(
                &dockerd,
                &docker_image,
                &["NVIDIA_VISIBLE_DEVICES=2"],
                &args,
            )
        });
        (ctr.join().unwrap(), docker.join().unwrap())
    });
    for (output, gpu) in [(&by_ctr, 1), (&by_docker, 2)] {
        output.assert_success();
        output.assert_lines(&[
            &format!("dev /dev/nvidia{gpu} ENXIO"),
            &format!("dev /dev/nvidia{} absent", 3 - gpu),
            "dlopen libcuda.so.1 ok",
        ]);
    }
    assert_eq!(
        node.nvml_inits(),
        1,
        "NVML asked more than once:\n{}",
        node.log()
    );

    assert!(containerd.shutdown(), "{}", containerd.log());
    assert!(dockerd.shutdown(), "{}", dockerd.log());
    assert_no_mounts_left(ctr_dir.path(), &node);
    assert_no_mounts_left(docker_dir.path(), &node);
}

// ---- a long run of starts ----

/// How many starts in a row: `NVHOOK_SEQUENTIAL_STARTS`, 1,000 unless set.
fn sequential_starts() -> u32 {
    std::env::var("NVHOOK_SEQUENTIAL_STARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// What must not grow over a long run of starts.
#[derive(Debug, PartialEq)]
struct Footprint {
    /// Mounts in the host's table that concern this test: under its engine's directory or its
    /// node (the other tests of this binary run beside it and mount and unmount their own).
    host_mounts: usize,
    engine_fds: usize,
    /// Bytes of nvhook's own files on the node (its NVML cache directory).
    nvhook_state_bytes: u64,
}

impl Footprint {
    /// Whether any count is higher than in `before`. Fewer is no leak: containerd may close a
    /// descriptor it held before the starts (a warm-up's connection, say).
    fn grew_from(&self, before: &Footprint) -> bool {
        self.host_mounts > before.host_mounts
            || self.engine_fds > before.engine_fds
            || self.nvhook_state_bytes > before.nvhook_state_bytes
    }
}

fn footprint(containerd: &Containerd, dir: &EngineDir, node: &SimNode) -> Footprint {
    let mounts = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let ours = [dir.path(), node.root()].map(|p| p.display().to_string());
    Footprint {
        host_mounts: mounts
            .lines()
            .filter(|l| ours.iter().any(|p| l.contains(p.as_str())))
            .count(),
        engine_fds: containerd.open_fds(),
        nvhook_state_bytes: bytes_under(&node.root().join("run")),
    }
}

fn bytes_under(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// 1,000 GPU containers one after the other through containerd and nvhook-runtime: each gets
/// its GPU, and the host's mount table, containerd's open files and nvhook's state on the
/// node are the same size at the end as after the first few.
#[test]
fn a_thousand_sequential_starts_grow_nothing() {
    let _timer = Timer::start("a_thousand_sequential_starts");
    require_root();
    let node = SimNode::create(GPUS);
    // The driver's files are kept for the next start once the node's directories have
    // settled: made now, they are kept during the warm-up rather than in the middle.
    std::thread::sleep(Duration::from_millis(2500));
    let dir = EngineDir::new("ctrd-seq");
    let (mut containerd, image) = containerd_for(&node, &dir);
    // ctr now and then loses a task's output when the task exits before ctr has attached
    // to its fifos: a start that succeeded with no output at all is run again and counted.
    let lost_outputs = std::cell::Cell::new(0u32);
    let start = |i: u32| {
        let gpu = i % GPUS;
        let visible = format!("NVIDIA_VISIBLE_DEVICES={gpu}");
        let dev = format!("/dev/nvidia{gpu}");
        let run = || {
            ctr_run(
                &containerd,
                &image,
                &[&visible],
                &["/gpucheck", "--dev", &dev],
            )
        };
        let mut out = run();
        while out.status.success() && out.stdout.is_empty() && lost_outputs.get() < 10 {
            lost_outputs.set(lost_outputs.get() + 1);
            out = run();
        }
        out.assert_success();
        out.assert_lines(&[&format!("dev {dev} ENXIO")]);
    };
    // The first starts fill what is filled once: NVML's cache, the kept search for the
    // driver's files, containerd's caches.
    const WARM_UP: u32 = 10;
    (0..WARM_UP).for_each(start);
    let before = footprint(&containerd, &dir, &node);
    let total = sequential_starts();
    let started = Instant::now();
    (WARM_UP..total).for_each(start);
    let elapsed = started.elapsed();
    // containerd closes a finished task's files a moment after ctr returns: a leak stays,
    // those go within a few seconds.
    let mut after = footprint(&containerd, &dir, &node);
    for _ in 0..20 {
        if !after.grew_from(&before) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
        after = footprint(&containerd, &dir, &node);
    }
    eprintln!(
        "{} sequential GPU starts through containerd: {:.1} s ({:.0} ms each; ctr lost {} outputs); before {before:?}, after {after:?}",
        total - WARM_UP,
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / f64::from(total - WARM_UP),
        lost_outputs.get()
    );
    assert!(
        !after.grew_from(&before),
        "something grew over {total} starts: before {before:?}, after {after:?}"
    );
    assert!(containerd.shutdown(), "{}", containerd.log());
    assert_no_mounts_left(dir.path(), &node);
}

// ---- durability across `runc update` ----

/// A glibc-image bundle that sleeps (a static busybox copied into it), so
/// that gpucheck can be exec'd into it later.
fn sleeping_gpu_bundle() -> Bundle {
    let mut bundle = Bundle::new(glibc_image(), &["/usr/bin/busybox", "sleep", "120"]);
    fs::copy(
        require_program("busybox"),
        bundle.rootfs().join("usr/bin/busybox"),
    )
    .expect("copy busybox into the bundle");
    bundle.env("NVIDIA_VISIBLE_DEVICES=1");
    bundle
}

const EXEC_GPUCHECK: &[&str] = &[
    "/gpucheck",
    "--dev",
    "/dev/nvidia1",
    "--dev",
    "/dev/nvidia0",
];

/// What `runc update` is asked to change. cgroup v1: a pids limit. Under
/// the test's cgroup2 mount no controller but hugetlb is available, so v2
/// passes an empty resources file: runc still re-applies the whole cgroup
/// config, device program included.
fn update_flags(env: RuntimeEnv, bundle: &Bundle) -> Vec<String> {
    match env {
        RuntimeEnv::CgroupV1 => vec!["--pids-limit".into(), "100".into()],
        RuntimeEnv::CgroupV2 => {
            let file = bundle.dir().join("update.json");
            fs::write(&file, "{}").expect("write update.json");
            vec!["-r".into(), file.display().to_string()]
        }
    }
}

/// The container's view of GPU 1 before and after `runc update`; on cgroup
/// v1 the device controller's rules for major 195 are printed around it.
fn gpu_1_across_update(
    env: RuntimeEnv,
    what: &str,
    container: &DetachedContainer,
    flags: &[String],
) -> (Output, Output) {
    let rules = || match env {
        RuntimeEnv::CgroupV1 => format!("{:?}", container.v1_device_rules(NVIDIA_MAJOR)),
        RuntimeEnv::CgroupV2 => "(BPF program)".to_owned(),
    };
    let before = container.exec(EXEC_GPUCHECK);
    let rules_before = rules();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    container.update(&flags);
    let after = container.exec(EXEC_GPUCHECK);
    eprintln!(
        "{what} ({env:?}): /dev/nvidia1 {} before `runc update {}`, {} after; devices.list {rules_before} -> {}",
        verdict(&before),
        flags.join(" "),
        verdict(&after),
        rules()
    );
    (before, after)
}

fn verdict(output: &Output) -> &str {
    output
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("dev /dev/nvidia1 "))
        .unwrap_or("(no answer)")
}

#[test]
fn nvhook_runtime_device_rules_survive_runc_update_cgroup_v1() {
    let _timer = Timer::start("nvhook_runtime_device_rules_survive_runc_update_cgroup_v1");
    nvhook_runtime_device_rules_survive_runc_update(RuntimeEnv::CgroupV1);
}

#[test]
fn nvhook_runtime_device_rules_survive_runc_update_cgroup_v2() {
    let _timer = Timer::start("nvhook_runtime_device_rules_survive_runc_update_cgroup_v2");
    nvhook_runtime_device_rules_survive_runc_update(RuntimeEnv::CgroupV2);
}

fn nvhook_runtime_device_rules_survive_runc_update(env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);

    // nvhook-runtime: the devices are the runtime's own (linux.devices and
    // linux.resources.devices), so runc re-applies them on update.
    let bundle = sleeping_gpu_bundle();
    bundle.write_config();
    let mut shimmed = DetachedContainer::run(
        env,
        nvhook_runtime_bin(),
        &bundle.state_dir(),
        bundle.dir(),
        bundle.id(),
        &[(NVHOOK_CONFIG, &node.config())],
    );
    assert_nvhook_runtime_owns_gpu_1(bundle.dir());
    let (before, mut after) =
        gpu_1_across_update(env, "nvhook-runtime", &shimmed, &update_flags(env, &bundle));
    after.hook_log = Some(node.log());
    assert_gpu_1_only(&before);
    assert_gpu_1_only(&after);
    shimmed.delete();

    // For contrast, the hook alone under plain runc: its cgroup rule is not
    // in the spec, so whether `runc update` keeps it is runc's business.
    // Recorded, not asserted.
    let mut hooked = sleeping_gpu_bundle();
    hooked.prestart_hook(&node);
    hooked.write_config();
    let mut plain = DetachedContainer::run(
        env,
        &require_program("runc"),
        &hooked.state_dir(),
        hooked.dir(),
        hooked.id(),
        &[],
    );
    let (hook_before, _hook_after) = gpu_1_across_update(
        env,
        "hook only (contrast)",
        &plain,
        &update_flags(env, &hooked),
    );
    assert_gpu_1_only(&hook_before);
    plain.delete();

    for dir in [bundle.dir(), hooked.dir()] {
        assert_no_mounts_left(dir, &node);
    }
}

/// nvhook-runtime, not the hook, put GPU 1 into the spec: node and cgroup rule.
#[track_caller]
fn assert_nvhook_runtime_owns_gpu_1(bundle: &Path) {
    let text = fs::read_to_string(bundle.join("config.json")).expect("read config.json");
    let spec: serde_json::Value = serde_json::from_str(&text).expect("config.json is JSON");
    let has = |list: &serde_json::Value, pred: &dyn Fn(&serde_json::Value) -> bool| {
        list.as_array().is_some_and(|a| a.iter().any(pred))
    };
    assert!(
        has(&spec["linux"]["devices"], &|d| d["path"] == "/dev/nvidia1"),
        "no /dev/nvidia1 in linux.devices:\n{text}"
    );
    assert!(
        has(&spec["linux"]["resources"]["devices"], &|r| {
            r["allow"] == true && r["major"] == NVIDIA_MAJOR && r["minor"] == 1
        }),
        "no allow rule for 195:1 in linux.resources.devices:\n{text}"
    );
    assert!(
        bundle.join("nvhook-plan.json").is_file(),
        "nvhook-runtime left no nvhook-plan.json"
    );
}
