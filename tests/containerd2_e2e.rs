//! containerd 2 (Debian sid's, which `scripts/test.sh` fetches into `.engines/sid` through
//! `scripts/sid-engines.sh`) in the test set-up: it starts with its own root, state, sockets,
//! NRI socket and plugin directories, runs a host-network pod through the project's CRI client
//! with its default runtime (Debian 12's runc), and applies a CDI device from a spec directory of
//! the test's choosing. The ground the NRI tests stand on. Run as root after
//! `cargo build --workspace`: `cargo test --test containerd2_e2e`.

use nvhook_test_support as support;
use support::{containerd2, cri};

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use containerd2::{Containerd2Cri, DEFAULT_HANDLER};
use cri::{ContainerRequest, Cri};
use support::engines::{CgroupParent, ContainerdBuild, EngineDir, ImageConfig, unique_name};
use support::{busybox_image, require_root};

/// A CDI spec of one device whose only edit is an environment variable.
const CDI_SPEC: &str = r#"{
  "cdiVersion": "0.5.0",
  "kind": "nvhook-test.example/probe",
  "devices": [{ "name": "one", "containerEdits": { "env": ["CDI_PROBE=device-one"] } }],
  "containerEdits": {}
}"#;

#[test]
fn containerd2_runs_a_cri_pod_with_runc_cdi_and_an_nri_socket() {
    require_root();
    let build = ContainerdBuild::sid();
    eprintln!("containerd from Debian sid: {}", build.version());
    let dir = EngineDir::new("ctrd2");
    let setup = Containerd2Cri::under(dir.path());
    fs::create_dir_all(&setup.cdi_spec_dirs[0]).expect("create the CDI spec dir");
    fs::write(setup.cdi_spec_dirs[0].join("probe.json"), CDI_SPEC).expect("write the CDI spec");
    let host_file = dir.path().join("greeting.txt");
    fs::write(&host_file, "from the host\n").expect("write the mounted file");

    let started = Instant::now();
    let containerd = setup.start(dir.path(), &[]);
    let start_time = started.elapsed();

    let socket = fs::symlink_metadata(&setup.nri.socket).unwrap_or_else(|e| {
        panic!(
            "no NRI socket at {}: {e}\n{}",
            setup.nri.socket.display(),
            containerd.log()
        )
    });
    assert!(socket.file_type().is_socket(), "{:?}", socket.file_type());
    UnixStream::connect(&setup.nri.socket).expect("containerd accepts on its NRI socket");

    let image = format!("docker.io/nvhook-test/{}:latest", unique_name("busybox"));
    let shell = ImageConfig {
        cmd: &["/bin/busybox", "sh"],
        env: &[],
    };
    containerd.import_rootfs(dir.path(), busybox_image().rootfs(), &image, &shell);

    let mut cri = Cri::connect(containerd.socket());
    assert!(
        cri.runtime_name().starts_with("containerd 2."),
        "CRI Version says {}",
        cri.runtime_name()
    );
    assert!(cri.has_image(&setup.sandbox_image) && cri.has_image(&image));
    let cgroups = CgroupParent::new("nvhook-ctrd2");
    let host_path = host_file.to_str().expect("UTF-8 path");
    let run = cri.run_pod(
        &unique_name("hello"),
        DEFAULT_HANDLER,
        &cgroups.path(),
        &dir.path().join("pods"),
        &ContainerRequest {
            image: &image,
            args: &[
                "/bin/busybox",
                "sh",
                "-c",
                "echo greeting=$GREETING; echo cdi=$CDI_PROBE; cat /mnt/greeting.txt",
            ],
            env: &[("GREETING", "hello")],
            mounts: &[("/mnt/greeting.txt", host_path)],
            annotations: &[("nvhook.test/container", "yes")],
            pod_annotations: &[("nvhook.test/pod", "yes")],
            cdi_devices: &["nvhook-test.example/probe=one"],
            ..Default::default()
        },
    );
    let mut output = run.output;
    output.hook_log = Some(format!("(containerd log)\n{}", containerd.log()));
    output.assert_success();
    for line in ["greeting=hello", "cdi=device-one", "from the host"] {
        assert!(output.has_line(line), "missing {line:?}\n{output}");
    }

    drop(cri);
    containerd.stop_leaving_nothing(dir.path());
    eprintln!(
        "timing: containerd 2 start + pause image import {start_time:.2?}, \
         RunPodSandbox {:.2?}, CreateContainer+StartContainer {:.2?}",
        run.sandbox, run.container_start
    );
}
