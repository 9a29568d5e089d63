//! `/dev/char/MAJ:MIN` links on the simulated node: with the systemd cgroup driver, runc
//! gives systemd only the device rules whose link resolves, and a `systemctl daemon-reload`
//! drops the rest from a running container. nvhook makes the links for every node it hands out
//! (nvhook-runtime, before it execs the runtime), for every NVIDIA node (`nvhook dev-char-links`, run
//! at boot and by udev), and for the nodes a CDI spec names (`nvhook cdi generate/refresh`).

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use nvhook_test_support::{Bundle, SimNode, glibc_image, nvhook_bin, require_root, workspace_bin};

/// `(major, minor)` of every allow rule naming one device in the spec's
/// `linux.resources.devices`.
fn allowed_devices(spec: &serde_json::Value) -> Vec<(u64, u64)> {
    spec["linux"]["resources"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["allow"] == true)
        .filter_map(|r| Some((r["major"].as_u64()?, r["minor"].as_u64()?)))
        .collect()
}

/// Whether `<dev>/char/MAJ:MIN` leads to a character device with those numbers, as systemd
/// needs it to.
fn resolves(node: &SimNode, major: u64, minor: u64) -> bool {
    let link = node.dev_root().join(format!("dev/char/{major}:{minor}"));
    fs::metadata(link).is_ok_and(|m| {
        m.file_type().is_char_device()
            && libc::major(m.rdev()) as u64 == major
            && libc::minor(m.rdev()) as u64 == minor
    })
}

fn char_dir(node: &SimNode) -> PathBuf {
    node.dev_root().join("dev/char")
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn nvhook_runtime_links_every_node_it_hands_to_the_runtime_before_execing_it() {
    require_root();
    let node = SimNode::create_with(4, &["--mig", "2:2"]);
    let scratch = tempfile::tempdir().unwrap();
    // The runtime records /dev/char as it finds it when it starts: that is when runc reads the
    // rules and gives them to systemd.
    let seen = scratch.path().join("seen");
    let runtime = scratch.path().join("runc");
    fs::write(
        &runtime,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > {seen}.argv\nls {dir} > {seen}\n",
            seen = seen.display(),
            dir = char_dir(&node).display()
        ),
    )
    .unwrap();
    fs::set_permissions(&runtime, fs::Permissions::from_mode(0o755)).unwrap();
    node.configure(&format!("runtimes = [{:?}]", runtime.display().to_string()));
    assert!(!char_dir(&node).exists(), "the node starts without links");

    let mut bundle = Bundle::new(glibc_image(), &["/bin/true"]);
    bundle.env("NVIDIA_VISIBLE_DEVICES=1,2:0");
    bundle.write_config();
    let out = Command::new(workspace_bin("nvhook-runtime"))
        .args(["--systemd-cgroup", "create", "--bundle"])
        .arg(bundle.dir())
        .arg(bundle.id())
        .env("NVHOOK_CONFIG", node.config())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}\n{}", node.log());
    let argv = fs::read_to_string(seen.with_extension("argv")).unwrap();
    assert_eq!(argv.lines().next(), Some("--systemd-cgroup"));

    let spec: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(bundle.dir().join("config.json")).unwrap())
            .unwrap();
    let rules = allowed_devices(&spec);
    assert!(rules.contains(&(195, 1)), "GPU 1's rule: {rules:?}");
    let seen = fs::read_to_string(&seen).unwrap();
    for (major, minor) in &rules {
        assert!(
            seen.lines().any(|l| l == format!("{major}:{minor}")),
            "{major}:{minor} was not linked when the runtime started: {seen}"
        );
        assert!(resolves(&node, *major, *minor), "{major}:{minor}");
    }
    // Only what this container was given: GPU 0's node is not its business.
    assert!(!char_dir(&node).join("195:0").exists());
    assert_eq!(
        fs::read_link(char_dir(&node).join("195:1")).unwrap(),
        Path::new("../nvidia1")
    );
}

fn nvhook(node: &SimNode, args: &[&str]) -> std::process::Output {
    Command::new(nvhook_bin())
        .arg("--config")
        .arg(node.config())
        .args(args)
        .output()
        .unwrap()
}

/// Every `nvidia*` node under the node's /dev and /dev/nvidia-caps, as `(major, minor)`.
fn every_nvidia_node(node: &SimNode) -> Vec<(u64, u64)> {
    let mut found = Vec::new();
    for dir in ["dev", "dev/nvidia-caps"] {
        for entry in fs::read_dir(node.dev_root().join(dir)).unwrap().flatten() {
            let meta = fs::symlink_metadata(entry.path()).unwrap();
            let named = entry.file_name().to_string_lossy().starts_with("nvidia");
            if named && meta.file_type().is_char_device() {
                found.push((
                    libc::major(meta.rdev()) as u64,
                    libc::minor(meta.rdev()) as u64,
                ));
            }
        }
    }
    assert!(found.len() > 4, "the node has GPUs, control nodes and caps");
    found
}

#[test]
fn dev_char_links_links_every_nvidia_node_once_and_says_so() {
    require_root();
    let node = SimNode::create_with(2, &["--mig", "1:2"]);
    let out = nvhook(&node, &["dev-char-links"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let nodes = every_nvidia_node(&node);
    for (major, minor) in &nodes {
        assert!(resolves(&node, *major, *minor), "{major}:{minor}\n{stdout}");
    }
    assert!(stdout.contains("created "), "{stdout}");
    assert!(
        stdout.ends_with(&format!(
            "{} NVIDIA device nodes linked in {}\n",
            nodes.len(),
            char_dir(&node).display()
        )),
        "{stdout}"
    );
    // Again: nothing to do, nothing said but the count.
    let again = nvhook(&node, &["dev-char-links"]);
    assert!(again.status.success());
    assert_eq!(String::from_utf8_lossy(&again.stdout).lines().count(), 1);
}

#[test]
fn an_entry_that_is_not_a_link_is_left_and_named_in_one_line() {
    require_root();
    let node = SimNode::create(2);
    fs::create_dir_all(char_dir(&node)).unwrap();
    fs::write(char_dir(&node).join("195:1"), "not ours").unwrap();
    let out = nvhook(&node, &["dev-char-links"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("195:1 is not a link: left as it is"),
        "{stderr}"
    );
    assert!(stderr.lines().last().unwrap().contains("1 of "), "{stderr}");
    assert_eq!(
        fs::read_to_string(char_dir(&node).join("195:1")).unwrap(),
        "not ours"
    );
    // The others are made all the same.
    assert!(resolves(&node, 195, 0) && resolves(&node, 195, 255));
}

#[test]
fn a_char_directory_that_is_a_link_is_never_written_through() {
    require_root();
    let node = SimNode::create(1);
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), char_dir(&node)).unwrap();
    let out = nvhook(&node, &["dev-char-links"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("must be a directory, not a link"),
        "{stderr}"
    );
    assert_eq!(entries(elsewhere.path()), Vec::<String>::new());
}

#[test]
fn cdi_refresh_links_the_nodes_its_spec_names() {
    require_root();
    let node = SimNode::create(2);
    let spec = node.root().join("cdi/nvidia.yaml");
    let out = nvhook(
        &node,
        &["cdi", "refresh", "--output", spec.to_str().unwrap()],
    );
    assert!(out.status.success(), "{out:?}");
    for (major, minor) in every_nvidia_node(&node) {
        assert!(resolves(&node, major, minor), "{major}:{minor}");
    }
}
