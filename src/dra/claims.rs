//! Preparing a ResourceClaim on this node: the devices its allocation gives from this node's
//! pool, a CDI spec for exactly those (transient, one per claim, under NVIDIA's driver's file
//! name), and the checkpoint that remembers them; unpreparing removes exactly that.

use super::checkpoint::{Checkpoint, CheckpointError, PreparedClaim, PreparedDevice};
use super::devices::{DeviceKind, DraDevice, devices};
use super::{CDI_CLASS, CDI_VENDOR, DRIVER_NAME};
use crate::cdi::{self, CdiError};
use crate::config::Config;
use crate::delivery::cdi_spec::Format;
use crate::inventory::Inventory;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One result of a claim's allocation, as the scheduler wrote it in the claim's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// A claim as the API server has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// None while the claim is not allocated.
    pub allocation: Option<Vec<Allocated>>,
}

impl ClaimView {
    fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Why a claim cannot be prepared here, in the line the kubelet shows in the pod's events.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(
        "claim {claim} is not allocated: the scheduler has not placed it, or its allocation was removed"
    )]
    NotAllocated { claim: String },
    #[error("claim {claim} is allocated no device of {DRIVER_NAME}")]
    NothingOfOurs { claim: String },
    #[error(
        "claim {claim} is allocated {device} of pool {pool}, not of this node ({node}): the kubelet of {pool} prepares it"
    )]
    OtherNode {
        claim: String,
        device: String,
        pool: String,
        node: String,
    },
    #[error(
        "claim {claim} is allocated {device}, which this node does not have (it offers: {offered}): the node's ResourceSlice is stale or the GPU is gone; delete the pod so that the claim is allocated again"
    )]
    NoSuchDevice {
        claim: String,
        device: String,
        offered: String,
    },
    #[error(
        "claim {claim} is allocated {device}, which claim {holder} (uid {holder_uid}) prepared here holds: the device is given to one claim at a time"
    )]
    Taken {
        claim: String,
        device: String,
        holder: String,
        holder_uid: String,
    },
    #[error(transparent)]
    Spec(#[from] CdiError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("cannot remove the CDI spec {}: {source}", path.display())]
    RemoveSpec {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Which of this node's devices `claim` is allocated: every result of this driver must name
/// a device of this node's pool that no other prepared claim holds.
pub fn select<'a>(
    claim: &ClaimView,
    node: &str,
    offered: &'a [DraDevice],
    checkpoint: &Checkpoint,
) -> Result<Vec<(Allocated, &'a DraDevice)>, ClaimError> {
    let Some(results) = &claim.allocation else {
        return Err(ClaimError::NotAllocated { claim: claim.id() });
    };
    let mut selected = Vec::new();
    for result in results.iter().filter(|r| r.driver == DRIVER_NAME) {
        if result.pool != node {
            return Err(ClaimError::OtherNode {
                claim: claim.id(),
                device: result.device.clone(),
                pool: result.pool.clone(),
                node: node.to_string(),
            });
        }
        let Some(device) = offered.iter().find(|d| d.name == result.device) else {
            let names: Vec<&str> = offered.iter().map(|d| d.name.as_str()).collect();
            return Err(ClaimError::NoSuchDevice {
                claim: claim.id(),
                device: result.device.clone(),
                offered: if names.is_empty() {
                    "no device".into()
                } else {
                    names.join(", ")
                },
            });
        };
        if let Some((holder_uid, holder)) = checkpoint.holder(&device.name, &claim.uid) {
            return Err(ClaimError::Taken {
                claim: claim.id(),
                device: device.name.clone(),
                holder: format!("{}/{}", holder.namespace, holder.name),
                holder_uid: holder_uid.to_string(),
            });
        }
        selected.push((result.clone(), device));
    }
    if selected.is_empty() {
        return Err(ClaimError::NothingOfOurs { claim: claim.id() });
    }
    Ok(selected)
}

/// The CDI id of `device` in the spec of the claim `uid`.
pub fn cdi_id(uid: &str, device: &str) -> String {
    format!("{CDI_VENDOR}/{CDI_CLASS}={uid}-{device}")
}

/// Prepares and unprepares claims for one node; one call at a time, as the checkpoint is
/// read, changed and written whole.
pub struct Claims {
    pub config: Config,
    pub config_path: Option<PathBuf>,
    /// The node's name: its pool's.
    pub node: String,
    /// Where the per-claim specs go (the engine's CDI spec directory).
    pub cdi_root: PathBuf,
    pub checkpoint: PathBuf,
    one_at_a_time: Mutex<()>,
}

impl Claims {
    pub fn new(
        config: Config,
        config_path: Option<PathBuf>,
        node: &str,
        cdi_root: &Path,
        plugin_dir: &Path,
    ) -> Claims {
        Claims {
            config,
            config_path,
            node: node.to_string(),
            cdi_root: cdi_root.to_path_buf(),
            checkpoint: plugin_dir.join(super::checkpoint::FILE_NAME),
            one_at_a_time: Mutex::new(()),
        }
    }

    /// `<cdi root>/k8s.gpu.nvidia.com-claim_<uid>.yaml`, the name NVIDIA's driver gives.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_root
            .join(format!("{CDI_VENDOR}-{CDI_CLASS}_{uid}.yaml"))
    }

    /// Prepares `claim` on this node's `inventory`; preparing it again gives the same devices.
    /// The checkpoint is written before the spec: a crash in between leaves a claim the
    /// kubelet prepares again or unprepares, never a spec the plugin does not know.
    pub fn prepare(
        &self,
        claim: &ClaimView,
        inventory: &Inventory,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        let _one = self.one_at_a_time.lock().unwrap_or_else(|e| e.into_inner());
        let mut checkpoint = Checkpoint::load(&self.checkpoint)?;
        let offered = devices(inventory);
        let selected = select(claim, &self.node, &offered, &checkpoint)?;
        let prepared = PreparedClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices: selected
                .iter()
                .map(|(result, device)| PreparedDevice {
                    request: result.request.clone(),
                    pool: result.pool.clone(),
                    device: device.name.clone(),
                    cdi_id: cdi_id(&claim.uid, &device.name),
                })
                .collect(),
        };
        if checkpoint.claims.get(&claim.uid) != Some(&prepared) {
            checkpoint
                .claims
                .insert(claim.uid.clone(), prepared.clone());
            checkpoint.save(&self.checkpoint)?;
        }
        let (mut gpus, mut channels) = (Vec::new(), Vec::new());
        for (_, device) in &selected {
            let in_spec = format!("{}-{}", claim.uid, device.name);
            match &device.kind {
                DeviceKind::Gpu(id) => gpus.push((in_spec, id.clone())),
                DeviceKind::ImexChannel(channel) => channels.push((in_spec, *channel)),
            }
        }
        let kind = format!("{CDI_VENDOR}/{CDI_CLASS}");
        let spec = cdi::generate::claim_spec(
            &self.config,
            self.config_path.as_deref(),
            inventory,
            &kind,
            &gpus,
            &channels,
        )?;
        cdi::refresh_spec(&self.spec_path(&claim.uid), &spec.to_text(Format::Yaml))?;
        tracing::info!(claim = %claim.id(), uid = %claim.uid, devices = ?prepared.devices.iter().map(|d| &d.device).collect::<Vec<_>>(), "DRA: claim prepared");
        Ok(prepared.devices)
    }

    /// Removes the spec of claim `uid`, then forgets the claim; a claim never prepared here
    /// (or already unprepared) is unprepared already.
    pub fn unprepare(&self, uid: &str) -> Result<(), ClaimError> {
        let _one = self.one_at_a_time.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.spec_path(uid);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(ClaimError::RemoveSpec { path, source }),
        }
        let mut checkpoint = Checkpoint::load(&self.checkpoint)?;
        if let Some(claim) = checkpoint.claims.remove(uid) {
            checkpoint.save(&self.checkpoint)?;
            tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), uid, "DRA: claim unprepared");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::DeviceId;

    fn offered() -> Vec<DraDevice> {
        (0..2)
            .map(|i| DraDevice {
                name: format!("gpu-{i}"),
                kind: DeviceKind::Gpu(DeviceId::Index(i)),
            })
            .collect()
    }

    fn claim(uid: &str, results: &[(&str, &str, &str)]) -> ClaimView {
        ClaimView {
            namespace: "ml".into(),
            name: format!("claim-{uid}"),
            uid: uid.into(),
            allocation: Some(
                results
                    .iter()
                    .map(|(driver, pool, device)| Allocated {
                        request: "gpu".into(),
                        driver: driver.to_string(),
                        pool: pool.to_string(),
                        device: device.to_string(),
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn a_claim_gets_this_nodes_devices_of_this_driver() {
        let offered = offered();
        let c = claim(
            "u1",
            &[
                ("gpu.nvidia.com", "node-a", "gpu-1"),
                ("nic.example.com", "node-a", "nic-0"),
            ],
        );
        let selected = select(&c, "node-a", &offered, &Checkpoint::default()).unwrap();
        assert_eq!(selected.len(), 1);
        assert_eq!(selected[0].1.name, "gpu-1");
        assert_eq!(cdi_id("u1", "gpu-1"), "k8s.gpu.nvidia.com/claim=u1-gpu-1");
    }

    #[test]
    fn a_claim_not_placed_here_or_naming_what_this_node_lacks_is_refused_in_one_line() {
        let offered = offered();
        let none = Checkpoint::default();
        let cases = [
            (
                ClaimView {
                    allocation: None,
                    ..claim("u1", &[])
                },
                "claim ml/claim-u1 is not allocated",
            ),
            (
                claim("u2", &[("gpu.nvidia.com", "node-b", "gpu-0")]),
                "of pool node-b, not of this node (node-a)",
            ),
            (
                claim("u3", &[("gpu.nvidia.com", "node-a", "gpu-7")]),
                "gpu-7, which this node does not have (it offers: gpu-0, gpu-1)",
            ),
            (
                claim("u4", &[("nic.example.com", "node-a", "nic-0")]),
                "is allocated no device of gpu.nvidia.com",
            ),
        ];
        for (c, needle) in cases {
            let line = select(&c, "node-a", &offered, &none)
                .unwrap_err()
                .to_string();
            assert!(line.contains(needle) && !line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn a_device_a_prepared_claim_holds_is_not_given_to_another() {
        let offered = offered();
        let mut checkpoint = Checkpoint::default();
        checkpoint.claims.insert(
            "u1".into(),
            PreparedClaim {
                namespace: "ml".into(),
                name: "first".into(),
                devices: vec![PreparedDevice {
                    request: "gpu".into(),
                    pool: "node-a".into(),
                    device: "gpu-0".into(),
                    cdi_id: cdi_id("u1", "gpu-0"),
                }],
            },
        );
        let second = claim("u2", &[("gpu.nvidia.com", "node-a", "gpu-0")]);
        let line = select(&second, "node-a", &offered, &checkpoint)
            .unwrap_err()
            .to_string();
        assert!(
            line.contains("which claim ml/first (uid u1) prepared here holds"),
            "{line}"
        );
        // The claim that holds it is prepared again as it was.
        let first = claim("u1", &[("gpu.nvidia.com", "node-a", "gpu-0")]);
        assert!(select(&first, "node-a", &offered, &checkpoint).is_ok());
    }

    #[test]
    fn prepare_writes_the_claims_spec_and_checkpoint_and_unprepare_removes_exactly_them() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            driver_root: "/drv".into(),
            dev_root: "/node".into(),
            ..Config::default()
        };
        let claims = Claims::new(
            config,
            None,
            "node-a",
            &dir.path().join("cdi"),
            &dir.path().join("plugin"),
        );
        let inventory = nvhook_model::plan::fixtures::inventory(2, &[]);
        let first = claim("u1", &[("gpu.nvidia.com", "node-a", "gpu-1")]);
        let devices = claims.prepare(&first, &inventory).unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].cdi_id, "k8s.gpu.nvidia.com/claim=u1-gpu-1");
        let path = claims.spec_path("u1");
        assert!(path.ends_with("cdi/k8s.gpu.nvidia.com-claim_u1.yaml"));
        let spec = cdi::read_spec(&path).unwrap();
        assert_eq!(spec.kind, "k8s.gpu.nvidia.com/claim");
        let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["u1-gpu-1"]);
        let nodes: Vec<&str> = spec.devices[0]
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(nodes, ["/dev/nvidia1"]);
        // Prepared again (the kubelet restarted): the same answer, the same spec.
        let before = std::fs::read(&path).unwrap();
        assert_eq!(claims.prepare(&first, &inventory).unwrap(), devices);
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // A second claim for the same GPU is refused while the first holds it.
        let second = claim("u2", &[("gpu.nvidia.com", "node-a", "gpu-1")]);
        assert!(matches!(
            claims.prepare(&second, &inventory),
            Err(ClaimError::Taken { .. })
        ));
        assert!(!claims.spec_path("u2").exists());
        claims.unprepare("u1").unwrap();
        assert!(!path.exists());
        assert_eq!(
            Checkpoint::load(&claims.checkpoint).unwrap(),
            Checkpoint::default()
        );
        claims.unprepare("u1").expect("unprepared already");
        assert!(claims.prepare(&second, &inventory).is_ok());
    }

    #[test]
    fn an_imex_channel_is_given_as_its_node_alone_beside_the_claims_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let claims = Claims::new(
            Config::default(),
            None,
            "node-a",
            &dir.path().join("cdi"),
            &dir.path().join("plugin"),
        );
        let mut inventory = nvhook_model::plan::fixtures::inventory(2, &[]);
        inventory.majors.extra = vec![(500, "nvidia-caps-imex-channels".into())];
        inventory.nodes.push(nvhook_model::plan::fixtures::node(
            "/dev/nvidia-caps-imex-channels/channel3",
            500,
            3,
        ));
        let nodes = |device: &crate::delivery::cdi_spec::Device| -> Vec<String> {
            let edits = &device.container_edits;
            assert!(edits.mounts.is_empty() && edits.hooks.is_empty() && edits.env.is_empty());
            edits.device_nodes.iter().map(|n| n.path.clone()).collect()
        };
        let both = claim(
            "u1",
            &[
                ("gpu.nvidia.com", "node-a", "gpu-0"),
                ("gpu.nvidia.com", "node-a", "channel-3"),
            ],
        );
        let prepared = claims.prepare(&both, &inventory).unwrap();
        let ids: Vec<&str> = prepared.iter().map(|d| d.cdi_id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "k8s.gpu.nvidia.com/claim=u1-gpu-0",
                "k8s.gpu.nvidia.com/claim=u1-channel-3"
            ]
        );
        let spec = cdi::read_spec(&claims.spec_path("u1")).unwrap();
        assert_eq!(spec.devices[1].name, "u1-channel-3");
        assert_eq!(
            nodes(&spec.devices[1]),
            ["/dev/nvidia-caps-imex-channels/channel3"]
        );
        assert!(
            !spec.container_edits.mounts.is_empty(),
            "the GPU's driver files"
        );
        // The channel is the first claim's until it is unprepared.
        let channel_only = claim("u2", &[("gpu.nvidia.com", "node-a", "channel-3")]);
        assert!(matches!(
            claims.prepare(&channel_only, &inventory),
            Err(ClaimError::Taken { .. })
        ));
        claims.unprepare("u1").unwrap();
        claims.prepare(&channel_only, &inventory).unwrap();
        let spec = cdi::read_spec(&claims.spec_path("u2")).unwrap();
        assert_eq!(spec.devices.len(), 1);
        assert_eq!(
            nodes(&spec.devices[0]),
            ["/dev/nvidia-caps-imex-channels/channel3"]
        );
        assert_eq!(spec.container_edits, Default::default(), "no driver file");
    }
}
