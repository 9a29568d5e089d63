//! `nvhook runtime-server` on the simulated node: nvhook-runtime has a GPU create prepared by
//! the server at its config's `runtime-server` socket, and the bundle comes out byte for byte
//! as `nvhook runtime` leaves it; under Debian's runc the container sees exactly its GPU. Where
//! the server cannot answer for a create (nvhook-runtime in another mount namespace, another
//! config file) or none listens (stopped, or killed and its socket left behind),
//! nvhook-runtime runs `nvhook runtime` itself. A refusal reads as nvhook's own line; a peer of
//! another user gets no answer; a second server on a socket in use, or a socket path that is
//! another kind of file, is refused in one line. A driver upgrade under a running server reaches
//! the next create, though the server keeps NVML's answer in memory. Run as root after
//! `cargo build --workspace`.

use nvhook_runtime::server::Request;
use nvhook_test_support as support;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};
use support::engines::nvhook_runtime_bin;
use support::{
    Bundle, RuntimeEnv, SimNode, compute_bundle, nvhook_bin, require_program, require_root,
    run_container_with, run_detached_with,
};

const GPUS: u32 = 4;
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
const PLAN_FILE: &str = "nvhook-plan.json";

/// `nvhook runtime-server` reading `config`, listening once its socket answers.
struct Server {
    child: Child,
    socket: PathBuf,
}

impl Server {
    fn start(node: &SimNode) -> Server {
        let socket = socket_of(node);
        let mut child = Command::new(nvhook_bin())
            .arg("runtime-server")
            .env("NVHOOK_CONFIG", node.config())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nvhook runtime-server");
        let until = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            if let Some(status) = child.try_wait().expect("wait for the server") {
                panic!("the server ended ({status}): {}", node.log());
            }
            assert!(
                Instant::now() < until,
                "no socket after 20 s: {}",
                node.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Server { child, socket }
    }

    /// SIGTERM, as its unit stops it.
    fn stop(mut self) -> ExitStatus {
        signal(&self.child, "TERM");
        self.child.wait().expect("wait for the server")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.socket);
    }
}

/// The node's server socket: beside the node's directory, which `SimNode::change` makes anew.
fn socket_of(node: &SimNode) -> PathBuf {
    let name = node
        .root()
        .file_name()
        .expect("the node's directory has a name");
    let mut name = name.to_os_string();
    name.push(".runtime.sock");
    node.root().with_file_name(name)
}

fn signal(child: &Child, name: &str) {
    let status = Command::new(require_program("kill"))
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

/// A node whose nvhook-runtime execs `runtimes` and asks the server on the node's socket.
fn node(runtimes: Option<&str>) -> SimNode {
    let node = SimNode::create(GPUS);
    ask_the_server(&node);
    if let Some(runtimes) = runtimes {
        node.set("runtimes", runtimes);
    }
    node
}

/// The node's config names the node's socket as `runtime-server`.
fn ask_the_server(node: &SimNode) {
    let socket = socket_of(node);
    node.set(
        "runtime-server",
        &format!("{:?}", socket.display().to_string()),
    );
}

fn gpu_bundle(visible: &str) -> Bundle {
    let bundle = compute_bundle(GPUS, visible, &["--write", LIBCUDA]);
    bundle.write_config();
    bundle
}

/// `nvhook-runtime create` of `bundle` with `/bin/true` as the runtime (the node's config).
fn create(config: &Path, bundle: &Bundle) -> Output {
    Command::new(nvhook_runtime_bin())
        .args(["create", "--bundle"])
        .arg(bundle.dir())
        .arg(bundle.id())
        .env("NVHOOK_CONFIG", config)
        .output()
        .expect("run nvhook-runtime")
}

/// Who prepared each GPU create so far, by the node's log.
fn prepared_by(node: &SimNode) -> Vec<String> {
    node.log()
        .lines()
        .filter(|l| l.contains("GPU container prepared"))
        .map(|l| {
            let by = l.split(" by=").nth(1).expect("a prepared line names who");
            by.split_whitespace().next().unwrap().to_string()
        })
        .collect()
}

/// config.json, and the plan file the hook reads without the identity of the config.json it
/// was written beside (which names that file's inode and times), after checking that identity.
fn prepared_files(bundle: &Bundle) -> (String, serde_json::Value) {
    let config = bundle.dir().join("config.json");
    let text = fs::read_to_string(&config).expect("read config.json");
    let plan = fs::read_to_string(bundle.dir().join(PLAN_FILE)).expect("read the plan file");
    let mut plan: serde_json::Value = serde_json::from_str(&plan).expect("parse the plan file");
    let written = plan
        .as_object_mut()
        .and_then(|p| p.remove("config_json"))
        .expect("the plan file names its config.json");
    let meta = fs::metadata(&config).unwrap();
    assert_eq!(
        written["ino"],
        meta.ino(),
        "the plan file names another config.json"
    );
    assert_eq!(written["size"], meta.len());
    (text, plan)
}

#[test]
fn the_server_prepares_a_bundle_byte_for_byte_as_nvhook_runtime_does() {
    require_root();
    let node = node(Some("[\"/bin/true\"]"));
    let config = node.config();
    for visible in ["1", "0,3", "all"] {
        let bundle = gpu_bundle(visible);
        let original = fs::read(bundle.dir().join("config.json")).unwrap();
        let server = Server::start(&node);
        let out = create(&config, &bundle);
        assert!(out.status.success(), "{out:?}\n{}", node.log());
        let served = prepared_files(&bundle);
        assert!(server.stop().success());
        fs::write(bundle.dir().join("config.json"), &original).unwrap();
        fs::remove_file(bundle.dir().join(PLAN_FILE)).unwrap();
        let out = create(&config, &bundle);
        assert!(out.status.success(), "{out:?}\n{}", node.log());
        let direct = prepared_files(&bundle);
        assert_eq!(served.0, direct.0, "{visible}");
        assert_eq!(served.1, direct.1, "{visible}");
        assert!(served.0.contains("/dev/nvidia") && served.1["plan"].is_object());
    }
    assert_eq!(
        prepared_by(&node),
        ["runtime-server", "nvhook"].repeat(3),
        "{}",
        node.log()
    );
}

#[test]
fn a_gpu_container_under_runc_gets_its_gpu_from_the_server() {
    require_root();
    let node = node(None);
    let _server = Server::start(&node);
    let config = node.config();
    let bundle = gpu_bundle("1");
    let mut output = run_detached_with(
        &bundle,
        RuntimeEnv::CgroupV1,
        nvhook_runtime_bin(),
        &[("NVHOOK_CONFIG", &config)],
    );
    output.hook_log = Some(node.log());
    output.assert_only_gpu_with_read_only_driver(GPUS, 1, LIBCUDA);
    // runc runs in its own mount namespace here: the server cannot see its paths as it does,
    // and passes; nvhook prepares the same container.
    let bundle = gpu_bundle("1");
    let mut output = run_detached_with(
        &bundle,
        RuntimeEnv::CgroupV2,
        nvhook_runtime_bin(),
        &[("NVHOOK_CONFIG", &config)],
    );
    output.hook_log = Some(node.log());
    output.assert_only_gpu_with_read_only_driver(GPUS, 1, LIBCUDA);
    assert_eq!(
        prepared_by(&node),
        ["runtime-server", "nvhook"],
        "{}",
        node.log()
    );
    assert!(
        node.log().contains("another mount namespace"),
        "{}",
        node.log()
    );
}

#[test]
fn a_refused_create_reads_as_nvhooks_line_and_leaves_the_bundle_alone() {
    require_root();
    let node = node(Some("[\"/bin/true\"]"));
    let config = node.config();
    let bundle = gpu_bundle("9");
    let original = fs::read(bundle.dir().join("config.json")).unwrap();
    let server = Server::start(&node);
    let served = create(&config, &bundle);
    assert!(server.stop().success());
    let direct = create(&config, &bundle);
    for out in [&served, &direct] {
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "nvhook-runtime: NVIDIA_VISIBLE_DEVICES=9: no such GPU (this node has 0-3)\n"
        );
    }
    assert_eq!(
        fs::read(bundle.dir().join("config.json")).unwrap(),
        original
    );
    assert!(!bundle.dir().join(PLAN_FILE).exists());
}

#[test]
fn where_no_server_can_answer_nvhook_prepares_the_create() {
    require_root();
    let node = node(Some("[\"/bin/true\"]"));
    let config = node.config();
    // No server listens.
    assert!(create(&config, &gpu_bundle("1")).status.success());
    // One started with the node's config file, asked by nvhook-runtime with a copy of it.
    let mut server = Server::start(&node);
    let copy = node.root().join("copy.toml");
    fs::copy(&config, &copy).unwrap();
    assert!(create(&copy, &gpu_bundle("1")).status.success());
    assert!(create(&config, &gpu_bundle("1")).status.success());
    // Killed: its socket stays, and nobody answers there.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    assert!(server.socket.exists());
    assert!(create(&config, &gpu_bundle("1")).status.success());
    // A new server replaces the socket left behind.
    let server = Server::start(&node);
    assert!(create(&config, &gpu_bundle("1")).status.success());
    // Stopped, it takes its socket with it.
    let socket = server.socket.clone();
    assert!(server.stop().success());
    assert!(!socket.exists());
    assert_eq!(
        prepared_by(&node),
        [
            "nvhook",
            "nvhook",
            "runtime-server",
            "nvhook",
            "runtime-server"
        ],
        "{}",
        node.log()
    );
    assert!(node.log().contains("another config file"), "{}", node.log());
}

#[test]
fn a_peer_of_another_user_gets_no_answer() {
    require_root();
    let node = node(Some("[\"/bin/true\"]"));
    let server = Server::start(&node);
    let bundle = gpu_bundle("1");
    let original = fs::read(bundle.dir().join("config.json")).unwrap();
    // The socket is root's alone; opened up here (and the way to it) to show the server's own
    // check.
    fs::set_permissions(node.root(), fs::Permissions::from_mode(0o711)).unwrap();
    fs::set_permissions(&server.socket, fs::Permissions::from_mode(0o666)).unwrap();
    let mut buf = vec![0u8; 4096];
    let dir = bundle.dir().to_str().unwrap();
    let args: [&[u8]; 4] = [b"create", b"--bundle", dir.as_bytes(), b"id"];
    let nvhook = nvhook_bin().to_str().unwrap().as_bytes();
    let config = node.config();
    let request = Request::encode(
        &mut buf,
        nvhook,
        Some(config.to_str().unwrap().as_bytes()),
        args,
    )
    .expect("encode");
    // A client as nobody: the request with its working directory, then what comes back (the
    // server may close the connection before the request is sent, or unread after it).
    let client = "import socket, os, sys\n\
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
        s.connect(sys.argv[1])\n\
        cwd = os.open('/', os.O_PATH)\n\
        try:\n    s.sendmsg([bytes.fromhex(sys.argv[2])], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, cwd.to_bytes(4, sys.byteorder))])\n    reply = s.recv(4096)\n\
        except (BrokenPipeError, ConnectionResetError):\n    reply = b''\n\
        print(repr(reply))\n";
    let hex: String = request.iter().map(|b| format!("{b:02x}")).collect();
    // Debian's, which another user may run (a toolchain's shims under /root are root's).
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.is_file(),
        "the test needs Debian's python3 (apt-get install python3)"
    );
    let out = Command::new(python)
        .args(["-c", client])
        .arg(&server.socket)
        .arg(hex)
        .current_dir("/")
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run python3");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "b''");
    assert_eq!(
        fs::read(bundle.dir().join("config.json")).unwrap(),
        original
    );
    assert!(
        node.log()
            .contains("a request from another user, not answered"),
        "{}",
        node.log()
    );
}

#[test]
fn a_socket_in_use_or_of_another_kind_is_refused_in_one_line() {
    require_root();
    let node = node(None);
    let _server = Server::start(&node);
    let second = Command::new(nvhook_bin())
        .arg("runtime-server")
        .env("NVHOOK_CONFIG", node.config())
        .output()
        .expect("run a second server");
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("is in use by another nvhook runtime-server")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
    let file = node.root().join("not-a-socket");
    fs::write(&file, "kept").unwrap();
    let third = Command::new(nvhook_bin())
        .args(["runtime-server", "--socket"])
        .arg(&file)
        .env("NVHOOK_CONFIG", node.config())
        .output()
        .expect("run a third server");
    assert_eq!(third.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&third.stderr);
    assert!(
        stderr.contains("exists and is not a socket") && stderr.lines().count() == 1,
        "{stderr}"
    );
    assert_eq!(fs::read_to_string(&file).unwrap(), "kept");
}

#[test]
fn a_driver_upgrade_under_a_running_server_reaches_the_next_create() {
    require_root();
    const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
    let node = node(None);
    let _server = Server::start(&node);
    let config = node.config();
    let start = || {
        let bundle = compute_bundle(GPUS, "2", &["--ls", LIB_DIR]);
        let vars = [("NVHOOK_CONFIG", config.as_path())];
        let out = run_container_with(&bundle, RuntimeEnv::CgroupV1, nvhook_runtime_bin(), &vars);
        out.assert_success();
        out
    };
    start().assert_lines(&[&format!("ls {LIB_DIR} libcuda.so.550.54.15")]);
    // The server keeps NVML's answer and the driver's files in memory: the host's new state
    // must reach the next create all the same.
    node.change(&["--gpus", "4", "--driver-version", "560.35.03"]);
    // simnode writes the node's config anew.
    ask_the_server(&node);
    let after = start();
    after.assert_gpus(GPUS, &[2]);
    after.assert_lines(&[
        &format!("ls {LIB_DIR} libcuda.so.560.35.03"),
        "dlopen libcuda.so.1 ok",
    ]);
    assert_eq!(prepared_by(&node), ["runtime-server"; 2], "{}", node.log());
}
