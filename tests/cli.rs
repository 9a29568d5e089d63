//! The `nvhook` binary's `info` and `plan` commands on a real simulated GPU node built by
//! `simnode` (run as root, after `cargo build --workspace`): what they print, and how they fail.

use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tempfile::TempDir;

use nvhook_test_support as support;
use support::{run_nvhook, simnode_bin};

const DRIVER_VERSION: &str = "550.54.15";
const TOPOLOGY: &str = "driver/usr/lib/x86_64-linux-gnu/nvml-topology.json";
const DEBIAN_LIB64: &str = "/usr/lib/x86_64-linux-gnu";

fn run_simnode(args: &[&str]) -> Output {
    let out = Command::new(simnode_bin())
        .args(args)
        .output()
        .expect("run simnode");
    assert!(
        out.status.success(),
        "simnode {args:?} failed (these tests run as root): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A simulated node in its own temporary directory, destroyed with `simnode destroy` on drop.
struct Node {
    dir: TempDir,
    topology: Value,
}

impl Node {
    /// 4 GPUs, GPU 3 split into 2 MIG devices, plus any extra `simnode create` flags.
    fn create(extra: &[&str]) -> Node {
        let dir = tempfile::Builder::new()
            .prefix("nvhook-cli-")
            .tempdir()
            .expect("create temp dir");
        let root = dir.path().join("node");
        let mut args = vec![
            "create",
            root.to_str().unwrap(),
            "--gpus",
            "4",
            "--mig",
            "3:2",
        ];
        args.extend_from_slice(extra);
        run_simnode(&args);
        let text = fs::read_to_string(root.join(TOPOLOGY)).expect("read the topology file");
        let topology = serde_json::from_str(&text).expect("topology is JSON");
        Node { dir, topology }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("node")
    }

    fn config(&self) -> PathBuf {
        self.root().join("config.toml")
    }

    /// The node's config without its log file, as most hosts run: log lines then go to stderr.
    fn config_without_log_file(&self) -> PathBuf {
        let text = fs::read_to_string(self.config()).unwrap();
        let kept: Vec<&str> = text.lines().filter(|l| !l.starts_with("log-")).collect();
        let path = self.dir.path().join("nolog.toml");
        fs::write(&path, kept.join("\n")).unwrap();
        path
    }

    fn gpu(&self, index: usize) -> &Value {
        &self.topology["gpus"][index]
    }

    fn gpu_uuid(&self, index: usize) -> String {
        str_at(self.gpu(index), "uuid")
    }

    fn mig_uuid(&self, gpu: usize, mig: usize) -> String {
        str_at(&self.gpu(gpu)["mig_devices"][mig], "uuid")
    }

    /// NVML form: `00000000:1B:00.0`.
    fn nvml_bus_id(&self, index: usize) -> String {
        str_at(self.gpu(index), "pci_bus_id")
    }

    /// Kernel form: `0000:1b:00.0`.
    fn kernel_bus_id(&self, index: usize) -> String {
        self.nvml_bus_id(index)
            .strip_prefix("0000")
            .expect("8-digit domain")
            .to_lowercase()
    }

    /// A bundle whose config.json carries `env`, with a Debian rootfs.
    fn bundle(&self, env: &[&str]) -> TempDir {
        let bundle = tempfile::tempdir_in(self.dir.path()).unwrap();
        fs::create_dir_all(bundle.path().join("rootfs/etc")).unwrap();
        fs::write(bundle.path().join("rootfs/etc/debian_version"), "12.5\n").unwrap();
        let spec = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "env": env},
            "root": {"path": "rootfs"},
        });
        fs::write(bundle.path().join("config.json"), spec.to_string()).unwrap();
        bundle
    }

    fn run_with(&self, config: &Path, args: &[&str]) -> Output {
        run_nvhook(&[&["--config", config.to_str().unwrap()], args].concat())
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_with(&self.config(), args)
    }

    fn plan_with(&self, config: &Path, env: &[&str]) -> Output {
        let bundle = self.bundle(env);
        let dir = bundle.path().to_str().unwrap();
        self.run_with(config, &["plan", "--bundle", dir, "--format", "json"])
    }

    /// `nvhook plan --format json` for `env`, which must succeed.
    fn plan(&self, env: &[&str]) -> Value {
        let out = self.plan_with(&self.config(), env);
        let doc = success_json(&out, &env);
        assert_eq!(doc["gpu_requested"], true, "{env:?}");
        doc["plan"].clone()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new(simnode_bin())
            .arg("destroy")
            .arg(self.root())
            .output();
    }
}

fn str_at(value: &Value, key: &str) -> String {
    value[key]
        .as_str()
        .unwrap_or_else(|| panic!("no string {key} in {value}"))
        .to_string()
}

fn strings(value: &Value, key: &str) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|v| str_at(v, key))
        .collect()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
fn success_json(out: &Output, what: &dyn std::fmt::Debug) -> Value {
    assert!(
        out.status.success(),
        "{what:?}: exit {:?}: {}",
        out.status.code(),
        stderr(out)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what:?}: stdout is not JSON: {e}"))
}

/// Exit status 1, nothing on stdout, and exactly one `nvhook: ` line on stderr, which
/// states its cause once. Returns that line.
#[track_caller]
fn one_line_failure(out: &Output, what: &dyn std::fmt::Debug) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{what:?}: stderr {err}");
    assert!(out.stdout.is_empty(), "{what:?}: stdout {:?}", out.stdout);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{what:?}: want one line on stderr, got {lines:#?}"
    );
    let line = lines[0];
    assert!(line.starts_with("nvhook: "), "{what:?}: {line}");
    // "...: cause: cause" reads as a stutter: the final cause must not repeat earlier text.
    let tail = line.rsplit(": ").next().unwrap();
    let repeats = if tail.len() > 10 {
        line.matches(tail).count()
    } else {
        1
    };
    assert_eq!(repeats, 1, "{what:?}: repeated cause in {line}");
    line.to_string()
}

fn visible(value: &str) -> String {
    format!("NVIDIA_VISIBLE_DEVICES={value}")
}

fn env_of(vars: &[String]) -> Vec<&str> {
    vars.iter().map(String::as_str).collect()
}

// ---------------------------------------------------------------- info

#[test]
fn info_json_lists_the_gpus_of_the_topology() {
    let node = Node::create(&[]);
    let inv = success_json(&node.run(&["info", "--format", "json"]), &"info");
    assert_eq!(inv["driver_version"], DRIVER_VERSION);
    assert_eq!(inv["cuda_version"], "12.4");
    let gpus = &inv["gpus"];
    assert_eq!(gpus.as_array().map(Vec::len), Some(4), "{gpus}");
    let want: Vec<String> = (0..4).map(|i| node.gpu_uuid(i)).collect();
    assert_eq!(strings(gpus, "uuid"), want);
    let want: Vec<String> = (0..4).map(|i| node.kernel_bus_id(i)).collect();
    assert_eq!(strings(gpus, "pci_bus_id"), want);
    let migs = strings(&gpus[3]["mig_devices"], "uuid");
    assert_eq!(migs, vec![node.mig_uuid(3, 0), node.mig_uuid(3, 1)]);
    // The architecture of the driver found: its NVML library's ELF header (the mock NVML, built
    // for this machine).
    let driver_arch = &inv["driver_arch"];
    assert_eq!(
        driver_arch["machine"],
        std::env::consts::ARCH,
        "{driver_arch}"
    );
    let library = driver_arch["library"].as_str().unwrap();
    assert!(library.contains("libnvidia-ml.so"), "{driver_arch}");
    assert!(driver_arch.get("error").is_none(), "{driver_arch}");
    assert!(stderr(&node.run(&["info", "--format", "json"])).is_empty());
}

#[test]
fn info_text_describes_driver_gpus_and_mig_devices() {
    let node = Node::create(&[]);
    for args in [&["info"][..], &["info", "--format", "text"]] {
        let out = node.run(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(DRIVER_VERSION), "{text}");
        for i in 0..4 {
            assert!(text.contains(&node.gpu_uuid(i)), "GPU {i}: {text}");
            assert!(text.contains(&node.kernel_bus_id(i)), "GPU {i}: {text}");
        }
        assert!(text.contains(&node.mig_uuid(3, 1)), "{text}");
        assert!(text.contains("/dev/nvidia3"), "{text}");
        let memory = node.gpu(0)["memory_total"].as_u64().unwrap() >> 20;
        assert!(
            text.contains(&format!("Memory:         {memory} MiB")),
            "{text}"
        );
        assert!(text.contains("Persistence:    on"), "{text}");
        let arch = format!("Driver arch:    {} (", std::env::consts::ARCH);
        assert!(
            text.lines()
                .any(|l| l.starts_with(&arch) && l.contains("libnvidia-ml.so")),
            "{text}"
        );
    }
}

#[test]
fn nvml_init_failure_is_one_line_naming_nvml() {
    let node = Node::create(&["--nvml-init-error", "9"]);
    for args in [&["info"][..], &["info", "--format", "json"]] {
        let line = one_line_failure(&node.run(args), &args);
        assert!(line.contains("NVML"), "{line}");
    }
    let line = one_line_failure(&node.plan_with(&node.config(), &[&visible("0")]), &"plan");
    assert!(line.contains("NVML"), "{line}");
}

/// nvhook without its NVML helper beside it (a partial install) names the helper and the fix.
#[test]
fn a_missing_nvml_helper_is_one_line_naming_it() {
    let node = Node::create(&[]);
    let alone = TempDir::new().unwrap();
    let nvhook = alone.path().join("nvhook");
    fs::copy(support::nvhook_bin(), &nvhook).unwrap();
    let config = node.config();
    let out = support::output_of_copied_binary(
        Command::new(&nvhook)
            .arg("--config")
            .arg(&config)
            .arg("info"),
    );
    let line = one_line_failure(&out, &"info without nvhook-nvml");
    let helper = alone.path().join("nvhook-nvml");
    assert!(line.contains(&helper.display().to_string()), "{line}");
    assert!(line.contains("reinstall nvhook"), "{line}");
}

/// Every container start execs nvhook, so it is a static PIE (no loader work, still loaded
/// at a random address); NVML is loaded by the dynamic helper beside it.
#[test]
fn nvhook_is_a_static_pie_and_its_nvml_helper_is_dynamic() {
    let nvhook = support::nvhook_bin();
    assert!(support::readelf("-h", nvhook).contains("DYN (Position-Independent Executable file)"));
    let segments = support::readelf("-l", nvhook);
    assert!(!segments.contains("INTERP"), "{segments}");
    let dynamic = support::readelf("-d", nvhook);
    assert!(!dynamic.contains("NEEDED"), "{dynamic}");
    let helper = support::workspace_bin("nvhook-nvml");
    assert!(support::readelf("-l", &helper).contains("INTERP"));
}

/// The code a container start runs is laid out together, ahead of the rest of nvhook's text
/// (build.rs, from link/hot-text.txt): the hook's and nvhook-runtime's create's main functions
/// are in that section. Failing here, the list no longer names the code a start runs (it was
/// renamed or moved): run scripts/hot-text.sh.
#[test]
fn the_code_a_start_runs_is_laid_out_together() {
    let nvhook = support::nvhook_bin();
    let sections = support::readelf("-S", nvhook);
    let index_of = |name: &str| {
        sections
            .lines()
            .find(|line| line.split_whitespace().nth(1) == Some(name))
            .and_then(|line| line.trim_start().strip_prefix('['))
            .and_then(|rest| rest.split(']').next())
            .map(|index| index.trim().to_string())
            .unwrap_or_else(|| panic!("no {name} section in {}:\n{sections}", nvhook.display()))
    };
    let hot = index_of(".text.nvhook_hot");
    let text = index_of(".text");
    assert!(
        hot.parse::<u32>().unwrap() < text.parse::<u32>().unwrap(),
        "{sections}"
    );
    let symbols = support::readelf("-sC", nvhook);
    for function in [
        "nvhook::hook::run_hook",
        "nvhook::hook::prestart::configure",
        "nvhook::hook::prestart::apply",
        "nvhook::inventory::isolated::load_from",
        "nvhook::runtime_create::prepare_bundle",
    ] {
        let line = symbols
            .lines()
            .find(|line| line.split_whitespace().nth(7) == Some(function))
            .unwrap_or_else(|| panic!("{function} is not in {}'s symbols", nvhook.display()));
        let section = line.split_whitespace().nth(6);
        assert_eq!(
            section,
            Some(hot.as_str()),
            "{function} is not with the hot code: {line}"
        );
    }
}

// ---------------------------------------------------------------- plan

#[test]
fn plan_selects_by_every_id_form() {
    let node = Node::create(&[]);
    // (NVIDIA_VISIBLE_DEVICES, selected id, selected UUID, GPU node, nvidia-caps nodes)
    let cases = [
        ("1".to_string(), "1", node.gpu_uuid(1), "/dev/nvidia1", 0),
        (node.gpu_uuid(2), "2", node.gpu_uuid(2), "/dev/nvidia2", 0),
        (
            node.kernel_bus_id(1),
            "1",
            node.gpu_uuid(1),
            "/dev/nvidia1",
            0,
        ),
        (
            node.nvml_bus_id(2),
            "2",
            node.gpu_uuid(2),
            "/dev/nvidia2",
            0,
        ),
        (
            node.mig_uuid(3, 1),
            "3:1",
            node.mig_uuid(3, 1),
            "/dev/nvidia3",
            2,
        ),
        (
            "3:0".to_string(),
            "3:0",
            node.mig_uuid(3, 0),
            "/dev/nvidia3",
            2,
        ),
    ];
    for (value, id, uuid, gpu_node, caps_nodes) in cases {
        let plan = node.plan(&[&visible(&value)]);
        let selected = &plan["selected"];
        assert_eq!(strings(selected, "id"), vec![id], "{value}");
        assert_eq!(strings(selected, "uuid"), vec![uuid], "{value}");
        let devices = strings(&plan["devices"], "path");
        let gpu_nodes: Vec<&String> = devices
            .iter()
            .filter(|d| {
                d.strip_prefix("/dev/nvidia")
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .collect();
        assert_eq!(gpu_nodes, vec![gpu_node], "{value}: {devices:?}");
        let caps = devices
            .iter()
            .filter(|d| d.starts_with("/dev/nvidia-caps/"))
            .count();
        assert_eq!(caps, caps_nodes, "{value}: {devices:?}");
        assert!(
            devices.contains(&"/dev/nvidiactl".to_string()),
            "{devices:?}"
        );
        assert_eq!(
            plan["cgroup_rules"].as_array().map(Vec::len),
            Some(devices.len()),
            "{value}"
        );
        assert_eq!(plan["layout"]["lib64_dir"], DEBIAN_LIB64, "{value}");
        // Every host path in the plan is the simulated node's.
        for m in plan["mounts"].as_array().unwrap() {
            let source = Path::new(m["source"].as_str().unwrap());
            assert!(source.starts_with(node.root()), "{m}");
        }
    }
}

#[test]
fn plan_files_follow_the_capabilities() {
    let node = Node::create(&[]);
    let lib = |stem: &str| format!("{DEBIAN_LIB64}/{stem}.so.{DRIVER_VERSION}");
    // (NVIDIA_DRIVER_CAPABILITIES, wanted mounts, unwanted mount substrings, uvm nodes)
    let cases = [
        (
            "utility",
            vec!["/usr/bin/nvidia-smi".to_string(), lib("libnvidia-ml")],
            vec!["libcuda"],
            false,
        ),
        (
            "compute",
            vec![lib("libcuda")],
            vec!["nvidia-smi", "libnvidia-ml"],
            true,
        ),
        (
            "compute,utility",
            vec![
                lib("libcuda"),
                lib("libnvidia-ml"),
                "/usr/bin/nvidia-smi".into(),
            ],
            vec!["i386-linux-gnu"],
            true,
        ),
    ];
    for (capabilities, wanted, unwanted, uvm) in cases {
        let caps = format!("NVIDIA_DRIVER_CAPABILITIES={capabilities}");
        let plan = node.plan(&[&visible("0"), &caps]);
        let mounts = strings(&plan["mounts"], "destination");
        for w in &wanted {
            assert!(mounts.contains(w), "{capabilities}: no {w} in {mounts:#?}");
        }
        for u in unwanted {
            assert!(
                !mounts.iter().any(|m| m.contains(u)),
                "{capabilities}: unexpected {u} in {mounts:#?}"
            );
        }
        let devices = strings(&plan["devices"], "path");
        assert_eq!(
            devices.contains(&"/dev/nvidia-uvm".to_string()),
            uvm,
            "{capabilities}: {devices:?}"
        );
    }
}

#[test]
fn void_and_unset_give_an_empty_plan() {
    let node = Node::create(&[]);
    let env_sets: [&[&str]; 3] = [&["NVIDIA_VISIBLE_DEVICES=void"], &[], &["PATH=/bin"]];
    for env in env_sets {
        let doc = success_json(&node.plan_with(&node.config(), env), &env);
        assert_eq!(
            doc,
            serde_json::json!({"gpu_requested": false, "plan": null}),
            "{env:?}"
        );
    }
    let bundle = node.bundle(&["NVIDIA_VISIBLE_DEVICES=void"]);
    let out = node.run(&["plan", "--bundle", bundle.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("empty plan"));
}

/// Requests the node cannot honour, and what the one error line must say about each.
fn refused_requests() -> [(Vec<String>, Vec<&'static str>); 3] {
    [
        (
            vec![visible("7")],
            vec!["nvhook: NVIDIA_VISIBLE_DEVICES=7: no such GPU (this node has 0-3"],
        ),
        (
            vec![visible("0"), "NVIDIA_DRIVER_CAPABILITIES=teleport".into()],
            vec![
                "NVIDIA_DRIVER_CAPABILITIES=teleport",
                "unknown driver capability",
            ],
        ),
        (
            vec![visible("0"), "NVIDIA_REQUIRE_CUDA=cuda>=99.0".into()],
            vec!["unsatisfied condition: cuda>=99.0", "12.4", DRIVER_VERSION],
        ),
    ]
}

fn check_refused(node: &Node, config: &Path) {
    for (env, needles) in refused_requests() {
        let out = node.plan_with(config, &env_of(&env));
        let line = one_line_failure(&out, &env);
        for n in needles {
            assert!(line.contains(n), "{env:?}: {n:?} not in {line}");
        }
    }
}

#[test]
fn refused_requests_fail_with_one_line() {
    let node = Node::create(&[]);
    check_refused(&node, &node.config());
}

/// Without a log file, warnings and errors are logged to stderr: the failure must still be
/// one line there.
#[test]
fn refused_requests_fail_with_one_line_without_a_log_file() {
    let node = Node::create(&[]);
    check_refused(&node, &node.config_without_log_file());
}

// ---------------------------------------------------------------- usage and config

#[test]
fn usage_errors_exit_2() {
    let cases: [&[&str]; 6] = [
        &[],
        &["teleport"],
        &["plan"],
        &["info", "--format", "yaml"],
        &["info", "--bogus"],
        &["--config"],
    ];
    for args in cases {
        let out = run_nvhook(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
}

#[test]
fn bad_config_file_names_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    fs::write(&path, "log-level = \"info\"\nteleport-gpus = true\n").unwrap();
    let absent = dir.path().join("absent");
    let absent = absent.to_str().unwrap();
    for args in [&["info"][..], &["plan", "--bundle", absent]] {
        let out = run_nvhook(&[&["--config", path.to_str().unwrap()], args].concat());
        let line = one_line_failure(&out, &args);
        assert!(line.contains("teleport-gpus"), "{line}");
        assert!(line.contains(path.to_str().unwrap()), "{line}");
    }
}

#[test]
fn missing_config_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.toml");
    let out = run_nvhook(&["--config", path.to_str().unwrap(), "info"]);
    let line = one_line_failure(&out, &path);
    assert!(line.contains(path.to_str().unwrap()), "{line}");
}

/// `nvhook dra ARGS` is nvhook-dra, installed beside nvhook, with the same arguments.
#[test]
fn nvhook_dra_runs_the_dra_plugin_beside_nvhook() {
    let out = run_nvhook(&["dra", "--version"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("nvhook-dra {}", env!("CARGO_PKG_VERSION"))
    );
    let out = run_nvhook(&["dra", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("--node-name") && help.contains("remove-slices"),
        "{help}"
    );
}
