//! NVML's answer cached between starts (`nvml-cache-file`), with real runc containers on a
//! simulated node: a second start does not pay NVML, and a cached answer that no longer
//! matches the GPUs never refuses a start. Run as root after `cargo build --workspace`.

use nvhook_test_support as support;

use support::{Bundle, Output, RuntimeEnv, SimNode, glibc_image, gpucheck_args, run_clean};

const GPUS: u32 = 4;
/// Long enough that a start which paid it cannot be mistaken for one that did not.
const NVML_INIT_MS: u64 = 400;

#[track_caller]
fn start_with_gpu(node: &SimNode, visible: &str) -> Output {
    let args = gpucheck_args(GPUS, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &args);
    bundle.env(&format!("NVIDIA_VISIBLE_DEVICES={visible}"));
    bundle.prestart_hook(node);
    let output = run_clean(&bundle, Some(node), RuntimeEnv::CgroupV1);
    output.assert_success();
    output
}

fn cache_file(node: &SimNode) -> std::path::PathBuf {
    node.root().join("run/nvml-inventory.json")
}

/// A burst of starts on a node whose NVML answer is not cached yet (after a boot or a driver
/// upgrade) asks NVML once: the first start queries, the others wait and read its answer.
#[test]
fn a_burst_of_cold_starts_asks_nvml_once() {
    const STARTS: u32 = 8;
    let node = SimNode::create_with(GPUS, &["--nvml-init-delay-ms", "300"]);
    let barrier = std::sync::Barrier::new(STARTS as usize);
    std::thread::scope(|scope| {
        for i in 0..STARTS {
            let (node, barrier) = (&node, &barrier);
            scope.spawn(move || {
                let gpu = i % GPUS;
                let args = gpucheck_args(GPUS, &[]);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let mut bundle = Bundle::new(glibc_image(), &args);
                bundle.env(&format!("NVIDIA_VISIBLE_DEVICES={gpu}"));
                bundle.prestart_hook(node);
                barrier.wait();
                let output = run_clean(&bundle, Some(node), RuntimeEnv::CgroupV1);
                output.assert_success();
                output.assert_gpus(GPUS, &[gpu]);
            });
        }
    });
    assert_eq!(node.nvml_inits(), 1, "{}", node.log());
    let log = node.log();
    assert_eq!(log.matches("source=Nvml").count(), 1, "{log}");
    assert_eq!(
        log.matches("source=Cache").count(),
        STARTS as usize - 1,
        "{log}"
    );
}

#[test]
fn a_second_start_does_not_pay_nvml_init() {
    let node = SimNode::create_with(GPUS, &["--nvml-init-delay-ms", &NVML_INIT_MS.to_string()]);
    start_with_gpu(&node, "1").assert_gpus(GPUS, &[1]);
    assert!(cache_file(&node).is_file(), "no cache written");
    start_with_gpu(&node, "2").assert_gpus(GPUS, &[2]);

    let steps = node.step_us("inventory");
    assert_eq!(steps.len(), 2, "{}", node.log());
    assert!(steps[0] >= NVML_INIT_MS * 1000, "first start: {steps:?}");
    assert!(
        steps[1] < NVML_INIT_MS * 1000 / 2,
        "second start: {steps:?}"
    );
    let log = node.log();
    assert!(log.contains("source=Nvml"), "{log}");
    assert!(log.contains("source=Cache"), "{log}");
}

#[test]
fn a_kept_answer_that_misses_a_gpu_is_replaced_not_obeyed() {
    let node = SimNode::create(GPUS);
    start_with_gpu(&node, "0");
    // Stale in a way the fingerprint cannot see: NVML's cached answer lost GPU 3.
    let path = cache_file(&node);
    let mut stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read cache")).expect("JSON");
    let gpus = stored["system"]["gpus"].as_array_mut().expect("gpus");
    gpus.retain(|g| g["index"] != 3);
    std::fs::write(&path, serde_json::to_vec(&stored).expect("encode")).expect("write cache");

    start_with_gpu(&node, "3").assert_gpus(GPUS, &[3]);
    let log = node.log();
    assert!(log.contains("asking NVML again"), "{log}");
    // The fresh answer replaced the stale one.
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read cache")).expect("JSON");
    assert_eq!(stored["system"]["gpus"].as_array().map(Vec::len), Some(4));
}

/// The cached answer damaged between two starts: garbage, cut short, or replaced by a link
/// (to a copy of a good answer elsewhere, which a start must not follow). Each start still
/// gets exactly its GPU, from NVML asked again, and leaves a good private file in its place;
/// the link's target is never written.
#[test]
fn a_corrupt_truncated_or_linked_cache_is_asked_again_and_replaced() {
    let node = SimNode::create(GPUS);
    start_with_gpu(&node, "0");
    let path = cache_file(&node);
    let good = std::fs::read(&path).expect("read cache");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let target = elsewhere.path().join("copy.json");
    std::fs::write(&target, &good).expect("write copy");

    type Damage = fn(&std::path::Path, &[u8], &std::path::Path);
    let damages: [(&str, Damage); 3] = [
        ("garbage", |p, _, _| {
            std::fs::write(p, b"\x00\xffnot json{").unwrap()
        }),
        ("truncated", |p, good, _| {
            std::fs::write(p, &good[..good.len() / 2]).unwrap()
        }),
        ("a link", |p, _, target| {
            std::fs::remove_file(p).unwrap();
            std::os::unix::fs::symlink(target, p).unwrap();
        }),
    ];
    for (i, (what, damage)) in damages.iter().enumerate() {
        damage(&path, &good, &target);
        let inits = node.nvml_inits();
        let gpu = (i as u32 + 1) % GPUS;
        start_with_gpu(&node, &gpu.to_string()).assert_gpus(GPUS, &[gpu]);
        assert_eq!(
            node.nvml_inits(),
            inits + 1,
            "{what}: NVML was not asked again"
        );
        let meta = std::fs::symlink_metadata(&path).expect("the cache is there again");
        assert!(meta.is_file(), "{what}: {meta:?}");
        let stored: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("a whole answer");
        assert_eq!(
            stored["system"]["gpus"].as_array().map(Vec::len),
            Some(GPUS as usize)
        );
    }
    assert_eq!(
        std::fs::read(&target).unwrap(),
        good,
        "the link's target was written"
    );
}

/// `nri-mode = "hook"`: the inventory the NRI plugin planned a container with serves that
/// container's prestart hook, which then reads nothing of NVML; once, and only while the host
/// is as the plugin found it. A container removed before it started leaves nothing behind,
/// one removed while the plugin was away leaves nothing once it connects again, and a
/// container id that is no plain file name gets nothing handed over.
#[test]
fn the_nri_plugins_inventory_serves_its_containers_hook_once() {
    use nvhook_nri::Plugin;
    use nvhook_nri::api::{Container, Event, PodSandbox, StateChangeEvent};

    const OLD: &str = "550.54.15";
    const NEW: &str = "560.35.03";
    let node = SimNode::create(GPUS);
    let mut plugin = nvhook::nri::GpuPlugin::new(Some(node.config()));
    let handed = node.root().join("run/nri-inventory");
    let left = || -> Vec<String> {
        std::fs::read_dir(&handed)
            .map(|dir| {
                dir.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let container = |id: &str| Container {
        id: id.into(),
        name: "train".into(),
        env: vec!["NVIDIA_VISIBLE_DEVICES=1".into()],
        ..Default::default()
    };
    let bundle = || {
        let args = gpucheck_args(GPUS, &["--ls", "/usr/lib/x86_64-linux-gnu"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut bundle = Bundle::new(glibc_image(), &args);
        bundle.env("NVIDIA_VISIBLE_DEVICES=1");
        bundle.prestart_hook(&node);
        bundle
    };
    let plan = |plugin: &nvhook::nri::GpuPlugin, id: &str| {
        plugin
            .adjust(&PodSandbox::default(), &container(id))
            .expect("the plugin plans")
            .expect("a GPU container");
    };
    let used_line = "the inventory the NRI plugin planned this container with";
    // The plugin here is this test's process, with no NVML helper beside it: it plans from
    // the answer a first start stored.
    start_with_gpu(&node, "0");

    // Planned by the plugin, then started with NVML's stored answer gone: the hook asks NVML
    // nothing, and takes the file.
    let first = bundle();
    plan(&plugin, first.id());
    assert_eq!(left(), [format!("{}.json", first.id())]);
    std::fs::remove_file(cache_file(&node)).expect("remove NVML's stored answer");
    let inits = node.nvml_inits();
    let output = run_clean(&first, Some(&node), RuntimeEnv::CgroupV1);
    output.assert_success();
    output.assert_gpus(GPUS, &[1]);
    assert_eq!(
        node.nvml_inits(),
        inits,
        "the hook asked NVML\n{}",
        node.log()
    );
    assert!(node.log().contains(used_line), "{}", node.log());
    assert!(left().is_empty(), "{:?}", left());

    // The same container started again: nothing is handed over twice.
    let output = run_clean(&first, Some(&node), RuntimeEnv::CgroupV1);
    output.assert_success();
    assert_eq!(node.nvml_inits(), inits + 1, "NVML was not asked");
    assert_eq!(node.log().matches(used_line).count(), 1, "{}", node.log());

    // The driver upgraded between the plugin's planning and the start: the hook finds the new
    // driver's files itself.
    let upgraded = bundle();
    plan(&plugin, upgraded.id());
    node.change(&["--gpus", "4", "--driver-version", NEW]);
    let output = run_clean(&upgraded, Some(&node), RuntimeEnv::CgroupV1);
    output.assert_success();
    output.assert_gpus(GPUS, &[1]);
    assert!(
        output.stdout.contains(&format!("libcuda.so.{NEW}"))
            && !output.stdout.contains(&format!("libcuda.so.{OLD}")),
        "{output}"
    );
    assert!(
        node.log()
            .contains("the host changed since the NRI plugin planned: reading the inventory again"),
        "{}",
        node.log()
    );
    assert!(left().is_empty(), "{:?}", left());

    // Removed before it started: the plugin removes what it left.
    plan(&plugin, "removed-before-start");
    assert_eq!(left(), ["removed-before-start.json"]);
    plugin
        .state_change(&StateChangeEvent {
            event: Event::RemoveContainer as i32,
            pod: None,
            container: Some(container("removed-before-start")),
        })
        .expect("the removal is taken");
    assert!(left().is_empty(), "{:?}", left());

    // An id that would name another path is planned for, and nothing is written for it.
    plan(&plugin, "../../escape");
    plan(&plugin, ".hidden");
    assert!(left().is_empty(), "{:?}", left());
    assert!(!node.root().join("escape.json").exists());

    // Removed while the plugin was not connected: what it left, too old for a hook to take by
    // the time it connects again, goes then; what a container created just before is kept.
    plan(&plugin, "removed-while-away");
    plan(&plugin, "created-just-before");
    let aged = std::fs::File::options()
        .write(true)
        .open(handed.join("removed-while-away.json"))
        .expect("open what was left");
    aged.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(120))
        .expect("age it");
    let mut reconnected = nvhook::nri::GpuPlugin::new(Some(node.config()));
    reconnected
        .synchronize(Vec::new(), Vec::new())
        .expect("synchronized");
    assert_eq!(left(), ["created-just-before.json"]);
}
