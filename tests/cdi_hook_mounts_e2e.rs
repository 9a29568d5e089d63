//! The CDI route with the driver files' mounts made by nvhook's createRuntime hook
//! (`cdi-mounts = "hook"`, the default since issue 41): the spec lists the GPU's device nodes
//! and nvhook's hook, and no mount; the hook opens each host file as a detached read-only tree
//! and attaches it inside the rootfs, from the container's mount namespace, before pivot_root.
//! Through Debian 12's Podman 4.3 on runc 1.1.5, and Debian sid's Podman 5 on sid's runc 1.3
//! and on sid's crun 1.28 (cgroup v2 in a mount namespace), a container gets exactly its GPU
//! and libcuda loads; on those and on Podman 4.3 over youki it sees the same driver files, at
//! the same paths, with the same mount options, as through a spec whose runtime makes the
//! mounts (`cdi-mounts = "runtime"`), also where a driver directory the image lacks gets a
//! tmpfs of its own for the files' mounts and links; and the createContainer hook of a spec written before
//! refuses to mount from the runtime's own mount namespace. A pod through containerd 2.1.9's CRI gets its GPU from such a spec too. Run as
//! root after `cargo build --workspace` (and `scripts/sid-engines.sh`,
//! `scripts/sid-runtimes.sh`, `scripts/youki.sh`): `cargo test --test cdi_hook_mounts_e2e`.

use nvhook_test_support as support;

use std::path::Path;
use std::process::Command;

use serde_json::json;
use support::containerd2::{CriNode, DEFAULT_HANDLER};
use support::cri::ContainerRequest;
use support::engines::{output_of, unique_name, youki_bin};
use support::hook_mounts::{assert_same_view_both_ways, spec_mounts, write_spec};
use support::podman::{CdiSpecFile, Podman};
use support::{
    Bundle, MountNs, RuntimeEnv, SimNode, busybox_image, glibc_image, gpucheck_args,
    host_mounts_referencing, nvhook_bin, require_root, run_clean,
};

const GPUS: u32 = 4;
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";

/// nvhook's createRuntime hook entry for `node`, with the hook's own `args`.
fn create_runtime_hook(node: &SimNode, args: Vec<serde_json::Value>) -> serde_json::Value {
    let mut all = vec![
        json!("nvhook"),
        json!("--config"),
        json!(node.config()),
        json!("hook"),
        json!("createRuntime"),
    ];
    all.extend(args);
    json!({ "path": nvhook_bin(), "args": all })
}

/// The engines of this test: a name and a Podman with its `podman run` flags.
fn engines(ns: &MountNs) -> Vec<(&'static str, Podman, Vec<&'static str>)> {
    vec![
        ("Podman 4.3, runc 1.1.5", Podman::new(), vec![]),
        ("Podman 5, runc 1.3", Podman::sid(), vec![]),
        (
            "Podman 5, crun 1.28, cgroup v2",
            Podman::sid().within(ns).running(Path::new("crun")),
            // No pids controller in that hierarchy: Podman's default limit is turned off.
            vec!["--pids-limit", "0"],
        ),
    ]
}

/// GPU 1 through a spec with no mount at all: exactly that GPU, libcuda loads, the driver
/// files are read-only, the hook logged the mounts it made, and none is left on the host.
#[test]
fn podman_runs_a_device_whose_mounts_nvhooks_hook_makes() {
    require_root();
    let ns = MountNs::new(RuntimeEnv::CgroupV2);
    for (engine, podman, flags) in engines(&ns) {
        let node = SimNode::create(GPUS);
        let spec = CdiSpecFile::new("json");
        let written = write_spec(&node, "hook", spec.path());
        assert!(spec_mounts(&written).is_empty(), "{written:#}");
        let image = format!("localhost/{}:latest", unique_name("nvhook-hook-mounts"));
        podman.import(glibc_image().rootfs(), &image);
        let args = gpucheck_args(GPUS, &["--write", LIBCUDA]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut run_flags = vec!["--device", "nvidia.com/gpu=1"];
        run_flags.extend(&flags);
        let mut output = podman.run(&run_flags, &image, &args);
        output.hook_log = Some(node.log());
        output.assert_success();
        output.assert_gpus(GPUS, &[1]);
        output.assert_lines(&[
            "dlopen libcuda.so.1 ok",
            "cuInit 0",
            &format!("write {LIBCUDA} EROFS"),
        ]);
        assert!(
            node.log().contains("driver files mounted"),
            "{engine}: {}",
            node.log()
        );
        let leaked = host_mounts_referencing(&[node.root()]);
        assert!(
            leaked.is_empty(),
            "{engine}: driver files still mounted: {leaked:#?}"
        );
    }
}

/// The hook's mounts give the container what the runtime's give it, file by file, on every
/// engine of this test and on Podman over youki: the same files at the same paths, the same
/// links beside them, each a mount of the same host file with the same options (read-only,
/// nosuid, nodev). The user-namespaced and rootless engines are compared in
/// tests/userns_e2e.rs and tests/cdi_e2e.rs.
#[test]
fn the_hooks_mounts_show_the_container_what_the_runtimes_show_it() {
    require_root();
    let ns = MountNs::new(RuntimeEnv::CgroupV2);
    let mut engines = engines(&ns);
    engines.push((
        "Podman 4.3, youki",
        Podman::with_runtime(youki_bin()),
        vec![],
    ));
    for (engine, podman, flags) in engines {
        let image = format!("localhost/{}:latest", unique_name("nvhook-busybox"));
        podman.import(busybox_image().rootfs(), &image);
        let node = SimNode::create(GPUS);
        let spec = CdiSpecFile::new("json");
        assert_same_view_both_ways(engine, &node, spec.path(), |args| {
            let mut run_flags = vec!["--device", "nvidia.com/gpu=1"];
            run_flags.extend(&flags);
            podman.run(&run_flags, &image, args)
        });
    }
}

/// A node whose driver libraries live in a directory images do not have
/// (`/usr/local/nvidia/lib64`, GKE's layout), where the spec keeps them: the hook gives that
/// directory a tmpfs of the container's own holding the files' mounts and the links, and the
/// container sees the same files, links, modes and mounts as through a spec whose runtime
/// binds each file into the container's layer (on runc 1.1.5, runc 1.3 and crun).
#[test]
fn a_driver_directory_made_a_tmpfs_tree_shows_what_per_file_mounts_show() {
    require_root();
    let ns = MountNs::new(RuntimeEnv::CgroupV2);
    for (engine, podman, flags) in engines(&ns) {
        let image = format!("localhost/{}:latest", unique_name("nvhook-busybox"));
        podman.import(busybox_image().rootfs(), &image);
        let node = SimNode::create_with(GPUS, &["--lib-dir", "usr/local/nvidia/lib64"]);
        let spec = CdiSpecFile::new("json");
        assert_same_view_both_ways(engine, &node, spec.path(), |args| {
            let mut run_flags = vec!["--device", "nvidia.com/gpu=1"];
            run_flags.extend(&flags);
            podman.run(&run_flags, &image, args)
        });
        let log = node.log();
        let bound: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("driver files mounted"))
            .collect();
        // Both hook runs (grouped arguments, one entry each) made the library directory a tree.
        assert_eq!(bound.len(), 2, "{engine}:\n{log}");
        for line in bound {
            assert!(
                !line.contains("trees=0") && !line.contains("in_trees=0"),
                "{engine}: {line}\n{log}"
            );
        }
    }
}

/// Two directories the image lacks that are one directory under two names (`/lib` links to
/// `usr/lib`, as on a merged-/usr image): a tmpfs on each would hide the first one's files, so
/// both keep their files per-file, and the container sees all four; a third directory beside
/// them is still a tree.
#[test]
fn one_directory_under_two_names_keeps_its_files_per_file() {
    require_root();
    let node = SimNode::create(GPUS);
    let source = node
        .driver_root()
        .join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
    let files = [
        "/lib/firmware/nvidia/a.bin",
        "/lib/firmware/nvidia/b.bin",
        "/usr/lib/firmware/nvidia/c.bin",
        "/usr/lib/firmware/nvidia/d.bin",
        "/opt/nvidia/e.bin",
        "/opt/nvidia/f.bin",
    ];
    let mut script = String::new();
    for file in files {
        script.push_str(&format!("test -s {file} && echo found {file}; "));
    }
    let mut bundle = Bundle::new(busybox_image(), &["/bin/sh", "-c", &script]);
    std::fs::create_dir_all(bundle.rootfs().join("usr/lib")).expect("make usr/lib");
    std::fs::create_dir_all(bundle.rootfs().join("opt")).expect("make opt");
    std::os::unix::fs::symlink("usr/lib", bundle.rootfs().join("lib")).expect("link lib");
    let mut args = Vec::new();
    for file in files {
        args.extend([json!("--bind-file"), json!(source), json!(file)]);
    }
    bundle.raw_hook("createRuntime", create_runtime_hook(&node, args));
    let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV2);
    output.assert_success();
    for file in files {
        assert!(
            output.stdout.contains(&format!("found {file}\n")),
            "{file}: {output}"
        );
    }
    let log = node.log();
    assert!(
        log.lines()
            .any(|l| l.contains("driver files mounted") && l.contains("in_trees=2 trees=1")),
        "{log}"
    );
}

/// A tree is made once on the node and copied into each container after: the second
/// container's hook makes none and its container sees the same files and links. A driver file
/// replaced (a new inode, as an upgrade writes it) gets a new tree, and the old one is removed
/// from the node with its mounts, as is one a hook that is gone left half-made. Where the
/// node's store cannot be made, the container gets a tmpfs of its own with the same files, and
/// the log says why.
#[test]
fn a_tree_is_kept_on_the_node_and_copied_into_each_container() {
    require_root();
    let node = SimNode::create(GPUS);
    let sources = node.driver_root().join("opt-nvidia");
    std::fs::create_dir(&sources).expect("make the sources' directory");
    for (name, text) in [("a.bin", "one"), ("b.bin", "two")] {
        std::fs::write(sources.join(name), text).expect("write a source");
    }
    let script = "cat /opt/nvidia/a.bin /opt/nvidia/lib/b.bin; echo; readlink /opt/nvidia/c.bin";
    let start = || {
        let mut bundle = Bundle::new(busybox_image(), &["/bin/sh", "-c", script]);
        std::fs::create_dir_all(bundle.rootfs().join("opt")).expect("make opt");
        let mut args = vec![json!("--link"), json!("/opt/nvidia/c.bin=a.bin")];
        for (source, file) in [
            ("a.bin", "/opt/nvidia/a.bin"),
            ("b.bin", "/opt/nvidia/lib/b.bin"),
        ] {
            args.extend([
                json!("--bind-file"),
                json!(sources.join(source)),
                json!(file),
            ]);
        }
        bundle.raw_hook("createRuntime", create_runtime_hook(&node, args));
        // In the host's mount namespace, where the node's store stays between starts.
        let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
        output.assert_success();
        output
    };
    let store = node.root().join("run/hook-trees");
    let trees = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&store)
            .map(|entries| entries.flatten())
            .into_iter()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| !name.starts_with('.'))
            .collect();
        names.sort();
        names
    };
    let kept_mounts = |tree: &str| {
        let table = std::fs::read_to_string("/proc/self/mountinfo").expect("read the mount table");
        let at = store.join(tree).display().to_string();
        table.lines().filter(|l| l.contains(&at)).count()
    };
    let made = |log: &str| log.matches("a tree kept on the host").count();
    let seen = "onetwo\na.bin\n";
    for round in 1..=2 {
        let output = start();
        assert_eq!(output.stdout, seen, "round {round}: {output}");
        let log = node.log();
        assert_eq!(made(&log), 1, "round {round}:\n{log}");
        assert_eq!(
            log.matches("in_trees=2 trees=1 kept=1").count(),
            round,
            "{log}"
        );
    }
    let first = trees();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(kept_mounts(&first[0]), 2);
    // A tree a hook that is gone left half-made, with a file bound in it.
    let half = store.join(".0123456789abcdef.4000000000");
    std::fs::create_dir(&half).expect("make a half-made tree");
    std::fs::write(half.join("b.bin"), "").expect("make a mount point");
    let bound = Command::new("mount")
        .arg("--bind")
        .arg(sources.join("b.bin"))
        .arg(half.join("b.bin"))
        .status();
    assert!(bound.is_ok_and(|s| s.success()), "mount --bind");
    // The driver upgraded: a.bin is a new file.
    std::fs::remove_file(sources.join("a.bin")).expect("remove a source");
    std::fs::write(sources.join("a.bin"), "ONE").expect("write a source anew");
    let output = start();
    assert_eq!(output.stdout, "ONEtwo\na.bin\n", "{output}");
    assert_eq!(made(&node.log()), 2, "{}", node.log());
    let second = trees();
    assert!(second.len() == 1 && second != first, "{first:?} {second:?}");
    assert_eq!(kept_mounts(&first[0]), 0, "the old tree's mounts are left");
    assert!(!store.join(format!(".{}.sources", first[0])).exists());
    assert!(!half.exists(), "the half-made tree is left");
    // A store that cannot be made: a tmpfs of the container's own.
    let unmounted = Command::new("umount").arg("--lazy").arg(&store).status();
    assert!(
        unmounted.is_ok_and(|s| s.success()),
        "umount {}",
        store.display()
    );
    std::fs::remove_dir_all(&store).expect("remove the store");
    std::fs::write(&store, "").expect("put a file in the store's place");
    let output = start();
    assert_eq!(output.stdout, "ONEtwo\na.bin\n", "{output}");
    let log = node.log();
    let store_line = format!(
        "the trees get a tmpfs of their own: no store for them: cannot create {}: File exists",
        store.display()
    );
    assert!(log.contains(&store_line), "{log}");
    assert!(log.contains("in_trees=2 trees=1 kept=0"), "{log}");
}

/// The hook makes no mount on the runtime's side: at createContainer when the runtime runs it
/// in its own mount namespace (against the OCI spec), at createRuntime when the state's pid
/// shares that namespace (no container's process). One line each, and the rootfs is as it was.
#[test]
fn the_hook_refuses_to_mount_from_the_runtimes_mount_namespace() {
    require_root();
    let node = SimNode::create(GPUS);
    let bundle = Bundle::new(busybox_image(), &["/bin/true"]);
    bundle.write_config();
    let source = node
        .driver_root()
        .join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
    let pid = std::process::id();
    let state = json!({
        "ociVersion": "1.2.0", "id": bundle.id(), "status": "creating",
        "pid": pid, "bundle": bundle.dir(),
    });
    let state_file = bundle.dir().join("state.json");
    std::fs::write(&state_file, state.to_string()).expect("write the state");
    let refusals = [
        (
            "createContainer",
            "nvhook: the runtime ran nvhook's createContainer hook in its own mount namespace"
                .to_string(),
        ),
        (
            "createRuntime",
            format!(
                "nvhook: pid {pid}, the container's process by the OCI state, shares the runtime's mount namespace"
            ),
        ),
    ];
    for (stage, refusal) in refusals {
        let output = output_of(
            Command::new(nvhook_bin())
                .arg("--config")
                .arg(node.config())
                .args(["hook", stage, "--bind-file"])
                .arg(&source)
                .arg("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
                .stdin(std::fs::File::open(&state_file).expect("open the state")),
        );
        assert!(!output.status.success(), "{stage}: {output}");
        let line = output.stderr.trim();
        assert!(
            line.starts_with(&refusal) && !line.contains('\n'),
            "{stage}: {output}"
        );
        assert!(host_mounts_referencing(&[node.root()]).is_empty());
        assert!(
            !bundle
                .rootfs()
                .join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
                .exists()
        );
    }
}

/// A rootfs whose propagation is shared would carry the hook's mounts to the host's view of
/// it: the hook refuses to make them, in one line that names the way out, before it looks at
/// the container.
#[test]
fn the_hook_makes_no_mount_under_a_shared_rootfs() {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = Bundle::new(busybox_image(), &["/bin/true"]);
    bundle.rootfs_propagation("rshared");
    bundle.write_config();
    let source = node
        .driver_root()
        .join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
    let state = json!({
        "ociVersion": "1.2.0", "id": bundle.id(), "status": "creating",
        "pid": std::process::id(), "bundle": bundle.dir(),
    });
    let state_file = bundle.dir().join("state.json");
    std::fs::write(&state_file, state.to_string()).expect("write the state");
    let output = output_of(
        Command::new(nvhook_bin())
            .arg("--config")
            .arg(node.config())
            .args(["hook", "createRuntime", "--bind-file"])
            .arg(&source)
            .arg("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
            .stdin(std::fs::File::open(&state_file).expect("open the state")),
    );
    assert!(!output.status.success(), "{output}");
    assert_eq!(
        output.stderr.trim(),
        "nvhook: linux.rootfsPropagation is \"rshared\": the driver files' mounts nvhook's CDI hook makes would propagate to the host; use private or slave, or set cdi-mounts = \"runtime\" in the nvhook config and regenerate the CDI spec",
        "{output}"
    );
    assert!(host_mounts_referencing(&[node.root()]).is_empty());
}

/// A pod through containerd 2.1.9's CRI asking for `nvidia.com/gpu=1` (the device plugin's
/// `cdi-cri` strategy, Docker 29's `--gpus`, a DRA claim's spec do the same): containerd
/// injects the spec's nodes and hook, runc runs the hook, and the pod gets exactly GPU 1 with
/// libcuda loading, nothing left mounted once containerd stops.
#[test]
fn a_pod_through_containerds_cri_gets_its_gpu_from_a_spec_whose_hook_mounts() {
    let mut node = CriNode::start("cdi-hook-mounts", GPUS, &[], false, |_, node, _| {
        node.set("cdi-mounts", "\"hook\"");
    });
    let args = gpucheck_args(GPUS, &["--write", LIBCUDA]);
    let request = ContainerRequest {
        cdi_devices: &["nvidia.com/gpu=1"],
        ..Default::default()
    };
    let run = node.run_gpucheck(DEFAULT_HANDLER, "hook-mounts", &args, request);
    run.output.assert_gpus(GPUS, &[1]);
    run.output.assert_lines(&[
        "dlopen libcuda.so.1 ok",
        "cuInit 0",
        &format!("write {LIBCUDA} EROFS"),
    ]);
    assert!(
        node.node.log().contains("driver files mounted"),
        "{}",
        node.node.log()
    );
    node.stop();
}
