//! The devices this node offers, named as NVIDIA's DRA driver names them.

use crate::inventory::Inventory;
use crate::request::DeviceId;

/// A device of the node's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDevice {
    /// `gpu-<minor>`: the GPU's `/dev/nvidia<minor>`, not its NVML index.
    pub name: String,
    pub id: DeviceId,
    pub uuid: String,
}

/// Every whole GPU of `inventory` that is not split into MIG devices. A GPU in MIG mode is
/// offered through its MIG devices only, as NVIDIA's driver does, and those need the MIG
/// profile's id and placement in their names, which the inventory does not read yet: such a
/// GPU is left out, with a line in the log.
pub fn devices(inventory: &Inventory) -> Vec<DraDevice> {
    let mut out = Vec::new();
    for gpu in &inventory.gpus {
        if gpu.mig_enabled {
            tracing::info!(gpu = gpu.index, "DRA: a GPU in MIG mode is not offered yet");
            continue;
        }
        out.push(DraDevice {
            name: format!("gpu-{}", gpu.minor),
            id: DeviceId::Index(gpu.index),
            uuid: gpu.uuid.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvhook_model::plan::fixtures::inventory;

    #[test]
    fn gpus_are_named_by_their_minor_and_mig_mode_gpus_are_left_out() {
        let mut inv = inventory(3, &[]);
        // Minors need not follow NVML's order.
        inv.gpus[0].minor = 2;
        inv.gpus[2].minor = 0;
        inv.gpus[1].mig_enabled = true;
        let names: Vec<(String, DeviceId)> =
            devices(&inv).into_iter().map(|d| (d.name, d.id)).collect();
        assert_eq!(
            names,
            [
                ("gpu-2".to_string(), DeviceId::Index(0)),
                ("gpu-0".to_string(), DeviceId::Index(2)),
            ]
        );
    }
}
