//! `nvhook configure`: register nvhook-runtime with a container engine by editing the
//! engine's own config file, and take it out again.
//!
//! Each engine module only turns the old text into the new text; reading, the atomic
//! write, the backup and the dry-run diff are shared in `file`. Edits are
//! format-preserving: a second run is a no-op, and `--remove` gives back the original bytes
//! (for daemon.json, when it was pretty-printed the way serde_json does; other layouts are
//! re-indented by the first change, and the backup keeps the original).
//!
//! `--kubernetes` also edits nvhook's own config (see `policy`), with the same care. Both
//! files are checked before either is written, so a bad one leaves both untouched.

pub mod containerd;
mod crio;
mod docker;
mod file;
mod policy;
mod template;
mod toml;

pub use policy::HARDENED as KUBERNETES_POLICY;

use crate::shown::ShownPath;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The container engines whose config nvhook knows how to edit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Docker,
    Containerd,
    Crio,
    /// k3s's embedded containerd, through its config template.
    K3s,
    /// RKE2's embedded containerd, through its config template.
    Rke2,
}

impl Engine {
    pub const ALL: [Engine; 5] = [
        Engine::Docker,
        Engine::Containerd,
        Engine::Crio,
        Engine::K3s,
        Engine::Rke2,
    ];

    /// The name `nvhook configure` takes.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Docker => "docker",
            Engine::Containerd => "containerd",
            Engine::Crio => "crio",
            Engine::K3s => "k3s",
            Engine::Rke2 => "rke2",
        }
    }

    /// The one file of an engine whose config is not a template; for k3s and RKE2, the
    /// directory of their templates.
    fn config_path(self) -> &'static str {
        match self {
            Engine::Docker => "/etc/docker/daemon.json",
            Engine::Containerd => "/etc/containerd/config.toml",
            // A drop-in of our own, so that the distribution's crio.conf is never rewritten.
            Engine::Crio => CRIO_NVIDIA_DROP_IN,
            Engine::K3s => RANCHER_K3S,
            Engine::Rke2 => RANCHER_RKE2,
        }
    }

    /// Whether `file` is where this engine's packages put its config, whose directory
    /// configure may make: the engine reads it there by default, so nothing is written to a
    /// place the engine never looks. For CRI-O, its main file and any drop-in of
    /// `crio.conf.d`; for k3s and RKE2, any template in their containerd directory.
    fn is_default_location(self, file: &Path) -> bool {
        let dir = file.parent();
        match self {
            Engine::Docker | Engine::Containerd => file == Path::new(self.config_path()),
            Engine::Crio => file == Path::new(CRIO_MAIN) || dir == Some(Path::new(CRIO_DROP_INS)),
            Engine::K3s | Engine::Rke2 => dir == Some(Path::new(self.config_path())),
        }
    }

    /// The config this engine reads when not told another, as a fix names it.
    fn default_described(self) -> String {
        match self {
            Engine::Docker | Engine::Containerd => self.config_path().to_string(),
            Engine::Crio => format!("{CRIO_MAIN} and the drop-ins in {CRIO_DROP_INS}"),
            Engine::K3s | Engine::Rke2 => format!("the template in {}", self.config_path()),
        }
    }

    /// The file configure edits when not told one: for k3s and RKE2, the template of the
    /// containerd they run now (see [`template`]).
    pub fn default_config(self) -> Result<PathBuf, ConfigureError> {
        match self {
            Engine::K3s | Engine::Rke2 => file::rancher_template(self, self.config_path()),
            _ => Ok(PathBuf::from(self.config_path())),
        }
    }

    /// The config files of this engine that exist under `root` (`/`: the host's), as
    /// configure would edit them: for k3s and RKE2, each template there.
    pub fn existing_configs(self, root: &Path) -> Vec<PathBuf> {
        let at = root.join(self.config_path().trim_start_matches('/'));
        match self {
            Engine::K3s | Engine::Rke2 => [template::V3_NAME, template::V2_NAME]
                .iter()
                .map(|name| at.join(name))
                .filter(|p| p.is_file())
                .collect(),
            _ => [at].into_iter().filter(|p| p.is_file()).collect(),
        }
    }

    pub fn restart_command(self) -> &'static str {
        match self {
            Engine::Docker => "systemctl restart docker",
            Engine::Containerd => "systemctl restart containerd",
            Engine::Crio => "systemctl restart crio",
            Engine::K3s => "systemctl restart k3s (k3s-agent on an agent node)",
            Engine::Rke2 => "systemctl restart rke2-server (rke2-agent on an agent node)",
        }
    }

    /// The program runtime `name` runs in the config text `current`, where it has one (for
    /// k3s and RKE2, where the template reads as containerd's TOML).
    fn runtime_program(self, current: &str, name: &str) -> Option<String> {
        match self {
            Engine::Docker => docker::runtime_program(current, name),
            Engine::Crio => crio::runtime_program(current, name),
            Engine::Containerd | Engine::K3s | Engine::Rke2 => {
                containerd::runtime_program(current, name)
            }
        }
    }

    /// The change to the engine's one config file (for containerd, its main file).
    fn apply(
        self,
        file: &Path,
        current: Option<&str>,
        change: &Change,
    ) -> Result<Option<String>, Invalid> {
        if current.is_none() && matches!(change, Change::Remove { .. } | Change::Nri { on: false })
        {
            return Ok(None);
        }
        if let Change::Nri { on } = *change {
            match self {
                Engine::Containerd => return containerd::apply_nri(current, on),
                Engine::Crio => {}
                _ => return Err(Invalid(format!("{} has no NRI", self.name()))),
            }
        }
        match self {
            Engine::Docker => docker::apply(current, change),
            Engine::Containerd => containerd::apply(current, change),
            Engine::Crio => crio::apply(current, change),
            Engine::K3s | Engine::Rke2 => template::apply(file, current, change),
        }
    }
}

/// What an engine's config says about NRI (the Node Resource Interface, through which
/// `nvhook nri` gives containers their GPUs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NriSetting {
    /// Not set, and on by default: containerd 2 (config versions 3 and 4), CRI-O 1.30 on.
    DefaultOn,
    /// Not set, and off by default: containerd 1.x (config versions 1 and 2; 1.7 has NRI).
    DefaultOff,
    On,
    Off,
}

impl NriSetting {
    pub fn enabled(self) -> bool {
        matches!(self, NriSetting::DefaultOn | NriSetting::On)
    }
}

/// What the config text `current` of `engine` says about NRI; `Err` for a file that cannot be
/// read as the engine's config, or an engine without NRI.
pub fn nri_setting(engine: Engine, current: &str) -> Result<NriSetting, String> {
    let setting = match engine {
        Engine::Containerd => containerd::nri_setting(Some(current)),
        Engine::Crio => crio::nri_setting(Some(current)),
        _ => Err(Invalid(format!("{} has no NRI", engine.name()))),
    };
    setting.map_err(|Invalid(message)| message)
}

/// CRI-O's main config, its drop-in directory, and nvhook's drop-in there.
const CRIO_MAIN: &str = "/etc/crio/crio.conf";
const CRIO_DROP_INS: &str = "/etc/crio/crio.conf.d";
const CRIO_NVIDIA_DROP_IN: &str = "/etc/crio/crio.conf.d/99-nvidia.conf";

/// Where k3s and RKE2 keep their containerd config and its templates.
pub const RANCHER_K3S: &str = "/var/lib/rancher/k3s/agent/etc/containerd";
pub const RANCHER_RKE2: &str = "/var/lib/rancher/rke2/agent/etc/containerd";

impl FromStr for Engine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(engine) = Engine::ALL.into_iter().find(|e| e.name() == s) {
            return Ok(engine);
        }
        match s {
            "cri-o" => Ok(Engine::Crio),
            "podman" => Err("Podman takes nvhook as an OCI hook, not as a runtime: \
                             install oci-nvhook-hook.json into its hooks.d directory"
                .into()),
            _ => Err(format!(
                "unknown engine {s:?}: use docker, containerd, crio, k3s or rke2"
            )),
        }
    }
}

/// What `nvhook configure` was asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    pub engine: Engine,
    /// The engine's config file; `None` means the engine's usual path.
    pub file: Option<PathBuf>,
    pub runtime_name: String,
    pub runtime_path: String,
    /// Write `runtime_path` even though nothing is there yet (an image build that installs it
    /// later).
    pub allow_missing: bool,
    pub set_as_default: bool,
    pub remove: bool,
    pub dry_run: bool,
    /// `--kubernetes`: the nvhook config in which to set the hardened device-selection
    /// policy ([`KUBERNETES_POLICY`]). `--remove` leaves that policy alone: loosening a
    /// node's security is for the admin to decide, and without the runtime it has no effect.
    pub kubernetes_policy: Option<PathBuf>,
    /// `--nri`: instead of a runtime, turn the engine's NRI on (or, with `remove`, give back
    /// what that changed), for `nvhook nri`.
    pub nri: bool,
    /// What the engine's program says its version is (`containerd --version`), where the
    /// front end found one to ask: `--nri` is refused for an engine without NRI.
    pub engine_version: Option<String>,
}

pub const DEFAULT_RUNTIME_NAME: &str = "nvidia";
/// The runtime's file name; the engines run the one beside nvhook
/// ([`crate::binary_paths::beside_nvhook`]).
pub const RUNTIME_BINARY: &str = "nvhook-runtime";

#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    #[error("cannot read {}: {source} (check the path, and run as root for files under /etc)", file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}; left untouched: fix it by hand, or name another file with --engine-config", file.display())]
    Invalid { file: PathBuf, message: String },
    #[error("cannot write {}: {source}; the original is unchanged (check permissions and free space)", file.display())]
    Write {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "--runtime-path {0:?} is not absolute: give the full path, engines must not look it up in PATH"
    )]
    RelativeRuntimePath(String),
    #[error(
        "{0} does not exist: name the installed nvhook-runtime with --runtime-path, or add --allow-missing if it will be there before the engine starts (an image build)"
    )]
    MissingRuntime(String),
    #[error(
        "{engine:?} has not written its containerd config in {} yet: start it once (it renders config.toml there), then run this again, or name the template with --engine-config", dir.display()
    )]
    NoRancherConfig { engine: Engine, dir: PathBuf },
    #[error(
        "{} imports {}, a directory that does not exist: create it (mkdir -p {}) and run this again, or take that entry out of imports",
        file.display(), dir.display(), dir.display()
    )]
    NoDropInDir { file: PathBuf, dir: PathBuf },
    /// `--engine-config` in a directory that does not exist, away from the engine's default:
    /// a typo there would configure a file the engine never reads.
    #[error(
        "--engine-config {}: no directory {}, so {} reads no config there; nothing written: name the file {} reads (by default {}), or mkdir -p {} first if {} is set up to read its config there",
        ShownPath(file), ShownPath(dir), engine.name(), engine.name(), engine.default_described(),
        ShownPath(dir), engine.name()
    )]
    NoConfigDir {
        engine: Engine,
        file: PathBuf,
        dir: PathBuf,
    },
    #[error("--runtime-name {0:?}: use only letters, digits, '.', '_' and '-'")]
    BadRuntimeName(String),
    #[error("{}: {message}; left untouched, and so is the engine's config: fix it, or name another file with --config", file.display())]
    InvalidPolicy { file: PathBuf, message: String },
    #[error(
        "--nri with {0}: NRI is for containerd and CRI-O; for {0} use nvhook configure {0} (a runtime)"
    )]
    NoNri(&'static str),
    #[error(
        "{version} has no NRI (containerd has it from 1.7): nvhook's NRI plugin would give GPU pods nothing; upgrade containerd to 1.7 or later, or give GPUs through the runtime: nvhook configure containerd"
    )]
    EngineWithoutNri { version: String },
    #[error(
        "cannot tell whether this containerd has NRI (1.7 or later): no containerd on PATH to ask (containerd --version), and {} has no NRI table; run this on the node, where containerd is", file.display()
    )]
    NriUnknown { file: PathBuf },
    #[error(
        "--remove with --kubernetes: --remove takes out the runtime and leaves the hardened policy in nvhook's config; to loosen it, set accept-env-when-unprivileged = true there"
    )]
    RemoveKubernetes,
}

impl ConfigureError {
    /// A mistake in configure's flags rather than in a file or the host.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ConfigureError::RelativeRuntimePath(_)
                | ConfigureError::BadRuntimeName(_)
                | ConfigureError::RemoveKubernetes
                | ConfigureError::NoNri(_)
                | ConfigureError::NoConfigDir { .. }
        )
    }
}

/// Refuses `--nri` for a containerd without NRI: the version its program gives, or, with no
/// program to ask, whether its config has an NRI table (1.6's has none).
fn check_containerd_nri(
    version: Option<&str>,
    config: &str,
    file: &Path,
) -> Result<(), ConfigureError> {
    match version.map(|text| (text, containerd::has_nri(text))) {
        Some((_, Some(true))) => Ok(()),
        Some((text, Some(false))) => Err(ConfigureError::EngineWithoutNri {
            version: containerd::version_words(text),
        }),
        _ if containerd::names_nri(config) => Ok(()),
        _ => Err(ConfigureError::NriUnknown {
            file: file.to_path_buf(),
        }),
    }
}

/// Why an engine refused the current text; `run` adds the file name.
#[derive(Debug)]
struct Invalid(String);

/// The edit an engine applies, independent of the file format.
#[derive(Debug)]
enum Change<'a> {
    Add {
        name: &'a str,
        path: &'a str,
        set_as_default: bool,
    },
    Remove {
        name: &'a str,
    },
    /// `--nri`: NRI on (`on`), or what turning it on changed given back.
    Nri {
        on: bool,
    },
}

/// The changes the engines' unit tests make.
#[cfg(test)]
mod test_changes {
    use super::Change;

    pub const ADD: Change = Change::Add {
        name: "nvidia",
        path: "/usr/bin/nvhook-runtime",
        set_as_default: false,
    };
    pub const REMOVE: Change = Change::Remove { name: "nvidia" };
}

/// What happened to the file.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    Unchanged,
    /// `--dry-run`: the unified diff of what would change; nothing was written.
    WouldChange {
        diff: String,
    },
    Written {
        backup: Option<PathBuf>,
    },
    /// `--remove` left nothing in a file the engine does not need: it was moved to the backup.
    Retired {
        backup: PathBuf,
    },
}

#[derive(Debug)]
pub struct Outcome {
    pub engine: Engine,
    /// The engine's files nvhook looked at, each with what happened to it.
    pub files: Vec<FileOutcome>,
    pub runtime_name: String,
    pub remove: bool,
    /// The other program the runtime ran before this change replaced it (NVIDIA's
    /// nvidia-container-runtime, an older nvhook elsewhere).
    pub replaced: Option<String>,
    /// `--kubernetes`: what happened to nvhook's config.
    pub policy: Option<PolicyOutcome>,
    /// `--nri`: what the engine's config said about NRI before.
    pub nri: Option<NriSetting>,
}

#[derive(Debug)]
pub struct FileOutcome {
    pub file: PathBuf,
    pub applied: Applied,
}

impl Outcome {
    /// Whether an engine file was written: the engine must be restarted to read it.
    pub fn changed(&self) -> bool {
        self.files
            .iter()
            .any(|f| matches!(f.applied, Applied::Written { .. } | Applied::Retired { .. }))
    }
}

#[derive(Debug)]
pub struct PolicyOutcome {
    pub file: PathBuf,
    pub applied: Applied,
}

/// Reads the engine's config (and, for containerd 2, the drop-in it imports), applies the
/// change, and writes what changed unless this is a dry run. Every file is checked before any
/// is written.
pub fn run(options: &Options) -> Result<Outcome, ConfigureError> {
    validate(options)?;
    let file = match &options.file {
        Some(file) => {
            check_config_dir(options.engine, file)?;
            file.clone()
        }
        None => options.engine.default_config()?,
    };
    let change = if options.nri {
        Change::Nri {
            on: !options.remove,
        }
    } else if options.remove {
        Change::Remove {
            name: &options.runtime_name,
        }
    } else {
        Change::Add {
            name: &options.runtime_name,
            path: &options.runtime_path,
            set_as_default: options.set_as_default,
        }
    };
    let engine_edits = engine_edits(options.engine, &file, &change)?;
    let replaced = match change {
        Change::Add { name, path, .. } => engine_edits
            .iter()
            .filter_map(|(_, edit)| edit.current.as_deref())
            .find_map(|text| options.engine.runtime_program(text, name))
            .filter(|program| program != path),
        Change::Remove { .. } | Change::Nri { .. } => None,
    };
    let nri = match options.nri {
        true => {
            let (_, edit) = &engine_edits[0];
            let current = edit.current.as_deref().unwrap_or("");
            if options.engine == Engine::Containerd && !options.remove {
                check_containerd_nri(options.engine_version.as_deref(), current, &file)?;
            }
            Some(nri_setting(options.engine, current).map_err(|message| {
                ConfigureError::Invalid {
                    file: file.clone(),
                    message,
                }
            })?)
        }
        false => None,
    };
    let policy_edit = match &options.kubernetes_policy {
        Some(policy_file) => {
            let current = file::read(policy_file)?;
            let new =
                policy::harden(current.as_deref(), policy_file).map_err(|Invalid(message)| {
                    ConfigureError::InvalidPolicy {
                        file: policy_file.clone(),
                        message,
                    }
                })?;
            Some((
                policy_file,
                Edit {
                    current,
                    new: Some(new),
                },
            ))
        }
        None => None,
    };
    // The policy first: a GPU runtime must never be live without the policy it was asked for.
    let policy = match policy_edit {
        Some((file, edit)) => Some(PolicyOutcome {
            file: file.clone(),
            applied: edit.commit(file, options.dry_run)?,
        }),
        None => None,
    };
    let files = engine_edits
        .into_iter()
        .map(|(file, edit)| {
            let applied = edit.commit(&file, options.dry_run)?;
            Ok(FileOutcome { file, applied })
        })
        .collect::<Result<_, ConfigureError>>()?;
    Ok(Outcome {
        engine: options.engine,
        files,
        runtime_name: options.runtime_name.clone(),
        remove: options.remove,
        replaced,
        policy,
        nri,
    })
}

/// The engine's files and their edits: one file, or for a containerd 2 config that imports
/// a drop-in directory, nvhook's drop-in first and then the main file (which `--remove`
/// cleans of a runtime an earlier nvhook wrote there).
fn engine_edits(
    engine: Engine,
    file: &Path,
    change: &Change,
) -> Result<Vec<(PathBuf, Edit)>, ConfigureError> {
    let invalid = |file: &Path| {
        let file = file.to_path_buf();
        move |Invalid(message)| ConfigureError::Invalid { file, message }
    };
    let current = file::read(file)?;
    let drop_in = match (engine, change) {
        // NRI's switch stays where it is read first: the main file.
        (_, Change::Nri { .. }) => None,
        (Engine::Containerd, _) => {
            containerd::drop_in(current.as_deref(), file).map_err(invalid(file))?
        }
        _ => None,
    };
    let Some(drop_in) = drop_in else {
        let new = engine
            .apply(file, current.as_deref(), change)
            .map_err(invalid(file))?;
        return Ok(vec![(file.to_path_buf(), Edit { current, new })]);
    };
    // containerd's own default drop-in directory (conf.d beside its config) is made where
    // missing; any other `imports` entry names a place only the admin can vouch for.
    let dir = drop_in.parent().unwrap_or(Path::new("/"));
    let default_dir = file.parent().unwrap_or(Path::new("/")).join("conf.d");
    if dir != default_dir && !dir.is_dir() {
        return Err(ConfigureError::NoDropInDir {
            file: file.to_path_buf(),
            dir: dir.to_path_buf(),
        });
    }
    let drop_in_current = file::read(&drop_in)?;
    let drop_in_new =
        containerd::apply_drop_in(current.as_deref(), drop_in_current.as_deref(), change)
            .map_err(invalid(&drop_in))?;
    let main_new = match change {
        Change::Remove { .. } => engine
            .apply(file, current.as_deref(), change)
            .map_err(invalid(file))?,
        Change::Add { .. } | Change::Nri { .. } => current.clone(),
    };
    Ok(vec![
        (
            drop_in,
            Edit {
                current: drop_in_current,
                new: drop_in_new,
            },
        ),
        (
            file.to_path_buf(),
            Edit {
                current,
                new: main_new,
            },
        ),
    ])
}

/// A file's text before and after, both known before anything is written.
struct Edit {
    current: Option<String>,
    /// `None`: the file is no longer needed.
    new: Option<String>,
}

impl Edit {
    fn commit(self, file: &Path, dry_run: bool) -> Result<Applied, ConfigureError> {
        let Edit { current, new } = self;
        Ok(if new == current {
            Applied::Unchanged
        } else if dry_run {
            Applied::WouldChange {
                diff: file::unified_diff(file, current.as_deref(), new.as_deref()),
            }
        } else {
            match new {
                Some(text) => Applied::Written {
                    backup: file::replace(file, &text, current.is_some())?,
                },
                None => Applied::Retired {
                    backup: file::retire(file)?,
                },
            }
        })
    }
}

/// An engine config named away from the engine's default must be in a directory that
/// exists: configure makes no directory there, and says so before reading or writing anything.
fn check_config_dir(engine: Engine, file: &Path) -> Result<(), ConfigureError> {
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty());
    match dir {
        Some(dir) if !engine.is_default_location(file) && !dir.is_dir() => {
            Err(ConfigureError::NoConfigDir {
                engine,
                file: file.to_path_buf(),
                dir: dir.to_path_buf(),
            })
        }
        _ => Ok(()),
    }
}

fn validate(options: &Options) -> Result<(), ConfigureError> {
    let name = &options.runtime_name;
    let name_ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !name_ok {
        return Err(ConfigureError::BadRuntimeName(name.clone()));
    }
    if options.remove && options.kubernetes_policy.is_some() {
        return Err(ConfigureError::RemoveKubernetes);
    }
    if options.nri {
        return match options.engine {
            Engine::Containerd | Engine::Crio => Ok(()),
            other => Err(ConfigureError::NoNri(other.name())),
        };
    }
    if !options.remove && !options.runtime_path.starts_with('/') {
        return Err(ConfigureError::RelativeRuntimePath(
            options.runtime_path.clone(),
        ));
    }
    // An engine told to run a file that is not there fails every container it starts with it.
    if !options.remove && !options.allow_missing && !Path::new(&options.runtime_path).exists() {
        return Err(ConfigureError::MissingRuntime(options.runtime_path.clone()));
    }
    Ok(())
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(policy) = &self.policy {
            writeln!(f, "{policy}")?;
        }
        if let Some(setting) = self.nri {
            return self.fmt_nri(f, setting);
        }
        let name = &self.runtime_name;
        // A file that only had to stay as it was is not worth a line beside one that changed.
        let changing: Vec<&FileOutcome> = self
            .files
            .iter()
            .filter(|f| f.applied != Applied::Unchanged)
            .collect();
        let shown = match changing.is_empty() {
            true => self.files.iter().collect(),
            false => changing,
        };
        for (at, outcome) in shown.iter().enumerate() {
            if at > 0 {
                writeln!(f)?;
            }
            let file = outcome.file.display();
            let done = if self.remove {
                format!("removed runtime {name:?} from {file}")
            } else {
                format!("configured runtime {name:?} in {file}")
            };
            match &outcome.applied {
                Applied::Unchanged if self.remove => write!(f, "not configured: {file} unchanged"),
                Applied::Unchanged => write!(f, "already configured: {file} unchanged"),
                Applied::WouldChange { diff } => write!(f, "{diff}dry run: {file} not written"),
                // Another program's runtime of that name is gone: say whose.
                Applied::Written { backup } if let Some(was) = &self.replaced => {
                    write!(f, "replaced runtime {name:?} in {file} (was {was}")?;
                    if let Some(backup) = backup {
                        write!(f, "; backup: {}", backup.display())?;
                    }
                    write!(f, ")")
                }
                Applied::Written { backup } => {
                    write!(f, "{done}")?;
                    if let Some(backup) = backup {
                        write!(f, " (previous version: {})", backup.display())?;
                    }
                    Ok(())
                }
                Applied::Retired { backup } => write!(
                    f,
                    "{done}; nothing else was left in it, so it was moved to {}",
                    backup.display()
                ),
            }?;
        }
        if self.changed() {
            write!(f, "\nto apply it: {}", self.engine.restart_command())?;
        }
        Ok(())
    }
}

/// How nvhook's plugin is started where the engine's NRI is on.
const NRI_PLUGIN_START: &str = "systemctl enable --now nvhook-nri.service (on Kubernetes: deploy/kubernetes/nvhook-installer-nri.yaml)";

impl Outcome {
    /// `--nri`'s lines: what happened to the switch, what to restart, how the plugin starts.
    fn fmt_nri(&self, f: &mut fmt::Formatter<'_>, before: NriSetting) -> fmt::Result {
        let on = !self.remove;
        let engine = self.engine.name();
        for outcome in &self.files {
            let file = outcome.file.display();
            match (&outcome.applied, before) {
                (Applied::Unchanged, NriSetting::DefaultOn) if engine == "containerd" => write!(
                    f,
                    "NRI is on: containerd 2 runs it by default and {file} does not turn it off; {file} unchanged"
                ),
                (Applied::Unchanged, NriSetting::DefaultOn) => write!(
                    f,
                    "NRI is on by default (CRI-O 1.30 and later); {file} unchanged"
                ),
                (Applied::Unchanged, _) if on => {
                    write!(f, "NRI already enabled: {file} unchanged")
                }
                (Applied::Unchanged, _) => write!(
                    f,
                    "nvhook did not enable NRI in {file}: unchanged (NRI stays as the file says)"
                ),
                (Applied::WouldChange { diff }, _) => {
                    write!(f, "{diff}dry run: {file} not written")
                }
                (Applied::Written { backup }, _) => {
                    match on {
                        true => write!(f, "enabled NRI in {file}")?,
                        false => write!(f, "gave back the NRI setting nvhook changed in {file}")?,
                    }
                    if let Some(backup) = backup {
                        write!(f, " (previous version: {})", backup.display())?;
                    }
                    Ok(())
                }
                (Applied::Retired { backup }, _) => write!(
                    f,
                    "took NRI out of {file}; nothing else was left in it, so it was moved to {}",
                    backup.display()
                ),
            }?;
        }
        let dry_run = self
            .files
            .iter()
            .any(|o| matches!(o.applied, Applied::WouldChange { .. }));
        if self.changed() {
            // containerd 1.7 reads the switch at start only; plugins then come and go freely.
            write!(f, "\nto apply it: {} (once)", self.engine.restart_command())?;
        }
        match on {
            true if !dry_run => write!(f, "\nthen start nvhook's NRI plugin: {NRI_PLUGIN_START}"),
            false if !dry_run => write!(
                f,
                "\nstop nvhook's NRI plugin too (GPU pods start without GPUs while the engine runs NRI without it): systemctl disable --now nvhook-nri.service"
            ),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for PolicyOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self.file.display();
        match &self.applied {
            Applied::Unchanged => write!(f, "Kubernetes policy already set: {file} unchanged"),
            Applied::WouldChange { diff } => write!(f, "{diff}dry run: {file} not written"),
            Applied::Written { backup } => {
                let keys: Vec<String> = KUBERNETES_POLICY
                    .iter()
                    .map(|(key, value)| format!("{key} = {value}"))
                    .collect();
                write!(
                    f,
                    "set the Kubernetes policy in {file}: {}",
                    keys.join(", ")
                )?;
                if let Some(backup) = backup {
                    write!(f, " (previous version: {})", backup.display())?;
                }
                write!(f, "; containers created from now on follow it")
            }
            // `policy::harden` always leaves text; shown for completeness.
            Applied::Retired { backup } => write!(f, "moved {file} to {}", backup.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_engines_default_location_may_lack_its_directory() {
        for (engine, file) in [
            (Engine::Docker, "/etc/docker/daemon.json"),
            (Engine::Containerd, "/etc/containerd/config.toml"),
            (Engine::Crio, "/etc/crio/crio.conf"),
            (Engine::Crio, "/etc/crio/crio.conf.d/99-nvidia.conf"),
            (Engine::Crio, "/etc/crio/crio.conf.d/50-gpu.conf"),
            (
                Engine::K3s,
                "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl",
            ),
            (
                Engine::Rke2,
                "/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.tmpl",
            ),
        ] {
            assert!(engine.is_default_location(Path::new(file)), "{file}");
            assert!(check_config_dir(engine, Path::new(file)).is_ok(), "{file}");
        }
        for (engine, file) in [
            (Engine::Docker, "/etc/containerd/config.toml"),
            (Engine::Docker, "/etc/docker/daemon.json.d/x.json"),
            (Engine::Containerd, "/etc/containerd/conf.d/99-nvhook.toml"),
            (Engine::Crio, "/etc/crio/daemon.json"),
            (
                Engine::K3s,
                "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl",
            ),
        ] {
            assert!(!engine.is_default_location(Path::new(file)), "{file}");
        }
        let dir = tempfile::tempdir().unwrap();
        let there = dir.path().join("daemon.json");
        assert!(check_config_dir(Engine::Docker, &there).is_ok());
        assert!(check_config_dir(Engine::Docker, Path::new("daemon.json")).is_ok());
        let typo = dir.path().join("dokcer/daemon.json");
        let e = check_config_dir(Engine::Docker, &typo).unwrap_err();
        assert!(e.is_usage());
        let d = dir.path().join("dokcer");
        assert_eq!(
            e.to_string(),
            format!(
                "--engine-config {}: no directory {}, so docker reads no config there; nothing written: name the file docker reads (by default /etc/docker/daemon.json), or mkdir -p {} first if docker is set up to read its config there",
                typo.display(),
                d.display(),
                d.display()
            )
        );
    }
}
