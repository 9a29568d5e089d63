//! Creating and destroying a whole node directory, safely: simnode only ever
//! deletes what carries its marker, and never descends into a mount.

use crate::devices::{self, Majors};
use crate::machine::Toolchain;
use crate::spec::{Gpu, Params};
use crate::{driver, procfs, sysfs, topology, wsl};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};

const MARKER: &str = ".simnode";
/// Bumped when the layout changes, so tests can tell what they read.
const MARKER_FORMAT: u32 = 1;

/// The marker's content: everything a test needs to know about the node.
#[derive(Serialize)]
struct Marker<'a> {
    simnode: u32,
    params: &'a Params,
    majors: Majors,
    driver_root: PathBuf,
    config: PathBuf,
    gpus: &'a [Gpu],
}

/// What `destroy` requires of a marker before it deletes anything.
#[derive(Deserialize)]
struct MarkerCheck {
    simnode: u32,
}

/// nvhook's config for this node (keys as nvhook's config.toml spells them).
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct HookConfig {
    driver_root: PathBuf,
    dev_root: PathBuf,
    proc_root: PathBuf,
    sys_root: PathBuf,
    log_file: PathBuf,
    log_level: &'static str,
    /// The node's own: with one file for all, nodes used in turn (the bench, parallel tests)
    /// would keep replacing each other's answer.
    nvml_cache_file: PathBuf,
    /// The node's own too: cgroup v2 device programs are kept there once a test mounts a
    /// bpffs on its parent, and nowhere (not in the host's bpffs) otherwise.
    device_program_pins: PathBuf,
    hook_path: PathBuf,
}

pub struct Inputs<'a> {
    pub toolchain: &'a Toolchain,
    pub params: &'a Params,
    pub mock_nvml: &'a Path,
    pub hook_path: &'a Path,
    /// Rebuild an existing node in place instead of a new one.
    pub keep_state: Option<KeepState>,
    pub display: Display,
    /// Entries of other libraries in the driver root's loader cache.
    pub other_libraries: usize,
}

/// What a desktop or workstation host has beyond a headless one, and where its kernel
/// takes firmware from.
#[derive(Default)]
pub struct Display {
    /// nvidia-drm is loaded: DRM nodes per GPU.
    pub drm: bool,
    /// The kernel's `firmware_class.path`.
    pub firmware_path: Option<String>,
}

/// How a node changes in place.
#[derive(Clone, Copy)]
pub struct KeepState {
    /// The kernel module was reloaded and got other dynamic majors.
    pub new_majors: bool,
}

/// What a node changed in place keeps: what nvhook wrote (its log, NVML's cached answer,
/// the /dev/char links), what the tests wrote (the config they appended to, the records of
/// NVML inits and memory limit calls), and the marker that says it is simnode's.
const KEPT: &[&str] = &[
    MARKER,
    "config.toml",
    "nvhook.log",
    "nvml-inits",
    topology::MEMORY_LIMIT_CALLS,
    "run",
    "dev/char",
];

#[derive(Deserialize)]
struct MarkerMajors {
    majors: Majors,
}

pub fn create(dir: &Path, inputs: &Inputs) -> Result<()> {
    inputs.params.validate()?;
    if !inputs.mock_nvml.is_file() {
        bail!(
            "mock NVML not found at {}: build it with `cargo build -p mock-nvml` or pass --mock-nvml PATH",
            inputs.mock_nvml.display()
        );
    }
    let (dir, majors) = match inputs.keep_state {
        None => (prepare(dir)?, Majors::pick()?),
        Some(keep) => {
            let dir = dir
                .canonicalize()
                .with_context(|| format!("cannot resolve {}: no such node", dir.display()))?;
            check_marker(&dir)?;
            let old = read_marker::<MarkerMajors>(&dir)?.majors;
            // The driver keeps the memory limits set until its module is unloaded.
            let mut kept = KEPT.to_vec();
            if !keep.new_majors {
                kept.push(topology::MEMORY_LIMITS_STATE);
            }
            clear_except(&dir, &kept)?;
            let majors = match keep.new_majors {
                true => Majors::pick_other_than(old)?,
                false => old,
            };
            (dir, majors)
        }
    };
    let gpus = inputs.params.gpu_list();
    let driver_root = dir.join("driver");
    let config = dir.join("config.toml");

    // The marker goes first: a build that fails halfway can still be
    // replaced or destroyed.
    let marker = Marker {
        simnode: MARKER_FORMAT,
        params: inputs.params,
        majors,
        driver_root: driver_root.clone(),
        config: config.clone(),
        gpus: &gpus,
    };
    let marker_json = serde_json::to_string_pretty(&marker)? + "\n";
    fs::write(dir.join(MARKER), marker_json).context("cannot write the node marker")?;

    if inputs.params.wsl {
        wsl::build(
            &dir,
            inputs.toolchain,
            inputs.params,
            &gpus,
            inputs.mock_nvml,
        )?;
        return finish(&dir, inputs, &gpus, &config, driver_root);
    }
    let firmware_path = inputs.display.firmware_path.as_deref();
    driver::build(
        &driver_root,
        inputs.toolchain,
        inputs.params,
        &gpus,
        inputs.mock_nvml,
        majors.caps,
        firmware_path,
    )?;
    driver::add_other_libraries(&driver_root, inputs.toolchain, inputs.other_libraries)?;
    let caps = devices::capabilities(&gpus);
    let fabric = &inputs.params.fabric;
    devices::make_nodes(&dir.join("dev"), &gpus, majors, &caps, fabric)?;
    let sys_root = dir.join("sys");
    if inputs.display.drm {
        devices::make_drm_nodes(&dir.join("dev"), &gpus)?;
    }
    sysfs::write(&sys_root, &gpus, inputs.display.drm, firmware_path)?;
    let proc_root = dir.join("proc");
    procfs::write(
        &proc_root,
        inputs.toolchain.arch,
        inputs.params,
        &gpus,
        majors,
        &caps,
        inputs.display.drm,
    )?;
    finish(&dir, inputs, &gpus, &config, driver_root)
}

/// nvhook's config for the node, and the summary.
fn finish(
    dir: &Path,
    inputs: &Inputs,
    gpus: &[Gpu],
    config: &Path,
    driver_root: PathBuf,
) -> Result<()> {
    let hook_config = HookConfig {
        driver_root,
        dev_root: dir.to_path_buf(),
        proc_root: dir.join("proc"),
        sys_root: dir.join("sys"),
        log_file: dir.join("nvhook.log"),
        log_level: "debug",
        nvml_cache_file: dir.join("run/nvml-inventory.json"),
        device_program_pins: dir.join("bpf/nvhook"),
        hook_path: inputs.hook_path.to_path_buf(),
    };
    if inputs.keep_state.is_none() || !config.exists() {
        let toml = toml::to_string(&hook_config).context("cannot render config.toml")?;
        fs::write(config, toml).with_context(|| format!("cannot write {}", config.display()))?;
    }

    print_summary(dir, inputs.params, gpus, config);
    Ok(())
}

/// An empty node directory, canonical: made new, emptied when it is an old
/// node, refused when it holds anything simnode did not make.
fn prepare(dir: &Path) -> Result<PathBuf> {
    if !dir.exists() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let dir = dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", dir.display()))?;
    if !dir.is_dir() {
        bail!(
            "{} is not a directory: pick a directory path for the node",
            dir.display()
        );
    }
    let empty = fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .next()
        .is_none();
    if !empty {
        check_marker(&dir)?;
        clear(&dir)?;
    }
    Ok(dir)
}

pub fn destroy(dir: &Path) -> Result<()> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}: no such node", dir.display()))?;
    check_marker(&dir)?;
    clear(&dir)?;
    fs::remove_dir(&dir)
        .with_context(|| format!("cannot remove {} (is it a mount point?)", dir.display()))?;
    println!("simnode: removed {}", dir.display());
    Ok(())
}

fn read_marker<T: serde::de::DeserializeOwned>(dir: &Path) -> Result<T> {
    let path = dir.join(MARKER);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("cannot parse {}", path.display()))
}

fn check_marker(dir: &Path) -> Result<()> {
    let path = dir.join(MARKER);
    let refuse = || {
        format!(
            "{} has no valid {MARKER} marker, so simnode did not make it: refusing to delete it; remove it yourself or pick another directory",
            dir.display()
        )
    };
    let is_file = fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
    if !is_file {
        bail!(refuse());
    }
    let text = fs::read_to_string(&path).with_context(refuse)?;
    let marker: MarkerCheck = serde_json::from_str(&text).with_context(refuse)?;
    if marker.simnode != MARKER_FORMAT {
        bail!(refuse());
    }
    Ok(())
}

/// Removes everything inside `dir`, after making sure nothing is mounted
/// there (remove_dir_all would otherwise delete into the mounted file system).
fn clear(dir: &Path) -> Result<()> {
    clear_except(dir, &[])
}

/// nvhook's own mounts in a node's state directory: the CDI hook's kept trees and the NRI
/// plugin's gathered driver directories (one that was killed). A node removed takes them
/// down; one rebuilt with `--keep-state` keeps them, as a host keeps `/run`.
const STATE_MOUNTS: &[&str] = &["run/hook-trees", "run/driver-dirs"];

/// Removes everything in `dir` but the `kept` paths (relative, at most one directory deep).
fn clear_except(dir: &Path, kept: &[&str]) -> Result<()> {
    let mountinfo =
        fs::read_to_string("/proc/self/mountinfo").context("cannot read /proc/self/mountinfo")?;
    let under = |m: &Path, paths: &[&str]| paths.iter().any(|p| m.starts_with(dir.join(p)));
    let inside = mount_points(&mountinfo).filter(|m| m.starts_with(dir) && m != dir);
    let mut state = Vec::new();
    for mount in inside.filter(|m| !under(m, kept)) {
        if !under(&mount, STATE_MOUNTS) {
            bail!(
                "{} is mounted inside the node: unmount it first",
                mount.display()
            );
        }
        state.push(mount);
    }
    for store in STATE_MOUNTS.iter().map(|p| dir.join(p)) {
        if state.iter().any(|m| m.starts_with(&store)) {
            let path = std::ffi::CString::new(store.as_os_str().as_encoded_bytes())?;
            // SAFETY: path is a valid NUL-terminated string for the call.
            if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
                let e = std::io::Error::last_os_error();
                bail!("cannot unmount {}: {e}", store.display());
            }
        }
    }
    remove_entries(dir, dir, kept)
}

fn remove_entries(root: &Path, dir: &Path, kept: &[&str]) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let rel = path.strip_prefix(root).unwrap_or(&path);
        if kept.iter().any(|k| rel == Path::new(k)) {
            continue;
        }
        let holds_kept = kept.iter().any(|k| Path::new(k).starts_with(rel));
        let is_dir = fs::symlink_metadata(&path)?.is_dir();
        if is_dir && holds_kept {
            remove_entries(root, &path, kept)?;
            continue;
        }
        let removed = if is_dir {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        removed.with_context(|| format!("cannot remove {}", path.display()))?;
    }
    Ok(())
}

/// Mount points from /proc/self/mountinfo, as nvhook's own parser reads them.
fn mount_points(mountinfo: &str) -> impl Iterator<Item = PathBuf> + '_ {
    mountinfo
        .lines()
        .filter_map(nvhook_cgroup::mountinfo::parse_mount)
        .map(|mount| mount.mount_point)
}

fn print_summary(dir: &Path, params: &Params, gpus: &[Gpu], config: &Path) {
    println!(
        "simnode: node ready at {} ({} GPUs, driver {}, CUDA {})",
        dir.display(),
        gpus.len(),
        params.driver_version,
        params.cuda_version
    );
    for gpu in gpus {
        println!(
            "  GPU {} {} at {}",
            gpu.index,
            gpu.uuid,
            gpu.kernel_bus_id()
        );
        for mig in &gpu.mig {
            println!(
                "    {} (GI {} CI {})",
                mig.uuid, mig.gpu_instance_id, mig.compute_instance_id
            );
        }
    }
    println!("  config: {}", config.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_decode_escapes() {
        let info = "36 35 98:0 /mnt1 /mnt/my\\040dir rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 35 98:0 / /tmp rw - tmpfs tmpfs rw\n";
        let points: Vec<PathBuf> = mount_points(info).collect();
        assert_eq!(
            points,
            [PathBuf::from("/mnt/my dir"), PathBuf::from("/tmp")]
        );
    }

    /// nvhook's own mounts in a node's state directory stay when the node is rebuilt with
    /// its state and go when it is cleared; any other mount inside a node is refused. Needs
    /// root, as the end-to-end tests do.
    #[test]
    fn a_nodes_state_mounts_go_with_it_and_others_are_refused() {
        // SAFETY: geteuid reads the process's id and touches no memory.
        assert_eq!(unsafe { libc::geteuid() }, 0, "run the tests as root");
        let dir = tempfile::tempdir().unwrap();
        let mount = |at: &Path| {
            fs::create_dir_all(at).unwrap();
            let status = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "tmpfs"])
                .arg(at)
                .status()
                .unwrap();
            assert!(status.success(), "mount {}", at.display());
        };
        let store = dir.path().join("run/hook-trees");
        mount(&store);
        fs::write(store.join("tree"), "").unwrap();
        let mounted = |at: &Path| {
            let table = fs::read_to_string("/proc/self/mountinfo").unwrap();
            mount_points(&table).any(|m| m == at)
        };
        clear_except(dir.path(), &["run"]).unwrap();
        assert!(mounted(&store) && store.join("tree").exists());
        let other = dir.path().join("driver");
        mount(&other);
        let refused = clear(dir.path()).unwrap_err().to_string();
        assert!(refused.contains("is mounted inside the node"), "{refused}");
        let unmounted = std::process::Command::new("umount").arg(&other).status();
        assert!(unmounted.unwrap().success());
        clear(dir.path()).unwrap();
        assert!(!mounted(&store));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
