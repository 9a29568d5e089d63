//! Table tests of `Request::from_spec` against the reference table and the device policy.

use super::*;
use proptest::prelude::*;
use serde_json::json;
use std::path::Path;

const SYS_ADMIN: &str = "CAP_SYS_ADMIN";

fn spec_with(env: &[&str], mounts: &[(&str, &str)], bounding: &[&str]) -> Spec {
    let mounts: Vec<_> = mounts
        .iter()
        .map(|(source, destination)| {
            json!({"source": source, "destination": destination, "type": "bind"})
        })
        .collect();
    let doc = json!({
        "ociVersion": "1.0.2",
        "process": {"env": env, "capabilities": {"bounding": bounding}},
        "root": {"path": "rootfs"},
        "mounts": mounts,
    });
    Spec::parse(&doc.to_string(), Path::new("config.json")).unwrap()
}

fn spec(env: &[&str]) -> Spec {
    spec_with(env, &[], &["CAP_CHOWN"])
}

fn decide(env: &[&str]) -> Result<Decision, RequestError> {
    Request::decide(&spec(env), &Config::default())
}

fn request(env: &[&str]) -> Request {
    match decide(env) {
        Ok(Decision::Gpu(r)) => *r,
        other => panic!("{env:?}: {other:?}"),
    }
}

fn err(env: &[&str]) -> String {
    decide(env).unwrap_err().to_string()
}

fn device_mount(id: &str) -> (&'static str, String) {
    ("/dev/null", format!("{DEVICE_MOUNT_ROOT}/{id}"))
}

fn caps(list: &[Capability]) -> BTreeSet<Capability> {
    list.iter().copied().collect()
}

use Capability::*;

#[test]
fn visible_devices_rows_of_the_reference_table() {
    use DeviceSelection::*;
    let none: Option<DeviceSelection> = None;
    let cases = [
        (vec![], none.clone()),
        (vec!["NVIDIA_VISIBLE_DEVICES="], None),
        (vec!["NVIDIA_VISIBLE_DEVICES=void"], None),
        (vec!["NVIDIA_VISIBLE_DEVICES=0,void"], None),
        (vec!["NVIDIA_VISIBLE_DEVICES"], None),
        (vec!["NVIDIA_VISIBLE_DEVICES=none"], Some(NoDevices)),
        (vec!["NVIDIA_VISIBLE_DEVICES=all"], Some(All)),
        (vec!["NVIDIA_VISIBLE_DEVICES=0,all"], Some(All)),
        (vec!["NVIDIA_VISIBLE_DEVICES=all,none"], Some(NoDevices)),
        (
            vec!["NVIDIA_VISIBLE_DEVICES=0, GPU-ab12-cd34 ,0000:3B:00.0,MIG-ef56,1:2"],
            Some(List(vec![
                DeviceId::Index(0),
                DeviceId::GpuUuid("GPU-ab12-cd34".into()),
                DeviceId::PciBusId("0000:3b:00.0".into()),
                DeviceId::MigUuid("MIG-ef56".into()),
                DeviceId::MigIndex { gpu: 1, mig: 2 },
            ])),
        ),
        // The last entry of process.env wins, as for execve.
        (
            vec!["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"],
            None,
        ),
    ];
    for (env, want) in cases {
        let got = Request::from_spec(&spec(&env), &Config::default()).unwrap();
        assert_eq!(got.as_ref().map(|r| &r.devices), want.as_ref(), "{env:?}");
        if let Some(r) = got {
            assert_eq!(r.source, SelectionSource::Env);
        }
    }
}

#[test]
fn unknown_device_error_names_variable_value_and_device() {
    assert_eq!(
        err(&["NVIDIA_VISIBLE_DEVICES=0,gpu7"]),
        "NVIDIA_VISIBLE_DEVICES=0,gpu7: unknown device \"gpu7\" (use an index, GPU-<uuid>, \
         MIG-<uuid>, a PCI bus id, G:M, all or none)"
    );
    let e = err(&["NVIDIA_VISIBLE_DEVICES=x\ny"]);
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn driver_capabilities() {
    let dev = "NVIDIA_VISIBLE_DEVICES=all";
    let cases: [(&[&str], &[Capability]); 8] = [
        (&[], &[Utility, Compute]),
        (&["NVIDIA_DRIVER_CAPABILITIES="], &[Utility, Compute]),
        (&["NVIDIA_DRIVER_CAPABILITIES= , "], &[Utility, Compute]),
        (&["NVIDIA_DRIVER_CAPABILITIES=video"], &[Video]),
        (
            &["NVIDIA_DRIVER_CAPABILITIES= compute , graphics,display "],
            &[Compute, Graphics, Display],
        ),
        (&["NVIDIA_DRIVER_CAPABILITIES=all"], &Capability::ALL),
        (
            &["NVIDIA_DRIVER_CAPABILITIES=compute,all"],
            &Capability::ALL,
        ),
        (
            &["NVIDIA_DRIVER_CAPABILITIES=ngx,compat32,ngx"],
            &[Ngx, Compat32],
        ),
    ];
    for (env, want) in cases {
        let env: Vec<&str> = env.iter().copied().chain([dev]).collect();
        assert_eq!(request(&env).capabilities, caps(want), "{env:?}");
    }
}

#[test]
fn capabilities_against_what_the_node_serves() {
    let config = Config {
        supported_capabilities: vec![Utility, Video],
        ..Config::default()
    };
    let run = |caps_env: Option<&str>| {
        let mut env = vec!["NVIDIA_VISIBLE_DEVICES=0".to_string()];
        env.extend(caps_env.map(|c| format!("NVIDIA_DRIVER_CAPABILITIES={c}")));
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        Request::from_spec(&spec(&env), &config).map(|r| r.unwrap().capabilities)
    };
    // The default is cut down to what the node serves, silently, as in the toolkit.
    assert_eq!(run(None).unwrap(), caps(&[Utility]));
    assert_eq!(run(Some("all")).unwrap(), caps(&[Utility, Video]));
    let e = run(Some("utility,compute")).unwrap_err();
    assert!(matches!(
        e,
        RequestError::UnsupportedCapability {
            capability: Compute,
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        "NVIDIA_DRIVER_CAPABILITIES=utility,compute: this node does not serve capability compute \
         (it serves utility,video; ask for those, or add compute to supported-capabilities in \
         the nvhook config)"
    );
    let e = run(Some("utility,teleport")).unwrap_err();
    assert!(matches!(e, RequestError::UnknownCapability { .. }), "{e:?}");
    assert!(e.to_string().contains("\"teleport\""), "{e}");
    // `none` is no capability name: the toolkit rejects it as unsupported.
    assert!(run(Some("none")).is_err());
}

#[test]
fn requirements_from_every_require_variable() {
    let r = request(&[
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_REQUIRE_CUDA=cuda>=12.4",
        "NVIDIA_REQUIRE_ARCH=arch>=8.0",
        "NVIDIA_REQUIRE_JETPACK=jetpack>=5",
        "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=",
    ]);
    let gpu = |cuda: &str, arch: &str| GpuFacts {
        cuda: cuda.parse().unwrap(),
        driver: "550.54.15".parse().unwrap(),
        arch: arch.parse().unwrap(),
        brand: "tesla".into(),
    };
    assert!(r.requirements.check(&gpu("12.4", "8.0")).is_ok());
    let e = r.requirements.check(&gpu("12.4", "7.5")).unwrap_err();
    assert_eq!(e.variable, "NVIDIA_REQUIRE_ARCH");
    assert_eq!(e.to_string(), "unsatisfied condition: arch>=8.0");
    let e = r.requirements.check(&gpu("12.2", "8.0")).unwrap_err();
    assert_eq!(e.to_string(), "unsatisfied condition: cuda>=12.4");
}

#[test]
fn requirement_syntax_error_names_variable() {
    let e = decide(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_FOO=cuda>>12"]).unwrap_err();
    assert!(matches!(e, RequestError::Requirement { .. }));
    assert_eq!(
        e.to_string(),
        "NVIDIA_REQUIRE_FOO: condition \"cuda>>12\": unknown operator \">>\" (use = != < <= > >=)"
    );
    // Unknown keys fail (libnvidia-container: "invalid expression").
    assert!(decide(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_X=gpu>=1"]).is_err());
}

#[test]
fn disable_require() {
    let base = [
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_REQUIRE_CUDA=cuda>=99",
        "CUDA_VERSION=12.4.1",
    ];
    for (flag, disabled) in [
        ("1", true),
        ("t", true),
        ("T", true),
        ("true", true),
        ("TRUE", true),
        ("True", true),
        ("false", false),
        ("0", false),
        ("yes", false),
        ("", false),
    ] {
        let flag = format!("NVIDIA_DISABLE_REQUIRE={flag}");
        let env: Vec<&str> = base.iter().copied().chain([flag.as_str()]).collect();
        assert_eq!(request(&env).requirements.is_empty(), disabled, "{flag}");
    }
    // A disabled check does not even parse the expressions.
    let env = [
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_REQUIRE_X=bogus",
        "NVIDIA_DISABLE_REQUIRE=1",
    ];
    assert!(request(&env).requirements.is_empty());
    let config = Config {
        disable_require: true,
        ..Config::default()
    };
    let r = Request::from_spec(&spec(&base), &config).unwrap().unwrap();
    assert!(r.requirements.is_empty());
}

#[test]
fn legacy_cuda_image() {
    let facts = |cuda: &str| GpuFacts {
        cuda: cuda.parse().unwrap(),
        driver: "418.87".parse().unwrap(),
        arch: "7.0".parse().unwrap(),
        brand: "tesla".into(),
    };
    // CUDA_VERSION alone: all devices, every served capability, cuda>=major.minor.
    let r = request(&["CUDA_VERSION=10.1.243"]);
    assert_eq!(r.devices, DeviceSelection::All);
    assert_eq!(r.source, SelectionSource::Env);
    assert_eq!(r.capabilities, caps(&Capability::ALL));
    assert!(r.requirements.check(&facts("10.1")).is_ok());
    let e = r.requirements.check(&facts("10.0")).unwrap_err();
    assert_eq!(e.to_string(), "unsatisfied condition: cuda>=10.1");
    assert_eq!(e.variable, "CUDA_VERSION");

    // The defaults apply only to unset variables.
    assert!(
        decide(&["CUDA_VERSION=10.1", "NVIDIA_VISIBLE_DEVICES="]).unwrap()
            == Decision::NotRequested
    );
    let r = request(&[
        "CUDA_VERSION=10.1",
        "NVIDIA_VISIBLE_DEVICES=1",
        "NVIDIA_DRIVER_CAPABILITIES=",
    ]);
    assert_eq!(r.devices, DeviceSelection::List(vec![DeviceId::Index(1)]));
    assert_eq!(r.capabilities, caps(&[Utility, Compute]));

    // Short and prefixed forms, as golang semver reads them.
    for (version, want) in [("12", "12.0"), ("v11.8.0", "11.8"), ("12.4.1-rc1", "12.4")] {
        let r = request(&[&format!("CUDA_VERSION={version}")]);
        let e = r.requirements.check(&facts("1.0")).unwrap_err();
        assert_eq!(e.condition.0, format!("cuda>={want}"), "{version}");
    }

    // An NVIDIA_REQUIRE_CUDA makes the image non-legacy: nothing is implied.
    assert_eq!(
        decide(&["CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"]).unwrap(),
        Decision::NotRequested
    );
    // ...unless it is empty.
    assert_eq!(
        request(&["CUDA_VERSION=12.4", "NVIDIA_REQUIRE_CUDA="]).devices,
        DeviceSelection::All
    );

    let e = decide(&["CUDA_VERSION=twelve"]).unwrap_err();
    assert!(matches!(e, RequestError::LegacyCudaVersion { .. }), "{e:?}");
    assert!(e.to_string().starts_with("CUDA_VERSION=twelve: "), "{e}");
    for bad in ["1.2.3.4", "12.", "v", "1.x"] {
        assert!(decide(&[&format!("CUDA_VERSION={bad}")]).is_err(), "{bad}");
    }
    // With requirements disabled a bad CUDA_VERSION does not matter.
    assert!(decide(&["CUDA_VERSION=twelve", "NVIDIA_DISABLE_REQUIRE=true"]).is_ok());
}

#[test]
fn mig_management_is_for_privileged_containers() {
    let env = [
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_MIG_CONFIG_DEVICES=all",
        "NVIDIA_MIG_MONITOR_DEVICES=0,1",
    ];
    let privileged = spec_with(&env, &[], &[SYS_ADMIN]);
    let r = Request::from_spec(&privileged, &Config::default())
        .unwrap()
        .unwrap();
    assert!(r.privileged);
    assert_eq!(r.mig_config, Some(DeviceSelection::All));
    assert_eq!(
        r.mig_monitor,
        Some(DeviceSelection::List(vec![
            DeviceId::Index(0),
            DeviceId::Index(1)
        ]))
    );

    let e = Request::from_spec(&spec(&env), &Config::default()).unwrap_err();
    assert_eq!(
        e,
        RequestError::MigUnprivileged {
            variable: MIG_CONFIG_DEVICES,
            value: "all".into()
        }
    );
    assert_eq!(
        e.to_string(),
        "NVIDIA_MIG_CONFIG_DEVICES=all: only a privileged container (CAP_SYS_ADMIN in its \
         bounding set) may manage MIG (run it privileged or unset NVIDIA_MIG_CONFIG_DEVICES)"
    );
    let e = decide(&[
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_MIG_MONITOR_DEVICES=void",
    ])
    .unwrap_err();
    assert!(matches!(
        e,
        RequestError::MigUnprivileged {
            variable: MIG_MONITOR_DEVICES,
            ..
        }
    ));

    // Empty values are no request, privileged or not; so is void for a privileged container.
    let r = request(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MIG_CONFIG_DEVICES="]);
    assert_eq!(
        (r.mig_config, r.mig_monitor, r.privileged),
        (None, None, false)
    );
    let s = spec_with(
        &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MIG_CONFIG_DEVICES=void"],
        &[],
        &[SYS_ADMIN],
    );
    assert_eq!(
        Request::from_spec(&s, &Config::default())
            .unwrap()
            .unwrap()
            .mig_config,
        None
    );
    let s = spec_with(
        &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MIG_CONFIG_DEVICES=x"],
        &[],
        &[SYS_ADMIN],
    );
    let e = Request::from_spec(&s, &Config::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("NVIDIA_MIG_CONFIG_DEVICES=x: unknown device \"x\""),
        "{e}"
    );

    // Not a GPU container: MIG variables are not even looked at.
    assert_eq!(
        decide(&["NVIDIA_MIG_CONFIG_DEVICES=all"]).unwrap(),
        Decision::NotRequested
    );
}

#[test]
fn volume_mounts_select_devices() {
    let mounts = [
        device_mount("GPU-ab12"),
        device_mount("1"),
        device_mount("1"),
    ];
    let mounts: Vec<(&str, &str)> = mounts.iter().map(|(s, d)| (*s, d.as_str())).collect();
    let s = spec_with(&["NVIDIA_VISIBLE_DEVICES=all"], &mounts, &[]);
    let r = Request::from_spec(&s, &Config::default()).unwrap().unwrap();
    assert_eq!(r.source, SelectionSource::VolumeMounts);
    assert_eq!(
        r.devices,
        DeviceSelection::List(vec![
            DeviceId::GpuUuid("GPU-ab12".into()),
            DeviceId::Index(1)
        ])
    );

    let from = |mounts: &[(&str, &str)]| {
        Request::from_spec(&spec_with(&[], mounts, &[]), &Config::default())
            .map(|r| r.map(|r| r.devices))
    };
    assert_eq!(
        from(&[("/dev/null", "/var/run/nvidia-container-devices/all")]).unwrap(),
        Some(DeviceSelection::All)
    );
    assert_eq!(
        from(&[("/dev/./null", "/var/run//nvidia-container-devices/./0/")]).unwrap(),
        Some(DeviceSelection::List(vec![DeviceId::Index(0)]))
    );
    // Not device mounts: another source, outside the directory, the directory itself,
    // a sibling that shares the prefix, an IMEX channel.
    for (source, destination) in [
        ("/tmp/x", "/var/run/nvidia-container-devices/0"),
        ("/dev/null", "/var/run/nvidia-container-devices"),
        ("/dev/null", "/var/run/nvidia-container-devices/../0"),
        ("/dev/null", "/var/run/nvidia-container-devices0"),
        ("/dev/null", "/run/nvidia-container-devices/0"),
        ("/dev/null", "/var/run/nvidia-container-devices/imex/0"),
    ] {
        assert_eq!(
            from(&[(source, destination)]).unwrap(),
            None,
            "{source} {destination}"
        );
    }
    let e = from(&[("/dev/null", "/var/run/nvidia-container-devices/gpu7")]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "volume mount /var/run/nvidia-container-devices/gpu7: unknown device \"gpu7\" (use an \
         index, GPU-<uuid>, MIG-<uuid>, a PCI bus id, G:M, all or none)"
    );
    // CDI names are not device ids nvhook resolves.
    assert!(
        from(&[(
            "/dev/null",
            "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/0"
        )])
        .is_err()
    );
}

/// Every combination of privileged x accept-env x accept-mounts x mounts present x env present.
#[test]
fn device_policy_combinations() {
    let mount = device_mount("1");
    for bits in 0..32u8 {
        let [privileged, accept_env, accept_mounts, has_mounts, has_env] =
            [0, 1, 2, 3, 4].map(|i| bits & (1 << i) != 0);
        let config = Config {
            accept_env_when_unprivileged: accept_env,
            accept_volume_mount_devices: accept_mounts,
            ..Config::default()
        };
        let env: &[&str] = if has_env {
            &["NVIDIA_VISIBLE_DEVICES=0"]
        } else {
            &[]
        };
        let mounts: &[(&str, &str)] = if has_mounts {
            &[(mount.0, &mount.1)]
        } else {
            &[]
        };
        let bounding: &[&str] = if privileged { &[SYS_ADMIN] } else { &[] };
        let got = Request::decide(&spec_with(env, mounts, bounding), &config).unwrap();
        let want = if accept_mounts && has_mounts {
            Some((DeviceId::Index(1), SelectionSource::VolumeMounts))
        } else if has_env && (privileged || accept_env) {
            Some((DeviceId::Index(0), SelectionSource::Env))
        } else {
            None
        };
        let case = format!(
            "privileged={privileged} accept_env={accept_env} accept_mounts={accept_mounts} \
             mounts={has_mounts} env={has_env}"
        );
        match (got, want) {
            (Decision::Gpu(r), Some((id, source))) => {
                assert_eq!(r.devices, DeviceSelection::List(vec![id]), "{case}");
                assert_eq!(r.source, source, "{case}");
                assert_eq!(r.privileged, privileged, "{case}");
            }
            (Decision::EnvIgnored, None) => {
                assert!(has_env && !privileged && !accept_env, "{case}")
            }
            (Decision::NotRequested, None) => assert!(!has_env, "{case}"),
            (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn hardened_node_ignores_env_of_unprivileged_pods() {
    let config = Config {
        accept_env_when_unprivileged: false,
        ..Config::default()
    };
    // A CUDA base image sets NVIDIA_VISIBLE_DEVICES=all; without the device plugin's mounts
    // it gets nothing, and an invalid list is not an error since it is not read.
    for env in [
        vec!["NVIDIA_VISIBLE_DEVICES=all"],
        vec!["NVIDIA_VISIBLE_DEVICES=bogus"],
        vec!["CUDA_VERSION=12.4.1"],
        vec![
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_MIG_CONFIG_DEVICES=all",
        ],
    ] {
        assert_eq!(
            Request::decide(&spec(&env), &config).unwrap(),
            Decision::EnvIgnored,
            "{env:?}"
        );
    }
    // Empty or void stays "not requested" even there.
    let s = spec(&["NVIDIA_VISIBLE_DEVICES=void"]);
    assert_eq!(
        Request::decide(&s, &config).unwrap(),
        Decision::NotRequested
    );
    // The privileged container's env is honoured.
    let s = spec_with(&["NVIDIA_VISIBLE_DEVICES=all"], &[], &[SYS_ADMIN]);
    assert!(matches!(
        Request::decide(&s, &config).unwrap(),
        Decision::Gpu(_)
    ));
}

#[test]
fn void_in_mounts_means_no_gpu_and_does_not_fall_back_to_env() {
    let s = spec_with(
        &["NVIDIA_VISIBLE_DEVICES=all"],
        &[("/dev/null", "/var/run/nvidia-container-devices/void")],
        &[],
    );
    assert_eq!(
        Request::decide(&s, &Config::default()).unwrap(),
        Decision::NotRequested
    );
}

#[test]
fn no_spec_process_is_not_a_gpu_container() {
    let s = Spec::parse("{}", Path::new("config.json")).unwrap();
    assert_eq!(Request::from_spec(&s, &Config::default()).unwrap(), None);
}

proptest! {
    #[test]
    fn never_panics_on_arbitrary_env_and_mounts(
        env in proptest::collection::vec(
            ("(NVIDIA_VISIBLE_DEVICES|NVIDIA_DRIVER_CAPABILITIES|NVIDIA_REQUIRE_[A-Z]{0,4}|\
              NVIDIA_DISABLE_REQUIRE|CUDA_VERSION|NVIDIA_MIG_CONFIG_DEVICES|\
              NVIDIA_MIG_MONITOR_DEVICES|NVIDIA_IMEX_CHANNELS|NVIDIA_GDS|NVIDIA_MOFED|\
              NVIDIA_NVSWITCH|NVIDIA_GDRCOPY|[A-Z_]{0,6})", ".{0,40}"),
            0..8),
        mounts in proptest::collection::vec(
            ("(/dev/null|/dev/\\.\\./dev/null|.{0,12})",
             "(/var/run/nvidia-container-devices/(imex/)?)?.{0,24}"),
            0..4),
        privileged in any::<bool>(),
        accept_env in any::<bool>(),
        accept_mounts in any::<bool>(),
    ) {
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        let mounts: Vec<(&str, &str)> = mounts.iter().map(|(s, d)| (s.as_str(), d.as_str())).collect();
        let bounding: &[&str] = if privileged { &[SYS_ADMIN] } else { &[] };
        let config = Config {
            accept_env_when_unprivileged: accept_env,
            accept_volume_mount_devices: accept_mounts,
            ..Config::default()
        };
        let s = spec_with(&env, &mounts, bounding);
        if let Err(e) = Request::from_spec(&s, &config) {
            prop_assert!(!e.to_string().contains('\n'), "{}", e);
        }
    }

    #[test]
    fn device_list_roundtrips_through_display(ids in proptest::collection::vec(
        "([0-9]{1,4}|GPU-[0-9a-f]{4}-[0-9a-f]{4}|MIG-[0-9a-f]{8}|[0-9]{1,2}:[0-9]{1,2}|0000:[0-9a-f]{2}:[01][0-9a-f]\\.[0-7])",
        1..5))
    {
        let value = format!("NVIDIA_VISIBLE_DEVICES={}", ids.join(","));
        let r = request(&[&value]);
        let shown = r.devices.to_string();
        let again = request(&[&format!("NVIDIA_VISIBLE_DEVICES={shown}")]);
        prop_assert_eq!(r.devices, again.devices);
    }
}

#[test]
fn imex_channels_follow_the_gpu_policy() {
    let hardened = Config {
        accept_env_when_unprivileged: false,
        ..Config::default()
    };
    let gpu_mount = device_mount("0");
    let imex_mounts = [device_mount("imex/2"), device_mount("imex/0")];
    let decide_with =
        |env: &[&str], mounts: &[(&str, String)], bounding: &[&str], config: &Config| {
            let mounts: Vec<(&str, &str)> = mounts.iter().map(|(s, d)| (*s, d.as_str())).collect();
            match Request::decide(&spec_with(env, &mounts, bounding), config) {
                Ok(Decision::Gpu(r)) => r.imex_channels,
                other => panic!("{env:?}: {other:?}"),
            }
        };
    let env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=1"];
    let list = |l: &[u32]| Some(ImexChannels::List(l.to_vec()));
    let mut all_mounts = vec![gpu_mount.clone()];
    all_mounts.extend(imex_mounts.iter().cloned());
    // Default config: mounts win over the variable, the variable counts without them.
    assert_eq!(decide_with(&env, &[], &[], &Config::default()), list(&[1]));
    assert_eq!(
        decide_with(&env, &all_mounts, &[], &Config::default()),
        list(&[0, 2])
    );
    // Hardened: an unprivileged container's variable is ignored, its mounts count.
    assert_eq!(
        decide_with(&env, std::slice::from_ref(&gpu_mount), &[], &hardened),
        None
    );
    assert_eq!(
        decide_with(&env, &all_mounts, &[], &hardened),
        list(&[0, 2])
    );
    assert_eq!(
        decide_with(
            &env,
            std::slice::from_ref(&gpu_mount),
            &[SYS_ADMIN],
            &hardened
        ),
        list(&[1])
    );
    // Mounts not accepted: the variable, even when mounts are there.
    let no_mounts = Config {
        accept_volume_mount_devices: false,
        ..Config::default()
    };
    assert_eq!(decide_with(&env, &all_mounts, &[], &no_mounts), list(&[1]));
    // IMEX mounts select no GPU.
    assert_eq!(
        request(&["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=all"]).imex_channels,
        Some(ImexChannels::All)
    );
}

#[test]
fn imex_channels_and_families_come_only_with_a_gpu_request() {
    let d = decide(&["NVIDIA_IMEX_CHANNELS=abc", "NVIDIA_GDS=bogus"]).unwrap();
    assert_eq!(d, Decision::NotRequested);
}

#[test]
fn bad_imex_and_family_values_are_refused_in_one_line() {
    assert_eq!(
        err(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=1,,x"]),
        "NVIDIA_IMEX_CHANNELS=1,,x: \"x\" is not an IMEX channel number (use channel numbers separated by commas, such as 0,1, or all)"
    );
    assert_eq!(
        err(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MOFED=yes"]),
        "NVIDIA_MOFED=yes: use enabled or disabled (or leave it unset for the node's default)"
    );
    let mounts = [device_mount("0"), device_mount("imex/x")];
    let mounts: Vec<(&str, &str)> = mounts.iter().map(|(s, d)| (*s, d.as_str())).collect();
    let e = Request::decide(&spec_with(&[], &mounts, &[]), &Config::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "volume mount /var/run/nvidia-container-devices/imex/: \"x\" is not an IMEX channel number (use channel numbers separated by commas, such as 0,1, or all)"
    );
}

#[test]
fn families_by_variable_and_config_default() {
    use crate::imex_and_families::Family;
    let r = request(&[
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_NVSWITCH=enabled",
        "NVIDIA_GDS=disabled",
        "NVIDIA_MOFED=",
    ]);
    assert_eq!(r.families, BTreeSet::from([Family::NvSwitch]));
    let config = Config {
        device_families: vec![Family::Gds, Family::Mofed],
        accept_env_when_unprivileged: false,
        ..Config::default()
    };
    // An ignored environment neither adds a family nor takes the default away (nor fails).
    let spec = spec_with(
        &[
            "NVIDIA_GDRCOPY=enabled",
            "NVIDIA_GDS=disabled",
            "NVIDIA_MOFED=junk",
        ],
        &[(device_mount("0").0, &device_mount("0").1)],
        &[],
    );
    let Decision::Gpu(r) = Request::decide(&spec, &config).unwrap() else {
        panic!("not a GPU request");
    };
    assert_eq!(r.families, BTreeSet::from([Family::Gds, Family::Mofed]));
}

/// `gpu-memory-limits-from = "allocated"`: the limits of a container whose GPUs the device
/// plugin's mounts gave count; those of one that chose its GPUs by variable do not.
#[test]
fn memory_limits_from_allocated_containers_only_when_the_node_says_so() {
    let limits = [
        "NVIDIA_GPU_MEMORY_REQUEST=512",
        "NVIDIA_GPU_MEMORY_LIMIT=1024",
    ];
    let expected = Some(MemoryLimits {
        request_mib: 512,
        limit_mib: 1024,
    });
    let mount = device_mount("0");
    let mounted = spec_with(&limits, &[(mount.0, mount.1.as_str())], &[]);
    let mut chosen_env = limits.to_vec();
    chosen_env.push("NVIDIA_VISIBLE_DEVICES=0");
    let chosen = spec_with(&chosen_env, &[], &[]);
    let of = |spec: &Spec, config: &Config| {
        Request::from_spec(spec, config)
            .unwrap()
            .unwrap()
            .memory_limits
    };
    let any = Config::default();
    assert_eq!(of(&mounted, &any), expected);
    assert_eq!(of(&chosen, &any), expected);
    let allocated = Config {
        gpu_memory_limits_from: crate::config::GpuMemoryLimitsFrom::Allocated,
        ..Config::default()
    };
    assert_eq!(of(&mounted, &allocated), expected);
    assert_eq!(of(&chosen, &allocated), None);
}
