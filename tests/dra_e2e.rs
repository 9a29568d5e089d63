//! nvhook's DRA driver end to end (issue 39): `nvhook-dra` on a simulated node, registered by
//! the kubelet double through its registration socket and called over the kubelet's gRPC,
//! reading ResourceClaims from the API server double; the CDI ids it answers, given to
//! Debian sid's containerd 2.1.9 as the kubelet gives them (`CDIDevices` in CreateContainer),
//! give a pod exactly the allocated GPUs through runc, and unprepare leaves nothing. What no
//! test here has: a kube-apiserver and the scheduler's allocation (the claims are written
//! allocated, as the scheduler would leave them). Run as root after `cargo build --workspace`
//! (and `scripts/sid-engines.sh`): `cargo test --test dra_e2e`.

use nvhook_test_support as support;
use support::{containerd2, cri};

use k8s_openapi::api::resource::v1::ResourceSlice;
use nvhook_dra::kubelet::Kubelet;
use nvhook_dra::{Claim, Health};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use containerd2::{Containerd2Cri, Pods};
use cri::{ContainerRequest, Cri};
use support::apiserver::ApiServer;
use support::dra::{DRIVER, NODE, Plugin, allocated_claim};
use support::engines::{Containerd, EngineDir};
use support::{Output, SimNode, gpucheck_args, require_root, workspace_bin};

const GPUS: u32 = 4;

/// gpucheck: every GPU and control node, the nvidia entries of /dev, libcuda through the
/// loader, then `extra`.
fn gpucheck(extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--ls", "/dev"];
    args.extend(extra);
    gpucheck_args(GPUS, &args)
}

/// Debian sid's containerd 2.1.9 reading CDI specs where nvhook-dra writes them (`dir/cdi`),
/// the gpucheck image, and where its pods run.
struct Engine {
    containerd: Containerd,
    cri: Cri,
    image: String,
    pods: Pods,
}

impl Engine {
    fn start(dir: &Path, name: &str) -> Engine {
        let setup = Containerd2Cri {
            cdi_spec_dirs: vec![dir.join("cdi")],
            ..Containerd2Cri::under(dir)
        };
        let containerd = setup.start(dir, &[]);
        let image = containerd.import_gpucheck_image(dir);
        let cri = Cri::connect(containerd.socket());
        let pods = Pods::new(name, dir);
        Engine {
            containerd,
            cri,
            image,
            pods,
        }
    }

    /// A pod of gpucheck with `extra` arguments, given `cdi_ids` as the kubelet gives a
    /// prepared claim's devices.
    fn run(&mut self, node: &SimNode, cdi_ids: &[String], extra: &[&str]) -> Output {
        let ids: Vec<&str> = cdi_ids.iter().map(String::as_str).collect();
        let args = gpucheck(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.pods.run(
            &mut self.cri,
            &self.containerd,
            node,
            "dra",
            ContainerRequest {
                image: &self.image,
                args: &args,
                cdi_devices: &ids,
                ..Default::default()
            },
        )
    }
}

#[test]
fn claims_prepared_by_nvhook_dra_give_pods_exactly_their_gpus_through_containerd() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("dra");
    let api = ApiServer::start();
    let plugin = Plugin::start(&node, dir.path(), &api);
    let kubelet = Kubelet::new().expect("a kubelet double");
    let registered = kubelet
        .register(&plugin.registration_socket())
        .expect("the kubelet registers nvhook-dra");
    assert_eq!(registered.info.name, DRIVER);

    let mut engine = Engine::start(dir.path(), "dra");

    // One GPU: the device named by its minor.
    let (one, one_ref) = allocated_claim("one", NODE, &["gpu-1"]);
    api.put_claim(one);
    let answer = registered
        .prepare(std::slice::from_ref(&one_ref))
        .expect("prepare");
    let devices = answer[&one_ref.uid].as_ref().expect("claim one prepared");
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device, "gpu-1");
    assert_eq!(devices[0].pool, NODE);
    assert_eq!(devices[0].requests, ["gpu"]);
    let expected_id = format!("k8s.gpu.nvidia.com/claim={}-gpu-1", one_ref.uid);
    assert_eq!(devices[0].cdi_ids, std::slice::from_ref(&expected_id));
    let output = engine.run(&node, &devices[0].cdi_ids, &[]);
    output.assert_allocated_gpu_only("a one-GPU claim", GPUS, 1);
    // Prepared again (a kubelet restart): the same answer.
    let again = registered
        .prepare(std::slice::from_ref(&one_ref))
        .expect("prepare again");
    assert_eq!(
        again[&one_ref.uid].as_ref().unwrap()[0].cdi_ids,
        [expected_id]
    );

    // Two GPUs in one claim.
    let (two, two_ref) = allocated_claim("two", NODE, &["gpu-0", "gpu-3"]);
    api.put_claim(two);
    let answer = registered
        .prepare(std::slice::from_ref(&two_ref))
        .expect("prepare");
    let devices = answer[&two_ref.uid].as_ref().expect("claim two prepared");
    let ids: Vec<String> = devices.iter().flat_map(|d| d.cdi_ids.clone()).collect();
    assert_eq!(ids.len(), 2);
    let output = engine.run(&node, &ids, &[]);
    output.assert_gpus(GPUS, &[0, 3]);
    output.assert_lines(&["dlopen libcuda.so.1 ok", "cuInit 0"]);

    // Unprepare removes exactly that claim's spec and checkpoint entry.
    let answer = registered
        .unprepare(std::slice::from_ref(&one_ref))
        .expect("unprepare");
    assert_eq!(answer[&one_ref.uid], Ok(()));
    assert!(!plugin.spec(&one_ref.uid).exists());
    assert!(plugin.spec(&two_ref.uid).exists());
    assert!(!plugin.checkpoint().contains(&one_ref.uid));
    assert!(plugin.checkpoint().contains(&two_ref.uid));
    registered
        .unprepare(std::slice::from_ref(&two_ref))
        .expect("unprepare");
    assert!(!plugin.spec(&two_ref.uid).exists());
}

#[test]
fn claims_that_cannot_be_prepared_here_get_one_line_and_nothing_is_written() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("dra-faults");
    let api = ApiServer::start();
    let plugin = Plugin::start(&node, dir.path(), &api);
    let kubelet = Kubelet::new().expect("a kubelet double");
    let registered = kubelet.register(&plugin.registration_socket()).unwrap();

    let (elsewhere, elsewhere_ref) = allocated_claim("elsewhere", "node-b", &["gpu-0"]);
    let (missing, missing_ref) = allocated_claim("missing", NODE, &["gpu-9"]);
    let (mut unallocated, unallocated_ref) = allocated_claim("unallocated", NODE, &["gpu-0"]);
    unallocated.status = None;
    for claim in [elsewhere, missing, unallocated] {
        api.put_claim(claim);
    }
    let (_, unknown_ref) = allocated_claim("unknown", NODE, &["gpu-0"]);
    let (_, mut malformed_ref) = allocated_claim("malformed", NODE, &["gpu-0"]);
    malformed_ref.name.clear();
    let claims = [
        (
            malformed_ref,
            "the kubelet named a claim without a namespace, name or uid",
        ),
        (elsewhere_ref, "of pool node-b, not of this node (node-a)"),
        (
            missing_ref,
            "gpu-9, which this node does not have (it offers: gpu-0, gpu-1, gpu-2, gpu-3)",
        ),
        (unallocated_ref, "is not allocated"),
        (
            unknown_ref,
            "cannot read claim ml/unknown from the API server",
        ),
    ];
    let asked: Vec<Claim> = claims.iter().map(|(c, _)| c.clone()).collect();
    let answer = registered.prepare(&asked).expect("every claim answered");
    for (claim, needle) in &claims {
        let line = answer[&claim.uid].as_ref().expect_err("refused");
        assert!(line.contains(needle) && !line.contains('\n'), "{line}");
        assert!(!plugin.spec(&claim.uid).exists());
    }
    assert!(!plugin.checkpoint().contains("elsewhere"));

    // The API server unreachable: the claim cannot be read, nothing is written.
    let (ok, ok_ref) = allocated_claim("ok", NODE, &["gpu-2"]);
    api.put_claim(ok);
    api.set_unreachable(true);
    let answer = registered
        .prepare(std::slice::from_ref(&ok_ref))
        .expect("answered");
    let line = answer[&ok_ref.uid].as_ref().expect_err("refused");
    assert!(
        line.contains("cannot read claim ml/ok from the API server"),
        "{line}"
    );
    assert!(!plugin.spec(&ok_ref.uid).exists());
    api.set_unreachable(false);
    assert!(registered.prepare(std::slice::from_ref(&ok_ref)).unwrap()[&ok_ref.uid].is_ok());
}

#[test]
fn a_plugin_killed_between_prepare_and_unprepare_still_unprepares_and_keeps_the_gpu_taken() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("dra-restart");
    let api = ApiServer::start();
    let plugin = Plugin::start(&node, dir.path(), &api);
    let kubelet = Kubelet::new().expect("a kubelet double");
    let (first, first_ref) = allocated_claim("first", NODE, &["gpu-1"]);
    api.put_claim(first);
    {
        let registered = kubelet.register(&plugin.registration_socket()).unwrap();
        assert!(
            registered
                .prepare(std::slice::from_ref(&first_ref))
                .unwrap()[&first_ref.uid]
                .is_ok()
        );
    }
    plugin.kill();
    let plugin = Plugin::start(&node, dir.path(), &api);
    let registered = kubelet.register(&plugin.registration_socket()).unwrap();
    // A second claim for the same GPU (a stale allocation) is refused: the first holds it.
    let (second, second_ref) = allocated_claim("second", NODE, &["gpu-1"]);
    api.put_claim(second);
    let answer = registered
        .prepare(std::slice::from_ref(&second_ref))
        .unwrap();
    let line = answer[&second_ref.uid].as_ref().expect_err("refused");
    assert!(line.contains("which claim ml/first"), "{line}");
    assert!(
        registered
            .unprepare(std::slice::from_ref(&first_ref))
            .unwrap()[&first_ref.uid]
            .is_ok()
    );
    assert!(!plugin.spec(&first_ref.uid).exists());
    assert!(
        registered
            .prepare(std::slice::from_ref(&second_ref))
            .unwrap()[&second_ref.uid]
            .is_ok()
    );
}

/// The node's slice once it is its pool's only one and `done` says it is as expected.
fn slice_when(api: &ApiServer, done: impl Fn(&ResourceSlice) -> bool) -> ResourceSlice {
    slices_when(api, |slices| matches!(slices, [slice] if done(slice))).remove(0)
}

/// The node's slices, by name, once `done` says they are as expected, within 20 s.
fn slices_when(api: &ApiServer, done: impl Fn(&[ResourceSlice]) -> bool) -> Vec<ResourceSlice> {
    let started = Instant::now();
    loop {
        let mut slices = api.slices();
        slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        if done(&slices) {
            return slices;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the node's ResourceSlices did not come as expected: {slices:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn device_names(slice: &ResourceSlice) -> Vec<String> {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.clone())
        .collect()
}

fn uuids(slice: &ResourceSlice) -> Vec<String> {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .filter_map(|d| d.attributes.as_ref()?.get("uuid")?.string.clone())
        .collect()
}

#[test]
fn the_nodes_slice_follows_a_gpu_leaving_the_bus_and_health_says_so() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("dra-slices");
    let api = ApiServer::start();
    let plugin = Plugin::start(&node, dir.path(), &api);
    let slice = slice_when(&api, |s| {
        s.spec.devices.as_ref().is_some_and(|d| d.len() == 4)
    });
    assert_eq!(device_names(&slice), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    assert_eq!(slice.spec.driver, DRIVER);
    assert_eq!(slice.spec.node_name.as_deref(), Some(NODE));
    assert_eq!(slice.spec.pool.name, NODE);
    assert_eq!(slice.spec.pool.generation, 1);
    let attributes = slice.spec.devices.as_ref().unwrap()[1]
        .attributes
        .clone()
        .unwrap();
    assert_eq!(attributes["type"].string.as_deref(), Some("gpu"));
    assert_eq!(
        attributes["uuid"].string.as_deref(),
        Some(node.gpu_uuid(1).as_str())
    );
    let driver_version = node.driver_version();
    assert_eq!(
        attributes["driverVersion"].version.as_deref(),
        Some(driver_version.as_str())
    );
    let kubelet = Kubelet::new().expect("a kubelet double");
    let registered = kubelet.register(&plugin.registration_socket()).unwrap();
    let first = registered
        .health_updates(1, Duration::from_secs(20))
        .unwrap()
        .remove(0);
    assert_eq!(first.len(), 4);
    assert!(
        first.iter().all(|d| d.health == Health::Healthy),
        "{first:?}"
    );

    // GPU 1 falls off the bus.
    let lost = node.gpu_uuid(1);
    node.change(&["--gpus", &GPUS.to_string(), "--lost-gpu", "1"]);
    let slice = slice_when(&api, |s| {
        s.spec.devices.as_ref().is_some_and(|d| d.len() == 3)
    });
    assert_eq!(slice.spec.pool.generation, 2);
    assert!(!uuids(&slice).contains(&lost), "{slice:#?}");
    let now = registered
        .health_updates(1, Duration::from_secs(20))
        .unwrap()
        .remove(0);
    let unhealthy: Vec<&str> = now
        .iter()
        .filter(|d| d.health == Health::Unhealthy)
        .map(|d| d.device.as_str())
        .collect();
    assert_eq!(unhealthy.len(), 1, "{now:?}");
    assert!(!device_names(&slice).contains(&unhealthy[0].to_string()));

    // An uninstall with no kubelet left removes the node's slice.
    drop(plugin);
    let status = Command::new(workspace_bin("nvhook-dra"))
        .args(["--node-name", NODE, "--api-server", &api.url()])
        .arg("--config")
        .arg(node.config())
        .arg("remove-slices")
        .status()
        .expect("run nvhook-dra remove-slices");
    assert!(status.success());
    assert!(api.slices().is_empty());
}

/// NVIDIA's pattern for a static MIG device's name, `^gpu-\d+-mig-[a-z0-9-]+-\d+-\d+$`.
fn is_nvidia_mig_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some((minor, rest)) = name
        .strip_prefix("gpu-")
        .and_then(|rest| rest.split_once("-mig-"))
    else {
        return false;
    };
    let mut tail = rest.rsplitn(3, '-');
    let (start, profile_id, profile) = (tail.next(), tail.next(), tail.next());
    digits(minor)
        && start.is_some_and(digits)
        && profile_id.is_some_and(digits)
        && profile.is_some_and(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// The nvidia-caps minor the simulated driver gives a MIG capability (`gpu1/mig/gi2/access`).
fn cap_minor(node: &SimNode, capability: &str) -> u32 {
    let path = node
        .root()
        .join("proc/driver/nvidia/capabilities")
        .join(capability);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("DeviceFileMinor: "))
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or_else(|| panic!("no DeviceFileMinor in {}: {text}", path.display()))
}

/// A GPU in MIG mode is offered as its MIG devices, under NVIDIA's names and with NVIDIA's
/// attributes, and not as itself; a claim allocated one of them by the name the node's slice
/// gives gets a pod exactly that MIG device through containerd 2.1.9 and runc: its GPU's node
/// and its GPU and compute instances' caps nodes, not the other MIG device's, and libcuda.
#[test]
fn a_claim_for_a_mig_device_by_nvidias_name_gives_a_pod_exactly_that_mig_device() {
    require_root();
    let node = SimNode::create_with(GPUS, &["--mig", "1:2"]);
    let dir = EngineDir::new("dra-mig");
    let api = ApiServer::start();
    let plugin = Plugin::start(&node, dir.path(), &api);
    // Three whole GPUs and GPU 1's two MIG devices.
    let slice = slice_when(&api, |s| {
        s.spec.devices.as_ref().is_some_and(|d| d.len() == 5)
    });
    let topology = node.topology();
    let migs = topology["gpus"][1]["mig_devices"]
        .as_array()
        .expect("GPU 1's MIG devices");
    let (ours, other) = (&migs[1], &migs[0]);
    let ours_uuid = ours["uuid"].as_str().unwrap();
    let listed = slice.spec.devices.as_ref().unwrap();
    let device = listed
        .iter()
        .find(|d| {
            d.attributes
                .as_ref()
                .and_then(|a| a.get("uuid")?.string.as_deref())
                == Some(ours_uuid)
        })
        .unwrap_or_else(|| panic!("no device with the MIG UUID {ours_uuid}: {slice:#?}"));
    let name = device.name.clone();
    assert!(is_nvidia_mig_name(&name), "{name}");
    assert!(name.starts_with("gpu-1-mig-3g40gb-"), "{name}");
    let names = device_names(&slice);
    assert!(!names.contains(&"gpu-1".to_string()), "{names:?}");
    for whole in ["gpu-0", "gpu-2", "gpu-3"] {
        assert!(names.contains(&whole.to_string()), "{names:?}");
    }
    let attributes = device.attributes.as_ref().unwrap();
    assert_eq!(attributes["type"].string.as_deref(), Some("mig"));
    assert_eq!(
        attributes["parentUUID"].string.as_deref(),
        Some(node.gpu_uuid(1).as_str())
    );
    assert_eq!(attributes["profile"].string.as_deref(), Some("3g.40gb"));
    let capacity = device.capacity.as_ref().expect("the MIG device's capacity");
    assert!(capacity.contains_key("memory"), "{capacity:?}");
    // Its profile's multiprocessors and engines, as NVML describes 3g.40gb.
    for (name, count) in [
        ("multiprocessors", "42"),
        ("copyEngines", "3"),
        ("decoders", "2"),
    ] {
        assert_eq!(capacity[name].value.0, count, "{name}: {capacity:?}");
    }
    assert!(
        capacity
            .keys()
            .filter(|k| k.starts_with("memorySlice"))
            .count()
            == 4,
        "{capacity:?}"
    );

    let kubelet = Kubelet::new().expect("a kubelet double");
    let registered = kubelet.register(&plugin.registration_socket()).unwrap();
    let mut engine = Engine::start(dir.path(), "dra-mig");

    let (claim, claim_ref) = allocated_claim("mig", NODE, &[&name]);
    api.put_claim(claim);
    let answer = registered
        .prepare(std::slice::from_ref(&claim_ref))
        .expect("prepare");
    let devices = answer[&claim_ref.uid]
        .as_ref()
        .expect("the MIG claim prepared");
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device, name);
    let expected_id = format!("k8s.gpu.nvidia.com/claim={}-{name}", claim_ref.uid);
    assert_eq!(devices[0].cdi_ids, [expected_id]);

    let caps = |mig: &serde_json::Value| {
        let gi = format!("gpu1/mig/gi{}", mig["gpu_instance_id"]);
        let ci = format!("{gi}/ci{}", mig["compute_instance_id"]);
        [&gi, &ci].map(|c| {
            format!(
                "/dev/nvidia-caps/nvidia-cap{}",
                cap_minor(&node, &format!("{c}/access"))
            )
        })
    };
    let (ours_caps, other_caps) = (caps(ours), caps(other));
    let mut extra: Vec<&str> = Vec::new();
    for cap in ours_caps.iter().chain(&other_caps) {
        extra.extend(["--dev", cap]);
    }
    extra.extend(["--ls", "/dev/nvidia-caps"]);
    let output = engine.run(&node, &devices[0].cdi_ids, &extra);
    output.assert_success();
    output.assert_gpus(GPUS, &[1]);
    assert_eq!(output.gpu_nodes_in_dev(), ["nvidia1"], "{output}");
    for cap in &ours_caps {
        output.assert_lines(&[&format!("dev {cap} ENXIO")]);
    }
    for cap in &other_caps {
        output.assert_lines(&[&format!("dev {cap} absent")]);
    }
    let mut in_caps: Vec<&str> = output
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ls /dev/nvidia-caps "))
        .collect();
    in_caps.sort_unstable();
    let mut expected: Vec<&str> = ours_caps
        .iter()
        .map(|c| c.strip_prefix("/dev/nvidia-caps/").unwrap())
        .collect();
    expected.sort_unstable();
    assert_eq!(in_caps, expected, "{output}");
    output.assert_lines(&["dlopen libcuda.so.1 ok", "cuInit 0"]);

    let answer = registered
        .unprepare(std::slice::from_ref(&claim_ref))
        .expect("unprepare");
    assert_eq!(answer[&claim_ref.uid], Ok(()));
    assert!(!plugin.spec(&claim_ref.uid).exists());
    assert!(!plugin.checkpoint().contains(&claim_ref.uid));
}

/// The host's IMEX channels are in the node's pool as NVIDIA's ComputeDomain driver lists them
/// (`channel-<N>`, `type` channel, `id`); a claim allocated a GPU and a channel gets a pod that
/// GPU and exactly that channel's node, and the channel is not given to a second claim until
/// the first is unprepared.
#[test]
fn a_claim_for_an_imex_channel_gives_the_pod_exactly_that_channel_beside_its_gpu() {
    require_root();
    let node = SimNode::create_with(GPUS, &["--imex-channels", "3"]);
    let dir = EngineDir::new("dra-imex");
    let api = ApiServer::start();
    let plugin = Plugin::start(&node, dir.path(), &api);
    let slice = slice_when(&api, |s| {
        s.spec.devices.as_ref().is_some_and(|d| d.len() == 7)
    });
    let listed = slice.spec.devices.as_ref().unwrap();
    let channel = listed
        .iter()
        .find(|d| d.name == "channel-1")
        .unwrap_or_else(|| panic!("no channel-1: {:?}", device_names(&slice)));
    let attributes = channel.attributes.as_ref().unwrap();
    assert_eq!(attributes["type"].string.as_deref(), Some("channel"));
    assert_eq!(attributes["id"].int, Some(1));

    let kubelet = Kubelet::new().expect("a kubelet double");
    let registered = kubelet.register(&plugin.registration_socket()).unwrap();
    let mut engine = Engine::start(dir.path(), "dra-imex");
    let (claim, claim_ref) = allocated_claim("fabric", NODE, &["gpu-2", "channel-1"]);
    api.put_claim(claim);
    let answer = registered
        .prepare(std::slice::from_ref(&claim_ref))
        .expect("prepare");
    let devices = answer[&claim_ref.uid].as_ref().expect("the claim prepared");
    let ids: Vec<String> = devices.iter().flat_map(|d| d.cdi_ids.clone()).collect();
    assert_eq!(
        ids,
        [
            format!("k8s.gpu.nvidia.com/claim={}-gpu-2", claim_ref.uid),
            format!("k8s.gpu.nvidia.com/claim={}-channel-1", claim_ref.uid),
        ]
    );
    const IMEX_DIR: &str = "/dev/nvidia-caps-imex-channels";
    let output = engine.run(
        &node,
        &ids,
        &[
            "--ls",
            IMEX_DIR,
            "--dev",
            "/dev/nvidia-caps-imex-channels/channel1",
        ],
    );
    output.assert_success();
    output.assert_gpus(GPUS, &[2]);
    let in_dir: Vec<&str> = output
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ls /dev/nvidia-caps-imex-channels "))
        .collect();
    assert_eq!(in_dir, ["channel1"], "{output}");
    output.assert_lines(&[
        "dev /dev/nvidia-caps-imex-channels/channel1 ENXIO",
        "dlopen libcuda.so.1 ok",
    ]);

    // The channel is the first claim's until it is unprepared.
    let (second, second_ref) = allocated_claim("fabric-2", NODE, &["channel-1"]);
    api.put_claim(second);
    let answer = registered
        .prepare(std::slice::from_ref(&second_ref))
        .expect("the kubelet's call");
    let refused = answer[&second_ref.uid].as_ref().unwrap_err();
    assert!(refused.contains("channel-1, which claim"), "{refused}");
    registered
        .unprepare(std::slice::from_ref(&claim_ref))
        .expect("unprepare");
    let answer = registered
        .prepare(std::slice::from_ref(&second_ref))
        .expect("prepare");
    assert!(answer[&second_ref.uid].is_ok(), "{answer:?}");
    registered
        .unprepare(std::slice::from_ref(&second_ref))
        .expect("unprepare");
    assert!(!plugin.spec(&second_ref.uid).exists());
}

/// A pool past the API's 128 devices a slice is published in as many slices as it takes, all
/// at one generation and each saying how many the pool has; when the pool fits one slice
/// again, the other is deleted and the first republished at the next generation.
#[test]
fn a_pool_past_one_slice_is_published_in_two_and_shrinks_back_to_one() {
    require_root();
    let node = SimNode::create_with(GPUS, &["--imex-channels", "130"]);
    let dir = EngineDir::new("dra-pool");
    let api = ApiServer::start();
    let _plugin = Plugin::start(&node, dir.path(), &api);
    let slices = slices_when(&api, |slices| slices.len() == 2);
    let names: Vec<&str> = slices
        .iter()
        .map(|s| s.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            format!("{NODE}-gpu.nvidia.com"),
            format!("{NODE}-gpu.nvidia.com-1")
        ]
    );
    let sizes: Vec<usize> = slices.iter().map(|s| device_names(s).len()).collect();
    assert_eq!(sizes, [128, 6]);
    for slice in &slices {
        assert_eq!(slice.spec.pool.name, NODE);
        assert_eq!(slice.spec.pool.generation, 1);
        assert_eq!(slice.spec.pool.resource_slice_count, 2);
    }
    assert_eq!(device_names(&slices[1]).last().unwrap(), "channel-129");

    node.change(&["--gpus", &GPUS.to_string(), "--imex-channels", "2"]);
    let slice = slice_when(&api, |s| device_names(s).len() == 6);
    assert_eq!(
        slice.metadata.name.as_deref(),
        Some(format!("{NODE}-gpu.nvidia.com").as_str())
    );
    assert_eq!(slice.spec.pool.generation, 2);
    assert_eq!(slice.spec.pool.resource_slice_count, 1);
}

/// With `--dynamic-mig`, a GPU in MIG mode with no MIG device is offered as partitionable
/// devices (KEP-4815, as NVIDIA's DynamicMIG): its counter set in a slice of its own, every
/// place of every MIG profile a device that consumes from it, all accepted by the API server
/// double's v1 validation. A claim for one place gets its MIG device made through NVML at
/// prepare (the mock's), and a pod through containerd 2.1.9 and runc gets exactly that MIG
/// device; an overlapping place is refused in one line with nothing kept; the pool does not
/// change while the device exists; a plugin restarted before unprepare still destroys it.
#[test]
fn a_claim_for_a_mig_partition_makes_that_mig_device_and_unprepare_destroys_it() {
    require_root();
    let node = SimNode::create_with(GPUS, &["--mig", "1:0"]);
    let dir = EngineDir::new("dra-dynamic-mig");
    let api = ApiServer::start();
    let plugin = Plugin::start_with(&node, dir.path(), &api, &["--dynamic-mig"]);
    let slices = slices_when(&api, |slices| slices.len() == 2);
    let counters = slices[0]
        .spec
        .shared_counters
        .as_ref()
        .expect("the first slice holds the counter sets");
    assert_eq!(counters.len(), 1);
    assert_eq!(counters[0].name, "gpu-1-counter-set");
    let whole = &counters[0].counters;
    assert_eq!(whole["multiprocessors"].value.0, "98");
    assert_eq!(
        (0..8)
            .filter(|i| whole.contains_key(&format!("memory-slice-{i}")))
            .count(),
        8
    );
    let names = device_names(&slices[1]);
    assert!(names.starts_with(&["gpu-0".to_string()]), "{names:?}");
    assert!(!names.contains(&"gpu-1".to_string()), "{names:?}");
    let place = "gpu-1-mig-3g40gb-9-4";
    let listed = slices[1].spec.devices.as_ref().unwrap();
    let device = listed
        .iter()
        .find(|d| d.name == place)
        .unwrap_or_else(|| panic!("no {place}: {names:?}"));
    let attributes = device.attributes.as_ref().unwrap();
    assert_eq!(attributes["type"].string.as_deref(), Some("mig"));
    assert_eq!(attributes["profile"].string.as_deref(), Some("3g.40gb"));
    assert!(!attributes.contains_key("uuid"), "a place has no UUID");
    let capacity = device.capacity.as_ref().unwrap();
    assert_eq!(capacity["multiprocessors"].value.0, "42");
    let consumed = device.consumes_counters.as_ref().unwrap();
    assert_eq!(consumed.len(), 1);
    assert_eq!(consumed[0].counter_set, "gpu-1-counter-set");
    let mut taken: Vec<&str> = consumed[0]
        .counters
        .keys()
        .filter(|k| k.starts_with("memory-slice-"))
        .map(String::as_str)
        .collect();
    taken.sort_unstable();
    assert_eq!(
        taken,
        [
            "memory-slice-4",
            "memory-slice-5",
            "memory-slice-6",
            "memory-slice-7"
        ]
    );

    let kubelet = Kubelet::new().expect("a kubelet double");
    let registered = kubelet.register(&plugin.registration_socket()).unwrap();
    let mut engine = Engine::start(dir.path(), "dra-dyn");
    let (claim, claim_ref) = allocated_claim("part", NODE, &[place]);
    api.put_claim(claim);
    let answer = registered
        .prepare(std::slice::from_ref(&claim_ref))
        .expect("prepare");
    let devices = answer[&claim_ref.uid].as_ref().expect("the claim prepared");
    assert_eq!(
        devices[0].cdi_ids,
        [format!(
            "k8s.gpu.nvidia.com/claim={}-{place}",
            claim_ref.uid
        )]
    );
    let topology = node.topology();
    let made = topology["gpus"][1]["mig_devices"]
        .as_array()
        .expect("GPU 1's MIG devices");
    assert_eq!(made.len(), 1, "{made:?}");
    let gi = format!("gpu1/mig/gi{}", made[0]["gpu_instance_id"]);
    let ci = format!("{gi}/ci{}", made[0]["compute_instance_id"]);
    let caps = [&gi, &ci].map(|c| {
        format!(
            "/dev/nvidia-caps/nvidia-cap{}",
            cap_minor(&node, &format!("{c}/access"))
        )
    });
    let output = engine.run(
        &node,
        &devices[0].cdi_ids,
        &[
            "--ls",
            "/dev/nvidia-caps",
            "--dev",
            &caps[0],
            "--dev",
            &caps[1],
        ],
    );
    output.assert_success();
    output.assert_gpus(GPUS, &[1]);
    for cap in &caps {
        output.assert_lines(&[&format!("dev {cap} ENXIO")]);
    }
    output.assert_lines(&["dlopen libcuda.so.1 ok", "cuInit 0"]);

    // An overlapping place, which the scheduler's counters would not give: refused in one
    // line, nothing kept.
    let (over, over_ref) = allocated_claim("over", NODE, &["gpu-1-mig-1g10gb-19-5"]);
    api.put_claim(over);
    let answer = registered
        .prepare(std::slice::from_ref(&over_ref))
        .expect("the kubelet's call");
    let refused = answer[&over_ref.uid].as_ref().unwrap_err();
    assert!(
        refused.contains("cannot make MIG device gpu-1-mig-1g10gb-19-5")
            && refused.contains("INSUFFICIENT_RESOURCES")
            && !refused.contains('\n'),
        "{refused}"
    );
    assert!(!plugin.spec(&over_ref.uid).exists());
    assert!(!plugin.checkpoint().contains(&over_ref.uid));
    // The pool is as it was: the place's device did not change with its MIG device made.
    std::thread::sleep(Duration::from_secs(2));
    let now = slices_when(&api, |slices| slices.len() == 2);
    assert!(now.iter().all(|s| s.spec.pool.generation == 1), "{now:#?}");

    // Killed before the unprepare: the restarted plugin still destroys what it made.
    drop(plugin);
    let plugin = Plugin::start_with(&node, dir.path(), &api, &["--dynamic-mig"]);
    let registered = kubelet.register(&plugin.registration_socket()).unwrap();
    let answer = registered
        .unprepare(std::slice::from_ref(&claim_ref))
        .expect("unprepare");
    assert_eq!(answer[&claim_ref.uid], Ok(()));
    let left = node.topology()["gpus"][1]["mig_devices"].clone();
    assert_eq!(left, serde_json::json!([]), "{left}");
    assert!(!plugin.spec(&claim_ref.uid).exists());
    assert!(!plugin.checkpoint().contains(&claim_ref.uid));
}
