//! nvhook under NVIDIA's names, held to what NVIDIA's programs do with the same input
//! (issue 35): the hooks of NVIDIA's CDI specs (`nvidia-cdi-hook`), `nvidia-container-cli` and
//! `nvidia-container-runtime-hook`, run as engines, NVIDIA's runtime and scripts run them.
//! Where NVIDIA's behaviour writes on the host, nvhook refuses instead, and the host keeps
//! nothing: those runs happen in a private mount namespace with overlays over the host's
//! `/etc` and `/usr/lib`, whose upper layers must stay empty. Run as root.

use nvhook_test_support as support;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use support::{SimNode, nvhook_bin, require_program, require_root};

/// Runs `program args` in a private mount namespace (its scratch directory in `scratch`) whose `/etc` and `/usr/lib` are overlays
/// of the host's, `stdin` on its stdin with `@PID@` replaced by a pid in that namespace. The
/// output's stdout lists what the run wrote there (one path a line, relative to the upper
/// layer), after a line `exit=N` with the program's exit status; stderr is the program's.
fn run_guarded(scratch: &Path, program: &Path, args: &[&str], stdin: &str) -> Output {
    const SCRIPT: &str = r#"set -e
upper=$(mktemp -d -p "$GUARD_SCRATCH")
mount -t tmpfs guard "$upper"
for dir in /etc /usr/lib; do
  name=$(echo "$dir" | tr / _)
  mkdir "$upper/u$name" "$upper/w$name"
  mount -t overlay guard -o "lowerdir=$dir,upperdir=$upper/u$name,workdir=$upper/w$name" "$dir"
done
set +e
sed "s/@PID@/$$/" | "$@"
echo "exit=$?"
cd "$upper" && find u_etc u_usr_lib -mindepth 1
"#;
    let mut child = Command::new(require_program("unshare"))
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            SCRIPT,
            "sh",
        ])
        .arg(program)
        .args(args)
        .env_remove("NVHOOK_CONFIG")
        .env("GUARD_SCRATCH", scratch)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn unshare");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write the state");
    child.wait_with_output().expect("wait for unshare")
}

/// A bundle directory whose config.json asks for GPU 0 with `root.path` = `root`.
fn bundle_with_root(dir: &Path, root: &str) -> PathBuf {
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["true"], "cwd": "/", "env": ["NVIDIA_VISIBLE_DEVICES=0"]},
        "root": {"path": root},
        "mounts": [],
    });
    fs::write(dir.join("config.json"), spec.to_string()).expect("write config.json");
    dir.to_path_buf()
}

fn state(bundle: &Path) -> String {
    format!(
        r#"{{"ociVersion":"1.0.2","id":"host-root","status":"creating","pid":@PID@,"bundle":"{}"}}"#,
        bundle.display()
    )
}

/// The program's exit status and stderr, and what it wrote under the guard.
fn outcome(out: &Output) -> (Option<i32>, String, Vec<String>) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let exit = lines
        .next()
        .and_then(|l| l.strip_prefix("exit="))
        .and_then(|n| n.parse().ok());
    let written = lines.map(String::from).collect();
    (
        exit,
        String::from_utf8_lossy(&out.stderr).into_owned(),
        written,
    )
}

/// A bundle whose `root.path` is the host's `/` (or a path that resolves to it): every hook that
/// writes in a rootfs refuses it in one line, and the host's files are untouched. NVIDIA's
/// `update-ldcache` and `create-symlinks` rewrote the host's loader cache and made links in its
/// library directory with such a bundle.
#[test]
fn a_bundle_whose_root_is_the_hosts_is_refused_by_every_hook() {
    require_root();
    let node = SimNode::create(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).expect("mkdir bin");
    support::link_to_nvhook(&bin, &["nvidia-cdi-hook"]);
    let cdi_hook = bin.join("nvidia-cdi-hook");
    let config = node.config();
    let config = config.to_str().expect("utf-8");
    let libdir = "/usr/lib/x86_64-linux-gnu";
    let runs: [(&Path, Vec<&str>); 5] = [
        (&cdi_hook, vec!["update-ldcache", "--folder", libdir]),
        (
            &cdi_hook,
            vec![
                "create-symlinks",
                "--link",
                "libnvhook-probe.so.1::/usr/lib/x86_64-linux-gnu/libnvhook-probe.so",
            ],
        ),
        (
            &cdi_hook,
            vec!["create-soname-symlinks", "--folder", libdir],
        ),
        (
            nvhook_bin(),
            vec![
                "--config",
                config,
                "hook",
                "createContainer",
                "--link",
                "/usr/lib/x86_64-linux-gnu/libnvhook-probe.so=libc.so.6",
            ],
        ),
        (nvhook_bin(), vec!["--config", config, "hook", "prestart"]),
    ];
    for root in ["/", "../../../../../../../../../.."] {
        let bundle = bundle_with_root(dir.path(), root);
        for (program, args) in &runs {
            let case = format!("root.path {root}: {} {args:?}", program.display());
            let out = run_guarded(dir.path(), program, args, &state(&bundle));
            let (exit, stderr, written) = outcome(&out);
            assert_eq!(exit, Some(1), "{case}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{case}: {stderr}");
            assert!(
                stderr.contains("is the host's own root directory: nvhook writes nothing there"),
                "{case}: {stderr}"
            );
            assert!(written.is_empty(), "{case}: wrote on the host: {written:?}");
        }
    }
}

/// `nvidia-container-cli configure` for a process that is not a container's, or a rootfs that
/// is not its root mount, is refused before anything is written: NVIDIA's made 24 bind mounts
/// in the host's mount namespace and 0666 device nodes in a host directory.
#[test]
fn configure_refuses_a_host_process_and_a_host_directory() {
    require_root();
    let node = SimNode::create(2);
    let dir = tempfile::tempdir().expect("tempdir");
    support::link_to_nvhook(dir.path(), &["nvidia-container-cli"]);
    let cli = dir.path().join("nvidia-container-cli");
    let target = dir.path().join("target");
    fs::create_dir(&target).expect("mkdir target");
    let target_arg = target.to_str().expect("utf-8");
    // A host process: the test's own child, in the host's mount namespace.
    let mut host_process = Command::new("sleep").arg("60").spawn().expect("sleep");
    // A process in a mount namespace of its own, with nothing mounted at the target.
    let mut own_ns = Command::new(require_program("unshare"))
        .args(["--mount", "--propagation", "private", "sleep", "60"])
        .spawn()
        .expect("unshare sleep");
    // unshare execs sleep in the new namespace: wait until its namespace is not ours.
    let ours = fs::read_link("/proc/self/ns/mnt").expect("our mount ns");
    let ns_of = |pid: u32| fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    for _ in 0..200 {
        if ns_of(own_ns.id()).is_some_and(|ns| ns != ours) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for (pid, said) in [
        (host_process.id(), "shares the host's mount namespace"),
        (own_ns.id(), "has no mount at that rootfs"),
    ] {
        let pid_arg = format!("--pid={pid}");
        let mounts_before = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let out = Command::new(&cli)
            .args([
                "--load-kmods",
                "configure",
                "--device=0",
                "--compute",
                "--utility",
            ])
            .arg(&pid_arg)
            .arg(target_arg)
            .env("NVHOOK_CONFIG", node.config())
            .output()
            .expect("run nvidia-container-cli");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{said}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{said}: {stderr}");
        assert!(
            stderr.starts_with("nvhook (as nvidia-container-cli): pid ") && stderr.contains(said),
            "{said}: {stderr}"
        );
        let left: Vec<_> = fs::read_dir(&target).expect("read target").collect();
        assert!(left.is_empty(), "{said}: wrote {left:?}");
        let mounts_after = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert_eq!(mounts_before, mounts_after, "{said}: mounted on the host");
    }
    for child in [&mut host_process, &mut own_ns] {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// NVIDIA's `disable-device-node-modification` changes the container's
/// `/proc/driver/nvidia/params` only: the MIG capability files a MIG device's user reads
/// (`capabilities/gpu*/mig/gi*/ci*/access`) stay, and so does every other file of the
/// directory. The simulated node's driver procfs stands in for the kernel's: a tmpfs at the
/// container's `/proc/driver`, filled from it by a createContainer hook that runs before
/// nvhook's.
#[test]
fn disable_device_node_modification_changes_params_alone() {
    require_root();
    let node = SimNode::create_with(2, &["--mig", "1:2"]);
    let host_proc = node.root().join("proc/driver/nvidia");
    let caps = host_proc.join("capabilities/gpu1/mig");
    assert!(caps.is_dir(), "the MIG node has {}", caps.display());
    let dir = tempfile::tempdir().expect("tempdir");
    support::link_to_nvhook(dir.path(), &["nvidia-cdi-hook"]);
    let mut bundle = support::Bundle::new(
        support::busybox_image(),
        &[
            "sh",
            "-c",
            "cd /proc/driver/nvidia && find . | sort && echo '== params' && cat params && \
             echo '== access' && cat capabilities/gpu1/mig/gi*/ci*/access | sort -u",
        ],
    );
    let rootfs = bundle.rootfs().to_path_buf();
    bundle
        .tmpfs("/proc/driver")
        .raw_hook(
            "createContainer",
            serde_json::json!({
                "path": require_program("sh"),
                "args": ["sh", "-c", format!(
                    "mount -o remount,rw {root}/proc/driver && cp -a {host} {root}/proc/driver/ && mount -o remount,ro {root}/proc/driver",
                    root = rootfs.display(),
                    host = host_proc.display(),
                )],
                "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
                "timeout": 30,
            }),
        )
        .raw_hook(
            "createContainer",
            serde_json::json!({
                "path": dir.path().join("nvidia-cdi-hook"),
                "args": ["nvidia-cdi-hook", "disable-device-node-modification"],
                "env": [format!("NVHOOK_CONFIG={}", node.config().display())],
                "timeout": 30,
            }),
        );
    let out = support::run_container(&bundle, support::RuntimeEnv::CgroupV1);
    out.assert_success();
    let listing = |root: &Path| -> Vec<String> {
        let out = Command::new("sh")
            .arg("-c")
            .arg("find . | sort")
            .current_dir(root)
            .output()
            .expect("find");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect()
    };
    let seen: Vec<&str> = out
        .stdout
        .lines()
        .take_while(|l| *l != "== params")
        .collect();
    assert_eq!(
        seen,
        listing(&host_proc),
        "every file of the directory is kept"
    );
    let section = |name: &str| -> Vec<&str> {
        out.stdout
            .lines()
            .skip_while(|l| *l != format!("== {name}"))
            .skip(1)
            .take_while(|l| !l.starts_with("== "))
            .collect()
    };
    let host_params = fs::read_to_string(host_proc.join("params")).expect("host params");
    assert!(
        host_params.contains("ModifyDeviceFiles: 1"),
        "{host_params}"
    );
    let want: Vec<String> = host_params
        .lines()
        .map(|l| {
            if l.starts_with("ModifyDeviceFiles:") {
                "ModifyDeviceFiles: 0".into()
            } else {
                l.to_string()
            }
        })
        .collect();
    assert_eq!(section("params"), want);
    let host_access = Command::new("sh")
        .arg("-c")
        .arg("cat capabilities/gpu1/mig/gi*/ci*/access | sort -u")
        .current_dir(&host_proc)
        .output()
        .expect("cat the host's access files");
    let host_access = String::from_utf8_lossy(&host_access.stdout);
    assert!(host_access.contains("DeviceFileMinor: "), "{host_access}");
    assert_eq!(section("access"), host_access.lines().collect::<Vec<_>>());
}

/// `nvidia-container-cli`'s probes as install checks and bug-report scripts run them: each
/// exits 0 with libnvidia-container's shape (its binary could not be built here: its option
/// table was read from the source, docs/gpu-flags.md).
#[test]
fn nvidia_container_cli_answers_version_and_help() {
    let dir = tempfile::tempdir().expect("tempdir");
    support::link_to_nvhook(dir.path(), &["nvidia-container-cli"]);
    let cli = dir.path().join("nvidia-container-cli");
    let run = |args: &[&str]| {
        let out = Command::new(&cli)
            .args(args)
            .env_remove("NVHOOK_CONFIG")
            .output()
            .expect("run nvidia-container-cli");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for flag in ["--version", "-V"] {
        let text = run(&[flag]);
        let keys: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_once(": ").map(|(k, _)| k))
            .map(|k| match k {
                "cli-version" | "lib-version" | "build date" | "build revision"
                | "build compiler" | "build platform" | "build flags" => k,
                other => panic!("{flag}: unexpected line {other}"),
            })
            .collect();
        assert_eq!(keys.len(), 7, "{flag}: {keys:?}");
    }
    for args in [
        &["--help"][..],
        &["-?"],
        &["--usage"],
        &["-k", "configure", "--help"],
    ] {
        assert!(
            run(args).starts_with("Usage: nvidia-container-cli "),
            "{args:?}"
        );
    }
}
