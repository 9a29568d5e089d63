//! Container Device Interface: nvhook's plans as CDI container edits.
//!
//! containerd ≥ 1.7, CRI-O, Podman and Docker ≥ 25 inject devices from CDI specs
//! (`/etc/cdi`, `/var/run/cdi`) themselves. `nvhook cdi generate` writes such a spec from
//! the same inventory and plans the hook uses, nvhook-runtime's cdi mode writes the same
//! edits into config.json, and both leave to nvhook only a `createRuntime` hook for the
//! links and the loader cache.

pub mod generate;
pub mod imex_and_families;

pub use crate::delivery::cdi_spec::KIND;
pub use crate::delivery::cdi_spec::{CdiSpec, CdiVersion, ContainerEdits, Format};
pub use generate::{NameStrategy, generate};
pub use imex_and_families::generate_imex_and_families;

use crate::atomic_file::{NewFile, write_atomic};
use crate::delivery::args_file;
use crate::delivery::cdi_spec as spec;
use std::path::{Path, PathBuf};

/// Where engines look for spec files, lowest priority first.
pub const SPEC_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Invalid(#[from] spec::InvalidSpec),
    #[error(
        "this node has no GPU, and a CDI spec needs at least one device (does `nvhook info` list the GPUs?)"
    )]
    NoGpu,
    #[error("cannot {op} CDI spec {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot {op} CDI spec {path}: {message}")]
    BadFile {
        op: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("cannot write CDI spec {0}: engines only read spec files named *.json or *.yaml")]
    Name(PathBuf),
    #[error(
        "cannot write CDI spec {}: it is a directory (name the file in it, such as {})",
        .0.display(),
        .0.join("nvidia.yaml").display()
    )]
    Directory(PathBuf),
}

/// A spec of `kind` with `devices` and the spec-wide edits `common`, at the oldest CDI version
/// that holds them, validated.
fn spec_of(
    kind: &str,
    devices: Vec<spec::Device>,
    common: ContainerEdits,
) -> Result<CdiSpec, CdiError> {
    let mut made = CdiSpec {
        cdi_version: String::new(),
        kind: kind.into(),
        devices,
        container_edits: common,
    };
    made.cdi_version = spec::minimum_version(&made).to_string();
    spec::validate(&made)?;
    Ok(made)
}

/// Reads and validates the spec at `path`.
pub fn read_spec(path: &Path) -> Result<CdiSpec, CdiError> {
    let fail = |op, message: String| CdiError::BadFile {
        op,
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|source| CdiError::Io {
        op: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let spec = CdiSpec::parse(&text).map_err(|e| fail("parse", e.0))?;
    // The names it quotes are the file's: one line, however long they are.
    spec::validate(&spec).map_err(|e| fail("use", spec::cut_quoted(&e.0)))?;
    Ok(spec)
}

/// Why `nvhook cdi list` lists nothing: never a success, as an empty list would read.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error(
        "no CDI spec in {dirs}: write one with nvhook cdi generate --output /etc/cdi/nvidia.yaml, or nvhook cdi refresh (it writes {REFRESHED_SPEC})"
    )]
    NoSpec { dirs: String },
    #[error(
        "none of the {count} CDI specs in {dirs} can be read (each is named above): fix or remove them, and remake nvhook's with nvhook cdi refresh"
    )]
    NoneReadable { count: usize, dirs: String },
    #[error(transparent)]
    Spec(#[from] CdiError),
    #[error("cannot write the list: {0}")]
    Output(std::io::Error),
}

/// `nvhook cdi list FILE...`, or with no file, the specs in [`SPEC_DIRS`]: each device's
/// `vendor/class=name` on `out`, one a line. Of the directories' specs, one nvhook cannot read
/// is a warning line on `warn` (other vendors' specs live there too: one is no reason to hide
/// the others); a named file that cannot be read is the error.
pub fn list(
    files: &[PathBuf],
    out: &mut dyn std::io::Write,
    warn: &mut dyn std::io::Write,
) -> Result<(), ListError> {
    let dirs: Vec<&Path> = SPEC_DIRS.iter().map(Path::new).collect();
    list_in(files, &dirs, out, warn)
}

/// [`list`], the specs looked for in `dirs` where no file is named.
pub fn list_in(
    files: &[PathBuf],
    dirs: &[&Path],
    out: &mut dyn std::io::Write,
    warn: &mut dyn std::io::Write,
) -> Result<(), ListError> {
    let print = |out: &mut dyn std::io::Write, spec: &CdiSpec| {
        spec.qualified_names()
            .iter()
            .try_for_each(|name| writeln!(out, "{name}"))
            .map_err(ListError::Output)
    };
    if !files.is_empty() {
        for file in files {
            print(out, &read_spec(file)?)?;
        }
        return Ok(());
    }
    let named = || {
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let found = spec_files(dirs);
    if found.is_empty() {
        return Err(ListError::NoSpec { dirs: named() });
    }
    let mut read = 0;
    for file in &found {
        match read_spec(file) {
            Ok(spec) => {
                print(out, &spec)?;
                read += 1;
            }
            Err(e) => writeln!(warn, "nvhook: warning: {e}").map_err(ListError::Output)?,
        }
    }
    match read {
        0 => Err(ListError::NoneReadable {
            count: found.len(),
            dirs: named(),
        }),
        _ => Ok(()),
    }
}

/// The spec files engines would read from `dirs`: `*.json` and `*.yaml`, sorted by name.
pub fn spec_files(dirs: &[&Path]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("json" | "yaml")
                    )
            })
            .collect();
        files.sort();
        out.extend(files);
    }
    out
}

/// Where `nvhook cdi refresh` keeps the spec by default: on tmpfs, remade at each boot.
pub const REFRESHED_SPEC: &str = "/var/run/cdi/nvidia.yaml";

/// Replaces the spec at `path` with `text` unless it already holds exactly that; whether it
/// was written. An unchanged spec keeps its inode and times, so engines watching the
/// directory see nothing happen.
pub fn refresh_spec(path: &Path, text: &str) -> Result<bool, CdiError> {
    if holds(path, text)? {
        return Ok(false);
    }
    write_spec(path, text)?;
    Ok(true)
}

/// Whether the file at `path` holds exactly `text` (none there: it does not).
fn holds(path: &Path, text: &str) -> Result<bool, CdiError> {
    match std::fs::read(path) {
        Ok(current) => Ok(current == text.as_bytes()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(CdiError::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// What became of an extra spec's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecOutcome {
    Written(PathBuf),
    Unchanged(PathBuf),
    /// The host no longer has that class: its old file was removed.
    Removed(PathBuf),
}

/// Puts the extra specs (IMEX channels, device families) beside the GPU spec at `gpu_spec`,
/// each rewritten only when it changed, and removes the file of a class the host no longer
/// has, so that engines never offer devices that are gone.
pub fn write_imex_and_family_specs(
    gpu_spec: &Path,
    specs: &[(&str, CdiSpec)],
    format: Format,
) -> Result<Vec<SpecOutcome>, CdiError> {
    let mut out = Vec::new();
    for class in imex_and_families::classes() {
        let path = imex_and_families::path_beside(gpu_spec, class);
        match specs.iter().find(|(c, _)| *c == class) {
            Some((_, spec)) => out.push(match refresh_spec(&path, &spec.to_text(format))? {
                true => SpecOutcome::Written(path),
                false => SpecOutcome::Unchanged(path),
            }),
            None => match std::fs::remove_file(&path) {
                Ok(()) => out.push(SpecOutcome::Removed(path)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(CdiError::Io {
                        op: "remove",
                        path,
                        source,
                    });
                }
            },
        }
    }
    Ok(out)
}

/// Writes `text` to `path` atomically (engines watch these directories and may read at any
/// time). Engines read only `*.json` and `*.yaml`: another name would be silently ignored.
pub fn write_spec(path: &Path, text: &str) -> Result<(), CdiError> {
    spec_dir(path)?;
    write_checked(path, text)
}

/// [`write_spec`] of a `path` [`spec_dir`] has checked.
fn write_checked(path: &Path, text: &str) -> Result<(), CdiError> {
    write_atomic(path, text.as_bytes(), NewFile::mode(0o644)).map_err(|source| CdiError::Io {
        op: "write",
        path: path.to_path_buf(),
        source,
    })
}

/// Checks that `path` can be a spec file engines read, and makes its directory where missing.
fn spec_dir(path: &Path) -> Result<(), CdiError> {
    if path.is_dir() {
        return Err(CdiError::Directory(path.to_path_buf()));
    }
    if !matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("json" | "yaml")
    ) {
        return Err(CdiError::Name(path.to_path_buf()));
    }
    // As engines' own spec directories often do not exist before the first spec.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| CdiError::Io {
            op: "create the directory of",
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

/// Writes nvhook's GPU spec to `path` as `format`, with its hook's arguments in a file beside
/// it ([`args_file`]): the file first, so that an engine never reads a spec whose file is not
/// there yet. With `only_if_changed` a spec that holds that text already is left as it is (see
/// [`refresh_spec`]). Whether the spec was written.
pub fn write_gpu_spec(
    path: &Path,
    mut spec: CdiSpec,
    format: Format,
    only_if_changed: bool,
) -> Result<bool, CdiError> {
    spec_dir(path)?;
    let io = |op, path: &Path| {
        let path = path.to_path_buf();
        move |source| CdiError::Io { op, path, source }
    };
    let absolute = std::path::absolute(path).map_err(io("find", path))?;
    // The file of the spec being replaced stays for the containers made through it.
    let previous = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| args_file::named_in(&text, &absolute));
    let file = args_file::externalize(&mut spec, &absolute);
    if let Some(file) = &file {
        file.write()
            .map_err(io("write the hook's arguments of", path))?;
    }
    let text = spec.to_text(format);
    let written = !(only_if_changed && holds(path, &text)?);
    if written {
        write_checked(path, &text)?;
    }
    let keep: Vec<&Path> = (file.iter().map(|f| f.path.as_path()))
        .chain(previous.as_deref())
        .collect();
    match args_file::remove_others(&absolute, &keep) {
        Ok(removed) => {
            for old in removed {
                tracing::info!(path = %old.display(), "removed the hook's arguments of an older spec");
            }
        }
        Err(e) => {
            tracing::warn!(spec = %path.display(), "older hook argument files not removed: {e}")
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refresh_writes_only_a_spec_that_changed() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("run/cdi/nvidia.yaml");
        assert!(refresh_spec(&spec, "a: 1\n").unwrap(), "made where missing");
        let first = std::fs::metadata(&spec).unwrap();
        assert!(
            !refresh_spec(&spec, "a: 1\n").unwrap(),
            "same text: left be"
        );
        let again = std::fs::metadata(&spec).unwrap();
        assert_eq!(
            (again.ino(), again.mtime_nsec()),
            (first.ino(), first.mtime_nsec())
        );
        assert!(refresh_spec(&spec, "a: 2\n").unwrap());
        assert_ne!(
            std::fs::metadata(&spec).unwrap().ino(),
            first.ino(),
            "replaced by a rename"
        );
        assert_eq!(std::fs::read_to_string(&spec).unwrap(), "a: 2\n");
        assert_eq!(
            std::fs::read_dir(spec.parent().unwrap()).unwrap().count(),
            1
        );
    }

    #[test]
    fn extra_specs_are_written_beside_and_retired_when_gone() {
        use crate::delivery::cdi_spec::{ContainerEdits, Device, DeviceNode};
        let dir = tempfile::tempdir().unwrap();
        let gpu = dir.path().join("nvidia.yaml");
        let spec = CdiSpec {
            cdi_version: "0.5.0".into(),
            kind: "nvidia.com/gds".into(),
            devices: vec![Device {
                name: "all".into(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: "/dev/nvidia-fs0".into(),
                        host_path: None,
                        kind: None,
                        major: None,
                        minor: None,
                        file_mode: None,
                        permissions: None,
                    }],
                    ..ContainerEdits::default()
                },
            }],
            container_edits: ContainerEdits::default(),
        };
        let gds = dir.path().join("nvidia-gds.yaml");
        let specs = [("gds", spec)];
        assert_eq!(
            write_imex_and_family_specs(&gpu, &specs, Format::Yaml).unwrap(),
            [SpecOutcome::Written(gds.clone())]
        );
        assert_eq!(
            write_imex_and_family_specs(&gpu, &specs, Format::Yaml).unwrap(),
            [SpecOutcome::Unchanged(gds.clone())]
        );
        assert!(read_spec(&gds).is_ok());
        std::fs::write(dir.path().join("other.yaml"), "x").unwrap();
        assert_eq!(
            write_imex_and_family_specs(&gpu, &[], Format::Yaml).unwrap(),
            [SpecOutcome::Removed(gds.clone())]
        );
        assert!(!gds.exists() && dir.path().join("other.yaml").exists());
    }

    const SPEC: &str = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n";

    /// `list_in`'s result, its stdout and its stderr.
    fn listed(files: &[PathBuf], dirs: &[&Path]) -> (Result<(), ListError>, String, String) {
        let (mut out, mut warn) = (Vec::new(), Vec::new());
        let result = list_in(files, dirs, &mut out, &mut warn);
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (result, text(out), text(warn))
    }

    #[test]
    fn listing_no_spec_is_an_error_that_says_where_and_how_to_make_one() {
        let dir = tempfile::tempdir().unwrap();
        let (etc, run) = (dir.path().join("etc/cdi"), dir.path().join("run/cdi"));
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(etc.join("notes.txt"), "not read by engines").unwrap();
        let (result, out, warn) = listed(&[], &[&etc, &run]);
        assert_eq!(
            result.unwrap_err().to_string(),
            format!(
                "no CDI spec in {} or {}: write one with nvhook cdi generate --output /etc/cdi/nvidia.yaml, or nvhook cdi refresh (it writes /var/run/cdi/nvidia.yaml)",
                etc.display(),
                run.display()
            )
        );
        assert_eq!((out.as_str(), warn.as_str()), ("", ""));

        // Only specs nvhook cannot read: each a warning, and still no success.
        let bad = etc.join("broken.yaml");
        std::fs::write(&bad, "just some text\n").unwrap();
        let (result, out, warn) = listed(&[], &[&etc, &run]);
        let not_a_spec = format!(
            "cannot parse CDI spec {}: not a CDI spec: the file holds text, where a spec is a mapping of cdiVersion, kind and devices",
            bad.display()
        );
        assert_eq!(warn, format!("nvhook: warning: {not_a_spec}\n"));
        assert_eq!(
            result.unwrap_err().to_string(),
            format!(
                "none of the 1 CDI specs in {} or {} can be read (each is named above): fix or remove them, and remake nvhook's with nvhook cdi refresh",
                etc.display(),
                run.display()
            )
        );
        assert_eq!(out, "");

        // A readable one beside it is listed, the other warned about.
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("nvidia.yaml"), SPEC).unwrap();
        let (result, out, warn) = listed(&[], &[&etc, &run]);
        assert!(result.is_ok());
        assert_eq!(out, "nvidia.com/gpu=0\n");
        assert_eq!(warn, format!("nvhook: warning: {not_a_spec}\n"));

        // Named files: listed, or the first that is no spec is the error, in one short line.
        let good = run.join("nvidia.yaml");
        let (result, out, _) = listed(std::slice::from_ref(&good), &[]);
        assert!(result.is_ok());
        assert_eq!(out, "nvidia.com/gpu=0\n");
        let (result, _, _) = listed(&[good, bad], &[]);
        assert_eq!(result.unwrap_err().to_string(), not_a_spec);
    }

    #[test]
    fn a_file_that_is_no_spec_is_named_in_one_short_line_never_quoted_whole() {
        let dir = tempfile::tempdir().unwrap();
        let long = "x".repeat(5000);
        for (name, text, want) in [
            (
                "passwd.json",
                format!("root:x:0:0:root:/root:/bin/bash\n{long}:x:1:1::/:/bin/sh\n"),
                "not a CDI spec: the file holds text, where a spec is a mapping of cdiVersion, kind and devices".to_string(),
            ),
            (
                "list.yaml",
                format!("- {long}\n- b\n"),
                "not a CDI spec: the file holds a list, where a spec is a mapping of cdiVersion, kind and devices".to_string(),
            ),
            (
                "empty.yaml",
                String::new(),
                "not a CDI spec: the file holds nothing, where a spec is a mapping of cdiVersion, kind and devices".to_string(),
            ),
            (
                "devices.yaml",
                format!("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices: \"{long}\"\n"),
                format!(
                    "devices: invalid type: string \"{}…\" (5000 bytes), expected a sequence at line 3 column 10",
                    "x".repeat(64)
                ),
            ),
            (
                "kind.yaml",
                SPEC.replace("nvidia.com/gpu", &long),
                format!("kind \"{}…\" (5000 bytes) is not vendor/class", "x".repeat(64)),
            ),
        ] {
            let file = dir.path().join(name);
            std::fs::write(&file, &text).unwrap();
            let e = read_spec(&file).unwrap_err().to_string();
            let op = if name == "kind.yaml" { "use" } else { "parse" };
            assert_eq!(e, format!("cannot {op} CDI spec {}: {want}", file.display()), "{name}");
            assert!(e.len() < 400 && !e.contains('\n'), "{name}: {e}");
        }
    }

    #[test]
    fn specs_are_written_only_where_engines_read_them() {
        let dir = tempfile::tempdir().unwrap();
        let yml = dir.path().join("nvidia.yml");
        let e = write_spec(&yml, "x").unwrap_err().to_string();
        assert!(e.contains("*.yaml") && e.contains("nvidia.yml"), "{e}");
        for name in ["b.yaml", "a.json"] {
            write_spec(&dir.path().join(name), "x").unwrap();
        }
        std::fs::write(dir.path().join("c.txt"), "x").unwrap();
        assert_eq!(
            spec_files(&[dir.path(), &dir.path().join("absent")]),
            [dir.path().join("a.json"), dir.path().join("b.yaml")]
        );
    }
}
