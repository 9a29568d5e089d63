//! IMEX channels and the opt-in device families (NVSwitch, GDS, MOFED, GDRCopy) end to end:
//! real runc containers on a simulated node that has (or lacks) each, with nvhook as the
//! prestart hook and through nvhook-runtime. A node the cgroup allows opens with ENXIO (ENODEV
//! for the misc device rdma_cm: no driver behind either), one it refuses with EPERM.
//!
//! Run as root after `cargo build --workspace`: `cargo test --test extra_devices_e2e`.

use nvhook_test_support as support;

use std::fs;

use support::engines::nvhook_runtime_bin;
use support::{
    Bundle, Output, RuntimeEnv, SimNode, glibc_image, require_root, run_clean, run_container_with,
    run_nvhook,
};

const IMEX_DIR: &str = "/dev/nvidia-caps-imex-channels";
/// The full set of fabric nodes `simnode --nvswitch 2 --gds --mofed --gdrcopy` makes, with the
/// verdict of opening each where the cgroup allows it.
const FAMILY_NODES: &[(&str, &str, &str)] = &[
    ("NVIDIA_NVSWITCH", "/dev/nvidia-nvswitchctl", "ENXIO"),
    ("NVIDIA_NVSWITCH", "/dev/nvidia-nvswitch0", "ENXIO"),
    ("NVIDIA_NVSWITCH", "/dev/nvidia-nvswitch1", "ENXIO"),
    ("NVIDIA_NVSWITCH", "/dev/nvidia-nvlink", "ENXIO"),
    ("NVIDIA_GDS", "/dev/nvidia-fs0", "ENXIO"),
    ("NVIDIA_GDS", "/dev/nvidia-fs3", "ENXIO"),
    ("NVIDIA_MOFED", "/dev/infiniband/uverbs0", "ENXIO"),
    ("NVIDIA_MOFED", "/dev/infiniband/umad0", "ENXIO"),
    // A misc major with a minor no driver registered: ENODEV.
    ("NVIDIA_MOFED", "/dev/infiniband/rdma_cm", "ENODEV"),
    ("NVIDIA_GDRCOPY", "/dev/gdrdrv", "ENXIO"),
];
const FAMILY_FLAGS: &[&str] = &["--nvswitch", "2", "--gds", "--mofed", "--gdrcopy"];

fn channel(n: u32) -> String {
    format!("{IMEX_DIR}/channel{n}")
}

/// The major the node's /proc/devices registers as `name`.
fn major(node: &SimNode, name: &str) -> u32 {
    let text = fs::read_to_string(node.root().join("proc/devices")).expect("read proc/devices");
    text.lines()
        .find_map(|l| {
            let (major, n) = l.trim().split_once(' ')?;
            (n == name).then(|| major.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {name} in the node's /proc/devices:\n{text}"))
}

/// A container asking for GPU 0 with `env`, that lists `dirs` and opens `nodes`.
fn bundle(node: &SimNode, env: &[&str], dirs: &[&str], nodes: &[&str]) -> Bundle {
    let mut args = vec!["/gpucheck".to_string()];
    for dir in dirs {
        args.extend(["--ls".to_string(), dir.to_string()]);
    }
    for n in nodes {
        args.extend(["--dev".to_string(), n.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &args);
    bundle.env("NVIDIA_VISIBLE_DEVICES=0");
    for var in env {
        bundle.env(var);
    }
    bundle.prestart_hook(node);
    bundle
}

/// The names gpucheck listed in `dir`.
fn listed<'a>(output: &'a Output, dir: &str) -> Vec<&'a str> {
    let prefix = format!("ls {dir} ");
    output
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .collect()
}

fn imex_channel_1_gets_exactly_that_channel_and_its_rule(env: RuntimeEnv) {
    require_root();
    let node = SimNode::create_with(2, &["--imex-channels", "3"]);
    let imex = major(&node, "nvidia-caps-imex-channels");
    let mut b = bundle(
        &node,
        &["NVIDIA_IMEX_CHANNELS=1"],
        &[IMEX_DIR],
        &[&channel(1), "/dev/imex-unallowed"],
    );
    // The same major with another minor, made by runc without a rule: refused, so the rule
    // nvhook added is for channel 1 alone.
    b.extra_device("/dev/imex-unallowed", imex, 0);
    let out = run_clean(&b, Some(&node), env);
    out.assert_success();
    assert_eq!(listed(&out, IMEX_DIR), ["channel1"], "{out}");
    out.assert_lines(&[
        &format!("dev {} ENXIO", channel(1)),
        "dev /dev/imex-unallowed EPERM",
    ]);
}

#[test]
fn imex_channel_1_gets_exactly_that_channel_and_its_rule_cgroup_v1() {
    imex_channel_1_gets_exactly_that_channel_and_its_rule(RuntimeEnv::CgroupV1);
}

#[test]
fn imex_channel_1_gets_exactly_that_channel_and_its_rule_cgroup_v2() {
    imex_channel_1_gets_exactly_that_channel_and_its_rule(RuntimeEnv::CgroupV2);
}

#[test]
fn imex_all_gets_every_channel_the_node_has() {
    require_root();
    let node = SimNode::create_with(2, &["--imex-channels", "3"]);
    let nodes: Vec<String> = (0..3).map(channel).collect();
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let out = run_clean(
        &bundle(&node, &["NVIDIA_IMEX_CHANNELS=all"], &[IMEX_DIR], &nodes),
        Some(&node),
        RuntimeEnv::CgroupV1,
    );
    out.assert_success();
    assert_eq!(
        listed(&out, IMEX_DIR),
        ["channel0", "channel1", "channel2"],
        "{out}"
    );
    for n in nodes {
        out.assert_lines(&[&format!("dev {n} ENXIO")]);
    }
}

#[test]
fn imex_channels_from_the_device_plugins_mounts() {
    require_root();
    let node = SimNode::create_with(2, &["--imex-channels", "3"]);
    let mut b = Bundle::new(glibc_image(), &["/gpucheck", "--ls", IMEX_DIR]);
    b.device_list_mount("1").device_list_mount("imex/2");
    b.prestart_hook(&node);
    let out = run_clean(&b, Some(&node), RuntimeEnv::CgroupV1);
    out.assert_success();
    assert_eq!(listed(&out, IMEX_DIR), ["channel2"], "{out}");
}

#[test]
fn imex_all_on_a_node_without_channels_starts_with_none() {
    require_root();
    let node = SimNode::create(2);
    let out = run_clean(
        &bundle(&node, &["NVIDIA_IMEX_CHANNELS=all"], &[IMEX_DIR], &[]),
        Some(&node),
        RuntimeEnv::CgroupV1,
    );
    out.assert_success();
    out.assert_lines(&[&format!("ls {IMEX_DIR} absent")]);
    assert!(
        out.hook_log
            .as_deref()
            .is_some_and(|l| l.contains("NVIDIA_IMEX_CHANNELS=all") && l.contains("skipped")),
        "{out}"
    );
}

/// What the container explicitly asked for and did not get stops it, with one line; so does
/// a value nvhook cannot read. Nothing is left mounted (run_clean checks).
#[test]
fn missing_channels_and_malformed_values_are_refused_in_one_line() {
    require_root();
    let node = SimNode::create_with(2, &["--imex-channels", "2"]);
    for (var, line) in [
        (
            "NVIDIA_IMEX_CHANNELS=5",
            "nvhook: NVIDIA_IMEX_CHANNELS: IMEX channel 5 does not exist on this host (it has channels 0,1; ask for one it has, or all)",
        ),
        (
            "NVIDIA_IMEX_CHANNELS=1,,x",
            "nvhook: NVIDIA_IMEX_CHANNELS=1,,x: \"x\" is not an IMEX channel number (use channel numbers separated by commas, such as 0,1, or all)",
        ),
        (
            "NVIDIA_IMEX_CHANNELS=-1",
            "nvhook: NVIDIA_IMEX_CHANNELS=-1: \"-1\" is not an IMEX channel number (use channel numbers separated by commas, such as 0,1, or all)",
        ),
        (
            "NVIDIA_IMEX_CHANNELS=abc",
            "nvhook: NVIDIA_IMEX_CHANNELS=abc: \"abc\" is not an IMEX channel number (use channel numbers separated by commas, such as 0,1, or all)",
        ),
        (
            "NVIDIA_GDS=true",
            "nvhook: NVIDIA_GDS=true: use enabled or disabled (or leave it unset for the node's default)",
        ),
    ] {
        let b = bundle(&node, &[var], &[], &[]);
        let out = run_clean(&b, Some(&node), RuntimeEnv::CgroupV1);
        out.assert_refused_by_hook(line);
    }
}

#[test]
fn each_family_enabled_on_a_node_that_has_it_gets_its_nodes_and_rules() {
    require_root();
    let node = SimNode::create_with(2, FAMILY_FLAGS);
    let nodes: Vec<&str> = FAMILY_NODES.iter().map(|(_, n, _)| *n).collect();
    for variable in [
        "NVIDIA_NVSWITCH",
        "NVIDIA_GDS",
        "NVIDIA_MOFED",
        "NVIDIA_GDRCOPY",
    ] {
        let var = format!("{variable}=enabled");
        let out = run_clean(
            &bundle(&node, &[&var], &[], &nodes),
            Some(&node),
            RuntimeEnv::CgroupV1,
        );
        out.assert_success();
        for (family, path, allowed) in FAMILY_NODES {
            let verdict = if *family == variable {
                *allowed
            } else {
                "absent"
            };
            out.assert_lines(&[&format!("dev {path} {verdict}")]);
        }
    }
}

#[test]
fn families_enabled_on_a_node_without_them_start_with_nothing_added() {
    require_root();
    let node = SimNode::create(2);
    let vars = [
        "NVIDIA_NVSWITCH=enabled",
        "NVIDIA_GDS=Enabled",
        "NVIDIA_MOFED=enabled",
        "NVIDIA_GDRCOPY=enabled",
    ];
    let nodes: Vec<&str> = FAMILY_NODES.iter().map(|(_, n, _)| *n).collect();
    let b = bundle(&node, &vars, &["/dev/infiniband"], &nodes);
    let out = run_clean(&b, Some(&node), RuntimeEnv::CgroupV1);
    out.assert_success();
    out.assert_lines(&["ls /dev/infiniband absent"]);
    for path in &nodes {
        out.assert_lines(&[&format!("dev {path} absent")]);
    }
    // `nvhook plan` says what was left out and why.
    b.write_config();
    let config = node.config().display().to_string();
    let bundle_dir = b.dir().display().to_string();
    let plan = run_nvhook(&["--config", &config, "plan", "--bundle", &bundle_dir]);
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(plan.status.success(), "{text}");
    for family in ["nvswitch", "gds", "mofed", "gdrcopy"] {
        assert!(
            text.contains(&format!("  device family {family} (NVIDIA_")),
            "{text}"
        );
    }
    assert!(
        text.contains("Skipped (asked for, not on this host):"),
        "{text}"
    );
}

#[test]
fn through_nvhook_runtime_the_runtime_makes_the_nodes_and_dev_char_links_them() {
    through_nvhook_runtime("hook");
}

#[test]
fn through_nvhook_runtime_in_cdi_mode_too() {
    through_nvhook_runtime("cdi");
}

/// nvhook-runtime puts the nodes into config.json (runc makes them and owns their rules) and
/// links each in /dev/char for the systemd cgroup driver, in `runtime-mode` `mode`.
fn through_nvhook_runtime(mode: &str) {
    require_root();
    let mut flags = vec!["--imex-channels", "2"];
    flags.extend(FAMILY_FLAGS);
    let node = SimNode::create_with(2, &flags);
    node.configure(&format!("runtime-mode = {mode:?}"));
    let mut b = Bundle::new(
        glibc_image(),
        &[
            "/gpucheck",
            "--ls",
            IMEX_DIR,
            "--dev",
            "/dev/nvidia-caps-imex-channels/channel1",
            "--dev",
            "/dev/gdrdrv",
        ],
    );
    b.env("NVIDIA_VISIBLE_DEVICES=0")
        .env("NVIDIA_IMEX_CHANNELS=1")
        .env("NVIDIA_GDRCOPY=enabled");
    let config = node.config();
    let mut out = run_container_with(
        &b,
        RuntimeEnv::CgroupV1,
        nvhook_runtime_bin(),
        &[("NVHOOK_CONFIG", &config)],
    );
    out.hook_log = Some(node.log());
    out.assert_success();
    assert_eq!(listed(&out, IMEX_DIR), ["channel1"], "{out}");
    out.assert_lines(&[
        &format!("dev {} ENXIO", channel(1)),
        "dev /dev/gdrdrv ENXIO",
    ]);
    let text = fs::read_to_string(b.dir().join("config.json")).expect("read config.json");
    let spec: serde_json::Value = serde_json::from_str(&text).expect("config.json is JSON");
    let listed_paths: Vec<&str> = spec["linux"]["devices"]
        .as_array()
        .expect("linux.devices")
        .iter()
        .filter_map(|d| d["path"].as_str())
        .collect();
    for path in [channel(1).as_str(), "/dev/gdrdrv"] {
        assert!(
            listed_paths.contains(&path),
            "{path} not in {listed_paths:?}"
        );
    }
    for (name, minor) in [("nvidia-caps-imex-channels", 1), ("gdrdrv", 0)] {
        let link = node
            .dev_root()
            .join(format!("dev/char/{}:{minor}", major(&node, name)));
        assert!(link.exists(), "{} does not resolve", link.display());
    }
}

/// `device-families` in the config: a container that says nothing gets the family, one that
/// says `disabled` does not.
#[test]
fn the_config_default_gives_a_family_unless_the_container_disables_it() {
    require_root();
    let node = SimNode::create_with(2, &["--mofed"]);
    node.configure("device-families = [\"mofed\"]");
    let uverbs = "/dev/infiniband/uverbs0";
    for (env, verdict) in [(None, "ENXIO"), (Some("NVIDIA_MOFED=disabled"), "absent")] {
        let env: Vec<&str> = env.into_iter().collect();
        let out = run_clean(
            &bundle(&node, &env, &[], &[uverbs]),
            Some(&node),
            RuntimeEnv::CgroupV1,
        );
        out.assert_success();
        out.assert_lines(&[&format!("dev {uverbs} {verdict}")]);
    }
}

/// On a hardened node (`accept-env-when-unprivileged = false`) a pod whose GPUs come from the
/// device plugin's mounts cannot add IMEX channels or families by variable; its mounts count.
#[test]
fn a_hardened_node_ignores_an_unprivileged_containers_variables() {
    require_root();
    let node = SimNode::create_with(2, &["--imex-channels", "3", "--gdrcopy"]);
    node.configure("accept-env-when-unprivileged = false");
    let mut b = Bundle::new(
        glibc_image(),
        &["/gpucheck", "--ls", IMEX_DIR, "--dev", "/dev/gdrdrv"],
    );
    b.env("NVIDIA_IMEX_CHANNELS=all")
        .env("NVIDIA_GDRCOPY=enabled")
        .device_list_mount("0")
        .prestart_hook(&node);
    let out = run_clean(&b, Some(&node), RuntimeEnv::CgroupV1);
    out.assert_success();
    out.assert_lines(&[&format!("ls {IMEX_DIR} absent"), "dev /dev/gdrdrv absent"]);
    b.device_list_mount("imex/1");
    let out = run_clean(&b, Some(&node), RuntimeEnv::CgroupV1);
    out.assert_success();
    assert_eq!(listed(&out, IMEX_DIR), ["channel1"], "{out}");
}

/// `nvhook dev-char-links` (boot and udev) links IMEX channels and the families' nodes too.
#[test]
fn dev_char_links_covers_imex_channels_and_family_nodes() {
    require_root();
    let mut flags = vec!["--imex-channels", "2"];
    flags.extend(FAMILY_FLAGS);
    let node = SimNode::create_with(1, &flags);
    let config = node.config().display().to_string();
    let out = run_nvhook(&["--config", &config, "dev-char-links"]);
    assert!(out.status.success(), "{out:?}");
    for (name, minor, target) in [
        (
            "nvidia-caps-imex-channels",
            1,
            "../nvidia-caps-imex-channels/channel1",
        ),
        ("gdrdrv", 0, "../gdrdrv"),
        ("nvidia-fs", 2, "../nvidia-fs2"),
        ("infiniband_verbs", 192, "../infiniband/uverbs0"),
        ("nvidia-nvlink", 0, "../nvidia-nvlink"),
    ] {
        let link = node
            .dev_root()
            .join(format!("dev/char/{}:{minor}", major(&node, name)));
        let read = fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display()));
        assert_eq!(read, std::path::Path::new(target));
    }
}
