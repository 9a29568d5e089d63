//! The command lines engines build, as their sources write them, and what nvhook refuses.

use super::report::{info_text, list_text};
use super::*;
use crate::config::Config;
use crate::plan::tests::{inventory, standard};
use crate::request::{DeviceSelection, Request, RequestError, SelectionSource};

fn args(line: &str) -> Vec<String> {
    line.split(' ').map(str::to_string).collect()
}

fn configure_of(line: &str) -> Configure {
    match parse(&args(line)) {
        Ok(Command::Configure(c)) => c,
        other => panic!("{line}: {other:?}"),
    }
}

#[test]
fn containerd_1_6_ctr_run_gpus_command_line() {
    // contrib/nvidia: `--load-kmods` before the command, every capability, --pid and the
    // rootfs as containerd oci-hook renders them.
    let c = configure_of(
        "--load-kmods configure --device=0,2 --compute --compat32 --graphics --utility --video --display --pid=4242 /run/c/b/rootfs",
    );
    assert_eq!(c.pid, 4242);
    assert_eq!(c.rootfs, PathBuf::from("/run/c/b/rootfs"));
    assert!(!c.no_cgroups);
    assert_eq!(c.flags.devices.as_deref(), Some("0,2"));
    assert_eq!(
        c.flags
            .capabilities
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>(),
        [
            "compute", "utility", "video", "graphics", "display", "compat32"
        ]
    );

    let request = Request::from_flags(&c.flags, &Config::default()).unwrap();
    assert_eq!(request.source, SelectionSource::CliFlag);
    assert_eq!(request.devices.to_string(), "0,2");
    assert_eq!(request.capabilities, c.flags.capabilities);
}

#[test]
fn every_option_of_the_subset_is_read() {
    let c = configure_of(
        "--load-kmods --debug /var/log/nvc.log --ldcache=/etc/ld.so.cache --user --no-pivot configure --device=GPU-1 --device 3 --require=cuda>=12.0 --require brand=tesla --ldconfig=@/sbin/ldconfig.real --no-cgroups --ngx -c -u --mig-config=0 --mig-monitor=0 -p 7 /rootfs",
    );
    assert_eq!(c.flags.devices.as_deref(), Some("GPU-1,3"));
    assert_eq!(c.flags.requirements, ["cuda>=12.0", "brand=tesla"]);
    assert_eq!(c.flags.mig_config.as_deref(), Some("0"));
    assert_eq!(c.flags.mig_monitor.as_deref(), Some("0"));
    assert!(c.no_cgroups);
    assert_eq!(c.pid, 7);
    assert_eq!(c.flags.capabilities.len(), 3);
}

#[test]
fn no_device_means_the_driver_files_only() {
    let c = configure_of("configure --utility --pid=1 /r");
    let request = Request::from_flags(&c.flags, &Config::default()).unwrap();
    assert_eq!(request.devices, DeviceSelection::NoDevices);
}

#[test]
fn bad_values_name_the_flag() {
    let c = configure_of("configure --device=0,bogus --pid=1 /r");
    let e = Request::from_flags(&c.flags, &Config::default()).unwrap_err();
    assert!(matches!(e, RequestError::UnknownDevice { .. }), "{e}");
    assert!(e.to_string().starts_with("--device=0,bogus: "), "{e}");

    let c = configure_of("configure --require=cuda>>1 --pid=1 /r");
    let e = Request::from_flags(&c.flags, &Config::default()).unwrap_err();
    assert!(e.to_string().starts_with("--require: "), "{e}");
}

#[test]
fn capabilities_the_node_does_not_serve_are_left_out() {
    let config = Config {
        supported_capabilities: vec![Capability::Compute, Capability::Utility],
        ..Config::default()
    };
    let c = configure_of("configure --device=0 --compute --utility --graphics --pid=1 /r");
    let request = Request::from_flags(&c.flags, &config).unwrap();
    assert_eq!(
        request.capabilities,
        [Capability::Compute, Capability::Utility].into()
    );
}

#[test]
fn what_nvhook_does_not_do_is_refused_in_one_line() {
    let refused = |line: &str| parse(&args(line)).unwrap_err().to_string();
    for (line, named) in [
        (
            "--root=/run/nvidia/driver configure --pid=1 /r",
            "--root=/run/nvidia/driver",
        ),
        (
            "configure --no-devbind --pid=1 /r",
            "configure option --no-devbind",
        ),
        (
            "configure --imex-channel=0 --pid=1 /r",
            "configure option --imex-channel=0",
        ),
        ("info --json", "info option --json"),
        ("list --device=0 --firmwares", "list option --firmwares"),
        ("--version", "--version"),
        ("mig", "command mig"),
    ] {
        let e = refused(line);
        assert!(
            e.contains(named) && e.contains("not supported"),
            "{line}: {e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
    assert!(refused("configure --device=0 /r").contains("--pid=PID"));
    assert!(refused("configure --pid=0 /r").contains("not a process id"));
    assert!(refused("configure --pid=1 /").contains("absolute path other than /"));
    assert!(refused("configure --pid=1 rootfs").contains("absolute path"));
    assert!(refused("configure --pid=1 /a /b").contains("/b"));
    assert!(refused("configure --pid=1 /r --device").contains("--device needs a value"));
    assert!(refused("--load-kmods").contains("no command"));
}

#[test]
fn info_has_libnvidia_containers_shape() {
    let text = info_text(&inventory(2, &[]), false);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!("{:<15} {}", "NVRM version:", standard().driver_version)
    );
    assert_eq!(lines[1], "CUDA version:   12.4");
    assert_eq!(lines[2], "");
    assert_eq!(lines[3], "Device Index:   0");
    assert_eq!(lines[4], "Device Minor:   0");
    assert_eq!(lines[5], "Model:          NVIDIA A100-SXM4-80GB");
    assert_eq!(lines[9], "Architecture:   8.0");
    assert_eq!(lines[11], "Device Index:   1");

    let csv = info_text(&inventory(1, &[]), true);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "NVRM version,CUDA version");
    assert_eq!(
        lines[3],
        "Device Index,Device Minor,Model,Brand,GPU UUID,Bus Location,Architecture"
    );
    assert_eq!(lines[4].split(',').count(), 7, "{}", lines[4]);
}

#[test]
fn list_gives_host_paths_by_kind() {
    let inventory = inventory(2, &[]);
    let everything = match parse(&args("list")) {
        Ok(Command::List(list)) => list,
        other => panic!("{other:?}"),
    };
    let text = list_text(&inventory, &everything, &[]);
    assert!(
        text.lines().next().unwrap().ends_with("/dev/nvidiactl"),
        "{text}"
    );
    assert!(
        text.contains("nvidia-smi") && text.contains("persistenced/socket"),
        "{text}"
    );
    let libs32 = inventory
        .files
        .libraries
        .iter()
        .filter(|l| l.class == nvhook_ldcache::ElfClass::Lib32);
    assert!(libs32.clone().count() > 0);
    for lib in libs32 {
        assert!(text.contains(&lib.host_path.display().to_string()));
    }

    let libraries = match parse(&args("list --libraries")) {
        Ok(Command::List(list)) => list,
        other => panic!("{other:?}"),
    };
    let text = list_text(&inventory, &libraries, &[]);
    assert!(
        !text.contains("/dev/") && !text.contains("nvidia-smi"),
        "{text}"
    );
    assert_eq!(
        text.lines().count(),
        inventory
            .files
            .libraries
            .iter()
            .filter(|l| l.class == nvhook_ldcache::ElfClass::Lib64)
            .count()
    );
}

#[test]
fn list_device_gives_the_control_nodes_and_the_plans_nodes() {
    let inventory = inventory(4, &[]);
    let list = match parse(&args("list -d 1 --device=3")) {
        Ok(Command::List(list)) => list,
        other => panic!("{other:?}"),
    };
    assert_eq!(list.devices.devices.as_deref(), Some("1,3"));
    assert!(!list.all_nodes && !list.libraries);
    // The binary plans the request configure would make of the same --device.
    let request = Request::from_flags(&list.devices, &Config::default()).unwrap();
    let plan = crate::plan::build_with_layout(
        &request,
        &inventory,
        "",
        crate::plan::Layout::host_paths("/".into(), inventory.arch),
    )
    .unwrap();
    let text = list_text(&inventory, &list, &plan.devices);
    let nodes: Vec<&str> = text
        .lines()
        .map(|l| &l[l.find("/dev/").unwrap()..])
        .collect();
    assert_eq!(nodes[0], "/dev/nvidiactl", "{text}");
    assert!(nodes.contains(&"/dev/nvidia-uvm"), "{text}");
    assert!(nodes.contains(&"/dev/nvidia1") && nodes.contains(&"/dev/nvidia3"));
    assert!(!nodes.contains(&"/dev/nvidia0") && !nodes.contains(&"/dev/nvidia2"));
    assert_eq!(
        nodes.len(),
        nodes.iter().collect::<std::collections::HashSet<_>>().len()
    );
}
