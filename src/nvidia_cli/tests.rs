//! The command lines engines build, as their sources write them, and what nvhook refuses.

use super::info::{info_text, list_text};
use super::*;
use crate::config::Config;
use crate::request::{DeviceSelection, Request, RequestError, SelectionSource};
use nvhook_model::plan::fixtures::{inventory, standard};

fn args(line: &str) -> Vec<String> {
    line.split(' ').map(str::to_string).collect()
}

fn configure_of(line: &str) -> Configure {
    match parse(&args(line)).map(|(_, c)| c) {
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
fn what_nvidia_does_not_take_is_refused_in_one_line() {
    let refused = |line: &str| parse(&args(line)).unwrap_err().to_string();
    for (line, named) in [
        ("configure --bogus --pid=1 /r", "configure option --bogus"),
        ("info --json", "info option --json"),
        ("list --json", "list option --json"),
        ("--bogus configure", "--bogus is not an option"),
        ("mig", "command mig"),
    ] {
        let e = refused(line);
        assert!(e.contains(named), "{line}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
    assert!(refused("configure --device=0 /r").contains("--pid=PID"));
    assert!(refused("configure --pid=0 /r").contains("not a process id"));
    assert!(refused("configure --pid=1 /").contains("absolute path other than /"));
    assert!(refused("configure --pid=1 rootfs").contains("absolute path"));
    assert!(refused("configure --pid=1 /a /b").contains("/b"));
    assert!(refused("configure --pid=1 /r --device").contains("--device needs a value"));
    assert!(
        refused("configure --cuda-compat-mode=auto --pid=1 /r")
            .contains("mount, ldconfig or disabled")
    );
    assert!(refused("--load-kmods").contains("no command"));
    assert!(refused("--debug").contains("--debug needs a value"));
}

/// Every option of libnvidia-container's 1.17-1.20 command line, as NVIDIA's runtime hook
/// and people pass them.
#[test]
fn nvidias_whole_option_set_is_taken() {
    // v1.20's runtime hook, with the default config.
    let (global, c) = parse(&args(
        "--load-kmods configure --cuda-compat-mode=ldconfig --ldconfig=@/sbin/ldconfig.real --device=0,1 --imex-channel=0,3 --compat32 --compute --display --graphics --ngx --utility --video --require=cuda>=12.0 --pid=4242 /r",
    ))
    .unwrap();
    assert_eq!(global, Global::default());
    let Command::Configure(c) = c else {
        panic!("{c:?}")
    };
    assert_eq!(c.flags.imex_channels.as_deref(), Some("0,3"));
    assert!(!c.no_cuda_compat);
    assert_eq!(c.flags.capabilities.len(), 7);
    // Short options, before and after the command (-n and -u mean other things there).
    let (global, c) = parse(&args(
        "-k -n -u -d /tmp/log -l /etc/ld.so.cache -r/run/nvidia/driver --no-create-imex-channels configure -c -u -v -g -D -n -d 2 -r cuda>=11 -l /sbin/ldconfig -p 7 /r",
    ))
    .unwrap();
    assert_eq!(global.root.as_deref(), Some("/run/nvidia/driver"));
    let Command::Configure(c) = c else {
        panic!("{c:?}")
    };
    assert_eq!((c.pid, c.flags.devices.as_deref()), (7, Some("2")));
    assert_eq!(c.flags.capabilities.len(), 6);
    assert_eq!(c.flags.requirements, ["cuda>=11"]);
    for (line, no_compat) in [
        ("configure --cuda-compat-mode=disabled --pid=1 /r", true),
        ("configure --no-cntlibs --pid=1 /r", true),
        ("configure --cuda-compat-mode=mount --pid=1 /r", false),
        (
            "configure --no-devbind --no-persistenced --no-fabricmanager --no-gsp-firmware --pid=1 /r",
            false,
        ),
    ] {
        assert_eq!(configure_of(line).no_cuda_compat, no_compat, "{line}");
    }
    assert_eq!(
        parse(&args("--root /run/nvidia/driver -u1000:1000 info"))
            .unwrap()
            .0
            .root
            .as_deref(),
        Some("/run/nvidia/driver")
    );
    for (line, want) in [
        ("--version", Command::Version),
        ("-V", Command::Version),
        ("--help", Command::Help(None)),
        ("-?", Command::Help(None)),
        ("--usage", Command::Help(None)),
        ("configure --help", Command::Help(Some("configure"))),
        ("list -?", Command::Help(Some("list"))),
    ] {
        assert_eq!(parse(&args(line)).unwrap().1, want, "{line}");
    }
    assert!(help(None).contains("--no-create-imex-channels"));
    assert!(help(Some("configure")).contains("--cuda-compat-mode=MODE"));
    let Command::List(list) = parse(&args("list --firmwares --no-persistenced"))
        .unwrap()
        .1
    else {
        panic!()
    };
    assert!(list.firmwares && !list.libraries);
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
    let everything = match parse(&args("list")).map(|(_, c)| c) {
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

    let libraries = match parse(&args("list --libraries")).map(|(_, c)| c) {
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
    let list = match parse(&args("list -d 1 --device=3")).map(|(_, c)| c) {
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

/// Every command line NVIDIA's v1.20.0 runtime hook was seen to run nvidia-container-cli with
/// (tests/fixtures/nvidia-programs/runtime-hook-argv.tsv) is taken, as the configure it asks
/// for: its devices, capabilities, requirements and IMEX channels.
#[test]
fn nvidias_runtime_hook_command_lines_are_taken() {
    let rows: Vec<Vec<String>> =
        include_str!("../../tests/fixtures/nvidia-programs/runtime-hook-argv.tsv")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.split('\t').map(str::to_string).collect())
            .collect();
    assert_eq!(rows.len(), 5);
    for row in &rows {
        let (_, command) = parse(row).unwrap_or_else(|e| panic!("{row:?}: {e}"));
        let Command::Configure(c) = command else {
            panic!("{row:?}: {command:?}")
        };
        assert_eq!(
            (c.pid, c.rootfs.to_str()),
            (4242, Some("/tmp/rootfs")),
            "{row:?}"
        );
        assert!(!c.no_cuda_compat, "{row:?}");
        let flags = |name: &str| row.iter().filter(|a| a.starts_with(name)).count();
        assert_eq!(
            c.flags.capabilities.len(),
            [
                "--compute",
                "--utility",
                "--video",
                "--graphics",
                "--display",
                "--ngx",
                "--compat32"
            ]
            .iter()
            .map(|f| flags(f))
            .sum::<usize>(),
            "{row:?}"
        );
        assert_eq!(c.flags.requirements.len(), flags("--require="), "{row:?}");
        assert_eq!(
            c.flags.imex_channels.is_some(),
            flags("--imex-channel=") == 1,
            "{row:?}"
        );
        assert_eq!(
            c.flags.devices.is_some(),
            flags("--device=") == 1,
            "{row:?}"
        );
    }
}
