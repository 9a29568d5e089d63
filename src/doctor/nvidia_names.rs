//! Doctor's view of NVIDIA's command names, which docker's and ctr's `--gpus` run by name (and
//! `nvidia-cdi-hook`, which NVIDIA's CDI specs name and Docker 29's `--gpus` looks for):
//! where each resolves on doctor's PATH, and whether each running dockerd found the runtime
//! hook. dockerd looks `nvidia-container-runtime-hook` (and, from Docker 29.2, `nvidia-cdi-hook`)
//! up once, when it starts, on its own PATH: a name installed after that start is not used
//! until dockerd restarts.
//!
//! The judgements are pure functions of the facts (tested below); `gather` reads them.

use super::Check;
use crate::nvidia_cli::{CDI_HOOK_NAME, NAMES, RUNTIME_HOOK_NAME};
use crate::runtime_create;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// One name, as a PATH resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Where the name was found, and the file it leads to once every link is followed.
    pub path: PathBuf,
    pub leads_to: PathBuf,
}

/// A running dockerd and what its PATH gives for the names its `--gpus` looks up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerd {
    pub pid: u32,
    pub started: Option<SystemTime>,
    /// The runtime hook on dockerd's PATH, and when that entry was made.
    pub hook: Option<(PathBuf, Option<SystemTime>)>,
    /// `nvidia-cdi-hook` on dockerd's PATH, and when that entry was made.
    pub cdi_hook: Option<(PathBuf, Option<SystemTime>)>,
}

/// How far [`start_time`] may fall before the real start: `/proc/stat`'s boot time is in whole
/// seconds, a process's start in clock ticks after it. A name made within this of dockerd's
/// start counts as seen, as it most likely was (installed, then dockerd restarted).
const START_TIME_SLACK: Duration = Duration::from_secs(2);

impl Dockerd {
    /// Whether dockerd saw `entry` when it started: on its PATH, and not made after the start
    /// (times that cannot be read do not make a warning up).
    fn saw(&self, entry: Option<&(PathBuf, Option<SystemTime>)>) -> bool {
        entry.is_some_and(|(_, made)| match (made, self.started) {
            (Some(made), Some(started)) => *made <= started + START_TIME_SLACK,
            _ => true,
        })
    }
}

/// The facts the checks judge.
#[derive(Debug, Clone)]
pub struct Facts {
    /// Each of NVIDIA's names, as doctor's PATH resolves it.
    pub names: Vec<(&'static str, Option<Resolved>)>,
    /// This nvhook, every link followed.
    pub nvhook: PathBuf,
    pub dockerds: Vec<Dockerd>,
}

/// A line per name, then one per running dockerd.
pub fn checks(facts: &Facts) -> Vec<Check> {
    let mut out: Vec<Check> = facts
        .names
        .iter()
        .map(|(name, resolved)| name_check(name, resolved.as_ref(), &facts.nvhook))
        .collect();
    out.extend(facts.dockerds.iter().map(dockerd_check));
    out
}

fn name_check(name: &str, resolved: Option<&Resolved>, nvhook: &Path) -> Check {
    let check = format!("name {name}");
    let link = format!(
        "ln -s {} /usr/bin/{name} (the nvhook packages ship it)",
        nvhook.display()
    );
    match resolved {
        None if name == CDI_HOOK_NAME => Check::warn(
            &check,
            "not on PATH: the hooks of NVIDIA's CDI specs (nvidia-ctk cdi generate) that name it fail, and Docker 29's --gpus does not use CDI".to_string(),
            link,
        ),
        None => Check::warn(
            &check,
            "not on PATH: an engine's --gpus that runs it fails".to_string(),
            link,
        ),
        Some(r) if r.leads_to == nvhook => {
            Check::ok(&check, format!("{} -> nvhook", r.path.display()))
        }
        Some(r) => Check::warn(
            &check,
            format!(
                "{} is {}, not this nvhook: an engine's --gpus runs that program",
                r.path.display(),
                r.leads_to.display()
            ),
            format!(
                "to serve --gpus with nvhook, remove NVIDIA's package of it (nvidia-container-toolkit, libnvidia-container-tools) and {link}"
            ),
        ),
    }
}

fn dockerd_check(d: &Dockerd) -> Check {
    let check = format!("dockerd {}", d.pid);
    let restart =
        "restart dockerd (systemctl restart docker): it looks the hook up only when it starts";
    let cdi = d.saw(d.cdi_hook.as_ref());
    match &d.hook {
        None if cdi => Check::warn(
            &check,
            format!(
                "only {CDI_HOOK_NAME} is on dockerd's PATH: Docker 29.2 on serves `docker run --gpus` from CDI specs of nvidia.com/gpu alone (nvhook cdi refresh keeps nvhook's current), earlier releases fail it (could not select device driver)"
            ),
            format!(
                "link {RUNTIME_HOOK_NAME} into a directory on dockerd's PATH (/usr/bin), then {restart}"
            ),
        ),
        None => Check::warn(
            &check,
            format!(
                "{RUNTIME_HOOK_NAME} is not on dockerd's PATH: `docker run --gpus` fails (could not select device driver)"
            ),
            format!("link it into a directory on dockerd's PATH (/usr/bin), then {restart}"),
        ),
        Some((path, _)) if !d.saw(d.hook.as_ref()) => Check::warn(
            &check,
            format!(
                "started before {} was made, so it did not register the hook: `docker run --gpus` fails (could not select device driver)",
                path.display()
            ),
            restart,
        ),
        Some((path, _)) if cdi => Check::ok(
            &check,
            format!(
                "finds {} and {CDI_HOOK_NAME} on its PATH (docker run --gpus: Docker 29.2 on asks CDI specs of nvidia.com/gpu first, which nvhook cdi refresh keeps current, then the hook)",
                path.display()
            ),
        ),
        Some((path, _)) => Check::ok(
            &check,
            format!("finds {} on its PATH (docker run --gpus)", path.display()),
        ),
    }
}

/// When the process whose `/proc/<pid>/stat` is `stat` started, given `/proc/stat`'s `btime`
/// line and the clock's ticks per second.
pub fn start_time(stat: &str, proc_stat: &str, ticks_per_second: u64) -> Option<SystemTime> {
    // The command name (field 2) may hold spaces and parentheses: count after its last `)`.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let since_boot = Duration::from_millis(ticks.checked_mul(1000)? / ticks_per_second.max(1));
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(boot) + since_boot)
}

/// `PATH`'s value in a process environment (`/proc/<pid>/environ`: NUL-separated).
pub fn path_of(environ: &[u8]) -> Option<&OsStr> {
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"PATH="))
        .map(OsStr::from_bytes)
}

/// Reads the facts: doctor's own PATH, and each dockerd's from `/proc`.
pub fn gather(nvhook: PathBuf) -> Facts {
    let path_var = std::env::var_os("PATH");
    let dirs = runtime_create::search_dirs(path_var.as_deref());
    let names = NAMES
        .iter()
        .map(|name| {
            let resolved = runtime_create::locate_runtime(name, &dirs).map(|path| Resolved {
                leads_to: std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone()),
                path,
            });
            (*name, resolved)
        })
        .collect();
    Facts {
        names,
        nvhook,
        dockerds: dockerds(),
    }
}

fn dockerds() -> Vec<Dockerd> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let proc_stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    let mut out: Vec<Dockerd> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "dockerd")
        })
        .map(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            // Go's exec.LookPath searches nothing when PATH is unset.
            let dirs: Vec<PathBuf> = path_of(&environ)
                .map(|p| std::env::split_paths(p).collect())
                .unwrap_or_default();
            let on_path = |name| {
                runtime_create::locate_runtime(name, &dirs).map(|path| {
                    let made = std::fs::symlink_metadata(&path)
                        .and_then(|m| m.modified())
                        .ok();
                    (path, made)
                })
            };
            let started = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| start_time(&stat, &proc_stat, ticks));
            Dockerd {
                pid,
                started,
                hook: on_path(RUNTIME_HOOK_NAME),
                cdi_hook: on_path(CDI_HOOK_NAME),
            }
        })
        .collect();
    out.sort_by_key(|d| d.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Level;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn resolved(path: &str, leads_to: &str) -> Option<Resolved> {
        Some(Resolved {
            path: path.into(),
            leads_to: leads_to.into(),
        })
    }

    #[test]
    fn each_name_says_where_it_leads() {
        let facts = Facts {
            names: vec![
                (
                    "nvidia-container-runtime-hook",
                    resolved("/usr/bin/nvidia-container-runtime-hook", "/usr/bin/nvhook"),
                ),
                (
                    "nvidia-container-cli",
                    resolved(
                        "/usr/bin/nvidia-container-cli",
                        "/usr/bin/nvidia-container-cli",
                    ),
                ),
                ("nvidia-other", None),
            ],
            nvhook: "/usr/bin/nvhook".into(),
            dockerds: Vec::new(),
        };
        let checks = checks(&facts);
        let levels: Vec<Level> = checks.iter().map(|c| c.level).collect();
        assert_eq!(levels, [Level::Ok, Level::Warn, Level::Warn]);
        assert_eq!(
            checks[0].to_string(),
            "ok   name nvidia-container-runtime-hook: /usr/bin/nvidia-container-runtime-hook -> nvhook"
        );
        assert!(
            checks[1].detail.contains("not this nvhook"),
            "{}",
            checks[1]
        );
        assert!(
            checks[1]
                .fix
                .as_deref()
                .unwrap()
                .contains("nvidia-container-toolkit")
        );
        assert!(checks[2].detail.starts_with("not on PATH"), "{}", checks[2]);
        assert!(
            checks[2]
                .fix
                .as_deref()
                .unwrap()
                .starts_with("ln -s /usr/bin/nvhook /usr/bin/nvidia-other")
        );
    }

    #[test]
    fn a_dockerd_started_before_the_hook_was_made_must_restart() {
        let hook = PathBuf::from("/usr/bin/nvidia-container-runtime-hook");
        let dockerd = |started, made| Dockerd {
            pid: 42,
            started,
            hook: Some((hook.clone(), made)),
            cdi_hook: None,
        };
        // Made a moment after the start as read from /proc, which may be a second early:
        // seen.
        assert_eq!(
            dockerd_check(&dockerd(Some(at(100)), Some(at(101)))).level,
            Level::Ok
        );
        let found = dockerd_check(&dockerd(Some(at(200)), Some(at(100))));
        assert_eq!(found.level, Level::Ok, "{found}");
        assert_eq!(
            found.to_string(),
            "ok   dockerd 42: finds /usr/bin/nvidia-container-runtime-hook on its PATH (docker run --gpus)"
        );
        let stale = dockerd_check(&dockerd(Some(at(100)), Some(at(200))));
        assert_eq!(stale.level, Level::Warn);
        assert!(stale.detail.starts_with("started before"), "{stale}");
        assert!(stale.fix.as_deref().unwrap().starts_with("restart dockerd"));
        // Times that cannot be read do not make a warning up.
        assert_eq!(dockerd_check(&dockerd(None, Some(at(1)))).level, Level::Ok);
        let missing = dockerd_check(&Dockerd {
            pid: 42,
            started: Some(at(1)),
            hook: None,
            cdi_hook: None,
        });
        assert_eq!(missing.level, Level::Warn);
        assert!(
            missing.detail.contains("not on dockerd's PATH"),
            "{missing}"
        );
    }

    #[test]
    fn a_dockerd_that_saw_nvidia_cdi_hook_is_told_docker_29s_cdi_route() {
        let cdi_hook = Some((PathBuf::from("/usr/bin/nvidia-cdi-hook"), Some(at(100))));
        let both = Dockerd {
            pid: 7,
            started: Some(at(200)),
            hook: Some((
                PathBuf::from("/usr/bin/nvidia-container-runtime-hook"),
                Some(at(100)),
            )),
            cdi_hook: cdi_hook.clone(),
        };
        let check = dockerd_check(&both);
        assert_eq!(check.level, Level::Ok, "{check}");
        assert!(
            check.detail.contains("and nvidia-cdi-hook") && check.detail.contains("CDI"),
            "{check}"
        );
        // Made after dockerd started: not seen, so no CDI route to speak of.
        let late = Dockerd {
            started: Some(at(50)),
            ..both.clone()
        };
        assert!(!dockerd_check(&late).detail.contains("CDI"));
        // The CDI name alone serves Docker 29.2 on and no earlier release.
        let cdi_only = dockerd_check(&Dockerd { hook: None, ..both });
        assert_eq!(cdi_only.level, Level::Warn);
        assert!(
            cdi_only.detail.starts_with("only nvidia-cdi-hook")
                && cdi_only.detail.contains("earlier releases fail"),
            "{cdi_only}"
        );
        assert!(
            cdi_only
                .fix
                .as_deref()
                .unwrap()
                .starts_with("link nvidia-container-runtime-hook")
        );
    }

    #[test]
    fn a_process_start_is_boot_time_plus_its_ticks() {
        // Field 22 (starttime) is 12345 ticks; the name holds a space and a parenthesis.
        let stat = "77 (my) proc) S 1 77 77 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 1000 10";
        let proc_stat = "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n";
        assert_eq!(
            start_time(stat, proc_stat, 100),
            Some(at(1_700_000_000) + Duration::from_millis(123_450))
        );
        assert_eq!(start_time(stat, "cpu 1\n", 100), None);
        assert_eq!(start_time("garbage", proc_stat, 100), None);
    }

    #[test]
    fn path_is_read_from_a_process_environment() {
        assert_eq!(
            path_of(b"HOME=/root\0PATH=/a:/b\0X=1\0"),
            Some(OsStr::new("/a:/b"))
        );
        assert_eq!(path_of(b"HOME=/root\0"), None);
    }
}
