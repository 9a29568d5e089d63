//! The hook's own command line, read without clap. Every container start runs
//! `nvhook [--config FILE] hook STAGE ARGS...`, and clap builds the whole command tree (every
//! subcommand, its flags and help) before it parses a word of it: a part of the hook's
//! process start the runtime waits for. The lines nvhook writes into hook entries are read
//! here; anything this reader is not sure of reading exactly as clap would (help, a flag where
//! clap takes one, a word that is not UTF-8) goes to clap as before.

use crate::Stage;
use clap::ValueEnum;
use std::ffi::OsString;
use std::path::PathBuf;

/// A hook's command line: what `Command::Hook` and the global `--config` hold.
#[derive(Debug, PartialEq)]
pub(crate) struct HookLine {
    pub config: Option<PathBuf>,
    pub stage: Stage,
    pub args: Vec<String>,
}

/// `args` (the command line without the program's name) as a hook's, where it is one that
/// clap would read the same way.
pub(crate) fn read(args: &[OsString]) -> Option<HookLine> {
    let words: Vec<&str> = args.iter().map(|a| a.to_str()).collect::<Option<_>>()?;
    let (config, rest) = match words.as_slice() {
        ["--config", path, rest @ ..] => (Some(*path), rest),
        [first, rest @ ..] if first.starts_with("--config=") => {
            (Some(&first["--config=".len()..]), rest)
        }
        rest => (None, rest),
    };
    // A path clap would take for a flag, or an empty one, is clap's to judge.
    if config.is_some_and(|p| p.is_empty() || p.starts_with('-')) {
        return None;
    }
    let ["hook", stage, args @ ..] = rest else {
        return None;
    };
    let stage = Stage::from_str(stage, false).ok()?;
    // clap reads the stage's first argument as one of its flags where it is one (help, the
    // global --config, `--`); after a first plain value everything is a value.
    if let Some(first) = args.first() {
        let clap_flag = first.starts_with('-') && !first.starts_with("--")
            || ["--help", "--config", "--version"]
                .iter()
                .any(|flag| first.starts_with(flag))
            || *first == "--";
        if clap_flag {
            return None;
        }
    }
    Some(HookLine {
        config: config.map(PathBuf::from),
        stage,
        args: args.iter().map(|a| a.to_string()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cli, Command};
    use clap::Parser;

    fn words(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(OsString::from).collect()
    }

    /// What clap makes of the same line, as a hook's.
    fn by_clap(line: &str) -> Option<HookLine> {
        let cli = Cli::try_parse_from(words(&format!("nvhook {line}"))).ok()?;
        match cli.command {
            Command::Hook { stage, args } => Some(HookLine {
                config: cli.config,
                stage,
                args,
            }),
            _ => None,
        }
    }

    #[test]
    fn the_lines_nvhook_writes_are_read_as_clap_reads_them() {
        for line in [
            "hook prestart",
            "--config /etc/nvhook/config.toml hook prestart",
            "--config=/etc/nvhook/config.toml hook createRuntime",
            "hook createContainer",
            "--config /c.toml hook createContainer --link /usr/lib/libcuda.so=libcuda.so.1 --lib64 /usr/lib/libcuda.so.1",
            "hook createContainer --bind-file /h/libcuda.so.1 /usr/lib/libcuda.so.1 --help --config /x",
            "hook memoryLimits GPU-0f7c2c6e-7b9d-4c1f-9a3e-000000000003",
            "hook prestart extra",
        ] {
            let fast = read(&words(line)[..]);
            assert!(fast.is_some(), "{line}: not read without clap");
            assert_eq!(fast, by_clap(line), "{line}");
        }
    }

    #[test]
    fn lines_clap_reads_differently_are_left_to_clap() {
        for line in [
            // Flags clap takes at the stage's first argument.
            "hook createContainer --help",
            "hook prestart -h",
            "hook createContainer --config /x",
            "hook createContainer --config=/x",
            "hook createContainer -- --link",
            "hook memoryLimits --version",
            // Not a hook's line, or not one clap accepts.
            "hook",
            "hook Prestart",
            "hook poststart",
            "--config --config hook prestart",
            "--config= hook prestart",
            "hook --config /x prestart",
            "info",
            "--version",
        ] {
            assert_eq!(read(&words(line)[..]), None, "{line}");
        }
        use std::os::unix::ffi::OsStringExt;
        let raw = OsString::from_vec(vec![0xff]);
        assert_eq!(
            read(&[OsString::from("hook"), OsString::from("prestart"), raw]),
            None
        );
    }
}
