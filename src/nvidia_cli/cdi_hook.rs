//! `nvidia-cdi-hook`'s command line, as the createContainer hooks of NVIDIA's CDI specs
//! (toolkit 1.17 to 1.20) write it: one hook per entry, `nvidia-cdi-hook HOOK --flag VALUE...`,
//! the OCI state on stdin. Each hook is read into the work of nvhook's own createContainer hook
//! ([`LinkArgs`]); nothing here runs a program (no ldconfig, no chmod). NVIDIA's flags parse the
//! Go way (urfave/cli): `--flag VALUE`, `--flag=VALUE`, and the same with one dash; arguments
//! that are not flags are ignored.
//!
//! As NVIDIA's does since 1.18, a hook nvhook does not know (a spec from a newer toolkit), or
//! none, is a warning and success: such a spec never stops a start. An unknown flag of a hook
//! it knows is an error, as NVIDIA's is.

use crate::delivery::hook_args::CompatHook;
use crate::delivery::hook_args::{LibFolder, LinkArgs};
use crate::plan::{Symlink, ld_so_conf_listing};
use crate::shown::Shown;

/// NVIDIA's CDI hook program, named in the hooks of its CDI specs; Docker 29 maps `--gpus` onto
/// CDI when it is on dockerd's PATH.
pub const CDI_HOOK_NAME: &str = "nvidia-cdi-hook";

/// The hooks nvhook answers, each with the flags that take a value, and what it does.
const HOOKS: [(&str, &[&str], &str); 9] = [
    (
        "update-ldcache",
        &["folder", "ldconfig-path"],
        "each library in the folders gets its SONAME link and a loader-cache entry, ahead of them those of the directories an enable-cuda-compat hook listed (nvhook writes the cache; no ldconfig runs)",
    ),
    (
        "create-symlinks",
        &["link"],
        "makes each --link TARGET::LINK in the container",
    ),
    (
        "chmod",
        &["path", "mode"],
        "nothing: nvhook changes no mode (NVIDIA turned this hook off by default: it was for old crun)",
    ),
    (
        "enable-cuda-compat",
        &[
            "host-driver-version",
            "host-cuda-version",
            "cuda-compat-container-root",
        ],
        "lists the image's CUDA compat directory in /etc/ld.so.conf.d/00-compat-nvhook.conf when NVIDIA's rule says it serves this host",
    ),
    (
        "disable-device-node-modification",
        &[],
        "binds a params with ModifyDeviceFiles: 0 over the container's /proc/driver/nvidia/params",
    ),
    (
        "update-application-profile",
        &[],
        "writes /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf limiting EGL and Vulkan to the container's GPUs",
    ),
    (
        "create-soname-symlinks",
        &["folder", "ldconfig-path"],
        "each library in the folders gets its SONAME link",
    ),
    (
        "apply-cuda-memory-limits",
        &["driver-root", "gpu-id"],
        "sets the container's NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT (MiB) on each --gpu-id for its cgroup, through NVML (nvhook-nvml), as gpu-memory-limits in nvhook's config says",
    ),
    ("noop", &[], "nothing"),
];

/// What one `nvidia-cdi-hook` command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CdiHook {
    /// Work for nvhook's createContainer hook.
    Links(Box<LinkArgs>),
    /// A hook that nvhook accepts and has nothing to do for; why, for the log.
    Nothing(&'static str),
    /// `apply-cuda-memory-limits`, a createRuntime hook: the container's GPU memory limits on
    /// these GPUs (UUIDs).
    MemoryLimits(Vec<String>),
    /// No hook, or one nvhook does not know: NVIDIA's warning, and success.
    Unsupported(String),
    /// `--version` (`-v`, `-version`).
    Version,
    /// `--help`, `-h`, `help`: the program's, or one hook's.
    Help(Option<&'static str>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiHookError {
    #[error("{hook}: flag provided but not defined: {option}")]
    UnknownOption { hook: &'static str, option: Shown },
    #[error("{hook}: {option} needs a value")]
    NoValue { hook: &'static str, option: Shown },
    #[error("{hook}: {option} {value}: {why}")]
    BadValue {
        hook: &'static str,
        option: Shown,
        value: Shown,
        why: &'static str,
    },
}

/// Global flags: NVIDIA's logging switches (nvhook logs where its config says), help and
/// version.
fn global(flag: &str) -> Option<CdiHook> {
    let name = flag.strip_prefix("--").or_else(|| flag.strip_prefix('-'))?;
    let name = name.split_once('=').map_or(name, |(n, _)| n);
    match name {
        "debug" | "d" | "quiet" => Some(CdiHook::Nothing("")),
        "help" | "h" => Some(CdiHook::Help(None)),
        "version" | "v" => Some(CdiHook::Version),
        _ => None,
    }
}

/// Reads the arguments after the program name.
pub fn parse(args: &[String]) -> Result<CdiHook, CdiHookError> {
    let mut args = args.iter().map(String::as_str);
    let hook = loop {
        let Some(arg) = args.next() else {
            return Ok(CdiHook::Unsupported("No CDI hook specified".into()));
        };
        if !arg.starts_with('-') {
            break arg;
        }
        match global(arg) {
            Some(CdiHook::Nothing(_)) => {}
            Some(answer) => return Ok(answer),
            // As NVIDIA's: an unknown global flag leaves it with no hook, whatever follows.
            None => return Ok(CdiHook::Unsupported("No CDI hook specified".into())),
        }
    };
    if hook == "help" || hook == "h" {
        let named = args.next().and_then(known);
        return Ok(CdiHook::Help(named.map(|(name, ..)| name)));
    }
    let Some((hook, options, _)) = known(hook) else {
        // As NVIDIA's: an unknown hook never fails a start.
        return Ok(CdiHook::Unsupported(format!(
            "Unsupported CDI hook: {}",
            Shown(hook)
        )));
    };
    let rest: Vec<&str> = args.collect();
    let Some(flags) = flags(hook, options, &rest)? else {
        return Ok(CdiHook::Help(Some(hook)));
    };
    let values = |name: &'static str| {
        flags
            .iter()
            .filter(move |(n, _)| *n == name)
            .map(|(_, v)| *v)
    };
    let bad = |option: &str, value: &str, why| CdiHookError::BadValue {
        hook,
        option: format!("--{option}").into(),
        value: value.into(),
        why,
    };
    let absolute = |option: &str, value: &str| {
        if value.starts_with('/') && !value.split('/').any(|c| c == "..") {
            Ok(value.to_string())
        } else {
            Err(bad(option, value, "not an absolute path in the container"))
        }
    };
    let mut links = LinkArgs::default();
    match hook {
        "create-symlinks" => {
            for link in values("link") {
                // NVIDIA splits at the first `::`: `a::b::/c` makes `b::/c`, which nvhook,
                // stricter, refuses as a link path that is not absolute.
                let (target, path) = link
                    .split_once("::")
                    .filter(|(target, _)| !target.is_empty())
                    .ok_or_else(|| bad("link", link, "not TARGET::LINK"))?;
                links.symlinks.push(Symlink {
                    path: absolute("link", path).map_err(|_| {
                        bad(
                            "link",
                            link,
                            "its LINK part is not an absolute path in the container",
                        )
                    })?,
                    target: target.to_string(),
                });
            }
        }
        "update-ldcache" | "create-soname-symlinks" => {
            for dir in values("folder") {
                links.folders.push(LibFolder {
                    dir: absolute("folder", dir)?,
                    cache: hook == "update-ldcache",
                });
            }
            // As NVIDIA's hook does, and nvhook's own specs: the folders stay in the cache of
            // an ldconfig the image runs later.
            if hook == "update-ldcache" {
                links.ld_so_confs.extend(ld_so_conf_listing(
                    links.folders.iter().map(|f| f.dir.as_str()),
                ));
                links.makes_cache = true;
            }
            if let Some(ldconfig) = values("ldconfig-path").next_back() {
                tracing::debug!(
                    ldconfig,
                    "--ldconfig-path ignored: nvhook writes the loader cache itself"
                );
            }
        }
        "enable-cuda-compat" => {
            let last = |name| values(name).next_back().filter(|v| !v.is_empty());
            let (host_driver, host_cuda) = (last("host-driver-version"), last("host-cuda-version"));
            if host_driver.is_none() && host_cuda.is_none() {
                return Ok(CdiHook::Nothing(
                    "enable-cuda-compat: no host driver or CUDA version given: nothing to do",
                ));
            }
            let dir = match last("cuda-compat-container-root") {
                // NVIDIA joins it to the container's root, so a relative one is from there.
                Some(dir) => absolute(
                    "cuda-compat-container-root",
                    &format!("/{}", dir.trim_start_matches('/')),
                )?,
                None => crate::plan::compat::NVIDIA_COMPAT_DIR.to_string(),
            };
            links.compat_hook = Some(CompatHook {
                host_driver: host_driver.map(str::to_string),
                host_cuda: host_cuda.map(str::to_string),
                dir,
            });
        }
        "apply-cuda-memory-limits" => {
            if let Some(root) = values("driver-root").next_back() {
                tracing::debug!(
                    root,
                    "--driver-root ignored: nvhook's config names the driver root"
                );
            }
            let mut gpus = Vec::new();
            for value in values("gpu-id") {
                // A repeated flag, each value also a comma list, as urfave's string slices.
                for id in value.split(',').map(str::trim) {
                    if id.is_empty() {
                        return Err(bad("gpu-id", value, "an empty GPU id"));
                    }
                    gpus.push(id.to_string());
                }
            }
            return Ok(CdiHook::MemoryLimits(gpus));
        }
        "disable-device-node-modification" => links.params_view = true,
        "update-application-profile" => links.application_profile = true,
        "chmod" => {
            return Ok(CdiHook::Nothing(
                "chmod: nvhook changes no mode in the container (NVIDIA turned this hook off by default: it was for old crun)",
            ));
        }
        _ => return Ok(CdiHook::Nothing("noop")),
    }
    Ok(CdiHook::Links(Box::new(links)))
}

/// The hook named `name`: its name, the flags that take a value, what it does.
fn known(name: &str) -> Option<(&'static str, &'static [&'static str], &'static str)> {
    HOOKS.iter().copied().find(|(hook, ..)| *hook == name)
}

/// `nvidia-cdi-hook --help`, or one hook's.
pub fn help(hook: Option<&str>) -> String {
    match hook.and_then(known) {
        Some((name, options, what)) => {
            let mut text = format!(
                "NAME:\n   {CDI_HOOK_NAME} {name} - {what}\n\nUSAGE:\n   {CDI_HOOK_NAME} {name} [options]\n\nOPTIONS:\n"
            );
            for option in options.iter().copied().chain(["container-spec"]) {
                text.push_str(&format!("   --{option} value\n"));
            }
            text.push_str("   --help, -h  show help\n");
            text
        }
        None => {
            let mut text = format!(
                "NAME:\n   {CDI_HOOK_NAME} - nvhook answering as NVIDIA's CDI hook program: the createContainer hooks of CDI specs NVIDIA's tools write\n\nUSAGE:\n   {CDI_HOOK_NAME} [global options] HOOK [options]\n\nHOOKS:\n"
            );
            for (name, _, what) in HOOKS {
                text.push_str(&format!("   {name}\n      {what}\n"));
            }
            text.push_str("\nGLOBAL OPTIONS:\n   --debug, -d  (nvhook logs where its config says)\n   --quiet\n   --help, -h     show help\n   --version, -v  print the version\n\nAny other hook is a warning and success, as with NVIDIA's.\n");
            text
        }
    }
}

/// The `(name, value)` pairs of `args`, every one of `options` taking a value (arguments that
/// are not flags are skipped, as urfave/cli leaves them to the hook, which ignores them);
/// plus `--container-spec`, which may only say stdin (`-` or empty): the state is read there.
/// None when `--help` is among them.
fn flags<'a>(
    hook: &'static str,
    options: &[&str],
    args: &[&'a str],
) -> Result<Option<Vec<(&'a str, &'a str)>>, CdiHookError> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let Some(name) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            tracing::debug!(
                hook,
                argument = *arg,
                "argument ignored, as NVIDIA's hook does"
            );
            continue;
        };
        let (name, inline) = match name.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (name, None),
        };
        if name == "help" || name == "h" {
            return Ok(None);
        }
        // The global logging switches are accepted after a hook too (urfave's persistent
        // flags).
        if matches!(global(arg), Some(CdiHook::Nothing(_))) {
            continue;
        }
        if !options.contains(&name) && name != "container-spec" {
            // Go's flag package names it with one dash.
            return Err(CdiHookError::UnknownOption {
                hook,
                option: format!("-{name}").into(),
            });
        }
        let value = match inline {
            Some(value) => value,
            None => it.next().ok_or_else(|| CdiHookError::NoValue {
                hook,
                option: format!("--{name}").into(),
            })?,
        };
        if name == "container-spec" {
            if !value.is_empty() && value != "-" {
                return Err(CdiHookError::BadValue {
                    hook,
                    option: "--container-spec".into(),
                    value: value.into(),
                    why: "nvhook reads the OCI state on stdin only",
                });
            }
            continue;
        }
        out.push((name, value));
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(words: &str) -> Result<CdiHook, CdiHookError> {
        let args: Vec<String> = words.split_whitespace().map(str::to_string).collect();
        parse(&args)
    }

    fn links(words: &str) -> LinkArgs {
        match parse_words(words) {
            Ok(CdiHook::Links(links)) => *links,
            other => panic!("{words}: {other:?}"),
        }
    }

    #[test]
    fn create_symlinks_takes_target_then_link() {
        let got = links(
            "create-symlinks --link libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so \
             --link=../nvidia/gsp.bin::/lib/firmware/gsp.bin -link /a::/b",
        );
        let want = [
            ("/usr/lib/x86_64-linux-gnu/libcuda.so", "libcuda.so.1"),
            ("/lib/firmware/gsp.bin", "../nvidia/gsp.bin"),
            ("/b", "/a"),
        ];
        let got: Vec<(&str, &str)> = got
            .symlinks
            .iter()
            .map(|l| (l.path.as_str(), l.target.as_str()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn update_ldcache_folders_and_ignored_ldconfig() {
        let got = links(
            "update-ldcache --ldconfig-path /sbin/ldconfig.real --folder /usr/lib/x86_64-linux-gnu --folder=/usr/lib/i386-linux-gnu",
        );
        assert_eq!(
            got.folders,
            vec![
                LibFolder {
                    dir: "/usr/lib/x86_64-linux-gnu".into(),
                    cache: true
                },
                LibFolder {
                    dir: "/usr/lib/i386-linux-gnu".into(),
                    cache: true
                },
            ]
        );
        // The folders an ldconfig in the image must keep; /usr/lib64 it searches anyway.
        let confs = links("update-ldcache --folder /usr/lib64 --folder /opt/nv").ld_so_confs;
        assert_eq!(confs.len(), 1);
        assert_eq!(confs[0].dirs, ["/opt/nv"]);
        let got = links("create-soname-symlinks --folder /usr/lib64");
        assert!(got.ld_so_confs.is_empty());
        assert_eq!(
            got.folders,
            vec![LibFolder {
                dir: "/usr/lib64".into(),
                cache: false
            }]
        );
    }

    #[test]
    fn the_other_hooks() {
        let compat = |words: &str| links(words).compat_hook.expect(words);
        let got = compat("--debug enable-cuda-compat --host-driver-version=580.95.05");
        assert_eq!(got.host_driver.as_deref(), Some("580.95.05"));
        assert_eq!(got.dir, "/usr/local/cuda/compat");
        let got = compat(
            "enable-cuda-compat --host-driver-version 550.54.15 --host-cuda-version 12.4 --cuda-compat-container-root opt/compat",
        );
        assert_eq!(
            (
                got.host_driver.as_deref(),
                got.host_cuda.as_deref(),
                got.dir.as_str()
            ),
            (Some("550.54.15"), Some("12.4"), "/opt/compat")
        );
        // NVIDIA's hook decides later whether a version parses; with none it does nothing.
        assert_eq!(
            compat("enable-cuda-compat --host-driver-version latest")
                .host_driver
                .as_deref(),
            Some("latest")
        );
        for nothing in [
            "enable-cuda-compat",
            "enable-cuda-compat --host-driver-version=",
            "chmod --mode 755 --path /dev/dri",
            "noop",
            "noop stray arguments",
        ] {
            assert!(
                matches!(parse_words(nothing), Ok(CdiHook::Nothing(_))),
                "{nothing}"
            );
        }
        assert!(links("disable-device-node-modification --container-spec -").params_view);
        assert!(links("update-application-profile").application_profile);
        assert!(links("update-ldcache --folder /usr/lib64").makes_cache);
        assert!(!links("create-soname-symlinks --folder /usr/lib64").makes_cache);
    }

    /// A spec from a newer toolkit never stops a start: no hook, an unknown one, or an unknown
    /// global flag without a known hook is NVIDIA's warning and success.
    #[test]
    fn unknown_hooks_are_a_warning() {
        for (words, said) in [
            ("", "No CDI hook specified"),
            ("--debug", "No CDI hook specified"),
            (
                "apply-cuda-memory-limit",
                "Unsupported CDI hook: apply-cuda-memory-limit",
            ),
            ("--verbose", "No CDI hook specified"),
            ("--verbose create-symlinks", "No CDI hook specified"),
            ("frobnicate --verbose", "Unsupported CDI hook: frobnicate"),
            (
                "--debug=false frobnicate",
                "Unsupported CDI hook: frobnicate",
            ),
        ] {
            assert_eq!(
                parse_words(words),
                Ok(CdiHook::Unsupported(said.into())),
                "{words}"
            );
        }
    }

    /// NVIDIA's createRuntime hook: every --gpu-id, repeated or a comma list; its driver root
    /// is nvhook's config's.
    #[test]
    fn apply_cuda_memory_limits_names_its_gpus() {
        assert_eq!(
            parse_words(
                "apply-cuda-memory-limits --driver-root /run/nvidia/driver --gpu-id GPU-a --gpu-id=GPU-b,GPU-c"
            ),
            Ok(CdiHook::MemoryLimits(vec![
                "GPU-a".into(),
                "GPU-b".into(),
                "GPU-c".into()
            ]))
        );
        assert_eq!(
            parse_words("apply-cuda-memory-limits"),
            Ok(CdiHook::MemoryLimits(Vec::new()))
        );
        let e = parse_words("apply-cuda-memory-limits --gpu-id GPU-a,,GPU-b").unwrap_err();
        assert!(e.to_string().contains("an empty GPU id"), "{e}");
        let e = parse_words("apply-cuda-memory-limits --gpu GPU-a").unwrap_err();
        assert!(matches!(e, CdiHookError::UnknownOption { .. }), "{e}");
    }

    #[test]
    fn help_and_version() {
        for words in ["--version", "-v", "-version", "--debug --version"] {
            assert_eq!(parse_words(words), Ok(CdiHook::Version), "{words}");
        }
        for words in ["--help", "-h", "help", "-help", "h"] {
            assert_eq!(parse_words(words), Ok(CdiHook::Help(None)), "{words}");
        }
        for words in [
            "update-ldcache --help",
            "update-ldcache --folder /x -h",
            "help update-ldcache",
        ] {
            assert_eq!(
                parse_words(words),
                Ok(CdiHook::Help(Some("update-ldcache"))),
                "{words}"
            );
        }
        assert!(help(None).contains("enable-cuda-compat"));
        assert!(help(Some("create-symlinks")).contains("--link value"));
    }

    #[test]
    fn bad_input_to_a_known_hook_is_named() {
        for (words, said) in [
            (
                "create-symlinks --folder /x",
                "create-symlinks: flag provided but not defined: -folder",
            ),
            (
                "update-ldcache --bogus=1",
                "update-ldcache: flag provided but not defined: -bogus",
            ),
            (
                "create-symlinks --link",
                "create-symlinks: --link needs a value",
            ),
            ("create-symlinks --link /a", "not TARGET::LINK"),
            ("create-symlinks --link ::/a", "not TARGET::LINK"),
            (
                "create-symlinks --link a::b",
                "its LINK part is not an absolute path",
            ),
            (
                "create-symlinks --link a::b::/c",
                "--link a::b::/c: its LINK part",
            ),
            (
                "create-symlinks --link a::/x/../../etc",
                "its LINK part is not an absolute path",
            ),
            ("update-ldcache --folder lib", "not an absolute path"),
            (
                "enable-cuda-compat --host-driver-version 1 --cuda-compat-container-root /a/../..",
                "not an absolute path",
            ),
            (
                "update-ldcache --container-spec /tmp/config.json",
                "stdin only",
            ),
        ] {
            let e = parse_words(words).expect_err(words).to_string();
            assert!(e.contains(said), "{words}: {e}");
            assert_eq!(e.lines().count(), 1, "{words}: {e}");
        }
        // Arguments that are not flags are ignored, as urfave/cli leaves them.
        assert_eq!(
            links("update-ldcache stray --folder /usr/lib64")
                .folders
                .len(),
            1
        );
    }
}
