//! `nvidia-cdi-hook`'s command line, as the createContainer hooks of NVIDIA's CDI specs
//! (toolkit 1.17 to 1.20) write it: one hook per entry, `nvidia-cdi-hook HOOK --flag VALUE...`,
//! the OCI state on stdin. Each hook is read into the work of nvhook's own createContainer hook
//! ([`LinkArgs`]); nothing here runs a program (no ldconfig, no chmod). NVIDIA's flags parse the
//! Go way: `--flag VALUE`, `--flag=VALUE`, and the same with one dash.
//!
//! Unlike NVIDIA's, which warns and succeeds, an unknown hook or flag fails with one line that
//! names it: a spec nvhook cannot honour stops the container rather than start it half-made.

use crate::cdi::hook::{LibFolder, LinkArgs};
use crate::echo::Echo;
use crate::plan::{Symlink, compat, ld_so_conf_listing};

/// NVIDIA's CDI hook program, named in the hooks of its CDI specs; Docker 29 maps `--gpus` onto
/// CDI when it is on dockerd's PATH.
pub const CDI_HOOK_NAME: &str = "nvidia-cdi-hook";

/// The hooks nvhook answers, for messages.
const HOOKS: &str = "create-symlinks, update-ldcache, create-soname-symlinks, enable-cuda-compat, disable-device-node-modification, chmod, update-application-profile, noop";

/// What one `nvidia-cdi-hook` command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CdiHook {
    /// Work for nvhook's createContainer hook.
    Links(LinkArgs),
    /// A hook that nvhook accepts and has nothing to do for; why, for the log.
    Nothing(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiHookError {
    #[error("no hook named: use one of {HOOKS}")]
    NoHook,
    #[error("unknown hook {0} (nvhook answers {HOOKS})")]
    UnknownHook(Echo),
    #[error("{hook}: unknown option {option}")]
    UnknownOption { hook: &'static str, option: Echo },
    #[error("{hook}: {option} needs a value")]
    NoValue { hook: &'static str, option: Echo },
    #[error("{hook}: {option} {value}: {why}")]
    BadValue {
        hook: &'static str,
        option: Echo,
        value: Echo,
        why: &'static str,
    },
    #[error("{hook} needs {what}")]
    Missing {
        hook: &'static str,
        what: &'static str,
    },
}

/// Reads the arguments after the program name.
pub fn parse(args: &[String]) -> Result<CdiHook, CdiHookError> {
    let mut args = args.iter().map(String::as_str);
    // Global flags: NVIDIA's logging switches; nvhook logs where its config says.
    let hook = loop {
        match args.next().ok_or(CdiHookError::NoHook)? {
            "--debug" | "-debug" | "-d" | "--quiet" | "-quiet" => {}
            flag if flag.starts_with('-') => {
                return Err(CdiHookError::UnknownOption {
                    hook: "nvidia-cdi-hook",
                    option: flag.into(),
                });
            }
            hook => break hook,
        }
    };
    let rest: Vec<&str> = args.collect();
    let (hook, options): (&'static str, &[&str]) = match hook {
        "create-symlinks" => ("create-symlinks", &["link"]),
        "update-ldcache" => ("update-ldcache", &["folder", "ldconfig-path"]),
        "create-soname-symlinks" => ("create-soname-symlinks", &["folder", "ldconfig-path"]),
        "enable-cuda-compat" => (
            "enable-cuda-compat",
            &[
                "host-driver-version",
                "host-cuda-version",
                "cuda-compat-container-root",
            ],
        ),
        "disable-device-node-modification" => ("disable-device-node-modification", &[]),
        "chmod" => ("chmod", &["path", "mode"]),
        "update-application-profile" => ("update-application-profile", &[]),
        "noop" => ("noop", &[]),
        other => return Err(CdiHookError::UnknownHook(other.into())),
    };
    let flags = flags(hook, options, &rest)?;
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
                let (target, path) = link
                    .split_once("::")
                    .filter(|(target, _)| !target.is_empty())
                    .ok_or_else(|| bad("link", link, "not TARGET::LINK"))?;
                links.symlinks.push(Symlink {
                    path: absolute("link", path)?,
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
            }
            if let Some(ldconfig) = values("ldconfig-path").next_back() {
                tracing::debug!(
                    ldconfig,
                    "--ldconfig-path ignored: nvhook writes the loader cache itself"
                );
            }
        }
        "enable-cuda-compat" => {
            for version in values("host-cuda-version") {
                tracing::debug!(
                    version,
                    "--host-cuda-version ignored: nvhook decides by the host driver version"
                );
            }
            for root in values("cuda-compat-container-root") {
                tracing::debug!(
                    root,
                    "--cuda-compat-container-root ignored: nvhook looks in /usr/local/cuda/compat"
                );
            }
            let version =
                values("host-driver-version")
                    .next_back()
                    .ok_or(CdiHookError::Missing {
                        hook,
                        what: "--host-driver-version",
                    })?;
            if compat::DriverVersion::parse(version).is_none() {
                return Err(bad("host-driver-version", version, "not a driver version"));
            }
            links.cuda_compat_host = Some(version.to_string());
        }
        "disable-device-node-modification" => links.params_view = true,
        "chmod" => {
            return Ok(CdiHook::Nothing(
                "chmod: nvhook changes no mode in the container (NVIDIA turned this hook off by default: it was for old crun)",
            ));
        }
        "update-application-profile" => {
            return Ok(CdiHook::Nothing(
                "update-application-profile: nvhook writes no driver application profile",
            ));
        }
        _ => return Ok(CdiHook::Nothing("noop")),
    }
    Ok(CdiHook::Links(links))
}

/// The `(name, value)` pairs of `args`, every one of `options` taking a value; plus
/// `--container-spec`, which may only say stdin (`-` or empty): the state is read there.
fn flags<'a>(
    hook: &'static str,
    options: &[&str],
    args: &[&'a str],
) -> Result<Vec<(&'a str, &'a str)>, CdiHookError> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let unknown = || CdiHookError::UnknownOption {
            hook,
            option: (*arg).into(),
        };
        let name = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .ok_or_else(unknown)?;
        let (name, inline) = match name.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (name, None),
        };
        if !options.contains(&name) && name != "container-spec" {
            return Err(unknown());
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
    Ok(out)
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
            Ok(CdiHook::Links(links)) => links,
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
        let got = links("--debug enable-cuda-compat --host-driver-version=580.95.05");
        assert_eq!(got.cuda_compat_host.as_deref(), Some("580.95.05"));
        let got = links(
            "enable-cuda-compat --host-driver-version 550.54.15 --host-cuda-version 12.4 --cuda-compat-container-root /usr/local/cuda/compat",
        );
        assert_eq!(got.cuda_compat_host.as_deref(), Some("550.54.15"));
        assert!(links("disable-device-node-modification --container-spec -").params_view);
        for nothing in [
            "chmod --mode 755 --path /dev/dri",
            "update-application-profile",
            "noop",
        ] {
            assert!(
                matches!(parse_words(nothing), Ok(CdiHook::Nothing(_))),
                "{nothing}"
            );
        }
    }

    #[test]
    fn unknown_or_bad_input_is_named() {
        for (words, said) in [
            ("", "no hook named"),
            ("frobnicate --x 1", "unknown hook frobnicate"),
            ("--verbose create-symlinks", "unknown option --verbose"),
            (
                "create-symlinks --folder /x",
                "create-symlinks: unknown option --folder",
            ),
            (
                "create-symlinks --link",
                "create-symlinks: --link needs a value",
            ),
            ("create-symlinks --link /a", "not TARGET::LINK"),
            ("create-symlinks --link ::/a", "not TARGET::LINK"),
            ("create-symlinks --link a::b", "not an absolute path"),
            (
                "create-symlinks --link a::/x/../../etc",
                "not an absolute path",
            ),
            ("update-ldcache --folder lib", "not an absolute path"),
            ("update-ldcache stray", "unknown option stray"),
            ("enable-cuda-compat", "needs --host-driver-version"),
            (
                "enable-cuda-compat --host-driver-version latest",
                "not a driver version",
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
    }
}
