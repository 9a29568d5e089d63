//! Resolving handles, indices, UUIDs and bus ids to the topology's devices.

use crate::handle::{DeviceHandle, Handle};
use crate::pci::BusId;
use crate::status::{NvmlResult, Status};
use crate::topology::{Gpu, MAX_MIG_DEVICES, MigDevice, Topology};

/// A device a handle names: a physical GPU, or a MIG device together with its parent.
#[derive(Clone, Copy)]
pub enum Device<'a> {
    Gpu {
        index: usize,
        gpu: &'a Gpu,
    },
    Mig {
        parent: usize,
        gpu: &'a Gpu,
        index: usize,
        mig: &'a MigDevice,
    },
}

impl<'a> Device<'a> {
    /// Resolves a handle; `INVALID_ARGUMENT` for null, foreign or stale handles.
    pub fn from_handle(topology: &'a Topology, raw: DeviceHandle) -> NvmlResult<Self> {
        let device = match Handle::from_raw(raw).ok_or(Status::INVALID_ARGUMENT)? {
            Handle::Gpu(index) => gpu(topology, index),
            Handle::Mig {
                gpu: parent,
                mig: index,
            } => gpu(topology, parent).and_then(|device| device.mig(index)),
        };
        device.ok_or(Status::INVALID_ARGUMENT)
    }

    /// `nvmlDeviceGetHandleByIndex_v2`: an index past the count is an invalid argument.
    pub fn by_index(topology: &'a Topology, index: u32) -> NvmlResult<Self> {
        let index = usize::try_from(index).map_err(|_| Status::INVALID_ARGUMENT)?;
        gpu(topology, index).ok_or(Status::INVALID_ARGUMENT)
    }

    /// `nvmlDeviceGetHandleByUUID`: matches GPU and (enabled) MIG device UUIDs.
    pub fn by_uuid(topology: &'a Topology, uuid: &str) -> NvmlResult<Self> {
        all_devices(topology)
            .find(|device| device.uuid() == uuid)
            .ok_or(Status::NOT_FOUND)
    }

    /// `nvmlDeviceGetHandleByPciBusId_v2`: a malformed id is an invalid argument, a
    /// well-formed one that names no GPU is not found.
    pub fn by_bus_id(topology: &'a Topology, bus_id: &str) -> NvmlResult<Self> {
        let wanted = BusId::parse(bus_id).map_err(|_| Status::INVALID_ARGUMENT)?;
        let mut gpus = topology.gpus.iter().enumerate();
        let (index, gpu) = gpus
            .find(|(_, gpu)| gpu.pci_bus_id == wanted)
            .ok_or(Status::NOT_FOUND)?;
        Ok(Self::Gpu { index, gpu })
    }

    pub fn handle(self) -> Handle {
        match self {
            Self::Gpu { index, .. } => Handle::Gpu(index),
            Self::Mig { parent, index, .. } => Handle::Mig {
                gpu: parent,
                mig: index,
            },
        }
    }

    pub fn uuid(self) -> &'a str {
        match self {
            Self::Gpu { gpu, .. } => &gpu.uuid,
            Self::Mig { mig, .. } => &mig.uuid,
        }
    }

    pub fn name(self) -> &'a str {
        match self {
            Self::Gpu { gpu, .. } => &gpu.name,
            Self::Mig { mig, .. } => &mig.name,
        }
    }

    /// NVML index: the GPU's, or for a MIG device its index under the parent, the one
    /// `nvmlDeviceGetMigDeviceHandleByIndex` takes.
    pub fn index(self) -> u32 {
        let index = match self {
            Self::Gpu { index, .. } | Self::Mig { index, .. } => index,
        };
        // Indices are bounded by MAX_GPUS / MAX_MIG_DEVICES at load time.
        u32::try_from(index).unwrap_or(u32::MAX)
    }

    /// The physical GPU's properties, which a MIG device shares (PCI function,
    /// architecture, compute capability, brand).
    pub fn board(self) -> &'a Gpu {
        match self {
            Self::Gpu { gpu, .. } | Self::Mig { gpu, .. } => gpu,
        }
    }

    /// For queries only a physical GPU answers, with the status a MIG handle gets.
    pub fn physical(self, mig_status: Status) -> NvmlResult<&'a Gpu> {
        match self {
            Self::Gpu { gpu, .. } => Ok(gpu),
            Self::Mig { .. } => Err(mig_status),
        }
    }

    /// For queries only a MIG device answers, with the status a GPU handle gets.
    pub fn mig_device(self, gpu_status: Status) -> NvmlResult<&'a MigDevice> {
        match self {
            Self::Mig { mig, .. } => Ok(mig),
            Self::Gpu { .. } => Err(gpu_status),
        }
    }

    pub fn parent(self, topology: &'a Topology) -> NvmlResult<Self> {
        match self {
            Self::Mig { parent, .. } => gpu(topology, parent).ok_or(Status::INVALID_ARGUMENT),
            Self::Gpu { .. } => Err(Status::INVALID_ARGUMENT),
        }
    }

    /// `nvmlDeviceGetMigDeviceHandleByIndex` on this (parent) device.
    pub fn mig_by_index(self, index: u32) -> NvmlResult<Self> {
        let gpu = self.physical(Status::INVALID_ARGUMENT)?;
        if !gpu.mig_enabled() {
            return Err(Status::NOT_SUPPORTED);
        }
        let index = usize::try_from(index).map_err(|_| Status::INVALID_ARGUMENT)?;
        if index >= MAX_MIG_DEVICES {
            return Err(Status::INVALID_ARGUMENT);
        }
        self.mig(index).ok_or(Status::NOT_FOUND)
    }

    fn mig(self, index: usize) -> Option<Self> {
        let Self::Gpu { index: parent, gpu } = self else {
            return None;
        };
        let mig = gpu.mig_devices().get(index)?;
        Some(Self::Mig {
            parent,
            gpu,
            index,
            mig,
        })
    }
}

fn gpu(topology: &Topology, index: usize) -> Option<Device<'_>> {
    topology
        .gpus
        .get(index)
        .map(|gpu| Device::Gpu { index, gpu })
}

fn all_devices(topology: &Topology) -> impl Iterator<Item = Device<'_>> {
    (0..topology.gpus.len())
        .filter_map(|index| gpu(topology, index))
        .flat_map(|device| {
            let migs = (0..MAX_MIG_DEVICES).filter_map(move |mig| device.mig(mig));
            std::iter::once(device).chain(migs)
        })
}
