//! NRI plugin mode (`nvhook nri`): whether the engine runs NRI, whether its socket is there,
//! whether nvhook is set up as a plugin and running, and whether the runtime path is set up
//! beside it. Facts are read in [`gather`]; what they mean is decided in [`checks`], from the
//! facts alone.
//!
//! NRI fails open: an engine that runs NRI without nvhook's plugin starts GPU pods, without
//! their GPUs. So a plugin that is set up but not running is worth a line of its own.

use super::{Check, under};
use crate::configure::{self, Engine, NriSetting};
use std::path::{Path, PathBuf};

/// Where containerd and CRI-O listen for plugins and look for pre-registered ones, unless
/// their config says otherwise.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
pub const PLUGIN_DIR: &str = "/opt/nri/plugins";
/// The unit packaging/systemd installs (not enabled).
pub const SERVICE: &str = "nvhook-nri.service";

/// What an engine config says about NRI.
#[derive(Debug, Clone)]
pub struct EngineNri {
    pub engine: &'static str,
    pub file: PathBuf,
    pub setting: Result<NriSetting, String>,
}

/// How nvhook is set up to run as a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setup {
    /// `NN-nvhook` in the plugin directory, leading to `target` (the engine starts it when it
    /// starts); `is_nvhook`: the target is a program named nvhook.
    PreRegistered {
        link: PathBuf,
        target: PathBuf,
        is_nvhook: bool,
    },
    /// nvhook-nri.service enabled (a link in a `*.wants` directory).
    Service(PathBuf),
}

/// A running nvhook NRI plugin, and the socket it says it is registered through (none: not
/// registered now).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub pid: u32,
    pub registered_at: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub engines: Vec<EngineNri>,
    /// What the containerd on PATH says its version is (1.6 has no NRI).
    pub containerd_version: Option<String>,
    pub socket: PathBuf,
    pub socket_exists: bool,
    /// Something accepts connections on it (a socket file left by an engine that stopped
    /// does not).
    pub socket_answers: bool,
    pub setup: Vec<Setup>,
    /// `doctor --nri`: the plugin is started by something else (the Kubernetes installer).
    pub declared: bool,
    /// The running nvhook NRI plugins (on this machine: not necessarily this root's).
    pub running: Vec<Running>,
    /// An engine config registers nvhook's runtime too.
    pub runtime_configured: bool,
}

impl Facts {
    /// Whether this node means to give GPUs through NRI: nvhook is set up as a plugin, or
    /// doctor was told so (`--nri`). A running plugin alone does not say it: it may be another
    /// root's (a test's, a chroot's).
    pub fn nri_mode(&self) -> bool {
        !self.setup.is_empty() || self.declared
    }
}

/// The facts under `root` (engine configs, socket, plugin directory, systemd links); running
/// plugins are looked for in this host's /proc.
pub fn gather(root: &Path, runtime_configured: bool, declared: bool) -> Facts {
    let mut engines = Vec::new();
    for file in Engine::Containerd.existing_configs(root) {
        engines.push(engine_nri(Engine::Containerd, file));
    }
    // CRI-O reads crio.conf, then its drop-ins in name order: the last setting wins.
    let crio_files = std::iter::once(under(root, "/etc/crio/crio.conf"))
        .chain(sorted_entries(&under(root, "/etc/crio/crio.conf.d")))
        .filter(|f| f.is_file());
    let crio: Vec<EngineNri> = crio_files
        .map(|file| engine_nri(Engine::Crio, file))
        .collect();
    let deciding = crio
        .iter()
        .rev()
        .find(|e| !matches!(e.setting, Ok(NriSetting::DefaultOn)))
        .or(crio.last());
    engines.extend(deciding.cloned());
    let socket = under(root, DEFAULT_SOCKET);
    let registrations = Path::new(crate::nri::registration::DIR);
    Facts {
        containerd_version: engines
            .iter()
            .any(|e| e.engine == Engine::Containerd.name())
            .then(|| super::program_version("containerd"))
            .flatten(),
        engines,
        socket_exists: socket.exists(),
        socket_answers: std::os::unix::net::UnixStream::connect(&socket).is_ok(),
        socket,
        setup: setup(root),
        declared,
        running: running_plugins(Path::new("/proc"))
            .into_iter()
            .map(|pid| Running {
                pid,
                registered_at: crate::nri::registration::registered_at(registrations, pid),
            })
            .collect(),
        runtime_configured,
    }
}

fn engine_nri(engine: Engine, file: PathBuf) -> EngineNri {
    let setting = std::fs::read_to_string(&file)
        .map_err(|e| e.to_string())
        .and_then(|text| configure::nri_setting(engine, &text));
    EngineNri {
        engine: engine.name(),
        file,
        setting,
    }
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    entries
}

/// Whether `name` is a plugin name NRI would start as nvhook: two digits, `-nvhook`.
fn is_plugin_name(name: &str) -> bool {
    let (index, plugin) = name.split_at_checked(2).unwrap_or(("", ""));
    index.chars().all(|c| c.is_ascii_digit()) && index.len() == 2 && plugin == "-nvhook"
}

fn setup(root: &Path) -> Vec<Setup> {
    let mut found = Vec::new();
    for link in sorted_entries(&under(root, PLUGIN_DIR)) {
        let name = link.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !is_plugin_name(name) {
            continue;
        }
        // A link's absolute target names the host's path: follow it under `root`.
        let target = match std::fs::read_link(&link) {
            Ok(to) if to.is_absolute() => under(root, &to.to_string_lossy()),
            Ok(to) => link.parent().unwrap_or(root).join(to),
            Err(_) => link.clone(),
        };
        let is_nvhook = target.is_file()
            && (target.file_name().is_some_and(|n| n == "nvhook")
                || std::fs::canonicalize(&target)
                    .ok()
                    .and_then(|t| t.file_name().map(|n| n == "nvhook"))
                    .unwrap_or(false)
                || target == link);
        found.push(Setup::PreRegistered {
            link,
            target,
            is_nvhook,
        });
    }
    for wants in sorted_entries(&under(root, "/etc/systemd/system")) {
        let unit = wants.join(SERVICE);
        if wants.to_string_lossy().ends_with(".wants") && unit.symlink_metadata().is_ok() {
            found.push(Setup::Service(unit));
        }
    }
    found
}

/// Processes that run nvhook as an NRI plugin: `nvhook ... nri ...`, or `NN-nvhook` as the
/// engine starts a pre-registered one.
pub fn running_plugins(proc: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir(proc)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline =
                std::fs::read(proc.join(pid.to_string()).join("cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            is_plugin_command(&args)
        })
        .collect();
    pids.sort_unstable();
    pids
}

fn is_plugin_command(args: &[&[u8]]) -> bool {
    let Some(program) = args.first() else {
        return false;
    };
    let name =
        String::from_utf8_lossy(program.rsplit(|b| *b == b'/').next().unwrap_or(b"")).into_owned();
    is_plugin_name(&name) || (name == "nvhook" && args[1..].iter().any(|a| *a == b"nri"))
}

pub fn checks(facts: &Facts, runtime_name: &str) -> Vec<Check> {
    if !facts.nri_mode() {
        return Vec::new();
    }
    let mut out = Vec::new();
    if facts.engines.is_empty() {
        out.push(Check::warn(
            "NRI engine",
            "no containerd or CRI-O config found: containerd 2 and CRI-O 1.30+ run NRI by default, containerd 1.7 does not",
            "on containerd 1.7: nvhook configure containerd --nri, then restart containerd once",
        ));
    }
    let containerd_without_nri = facts
        .containerd_version
        .as_deref()
        .filter(|v| configure::containerd::has_nri(v) == Some(false));
    for e in &facts.engines {
        let name = format!("NRI {}", e.engine);
        let file = e.file.display();
        if let Some(version) = containerd_without_nri.filter(|_| e.engine == "containerd") {
            out.push(Check::fail(
                &name,
                format!(
                    "{} has no NRI (containerd has it from 1.7), whatever {file} says: GPU pods get no GPU from nvhook's plugin",
                    configure::containerd::version_words(version)
                ),
                format!(
                    "upgrade containerd to 1.7 or later, or give GPUs through the runtime: nvhook configure containerd --engine-config {file}, then restart containerd"
                ),
            ));
            continue;
        }
        out.push(match &e.setting {
            Ok(NriSetting::DefaultOn) => Check::ok(&name, format!("on by default ({file} does not turn it off)")),
            Ok(NriSetting::On) => Check::ok(&name, format!("on in {file}")),
            Ok(off) => Check::fail(
                &name,
                match off {
                    NriSetting::Off => format!("off in {file}: GPU pods get no GPU from nvhook's plugin"),
                    _ => format!("off: {file} is a containerd 1.x config (NRI off by default): GPU pods get no GPU from nvhook's plugin"),
                },
                format!(
                    "nvhook configure {} --nri --engine-config {file}, then restart {} once",
                    e.engine, e.engine
                ),
            ),
            Err(why) => Check::fail(&name, format!("{file}: {why}"), "fix the file by hand"),
        });
    }
    let socket = facts.socket.display();
    out.push(match (facts.socket_exists, facts.socket_answers) {
        (_, true) => Check::ok("NRI socket", format!("{socket} answers")),
        (true, false) => Check::fail(
            "NRI socket",
            format!("{socket} is there, and nothing answers on it (connection refused): a socket left by an engine that stopped, or the engine listens elsewhere (socket_path)"),
            "start the engine with NRI on (see the NRI engine line), or remove the leftover socket; nvhook nri --socket PATH for another socket",
        ),
        (false, false) => Check::warn(
            "NRI socket",
            format!("no {socket}: the engine is not running, runs without NRI, or listens elsewhere (socket_path)"),
            "start the engine with NRI on (see the NRI engine line); nvhook nri --socket PATH for another socket",
        ),
    });
    out.push(plugin_check(&facts.setup, &facts.running, &facts.socket));
    if facts.runtime_configured {
        out.push(Check::warn(
            "NRI and runtime",
            format!(
                "both set up: a container run by runtime {runtime_name} gets nvhook's NRI adjustment first, and nvhook-runtime then finds its work there (nri-mode = hook: the same hook, added once) or nothing to do (nri-mode = cdi: NVIDIA_VISIBLE_DEVICES=void); NRI wins, with a second look at every container"
            ),
            "keep one: nvhook configure containerd --remove (NRI only), or systemctl disable --now nvhook-nri.service and remove /opt/nri/plugins/NN-nvhook (runtime only)",
        ));
    }
    out
}

fn plugin_check(setup: &[Setup], running: &[Running], socket: &Path) -> Check {
    const NAME: &str = "NRI plugin";
    let fails_open = "if it is not running, GPU pods start without their GPUs (NRI fails open)";
    if let Some(Setup::PreRegistered { link, target, .. }) = setup.iter().find(|s| {
        matches!(
            s,
            Setup::PreRegistered {
                is_nvhook: false,
                ..
            }
        )
    }) {
        return Check::warn(
            NAME,
            format!(
                "{} leads to {}, not to an nvhook: the engine starts that program as nvhook's plugin",
                link.display(),
                target.display()
            ),
            format!("ln -sf /usr/bin/nvhook {}", link.display()),
        );
    }
    let how: Vec<String> = setup
        .iter()
        .map(|s| match s {
            Setup::PreRegistered { link, .. } => {
                format!("{} (started by the engine at its start)", link.display())
            }
            Setup::Service(unit) => format!("{SERVICE} enabled ({})", unit.display()),
        })
        .collect();
    let set_up = match how.is_empty() {
        true => "not set up to start by itself: whoever started it keeps it running (the Kubernetes installer's NRI mode does)".to_string(),
        false => format!("set up as {}", how.join(", ")),
    };
    let socket_text = socket.display().to_string();
    let here = running.iter().find(|r| {
        r.registered_at.as_deref().is_some_and(|at| {
            at == socket_text || at == crate::nri::registration::ENGINE_CONNECTION
        })
    });
    let pids = |plugins: &[Running]| {
        plugins
            .iter()
            .map(|r| r.pid.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(plugin) = here {
        return Check::ok(
            NAME,
            format!(
                "running (pid {}), registered with the engine at {socket_text}; {set_up}",
                plugin.pid
            ),
        );
    }
    if !running.is_empty() {
        let elsewhere: Vec<&str> = running
            .iter()
            .filter_map(|r| r.registered_at.as_deref())
            .collect();
        return Check::fail(
            NAME,
            match elsewhere.is_empty() {
                true => format!(
                    "running (pid {}), and registered with no engine: GPU pods start without their GPUs (NRI fails open)",
                    pids(running)
                ),
                false => format!(
                    "running (pid {}), registered at {}, not at {socket_text}: GPU pods of this engine start without their GPUs (NRI fails open)",
                    pids(running),
                    elsewhere.join(", ")
                ),
            },
            format!(
                "see why in its stderr (journalctl -u {SERVICE}); nvhook nri --socket {socket_text} for this engine's socket"
            ),
        );
    }
    match how.is_empty() {
        false => Check::warn(
            NAME,
            format!("{set_up}, and not running: {fails_open}"),
            format!(
                "systemctl start {SERVICE}; a pre-registered plugin starts with the engine (restart it once)"
            ),
        ),
        // Not reached: without a setup or a running plugin, `checks` makes no line.
        true => Check::warn(
            NAME,
            format!("not set up: {fails_open}"),
            format!("systemctl enable --now {SERVICE}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Level;

    fn facts(setting: NriSetting) -> Facts {
        Facts {
            engines: vec![EngineNri {
                engine: "containerd",
                file: "/etc/containerd/config.toml".into(),
                setting: Ok(setting),
            }],
            containerd_version: Some(
                "containerd github.com/containerd/containerd/v2 2.1.9+unknown".into(),
            ),
            socket: DEFAULT_SOCKET.into(),
            socket_exists: true,
            socket_answers: true,
            setup: vec![Setup::Service(
                "/etc/systemd/system/multi-user.target.wants/nvhook-nri.service".into(),
            )],
            declared: false,
            running: vec![Running {
                pid: 42,
                registered_at: Some(DEFAULT_SOCKET.into()),
            }],
            runtime_configured: false,
        }
    }

    fn levels(checks: &[Check]) -> Vec<(String, Level)> {
        checks.iter().map(|c| (c.name.clone(), c.level)).collect()
    }

    #[test]
    fn no_plugin_set_up_means_no_nri_lines_whatever_runs() {
        let mut f = facts(NriSetting::Off);
        f.setup.clear();
        assert!(checks(&f, "nvidia").is_empty());
        // `doctor --nri`: the Kubernetes installer runs it.
        f.declared = true;
        let out = checks(&f, "nvidia");
        assert_eq!(out[2].level, Level::Ok, "{}", out[2]);
        f.running.clear();
        let out = checks(&f, "nvidia");
        assert_eq!(out[2].level, Level::Warn);
        assert!(out[2].detail.contains("NRI fails open"), "{}", out[2]);
    }

    #[test]
    fn a_node_in_nri_mode_is_all_ok() {
        for setting in [NriSetting::DefaultOn, NriSetting::On] {
            let out = checks(&facts(setting), "nvidia");
            assert!(out.iter().all(|c| c.level == Level::Ok), "{out:?}");
            assert_eq!(out.len(), 3);
        }
    }

    #[test]
    fn nri_off_fails_with_configure_nri() {
        for setting in [NriSetting::Off, NriSetting::DefaultOff] {
            let out = checks(&facts(setting), "nvidia");
            assert_eq!(out[0].level, Level::Fail);
            let fix = out[0].fix.as_deref().unwrap();
            assert!(fix.contains("nvhook configure containerd --nri"), "{fix}");
            assert!(fix.contains("restart containerd once"), "{fix}");
        }
    }

    /// Every "ok" is a check that can fail: a containerd without NRI, a leftover socket, a
    /// plugin registered at another socket or nowhere.
    #[test]
    fn what_is_not_so_is_not_ok() {
        let mut old = facts(NriSetting::On);
        old.containerd_version =
            Some("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1".into());
        let out = checks(&old, "nvidia");
        assert_eq!(out[0].level, Level::Fail);
        assert!(
            out[0]
                .detail
                .starts_with("containerd 1.6.20~ds1 has no NRI"),
            "{}",
            out[0].detail
        );
        assert!(
            out[0]
                .fix
                .as_deref()
                .unwrap()
                .contains("upgrade containerd to 1.7")
        );

        let mut leftover = facts(NriSetting::On);
        leftover.socket_answers = false;
        let out = checks(&leftover, "nvidia");
        assert_eq!(out[1].level, Level::Fail);
        assert!(
            out[1].detail.contains("nothing answers on it"),
            "{}",
            out[1].detail
        );

        let mut elsewhere = facts(NriSetting::On);
        elsewhere.running[0].registered_at = Some("/tmp/other.sock".into());
        let out = checks(&elsewhere, "nvidia");
        assert_eq!(out[2].level, Level::Fail);
        assert!(
            out[2].detail.starts_with(
                "running (pid 42), registered at /tmp/other.sock, not at /var/run/nri/nri.sock"
            ),
            "{}",
            out[2].detail
        );

        let mut nowhere = facts(NriSetting::On);
        nowhere.running[0].registered_at = None;
        let out = checks(&nowhere, "nvidia");
        assert_eq!(out[2].level, Level::Fail);
        assert!(
            out[2].detail.contains("registered with no engine"),
            "{}",
            out[2].detail
        );

        let good = checks(&facts(NriSetting::On), "nvidia");
        assert!(good.iter().all(|c| c.level == Level::Ok), "{good:?}");
        assert!(
            good[2].detail.starts_with(
                "running (pid 42), registered with the engine at /var/run/nri/nri.sock"
            )
        );
    }

    #[test]
    fn set_up_and_not_running_warns_that_nri_fails_open() {
        let mut f = facts(NriSetting::On);
        f.running.clear();
        f.socket_exists = false;
        f.socket_answers = false;
        let out = checks(&f, "nvidia");
        assert_eq!(
            levels(&out),
            [
                ("NRI containerd".into(), Level::Ok),
                ("NRI socket".into(), Level::Warn),
                ("NRI plugin".into(), Level::Warn)
            ]
        );
        assert!(
            out[2]
                .detail
                .contains("GPU pods start without their GPUs (NRI fails open)")
        );
    }

    #[test]
    fn runtime_and_nri_both_set_up_warns_which_wins() {
        let mut f = facts(NriSetting::On);
        f.runtime_configured = true;
        let out = checks(&f, "nvidia");
        let both = out.last().unwrap();
        assert_eq!(both.level, Level::Warn);
        assert!(both.detail.contains("NRI wins"), "{both}");
    }

    #[test]
    fn a_plugin_link_to_another_program_warns() {
        let mut f = facts(NriSetting::On);
        f.setup = vec![Setup::PreRegistered {
            link: "/opt/nri/plugins/10-nvhook".into(),
            target: "/usr/bin/true".into(),
            is_nvhook: false,
        }];
        let out = checks(&f, "nvidia");
        assert_eq!(out[2].level, Level::Warn);
        assert!(out[2].detail.contains("/usr/bin/true"), "{}", out[2]);
    }

    #[test]
    fn plugin_commands_are_recognised() {
        let yes: [&[&[u8]]; 3] = [
            &[b"/usr/bin/nvhook", b"nri"],
            &[
                b"/usr/local/nvhook/bin/nvhook",
                b"--config",
                b"/x",
                b"nri",
                b"--socket",
                b"/s",
            ],
            &[b"/opt/nri/plugins/10-nvhook"],
        ];
        for args in yes {
            assert!(is_plugin_command(args), "{args:?}");
        }
        let no: [&[&[u8]]; 4] = [
            &[b"/usr/bin/nvhook", b"doctor"],
            &[b"/usr/bin/vim", b"nri"],
            &[b"/opt/nri/plugins/1-nvhook"],
            &[],
        ];
        for args in no {
            assert!(!is_plugin_command(args), "{args:?}");
        }
    }
}
