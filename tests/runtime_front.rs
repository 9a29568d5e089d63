//! nvhook-runtime as engines run it: a static program that hands every command straight to
//! the runtime, and only a create that may ask for a GPU to `nvhook runtime` beside it.
//! The binary is copied alone into a scratch directory, so that anything it would hand to
//! nvhook fails loudly instead.

use nvhook_runtime::server::{self as wire, Request};
use nvhook_runtime::{
    DEFAULT_RUNTIMES, Invocation, Runtimes, ServerSocket, array_strings, join_path,
    may_ask_for_gpu, runtimes_in_toml, server_socket_in_toml,
};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use nvhook_test_support as support;

fn nvhook_runtime() -> PathBuf {
    support::workspace_bin("nvhook-runtime")
}

struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    /// nvhook-runtime alone (no nvhook beside it), a runtime script that records its argv and
    /// its stdin, and a config naming that script.
    fn new() -> Scratch {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::copy(nvhook_runtime(), dir.path().join("nvhook-runtime")).expect("copy the binary");
        let script = format!(
            "#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > {out}/argv\nreadlink /proc/self/fd/0 > {out}/stdin\n",
            out = dir.path().display()
        );
        let runtime = dir.path().join("fake-runc");
        fs::write(&runtime, script).expect("write the runtime");
        fs::set_permissions(&runtime, fs::Permissions::from_mode(0o755)).expect("chmod");
        let config = format!(
            "# what nvhook-runtime execs\nlog-level = \"debug\"\nruntimes = [{:?}, {:?}]\n",
            dir.path().join("absent/runc").display().to_string(),
            runtime.display().to_string()
        );
        fs::write(dir.path().join("config.toml"), config).expect("write the config");
        Scratch { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn bundle(&self, name: &str, config_json: &str) -> PathBuf {
        let bundle = self.path(name);
        fs::create_dir_all(&bundle).expect("mkdir bundle");
        fs::write(bundle.join("config.json"), config_json).expect("write config.json");
        bundle
    }

    fn run(&self, args: &[&str], stdin: Stdio) -> Output {
        support::output_of_copied_binary(
            Command::new(self.path("nvhook-runtime"))
                .args(args)
                .env("NVHOOK_CONFIG", self.path("config.toml"))
                .stdin(stdin),
        )
    }

    /// The runtime's argv, when it ran.
    fn runtime_argv(&self) -> Vec<String> {
        let text = fs::read_to_string(self.path("argv")).unwrap_or_default();
        fs::remove_file(self.path("argv")).ok();
        text.lines().map(String::from).collect()
    }
}

#[track_caller]
fn assert_passed_through(s: &Scratch, args: &[&str]) {
    let out = s.run(args, Stdio::null());
    assert!(out.status.success(), "{args:?}: {out:?}");
    let mut want = vec![s.path("fake-runc").display().to_string()];
    want.extend(args.iter().map(|a| a.to_string()));
    assert_eq!(s.runtime_argv(), want, "{args:?}");
}

#[test]
fn every_command_but_a_gpu_create_goes_straight_to_the_runtime() {
    let s = Scratch::new();
    assert_passed_through(&s, &["start", "id"]);
    assert_passed_through(
        &s,
        &["--root", "/run/r", "--log", "/l", "delete", "-f", "id"],
    );
    assert_passed_through(&s, &["state", "id"]);
    assert_passed_through(&s, &["--version"]);
    let plain = s.bundle(
        "plain",
        r#"{"process":{"env":["PATH=/bin","NVIDIA_DRIVER_CAPABILITIES=all"]}}"#,
    );
    let plain = plain.to_str().unwrap();
    assert_passed_through(&s, &["create", "--bundle", plain, "id"]);
    assert_passed_through(&s, &["run", "-b", plain, "id"]);
    // `--root create` is a directory, `delete` the command.
    assert_passed_through(&s, &["--root", "create", "delete", "id"]);
}

#[test]
fn a_create_that_may_ask_for_a_gpu_is_handed_to_nvhook_beside_it() {
    let s = Scratch::new();
    let nvhook = s.path("nvhook");
    for (name, config_json) in [
        ("env", r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#),
        ("legacy", r#"{"process":{"env":["CUDA_VERSION=12.4"]}}"#),
        (
            "mounts",
            r#"{"mounts":[{"source":"/dev/null","destination":"/var/run/nvidia-container-devices/0"}]}"#,
        ),
        (
            "escaped",
            r#"{"process":{"env":["NVIDIA\u005fVISIBLE_DEVICES=0"]}}"#,
        ),
    ] {
        let bundle = s.bundle(name, config_json);
        let out = s.run(
            &["create", "--bundle", bundle.to_str().unwrap(), "id"],
            Stdio::null(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert_eq!(
            stderr,
            format!(
                "nvhook-runtime: {} cannot be run: install nvhook beside nvhook-runtime (errno 2)\n",
                nvhook.display()
            ),
            "{name}"
        );
        assert!(s.runtime_argv().is_empty(), "{name}: the runtime ran");
    }
    // A missing config.json is nvhook's to report, not the runtime's.
    let absent = s.path("absent");
    let out = s.run(
        &["create", "--bundle", absent.to_str().unwrap(), "id"],
        Stdio::null(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(s.runtime_argv().is_empty());
}

#[test]
fn by_default_the_hook_entry_runs_the_nvhook_beside_nvhook_runtime() {
    let s = Scratch::new();
    for bin in ["nvhook", "nvhook-nvml"] {
        fs::copy(support::workspace_bin(bin), s.path(bin)).expect("copy the binary");
    }
    // The simulated node's own config, less the hook-path it names.
    let node = support::SimNode::create(1);
    let node_config = fs::read_to_string(node.config()).expect("read the node's config");
    let mut config: String = node_config
        .lines()
        .filter(|l| !l.starts_with("hook-path") && !l.starts_with("runtimes"))
        .map(|l| format!("{l}\n"))
        .collect();
    config.push_str(&format!(
        "runtimes = [{:?}]\n",
        s.path("fake-runc").display().to_string()
    ));
    fs::write(s.path("config.toml"), config).expect("write the config");
    let bundle = s.bundle(
        "gpu",
        r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"root":{"path":"rootfs"}}"#,
    );
    fs::create_dir(bundle.join("rootfs")).expect("mkdir rootfs");

    let out = s.run(
        &["create", "--bundle", bundle.to_str().unwrap(), "id"],
        Stdio::null(),
    );
    assert!(out.status.success(), "{out:?}\n{}", node.log());
    assert_eq!(
        s.runtime_argv()[1],
        "create",
        "the runtime ran after nvhook-runtime"
    );
    let spec: serde_json::Value =
        serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        spec["hooks"]["prestart"][0]["path"],
        s.path("nvhook").display().to_string(),
        "{spec}"
    );
}

#[test]
fn a_config_it_cannot_read_with_certainty_is_handed_to_nvhook() {
    let s = Scratch::new();
    let absent = format!(
        "runtimes = [{:?}]\n",
        s.path("absent/runc").display().to_string()
    );
    for config in [
        "\"runtimes\" = [\"/bin/true\"]\n",
        "runtimes = [\n\"/bin/true\"]\n",
        absent.as_str(),
    ] {
        fs::write(s.path("config.toml"), config).unwrap();
        let out = s.run(&["start", "id"], Stdio::null());
        assert_eq!(out.status.code(), Some(1), "{config}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("cannot be run: install nvhook"),
            "{config}: {out:?}"
        );
    }
}

#[test]
fn a_closed_stdin_reaches_the_runtime_as_dev_null() {
    let s = Scratch::new();
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "exec {} start id <&-",
            s.path("nvhook-runtime").display()
        ))
        .env("NVHOOK_CONFIG", s.path("config.toml"))
        .output()
        .expect("run through sh");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        fs::read_to_string(s.path("stdin")).unwrap().trim(),
        "/dev/null"
    );
}

/// A static PIE with nothing for a loader to do: no interpreter, no libraries, and only the
/// relative relocations it applies itself (anything else would be left undone).
#[test]
fn the_binary_is_a_self_relocating_static_pie() {
    let readelf = |flag: &str| support::readelf(flag, &nvhook_runtime());
    assert!(readelf("-h").contains("DYN (Position-Independent Executable file)"));
    let segments = readelf("-l");
    assert!(!segments.contains("INTERP"), "{segments}");
    let dynamic = readelf("-d");
    assert!(!dynamic.contains("NEEDED"), "{dynamic}");
    let relocations = readelf("-r");
    let kinds: Vec<&str> = relocations
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).filter(|k| k.starts_with("R_")))
        .collect();
    let relative = if cfg!(target_arch = "aarch64") {
        "R_AARCH64_RELATIVE"
    } else {
        "R_X86_64_RELATIVE"
    };
    assert!(kinds.iter().all(|k| *k == relative), "{relocations}");
    assert!(nvhook_runtime().metadata().unwrap().len() < 1 << 20);
}

// ---------------------------------------------------------------- its decisions, on bytes

fn inv<'a>(v: &[&'a str]) -> Invocation<'a> {
    Invocation::parse(v.iter().map(|s| s.as_bytes()))
}

#[test]
fn parses_runc_command_lines() {
    let cases: &[(&[&str], Option<&str>, Option<&str>)] = &[
        (
            &[
                "--root",
                "/r",
                "--log",
                "/l",
                "--log-format",
                "json",
                "create",
                "--bundle",
                "/b",
                "id",
            ],
            Some("create"),
            Some("/b"),
        ),
        (
            &["--systemd-cgroup", "run", "-b", "/x", "id"],
            Some("run"),
            Some("/x"),
        ),
        (&["create", "--bundle=/y", "id"], Some("create"), Some("/y")),
        (&["create", "-b=/z", "id"], Some("create"), Some("/z")),
        (&["create", "id", "--bundle"], Some("create"), None),
        (&["start", "id"], Some("start"), None),
        (&["run", "id"], Some("run"), None),
        (&["--version"], None, None),
        (&[], None, None),
    ];
    for (argv, command, bundle) in cases {
        let i = inv(argv);
        assert_eq!(i.command, command.map(str::as_bytes), "{argv:?}");
        assert_eq!(i.bundle, bundle.map(str::as_bytes), "{argv:?}");
    }
    assert!(inv(&["run", "x"]).creates());
    assert!(inv(&["--root", "/r", "create", "x"]).creates());
    assert!(!inv(&["delete", "x"]).creates());
    // `--root create` is the root directory, not the command.
    assert!(!inv(&["--root", "create", "delete", "x"]).creates());
}

#[test]
fn gpu_markers() {
    assert!(!may_ask_for_gpu(b""));
    assert!(!may_ask_for_gpu(
        br#"{"process":{"env":["PATH=/bin","NVIDIA_DRIVER_CAPABILITIES=all"]}}"#
    ));
    for yes in [
        &br#"{"env":["NVIDIA_VISIBLE_DEVICES=0"]}"#[..],
        br#"{"env":["CUDA_VERSION=12.4"]}"#,
        br#"{"destination":"\/var\/run\/nvidia-container-devices\/0"}"#,
        br#"{"env":["NVIDIA\u005fVISIBLE_DEVICES=0"]}"#,
        b"CUDA_VERSION",
    ] {
        assert!(may_ask_for_gpu(yes), "{}", String::from_utf8_lossy(yes));
    }
}

fn listed(text: &str) -> Option<Vec<String>> {
    match runtimes_in_toml(text.as_bytes()) {
        Runtimes::Listed(inner) => Some(
            array_strings(inner)
                .map(|s| String::from_utf8(s.to_vec()).unwrap())
                .collect(),
        ),
        Runtimes::Default => Some(DEFAULT_RUNTIMES.iter().map(|s| s.to_string()).collect()),
        Runtimes::Unsure => None,
    }
}

#[test]
fn runtimes_key_forms() {
    let runc_crun = Some(vec!["runc".to_string(), "crun".to_string()]);
    let cases: &[(&str, Option<Vec<String>>)] = &[
        ("", runc_crun.clone()),
        (
            "# runtimes = [\"x\"]\nlog-level = \"debug\"\n",
            runc_crun.clone(),
        ),
        (
            "runtimes = [\"/opt/runc\"]\n",
            Some(vec!["/opt/runc".into()]),
        ),
        (
            "runtimes=['a', \"b\",]  # c\n",
            Some(vec!["a".into(), "b".into()]),
        ),
        ("runtimes = []\r\n", Some(vec![])),
        ("  runtimes = [ \"crun\" ]", Some(vec!["crun".into()])),
        (
            "supported-capabilities = [\n  \"compute\", # x ]\n  \"utility\",\n]\nruntimes = [\"crun\"]\n",
            Some(vec!["crun".into()]),
        ),
        (
            "hook-path = \"/a]#b\" # [\nruntimes = [\"crun\"]\n",
            Some(vec!["crun".into()]),
        ),
        ("[table]\nruntimes = [\"crun\"]\n", runc_crun.clone()),
        // What a scanner could misread is left to nvhook.
        ("\"runtimes\" = [\"crun\"]\n", None),
        ("\u{feff}runtimes = [\"crun\"]\n", None),
        ("runtimes = [\n\"crun\"]\n", None),
        ("runtimes = [\"cr\\u0075n\"]\n", None),
        ("runtimes = [\"\"\"crun\"\"\"]\n", None),
        ("runtimes = \"crun\"\n", None),
        ("runtimes.x = [\"crun\"]\n", None),
        ("runtimes = [\"crun\"] x\n", None),
        ("hook-path = \"\"\"\nruntimes = [\"crun\"]\n\"\"\"\n", None),
        ("hook-path = \"a\nruntimes = [\"crun\"]\n", None),
        ("x = ]\nruntimes = [\"crun\"]\n", None),
    ];
    for (text, want) in cases {
        assert_eq!(&listed(text), want, "{text:?}");
    }
}

#[test]
fn joins_path_entries() {
    let mut buf = [0u8; 16];
    assert_eq!(
        join_path(&mut buf, b"/bin", b"runc"),
        Some(&b"/bin/runc\0"[..])
    );
    assert_eq!(join_path(&mut buf, b"", b"runc"), Some(&b"runc\0"[..]));
    assert_eq!(join_path(&mut buf, b"/a-long-dir", b"runc"), None);
    assert_eq!(join_path(&mut buf, b"/bin", b"ru\0nc"), None);
}

#[test]
fn runtime_server_key_forms() {
    let cases: &[(&str, ServerSocket)] = &[
        ("", ServerSocket::Default),
        ("runtimes = [\"runc\"]\n", ServerSocket::Default),
        (
            "runtime-server = \"/run/x.sock\"\n",
            ServerSocket::Named(b"/run/x.sock"),
        ),
        (
            "runtimes = [\"runc\"]\nruntime-server='/s' # the socket\r\n",
            ServerSocket::Named(b"/s"),
        ),
        ("runtime-server = \"\"\n", ServerSocket::Named(b"")),
        // A key of a table is not the top-level one.
        ("[x]\nruntime-server = \"/s\"\n", ServerSocket::Default),
        // The key's prefix is another key.
        ("runtime-server-x = \"/s\"\n", ServerSocket::Default),
        // What a scanner could misread is left to nvhook.
        ("runtime-server = \"/r\\u0073\"\n", ServerSocket::Unsure),
        ("runtime-server = \"\"\"/s\"\"\"\n", ServerSocket::Unsure),
        ("runtime-server = [\"/s\"]\n", ServerSocket::Unsure),
        ("runtime-server = \"/s\" x\n", ServerSocket::Unsure),
        ("\"runtime-server\" = \"/s\"\n", ServerSocket::Unsure),
        (
            "hook-path = \"\"\"\nruntime-server = \"/s\"\n\"\"\"\n",
            ServerSocket::Unsure,
        ),
    ];
    for (text, want) in cases {
        assert_eq!(&server_socket_in_toml(text.as_bytes()), want, "{text:?}");
    }
    // The shipped config's line is read as nvhook reads it.
    let shipped = include_str!("../config/config.toml");
    assert_eq!(
        server_socket_in_toml(shipped.as_bytes()),
        ServerSocket::Named(wire::DEFAULT_SOCKET.as_bytes())
    );
}

#[test]
fn a_request_reads_back_as_written() {
    let args: [&[u8]; 4] = [b"--root", b"/run/r", b"create", b"id"];
    let mut buf = [0u8; 256];
    for config in [None, Some(&b"/etc/n.toml"[..]), Some(&b""[..])] {
        let msg = Request::encode(&mut buf, b"/usr/bin/nvhook", config, args).unwrap();
        let request = Request::decode(msg).unwrap();
        assert_eq!(request.nvhook, b"/usr/bin/nvhook");
        assert_eq!(request.config, config);
        assert_eq!(request.args().collect::<Vec<_>>(), args);
    }
    let msg = Request::encode(&mut buf, b"/n", None, []).unwrap();
    assert_eq!(Request::decode(msg).unwrap().args().count(), 0);
    // Too long for the buffer, or a NUL in a string: not sent (nvhook prepares the create).
    assert!(Request::encode(&mut [0u8; 16], b"/usr/bin/nvhook", None, args).is_none());
    assert!(Request::encode(&mut buf, b"/n\0x", None, args).is_none());
    assert!(Request::encode(&mut buf, b"/n", None, [&b"a\0b"[..]]).is_none());
    // Another version, or a message cut short, is not read.
    let msg = Request::encode(&mut buf, b"/n", Some(b"/c"), args)
        .unwrap()
        .to_vec();
    assert!(Request::decode(&msg[..msg.len() - 1]).is_none());
    assert!(Request::decode(&msg[1..]).is_none());
    let mut other = msg.clone();
    let version = other.iter().position(|&c| c == 0).unwrap() - 1;
    other[version] = b'2';
    assert!(Request::decode(&other).is_none());
}
