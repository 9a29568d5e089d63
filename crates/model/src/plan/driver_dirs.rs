//! The directories NVIDIA's CUDA images name for the driver's files: their `LD_LIBRARY_PATH`
//! lists `/usr/local/nvidia/lib` and `/usr/local/nvidia/lib64`, and their `PATH` begins with
//! `/usr/local/nvidia/bin` (GKE mounts its driver there). No image ships files in them, so a
//! container whose environment names one can get the driver's files there as one directory,
//! where a plan for no hook otherwise binds each library into two of the image's own
//! directories ([`super::Layout::at_sonames`]).

use nvhook_ldcache::ElfClass;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const LIB64: &str = "/usr/local/nvidia/lib64";
pub const LIB32: &str = "/usr/local/nvidia/lib";
pub const BIN: &str = "/usr/local/nvidia/bin";

/// Which of those directories the image's environment searches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverDirs {
    pub lib64: bool,
    pub lib32: bool,
    pub bin: bool,
}

impl DriverDirs {
    /// The directories named by `LD_LIBRARY_PATH` and `PATH` in `env` (`KEY=value` entries,
    /// the first of a key counting, as for `getenv`).
    pub fn from_env(env: &[String]) -> DriverDirs {
        let var = |key: &str| {
            env.iter()
                .find_map(|e| e.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or_default()
        };
        // glibc's loader splits its list at ':' and ';', a shell's PATH at ':' alone.
        let lists = |list: &str, seps: &[char], dir: &str| {
            list.split(seps)
                .any(|entry| entry.trim_end_matches('/') == dir)
        };
        let libs = var("LD_LIBRARY_PATH");
        DriverDirs {
            lib64: lists(libs, &[':', ';'], LIB64),
            lib32: lists(libs, &[':', ';'], LIB32),
            bin: lists(var("PATH"), &[':'], BIN),
        }
    }

    pub fn is_none(&self) -> bool {
        *self == DriverDirs::default()
    }

    /// Where a library of `class` goes, when the image searches that directory.
    pub fn lib_dir(&self, class: ElfClass) -> Option<&'static str> {
        match class {
            ElfClass::Lib64 => self.lib64.then_some(LIB64),
            ElfClass::Lib32 => self.lib32.then_some(LIB32),
        }
    }

    /// Where the binaries go, when the image searches that directory.
    pub fn bin_dir(&self) -> Option<&'static str> {
        self.bin.then_some(BIN)
    }

    /// The directories in use.
    pub fn dirs(&self) -> impl Iterator<Item = &'static str> {
        [(self.lib64, LIB64), (self.lib32, LIB32), (self.bin, BIN)]
            .into_iter()
            .filter_map(|(on, dir)| on.then_some(dir))
    }
}

/// The files `plan` mounts in each driver directory its layout uses, by name, with their
/// host sources: what one directory of them would hold.
pub fn files_by_dir(plan: &super::Plan) -> Vec<(&'static str, Vec<(&str, &Path)>)> {
    plan.layout
        .driver_dirs
        .dirs()
        .map(|dir| {
            let files = plan
                .mounts
                .iter()
                .filter_map(|m| {
                    let (parent, name) = m.destination.rsplit_once('/')?;
                    (parent == dir).then_some((name, m.source.as_path()))
                })
                .collect();
            (dir, files)
        })
        .filter(|(_, files): &(_, Vec<_>)| !files.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn a_cuda_images_environment_names_all_three() {
        let dirs = DriverDirs::from_env(&env(&[
            "PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/bin:/bin",
            "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
        ]));
        assert_eq!(
            dirs,
            DriverDirs {
                lib64: true,
                lib32: true,
                bin: true
            }
        );
        assert_eq!(dirs.lib_dir(ElfClass::Lib64), Some(LIB64));
        assert_eq!(dirs.dirs().collect::<Vec<_>>(), [LIB64, LIB32, BIN]);
    }

    #[test]
    fn only_the_exact_directories_count() {
        let dirs = DriverDirs::from_env(&env(&[
            "LD_LIBRARY_PATH=/usr/local/nvidia/lib64/;/usr/local/nvidia/lib32",
            "PATH=/usr/local/nvidia/bin/x:/usr/bin",
            "LD_LIBRARY_PATH=/usr/local/nvidia/lib",
        ]));
        // A trailing slash is the same directory; a second LD_LIBRARY_PATH is not read.
        assert_eq!(
            dirs,
            DriverDirs {
                lib64: true,
                lib32: false,
                bin: false
            }
        );
        assert!(
            DriverDirs::from_env(&env(&["LD_LIBRARY_PATHX=/usr/local/nvidia/lib64"])).is_none()
        );
        assert!(DriverDirs::from_env(&[]).is_none());
    }
}
