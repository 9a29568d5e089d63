//! The host changes between two starts (issue 20 §2): a driver upgrade, a MIG
//! reconfiguration, a GPU that falls off the bus, a module reload with new dynamic majors.
//! The next start never uses NVML's answer or a plan made for the host as it was; a request
//! the host can no longer meet is refused in one line that says what changed; a container
//! already running is not touched. Real runc on the simulated node, changed in place with
//! `simnode create --keep-state`.

use std::fs;

use nvhook_test_support::engines::{DetachedContainer, nvhook_runtime_bin};
use nvhook_test_support::{
    Bundle, Output, RuntimeEnv, SimNode, glibc_image, gpucheck_args, require_program, run_clean,
    run_container_with,
};

const GPUS: u32 = 4;
const OLD: &str = "550.54.15";
const NEW: &str = "560.35.03";
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";

fn start(node: &SimNode, visible: &str, extra: &[&str]) -> Output {
    let args = gpucheck_args(GPUS, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &args);
    bundle.env(&format!("NVIDIA_VISIBLE_DEVICES={visible}"));
    bundle.prestart_hook(node);
    run_clean(&bundle, Some(node), RuntimeEnv::CgroupV1)
}

/// A container that asks for GPU 1 and sleeps, so it can be looked into after the change.
fn sleeping_on_gpu_1(node: &SimNode) -> (Bundle, DetachedContainer) {
    let mut bundle = Bundle::new(glibc_image(), &["/usr/bin/busybox", "sleep", "120"]);
    fs::copy(
        require_program("busybox"),
        bundle.rootfs().join("usr/bin/busybox"),
    )
    .expect("copy busybox into the bundle");
    bundle.env("NVIDIA_VISIBLE_DEVICES=1");
    bundle.prestart_hook(node);
    bundle.write_config();
    let container = DetachedContainer::run(
        RuntimeEnv::CgroupV1,
        &require_program("runc"),
        &bundle.state_dir(),
        bundle.dir(),
        bundle.id(),
        &[],
    );
    (bundle, container)
}

#[test]
fn a_driver_upgrade_gives_the_next_start_the_new_libraries_and_leaves_running_ones_be() {
    let node = SimNode::create(GPUS);
    let ls = ["--ls", LIB_DIR];
    let before = start(&node, "0", &ls);
    before.assert_success();
    before.assert_lines(&[&format!("ls {LIB_DIR} libcuda.so.{OLD}")]);
    let (_bundle, running) = sleeping_on_gpu_1(&node);
    let inits = node.nvml_inits();

    node.change(&["--gpus", "4", "--driver-version", NEW]);
    let after = start(&node, "0", &ls);
    after.assert_success();
    after.assert_gpus(GPUS, &[0]);
    after.assert_lines(&[
        &format!("ls {LIB_DIR} libcuda.so.{NEW}"),
        "dlopen libcuda.so.1 ok",
    ]);
    assert!(
        !after.stdout.contains(&format!("libcuda.so.{OLD}")),
        "an old library reached the new container\n{after}"
    );
    assert_eq!(node.nvml_inits(), inits + 1, "NVML was not asked again");
    let log = node.log();
    assert!(
        log.contains(&format!(
            "the host changed since NVML's stored answer change=driver {OLD} -> {NEW}"
        )),
        "{log}"
    );

    // The container started before the upgrade keeps its GPU and the libraries it was given.
    let seen = running.exec(&["/gpucheck", "--dev", "/dev/nvidia1", "--ls", LIB_DIR]);
    seen.assert_lines(&[
        "dev /dev/nvidia1 ENXIO",
        &format!("ls {LIB_DIR} libcuda.so.{OLD}"),
        "dlopen libcuda.so.1 ok",
    ]);
}

#[test]
fn a_driver_upgrade_reaches_starts_through_nvhook_runtime_too() {
    let node = SimNode::create(GPUS);
    let shim_start = |node: &SimNode| {
        let args = gpucheck_args(GPUS, &["--ls", LIB_DIR]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut bundle = Bundle::new(glibc_image(), &args);
        bundle.env("NVIDIA_VISIBLE_DEVICES=2");
        let config = node.config();
        let out = run_container_with(
            &bundle,
            RuntimeEnv::CgroupV1,
            nvhook_runtime_bin(),
            &[("NVHOOK_CONFIG", &config)],
        );
        out.assert_success();
        out
    };
    shim_start(&node).assert_lines(&[&format!("ls {LIB_DIR} libcuda.so.{OLD}")]);
    node.change(&["--gpus", "4", "--driver-version", NEW]);
    let after = shim_start(&node);
    after.assert_gpus(GPUS, &[2]);
    after.assert_lines(&[
        &format!("ls {LIB_DIR} libcuda.so.{NEW}"),
        "dlopen libcuda.so.1 ok",
    ]);
}

#[test]
fn a_mig_device_that_was_reconfigured_away_is_refused_saying_so() {
    let node = SimNode::create_with(GPUS, &["--mig", "1:2"]);
    start(&node, "1:1", &[]).assert_success();
    node.change(&["--gpus", "4", "--mig", "1:1"]);
    let refused = start(&node, "1:1", &[]);
    refused.assert_refused_by_hook(
        "nvhook: NVIDIA_VISIBLE_DEVICES=1:1: no such GPU (this node has 0-3 and MIG devices 1:0); \
         the host changed since the last start: GPU 1's MIG devices 1:0,1:1 -> 1:0",
    );
    // What is still there is given.
    start(&node, "1:0", &[]).assert_success();
}

#[test]
fn a_gpu_off_the_bus_is_named_and_an_index_now_means_the_gpu_after_it() {
    let node = SimNode::create(GPUS);
    let lost = node.gpu_uuid(2);
    let moved = node.gpu_uuid(3);
    start(&node, &lost, &[]).assert_gpus(GPUS, &[2]);

    node.change(&["--gpus", "4", "--lost-gpu", "2"]);
    let refused = start(&node, &lost, &[]);
    let line = refused.hook_stderr().unwrap_or_default();
    assert!(
        line.starts_with(&format!(
            "nvhook: NVIDIA_VISIBLE_DEVICES={lost}: no such GPU"
        )),
        "{refused}"
    );
    assert!(
        line.contains(&format!(
            "; the host changed since the last start: GPU 2 ({lost}, 0000:1e:00.0) is gone; \
             GPU 3 ({moved}) is now GPU 2"
        )),
        "{refused}"
    );
    assert_eq!(line.lines().count(), 1, "{line}");
    // Index 2 is now the board's fourth GPU, whose node is /dev/nvidia3.
    start(&node, "2", &[]).assert_gpus(GPUS, &[3]);
    start(&node, &moved, &[]).assert_gpus(GPUS, &[3]);
}

#[test]
fn a_module_reload_with_new_majors_gives_the_next_start_the_new_uvm_node() {
    let node = SimNode::create(GPUS);
    let uvm_major = |node: &SimNode| {
        let text = fs::read_to_string(node.root().join("proc/devices")).unwrap();
        text.lines()
            .find_map(|l| l.strip_suffix(" nvidia-uvm")?.trim().parse::<u32>().ok())
            .expect("nvidia-uvm in the node's /proc/devices")
    };
    let before = uvm_major(&node);
    start(&node, "0", &[]).assert_control_nodes_allowed();
    node.change(&["--gpus", "4", "--reload-module"]);
    let after = uvm_major(&node);
    assert_ne!(before, after, "the reload gave nvidia-uvm another major");
    let out = start(&node, "0", &["--stat", "/dev/nvidia-uvm"]);
    out.assert_control_nodes_allowed();
    out.assert_lines(&[&format!("stat /dev/nvidia-uvm char {after}:0")]);
}

/// The NRI plugin keeps the driver's files it found while a search would find the same: a
/// firmware file added and a tool removed, with NVML's answer unchanged, reach the very next
/// container's adjustment, as they would without the kept search.
#[test]
fn the_nri_plugins_kept_driver_files_follow_files_added_and_removed() {
    use nvhook_nri::api::{Container, PodSandbox};

    let node = SimNode::create(GPUS);
    // The adjustment lists the driver's files as mounts where the runtime makes them.
    node.configure("nri-mode = \"cdi\"\ncdi-mounts = \"runtime\"");
    // The plugin here is this test's process, with no NVML helper beside it: it plans from the
    // answer a first start stored.
    start(&node, "0", &[]).assert_success();
    // Directories changed within the filesystem clock's step are not trusted to show the next
    // change: the node's settle before a search of them is kept.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let plugin = nvhook::nri::GpuPlugin::new(Some(node.config()));
    let mounted = || -> Vec<String> {
        let container = Container {
            id: "kept".into(),
            env: vec!["NVIDIA_VISIBLE_DEVICES=0".into()],
            ..Default::default()
        };
        let adjustment = plugin
            .adjust(&PodSandbox::default(), &container)
            .expect("the plugin plans")
            .expect("a GPU container");
        adjustment
            .mounts
            .into_iter()
            .map(|m| m.destination)
            .collect()
    };
    let tool = "/usr/bin/nvidia-debugdump".to_string();
    let firmware = format!("/lib/firmware/nvidia/{OLD}/gsp_gb10x.bin");
    let searched = mounted();
    let kept = mounted();
    assert_eq!(searched, kept);
    assert!(kept.contains(&tool), "{kept:#?}");
    assert!(!kept.contains(&firmware), "{kept:#?}");

    let driver = node.driver_root();
    fs::write(driver.join(firmware.trim_start_matches('/')), b"firmware")
        .expect("add a firmware file");
    fs::remove_file(driver.join(tool.trim_start_matches('/'))).expect("remove a tool");
    let after = mounted();
    assert!(after.contains(&firmware), "{after:#?}");
    assert!(!after.contains(&tool), "{after:#?}");
}

/// The driver's files a start found are kept for the next start (beside NVML's cached answer)
/// once the directories it read have settled, and used while they stay as they were: a
/// firmware file added and a tool removed without NVML's answer changing reach the very next
/// start, as they would without the kept search.
#[test]
fn kept_driver_files_follow_files_added_and_removed() {
    const KEPT: &str = "the driver's files as a search before found them";
    let firmware = format!("/lib/firmware/nvidia/{OLD}");
    let node = SimNode::create(GPUS);
    // Directories changed within the filesystem clock's step are not trusted to show the next
    // change: the node's must settle before a search of them is kept.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let look = ["--ls", &firmware, "--ls", "/usr/bin"];
    // The first start asks NVML, and keeps its search beside the answer it stores.
    start(&node, "0", &look).assert_success();
    assert!(
        node.root().join("run/driver-files.json").is_file(),
        "no search kept\n{}",
        node.log()
    );
    let served = start(&node, "1", &look);
    served.assert_success();
    served.assert_lines(&["ls /usr/bin nvidia-debugdump"]);
    assert!(node.log().contains(KEPT), "{}", node.log());

    let driver = node.driver_root();
    fs::write(
        driver.join(format!("lib/firmware/nvidia/{OLD}/gsp_gb10x.bin")),
        b"firmware",
    )
    .expect("add a firmware file");
    fs::remove_file(driver.join("usr/bin/nvidia-debugdump")).expect("remove a tool");
    let after = start(&node, "0", &look);
    after.assert_success();
    after.assert_gpus(GPUS, &[0]);
    after.assert_lines(&[&format!("ls {firmware} gsp_gb10x.bin")]);
    assert!(
        !after.stdout.contains("ls /usr/bin nvidia-debugdump"),
        "a removed tool reached the container\n{after}"
    );
    assert_eq!(node.log().matches(KEPT).count(), 1, "{}", node.log());
}
