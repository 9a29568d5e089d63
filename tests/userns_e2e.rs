//! GPU containers in a user namespace (issue 25 §1): uid/gid mappings as runc takes them from
//! Kubernetes `hostUsers: false`, Docker's `userns-remap` and Podman's `--userns=auto`, the
//! container's root being an unprivileged host id. Real runc on a simulated node, nvhook as
//! the prestart hook and as nvhook-runtime. Run as root after `cargo build --workspace`.

use nvhook_test_support as support;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use nvhook::nvidia_cli::RUNTIME_HOOK_NAME;
use support::engines::{Dockerd, EngineDir, unique_name};
use support::hook_mounts::assert_same_view_both_ways;
use support::podman::{CdiSpecFile, Podman};
use support::{
    Bundle, MountNs, Output, RuntimeEnv, SimNode, WRITTEN_SEEN_INSIDE, busybox_image, glibc_image,
    gpucheck_args, host_mounts_referencing, host_snapshot, owner_args, require_root, run_clean,
    run_in_ns, table_diff,
};

const GPUS: u32 = 4;
/// The host ids the container's ids 0..65536 are.
const HOST_ID: u32 = 100_000;
const IDS: u32 = 65_536;
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";

fn userns_bundle(extra: &[&str]) -> Bundle {
    let args = gpucheck_args(GPUS, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &args);
    bundle.user_namespace(HOST_ID, IDS);
    bundle
}

/// Each entry of a rootfs, not following links: path inside the rootfs -> (inode, uid, gid).
type Tree = BTreeMap<String, (u64, u32, u32)>;

fn tree(rootfs: &Path) -> Tree {
    fn walk(root: &Path, dir: &Path, tree: &mut Tree) {
        for entry in std::fs::read_dir(dir).expect("read a rootfs directory") {
            let path = entry.expect("a directory entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let inside = Path::new("/").join(path.strip_prefix(root).expect("under the root"));
            tree.insert(
                inside.display().to_string(),
                (meta.ino(), meta.uid(), meta.gid()),
            );
            if meta.is_dir() {
                walk(root, &path, tree);
            }
        }
    }
    let mut tree = Tree::new();
    walk(rootfs, rootfs, &mut tree);
    tree
}

/// One of each kind of entry nvhook writes in the image of GPU 1's container (compute and
/// utility): the loader cache (replaced whole), the ld.so.conf.d directory and nvhook's file
/// in it, a SONAME link and the development link, mount points of a library, of a tool, of a
/// firmware directory and of a socket, and directories made for them.
fn written_in_the_image(node: &SimNode) -> Vec<String> {
    let version = node.driver_version();
    let lib = "/usr/lib/x86_64-linux-gnu";
    [
        "/etc/ld.so.cache",
        "/etc/ld.so.conf.d",
        "/etc/ld.so.conf.d/000-nvhook.conf",
        LIBCUDA,
        &format!("{lib}/libcuda.so"),
        &format!("{lib}/libcuda.so.{version}"),
        &format!("{lib}/libnvidia-ml.so.1"),
        &format!("{lib}/libnvidia-ml.so.{version}"),
        "/usr/bin/nvidia-smi",
        "/usr/lib/firmware/nvidia",
        &format!("/usr/lib/firmware/nvidia/{version}"),
        "/run/nvidia-persistenced",
        "/run/nvidia-persistenced/socket",
    ]
    .map(String::from)
    .to_vec()
}

/// What the run made in the image, read on the host from the rootfs directory once the
/// container is gone (its mounts went with its mount namespace, leaving the files they
/// covered): every entry that was not there `before`, or is another file now. `expected` must
/// be among them, and each must be the container root's, HOST_ID:HOST_ID as the host sees it:
/// one the host's root made (0:0) is a file the container's root cannot change or remove.
#[track_caller]
fn assert_written_as_container_root(
    before: &Tree,
    rootfs: &Path,
    expected: &[String],
    output: &Output,
) {
    let after = tree(rootfs);
    let written: BTreeMap<&str, String> = after
        .iter()
        .filter(|(path, (ino, ..))| before.get(*path).is_none_or(|(was, ..)| was != ino))
        .map(|(path, (_, uid, gid))| (path.as_str(), format!("{uid}:{gid}")))
        .collect();
    let missing: Vec<&String> = expected
        .iter()
        .filter(|p| !written.contains_key(p.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "not written in the image: {missing:?}\nwritten: {written:#?}\n{output}"
    );
    let root = format!("{HOST_ID}:{HOST_ID}");
    let foreign: BTreeMap<_, _> = written
        .into_iter()
        .filter(|(_, owner)| *owner != root)
        .collect();
    assert!(
        foreign.is_empty(),
        "written in the image as another than the container's root ({root}): {foreign:?}\n{output}"
    );
}

/// A prestart hook after nvhook's that lists, with owners as the host sees them, the entries
/// of the container's /dev: the runtime's tmpfs, which exists only in the container's mount
/// namespace, where nvhook's mount points lie under the host's nodes bound on them. The hook
/// enters that namespace (before pivot_root) and binds the tmpfs alone, without the mounts on
/// it, on a directory of the bundle for as long as it takes to `stat` what is under them
/// (a bind in a namespace of its own would copy those mounts locked, and the kernel refuses
/// to bind a mount with locked ones on it alone). Returns the file the listing goes to,
/// `./NAME UID:GID` a line.
fn list_dev_after_nvhook(bundle: &mut Bundle) -> std::path::PathBuf {
    const SCRIPT: &str = r#"set -e
pid=$(sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p')
exec nsenter --mount=/proc/$pid/ns/mnt sh -ec \
    'mount --bind "$1/dev" "$2"
     (cd "$2" && find . -exec stat -c "%n %u:%g" {} + >"$3")
     umount "$2"' \
    sh "$@""#;
    let view = bundle.dir().join("dev-view");
    std::fs::create_dir(&view).expect("make the directory to view /dev on");
    let listing = bundle.dir().join("dev-owners");
    let args = [
        "sh".into(),
        "-ec".into(),
        SCRIPT.into(),
        "sh".into(),
        bundle.rootfs().display().to_string(),
        view.display().to_string(),
        listing.display().to_string(),
    ];
    bundle.prestart_command(Path::new("/bin/sh"), &args);
    listing
}

/// The container's /dev as [`list_dev_after_nvhook`] saw it: GPU 1's nodes and the control
/// nodes are there (mount points nvhook made for the host's nodes), and every entry is the
/// container root's (the runtime's own too).
#[track_caller]
fn assert_dev_made_as_container_root(listing: &Path, output: &Output) {
    let text = std::fs::read_to_string(listing)
        .unwrap_or_else(|e| panic!("{}: {e}\n{output}", listing.display()));
    let owners: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|line| line.rsplit_once(' '))
        .collect();
    let mut nodes = vec![support::gpu_node(1)];
    nodes.extend(support::CONTROL_NODES.map(String::from));
    let missing: Vec<&String> = nodes
        .iter()
        .filter(|node| !owners.contains_key(node.replacen("/dev/", "./", 1).as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "not in the container's /dev: {missing:?}\n{text}\n{output}"
    );
    let root = format!("{HOST_ID}:{HOST_ID}");
    let foreign: Vec<_> = owners.iter().filter(|(_, owner)| **owner != root).collect();
    assert!(
        foreign.is_empty(),
        "made in the container's /dev as another than its root ({root}): {foreign:?}\n{output}"
    );
}

#[track_caller]
fn assert_gpu_1_only(output: &Output) {
    output.assert_only_gpu_with_read_only_driver(GPUS, 1, LIBCUDA);
}

/// A user-namespaced container asking for GPU 1 (compute, utility) through nvhook's prestart
/// hook on `node`, which checks that it can write libcuda.
fn gpu_1_through_the_hook(node: &SimNode) -> Bundle {
    let mut bundle = userns_bundle(&["--write", LIBCUDA]);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=1")
        .env("NVIDIA_DRIVER_CAPABILITIES=compute,utility")
        .prestart_hook(node);
    bundle
}

fn hook_gives_a_user_namespaced_container_its_gpu(env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = gpu_1_through_the_hook(&node);
    let dev = list_dev_after_nvhook(&mut bundle);
    let host = host_snapshot();
    let before = tree(bundle.rootfs());
    let output = run_clean(&bundle, Some(&node), env);
    assert_gpu_1_only(&output);
    // What nvhook wrote in the image and in /dev is the container root's: its host id.
    assert_written_as_container_root(
        &before,
        bundle.rootfs(),
        &written_in_the_image(&node),
        &output,
    );
    assert_dev_made_as_container_root(&dev, &output);
    let diff = host.diff(&host_snapshot());
    assert!(diff.is_empty(), "the host changed: {diff:#?}");
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
}

#[test]
fn the_hook_gives_a_user_namespaced_container_its_gpu_cgroup_v1() {
    hook_gives_a_user_namespaced_container_its_gpu(RuntimeEnv::CgroupV1);
}

#[test]
fn the_hook_gives_a_user_namespaced_container_its_gpu_cgroup_v2() {
    hook_gives_a_user_namespaced_container_its_gpu(RuntimeEnv::CgroupV2);
}

/// An image whose directories are read-only to their owner (`dr-xr-xr-x`, as Podman leaves
/// an imported image's `/`): the container's root may still write there in its namespace, and
/// so does nvhook acting as that root, which keeps its file capabilities when it takes that
/// root's ids.
#[test]
fn the_hook_writes_in_directories_read_only_to_the_container_root() {
    require_root();
    let node = SimNode::create(GPUS);
    let bundle = gpu_1_through_the_hook(&node);
    let lib = bundle.rootfs().join("usr/lib/x86_64-linux-gnu");
    for dir in [bundle.rootfs(), lib.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))
            .expect("make the directory read-only to its owner");
    }
    let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
    assert_gpu_1_only(&output);
    let link = std::fs::symlink_metadata(lib.join("libcuda.so.1")).expect("the SONAME link");
    assert_eq!((link.uid(), link.gid()), (HOST_ID, HOST_ID));
}

/// The device plugin's way with Kubernetes `hostUsers: false`: GPU 1's nodes come in the
/// spec's `linux.devices` (the plugin's DeviceSpecs), runc binds them from the host's /dev,
/// and nvhook makes no node. What it writes is then in the image alone, on the host's
/// filesystem, where the host's root may create files (no EOVERFLOW there): only their owners
/// tell whether nvhook wrote them as the container's root.
#[test]
fn the_hook_writes_as_the_container_root_beside_nodes_the_runtime_made() {
    require_root();
    let node = SimNode::create(GPUS);
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let ns = node.dev_at_host_paths(RuntimeEnv::CgroupV1, scratch.path());
    let mut bundle = userns_bundle(&["--write", LIBCUDA]);
    let mut nodes = vec![support::gpu_node(1)];
    nodes.extend(support::CONTROL_NODES.map(String::from));
    for path in &nodes {
        let host = node.dev_root().join(path.trim_start_matches('/'));
        let rdev = std::fs::metadata(&host)
            .unwrap_or_else(|e| panic!("{}: {e}", host.display()))
            .rdev();
        // glibc's encoding of dev_t.
        let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
        let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
        let (major, minor) = (major as u32, minor as u32);
        bundle
            .extra_device(path, major, minor)
            .allow_device(major, minor);
    }
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=1")
        .env("NVIDIA_DRIVER_CAPABILITIES=compute,utility")
        .prestart_hook(&node);
    let dev = list_dev_after_nvhook(&mut bundle);
    let before = tree(bundle.rootfs());
    let mut output = run_in_ns(&bundle, &ns, &support::require_program("runc"), &[]);
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    assert_written_as_container_root(
        &before,
        bundle.rootfs(),
        &written_in_the_image(&node),
        &output,
    );
    // The nodes' mount points are runc's here, made as the container's root too.
    assert_dev_made_as_container_root(&dev, &output);
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
}

fn runtime_gives_a_user_namespaced_container_its_gpu(env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = userns_bundle(&["--write", LIBCUDA]);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=1")
        .env("NVIDIA_DRIVER_CAPABILITIES=compute,utility");
    let ns = MountNs::new(env);
    let table = ns.table();
    let config = node.config().display().to_string();
    let before = tree(bundle.rootfs());
    let mut output = run_in_ns(
        &bundle,
        &ns,
        support::engines::nvhook_runtime_bin(),
        &[("NVHOOK_CONFIG", &config)],
    );
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    assert_written_as_container_root(
        &before,
        bundle.rootfs(),
        &written_in_the_image(&node),
        &output,
    );
    let changed = table_diff(&table, &ns.table());
    assert!(changed.is_empty(), "the mount table changed: {changed:#?}");
}

#[test]
fn nvhook_runtime_gives_a_user_namespaced_container_its_gpu_cgroup_v1() {
    runtime_gives_a_user_namespaced_container_its_gpu(RuntimeEnv::CgroupV1);
}

#[test]
fn nvhook_runtime_gives_a_user_namespaced_container_its_gpu_cgroup_v2() {
    runtime_gives_a_user_namespaced_container_its_gpu(RuntimeEnv::CgroupV2);
}

/// Which Podman runs a `--userns=auto` container, and over which runtime.
#[derive(Debug, Clone, Copy)]
enum PodmanRow {
    /// Debian 12's Podman 4.3 over its runc 1.1.
    Debian12,
    /// sid's Podman 5 over sid's runc 1.3.
    SidRunc,
    /// sid's Podman 5 over sid's crun, under cgroup v2 (crun refuses this machine's v1).
    SidCrunV2,
}

/// Rootful Podman with `--userns=auto` (the container's ids mapped into the `containers`
/// user's range in /etc/subuid, 100000..) and nvhook's CDI spec: the runtime binds the nodes
/// from their host paths (so Podman runs where the node's are at /dev, as on a GPU host), and
/// nvhook's createRuntime hook makes the links and the cache. The hook runs as the host's root
/// from the runtime's side, reads the bundle (crun names its working directory, `/`, as the
/// bundle: there the hook takes the rootfs from crun's state) and creates what it writes as
/// the container's root.
fn podman_runs_a_cdi_device_in_a_user_namespace(row: PodmanRow) {
    require_root();
    let node = SimNode::create(GPUS);
    let scratch = tempfile::tempdir().expect("a scratch directory");
    // `--userns=auto` takes its ranges from the `containers` user's in /etc/subuid and
    // /etc/subgid: the test's, bound over the host's in the namespace. Podman 5 also looks
    // the user up (libsubid): the host's /etc/passwd with that user, bound the same way.
    let ids = scratch.path().join("subids");
    std::fs::write(&ids, format!("containers:{HOST_ID}:{IDS}\n")).expect("write the id ranges");
    let passwd = scratch.path().join("passwd");
    let mut users = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    users.push_str("containers:x:999999:999999::/:/usr/sbin/nologin\n");
    std::fs::write(&passwd, users).expect("write a passwd file");
    let dev = scratch.path().join("dev");
    std::fs::create_dir(&dev).expect("a directory for the host's /dev");
    let env = match row {
        PodmanRow::SidCrunV2 => RuntimeEnv::CgroupV2,
        PodmanRow::Debian12 | PodmanRow::SidRunc => RuntimeEnv::CgroupV1,
    };
    let ns = node.dev_at_host_paths_and(
        env,
        &dev,
        &format!(
            "mount --bind {ids} /etc/subuid && mount --bind {ids} /etc/subgid && \
             mount --bind {passwd} /etc/passwd",
            ids = ids.display(),
            passwd = passwd.display()
        ),
    );
    let spec = CdiSpecFile::new("yaml");
    node.generate_cdi_spec(spec.path());
    let mut flags = vec!["--userns=auto", "--device", "nvidia.com/gpu=1"];
    let podman = match row {
        PodmanRow::Debian12 => Podman::inside(&ns),
        PodmanRow::SidRunc => Podman::sid().within(&ns),
        PodmanRow::SidCrunV2 => {
            // No pids controller is delegated to this cgroup2 hierarchy.
            flags.extend(["--pids-limit", "0"]);
            Podman::sid().within(&ns).running(Path::new("crun"))
        }
    };
    let image = format!("localhost/{}:latest", unique_name("nvhook-userns"));
    podman.import(glibc_image().rootfs(), &image);
    let driver_libcuda = format!(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.{}",
        node.driver_version()
    );
    let mut extra = vec!["--write", LIBCUDA, "--owner", &driver_libcuda];
    extra.extend(owner_args(&WRITTEN_SEEN_INSIDE));
    let args = gpucheck_args(GPUS, &extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let host = host_snapshot();
    let mut output = podman.run(&flags, &image, &args);
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    // The cache, the conf file and the links nvhook's createRuntime hook wrote are the
    // container's root's.
    output.assert_owned_by_root_inside(&WRITTEN_SEEN_INSIDE);
    // The driver's own file, the host root's: proof that the container has a user namespace
    // (the id it cannot map shows as the overflow id).
    output.assert_lines(&[&format!("owner {driver_libcuda} 65534:65534")]);
    let diff = host.diff(&host_snapshot());
    assert!(diff.is_empty(), "the host changed: {diff:#?}");
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");

    // The driver files' mounts made by nvhook's hook show this container what the runtime's do.
    drop(spec);
    let spec = CdiSpecFile::new("json");
    let busybox = format!("localhost/{}:latest", unique_name("nvhook-userns-busybox"));
    podman.import(busybox_image().rootfs(), &busybox);
    assert_same_view_both_ways(&format!("{row:?}"), &node, spec.path(), |args| {
        podman.run(&flags, &busybox, args)
    });
}

#[test]
fn podman_4_runs_a_cdi_device_in_a_user_namespace() {
    podman_runs_a_cdi_device_in_a_user_namespace(PodmanRow::Debian12);
}

#[test]
fn podman_5_runs_a_cdi_device_in_a_user_namespace_on_sid_runc() {
    podman_runs_a_cdi_device_in_a_user_namespace(PodmanRow::SidRunc);
}

#[test]
fn podman_5_runs_a_cdi_device_in_a_user_namespace_on_sid_crun_cgroup_v2() {
    podman_runs_a_cdi_device_in_a_user_namespace(PodmanRow::SidCrunV2);
}

/// Docker's `userns-remap` (Debian's dockerd 20.10, the container's ids remapped to 100000..):
/// `docker run --gpus device=1` through nvhook under NVIDIA's hook name. dockerd reads the
/// remapping from /etc/subuid and /etc/subgid: it runs in a mount namespace where those two
/// files are the test's (the host's are not touched). The ranges are those of an existing
/// user, `daemon` (`userns-remap: default` would add a user `dockremap` to the host): dockerd
/// turns user namespaces off for `root`, which "cannot be remapped with itself".
#[test]
fn docker_userns_remap_runs_gpus_through_the_hook() {
    const REMAP: &str = "daemon";
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("userns-remap");
    let ids = dir.path().join("subids");
    std::fs::write(&ids, format!("{REMAP}:{HOST_ID}:{IDS}\n")).expect("write the id ranges");
    let setup = format!(
        "mount --bind {ids} /etc/subuid && mount --bind {ids} /etc/subgid",
        ids = ids.display()
    );
    let ns = MountNs::with_setup(RuntimeEnv::CgroupV1, &setup);
    let bin = dir.path().join("nvidia-names");
    std::fs::create_dir(&bin).expect("make the links' directory");
    std::os::unix::fs::symlink(support::nvhook_bin(), bin.join(RUNTIME_HOOK_NAME))
        .expect("link nvidia-container-runtime-hook");
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display());
    let daemon_json = dir.path().join("daemon.json");
    std::fs::write(
        &daemon_json,
        format!(r#"{{"userns-remap": "{REMAP}:{REMAP}"}}"#),
    )
    .expect("write daemon.json");
    let config = node.config();
    let env = [
        ("PATH", Path::new(&path)),
        ("NVHOOK_CONFIG", config.as_path()),
    ];
    let mut dockerd = Dockerd::start_in(&ns, dir.path(), &daemon_json, &env);
    let image = dockerd.import_gpucheck_image(dir.path());
    let driver_libcuda = format!(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.{}",
        node.driver_version()
    );
    let mut extra = vec!["--write", LIBCUDA, "--owner", &driver_libcuda];
    extra.extend(owner_args(&WRITTEN_SEEN_INSIDE));
    let args = gpucheck_args(GPUS, &extra);
    let mut run = vec!["--rm", "--network", "none", "--gpus", "device=1", &image];
    run.extend(args.iter().map(String::as_str));
    let mut output = dockerd.run(&run);
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    output.assert_owned_by_root_inside(&WRITTEN_SEEN_INSIDE);
    // The driver's own file, the host root's: the container has a user namespace.
    output.assert_lines(&[&format!("owner {driver_libcuda} 65534:65534")]);
    assert!(
        dockerd.shutdown(),
        "dockerd ignored SIGTERM:\n{}",
        dockerd.log()
    );
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
}
