//! 9: the GPU flags people type, with nvhook alone (NVIDIA's names linked to nvhook on the
//! engines' PATH, no runtime configured): `docker run --gpus device=3` on Debian sid's dockerd
//! (the route its release takes: the prestart hook in 28, CDI names from 29.2) and `--device
//! nvidia.com/gpu=3` (CDI, nvhook's spec), and `ctr run --gpus 3` on sid's containerd
//! (`nvidia-container-cli configure` through `containerd oci-hook` in 2.1; CDI from 2.3), each
//! against the same engine's start of the same container without a GPU. What is timed is what
//! the user waits for: the client command from exec to exit, for a container that opens one
//! GPU node and exits. The variants take turns round by round, so that the machine's drift
//! hits them alike. Needs `scripts/sid-engines.sh`.

use crate::stats::Samples;
use crate::support::containerd2::Containerd2Cri;
use crate::support::engines::{ContainerdBuild, Dockerd, DockerdBuild, EngineDir, unique_name};
use crate::support::{SimNode, link_to_nvhook};
use std::ffi::OsStr;
use std::path::Path;
use std::time::Instant;

const GPUS: u32 = 8;
const PROBE: [&str; 3] = ["/gpucheck", "--dev", "/dev/nvidia3"];
/// The system's directories, after the one with NVIDIA's names.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Clone, Copy, PartialEq)]
enum Client {
    Docker,
    Ctr,
}

/// One way of starting the container, and its samples (ms).
struct Variant {
    label: &'static str,
    client: Client,
    flags: &'static [&'static str],
    samples: Samples,
}

/// `rounds` starts per variant, after one warm-up start each.
pub fn run(rounds: usize) {
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("gpus-bench");
    let bin = dir.path().join("nvidia-names");
    std::fs::create_dir(&bin).expect("make the names' directory");
    link_to_nvhook(&bin, &nvhook::nvidia_cli::NAMES);
    let path = format!("{}:{SYSTEM_PATH}", bin.display());
    let cdi_dir = dir.path().join("cdi");
    std::fs::create_dir(&cdi_dir).expect("make the CDI spec directory");
    node.generate_cdi_spec(&cdi_dir.join("nvhook.yaml"));
    let config = node.config();

    // dockerd reads nvhook's spec from its cdi-spec-dirs; its hooks get its environment.
    let build = DockerdBuild::sid();
    let docker_dir = EngineDir::new("gpus-bench-dockerd");
    let daemon_json = docker_dir.path().join("daemon.json");
    // Docker 29.5 on: no time namespace, which Debian 12's runc 1.1 does not know.
    let daemon = serde_json::json!({
        "cdi-spec-dirs": [cdi_dir],
        "features": { "time-namespaces": false },
    });
    std::fs::write(&daemon_json, daemon.to_string()).expect("write daemon.json");
    let env = [("PATH", Path::new(&path)), ("NVHOOK_CONFIG", &config)];
    let mut dockerd = Dockerd::start_with(&build, docker_dir.path(), &daemon_json, &env);
    let docker_image = dockerd.import_gpucheck_image(docker_dir.path());

    // ctr builds the hook from its own environment: its `containerd oci-hook` (sid's) first.
    let ctr_dir = EngineDir::new("gpus-bench-ctrd");
    let mut containerd = Containerd2Cri::under(ctr_dir.path()).start(ctr_dir.path(), &[]);
    containerd.set_ctr_cdi_dir(&cdi_dir);
    let ctr_image = containerd.import_gpucheck_image(ctr_dir.path());
    let sid = ContainerdBuild::sid().program("containerd");
    let sid_dir = sid.parent().expect("containerd is in a directory");
    let ctr_path = format!("{}:{path}", sid_dir.display());
    let ctr_env = [
        ("PATH", OsStr::new(&ctr_path)),
        ("NVHOOK_CONFIG", config.as_os_str()),
    ];

    let variant = |label, client, flags| Variant {
        label,
        client,
        flags,
        samples: Samples::default(),
    };
    let mut variants = [
        variant("docker run, no GPU", Client::Docker, &[]),
        variant(
            "docker run --gpus device=3",
            Client::Docker,
            &["--gpus", "device=3"],
        ),
        variant(
            "docker run --device nvidia.com/gpu=3",
            Client::Docker,
            &["--device", "nvidia.com/gpu=3"],
        ),
        variant("ctr run, no GPU", Client::Ctr, &[]),
        variant("ctr run --gpus 3", Client::Ctr, &["--gpus", "3"]),
    ];
    for round in 0..=rounds {
        for v in variants.iter_mut() {
            let started = Instant::now();
            let output = match v.client {
                Client::Docker => {
                    let mut args = vec!["--rm", "--network", "none"];
                    args.extend(v.flags);
                    args.push(&docker_image);
                    args.extend(PROBE);
                    dockerd.run(&args)
                }
                Client::Ctr => containerd.run_with_env(
                    &ctr_env,
                    v.flags,
                    &ctr_image,
                    &unique_name("gpus-bench"),
                    &PROBE,
                ),
            };
            let ms = started.elapsed().as_secs_f64() * 1e3;
            let expected = if v.flags.is_empty() {
                "absent"
            } else {
                "ENXIO"
            };
            assert!(
                output.has_line(&format!("dev /dev/nvidia3 {expected}")),
                "{}: the container did not get what it asked for\n{output}\n(node log)\n{}",
                v.label,
                node.log()
            );
            if round > 0 {
                v.samples.push(ms);
            }
        }
    }
    report(&variants, rounds, &build, &node.log());
    assert!(dockerd.shutdown(), "dockerd ignored SIGTERM");
    assert!(containerd.shutdown(), "containerd ignored SIGTERM");
}

fn report(variants: &[Variant], rounds: usize, build: &DockerdBuild, log: &str) {
    println!(
        "# docker run --gpus and ctr run --gpus with nvhook alone ({rounds} starts per variant, interleaved)\n"
    );
    println!(
        "Debian sid's dockerd {} and containerd; the client command from exec to exit, ms; Δ p50 against the same client's start without a GPU.\n",
        build.version()
    );
    println!("| variant | p50 | p95 | Δ p50 |");
    println!("|---|---|---|---|");
    for v in variants {
        let plain = variants
            .iter()
            .find(|p| p.client == v.client && p.flags.is_empty())
            .expect("each client has a start without a GPU");
        println!("{}", v.samples.delta_row(v.label, plain.samples.p50()));
    }
    // Which route served the GPU starts, from nvhook's log.
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    println!(
        "\nnvhook served: {} as the prestart hook, {} as `nvidia-container-cli configure`, {} as a CDI spec's hook.\n",
        count("stage=Prestart"),
        count("configured as nvidia-container-cli"),
        count("stage=CreateRuntime")
    );
}
