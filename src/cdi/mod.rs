//! Container Device Interface: nvhook's plans as CDI container edits.
//!
//! containerd ≥ 1.7, CRI-O, Podman and Docker ≥ 25 inject devices from CDI specs
//! (`/etc/cdi`, `/var/run/cdi`) themselves. `nvhook cdi generate` writes such a spec from
//! the same inventory and plans the hook uses, the runtime shim's cdi mode writes the same
//! edits into config.json, and both leave to nvhook only a `createContainer` hook for the
//! links and the loader cache.

pub mod config_json;
pub mod edits;
pub mod extra;
pub mod generate;
pub mod hook;
pub mod nvidia_hooks;
pub mod spec;

pub use edits::{HookBinary, container_edits};
pub use extra::generate_extra;
pub use generate::{KIND, NameStrategy, generate};
pub use spec::{CdiSpec, CdiVersion, ContainerEdits, Format};

use crate::atomic_file::{NewFile, write_atomic};
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
    spec::validate(&spec).map_err(|e| fail("use", e.0))?;
    Ok(spec)
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
    match std::fs::read(path) {
        Ok(current) if current == text.as_bytes() => return Ok(false),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(CdiError::Io {
                op: "read",
                path: path.to_path_buf(),
                source,
            });
        }
    }
    write_spec(path, text)?;
    Ok(true)
}

/// What became of an extra spec's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtraOutcome {
    Written(PathBuf),
    Unchanged(PathBuf),
    /// The host no longer has that class: its old file was removed.
    Removed(PathBuf),
}

/// Puts the extra specs (IMEX channels, device families) beside the GPU spec at `gpu_spec`,
/// each rewritten only when it changed, and removes the file of a class the host no longer
/// has, so that engines never offer devices that are gone.
pub fn write_extra_specs(
    gpu_spec: &Path,
    specs: &[(&str, CdiSpec)],
    format: Format,
) -> Result<Vec<ExtraOutcome>, CdiError> {
    let mut out = Vec::new();
    for class in extra::classes() {
        let path = extra::path_beside(gpu_spec, class);
        match specs.iter().find(|(c, _)| *c == class) {
            Some((_, spec)) => out.push(match refresh_spec(&path, &spec.to_text(format))? {
                true => ExtraOutcome::Written(path),
                false => ExtraOutcome::Unchanged(path),
            }),
            None => match std::fs::remove_file(&path) {
                Ok(()) => out.push(ExtraOutcome::Removed(path)),
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
    write_atomic(path, text.as_bytes(), NewFile::mode(0o644)).map_err(|source| CdiError::Io {
        op: "write",
        path: path.to_path_buf(),
        source,
    })
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
        use crate::cdi::spec::{ContainerEdits, Device, DeviceNode};
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
            write_extra_specs(&gpu, &specs, Format::Yaml).unwrap(),
            [ExtraOutcome::Written(gds.clone())]
        );
        assert_eq!(
            write_extra_specs(&gpu, &specs, Format::Yaml).unwrap(),
            [ExtraOutcome::Unchanged(gds.clone())]
        );
        assert!(read_spec(&gds).is_ok());
        std::fs::write(dir.path().join("other.yaml"), "x").unwrap();
        assert_eq!(
            write_extra_specs(&gpu, &[], Format::Yaml).unwrap(),
            [ExtraOutcome::Removed(gds.clone())]
        );
        assert!(!gds.exists() && dir.path().join("other.yaml").exists());
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
            spec_files(&[dir.path(), Path::new("/nonexistent")]),
            [dir.path().join("a.json"), dir.path().join("b.yaml")]
        );
    }
}
