//! What the plugin prepared, kept on disk: a plugin restarted between prepare and unprepare
//! still answers for its claims, and never gives a device a prepared claim holds to another.

use crate::atomic_file::{NewFile, write_atomic};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The file's name in the plugin's directory (NVIDIA's driver's name for its own).
pub const FILE_NAME: &str = "checkpoint.json";

/// A device of a prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreparedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub cdi_id: String,
    /// The plugin made the MIG device behind this device for the claim (or was making it when
    /// it stopped), and destroys it when the claim is unprepared.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub made_mig: bool,
}

/// A prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
}

/// The prepared claims by uid.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub claims: BTreeMap<String, PreparedClaim>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read the DRA checkpoint {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the DRA checkpoint {} is not nvhook's: {source} (move it away: the plugin starts a new one, and the kubelet prepares its claims again)", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot write the DRA checkpoint {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Checkpoint {
    /// The checkpoint at `path`; an empty one where there is none yet.
    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoint::default()),
            Err(source) => {
                return Err(CheckpointError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        serde_json::from_str(&text).map_err(|source| CheckpointError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Replaces the file at `path` with this checkpoint, whole (a crash leaves the old one).
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let text = serde_json::to_string_pretty(self).expect("a checkpoint encodes as JSON");
        let durable = NewFile {
            durable: true,
            ..NewFile::mode(0o600)
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(dir)
            .and_then(|()| write_atomic(path, text.as_bytes(), durable))
            .map_err(|source| CheckpointError::Write {
                path: path.to_path_buf(),
                source,
            })
    }

    /// The devices whose MIG device the plugin made for a claim it holds.
    pub fn made_here(&self) -> BTreeSet<String> {
        self.claims
            .values()
            .flat_map(|claim| &claim.devices)
            .filter(|d| d.made_mig)
            .map(|d| d.device.clone())
            .collect()
    }

    /// The prepared claim other than `uid` that holds `device`, if any.
    pub fn holder(&self, device: &str, uid: &str) -> Option<(&str, &PreparedClaim)> {
        self.claims
            .iter()
            .find(|(other, claim)| {
                other.as_str() != uid && claim.devices.iter().any(|d| d.device == device)
            })
            .map(|(uid, claim)| (uid.as_str(), claim))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_round_trips_and_a_foreign_file_is_refused_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert_eq!(Checkpoint::load(&path).unwrap(), Checkpoint::default());
        let mut checkpoint = Checkpoint::default();
        checkpoint.claims.insert(
            "u1".into(),
            PreparedClaim {
                namespace: "ml".into(),
                name: "train".into(),
                devices: vec![PreparedDevice {
                    request: "gpu".into(),
                    pool: "node-a".into(),
                    device: "gpu-0".into(),
                    cdi_id: "k8s.gpu.nvidia.com/claim=u1-gpu-0".into(),
                    made_mig: false,
                }],
            },
        );
        checkpoint.save(&path).unwrap();
        assert_eq!(Checkpoint::load(&path).unwrap(), checkpoint);
        assert_eq!(
            checkpoint.holder("gpu-0", "u2").map(|(uid, _)| uid),
            Some("u1")
        );
        assert_eq!(checkpoint.holder("gpu-0", "u1"), None);
        assert_eq!(checkpoint.holder("gpu-1", "u2"), None);

        std::fs::write(&path, r#"{"v1": {"preparedClaims": {}}}"#).unwrap();
        let e = Checkpoint::load(&path).unwrap_err();
        let line = e.to_string();
        assert!(matches!(e, CheckpointError::Parse { .. }), "{e:?}");
        assert!(
            line.contains("is not nvhook's") && !line.contains('\n'),
            "{line}"
        );
    }
}
