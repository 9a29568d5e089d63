//! CUDA forward compatibility: whether the image's compat libraries (`/usr/local/cuda/compat`,
//! a newer driver's user-space libraries shipped by CUDA images) load instead of the host's.
//!
//! The rule: the compat driver's version is read from the name of the one regular file
//! `libcuda.so.<version>` in the directory (nothing from the image is run), and compared
//! with the host driver's version component by component as numbers (major, minor, patch).
//! The compat libraries are used only when that version is strictly newer than the host's.
//! NVIDIA's toolkit (without the ELF note newer compat libraries carry) compares majors only;
//! this agrees with it whenever the majors differ, and within one major uses the newer
//! driver too (a 580.95 compat library on a 580.65 host), which is what the note's rule
//! gives for a branch the note lists. Anything unclear (no such file, several, a name that
//! is not a version) leaves the host's libraries in place, with the reason in the plan.

use super::{CacheEntry, LdSoConf};
use crate::shown::Shown;
use nvhook_ldcache::ElfClass;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// The image's compat directory as probed: where it is and the regular files in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompatDir {
    /// The path it was found at in the image (`/usr/local/cuda/compat`).
    pub dir: String,
    /// Names of the regular files directly in it (links are not listed).
    pub files: Vec<String>,
}

/// What the plan decided about the image's compat libraries, for `nvhook plan` and the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaCompat {
    pub dir: String,
    pub host_driver: String,
    /// From the compat `libcuda.so.<version>` file name, when there is exactly one.
    pub compat_driver: Option<String>,
    /// The compat files the loader now resolves, by SONAME; empty: the host's are used.
    pub libraries: Vec<String>,
    pub reason: String,
}

impl CudaCompat {
    pub fn used(&self) -> bool {
        !self.libraries.is_empty()
    }

    pub fn log(&self) {
        tracing::info!(dir = %self.dir, libraries = ?self.libraries, "CUDA compat: {}", self.reason);
    }
}

/// The ld.so.conf.d file that keeps the compat directory first for an ldconfig run in the
/// image: ldconfig reads the files in name order and keeps the first directory's copy of a
/// SONAME, and this name sorts before nvhook's other file and the distribution's.
pub const COMPAT_CONF: &str = "/etc/ld.so.conf.d/00-compat-nvhook.conf";

/// Where NVIDIA's toolkit looks for an image's compat libraries (its `enable-cuda-compat`
/// default), and nvhook first.
pub const NVIDIA_COMPAT_DIR: &str = "/usr/local/cuda/compat";

/// A driver version, `major.minor[.patch]`, each part a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverVersion(Vec<u64>);

impl DriverVersion {
    pub fn parse(text: &str) -> Option<DriverVersion> {
        let parts: Vec<u64> = text
            .split('.')
            .map(|p| {
                (!p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| p.parse().ok())
                    .flatten()
            })
            .collect::<Option<_>>()?;
        (2..=3)
            .contains(&parts.len())
            .then_some(DriverVersion(parts))
    }
}

impl PartialOrd for DriverVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DriverVersion {
    /// Missing parts count as 0: `580.95` equals `580.95.0`.
    fn cmp(&self, other: &Self) -> Ordering {
        let part = |v: &DriverVersion, i: usize| v.0.get(i).copied().unwrap_or(0);
        (0..3)
            .map(|i| part(self, i).cmp(&part(other, i)))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

/// `libcuda.so.580.95.05` -> (`libcuda`, `580.95.05`).
fn stem_and_version(file_name: &str) -> Option<(&str, &str)> {
    file_name.split_once(".so.")
}

/// The compat driver's version, or why there is none to compare. Like NVIDIA's
/// `libcuda.so.*.*`, only names with a dot after `libcuda.so.` are candidates: a regular file
/// `libcuda.so.1` is a plain copy, not a versioned driver file.
fn compat_version(found: &CompatDir) -> Result<(String, DriverVersion), String> {
    let libcuda: Vec<&str> = found
        .files
        .iter()
        .filter_map(|f| stem_and_version(f).filter(|(stem, _)| *stem == "libcuda"))
        .map(|(_, version)| version)
        .filter(|version| version.contains('.'))
        .collect();
    // Names come from the image: echoed, so that one cannot add lines to a log or a report.
    match libcuda[..] {
        [] => Err("it holds no regular file libcuda.so.<version>".into()),
        [version] => DriverVersion::parse(version)
            .map(|v| (version.to_string(), v))
            .ok_or_else(|| format!("libcuda.so.{}: not a driver version", Shown(version))),
        _ => Err(format!(
            "it holds several libcuda.so.<version> files ({})",
            libcuda
                .iter()
                .map(|v| Shown(v).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The compat decision, and the plan's loader entries redirected to the compat directory.
/// `entries` are the plan's cache entries; `host_files` maps each injected library's SONAME
/// to its host file name (`libcuda.so.1` -> `libcuda.so.550.54.15`).
///
/// A redirected entry names the compat file itself: nothing is written in the compat
/// directory, which may be a volume (a CUDA toolkit on a shared disk) nvhook never writes in.
pub fn apply(
    found: &CompatDir,
    host_driver: &str,
    image_has_cache: bool,
    host_files: &[(&str, &str)],
    entries: &mut [CacheEntry],
) -> (CudaCompat, Option<LdSoConf>) {
    let mut decision = CudaCompat {
        dir: found.dir.clone(),
        host_driver: host_driver.to_string(),
        compat_driver: None,
        libraries: Vec::new(),
        reason: String::new(),
    };
    let (text, compat) = match compat_version(found) {
        Ok(v) => v,
        Err(why) => {
            decision.reason = format!("{why}: the host's libraries");
            return (decision, None);
        }
    };
    decision.compat_driver = Some(text.clone());
    let Some(host) = DriverVersion::parse(host_driver) else {
        decision.reason = format!("the host driver version {host_driver} is not a version");
        return (decision, None);
    };
    if compat <= host {
        decision.reason = format!(
            "host driver {host_driver} is the same or newer than compat {text}: the host's libraries"
        );
        return (decision, None);
    }
    if !image_has_cache {
        decision.reason = format!(
            "compat {text} is newer than host driver {host_driver}, but the image has no /etc/ld.so.cache to point at it: the host's libraries"
        );
        return (decision, None);
    }
    // (cache entry, compat file) for each library the container gets that the directory has.
    let redirected: Vec<(usize, String)> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.class == ElfClass::Lib64)
        .filter_map(|(i, e)| {
            let (_, file) = host_files.iter().find(|(soname, _)| *soname == e.soname)?;
            let (stem, _) = stem_and_version(file)?;
            let compat_file = format!("{stem}.so.{text}");
            found
                .files
                .contains(&compat_file)
                .then_some((i, compat_file))
        })
        .collect();
    for (i, compat_file) in redirected {
        let entry = &mut entries[i];
        entry.path = format!("{}/{compat_file}", found.dir);
        decision.libraries.push(entry.soname.clone());
    }
    if !decision.used() {
        decision.reason = format!(
            "compat {text} is newer than host driver {host_driver}, but none of the libraries the container gets is in it: the host's libraries"
        );
        return (decision, None);
    }
    decision.reason =
        format!("compat {text} is newer than host driver {host_driver}: the compat libraries");
    let conf = LdSoConf {
        path: COMPAT_CONF.into(),
        dirs: vec![found.dir.clone()],
    };
    (decision, Some(conf))
}

/// The section of a compat libcuda whose note says which host drivers it serves, and the
/// note's owner.
pub const FWD_COMPAT_NOTE: (&str, &str) = (".note.cuda.fwd_compatibility", "NVIDIA Corporation");

/// The JSON description of that note (`{"CUDA Version": "13.0", "Driver": [535, 550], ...}`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FwdCompatNote {
    #[serde(rename = "CUDA Version", default)]
    pub cuda_version: String,
    #[serde(rename = "Driver", default)]
    pub driver: Vec<i64>,
}

impl FwdCompatNote {
    /// None for a description that is not such JSON: NVIDIA's hook then decides without it.
    pub fn parse(json: &[u8]) -> Option<FwdCompatNote> {
        serde_json::from_slice(json).ok()
    }
}

/// Whether NVIDIA's `enable-cuda-compat` hook (toolkit 1.20) puts the compat directory first:
/// `compat` is the version in the compat `libcuda.so.<version>` file's name, `note` its ELF
/// note, `host_driver` and `host_cuda` the spec's `--host-driver-version` and
/// `--host-cuda-version`. With the note: the host driver's major must be one it lists and the
/// compat driver newer (without both driver versions, the note's CUDA version newer than the
/// host's). Without: never when a host CUDA version is given, else a newer compat major.
pub fn nvidia_hook_uses_compat(
    compat: &str,
    host_driver: Option<&str>,
    host_cuda: Option<&str>,
    note: Option<&FwdCompatNote>,
) -> bool {
    let compat = crate::version::loose(compat);
    let host = host_driver.and_then(crate::version::loose);
    let host_cuda_text = host_cuda.filter(|v| !v.is_empty());
    if let Some(note) = note {
        return match (compat, host) {
            (Some(compat), Some(host)) => {
                i64::try_from(host[0]).is_ok_and(|major| note.driver.contains(&major))
                    && compat > host
            }
            _ => host_cuda_text
                .and_then(crate::version::loose)
                .zip(crate::version::loose(&note.cuda_version))
                .is_some_and(|(host, image)| image > host),
        };
    }
    host_cuda_text.is_none() && matches!((compat, host), (Some(c), Some(h)) if h[0] < c[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidias_hook_rule() {
        let note = |cuda: &str, driver: &[i64]| FwdCompatNote {
            cuda_version: cuda.into(),
            driver: driver.to_vec(),
        };
        let yes = nvidia_hook_uses_compat;
        // No note: majors only, and never with a host CUDA version.
        assert!(yes("580.95.05", Some("550.54.15"), None, None));
        assert!(!yes("550.90.07", Some("550.54.15"), None, None));
        assert!(!yes("535.1.1", Some("550.54.15"), None, None));
        assert!(!yes("580.95.05", Some("550.54.15"), Some("12.4"), None));
        assert!(yes("580.95.05", Some("550.54.15"), Some(""), None));
        assert!(!yes("580.95.05", None, None, None));
        assert!(!yes("580.95.05", Some("latest"), None, None));
        assert!(yes("v581", Some("580"), None, None));
        // The note: the host's major listed and the compat driver newer, within a major too.
        let listed = note("13.0", &[550, 570]);
        assert!(yes("580.95.05", Some("550.54.15"), None, Some(&listed)));
        assert!(!yes("580.95.05", Some("535.54.15"), None, Some(&listed)));
        assert!(yes(
            "550.90.07",
            Some("550.54.15"),
            None,
            Some(&note("12.4", &[550]))
        ));
        assert!(!yes(
            "550.40.07",
            Some("550.54.15"),
            None,
            Some(&note("12.4", &[550]))
        ));
        // Without a usable driver version, the note's CUDA version against the host's.
        assert!(yes("580.95.05", None, Some("12.4"), Some(&listed)));
        assert!(!yes("580.95.05", None, Some("13.0"), Some(&listed)));
        assert!(!yes("580.95.05", Some("x"), None, Some(&listed)));
        assert_eq!(
            FwdCompatNote::parse(
                br#"{"Format":1,"CUDA Version":"13.0","Driver":[550],"Device":[]}"#
            ),
            Some(note("13.0", &[550]))
        );
        assert_eq!(FwdCompatNote::parse(b"{\"Driver\":\"550\"}"), None);
    }

    fn v(text: &str) -> DriverVersion {
        DriverVersion::parse(text).unwrap()
    }

    #[test]
    fn versions_compare_as_numbers() {
        assert!(v("580.159.03") > v("580.95.05"));
        assert!(v("580.95.05") > v("550.54.15"));
        assert!(v("550.100") > v("550.54.15"));
        assert_eq!(v("580.95").cmp(&v("580.95.0")), Ordering::Equal);
        assert!(v("1000.1") > v("999.999.999"));
        for bad in [
            "",
            "1",
            "580",
            "580.",
            ".95",
            "580.95.05.1",
            "580.9x",
            "-1.2",
            "580.95 ",
            "1234567890.1",
        ] {
            assert_eq!(DriverVersion::parse(bad), None, "{bad:?}");
        }
    }

    const HOST: &[(&str, &str)] = &[
        ("libcuda.so.1", "libcuda.so.550.54.15"),
        (
            "libnvidia-ptxjitcompiler.so.1",
            "libnvidia-ptxjitcompiler.so.550.54.15",
        ),
        ("libnvidia-ml.so.1", "libnvidia-ml.so.550.54.15"),
    ];

    fn entries() -> Vec<CacheEntry> {
        HOST.iter()
            .map(|(soname, _)| CacheEntry {
                soname: soname.to_string(),
                path: format!("/usr/lib/x86_64-linux-gnu/{soname}"),
                class: ElfClass::Lib64,
            })
            .collect()
    }

    fn compat(files: &[&str]) -> CompatDir {
        CompatDir {
            dir: "/usr/local/cuda/compat".into(),
            files: files.iter().map(|f| f.to_string()).collect(),
        }
    }

    fn run(host: &str, files: &[&str], cache: bool) -> (CudaCompat, Vec<CacheEntry>) {
        let mut e = entries();
        let (d, conf) = apply(&compat(files), host, cache, HOST, &mut e);
        assert_eq!(conf.is_some(), d.used(), "{d:?}");
        (d, e)
    }

    #[test]
    fn a_newer_compat_driver_takes_the_libraries_it_has() {
        let files = [
            "libcuda.so.580.95.05",
            "libnvidia-ptxjitcompiler.so.580.95.05",
            "libnvidia-nvvm.so.580.95.05",
        ];
        let (d, e) = run("550.54.15", &files, true);
        assert_eq!(d.compat_driver.as_deref(), Some("580.95.05"));
        assert_eq!(
            d.libraries,
            ["libcuda.so.1", "libnvidia-ptxjitcompiler.so.1"]
        );
        assert!(
            d.reason.contains("newer than host driver 550.54.15"),
            "{}",
            d.reason
        );
        assert_eq!(e[0].path, "/usr/local/cuda/compat/libcuda.so.580.95.05");
        assert_eq!(
            e[1].path,
            "/usr/local/cuda/compat/libnvidia-ptxjitcompiler.so.580.95.05"
        );
        // Not in the compat directory: the host's, as before.
        assert_eq!(e[2].path, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
        // Same major, newer minor: newer, so used.
        let (d, ..) = run("580.65.06", &files, true);
        assert!(d.used(), "{d:?}");
    }

    #[test]
    fn the_hosts_libraries_stay_otherwise() {
        let untouched = entries();
        for (host, files, cache, why) in [
            (
                "580.159.03",
                &["libcuda.so.580.95.05"][..],
                true,
                "the same or newer",
            ),
            (
                "580.95.05",
                &["libcuda.so.580.95.05"],
                true,
                "the same or newer",
            ),
            (
                "550.54.15",
                &["libcuda.so.580.95.05"],
                false,
                "no /etc/ld.so.cache",
            ),
            (
                "550.54.15",
                &[],
                true,
                "no regular file libcuda.so.<version>",
            ),
            ("550.54.15", &["libcuda.so.1"], true, "no regular file"),
            ("550.54.15", &["libcuda.so.latest"], true, "no regular file"),
            (
                "550.54.15",
                &["libcuda.so.580.x"],
                true,
                "libcuda.so.580.x: not a driver version",
            ),
            (
                "550.54.15",
                &["libcuda.so.5.8.0.9"],
                true,
                "not a driver version",
            ),
            (
                "550.54.15",
                &["libcuda.so.9.9\nx"],
                true,
                "libcuda.so.9.9\\nx: not a driver version",
            ),
            (
                "550.54.15",
                &["libcuda.so.580.95.05", "libcuda.so.590.1.1"],
                true,
                "several",
            ),
            (
                "unknown",
                &["libcuda.so.580.95.05"],
                true,
                "is not a version",
            ),
        ] {
            let (d, e) = run(host, files, cache);
            assert!(!d.used(), "{host} {files:?}: {d:?}");
            assert!(d.reason.contains(why), "{host} {files:?}: {}", d.reason);
            assert_eq!(e, untouched);
        }
    }

    #[test]
    fn nothing_to_redirect_when_the_container_gets_no_compat_library() {
        let mut e = entries();
        e.retain(|e| e.soname == "libnvidia-ml.so.1");
        let before = e.clone();
        let found = compat(&["libcuda.so.580.95.05"]);
        let (d, conf) = apply(&found, "550.54.15", true, HOST, &mut e);
        assert!(!d.used() && conf.is_none(), "{d:?}");
        assert!(d.reason.contains("none of the libraries"), "{}", d.reason);
        assert_eq!(e, before);
    }
}
