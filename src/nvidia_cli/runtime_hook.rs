//! `nvidia-container-runtime-hook`'s command line (Go's `flag` package): flags `-config FILE`,
//! `-debug`, `-version` (one or two dashes, `=value` or the next argument), then a command,
//! `prestart`, `poststart` or `poststop`. Docker's `--gpus` runs `prestart`.

use crate::shown::Shown;

/// What one command line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeHook {
    /// `prestart`: nvhook's prestart hook.
    Prestart,
    /// `poststart`, `poststop`: nothing, as NVIDIA's.
    Nothing,
    Version,
    /// `-h`, `-help`: the usage, on stderr, and success.
    Help,
}

/// A command line NVIDIA's hook answers with its usage and exit status 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeHookError {
    #[error("flag provided but not defined: -{0}")]
    UnknownFlag(Shown),
    #[error("flag needs an argument: -{0}")]
    NoValue(&'static str),
    #[error("no command: use prestart, poststart or poststop")]
    NoCommand,
    #[error("unknown command {0}: use prestart, poststart or poststop")]
    UnknownCommand(Shown),
}

/// The usage NVIDIA's hook prints (on stderr) for `-h` and for every mistake.
pub const USAGE: &str = "Usage of nvidia-container-runtime-hook:
  -config string
    \tconfiguration file (NVIDIA's; nvhook reads $NVHOOK_CONFIG or /etc/nvhook/config.toml)
  -debug
    \tenable debug output (nvhook logs where its config says)
  -version
    \tenable version output

Commands:
  prestart
        run the prestart hook
  poststart
        no-op
  poststop
        no-op
";

/// Reads the arguments after the program name.
pub fn parse(args: &[String]) -> Result<RuntimeHook, RuntimeHookError> {
    let mut args = args.iter().map(String::as_str);
    let mut version = false;
    let command = loop {
        let Some(arg) = args.next() else {
            break None;
        };
        // Go stops at the first argument that is not a flag, and at `--`.
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            break Some(arg);
        };
        if flag.is_empty() {
            break args.next();
        }
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (flag, None),
        };
        match name {
            "h" | "help" => return Ok(RuntimeHook::Help),
            "version" => version = inline.is_none_or(|v| v != "false"),
            "debug" => {}
            "config" => {
                if inline.is_none() && args.next().is_none() {
                    return Err(RuntimeHookError::NoValue("config"));
                }
            }
            other => return Err(RuntimeHookError::UnknownFlag(other.into())),
        }
    };
    if version {
        return Ok(RuntimeHook::Version);
    }
    match command {
        Some("prestart") => Ok(RuntimeHook::Prestart),
        Some("poststart" | "poststop") => Ok(RuntimeHook::Nothing),
        Some(other) => Err(RuntimeHookError::UnknownCommand(other.into())),
        None => Err(RuntimeHookError::NoCommand),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(words: &str) -> Result<RuntimeHook, RuntimeHookError> {
        let args: Vec<String> = words.split_whitespace().map(str::to_string).collect();
        parse(&args)
    }

    #[test]
    fn nvidias_flags_and_commands() {
        for (words, want) in [
            ("prestart", Ok(RuntimeHook::Prestart)),
            (
                "-config /etc/nvidia-container-runtime/config.toml prestart",
                Ok(RuntimeHook::Prestart),
            ),
            (
                "--config=/x -debug prestart extra",
                Ok(RuntimeHook::Prestart),
            ),
            ("poststart", Ok(RuntimeHook::Nothing)),
            ("poststop", Ok(RuntimeHook::Nothing)),
            ("-version", Ok(RuntimeHook::Version)),
            ("--version", Ok(RuntimeHook::Version)),
            ("-version prestart", Ok(RuntimeHook::Version)),
            ("-h", Ok(RuntimeHook::Help)),
            ("--help prestart", Ok(RuntimeHook::Help)),
            ("-v", Err(RuntimeHookError::UnknownFlag("v".into()))),
            ("", Err(RuntimeHookError::NoCommand)),
            ("-debug", Err(RuntimeHookError::NoCommand)),
            ("-config", Err(RuntimeHookError::NoValue("config"))),
            (
                "create",
                Err(RuntimeHookError::UnknownCommand("create".into())),
            ),
        ] {
            assert_eq!(parse_words(words), want, "{words}");
        }
        assert_eq!(
            RuntimeHookError::UnknownFlag("v".into()).to_string(),
            "flag provided but not defined: -v"
        );
    }
}
