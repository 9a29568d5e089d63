//! Preparing a ResourceClaim on this node: the devices its allocation gives from this node's
//! pool, a CDI spec for exactly those (transient, one per claim, under NVIDIA's driver's file
//! name), and the checkpoint that remembers them; unpreparing removes exactly that.

use super::checkpoint::{Checkpoint, CheckpointError, PreparedClaim, PreparedDevice};
use super::devices::{DeviceKind, DraDevice, Mig, offered};
use super::names::mig_name;
use super::partitions::Partition;
use super::{CDI_CLASS, CDI_VENDOR, DRIVER_NAME};
use crate::cdi::{self, CdiError};
use crate::config::Config;
use crate::delivery::args_file;
use crate::delivery::cdi_spec::Format;
use crate::inventory::{Gpu, Inventory};
use crate::request::DeviceId;
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
    #[error("cannot make MIG device {device} for claim {claim}: {source}")]
    MakeMig {
        claim: String,
        device: String,
        #[source]
        source: NodeError,
    },
    #[error(
        "claim {claim}: the MIG device {device} was made, yet NVML does not list it (is another tool managing MIG on this GPU?)"
    )]
    MigNotThere { claim: String, device: String },
    #[error(
        "cannot destroy MIG device {uuid} made for claim {claim}: {source} (the kubelet's next unprepare tries again)"
    )]
    DestroyMig {
        claim: String,
        uuid: String,
        #[source]
        source: NodeError,
    },
    #[error("GPU {index} is no longer on this node")]
    GpuGone { index: u32 },
    #[error("the node's devices are not known: {0}")]
    Node(#[source] NodeError),
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
pub fn select(
    claim: &ClaimView,
    node: &str,
    offered: &[DraDevice],
    checkpoint: &Checkpoint,
) -> Result<Vec<(Allocated, DraDevice)>, ClaimError> {
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
        selected.push((result.clone(), device.clone()));
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
    /// GPUs in MIG mode offered as partitionable devices ([`super::partitions`]).
    pub dynamic_mig: bool,
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
            dynamic_mig: false,
            one_at_a_time: Mutex::new(()),
        }
    }

    /// `<cdi root>/k8s.gpu.nvidia.com-claim_<uid>.yaml`, the name NVIDIA's driver gives.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_root
            .join(format!("{CDI_VENDOR}-{CDI_CLASS}_{uid}.yaml"))
    }

    /// The devices this node offers now, as the claims it holds leave them.
    pub fn offered(&self, inventory: &Inventory) -> Result<Vec<DraDevice>, ClaimError> {
        let _one = self.one_at_a_time.lock().unwrap_or_else(|e| e.into_inner());
        Ok(self.offered_with(inventory, &Checkpoint::load(&self.checkpoint)?))
    }

    fn offered_with(&self, inventory: &Inventory, checkpoint: &Checkpoint) -> Vec<DraDevice> {
        match self.dynamic_mig {
            false => offered(inventory, Mig::Static),
            true => offered(
                inventory,
                Mig::Partitionable {
                    made_here: &checkpoint.made_here(),
                },
            ),
        }
    }

    /// Prepares `claim` on `node`; preparing it again gives the same devices. The checkpoint is
    /// written before anything is made: a crash after it leaves a claim the kubelet prepares
    /// again or unprepares, never a spec or a MIG device the plugin does not know. A prepare
    /// that fails leaves the checkpoint as it found it and destroys what it made.
    pub fn prepare(
        &self,
        claim: &ClaimView,
        node: &dyn Node,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        let _one = self.one_at_a_time.lock().unwrap_or_else(|e| e.into_inner());
        let mut checkpoint = Checkpoint::load(&self.checkpoint)?;
        let inventory = node.inventory().map_err(ClaimError::Node)?;
        let offered = self.offered_with(&inventory, &checkpoint);
        let selected = select(claim, &self.node, &offered, &checkpoint)?;
        let before = checkpoint.claims.get(&claim.uid).cloned();
        let made_before = |name: &str| {
            before
                .iter()
                .flat_map(|c| &c.devices)
                .any(|d| d.device == name && d.made_mig)
        };
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
                    made_mig: matches!(device.kind, DeviceKind::MigPartition { made: None, .. })
                        || made_before(&device.name),
                })
                .collect(),
        };
        if before.as_ref() != Some(&prepared) {
            checkpoint
                .claims
                .insert(claim.uid.clone(), prepared.clone());
            checkpoint.save(&self.checkpoint)?;
        }
        let mut made = Vec::new();
        let written = self.make_and_write(claim, node, inventory, &selected, &mut made);
        if let Err(e) = written {
            for (device, uuid) in &made {
                if let Err(left) = node.destroy_mig(uuid) {
                    tracing::warn!(claim = %claim.id(), device, uuid, "DRA: a MIG device made for a claim that failed is left: {left}");
                }
            }
            match before {
                Some(before) => checkpoint.claims.insert(claim.uid.clone(), before),
                None => checkpoint.claims.remove(&claim.uid),
            };
            checkpoint.save(&self.checkpoint)?;
            return Err(e);
        }
        tracing::info!(claim = %claim.id(), uid = %claim.uid, devices = ?prepared.devices.iter().map(|d| &d.device).collect::<Vec<_>>(), "DRA: claim prepared");
        Ok(prepared.devices)
    }

    /// Makes the MIG devices the claim's partitions lack (each one made is pushed on `made`,
    /// by device name and UUID), then writes the claim's spec.
    fn make_and_write(
        &self,
        claim: &ClaimView,
        node: &dyn Node,
        mut inventory: Inventory,
        selected: &[(Allocated, DraDevice)],
        made: &mut Vec<(String, String)>,
    ) -> Result<(), ClaimError> {
        for (_, device) in selected {
            if let DeviceKind::MigPartition {
                partition,
                made: None,
            } = &device.kind
            {
                let gpu = gpu_of(&inventory, partition.gpu)?;
                let uuid = node
                    .make_mig(&gpu.uuid, partition.profile_id, partition.placement.start)
                    .map_err(|source| ClaimError::MakeMig {
                        claim: claim.id(),
                        device: device.name.clone(),
                        source,
                    })?;
                made.push((device.name.clone(), uuid));
            }
        }
        if !made.is_empty() {
            inventory = node.inventory().map_err(ClaimError::Node)?;
        }
        let (mut gpus, mut channels) = (Vec::new(), Vec::new());
        for (_, device) in selected {
            let in_spec = format!("{}-{}", claim.uid, device.name);
            match &device.kind {
                DeviceKind::Gpu(id) => gpus.push((in_spec, id.clone())),
                DeviceKind::MigPartition { partition, .. } => {
                    let mig =
                        mig_at(&inventory, partition).ok_or_else(|| ClaimError::MigNotThere {
                            claim: claim.id(),
                            device: device.name.clone(),
                        })?;
                    gpus.push((
                        in_spec,
                        DeviceId::MigIndex {
                            gpu: partition.gpu,
                            mig,
                        },
                    ));
                }
                DeviceKind::ImexChannel(channel) => channels.push((in_spec, *channel)),
            }
        }
        let kind = format!("{CDI_VENDOR}/{CDI_CLASS}");
        let spec = cdi::generate::claim_spec(
            &self.config,
            self.config_path.as_deref(),
            &inventory,
            &kind,
            &gpus,
            &channels,
        )?;
        // Its hook's arguments in a file beside it, as nvhook's own spec's: every pod started
        // through the claim passes its engine and runtime a spec that much smaller.
        cdi::write_gpu_spec(&self.spec_path(&claim.uid), spec, Format::Yaml, true)?;
        Ok(())
    }

    /// Removes the spec of claim `uid` (with its hook's argument files) and destroys the MIG
    /// devices made for it, then forgets the claim; a claim never prepared here (or already
    /// unprepared) is unprepared already.
    /// A MIG device that cannot be destroyed keeps the claim in the checkpoint, so that the
    /// kubelet's next unprepare tries again and no other claim is given its place meanwhile.
    pub fn unprepare(&self, uid: &str, node: &dyn Node) -> Result<(), ClaimError> {
        let _one = self.one_at_a_time.lock().unwrap_or_else(|e| e.into_inner());
        remove_spec(&self.spec_path(uid))?;
        let mut checkpoint = Checkpoint::load(&self.checkpoint)?;
        let Some(claim) = checkpoint.claims.get(uid) else {
            return Ok(());
        };
        let id = format!("{}/{}", claim.namespace, claim.name);
        let made: Vec<&str> = claim
            .devices
            .iter()
            .filter(|d| d.made_mig)
            .map(|d| d.device.as_str())
            .collect();
        if !made.is_empty() {
            let inventory = node.inventory().map_err(ClaimError::Node)?;
            for gpu in &inventory.gpus {
                for mig in &gpu.mig_devices {
                    if mig_name(gpu, mig).is_some_and(|n| made.contains(&n.as_str())) {
                        node.destroy_mig(&mig.uuid)
                            .map_err(|source| ClaimError::DestroyMig {
                                claim: id.clone(),
                                uuid: mig.uuid.clone(),
                                source,
                            })?;
                    }
                }
            }
        }
        checkpoint.claims.remove(uid);
        checkpoint.save(&self.checkpoint)?;
        tracing::info!(claim = %id, uid, "DRA: claim unprepared");
        Ok(())
    }
}

/// Removes the spec at `path` and its hook's argument files; what is gone already is removed.
fn remove_spec(path: &Path) -> Result<(), ClaimError> {
    let removed = |result: std::io::Result<()>| match result {
        Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
            Err(ClaimError::RemoveSpec {
                path: path.to_path_buf(),
                source,
            })
        }
        _ => Ok(()),
    };
    removed(std::fs::remove_file(path))?;
    removed(args_file::remove_others(path, &[]).map(drop))
}

/// The GPU of NVML index `index`.
fn gpu_of(inventory: &Inventory, index: u32) -> Result<&Gpu, ClaimError> {
    inventory
        .gpus
        .iter()
        .find(|g| g.index == index)
        .ok_or(ClaimError::GpuGone { index })
}

/// The MIG index of the MIG device at `partition`, if there is one.
fn mig_at(inventory: &Inventory, partition: &Partition) -> Option<u32> {
    let gpu = inventory.gpus.iter().find(|g| g.index == partition.gpu)?;
    gpu.mig_devices
        .iter()
        .find(|m| {
            m.gpu_instance_profile_id == Some(partition.profile_id)
                && m.placement == Some(partition.placement)
        })
        .map(|m| m.index)
}

/// The node under the claims: its devices as they are now, and the MIG devices made and
/// destroyed on it (through NVML on a real node).
pub trait Node {
    /// The node's devices now: after [`Node::make_mig`] or [`Node::destroy_mig`], with what
    /// they did.
    fn inventory(&self) -> Result<Inventory, NodeError>;
    /// Makes a MIG device of GPU instance profile `profile_id` at memory slice `start` of the
    /// GPU `gpu_uuid`; answers its UUID.
    fn make_mig(&self, gpu_uuid: &str, profile_id: u32, start: u32) -> Result<String, NodeError>;
    fn destroy_mig(&self, mig_uuid: &str) -> Result<(), NodeError>;
}

pub type NodeError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// The device nodes a spec's device gives.
    fn node_paths(device: &crate::delivery::cdi_spec::Device) -> Vec<String> {
        let edits = &device.container_edits;
        edits.device_nodes.iter().map(|n| n.path.clone()).collect()
    }

    /// A node whose MIG devices are made and destroyed in memory, as NVML makes them.
    struct FakeNode {
        inventory: RefCell<Inventory>,
        /// Every MIG device made and destroyed, in order.
        log: RefCell<Vec<String>>,
    }

    impl FakeNode {
        fn new(inventory: Inventory) -> FakeNode {
            FakeNode {
                inventory: RefCell::new(inventory),
                log: RefCell::new(Vec::new()),
            }
        }
    }

    impl Node for FakeNode {
        fn inventory(&self) -> Result<Inventory, NodeError> {
            Ok(self.inventory.borrow().clone())
        }

        fn make_mig(
            &self,
            gpu_uuid: &str,
            profile_id: u32,
            start: u32,
        ) -> Result<String, NodeError> {
            let mut inventory = self.inventory.borrow_mut();
            let gpu = inventory
                .gpus
                .iter_mut()
                .find(|g| g.uuid == gpu_uuid)
                .ok_or("Not Found")?;
            let profile = gpu
                .mig_profiles
                .iter()
                .find(|p| p.id == profile_id)
                .ok_or("Invalid Argument")?;
            let placement = *profile
                .placements
                .iter()
                .find(|p| p.start == start)
                .ok_or("Invalid Argument")?;
            let overlap = gpu.mig_devices.iter().any(|m| {
                m.placement.is_some_and(|p| {
                    p.start < placement.start + placement.size && placement.start < p.start + p.size
                })
            });
            if overlap {
                return Err("Insufficient Resources".into());
            }
            let index = gpu
                .mig_devices
                .iter()
                .map(|m| m.index + 1)
                .max()
                .unwrap_or(0);
            let uuid = format!("MIG-made-{}-{profile_id}-{start}", gpu.index);
            let mut mig = gpu.mig_devices.first().cloned().unwrap_or_else(|| {
                nvhook_model::plan::fixtures::inventory(1, &[(0, 1)]).gpus[0].mig_devices[0].clone()
            });
            let (gi, ci) = nvhook_model::plan::fixtures::cap_minors(gpu.index, index);
            mig.index = index;
            mig.uuid = uuid.clone();
            mig.gpu_instance_id = index + 1;
            mig.gi_cap_minor = Some(gi);
            mig.ci_cap_minor = Some(ci);
            mig.profile = Some(profile.name.clone());
            mig.gpu_instance_profile_id = Some(profile_id);
            mig.placement = Some(placement);
            gpu.mig_devices.push(mig);
            let caps = inventory
                .nodes
                .iter()
                .find(|n| n.path.starts_with("/dev/nvidia-caps/"))
                .map(|n| n.major)
                .ok_or("no nvidia-caps")?;
            for minor in [gi, ci] {
                let path = format!("/dev/nvidia-caps/nvidia-cap{minor}");
                inventory
                    .nodes
                    .push(nvhook_model::plan::fixtures::node(&path, caps, minor));
            }
            self.log.borrow_mut().push(format!("make {uuid}"));
            Ok(uuid)
        }

        fn destroy_mig(&self, mig_uuid: &str) -> Result<(), NodeError> {
            let mut inventory = self.inventory.borrow_mut();
            for gpu in &mut inventory.gpus {
                gpu.mig_devices.retain(|m| m.uuid != mig_uuid);
            }
            self.log.borrow_mut().push(format!("destroy {mig_uuid}"));
            Ok(())
        }
    }

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
                    made_mig: false,
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
        let node = FakeNode::new(nvhook_model::plan::fixtures::inventory(2, &[]));
        let first = claim("u1", &[("gpu.nvidia.com", "node-a", "gpu-1")]);
        let devices = claims.prepare(&first, &node).unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].cdi_id, "k8s.gpu.nvidia.com/claim=u1-gpu-1");
        let path = claims.spec_path("u1");
        assert!(path.ends_with("cdi/k8s.gpu.nvidia.com-claim_u1.yaml"));
        let spec = cdi::read_spec(&path).unwrap();
        assert_eq!(spec.kind, "k8s.gpu.nvidia.com/claim");
        let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["u1-gpu-1"]);
        assert_eq!(node_paths(&spec.devices[0]), ["/dev/nvidia1"]);
        // Prepared again (the kubelet restarted): the same answer, the same spec.
        let before = std::fs::read(&path).unwrap();
        assert_eq!(claims.prepare(&first, &node).unwrap(), devices);
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // A second claim for the same GPU is refused while the first holds it.
        let second = claim("u2", &[("gpu.nvidia.com", "node-a", "gpu-1")]);
        assert!(matches!(
            claims.prepare(&second, &node),
            Err(ClaimError::Taken { .. })
        ));
        assert!(!claims.spec_path("u2").exists());
        // The hook's arguments are in a file beside the spec, which goes with it.
        let hook_args = &spec.container_edits.hooks[0].args;
        let at = hook_args.iter().position(|a| a == args_file::FLAG).unwrap();
        let args_path = PathBuf::from(&hook_args[at + 1]);
        assert_eq!(args_path.parent(), path.parent());
        assert!(args_file::inline(hook_args).unwrap().len() > hook_args.len());
        claims.unprepare("u1", &node).unwrap();
        assert!(!path.exists());
        assert!(
            !args_path.exists(),
            "the hook's argument file outlived its spec"
        );
        assert_eq!(
            Checkpoint::load(&claims.checkpoint).unwrap(),
            Checkpoint::default()
        );
        claims.unprepare("u1", &node).expect("unprepared already");
        assert!(claims.prepare(&second, &node).is_ok());
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
        let node = FakeNode::new(inventory);
        let nodes = |device: &crate::delivery::cdi_spec::Device| -> Vec<String> {
            let edits = &device.container_edits;
            assert!(edits.mounts.is_empty() && edits.hooks.is_empty() && edits.env.is_empty());
            node_paths(device)
        };
        let both = claim(
            "u1",
            &[
                ("gpu.nvidia.com", "node-a", "gpu-0"),
                ("gpu.nvidia.com", "node-a", "channel-3"),
            ],
        );
        let prepared = claims.prepare(&both, &node).unwrap();
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
            args_file::inline(&spec.container_edits.hooks[0].args)
                .unwrap()
                .contains(&"--bind-files".to_string())
                && spec.container_edits.mounts.is_empty(),
            "the GPU's driver files, for the hook to mount"
        );
        // The channel is the first claim's until it is unprepared.
        let channel_only = claim("u2", &[("gpu.nvidia.com", "node-a", "channel-3")]);
        assert!(matches!(
            claims.prepare(&channel_only, &node),
            Err(ClaimError::Taken { .. })
        ));
        claims.unprepare("u1", &node).unwrap();
        claims.prepare(&channel_only, &node).unwrap();
        let spec = cdi::read_spec(&claims.spec_path("u2")).unwrap();
        assert_eq!(spec.devices.len(), 1);
        assert_eq!(
            nodes(&spec.devices[0]),
            ["/dev/nvidia-caps-imex-channels/channel3"]
        );
        assert_eq!(spec.container_edits, Default::default(), "no driver file");
    }

    /// Claims on a node whose GPU 1 is in MIG mode with no MIG device, offered as partitions.
    fn partitioned(dir: &Path) -> (Claims, FakeNode) {
        let mut claims = Claims::new(
            Config::default(),
            None,
            "node-a",
            &dir.join("cdi"),
            &dir.join("plugin"),
        );
        claims.dynamic_mig = true;
        let mut inventory = nvhook_model::plan::fixtures::inventory(2, &[]);
        inventory.gpus[1].mig_enabled = true;
        inventory.gpus[1].mig_profiles = nvhook_model::plan::fixtures::mig_profiles();
        (claims, FakeNode::new(inventory))
    }

    #[test]
    fn a_partition_is_made_at_prepare_and_destroyed_at_unprepare() {
        let dir = tempfile::tempdir().unwrap();
        let (claims, node) = partitioned(dir.path());
        let offered = claims.offered(&node.inventory().unwrap()).unwrap();
        assert_eq!(offered.len(), 1 + 10, "gpu-0 and GPU 1's ten places");
        let three = claim(
            "u1",
            &[("gpu.nvidia.com", "node-a", "gpu-1-mig-3g40gb-9-4")],
        );
        let prepared = claims.prepare(&three, &node).unwrap();
        assert_eq!(
            prepared[0].cdi_id,
            "k8s.gpu.nvidia.com/claim=u1-gpu-1-mig-3g40gb-9-4"
        );
        assert!(prepared[0].made_mig);
        assert_eq!(*node.log.borrow(), ["make MIG-made-1-9-4"]);
        let spec = cdi::read_spec(&claims.spec_path("u1")).unwrap();
        let made = &node.inventory().unwrap().gpus[1].mig_devices[0];
        let caps: Vec<String> = [made.gi_cap_minor, made.ci_cap_minor]
            .map(|m| format!("/dev/nvidia-caps/nvidia-cap{}", m.unwrap()))
            .to_vec();
        assert_eq!(
            node_paths(&spec.devices[0]),
            ["/dev/nvidia1", &caps[0], &caps[1]]
        );
        // The same place stays offered, now made; preparing the claim again makes nothing.
        let offered = claims.offered(&node.inventory().unwrap()).unwrap();
        assert_eq!(offered.len(), 11);
        assert_eq!(claims.prepare(&three, &node).unwrap(), prepared);
        assert_eq!(node.log.borrow().len(), 1);

        // A place over it (which the scheduler's counters would not give) fails to be made:
        // one line, and neither checkpoint nor spec keeps the claim.
        let over = claim(
            "u2",
            &[("gpu.nvidia.com", "node-a", "gpu-1-mig-1g10gb-19-5")],
        );
        let line = claims.prepare(&over, &node).unwrap_err().to_string();
        assert!(
            line.contains("cannot make MIG device gpu-1-mig-1g10gb-19-5 for claim ml/claim-u2: Insufficient Resources"),
            "{line}"
        );
        assert!(
            !Checkpoint::load(&claims.checkpoint)
                .unwrap()
                .claims
                .contains_key("u2")
        );
        assert!(!claims.spec_path("u2").exists());

        claims.unprepare("u1", &node).unwrap();
        assert_eq!(
            *node.log.borrow(),
            ["make MIG-made-1-9-4", "destroy MIG-made-1-9-4"]
        );
        assert!(node.inventory().unwrap().gpus[1].mig_devices.is_empty());
        assert_eq!(
            Checkpoint::load(&claims.checkpoint).unwrap(),
            Checkpoint::default()
        );
    }

    #[test]
    fn a_mig_device_the_plugin_did_not_make_is_given_and_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let (claims, node) = partitioned(dir.path());
        node.make_mig(&node.inventory().unwrap().gpus[1].uuid, 19, 2)
            .unwrap();
        node.log.borrow_mut().clear();
        let names: Vec<String> = claims
            .offered(&node.inventory().unwrap())
            .unwrap()
            .into_iter()
            .map(|d| d.name)
            .collect();
        // Neither the places over the operator's 1g.10gb at slice 2 nor 7g.80gb.
        assert!(
            !names
                .iter()
                .any(|n| n.contains("3g40gb-9-0") || n.contains("7g80gb"))
        );
        assert!(names.contains(&"gpu-1-mig-3g40gb-9-4".to_string()));
        let theirs = claim(
            "u1",
            &[("gpu.nvidia.com", "node-a", "gpu-1-mig-1g10gb-19-2")],
        );
        let prepared = claims.prepare(&theirs, &node).unwrap();
        assert!(!prepared[0].made_mig);
        claims.unprepare("u1", &node).unwrap();
        assert!(node.log.borrow().is_empty(), "{:?}", node.log.borrow());
        assert_eq!(node.inventory().unwrap().gpus[1].mig_devices.len(), 1);
    }
}
