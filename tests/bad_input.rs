//! Malformed input to the real binaries: `nvhook hook prestart` (state on stdin, the
//! bundle's config.json, nvhook's config file), `nvhook plan`, `nvhook-runtime create` and
//! `nvhook configure`, and nvhook under NVIDIA's names. Each must exit 1 with exactly one
//! short line on stderr that starts with the binary's prefix and names the cause: never a
//! panic, never a backtrace, and for `configure`, never a half-written engine config.
//!
//! Tests are built without `panic = "abort"` (that is the release profile only), so a
//! panic here would print "panicked at" and exit 101: both are checked for.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tempfile::TempDir;

use nvhook_test_support as support;

const NVHOOK: &str = env!("CARGO_BIN_EXE_nvhook");
fn nvhook_runtime() -> String {
    support::workspace_bin("nvhook-runtime")
        .to_str()
        .expect("a UTF-8 target directory")
        .to_owned()
}

/// Longer than any message nvhook writes for these inputs, short enough to read.
const MAX_LINE: usize = 400;

/// Scratch space: nvhook configs and bundles, each made on demand.
struct Scratch {
    dir: TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.path(name);
        fs::write(&path, bytes).expect("write scratch file");
        path
    }

    /// A valid nvhook config whose roots do not exist: every case here fails before they
    /// would be read.
    fn config(&self) -> PathBuf {
        let text = format!(
            "driver-root = {:?}\nruntimes = [\"/bin/false\"]\n",
            self.path("absent/driver").display().to_string()
        );
        self.file("nvhook.toml", text.as_bytes())
    }

    /// A bundle directory whose config.json holds `config_json`, with an empty rootfs.
    fn bundle(&self, name: &str, config_json: &[u8]) -> PathBuf {
        let dir = self.path(name);
        fs::create_dir_all(dir.join("rootfs")).expect("mkdir bundle");
        fs::write(dir.join("config.json"), config_json).expect("write config.json");
        dir
    }

    /// A bundle whose container has `env`.
    fn env_bundle(&self, name: &str, env: &[&str]) -> PathBuf {
        let spec = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "env": env},
            "root": {"path": "rootfs"},
        });
        self.bundle(name, spec.to_string().as_bytes())
    }
}

fn state(bundle: &Path, pid: Option<u32>) -> Vec<u8> {
    let mut state = serde_json::json!({
        "ociVersion": "1.0.2", "id": "bad-input", "status": "creating", "bundle": bundle,
    });
    if let Some(pid) = pid {
        state["pid"] = pid.into();
    }
    state.to_string().into_bytes()
}

fn run(program: &str, args: &[&str], env: &[(&str, &Path)], stdin: &[u8]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_remove("NVHOOK_CONFIG")
        // A panic would show its backtrace: there must be none to show.
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        cmd.env(key, value);
    }
    let mut child = cmd.spawn().expect("spawn the binary under test");
    // The binary may exit before reading all of it (e.g. on a bad config): that is fine.
    let _ = child.stdin.take().expect("stdin").write_all(stdin);
    child.wait_with_output().expect("wait for the binary")
}

/// Exit status 1, and stderr is one short line `<prefix>: ...` containing `needle`.
#[track_caller]
fn assert_one_line(case: &str, out: &Output, prefix: &str, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = format!("{case}: exit {:?}, stderr {stderr:?}", out.status.code());
    assert!(!stderr.contains("panicked"), "{context}");
    assert!(!stderr.contains("backtrace"), "{context}");
    assert_eq!(out.status.code(), Some(1), "{context}");
    assert!(out.stdout.is_empty(), "{context}: stdout {:?}", out.stdout);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{context}");
    let line = lines[0];
    assert!(line.starts_with(&format!("{prefix}: ")), "{context}");
    assert!(line.len() <= MAX_LINE, "{context}: {} chars", line.len());
    assert!(line.contains(needle), "{context}: no {needle:?}");
}

/// `nvhook --config CONFIG hook prestart` with `stdin`.
fn hook(config: &Path, stdin: &[u8]) -> Output {
    let config = config.to_str().expect("utf-8 path");
    run(
        NVHOOK,
        &["--config", config, "hook", "prestart"],
        &[],
        stdin,
    )
}

#[test]
fn malformed_state_on_stdin() {
    let s = Scratch::new();
    let config = s.config();
    let mut huge = vec![b' '; 2 << 20];
    huge.extend_from_slice(b"{\"bundle\": \"/b\"}");
    let cases: [(&str, &[u8], &str); 11] = [
        (
            "empty",
            b"",
            "cannot parse the OCI state on stdin: not a JSON object",
        ),
        (
            "not JSON",
            b"not json",
            "cannot parse the OCI state on stdin",
        ),
        (
            "an array",
            br#"["c", 1, "/b"]"#,
            "cannot parse the OCI state on stdin: not a JSON object",
        ),
        ("no bundle", b"{}", "missing field `bundle`"),
        (
            "relative bundle",
            br#"{"bundle":"b"}"#,
            "is not an absolute path",
        ),
        ("bundle a number", br#"{"bundle":7}"#, "invalid type"),
        (
            "pid a string",
            br#"{"bundle":"/b","pid":"1"}"#,
            "invalid type",
        ),
        (
            "pid too large",
            br#"{"bundle":"/b","pid":99999999999}"#,
            "invalid value",
        ),
        ("truncated", br#"{"bundle":"/tm"#, "EOF while parsing"),
        (
            "invalid UTF-8",
            b"{\"bundle\":\"/\xff\"}",
            "cannot read the OCI state on stdin",
        ),
        (
            "over 1 MiB",
            &huge,
            "the OCI state on stdin is larger than 1048576 bytes",
        ),
    ];
    for (case, stdin, needle) in cases {
        assert_one_line(case, &hook(&config, stdin), "nvhook", needle);
    }
}

#[test]
fn missing_or_malformed_bundle() {
    let s = Scratch::new();
    let config = s.config();
    let no_config_json = s.path("empty-bundle");
    fs::create_dir(&no_config_json).unwrap();
    let dir_config_json = s.path("dir-bundle");
    fs::create_dir_all(dir_config_json.join("config.json")).unwrap();
    let gpu = r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"root":{"path":"rootfs"}}"#;
    let cases: Vec<(&str, PathBuf, Option<u32>, &str)> = vec![
        (
            "missing bundle",
            s.path("absent"),
            Some(1),
            "absent/config.json: No such file",
        ),
        (
            "no config.json",
            no_config_json,
            Some(1),
            "config.json: No such file",
        ),
        (
            "a bundle path with a newline and an escape in it",
            s.path("a\nb\u{1b}[2J"),
            Some(1),
            "a\\nb\\u{1b}[2J/config.json: No such file",
        ),
        (
            "config.json a directory",
            dir_config_json,
            Some(1),
            "Is a directory",
        ),
        (
            "empty config.json",
            s.bundle("b1", b""),
            Some(1),
            "bad OCI spec",
        ),
        (
            "config.json not JSON",
            s.bundle("b2", b"{oops"),
            Some(1),
            "bad OCI spec",
        ),
        (
            "config.json an array",
            s.bundle("b3", b"[]"),
            Some(1),
            "not a JSON object",
        ),
        (
            "env a string",
            s.bundle("b4", br#"{"process":{"env":"NVIDIA_VISIBLE_DEVICES=0"}}"#),
            Some(1),
            "invalid type",
        ),
        (
            "env of numbers",
            s.bundle("b5", br#"{"process":{"env":[1]}}"#),
            Some(1),
            "invalid type",
        ),
        (
            "mounts an object",
            s.bundle("b6", br#"{"mounts":{}}"#),
            Some(1),
            "invalid type",
        ),
        (
            "mount without destination",
            s.bundle("b7", br#"{"mounts":[{"source":"/dev/null"}]}"#),
            Some(1),
            "missing field `destination`",
        ),
        (
            "invalid UTF-8",
            s.bundle("b8", b"{\"process\":{\"env\":[\"\xff\"]}}"),
            Some(1),
            "stream did not contain valid UTF-8",
        ),
        (
            "GPU request without pid",
            s.bundle("b9", gpu.as_bytes()),
            None,
            "the OCI state has no pid",
        ),
        (
            "GPU request without root",
            s.bundle(
                "b10",
                br#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#,
            ),
            Some(1),
            "no root.path",
        ),
    ];
    for (case, bundle, pid, needle) in &cases {
        let out = hook(&config, &state(bundle, *pid));
        assert_one_line(case, &out, "nvhook", needle);
        let bundle = bundle.to_str().unwrap();
        let out = run(
            NVHOOK,
            &[
                "--config",
                config.to_str().unwrap(),
                "plan",
                "--bundle",
                bundle,
            ],
            &[],
            b"",
        );
        if *pid == Some(1) {
            assert_one_line(&format!("plan: {case}"), &out, "nvhook", needle);
        }
    }
}

/// NVIDIA_* values with control characters and junk: refused on one line, the value
/// escaped, before any host state is looked at.
#[test]
fn malformed_nvidia_variables() {
    let s = Scratch::new();
    let config = s.config();
    let cases: [(&[&str], &str); 6] = [
        (
            &["NVIDIA_VISIBLE_DEVICES=GPU-\n\u{1b}[31mred"],
            "NVIDIA_VISIBLE_DEVICES=GPU-\\n\\u{1b}[31mred",
        ),
        (
            &["NVIDIA_VISIBLE_DEVICES=0,,x\r"],
            "NVIDIA_VISIBLE_DEVICES=0,,x\\r",
        ),
        (
            &[
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_DRIVER_CAPABILITIES=compute\nutility",
            ],
            "NVIDIA_DRIVER_CAPABILITIES=compute\\nutility",
        ),
        (
            &[
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_REQUIRE_CUDA=cuda>>=12\u{7f}",
            ],
            "NVIDIA_REQUIRE_CUDA: condition \"cuda>>=12\\u{7f}\"",
        ),
        (
            &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_X=\u{0}>=1"],
            "NVIDIA_REQUIRE_X: condition \"\\0>=1\"",
        ),
        (&["CUDA_VERSION=twelve\n"], "CUDA_VERSION=twelve\\n"),
    ];
    for (i, (env, needle)) in cases.iter().enumerate() {
        let bundle = s.env_bundle(&format!("v{i}"), env);
        let out = hook(&config, &state(&bundle, Some(1)));
        assert_one_line(&format!("{env:?}"), &out, "nvhook", needle);
    }
}

/// A 100,000-byte value wherever the request reads one (each variable, a variable's name,
/// the device plugin's mounts, the rootfs propagation): refused on one line of at most 400
/// characters that shows the value's start and its length, by the hook and by nvhook-runtime.
#[test]
fn huge_container_values_are_cut_in_the_one_line() {
    const HUGE: usize = 100_000;
    let s = Scratch::new();
    let config = s.config();
    let x = "x".repeat(HUGE);
    let cut = format!("{}… ({HUGE} bytes)", "x".repeat(64));
    let gpu = "NVIDIA_VISIBLE_DEVICES=0".to_string();
    let require_name = format!("NVIDIA_REQUIRE_{x}");
    let mut cases: Vec<(String, serde_json::Value, String)> = vec![
        (
            "NVIDIA_VISIBLE_DEVICES".into(),
            serde_json::json!({"env": [format!("NVIDIA_VISIBLE_DEVICES={x}")]}),
            format!("NVIDIA_VISIBLE_DEVICES={cut}: unknown device \"{cut}\" (use an index"),
        ),
        (
            "NVIDIA_DRIVER_CAPABILITIES".into(),
            serde_json::json!({"env": [gpu, format!("NVIDIA_DRIVER_CAPABILITIES={x}")]}),
            format!("NVIDIA_DRIVER_CAPABILITIES={cut}: unknown driver capability \"{cut}\""),
        ),
        (
            "NVIDIA_IMEX_CHANNELS".into(),
            serde_json::json!({"env": [gpu, format!("NVIDIA_IMEX_CHANNELS={x}")]}),
            format!("NVIDIA_IMEX_CHANNELS={cut}: \"{cut}\" is not an IMEX channel number"),
        ),
        (
            "NVIDIA_MIG_CONFIG_DEVICES".into(),
            serde_json::json!({"env": [gpu, format!("NVIDIA_MIG_CONFIG_DEVICES={x}")]}),
            format!("NVIDIA_MIG_CONFIG_DEVICES={cut}: only a privileged container"),
        ),
        (
            "NVIDIA_MIG_MONITOR_DEVICES".into(),
            serde_json::json!({"env": [gpu, format!("NVIDIA_MIG_MONITOR_DEVICES={x}")]}),
            format!("NVIDIA_MIG_MONITOR_DEVICES={cut}: only a privileged container"),
        ),
        (
            "NVIDIA_REQUIRE_CUDA".into(),
            serde_json::json!({"env": [gpu, format!("NVIDIA_REQUIRE_CUDA={x}")]}),
            format!("NVIDIA_REQUIRE_CUDA: condition \"{cut}\" has no operator"),
        ),
        (
            // Three values from the container: the name, the condition and its version.
            "NVIDIA_REQUIRE_ name".into(),
            serde_json::json!({"env": [gpu, format!("{require_name}=cuda>=1.{x}")]}),
            format!(
                "NVIDIA_REQUIRE_{}… ({} bytes): condition \"cuda>=1.",
                "x".repeat(64 - 15),
                require_name.len()
            ),
        ),
        (
            "CUDA_VERSION".into(),
            serde_json::json!({"env": [format!("CUDA_VERSION={x}")]}),
            format!("CUDA_VERSION={cut}: not a version"),
        ),
        (
            "device mount".into(),
            serde_json::json!({"mounts": [{
                "source": "/dev/null",
                "destination": format!("/var/run/nvidia-container-devices/{x}"),
            }]}),
            format!(
                "volume mount /var/run/nvidia-container-devices/{cut}: unknown device \"{cut}\""
            ),
        ),
        (
            "IMEX mount".into(),
            serde_json::json!({"env": [gpu], "mounts": [{
                "source": "/dev/null",
                "destination": format!("/var/run/nvidia-container-devices/imex/{x}"),
            }]}),
            format!(
                "volume mount /var/run/nvidia-container-devices/imex/: \"{cut}\" is not an IMEX channel number"
            ),
        ),
        (
            "rootfsPropagation".into(),
            serde_json::json!({"env": [gpu], "propagation": format!("shared{x}")}),
            format!(
                "linux.rootfsPropagation is \"shared{}… ({} bytes)\"",
                "x".repeat(64 - 6),
                HUGE + 6
            ),
        ),
    ];
    for family in [
        "NVIDIA_NVSWITCH",
        "NVIDIA_GDS",
        "NVIDIA_MOFED",
        "NVIDIA_GDRCOPY",
    ] {
        cases.push((
            family.into(),
            serde_json::json!({"env": [gpu, format!("{family}={x}")]}),
            format!("{family}={cut}: use enabled or disabled"),
        ));
    }
    for (i, (case, container, needle)) in cases.iter().enumerate() {
        let or_none = |key: &str| container.get(key).cloned().unwrap_or(serde_json::json!([]));
        let spec = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "env": or_none("env")},
            "root": {"path": "rootfs"},
            "mounts": or_none("mounts"),
            "linux": {"rootfsPropagation": container.get("propagation")},
        });
        let bundle = s.bundle(&format!("huge{i}"), spec.to_string().as_bytes());
        assert_one_line(
            case,
            &hook(&config, &state(&bundle, Some(1))),
            "nvhook",
            needle,
        );
        // nvhook-runtime refuses a request as the hook does; propagation is the hook's alone.
        if container.get("propagation").is_none() {
            let args = ["create", "--bundle", bundle.to_str().unwrap(), "id"];
            let out = run(&nvhook_runtime(), &args, &[("NVHOOK_CONFIG", &config)], b"");
            assert_one_line(&format!("runtime: {case}"), &out, "nvhook-runtime", needle);
        }
    }
}

/// A program, its arguments, the config it is given, its stdin, what its line must name.
type NamedRun<'a> = (&'a str, &'a [&'a str], &'a Path, &'a [u8], &'a str);

/// nvhook run under NVIDIA's names with command lines it does not serve, and with bad input
/// to the ones it does: one line that names who answered, exit 2 for a command line it
/// refuses, 1 for input it cannot act on.
#[test]
fn nvidia_names_with_bad_arguments() {
    let s = Scratch::new();
    let link = |name: &str| {
        let path = s.path(name);
        std::os::unix::fs::symlink(NVHOOK, &path).expect("link an NVIDIA name");
        path.to_str().expect("utf-8 path").to_owned()
    };
    let (hook_name, cli_name) = (
        link("nvidia-container-runtime-hook"),
        link("nvidia-container-cli"),
    );
    let config = s.config();
    let env = [("NVHOOK_CONFIG", config.as_path())];
    let hook_prefix = "nvhook (as nvidia-container-runtime-hook)";
    let cli_prefix = "nvhook (as nvidia-container-cli)";
    // As NVIDIA's programs: the runtime hook (Go's flag package) exits 2 with its usage after
    // the error line, nvidia-container-cli (argp) exits 1.
    let refused = |case: &str, out: &Output, prefix: &str, needle: &str| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let (first, rest) = stderr.split_once('\n').unwrap_or((&stderr, ""));
        if prefix == hook_prefix {
            assert_eq!(out.status.code(), Some(2), "{case}: {stderr:?}");
            assert!(
                rest.starts_with("Usage of nvidia-container-runtime-hook:"),
                "{case}: {stderr:?}"
            );
        } else {
            assert_eq!(out.status.code(), Some(1), "{case}: {stderr:?}");
            assert!(rest.is_empty(), "{case}: {stderr:?}");
        }
        assert!(
            first.starts_with(&format!("{prefix}: ")),
            "{case}: {stderr:?}"
        );
        assert!(first.contains(needle), "{case}: {stderr:?}");
    };
    let refusals: [(&str, &[&str], &str); 5] = [
        (&hook_name, &[], "no command"),
        (&hook_name, &["create"], "unknown command create"),
        (
            &hook_name,
            &["-v", "prestart"],
            "flag provided but not defined: -v",
        ),
        (
            &cli_name,
            &["configure", "--bogus", "--pid=1", "/r"],
            "configure option --bogus",
        ),
        (&cli_name, &[], "no command"),
    ];
    for (program, args, needle) in refusals {
        let prefix = if program == hook_name {
            hook_prefix
        } else {
            cli_prefix
        };
        refused(needle, &run(program, args, &env, b""), prefix, needle);
    }
    let absent = s.path("absent.toml");
    let failures: [NamedRun; 4] = [
        (
            &hook_name,
            &["prestart"],
            &config,
            b"[1]",
            "cannot parse the OCI state",
        ),
        (
            &hook_name,
            &["prestart"],
            &absent,
            b"{}",
            "cannot read config",
        ),
        (
            &cli_name,
            &["configure", "--device=0,\u{1}junk", "--pid=1", "/r"],
            &config,
            b"",
            "--device=0,",
        ),
        (
            &cli_name,
            &["configure", "--device=0", "--pid=2147483646", "/r"],
            &config,
            b"",
            "is the container still running?",
        ),
    ];
    for (program, args, config, stdin, needle) in failures {
        let prefix = if program == hook_name {
            hook_prefix
        } else {
            cli_prefix
        };
        let out = run(program, args, &[("NVHOOK_CONFIG", config)], stdin);
        assert_one_line(needle, &out, prefix, needle);
    }
}

/// A log file the hook may not open (a rootless engine runs a CDI spec's hook as an
/// unprivileged user): the error first, once, not once per sink (Podman shows only a failing
/// hook's first stderr line), then one warning that says where the log went.
#[test]
fn createcontainer_hook_with_a_log_file_it_cannot_open() {
    let s = Scratch::new();
    let config = s.file(
        "log.toml",
        format!("log-file = \"{}\"\n", s.path("absent/nvhook.log").display()).as_bytes(),
    );
    let args = [
        "--config",
        config.to_str().unwrap(),
        "hook",
        "createContainer",
    ];
    let out = run(NVHOOK, &args, &[], &state(&s.path("absent"), Some(1)));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].starts_with("nvhook: ") && lines[0].contains("absent/config.json"),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with("nvhook: warning: cannot open log file")
            && lines[1].contains("absent/nvhook.log"),
        "{stderr}"
    );
}

#[test]
fn bad_nvhook_config_file() {
    let s = Scratch::new();
    let bundle = s.env_bundle("b", &["NVIDIA_VISIBLE_DEVICES=0"]);
    let cases: [(&str, PathBuf, &str); 8] = [
        ("missing", s.path("absent.toml"), "cannot read config"),
        (
            "a directory",
            s.dir.path().to_path_buf(),
            "cannot read config",
        ),
        ("not TOML", s.file("c1.toml", b"driver-root = \n"), "line 1"),
        (
            "unknown key",
            s.file("c2.toml", b"log-level = \"info\"\nteleport = 1\n"),
            "line 2: unknown field `teleport`",
        ),
        (
            "wrong type",
            s.file("c3.toml", b"accept-volume-mount-devices = \"yes\""),
            "line 1",
        ),
        (
            "nvml-timeout-ms 0",
            s.file("c4.toml", b"nvml-timeout-ms = 0"),
            "nvml-timeout-ms = 0 must be between 1 and 25000",
        ),
        (
            "invalid UTF-8",
            s.file("c5.toml", b"driver-root = \"\xff\""),
            "stream did not contain valid UTF-8",
        ),
        (
            "relative root",
            s.file("c6.toml", b"dev-root = \"dev\""),
            "dev-root \"dev\" must be an absolute path",
        ),
    ];
    for (case, config, needle) in &cases {
        let out = hook(config, &state(&bundle, Some(1)));
        assert_one_line(case, &out, "nvhook", needle);
        let args = [
            "--config",
            config.to_str().unwrap(),
            "plan",
            "--bundle",
            bundle.to_str().unwrap(),
        ];
        assert_one_line(
            &format!("plan: {case}"),
            &run(NVHOOK, &args, &[], b""),
            "nvhook",
            needle,
        );
        let args = ["create", "--bundle", bundle.to_str().unwrap(), "id"];
        let out = run(&nvhook_runtime(), &args, &[("NVHOOK_CONFIG", config)], b"");
        assert_one_line(&format!("runtime: {case}"), &out, "nvhook-runtime", needle);
    }
}

#[test]
fn nvhook_runtime_with_bad_bundles() {
    let s = Scratch::new();
    let runc_config = s.file("runc.toml", b"");
    // A runtime that is nowhere: a path in the scratch directory that nothing made.
    let absent_runc = s.path("absent/runc").display().to_string();
    let no_runtime = s.file(
        "none.toml",
        format!("runtimes = [{absent_runc:?}]\n").as_bytes(),
    );
    let no_runtime_line = format!("none of the runtimes [{absent_runc:?}] is installed");
    let cases: [(&str, &Path, PathBuf, &str); 4] = [
        (
            "missing bundle",
            &runc_config,
            s.path("absent"),
            "cannot read",
        ),
        (
            "config.json not JSON",
            &runc_config,
            s.bundle("b1", b"{oops NVIDIA_VISIBLE_DEVICES"),
            "bad OCI spec",
        ),
        (
            "config.json env a string",
            &runc_config,
            s.bundle("b2", br#"{"process":{"env":"NVIDIA_VISIBLE_DEVICES=0"}}"#),
            "invalid type",
        ),
        (
            "no runtime installed",
            &no_runtime,
            s.env_bundle("b3", &[]),
            &no_runtime_line,
        ),
    ];
    for (case, config_file, bundle, needle) in &cases {
        let args = ["create", "--bundle", bundle.to_str().unwrap(), "id"];
        let out = run(
            &nvhook_runtime(),
            &args,
            &[("NVHOOK_CONFIG", config_file)],
            b"",
        );
        assert_one_line(case, &out, "nvhook-runtime", needle);
    }
    // A config.json that cannot ask for a GPU is the runtime's alone, broken or not: runc
    // reports it, and nvhook never parses it.
    let bundle = s.bundle("b4", b"{oops");
    let args = ["create", "--bundle", bundle.to_str().unwrap(), "id"];
    let out = run(
        &nvhook_runtime(),
        &args,
        &[("NVHOOK_CONFIG", &runc_config)],
        b"",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("runc create failed")
            && !stderr.contains("nvhook"),
        "{stderr}"
    );
}

/// A malformed engine config is refused and left byte for byte as it was, with no backup
/// or temporary file beside it.
#[test]
fn configure_refuses_malformed_engine_configs() {
    let s = Scratch::new();
    let cases: [(&str, &str, &[u8], &str); 10] = [
        ("docker", "daemon.json", b"{", "not valid JSON"),
        (
            "docker",
            "daemon.json",
            b"[]",
            "not a JSON object at the top level",
        ),
        (
            "docker",
            "daemon.json",
            br#"{"runtimes": 1}"#,
            "`runtimes` is not an object",
        ),
        (
            "docker",
            "daemon.json",
            b"{\"a\": \"\xff\"}",
            "stream did not contain valid UTF-8",
        ),
        ("containerd", "config.toml", b"a = = 1\n", "not valid TOML"),
        ("containerd", "config.toml", b"version = 5\n", "version"),
        (
            "containerd",
            "config.toml",
            b"version = 2\nplugins = 1\n",
            "is not a table",
        ),
        ("containerd", "config.toml", b"version = \"2\"\n", "version"),
        (
            "crio",
            "99-nvidia.conf",
            b"[crio.runtime\n",
            "not valid TOML",
        ),
        (
            "crio",
            "99-nvidia.conf",
            b"[crio]\nruntime = 3\n",
            "is not a table",
        ),
    ];
    for (i, (engine, name, text, needle)) in cases.iter().enumerate() {
        let dir = s.path(&format!("engine{i}"));
        fs::create_dir(&dir).unwrap();
        let file = dir.join(name);
        fs::write(&file, text).unwrap();
        let args = [
            "configure",
            engine,
            "--engine-config",
            file.to_str().unwrap(),
        ];
        let case = format!("{engine} {:?}", String::from_utf8_lossy(text));
        assert_one_line(&case, &run(NVHOOK, &args, &[], b""), "nvhook", needle);
        assert_eq!(fs::read(&file).unwrap(), *text, "{case}: file changed");
        let entries: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(entries.len(), 1, "{case}: {entries:?}");
    }
    let dir = s.path("engine-dir");
    fs::create_dir(&dir).unwrap();
    let args = [
        "configure",
        "docker",
        "--engine-config",
        dir.to_str().unwrap(),
    ];
    assert_one_line(
        "a directory",
        &run(NVHOOK, &args, &[], b""),
        "nvhook",
        "Is a directory",
    );
    let file = s.path("daemon.json");
    let args = [
        "configure",
        "docker",
        "--engine-config",
        file.to_str().unwrap(),
        "--runtime-path",
        "nvhook-runtime",
    ];
    // A usage error: exit 2, the README's status for those, and otherwise the same one line.
    let out = run(NVHOOK, &args, &[], b"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("nvhook: ") && stderr.contains("is not absolute"));
    assert!(!file.exists());
}
