//! Device handles: opaque pointers that encode which GPU or MIG device they name.
//!
//! Each handle points at one byte of a static table owned by this library, so a handle
//! is never null, stays valid across shutdown and re-init (as indices into the topology
//! do), and a pointer that did not come from us is recognised and rejected.

use crate::topology::{MAX_COMPUTE_INSTANCES, MAX_GPU_INSTANCES, MAX_GPUS, MAX_MIG_DEVICES};

/// `nvmlDevice_st`: never dereferenced, only its address matters.
#[repr(C)]
pub struct NvmlDevice {
    _opaque: [u8; 0],
}

/// `nvmlDevice_t`.
pub type DeviceHandle = *mut NvmlDevice;

/// Slot 0 of each GPU's block is the GPU itself, slots 1..=7 its MIG devices.
const SLOTS_PER_GPU: usize = 1 + MAX_MIG_DEVICES;

static ANCHORS: [u8; MAX_GPUS * SLOTS_PER_GPU] = [0; MAX_GPUS * SLOTS_PER_GPU];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handle {
    Gpu(usize),
    Mig { gpu: usize, mig: usize },
}

impl Handle {
    /// The C handle; callers only build handles for indices the topology validated.
    pub fn to_raw(self) -> DeviceHandle {
        let slot = match self {
            Self::Gpu(gpu) => gpu * SLOTS_PER_GPU,
            Self::Mig { gpu, mig } => gpu * SLOTS_PER_GPU + 1 + mig,
        };
        ANCHORS.as_ptr().wrapping_add(slot).cast_mut().cast()
    }

    /// Decodes a handle; `None` for null or anything not produced by `to_raw`.
    pub fn from_raw(raw: DeviceHandle) -> Option<Self> {
        let offset = raw.addr().checked_sub(ANCHORS.as_ptr().addr())?;
        if offset >= ANCHORS.len() {
            return None;
        }
        let (gpu, slot) = (offset / SLOTS_PER_GPU, offset % SLOTS_PER_GPU);
        Some(match slot {
            0 => Self::Gpu(gpu),
            _ => Self::Mig { gpu, mig: slot - 1 },
        })
    }
}

/// `nvmlGpuInstance_st`: never dereferenced, only its address matters.
#[repr(C)]
pub struct NvmlGpuInstance {
    _opaque: [u8; 0],
}

/// `nvmlGpuInstance_t`.
pub type GpuInstanceHandle = *mut NvmlGpuInstance;

/// One slot per GPU instance id of each GPU, apart from the device handles' table so that
/// neither kind of handle passes for the other.
static INSTANCE_ANCHORS: [u8; MAX_GPUS * MAX_GPU_INSTANCES] = [0; MAX_GPUS * MAX_GPU_INSTANCES];

/// GPU instance `id` of GPU `gpu` (its NVML index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceHandle {
    pub gpu: usize,
    pub id: usize,
}

impl InstanceHandle {
    /// The C handle; callers only build handles for instances the topology has.
    pub fn to_raw(self) -> GpuInstanceHandle {
        let slot = self.gpu * MAX_GPU_INSTANCES + self.id;
        INSTANCE_ANCHORS
            .as_ptr()
            .wrapping_add(slot)
            .cast_mut()
            .cast()
    }

    /// Decodes a handle; `None` for null or anything not produced by `to_raw`.
    pub fn from_raw(raw: GpuInstanceHandle) -> Option<Self> {
        let offset = raw.addr().checked_sub(INSTANCE_ANCHORS.as_ptr().addr())?;
        if offset >= INSTANCE_ANCHORS.len() {
            return None;
        }
        Some(Self {
            gpu: offset / MAX_GPU_INSTANCES,
            id: offset % MAX_GPU_INSTANCES,
        })
    }
}

/// `nvmlComputeInstance_st`: never dereferenced, only its address matters.
#[repr(C)]
pub struct NvmlComputeInstance {
    _opaque: [u8; 0],
}

/// `nvmlComputeInstance_t`.
pub type ComputeInstanceHandle = *mut NvmlComputeInstance;

const CI_SLOTS: usize = MAX_GPUS * MAX_GPU_INSTANCES * MAX_COMPUTE_INSTANCES;

/// One slot per compute instance id of each GPU instance, apart from the other tables.
static COMPUTE_ANCHORS: [u8; CI_SLOTS] = [0; CI_SLOTS];

/// Compute instance `ci` of GPU instance `gi` of GPU `gpu` (its NVML index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ComputeHandle {
    pub gpu: usize,
    pub gi: usize,
    pub ci: usize,
}

impl ComputeHandle {
    /// The C handle; callers only build handles for instances the topology has.
    pub fn to_raw(self) -> ComputeInstanceHandle {
        let slot = (self.gpu * MAX_GPU_INSTANCES + self.gi) * MAX_COMPUTE_INSTANCES + self.ci;
        COMPUTE_ANCHORS
            .as_ptr()
            .wrapping_add(slot)
            .cast_mut()
            .cast()
    }

    /// Decodes a handle; `None` for null or anything not produced by `to_raw`.
    pub fn from_raw(raw: ComputeInstanceHandle) -> Option<Self> {
        let offset = raw.addr().checked_sub(COMPUTE_ANCHORS.as_ptr().addr())?;
        if offset >= COMPUTE_ANCHORS.len() {
            return None;
        }
        let (gpu_gi, ci) = (
            offset / MAX_COMPUTE_INSTANCES,
            offset % MAX_COMPUTE_INSTANCES,
        );
        Some(Self {
            gpu: gpu_gi / MAX_GPU_INSTANCES,
            gi: gpu_gi % MAX_GPU_INSTANCES,
            ci,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_handle() {
        for gpu in 0..MAX_GPUS {
            let mut handles = vec![Handle::Gpu(gpu)];
            handles.extend((0..MAX_MIG_DEVICES).map(|mig| Handle::Mig { gpu, mig }));
            for handle in handles {
                assert_eq!(Handle::from_raw(handle.to_raw()), Some(handle));
            }
        }
    }

    #[test]
    fn instance_handles_round_trip_and_are_no_device_handles() {
        let last = InstanceHandle {
            gpu: MAX_GPUS - 1,
            id: MAX_GPU_INSTANCES - 1,
        };
        for handle in [InstanceHandle { gpu: 0, id: 0 }, last] {
            assert_eq!(InstanceHandle::from_raw(handle.to_raw()), Some(handle));
            assert_eq!(Handle::from_raw(handle.to_raw().cast()), None);
        }
        assert_eq!(
            InstanceHandle::from_raw(Handle::Gpu(0).to_raw().cast()),
            None
        );
        assert_eq!(InstanceHandle::from_raw(std::ptr::null_mut()), None);
    }

    #[test]
    fn compute_handles_round_trip_and_are_no_other_handles() {
        let last = ComputeHandle {
            gpu: MAX_GPUS - 1,
            gi: MAX_GPU_INSTANCES - 1,
            ci: MAX_COMPUTE_INSTANCES - 1,
        };
        let some = ComputeHandle {
            gpu: 1,
            gi: 9,
            ci: 2,
        };
        for handle in [
            ComputeHandle {
                gpu: 0,
                gi: 0,
                ci: 0,
            },
            some,
            last,
        ] {
            assert_eq!(ComputeHandle::from_raw(handle.to_raw()), Some(handle));
            assert_eq!(InstanceHandle::from_raw(handle.to_raw().cast()), None);
        }
        assert_eq!(ComputeHandle::from_raw(std::ptr::null_mut()), None);
    }

    #[test]
    fn rejects_foreign_pointers() {
        // Step by bytes: NvmlDevice is zero-sized, so offsetting it would not move.
        let last = Handle::Mig {
            gpu: MAX_GPUS - 1,
            mig: MAX_MIG_DEVICES - 1,
        };
        let past_end = last.to_raw().cast::<u8>().wrapping_add(1).cast();
        let before = Handle::Gpu(0).to_raw().cast::<u8>().wrapping_sub(1).cast();
        for raw in [std::ptr::null_mut(), past_end, before] {
            assert_eq!(Handle::from_raw(raw), None);
        }
    }
}
