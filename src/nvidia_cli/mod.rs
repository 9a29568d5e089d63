//! NVIDIA's command names, which engines run by name: Docker 19.03 to 27's `--gpus` runs
//! `nvidia-container-runtime-hook prestart`, containerd's (to 2.1) and nerdctl's `--gpus` run
//! `nvidia-container-cli ... configure ...`. nvhook answers both when run under them, and
//! `nvidia-cdi-hook` (the hook program of NVIDIA's CDI specs, see [`cdi_hook`]).
//!
//! This module reads `nvidia-container-cli`'s command line, the subset those engines and
//! scripts use (libnvidia-container's option names), into typed commands; `info` writes
//! `info` and `list` in libnvidia-container's shapes. Pure: the binary applies them.

pub mod cdi_hook;
pub mod info;
pub mod runtime_hook;

pub use cdi_hook::CDI_HOOK_NAME;

use crate::capability::Capability;
use crate::request::Flags;
use crate::shown::Shown;
use std::path::PathBuf;

/// The OCI hook Docker's `--gpus` adds (`nvidia-container-runtime-hook prestart`).
pub const RUNTIME_HOOK_NAME: &str = "nvidia-container-runtime-hook";
/// The program containerd's and nerdctl's `--gpus` hook runs through `containerd oci-hook`.
pub const CLI_NAME: &str = "nvidia-container-cli";
/// Every NVIDIA name nvhook answers to, as the packages link them.
pub const NAMES: [&str; 3] = [RUNTIME_HOOK_NAME, CLI_NAME, CDI_HOOK_NAME];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CliError {
    #[error("{0} is not an option of nvidia-container-cli (try nvidia-container-cli --help)")]
    Unsupported(Shown),
    #[error("{option} needs a value ({option}=VALUE)")]
    NoValue { option: &'static str },
    #[error("--pid={0}: not a process id")]
    BadPid(Shown),
    #[error("configure needs --pid=PID: nvhook works only on a container the runtime started")]
    NoPid,
    #[error(
        "configure needs the container's rootfs, an absolute path other than / (got {0}), after its options"
    )]
    BadRootfs(Shown),
    #[error("no command: use configure, info or list")]
    NoCommand,
    #[error("--cuda-compat-mode={0}: use mount, ldconfig or disabled")]
    BadCompatMode(Shown),
}

/// One command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Configure(Configure),
    Info {
        csv: bool,
    },
    List(List),
    /// `--version`, `-V`.
    Version,
    /// `--help`, `-?`, `--usage`: the program's, or one command's.
    Help(Option<&'static str>),
}

/// The options of the whole command line that are not the command's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Global {
    /// `--root=PATH`: the driver root, which must be the one nvhook's config names.
    pub root: Option<String>,
}

/// `configure`: give the container of `pid`, whose rootfs is `rootfs`, what `flags` ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configure {
    pub flags: Flags,
    pub pid: i32,
    pub rootfs: PathBuf,
    /// `--no-cgroups`: the caller sets the device cgroup itself.
    pub no_cgroups: bool,
    /// `--cuda-compat-mode=disabled` (or `--no-cntlibs`): the image's compat libraries are
    /// not used. `mount` and `ldconfig` leave the choice to nvhook's rule.
    pub no_cuda_compat: bool,
}

/// `list`: what a container would get, by kind. With no option, everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct List {
    /// Every device node of the node (`list` with no option).
    pub all_nodes: bool,
    /// `--device=LIST`, `--mig-config=LIST`, `--mig-monitor=LIST`: the driver's control nodes
    /// and the nodes a container given these devices gets.
    pub devices: Flags,
    pub libraries: bool,
    pub binaries: bool,
    pub ipcs: bool,
    pub firmwares: bool,
    pub compat32: bool,
}

/// Global options that change nothing for nvhook: long name, short name, whether a value
/// follows (`Some(false)`: optional, attached only), why.
const IGNORED_GLOBAL: [(&str, &str, Option<bool>, &str); 6] = [
    (
        "--load-kmods",
        "-k",
        None,
        "nvhook never loads kernel modules",
    ),
    ("--no-pivot", "-n", None, "nvhook never pivots"),
    (
        "--user",
        "-u",
        Some(false),
        "nvhook runs as the runtime's user",
    ),
    (
        "--debug",
        "-d",
        Some(true),
        "nvhook logs where its config says",
    ),
    (
        "--ldcache",
        "-l",
        Some(true),
        "nvhook reads the driver root's loader cache",
    ),
    (
        "--no-create-imex-channels",
        "",
        None,
        "nvhook creates no IMEX channel node on the host",
    ),
];

/// The options of `configure` that nvhook accepts and leaves as they are: NVIDIA's runtime
/// hook never passes them, and nvhook's plan already leaves out what the host lacks.
const IGNORED_CONFIGURE: [(&str, &str); 5] = [
    (
        "--no-devbind",
        "the runtime's own nodes are kept; nvhook adds the GPU's",
    ),
    (
        "--no-persistenced",
        "the persistenced socket is mounted where the host has one",
    ),
    (
        "--no-fabricmanager",
        "the fabricmanager socket is mounted where the host has one",
    ),
    (
        "--no-gsp-firmware",
        "the GSP firmware is mounted where the host has it",
    ),
    ("--no-cntlibs", "same as --cuda-compat-mode=disabled"),
];

/// Reads the arguments after the program name.
pub fn parse(args: &[String]) -> Result<(Global, Command), CliError> {
    let mut global = Global::default();
    let mut args = args.iter().map(String::as_str);
    let command = loop {
        let arg = args.next().ok_or(CliError::NoCommand)?;
        let (name, inline) = split(arg);
        match name {
            "--help" | "-?" | "--usage" => return Ok((global, Command::Help(None))),
            "--version" | "-V" => return Ok((global, Command::Version)),
            _ => {}
        }
        if let Some(attached) = option(name, "--root", "-r") {
            let root = match attached.or(inline) {
                Some(root) => root.to_string(),
                None => value_of(None, &mut args, "--root")?,
            };
            global.root = Some(root);
            continue;
        }
        let ignored = IGNORED_GLOBAL
            .iter()
            .find_map(|entry| Some((entry, option(name, entry.0, entry.1)?)));
        match ignored {
            Some(((option, _, takes_value, why), attached)) => {
                let given = attached.or(inline).is_some();
                if *takes_value == Some(true) && !given && args.next().is_none() {
                    return Err(CliError::NoValue { option });
                }
                tracing::debug!(option, why, "ignored");
            }
            None if arg.starts_with('-') => return Err(CliError::Unsupported(arg.into())),
            None => break arg,
        }
    };
    let rest: Vec<&str> = args.collect();
    if rest
        .iter()
        .any(|a| matches!(*a, "--help" | "-?" | "--usage"))
    {
        let known = ["configure", "info", "list"]
            .into_iter()
            .find(|c| *c == command);
        return Ok((global, Command::Help(known)));
    }
    let command = match command {
        "configure" => configure(&rest).map(Command::Configure),
        "info" => match rest[..] {
            [] => Ok(Command::Info { csv: false }),
            ["--csv"] => Ok(Command::Info { csv: true }),
            [first, ..] => Err(CliError::Unsupported(unsupported(first, "info"))),
        },
        "list" => list(&rest).map(Command::List),
        other => Err(CliError::Unsupported(format!("command {other}").into())),
    }?;
    Ok((global, command))
}

/// `nvidia-container-cli --help`, or one command's, in argp's layout.
pub fn help(command: Option<&str>) -> String {
    let (usage, what, options): (&str, &str, &[&str]) = match command {
        Some("configure") => (
            "configure [OPTION...] ROOTFS",
            "Configure a container with GPU support (nvhook: the same plan as its prestart hook)",
            &[
                "-p, --pid=PID",
                "-d, --device=ID",
                "-r, --require=EXPR",
                "-l, --ldconfig=PATH",
                "-c, --compute",
                "-u, --utility",
                "-v, --video",
                "-g, --graphics",
                "-D, --display",
                "-n, --ngx",
                "    --compat32",
                "    --mig-config=ID",
                "    --mig-monitor=ID",
                "    --imex-channel=CHANNEL",
                "    --no-cgroups",
                "    --cuda-compat-mode=MODE",
                "    --no-cntlibs",
                "    --no-devbind",
                "    --no-persistenced",
                "    --no-fabricmanager",
                "    --no-gsp-firmware",
            ],
        ),
        Some("info") => (
            "info [OPTION...]",
            "Report information about the driver and devices",
            &["    --csv"],
        ),
        Some("list") => (
            "list [OPTION...]",
            "List driver components",
            &[
                "-d, --device=ID",
                "-l, --libraries",
                "-b, --binaries",
                "-i, --ipcs",
                "-f, --firmwares",
                "    --compat32",
                "    --mig-config=ID",
                "    --mig-monitor=ID",
                "    --imex-channel=CHANNEL",
            ],
        ),
        _ => (
            "[OPTION...] COMMAND [ARG...]",
            "Command line utility for manipulating NVIDIA GPU containers (nvhook answering as nvidia-container-cli).\n\n Commands:\n  configure                  Configure a container with GPU support\n  info                       Report information about the driver and devices\n  list                       List driver components",
            &[
                "-?, --help",
                "-d, --debug=FILE",
                "-k, --load-kmods",
                "-l, --ldcache=FILE",
                "    --no-create-imex-channels",
                "-n, --no-pivot",
                "-r, --root=PATH",
                "    --usage",
                "-u, --user[=UID[:GID]]",
                "-V, --version",
            ],
        ),
    };
    let mut text = format!("Usage: {CLI_NAME} {usage}\n{what}\n\n Options:\n");
    for option in options {
        text.push_str(&format!("  {option}\n"));
    }
    text
}

fn configure(args: &[&str]) -> Result<Configure, CliError> {
    let mut flags = Flags::default();
    let mut pid = None;
    let mut rootfs = None;
    let mut no_cgroups = false;
    let mut no_cuda_compat = false;
    let mut args = args.iter().copied();
    while let Some(arg) = args.next() {
        let (name, inline) = split(arg);
        let mut value = |option| value_of(inline, &mut args, option);
        match name {
            "--device" | "-d" => join(&mut flags.devices, value("--device")?),
            "--require" | "-r" => flags.requirements.push(value("--require")?),
            "--pid" | "-p" => {
                let text = value("--pid")?;
                let parsed = text.parse().ok().filter(|p: &i32| *p > 0);
                pid = Some(parsed.ok_or_else(|| CliError::BadPid(text.as_str().into()))?);
            }
            "--mig-config" => join(&mut flags.mig_config, value("--mig-config")?),
            "--mig-monitor" => join(&mut flags.mig_monitor, value("--mig-monitor")?),
            "--imex-channel" => join(&mut flags.imex_channels, value("--imex-channel")?),
            // nvhook writes the loader cache itself and never runs an ldconfig.
            "--ldconfig" | "-l" => drop(value("--ldconfig")?),
            "--no-cgroups" => no_cgroups = true,
            "--cuda-compat-mode" => match value("--cuda-compat-mode")?.as_str() {
                "mount" | "ldconfig" => no_cuda_compat = false,
                "disabled" => no_cuda_compat = true,
                other => return Err(CliError::BadCompatMode(other.into())),
            },
            _ if inline.is_none() && IGNORED_CONFIGURE.iter().any(|(o, _)| *o == name) => {
                no_cuda_compat |= name == "--no-cntlibs";
                tracing::debug!(option = name, "ignored");
            }
            _ if inline.is_none() && capability(name).is_some() => {
                flags.capabilities.extend(capability(name));
            }
            _ if arg.starts_with('-') => {
                return Err(CliError::Unsupported(unsupported(arg, "configure")));
            }
            _ if rootfs.is_some() => return Err(CliError::Unsupported(arg.into())),
            _ => rootfs = Some(arg),
        }
    }
    let rootfs = rootfs.unwrap_or_default();
    if !rootfs.starts_with('/') || rootfs.trim_end_matches('/').is_empty() {
        return Err(CliError::BadRootfs(rootfs.into()));
    }
    Ok(Configure {
        flags,
        pid: pid.ok_or(CliError::NoPid)?,
        rootfs: PathBuf::from(rootfs),
        no_cgroups,
        no_cuda_compat,
    })
}

fn list(args: &[&str]) -> Result<List, CliError> {
    let mut list = List::default();
    let mut args = args.iter().copied();
    while let Some(arg) = args.next() {
        let (name, inline) = split(arg);
        let mut value = |option| value_of(inline, &mut args, option);
        let selection = &mut list.devices;
        match (name, inline) {
            ("--device" | "-d", _) => join(&mut selection.devices, value("--device")?),
            ("--mig-config", _) => join(&mut selection.mig_config, value("--mig-config")?),
            ("--mig-monitor", _) => join(&mut selection.mig_monitor, value("--mig-monitor")?),
            ("--libraries" | "-l", None) => list.libraries = true,
            ("--binaries" | "-b", None) => list.binaries = true,
            ("--ipcs" | "-i", None) => list.ipcs = true,
            ("--firmwares" | "-f", None) => list.firmwares = true,
            ("--compat32", None) => list.compat32 = true,
            ("--imex-channel", _) => join(&mut selection.imex_channels, value("--imex-channel")?),
            ("--no-persistenced" | "--no-fabricmanager" | "--no-gsp-firmware", None) => {}
            _ => return Err(CliError::Unsupported(unsupported(arg, "list"))),
        }
    }
    // No option, or IMEX channels alone: everything, as libnvidia-container lists.
    let only_imex = List {
        devices: Flags {
            imex_channels: list.devices.imex_channels.clone(),
            ..Flags::default()
        },
        ..List::default()
    };
    if list == only_imex {
        return Ok(List {
            all_nodes: true,
            libraries: true,
            binaries: true,
            ipcs: true,
            firmwares: true,
            compat32: true,
            ..only_imex
        });
    }
    Ok(list)
}

/// An option's value: inline (`--name=value`) or the next argument, never empty.
fn value_of<'a>(
    inline: Option<&'a str>,
    args: &mut impl Iterator<Item = &'a str>,
    option: &'static str,
) -> Result<String, CliError> {
    inline
        .or_else(|| args.next())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .ok_or(CliError::NoValue { option })
}

/// A repeated list option adds to the lists before it, as libnvidia-container joins them.
fn join(list: &mut Option<String>, more: String) {
    *list = Some(match list.take() {
        Some(earlier) => format!("{earlier},{more}"),
        None => more,
    });
}

/// Whether `name` (an argument less any `=value`) is the option `long` or `short`: `Some` of
/// the value attached to the short form (`-r/run/nvidia/driver`), if any.
fn option<'a>(name: &'a str, long: &str, short: &str) -> Option<Option<&'a str>> {
    if name == long || (!short.is_empty() && name == short) {
        return Some(None);
    }
    let attached = name
        .strip_prefix(short)
        .filter(|_| !short.is_empty() && !name.starts_with("--"))?;
    (!attached.is_empty()).then_some(Some(attached))
}

/// `--name=value` as (`--name`, `value`); anything else as itself.
fn split(arg: &str) -> (&str, Option<&str>) {
    match arg.split_once('=') {
        Some((name, value)) if name.starts_with('-') => (name, Some(value)),
        _ => (arg, None),
    }
}

/// The capability flags of `configure`, long and short as libnvidia-container names them.
fn capability(flag: &str) -> Option<Capability> {
    Some(match flag {
        "--compute" | "-c" => Capability::Compute,
        "--utility" | "-u" => Capability::Utility,
        "--video" | "-v" => Capability::Video,
        "--graphics" | "-g" => Capability::Graphics,
        "--display" | "-D" => Capability::Display,
        "--compat32" => Capability::Compat32,
        "--ngx" | "-n" => Capability::Ngx,
        _ => return None,
    })
}

fn unsupported(arg: &str, command: &str) -> Shown {
    format!("{command} option {arg}").into()
}

#[cfg(test)]
mod tests;
