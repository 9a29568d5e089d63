//! What a new user meets first (issue 26 §2 and §3): the defaults of `configure`, `doctor`
//! and `labels` agree, and each message that used to mislead or say nothing names its cause
//! and its fix. Every test runs the real nvhook (run as root, after `cargo build --workspace`)
//! and checks the exact line.

use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvhook_test_support as support;
use support::{SimNode, nvhook_bin, run_nvhook, workspace_bin};

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit status `code` and exactly one line on stderr, which is returned.
#[track_caller]
fn failure(out: &Output, code: i32) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "want one line on stderr: {err}");
    lines[0].to_string()
}

/// Exit status 0; stdout.
#[track_caller]
fn success(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        stderr(out)
    );
    stdout(out)
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `nvhook --config NODE-CONFIG ARGS...` on `node`.
fn on(node: &SimNode, args: &[&str]) -> Output {
    let config = node.config();
    run_nvhook(&[&["--config", s(&config)], args].concat())
}

/// Points the node's `dev-root` at `dir`.
fn set_dev_root(node: &SimNode, dir: &Path) {
    let text = fs::read_to_string(node.config()).unwrap();
    let lines: Vec<String> = text
        .lines()
        .map(|l| match l.starts_with("dev-root") {
            true => format!("dev-root = {:?}", s(dir)),
            false => l.to_string(),
        })
        .collect();
    fs::write(node.config(), lines.join("\n") + "\n").unwrap();
}

/// A bundle in `dir` whose config.json is `spec` plus `root.path = rootfs` (a directory made
/// here unless `spec` says otherwise).
fn bundle(dir: &Path, name: &str, mut spec: Value) -> PathBuf {
    let bundle = dir.join(name);
    fs::create_dir_all(bundle.join("rootfs")).unwrap();
    spec["root"] = serde_json::json!({"path": "rootfs"});
    fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
    bundle
}

// ---------------------------------------------------------------- §2 defaults that agree

#[test]
fn configure_writes_the_runtime_beside_this_nvhook_and_refuses_one_that_is_not_there() {
    let dir = tempfile::tempdir().unwrap();
    let daemon_json = dir.path().join("daemon.json");
    let out = run_nvhook(&["configure", "docker", "--engine-config", s(&daemon_json)]);
    assert_eq!(
        success(&out),
        format!(
            "configured runtime \"nvidia\" in {}\nto apply it: systemctl restart docker\n",
            daemon_json.display()
        )
    );
    let written: Value = serde_json::from_str(&fs::read_to_string(&daemon_json).unwrap()).unwrap();
    let beside = workspace_bin("nvhook-runtime");
    assert_eq!(written["runtimes"]["nvidia"]["path"], s(&beside));

    let missing = dir.path().join("nowhere/nvhook-runtime");
    let other = dir.path().join("other.json");
    let args = [
        "configure",
        "docker",
        "--engine-config",
        s(&other),
        "--runtime-path",
        s(&missing),
    ];
    assert_eq!(
        failure(&run_nvhook(&args), 1),
        format!(
            "nvhook: {} does not exist: name the installed nvhook-runtime with --runtime-path, or add --allow-missing if it will be there before the engine starts (an image build)",
            missing.display()
        )
    );
    assert!(!other.exists());
    success(&run_nvhook(&[&args[..], &["--allow-missing"]].concat()));
    let written: Value = serde_json::from_str(&fs::read_to_string(&other).unwrap()).unwrap();
    assert_eq!(written["runtimes"]["nvidia"]["path"], s(&missing));
}

#[test]
fn doctor_expects_the_runtime_configure_writes() {
    let node = SimNode::create(1);
    let host = tempfile::tempdir().unwrap();
    let daemon_json = host.path().join("etc/docker/daemon.json");
    fs::create_dir_all(daemon_json.parent().unwrap()).unwrap();
    fs::write(&daemon_json, "{}\n").unwrap();
    success(&run_nvhook(&[
        "configure",
        "docker",
        "--engine-config",
        s(&daemon_json),
    ]));
    let report = stdout(&on(&node, &["doctor", "--root", s(host.path())]));
    let want = format!(
        "ok   engine docker: {}: runtime nvidia is {}",
        daemon_json.display(),
        workspace_bin("nvhook-runtime").display()
    );
    assert!(report.lines().any(|l| l == want), "want {want}\n{report}");
}

#[test]
fn configure_takes_config_only_where_it_writes_nvhooks_config() {
    let dir = tempfile::tempdir().unwrap();
    let engine = dir.path().join("config.toml");
    let nvhook_config = dir.path().join("nvhook.toml");
    let out = run_nvhook(&[
        "--config",
        s(&nvhook_config),
        "configure",
        "containerd",
        "--engine-config",
        s(&engine),
    ]);
    assert_eq!(
        failure(&out, 2),
        format!(
            "nvhook: drop --config {}: configure reads no nvhook config (the engine's file is --engine-config; only --kubernetes writes nvhook's)",
            nvhook_config.display()
        )
    );
    assert!(!engine.exists() && !nvhook_config.exists());

    let out = run_nvhook(&[
        "--config",
        s(&nvhook_config),
        "configure",
        "containerd",
        "--engine-config",
        s(&engine),
        "--kubernetes",
    ]);
    let first = success(&out).lines().next().unwrap().to_string();
    assert_eq!(
        first,
        format!(
            "set the Kubernetes policy in {}: accept-env-when-unprivileged = false, accept-volume-mount-devices = true; containers created from now on follow it",
            nvhook_config.display()
        )
    );

    let help = stdout(&run_nvhook(&["configure", "--help"]));
    assert!(
        help.contains("configure takes it only with --kubernetes"),
        "{help}"
    );
}

/// What NVIDIA's `nvidia-ctk runtime configure` leaves in each engine's config.
const NVIDIA_CTK_CONFIGS: [(&str, &str, &str); 3] = [
    (
        "docker",
        "daemon.json",
        "{\"runtimes\": {\"nvidia\": {\"path\": \"/usr/bin/nvidia-container-runtime\", \"runtimeArgs\": []}}}\n",
    ),
    (
        "containerd",
        "config.toml",
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\nruntime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\nBinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
    ),
    (
        "crio",
        "99-nvidia.conf",
        "[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/nvidia-container-runtime\"\nruntime_type = \"oci\"\n",
    ),
];

#[test]
fn replacing_another_programs_runtime_says_whose_it_was() {
    let dir = tempfile::tempdir().unwrap();
    for (engine, name, text) in NVIDIA_CTK_CONFIGS {
        let file = dir.path().join(name);
        fs::write(&file, text).unwrap();
        let out = run_nvhook(&["configure", engine, "--engine-config", s(&file)]);
        assert_eq!(
            success(&out).lines().next().unwrap(),
            format!(
                "replaced runtime \"nvidia\" in {} (was /usr/bin/nvidia-container-runtime; backup: {}.nvhook.bak)",
                file.display(),
                file.display()
            ),
            "{engine}"
        );
    }
}

#[test]
fn labels_say_a_gpu_is_present_in_every_format() {
    let node = SimNode::create(2);
    let text = success(&on(&node, &["labels"]));
    assert!(
        text.lines().any(|l| l == "nvidia.com/gpu.present=true"),
        "{text}"
    );
    let nfd = success(&on(&node, &["labels", "--format", "nfd"]));
    assert!(
        nfd.lines().any(|l| l == "nvidia.com/gpu.present=true"),
        "{nfd}"
    );
    let json: Value = serde_json::from_str(&success(&on(&node, &["labels", "--format", "json"])))
        .expect("labels --format json");
    assert_eq!(json["nvidia.com/gpu.present"], "true");
    // The installer publishes the nfd file: the RuntimeClass's nodeSelector matches it.
    let runtime_class = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/runtimeclass.yaml"),
    )
    .unwrap();
    assert!(runtime_class.contains("nvidia.com/gpu.present: \"true\""));
    let refresh = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/refresh.sh"),
    )
    .unwrap();
    assert!(
        refresh
            .lines()
            .any(|l| l.contains("\"$nvhook\" labels --format nfd") && l.contains("--output")),
        "{refresh}"
    );
}

// ---------------------------------------------------------------- §3 messages

#[test]
fn cdi_generate_makes_the_directory_refuses_a_directory_and_says_what_it_wrote() {
    let node = SimNode::create(2);
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("etc/cdi/nvidia.yaml");
    let out = on(&node, &["cdi", "generate", "--output", s(&spec)]);
    assert_eq!(
        success(&out).lines().next().unwrap(),
        format!("wrote {} (5 devices)", spec.display())
    );
    assert!(spec.is_file());

    let as_dir = dir.path().join("etc/cdi");
    let out = on(&node, &["cdi", "generate", "--output", s(&as_dir)]);
    assert_eq!(
        failure(&out, 1),
        format!(
            "nvhook: cannot write CDI spec {}: it is a directory (name the file in it, such as {}/nvidia.yaml)",
            as_dir.display(),
            as_dir.display()
        )
    );
}

#[test]
fn a_missing_or_linked_rootfs_is_named() {
    let node = SimNode::create(1);
    let dir = tempfile::tempdir().unwrap();
    let gpu = serde_json::json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}});
    let missing = bundle(dir.path(), "missing", gpu.clone());
    fs::remove_dir(missing.join("rootfs")).unwrap();
    let linked = bundle(dir.path(), "linked", gpu);
    fs::remove_dir(linked.join("rootfs")).unwrap();
    std::os::unix::fs::symlink(dir.path(), linked.join("rootfs")).unwrap();
    for (bundle, why) in [
        (
            &missing,
            "no such directory (check root.path in config.json)",
        ),
        (
            &linked,
            "it is a symlink, which runtimes refuse as a rootfs (runc: \"not an absolute path, or a symlink\"): point root.path at the directory itself",
        ),
    ] {
        let out = on(&node, &["plan", "--bundle", s(bundle)]);
        assert_eq!(
            failure(&out, 1),
            format!(
                "nvhook: cannot open the container rootfs {}/rootfs: {why}",
                bundle.display()
            )
        );
    }
}

#[test]
fn an_unknown_device_plugin_mount_is_named_not_the_variable() {
    let node = SimNode::create(2);
    let dir = tempfile::tempdir().unwrap();
    let mount = "/var/run/nvidia-container-devices/GPU-nope";
    let b = bundle(
        dir.path(),
        "b",
        serde_json::json!({
            "process": {"env": []},
            "mounts": [{"destination": mount, "source": "/dev/null", "type": "bind"}],
        }),
    );
    let out = on(&node, &["plan", "--bundle", s(&b)]);
    assert_eq!(
        failure(&out, 1),
        format!("nvhook: volume mount {mount}: no such GPU (this node has 0-1)")
    );
}

/// `plan --format json` of a bundle whose process has `env`, privileged when asked.
fn plan_of(node: &SimNode, dir: &Path, env: &[&str], privileged: bool) -> Value {
    let mut spec = serde_json::json!({"process": {"env": env}});
    if privileged {
        spec["process"]["capabilities"] = serde_json::json!({"bounding": ["CAP_SYS_ADMIN"]});
    }
    let name = format!("b{}", fs::read_dir(dir).unwrap().count());
    let b = bundle(dir, &name, spec);
    let out = on(node, &["plan", "--bundle", s(&b), "--format", "json"]);
    let doc: Value = serde_json::from_str(&success(&out)).expect("plan is JSON");
    doc["plan"].clone()
}

/// One rule for every NVIDIA_* list, the toolkit's: spaces trimmed, empty items skipped, a
/// repeated item counted once. Each messy value plans exactly as its clean form, which
/// differs from leaving the variable out.
#[test]
fn every_nvidia_list_reads_spaces_empty_and_repeated_items_alike() {
    let node = SimNode::create_with(2, &["--mig", "1:2", "--imex-channels", "4"]);
    let dir = tempfile::tempdir().unwrap();
    let gpu = "NVIDIA_VISIBLE_DEVICES=0";
    let cases: [(&str, &str, &str, &[&str], bool); 5] = [
        ("NVIDIA_VISIBLE_DEVICES", " 0,,1,0", "0,1", &[], false),
        (
            "NVIDIA_DRIVER_CAPABILITIES",
            "compute,,graphics, compute",
            "compute,graphics",
            &[gpu],
            false,
        ),
        ("NVIDIA_IMEX_CHANNELS", " 1,,2,1", "1,2", &[gpu], false),
        ("NVIDIA_MIG_CONFIG_DEVICES", " 1,,1", "1", &[gpu], true),
        ("NVIDIA_MIG_MONITOR_DEVICES", "1,, 1 ", "1", &[gpu], true),
    ];
    for (variable, messy, clean, base, privileged) in cases {
        let with = |value: Option<&str>| {
            let mut env: Vec<String> = base.iter().map(|v| v.to_string()).collect();
            env.extend(value.map(|v| format!("{variable}={v}")));
            let env: Vec<&str> = env.iter().map(String::as_str).collect();
            plan_of(&node, dir.path(), &env, privileged)
        };
        let clean_plan = with(Some(clean));
        assert_eq!(with(Some(messy)), clean_plan, "{variable}={messy:?}");
        if !base.is_empty() {
            assert_ne!(with(None), clean_plan, "{variable} changes nothing");
        }
    }
}

#[test]
fn info_with_no_device_nodes_says_where_it_looked() {
    let node = SimNode::create(2);
    let empty = tempfile::tempdir().unwrap();
    set_dev_root(&node, empty.path());
    let out = on(&node, &["info"]);
    assert_eq!(
        failure(&out, 1),
        format!(
            "nvhook: 2 GPUs but no NVIDIA device node in {}/dev: check dev-root in the nvhook config, or load the driver (nvidia-modprobe)",
            empty.path().display()
        )
    );
    assert!(
        stdout(&out).ends_with("Device nodes:\n  none\n"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn doctor_names_a_missing_root() {
    let node = SimNode::create(1);
    let scratch = tempfile::tempdir().unwrap();
    let absent = scratch.path().join("absent");
    let out = on(&node, &["doctor", "--root", absent.to_str().unwrap()]);
    assert_eq!(
        failure(&out, 2),
        format!(
            "nvhook: --root {}: no such directory (name the directory that holds the host's /etc, or leave --root out for /)",
            absent.display()
        )
    );
}

/// A doctor report line for `name` (`warn NVML cache: ...`).
fn doctor_line(node: &SimNode, host: &Path, start: &str) -> String {
    let report = stdout(&on(node, &["doctor", "--root", s(host)]));
    report
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no {start:?} line in\n{report}"))
        .to_string()
}

#[test]
fn doctor_says_why_a_stored_nvml_cache_is_not_used() {
    use std::os::unix::fs::PermissionsExt;
    let node = SimNode::create(1);
    let host = tempfile::tempdir().unwrap();
    let config = node.config();
    let cache = node.root().join("run/nvml-inventory.json");
    success(&on(&node, &["labels"]));
    assert!(cache.is_file(), "labels stores NVML's answer");
    let run = node.root().join("run");
    fs::set_permissions(&run, fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(
        doctor_line(&node, host.path(), "warn NVML cache:"),
        format!(
            "warn NVML cache: {}: not used: its directory {} is not private to this user (uid 0): a cache others may write is not trusted -> fix: run nvhook doctor as the user the hook runs as (root), or make the cache's directory that user's alone (chown, chmod go-w)",
            cache.display(),
            run.display()
        )
    );
    // A user other than the hook's, as a doctor run without root is.
    fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(node.root(), fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(nvhook_bin())
        .args(["--config", s(&config), "doctor", "--root", s(host.path())])
        .env_remove("NVHOOK_CONFIG")
        .output()
        .expect("run setpriv");
    let report = stdout(&out);
    let line = report
        .lines()
        .find(|l| l.starts_with("warn NVML cache:"))
        .unwrap_or_else(|| panic!("no NVML cache line in\n{report}{}", stderr(&out)));
    assert_eq!(
        line,
        format!(
            "warn NVML cache: {}: not used: this user (uid 65534) may not look into {}: Permission denied (os error 13) -> fix: run nvhook doctor as the user the hook runs as (root), or make the cache's directory that user's alone (chown, chmod go-w)",
            cache.display(),
            run.display()
        )
    );
    // Where nothing is stored, the fix names the config doctor was given.
    fs::remove_file(&cache).unwrap();
    assert_eq!(
        doctor_line(&node, host.path(), "warn NVML cache:"),
        format!(
            "warn NVML cache: {}: none stored yet -> fix: nothing to do: the next container start (or nvhook --config {} cdi refresh) asks NVML and stores the answer",
            cache.display(),
            config.display()
        )
    );
}

#[test]
fn doctor_tells_an_entry_dev_char_links_cannot_replace_from_a_missing_link() {
    let node = SimNode::create(1);
    let host = tempfile::tempdir().unwrap();
    let config = node.config();
    let nvhook = format!("nvhook --config {}", config.display());
    let line = doctor_line(&node, host.path(), "warn /dev/char links:");
    assert!(
        line.ends_with(&format!(" -> fix: {nvhook} dev-char-links")),
        "{line}"
    );
    success(&on(&node, &["dev-char-links"]));
    let entry = node.root().join("dev/char/195:0");
    fs::remove_file(&entry).unwrap();
    fs::write(&entry, "").unwrap();
    assert_eq!(
        doctor_line(&node, host.path(), "warn /dev/char links:"),
        format!(
            "warn /dev/char links: missing or wrong: 195:0 (systemd drops those devices from a container's rules on daemon-reload) -> fix: move {} out of the way (not links: dev-char-links replaces only links), then run {nvhook} dev-char-links",
            entry.display()
        )
    );
}

#[test]
fn a_duplicate_config_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, "log-level = \"info\"\nlog-level = \"debug\"\n").unwrap();
    let out = run_nvhook(&["--config", s(&config), "info"]);
    assert_eq!(
        failure(&out, 1),
        format!(
            "nvhook: bad config {}: line 2: duplicate key `log-level` (set each key once)",
            config.display()
        )
    );
}

/// The README: "2 for usage errors". nvhook's own checks of its flags agree with clap's.
#[test]
fn nvhooks_own_argument_checks_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let engine = dir.path().join("daemon.json");
    let nvhook_config = dir.path().join("nvhook.toml");
    let other = dir.path().join("other.toml");
    let drop_config = format!(
        "nvhook: drop --config {}: configure reads no nvhook config (the engine's file is --engine-config; only --kubernetes writes nvhook's)",
        other.display()
    );
    let cases: [(Vec<&str>, &str); 6] = [
        (
            vec![
                "--config",
                s(&other),
                "configure",
                "docker",
                "--engine-config",
                s(&engine),
            ],
            &drop_config,
        ),
        (
            vec![
                "configure",
                "docker",
                "--engine-config",
                s(&engine),
                "--runtime-name",
                "a b",
            ],
            "nvhook: --runtime-name \"a b\": use only letters, digits, '.', '_' and '-'",
        ),
        (
            vec![
                "configure",
                "docker",
                "--engine-config",
                s(&engine),
                "--runtime-path",
                "nvhook-runtime",
            ],
            "nvhook: --runtime-path \"nvhook-runtime\" is not absolute: give the full path, engines must not look it up in PATH",
        ),
        (
            vec![
                "configure",
                "containerd",
                "--engine-config",
                s(&engine),
                "--remove",
                "--kubernetes",
                "--config",
                s(&nvhook_config),
            ],
            "nvhook: --remove with --kubernetes: --remove takes out the runtime and leaves the hardened policy in nvhook's config; to loosen it, set accept-env-when-unprivileged = true there",
        ),
        (
            vec!["labels", "--prefix", "Not_A_Domain"],
            "nvhook: --prefix \"Not_A_Domain\": expected a DNS subdomain such as nvidia.com (lower-case letters, digits, '-' and '.', at most 253 characters)",
        ),
        (
            vec!["hook", "prestart", "--link", "a=b"],
            "nvhook: Prestart takes no arguments (only createRuntime and createContainer do): [\"--link\", \"a=b\"]",
        ),
    ];
    for (args, line) in cases {
        assert_eq!(failure(&run_nvhook(&args), 2), line, "{args:?}");
    }
    assert!(!engine.exists() && !nvhook_config.exists() && !other.exists());
}

#[test]
fn nvhook_runtime_names_the_program_that_was_run() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent");
    let args = ["create", "--bundle", s(&absent), "id"];
    let want = |program: &str| {
        format!(
            "{program}: cannot read {}/config.json: No such file or directory (os error 2)",
            absent.display()
        )
    };
    let by_hand = run_nvhook(&[&["runtime"][..], &args].concat());
    assert_eq!(failure(&by_hand, 1), want("nvhook"));
    let by_engine = Command::new(workspace_bin("nvhook-runtime"))
        .args(args)
        .env_remove("NVHOOK_CONFIG")
        .output()
        .expect("run nvhook-runtime");
    assert_eq!(failure(&by_engine, 1), want("nvhook-runtime"));
}

#[test]
fn containerd_imports_of_a_missing_directory_other_than_its_default_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("config.toml");
    let elsewhere = dir.path().join("elsewhere");
    let text = format!(
        "version = 3\nimports = [\"{}/*.toml\"]\n",
        elsewhere.display()
    );
    fs::write(&main, &text).unwrap();
    let out = run_nvhook(&["configure", "containerd", "--engine-config", s(&main)]);
    assert_eq!(
        failure(&out, 1),
        format!(
            "nvhook: {} imports {}, a directory that does not exist: create it (mkdir -p {}) and run this again, or take that entry out of imports",
            main.display(),
            elsewhere.display(),
            elsewhere.display()
        )
    );
    assert!(!elsewhere.exists());
    assert_eq!(fs::read_to_string(&main).unwrap(), text);

    // containerd's own default, conf.d beside its config, is made.
    fs::write(&main, "version = 3\nimports = [\"conf.d/*.toml\"]\n").unwrap();
    let out = run_nvhook(&["configure", "containerd", "--engine-config", s(&main)]);
    let drop_in = dir.path().join("conf.d/99-nvhook.toml");
    assert_eq!(
        success(&out).lines().next().unwrap(),
        format!("configured runtime \"nvidia\" in {}", drop_in.display())
    );
}

#[test]
fn dev_char_links_without_nvidia_nodes_makes_nothing() {
    let node = SimNode::create(1);
    let empty = tempfile::tempdir().unwrap();
    fs::create_dir(empty.path().join("dev")).unwrap();
    set_dev_root(&node, empty.path());
    let out = on(&node, &["dev-char-links"]);
    assert_eq!(
        success(&out),
        format!(
            "no NVIDIA device nodes in {}/dev: nothing to link (load the driver, nvidia-modprobe, or check dev-root in the nvhook config)\n",
            empty.path().display()
        )
    );
    assert!(!empty.path().join("dev/char").exists());
}

/// The README's first command on a simulated node: the demo runs a container with GPUs 1 and
/// 3, each count it prints says what it counts (and the mounts agree with the hook's log),
/// whole GPUs are listed, and it ends by saying how to remove what it made.
#[test]
fn the_demo_runs_and_says_what_its_numbers_mean() {
    support::require_root();
    let work = tempfile::tempdir().expect("demo dir");
    let target = support::profile_dir()
        .parent()
        .expect("target/<profile> has a parent")
        .to_owned();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("scripts/demo.sh"))
        .env("NVHOOK_DEMO_BUILT", "1")
        .env("NVHOOK_DEMO_DIR", work.path())
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run scripts/demo.sh");
    let text = success(&out);
    let lines: Vec<&str> = text.lines().collect();
    let after = |heading: &str| -> &str {
        let i = lines
            .iter()
            .position(|l| l.starts_with(heading))
            .unwrap_or_else(|| panic!("no {heading:?} in:\n{text}"));
        lines.get(i + 1).copied().unwrap_or_default()
    };
    for gpu in 0..4 {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("GPU {gpu}: NVIDIA A100-SXM4-80GB (GPU-"))),
            "GPU {gpu} missing or cut:\n{text}"
        );
    }
    assert_eq!(
        after("-- driver libraries in /usr/lib (files of driver 550.54.15;"),
        "14",
        "{text}"
    );
    let mounted = after("-- files and sockets the hook bind-mounted read-only from the node");
    assert!(
        text.contains(&format!("mounts: {mounted} }}")),
        "the container counts {mounted} mounts, the hook's log another number:\n{text}"
    );
    assert!(text.contains("nvidia1\nnvidia3\n"), "{text}");
    // The container's own numbering is said, not left to guess.
    assert!(
        text.contains("The node's GPUs 1 and 3 are /dev/nvidia1 and /dev/nvidia3 in the container"),
        "{text}"
    );
    assert!(text.contains("GPU 0 and GPU 1"), "{text}");
    assert_eq!(
        lines.last().copied(),
        Some(
            format!(
                "The simulated node and the bundle are files under {0}: rm -rf {0} removes them.",
                work.path().display()
            )
            .as_str()
        ),
        "{text}"
    );
}

/// The README's first screen takes a newcomer from a clone to a GPU container: the
/// prerequisites, then the demo, then the test suite, in its first 60 lines, in that order.
#[test]
fn the_readme_starts_with_the_prerequisites_and_the_demo() {
    let readme = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("read README.md");
    let first: Vec<&str> = readme.lines().take(60).collect();
    let at = |line: &str| {
        first
            .iter()
            .position(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("{line:?} not in the README's first 60 lines"))
    };
    let prerequisites = at("apt-get install -y runc gcc libc6-dev binutils busybox-static python3");
    let demo = at("scripts/demo.sh");
    let suite = at("scripts/test.sh");
    assert!(
        prerequisites < demo && demo < suite,
        "{prerequisites} {demo} {suite}"
    );
}

/// No script or page names a package mirror's host: the fetches take the mirror from the
/// system's own apt sources (a proxy or a local mirror must work), and pages say "Debian's
/// mirror".
#[test]
fn no_mirror_host_is_written_in_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md"), root.join(".ci/run")];
    for dir in ["scripts", "docs", "packaging", "deploy/kubernetes"] {
        let mut stack = vec![root.join(dir)];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).expect("read a directory") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    files.push(path);
                }
            }
        }
    }
    for file in files {
        let text = fs::read(&file).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        for host in ["deb.debian.org", "ftp.debian.org", "httpredir.debian.org"] {
            assert!(!text.contains(host), "{} names {host}", file.display());
        }
    }
}

/// Every relative link in the README, SECURITY.md and docs/ leads to a file of the
/// repository: nothing points outside it (a clone has no `../shared`).
#[test]
fn the_docs_link_only_to_files_of_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md"), root.join("SECURITY.md")];
    pages.extend(
        fs::read_dir(root.join("docs"))
            .expect("docs/")
            .map(|e| e.expect("docs entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    let mut broken = Vec::new();
    for page in &pages {
        let text = fs::read_to_string(page).expect("read page");
        if text.contains("shared/") {
            broken.push(format!("{} names shared/", page.display()));
        }
        for target in text
            .split("](")
            .skip(1)
            .filter_map(|rest| rest.split(')').next())
        {
            let file = target.split('#').next().unwrap_or_default();
            if file.is_empty() || file.contains("://") || file.starts_with("mailto:") {
                continue;
            }
            let resolved = page.parent().expect("page dir").join(file);
            let inside = resolved
                .canonicalize()
                .is_ok_and(|p| p.starts_with(root.canonicalize().expect("root")));
            if !inside {
                broken.push(format!("{} links to {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}
