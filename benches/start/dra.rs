//! 10: DRA (issue 39). What `nvhook-dra` costs the kubelet: NodePrepareResources of a one-GPU
//! claim over the kubelet's gRPC, the claim read from the API server double and the node's
//! inventory in memory (and NodeUnprepareResources after it); then a pod's container start on
//! containerd 2.1.9 through the DRA claim's CDI id against the same pod through the device
//! plugin's CDI name (`nvidia.com/gpu=3` in nvhook's node spec), against the same device from
//! the node's spec written with `cdi-mounts = "runtime"` (the runtime making the driver files'
//! mounts; the node's own spec leaves them to nvhook's hook, the default), and against plain
//! runc, the variants taking turns round by round in rotating order, each pod on a node left
//! alone for a moment after the last; the claim's pod against the device plugin's, paired by
//! round. Needs `scripts/sid-engines.sh`.

use crate::pod_parts::{Pods, TimedRunc, engine_dir, settle};
use crate::stats::Samples;
use crate::support::SimNode;
use crate::support::apiserver::ApiServer;
use crate::support::containerd2::{Containerd2Cri, DEFAULT_HANDLER};
use crate::support::cri::{ContainerRequest, Cri};
use crate::support::dra::{NODE, Plugin, allocated_claim};
use crate::support::engines::{CgroupParent, unique_name};
use nvhook_dra::kubelet::Kubelet;
use std::time::Instant;

/// The kind of the bench's copy of the node spec written with `cdi-mounts = "runtime"`.
const RUNTIME_MOUNTS_KIND: &str = "nvhook-bench.example/runtime-mounts";

const GPUS: u32 = 8;

pub fn run(rounds: usize) {
    let node = SimNode::create(GPUS);
    let dir = engine_dir("dra-bench");
    let api = ApiServer::start();
    let plugin = Plugin::start(&node, dir.path(), &api);
    let kubelet = Kubelet::new().expect("a kubelet double");
    let registered = kubelet
        .register(&plugin.registration_socket())
        .expect("register nvhook-dra");

    // NodePrepareResources and NodeUnprepareResources of a fresh one-GPU claim each round,
    // after one warm-up (its first inventory).
    let mut prepare = Samples::default();
    let mut unprepare = Samples::default();
    for round in 0..=rounds {
        let (claim, named) = allocated_claim("bench", NODE, &["gpu-5"]);
        api.put_claim(claim);
        let started = Instant::now();
        let answer = registered
            .prepare(std::slice::from_ref(&named))
            .expect("prepare");
        let prepared = started.elapsed();
        assert!(answer[&named.uid].is_ok(), "{answer:?}");
        let started = Instant::now();
        registered
            .unprepare(std::slice::from_ref(&named))
            .expect("unprepare");
        if round > 0 {
            prepare.push(prepared.as_secs_f64() * 1e3);
            unprepare.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }

    // The pods: one claim for GPU 3 prepared once, as the kubelet does for a pod's claim.
    let cdi = dir.path().join("cdi");
    node.generate_cdi_spec(&cdi.join("nvidia.yaml"));
    let (claim, named) = allocated_claim("pods", NODE, &["gpu-3"]);
    api.put_claim(claim);
    let answer = registered
        .prepare(std::slice::from_ref(&named))
        .expect("prepare");
    let claim_ids = answer[&named.uid].as_ref().expect("prepared")[0]
        .cdi_ids
        .clone();
    // The node's spec again, written with `cdi-mounts = "runtime"` under a kind of its own so
    // that both are offered: the same device, its mounts made by runc.
    node.set("cdi-mounts", "\"runtime\"");
    let runtime_spec = dir.path().join("runtime-mounts.json");
    node.generate_cdi_spec(&runtime_spec);
    node.set("cdi-mounts", "\"hook\"");
    let mut spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&runtime_spec).expect("read the spec"))
            .expect("the spec is JSON");
    spec["kind"] = RUNTIME_MOUNTS_KIND.into();
    std::fs::write(cdi.join("runtime-mounts.json"), spec.to_string()).expect("write the spec");
    let runc = TimedRunc::new(dir.path());
    let setup = Containerd2Cri {
        cdi_spec_dirs: vec![cdi],
        runc: runc.program(),
        ..Containerd2Cri::under(dir.path())
    };
    let mut containerd = setup.start(dir.path(), &runc.env());
    let image = containerd.import_gpucheck_image(dir.path());
    let mut cri = Cri::connect(containerd.socket());
    let device_plugin = ["nvidia.com/gpu=3".to_string()];
    let runtime_mounts = [format!("{RUNTIME_MOUNTS_KIND}=3")];
    let variants: [(&str, &[String]); 4] = [
        ("plain runc, no GPU", &[]),
        ("device plugin's CDI name, nvidia.com/gpu=3", &device_plugin),
        ("DRA claim's CDI id, gpu-3", &claim_ids),
        (
            "the same device from a spec written with cdi-mounts = \"runtime\"",
            &runtime_mounts,
        ),
    ];
    let mut pods = Pods::default();
    let cgroups = CgroupParent::new("nvhook-dra-bench");
    let logs = dir.path().join("pods");
    let args = ["/gpucheck", "--dev", "/dev/nvidia3"];
    for round in 0..=rounds {
        // In rotating order, so that no variant always follows the same one.
        for turn in 0..variants.len() {
            let variant = (round + turn) % variants.len();
            let (label, ids) = &variants[variant];
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let request = ContainerRequest {
                image: &image,
                args: &args,
                cdi_devices: &ids,
                ..Default::default()
            };
            let run = cri.run_pod(
                &unique_name("dra-bench"),
                DEFAULT_HANDLER,
                &cgroups.path(),
                &logs,
                &request,
            );
            let expected = if ids.is_empty() { "absent" } else { "ENXIO" };
            assert!(
                run.output.has_line(&format!("dev /dev/nvidia3 {expected}")),
                "{label}: the pod did not get what it asked for\n{}\n(node log)\n{}",
                run.output,
                node.log()
            );
            if round > 0 {
                pods.push(variant, run);
            }
            settle();
        }
    }
    registered
        .unprepare(std::slice::from_ref(&named))
        .expect("unprepare");
    drop(cri);
    containerd.shutdown();

    println!("# DRA: nvhook-dra on a simulated node of {GPUS} GPUs ({rounds} rounds)\n");
    println!(
        "The kubelet double's calls over gRPC, ms (the claim read from the API server double, NVML's answer in memory).\n"
    );
    println!("| call | p50 | p95 |");
    println!("|---|---|---|");
    println!(
        "| NodePrepareResources, one GPU | {:.2} | {:.2} |",
        prepare.p50(),
        prepare.p95()
    );
    println!(
        "| NodeUnprepareResources | {:.2} | {:.2} |",
        unprepare.p50(),
        unprepare.p95()
    );
    println!();
    println!(
        "CRI CreateContainer + StartContainer on containerd 2.1.9, ms; Δ p50 against plain runc.\n"
    );
    let labels: Vec<&str> = variants.iter().map(|(label, _)| *label).collect();
    pods.print_totals(&labels);
    let totals = pods.totals(labels.len());
    println!(
        "- the DRA claim's pod against the device plugin's CDI name, paired by round: {:+.2} ms\n",
        totals[2].paired_minus(&totals[1]).p50()
    );
    pods.print_parts(&labels, &runc, &node.log());
}
