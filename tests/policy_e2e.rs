//! Device-selection policy end to end: real runc containers with nvhook as the prestart
//! hook on a simulated 4-GPU node, for every combination of privileged / unprivileged,
//! NVIDIA_VISIBLE_DEVICES / the device plugin's volume-mount list / both, and the two
//! config switches `accept-env-when-unprivileged` and `accept-volume-mount-devices`.
//! Asserts which GPUs each container can open and that an ignored variable is logged.
//!
//! Run as root after `cargo build --workspace`: `cargo test --test policy_e2e`.

use nvhook_test_support as support;

use support::{Bundle, RuntimeEnv, SimNode, glibc_image, run_clean};

const GPUS: u32 = 4;
/// What the environment asks for, and what the volume mounts ask for: disjoint, so the
/// GPUs a container sees tell which source won.
const ENV_GPUS: [u32; 2] = [0, 1];
const MOUNT_GPUS: [u32; 2] = [2, 3];
const IGNORED_LOG: &str = "NVIDIA_VISIBLE_DEVICES ignored";

#[derive(Clone, Copy, Debug)]
enum Asks {
    Env,
    Mounts,
    Both,
}

impl Asks {
    fn env(self) -> bool {
        matches!(self, Asks::Env | Asks::Both)
    }

    fn mounts(self) -> bool {
        matches!(self, Asks::Mounts | Asks::Both)
    }
}

#[derive(Clone, Copy, Debug)]
struct Switches {
    accept_env_when_unprivileged: bool,
    accept_volume_mount_devices: bool,
}

/// nvidia-container-toolkit's rule: accepted volume mounts, when present, are the whole
/// selection; else the variable, for a privileged container or when the switch accepts it
/// from unprivileged ones (otherwise it is ignored, with a log line).
fn expected(privileged: bool, asks: Asks, switches: Switches) -> (Vec<u32>, bool) {
    if switches.accept_volume_mount_devices && asks.mounts() {
        return (MOUNT_GPUS.to_vec(), false);
    }
    if !asks.env() {
        return (vec![], false);
    }
    if privileged || switches.accept_env_when_unprivileged {
        (ENV_GPUS.to_vec(), false)
    } else {
        (vec![], true)
    }
}

fn bundle(node: &SimNode, privileged: bool, asks: Asks) -> Bundle {
    let mut args = vec!["/gpucheck".to_string()];
    for index in 0..GPUS {
        args.extend(["--dev".to_string(), format!("/dev/nvidia{index}")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &args);
    if asks.env() {
        let list: Vec<String> = ENV_GPUS.iter().map(u32::to_string).collect();
        bundle.env(&format!("NVIDIA_VISIBLE_DEVICES={}", list.join(",")));
    }
    if asks.mounts() {
        for index in MOUNT_GPUS {
            bundle.device_list_mount(&index.to_string());
        }
    }
    if privileged {
        bundle.privileged();
    }
    bundle.prestart_hook(node);
    bundle
}

/// Every privilege and request combination on a node configured with `switches`.
fn check_policy(switches: Switches) {
    let node = SimNode::create(GPUS);
    node.configure(&format!(
        "accept-env-when-unprivileged = {}\naccept-volume-mount-devices = {}",
        switches.accept_env_when_unprivileged, switches.accept_volume_mount_devices
    ));
    for privileged in [false, true] {
        for asks in [Asks::Env, Asks::Mounts, Asks::Both] {
            let case = format!("privileged={privileged} asks={asks:?} {switches:?}");
            let (gpus, ignored) = expected(privileged, asks, switches);
            let logged_before = node.log().matches(IGNORED_LOG).count();
            let output = run_clean(
                &bundle(&node, privileged, asks),
                Some(&node),
                RuntimeEnv::CgroupV1,
            );
            assert!(output.status.success(), "{case}\n{output}");
            output.assert_gpus(GPUS, &gpus);
            let logged = node.log().matches(IGNORED_LOG).count() - logged_before;
            assert_eq!(logged, usize::from(ignored), "{case}: log lines\n{output}");
        }
    }
}

#[test]
fn policy_default_accepts_env_and_volume_mounts() {
    check_policy(Switches {
        accept_env_when_unprivileged: true,
        accept_volume_mount_devices: true,
    });
}

/// What `nvhook configure containerd --kubernetes` writes: unprivileged pods get GPUs
/// only from the device plugin's volume mounts.
#[test]
fn policy_hardened_ignores_env_of_unprivileged_containers() {
    check_policy(Switches {
        accept_env_when_unprivileged: false,
        accept_volume_mount_devices: true,
    });
}

#[test]
fn policy_env_only() {
    check_policy(Switches {
        accept_env_when_unprivileged: true,
        accept_volume_mount_devices: false,
    });
}

#[test]
fn policy_neither_source_for_unprivileged_containers() {
    check_policy(Switches {
        accept_env_when_unprivileged: false,
        accept_volume_mount_devices: false,
    });
}

/// A legacy CUDA image (`CUDA_VERSION` alone, from before `NVIDIA_REQUIRE_CUDA`) asks for every
/// GPU through its environment: on a hardened node an unprivileged container of it starts with
/// no GPU and the log says why, as for `NVIDIA_VISIBLE_DEVICES`; a privileged one, or any on a
/// node that accepts the environment, gets them all.
#[test]
fn policy_hardened_ignores_a_legacy_cuda_image_of_an_unprivileged_container() {
    let node = SimNode::create(GPUS);
    let legacy = |privileged: bool| {
        let args = support::gpucheck_args(GPUS, &["--ls", "/dev"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut bundle = Bundle::new(glibc_image(), &args);
        // The node's CUDA is 12.4: the implied cuda>=12.4 holds.
        bundle.env("CUDA_VERSION=12.4.1");
        if privileged {
            bundle.privileged();
        }
        bundle.prestart_hook(&node);
        bundle
    };
    let all: Vec<u32> = (0..GPUS).collect();
    for (hardened, privileged) in [(true, false), (true, true), (false, false)] {
        node.set("accept-env-when-unprivileged", &(!hardened).to_string());
        let case = format!("hardened={hardened} privileged={privileged}");
        let logged_before = node.log().matches(IGNORED_LOG).count();
        let output = run_clean(&legacy(privileged), Some(&node), RuntimeEnv::CgroupV1);
        let logged = node.log().matches(IGNORED_LOG).count() - logged_before;
        if hardened && !privileged {
            output.assert_no_gpu_given(&case);
            output.assert_gpus(GPUS, &[]);
            for control in support::CONTROL_NODES {
                output.assert_lines(&[&format!("dev {control} absent")]);
            }
            assert_eq!(
                logged, 1,
                "{case}: the ignored environment is logged\n{output}"
            );
        } else {
            output.assert_success();
            output.assert_gpus(GPUS, &all);
            output.assert_lines(&["dlopen libcuda.so.1 ok"]);
            assert_eq!(logged, 0, "{case}\n{output}");
        }
    }
}
