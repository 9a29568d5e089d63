//! NVIDIA's command names, which engines run by name: Docker 19.03 to 27's `--gpus` runs
//! `nvidia-container-runtime-hook prestart`, containerd's (to 2.1) and nerdctl's `--gpus` run
//! `nvidia-container-cli ... configure ...`. nvhook answers both when run under them, and
//! `nvidia-cdi-hook` (the hook program of NVIDIA's CDI specs, see [`cdi_hook`]).
//!
//! This module reads `nvidia-container-cli`'s command line, the subset those engines and
//! scripts use (libnvidia-container's option names), into typed commands; `report` writes
//! `info` and `list` in libnvidia-container's shapes. Pure: the binary applies them.

pub mod cdi_hook;
pub mod report;

pub use cdi_hook::CDI_HOOK_NAME;

use crate::capability::Capability;
use crate::echo::Echo;
use crate::request::Flags;
use std::path::PathBuf;

/// The OCI hook Docker's `--gpus` adds (`nvidia-container-runtime-hook prestart`).
pub const RUNTIME_HOOK_NAME: &str = "nvidia-container-runtime-hook";
/// The program containerd's and nerdctl's `--gpus` hook runs through `containerd oci-hook`.
pub const CLI_NAME: &str = "nvidia-container-cli";
/// Every NVIDIA name nvhook answers to, as the packages link them.
pub const NAMES: [&str; 3] = [RUNTIME_HOOK_NAME, CLI_NAME, CDI_HOOK_NAME];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CliError {
    #[error(
        "{0} is not supported by nvhook's nvidia-container-cli (it answers configure, info and list, with the options containerd's and nerdctl's --gpus use)"
    )]
    Unsupported(Echo),
    #[error("{option} needs a value ({option}=VALUE)")]
    NoValue { option: &'static str },
    #[error("--pid={0}: not a process id")]
    BadPid(Echo),
    #[error("configure needs --pid=PID: nvhook works only on a container the runtime started")]
    NoPid,
    #[error(
        "configure needs the container's rootfs, an absolute path other than / (got {0}), after its options"
    )]
    BadRootfs(Echo),
    #[error("no command: use configure, info or list")]
    NoCommand,
}

/// One command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Configure(Configure),
    Info { csv: bool },
    List(List),
}

/// `configure`: give the container of `pid`, whose rootfs is `rootfs`, what `flags` ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configure {
    pub flags: Flags,
    pub pid: i32,
    pub rootfs: PathBuf,
    /// `--no-cgroups`: the caller sets the device cgroup itself.
    pub no_cgroups: bool,
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
    pub compat32: bool,
}

/// Global options that change nothing for nvhook: name, whether a value must follow, why.
const IGNORED_GLOBAL: [(&str, bool, &str); 5] = [
    ("--load-kmods", false, "nvhook never loads kernel modules"),
    ("--no-pivot", false, "nvhook never pivots"),
    ("--user", false, "nvhook runs as the runtime's user"),
    ("--debug", true, "nvhook logs where its config says"),
    (
        "--ldcache",
        true,
        "nvhook reads the driver root's loader cache",
    ),
];

/// Reads the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, CliError> {
    let mut args = args.iter().map(String::as_str);
    let command = loop {
        let arg = args.next().ok_or(CliError::NoCommand)?;
        let (name, inline) = split(arg);
        match IGNORED_GLOBAL.iter().find(|(option, ..)| *option == name) {
            Some((option, takes_value, why)) => {
                if *takes_value && inline.is_none() && args.next().is_none() {
                    return Err(CliError::NoValue { option });
                }
                tracing::debug!(option, why, "ignored");
            }
            None if arg.starts_with('-') => return Err(CliError::Unsupported(arg.into())),
            None => break arg,
        }
    };
    let rest: Vec<&str> = args.collect();
    match command {
        "configure" => configure(&rest).map(Command::Configure),
        "info" => match rest[..] {
            [] => Ok(Command::Info { csv: false }),
            ["--csv"] => Ok(Command::Info { csv: true }),
            [first, ..] => Err(CliError::Unsupported(unsupported(first, "info"))),
        },
        "list" => list(&rest).map(Command::List),
        other => Err(CliError::Unsupported(format!("command {other}").into())),
    }
}

fn configure(args: &[&str]) -> Result<Configure, CliError> {
    let mut flags = Flags::default();
    let mut pid = None;
    let mut rootfs = None;
    let mut no_cgroups = false;
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
            // nvhook writes the loader cache itself and never runs an ldconfig.
            "--ldconfig" | "-l" => drop(value("--ldconfig")?),
            "--no-cgroups" => no_cgroups = true,
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
            ("--compat32", None) => list.compat32 = true,
            _ => return Err(CliError::Unsupported(unsupported(arg, "list"))),
        }
    }
    if list == List::default() {
        return Ok(List {
            all_nodes: true,
            devices: Flags::default(),
            libraries: true,
            binaries: true,
            ipcs: true,
            compat32: true,
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
        "--ngx" => Capability::Ngx,
        _ => return None,
    })
}

fn unsupported(arg: &str, command: &str) -> Echo {
    format!("{command} option {arg}").into()
}

#[cfg(test)]
mod tests;
