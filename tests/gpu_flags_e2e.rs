//! The GPU flags people type, with nvhook alone: Debian 12's dockerd 20.10 `docker run --gpus`
//! (which runs `nvidia-container-runtime-hook prestart`) and containerd 1.6's `ctr run --gpus`
//! (which runs `nvidia-container-cli configure` through `containerd oci-hook`), Debian sid's
//! dockerd (28: still the hook for `--gpus`; 29.2 on: CDI names; CDI devices by `--device`
//! in both) and containerd 2.1.9 (`scripts/sid-engines.sh` fetches them), each with no
//! runtime configured and no NVIDIA program anywhere: the only NVIDIA names are links to the
//! nvhook cargo built, in a directory on the engine's PATH, as the packages install them.
//! Run as root after `cargo build --workspace`: `cargo test --test gpu_flags_e2e`.
//!
//! On the simulated node no driver sits behind the device nodes, so opening a node the cgroup
//! allows gives ENXIO; one the container was not given is absent.

use nvhook_test_support as support;

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use nvhook::nvidia_cli::{CLI_NAME, NAMES, RUNTIME_HOOK_NAME};
use support::containerd2::Containerd2Cri;
use support::engines::{
    Containerd, ContainerdBuild, Dockerd, DockerdBuild, EngineDir, assert_no_mounts_left,
    containerd_config, unique_name,
};
use support::{
    Output, SimNode, gpucheck_args, link_to_nvhook, nvhook_bin, require_program, require_root,
};

const GPUS: u32 = 4;
const NVHOOK_CONFIG: &str = "NVHOOK_CONFIG";
/// The system's directories, where no NVIDIA program may be.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Where the image's libraries are, and the driver's go.
const LIBRARY_DIR: &str = "/usr/lib/x86_64-linux-gnu";
/// NVIDIA's toolkit programs an engine could otherwise find.
const NVIDIA_PROGRAMS: [&str; 5] = [
    RUNTIME_HOOK_NAME,
    CLI_NAME,
    "nvidia-container-runtime",
    "nvidia-ctk",
    "nvidia-cdi-hook",
];

/// The directory that will hold NVIDIA's names, and the PATH engines get with it first. No
/// NVIDIA program may be in the system's directories.
fn names_dir(dir: &EngineDir) -> (PathBuf, String) {
    for program in NVIDIA_PROGRAMS {
        for system_dir in SYSTEM_PATH.split(':') {
            let path = Path::new(system_dir).join(program);
            assert!(
                fs::symlink_metadata(&path).is_err(),
                "{} exists: these tests prove nvhook works with no NVIDIA program installed",
                path.display()
            );
        }
    }
    let bin = dir.path().join("nvidia-names");
    fs::create_dir(&bin).expect("make the links' directory");
    let path = format!("{}:{SYSTEM_PATH}", bin.display());
    (bin, path)
}

/// NVIDIA's names in `bin`, as links to nvhook, as the packages install them.
fn link_names(bin: &Path) {
    link_to_nvhook(bin, &NAMES);
}

/// `nvhook doctor`'s line about the dockerd `pid`.
fn doctor_on_dockerd(node: &SimNode, path: &str, pid: u32) -> String {
    let out = std::process::Command::new(nvhook_bin())
        .args([
            "--config",
            node.config().to_str().expect("UTF-8 path"),
            "doctor",
        ])
        .env("PATH", path)
        .output()
        .expect("run nvhook doctor");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let start = format!(" dockerd {pid}: ");
    text.lines()
        .find(|l| l.get(4..).is_some_and(|rest| rest.starts_with(&start)))
        .unwrap_or_else(|| panic!("doctor names no dockerd {pid}:\n{text}"))
        .to_owned()
}

/// gpucheck probing every GPU and the control nodes, and loading libcuda.
fn probe() -> Vec<String> {
    gpucheck_args(GPUS, &[])
}

#[track_caller]
fn assert_exactly(output: &Output, visible: &[u32]) {
    output.assert_success();
    output.assert_gpus(GPUS, visible);
    output.assert_control_nodes_allowed();
    output.assert_lines(&["dlopen libcuda.so.1 ok"]);
}

/// A refused start: the engine failed it and passed on nvhook's stderr, one line, `message`.
#[track_caller]
fn assert_refused(output: &Output, message: &str) {
    assert!(
        !output.status.success(),
        "a start that should fail ran:\n{output}"
    );
    let hook = output
        .hook_stderr()
        .unwrap_or_else(|| panic!("no hook error in the engine's message:\n{output}"));
    // containerd appends its error class (`: unknown`) to the hook's line.
    let line = hook.lines().next().unwrap_or_default();
    assert_eq!(
        line.strip_suffix(": unknown").unwrap_or(line),
        message,
        "\n{output}"
    );
    assert!(
        hook.lines()
            .skip(1)
            .all(|l| l.trim().is_empty() || l.starts_with(':')),
        "\n{output}"
    );
}

/// Nothing was written in the host directory `volume` by the start that gave `output`.
#[track_caller]
fn assert_volume_empty(output: &Output, volume: &Path) {
    let written: Vec<_> = fs::read_dir(volume).expect("list the volume").collect();
    assert!(
        written.is_empty(),
        "something was written in the volume: {written:?}\n{output}"
    );
}

/// Nothing but mount points in the host directory `volume`: empty files and directories,
/// which runc makes where a mount of the container's spec falls in the volume, before any
/// hook and whatever the mount is (the spec's binds of a CDI device, as with NVIDIA's specs;
/// `/dev/pts` and the like where CDI's edits sorted the mounts so that the volume at `/dev`
/// comes first).
#[track_caller]
fn assert_only_mount_points(output: &Output, volume: &Path) {
    let written: Vec<(PathBuf, fs::Metadata)> = fs::read_dir(volume)
        .expect("list the volume")
        .map(|e| {
            let path = e.expect("a volume entry").path();
            let meta = fs::symlink_metadata(&path).expect("stat a volume entry");
            (path, meta)
        })
        .collect();
    let mount_point = |path: &Path, meta: &fs::Metadata| {
        meta.is_file() && meta.len() == 0
            || meta.is_dir() && fs::read_dir(path).is_ok_and(|mut d| d.next().is_none())
    };
    assert!(
        written.iter().all(|(path, meta)| mount_point(path, meta)),
        "more than the runtime's mount points in the volume: {written:?}\n{output}"
    );
}

/// A start that failed with nvhook's refusal, its line starting with `said_by`, to write into
/// the volume mounted at `destination`.
#[track_caller]
fn assert_hook_refused_volume(output: &Output, destination: &str, said_by: &str) {
    let hook = output.hook_stderr().unwrap_or_default();
    let line = format!("the volume mounted at {destination}: nvhook will not write into a volume");
    assert!(
        !output.status.success() && hook.starts_with(said_by) && hook.contains(&line),
        "{output}"
    );
}

/// A CDI start refused by nvhook's createRuntime hook, which would have written in the host
/// directory `volume`, bound at `destination`, where the runtime left only its mount points.
#[track_caller]
fn assert_cdi_volume_refused(output: &Output, volume: &Path, destination: &str) {
    assert_only_mount_points(output, volume);
    assert_hook_refused_volume(output, destination, "nvhook: ");
}

/// A start refused because nvhook, under one of NVIDIA's names, would have written in the host
/// directory `volume`, bound at `destination`, which is left empty.
#[track_caller]
fn assert_volume_refused(output: &Output, volume: &Path, destination: &str) {
    assert_volume_empty(output, volume);
    assert_hook_refused_volume(output, destination, "nvhook (as ");
}

// ---- dockerd: --gpus runs nvidia-container-runtime-hook prestart, or (29.2 on) CDI ----

/// How an engine with every NVIDIA name on its PATH serves `--gpus`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum GpusRoute {
    /// nvhook as NVIDIA's hook: dockerd's `nvidia-container-runtime-hook prestart` with
    /// NVIDIA_VISIBLE_DEVICES (Docker 19.03 to 29.1), ctr's `nvidia-container-cli configure`
    /// (containerd to 2.2).
    Hook,
    /// CDI names of kind `nvidia.com/gpu`, which the engine applies from the CDI spec (whose
    /// createRuntime hook is nvhook's). Docker 29.2 on, when `nvidia-cdi-hook` is on
    /// dockerd's PATH at start-up (moby #50228): `all`, the ids, or `0`..`N-1` for a count, and
    /// a request no spec resolves falls back to the hook. ctr from containerd 2.3 (containerd
    /// #12537): `nvidia.com/gpu=N` from the specs in /etc/cdi and /var/run/cdi, no fallback.
    Cdi,
}

impl GpusRoute {
    /// The route of an engine of `release`, whose `--gpus` is CDI from `first_cdi` on.
    fn of(release: (u32, u32), first_cdi: (u32, u32)) -> GpusRoute {
        if release >= first_cdi {
            GpusRoute::Cdi
        } else {
            GpusRoute::Hook
        }
    }
}

/// The first dockerd and ctr releases whose `--gpus` is CDI, in moby's and containerd's source.
const DOCKERD_CDI_GPUS: (u32, u32) = (29, 2);
const CTR_CDI_GPUS: (u32, u32) = (2, 3);

/// How many containers nvhook's log says it served: (as NVIDIA's hook, prestart or
/// `configure`; as the createRuntime hook of a CDI spec).
fn served(node: &SimNode) -> (usize, usize) {
    let log = node.log();
    let count = |served: &dyn Fn(&str) -> bool| log.lines().filter(|l| served(l)).count();
    (
        count(&|l| {
            l.contains(&format!("configured as {CLI_NAME}"))
                || l.contains("hook finished") && l.contains("stage=Prestart")
        }),
        count(&|l| l.contains("hook finished") && l.contains("stage=CreateRuntime")),
    )
}

/// The output of `start`, a container start that nvhook served by `route` (read from its log).
#[track_caller]
fn started_by(node: &SimNode, route: GpusRoute, start: impl FnOnce() -> Output) -> Output {
    let (hook, cdi) = served(node);
    let output = start();
    let (hook_after, cdi_after) = served(node);
    let by = (hook_after - hook, cdi_after - cdi);
    match route {
        GpusRoute::Hook => assert_eq!(by, (1, 0), "served (hook, cdi)\n{output}"),
        GpusRoute::Cdi => assert!(by.0 == 0 && by.1 >= 1, "served {by:?}\n{output}"),
    }
    output
}

/// `docker run --rm FLAGS IMAGE` of gpucheck.
fn docker_run(dockerd: &Dockerd, image: &str, flags: &[&str]) -> Output {
    let probe = probe();
    let mut args = vec!["--rm", "--network", "none"];
    args.extend(flags);
    args.push(image);
    args.extend(probe.iter().map(String::as_str));
    dockerd.run(&args)
}

#[test]
fn docker_run_gpus_with_the_runtime_hook_name_on_dockerds_path() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("gpus-dockerd");
    let (bin, path) = names_dir(&dir);
    // No runtime configured: daemon.json is empty.
    let daemon_json = dir.path().join("daemon.json");
    fs::write(&daemon_json, "{}").expect("write daemon.json");
    // dockerd gives the hook its own environment: that is where nvhook finds the node's config.
    let env = [("PATH", Path::new(&path)), (NVHOOK_CONFIG, &node.config())];
    // dockerd looks the hook up once, at start-up, on its own PATH: a link made after that
    // is not used, and doctor says so, until dockerd restarts.
    let mut dockerd = Dockerd::start(dir.path(), &daemon_json, &env);
    let image = dockerd.import_gpucheck_image(dir.path());
    // Doctor reads dockerd's start from /proc, to the second, and gives a name made within two
    // seconds of it the benefit of the doubt: make the links clearly later.
    std::thread::sleep(std::time::Duration::from_secs(3));
    link_names(&bin);
    let early = docker_run(&dockerd, &image, &["--gpus", "all"]);
    assert!(
        !early.status.success() && early.stderr.contains("could not select device driver"),
        "{early}"
    );
    let line = doctor_on_dockerd(&node, &path, dockerd.pid());
    assert!(
        line.starts_with("warn")
            && line.contains("started before")
            && line.contains("restart dockerd"),
        "{line}"
    );
    assert!(
        dockerd.shutdown(),
        "dockerd ignored SIGTERM:\n{}",
        dockerd.log()
    );
    let mut dockerd = Dockerd::start(dir.path(), &daemon_json, &env);
    let line = doctor_on_dockerd(&node, &path, dockerd.pid());
    assert!(line.starts_with("ok   dockerd"), "{line}");

    docker_run_gpus_flags(&dockerd, &image, dir.path(), &node, GpusRoute::Hook);
    assert!(
        dockerd.shutdown(),
        "dockerd ignored SIGTERM:\n{}",
        dockerd.log()
    );
    assert_no_mounts_left(dir.path(), node.root());
}

/// The `--gpus` values people type, each giving exactly its GPUs by `route` (read from
/// nvhook's log: the prestart hook, or the createRuntime hook of nvhook's CDI spec); a GPU
/// the node lacks is refused with nvhook's line (by the hook, which the CDI route falls back
/// to); a container without `--gpus` gets none; a volume over /dev gets no node.
fn docker_run_gpus_flags(
    dockerd: &Dockerd,
    image: &str,
    dir: &Path,
    node: &SimNode,
    route: GpusRoute,
) {
    for (gpus, visible) in [
        ("all", &[0, 1, 2, 3][..]),
        ("device=2", &[2]),
        // A count: the first two GPUs.
        ("2", &[0, 1]),
        ("\"device=1,3\"", &[1, 3]),
        ("all,\"capabilities=compute,utility\"", &[0, 1, 2, 3]),
    ] {
        eprintln!("docker run --gpus {gpus} ({route:?})");
        let output = started_by(node, route, || {
            docker_run(dockerd, image, &["--gpus", gpus])
        });
        assert_exactly(&output, visible);
    }
    assert_refused(
        &docker_run(dockerd, image, &["--gpus", "device=7"]),
        "nvhook (as nvidia-container-runtime-hook): NVIDIA_VISIBLE_DEVICES=7: no such GPU (this node has 0-3)",
    );
    let plain = docker_run(dockerd, image, &[]);
    plain.assert_success();
    plain.assert_gpus(GPUS, &[]);
    // A host directory over the runtime's own /dev tmpfs is a volume: no node is made in it.
    let volume = dir.join("volume");
    fs::create_dir(&volume).expect("make the volume");
    let bind = format!("{}:/dev", volume.display());
    let over_dev = docker_run(dockerd, image, &["--gpus", "1", "-v", &bind]);
    assert_dev_volume_refused(&over_dev, &volume, route);
}

/// A start with the host directory `volume` bound over the runtime's /dev tmpfs, refused
/// with no device node in `volume`: by nvhook on the hook route (the volume left empty); on
/// the CDI route by runc, which makes no device node in a /dev the container brought (CDI's
/// included) and fails on the missing /dev/null before the spec's hook runs.
#[track_caller]
fn assert_dev_volume_refused(output: &Output, volume: &Path, route: GpusRoute) {
    match route {
        GpusRoute::Hook => assert_volume_refused(output, volume, "/dev"),
        GpusRoute::Cdi => {
            assert!(
                !output.status.success() && output.stderr.contains("/dev/null"),
                "{output}"
            );
            assert_only_mount_points(output, volume);
        }
    }
}

// ---- Debian sid's dockerd (28 or 29): --gpus by its release's route; CDI devices by name ----

/// Debian sid's dockerd with every NVIDIA name on its PATH, `nvidia-cdi-hook` included, and
/// nvhook's CDI spec in the spec directory it reads (CDI is on by default from 28). Docker
/// 28's `--gpus` takes the hook route whatever else is there (its nvidia device driver,
/// registered when `nvidia-container-runtime-hook` is on dockerd's PATH at start-up, sets
/// NVIDIA_VISIBLE_DEVICES and that prestart hook); from 29.2 (moby #50228) it becomes CDI names
/// because `nvidia-cdi-hook` is on the PATH. Either way each `--gpus` form gives exactly its
/// GPUs, and `--device nvidia.com/gpu=N` gives CDI devices through nvhook's createRuntime
/// hook.
#[test]
fn sids_dockerd_serves_gpus_by_its_route_and_cdi_devices_by_name() {
    require_root();
    let build = DockerdBuild::sid();
    let route = GpusRoute::of(build.release(), DOCKERD_CDI_GPUS);
    eprintln!(
        "dockerd of Debian sid {}: --gpus by {route:?}",
        build.version()
    );
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("gpus-dockerd-sid");
    let (bin, path) = names_dir(&dir);
    link_names(&bin);
    assert!(
        bin.join("nvidia-cdi-hook").exists(),
        "NAMES has nvidia-cdi-hook"
    );
    let cdi_dir = dir.path().join("cdi");
    fs::create_dir(&cdi_dir).expect("make the CDI spec directory");
    node.generate_cdi_spec(&cdi_dir.join("nvhook.yaml"));
    let daemon_json = dir.path().join("daemon.json");
    // Docker 29.5 on gives containers a time namespace of their own, which Debian 12's runc
    // (1.1) does not know: the daemon's own switch turns that off (earlier releases ignore it).
    let config = serde_json::json!({
        "cdi-spec-dirs": [cdi_dir],
        "features": { "time-namespaces": false },
    });
    fs::write(&daemon_json, config.to_string()).expect("write daemon.json");
    let env = [("PATH", Path::new(&path)), (NVHOOK_CONFIG, &node.config())];
    let mut dockerd = Dockerd::start_with(&build, dir.path(), &daemon_json, &env);
    let image = dockerd.import_gpucheck_image(dir.path());
    // Doctor names both names this dockerd found, and the route from 29.2.
    let line = doctor_on_dockerd(&node, &path, dockerd.pid());
    assert!(
        line.starts_with("ok   dockerd") && line.contains(" and nvidia-cdi-hook on its PATH"),
        "{line}"
    );

    docker_run_gpus_flags(&dockerd, &image, dir.path(), &node, route);
    for (devices, visible) in [
        (&["nvidia.com/gpu=all"][..], &[0, 1, 2, 3][..]),
        (&["nvidia.com/gpu=2"], &[2]),
        (&["nvidia.com/gpu=1", "nvidia.com/gpu=3"], &[1, 3]),
    ] {
        eprintln!("docker run --device {devices:?}");
        let flags: Vec<&str> = devices.iter().flat_map(|d| ["--device", d]).collect();
        assert_exactly(&docker_run(&dockerd, &image, &flags), visible);
    }
    let uuid = format!("nvidia.com/gpu={}", node.gpu_uuid(0));
    assert_exactly(&docker_run(&dockerd, &image, &["--device", &uuid]), &[0]);
    // A CDI device the spec lacks: dockerd refuses it, in one line, before any hook runs.
    let missing = docker_run(&dockerd, &image, &["--device", "nvidia.com/gpu=7"]);
    assert!(!missing.status.success(), "{missing}");
    // (The docker client adds its `Run 'docker run --help'` hint.)
    let said: Vec<&str> = missing
        .stderr
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("Run 'docker run --help'"))
        .collect();
    assert_eq!(
        said,
        [
            "docker: Error response from daemon: CDI device injection failed: unresolvable CDI devices nvidia.com/gpu=7"
        ],
        "{missing}"
    );

    assert!(
        dockerd.shutdown(),
        "dockerd ignored SIGTERM:\n{}",
        dockerd.log()
    );
    assert_no_mounts_left(dir.path(), node.root());
}

// ---- containerd 1.6: ctr run --gpus runs nvidia-container-cli configure ----

/// `ctr run --rm FLAGS ...` of gpucheck, with ctr's PATH and config variable (ctr builds the
/// hook from its own environment).
fn ctr_run(
    containerd: &Containerd,
    image: &str,
    path: &str,
    node: &SimNode,
    flags: &[&str],
) -> Output {
    let probe = probe();
    let probe: Vec<&str> = probe.iter().map(String::as_str).collect();
    let config = node.config();
    containerd.run_with_env(
        &[
            ("PATH", OsStr::new(path)),
            (NVHOOK_CONFIG, config.as_os_str()),
        ],
        flags,
        image,
        &unique_name("gpus"),
        &probe,
    )
}

#[test]
fn ctr_run_gpus_with_nvidia_container_cli_on_ctrs_path() {
    require_root();
    // ctr's hook runs `containerd oci-hook`, found on ctr's PATH.
    require_program("containerd");
    ctr_run_gpus("gpus-ctrd", |dir| {
        let config = dir.join("containerd.toml");
        fs::write(&config, containerd_config(dir)).expect("write containerd config");
        (Containerd::start(dir, &config, &[]), None)
    });
}

/// containerd 2.1 (Debian sid's) still maps `ctr run --gpus` onto nvidia-container-cli's
/// prestart hook, as 2.2 does; from 2.3 ctr asks CDI for `nvidia.com/gpu=N`: the same flags,
/// the same answers, by the route its release takes.
#[test]
fn ctr_run_gpus_on_containerd_2() {
    require_root();
    ctr_run_gpus("gpus-ctrd2", |dir| {
        let containerd = Containerd2Cri::under(dir).start(dir, &[]);
        // Its own `containerd oci-hook`, ahead of Debian 12's on ctr's PATH.
        let sid = ContainerdBuild::sid().program("containerd");
        (containerd, sid.parent().map(Path::to_path_buf))
    });
}

/// `ctr run --gpus` against the containerd `start` makes in a directory of its own (with the
/// directory of that containerd's programs, to put first on ctr's PATH, if not the system's).
/// ctr sees nvhook's CDI spec as the host's /var/run/cdi, which only 2.3 on reads for
/// `--gpus`.
fn ctr_run_gpus(name: &str, start: impl FnOnce(&Path) -> (Containerd, Option<PathBuf>)) {
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new(name);
    let (bin, path) = names_dir(&dir);
    link_names(&bin);
    let (mut containerd, programs) = start(dir.path());
    let path = match programs {
        Some(programs) => format!("{}:{path}", programs.display()),
        None => path,
    };
    let cdi_dir = dir.path().join("ctr-cdi");
    fs::create_dir(&cdi_dir).expect("make the CDI spec directory");
    node.generate_cdi_spec(&cdi_dir.join("nvhook.yaml"));
    containerd.set_ctr_cdi_dir(&cdi_dir);
    let route = GpusRoute::of(containerd.ctr_release(), CTR_CDI_GPUS);
    eprintln!("ctr run --gpus by {route:?}");
    let image = containerd.import_gpucheck_image(dir.path());

    let ctr = |flags: &[&str]| ctr_run(&containerd, &image, &path, &node, flags);
    let gpus = |flags: &[&str]| started_by(&node, route, || ctr(flags));
    assert_exactly(&gpus(&["--gpus", "1"]), &[1]);
    assert_exactly(&gpus(&["--gpus", "0", "--gpus", "2"]), &[0, 2]);
    let missing = ctr(&["--gpus", "7"]);
    match route {
        GpusRoute::Hook => assert_refused(
            &missing,
            "nvhook (as nvidia-container-cli): --device=7: no such GPU (this node has 0-3)",
        ),
        // ctr resolves the CDI names itself, before it asks containerd for anything.
        GpusRoute::Cdi => assert!(
            !missing.status.success()
                && missing
                    .stderr
                    .contains("unresolvable CDI devices nvidia.com/gpu=7"),
            "{missing}"
        ),
    }
    let plain = ctr(&[]);
    plain.assert_success();
    plain.assert_gpus(GPUS, &[]);
    // A host directory bound where the libraries go is refused (with no bundle, the volumes
    // are read from the container's mount table), and gets nothing.
    let volume = dir.path().join("volume");
    fs::create_dir(&volume).expect("make the volume");
    let bind = format!(
        "type=bind,src={},dst={LIBRARY_DIR},options=rbind:rw",
        volume.display()
    );
    let on_volume = ctr(&["--gpus", "1", "--mount", &bind]);
    match route {
        GpusRoute::Hook => assert_volume_refused(&on_volume, &volume, LIBRARY_DIR),
        GpusRoute::Cdi => assert_cdi_volume_refused(&on_volume, &volume, LIBRARY_DIR),
    }
    // A host directory over the runtime's own /dev tmpfs: the later mount is the one there.
    let volume = dir.path().join("dev-volume");
    fs::create_dir(&volume).expect("make the volume");
    let bind = format!(
        "type=bind,src={},dst=/dev,options=rbind:rw",
        volume.display()
    );
    let over_dev = ctr(&["--gpus", "1", "--mount", &bind]);
    assert_dev_volume_refused(&over_dev, &volume, route);

    assert!(
        containerd.shutdown(),
        "containerd ignored SIGTERM:\n{}",
        containerd.log()
    );
    assert_no_mounts_left(dir.path(), node.root());
}

/// `nvidia-container-cli info` and `list`, as scripts run them, answer from the node.
#[test]
fn nvidia_container_cli_info_and_list_describe_the_node() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("gpus-info");
    let link = dir.path().join(CLI_NAME);
    std::os::unix::fs::symlink(nvhook_bin(), &link).expect("link nvidia-container-cli");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&link)
            .args(args)
            .env(NVHOOK_CONFIG, node.config())
            .output()
            .expect("run nvidia-container-cli");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let info = run(&["info"]);
    assert!(
        info.starts_with(&format!("NVRM version:   {}\n", node.driver_version())),
        "{info}"
    );
    for index in 0..GPUS {
        assert!(
            info.contains(&format!("Device Index:   {index}\n")),
            "{info}"
        );
        let uuid = node.gpu_uuid(index as usize);
        assert!(
            info.contains(&format!("GPU UUID:       {uuid}\n")),
            "{info}"
        );
    }
    let list: Vec<PathBuf> = run(&["list"]).lines().map(PathBuf::from).collect();
    let dev = node.dev_root().join("dev/nvidia3");
    assert!(list.contains(&dev), "{} not in {list:?}", dev.display());
    assert!(list.iter().any(|p| p.ends_with("nvidia-smi")), "{list:?}");
    assert!(
        list.iter().all(|p| p.exists()),
        "a listed path is missing: {list:?}"
    );
    let unique: std::collections::BTreeSet<&PathBuf> = list.iter().collect();
    assert_eq!(unique.len(), list.len(), "a path listed twice: {list:?}");

    // `--device` by index and by UUID: the control nodes and those GPUs' nodes, nothing else.
    let uuid = node.gpu_uuid(3);
    let chosen = run(&["list", "--device=1", "-d", &uuid]);
    let gpu_nodes: Vec<&str> = chosen
        .lines()
        .filter_map(|l| l.rsplit_once("/dev/nvidia").map(|(_, n)| n))
        .filter(|n| n.parse::<u32>().is_ok())
        .collect();
    assert_eq!(gpu_nodes, ["1", "3"], "{chosen}");
    assert!(chosen.starts_with(&format!(
        "{}\n",
        node.dev_root().join("dev/nvidiactl").display()
    )));
    assert!(!chosen.contains("nvidia-smi"), "{chosen}");

    // A GPU the node does not have: one line, a failure, nothing on stdout.
    let out = std::process::Command::new(&link)
        .args(["list", "--device=9"])
        .env(NVHOOK_CONFIG, node.config())
        .output()
        .expect("run nvidia-container-cli");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains('9'), "{stderr}");
}
